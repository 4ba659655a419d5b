#include "tessera/server/job_ends.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tessera/sched/predictor.h"
#include "tessera/server/server_util.h"

namespace tessera::server {

EndOutcome EndOf(const RunningJob& r, int exit_code, bool exit_known, const CgroupUsage& usage,
                 bool requeue_wanted) {
  if (r.stop == "cancel") return {JobState::kCancelled, r.stop_reason};
  if (r.stop == "preempt") return {JobState::kPreempted, r.stop_reason, requeue_wanted};
  // Stopped to be resized, and not started again here (a restarted server found it ended): it
  // goes back to the queue at its place.
  if (r.stop == "resize") return {JobState::kPreempted, r.stop_reason, true};
  if (r.stop == "unhealthy") {
    return {requeue_wanted ? JobState::kPreempted : JobState::kFailed, r.stop_reason,
            requeue_wanted};
  }
  if (r.stop == "timeout" || r.stop == "logs") return {JobState::kFailed, r.stop_reason};
  // A trial stopped at its end did what it was for (JobEnds::Record says what it measured).
  if (r.stop == "trial") return {JobState::kSucceeded, r.stop_reason};
  if (!exit_known) {
    return {JobState::kLost,
            "its process ended while the server was not its parent; exit status unknown"};
  }
  if (exit_code == 0) return {JobState::kSucceeded, "exit code 0"};
  if (r.container && exit_code >= 125 && exit_code <= 127) {
    // podman's own codes: it could not run the container, or the command in it.
    return {JobState::kFailed,
            exit_code == 125   ? "podman could not run the container (exit code 125; its error is "
                                 "in the job's stderr log)"
            : exit_code == 126 ? "the command cannot be run in the container (exit code 126)"
                               : "the command was not found in the container (exit code 127)"};
  }
  std::string reason =
      exit_code > 128 ? fmt::format("ended by signal {} (exit code {})", exit_code - 128, exit_code)
                      : fmt::format("exit code {}", exit_code);
  if (usage.oom_kills > 0) {
    reason = fmt::format(
        "over its memory limit of {} MiB: the kernel killed {} of its processes (OOM); {}",
        r.memory_mib, usage.oom_kills, reason);
  }
  return {JobState::kFailed, std::move(reason)};
}

void LearnFromEnd(sched::DurationPredictor& history, const JobSpec& spec, const std::string& owner,
                  const EndFacts& e) {
  // Its memory: its peak, or past it what its limit refused it (outgrown_mib).
  const auto memory = static_cast<double>(std::max(e.peak_mib, e.outgrown_mib));
  if (e.trial) {
    for (const sched::RunKind& kind : TrialKinds(spec, owner)) {
      if (e.util) history.AddUtilization(kind, *e.util);
      history.AddGpuMemoryPeak(kind, memory);
    }
  } else if (e.to == JobState::kSucceeded) {
    const sched::RunKind kind = RunKindOf(spec, owner);
    history.Add(kind, e.run_s, e.util, e.shared_gpu);
    history.AddGpuMemoryPeak(kind, memory);
  } else if (e.to == JobState::kFailed && e.outgrown_mib > 0) {
    history.AddGpuMemoryPeak(RunKindOf(spec, owner), static_cast<double>(e.outgrown_mib));
  }
}

JobEnds::JobEnds(JobHost& host, Store& store, sched::DurationPredictor& history, Options options)
    : host_(host), store_(store), history_(history), options_(std::move(options)) {}

void JobEnds::RemoveEndFiles(int64_t id) const {
  unlink(JobFilePath(options_.state_dir, "exit", id).c_str());
  RemoveStopFile(options_.state_dir, id);
  RemoveResizeFile(options_.state_dir, id);
}

void JobEnds::Record(Ending& e, double now) {
  RunningJob& r = e.run;
  if (!r.region.empty()) {
    // Its last GPU use first: the arbiter's count and the region's peak.
    if (!r.gpus.empty())
      r.AddShareReading(host_.ReadShare(r.id, r.gpus, r.gpu_milli > 0, r.region));
    r.kernel_launches = host_.KernelLaunches(r.region);
    host_.RemoveRegion(r.region);
  }
  TransitionFields f;
  f.ended_at = now;
  if (e.exit_known) f.exit_code = e.exit_code;
  CgroupUsage usage;
  nlohmann::json u = nlohmann::json::object();
  if (r.cgroup) {
    usage = r.WithEarlier(host_.Usage(r.id));
    if (usage.cpu_seconds >= 0) u["cpu_seconds"] = usage.cpu_seconds;
    if (usage.peak_memory_bytes >= 0) u["peak_memory_bytes"] = usage.peak_memory_bytes;
    u["oom_kills"] = usage.oom_kills;
    // What the job left running goes with it; a cgroup still busy is removed on a later turn.
    e.cgroup_left = !host_.Unconfine(r.id);
  }
  // What it left in its own /tmp and /dev/shm goes with it (its processes are gone with its
  // cgroup).
  host_.RemovePrivateDirs(r.id);
  // Its GPU use, for the history that predicts the next runs: measured utilization (percent of
  // its GPUs' time) and the most GPU memory it held per GPU. Rounded to a tenth of a point, as
  // stored: the history a restart reads back is the same.
  std::optional<double> util = r.GpuUtilization(now);
  if (util) {
    util = std::round(*util * 10) / 10;
    u["gpu_utilization_pct"] = *util;
  }
  // A compute share whose launches waited for the GPU: how long, and what it would have used had
  // they not - what it teaches (a share held to its slices is measured at most at its size).
  std::optional<double> held_back, demand;
  if (const auto held = r.GpuHeldBack(now); held && util && std::round(held->pct * 10) > 0) {
    held_back = std::round(held->pct * 10) / 10;
    demand = std::max(*util, std::round(held->demand_pct * 10) / 10);
    u["gpu_held_back_pct"] = *held_back;
    u["gpu_demand_pct"] = *demand;
  }
  const std::optional<double> teaches = demand ? demand : util;
  if (r.gpu_peak_mib > 0) u["gpu_peak_memory_mib"] = r.gpu_peak_mib;
  if (r.kernel_launches > 0) u["kernel_launches"] = r.kernel_launches;
  if (r.gpu_refused > 0) {
    u["gpu_memory_refused"] = r.gpu_refused;
    u["gpu_memory_wanted_mib"] = r.gpu_wanted_mib;
  }
  if (!r.region.empty()) u["shared_gpu"] = r.shared_gpu;
  if (r.stop == "trial")
    u["trial"] = true;  // its use is a trial's (LearnFromEnd, at a restart too)
  if (!u.empty()) f.usage_json = u.dump();
  EndOutcome end = EndOf(r, e.exit_code, e.exit_known, usage, e.requeue_wanted);
  // Failed where its GPU memory limit refused it (or, sized automatically, near its size), or
  // succeeded though its limit refused it: said with what to ask, and - sized automatically, or a
  // trial - what it needed remembered, so that the next run of its kind is sized past it.
  int64_t outgrown_mib = 0;
  if ((end.to == JobState::kFailed || end.to == JobState::kSucceeded) && r.spec) {
    if (std::string grew = MemoryOutgrownAtEnd(
            *r.spec, end.to == JobState::kFailed, r.stop == "trial",
            {.peak_mib = r.gpu_peak_mib, .refused = r.gpu_refused, .wanted_mib = r.gpu_wanted_mib},
            options_.sizing, &outgrown_mib);
        !grew.empty()) {
      end.reason += "; " + grew;
    }
  }
  // A container left behind: its client was stopped, or ended while another server was its parent.
  // (One killed after the grace period was removed then.)
  if (r.container && options_.containers && !r.killed && (!r.stop.empty() || !e.exit_known))
    host_.RemoveContainer(r.id);
  // What it teaches the history - before its end is recorded, so that whoever sees it ended (and
  // submits the next run) finds it there.
  if (r.spec) {
    LearnFromEnd(history_, *r.spec, r.owner,
                 {.to = end.to,
                  .trial = r.stop == "trial",
                  .run_s = now - r.started,
                  .util = teaches,
                  .shared_gpu = r.region.empty() ? std::nullopt : std::optional<bool>(r.shared_gpu),
                  .peak_mib = r.gpu_peak_mib,
                  .outgrown_mib = outgrown_mib});
  }
  // A trial: what it measured and the size that recommends.
  if (r.stop == "trial" && r.spec) {
    end.reason = TrialSummary(end.reason,
                              {.util_pct = util,
                               .held_back_pct = held_back,
                               .demand_pct = demand,
                               .peak_mib = r.gpu_peak_mib,
                               .refused = r.gpu_refused,
                               .wanted_mib = r.gpu_wanted_mib,
                               .kernel_launches = r.kernel_launches,
                               .run_s = now - r.started},
                              options_.sizing);
    // The server's trial of an "auto" job never measured: the job itself goes on, re-queued
    // under its id and sized from what the trial measured (its stored spec so, for a restart).
    if (r.spec->trial_s <= 0 && r.spec->sizing_trial_s > 0) {
      const JobSpec next =
          ResizeAfterTrial(*r.spec, history_.Predict(RunKindOf(*r.spec, r.owner)), options_.sizing);
      end = {JobState::kPreempted,
             fmt::format("{}; re-queued sized from it: {}", end.reason, next.sizing), true};
      f.spec_json = JobSpecToJson(next).dump();
    }
  }
  if (end.requeue) f.requeue = "re-queued";
  absl::Status st = store_.Transition(r.id, end.to, end.reason, now, f);
  if (!st.ok() && UseReserve()) {
    spdlog::warn(
        "job {}: recording its end: {}; the disk is full: its reserve of {} MiB is given up for "
        "it (submits are refused until there is room again)",
        r.id, std::string(st.message()), kReserveBytes >> 20);
    st = store_.Transition(r.id, end.to, end.reason, now, f);
  }
  if (!st.ok()) {
    spdlog::error(
        "job {}: its end ({}) cannot be recorded now ({}): it is kept and recorded once "
        "the disk has room",
        r.id, JobStateName(end.to), std::string(st.message()));
    unrecorded_.push_back(Unrecorded{r.id, end.to, end.reason, now, f});
    return;
  }
  // Recorded: a restart no longer needs the exit file to tell how it ended.
  RemoveEndFiles(r.id);
  spdlog::info("job {}: {} ({})", r.id, JobStateName(end.to), end.reason);
  if (end.requeue) e.requeue = Requeued(r.id, now);
}

std::optional<QueuedJob> JobEnds::Requeued(int64_t id, double now) {
  auto rec = store_.Get(id);
  auto spec = rec.ok() ? ParseJobSpec(rec->spec_json) : absl::StatusOr<JobSpec>(rec.status());
  if (!spec.ok()) {
    spdlog::error(
        "job {}: re-queued, but its record cannot be read back ({}): it waits for the "
        "next start of the server",
        id, std::string(spec.status().message()));
    return std::nullopt;
  }
  return QueuedJob::Of(*rec, std::make_shared<const JobSpec>(*std::move(spec)), now);
}

std::vector<QueuedJob> JobEnds::Tend(double now) {
  std::vector<QueuedJob> requeued;
  for (auto it = unrecorded_.begin(); it != unrecorded_.end();) {
    if (!store_.Transition(it->id, it->to, it->reason, it->at, it->fields).ok()) {
      ++it;
      continue;
    }
    RemoveEndFiles(it->id);
    spdlog::info("job {}: {} ({}), recorded now that the disk has room{}", it->id,
                 JobStateName(it->to), it->reason, it->fields.requeue ? "; re-queued" : "");
    if (it->fields.requeue) {
      if (std::optional<QueuedJob> q = Requeued(it->id, now)) requeued.push_back(*std::move(q));
    }
    it = unrecorded_.erase(it);
  }
  if (reserve_used_.load() && unrecorded_.empty() && MakeReserve()) {
    reserve_used_ = false;
    spdlog::info(
        "the state folder's disk has room again: its reserve is made again, submits are taken");
  }
  return requeued;
}

bool JobEnds::MakeReserve() {
  const std::string path = options_.state_dir + "/reserve";
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  // Blocks allocated now (not a sparse file): giving it up frees them.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(kReserveBytes));
  close(fd);
  if (err != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    if (err != 0) errno = err;
    const int saved = errno;
    unlink(tmp.c_str());
    errno = saved;
    return false;
  }
  return true;
}

bool JobEnds::UseReserve() {
  if (unlink((options_.state_dir + "/reserve").c_str()) != 0) return false;
  reserve_used_ = true;
  return true;
}

namespace {

// The inodes on `dev` under `shm_dir` that the live processes of user `uid` hold open or mapped.
std::set<ino_t> HeldShmFiles(const std::string& proc_dir, const std::string& shm_dir, dev_t dev,
                             uint32_t uid) {
  std::set<ino_t> held;
  DIR* procs = opendir(proc_dir.c_str());
  if (procs == nullptr) return held;
  const std::string prefix = shm_dir + "/";
  while (const dirent* p = readdir(procs)) {
    if (p->d_name[0] < '1' || p->d_name[0] > '9') continue;  // not a process
    const std::string pid_dir = proc_dir + "/" + p->d_name;
    struct stat ps;
    if (stat(pid_dir.c_str(), &ps) != 0 || ps.st_uid != uid) continue;
    // Its descriptors...
    if (DIR* fds = opendir((pid_dir + "/fd").c_str())) {
      while (const dirent* f = readdir(fds)) {
        struct stat st;
        if (f->d_name[0] != '.' && fstatat(dirfd(fds), f->d_name, &st, 0) == 0 && st.st_dev == dev)
          held.insert(st.st_ino);
      }
      closedir(fds);
    }
    // ...and its mappings (a file mapped and then closed, as POSIX shared memory and semaphores).
    std::ifstream maps(pid_dir + "/maps");
    for (std::string line; std::getline(maps, line);) {
      const size_t path = line.find(prefix);
      if (path == std::string::npos) continue;
      std::istringstream fields(line.substr(0, path));
      std::string range, perms, offset, device;
      unsigned long long ino = 0;
      if (fields >> range >> perms >> offset >> device >> ino) held.insert(static_cast<ino_t>(ino));
    }
  }
  closedir(procs);
  return held;
}

}  // namespace

size_t RemoveUserShm(const std::string& shm_dir, uint32_t uid, const std::string& proc_dir) {
  if (shm_dir.empty() || uid == 0 || uid == geteuid()) return 0;
  struct stat folder;
  if (stat(shm_dir.c_str(), &folder) != 0) return 0;
  // What a live process of the user still holds is not a leftover: their processes outside the
  // server (a login session, a notebook) keep their shared memory.
  const std::set<ino_t> held = HeldShmFiles(proc_dir, shm_dir, folder.st_dev, uid);
  DIR* dir = opendir(shm_dir.c_str());
  if (dir == nullptr) return 0;
  const int fd = dirfd(dir);
  size_t files = 0, kept = 0;
  uint64_t bytes = 0;
  while (const dirent* e = readdir(dir)) {
    struct stat st;
    if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != uid) continue;
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) continue;
    if (S_ISREG(st.st_mode) && st.st_dev == folder.st_dev && held.contains(st.st_ino)) {
      ++kept;
      continue;
    }
    if (unlinkat(fd, e->d_name, 0) == 0) ++files, bytes += static_cast<uint64_t>(st.st_size);
  }
  closedir(dir);
  if (files > 0 || kept > 0) {
    spdlog::info(
        "user {}: removed {} files ({} MiB) their jobs left in {}: none of their jobs runs; {} "
        "kept, held by a live process of theirs",
        UserName(uid), files, bytes >> 20, shm_dir, kept);
  }
  return files;
}

}  // namespace tessera::server
