#include "tessera/sim/inflation.h"

#include <chrono>
#include <cmath>
#include <random>

#include "fmt/format.h"
#include "tessera/sim/cluster.h"

namespace tessera::sim {

std::string RequestKind(const core::Request& r) {
  if (r.fractional()) return "share";
  if (r.gpus == 0) return "cpu-only";
  return fmt::format("{}-gpu", r.gpus);
}

InflationResult RunInflation(const std::vector<core::NodeSpec>& nodes,
                             const std::vector<core::Request>& pods,
                             const std::vector<sched::TypicalRequest>& typical,
                             const InflationConfig& config) {
  auto t0 = std::chrono::steady_clock::now();
  InflationResult out;
  out.label = config.label;
  out.seed = config.seed;
  auto scheduler =
      NewSimScheduler(nodes, typical, config.policies, config.seed, &out.capacity_milli);
  sched::Scheduler& s = *scheduler;

  // The draw of pods has its own stream, so every policy sees the same arrivals for a seed.
  std::mt19937_64 draw(config.seed);
  const double capacity = static_cast<double>(out.capacity_milli);
  const double target = config.ratio * capacity;
  int64_t arrived_milli = 0, allocated_milli = 0, pods_arrived = 0, pods_failed = 0;
  int next_step = 1;
  auto point = [&] {
    InflationPoint p;
    p.arrived = capacity > 0 ? arrived_milli / capacity : 0;
    p.allocated = capacity > 0 ? allocated_milli / capacity : 0;
    p.unallocated_gpus = (capacity - static_cast<double>(allocated_milli)) / core::kMilliPerGpu;
    p.fragmented_gpus = s.FragmentedMilli() / core::kMilliPerGpu;
    p.pods_arrived = pods_arrived;
    p.pods_failed = pods_failed;
    return p;
  };
  if (!pods.empty() && out.capacity_milli > 0) {
    std::uniform_int_distribution<size_t> pick(0, pods.size() - 1);
    while (arrived_milli < target) {
      core::Request r = pods[pick(draw)];
      r.id = fmt::format("i{}", pods_arrived);
      ++pods_arrived;
      arrived_milli += r.gpu_milli_total();
      std::string kind = RequestKind(r);
      ++out.arrived_by_kind[kind];
      auto a = s.Place(r);
      if (a.ok()) {
        allocated_milli += r.gpu_milli_total();
      } else {
        ++pods_failed;
        ++out.failed_by_kind[kind];
      }
      while (next_step * config.step * capacity <= static_cast<double>(arrived_milli) &&
             next_step * config.step <= config.ratio + 1e-9) {
        out.curve.push_back(point());
        out.curve.back().arrived = next_step * config.step;
        ++next_step;
      }
    }
  }
  out.final = point();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera::sim
