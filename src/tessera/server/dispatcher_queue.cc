// The dispatcher's side of admission (admission.h): what the waiting room asks of the server
// (dependencies' outcomes, what runs, the cycle's queue), the jobs that can never run, and the
// pass that carries out the engine's decisions.
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

void Dispatcher::Enqueue(Queued q) {
  queue_changes_.emplace_back(q.id, true);
  admission_.Add(std::move(q));
  dirty_ = true;
}

std::string Dispatcher::WaitingReason(int64_t id) const {
  return admission_.Waiting(id, admission_world_);
}

DependencyState Dispatcher::AdmissionWorld::Outcome(const Dependency& dep) {
  d.mu_.AssertHeld();
  return d.Outcome(dep);
}

void Dispatcher::AdmissionWorld::CountActive(std::map<uint32_t, size_t>& by_user,
                                             std::map<int64_t, int>& by_array) {
  d.mu_.AssertHeld();
  for (const auto& [id, r] : d.runs_->jobs()) {
    if (r.array_id != 0) ++by_array[r.array_id];
    ++by_user[r.uid];
  }
  for (const auto& [id, s] : d.starting_) ++by_user[s.uid];
}

absl::Status Dispatcher::AdmissionWorld::EnterCycle(const QueuedJob& q) {
  d.mu_.AssertHeld();
  sched::Submission sub = d.SubmissionFor(*q.spec, q.id, q.owner, q.uid, q.submitted);
  sub.entry.request.priority = q.priority;  // the stored one: it may have changed since
  return d.engine_->Submit(std::move(sub));
}

void Dispatcher::AdmissionWorld::LeaveCycle(int64_t id) {
  d.mu_.AssertHeld();
  d.engine_->Cancel(std::to_string(id));
}

const std::string* Dispatcher::AdmissionWorld::CycleWaiting(int64_t id) const {
  d.mu_.AssertHeld();
  return d.engine_->cycle().Waiting(std::to_string(id));
}

DependencyState Dispatcher::Outcome(const Dependency& d) const {
  using S = DependencyState;
  // Queued, starting or running here: not settled. Preempted and lost jobs that are not queued
  // again are over.
  auto active = [&](int64_t id) {
    return admission_.Contains(id) || runs_->contains(id) || starting_.contains(id) ||
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

void Dispatcher::EndNeverMet(double now) {
  if (never_met_.empty()) return;
  // An array's tasks share their reason: one transaction for them all.
  std::map<std::string, std::vector<int64_t>> by_reason;
  for (const auto& [id, why] : never_met_) by_reason[why].push_back(id);
  never_met_.clear();
  Publish();  // what the pass decided, before mu_ goes
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
      for (int64_t id : ids) {
        admission_.Erase(id);
        queue_changes_.emplace_back(id, false);
      }
    }
    EndChange(ids);  // those not stored are tried again at the next pass
  }
}

void Dispatcher::PassExecutor::Start(const std::string& job, const sched::Allocation& a,
                                     double now) {
  d.mu_.AssertHeld();
  const int64_t id = std::stoll(job);
  if (!d.admission_.Contains(id)) return;  // the engine's queue only holds what admission holds
  Queued q = d.admission_.Take(id);
  d.queue_changes_.emplace_back(id, false);
  Starting starting{"", q.spec, q.owner, q.uid, a.gpus};
  Launch l;
  static_cast<LaunchPlan&>(l) = PlanLaunch(d.launch_setup_, q, a, now);
  l.queued = std::move(q);
  launches.push_back(std::move(l));
  d.starting_[id] = std::move(starting);
}

void Dispatcher::PassExecutor::Stop(const std::vector<std::string>& victims,
                                    const std::string& for_id, const std::string&, double now) {
  d.mu_.AssertHeld();
  const Queued* q = d.admission_.Find(std::stoll(for_id));
  if (!q) return;
  for (const std::string& victim : victims) {
    Running* r = d.runs_->Find(std::stoll(victim));
    if (r == nullptr) continue;
    ++stops;
    d.runs_->RequestStop(
        *r, "preempt", fmt::format("preempted for job {} (priority {})", for_id, q->priority), now);
  }
}

void Dispatcher::SchedulePass(double now) {
  // Jobs whose dependencies can never be met end (cancelled, with the reason): stored by
  // EndNeverMet below, without mu_.
  for (auto& never : admission_.Admit(admission_world_)) never_met_.push_back(std::move(never));
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
  Publish();  // the starts are seen (on their GPUs) before they are recorded
  mu_.unlock();
  for (Launch& l : launches) ExecuteLaunch(l, now);
  mu_.lock();
  for (Launch& l : launches) CommitLaunch(l, now);
}

}  // namespace tessera::server
