#pragma once
// Placement policies: the filters every placement passes (resources, attributes, health, topology
// requirement) and the scores that rank the nodes that pass, each selectable alone or combined with
// weights. Everything here is a pure function of one node's state and the request, so the scheduler
// can evaluate a class of identical nodes once. Not thread-safe (FGD memoises).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "tessera/core/request.h"
#include "tessera/sched/cluster_state.h"
#include "tessera/sched/fragmentation.h"

namespace tessera::sched {

enum class PolicyKind : uint8_t {
  kRandom,         // uniformly random among feasible nodes (seeded)
  kSpread,         // least allocated after placement (kube-scheduler LeastAllocated)
  kBinpack,        // most allocated after placement (MostAllocated)
  kBestFit,        // least CPU and GPU left over, normalised by the largest node
  kDotProduct,     // Tetris: smallest dot product of free and requested resources
  kGpuPacking,     // shared GPUs first, then used nodes, then idle nodes
  kGpuClustering,  // nodes already running work of the same GPU size
  kFgd,            // fragmentation gradient descent: least growth of fragmentation
  kTopology,       // best-linked GPU set; satisfies "prefer" topology wishes
};

std::string_view PolicyName(PolicyKind kind);

struct WeightedPolicy {
  PolicyKind kind;
  double weight = 1;
};

// "fgd", "bestfit,topology:0.5", "all" (each policy once, weight 1) -> policies. kInvalidArgument
// naming the unknown policy or bad weight.
absl::StatusOr<std::vector<WeightedPolicy>> ParsePolicies(const std::string& text);
std::vector<PolicyKind> AllPolicyKinds();
// Tessera's default policy set: fgd:1, bestfit:0.01, topology:0.5 (see docs/simulator.md for why).
std::vector<WeightedPolicy> DefaultPolicies();

// One node's state, GPUs in class order (sorted for interchangeable GPUs, index order otherwise).
struct NodeView {
  const NodeShape* shape = nullptr;
  ShapeId shape_id = 0;
  int64_t cpu_left = 0;
  int64_t memory_left = 0;
  uint16_t tags = 0;
  const std::vector<ClassGpu>* gpus = nullptr;
  // GPU kinds of the shape the request's selector accepts, bit per kind, when the caller has worked
  // them out (the scheduler does once per request and node shape); -1 = check each kind.
  int64_t accepted_kinds = -1;
  bool Accepts(uint16_t kind, const core::Request& r) const;
};

struct Evaluation {
  bool feasible = false;
  double score = 0;                       // higher is better
  absl::InlinedVector<int, 8> positions;  // chosen GPUs, as positions in the view's GPU order
  std::string reason;                     // why not, when infeasible
};

// Cluster-wide constants some scores normalise by.
struct ClusterScale {
  int64_t max_cpu_milli = 1;
  int64_t max_gpu_milli = 1;
};

class PolicySet {
 public:
  PolicySet(std::vector<WeightedPolicy> policies, Fragmentation* fragmentation)
      : policies_(std::move(policies)), frag_(fragmentation) {}

  // Filters, chooses GPUs, scores. `want_reason` fills Evaluation::reason when infeasible.
  Evaluation Evaluate(const NodeView& node, const core::Request& r, const ClusterScale& scale,
                      bool want_reason) const;

  const std::vector<WeightedPolicy>& policies() const { return policies_; }
  bool random_only() const;

 private:
  double Score(PolicyKind kind, const NodeView& node, const core::Request& r,
               const absl::InlinedVector<int, 8>& positions, const ClusterScale& scale) const;

  std::vector<WeightedPolicy> policies_;
  Fragmentation* frag_;
};

// Whether GPU kind `k` of `shape` meets the request's attribute selector.
bool KindAccepted(const NodeShape& shape, uint16_t kind, const core::Request& r);

// Link cost of a GPU set on a node (lower is better): summed over pairs, NVLink cheapest (more
// links cheaper), then PCIe levels in order. 0 for fewer than two GPUs or unknown topology.
double LinkCost(const core::Topology& topo, const absl::InlinedVector<int, 8>& gpus);

}  // namespace tessera::sched
