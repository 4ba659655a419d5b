#include "tessera/server/submit_checks.h"

#include <sys/statvfs.h>

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

absl::Status CheckDiskRoom(const ServerConfig& config, bool disk_full) {
  if (struct statvfs fs;
      config.min_free_disk_bytes > 0 && statvfs(config.state_dir.c_str(), &fs) == 0 &&
      static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize < config.min_free_disk_bytes) {
    return HttpError(
        507, fmt::format("the server's disk ({}) has {} MiB free, under its reserve of {} MiB "
                         "(limits.min_free_disk): no new work until room is made",
                         config.state_dir, (static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize) >> 20,
                         config.min_free_disk_bytes >> 20));
  }
  if (disk_full) {
    return HttpError(507,
                     fmt::format("the server's disk ({}) filled up: its reserve went to record "
                                 "how jobs ended; no new work until room is made",
                                 config.state_dir));
  }
  return absl::OkStatus();
}

absl::Status CheckIdempotencyKey(const std::string& key) {
  if (key.size() > 128 ||
      std::any_of(key.begin(), key.end(), [](unsigned char c) { return c < 0x21 || c > 0x7e; })) {
    return HttpError(400,
                     "Idempotency-Key: expected at most 128 printable characters without spaces");
  }
  return absl::OkStatus();
}

absl::Status CheckQueueRoom(const ServerConfig& config, const std::string& user,
                            size_t waiting_jobs, size_t jobs, uint64_t waiting_bytes,
                            uint64_t bytes) {
  if (waiting_jobs + jobs > config.max_queued_jobs_per_user) {
    return HttpError(429, fmt::format("{} has {} jobs waiting and this would add {}: at most {} "
                                      "per user (limits.max_queued_jobs_per_user in the server's "
                                      "config)",
                                      user, waiting_jobs, jobs, config.max_queued_jobs_per_user));
  }
  if (waiting_bytes + bytes > config.max_queued_bytes_per_user) {
    return HttpError(
        429, fmt::format("{}'s waiting jobs hold {} (commands, environments) and this one {}: "
                         "at most {} per user (limits.max_queued_bytes_per_user in the server's "
                         "config)",
                         user, core::FormatBytes(waiting_bytes), core::FormatBytes(bytes),
                         core::FormatBytes(config.max_queued_bytes_per_user)));
  }
  return absl::OkStatus();
}

absl::Status CheckDependencies(const std::vector<Dependency>& after, const DependencyLookup& look) {
  for (const Dependency& d : after) {
    absl::Status st = look.exists(d.job, -1);
    if (st.ok() && d.task >= 0) st = look.exists(d.job, d.task);
    if (!st.ok() && st.code() != absl::StatusCode::kNotFound)
      return HttpError(500, std::string(st.message()));
    if (!st.ok()) {
      const std::string ref =
          d.task >= 0 ? fmt::format("{}_{}", d.job, d.task) : std::to_string(d.job);
      return HttpError(400, fmt::format("after {}: job {} does not exist (a dependency names a job "
                                        "submitted before, so dependencies never form a cycle)",
                                        DependencyText(d), ref));
    }
    if (std::string why = Unmeetable(d, look.outcome(d)); !why.empty())
      return HttpError(422, fmt::format("after {}: {}", DependencyText(d), why));
  }
  return absl::OkStatus();
}

}  // namespace tessera::server
