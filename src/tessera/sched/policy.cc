#include "tessera/sched/policy.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/numbers.h"
#include "fmt/format.h"

namespace tessera::sched {
namespace {

struct KindName {
  PolicyKind kind;
  std::string_view name;
};
constexpr KindName kNames[] = {
    {PolicyKind::kRandom, "random"},
    {PolicyKind::kSpread, "spread"},
    {PolicyKind::kBinpack, "binpack"},
    {PolicyKind::kBestFit, "bestfit"},
    {PolicyKind::kDotProduct, "dotprod"},
    {PolicyKind::kGpuPacking, "gpupacking"},
    {PolicyKind::kGpuClustering, "gpuclustering"},
    {PolicyKind::kFgd, "fgd"},
    {PolicyKind::kTopology, "topology"},
};

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
int ShapeIndex(const NodeView& n, int p) { return p; }

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

// Chooses `k` of the free GPUs: the best-linked set (that satisfies a required scope), and among
// equals the one that leaves the remaining free GPUs best linked. Returns false if no set
// qualifies.
using Gpus = absl::InlinedVector<int, 8>;

bool ChooseLinkedSet(const NodeView& n, const Gpus& free, int k, const core::Request& r,
                     Gpus& out) {
  const core::Topology& topo = n.shape->topology;
  bool need = r.topology == core::TopologyMode::kRequire;
  const int m = static_cast<int>(free.size());
  // Exhaustive over combinations when small (8 GPUs: at most 70 sets), greedy otherwise.
  double combos = 1;
  for (int i = 0; i < k; ++i) combos = combos * (m - i) / (i + 1);
  double best_cost = 0, best_rest = 0;
  bool found = false;
  auto consider = [&](const Gpus& set) {
    if (need && !SatisfiesScope(n, set, r.topology_scope)) return;
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
    std::vector<int> idx(k);
    for (int i = 0; i < k; ++i) idx[i] = i;
    Gpus set(k);
    for (;;) {
      for (int i = 0; i < k; ++i) set[i] = free[idx[i]];
      consider(set);
      int i = k - 1;
      while (i >= 0 && idx[i] == m - k + i) --i;
      if (i < 0) break;
      ++idx[i];
      for (int j = i + 1; j < k; ++j) idx[j] = idx[j - 1] + 1;
    }
  } else {
    for (int seed : free) {
      Gpus set = {seed};
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
    }
  }
  return found;
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

std::string_view PolicyName(PolicyKind kind) {
  for (const KindName& k : kNames) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

std::vector<PolicyKind> AllPolicyKinds() {
  std::vector<PolicyKind> out;
  for (const KindName& k : kNames) out.push_back(k.kind);
  return out;
}

std::vector<WeightedPolicy> DefaultPolicies() {
  return {{PolicyKind::kFgd, 1}, {PolicyKind::kBestFit, 0.01}, {PolicyKind::kTopology, 0.5}};
}

absl::StatusOr<std::vector<WeightedPolicy>> ParsePolicies(const std::string& text) {
  std::vector<WeightedPolicy> out;
  if (text == "all") {
    for (PolicyKind k : AllPolicyKinds()) out.push_back({k, 1});
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
      for (WeightedPolicy p : DefaultPolicies()) out.push_back({p.kind, p.weight * weight});
      if (end == text.size()) break;
      continue;
    }
    auto it = std::find_if(std::begin(kNames), std::end(kNames),
                           [&](const KindName& k) { return k.name == name; });
    if (it == std::end(kNames)) {
      std::string known;
      for (const KindName& k : kNames) known += (known.empty() ? "" : ", ") + std::string(k.name);
      return absl::InvalidArgumentError(
          fmt::format("unknown policy '{}' (known: {}, tessera, or all)", name, known));
    }
    out.push_back({it->kind, weight});
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

bool PolicySet::random_only() const {
  return std::all_of(policies_.begin(), policies_.end(),
                     [](const WeightedPolicy& p) { return p.kind == PolicyKind::kRandom; });
}

Evaluation PolicySet::Evaluate(const NodeView& node, const core::Request& r,
                               const ClusterScale& scale, bool want_reason) const {
  Evaluation ev;
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
    Gpus candidates;
    for (size_t p = 0; p < gpus.size(); ++p) {
      const ClassGpu& g = gpus[p];
      // A GPU held whole (no compute left) takes no share, not even a memory-only one.
      if (g.healthy && node.Accepts(g.kind, r) && g.milli_left >= std::max(r.gpu_milli, 1) &&
          g.memory_left_mib >= r.gpu_memory_mib) {
        candidates.push_back(static_cast<int>(p));
      }
    }
    if (candidates.empty()) {
      if (want_reason) {
        ev.reason = gpus.empty() ? "has no GPUs"
                                 : fmt::format("no healthy GPU has {}/1000 compute and {} MiB free",
                                               r.gpu_milli, r.gpu_memory_mib);
      }
      return ev;
    }
    // The first policy with a GPU preference chooses; otherwise the fullest GPU that fits (packing
    // within the node keeps whole GPUs free).
    PolicyKind chooser = PolicyKind::kBestFit;
    for (const WeightedPolicy& p : policies_) {
      if (p.kind == PolicyKind::kFgd || p.kind == PolicyKind::kDotProduct) {
        chooser = p.kind;
        break;
      }
    }
    int best = -1;
    double best_value = 0;
    for (int p : candidates) {
      double value;
      if (chooser == PolicyKind::kFgd && frag_ != nullptr) {
        value = Score(PolicyKind::kFgd, node, r, {p}, scale);
      } else if (chooser == PolicyKind::kDotProduct) {
        value = Score(PolicyKind::kDotProduct, node, r, {p}, scale);
      } else {
        value = -(gpus[p].milli_left * 1e7 + static_cast<double>(gpus[p].memory_left_mib));
      }
      if (best < 0 || value > best_value + 1e-12) {
        best = p;
        best_value = value;
      }
    }
    ev.positions = {best};
  }
  ev.feasible = true;
  for (const WeightedPolicy& p : policies_) {
    ev.score += p.weight * Score(p.kind, node, r, ev.positions, scale);
  }
  return ev;
}

double PolicySet::Score(PolicyKind kind, const NodeView& node, const core::Request& r,
                        const absl::InlinedVector<int, 8>& positions,
                        const ClusterScale& scale) const {
  const NodeShape& shape = *node.shape;
  const std::vector<ClassGpu>& gpus = *node.gpus;
  const int64_t req_gpu = r.gpu_milli_total();
  switch (kind) {
    case PolicyKind::kRandom:
      return 0;
    case PolicyKind::kSpread:
    case PolicyKind::kBinpack: {
      double used = 0;
      int dims = 0;
      if (shape.cpu_milli > 0) {
        used += double(shape.cpu_milli - node.cpu_left + r.cpu_milli) / shape.cpu_milli;
        ++dims;
      }
      if (shape.memory_mib > 0) {
        used += double(shape.memory_mib - node.memory_left + r.memory_mib) / shape.memory_mib;
        ++dims;
      }
      if (!gpus.empty()) {
        used += double(GpuCapacity(node) - GpuLeftTotal(node) + req_gpu) / GpuCapacity(node);
        ++dims;
      }
      double u = dims ? used / dims : 0;
      return kind == PolicyKind::kBinpack ? u : 1 - u;
    }
    case PolicyKind::kBestFit: {
      double s = 0.5 * double(node.cpu_left - r.cpu_milli) / scale.max_cpu_milli +
                 0.5 * double(GpuLeftTotal(node) - req_gpu) / scale.max_gpu_milli;
      return 1 - s;
    }
    case PolicyKind::kDotProduct: {
      if (shape.cpu_milli == 0) return 0;
      double free_cpu = double(node.cpu_left) / shape.cpu_milli;
      double want_cpu = double(r.cpu_milli) / shape.cpu_milli;
      double free_gpu = 0, want_gpu = 0;
      if (r.fractional() && !positions.empty()) {
        free_gpu = gpus[positions[0]].milli_left / 1000.0;
        want_gpu = r.gpu_milli / 1000.0;
      } else if (!gpus.empty()) {
        free_gpu = double(GpuLeftTotal(node)) / GpuCapacity(node);
        want_gpu = double(req_gpu) / GpuCapacity(node);
      }
      return 1 - (free_cpu * want_cpu + free_gpu * want_gpu) / 2;
    }
    case PolicyKind::kGpuPacking: {
      if (!r.wants_gpu()) return 0;
      int fully_free = 0;
      for (const ClassGpu& g : gpus) fully_free += g.healthy && g.milli_left == core::kMilliPerGpu;
      if (fully_free == static_cast<int>(gpus.size())) {
        return std::max(100 / 3 - fully_free, fully_free) / 100.0;
      }
      int free_used = 0;
      int64_t free_ratio = 0;
      for (int p : positions) {
        if (gpus[p].milli_left == core::kMilliPerGpu) ++free_used;
        free_ratio += gpus[p].milli_left * 100 / core::kMilliPerGpu;
      }
      if (free_used > 0) return std::max<int64_t>(100 / 2 - free_used, 100 / 3) / 100.0;
      return std::max<int64_t>(100 - free_ratio / 10, 100 / 2) / 100.0;
    }
    case PolicyKind::kGpuClustering: {
      int tag = AffinityTag(r);
      if (tag == 0) return 0;
      uint16_t gpu_tags = node.tags & ~uint16_t{1};  // CPU-only work does not count
      int64_t left = GpuLeftTotal(node);
      int64_t base = 100 / 4 * (scale.max_gpu_milli - left) / scale.max_gpu_milli;
      int64_t offset;
      if (gpu_tags & (1u << tag)) {
        offset = std::popcount(gpu_tags) == 1 ? 75 : 50;
      } else {
        offset = gpu_tags == 0 ? 25 : 0;
      }
      return double(base + offset) / 100.0;
    }
    case PolicyKind::kFgd: {
      // CPU-only requests are scored too: the CPU they take can strand a node's GPUs.
      if (frag_ == nullptr || frag_->empty()) return 0.5;
      double before = frag_->Of(shape, node.shape_id, node.cpu_left, gpus);
      std::vector<ClassGpu> after(gpus.begin(), gpus.end());
      for (int p : positions) {
        after[p].milli_left -= r.fractional() ? r.gpu_milli : core::kMilliPerGpu;
      }
      double frag_after = frag_->Of(shape, node.shape_id, node.cpu_left - r.cpu_milli, after);
      return Sigmoid((before - frag_after) / 1000.0);
    }
    case PolicyKind::kTopology: {
      if (r.gpus < 2) return 1;
      double pairs = double(positions.size()) * (positions.size() - 1) / 2;
      double avg = LinkCost(shape.topology, positions) / pairs;
      double quality = 1.0 / (1.0 + avg);
      if (r.topology == core::TopologyMode::kPrefer) {
        bool ok = shape.topology.size() > 0 && SatisfiesScope(node, positions, r.topology_scope);
        return 0.5 * quality + (ok ? 0.5 : 0);
      }
      return quality;
    }
  }
  return 0;
}

}  // namespace tessera::sched
