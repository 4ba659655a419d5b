#pragma once
// NvmlSource: the DeviceSource backed by a real (or fake) libnvidia-ml.so.1 opened at run time.
// Thread-safe: NVML calls are thread-safe, and the event set is created once under a mutex.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "tessera/core/mutex.h"
#include "tessera/devices/device_source.h"
#include "tessera/devices/nvml_library.h"

namespace tessera::devices {

struct NvmlSourceOptions {
  std::string library_path = NvmlLibrary::kDefaultPath;
  // Root of the file system that holds /sys, for the NUMA node of a GPU when NVML does not tell.
  std::string sysfs_root = "/";
};

class NvmlSource final : public DeviceSource {
 public:
  // Loads NVML (see NvmlLibrary::Load for the errors) and takes the device handles.
  static absl::StatusOr<std::unique_ptr<NvmlSource>> Create(const NvmlSourceOptions& options = {});
  ~NvmlSource() override;

  absl::StatusOr<core::NodeInventory> Discover() override;
  absl::StatusOr<std::vector<HealthEvent>> WaitHealthEvents(
      std::chrono::milliseconds timeout) override;
  absl::Status Probe(int index) override;
  absl::StatusOr<GpuTelemetry> ReadTelemetry(int index) override;

 private:
  NvmlSource(std::unique_ptr<NvmlLibrary> lib, NvmlSourceOptions options,
             std::vector<nvmlDevice_t> handles)
      : lib_(std::move(lib)), options_(std::move(options)), handles_(std::move(handles)) {}

  absl::Status EnsureEventSet();
  core::Topology ProbeTopology(const std::vector<core::Gpu>& gpus) const;
  int IndexOf(nvmlDevice_t handle) const;

  std::unique_ptr<NvmlLibrary> lib_;
  const NvmlSourceOptions options_;
  const std::vector<nvmlDevice_t> handles_;

  // Tensor-core activity (GPM) needs the previous reading's sample: one pair of samples per GPU,
  // allocated at its first reading; supported: -1 not asked yet, 0 no, 1 yes.
  struct Gpm {
    int supported = -1;
    nvmlGpmSample_t previous = nullptr, current = nullptr;
    bool have_previous = false;
  };
  // GPM readings since the last call: tensor activity and DRAM bandwidth use, 0..1 (each empty
  // when not given, and both at a GPU's first call).
  std::pair<std::optional<double>, std::optional<double>> ReadGpm(int index);
  core::Mutex gpm_mu_;
  std::vector<Gpm> gpm_ ABSL_GUARDED_BY(gpm_mu_);

  core::Mutex mu_;
  nvmlEventSet_t event_set_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool event_set_tried_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status event_set_status_ ABSL_GUARDED_BY(mu_);
};

// "00000000:18:00.0", "0000:18:00.0" and lower-case forms -> "00000000:18:00.0"; empty if
// malformed.
std::string CanonicalPciBusId(std::string_view bus_id);

}  // namespace tessera::devices
