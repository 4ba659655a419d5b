#include "tessera/sched/policy.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/numbers.h"
#include "fmt/format.h"

namespace tessera::sched {
namespace {

double PairCost(const core::GpuLink& l) {
  if (l.nvlinks > 0) return 0.5 - std::min(l.nvlinks, 63) / 128.0;
  switch (l.pcie) {
    case core::PcieLevel::kSelf:
      return 0;
    case core::PcieLevel::kBoard:
      return 1;
    case core::PcieLevel::kSingleSwitch:
      return 2;
    case core::PcieLevel::kMultipleSwitches:
      return 3;
    case core::PcieLevel::kHostBridge:
      return 4;
    case core::PcieLevel::kNumaNode:
      return 5;
    default:
      return 6;
  }
}

// Chooses `k` of the free GPUs, `must` among them: the best-linked set that `accept` takes, and
// among equals the one that leaves the remaining free GPUs best linked. Returns false if no set
// qualifies. A template on `accept` so the scheduler's hot path pays no indirect call.
using Gpus = absl::InlinedVector<int, 8>;

template <typename Accept>
bool ChooseBestLinked(const core::Topology& topo, const Gpus& free, const Gpus& must, int k,
                      const Accept& accept, Gpus& out) {
  const int m = static_cast<int>(free.size());
  const int pick = k - static_cast<int>(must.size());
  if (pick < 0 || pick > m) return false;
  // Exhaustive over combinations when small (8 GPUs: at most 70 sets), greedy otherwise.
  double combos = 1;
  for (int i = 0; i < pick; ++i) combos = combos * (m - i) / (i + 1);
  double best_cost = 0, best_rest = 0;
  bool found = false;
  auto consider = [&](const Gpus& set) {
    if (!accept(set)) return;
    double cost = LinkCost(topo, set);
    Gpus rest;
    for (int f : free) {
      if (std::find(set.begin(), set.end(), f) == set.end()) rest.push_back(f);
    }
    double rest_cost =
        rest.size() > 1 ? LinkCost(topo, rest) / (rest.size() * (rest.size() - 1) / 2) : 0;
    if (!found || cost < best_cost - 1e-9 ||
        (cost < best_cost + 1e-9 && rest_cost < best_rest - 1e-9)) {
      found = true;
      best_cost = cost;
      best_rest = rest_cost;
      out = set;
    }
  };
  if (combos <= 5000) {
    std::vector<int> idx(pick);
    for (int i = 0; i < pick; ++i) idx[i] = i;
    Gpus set(must.begin(), must.end());
    set.resize(k);
    const int base = static_cast<int>(must.size());
    for (;;) {
      for (int i = 0; i < pick; ++i) set[base + i] = free[idx[i]];
      consider(set);
      int i = pick - 1;
      while (i >= 0 && idx[i] == m - pick + i) --i;
      if (i < 0) break;
      ++idx[i];
      for (int j = i + 1; j < pick; ++j) idx[j] = idx[j - 1] + 1;
    }
  } else {
    for (int seed : must.empty() ? free : must) {
      Gpus set(must.begin(), must.end());
      if (must.empty()) set.push_back(seed);
      while (static_cast<int>(set.size()) < k) {
        int best = -1;
        double best_add = 0;
        for (int f : free) {
          if (std::find(set.begin(), set.end(), f) != set.end()) continue;
          double add = 0;
          for (int s : set) add += PairCost(topo.link(s, f));
          if (best < 0 || add < best_add) {
            best = f;
            best_add = add;
          }
        }
        set.push_back(best);
      }
      std::sort(set.begin(), set.end());
      consider(set);
      if (!must.empty()) break;  // the greedy fill from the required GPUs is one candidate
    }
  }
  return found;
}

bool ChooseLinkedSet(const NodeView& n, const Gpus& free, int k, const core::Request& r,
                     Gpus& out) {
  if (r.topology != core::TopologyMode::kRequire) {
    return ChooseBestLinked(
        n.shape->topology, free, {}, k, [](const Gpus&) { return true; }, out);
  }
  return ChooseBestLinked(
      n.shape->topology, free, {}, k,
      [&](const Gpus& set) { return SatisfiesScope(n, set, r.topology_scope); }, out);
}

}  // namespace

int64_t GpuLeftTotal(const NodeView& n) {
  int64_t total = 0;
  for (const ClassGpu& g : *n.gpus) {
    if (g.healthy) total += g.milli_left;
  }
  return total;
}

int64_t GpuCapacity(const NodeView& n) {
  return static_cast<int64_t>(n.gpus->size()) * core::kMilliPerGpu;
}

// GPU index (in the shape) of view position p: the identity for positional shapes. For sorted
// shapes the position carries no index; links are then uniform, so any index serves.
static int ShapeIndex(const NodeView& n, int p) { return p; }

bool SatisfiesScope(const NodeView& n, const absl::InlinedVector<int, 8>& set,
                    core::TopologyScope scope) {
  const NodeShape& s = *n.shape;
  for (size_t i = 0; i < set.size(); ++i) {
    for (size_t j = i + 1; j < set.size(); ++j) {
      int a = ShapeIndex(n, set[i]), b = ShapeIndex(n, set[j]);
      if (scope == core::TopologyScope::kNvlink) {
        if (s.topology.size() == 0 || s.topology.link(a, b).nvlinks == 0) return false;
      } else if (s.gpus[a].numa_node < 0 || s.gpus[a].numa_node != s.gpus[b].numa_node) {
        return false;
      }
    }
  }
  return true;
}

std::vector<int> ShareGpuOrder(const std::map<int, int>& free, int want,
                               const std::vector<int>& first) {
  std::vector<int> order = first;
  std::vector<std::pair<int, int>> fits, rest;  // (free shares, GPU)
  for (const auto& [g, n] : free) (n >= want ? fits : rest).emplace_back(n, g);
  std::sort(fits.begin(), fits.end());
  std::sort(rest.begin(), rest.end(), std::greater<>());
  for (const auto& [n, g] : fits) order.push_back(g);
  for (const auto& [n, g] : rest) order.push_back(g);
  return order;
}

std::vector<int> PreferredGpuSet(const core::Topology& topology, const std::vector<int>& available,
                                 const std::vector<int>& must_include, int size) {
  Gpus must(must_include.begin(), must_include.end());
  std::sort(must.begin(), must.end());
  must.erase(std::unique(must.begin(), must.end()), must.end());
  Gpus free;
  for (int g : available) {
    if (!std::binary_search(must.begin(), must.end(), g)) free.push_back(g);
  }
  std::sort(free.begin(), free.end());
  free.erase(std::unique(free.begin(), free.end()), free.end());
  Gpus out;
  if (size <= 0 || !ChooseBestLinked(
                       topology, free, must, size, [](const Gpus&) { return true; }, out)) {
    return {};
  }
  std::vector<int> result(out.begin(), out.end());
  std::sort(result.begin(), result.end());
  return result;
}

std::vector<std::string> AllPolicyNames() {
  std::vector<std::string> out;
  for (const PolicyDef& d : ScorePolicies()) out.emplace_back(d.name);
  return out;
}

std::vector<WeightedPolicy> DefaultPolicies() {
  return {{"fgd", 1}, {"stranded", 0.05}, {"bestfit", 0.01}, {"topology", 0.5}};
}

absl::StatusOr<std::vector<WeightedPolicy>> ParsePolicies(const std::string& text) {
  std::vector<WeightedPolicy> out;
  if (text == "all") {
    for (const std::string& name : AllPolicyNames()) out.push_back({name, 1});
    return out;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    start = end + 1;
    std::string name = item;
    double weight = 1;
    if (size_t colon = item.find(':'); colon != std::string::npos) {
      name = item.substr(0, colon);
      if (!absl::SimpleAtod(item.substr(colon + 1), &weight) || !(weight > 0) || weight > 1e6) {
        return absl::InvalidArgumentError(
            fmt::format("policy '{}': weight must be a positive number", item));
      }
    }
    if (name == "tessera") {
      for (const WeightedPolicy& p : DefaultPolicies()) out.push_back({p.name, p.weight * weight});
      if (end == text.size()) break;
      continue;
    }
    if (FindScorePolicy(name) == nullptr) {
      std::string known;
      for (const std::string& k : AllPolicyNames()) known += (known.empty() ? "" : ", ") + k;
      return absl::InvalidArgumentError(
          fmt::format("unknown policy '{}' (known: {}, tessera, or all)", name, known));
    }
    out.push_back({name, weight});
    if (end == text.size()) break;
  }
  if (out.empty()) return absl::InvalidArgumentError("no policy given");
  return out;
}

bool KindAccepted(const NodeShape& shape, uint16_t kind, const core::Request& r) {
  return core::GpuAccepted(shape.kinds[kind], r);
}

bool NodeView::Accepts(uint16_t kind, const core::Request& r) const {
  if (accepted_kinds >= 0) return (accepted_kinds >> kind) & 1;
  return KindAccepted(*shape, kind, r);
}

double LinkCost(const core::Topology& topo, const absl::InlinedVector<int, 8>& gpus) {
  if (gpus.size() < 2) return 0;
  double cost = 0;
  for (size_t i = 0; i < gpus.size(); ++i) {
    for (size_t j = i + 1; j < gpus.size(); ++j) {
      cost += topo.size() == 0 ? 6 : PairCost(topo.link(gpus[i], gpus[j]));
    }
  }
  return cost;
}

PolicySet::PolicySet(std::vector<WeightedPolicy> policies, Fragmentation* fragmentation)
    : policies_(std::move(policies)), filters_(&Filters()) {
  for (const WeightedPolicy& p : policies_) {
    const PolicyDef* def = FindScorePolicy(p.name);
    // Names come from ParsePolicies or the code's own lists; an unknown one is a programming error.
    if (def == nullptr) {
      fmt::print(stderr, "tessera: unknown policy '{}'\n", p.name);
      std::abort();
    }
    scores_.push_back(def->make(fragmentation));
    if (share_chooser_ == nullptr && scores_.back()->ChoosesShareGpu())
      share_chooser_ = scores_.back().get();
    ties_to_first_node_ = ties_to_first_node_ || scores_.back()->TiesToFirstNode();
  }
}

namespace {
constexpr double kOverCeilingPenalty = 1000;
}  // namespace

bool UnderUtilizationCeiling(const ClassGpu& g, const core::Request& r) {
  return r.util_ceiling_pct <= 0 || r.expected_util_pct <= 0 || g.util_pct <= 0 ||
         g.util_pct + r.expected_util_pct <= r.util_ceiling_pct;
}

bool PolicySet::random_only() const {
  return std::all_of(policies_.begin(), policies_.end(),
                     [](const WeightedPolicy& p) { return p.name == "random"; });
}

Evaluation PolicySet::Evaluate(const NodeView& node, const core::Request& r,
                               const ClusterScale& scale, bool want_reason) const {
  Evaluation ev;
  int over_ceiling = 0;  // percentage points a share's GPU would be predicted over the ceiling
  // CPU and memory first: the cheapest checks, inline on this hot path (every evaluation of every
  // changed class); then any further filter plugins.
  if (node.cpu_left < r.cpu_milli) {
    if (want_reason) ev.reason = fmt::format("{}m CPU free, wants {}m", node.cpu_left, r.cpu_milli);
    return ev;
  }
  if (node.memory_left < r.memory_mib) {
    if (want_reason) {
      ev.reason = fmt::format("{} MiB memory free, wants {} MiB", node.memory_left, r.memory_mib);
    }
    return ev;
  }
  for (const std::unique_ptr<FilterPlugin>& f : *filters_) {
    if (!f->Passes(node, r, want_reason ? &ev.reason : nullptr)) return ev;
  }
  const NodeShape& shape = *node.shape;
  const std::vector<ClassGpu>& gpus = *node.gpus;
  if (r.gpus > 0) {
    Gpus free;
    int accepted = 0, sick = 0;
    for (size_t p = 0; p < gpus.size(); ++p) {
      const ClassGpu& g = gpus[p];
      if (!node.Accepts(g.kind, r)) continue;
      ++accepted;
      if (!g.healthy) {
        ++sick;
        continue;
      }
      if (g.milli_left == core::kMilliPerGpu &&
          g.memory_left_mib == shape.kinds[g.kind].memory_mib) {
        free.push_back(static_cast<int>(p));
      }
    }
    if (static_cast<int>(free.size()) < r.gpus) {
      if (want_reason) {
        if (accepted == 0) {
          ev.reason = gpus.empty() ? "has no GPUs" : "no GPU matches the selector";
        } else {
          ev.reason = fmt::format("{} healthy GPU{} free, wants {}", free.size(),
                                  free.size() == 1 ? "" : "s", r.gpus);
          if (sick > 0) ev.reason += fmt::format(" ({} unhealthy)", sick);
        }
      }
      return ev;
    }
    if (r.gpus >= 2 && (shape.positional || r.topology == core::TopologyMode::kRequire)) {
      if (!ChooseLinkedSet(node, free, r.gpus, r, ev.positions)) {
        if (want_reason) {
          ev.reason =
              fmt::format("no {} free GPUs {}", r.gpus,
                          r.topology_scope == core::TopologyScope::kNvlink ? "all linked by NVLink"
                                                                           : "on one NUMA node");
        }
        return ev;
      }
    } else {
      ev.positions.assign(free.begin(), free.begin() + r.gpus);
    }
  } else if (r.fractional()) {
    Gpus candidates, over;  // with room: within the utilization ceiling, or over it
    int other_users = 0;    // with room, but running another owner's MPS clients
    for (size_t p = 0; p < gpus.size(); ++p) {
      const ClassGpu& g = gpus[p];
      // A GPU held whole (no compute left) takes no share, not even a memory-only one.
      if (g.healthy && node.Accepts(g.kind, r) && g.milli_left >= std::max(r.gpu_milli, 1) &&
          g.memory_left_mib >= r.gpu_memory_mib) {
        if (!MpsUserAllows(g.mps_user, r)) {
          ++other_users;
          continue;
        }
        (UnderUtilizationCeiling(g, r) ? candidates : over).push_back(static_cast<int>(p));
      }
    }
    const size_t want = static_cast<size_t>(r.shared_gpu_count());
    if (candidates.size() + (r.util_ceiling_strict ? 0 : over.size()) < want) {
      if (want_reason) {
        if (gpus.empty()) {
          ev.reason = "has no GPUs";
        } else if (other_users > 0 && candidates.size() + over.size() < want) {
          ev.reason = fmt::format(
              "{} MPS GPU{} with room run{} another user's clients (MPS serves one user per GPU "
              "at a time)",
              other_users, other_users == 1 ? "" : "s", other_users == 1 ? "s" : "");
        } else if (!over.empty()) {
          ev.reason = fmt::format(
              "{} GPU{} with room would be predicted busier than the {}% utilization ceiling "
              "with this job's {}%",
              over.size(), over.size() == 1 ? "" : "s", r.util_ceiling_pct, r.expected_util_pct);
        } else if (want == 1) {
          ev.reason = fmt::format("no healthy GPU has {}/1000 compute and {} MiB free", r.gpu_milli,
                                  r.gpu_memory_mib);
        } else {
          ev.reason = fmt::format("{} healthy GPU{} {}/1000 compute and {} MiB free, wants {}",
                                  candidates.size() + over.size(),
                                  candidates.size() + over.size() == 1 ? " has" : "s have",
                                  r.gpu_milli, r.gpu_memory_mib, want);
        }
      }
      return ev;
    }
    if (candidates.size() >= want) {
      // The first policy with a GPU preference chooses; otherwise the fullest GPUs that fit
      // (packing within the node keeps whole GPUs free). Best first, ties to the lower index.
      absl::InlinedVector<std::pair<double, int>, 8> valued;
      for (int p : candidates) {
        double value;
        if (share_chooser_ != nullptr) {
          const Gpus one = {p};
          value = share_chooser_->Score(ScoreInput{node, r, one, scale});
        } else {
          value = -(gpus[p].milli_left * 1e7 + static_cast<double>(gpus[p].memory_left_mib));
        }
        valued.emplace_back(value, p);
      }
      std::stable_sort(valued.begin(), valued.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first + 1e-12; });
      for (size_t i = 0; i < want; ++i) ev.positions.push_back(valued[i].second);
    } else {
      // Not enough GPUs within the ceiling: those, then the least busy of the rest, and the place
      // is scored below any within it, by how far over it goes.
      std::stable_sort(over.begin(), over.end(),
                       [&](int a, int b) { return gpus[a].util_pct < gpus[b].util_pct; });
      ev.positions.assign(candidates.begin(), candidates.end());
      for (size_t i = 0; ev.positions.size() < want; ++i) {
        ev.positions.push_back(over[i]);
        over_ceiling = std::max(over_ceiling,
                                gpus[over[i]].util_pct + r.expected_util_pct - r.util_ceiling_pct);
      }
    }
    std::sort(ev.positions.begin(), ev.positions.end());
  }
  ev.feasible = true;
  const ScoreInput in{node, r, ev.positions, scale};
  for (size_t i = 0; i < scores_.size(); ++i)
    ev.score += policies_[i].weight * scores_[i]->Score(in);
  // Over the utilization ceiling: below every place within it (scores are far smaller than the
  // penalty), the less over the better.
  if (over_ceiling > 0) ev.score -= kOverCeilingPenalty + over_ceiling;
  return ev;
}

}  // namespace tessera::sched
