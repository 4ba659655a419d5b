#pragma once
// What the Slurm plugin (spank_plugin.cc) decides and does for a job step on a node, apart from
// Slurm's SPANK calls so that it can be tested on its own: the limits a step's shards (or its
// --tessera-share/--tessera-mem options) mean, the node's files of a job (its shared region, the
// GPU arbiter and who may write it, a record of the job) and, at the job's end on the node, its
// accounting. docs/slurm.md has the user's side.
//
// Node files, under the plugin's state_dir (root's):
//   arbiter/gpu.arbiter   the node's GPU arbiter (as the server's: 0600 + an ACL entry per user
//                         with a running job that has a compute share; replaced to revoke one)
//   regions/<job>.region  the job's shared region: its memory limit per GPU, its use and peak
//                         (the job's user's, 0600); one for all its steps on the node
//   jobs/<job>.json       what was set up for the job (who, GPUs, limits, since when)
//   acct/<job>.json       written at the job's end on the node: its GPU time and peak memory per
//                         GPU (0644, as sacct shows every job to everyone by default)
//   history/<uid>/<name>.<job>.<host>.json  (<name>: a hash of the job's name)
//                         the same, kept per user for --tessera-mem/--tessera-share auto (root's,
//                         0700; under history_dir= instead: a folder the nodes share makes it the
//                         cluster's history); the newest kHistoryKept of each user

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tessera::slurm {

// The plugin's arguments in plugstack.conf (`key=value` words after the plugin's path).
struct PluginConfig {
  std::string library;                               // library=: libtessera-cuda.so (required)
  std::string state_dir = "/var/lib/tessera-slurm";  // state_dir=
  int shards_per_gpu = 0;               // shards_per_gpu=: gres.conf's shard Count per GPU
  uint64_t gpu_memory_bytes = 0;        // gpu_memory=: each GPU's memory (16GiB, 80G...)
  uint64_t context_overhead_bytes = 0;  // context_overhead=: per process and GPU
  // mps_gpus=: GPUs (indices, "0,1", or "all") shared by NVIDIA MPS instead of time slices. A step
  // on one is a client of its GPU's control daemon (tessera-slurm-mps@<N>.service; pipe and log
  // folders under state_dir/mps/gpu<N>/), with its share and memory as MPS's own limits; one
  // user's steps at a time on each.
  std::vector<int> mps_gpus;
  bool mps_all = false;
  std::string mps_control = "nvidia-cuda-mps-control";  // mps_control=
  // history_dir=: where ended jobs are kept for sizing "auto" (empty: <state_dir>/history). A
  // folder every node mounts (NFS) makes one history for the cluster; each epilog writes files of
  // its own host's name.
  std::string history_dir;
  int auto_margin_pct = 20;  // auto_margin=: added to the measured use when sizing "auto"
  // auto_trial=: a batch job asking "auto" of a name with no measured run yet runs first as a
  // trial this long on what its shards mean, then is requeued (slurm_requeue) and its next run
  // sized from it - the server's auto_size_trial. 0 (the default): none, it runs on its shards.
  double auto_trial_s = 0;
  // The Slurm node this runs as (SLURMD_NODENAME; empty: not known here). `%n` in state_dir= and
  // history_dir= is it - Slurm's own SlurmdSpoolDir convention, for hosts that run a slurmd per
  // node (--enable-multiple-slurmd) - and a history record is named by it (else the host's name).
  std::string node;
  // admin_comment=: whether the epilog writes the job's use on the node into its AdminComment
  // (AdminCommentPart): yes (the default) or no.
  bool admin_comment = true;
};
// The folder of ended jobs' records for sizing "auto" (history_dir=, or <state_dir>/history).
std::string HistoryDir(const PluginConfig& config);
// Records kept per user in the history (the oldest go first), and the newest of a job's kind
// that size it.
inline constexpr size_t kHistoryKept = 500;
inline constexpr size_t kHistorySized = 50;
// Whether GPU `gpu` is in MPS mode.
bool IsMps(const PluginConfig& config, int gpu);
// Unknown keys, malformed values and a missing library= are errors naming the word. `node` is
// the Slurm node's name (PluginConfig::node); a `%n` where it is empty is an error.
absl::StatusOr<PluginConfig> ParsePluginArgs(const std::vector<std::string>& args,
                                             const std::string& node = "");

// What Slurm says of a step (its environment) and what its user asked with the plugin's options.
struct StepRequest {
  std::string gpus;          // SLURM_STEP_GPUS (srun) or SLURM_JOB_GPUS (batch): "0,1"
  std::string shards;        // SLURM_SHARDS_ON_NODE: "3"; empty without shards
  std::string share_option;  // --tessera-share: "30%", "0.3"
  std::string mem_option;    // --tessera-mem: "10G", "512MiB" (a bare number is MiB, as --mem)
  std::string trial_option;  // --tessera-trial: "2m", "90s", "1:30:00"
  std::string job_name;      // SLURM_JOB_NAME: with the user, the kind "auto" is sized from
  bool batch_step = false;   // the step is a batch job's script (SLURM_BATCH_SCRIPT)
  // The job as slurmctld has it, asked (slurm_load_job) only of a job asking "auto" where
  // auto_trial= is set: the times it was requeued, and why Slurm would not requeue it (empty:
  // it would; "--no-requeue", or why slurmctld did not say).
  uint32_t restarts = 0;
  std::string not_requeueable = "not asked";
  // A batch job's: the node its script runs on, where its trial is decided (a step of it on
  // another of its nodes runs measured beside it, and the requeue ends it too); empty: not a batch
  // job, or not asked.
  std::string batch_host;
  uint32_t nodes = 1;  // the job's nodes (S_JOB_NNODES): of more than one, what is said names this
};

// The user's options as written (--tessera-share, --tessera-mem: a value or "auto";
// --tessera-trial: a length of at most a day), checked where srun and sbatch read them - before
// Slurm allocates anything - so that a mistyped one is refused at submission, not billed and
// failed at the step's launch. What the shards allow is checked at the step.
absl::Status CheckStepOptions(const std::string& share_option, const std::string& mem_option,
                              const std::string& trial_option = "");
inline constexpr double kMaxTrialSeconds = 86400;

// What a step gets: its GPUs (empty: none, the step is left alone), a compute share of each (0:
// none, launches not paced) and a memory limit on each (0: none).
struct StepLimits {
  std::vector<int> gpus;
  uint32_t share_permille = 0;
  uint64_t memory_bytes = 0;
  // "auto": sized by SetUpStep from the history of the user's jobs of this name (the job's first
  // step on the node; its later steps get what it was given). Until then the limits are what the
  // shards mean, the most "auto" may give.
  bool share_auto = false, memory_auto = false;
  std::string name;  // the job's name (its kind, with its user)
  // A trial (--tessera-trial): its steps are stopped this long after the job's start on the node,
  // on what its shards mean (never sized "auto": a trial measures), and its end recommends a size.
  double trial_s = 0;
  // StepRequest's: an "auto" batch job's trial (auto_trial=) requeues it.
  bool batch_step = false;
  uint32_t restarts = 0;
  std::string not_requeueable = "not asked";
  std::string batch_host;
  uint32_t nodes = 1;
  // Set by SetUpStep: this run is auto_trial='s, requeued at its end to be sized from it.
  bool auto_trial = false;
};

// Shards N of `shards_per_gpu` on a GPU mean N/shards_per_gpu of its time and of its memory; the
// options may ask less (never more: refused). A step with whole GPUs gets no limit unless its
// options ask one (its peak memory is still recorded). "auto" leaves what the shards mean.
absl::StatusOr<StepLimits> DecideLimits(const PluginConfig& config, const StepRequest& request);

// The environment a step's tasks get (set) and the variables taken out of it (unset: a step
// inherits its batch step's). `ld_preload` is the step's LD_PRELOAD now.
struct StepEnvironment {
  std::map<std::string, std::string> set;
  std::vector<std::string> unset;
  std::vector<std::string> notes;  // said in slurmd's log (a stale record set aside)
  // Said to the user on the step's first task's stderr: how "auto" sized the job, its trial.
  std::string say;
  // A trial: when its steps are stopped (seconds since the epoch; 0: not a trial).
  int64_t trial_deadline = 0;
  // At the trial's end the job is requeued (an auto_trial= run) instead of its steps stopped.
  bool requeue_at_trial_end = false;
};

// Sets up the job's node files for one of its steps (the first step makes the region and the
// record; later ones reuse them) and returns its tasks' environment. A step on a GPU in MPS mode
// (IsMps) is one GPU's (kFailedPrecondition for more: a process is the client of one MPS server),
// refused while another user's job is on that GPU (MPS serves one user's clients at a time) or
// while its daemon does not answer, and gets MPS's environment (devices::MpsClientEnv). Any failure
// is an error that names the file: the plugin then refuses the step (fail closed). A record of the
// same job id left by another user's job (its epilog never ran: slurmd crashed, the node rebooted;
// Slurm then gave the id again), or by any job started before `boot_time` (BootTime(); 0: not
// checked), is set aside in stale/ with its region, and said, never reused.
absl::StatusOr<StepEnvironment> SetUpStep(const PluginConfig& config, uint32_t job_id, uid_t uid,
                                          gid_t gid, const StepLimits& limits,
                                          const std::string& ld_preload, time_t now,
                                          int64_t boot_time = 0);

// When this machine booted (/proc/stat's btime), 0 when unknown. A record of a job started before
// it is an earlier job's (no job outlives a reboot): SetUpStep sets it aside even when its user is
// the same, and the exporter leaves it out.
int64_t BootTime();

// A job set up on this node (its record, jobs/<job>.json): who, its GPUs and limits, since when.
struct NodeJob {
  uint32_t job_id = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<int> gpus;
  uint32_t share_permille = 0;
  uint64_t memory_bytes = 0;
  int64_t started = 0;
  std::string name;  // SLURM_JOB_NAME
  bool share_auto = false, memory_auto = false;
  std::string sizing;  // how "auto" sized it
  double trial_s = 0;
  bool auto_trial = false;  // auto_trial='s run: requeued at its end
  uint32_t restarts = 0;    // the times the job was requeued before this run
  std::string trial_end;    // what its trial's end did (NoteTrialEnd)
};

// The records (<job>.json) of the folder `dir` by job id: jobs/ (set up, running) or acct/ (ended).
std::map<uint32_t, std::string> RecordFiles(const std::string& dir);
// The jobs set up on this node by job id; a record that does not read as one is left out.
std::map<uint32_t, NodeJob> NodeJobs(const std::string& state_dir);

// At the job's end on the node (its epilog): writes acct/<job>.json from the region's peaks and the
// arbiter's GPU time, removes the region and the record, and takes the user's arbiter access away
// when it was her last job with a compute share here. Returns the accounting file's path, empty
// when the job had nothing set up on this node.
// `uid`: the ending job's user when the epilog knows it; a record of another user's job under this
// id (a reused id) is set aside in stale/, not accounted as this job.
// The record also goes to the user's history (HistoryDir), and says what a trial recommends
// ("advice") or how a job sized "auto" outgrew its memory ("outgrew"). A requeued job's run keeps
// its earlier runs' records of this node (its auto_trial='s) in "earlier_runs", as Slurm keeps
// the job's id. `record`, when given, gets the accounting record as built - even when writing it,
// the history or the totals then failed (a full disk): what the epilog still says elsewhere.
absl::StatusOr<std::string> EndJob(const PluginConfig& config, uint32_t job_id, time_t now,
                                   std::optional<uid_t> uid = std::nullopt,
                                   nlohmann::json* record = nullptr);

// What the jobs of each user that ended on this node held and used, since the plugin first
// ran here: <state_dir>/totals.json (0644), added to by each EndJob. Counters: they never go
// down when an accounting record is overwritten (a reused id) or removed by an admin. GPU-seconds
// held weigh a compute share by its share ("fractional": a share or a memory limit; "whole" the
// rest); measured ones are those whose GPU time was charged (a compute share), busy their GPU
// time, at most what they held.
struct UserTotals {
  uint64_t jobs = 0;
  double whole_gpu_seconds = 0, fractional_gpu_seconds = 0;
  double measured_gpu_seconds = 0, busy_gpu_seconds = 0;
  uint64_t memory_refused_jobs = 0;  // jobs whose GPU memory limit refused an allocation
};
struct NodeTotals {
  std::map<uid_t, UserTotals> users;
  std::string unreadable;  // why totals.json was not read (then `users` is empty)
};
NodeTotals ReadTotals(const std::string& state_dir);
// What a run (an accounting record, or one of its earlier_runs) held of one of its GPUs and used
// of that: GPU-seconds held (its length, times its compute share where it had one) and, where its
// GPU time was measured (a compute share), the GPU-seconds it kept busy - at most what it held
// (time it used past its share was other jobs' idle time). The one rule of the totals, the
// AdminComment and `tessera slurm acct`'s IDLE.
struct GpuHeld {
  double held_s = 0;
  std::optional<double> busy_s;
};
GpuHeld HeldOf(const nlohmann::json& run, const nlohmann::json& gpu);
// What one accounting record (acct/<job>.json as EndJob writes it) adds to its user's totals.
void AddToTotals(const nlohmann::json& acct, UserTotals& t);

// What an auto_trial= run's end did (requeued, or why it could not be: it then runs on), kept in
// the job's record for its accounting ("trial_end"). NotFound when the job has no record here.
absl::Status NoteTrialEnd(const PluginConfig& config, uint32_t job_id, const std::string& said);

// What the user's ended jobs named `name` used (HistoryDir/<uid>/), the newest kHistorySized:
// the 95th percentile of their peak GPU memory per GPU (past the most a job sized "auto" asked
// where its limit refused it) and of their GPU utilization, with the runs each comes from.
struct KindUse {
  uint64_t peak_bytes = 0;
  int memory_runs = 0;
  double util_pct = 0;
  int util_runs = 0;
  // Why the history was not read (its folder not root's alone: records anyone could have
  // written), empty when it was.
  std::string unusable;
};
KindUse HistoryOf(const PluginConfig& config, uid_t uid, const std::string& name);
// The same of records' texts (the history's files): those named `name` only; a text that is not
// a record, or a field of another type, is skipped.
KindUse KindUseOf(const std::vector<std::string>& records, const std::string& name);

// Sizes the "auto" parts of `limits` from `use`: the percentile plus auto_margin=, the memory
// rounded up to 256 MiB, the share to 5%, never past what the shards mean (the limits as
// DecideLimits left them). Returns how, as said to the user.
std::string SizeAuto(const PluginConfig& config, const KindUse& use, StepLimits& limits);

// What a trial recommends from what it used: its shards (or whole GPUs) and --tessera-mem, with
// the margin; `acct` is its accounting record (EndJob's).
std::string TrialAdvice(const PluginConfig& config, const nlohmann::json& acct);

// The job's use on this node as one part of its AdminComment, which its epilog writes (plugstack
// word admin_comment=, on by default) so that `sacct -o JobID,AdminComment` shows every node's
// across the cluster, kept after the job as Slurm keeps the job: "tessera@<node>: gpu 0 (25%
// share): 96% busy, 8s of gpu time idle, peak 3.9 gib of 4 gib (98%)" - several GPUs summed
// (busy of what they held together, the highest peak), a whole GPU's busy not measured. In lower
// case, as sacctmgr stores it.
std::string AdminCommentPart(const nlohmann::json& acct, const std::string& node);
// `existing` (the job's AdminComment) with `part` in place of any earlier part of the same node;
// what others wrote there (another node's part, a site's own notes) is kept. Parts are joined by
// " | ".
std::string MergeAdminComment(const std::string& existing, const std::string& node,
                              const std::string& part);
// How an epilog writes its part into the job's AdminComment while the job's other nodes write
// theirs: `part` merged (MergeAdminComment) into the comment `current` reads (nullopt: could not be
// read, `err` set) and written by `write` (false: refused, `err` set), then read back; a part
// another node's write replaced is written again, five times at most, `wait` between (nullptr:
// sleeps 50-250 ms, a different time on each node). `alone`: the comment of a job of this one node
// as slurmctld gave it, which no other node writes at once - one write, without reading before or
// after (each a round trip to slurmdbd); done as for several nodes where that write is refused.
// Empty when done, else why not.
std::string WriteAdminComment(
    const std::string& node, const std::string& part,
    const std::function<std::optional<std::string>(std::string&)>& current,
    const std::function<bool(const std::string&, std::string&)>& write,
    const std::optional<std::string>& alone = std::nullopt,
    const std::function<void(std::chrono::milliseconds)>& wait = nullptr);

}  // namespace tessera::slurm
