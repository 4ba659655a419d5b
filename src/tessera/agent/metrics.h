#pragma once
// The agent's /metrics page (Prometheus text format 0.0.4): per-GPU telemetry named and labelled as
// dcgm-exporter does (devices/dcgm.h: DCGM_FI_*, labels gpu, UUID, pci_bus_id, device, modelName,
// Hostname - modelName is camelCase, which promtool's lint warns of, as it does for
// dcgm-exporter's own page) with the pod, namespace and container holding the GPU joined from the
// kubelet's PodResources, one series per holder as dcgm-exporter does for a shared GPU; health and
// XIDs; the fractional allocations' GPU memory in use and limit from their shared regions; the
// agent's own counters. A pure function of its input.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/agent/device_state.h"
#include "tessera/agent/pod_resources.h"
#include "tessera/devices/device_source.h"
#include "tessera/devices/health.h"
#include "tessera/devices/mps.h"

namespace tessera::agent {

struct GpuSample {
  const core::Gpu* gpu = nullptr;
  devices::GpuHealth health;
  uint64_t health_changes = 0;
  std::optional<devices::GpuTelemetry> telemetry;  // empty when the GPU did not answer
  std::vector<ContainerRef> holders;               // containers given it (whole or shares)
  std::optional<devices::MpsDaemonState> mps;      // its MPS daemon, when in MPS mode
};

struct ShareSample {
  Allocation allocation;
  std::optional<ContainerRef> holder;
  std::vector<uint64_t> used;   // per GPU of the allocation, from its region
  std::vector<uint64_t> limit;  // idem
};

struct AgentCountersSample {
  uint64_t registrations = 0;
  uint64_t allocations = 0;
  uint64_t allocation_errors = 0;
  uint64_t preferred = 0;
  uint64_t pod_resources_errors = 0;
  bool api_server_configured = false;
  bool api_server_up = false;
  bool labels_current = false;
  uint64_t label_updates = 0;
  uint64_t label_errors = 0;
  uint64_t hints_found = 0;
  uint64_t hints_none = 0;
  uint64_t hint_errors = 0;
  uint64_t allocated_marks = 0;
  uint64_t mark_errors = 0;
  uint64_t use_marks = 0;  // tessera.io/gpu-use written on ended pods
  uint64_t use_errors = 0;
  size_t whole_allocations = 0;
  size_t share_allocations = 0;
  // Ended pods by namespace and resource: GPU-seconds given (GPUs, or share x GPUs, x life) and
  // busy (a share's arbiter charge; a whole GPU's sampled utilization).
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> ended_gpu_seconds;
  // Time-sliced shares among them: how long their launches waited for the GPU, in GPU-seconds.
  std::map<std::pair<std::string, std::string>, double> ended_held_back_seconds;
};

// `virtual_gpus` (dcgm-exporter's --kubernetes-virtual-gpus): a GPU held by several pods (shares)
// has its DCGM_FI_* and tessera_gpu_healthy series once per holder, each with that pod's labels.
// Off (dcgm-exporter's default): once per GPU, with its first holder's labels - so NVIDIA's
// dashboard, which sums and counts series per GPU, reads every GPU once.
std::string RenderMetrics(const std::string& hostname, const std::vector<GpuSample>& gpus,
                          const std::vector<ShareSample>& shares,
                          const AgentCountersSample& counters, bool virtual_gpus = false);

// Reads the memory in use and the limit per device of a shared region file; false when it cannot
// be read or is not a region.
bool ReadRegion(const std::string& path, std::vector<uint64_t>* used, std::vector<uint64_t>* limit);

}  // namespace tessera::agent
