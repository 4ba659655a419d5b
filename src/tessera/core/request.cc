#include "tessera/core/request.h"

#include <algorithm>

namespace tessera::core {

std::string_view GpuSharingName(GpuSharing mode) {
  return mode == GpuSharing::kMps ? "mps" : "time-slice";
}

std::optional<GpuSharing> ParseGpuSharing(std::string_view text) {
  if (text == "mps") return GpuSharing::kMps;
  if (text == "time-slice") return GpuSharing::kTimeSlice;
  return std::nullopt;
}

std::string ValidateRequest(const Request& r) {
  if (r.cpu_milli < 0) return "cpu_milli: must not be negative";
  if (r.memory_mib < 0) return "memory_mib: must not be negative";
  if (r.gpus < 0 || r.gpus > 64) return "gpus: expected 0..64, got " + std::to_string(r.gpus);
  if (r.gpus > 0 && (r.gpu_milli != 0 || r.gpu_memory_mib != 0)) {
    return "a request asks for whole GPUs or a share of one, not both";
  }
  if (r.gpus_max != 0) {
    if (r.gpus < 1) return "gpus_max: an elastic request asks for whole GPUs (gpus 1 or more)";
    if (r.gpus_max < r.gpus || r.gpus_max > 64) {
      return "gpus_max: expected " + std::to_string(r.gpus) + "..64 (gpus..64), got " +
             std::to_string(r.gpus_max);
    }
    if (!r.gang.empty()) return "gpus_max: a gang member is not elastic (its gang is)";
  }
  if (r.gpu_milli < 0 || r.gpu_milli >= kMilliPerGpu) {
    return "gpu_milli: expected 1..999 (a share of a GPU), got " + std::to_string(r.gpu_milli);
  }
  if (r.gpu_memory_mib < 0) return "gpu_memory_mib: must not be negative";
  if (r.share_gpus < 0 || r.share_gpus > 64)
    return "share_gpus: expected 0..64, got " + std::to_string(r.share_gpus);
  if (r.share_gpus > 1 && !r.fractional())
    return "share_gpus: a share on several GPUs needs gpu_milli or gpu_memory_mib";
  if (r.min_gpu_memory_mib < 0) return "min_gpu_memory_mib: must not be negative";
  if (r.gang_size < 0) return "gang_size: must not be negative";
  if (!r.gang.empty() && r.gang_size < 1) return "gang_size: a gang member needs the gang's size";
  if (r.topology != TopologyMode::kNone && r.gpus < 2) {
    return "topology: a wish about links needs 2 or more whole GPUs";
  }
  if (r.expected_util_pct < 0 || r.expected_util_pct > 100) {
    return "expected_util_pct: expected 0..100, got " + std::to_string(r.expected_util_pct);
  }
  if (r.util_ceiling_pct < 0 || r.util_ceiling_pct > 100) {
    return "util_ceiling_pct: expected 0..100, got " + std::to_string(r.util_ceiling_pct);
  }
  return "";
}

std::string RequestShapeKey(const Request& r) {
  std::string key;
  key.reserve(96);
  auto add = [&](int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  add(r.cpu_milli);
  add(r.memory_mib);
  add(r.gpus);
  add(r.gpu_milli);
  add(r.gpu_memory_mib);
  add(r.shared_gpu_count());
  add(r.min_gpu_memory_mib);
  add(r.min_compute_capability
          ? r.min_compute_capability->major * 100 + r.min_compute_capability->minor
          : -1);
  add(static_cast<int>(r.topology) * 4 + static_cast<int>(r.topology_scope));
  add((r.expected_util_pct * 1000 + r.util_ceiling_pct) * 2 + (r.util_ceiling_strict ? 1 : 0));
  add(r.sharing ? 1 + static_cast<int>(*r.sharing) : 0);
  if (r.mps()) {
    key += r.owner;
    key.push_back('\0');
  }
  for (const std::string& m : r.models) {
    key += m;
    key.push_back('\0');
  }
  return key;
}

bool GpuAccepted(const NodeGpu& gpu, const Request& r) {
  if (!r.models.empty() &&
      std::find(r.models.begin(), r.models.end(), gpu.model) == r.models.end()) {
    return false;
  }
  if (gpu.memory_mib < r.min_gpu_memory_mib) return false;
  if (r.min_compute_capability && gpu.compute_capability < *r.min_compute_capability) return false;
  if (r.sharing) return gpu.sharing == *r.sharing;
  return !r.fractional() || gpu.sharing == GpuSharing::kTimeSlice;
}

NodeSpec NodeFromInventory(const NodeInventory& inv, int64_t cpu_milli, int64_t memory_mib) {
  NodeSpec n;
  n.name = inv.hostname;
  n.cpu_milli = cpu_milli;
  n.memory_mib = memory_mib;
  for (const Gpu& g : inv.gpus) {
    NodeGpu ng;
    ng.model = g.model;
    ng.memory_mib = g.memory_bytes ? static_cast<int64_t>(*g.memory_bytes >> 20) : 0;
    ng.compute_capability = g.compute_capability.value_or(ComputeCapability{});
    ng.numa_node = g.numa_node.value_or(-1);
    ng.uuid = g.uuid;
    n.gpus.push_back(std::move(ng));
  }
  n.topology = inv.topology;
  return n;
}

}  // namespace tessera::core
