#include "tessera/devices/open.h"

#include <cstdlib>

#include "tessera/devices/inventory.h"
#include "tessera/devices/nvml_source.h"
#include "tessera/devices/simulated_source.h"

namespace tessera::devices {
namespace {

absl::StatusOr<std::unique_ptr<DeviceSource>> OpenSimulated(const std::string& spec) {
  auto machine = LoadSimulatedMachine(spec);
  if (!machine.ok()) return machine.status();
  return std::make_unique<SimulatedSource>(std::move(*machine));
}

}  // namespace

absl::StatusOr<OpenedSource> OpenDeviceSource(const OpenOptions& options) {
  OpenedSource out;
  if (!options.simulate.empty()) {
    auto sim = OpenSimulated(options.simulate);
    if (!sim.ok()) return sim.status();
    out.source = std::move(*sim);
    return out;
  }
  NvmlSourceOptions nvml;
  nvml.sysfs_root = options.sysfs_root;
  if (!options.nvml_library.empty()) {
    nvml.library_path = options.nvml_library;
  } else if (const char* env = std::getenv("TESSERA_NVML_LIBRARY"); env && *env) {
    nvml.library_path = env;
  }
  auto real = NvmlSource::Create(nvml);
  if (real.ok()) {
    out.source = std::move(*real);
    return out;
  }
  if (options.fallback_simulate.empty()) return real.status();
  // Check the fallback before saying we use it.
  auto sim = OpenSimulated(options.fallback_simulate);
  if (!sim.ok()) return sim.status();
  out.fallback_reason = std::string(real.status().message());
  out.source = std::move(*sim);
  return out;
}

}  // namespace tessera::devices
