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
  double trial_s =
      0;  // a kind never measured: its first run is a trial this long (auto_size_trial)
};

struct ServerConfig;
// The server's policy (auto_size_margin) for a job that may run on `models` (empty: any) of
// `inventory` (null: the GPUs' memory unknown).
SizingPolicy SizingPolicyOf(const ServerConfig& config, const core::NodeInventory* inventory,
                            const std::vector<std::string>& models);

// Sets `spec`'s gpu_milli / gpu_memory_mib (or whole GPUs) for its "auto" parts from `history`
// and says how in spec.sizing. A spec without "auto" is left alone. A part never measured is not
// limited; with policy.trial_s (and neither a trial asked nor an array), the run is then a trial
// of that long (spec.sizing_trial_s), re-queued sized from it (ResizeAfterTrial).
void SizeAutomatically(JobSpec& spec, const sched::Prediction& history, const SizingPolicy& policy);

// What a trial measured: its GPU utilization (percent; nullopt: not measured), peak GPU memory
// per GPU (MiB; 0: not measured), and its kernel mix - the kernel launches its region counted (a
// share's; 0: not counted) over its run of `run_s` seconds.
struct TrialUse {
  std::optional<double> util_pct;
  // Its launches waited for the GPU (another job's slices): for how much of its run (percent),
  // and what it would have used had they not (percent of a GPU), which is what it is sized from.
  std::optional<double> held_back_pct, demand_pct;
  int64_t peak_mib = 0;
  // Allocations its GPU memory limit refused, and the most it asked (what it is sized from then).
  uint64_t refused = 0;
  int64_t wanted_mib = 0;
  uint64_t kernel_launches = 0;
  double run_s = 0;
};
// What a trial that ran its course says: `over` (its trial is over), what it measured - with its
// kernel mix: launches per second and, with its utilization, the mean GPU time of a kernel - and
// the size that recommends (as SizeAutomatically would size a job from it alone).
std::string TrialSummary(const std::string& over, const TrialUse& use, const SizingPolicy& policy);
// A job whose first run was the server's trial (spec.sizing_trial_s), sized again from `history`
// (which has the trial's use by now): the spec it is re-queued with. Never a trial again.
JobSpec ResizeAfterTrial(const JobSpec& spec, const sched::Prediction& history,
                         SizingPolicy policy);
// The kinds a trial's use is recorded under: its own, and the kind of the same job asking
// gpu_share and gpu_memory "auto" (which is what a trial sizes).
std::vector<sched::RunKind> TrialKinds(const JobSpec& spec, const std::string& user);

// What a job measured of its GPU memory (per GPU): its peak, the allocations its limit refused,
// and the most it would have held had they been given (what it held then plus what it asked).
struct GpuMemoryUse {
  int64_t peak_mib = 0;
  uint64_t refused = 0;
  int64_t wanted_mib = 0;
};
// Why a job with a GPU memory limit that failed ended, when the limit held it back: its
// allocations were refused at it (any limit: says how many, the peak, the most it asked and what
// to ask next time), or - sized automatically - its peak came within 10% of its size (a program
// that gave up without asking past it). Empty otherwise. `learn_mib` gets what the history of a
// job sized automatically should learn its kind needs (0: nothing).
std::string OutgrewItsSize(const JobSpec& spec, const GpuMemoryUse& use, const SizingPolicy& policy,
                           int64_t* learn_mib);
// The same at a run's end, `failed` or else succeeded: a failure as OutgrewItsSize says, and a
// success whose limit refused allocations too (it went on without them - a framework that frees
// its cache, a program that ignores the error - and must not pass silently). A `trial` says its
// refusals in its summary (TrialSummary) and gets nothing said here; its kinds learn what it
// asked (`learn_mib`).
std::string MemoryOutgrownAtEnd(const JobSpec& spec, bool failed, bool trial,
                                const GpuMemoryUse& use, const SizingPolicy& policy,
                                int64_t* learn_mib);

}  // namespace tessera::server
