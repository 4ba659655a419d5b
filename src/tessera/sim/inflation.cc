#include "tessera/sim/inflation.h"

#include <algorithm>
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

ArrivalOrder::ArrivalOrder(size_t pods, uint64_t seed) : draw_(seed), order_(pods) {
  for (size_t i = 0; i < pods; ++i) order_[i] = i;
  std::shuffle(order_.begin(), order_.end(), draw_);
}

size_t ArrivalOrder::Next() {
  if (next_ < order_.size()) return order_[next_++];
  return std::uniform_int_distribution<size_t>(0, order_.size() - 1)(draw_);
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

  // The arrivals have their own stream, so every policy sees the same arrivals for a seed.
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
    ArrivalOrder arrivals(pods.size(), config.seed);
    while (arrived_milli < target) {
      core::Request r = pods[arrivals.Next()];
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
  const sched::ClusterState& st = s.state();
  for (sched::ClassId c : st.live_classes()) {
    const auto members = static_cast<int64_t>(st.class_members(c).size());
    for (const sched::ClassGpu& g : st.class_gpus(c)) {
      if (!g.healthy || g.milli_left == 0) continue;
      if (g.milli_left == core::kMilliPerGpu) {
        out.whole_free_gpus += members;
      } else {
        out.gpus_by_milli_left[g.milli_left] += members;
      }
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera::sim
