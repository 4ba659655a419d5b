#pragma once
// DeviceSource: where a machine's GPUs come from. Two implementations: NvmlSource (a real driver
// loaded at run time) and SimulatedSource (an inventory file). Implementations are thread-safe: one
// thread may wait for health events while another discovers or probes.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/core/gpu.h"

namespace tessera::devices {

// A raw health signal from a source, before policy (ignored XIDs, recovery) is applied.
struct HealthEvent {
  enum class Kind {
    kXid,           // an XID error; `xid` holds its number
    kEccDoubleBit,  // an uncorrectable memory error
    kEccSingleBit,  // a corrected memory error
    kUnavailable,   // the driver says the GPU is gone / needs reset
  };
  int gpu = -1;  // GPU index
  Kind kind = Kind::kXid;
  uint64_t xid = 0;
  std::string detail;

  friend bool operator==(const HealthEvent&, const HealthEvent&) = default;
};

std::string_view HealthEventKindName(HealthEvent::Kind kind);

// What a GPU says about itself now. A field the driver cannot tell (not supported, no permission)
// is empty.
struct GpuTelemetry {
  std::optional<double> utilization;         // share of the last sample period a kernel ran, 0..1
  std::optional<double> memory_utilization;  // share of it device memory was read or written, 0..1
  std::optional<uint64_t> memory_used_bytes;
  std::optional<double> temperature_celsius;
  std::optional<double> power_watts;
  std::optional<uint64_t> memory_free_bytes;
  std::optional<double> sm_clock_mhz, memory_clock_mhz;
  // Share of the time the SMs did tensor-core work, 0..1, over the time since the last reading
  // (NVML's GPU performance monitoring: Hopper and later; empty elsewhere and at the first one).
  std::optional<double> tensor_active;
  // Share of the DRAM bandwidth used, 0..1, over the same period (GPM, as tensor_active).
  std::optional<double> dram_active;
  std::optional<uint64_t> energy_mj;                               // since the driver loaded
  std::optional<uint64_t> pcie_replays;                            // PCIe retries
  std::optional<double> pcie_tx_kbps, pcie_rx_kbps;                // KB/s over NVML's last 20 ms
  std::optional<double> encoder_utilization, decoder_utilization;  // 0..1
  // Memory rows remapped for correctable and uncorrectable errors; a remap waiting for a GPU reset;
  // a remap that failed (the bank is out of spare rows: the board should be replaced). Ampere+.
  std::optional<uint64_t> remapped_rows_correctable, remapped_rows_uncorrectable;
  std::optional<bool> row_remap_pending, row_remap_failure;
  // The last XID seen on the GPU (its health watch's; 0: none yet): dcgm-exporter's XID_ERRORS.
  std::optional<uint64_t> last_xid;
  std::optional<double> memory_temperature_celsius;  // HBM's (NVML field values); GDDR: none
  std::optional<uint64_t> nvlink_data_kib;  // NVLink payload sent + received, all links (counter)
  std::optional<uint64_t> memory_reserved_bytes;  // the driver's own (nvmlMemory_v2_t.reserved)

  friend bool operator==(const GpuTelemetry&, const GpuTelemetry&) = default;
};

class DeviceSource {
 public:
  virtual ~DeviceSource() = default;

  // The machine's GPUs, their attributes and topology. On failure (the driver broke), an error with
  // context; attributes a driver cannot tell are left unknown instead.
  virtual absl::StatusOr<core::NodeInventory> Discover() = 0;

  // Waits at most `timeout` for health events and returns those that arrived, possibly none. An
  // error means the event stream itself failed; the caller should then probe every GPU.
  virtual absl::StatusOr<std::vector<HealthEvent>> WaitHealthEvents(
      std::chrono::milliseconds timeout) = 0;

  // Asks GPU `index` something cheap. An error means it does not answer.
  virtual absl::Status Probe(int index) = 0;

  // Reads GPU `index`'s utilization, memory in use, temperature and power. Errors: kInvalidArgument
  // for no such GPU, kUnavailable when the GPU does not answer. A simulated GPU has nothing to
  // report: every field is empty.
  virtual absl::StatusOr<GpuTelemetry> ReadTelemetry(int index) = 0;
};

}  // namespace tessera::devices
