#pragma once
// Workload inflation (the FGD paper's experiment): an empty cluster; pods drawn with replacement
// from a pod list, in a seeded order, arrive one by one until the GPU demand that arrived reaches a
// ratio of the cluster's GPU capacity; pods never leave, and a pod that does not fit is counted as
// failed and not retried. Uses the production Scheduler. Deterministic for given inputs and seed;
// one run is single-threaded, so runs can go in parallel.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/request.h"
#include "tessera/sched/fragmentation.h"
#include "tessera/sched/policy.h"

namespace tessera::sim {

struct InflationConfig {
  std::string label;  // how reports name the policy set ("fgd")
  std::vector<sched::WeightedPolicy> policies;
  uint64_t seed = 42;
  double ratio = 1.3;  // arrived GPU demand / GPU capacity at the end
  double step = 0.01;  // a curve point each time arrived demand passes k*step
};

// The cluster after arrived GPU demand passed a given share of capacity.
struct InflationPoint {
  double arrived = 0;           // arrived GPU demand / capacity
  double allocated = 0;         // allocated GPU compute / capacity
  double unallocated_gpus = 0;  // capacity - allocated, in GPUs
  double fragmented_gpus = 0;   // FGD's measure against the pod list's distribution, in GPUs
  // Fragmented share of the unallocated GPU capacity (the paper's fragmentation ratio); 0 when
  // full.
  double fragmentation_ratio() const {
    return unallocated_gpus > 1e-9 ? fragmented_gpus / unallocated_gpus : 0;
  }
  int64_t pods_arrived = 0;
  int64_t pods_failed = 0;
};

struct InflationResult {
  std::string label;
  uint64_t seed = 0;
  int64_t capacity_milli = 0;
  std::vector<InflationPoint> curve;  // one point per step, the last at the end
  InflationPoint final;
  std::map<std::string, int64_t> failed_by_kind;  // "cpu-only", "share", "1-gpu", "2-gpu", ...
  std::map<std::string, int64_t> arrived_by_kind;
  double seconds = 0;  // wall time of the run
};

// The kind a report files a request under.
std::string RequestKind(const core::Request& r);

// `typical` is the workload FGD (and the fragmentation measure) assume; usually
// TypicalRequests(pods).
InflationResult RunInflation(const std::vector<core::NodeSpec>& nodes,
                             const std::vector<core::Request>& pods,
                             const std::vector<sched::TypicalRequest>& typical,
                             const InflationConfig& config);

}  // namespace tessera::sim
