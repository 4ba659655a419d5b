#pragma once
// The GPU readings as NVIDIA's dcgm-exporter names them (its default counters: DCGM_FI_DEV_* and
// DCGM_FI_PROF_*, their units and help texts), so that dashboards and alerts written for it read
// Tessera's GPUs too. The server and the agent export these families beside their own
// tessera_gpu_* series, with dcgm-exporter's labels (DcgmLabelNames). Which driver reading each
// comes from, and where it is an approximation, is in docs/metrics.md.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/gpu.h"
#include "tessera/devices/device_source.h"

namespace tessera::devices {

struct DcgmField {
  const char* name;  // "DCGM_FI_DEV_GPU_UTIL"
  const char* help;  // dcgm-exporter's
  // The value in dcgm-exporter's unit (%, MiB, MHz, C, W, ratio 0..1); nullopt: no sample.
  std::optional<double> (*value)(const GpuTelemetry&);
  const char* type = "gauge";  // "counter" where dcgm-exporter declares one
};

// Every field Tessera gives, in dcgm-exporter's order.
const std::vector<DcgmField>& DcgmFields();

// dcgm-exporter's labels for a GPU: gpu (index), UUID, pci_bus_id, device (nvidiaN), modelName,
// Hostname - in that order.
std::vector<std::pair<std::string, std::string>> DcgmLabels(const core::Gpu& gpu,
                                                            const std::string& hostname);

}  // namespace tessera::devices
