#pragma once
// A job's efficiency (seff's question for GPUs): what it used of what it was given - GPU time,
// GPU memory, host CPU and memory - from its record as GET /v1/jobs/N gives it (placement, spec,
// usage, times). Pure: the API attaches it to a job, `tessera eff` shows it.

#include <cstdint>
#include <functional>
#include <optional>

#include "nlohmann/json.hpp"

namespace tessera::server {

// For a job that started: {"elapsed_s", "gpus" (held: whole GPUs, or a share's fraction), "share",
// "gpu_hours", and where measured "gpu_busy_pct" (of what it held; at most 100), "gpu_used_pct"
// (a share that used more of its GPU's time than its share: how much, lent idle time),
// "gpu_held_back_pct" (of its run its launches waited for the GPU) with "gpu_demand_pct" (what it
// would have used of a GPU's time had they not), "gpu_memory_peak_mib", "gpu_memory_given_mib" (per
// GPU), "gpu_memory_pct", "gpu_memory_refused" (allocations its limit refused) with
// "gpu_memory_wanted_mib" (the most it asked per GPU), "cpus", "cpu_seconds", "cpu_pct" (of the
// CPUs asked over its run), "memory_peak_bytes", "memory_limit_bytes", "memory_pct"}; `running`
// true while it runs (figures so far: measured ones come at its end). Null for a job that never
// started. `gpu_memory_mib` gives a GPU's memory by index (0 when not known): a share's "gpus" is
// weighed as accounting weighs it (HeldOfGpu), so its GPU-hours are the same.
nlohmann::json EfficiencyOf(const nlohmann::json& job, double now,
                            const std::function<int64_t(int gpu)>& gpu_memory_mib = nullptr);

// What a job holds of one GPU, 0..1, as accounting and EfficiencyOf weigh it: a whole GPU (`milli`
// 1000) all of it; a share its part of the GPU's compute or, where larger, its memory's part of the
// GPU's memory (`total_mib`, 0 when not known); a memory-only share (`milli` 0) on a GPU whose
// memory is not known, all of it (nothing tells its fraction).
double HeldOfGpu(int milli, int64_t memory_mib, int64_t total_mib);

// The two measured fractions (0..1) both EfficiencyOf and accounting weigh, from a job's usage and
// placement objects; nullopt where not measured. GPU busy: its GPUs' busy time of what it held (a
// share: of its part of the GPU). GPU memory: its peak of what it was given per GPU.
std::optional<double> GpuBusyFraction(const nlohmann::json& usage, const nlohmann::json& placement);
std::optional<double> GpuMemoryFraction(const nlohmann::json& usage,
                                        const nlohmann::json& placement);

}  // namespace tessera::server
