#include "tessera/server/scheduling_loop.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace tessera::server {

using nlohmann::json;

SchedulingLoop::SchedulingLoop(DispatchState& state, JobHost& host, const LaunchSetup& launch,
                               const core::Clock& clock)
    : state_(state), host_(host), launch_(launch), clock_(clock) {}

bool SchedulingLoop::RunOnce() {
  DispatchState::ChangeLock lock(state_);
  return Turn();
}

void SchedulingLoop::Start() {
  thread_ = std::thread([this] { Run(); });
}

void SchedulingLoop::Stop() {
  stop_ = true;
  {
    core::MutexLock lock(state_.mu);
    state_.wake.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void SchedulingLoop::Run() {
  core::MutexLock lock(state_.mu);
  while (!stop_) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool passed = Turn();
    state_.Publish();  // before the waits below let the lock go
    if (state_.dirty) {
      if (passed && !pass_decided_) {
        // A pass that started and stopped nothing (jobs arriving behind a busy machine): the next
        // waits as long as this one took, so that a stream of submissions is admitted in batches
        // - the loop spends at most half its time in such passes, not one pass per submission.
        const auto now = std::chrono::steady_clock::now();
        state_.wake.wait_until(state_.mu, now + (now - t0), [&] { return stop_.load(); });
      }
      continue;
    }
    state_.wake.wait_for(state_.mu, std::chrono::duration<double>(state_.config.poll_interval_s));
  }
}

bool SchedulingLoop::Turn() {
  const double now = core::Seconds(clock_.Now());
  CheckRunning(now);
  if (state_.retention->Due(now)) state_.retention->Apply(now, state_.DependedOn());
  if (!state_.dirty) return false;
  state_.dirty = false;
  auto t0 = std::chrono::steady_clock::now();
  SchedulePass(now);
  state_.scheduling.Pass(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return true;
}

void SchedulingLoop::CheckRunning(double now) {
  if (now - arbiter_checked_ >= 1) {  // about once a second: an open and a 12-byte read
    arbiter_checked_ = now;
    host_.RepairArbiter();
    for (QueuedJob& q : state_.ends->Tend(now)) state_.Enqueue(std::move(q));
  }
  const std::vector<std::pair<int64_t, std::optional<int>>> ended = state_.runs->Check(now);
  for (auto it = cgroups_left_.begin(); it != cgroups_left_.end();) {
    it = host_.Unconfine(*it) ? cgroups_left_.erase(it) : std::next(it);
  }
  // Elastic jobs that did not answer a growth keep their size: what they were to grow onto is free.
  for (int64_t id : state_.runs->TakeKept()) {
    if (state_.engine->FixSize(std::to_string(id))) state_.dirty = true;
  }
  if (ended.empty()) return;
  // Their GPUs are free at once; what else an end takes (the cgroup's accounting, a container left
  // behind, the store's record with its fsync) is done without the lock, so that API reads do not
  // wait for it. Meanwhile the jobs are `finishing`: a cancel is told they have ended.
  std::vector<Ending> endings;
  std::vector<Launch> restarts;
  for (auto& [id, code] : ended) {
    if (state_.exits) state_.exits->Unwatch(id);
    RunningJob run = state_.runs->Take(id);
    if (RunningJobs::EndsForResize(run, code)) {
      // It checkpointed (or was stopped) for its resize: started again on its new size, under its
      // id, as a start is (recorded, launched without the lock, then committed).
      restarts.push_back(PlanRestart(std::move(run), now));
      continue;
    }
    // Its GPUs are free; stopped for preemption or a failed GPU, the engine's rules say whether
    // it goes back to the queue (JobEnds records it so, and it is enqueued again below).
    bool requeue = false;
    const std::string job = std::to_string(id);
    if (run.stop == "preempt") {
      requeue = state_.engine->Stopped(job, sched::StopCause::kPreempted);
    } else if (run.stop == "unhealthy") {
      requeue = state_.engine->Stopped(job, sched::StopCause::kUnhealthy);
    } else {
      state_.engine->Ended(job);
    }
    if (run.arbiter) host_.ArbiterUser(run.uid, -1);
    endings.push_back(Ending{std::move(run), code.value_or(-1), code.has_value()});
    endings.back().requeue_wanted = requeue;
    state_.finishing.insert(id);
  }
  state_.dirty = true;
  state_.Publish();
  state_.mu.unlock();
  for (Launch& l : restarts) ExecuteLaunch(l, now);
  for (Ending& e : endings) state_.ends->Record(e, now);
  state_.mu.lock();
  for (Launch& l : restarts) CommitLaunch(l, now);
  std::set<uint32_t> users;
  for (Ending& e : endings) {
    state_.finishing.erase(e.run.id);
    state_.admission.NoteLeft();
    if (e.cgroup_left) cgroups_left_.insert(e.run.id);
    if (e.requeue) state_.Enqueue(std::move(*e.requeue));
    users.insert(e.run.uid);
  }
  // What a user's jobs left in shared memory goes once none of them runs (jobs start on this
  // thread: none starts meanwhile). Without the lock: the sweep reads /proc.
  std::vector<uint32_t> idle;
  for (uint32_t uid : users) {
    if (!state_.runs->AnyOf(uid)) idle.push_back(uid);
  }
  if (idle.empty()) return;
  state_.mu.unlock();
  for (uint32_t uid : idle) RemoveUserShm(state_.config.shm_dir, uid);
  state_.mu.lock();
}

void SchedulingLoop::Measure(const std::vector<devices::GpuTelemetry>& telemetry,
                             const std::map<int64_t, JobHost::ShareUse>& shares) {
  core::MutexLock lock(state_.mu);
  const auto& scheduled = state_.engine->scheduler().state();
  std::vector<int> holders(state_.gpu_healthy.size());
  for (size_t g = 0; g < holders.size(); ++g)
    holders[g] = scheduled.gpu_use(0, static_cast<int>(g)).holders;
  state_.runs->Measure(telemetry, holders, shares);
}

void SchedulingLoop::PassExecutor::Start(const std::string& job, const sched::Allocation& a,
                                         double now) {
  DispatchState& s = loop.state_;
  s.mu.AssertHeld();
  const int64_t id = std::stoll(job);
  if (!s.admission.Contains(id)) return;  // the engine's queue only holds what admission holds
  QueuedJob q = s.TakeQueued(id);
  DispatchState::Starting starting{"", q.spec, q.owner, q.uid, a.gpus};
  Launch l;
  static_cast<LaunchPlan&>(l) = PlanLaunch(loop.launch_, q, a, now);
  l.queued = std::move(q);
  launches.push_back(std::move(l));
  s.starting[id] = std::move(starting);
}

void SchedulingLoop::PassExecutor::Resize(const std::string& job, const sched::Allocation& holds,
                                          double now) {
  DispatchState& s = loop.state_;
  s.mu.AssertHeld();
  const int64_t id = std::stoll(job);
  for (Launch& l : launches) {
    if (l.queued.id != id) continue;
    // Started in this pass, not yet launched: it starts on all it holds.
    static_cast<LaunchPlan&>(l) = PlanLaunch(loop.launch_, l.queued, holds, now);
    s.starting[id].gpus = holds.gpus;
    return;
  }
  RunningJob* r = s.runs->Find(id);
  if (r == nullptr) return;
  std::vector<std::string> uuids;
  for (int g : holds.gpus) uuids.push_back(loop.launch_.inventory->gpus[g].uuid);
  s.runs->AskResize(*r, holds.gpus, uuids, now);
}

SchedulingLoop::Launch SchedulingLoop::PlanRestart(RunningJob run, double now) {
  const std::string job = std::to_string(run.id);
  if (state_.engine->Shrinking(job)) state_.engine->Resized(job);  // it runs on its own alone now
  const std::optional<sched::Allocation> holds = state_.engine->Holding(job);
  Launch l;
  l.restart = true;
  l.queued.id = run.id;
  l.queued.priority = run.priority;
  l.queued.owner = run.owner;
  l.queued.uid = run.uid;
  l.queued.spec = run.spec;
  l.queued.array_id = run.array_id;
  l.queued.array_index = run.array_index;
  l.queued.since = now;
  sched::Allocation a = holds.value_or(sched::Allocation{});
  static_cast<LaunchPlan&>(l) = PlanLaunch(launch_, l.queued, a, now);
  if (!holds) l.refused = absl::InternalError("the scheduler holds no GPU for it");
  // The same job: its run's start, limits and what was measured of it go on; its sizes grow.
  RunningJob& next = l.run;
  next.started = run.started;
  next.restarts = run.restarts + 1;
  next.sizes = run.sizes;
  if (next.sizes.empty()) next.sizes.emplace_back(run.started, static_cast<int>(run.gpus.size()));
  next.sizes.emplace_back(now, static_cast<int>(a.gpus.size()));
  next.earlier = run.earlier;
  l.cgroup_before = run.cgroup;
  next.util_sum = run.util_sum;
  next.util_samples = run.util_samples;
  next.gpu_peak_mib = run.gpu_peak_mib;
  json placement = json::parse(l.placement_json, nullptr, false);
  json sizes = json::array();
  for (const auto& [at, n] : next.sizes) sizes.push_back({{"at", at}, {"gpus", n}});
  placement["sizes"] = sizes;
  placement["restarts"] = next.restarts;
  l.placement_json = placement.dump();
  l.spec.env["TESSERA_RESTARTS"] = std::to_string(next.restarts);
  l.where = fmt::format("{} (resized from {} to {} GPUs, restart {})", l.where, run.gpus.size(),
                        a.gpus.size(), next.restarts);
  RemoveResizeFile(state_.config.state_dir, run.id);
  RemoveStopFile(state_.config.state_dir, run.id);
  state_.starting[run.id] = DispatchState::Starting{"", run.spec, run.owner, run.uid, a.gpus};
  return l;
}

void SchedulingLoop::PassExecutor::Stop(const std::vector<std::string>& victims,
                                        const std::string& for_id, const std::string&, double now) {
  DispatchState& s = loop.state_;
  s.mu.AssertHeld();
  const QueuedJob* q = s.admission.Find(std::stoll(for_id));
  if (!q) return;
  for (const std::string& victim : victims) {
    RunningJob* r = s.runs->Find(std::stoll(victim));
    if (r == nullptr) continue;
    ++stops;
    s.runs->RequestStop(
        *r, "preempt", fmt::format("preempted for job {} (priority {})", for_id, q->priority), now);
  }
}

void SchedulingLoop::SchedulePass(double now) {
  // Jobs whose dependencies can never be met end (cancelled, with the reason): stored by
  // EndNeverMet below, without the lock.
  for (auto& never : state_.Admit()) never_met_.push_back(std::move(never));
  // At most max_starts_per_pass processes are started in one pass (the engine's limit per step),
  // so that the pass (and the lock's next holder) does not wait for thousands of forks; those left
  // over stay in the queue, placed again at the next pass, which follows at once.
  executor_.stops = 0;
  state_.engine->Step(now);
  if (state_.engine->deferred() > 0) state_.dirty = true;
  pass_decided_ =
      !executor_.launches.empty() || executor_.stops > 0 || state_.engine->deferred() > 0;
  std::vector<Launch> launches = std::move(executor_.launches);
  executor_.launches.clear();
  EndNeverMet(now);
  if (launches.empty()) return;
  // The store's writes (fsync) and the forks and execs go on without the lock: API reads,
  // submissions and cancels do not wait for them.
  state_.Publish();  // the starts are seen (on their GPUs) before they are recorded
  state_.mu.unlock();
  for (Launch& l : launches) ExecuteLaunch(l, now);
  state_.mu.lock();
  for (Launch& l : launches) CommitLaunch(l, now);
}

void SchedulingLoop::EndNeverMet(double now) {
  if (never_met_.empty()) return;
  // An array's tasks share their reason: one transaction for them all.
  std::map<std::string, std::vector<int64_t>> by_reason;
  for (const auto& [id, why] : never_met_) by_reason[why].push_back(id);
  never_met_.clear();
  state_.Publish();  // what the pass decided, before the lock goes
  state_.mu.unlock();
  std::map<std::string, absl::Status> stored;
  for (const auto& [why, ids] : by_reason)
    stored[why] = state_.store.TransitionMany(ids, JobState::kCancelled, why, now);
  state_.mu.lock();
  for (const auto& [why, ids] : by_reason) {
    if (const absl::Status& st = stored[why]; !st.ok()) {
      spdlog::error("job {}: {}", ids.front(), std::string(st.message()));
    } else {
      spdlog::info("{}: cancelled: {}",
                   ids.size() == 1
                       ? fmt::format("job {}", ids[0])
                       : fmt::format("{} jobs ({}..{})", ids.size(), ids.front(), ids.back()),
                   why);
      for (int64_t id : ids) state_.Dequeue(id);
    }
    state_.EndChange(ids);  // those not stored are tried again at the next pass
  }
}

void SchedulingLoop::ExecuteLaunch(Launch& l, double now) {
  const QueuedJob& q = l.queued;
  LaunchSpec& ls = l.spec;
  if (l.restart) {
    // Its new placement, its process not yet known (a crash before it is: lost, never run twice),
    // and the exit file of the run that ended gone.
    l.recorded = state_.store.SetPlacement(q.id, l.placement_json, 0, "placed on " + l.where, now);
    // What its run used of its cgroup, before the launch makes that anew.
    if (l.cgroup_before) l.run.earlier = l.run.WithEarlier(host_.Usage(q.id));
    std::error_code ec;
    std::filesystem::remove(JobFilePath(state_.config.state_dir, "exit", q.id), ec);
  } else {
    TransitionFields f;
    f.started_at = now;
    f.placement_json = l.placement_json;
    l.recorded = state_.store.Transition(q.id, JobState::kRunning, "placed on " + l.where, now, f);
  }
  if (!l.recorded.ok()) return;
  // Its owner may write the arbiter while it runs (a job with a compute share uses it).
  if (l.refused.ok() && ls.share && ls.share->share_milli > 0) {
    host_.ArbiterUser(q.uid, +1);
    l.run.arbiter = true;
  }
  if (!l.refused.ok()) {
    l.launched = l.refused;
  } else {
    if (l.run.container) {
      ls.container = LaunchSpec::Container{.image = q.spec->image,
                                           .own_path = q.spec->env.contains("PATH"),
                                           .memory_bytes = q.spec->memory_mib << 20,
                                           .cpu_milli = q.spec->cpu_milli,
                                           .pids_max = state_.config.pids_max};
    }
    l.launched = host_.Launch(ls, l.limits);
    l.run.cgroup = l.launched.ok() && l.limits.has_value();
  }
  if (!l.launched.ok()) {
    if (l.run.arbiter) host_.ArbiterUser(q.uid, -1);
    TransitionFields ff;
    ff.ended_at = now;
    ff.exit_code = ExitCodeOf(l.launched.status());  // 127: no such command, as a shell says
    (void)state_.store.Transition(q.id, JobState::kFailed,
                                  std::string(l.launched.status().message()), now, ff);
    return;
  }
  l.run.pid = l.launched->pid;
  l.run.start_time = l.launched->start_time;
  if (absl::Status st = state_.store.SetProcess(q.id, l.run.pid, l.run.start_time); !st.ok()) {
    spdlog::error("job {}: recording its process: {}", q.id, std::string(st.message()));
  }
}

void SchedulingLoop::CommitLaunch(Launch& l, double now) {
  const int64_t id = l.queued.id;
  std::string cancelled_by = std::move(state_.starting[id].cancelled_by);
  state_.starting.erase(id);
  if (!l.restart) state_.admission.NoteLeft();
  if (!l.recorded.ok() && l.restart) {
    // Not restarted (the store refused its placement): it ends, lost, its GPUs free.
    spdlog::error("job {}: not started again on its new size: {}", id,
                  std::string(l.recorded.message()));
    state_.engine->Ended(std::to_string(id));
    (void)state_.store.Transition(
        id, JobState::kLost,
        fmt::format("not started again on its new size: {}", std::string(l.recorded.message())),
        now);
    state_.dirty = true;
    return;
  }
  if (!l.recorded.ok()) {
    // Not started (the store refused the transition): back in the queue for the next pass.
    spdlog::error("job {}: {}", id, std::string(l.recorded.message()));
    state_.engine->Ended(std::to_string(id));
    state_.Enqueue(std::move(l.queued));
    state_.dirty = true;
    return;
  }
  if (!l.launched.ok()) {
    state_.engine->Ended(std::to_string(id));
    spdlog::info("job {}: failed to start: {}", id, std::string(l.launched.status().message()));
    state_.dirty = true;
    return;
  }
  RunningJob& run = state_.runs->Add(std::move(l.run));
  state_.runs->NoteSharing(run);  // shares beside one another on a GPU: each's history says so
  if (state_.exits) state_.exits->Watch(id, run.pid);
  spdlog::info("job {}: running on {} (pid {})", id, l.where, run.pid);
  if (!l.restart) state_.scheduling.Started(std::max(0.0, now - l.queued.since));
  if (!cancelled_by.empty()) state_.runs->RequestStop(run, "cancel", cancelled_by, now);
}

}  // namespace tessera::server
