#pragma once
// Sizing a job that asks gpu_share and/or gpu_memory "auto" (issue 58): from what jobs of its kind
// used (sched::Prediction: the 95th percentile of their measured GPU utilization and of their peak
// GPU memory per GPU) plus a margin the admin sets, rounded up; where nothing was measured yet, the
// part is not limited this time (a whole GPU when both are), and the run is measured for the next.
// Pure: the server sizes a job at submission (JobOperations::Submit), before it is stored.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/gpu.h"
#include "tessera/sched/predictor.h"
#include "tessera/server/job_spec.h"

namespace tessera::server {

struct SizingPolicy {
  int margin_pct = 20;            // added to the measured use (auto_size_margin)
  int share_step_pct = 5;         // a share is rounded up to this
  int64_t memory_step_mib = 256;  // memory is rounded up to this
  int64_t gpu_memory_mib = 0;     // of the GPUs it may run on (the least): a size at or past it
                                  // is the whole GPU's
};

struct ServerConfig;
// The server's policy (auto_size_margin) for a job that may run on `models` (empty: any) of
// `inventory` (null: the GPUs' memory unknown).
SizingPolicy SizingPolicyOf(const ServerConfig& config, const core::NodeInventory* inventory,
                            const std::vector<std::string>& models);

// Sets `spec`'s gpu_milli / gpu_memory_mib (or whole GPUs) for its "auto" parts from `history`
// and says how in spec.sizing. A spec without "auto" is left alone.
void SizeAutomatically(JobSpec& spec, const sched::Prediction& history, const SizingPolicy& policy);

// What a trial that ran its course says: `over` (its trial is over), what it measured - its GPU
// utilization (percent; nullopt: not measured) and peak GPU memory per GPU (MiB; 0: not measured)
// - and the size that recommends (as SizeAutomatically would size a job from it alone).
std::string TrialSummary(const std::string& over, std::optional<double> util_pct, int64_t peak_mib,
                         const SizingPolicy& policy);
// The kinds a trial's use is recorded under: its own, and the kind of the same job asking
// gpu_share and gpu_memory "auto" (which is what a trial sizes).
std::vector<sched::RunKind> TrialKinds(const JobSpec& spec, const std::string& user);

// Why a job sized automatically that failed ended, when its measured peak GPU memory (MiB, per
// GPU) came within 10% of its automatic memory size: it may have outgrown it. Names the peak and
// what to ask next time; empty otherwise.
std::string OutgrewItsSize(const JobSpec& spec, int64_t peak_mib, const SizingPolicy& policy);

}  // namespace tessera::server
