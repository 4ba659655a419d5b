#pragma once
// A Slurm cluster's own history as a trace (issue 37): nodes as `scontrol show node -o` prints them
// and jobs as `sacct -P` exports them, so that an admin can replay her cluster's jobs through
// Tessera's policies (docs/slurm.md, docs/simulator.md). Malformed lines are errors naming the
// file, line and field.
//
//   scontrol show node -o > nodes.txt
//   sacct -a -X -P -S 2026-10-01 -E now
//         --format=JobID,User,Submit,Start,End,State,AllocTRES,Timelimit > jobs.txt

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/request.h"
#include "tessera/sim/trace.h"

namespace tessera::sim {

// The node label that carries a node's shards per GPU (its Gres shard count over its GPU count).
inline constexpr char kShardsPerGpuLabel[] = "slurm.shards_per_gpu";

// `scontrol show node -o`: one node per line, `Key=Value` words. Read: NodeName, CPUTot, RealMemory
// (MiB) and Gres (`gpu[:type]:N`, `shard:M`; a GPU's model is its gres type, else "gpu").
// `gpu_memory_mib` (0: unknown) is each GPU's memory, which scontrol does not say.
absl::StatusOr<std::vector<core::NodeSpec>> ParseScontrolNodes(std::string_view text,
                                                               std::string_view filename,
                                                               int64_t gpu_memory_mib = 0);

// `sacct -P` (fields separated by '|', a header line first). Required fields: JobID, Submit, Start,
// End, State and AllocTRES (or ReqTRES); optional: User (its owner), Timelimit (its predicted
// duration); other fields are ignored (Slurm's priorities are not Tessera's). Job steps (an ID with
// a '.') and jobs that never started are left out; a running job (End Unknown) runs to the end of
// the replay. TRES: cpu, mem (K/M/G/T), gres/gpu (whole GPUs), gres/shard (a share of one GPU:
// shards / `shards_per_gpu` of its time, and of `gpu_memory_mib` when known); a job on several
// nodes becomes one job per node with an equal part of it.
absl::StatusOr<std::vector<SimJob>> ParseSacctJobs(std::string_view text, std::string_view filename,
                                                   int shards_per_gpu, int64_t gpu_memory_mib = 0);

// The shards per GPU of the first node that has shards (kShardsPerGpuLabel); 0 when none has.
int ShardsPerGpu(const std::vector<core::NodeSpec>& nodes);

}  // namespace tessera::sim
