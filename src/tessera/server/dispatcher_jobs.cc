// The dispatcher's side of running jobs (the table and what is done to each job are
// running_jobs.h's, what an end means and its record job_ends.h's): a look at them each turn (the
// ended ones taken out and handed to JobEnds without the lock, re-queued ones enqueued again), the
// history samples' measurements, and their launch (planned under the lock by launch_plan.h,
// executed without it, committed).
#include <arpa/inet.h>
#include <dirent.h>
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
#include <set>
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
#include "tessera/net/http.h"
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

void Dispatcher::CheckRunning(double now) {
  if (now - arbiter_checked_ >= 1) {  // about once a second: an open and a 12-byte read
    arbiter_checked_ = now;
    host_->RepairArbiter();
    ends_->Tend();
  }
  const std::vector<std::pair<int64_t, std::optional<int>>> ended = runs_->Check(now);
  for (auto it = cgroups_left_.begin(); it != cgroups_left_.end();) {
    it = host_->Unconfine(*it) ? cgroups_left_.erase(it) : std::next(it);
  }
  if (ended.empty()) return;
  // Their GPUs are free at once; what else an end takes (the cgroup's accounting, a container left
  // behind, the store's record with its fsync) is done without the lock, so that API reads do not
  // wait for it. Meanwhile the jobs are `finishing_`: a cancel is told they have ended.
  std::vector<Ending> endings;
  for (auto& [id, code] : ended) {
    if (exits_) exits_->Unwatch(id);
    Running run = runs_->Take(id);
    // Its GPUs are free; stopped for preemption or a failed GPU, the engine's rules say whether
    // it goes back to the queue (JobEnds records it so, and it is enqueued again below).
    bool requeue = false;
    const std::string job = std::to_string(id);
    if (run.stop == "preempt") {
      requeue = engine_->Stopped(job, sched::StopCause::kPreempted);
    } else if (run.stop == "unhealthy") {
      requeue = engine_->Stopped(job, sched::StopCause::kUnhealthy);
    } else {
      engine_->Ended(job);
    }
    if (run.arbiter) host_->ArbiterUser(run.uid, -1);
    endings.push_back(Ending{std::move(run), code.value_or(-1), code.has_value()});
    endings.back().requeue_wanted = requeue;
    finishing_.insert(id);
  }
  dirty_ = true;
  Publish();
  mu_.unlock();
  for (Ending& e : endings) ends_->Record(e, now);
  mu_.lock();
  std::set<uint32_t> users;
  for (Ending& e : endings) {
    finishing_.erase(e.run.id);
    admission_.NoteLeft();
    if (e.cgroup_left) cgroups_left_.insert(e.run.id);
    if (e.requeue) Enqueue(std::move(*e.requeue));
    users.insert(e.run.uid);
  }
  // What a user's jobs left in shared memory goes once none of them runs (jobs start on this
  // thread: none starts meanwhile).
  for (uint32_t uid : users) {
    if (!runs_->AnyOf(uid)) RemoveUserShm(config_.shm_dir, uid);
  }
}

void Dispatcher::MeasureRunning(const std::vector<devices::GpuTelemetry>& telemetry,
                                const std::map<int64_t, ShareReading>& shares) {
  const auto& state = engine_->scheduler().state();
  std::vector<int> holders(inventory_.gpus.size());
  for (size_t g = 0; g < holders.size(); ++g)
    holders[g] = state.gpu_use(0, static_cast<int>(g)).holders;
  runs_->Measure(telemetry, holders, shares);
}

void Dispatcher::ExecuteLaunch(Launch& l, double now) {
  const Queued& q = l.queued;
  LaunchSpec& ls = l.spec;
  TransitionFields f;
  f.started_at = now;
  f.placement_json = l.placement_json;
  l.recorded = store_->Transition(q.id, JobState::kRunning, "placed on " + l.where, now, f);
  if (!l.recorded.ok()) return;
  // Its owner may write the arbiter while it runs (a job with a compute share uses it).
  if (l.refused.ok() && ls.share && ls.share->share_milli > 0) {
    host_->ArbiterUser(q.uid, +1);
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
                                           .pids_max = config_.pids_max};
    }
    l.launched = host_->Launch(ls, l.limits);
    l.run.cgroup = l.launched.ok() && l.limits.has_value();
  }
  if (!l.launched.ok()) {
    if (l.run.arbiter) host_->ArbiterUser(q.uid, -1);
    TransitionFields ff;
    ff.ended_at = now;
    ff.exit_code = ExitCodeOf(l.launched.status());  // 127: no such command, as a shell says
    (void)store_->Transition(q.id, JobState::kFailed, std::string(l.launched.status().message()),
                             now, ff);
    return;
  }
  l.run.pid = l.launched->pid;
  l.run.start_time = l.launched->start_time;
  if (absl::Status st = store_->SetProcess(q.id, l.run.pid, l.run.start_time); !st.ok()) {
    spdlog::error("job {}: recording its process: {}", q.id, std::string(st.message()));
  }
}

void Dispatcher::CommitLaunch(Launch& l, double now) {
  const int64_t id = l.queued.id;
  std::string cancelled_by = std::move(starting_[id].cancelled_by);
  starting_.erase(id);
  admission_.NoteLeft();
  if (!l.recorded.ok()) {
    // Not started (the store refused the transition): back in the queue for the next pass.
    spdlog::error("job {}: {}", id, std::string(l.recorded.message()));
    engine_->Ended(std::to_string(id));
    Enqueue(std::move(l.queued));
    dirty_ = true;
    return;
  }
  if (!l.launched.ok()) {
    engine_->Ended(std::to_string(id));
    spdlog::info("job {}: failed to start: {}", id, std::string(l.launched.status().message()));
    dirty_ = true;
    return;
  }
  Running& run = runs_->Add(std::move(l.run));
  runs_->NoteSharing(run);  // shares beside one another on a GPU: each's history says so
  if (exits_) exits_->Watch(id, run.pid);
  spdlog::info("job {}: running on {} (pid {})", id, l.where, run.pid);
  scheduling_.Started(std::max(0.0, now - l.queued.since));
  if (!cancelled_by.empty()) runs_->RequestStop(run, "cancel", cancelled_by, now);
}

}  // namespace tessera::server
