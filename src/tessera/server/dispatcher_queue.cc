// The dispatcher's queue: jobs into it and out, why one waits, dependencies and their outcomes,
// admission into the scheduling cycle (holds, arrays' throttles, per-user caps) and the pass.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tessera/core/clock.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/cdi.h"
#include "tessera/devices/health.h"
#include "tessera/devices/open.h"
#include "tessera/devices/simulated_source.h"
#include "tessera/sched/cycle.h"
#include "tessera/sched/policy.h"
#include "tessera/sched/scheduler.h"
#include "tessera/server/acct.h"
#include "tessera/server/api_response.h"
#include "tessera/server/dispatcher.h"
#include "tessera/server/openapi.h"
#include "tessera/server/runner.h"
#include "tessera/server/server_util.h"

namespace tessera::server {

using nlohmann::json;
namespace fs = std::filesystem;

Dispatcher::Queued Dispatcher::QueuedOf(const JobRecord& r, std::shared_ptr<const JobSpec> spec,
                                        double since) {
  Queued q;
  q.id = r.id;
  q.priority = r.priority;
  q.owner = r.owner;
  q.uid = r.owner_uid;
  q.throttle = ArrayThrottle(spec->array);
  q.spec = std::move(spec);
  q.submitted = r.submitted_at;
  q.since = since;
  q.array_id = r.array_id;
  q.array_index = r.array_index;
  q.spec_bytes = r.spec_json.size();
  return q;
}

void Dispatcher::Enqueue(Queued q) {
  q.in_cycle = false;
  q.waiting = q.held ? fmt::format("held (tessera release {})", q.array_id ? q.array_id : q.id)
                     : "not yet considered";
  q.waiting_pass = 0;
  if (auto old = queued_.find(q.id); old != queued_.end()) EraseQueued(old);
  ++queued_by_uid_[q.uid];
  if (++queued_specs_[q.spec.get()] == 1) queued_bytes_by_uid_[q.uid] += q.spec_bytes;
  Index(q, +1);
  queued_[q.id] = std::move(q);
  dirty_ = true;
}

void Dispatcher::Index(const Queued& q, int delta) {
  if (q.in_cycle) {
    auto count = [&](auto& counts, auto key) {
      auto it = counts.try_emplace(key, 0).first;
      it->second += delta;
      if (it->second == 0) counts.erase(it);
    };
    count(in_cycle_by_uid_, q.uid);
    if (q.array_id != 0) count(in_cycle_by_array_, q.array_id);
  } else if (q.held) {
    // Held: nothing to look at until released (SetHeld moves it).
  } else if (!q.parked.empty()) {
    for (const std::string& key : q.parked) {
      auto g = parked_.find(key);
      if (delta > 0) {
        g->second.second.insert(q.id);
      } else if (g != parked_.end() && g->second.second.erase(q.id) && g->second.second.empty()) {
        parked_.erase(g);
      }
    }
  } else if (delta > 0) {
    outside_by_uid_[q.uid].insert(q.id);
  } else {
    auto o = outside_by_uid_.find(q.uid);
    o->second.erase(q.id);
    if (o->second.empty()) outside_by_uid_.erase(o);
  }
}

void Dispatcher::SetParked(Queued& q, std::vector<std::pair<std::string, Dependency>> on) {
  Index(q, -1);
  q.parked.clear();
  for (auto& [key, d] : on) {
    parked_.try_emplace(key, d, std::set<int64_t>{});
    q.parked.push_back(std::move(key));
  }
  Index(q, +1);
}

void Dispatcher::WakeParked(std::map<std::string, DependencyState>& outcomes) {
  if (left_ == parked_checked_) return;
  parked_checked_ = left_;
  std::set<int64_t> wake;
  for (const auto& [key, group] : parked_) {
    auto it = outcomes.find(key);
    if (it == outcomes.end()) it = outcomes.emplace(key, Outcome(group.first)).first;
    if (it->second.outcome != DependencyState::kPending)
      wake.insert(group.second.begin(), group.second.end());
  }
  for (int64_t id : wake) SetParked(queued_.at(id), {});
}

void Dispatcher::SetHeld(Queued& q, bool held) {
  if (q.held == held) return;
  Index(q, -1);
  q.held = held;
  q.parked.clear();  // released, it is looked at again
  Index(q, +1);
}

void Dispatcher::SetInCycle(Queued& q, bool in) {
  if (q.in_cycle == in) return;
  Index(q, -1);
  q.in_cycle = in;
  Index(q, +1);
}

void Dispatcher::EraseQueued(std::map<int64_t, Queued>::iterator it) {
  Queued& q = it->second;
  if (auto n = queued_by_uid_.find(q.uid); n != queued_by_uid_.end() && --n->second == 0)
    queued_by_uid_.erase(n);
  if (auto s = queued_specs_.find(q.spec.get()); s != queued_specs_.end() && --s->second == 0) {
    queued_specs_.erase(s);
    if (auto b = queued_bytes_by_uid_.find(q.uid); b != queued_bytes_by_uid_.end()) {
      b->second -= std::min<uint64_t>(b->second, q.spec_bytes);
      if (b->second == 0) queued_bytes_by_uid_.erase(b);
    }
  }
  Index(q, -1);
  queued_.erase(it);
  ++left_;
}

void Dispatcher::EraseQueued(int64_t id) {
  if (auto it = queued_.find(id); it != queued_.end()) EraseQueued(it);
}

std::string Dispatcher::WaitingReason(int64_t id) const {
  auto q = queued_.find(id);
  if (q == queued_.end()) return "";
  if (q->second.changing) return "a change to it (cancel, hold, release, priority) is being stored";
  if (!q->second.in_cycle) {
    // A user at her limit: her jobs the last pass did not examine say so.
    if (auto c = capped_.find(q->second.uid); c != capped_.end() && !q->second.held &&
                                              q->second.parked.empty() &&
                                              q->second.waiting_pass != admit_pass_)
      return c->second;
    return q->second.waiting;
  }
  const std::string* why = engine_->cycle().Waiting(std::to_string(id));
  return why ? *why : "";
}

Dispatcher::DependencyState Dispatcher::Outcome(const Dependency& d) const {
  using S = DependencyState;
  // Queued, starting or running here: not settled. Preempted and lost jobs that are not queued
  // again are over.
  auto active = [&](int64_t id) {
    return queued_.contains(id) || running_.contains(id) || starting_.contains(id) ||
           finishing_.contains(id);
  };
  auto ended = [&](int64_t id, JobState state) {
    return !active(id) && state != JobState::kQueued && state != JobState::kRunning;
  };
  int64_t id = d.job;
  if (d.task >= 0) {
    auto t = store_->TaskId(d.job, d.task);
    if (!t.ok()) return {S::kMissing, fmt::format("job {}_{} does not exist", d.job, d.task)};
    id = *t;
  } else if (active(id)) {
    return {S::kPending, ""};  // an array whose first task has not ended has not either
  }
  auto r = store_->Get(id);
  if (!r.ok()) return {S::kMissing, fmt::format("job {} does not exist", id)};
  const std::string name =
      d.task >= 0 ? fmt::format("job {}_{}", d.job, d.task) : fmt::format("job {}", d.job);
  if (d.task < 0 && r->array_id == r->id) {
    auto tasks = store_->Tasks(id);
    if (!tasks.ok()) return {S::kPending, ""};  // read again at the next pass
    size_t failed = 0;
    for (const Store::TaskState& t : *tasks) {
      if (!ended(t.id, t.state)) return {S::kPending, ""};
      if (t.state != JobState::kSucceeded) ++failed;
    }
    if (failed == 0) return {S::kOk, fmt::format("every task of array {} succeeded", d.job)};
    return {S::kNotOk, fmt::format("{} of the {} tasks of array {} did not succeed", failed,
                                   tasks->size(), d.job)};
  }
  if (!ended(id, r->state)) return {S::kPending, ""};
  if (r->state == JobState::kSucceeded) return {S::kOk, name + " succeeded"};
  return {S::kNotOk, fmt::format("{} {}", name, JobStateName(r->state))};
}

std::string Dispatcher::Unmeetable(const Dependency& d, const DependencyState& st) {
  using S = DependencyState;
  const bool never = st.outcome == S::kMissing ||
                     (d.kind == Dependency::Kind::kOk && st.outcome == S::kNotOk) ||
                     (d.kind == Dependency::Kind::kNotOk && st.outcome == S::kOk);
  return never ? fmt::format("{}: after {} can never be met", st.what, DependencyText(d)) : "";
}

void Dispatcher::Admit(double now) {
  ++admit_pass_;
  // What each array has running or in the cycle's queue (its % limit counts both), and each user
  // (limits.max_running_jobs_per_user counts both, and the jobs being started): kept as jobs come
  // and go (SetInCycle), not counted over the queue.
  std::map<int64_t, int> active;
  std::map<uint32_t, size_t> user_active(in_cycle_by_uid_.begin(), in_cycle_by_uid_.end());
  // An array's tasks waiting in the cycle: they all have one shape, and at most
  // max_starts_per_pass start in a pass, so more than a few passes' worth of them there would only
  // take the user's room (her small job stuck behind her own 10,000-task sweep) and the pass's
  // time.
  std::map<int64_t, size_t> array_in_cycle = in_cycle_by_array_;
  for (const auto& [array, n] : in_cycle_by_array_) active[array] += static_cast<int>(n);
  const size_t array_window = 4 * config_.max_starts_per_pass;
  for (const auto& [id, r] : running_) {
    if (r.array_id != 0) ++active[r.array_id];
    ++user_active[r.uid];
  }
  for (const auto& [id, s] : starting_) ++user_active[s.uid];
  // An array's tasks share their dependencies: each is looked up once per pass.
  std::map<std::string, DependencyState> outcomes;
  WakeParked(outcomes);
  std::vector<std::pair<Queued*, std::vector<std::pair<std::string, Dependency>>>> park;
  std::vector<std::pair<int64_t, std::string>> never;
  std::vector<Queued*> admitted;
  capped_.clear();
  auto cap = [&](uint32_t uid, const std::string& owner) {
    capped_[uid] = fmt::format(
        "{} has {} jobs running or starting, the most per user "
        "(limits.max_running_jobs_per_user)",
        owner, user_active[uid]);
  };
  // By user: a user at her limit costs one look, not one per job she has waiting.
  for (auto& [uid, ids] : outside_by_uid_) {
    for (int64_t id : ids) {
      Queued& q = queued_.at(id);
      if (user_active[uid] >= config_.max_running_jobs_per_user) {
        cap(uid, q.owner);
        break;
      }
      if (q.changing) continue;
      q.waiting_pass = admit_pass_;
      std::string pending, broken;
      std::vector<std::pair<std::string, Dependency>> pending_on;
      for (const Dependency& d : q.spec->after) {
        std::string key = DependencyText(d);
        auto it = outcomes.find(key);
        if (it == outcomes.end()) it = outcomes.emplace(key, Outcome(d)).first;
        if (std::string why = Unmeetable(d, it->second); !why.empty()) {
          broken = why;
          break;
        }
        if (it->second.outcome == DependencyState::kPending) pending_on.emplace_back(key, d);
        if (it->second.outcome == DependencyState::kPending && pending.empty()) {
          pending = fmt::format(
              "waiting for {} to end (after {})",
              d.task >= 0 ? fmt::format("job {}_{}", d.job, d.task) : fmt::format("job {}", d.job),
              key);
        }
      }
      if (!broken.empty()) {
        never.emplace_back(id, broken);
        continue;
      }
      if (!pending.empty()) {
        // Parked until one of them is settled: not looked at again each pass.
        q.waiting = pending;
        park.emplace_back(&q, std::move(pending_on));
        continue;
      }
      if (q.array_id != 0 && q.throttle > 0 && active[q.array_id] >= q.throttle) {
        q.waiting = fmt::format("array {} runs at most {} tasks at once (%{})", q.array_id,
                                q.throttle, q.throttle);
        continue;
      }
      if (q.array_id != 0 && array_in_cycle[q.array_id] >= array_window) {
        q.waiting = fmt::format("behind the first {} waiting tasks of array {}",
                                array_in_cycle[q.array_id], q.array_id);
        continue;
      }
      sched::Submission sub = SubmissionFor(*q.spec, q.id, q.owner, q.uid, q.submitted);
      sub.entry.request.priority = q.priority;  // the stored one: it may have changed since
      if (absl::Status st = engine_->Submit(std::move(sub)); !st.ok()) {
        spdlog::error("job {}: cannot queue it: {}", id, std::string(st.message()));
        q.waiting = std::string(st.message());
        continue;
      }
      admitted.push_back(&q);
      if (q.array_id != 0) ++active[q.array_id], ++array_in_cycle[q.array_id];
      ++user_active[q.uid];
    }
  }
  for (Queued* q : admitted) SetInCycle(*q, true);
  for (auto& [q, on] : park) SetParked(*q, std::move(on));
  // Jobs whose dependencies can never be met end (cancelled, with the reason), so that nobody waits
  // for them forever; their own dependents are settled at the next pass. Stored by SchedulePass
  // without mu_ (EndNeverMet); changing meanwhile.
  for (const auto& [id, why] : never) {
    queued_.at(id).changing = true;
    never_met_.emplace_back(id, why);
  }
}

void Dispatcher::EndNeverMet(double now) {
  if (never_met_.empty()) return;
  // An array's tasks share their reason: one transaction for them all.
  std::map<std::string, std::vector<int64_t>> by_reason;
  for (const auto& [id, why] : never_met_) by_reason[why].push_back(id);
  never_met_.clear();
  mu_.unlock();
  std::map<std::string, absl::Status> stored;
  for (const auto& [why, ids] : by_reason)
    stored[why] = store_->TransitionMany(ids, JobState::kCancelled, why, now);
  mu_.lock();
  for (const auto& [why, ids] : by_reason) {
    if (const absl::Status& st = stored[why]; !st.ok()) {
      spdlog::error("job {}: {}", ids.front(), std::string(st.message()));
    } else {
      spdlog::info("{}: cancelled: {}",
                   ids.size() == 1
                       ? fmt::format("job {}", ids[0])
                       : fmt::format("{} jobs ({}..{})", ids.size(), ids.front(), ids.back()),
                   why);
      for (int64_t id : ids) EraseQueued(id);
    }
    EndChange(ids);  // those not stored are tried again at the next pass
  }
}

void Dispatcher::PassExecutor::Start(const std::string& job, const sched::Allocation& a,
                                     double now) {
  const int64_t id = std::stoll(job);
  auto q = d.queued_.find(id);
  if (q == d.queued_.end()) return;  // the engine's queue only holds what queued_ holds
  Starting starting{"", q->second.spec, q->second.owner, q->second.uid, a.gpus};
  launches.push_back(d.PrepareLaunch(std::move(q->second), a, now));
  d.EraseQueued(q);
  d.starting_[id] = std::move(starting);
}

void Dispatcher::PassExecutor::Stop(const std::vector<std::string>& victims,
                                    const std::string& for_id, const std::string&, double now) {
  auto q = d.queued_.find(std::stoll(for_id));
  if (q == d.queued_.end()) return;
  for (const std::string& victim : victims) {
    auto it = d.running_.find(std::stoll(victim));
    if (it == d.running_.end()) continue;
    ++stops;
    d.RequestStop(it->second, "preempt",
                  fmt::format("preempted for job {} (priority {})", for_id, q->second.priority),
                  now);
  }
}

void Dispatcher::SchedulePass(double now) {
  Admit(now);
  // At most max_starts_per_pass processes are started in one pass (the engine's limit per step),
  // so that the pass (and the lock's next holder) does not wait for thousands of forks; those left
  // over stay in the queue, placed again at the next pass, which follows at once.
  executor_.stops = 0;
  engine_->Step(now);
  if (engine_->deferred() > 0) dirty_ = true;
  pass_decided_ = !executor_.launches.empty() || executor_.stops > 0 || engine_->deferred() > 0;
  std::vector<Launch> launches = std::move(executor_.launches);
  executor_.launches.clear();
  EndNeverMet(now);
  if (launches.empty()) return;
  // The store's writes (fsync) and the forks and execs go on without the lock: API reads,
  // submissions and cancels do not wait for them.
  mu_.unlock();
  for (Launch& l : launches) ExecuteLaunch(l, now);
  mu_.lock();
  for (Launch& l : launches) CommitLaunch(l, now);
}

}  // namespace tessera::server
