#include "tessera/sched/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include "fmt/format.h"

namespace tessera::sched {

Engine::Engine(std::unique_ptr<Scheduler> scheduler, Executor& executor, EngineOptions options)
    : scheduler_(std::move(scheduler)),
      executor_(executor),
      options_(options),
      cycle_(*scheduler_, options.cycle),
      history_(options.predict_from_kind_only) {}

void Engine::Expect(core::Request& r, const RunKind& kind) const {
  const Prediction p = history_.Predict(kind);
  // 0 means unknown to the cycle: a prediction of no time at all is a millisecond.
  if (p.samples > 0 || (r.expected_duration_s <= 0 && p.seconds > 0))
    r.expected_duration_s = std::max(p.seconds, 1e-3);
  if (options_.utilization_ceiling_pct > 0 && r.fractional() && p.util_samples > 0) {
    // A share that history shows slowed by sharing counts as that much busier: kept apart.
    r.expected_util_pct =
        std::clamp(static_cast<int>(std::lround(p.util_pct * p.sharing_slowdown)), 1, 100);
    r.util_ceiling_pct = options_.utilization_ceiling_pct;
    r.util_ceiling_strict = options_.utilization_ceiling_strict;
  }
}

absl::Status Engine::Queue(Submission s, std::string waiting) {
  QueueEntry e = s.entry;
  if (s.kind) Expect(e.request, *s.kind);
  const std::string id = e.request.id;
  if (absl::Status st = cycle_.Enqueue(std::move(e), std::move(waiting)); !st.ok()) return st;
  if (s.entry.request.wants_gpu()) ++queued_for_gpus_;
  queued_[id] = std::move(s);
  return absl::OkStatus();
}

Submission Engine::Unqueue(std::unordered_map<std::string, Submission>::iterator it) {
  Submission s = std::move(it->second);
  queued_.erase(it);
  if (s.entry.request.wants_gpu()) --queued_for_gpus_;
  return s;
}

absl::Status Engine::Submit(Submission s) { return Queue(std::move(s), "not yet considered"); }

bool Engine::Cancel(const std::string& id) {
  if (auto it = queued_.find(id); it != queued_.end()) (void)Unqueue(it);
  return cycle_.Remove(id);
}

size_t Engine::Step(double now, const Cycle::Scope* scope) {
  std::vector<CycleDecision> decisions = cycle_.Step(now, scope);
  // Which starts go ahead: those with GPUs first, then the rest in queue order, a gang whole.
  std::vector<size_t> starts;
  for (size_t i = 0; i < decisions.size(); ++i)
    if (decisions[i].kind == CycleDecision::Kind::kStart) starts.push_back(i);
  std::stable_partition(starts.begin(), starts.end(),
                        [&](size_t i) { return !decisions[i].allocation.gpus.empty(); });
  std::vector<bool> go(decisions.size(), false);
  if (options_.max_starts_per_step > 0 && starts.size() > options_.max_starts_per_step) {
    std::set<std::string> deferred_gangs;
    std::unordered_map<std::string, size_t> gang_starts;
    for (size_t i : starts)
      if (const std::string& g = decisions[i].allocation.request.gang; !g.empty()) ++gang_starts[g];
    size_t taken = 0;
    std::set<std::string> taken_gangs;
    for (size_t i : starts) {
      const std::string& g = decisions[i].allocation.request.gang;
      if (!g.empty() && taken_gangs.contains(g)) {
        go[i] = true;
        continue;
      }
      if (!g.empty() && deferred_gangs.contains(g)) continue;
      const size_t n = g.empty() ? 1 : gang_starts[g];
      // A gang larger than the limit goes alone in a step of its own, or it would never start.
      if (taken + n <= options_.max_starts_per_step || taken == 0) {
        go[i] = true;
        taken += n;
        if (!g.empty()) taken_gangs.insert(g);
      } else if (!g.empty()) {
        deferred_gangs.insert(g);
      }
    }
  } else {
    for (size_t i : starts) go[i] = true;
  }
  // Deferred starts give their allocation back and stay queued, ahead of the next Step.
  deferred_ = 0;
  for (size_t i : starts) {
    if (go[i]) continue;
    ++deferred_;
    const std::string& id = decisions[i].id;
    (void)scheduler_->Release(id);
    (void)Queue(Unqueue(queued_.find(id)),
                fmt::format("starting in the next pass: it fits now, but this pass "
                            "already started {}, the most at once ({}); a pass takes well under a "
                            "second",
                            options_.max_starts_per_step, options_.max_starts_setting));
  }
  size_t started = 0;
  for (size_t i : starts) {
    if (!go[i]) continue;
    const CycleDecision& d = decisions[i];
    running_[d.id] = Unqueue(queued_.find(d.id));
    if (Resizing(d.allocation.request)) elastic_.insert(d.id);
  }
  const bool may_grow = MayGrow();
  // An elastic request that is not resized starts larger for good, when nothing queued wants a
  // GPU (what the queue could use would be held to the request's end).
  const bool start_larger = queued_for_gpus_ == 0;
  for (size_t i : starts) {
    if (!go[i]) continue;
    CycleDecision& d = decisions[i];
    // An elastic request that could start larger now starts larger, where the larger size fits
    // best (placed for its minimum, the packing policies put it where it has no room to grow).
    const bool resizing = Resizing(d.allocation.request);
    const bool larger = d.allocation.request.elastic() && (resizing ? may_grow : start_larger) &&
                        PlaceLarger(d.allocation, resizing, now);
    executor_.Start(d.id, d.allocation, now);
    if (larger && resizing) executor_.Resize(d.id, *Holding(d.id), now);
    ++started;
  }
  for (const CycleDecision& d : decisions) {
    if (d.kind != CycleDecision::Kind::kPreempt) continue;
    // GPUs an elastic request grew onto are taken back by shrinking it, not by stopping it (when
    // it is not stopped whole anyway: its grown GPUs go with it) - by as many as `d` needs.
    std::vector<std::string> whole;
    for (const std::string& v : d.victims) {
      if (const std::string* grown = GrownOf(v)) {
        if (std::find(d.victims.begin(), d.victims.end(), *grown) == d.victims.end()) {
          Shrink(*grown, KeptFrom(d, v), now);
        }
      } else {
        whole.push_back(v);
      }
    }
    // A grown victim an earlier request of this pass already asked to shrink gives back this
    // request's room too, in the same resize: not a second restart once it has shrunk.
    // Plans of one pass do not see each other's rooms, so this one may count on GPUs the earlier
    // request's room already takes: as many others of what it keeps go too.
    for (const std::string& v : d.already_stopping) {
      const std::string* grown = GrownOf(v);
      const Allocation* held = scheduler_->state().Find(v);
      auto asked = grown ? shrinking_.find(*grown) : shrinking_.end();
      if (asked == shrinking_.end() || held->node != d.node) continue;
      const auto in_room = [&](int g) {
        return std::find(d.gpus.begin(), d.gpus.end(), g) != d.gpus.end();
      };
      auto need = static_cast<size_t>(std::count_if(held->gpus.begin(), held->gpus.end(), in_room));
      std::vector<int> keep;
      for (int g : asked->second) {
        if (in_room(g))
          need = need > 0 ? need - 1 : 0;
        else
          keep.push_back(g);
      }
      for (; need > 0 && !keep.empty(); --need) keep.pop_back();
      Shrink(*grown, std::move(keep), now);
    }
    if (!whole.empty()) executor_.Stop(whole, d.id, d.reason, now);
  }
  Grow(now);
  return started;
}

const std::string* Engine::GrownOf(const std::string& allocation_id) const {
  const Allocation* a = scheduler_->state().Find(allocation_id);
  if (a == nullptr || !a->reclaimable) return nullptr;
  constexpr std::string_view kSuffix = "+grown";
  if (!allocation_id.ends_with(kSuffix)) return nullptr;
  auto it = elastic_.find(allocation_id.substr(0, allocation_id.size() - kSuffix.size()));
  return it == elastic_.end() ? nullptr : &*it;
}

std::vector<int> Engine::KeptFrom(const CycleDecision& d, const std::string& grown_id) const {
  // The grown GPUs outside the room `d` waits for stay with the elastic request.
  const Allocation* grown = scheduler_->state().Find(grown_id);
  if (grown == nullptr || grown->node != d.node) return {};
  std::vector<int> kept;
  for (int g : grown->gpus) {
    if (std::find(d.gpus.begin(), d.gpus.end(), g) == d.gpus.end()) kept.push_back(g);
  }
  if (kept.size() == grown->gpus.size()) kept.clear();  // its plan takes none: all, to be sure
  return kept;
}

void Engine::Shrink(const std::string& id, std::vector<int> keep, double now) {
  // Its grown allocation stays a victim the cycle does not name again until Resized. Asked again
  // before then (another request of the same pass waits for it too), it keeps only what neither
  // takes, and the resize is asked again with that: the job restarts once, on what is left.
  auto [it, asked] = shrinking_.try_emplace(id, keep);
  if (!asked) {
    std::vector<int> both;
    for (int g : it->second) {
      if (std::find(keep.begin(), keep.end(), g) != keep.end()) both.push_back(g);
    }
    if (both.size() == it->second.size()) return;  // this room was given back already
    it->second = std::move(both);
  }
  if (const Allocation* own = scheduler_->state().Find(id))
    executor_.Resize(id, WithGpus(*own, it->second), now);
}

Allocation Engine::WithGpus(Allocation own, const std::vector<int>& more) {
  own.gpus.insert(own.gpus.end(), more.begin(), more.end());
  std::sort(own.gpus.begin(), own.gpus.end());
  own.request.gpus = static_cast<int>(own.gpus.size());
  return own;
}

bool Engine::Resized(const std::string& id) {
  auto it = shrinking_.find(id);
  if (it == shrinking_.end()) return false;
  const std::vector<int> keep = std::move(it->second);
  shrinking_.erase(it);
  const Allocation* own = scheduler_->state().Find(id);
  const Allocation* grown = scheduler_->state().Find(GrownId(id));
  const std::optional<Allocation> kept =
      own && grown && !keep.empty()
          ? std::optional<Allocation>(GrownAllocation(*own, keep, grown->start_time))
          : std::nullopt;
  (void)scheduler_->Release(GrownId(id));
  if (kept) {  // what it still holds past its minimum, no longer a victim anyone waits for
    (void)scheduler_->Restore(*kept);
    cycle_.Stopped(kept->id);
  }
  return true;
}

std::optional<Allocation> Engine::Holding(const std::string& id) const {
  const Allocation* own = scheduler_->state().Find(id);
  if (own == nullptr) return std::nullopt;
  if (const Allocation* grown = scheduler_->state().Find(GrownId(id));
      grown && grown->reclaimable) {
    return WithGpus(*own, grown->gpus);
  }
  return *own;
}

bool Engine::Resizing(const core::Request& r) const {
  return r.elastic() && r.resizable && executor_.Resizes();
}

bool Engine::MayGrow() const {
  if (elastic_.empty() || !options_.cycle.preemption) return false;
  // Only onto GPUs no queued request can use: with one waiting for a GPU, nothing grows (one that
  // waits for something else - a quota, its victims - may yet take a GPU freed meanwhile).
  return queued_for_gpus_ == 0;
}

bool Engine::PlaceLarger(Allocation& own, bool grown_part, double now) {
  const Allocation placed = own;
  const core::Request& r = placed.request;
  (void)scheduler_->Release(own.id);
  for (int n = r.gpus_max; n > r.gpus; --n) {
    core::Request larger = r;
    larger.gpus = n;
    larger.gpus_max = 0;
    absl::StatusOr<Allocation> a = scheduler_->Place(larger, now);
    if (!a.ok()) continue;
    if (a->borrowed) {  // grown only within its owner's own quota
      (void)scheduler_->Release(own.id);
      continue;
    }
    if (!grown_part) {  // all its own, as placed: a fixed size from now on
      own = *a;
      return true;
    }
    // Its own GPUs are the first of them; the rest it holds as grown (reclaimable).
    (void)scheduler_->Release(own.id);
    own = *a;
    own.request = r;
    own.gpus.resize(r.gpus);
    const Allocation grown =
        GrownAllocation(own, std::vector<int>(a->gpus.begin() + r.gpus, a->gpus.end()), now);
    if (scheduler_->Restore(own).ok() && scheduler_->Restore(grown).ok()) return true;
    (void)scheduler_->Release(own.id);
    (void)scheduler_->Release(grown.id);
    break;
  }
  own = placed;
  (void)scheduler_->Restore(own);
  return false;
}

Allocation Engine::GrownAllocation(const Allocation& own, std::vector<int> gpus, double now) {
  std::sort(gpus.begin(), gpus.end());
  Allocation grown;
  grown.id = GrownId(own.id);
  grown.node = own.node;
  grown.request = GrownRequest(own.request, static_cast<int>(gpus.size()));
  grown.gpus = std::move(gpus);
  grown.milli_per_gpu = own.milli_per_gpu;
  grown.memory_mib_per_gpu = own.memory_mib_per_gpu;
  grown.start_time = now;
  grown.reclaimable = true;
  return grown;
}

core::Request Engine::GrownRequest(const core::Request& r, int gpus) {
  core::Request more = r;
  more.id = GrownId(r.id);
  more.gpus = gpus;
  more.gpus_max = 0;
  more.cpu_milli = 0;
  more.memory_mib = 0;
  more.topology = core::TopologyMode::kNone;
  more.priority = std::numeric_limits<int>::min();
  more.preemptible = true;
  return more;
}

void Engine::Grow(double now) {
  if (!MayGrow()) return;
  const ClusterState& st = scheduler_->state();
  for (const std::string& id : elastic_) {
    if (shrinking_.contains(id)) continue;
    const Allocation* own = st.Find(id);
    if (own == nullptr) continue;
    const std::string grown_id = GrownId(id);
    const Allocation* grown = st.Find(grown_id);
    const int have = static_cast<int>(own->gpus.size() + (grown ? grown->gpus.size() : 0));
    const int room = own->request.gpus_max - have;
    if (room <= 0) continue;
    std::vector<int> free;
    const core::NodeSpec& node = st.node_spec(own->node);
    for (int g = 0; g < st.gpu_count(own->node) && static_cast<int>(free.size()) < room; ++g) {
      const GpuUse& u = st.gpu_use(own->node, g);
      if (u.holders == 0 && u.milli == 0 && u.healthy &&
          core::GpuAccepted(node.gpus[g], own->request))
        free.push_back(g);
    }
    if (free.empty()) continue;
    // What it grows onto counts against its owner's quota (and groups'), within their own limits.
    core::Request more = GrownRequest(own->request, static_cast<int>(free.size()));
    auto within = [&] {
      more.gpus = static_cast<int>(free.size());
      const GpuAmount delta = scheduler_->QuotaAmount(more, own->node, free);
      bool ok = scheduler_->quotas().WithinOwnLimit(more.owner, delta);
      for (const std::string& group : more.quota_groups)
        ok = ok && scheduler_->quotas().WithinOwnLimit(group, delta);
      return ok;
    };
    while (!free.empty() && !within()) free.pop_back();
    if (free.empty()) continue;
    std::optional<Allocation> before;
    if (grown != nullptr) {
      before = *grown;
      free.insert(free.end(), grown->gpus.begin(), grown->gpus.end());
      (void)scheduler_->Release(grown_id);
    }
    Allocation next = GrownAllocation(*own, std::move(free), before ? before->start_time : now);
    if (!scheduler_->Restore(next).ok()) {
      if (before) (void)scheduler_->Restore(*before);  // it keeps what it held
      continue;
    }
    executor_.Resize(id, *Holding(id), now);
  }
}

void Engine::ForgetElastic(const std::string& id) {
  if (elastic_.erase(id) == 0) return;
  shrinking_.erase(id);
  (void)scheduler_->Release(GrownId(id));
}

bool Engine::FixSize(const std::string& id) {
  if (!elastic_.contains(id)) return false;
  ForgetElastic(id);
  return true;
}

bool Engine::Ended(const std::string& id) {
  running_.erase(id);
  ForgetElastic(id);
  return scheduler_->Release(id).ok();
}

bool Engine::Stopped(const std::string& id, StopCause cause) {
  ForgetElastic(id);
  (void)scheduler_->Release(id);
  const bool by_rule =
      cause == StopCause::kPreempted ? options_.requeue_preempted : options_.requeue_unhealthy;
  auto it = running_.find(id);
  if (it == running_.end()) return by_rule;  // restored without its submission
  Submission s = std::move(it->second);
  running_.erase(it);
  const bool requeue = s.requeue.value_or(by_rule);
  if (requeue && !options_.requeue_through_driver) (void)Queue(std::move(s), "not yet considered");
  return requeue;
}

absl::Status Engine::Restore(const Allocation& restored, std::optional<Submission> s) {
  Allocation a = restored;
  core::Request& r = a.request;
  std::optional<Allocation> grown;
  if (r.elastic() && !r.fractional()) {
    const int held = static_cast<int>(a.gpus.size());
    if (held < r.gpus || held > r.gpus_max) {
      return absl::InvalidArgumentError(
          fmt::format("allocation {}: {} GPUs, outside its request's {} to {}", a.id, held, r.gpus,
                      r.gpus_max));
    }
    if (!Resizing(r)) {
      r.gpus = held;  // started larger for good
    } else if (held > r.gpus) {
      // Resized while it runs: its first `gpus` its own, the rest grown onto (given back first).
      grown =
          GrownAllocation(a, std::vector<int>(a.gpus.begin() + r.gpus, a.gpus.end()), a.start_time);
      a.gpus.resize(r.gpus);
    }
  }
  if (absl::Status st = scheduler_->Restore(a); !st.ok()) return st;
  if (grown) {
    if (absl::Status st = scheduler_->Restore(*grown); !st.ok()) {
      (void)scheduler_->Release(a.id);
      return st;
    }
  }
  if (Resizing(a.request)) elastic_.insert(a.id);
  if (s) running_[a.id] = *std::move(s);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Allocation>> Engine::RemoveNode(NodeId node) {
  auto released = cycle_.RemoveNode(node);
  if (released.ok())
    for (const Allocation& a : *released) {
      running_.erase(a.id);
      elastic_.erase(a.id);
      shrinking_.erase(a.id);
    }
  return released;
}

}  // namespace tessera::sched
