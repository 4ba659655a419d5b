#pragma once
// A job's efficiency (seff's question for GPUs): what it used of what it was given - GPU time,
// GPU memory, host CPU and memory - from its record as GET /v1/jobs/N gives it (placement, spec,
// usage, times). Pure: the API attaches it to a job, `tessera eff` shows it.

#include <optional>

#include "nlohmann/json.hpp"

namespace tessera::server {

// For a job that started: {"elapsed_s", "gpus" (held: whole GPUs, or a share's fraction), "share",
// "gpu_hours", and where measured "gpu_busy_pct" (of what it held), "gpu_held_back_pct" (of its
// run its launches waited for the GPU) with "gpu_demand_pct" (what it would have used of a GPU's
// time had they not), "gpu_memory_peak_mib",
// "gpu_memory_given_mib" (per GPU), "gpu_memory_pct", "gpu_memory_refused" (allocations its limit
// refused) with "gpu_memory_wanted_mib" (the most it asked per GPU), "cpus", "cpu_seconds",
// "cpu_pct" (of the CPUs asked over its run), "memory_peak_bytes", "memory_limit_bytes",
// "memory_pct"}; `running` true while it runs (figures so far: measured ones come at its end). Null
// for a job that never started.
nlohmann::json EfficiencyOf(const nlohmann::json& job, double now);

// The two measured fractions (0..1) both EfficiencyOf and accounting weigh, from a job's usage and
// placement objects; nullopt where not measured. GPU busy: its GPUs' busy time of what it held (a
// share: of its part of the GPU). GPU memory: its peak of what it was given per GPU.
std::optional<double> GpuBusyFraction(const nlohmann::json& usage, const nlohmann::json& placement);
std::optional<double> GpuMemoryFraction(const nlohmann::json& usage,
                                        const nlohmann::json& placement);

}  // namespace tessera::server
