#pragma once
// The vocabulary of GPU inventory: what a GPU is, how two GPUs are linked, and what one machine
// holds. Plain values with no I/O; safe to share between threads for reading, not for concurrent
// writing.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::core {

// Where the PCIe paths of two GPUs meet, nearest first. The order matches NVML's topology levels,
// so a smaller value is a better link.
enum class PcieLevel : uint8_t {
  kSelf = 0,          // the same GPU
  kBoard,             // two GPUs on one board (NVML "INTERNAL")
  kSingleSwitch,      // at most one PCIe switch between them ("PIX")
  kMultipleSwitches,  // several switches, no host bridge ("PXB")
  kHostBridge,        // through a PCIe host bridge ("PHB")
  kNumaNode,          // across host bridges within one NUMA node ("NODE")
  kSystem,            // across NUMA nodes / CPU sockets ("SYS")
  kUnknown,
};

// The short code nvidia-smi uses for a level ("PIX", "SYS", ...), "X" for kSelf, "?" for kUnknown.
std::string_view PcieLevelCode(PcieLevel level);
// A phrase for legends and errors: "a single PCIe switch".
std::string_view PcieLevelDescription(PcieLevel level);
// Parses a code as printed by PcieLevelCode; nullopt if it is none of them.
std::optional<PcieLevel> ParsePcieLevelCode(std::string_view code);

// How two GPUs are connected: NVLink lanes (direct or through an NVSwitch fabric) and the PCIe
// level.
struct GpuLink {
  int nvlinks = 0;  // active NVLink links between the pair; 0 when none
  bool via_nvswitch = false;
  PcieLevel pcie = PcieLevel::kUnknown;

  bool has_nvlink() const { return nvlinks > 0; }
  friend bool operator==(const GpuLink&, const GpuLink&) = default;
};

// nvidia-smi's label of a link: "NV18" for NVLink, else the PCIe code.
std::string LinkLabel(const GpuLink& link);

// A symmetric matrix of links between the GPUs of one machine, indexed by GPU index.
class Topology {
 public:
  Topology() = default;
  // All links start as kUnknown, the diagonal as kSelf.
  explicit Topology(int gpu_count);

  int size() const { return size_; }
  // Requires 0 <= a, b < size().
  const GpuLink& link(int a, int b) const { return links_[a * size_ + b]; }
  // Sets the link both ways. Requires a != b, both in range.
  void SetLink(int a, int b, const GpuLink& link);

  friend bool operator==(const Topology&, const Topology&) = default;

 private:
  int size_ = 0;
  std::vector<GpuLink> links_;
};

struct ComputeCapability {
  int major = 0;
  int minor = 0;
  friend auto operator<=>(const ComputeCapability&, const ComputeCapability&) = default;
};
// "9.0"
std::string FormatComputeCapability(const ComputeCapability& cc);
std::optional<ComputeCapability> ParseComputeCapability(std::string_view text);

// One GPU as discovered. Attributes a driver could not tell are nullopt (or empty strings):
// unknown, not zero.
struct Gpu {
  int index = 0;
  std::string uuid;   // "GPU-8f2c...", the stable identity
  std::string model;  // the name NVML reports, e.g. "NVIDIA H100 80GB HBM3"
  std::optional<uint64_t> memory_bytes;
  std::optional<ComputeCapability> compute_capability;
  std::string pci_bus_id;  // "00000000:18:00.0"; empty when unknown
  std::optional<int> numa_node;
  std::optional<int> minor;  // /dev/nvidia<minor>
  std::optional<bool> ecc_enabled;
  std::optional<bool> mig_enabled;

  friend bool operator==(const Gpu&, const Gpu&) = default;
};

// Everything one machine reports about its GPUs.
struct NodeInventory {
  std::string hostname;
  // True when the GPUs come from a simulated inventory rather than a driver. Every output shows it.
  bool simulated = false;
  // "nvml" or "simulated:<preset or file>".
  std::string source;
  std::string driver_version;       // empty when unknown
  std::string cuda_driver_version;  // "12.4"; empty when unknown
  std::vector<Gpu> gpus;
  Topology topology;
};

// What a CUDA context takes of a GPU's memory, for where the intercept library cannot measure it
// (a job in a pid namespace of its own - a container, a pod - whose pids NVML does not show it):
// 520 MiB on an H100 80GB HBM3 and an H200 as tessera-gpu-check measured it ("context footprint":
// NVML's figure for a process holding a context and one small module, before any allocation;
// driver 580.159.04, CUDA 13.0, 2026-11-25); 512 MiB for models not measured.
uint64_t DefaultContextOverhead(std::string_view model);

// Bytes in MiB rounded up (a refusal a few bytes past a limit still wanted more than it); a
// value past 2^62 (no allocation asks that much: a corrupt counter) is rounded down instead of
// overflowing.
inline uint64_t MibRoundedUp(uint64_t bytes) {
  return bytes >= (uint64_t{1} << 62) ? bytes >> 20 : (bytes + (uint64_t{1} << 20) - 1) >> 20;
}

// 81559 MiB -> "79.6 GiB"; bytes are shown in the largest binary unit that keeps a value >= 1.
std::string FormatBytes(uint64_t bytes);
// Parses "80GiB", "512 MiB", "16G", "16Gi", "1.5GB", "81920" (MiB when no unit): returns bytes,
// nullopt when malformed. K/M/G/T, Ki/Mi/Gi/Ti and KiB/MiB/GiB/TiB are powers of 1024 (Slurm's
// `--mem=16G`, Kubernetes' `16Gi`); KB/MB/GB/TB powers of 1000, as written; B bytes.
std::optional<uint64_t> ParseBytes(std::string_view text);

// Parses a duration as people write them: "90" and "90s" (seconds), "15m", "1h", "2d",
// "1h30m", "HH:MM:SS", "MM:SS", "D-HH:MM:SS" and "D-HH" (Slurm's --time forms, where a bare
// "MM:SS" is minutes and seconds). Returns seconds, nullopt when malformed or not above 0.
std::optional<double> ParseDuration(std::string_view text);
// The same, or "0" for none (config ages and limits, `tessera admin purge`): 0, or nullopt.
std::optional<double> ParseDurationOrZero(std::string_view text);
// The other way, in the largest units that are exact: 604800 -> "7d", 5400 -> "1h30m", 90 ->
// "1m30s".
std::string FormatDuration(double seconds);

}  // namespace tessera::core
