#pragma once
// Workload inflation (the FGD paper's experiment): an empty cluster; every pod of a pod list once,
// in a seeded order, then pods drawn with replacement from it, arrive one by one until the GPU
// demand that arrived reaches a ratio of the cluster's GPU capacity (as the paper's simulator
// tunes a list up to the ratio: its pods shuffled, then appended copies of random ones; a ratio
// below the list's own demand takes a prefix of the shuffled list); pods never leave, and a pod
// that does not fit is counted as failed and not retried. Uses the production Scheduler.
// Deterministic for given inputs and seed; one run is single-threaded, so runs can go in parallel.

#include <cstdint>
#include <map>
#include <random>
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
  // Where the unallocated compute is at the end: GPUs left whole, and partly used GPUs by the
  // thousandths they have left (healthy GPUs only).
  int64_t whole_free_gpus = 0;
  std::map<int32_t, int64_t> gpus_by_milli_left;
  double seconds = 0;  // wall time of the run
};

// The order pods of a list arrive in: every index of 0..pods-1 once, in an order `seed` shuffles,
// then indices drawn with replacement. RunInflation's own order, for callers that replay it.
// `pods` must be above 0.
class ArrivalOrder {
 public:
  ArrivalOrder(size_t pods, uint64_t seed);
  size_t Next();

 private:
  std::mt19937_64 draw_;
  std::vector<size_t> order_;
  size_t next_ = 0;
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
