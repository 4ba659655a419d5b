// Scheduler::PlanPreemption: which running work a request that cannot be placed may displace, and
// on which node - the cheapest set of lower-priority, preemptible allocations (whole gangs) whose
// going makes it fit.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "fmt/format.h"
#include "tessera/sched/scheduler.h"

namespace tessera::sched {

// PlanPreemption's search: who may be a victim of `r`, and on one node the cheapest set of them
// whose going makes `r` fit there.
struct Scheduler::PreemptionSearch {
  using Cost = std::tuple<size_t, int, int64_t, double>;  // victims, max priority, sum, work lost
  struct NodePlan {
    Cost cost;
    std::vector<int> gpus;
    std::vector<std::string> victims;
  };

  Scheduler& s;
  const core::Request& r;
  double now;
  bool requester_within_quota;
  // Gangs by id, for expanding a victim to its whole gang: built when a victim is in one (a scan
  // of every allocation, which most plans never need).
  std::optional<std::map<std::string, std::vector<const Allocation*>>> gangs;

  PreemptionSearch(Scheduler& sched, const core::Request& req, double t)
      : s(sched),
        r(req),
        now(t),
        requester_within_quota(s.quotas_.WithinOwnLimit(r.owner, s.QuotaAmount(r, 0, {}))) {}

  bool Eligible(const Allocation& a) const {
    if (!a.request.preemptible) return false;
    if (a.reclaimable) return true;
    if (a.request.priority < r.priority) return r.preempts_others || a.request.owner == r.owner;
    return a.borrowed && a.request.owner != r.owner && requester_within_quota;
  }

  // The nodes holding a possible victim, in id order. Most failures have none at all (equal
  // priorities, nothing borrowed): said at once when no preemptible work is below the request or
  // borrowed, else after one pass over the allocations. Only these nodes are looked at one by one
  // (a few GPUs an elastic request grew onto make every request's search look, not at every node).
  std::vector<NodeId> VictimNodes() const {
    const ClusterState& st = s.state_;
    std::vector<NodeId> nodes;
    if (!st.AnyPreemptibleBelow(r.priority) &&
        !(requester_within_quota && st.AnyBorrowedPreemptible())) {
      return nodes;
    }
    for (const auto& [id, a] : st.allocations()) {
      if (Eligible(a)) nodes.push_back(a.node);
    }
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    return nodes;
  }

  const std::vector<const Allocation*>& GangOf(const std::string& gang) {
    if (!gangs) {
      gangs.emplace();
      for (const auto& [id, a] : s.state_.allocations()) {
        if (!a.request.gang.empty()) (*gangs)[a.request.gang].push_back(&a);
      }
    }
    return (*gangs)[gang];
  }

  // The cheapest victims on node `n` (fewest, then lowest priorities, then least work lost), by
  // greedy choice and reprieve; nullopt when no set of them makes `r` fit there.
  std::optional<NodePlan> OnNode(NodeId n) {
    const ClusterState& st = s.state_;
    const NodeShape& shape = st.shape(st.node_shape(n));
    if (shape.cpu_milli < r.cpu_milli || shape.memory_mib < r.memory_mib ||
        static_cast<int>(shape.gpus.size()) < r.gpus) {
      return std::nullopt;
    }
    std::vector<const Allocation*> candidates;
    for (const Allocation* a : st.AllocationsOn(n)) {
      if (Eligible(*a)) candidates.push_back(a);
    }
    if (candidates.empty()) return std::nullopt;
    // Cheapest victims first: lowest priority, then least work done.
    std::stable_sort(candidates.begin(), candidates.end(), [&](const auto* a, const auto* b) {
      if (a->request.priority != b->request.priority)
        return a->request.priority < b->request.priority;
      return a->start_time > b->start_time;
    });
    // The node as it would be with a set of allocations gone, GPUs in index order.
    std::vector<ClassGpu> base(shape.gpus.size());
    for (size_t g = 0; g < base.size(); ++g) {
      const GpuUse& u = st.gpu_use(n, static_cast<int>(g));
      base[g] = ClassGpu{shape.gpu_kind[g], u.healthy, core::kMilliPerGpu - u.milli,
                         shape.gpus[g].memory_mib - u.memory_mib};
      base[g].mps_user = u.mps_user;
    }
    auto fits_without = [&](const std::vector<bool>& gone, Evaluation* out) {
      std::vector<ClassGpu> gpus = base;
      int64_t cpu_left = shape.cpu_milli - st.cpu_used(n);
      int64_t mem_left = shape.memory_mib - st.memory_used(n);
      std::vector<int> mps_gone(gpus.size(), 0);
      for (size_t i = 0; i < candidates.size(); ++i) {
        if (!gone[i]) continue;
        const Allocation* a = candidates[i];
        cpu_left += a->request.cpu_milli;
        mem_left += a->request.memory_mib;
        for (int g : a->gpus) {
          gpus[g].milli_left += a->milli_per_gpu;
          gpus[g].memory_left_mib += a->memory_mib_per_gpu;
          if (a->request.mps() && ++mps_gone[g] == st.gpu_use(n, g).mps_holders)
            gpus[g].mps_user = 0;
        }
      }
      // Whole-GPU holders with memory_mib_per_gpu 0 (mixed sizes) free all of the GPU's memory.
      for (size_t g = 0; g < gpus.size(); ++g) {
        if (gpus[g].milli_left == core::kMilliPerGpu)
          gpus[g].memory_left_mib = shape.gpus[g].memory_mib;
      }
      NodeView v;
      v.shape = &shape;
      v.shape_id = st.node_shape(n);
      v.cpu_left = cpu_left;
      v.memory_left = mem_left;
      v.gpus = &gpus;
      *out = s.policies_.Evaluate(v, r, s.scale_, false);
      return out->feasible;
    };
    // Freeing more never makes a request fit less: when it does not fit with every candidate gone,
    // no subset makes it fit (one evaluation instead of one per candidate, on most nodes of a
    // contended cluster).
    std::vector<bool> gone(candidates.size(), true);
    Evaluation ev;
    if (!fits_without(gone, &ev)) return std::nullopt;
    std::fill(gone.begin(), gone.end(), false);
    bool fits = false;
    for (size_t i = 0; i < candidates.size() && !fits; ++i) {
      gone[i] = true;
      fits = fits_without(gone, &ev);
    }
    if (!fits) return std::nullopt;
    // Reprieve: give back victims, most valuable first, while the request still fits.
    for (size_t i = candidates.size(); i-- > 0;) {
      if (!gone[i]) continue;
      gone[i] = false;
      Evaluation trial;
      if (!fits_without(gone, &trial)) gone[i] = true;
    }
    fits_without(gone, &ev);
    std::set<std::string> victims;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (!gone[i]) continue;
      victims.insert(candidates[i]->id);
      if (!candidates[i]->request.gang.empty()) {
        for (const Allocation* mate : GangOf(candidates[i]->request.gang)) victims.insert(mate->id);
      }
    }
    int max_priority = std::numeric_limits<int>::min();
    int64_t sum_priority = 0;
    double work = 0;
    for (const std::string& id : victims) {
      const Allocation* a = st.Find(id);
      if (!a->request.preemptible) return std::nullopt;  // a gang mate that must not be evicted
      max_priority = std::max(max_priority, a->request.priority);
      sum_priority += a->request.priority;
      work +=
          std::max(0.0, now - a->start_time) * std::max<int64_t>(1, a->request.gpu_milli_total());
    }
    NodePlan plan{Cost{victims.size(), max_priority, sum_priority, work}, {}, {}};
    for (int p : ev.positions) plan.gpus.push_back(p);
    plan.victims.assign(victims.begin(), victims.end());
    return plan;
  }
};

PreemptionPlan Scheduler::PlanPreemption(const core::Request& r, double now) {
  PreemptionPlan plan;
  if (std::string bad = core::ValidateRequest(r); !bad.empty()) {
    plan.why_not = bad;
    return plan;
  }
  Decision direct = Decide(r);
  if (direct.placed) {
    plan.possible = true;
    plan.node = direct.node;
    plan.gpus = direct.gpus;
    return plan;
  }
  PreemptionSearch search(*this, r, now);
  std::optional<PreemptionSearch::NodePlan> best;
  for (NodeId n : search.VictimNodes()) {
    if (!state_.node_live(n)) continue;
    std::optional<PreemptionSearch::NodePlan> p = search.OnNode(n);
    if (p && (!best || p->cost < best->cost)) {
      best = std::move(p);
      plan.node = n;
    }
  }
  if (!best) {
    plan.why_not =
        fmt::format("no set of lower-priority preemptible work makes it fit ({})", direct.why_not);
    return plan;
  }
  plan.possible = true;
  plan.gpus = std::move(best->gpus);
  plan.victims = std::move(best->victims);
  return plan;
}

}  // namespace tessera::sched
