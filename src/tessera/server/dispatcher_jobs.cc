// The dispatcher's side of running jobs (the table and what is done to each job are
// running_jobs.h's): their ends (how a job ended, its usage, its re-queueing, an end the full disk
// kept from being recorded), the history samples' measurements, and their launch (planned under
// the lock by launch_plan.h, executed without it, committed).
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
    if (!unrecorded_.empty()) RecordUnrecorded();
    if (reserve_used_.load() && unrecorded_.empty() && MakeReserve()) {
      reserve_used_ = false;
      spdlog::info(
          "the state folder's disk has room again: its reserve is made again, submits "
          "are taken");
    }
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
    // it goes back to the queue (Finish records it so, and it is enqueued again below).
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
  for (Ending& e : endings) Finish(e, now);
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
    if (!runs_->AnyOf(uid)) RemoveLeftShm(uid);
  }
}

void Dispatcher::RemoveLeftShm(uint32_t uid) {
  if (config_.shm_dir.empty() || uid == 0 || uid == geteuid()) return;
  DIR* dir = opendir(config_.shm_dir.c_str());
  if (dir == nullptr) return;
  const int fd = dirfd(dir);
  size_t files = 0;
  uint64_t bytes = 0;
  while (const dirent* e = readdir(dir)) {
    struct stat st;
    if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != uid) continue;
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) continue;
    if (unlinkat(fd, e->d_name, 0) == 0) ++files, bytes += static_cast<uint64_t>(st.st_size);
  }
  closedir(dir);
  if (files > 0) {
    spdlog::info(
        "user {}: removed {} files ({} MiB) their jobs left in {}: none of their jobs runs",
        UserName(uid), files, bytes >> 20, config_.shm_dir);
  }
}

void Dispatcher::Finish(Ending& e, double now) {
  Running& r = e.run;
  const int exit_code = e.exit_code;
  const bool exit_known = e.exit_known;
  std::error_code ec;
  if (!r.region.empty()) {
    // Its last GPU use first: the arbiter's count and the region's peak.
    if (!r.gpus.empty())
      r.AddShareReading(host_->ReadShare(r.id, r.gpus, r.gpu_milli > 0, r.region));
    host_->RemoveRegion(r.region);
  }
  TransitionFields f;
  f.ended_at = now;
  if (exit_known) f.exit_code = exit_code;
  CgroupUsage usage;
  json u = json::object();
  if (r.cgroup) {
    usage = host_->Usage(r.id);
    if (usage.cpu_seconds >= 0) u["cpu_seconds"] = usage.cpu_seconds;
    if (usage.peak_memory_bytes >= 0) u["peak_memory_bytes"] = usage.peak_memory_bytes;
    u["oom_kills"] = usage.oom_kills;
    // What the job left running goes with it; a cgroup still busy is removed on a later turn.
    e.cgroup_left = !host_->Unconfine(r.id);
  }
  // What it left in its own /tmp and /dev/shm goes with it (its processes are gone with its
  // cgroup).
  host_->RemovePrivateDirs(r.id);
  // Its GPU use, for the history that predicts the next runs: measured utilization (percent of
  // its GPUs' time) and the most GPU memory it held per GPU.
  // Rounded to a tenth of a point, as stored: the history a restart reads back is the same.
  std::optional<double> util = r.GpuUtilization(now);
  if (util) {
    util = std::round(*util * 10) / 10;
    u["gpu_utilization_pct"] = *util;
  }
  if (r.gpu_peak_mib > 0) u["gpu_peak_memory_mib"] = r.gpu_peak_mib;
  if (!r.region.empty()) u["shared_gpu"] = r.shared_gpu;
  if (!u.empty()) f.usage_json = u.dump();
  JobState to;
  std::string reason;
  bool requeue = false;
  if (r.stop == "cancel") {
    to = JobState::kCancelled, reason = r.stop_reason;
  } else if (r.stop == "preempt") {
    to = JobState::kPreempted, reason = r.stop_reason;
    requeue = e.requeue_wanted;
  } else if (r.stop == "unhealthy") {
    requeue = e.requeue_wanted;
    to = requeue ? JobState::kPreempted : JobState::kFailed, reason = r.stop_reason;
  } else if (r.stop == "timeout" || r.stop == "logs") {
    to = JobState::kFailed, reason = r.stop_reason;
  } else if (!exit_known) {
    to = JobState::kLost,
    reason = "its process ended while the server was not its parent; exit status unknown";
  } else if (exit_code == 0) {
    to = JobState::kSucceeded, reason = "exit code 0";
  } else if (r.container && exit_code >= 125 && exit_code <= 127) {
    // podman's own codes: it could not run the container, or the command in it.
    to = JobState::kFailed;
    reason = exit_code == 125   ? "podman could not run the container (exit code 125; its error is "
                                  "in the job's stderr log)"
             : exit_code == 126 ? "the command cannot be run in the container (exit code 126)"
                                : "the command was not found in the container (exit code 127)";
  } else {
    to = JobState::kFailed;
    reason = exit_code > 128
                 ? fmt::format("ended by signal {} (exit code {})", exit_code - 128, exit_code)
                 : fmt::format("exit code {}", exit_code);
    if (usage.oom_kills > 0) {
      reason = fmt::format(
          "over its memory limit of {} MiB: the kernel killed {} of its processes (OOM); {}",
          r.memory_mib, usage.oom_kills, reason);
    }
  }
  // A container left behind: its client was stopped, or ended while another server was its parent.
  // (One killed after the grace period was removed then.)
  if (r.container && containers_ && !r.killed && (!r.stop.empty() || !exit_known))
    host_->RemoveContainer(r.id);
  // Its run time joins the history that predicts the next ones - before its end is recorded, so
  // that whoever sees it ended (and submits the next run) finds it in the history.
  if (to == JobState::kSucceeded && r.spec) {
    engine_->history().Add(RunKindOf(*r.spec, r.owner), now - r.started, util,
                           r.region.empty() ? std::nullopt : std::optional<bool>(r.shared_gpu));
  }
  absl::Status st = store_->Transition(r.id, to, reason, now, f);
  if (!st.ok() && UseReserve()) {
    spdlog::warn(
        "job {}: recording its end: {}; the disk is full: its reserve of {} MiB is given up for "
        "it (submits are refused until there is room again)",
        r.id, std::string(st.message()), kReserveBytes >> 20);
    st = store_->Transition(r.id, to, reason, now, f);
  }
  if (!st.ok()) {
    spdlog::error(
        "job {}: its end ({}) cannot be recorded now ({}): it is kept and recorded once "
        "the disk has room",
        r.id, JobStateName(to), std::string(st.message()));
    unrecorded_.push_back(UnrecordedEnd{r.id, to, reason, now, f});
    return;
  }
  // Recorded: a restart no longer needs the exit file to tell how it ended.
  fs::remove(JobFile("exit", r.id), ec);
  spdlog::info("job {}: {} ({})", r.id, JobStateName(to), reason);
  if (requeue) {
    auto rec = store_->Get(r.id);
    auto spec = rec.ok() ? ParseJobSpec(rec->spec_json) : absl::StatusOr<JobSpec>(rec.status());
    if (spec.ok() && store_->Transition(r.id, JobState::kQueued, "re-queued", now).ok()) {
      e.requeue = QueuedJob::Of(*rec, std::make_shared<const JobSpec>(*std::move(spec)), now);
    }
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

namespace tessera::server {

void Dispatcher::RecordUnrecorded() {
  std::error_code ec;
  for (auto it = unrecorded_.begin(); it != unrecorded_.end();) {
    if (absl::Status st = store_->Transition(it->id, it->to, it->reason, it->at, it->fields);
        !st.ok()) {
      ++it;
      continue;
    }
    fs::remove(JobFile("exit", it->id), ec);
    spdlog::info("job {}: {} ({}), recorded now that the disk has room", it->id,
                 JobStateName(it->to), it->reason);
    it = unrecorded_.erase(it);
  }
}

bool Dispatcher::MakeReserve() {
  const std::string path = config_.state_dir + "/reserve";
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  // Blocks allocated now (not a sparse file): giving it up frees them.
  const bool ok = posix_fallocate(fd, 0, static_cast<off_t>(kReserveBytes)) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

bool Dispatcher::UseReserve() {
  if (unlink((config_.state_dir + "/reserve").c_str()) != 0) return false;
  reserve_used_ = true;
  return true;
}

}  // namespace tessera::server
