#include "tessera/devices/dcgm.h"

#include "fmt/format.h"

namespace tessera::devices {
namespace {

std::optional<double> Percent(const std::optional<double>& ratio) {
  return ratio ? std::optional<double>(*ratio * 100) : std::nullopt;
}

std::optional<double> Mib(const std::optional<uint64_t>& bytes) {
  return bytes ? std::optional<double>(static_cast<double>(*bytes) / 1048576.0) : std::nullopt;
}

}  // namespace

const std::vector<DcgmField>& DcgmFields() {
  static const std::vector<DcgmField> kFields = {
      {"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).",
       [](const GpuTelemetry& t) { return t.sm_clock_mhz; }},
      {"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).",
       [](const GpuTelemetry& t) { return t.memory_clock_mhz; }},
      {"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).",
       [](const GpuTelemetry& t) { return t.temperature_celsius; }},
      {"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).",
       [](const GpuTelemetry& t) { return t.power_watts; }},
      {"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).",
       [](const GpuTelemetry& t) { return Percent(t.utilization); }},
      {"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).",
       [](const GpuTelemetry& t) { return Percent(t.memory_utilization); }},
      {"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
       [](const GpuTelemetry& t) { return Mib(t.memory_free_bytes); }},
      {"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
       [](const GpuTelemetry& t) { return Mib(t.memory_used_bytes); }},
      // NVML's utilization (time a kernel ran) stands for the graphics engine's activity.
      {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.",
       [](const GpuTelemetry& t) { return t.utilization; }},
      {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.",
       [](const GpuTelemetry& t) { return t.tensor_active; }},
  };
  return kFields;
}

std::vector<std::pair<std::string, std::string>> DcgmLabels(const core::Gpu& gpu,
                                                            const std::string& hostname) {
  return {{"gpu", std::to_string(gpu.index)},
          {"UUID", gpu.uuid},
          {"pci_bus_id", gpu.pci_bus_id},
          {"device", fmt::format("nvidia{}", gpu.minor.value_or(gpu.index))},
          {"modelName", gpu.model},
          {"Hostname", hostname}};
}

}  // namespace tessera::devices
