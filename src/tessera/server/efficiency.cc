#include "tessera/server/efficiency.h"

#include <algorithm>
#include <cmath>

#include "tessera/core/gpu.h"

namespace tessera::server {

using nlohmann::json;

namespace {

double Round1(double v) { return std::round(v * 10) / 10; }

// A memory amount as the spec writes it ("512MiB", "40GiB"); -1 when absent or unreadable.
int64_t SpecBytes(const json& resources, const char* key) {
  if (!resources.is_object() || !resources.contains(key) || !resources[key].is_string()) return -1;
  const std::optional<uint64_t> b = core::ParseBytes(resources[key].get<std::string>());
  return b ? static_cast<int64_t>(*b) : -1;
}

// `j[key]` without copying it (a listing weighs a thousand jobs: their specs are most of their
// bytes); null when `j` is not an object or has no such key.
const json& Member(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

double PerGpu(const json& placement) {
  return placement.is_object() ? placement.value("milli_per_gpu", 1000) / 1000.0 : 1.0;
}

}  // namespace

std::optional<double> GpuBusyFraction(const json& usage, const json& placement) {
  const double per_gpu = PerGpu(placement);
  if (!usage.is_object() || !Member(usage, "gpu_utilization_pct").is_number() || per_gpu <= 0)
    return std::nullopt;
  return std::clamp(usage["gpu_utilization_pct"].get<double>() / 100 / per_gpu, 0.0, 1.0);
}

std::optional<double> GpuMemoryFraction(const json& usage, const json& placement) {
  const int64_t given =
      placement.is_object() ? placement.value("memory_mib_per_gpu", int64_t{0}) : 0;
  if (!usage.is_object() || !Member(usage, "gpu_peak_memory_mib").is_number() || given <= 0)
    return std::nullopt;
  return usage["gpu_peak_memory_mib"].get<double>() / static_cast<double>(given);
}

double HeldOfGpu(int milli, int64_t memory_mib, int64_t total_mib) {
  double w = milli >= 1000 ? 1.0 : std::max(milli, 0) / 1000.0;
  if (total_mib > 0)
    w = std::max(w, static_cast<double>(memory_mib) / static_cast<double>(total_mib));
  if (milli <= 0 && total_mib <= 0) w = 1;
  return std::min(w, 1.0);
}

json EfficiencyOf(const json& job, double now,
                  const std::function<int64_t(int gpu)>& gpu_memory_mib) {
  const json& started = Member(job, "started_at");
  if (!started.is_number()) return nullptr;
  const json& ended = Member(job, "ended_at");
  const bool running = !ended.is_number();
  const double elapsed =
      std::max(0.0, (running ? now : ended.get<double>()) - started.get<double>());
  json e;
  e["running"] = running;
  e["elapsed_s"] = Round1(elapsed);
  const json& placement = Member(job, "placement");
  const json& resources = Member(Member(job, "spec"), "resources");
  const json& usage = Member(job, "usage");
  // What it held: its GPUs, each whole or the part of it its share was given (of its compute or,
  // where larger, of its memory; a memory-only share's memory).
  double gpus = 0;
  bool share = false;
  int64_t memory_given_mib = -1;
  if (placement.is_object() && Member(placement, "gpus").is_array()) {
    const int milli = placement.value("milli_per_gpu", 1000);
    const int64_t mib = placement.value("memory_mib_per_gpu", int64_t{0});
    if (mib > 0) memory_given_mib = mib;
    for (const json& g : placement["gpus"]) {
      const int index = g.is_object() ? g.value("index", -1) : -1;
      gpus += HeldOfGpu(milli, mib, gpu_memory_mib ? gpu_memory_mib(index) : 0);
    }
    share = !placement["gpus"].empty() && milli < 1000;
  }
  e["gpus"] = std::round(gpus * 1000) / 1000;
  e["share"] = share;  // a part of each GPU
  if (memory_given_mib > 0) e["gpu_memory_given_mib"] = memory_given_mib;
  e["gpu_hours"] = std::round(gpus * elapsed / 3600 * 1000) / 1000;
  if (usage.is_object()) {
    // Measured as a share of its GPUs' time (a share: of one GPU's): of what it held, its part.
    if (const auto busy = GpuBusyFraction(usage, placement)) {
      e["gpu_busy_pct"] = Round1(100 * *busy);
      // A share that used more of its GPU's time than its share: the idle time work-conserving
      // sharing lent it (busy is at most all of what it held; this says by how much it went past).
      const double used = usage["gpu_utilization_pct"].get<double>();
      const int milli = placement.is_object() ? placement.value("milli_per_gpu", 1000) : 1000;
      if (milli > 0 && milli < 1000 && used > milli / 10.0) e["gpu_used_pct"] = Round1(used);
    }
    // A share whose launches waited for the GPU: for how much of its run, and what it would have
    // used of one GPU had they not (its time-slices held it to less than it wanted).
    if (Member(usage, "gpu_held_back_pct").is_number() &&
        Member(usage, "gpu_demand_pct").is_number()) {
      e["gpu_held_back_pct"] = usage["gpu_held_back_pct"].get<double>();
      e["gpu_demand_pct"] = usage["gpu_demand_pct"].get<double>();
    }
    if (Member(usage, "gpu_peak_memory_mib").is_number()) {
      e["gpu_memory_peak_mib"] = usage["gpu_peak_memory_mib"].get<int64_t>();
      if (const auto used = GpuMemoryFraction(usage, placement))
        e["gpu_memory_pct"] = Round1(100 * *used);
    }
    if (Member(usage, "gpu_memory_refused").is_number_unsigned()) {
      e["gpu_memory_refused"] = usage["gpu_memory_refused"].get<uint64_t>();
      e["gpu_memory_wanted_mib"] = usage.value("gpu_memory_wanted_mib", int64_t{0});
    }
    if (Member(usage, "cpu_seconds").is_number()) {
      const double cpu_s = usage["cpu_seconds"].get<double>();
      e["cpu_seconds"] = Round1(cpu_s);
      if (resources.is_object() && Member(resources, "cpus").is_number() && elapsed > 0) {
        const double cpus = resources["cpus"].get<double>();
        e["cpus"] = cpus;
        if (cpus > 0) e["cpu_pct"] = Round1(100.0 * cpu_s / (cpus * elapsed));
      }
    }
    if (Member(usage, "peak_memory_bytes").is_number()) {
      const int64_t peak = usage["peak_memory_bytes"].get<int64_t>();
      e["memory_peak_bytes"] = peak;
      if (const int64_t limit = SpecBytes(resources, "memory"); limit > 0) {
        e["memory_limit_bytes"] = limit;
        e["memory_pct"] = Round1(100.0 * static_cast<double>(peak) / static_cast<double>(limit));
      }
    }
  }
  return e;
}

}  // namespace tessera::server
