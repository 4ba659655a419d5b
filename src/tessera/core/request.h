#pragma once
// What a workload asks of the scheduler (Request) and what a node offers (NodeSpec). Plain values.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/gpu.h"

namespace tessera::core {

enum class TopologyMode : uint8_t { kNone, kPrefer, kRequire };
enum class TopologyScope : uint8_t {
  kNvlink,    // every pair of chosen GPUs linked by NVLink
  kNumaNode,  // every chosen GPU on one NUMA node
};

inline constexpr int kMilliPerGpu = 1000;

// How a GPU is shared between the jobs holding a part of it: in time slices the intercept
// library paces (priorities, preemption, a job's share whatever its process count), or by
// NVIDIA's Multi-Process Service (kernels of several processes at once; one user's clients per
// GPU at a time). A GPU is in one mode; a request may ask for one.
enum class GpuSharing : uint8_t { kTimeSlice, kMps };
// "time-slice", "mps".
std::string_view GpuSharingName(GpuSharing mode);
// Parses a name as GpuSharingName writes it; nullopt when it is neither.
std::optional<GpuSharing> ParseGpuSharing(std::string_view text);

// A measured use plus `margin` (a fraction: 0.2 = 20%), rounded up to a multiple of `step`: how a
// request is sized from what was used (the simulator's right-sizing, the server's "auto"). A value
// a hair over a multiple from floating-point error stays on it.
inline double SizeFromUse(double use, double margin, double step) {
  return std::ceil(use * (1 + margin) / step - 1e-9) * step;
}

struct Request {
  std::string id;  // unique among live allocations
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;

  // Either whole GPUs...
  int gpus = 0;
  // ...at least `gpus` of them and, elastic, up to `gpus_max` (0: exactly `gpus`): it is placed
  // with `gpus`, grows onto GPUs of its node no queued request can use and gives them back when one
  // can (sched::Engine). Not part of its shape: where it fits is where its `gpus` fit.
  int gpus_max = 0;
  // Elastic and resized while it runs when its driver resizes (sched::Executor::Resizes): its job
  // answers a resize (the server's `resize: signal`, the simulator's elastic jobs). Otherwise an
  // elastic request's size is fixed when it starts.
  bool resizable = false;
  // ...or a fractional share of a GPU: a compute share in thousandths (1..999) and/or GPU
  // memory, on each of `share_gpus` different GPUs of one node (0 or 1: one GPU; more: a job whose
  // ranks run on several shared GPUs).
  int gpu_milli = 0;
  int64_t gpu_memory_mib = 0;
  int share_gpus = 0;

  // Attribute selector: acceptable models (empty: any), least memory per GPU, least compute
  // capability.
  std::vector<std::string> models;
  int64_t min_gpu_memory_mib = 0;
  std::optional<ComputeCapability> min_compute_capability;

  TopologyMode topology = TopologyMode::kNone;
  TopologyScope topology_scope = TopologyScope::kNvlink;

  // The sharing mode asked for; none: a share goes on a time-sliced GPU, whole GPUs on either
  // (held whole, a GPU's mode does not matter). Asked, only GPUs in that mode take it. A request
  // in MPS mode shares a GPU only with requests of its own owner (the MPS control daemon runs one
  // user's server per GPU at a time; a client of another user waits until its clients end).
  std::optional<GpuSharing> sharing;

  int priority = 0;
  bool preemptible = true;
  // Whether it may preempt lower-priority work of other owners (the standalone server's preemption
  // rights); its own owner's work it always may.
  bool preempts_others = true;
  std::string owner;  // namespace/user, for quotas
  // Further quota accounts the request counts against, each checked like the owner's (the
  // standalone server's Unix groups: "group:ml").
  std::vector<std::string> quota_groups;
  std::string gang;  // gang id; members are placed all together or not at all
  int gang_size = 0;
  // How long it is expected to run, in seconds (a prediction from history, or the user's limit);
  // 0: unknown. Backfill with reservations uses it (sched::CycleOptions::reservations); it is no
  // part of the request's shape.
  double expected_duration_s = 0;
  // Interference-aware sharing (a share of one GPU only): how busy it is expected to keep the GPU,
  // in percent of the GPU's time (a prediction from the history of jobs like it; 0: unknown), and
  // the most predicted utilization a shared GPU should carry with it (0: no ceiling). A share goes
  // on a GPU whose holders' predicted utilization plus its own stays within the ceiling, or on a
  // GPU none of whose holders has a prediction; where there is none, on the least busy GPU with
  // room (scored below every place within the ceiling), or, when `util_ceiling_strict`, nowhere:
  // it waits. Part of the request's shape.
  int expected_util_pct = 0;
  int util_ceiling_pct = 0;
  bool util_ceiling_strict = false;

  bool fractional() const { return gpus == 0 && (gpu_milli > 0 || gpu_memory_mib > 0); }
  bool wants_gpu() const { return gpus > 0 || fractional(); }
  // How many GPUs it takes a share of (0 when it asks for whole GPUs or none).
  int shared_gpu_count() const { return fractional() ? std::max(share_gpus, 1) : 0; }
  // How many GPUs it is placed on, whole or shared.
  int gpu_count() const { return gpus > 0 ? gpus : shared_gpu_count(); }
  // Whether it may grow past `gpus` (gpus_max).
  bool elastic() const { return gpus_max > gpus && gpus > 0; }
  // Whether it runs as an MPS client (asked MPS mode).
  bool mps() const { return sharing == GpuSharing::kMps; }
  // GPU compute asked for, in thousandths of a GPU.
  int64_t gpu_milli_total() const {
    return int64_t{gpus} * kMilliPerGpu + int64_t{gpu_milli} * std::max(share_gpus, 1);
  }
};

// Why a request is malformed ("gpu_milli: expected 1..999 with gpus = 0, got 1200"); empty when
// fine.
std::string ValidateRequest(const Request& r);

struct NodeGpu {
  std::string model;
  int64_t memory_mib = 0;
  ComputeCapability compute_capability;
  int numa_node = -1;
  std::string uuid;
  GpuSharing sharing = GpuSharing::kTimeSlice;
  friend bool operator==(const NodeGpu&, const NodeGpu&) = default;
};

struct NodeSpec {
  std::string name;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  std::vector<std::pair<std::string, std::string>> labels;
  std::vector<NodeGpu> gpus;
  // Links between this node's GPUs; size 0 when unknown (then all GPUs count as equally linked).
  Topology topology;
};

// Whether a GPU of this kind satisfies the request's attribute selector: its model is one of
// `r.models` (exact names; any when empty), it has at least `r.min_gpu_memory_mib` and at least
// `r.min_compute_capability`, and it is in the sharing mode asked (time slices for a share that
// asks none).
bool GpuAccepted(const NodeGpu& gpu, const Request& r);

// The request's shape: the fields that decide where, and whether, it fits on a given cluster state
// and how each place scores (resources, attribute selector, topology wish), as a compact byte
// string. Requests of one shape fit or fail alike; the scheduler's caches and the scheduling
// cycle's "this shape did not fit" memo both key on it. Priority, owner and gang are not part of
// it: a caller that also depends on them (preemption depends on priority) adds them itself. The
// owner is, for a request in MPS mode: where it fits depends on whose clients hold a GPU.
std::string RequestShapeKey(const Request& r);

// A node for the scheduling model from a discovered inventory.
NodeSpec NodeFromInventory(const NodeInventory& inv, int64_t cpu_milli, int64_t memory_mib);

}  // namespace tessera::core
