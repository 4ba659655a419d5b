#pragma once
// GPU fragmentation as defined by FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23): how
// much of a node's free GPU compute cannot be used by the workload's typical requests. For each
// typical request t with frequency f: if the node cannot host t (too few fitting GPUs, too little
// CPU, or no acceptable model), all its free GPU compute is fragment (weighted by f); if it can,
// the free compute on GPUs too full for t is. Values are in thousandths of a GPU. Not thread-safe
// (the memo is mutable).

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/core/request.h"
#include "tessera/sched/cluster_state.h"

namespace tessera::sched {

struct TypicalRequest {
  int64_t cpu_milli = 0;
  int32_t milli_per_gpu = 0;  // 1000 for whole GPUs
  int gpus = 0;               // how many GPUs of that share (1 for a fraction)
  std::vector<std::string> models;
  double frequency = 0;
};

// The distribution of GPU requests in `requests` (CPU-only requests are left out: they change every
// node's fragmentation alike). Requests of equal shape are merged; the `coverage` most frequent
// shapes (fraction of requests, 0..1] are kept and renormalised.
std::vector<TypicalRequest> TypicalRequests(const std::vector<core::Request>& requests,
                                            double coverage = 1.0);

class Fragmentation {
 public:
  Fragmentation() = default;
  explicit Fragmentation(std::vector<TypicalRequest> typical);

  const std::vector<TypicalRequest>& typical() const { return typical_; }
  bool empty() const { return typical_.empty(); }

  // Fragmentation of a node of `shape` with `cpu_left` and `gpus` (in any order). Memoised on the
  // parts that matter (the CPU rank among typical CPU sizes and the sorted free GPU shares).
  double Of(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
            const std::vector<ClassGpu>& gpus);

  // The whole cluster's fragmentation (sum over nodes, thousandths of a GPU).
  double OfCluster(const ClusterState& state);

  size_t memo_size() const { return memo_.size(); }

 private:
  struct KeyHash {
    size_t operator()(const std::vector<uint64_t>& k) const;
  };
  double Compute(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
                 const std::vector<ClassGpu>& gpus);
  // Bitmask of the shape's GPU kinds that typical request t accepts.
  uint64_t Accepted(const NodeShape& shape, ShapeId shape_id, size_t t);

  std::vector<TypicalRequest> typical_;
  std::vector<int64_t> cpu_levels_;  // distinct typical CPU sizes, ascending
  std::unordered_map<std::vector<uint64_t>, double, KeyHash> memo_;
  std::vector<std::vector<uint64_t>> accepted_;  // [shape][t]
};

}  // namespace tessera::sched
