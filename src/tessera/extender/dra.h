#pragma once
// The extender's help for pods that ask for Tessera's GPUs through DRA (ResourceClaims of the
// DeviceClasses gpu.tessera.io and gpu-share.tessera.io; docs/kubernetes.md, "DRA or the device
// plugin"). kube-scheduler allocates DRA devices itself, first fit on the node it picks; what
// Tessera adds is the choice of node: of the nodes kube-scheduler found feasible, filter drops
// those whose free devices (the driver's ResourceSlices less the devices of allocated claims)
// cannot hold the pod's claims, and prioritize scores each by how much FGD's fragmentation of its
// GPUs grows when kube-scheduler's allocator takes the devices it will take there (lower growth,
// higher score). No I/O: the service feeds it the slices, claims and templates its informers see.
// Thread-safe.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/core/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/sched/cluster_state.h"
#include "tessera/sched/fragmentation.h"

namespace tessera::extender {

inline constexpr char kDraDriverName[] = "gpu.tessera.io";
inline constexpr char kDraGpuClass[] = "gpu.tessera.io";
inline constexpr char kDraShareClass[] = "gpu-share.tessera.io";

// What a pod's claims ask of Tessera's driver, by request.
struct DraRequest {
  bool share = false;
  int count = 0;
  bool same_gpu = false;  // a matchAttribute constraint on the GPU's uuid (shares of one GPU)
};
struct DraDemand {
  std::vector<DraRequest> requests;
  // A claim already allocated (shared with another pod): the pools (nodes) it is on.
  std::set<std::string> pinned;
  bool empty() const { return requests.empty() && pinned.empty(); }
};

class DraAdvisor {
 public:
  // Informer events; `deleted` says a deletion.
  void OnSlice(const nlohmann::json& slice, bool deleted);
  void OnClaim(const nlohmann::json& claim, bool deleted);
  void OnTemplate(const nlohmann::json& tmpl, bool deleted);

  // The pod's demand on Tessera's DRA driver: empty when it asks nothing of it (or only in ways
  // this does not read: allocationMode All, prioritized lists, other classes).
  DraDemand DemandOf(const nlohmann::json& pod) const;

  // Of `nodes`, those the demand fits on (by this model; a node it knows nothing of passes), and
  // why not for the others.
  std::vector<std::string> Filter(const DraDemand& demand, const std::vector<std::string>& nodes,
                                  std::map<std::string, std::string>* failed) const;
  // 0..10 per node: 10 where the fragmentation grows least.
  std::vector<std::pair<std::string, int64_t>> Prioritize(const DraDemand& demand,
                                                          const std::vector<std::string>& nodes);

  // For tests and metrics: free whole GPUs and free shares per node.
  struct NodeFree {
    int whole = 0;
    int shares = 0;
  };
  std::map<std::string, NodeFree> Free() const;
  // The shares of one GPU its nodes' slices publish (gpu-share.tessera.io devices): the most
  // common count over their GPUs (the larger on a tie), 0 when none publishes shares.
  int SharesPerGpu() const;

  struct Device {
    std::string name;
    int gpu = 0;  // GPU index
    bool share = false;
    int64_t memory_mib = 0;
  };
  struct Pool {
    int64_t generation = 0;
    std::map<std::string, std::vector<Device>> slices;  // of `generation`, by slice name
    std::map<int, core::NodeGpu> gpus;                  // by index: model, memory
    std::map<int, int> shares_per_gpu;                  // by index, for GPUs given in shares
    bool consumable = false;  // devices shared by amounts (allowMultipleAllocations): no opinion
  };

 private:
  // The devices a pool publishes now, in the allocator's order (slice name, then listed order).
  std::vector<Device> DevicesLocked(const Pool& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Which devices kube-scheduler's allocator takes for `demand` on `pool`; nullopt when it does
  // not fit.
  std::optional<std::vector<const Device*>> TakeLocked(const std::string& pool,
                                                       const std::vector<Device>& devices,
                                                       const DraDemand& demand) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double FragmentationLocked(const std::string& pool, const std::vector<Device>& devices,
                             const std::set<std::string>& taken) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountDemandLocked(const DraDemand& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable core::Mutex mu_;
  std::map<std::string, Pool> pools_ ABSL_GUARDED_BY(mu_);  // by pool (node) name
  // Devices of allocated claims: "pool/device" -> claim UID.
  std::map<std::string, std::string> allocated_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::string>> claim_devices_ ABSL_GUARDED_BY(mu_);  // by UID
  std::map<std::string, nlohmann::json> claims_ ABSL_GUARDED_BY(mu_);  // "ns/name" -> spec+status
  std::map<std::string, nlohmann::json> templates_ ABSL_GUARDED_BY(mu_);  // "ns/name" -> spec.spec
  // FGD's typical workload, from the demands seen (shape -> count).
  std::map<std::pair<int32_t, int>, int64_t> seen_ ABSL_GUARDED_BY(mu_);
  int64_t seen_at_build_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t seen_total_ ABSL_GUARDED_BY(mu_) = 0;
  sched::Fragmentation fragmentation_ ABSL_GUARDED_BY(mu_);
  // GPU shapes for the fragmentation measure, by their kinds' key.
  std::map<std::string, sched::ShapeId> shape_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<sched::NodeShape> shapes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::extender
