#pragma once
// FakeLauncher: a Launcher for tests that starts no process. A job "sleep N" runs N seconds of the
// given clock (a core::FakeClock the test advances) and exits 0; "false" exits 1 at once; any other
// command cannot be executed. SIGTERM ends a job `stop_latency_s` later (exit 143), SIGKILL at once
// (137). With AnswerResizes, a job answers SIGUSR1 as an elastic job resized by signal does
// (docs/server.md): it checkpoints and exits 75 `stop_latency_s` later, and started again
// (TESSERA_RESTARTS) it goes on from its checkpoint. Like a shepherd, it writes the job's exit file
// when a job that is not reaped as a child (a re-adopted one) is seen to have ended. Records every
// start and signal. Thread-safe.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "tessera/core/clock.h"
#include "tessera/core/numeric.h"
#include "tessera/server/launcher.h"

namespace tessera::server {

class FakeLauncher final : public Launcher {
 public:
  struct Started {
    int64_t job_id;
    double at;
    std::vector<std::string> gpu_uuids;
    std::map<std::string, std::string> env;  // as the server gave it (Tessera's are the runner's)
    std::vector<TaskLaunch> tasks;
    std::optional<uid_t> uid;  // who it would run as (set only when the server runs as root)
    std::optional<gid_t> gid;
  };

  explicit FakeLauncher(const core::Clock& clock, double stop_latency_s = 0)
      : clock_(clock), stop_latency_s_(stop_latency_s) {}

  absl::StatusOr<Launched> Start(const LaunchSpec& spec) override {
    std::unique_lock lock(mu_);
    if (hold_starts_) {
      ++held_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return !hold_starts_; });
      --held_;
    }
    const double now = Now();
    Job j;
    j.job_id = spec.job_id;
    if (spec.argv.size() == 2 && spec.argv[0] == "sleep") {
      j.resumed = now;
      j.left = std::stod(spec.argv[1]);
      j.rate = Rate(spec.job_id, static_cast<int>(spec.gpu_uuids.size()));
      // Started again for its resize: after its restart's cost, it goes on from its checkpoint.
      auto left = checkpoints_.find(spec.job_id);
      if (left != checkpoints_.end() && spec.env.contains("TESSERA_RESTARTS")) {
        j.left = left->second;
        j.resumed = now + restart_overhead_s_;
      }
      checkpoints_.erase(spec.job_id);  // any other start is a new run, from the beginning
      j.end = j.resumed + j.left / j.rate;
    } else if (spec.argv.size() == 1 && spec.argv[0] == "false") {
      j.end = now;
      j.code = 1;
    } else {
      return absl::InvalidArgumentError(fmt::format(
          "job {}: cannot execute '{}': No such file or directory", spec.job_id, spec.argv[0]));
    }
    j.exit_path = spec.exit_path;
    const pid_t pid = next_pid_++;
    jobs_[pid] = j;
    started_.push_back(
        {spec.job_id, now, spec.gpu_uuids, spec.env, spec.tasks, spec.uid, spec.gid});
    return Launched{pid, static_cast<uint64_t>(pid)};
  }

  bool Signal(pid_t pgid, int sig) override {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(pgid);
    if (it == jobs_.end() || it->second.end <= Now()) return false;
    signals_.emplace_back(pgid, sig);
    Job& j = it->second;
    if (sig == SIGKILL) {
      j.end = Now(), j.code = 128 + SIGKILL;
    } else if (sig == SIGTERM && Now() + stop_latency_s_ < j.end) {
      j.end = Now() + stop_latency_s_, j.code = 128 + SIGTERM;
    } else if (sig == SIGUSR1 && answer_resizes_ && Now() + stop_latency_s_ < j.end) {
      // It works on until it has checkpointed, and exits as the resize contract asks.
      j.end = Now() + stop_latency_s_, j.code = 75;
      checkpoints_[j.job_id] = std::max(0.0, j.left - std::max(0.0, j.end - j.resumed) * j.rate);
    }
    return true;
  }

  std::optional<int> Reap(pid_t pid) override {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(pid);
    if (it == jobs_.end() || it->second.end > Now()) return std::nullopt;
    int code = it->second.code;
    jobs_.erase(it);
    return code;
  }

  bool Alive(pid_t pid, uint64_t) override {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(pid);
    if (it == jobs_.end()) return false;
    if (it->second.end > Now()) return true;
    if (!it->second.exit_path.empty())
      std::ofstream(it->second.exit_path) << it->second.code << "\n";
    jobs_.erase(it);
    return false;
  }

  bool WatchableByPidfd() const override { return false; }

  // While on, Start blocks (a slow fork/exec) until ReleaseStarts.
  void HoldStarts() {
    std::lock_guard lock(mu_);
    hold_starts_ = true;
  }
  void ReleaseStarts() {
    std::lock_guard lock(mu_);
    hold_starts_ = false;
    changed_.notify_all();
  }
  // Waits (up to `seconds` of real time) until a Start is being held.
  bool WaitForHeldStart(double seconds) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::duration<double>(seconds),
                             [&] { return held_ > 0; });
  }

  // From now on, jobs answer SIGUSR1 as an elastic job resized by signal does; started again, one
  // spends `restart_overhead_s` (loading its checkpoint) before it goes on.
  // With `base_gpus` (a job's id -> the GPUs its "sleep N" takes N seconds on; 0: any), such a
  // job on n GPUs works at Amdahl's speedup(n) / speedup(base) with `serial_fraction`, as the
  // simulator's elastic jobs do (sim::ReplayConfig::elastic_serial_fraction).
  void AnswerResizes(double restart_overhead_s, double serial_fraction = 1,
                     std::function<int(int64_t)> base_gpus = nullptr) {
    std::lock_guard lock(mu_);
    answer_resizes_ = true;
    restart_overhead_s_ = restart_overhead_s;
    serial_fraction_ = serial_fraction;
    base_gpus_ = std::move(base_gpus);
  }

  // How long jobs started from now on take to stop after SIGTERM.
  void set_stop_latency(double seconds) {
    std::lock_guard lock(mu_);
    stop_latency_s_ = seconds;
  }

  // When the next running job ends; infinity when none runs.
  double NextEnd() const {
    std::lock_guard lock(mu_);
    double t = std::numeric_limits<double>::infinity();
    for (const auto& [pid, j] : jobs_) t = std::min(t, j.end);
    return t;
  }
  std::vector<Started> started() const {
    std::lock_guard lock(mu_);
    return started_;
  }
  std::vector<std::pair<pid_t, int>> signals() const {
    std::lock_guard lock(mu_);
    return signals_;
  }

 private:
  struct Job {
    int64_t job_id = 0;
    double end = 0;
    int code = 0;
    std::string exit_path;
    // A "sleep N": when it began to make progress, how much of N was left then, and how fast it
    // works (1: N seconds).
    double resumed = 0, left = 0, rate = 1;
  };
  // The rate of job `id` on `n` GPUs (the replay's Speed: one ElasticSpeed).
  double Rate(int64_t id, int n) const {
    const int base = base_gpus_ ? base_gpus_(id) : 0;
    return base <= 0 || n <= 0 ? 1 : core::ElasticSpeed(serial_fraction_, n, base);
  }
  double Now() const { return core::Seconds(clock_.Now()); }

  const core::Clock& clock_;
  double stop_latency_s_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool hold_starts_ = false;
  int held_ = 0;
  std::map<pid_t, Job> jobs_;  // running (or ended, not yet reaped)
  std::vector<Started> started_;
  std::vector<std::pair<pid_t, int>> signals_;
  bool answer_resizes_ = false;
  double restart_overhead_s_ = 0;
  double serial_fraction_ = 1;
  std::function<int(int64_t)> base_gpus_;
  std::map<int64_t, double> checkpoints_;  // by job id: the seconds of its work done
  pid_t next_pid_ = 1000;
};

}  // namespace tessera::server
