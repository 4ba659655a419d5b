#pragma once
// Choosing a DeviceSource: a simulated machine when asked for, else NVML, else (when allowed) a
// simulated fallback that is labelled as such. Used by every command and daemon that needs GPUs.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/devices/device_source.h"

namespace tessera::devices {

struct OpenOptions {
  std::string simulate;           // a preset name or inventory file; empty: use the driver
  std::string fallback_simulate;  // used when the driver cannot be loaded; empty: fail instead
  // The NVML library to load; empty means $TESSERA_NVML_LIBRARY, else libnvidia-ml.so.1.
  std::string nvml_library;
  std::string sysfs_root = "/";
};

struct OpenedSource {
  std::unique_ptr<DeviceSource> source;
  // Why the fallback was used ("no NVIDIA driver: ..."); empty when it was not. Callers must say so
  // (log or print): nothing is logged here.
  std::string fallback_reason;
};

// Errors: those of LoadSimulatedMachine for a bad --simulate/fallback spec (kInvalidArgument,
// kNotFound), those of NvmlSource::Create when the driver fails and no fallback is set.
absl::StatusOr<OpenedSource> OpenDeviceSource(const OpenOptions& options);

}  // namespace tessera::devices
