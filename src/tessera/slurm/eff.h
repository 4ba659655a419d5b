#pragma once
// `tessera slurm eff JOB`: seff's question for GPUs, on any machine of the cluster, after the job,
// from what sacct keeps of it - Slurm's own figures (elapsed, CPUs, CPU time, memory asked, the
// largest task's RSS) and the parts each node's epilog wrote into its AdminComment
// (AdminCommentPart in step.h), read back.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tessera::slurm {

// What `tessera slurm eff` asks sacct for, in this order: sacct -j JOB -P -n --noconvert
// --delimiter=kEffDelimiter -o kEffFields. The delimiter is one no job name or comment holds
// (AdminComment's parts are joined by " | ", sacct's own -P delimiter).
inline constexpr char kEffFields[] =
    "JobID,JobName,User,State,ExitCode,NNodes,AllocCPUS,ElapsedRaw,TotalCPU,ReqMem,MaxRSS,"
    "AdminComment,AllocTRES";
inline constexpr char kEffDelimiter[] = "\x1f";

// One node's part of an AdminComment, read back.
struct NodePart {
  std::string node;
  std::vector<int> gpus;
  double share_percent = 0;  // a compute share of each GPU; 0: whole GPUs
  bool under_a_second = false;
  std::optional<double> busy_percent, idle_s;  // where its GPU time was measured (a share)
  std::optional<uint64_t> peak_bytes, limit_bytes;
  uint64_t refused = 0;  // allocations its GPU memory limit refused
};

// The tessera@ parts of an AdminComment, in its order; the rest (a site's own notes) is left out.
// An error names a part that starts as one of ours and does not read as one.
absl::StatusOr<std::vector<NodePart>> ParseAdminComment(std::string_view comment);

// What sacct says of one job.
struct SacctEff {
  std::string job_id, name, user, state, exit_code;
  int nodes = 0, cpus = 0;
  double elapsed_s = 0, total_cpu_s = 0;
  std::optional<uint64_t> req_mem_bytes;  // the job's memory, all its nodes
  std::optional<uint64_t> max_rss_bytes;  // its largest task's peak RSS, of any step
  std::string admin_comment;
  // What Slurm gave it (AllocTRES' gres/gpu and gres/shard: recorded where AccountingStorageTRES
  // names them, as docs/slurm.md has a site do).
  int gpus_allocated = 0, shards_allocated = 0;
  // slurmdbd has the job from its first step only: named "allocation", without the memory it
  // asked. Slurm 22.05's slurmdbd makes such a record when a job's first step reaches it before
  // slurmctld's record of the job; slurmctld sends that within 5 s (its pass over jobs without
  // one), and the record is whole from then on.
  bool from_first_step = false;
};

// sacct's lines for `job_id` (its own and its steps', as kEffFields asks them). Errors name the
// line and field that does not read, a job sacct did not list, or an array job's id that names
// several tasks.
absl::StatusOr<SacctEff> ParseSacctEff(std::string_view text, std::string_view job_id);

// sacct's lines for many jobs (a period's, as `tessera slurm eff --since` asks them), each with
// its steps, in sacct's order. A job whose line does not read is left out and named in `errors`;
// an error: lines that are not sacct's answer to kEffFields.
struct SacctJobs {
  std::vector<SacctEff> jobs;
  std::vector<std::string> errors;
};
absl::StatusOr<SacctJobs> ParseSacctEffAll(std::string_view text);

// What the job used of what it held, as `tessera slurm eff -o json` gives it (in this order):
// Slurm's figures (the GPUs and shards it gave the job among them) (cpu_pct as seff: CPU time over
// elapsed x CPUs; memory_pct: the largest task's RSS over the memory asked per node) and the GPUs'
// from the nodes' parts: GPU-seconds a compute share held on each node (its elapsed x share x GPUs)
// and, weighed by that, how much was busy; the GPU time left idle as the nodes said it; the highest
// peak of GPU memory against its limit; refusals.
nlohmann::ordered_json EffOf(const SacctEff& job, const std::vector<NodePart>& parts);

// Jobs' EffOf summed per user, the GPU time they held idle most first (those with none measured
// last): jobs, jobs with GPU parts, GPU time held, busy and idle and busy over held, the median
// and highest of the jobs' GPU memory peaks over their limits, jobs whose limit refused an
// allocation, CPU time over elapsed x CPUs.
nlohmann::ordered_json EffByUser(const std::vector<nlohmann::ordered_json>& jobs);

}  // namespace tessera::slurm
