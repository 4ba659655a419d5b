#include "tessera/server/submit_checks.h"

#include <algorithm>
#include <vector>

#include "fmt/format.h"
#include "tessera/core/gpu.h"
#include "tessera/server/rights.h"

namespace tessera::server {

absl::Status CheckSubmitLimits(JobSpec& spec, const SubmitSetup& setup) {
  const ServerConfig& config = *setup.config;
  if (spec.grace_period_s > config.max_grace_period_s) {
    return HttpError(400,
                     fmt::format("grace_period_s: {:g} s is over this server's maximum of {:g} s "
                                 "(preemption.max_grace_period_s in its config)",
                                 spec.grace_period_s, config.max_grace_period_s));
  }
  if (config.max_runtime_s > 0 && spec.max_runtime_s > config.max_runtime_s) {
    return HttpError(400, fmt::format("max_runtime_s: {} is over this server's maximum of {} "
                                      "(limits.max_runtime in its config)",
                                      core::FormatDuration(spec.max_runtime_s),
                                      core::FormatDuration(config.max_runtime_s)));
  }
  // Slurm's DefaultTime: stored with the job, so `show` says what it got.
  if (spec.max_runtime_s == 0) spec.max_runtime_s = config.default_runtime_s;
  if (!spec.image.empty() && !setup.containers) {
    return HttpError(
        400, fmt::format("image: this server cannot run containers: {}", setup.containers_off));
  }
  // A part of a model's name ("H100") stands for the machine's models that have it; what is stored
  // and scheduled is exact.
  std::vector<std::string> machine_models;
  for (const core::Gpu& g : setup.inventory->gpus) machine_models.push_back(g.model);
  if (absl::Status st = ResolveModels(&spec, machine_models); !st.ok())
    return HttpError(400, std::string(st.message()));
  return absl::OkStatus();
}

absl::Status CheckFits(const JobSpec& spec, const core::Request& r, const core::NodeSpec& node,
                       const sched::QuotaManager& quotas, size_t machine_gpus) {
  int matching = 0;
  int64_t largest_mib = 0;  // of the GPUs of the models asked (any, if none)
  int64_t machine_cpu_milli = 0, machine_memory_mib = 0;
  std::string over_quota;
  {
    std::vector<int64_t> memory;  // of the GPUs that could take it, smallest first
    for (const core::NodeGpu& g : node.gpus) {
      if (core::GpuAccepted(g, r)) largest_mib = std::max(largest_mib, g.memory_mib);
      if (core::GpuAccepted(g, r) && g.memory_mib >= r.gpu_memory_mib) {
        ++matching;
        memory.push_back(g.memory_mib);
      }
    }
    machine_cpu_milli = node.cpu_milli, machine_memory_mib = node.memory_mib;
    // The least it would count against its quotas (whole GPUs: the smallest that could take it).
    sched::GpuAmount least;
    least.gpus = r.gpus;
    least.gpu_milli = r.gpu_milli_total();
    if (r.fractional()) {
      least.gpu_memory_mib = r.gpu_memory_mib * r.shared_gpu_count();
    } else {
      std::sort(memory.begin(), memory.end());
      for (int i = 0; i < r.gpus && i < static_cast<int>(memory.size()); ++i)
        least.gpu_memory_mib += memory[static_cast<size_t>(i)];
    }
    if (!quotas.NeverAllows(r.owner, least, &over_quota)) {
      for (const std::string& group : r.quota_groups)
        if (quotas.NeverAllows(group, least, &over_quota)) break;
    }
  }
  if (!over_quota.empty()) {
    return HttpError(400, fmt::format("resources: {}: the job could never start", over_quota));
  }
  if (r.cpu_milli > machine_cpu_milli) {
    return HttpError(400, fmt::format("resources.cpus: {:g} CPUs asked, this machine has {:g}; the "
                                      "job could never start",
                                      r.cpu_milli / 1000.0, machine_cpu_milli / 1000.0));
  }
  if (r.memory_mib > machine_memory_mib) {
    return HttpError(400,
                     fmt::format("resources.memory: {} MiB asked, this machine has {} MiB; the "
                                 "job could never start",
                                 r.memory_mib, machine_memory_mib));
  }
  if (matching < r.gpu_count() && r.gpu_memory_mib > largest_mib && largest_mib > 0) {
    return HttpError(400, fmt::format("resources.gpu_memory: {} per GPU asked; the largest GPU "
                                      "here{} has {}: the job could never start",
                                      core::FormatBytes(uint64_t(r.gpu_memory_mib) << 20),
                                      spec.models.empty() ? "" : " of the models asked",
                                      core::FormatBytes(uint64_t(largest_mib) << 20)));
  }
  if (matching < r.gpu_count()) {
    return HttpError(
        400, fmt::format(
                 "resources: this machine has {} matching GPU(s) of {}; the job could never start",
                 matching, machine_gpus));
  }
  return absl::OkStatus();
}

}  // namespace tessera::server
