#pragma once
// Scheduler: the decisions of Tessera. Places requests (whole GPUs or a share of one) on a
// ClusterState by the configured filters and weighted scores, places gangs all-or-nothing, enforces
// quotas, and plans (never executes) preemption. The same code serves the simulator, the standalone
// server and the Kubernetes extender. Deterministic for a given seed and call sequence. Not
// thread-safe.

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/sched/cluster_state.h"
#include "tessera/sched/fragmentation.h"
#include "tessera/sched/policy.h"
#include "tessera/sched/quota.h"

namespace tessera::sched {

struct SchedulerConfig {
  // Tessera's default ("tessera" in ParsePolicies): FGD; a twentieth of its weight on what runs of
  // the typical requests could not fill (stranded: a node whose CPU runs out before its GPUs do);
  // best fit as a light tie-breaker (FGD's differences are often tiny or nil; packing the fuller
  // node keeps empty ones whole); and topology.
  std::vector<WeightedPolicy> policies = DefaultPolicies();
  uint64_t seed = 42;
  // Equal best scores are broken at random (seeded), node-uniformly, like kube-scheduler; otherwise
  // the lowest-numbered class of identical nodes wins. A policy that asks for ties to the first
  // node (fgd-paper: ScorePlugin::TiesToFirstNode) overrides both: the lowest node id wins.
  bool random_ties = true;
  // Whether a placement that fails says why per node (Decision::why_not and the error message).
  // Costs a pass over the cluster per failure; a simulator that only counts failures turns it off.
  bool explain_failures = true;
};

struct Decision {
  bool placed = false;
  NodeId node = -1;
  std::vector<int> gpus;  // GPU indices on the node
  double score = 0;
  std::string why_not;  // when not placed: the reasons, with how many nodes gave each
};

struct PreemptionPlan {
  bool possible = false;
  NodeId node = -1;
  std::vector<int> gpus;             // where the request would go once the victims are gone
  std::vector<std::string> victims;  // allocation ids, gang mates included
  std::string why_not;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config = {});
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Adds a node (see ClusterState::AddNode).
  absl::StatusOr<NodeId> AddNode(core::NodeSpec spec);
  // Takes a node out (ClusterState::RemoveNode): its allocations are released (their quota use
  // given back) and returned. kNotFound for an unknown or removed node.
  absl::StatusOr<std::vector<Allocation>> RemoveNode(NodeId node);
  // Sets the workload FGD measures fragmentation against. Without it FGD scores every node alike.
  void SetTypicalRequests(std::vector<TypicalRequest> typical);
  absl::Status SetGpuHealth(NodeId node, int gpu, bool healthy);

  const ClusterState& state() const { return state_; }
  // Changes with anything a decision depends on: allocations, nodes, GPU health, quota limits (and
  // typical requests). Equal versions: the same inputs.
  uint64_t version() const {
    return state_.change_base() + state_.class_changes().size() + quotas_.limits_version() +
           typical_version_;
  }
  QuotaManager& quotas() { return quotas_; }
  const QuotaManager& quotas() const { return quotas_; }
  const SchedulerConfig& config() const { return config_; }

  // A trial: what-ifs made between BeginTrial and EndTrial (releases, placements) are all undone
  // by its end, so the state is then as it was (Cycle::Reserve's). Decisions remembered by state
  // (a shape that found no node) are neither used nor kept inside one, and outlive it: a trial
  // does not count as a change of the state they were made on. Trials nest.
  void BeginTrial();
  void EndTrial();
  // version() less what trials changed and undid: equal values, the same state (outside trials).
  uint64_t state_version() const { return version() - trial_bumps_; }

  // Where `r` would go now, without changing anything. Quotas are not consulted.
  Decision Decide(const core::Request& r);

  // Decides and records. kInvalidArgument for a malformed request or an id in use;
  // kResourceExhausted when nothing fits or a quota says no (the message says why).
  absl::StatusOr<Allocation> Place(const core::Request& r, double now = 0);
  // Whether Place(r, now) would succeed now. Changes nothing, not even the tie-breaks' random
  // sequence (a later Place chooses as if this had not been asked).
  bool Fits(const core::Request& r, double now = 0);
  // All members or none. Members share `gang` and `gang_size` == members.size().
  absl::StatusOr<std::vector<Allocation>> PlaceGang(const std::vector<core::Request>& members,
                                                    double now = 0);
  // Records an allocation decided earlier (a server re-adopting its running jobs after a restart):
  // the same checks as ClusterState::Apply, and the owner's quota use. Ignores the quota limits.
  absl::Status Restore(const Allocation& a);
  // Gives an allocation's resources back; kNotFound if unknown.
  absl::StatusOr<Allocation> Release(const std::string& id);

  // For a request that does not fit: the node and victims that would make it fit, fewest victims
  // first, then the lowest priorities, then the least work lost. Victims are lower-priority
  // preemptible allocations (of its own owner only, unless Request::preempts_others), and
  // allocations on borrowed quota when the requester is within its own quota; a victim's gang goes
  // with it. Changes nothing.
  PreemptionPlan PlanPreemption(const core::Request& r, double now = 0);

  // Every node's verdict for `r`: "fits (score 0.83, GPUs 2,3)" or why not. For people and logs.
  std::vector<std::pair<std::string, std::string>> Explain(const core::Request& r);

  // The best score any node offers `r`, by evaluating every class afresh (no cache); nullopt if no
  // node fits. Slow: for tests and consistency checks of the incremental caches Decide uses.
  std::optional<double> BestScoreUncached(const core::Request& r);

  // The cluster's fragmentation now, by FGD's measure against the typical requests (thousandths of
  // a GPU); 0 without typical requests.
  double FragmentedMilli() { return fragmentation_.OfCluster(state_); }

  // The GPU amounts an allocation counts against its owner's quota.
  GpuAmount QuotaAmount(const core::Request& r, NodeId node, const std::vector<int>& gpus) const;

  // The best of a subtree of classes: its score and how many nodes share it (0 = none feasible).
  struct Best {
    double score = -std::numeric_limits<double>::infinity();
    uint64_t weight = 0;
    NodeId first = std::numeric_limits<NodeId>::max();  // lowest node among the tied, when kept
  };

 private:
  // PlanPreemption's search, node by node (scheduler.cc).
  struct PreemptionSearch;
  // A cached evaluation of one class for one request shape: valid while `generation` matches the
  // class's; score -infinity = infeasible.
  struct Entry {
    double score = 0;
    uint64_t choice = 0;  // GPU positions in class order
    uint32_t generation = 0;
    bool valid = false;
  };
  // Spread: "no class of this node shape fits" as of `seen` insertions in epoch `epoch`.
  struct NoneFit {
    uint64_t epoch = 0;
    size_t seen = 0;
    bool valid = false;
  };
  // Per request shape: every class's cached evaluation and a tournament tree over them, kept
  // current from the cluster's class change log, so a decision costs O(changed classes x log
  // classes) instead of a scan of every class.
  struct Row {
    std::vector<Entry> entries;
    std::vector<Best> tree;  // 1-based heap: internal nodes 1..leaves-1, class c at leaves + c
    int leaves = 0;
    uint64_t cursor = 0;  // next change-log sequence number to apply
    bool built = false;
    // Per node shape: the accepted GPU kinds (NodeView::accepted_kinds), kNeverFits when no node of
    // that shape could take the request even empty, kUnknown before the first look.
    std::vector<int64_t> shape_kinds;
    std::vector<NoneFit> none_fit;  // by node shape (spread only)
    // The last decision that found no node, at scheduler version `failed_at` (+1; 0: none): the
    // same shape at the same version fails the same way, so a queue of blocked requests costs a
    // look each, not a decision (and an explanation) each, pass after pass.
    uint64_t failed_at = 0;
    std::string why_not;
  };
  static constexpr int64_t kUnknown = -2;
  static constexpr int64_t kNeverFits = -3;
  int64_t ShapeKinds(Row& row, ShapeId s, const core::Request& r);
  int InternRequestShape(const core::Request& r);
  const Entry& Evaluated(Row& row, ClassId c, const core::Request& r);
  // Spread alone: its score is a per-(request, node shape) constant minus how used the class is, so
  // within a node shape the classes can be kept in one request-independent order, and a decision
  // probes each node shape's least-used classes until one fits; a node shape where none fits is
  // remembered per request shape, so later decisions look only at its classes created since.
  bool DecideSpread(Row& row, const core::Request& r, Decision& d);
  void SyncSpreadOrder();
  double SpreadKey(ClassId c) const;
  Decision Placed(ClassId chosen, uint64_t u, const Entry& e);
  // The tied best class that holds the lowest node, and that node (ties to the first node).
  Decision PlacedOnFirstNode(const Row& row, const Best& root);
  NodeView ViewOf(ClassId c) const;
  void Ensure(Row& row, ClassId c, const core::Request& r);
  void Rebuild(Row& row, const core::Request& r);
  void Refresh(Row& row, const core::Request& r);
  std::string WhyNot(const core::Request& r);
  void ResetCaches();
  // Adds (sign +1) or takes back (-1) `amount` on the request's owner and each of its quota groups.
  void Charge(const core::Request& r, const GpuAmount& amount, int sign);

  SchedulerConfig config_;
  ClusterState state_;
  QuotaManager quotas_;
  Fragmentation fragmentation_;
  PolicySet policies_;
  ClusterScale scale_;
  std::mt19937_64 rng_;
  uint64_t typical_version_ = 0;
  int trial_depth_ = 0;
  uint64_t trial_from_ = 0;   // version() when the outermost trial began
  uint64_t trial_bumps_ = 0;  // version changes inside trials, all undone

  std::unordered_map<std::string, int> request_shapes_;
  std::vector<Row> cache_;      // [request shape]
  std::vector<uint8_t> dirty_;  // scratch for Refresh: internal tree nodes queued
  bool spread_only_ = false;
  bool first_node_ties_ = false;  // a policy asks for ties to the first node
  std::vector<std::set<std::pair<double, ClassId>>>
      spread_order_;                   // by node shape, least used first
  std::vector<double> spread_key_;     // by class; NaN = not ordered
  std::vector<ShapeId> spread_shape_;  // by class: the set it is in
  uint64_t spread_cursor_ = 0;
  // Classes inserted into each node shape's order (with their generation), for the no-fit memos.
  std::vector<std::vector<std::pair<ClassId, uint32_t>>> spread_inserted_;
  size_t spread_inserted_total_ = 0;
  uint64_t spread_epoch_ = 1;
  std::vector<int> level_, next_level_;
};

}  // namespace tessera::sched
