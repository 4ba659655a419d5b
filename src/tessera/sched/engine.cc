#include "tessera/sched/engine.h"

#include <algorithm>
#include <cmath>
#include <set>
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
  queued_[id] = std::move(s);
  return absl::OkStatus();
}

absl::Status Engine::Submit(Submission s) { return Queue(std::move(s), "not yet considered"); }

bool Engine::Cancel(const std::string& id) {
  queued_.erase(id);
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
    auto it = queued_.find(id);
    Submission s = std::move(it->second);
    queued_.erase(it);
    (void)Queue(std::move(s),
                fmt::format("starting in the next pass: it fits now, but this pass "
                            "already started {}, the most at once ({}); a pass takes well under a "
                            "second",
                            options_.max_starts_per_step, options_.max_starts_setting));
  }
  size_t started = 0;
  for (size_t i : starts) {
    if (!go[i]) continue;
    const CycleDecision& d = decisions[i];
    auto it = queued_.find(d.id);
    running_[d.id] = std::move(it->second);
    queued_.erase(it);
    executor_.Start(d.id, d.allocation, now);
    ++started;
  }
  for (const CycleDecision& d : decisions) {
    if (d.kind == CycleDecision::Kind::kPreempt) executor_.Stop(d.victims, d.id, d.reason, now);
  }
  return started;
}

bool Engine::Ended(const std::string& id) {
  running_.erase(id);
  return scheduler_->Release(id).ok();
}

bool Engine::Stopped(const std::string& id, StopCause cause) {
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

absl::Status Engine::Restore(const Allocation& a, std::optional<Submission> s) {
  if (absl::Status st = scheduler_->Restore(a); !st.ok()) return st;
  if (s) running_[a.id] = *std::move(s);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Allocation>> Engine::RemoveNode(NodeId node) {
  auto released = cycle_.RemoveNode(node);
  if (released.ok())
    for (const Allocation& a : *released) running_.erase(a.id);
  return released;
}

}  // namespace tessera::sched
