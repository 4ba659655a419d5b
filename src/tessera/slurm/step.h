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

#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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
};
// Whether GPU `gpu` is in MPS mode.
bool IsMps(const PluginConfig& config, int gpu);
// Unknown keys, malformed values and a missing library= are errors naming the word.
absl::StatusOr<PluginConfig> ParsePluginArgs(const std::vector<std::string>& args);

// What Slurm says of a step (its environment) and what its user asked with the plugin's options.
struct StepRequest {
  std::string gpus;          // SLURM_STEP_GPUS (srun) or SLURM_JOB_GPUS (batch): "0,1"
  std::string shards;        // SLURM_SHARDS_ON_NODE: "3"; empty without shards
  std::string share_option;  // --tessera-share: "30%", "0.3"
  std::string mem_option;    // --tessera-mem: "10G", "512MiB" (a bare number is MiB, as --mem)
};

// The user's options as written (--tessera-share, --tessera-mem), checked where srun and sbatch
// read them - before Slurm allocates anything - so that a mistyped one is refused at submission,
// not billed and failed at the step's launch. What the shards allow is checked at the step.
absl::Status CheckStepOptions(const std::string& share_option, const std::string& mem_option);

// What a step gets: its GPUs (empty: none, the step is left alone), a compute share of each (0:
// none, launches not paced) and a memory limit on each (0: none).
struct StepLimits {
  std::vector<int> gpus;
  uint32_t share_permille = 0;
  uint64_t memory_bytes = 0;
};

// Shards N of `shards_per_gpu` on a GPU mean N/shards_per_gpu of its time and of its memory; the
// options may ask less (never more: refused). A step with whole GPUs gets no limit unless its
// options ask one (its peak memory is still recorded).
absl::StatusOr<StepLimits> DecideLimits(const PluginConfig& config, const StepRequest& request);

// The environment a step's tasks get (set) and the variables taken out of it (unset: a step
// inherits its batch step's). `ld_preload` is the step's LD_PRELOAD now.
struct StepEnvironment {
  std::map<std::string, std::string> set;
  std::vector<std::string> unset;
  std::vector<std::string> notes;  // said in slurmd's log (a stale record set aside)
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
absl::StatusOr<std::string> EndJob(const PluginConfig& config, uint32_t job_id, time_t now,
                                   std::optional<uid_t> uid = std::nullopt);

}  // namespace tessera::slurm
