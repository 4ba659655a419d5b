#pragma once
// A job as submitted to the standalone server (POST /v1/jobs): parsed strictly from JSON - wrong
// types, out-of-range values and unknown fields are refused with the field's name - and turned into
// a scheduling request.

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "tessera/core/request.h"
#include "tessera/sched/predictor.h"

namespace tessera::server {

// A dependency (`--after ok:12`): the job waits until job 12 (or every task of array 12; `12_3` is
// one task) has ended, and runs only when its outcome is the one asked: ok (succeeded), notok
// (failed or cancelled) or any.
struct Dependency {
  enum class Kind { kOk, kNotOk, kAny };
  Kind kind = Kind::kOk;
  int64_t job = 0;
  int task = -1;  // an index of array `job`; -1: the job itself (all of it, when an array)
  bool operator==(const Dependency&) const = default;
};
std::string DependencyText(const Dependency& d);  // "ok:12", "any:12_3"
absl::StatusOr<Dependency> ParseDependency(std::string_view text);

// Array indices run 0..kMaxArrayIndex.
inline constexpr int kMaxArrayIndex = 9999999;

// An array's indices (`--array 0-99%8`: "0-99", "1,3,8-15:2", each with an optional "%N" at the end
// for at most N tasks running at once), in ascending order without repeats.
struct ArrayRange {
  std::vector<int> indices;
  int throttle = 0;  // 0: no limit
};
// kInvalidArgument naming what is wrong: empty, a reversed range, a bad number, more than
// `max_tasks` tasks.
absl::StatusOr<ArrayRange> ParseArray(std::string_view text, size_t max_tasks);
// The "%N" of an array's text without expanding its indices; 0 when none (or malformed).
int ArrayThrottle(std::string_view text);

struct JobSpec {
  std::vector<std::string> command;  // argv; required
  std::map<std::string, std::string> env;
  std::string workdir;  // absolute; empty: the server's state directory
  std::string name;
  std::map<std::string, std::string> labels;
  // Resources: whole GPUs, or a fraction of a GPU (compute share in thousandths and/or memory) -
  // then on each of `gpus` GPUs (0 or 1: one).
  int gpus = 0;
  // Elastic (resources.gpus_max, `--gpus MIN-MAX`): whole GPUs from `gpus` up to this many; 0: not
  // elastic. Without `resize_by` the server starts it on the most that fit when nothing queued
  // wants a GPU, and it keeps that size (sched::Executor::Resizes).
  int gpus_max = 0;
  // How an elastic job is resized while it runs (`resize`, docs/server.md "Elastic jobs"):
  // "signal": told its new GPUs in a file and by SIGUSR1, it checkpoints and exits 75, and is
  // started again on them; "restart": stopped as for a preemption (SIGTERM, its grace) and
  // started again on them; empty: never (its size is fixed when it starts). A "signal" job that
  // has not exited within resize_grace_s is stopped and restarted ("restart") or, when it was to
  // grow, left as it is ("keep"; a shrink is always carried out: another job waits for the GPUs).
  std::string resize_by;
  double resize_grace_s = 60;
  std::string resize_unanswered = "restart";
  bool Resizable() const { return gpus_max > 0 && !resize_by.empty(); }
  int gpu_milli = 0;
  int64_t gpu_memory_mib = 0;
  // gpu_share / gpu_memory "auto": sized by the server at submission from what jobs of its kind
  // used (auto_size.h), into gpu_milli / gpu_memory_mib (or whole GPUs); `sizing` says how (empty:
  // not sized yet; stored with the job as "sized", so that a restart queues the same request).
  bool gpu_share_auto = false;
  bool gpu_memory_auto = false;
  std::string sizing;
  // A trial run (`tessera submit --trial 2m`): stopped after this long, as a success, with its
  // measured use and the size it recommends; its use joins the history "auto" sizes from. 0: none.
  double trial_s = 0;
  // Sized "auto" with nothing measured of its kind: its first run is a trial this long (set by the
  // server, stored in "sized"), after which it is re-queued sized from it. 0: none.
  double sizing_trial_s = 0;
  // How long its run is a trial: asked (trial_s), or the server's first run of an "auto" job.
  double TrialSeconds() const { return trial_s > 0 ? trial_s : sizing_trial_s; }
  std::vector<std::string>
      models;  // acceptable GPU models, exact names as NVML gives them; empty: any
  int64_t min_gpu_memory_mib = 0;
  std::string topology = "none";  // none | prefer | require (NVLink between the GPUs)
  // How its GPUs are shared (core::GpuSharing): "time-slice", "mps", or empty: a share in time
  // slices, whole GPUs in either mode. An MPS job's processes are clients of their GPU's MPS
  // daemon, and an MPS GPU serves one user's jobs at a time.
  std::string sharing;
  // Host CPU (thousandths of a CPU) and memory: scheduled against the machine's, and limits of
  // the job's cgroup. 0: not asked (no limit).
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int priority = 0;  // -1000..1000, higher first
  bool preemptible = true;
  double max_runtime_s = 0;  // 0: none
  // Seconds between the SIGTERM of a stop (cancel, preemption, timeout) and the SIGKILL; negative:
  // the server's default (preemption.grace_period_s).
  double grace_period_s = -1;
  std::string image;  // run in a container (podman) with the GPUs as CDI devices
  // Batch habits (docs/server.md, "Coming from Slurm").
  std::string array;  // an array of tasks ("0-99%8", ParseArray); empty: one job
  std::vector<Dependency> after;
  bool hold = false;  // submitted held: queued, but not started until released
  // Processes started on the job's GPUs: tasks_per_gpu per GPU, or ntasks in all (1: the command
  // itself, as one process). With more than one, each gets RANK, LOCAL_RANK, WORLD_SIZE,
  // MASTER_ADDR, MASTER_PORT; the job ends when all have, failing (the rest stopped) as soon as
  // one fails unless task_failure is "wait".
  int ntasks = 0;
  int tasks_per_gpu = 0;
  std::string task_failure = "kill";  // kill | wait
  // Where its output goes besides the server's logs: files of the user's, named by patterns as
  // Slurm's --output/--error (ExpandOutputPattern), opened by the job itself as its user after it
  // entered its working directory (a relative name is in it), appended to. Empty: the server's
  // logs (tessera logs). An error pattern without an output one is fine; an output pattern
  // without an error one sends stderr there too (as Slurm does).
  std::string stdout_file, stderr_file;
  // Whether it goes back to the queue when stopped for another job (preemption) or by a GPU that
  // failed under it (Slurm's --requeue / --no-requeue); unset: the server's settings
  // (preemption.requeue, health.unhealthy_action).
  std::optional<bool> requeue;
  // Whether it asks for a fraction of a GPU (then on each of `gpus` GPUs) rather than whole ones.
  bool Share() const { return gpu_milli > 0 || gpu_memory_mib > 0; }
  bool Auto() const { return gpu_share_auto || gpu_memory_auto; }
  // How many processes the job starts.
  int Tasks() const {
    return tasks_per_gpu > 0 ? tasks_per_gpu * std::max(gpus, 1) : std::max(ntasks, 1);
  }
};

// What an output pattern's %-escapes stand for, for one process of one job.
struct OutputNames {
  int64_t job_id = 0;    // %j: the job (an array task's own id)
  int64_t array_id = 0;  // %A: its array (the job itself when not a task)
  int array_index = -1;  // %a: its index in the array; -1: no array task
  int task = 0;          // %t: the process's rank
  std::string user;      // %u
  std::string name;      // %x: the job's name (its command's program when unnamed)
  std::string host;      // %N
};
// Expands %j %A %a %t %u %x %N and %% (%a of a job that is no array task: 4294967294, as Slurm
// writes NO_VAL; %5j and the like: zero-padded to that width). kInvalidArgument naming an unknown
// escape; CheckOutputPattern is the same check without names.
absl::StatusOr<std::string> ExpandOutputPattern(std::string_view pattern, const OutputNames& n);
absl::Status CheckOutputPattern(std::string_view pattern);
// Where a process of a job writes its stdout (err false) or stderr, as its spec asks
// (stdout_file, stderr_file; stderr follows stdout when only that is given): the expanded
// pattern, relative names in the job's workdir; empty when the server's logs take it.
std::string OutputFileOf(const JobSpec& spec, const OutputNames& names, bool err);

// kInvalidArgument naming the field ("resources.gpu_share: expected a share between 1% and 100%").
absl::StatusOr<JobSpec> ParseJobSpec(std::string_view json);
absl::StatusOr<JobSpec> JobSpecFromJson(const nlohmann::json& j);
nlohmann::json JobSpecToJson(const JobSpec& spec);

// Turns each of `spec`'s models into exact names of `available` (the machine's models): an exact
// name stays; otherwise the models that contain it as whole words, case aside ("H100", "a100",
// "T4", "H100 80GB"; not "100"), so that what is stored and scheduled is exact. kInvalidArgument
// naming the model and the machine's models when one matches none.
absl::Status ResolveModels(JobSpec* spec, const std::vector<std::string>& available);

// The scheduling request for a job.
core::Request RequestOf(const JobSpec& spec, int64_t job_id, const std::string& owner);

// What run-time history knows a job of `user` by (sched::DurationPredictor): its name, command,
// shape (HistoryShape) and max runtime.
sched::RunKind RunKindOf(const JobSpec& spec, const std::string& user);
// The same, for the job's request `r` (RequestOf) already at hand.
sched::RunKind RunKindOf(const JobSpec& spec, const std::string& user, const core::Request& r);
// The job's shape as history keys it: "2 GPU", "30% 10240MiB on 2 GPUs x2" (sched::HistoryShape).
std::string HistoryShape(const JobSpec& spec);

}  // namespace tessera::server
