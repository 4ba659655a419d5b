#include "tessera/devices/dcgm.h"

#include "fmt/format.h"

namespace tessera::devices {
namespace {

std::optional<double> Percent(const std::optional<double>& ratio) {
  return ratio ? std::optional<double>(*ratio * 100) : std::nullopt;
}

template <typename T>
std::optional<double> Number(const std::optional<T>& v) {
  return v ? std::optional<double>(static_cast<double>(*v)) : std::nullopt;
}

std::optional<double> Mib(const std::optional<uint64_t>& bytes) {
  return bytes ? std::optional<double>(static_cast<double>(*bytes) / 1048576.0) : std::nullopt;
}

}  // namespace

const std::vector<DcgmField>& DcgmFields() {
  static const std::vector<DcgmField> kFields = {
      // In the order of dcgm-exporter's etc/default-counters.csv, then its DCP fields.
      {"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).",
       [](const GpuTelemetry& t) { return t.sm_clock_mhz; }},
      {"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).",
       [](const GpuTelemetry& t) { return t.memory_clock_mhz; }},
      {"DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).",
       [](const GpuTelemetry& t) { return t.memory_temperature_celsius; }},
      {"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).",
       [](const GpuTelemetry& t) { return t.temperature_celsius; }},
      {"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).",
       [](const GpuTelemetry& t) { return t.power_watts; }},
      {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).",
       [](const GpuTelemetry& t) { return Number(t.energy_mj); }, "counter"},
      {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
       "Total number of NVLink bandwidth counters for all lanes (data sent and received, in KiB).",
       [](const GpuTelemetry& t) { return Number(t.nvlink_data_kib); }, "counter"},
      {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
       "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
       [](const GpuTelemetry& t) { return t.pcie_tx_kbps; }, "counter"},
      {"DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
       "Total number of bytes received through PCIe RX (in KB) via NVML.",
       [](const GpuTelemetry& t) { return t.pcie_rx_kbps; }, "counter"},
      {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.",
       [](const GpuTelemetry& t) { return Number(t.pcie_replays); }, "counter"},
      {"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).",
       [](const GpuTelemetry& t) { return Percent(t.utilization); }},
      {"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).",
       [](const GpuTelemetry& t) { return Percent(t.memory_utilization); }},
      {"DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).",
       [](const GpuTelemetry& t) { return Percent(t.encoder_utilization); }},
      {"DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).",
       [](const GpuTelemetry& t) { return Percent(t.decoder_utilization); }},
      {"DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
       [](const GpuTelemetry& t) { return Number(t.last_xid); }},
      {"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
       [](const GpuTelemetry& t) { return Mib(t.memory_free_bytes); }},
      {"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
       [](const GpuTelemetry& t) { return Mib(t.memory_used_bytes); }},
      {"DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).",
       [](const GpuTelemetry& t) { return Mib(t.memory_reserved_bytes); }},
      {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
       "Number of remapped rows for uncorrectable errors",
       [](const GpuTelemetry& t) { return Number(t.remapped_rows_uncorrectable); }, "counter"},
      {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors",
       [](const GpuTelemetry& t) { return Number(t.remapped_rows_correctable); }, "counter"},
      {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed",
       [](const GpuTelemetry& t) { return Number(t.row_remap_failure); }},
      // Not among dcgm-exporter's defaults, but a DCGM field (DCGM_FI_DEV_ROW_REMAP_PENDING) and
      // the reading the row-remap alert needs: a remap waiting for the GPU's reset.
      {"DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending (a GPU reset is due)",
       [](const GpuTelemetry& t) { return Number(t.row_remap_pending); }},
      // NVML's utilization (time a kernel ran) stands for the graphics engine's activity.
      {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.",
       [](const GpuTelemetry& t) { return t.utilization; }},
      {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.",
       [](const GpuTelemetry& t) { return t.tensor_active; }},
      {"DCGM_FI_PROF_DRAM_ACTIVE",
       "Ratio of cycles the device memory interface is active sending or receiving data.",
       [](const GpuTelemetry& t) { return t.dram_active; }},
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
