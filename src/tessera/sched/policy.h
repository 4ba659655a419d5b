#pragma once
// Placement policies: the filters every placement passes (resources, attributes, health, topology
// requirement) and the scores that rank the nodes that pass, each selectable alone or combined with
// weights. Everything here is a pure function of one node's state and the request, so the scheduler
// can evaluate a class of identical nodes once. Not thread-safe (FGD memoises).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "tessera/core/request.h"
#include "tessera/sched/cluster_state.h"
#include "tessera/sched/fragmentation.h"

namespace tessera::sched {

// A policy by name ("fgd", "bestfit", ... as the registry below knows them) and its weight.
struct WeightedPolicy {
  std::string name;
  double weight = 1;
};

// "fgd", "bestfit,topology:0.5", "all" (each policy once, weight 1) -> policies. kInvalidArgument
// naming the unknown policy or bad weight.
absl::StatusOr<std::vector<WeightedPolicy>> ParsePolicies(const std::string& text);
// Every registered policy's name, in registry order.
std::vector<std::string> AllPolicyNames();
// Tessera's default policy set: fgd:1, stranded:0.05, bestfit:0.01, topology:0.5 (see
// docs/simulator.md for why).
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

// What a score sees: one node's state, the request, the GPUs chosen for it there (positions in the
// view's GPU order) and the cluster-wide constants.
struct ScoreInput {
  const NodeView& node;
  const core::Request& request;
  const absl::InlinedVector<int, 8>& positions;
  const ClusterScale& scale;
};

// A score plugin, in the spirit of kube-scheduler's framework: how good a feasible place is (higher
// is better), a pure function of its input, evaluated once per class of identical nodes. A new
// policy is a ScorePlugin in a file of its own plus one line in policy_registry.cc. May memoise;
// not thread-safe.
class ScorePlugin {
 public:
  virtual ~ScorePlugin() = default;
  virtual double Score(const ScoreInput& in) const = 0;
  // Whether this score also picks the GPU a share of one goes on: the first such policy of a set
  // does (by its score of each candidate GPU); with none, the fullest GPU that fits.
  virtual bool ChoosesShareGpu() const { return false; }
  // Whether equal best scores should go to the node added first (lowest node id) rather than as
  // SchedulerConfig says: how the FGD paper's simulator breaks ties, for reproducing its figures.
  virtual bool TiesToFirstNode() const { return false; }
};

// A filter plugin: a condition a node must meet besides the core's own checks (CPU, memory, and the
// GPU fit that choosing GPUs checks: count, attributes, health, topology requirement). On the hot
// path of every evaluation: returns whether the node passes, and says why not in `why` only when it
// is given.
class FilterPlugin {
 public:
  virtual ~FilterPlugin() = default;
  virtual bool Passes(const NodeView& node, const core::Request& r, std::string* why) const = 0;
};

// The registry: every score policy `--policies` knows, and the filters every placement passes.
struct PolicyDef {
  std::string_view name;
  std::string_view summary;
  std::unique_ptr<ScorePlugin> (*make)(Fragmentation* fragmentation);
};
const std::vector<PolicyDef>& ScorePolicies();
const PolicyDef* FindScorePolicy(std::string_view name);
const std::vector<std::unique_ptr<FilterPlugin>>& Filters();

// Helpers for plugins: healthy free GPU compute of a node and its capacity (thousandths), and
// whether a GPU set satisfies a topology scope.
int64_t GpuLeftTotal(const NodeView& n);
int64_t GpuCapacity(const NodeView& n);
bool SatisfiesScope(const NodeView& n, const absl::InlinedVector<int, 8>& set,
                    core::TopologyScope scope);

class PolicySet {
 public:
  // `policies` must name registered policies (ParsePolicies checks); FGD reads `fragmentation`.
  PolicySet(std::vector<WeightedPolicy> policies, Fragmentation* fragmentation);

  // Filters, chooses GPUs, scores. `want_reason` fills Evaluation::reason when infeasible.
  Evaluation Evaluate(const NodeView& node, const core::Request& r, const ClusterScale& scale,
                      bool want_reason) const;

  const std::vector<WeightedPolicy>& policies() const { return policies_; }
  bool random_only() const;
  // Whether any of the policies wants ties to go to the first node (ScorePlugin::TiesToFirstNode).
  bool ties_to_first_node() const { return ties_to_first_node_; }

 private:
  std::vector<WeightedPolicy> policies_;
  std::vector<std::unique_ptr<ScorePlugin>> scores_;  // one per policy, same order
  const std::vector<std::unique_ptr<FilterPlugin>>* filters_;
  const ScorePlugin* share_chooser_ = nullptr;  // the first that ChoosesShareGpu
  bool ties_to_first_node_ = false;
};

// Interference-aware sharing: whether a share `r` may go on GPU `g` as far as predicted
// utilization goes - no ceiling, no prediction for `r`, no predicted holder on `g`, or their
// predicted utilization plus `r`'s within the ceiling (core::Request::util_ceiling_pct).
bool UnderUtilizationCeiling(const ClassGpu& g, const core::Request& r);

// Whether GPU kind `k` of `shape` meets the request's attribute selector.
bool KindAccepted(const NodeShape& shape, uint16_t kind, const core::Request& r);

// Link cost of a GPU set on a node (lower is better): summed over pairs, NVLink cheapest (more
// links cheaper), then PCIe levels in order. 0 for fewer than two GPUs or unknown topology.
double LinkCost(const core::Topology& topo, const absl::InlinedVector<int, 8>& gpus);

// The GPUs a device of `size` should get on one node (sorted indices): `must_include` plus the
// rest from `available`, the best-linked set that leaves the remaining GPUs best linked (the same
// choice the scheduler makes when placing). Empty when `size` cannot be met. Used by the device
// plugin's GetPreferredAllocation.
std::vector<int> PreferredGpuSet(const core::Topology& topology, const std::vector<int>& available,
                                 const std::vector<int>& must_include, int size);

// The order in which GPUs give shares to a device of `want` shares on one node: `first` (the GPUs
// of its required shares, then the scheduler's choice), then best fit - the GPUs whose free shares
// (`free`: GPU index -> free shares) can hold all of them, fewest free first - then the others,
// most free first: packed onto as few GPUs as possible, the fullest that holds them first, leaving
// whole GPUs free for whole-GPU work (the bin packing the scheduler does for shares). Used by the
// device plugin's GetPreferredAllocation for the share resource.
std::vector<int> ShareGpuOrder(const std::map<int, int>& free, int want,
                               const std::vector<int>& first);

}  // namespace tessera::sched
