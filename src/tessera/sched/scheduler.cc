#include "tessera/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "fmt/format.h"

namespace tessera::sched {
namespace {

constexpr double kTieEpsilon = 1e-12;

std::string JoinInts(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

}  // namespace

Scheduler::Scheduler(SchedulerConfig config)
    : config_(std::move(config)), policies_(config_.policies, &fragmentation_), rng_(config_.seed) {
  first_node_ties_ = policies_.ties_to_first_node();
  spread_only_ = config_.policies.size() == 1 && config_.policies[0].name == "spread";
}

absl::StatusOr<NodeId> Scheduler::AddNode(core::NodeSpec spec) {
  int64_t gpu_milli = static_cast<int64_t>(spec.gpus.size()) * core::kMilliPerGpu;
  int64_t cpu = spec.cpu_milli;
  auto id = state_.AddNode(std::move(spec));
  if (!id.ok()) return id;
  if (cpu > scale_.max_cpu_milli || gpu_milli > scale_.max_gpu_milli) {
    scale_.max_cpu_milli = std::max(scale_.max_cpu_milli, cpu);
    scale_.max_gpu_milli = std::max(scale_.max_gpu_milli, gpu_milli);
    ResetCaches();  // scores normalised by the largest node changed
  }
  return id;
}

absl::StatusOr<std::vector<Allocation>> Scheduler::RemoveNode(NodeId node) {
  if (node < 0 || node >= state_.node_count() || !state_.node_live(node)) {
    return absl::NotFoundError(fmt::format("no node {} in the model", node));
  }
  // Each allocation's quota charge is given back as it leaves.
  std::vector<Allocation> out;
  for (const Allocation* a : state_.AllocationsOn(node)) {
    const std::string id = a->id;
    if (auto released = Release(id); released.ok()) out.push_back(*std::move(released));
  }
  auto rest = state_.RemoveNode(node);
  if (!rest.ok()) return rest.status();
  return out;
}

void Scheduler::SetTypicalRequests(std::vector<TypicalRequest> typical) {
  fragmentation_ = Fragmentation(std::move(typical));
  ++typical_version_;
  ResetCaches();
}

absl::Status Scheduler::SetGpuHealth(NodeId node, int gpu, bool healthy) {
  return state_.SetGpuHealth(node, gpu, healthy);
}

void Scheduler::ResetCaches() {
  for (Row& row : cache_) {
    row.entries.clear();
    row.built = false;
  }
}

int Scheduler::InternRequestShape(const core::Request& r) {
  auto [it, fresh] =
      request_shapes_.emplace(core::RequestShapeKey(r), static_cast<int>(cache_.size()));
  if (fresh) cache_.emplace_back();
  return it->second;
}

NodeView Scheduler::ViewOf(ClassId c) const {
  NodeView v;
  v.shape_id = state_.class_shape(c);
  v.shape = &state_.shape(v.shape_id);
  v.cpu_left = state_.class_cpu_left(c);
  v.memory_left = state_.class_memory_left(c);
  v.tags = state_.class_tags(c);
  v.gpus = &state_.class_gpus(c);
  return v;
}

namespace {

// Ties (within kTieEpsilon) add up their weights and keep the left (lower class id) score.
inline Scheduler::Best Combine(const Scheduler::Best& a, const Scheduler::Best& b) {
  if (b.weight == 0) return a;
  if (a.weight == 0) return b;
  if (b.score > a.score + kTieEpsilon) return b;
  if (a.score > b.score + kTieEpsilon) return a;
  return {a.score, a.weight + b.weight, std::min(a.first, b.first)};
}

}  // namespace

const Scheduler::Entry& Scheduler::Evaluated(Row& row, ClassId c, const core::Request& r) {
  Entry& e = row.entries[c];
  const uint32_t gen = state_.class_generation(c);
  if (!e.valid || e.generation != gen) {
    int64_t kinds = ShapeKinds(row, state_.class_shape(c), r);
    e.choice = 0;
    if (kinds == kNeverFits) {
      e.score = -std::numeric_limits<double>::infinity();
    } else {
      NodeView view = ViewOf(c);
      view.accepted_kinds = kinds;
      Evaluation ev = policies_.Evaluate(view, r, scale_, false);
      e.score = ev.feasible ? ev.score : -std::numeric_limits<double>::infinity();
      for (int p : ev.positions) e.choice |= 1ull << p;
    }
    e.generation = gen;
    e.valid = true;
  }
  return e;
}

void Scheduler::Ensure(Row& row, ClassId c, const core::Request& r) {
  Best& leaf = row.tree[row.leaves + c];
  const int32_t size = state_.class_sizes()[c];
  if (size == 0) {  // dead classes are never evaluated
    leaf = Best{};
    return;
  }
  const Entry& e = Evaluated(row, c, r);
  // The class's lowest node, for ties to the first node (kept at the maximum otherwise).
  NodeId first = std::numeric_limits<NodeId>::max();
  if (first_node_ties_) {
    for (NodeId m : state_.class_members(c)) first = std::min(first, m);
  }
  leaf = e.score == -std::numeric_limits<double>::infinity()
             ? Best{}
             : Best{e.score, static_cast<uint64_t>(size), first};
}

int64_t Scheduler::ShapeKinds(Row& row, ShapeId s, const core::Request& r) {
  if (row.shape_kinds.size() <= static_cast<size_t>(s)) row.shape_kinds.resize(s + 1, kUnknown);
  int64_t& k = row.shape_kinds[s];
  if (k != kUnknown) return k;
  const NodeShape& shape = state_.shape(s);
  if (shape.kinds.size() > 62) return k = -1;  // too many kinds for a mask: Evaluate checks each
  int64_t mask = 0;
  for (size_t i = 0; i < shape.kinds.size(); ++i) {
    if (KindAccepted(shape, static_cast<uint16_t>(i), r)) mask |= int64_t{1} << i;
  }
  int accepted = 0;
  for (uint16_t kind : shape.gpu_kind) accepted += (mask >> kind) & 1;
  bool never =
      shape.cpu_milli < r.cpu_milli || shape.memory_mib < r.memory_mib || accepted < r.gpu_count();
  return k = never ? kNeverFits : mask;
}

void Scheduler::Rebuild(Row& row, const core::Request& r) {
  const int capacity = state_.class_capacity();
  row.entries.resize(capacity);
  if (row.leaves < capacity || row.leaves < 2) {
    row.leaves = 2;
    while (row.leaves < capacity) row.leaves *= 2;
    row.tree.assign(2 * static_cast<size_t>(row.leaves), Best{});
  }
  for (ClassId c = 0; c < capacity; ++c) Ensure(row, c, r);
  Best* t = row.tree.data();
  for (int i = row.leaves - 1; i >= 1; --i) t[i] = Combine(t[2 * i], t[2 * i + 1]);
  row.cursor = state_.change_base() + state_.class_changes().size();
  row.built = true;
}

void Scheduler::Refresh(Row& row, const core::Request& r) {
  const auto& log = state_.class_changes();
  const uint64_t base = state_.change_base();
  const uint64_t end = base + log.size();
  const int capacity = state_.class_capacity();
  if (!row.built || row.leaves < capacity || row.cursor < base ||
      end - row.cursor > static_cast<uint64_t>(capacity)) {
    Rebuild(row, r);
    return;
  }
  if (row.cursor == end) return;
  if (row.entries.size() < static_cast<size_t>(capacity)) row.entries.resize(capacity);
  // Re-evaluate the changed classes, then recompute their ancestors level by level, each once: a
  // shape seen rarely pays for the union of the changed paths, not a walk per change.
  if (dirty_.size() < static_cast<size_t>(row.leaves)) dirty_.resize(row.leaves, 0);
  Best* t = row.tree.data();
  level_.clear();
  for (uint64_t seq = row.cursor; seq < end; ++seq) {
    ClassId c = log[seq - base];
    const Best before = t[row.leaves + c];
    Ensure(row, c, r);
    const Best& after = t[row.leaves + c];
    if (after.weight == before.weight && after.score == before.score && after.first == before.first)
      continue;
    int parent = (row.leaves + c) / 2;
    if (!dirty_[parent]) {
      dirty_[parent] = 1;
      level_.push_back(parent);
    }
  }
  while (!level_.empty()) {
    next_level_.clear();
    for (int i : level_) {
      t[i] = Combine(t[2 * i], t[2 * i + 1]);
      dirty_[i] = 0;
      int parent = i / 2;
      if (parent >= 1 && !dirty_[parent]) {
        dirty_[parent] = 1;
        next_level_.push_back(parent);
      }
    }
    level_.swap(next_level_);
  }
  row.cursor = end;
}

Decision Scheduler::Decide(const core::Request& r) {
  Decision d;
  Row& row = cache_[InternRequestShape(r)];
  const uint64_t version = trial_depth_ > 0 ? 0 : state_version() + 1;  // 0: not remembered
  if (version != 0 && row.failed_at == version) {
    d.why_not = row.why_not;
    return d;
  }
  if (spread_only_ && DecideSpread(row, r, d)) {
    if (!d.placed && version != 0) row.failed_at = version, row.why_not = d.why_not;
    return d;
  }
  Refresh(row, r);
  const Best root = row.tree[1];
  if (root.weight == 0) {
    d.why_not = config_.explain_failures ? WhyNot(r) : "no node fits";
    if (version != 0) row.failed_at = version, row.why_not = d.why_not;
    return d;
  }
  if (first_node_ties_) return PlacedOnFirstNode(row, root);
  // Walk down to a class with the best score: node-uniformly at random among ties (seeded), like
  // kube-scheduler, or the lowest class id.
  uint64_t u = config_.random_ties ? rng_() % root.weight : 0;
  int index = 1;
  while (index < row.leaves) {
    const Best& left = row.tree[2 * index];
    const Best& right = row.tree[2 * index + 1];
    bool left_ok = left.weight > 0 && left.score >= root.score - kTieEpsilon;
    bool right_ok = right.weight > 0 && right.score >= root.score - kTieEpsilon;
    if (left_ok && (u < left.weight || !right_ok)) {
      u = u < left.weight ? u : u % left.weight;
      index = 2 * index;
    } else {
      if (left_ok) u -= left.weight;
      if (right.weight > 0 && u >= right.weight) u %= right.weight;
      index = 2 * index + 1;
    }
  }
  const ClassId chosen = index - row.leaves;
  return Placed(chosen, u, row.entries[chosen]);
}

Decision Scheduler::PlacedOnFirstNode(const Row& row, const Best& root) {
  // Down the tied subtree that holds the lowest node (each node keeps the lowest of its ties).
  int index = 1;
  while (index < row.leaves) {
    const Best& left = row.tree[2 * index];
    const bool left_has_it =
        left.weight > 0 && left.score >= root.score - kTieEpsilon && left.first == root.first;
    index = left_has_it ? 2 * index : 2 * index + 1;
  }
  const ClassId chosen = index - row.leaves;
  const auto& members = state_.class_members(chosen);
  const auto at = std::find(members.begin(), members.end(), root.first) - members.begin();
  return Placed(chosen, static_cast<uint64_t>(at), row.entries[chosen]);
}

Decision Scheduler::Placed(ClassId chosen, uint64_t u, const Entry& e) {
  Decision d;
  const auto& members = state_.class_members(chosen);
  NodeId node = members[u % members.size()];
  std::vector<int> positions;
  for (int p = 0; p < 64; ++p) {
    if (e.choice >> p & 1) positions.push_back(p);
  }
  d.placed = true;
  d.node = node;
  d.score = e.score;
  d.gpus = state_.GpusForPositions(node, positions);
  return d;
}

double Scheduler::SpreadKey(ClassId c) const {
  // How used the class is, as the spread score measures it for an empty request.
  const NodeShape& shape = state_.shape(state_.class_shape(c));
  double used = 0;
  int dims = 0;
  if (shape.cpu_milli > 0) {
    used += double(shape.cpu_milli - state_.class_cpu_left(c)) / double(shape.cpu_milli);
    ++dims;
  }
  if (shape.memory_mib > 0) {
    used += double(shape.memory_mib - state_.class_memory_left(c)) / double(shape.memory_mib);
    ++dims;
  }
  const auto& gpus = state_.class_gpus(c);
  if (!gpus.empty()) {
    int64_t left = 0;
    for (const ClassGpu& g : gpus) left += g.healthy ? g.milli_left : 0;
    double cap = double(gpus.size()) * core::kMilliPerGpu;
    used += (cap - double(left)) / cap;
    ++dims;
  }
  return dims > 0 ? used / dims : 0;
}

void Scheduler::SyncSpreadOrder() {
  const auto& log = state_.class_changes();
  const uint64_t base = state_.change_base();
  const int capacity = state_.class_capacity();
  if (spread_key_.size() < static_cast<size_t>(capacity)) {
    spread_key_.resize(capacity, std::numeric_limits<double>::quiet_NaN());
    spread_shape_.resize(capacity, 0);
  }
  auto update = [&](ClassId c) {
    if (!std::isnan(spread_key_[c])) {
      // A reused class id may have another shape now: erase from the set it was put in.
      spread_order_[spread_shape_[c]].erase({spread_key_[c], c});
    }
    spread_key_[c] = std::numeric_limits<double>::quiet_NaN();
    if (state_.class_sizes()[c] > 0) {
      ShapeId s = state_.class_shape(c);
      if (spread_order_.size() <= static_cast<size_t>(s)) spread_order_.resize(s + 1);
      double k = SpreadKey(c);
      spread_order_[s].insert({k, c});
      spread_key_[c] = k;
      spread_shape_[c] = s;
      if (spread_inserted_.size() <= static_cast<size_t>(s)) spread_inserted_.resize(s + 1);
      spread_inserted_[s].emplace_back(c, state_.class_generation(c));
      ++spread_inserted_total_;
    }
  };
  // The insertion logs are bounded like the change log: past a size, drop them and start a new
  // epoch (every no-fit memo then lapses).
  if (spread_inserted_total_ > 4096 + 4 * static_cast<size_t>(capacity)) {
    for (auto& v : spread_inserted_) v.clear();
    spread_inserted_total_ = 0;
    ++spread_epoch_;
  }
  if (spread_cursor_ < base) {
    for (auto& set : spread_order_) set.clear();
    std::fill(spread_key_.begin(), spread_key_.end(), std::numeric_limits<double>::quiet_NaN());
    for (ClassId c = 0; c < capacity; ++c) update(c);
  } else {
    for (uint64_t seq = spread_cursor_; seq < base + log.size(); ++seq) update(log[seq - base]);
  }
  spread_cursor_ = base + log.size();
}

bool Scheduler::DecideSpread(Row& row, const core::Request& r, Decision& d) {
  constexpr double kKeyTie = 1e-9;
  // A share over a soft utilization ceiling scores below every place within it, whatever its
  // spread key: the walk in key order cannot stop at the first that fits. The general path.
  if (r.fractional() && r.util_ceiling_pct > 0 && r.expected_util_pct > 0 &&
      !r.util_ceiling_strict) {
    return false;
  }
  SyncSpreadOrder();
  if (row.entries.size() < static_cast<size_t>(state_.class_capacity())) {
    row.entries.resize(state_.class_capacity());
  }
  if (row.none_fit.size() < spread_order_.size()) row.none_fit.resize(spread_order_.size());
  double best = -std::numeric_limits<double>::infinity();
  absl::InlinedVector<ClassId, 8> tied;
  auto consider = [&](ClassId c, const Entry& e) {
    if (tied.empty() || e.score > best + kTieEpsilon) {
      tied.clear();
      tied.push_back(c);
      best = e.score;
    } else if (e.score >= best - kTieEpsilon) {
      tied.push_back(c);
    }
  };
  for (size_t s = 0; s < spread_order_.size(); ++s) {
    const auto& order = spread_order_[s];
    if (order.empty() || ShapeKinds(row, static_cast<ShapeId>(s), r) == kNeverFits) continue;
    const auto& inserted = spread_inserted_[s];
    NoneFit& memo = row.none_fit[s];
    if (memo.epoch == spread_epoch_ && memo.valid) {
      // No class of this shape fitted when `memo.seen` classes had been inserted; classes only
      // leave or arrive, so only those inserted since can fit now.
      bool any = false;
      for (size_t i = memo.seen; i < inserted.size(); ++i) {
        auto [c, gen] = inserted[i];
        if (state_.class_sizes()[c] == 0 || state_.class_generation(c) != gen) continue;
        const Entry& e = Evaluated(row, c, r);
        if (e.score == -std::numeric_limits<double>::infinity()) continue;
        consider(c, e);
        any = true;
      }
      if (!any) memo.seen = inserted.size();
      continue;
    }
    double first_key = std::numeric_limits<double>::quiet_NaN();
    for (const auto& [key, c] : order) {
      if (!std::isnan(first_key) && key > first_key + kKeyTie) break;
      const Entry& e = Evaluated(row, c, r);
      if (e.score == -std::numeric_limits<double>::infinity()) continue;
      if (std::isnan(first_key)) first_key = key;
      consider(c, e);
    }
    if (std::isnan(first_key)) memo = {spread_epoch_, inserted.size(), true};
  }
  if (tied.empty()) {
    d.why_not = config_.explain_failures ? WhyNot(r) : "no node fits";
    return true;
  }
  ClassId chosen = tied[0];
  uint64_t u = 0;
  if (config_.random_ties) {
    uint64_t weight = 0;
    for (ClassId c : tied) weight += static_cast<uint64_t>(state_.class_sizes()[c]);
    u = rng_() % weight;
    for (ClassId c : tied) {
      uint64_t w = static_cast<uint64_t>(state_.class_sizes()[c]);
      if (u < w) {
        chosen = c;
        break;
      }
      u -= w;
    }
  } else {
    for (ClassId c : tied) chosen = std::min(chosen, c);
  }
  d = Placed(chosen, u, row.entries[chosen]);
  return true;
}

std::optional<double> Scheduler::BestScoreUncached(const core::Request& r) {
  std::optional<double> best;
  for (ClassId c : state_.live_classes()) {
    Evaluation ev = policies_.Evaluate(ViewOf(c), r, scale_, false);
    if (ev.feasible && (!best || ev.score > *best)) best = ev.score;
  }
  return best;
}

std::string Scheduler::WhyNot(const core::Request& r) {
  if (state_.live_node_count() == 0) return "the cluster has no nodes";
  std::map<std::string, std::pair<int, NodeId>> reasons;
  for (ClassId c : state_.live_classes()) {
    Evaluation ev = policies_.Evaluate(ViewOf(c), r, scale_, true);
    auto& slot = reasons[ev.reason];
    if (slot.first == 0) slot.second = state_.class_members(c)[0];
    slot.first += static_cast<int>(state_.class_members(c).size());
  }
  std::vector<std::tuple<int, std::string, NodeId>> sorted;
  for (const auto& [reason, v] : reasons) sorted.emplace_back(v.first, reason, v.second);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  std::string out;
  for (size_t i = 0; i < sorted.size() && i < 4; ++i) {
    const auto& [count, reason, example] = sorted[i];
    if (!out.empty()) out += "; ";
    if (count == 1) {
      out += fmt::format("{}: {}", state_.node_name(example), reason);
    } else {
      out += fmt::format("{} ({} nodes, e.g. {})", reason, count, state_.node_name(example));
    }
  }
  if (sorted.size() > 4) out += fmt::format("; and {} other reasons", sorted.size() - 4);
  return out;
}

GpuAmount Scheduler::QuotaAmount(const core::Request& r, NodeId node,
                                 const std::vector<int>& gpus) const {
  GpuAmount a;
  a.gpus = r.gpus;
  a.gpu_milli = r.gpu_milli_total();
  if (r.fractional()) {
    a.gpu_memory_mib = r.gpu_memory_mib * r.shared_gpu_count();
  } else {
    for (int g : gpus) a.gpu_memory_mib += state_.node_spec(node).gpus[g].memory_mib;
  }
  return a;
}

void Scheduler::BeginTrial() {
  if (trial_depth_++ == 0) trial_from_ = version();
}

void Scheduler::EndTrial() {
  if (--trial_depth_ == 0) trial_bumps_ += version() - trial_from_;
}

bool Scheduler::Fits(const core::Request& r, double now) {
  const std::mt19937_64 rng = rng_;
  const bool fits = Place(r, now).ok();
  if (fits) (void)Release(r.id);
  rng_ = rng;
  return fits;
}

absl::StatusOr<Allocation> Scheduler::Place(const core::Request& r, double now) {
  if (std::string bad = core::ValidateRequest(r); !bad.empty()) {
    return absl::InvalidArgumentError(fmt::format("request {}: {}", r.id, bad));
  }
  if (r.id.empty()) return absl::InvalidArgumentError("request: id must not be empty");
  if (state_.Find(r.id) != nullptr) {
    return absl::InvalidArgumentError(fmt::format("request {}: id already placed", r.id));
  }
  Decision d = Decide(r);
  if (!d.placed) {
    return absl::ResourceExhaustedError(
        fmt::format("request {}: no node fits: {}", r.id, d.why_not));
  }
  GpuAmount amount = QuotaAmount(r, d.node, d.gpus);
  std::string why;
  QuotaVerdict verdict = quotas_.Check(r.owner, amount, &why);
  for (const std::string& group : r.quota_groups) {
    if (verdict == QuotaVerdict::kDenied) break;
    QuotaVerdict v = quotas_.Check(group, amount, &why);
    if (v != QuotaVerdict::kAllowed) verdict = v;
  }
  if (verdict == QuotaVerdict::kDenied) {
    return absl::ResourceExhaustedError(fmt::format("request {}: quota: {}", r.id, why));
  }
  Allocation a;
  a.id = r.id;
  a.node = d.node;
  a.gpus = d.gpus;
  a.milli_per_gpu = r.fractional() ? r.gpu_milli : (r.gpus > 0 ? core::kMilliPerGpu : 0);
  a.memory_mib_per_gpu = 0;
  if (r.fractional()) {
    a.memory_mib_per_gpu = r.gpu_memory_mib;
  } else if (!d.gpus.empty()) {
    a.memory_mib_per_gpu = state_.node_spec(d.node).gpus[d.gpus[0]].memory_mib;
  }
  a.request = r;
  a.start_time = now;
  a.borrowed = verdict == QuotaVerdict::kBorrowing;
  if (r.gpus > 0) {
    // Whole GPUs take all of each GPU's memory, whatever its size.
    for (int g : d.gpus) {
      if (state_.node_spec(d.node).gpus[g].memory_mib != a.memory_mib_per_gpu) {
        a.memory_mib_per_gpu = 0;
        break;
      }
    }
  }
  if (absl::Status st = state_.Apply(a); !st.ok()) return st;
  Charge(r, amount, +1);
  return a;
}

absl::StatusOr<std::vector<Allocation>> Scheduler::PlaceGang(
    const std::vector<core::Request>& members, double now) {
  if (members.empty()) return absl::InvalidArgumentError("gang: no members");
  const std::string& gang = members[0].gang;
  if (gang.empty()) return absl::InvalidArgumentError("gang: members need a gang id");
  for (const core::Request& m : members) {
    if (m.gang != gang || m.gang_size != static_cast<int>(members.size())) {
      return absl::InvalidArgumentError(
          fmt::format("gang {}: member {} says gang '{}' of {}, but {} members were given", gang,
                      m.id, m.gang, m.gang_size, members.size()));
    }
  }
  std::vector<Allocation> placed;
  for (size_t i = 0; i < members.size(); ++i) {
    auto a = Place(members[i], now);
    if (!a.ok()) {
      for (auto it = placed.rbegin(); it != placed.rend(); ++it) {
        auto undone = Release(it->id);
        (void)undone;
      }
      return absl::Status(
          a.status().code(),
          fmt::format("gang {}: member {} of {} cannot be placed, so none is: {}", gang, i + 1,
                      members.size(), std::string(a.status().message())));
    }
    placed.push_back(std::move(*a));
  }
  return placed;
}

void Scheduler::Charge(const core::Request& r, const GpuAmount& amount, int sign) {
  auto apply = [&](const std::string& account) {
    if (sign > 0) {
      quotas_.Add(account, amount);
    } else {
      quotas_.Sub(account, amount);
    }
  };
  apply(r.owner);
  for (const std::string& group : r.quota_groups) apply(group);
}

absl::Status Scheduler::Restore(const Allocation& a) {
  GpuAmount amount = QuotaAmount(a.request, a.node, a.gpus);
  if (absl::Status st = state_.Apply(a); !st.ok()) return st;
  Charge(a.request, amount, +1);
  return absl::OkStatus();
}

absl::StatusOr<Allocation> Scheduler::Release(const std::string& id) {
  const Allocation* found = state_.Find(id);
  if (found == nullptr) return absl::NotFoundError(fmt::format("allocation {}: not found", id));
  GpuAmount amount = QuotaAmount(found->request, found->node, found->gpus);
  auto a = state_.Remove(id);
  if (a.ok()) Charge(a->request, amount, -1);
  return a;
}

std::vector<std::pair<std::string, std::string>> Scheduler::Explain(const core::Request& r) {
  std::vector<std::pair<std::string, std::string>> out;
  // Nodes of one class get one verdict: each class is evaluated once.
  std::unordered_map<ClassId, Evaluation> by_class;
  for (NodeId n = 0; n < state_.node_count(); ++n) {
    if (!state_.node_live(n)) continue;
    ClassId c = state_.node_class(n);
    auto it = by_class.find(c);
    if (it == by_class.end()) {
      it = by_class.emplace(c, policies_.Evaluate(ViewOf(c), r, scale_, true)).first;
    }
    const Evaluation& ev = it->second;
    if (ev.feasible) {
      out.emplace_back(
          state_.node_name(n),
          fmt::format("fits (score {:.4f}, GPUs {})", ev.score,
                      JoinInts(state_.GpusForPositions(
                          n, std::vector<int>(ev.positions.begin(), ev.positions.end())))));
    } else {
      out.emplace_back(state_.node_name(n), ev.reason);
    }
  }
  return out;
}

}  // namespace tessera::sched
