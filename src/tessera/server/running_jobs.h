#pragma once
// RunningJobs: the executor side's table - the jobs whose processes run on this machine - and what
// is done to a running job through the JobHost:
// - a stop asked (cancel, preemption, timeout, log limit, a failed GPU): SIGTERM to its process
//   group once (SIGKILL at once if that fails), then SIGKILL when its grace period has passed;
// - a kill (a forced cancel, the grace run out): SIGKILL once, and its container removed by name;
// - each look (Check): a job whose process ended is told (reaped when this server is its parent,
//   otherwise its process gone and its exit file read), a job past its max runtime or over its log
//   limit is stopped, one still running its grace after SIGTERM is killed;
// - its GPU use measured from the history samples (utilization of the GPUs it holds alone, the
//   arbiter's GPU time and the region's peak for shares), for its history and its efficiency.
// What happens when a job ends (its GPUs freed in the engine, its end recorded, a re-queue) is
// SchedulingLoop's and JobEnds'. It takes no lock: its callers hold DispatchState's
// (running_jobs_test.cc drives it alone against a FakeJobHost and a fake clock).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/devices/device_source.h"
#include "tessera/server/auto_size.h"
#include "tessera/server/job_host.h"
#include "tessera/server/job_spec.h"

namespace tessera::server {

struct JobRecord;

struct RunningJob {
  int64_t id = 0;
  pid_t pid = 0;
  uint64_t start_time = 0;
  bool adopted = false;  // started by an earlier server process: not our child
  std::vector<int> gpus;
  std::string stop;  // why a stop was asked: cancel | preempt | timeout | unhealthy | logs; empty:
                     // none
  std::string stop_reason;
  double stop_at = 0;  // when SIGTERM went out
  bool killed = false;
  double started = 0;
  double max_runtime_s = 0;
  int tasks = 1;                 // its processes, each with its logs (TaskLogPath)
  double grace_period_s = 0;     // SIGTERM, then SIGKILL after this
  int64_t memory_limit_mib = 0;  // fractional jobs: the job's GPU memory limit
  int gpu_milli = 0;
  std::string region;
  bool container = false;  // runs in a podman container (named ContainerName(id))
  int64_t memory_mib = 0;  // its host memory limit (0: none)
  bool cgroup = false;     // has its own cgroups (Cgroups::Create)
  uint32_t uid = 0;        // its owner's
  bool arbiter = false;    // its owner may write the GPU arbiter file for it (ArbiterUser)
  int64_t array_id = 0;    // a task of this array
  std::shared_ptr<const JobSpec> spec;  // for its history when it succeeds
  std::string owner;
  // What it is measured to use of its GPUs (Measure, and the dispatcher at its end): utilization
  // from the history samples in which it held its GPUs alone, GPU time the arbiter charged it
  // (shares with a compute share), and the most GPU memory seen (MiB per GPU; shares: their
  // region's peak).
  double util_sum = 0;
  int util_samples = 0;
  uint64_t arbiter_busy_us = 0;
  uint64_t arbiter_seen_us = 0;  // the arbiter's count when last read
  uint64_t arbiter_held_us = 0;  // how long its launches waited for the GPU (per GPU)
  uint64_t arbiter_held_seen_us = 0;
  int64_t gpu_peak_mib = 0;
  uint64_t kernel_launches = 0;  // a share's, counted by its region (read at its end)
  uint64_t gpu_refused = 0;    // GPU memory allocations refused for its limit (its region's count)
  int64_t gpu_wanted_mib = 0;  // the most GPU memory it would have held (per GPU) had they not been
  bool shared_gpu = false;     // a share that another share's job ran beside (Add)
  // Elastic, resized while it runs (JobSpec::Resizable): the GPUs it is to run on next (empty: no
  // resize asked), when it was asked to move there (its job told, for resize by signal), its
  // place in its array, its priority, how many times it was started again on a new size, and its
  // sizes so far (from when, how many GPUs; empty: the one it started with).
  std::vector<int> resize_to;
  double resize_at = 0;
  int array_index = -1;
  int priority = 0;
  int restarts = 0;
  std::vector<std::pair<double, int>> sizes;
  // What its runs before its last restart used of their cgroups (CPU time summed, memory peak the
  // most, OOM kills summed; each made anew at a restart): its end adds its last run's.
  CgroupUsage earlier;
  // Its usage over all its runs: `last` (its last run's cgroup) with `earlier`.
  CgroupUsage WithEarlier(const CgroupUsage& last) const;

  // Adds one reading of its share's files (JobHost::ReadShare).
  void AddShareReading(const JobHost::ShareUse& s);
  // Its GPU utilization over its run until `now` (percent), when measured.
  std::optional<double> GpuUtilization(double now) const;
  // A compute share's launches that waited for the GPU (another job's slice, or its cap): the
  // part of its run until `now` it was held back (percent), and what it would have used had it
  // not been (core::DemandPct); nullopt when it never waited or is not a compute share.
  struct HeldBack {
    double pct = 0;         // of its run
    double demand_pct = 0;  // of a GPU
  };
  std::optional<HeldBack> GpuHeldBack(double now) const;
};

// <state_dir>/<dir>/<id><suffix>: a job's log, exit or region file; and the log of a job's task
// other than task 0.
std::string JobFilePath(const std::string& state_dir, const char* dir, int64_t id,
                        const char* suffix = "");
std::string TaskLogPath(const std::string& state_dir, int64_t id, int task, const char* suffix);

// A stop asked of a running job (RunningJob::stop, stop_reason, stop_at), kept in
// <state_dir>/stop/<id> until its end is recorded: a server restarted meanwhile re-adopts it still
// stopping, or records its end as the stop asked (preempted and re-queued, cancelled...), not as
// an exit code. Written through a temporary file and renamed, not fsynced: it need only outlive
// the server's process (a power loss ends the job too).
struct StopAsked {
  std::string why, reason;
  double at = 0;
};
void WriteStopFile(const std::string& state_dir, int64_t id, const StopAsked& stop);
// nullopt: none, or unreadable (said).
std::optional<StopAsked> ReadStopFile(const std::string& state_dir, int64_t id);
void RemoveStopFile(const std::string& state_dir, int64_t id);

// A resize asked of a running elastic job by signal, kept in <state_dir>/resize/<id> until it is
// carried out or its job ends: what the job reads (TESSERA_RESIZE_FILE, lines of NAME=value:
// TESSERA_RESIZE_GPUS, CUDA_VISIBLE_DEVICES with the new GPUs' UUIDs, TESSERA_RESIZE_ASKED_AT), and
// what a restarted server finds asked. Written through a temporary file and renamed, readable by
// the job's owner alone (`uid`, when the server runs as root).
std::string ResizeFilePath(const std::string& state_dir, int64_t id);
void WriteResizeFile(const std::string& state_dir, int64_t id,
                     const std::vector<std::string>& uuids, double asked_at, uint32_t uid);
// When the resize in the file was asked; nullopt: none (or unreadable, said).
std::optional<double> ReadResizeFile(const std::string& state_dir, int64_t id);
void RemoveResizeFile(const std::string& state_dir, int64_t id);
// The exit code by which a job resized by signal says it checkpointed and is to be started again on
// its new GPUs (sysexits.h's EX_TEMPFAIL: try again).
inline constexpr int kResizeExitCode = 75;

// What a finished job's record says it used (its usage, read once): its utilization, whether it
// shared its GPU, its GPU memory figures (peak, refusals, the most it asked), and whether its run
// was a trial.
struct RecordedUse {
  // What it teaches of its GPU utilization: what it would have used where it was held back
  // (gpu_demand_pct), else what it used (gpu_utilization_pct).
  std::optional<double> util;
  std::optional<bool> shared_gpu;
  GpuMemoryUse memory;
  bool trial = false;
};
RecordedUse UsageOf(const JobRecord& r);

class RunningJobs {
 public:
  struct Options {
    std::string state_dir;               // the jobs' logs and exit files
    uint64_t max_log_bytes_per_job = 0;  // 0: no limit
  };
  RunningJobs(JobHost& host, Options options) : host_(host), options_(std::move(options)) {}
  // Whether jobs may run in containers (a killed one's container is then removed by name).
  void set_containers(bool on) { containers_ = on; }

  // ---- the table ----
  // Tracks `r` (replacing a job of its id).
  RunningJob& Add(RunningJob r);
  // A share that has just started on the same GPUs as other shares: each is marked as having run
  // shared (its history says so).
  void NoteSharing(RunningJob& run);
  // After a restart: each re-adopted share that ran beside another - one re-adopted with it, or
  // one in `others` (the store's jobs of its run, with their placements) that ran on the same GPUs
  // and ended after it started (also while the server was down) - is marked shared, as it was
  // before (the mark itself is not stored).
  void NoteSharingSince(const std::vector<JobRecord>& others);
  // When the earliest re-adopted share started (nullopt: none): the period NoteSharingSince needs.
  std::optional<double> EarliestAdoptedShare() const;
  RunningJob* Find(int64_t id);
  // Stops tracking it; it leaves with what was measured of it.
  RunningJob Take(int64_t id);
  bool contains(int64_t id) const { return jobs_.contains(id); }
  size_t size() const { return jobs_.size(); }
  const std::map<int64_t, RunningJob>& jobs() const { return jobs_; }
  bool AnyOf(uint32_t uid) const;

  // ---- what is done to a job ----
  // A stop asked once; one asked for any other reason while the job stops to be resized ("resize")
  // takes its place (the job is not started again), its SIGTERM already sent.
  void RequestStop(RunningJob& r, const std::string& why, const std::string& reason, double now);
  // Elastic `r` is to run on `to` (its GPUs' `uuids`): by signal, its resize file written and
  // SIGUSR1 sent (once, until it is carried out; a later ask rewrites the file); by restart, it is
  // stopped ("resize"). Nothing when it is stopping for another reason, or `to` is what it runs on
  // and nothing was asked yet.
  void AskResize(RunningJob& r, std::vector<int> to, const std::vector<std::string>& uuids,
                 double now);
  // Whether `r`'s end is the one its resize asked (it is then started again on resize_to): it was
  // stopped to be resized, or after its signal it exited kResizeExitCode or was killed by the
  // signal (it had no handler yet: a job signalled the moment it started loses nothing).
  static bool EndsForResize(const RunningJob& r, std::optional<int> code);
  // The jobs that did not answer a resize to grow in their grace and keep the size they run at
  // (resize.unanswered keep), since the last call: the engine frees what they were to grow onto.
  std::vector<int64_t> TakeKept() { return std::exchange(kept_, {}); }
  void Kill(RunningJob& r, const std::string& why);
  // Every job on GPU `gpu` asked to stop (the GPU failed); with `mps_only`, only its MPS clients
  // (the GPU's MPS daemon died).
  void StopOn(int gpu, const std::string& why, const std::string& reason, double now,
              bool mps_only = false);
  // One look at every job at `now`: those whose process ended, with their exit code when known;
  // the others stopped or killed as their limits and grace say. Logs are measured about once a
  // second of `now`, not at every look.
  std::vector<std::pair<int64_t, std::optional<int>>> Check(double now);
  // One history sample: `telemetry` per GPU, `holders` per GPU (how many jobs hold it: readings
  // count for a job only where it holds its GPUs alone), and the shares' own readings by job.
  void Measure(const std::vector<devices::GpuTelemetry>& telemetry, const std::vector<int>& holders,
               const std::map<int64_t, JobHost::ShareUse>& shares);

  // The size of a job's logs, every task's.
  uint64_t LogBytes(const RunningJob& r) const;

 private:
  JobHost& host_;
  Options options_;
  bool containers_ = false;
  std::map<int64_t, RunningJob> jobs_;
  double logs_checked_ = 0;    // when Check last measured logs
  std::vector<int64_t> kept_;  // TakeKept
};

}  // namespace tessera::server
