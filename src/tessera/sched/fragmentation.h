#pragma once
// GPU fragmentation as defined by FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23): how
// much of a node's free GPU compute cannot be used by the workload's typical requests. For each
// typical request t with frequency f: if the node cannot host t (too few fitting GPUs, too little
// CPU, or no acceptable model), all its free GPU compute is fragment (weighted by f); if it can,
// the free compute on GPUs too full for t is. And a measure of our own beside it, Stranded(): what
// a run of each typical request could not fill, CPU included. Values are in thousandths of a GPU.
// Not thread-safe (the memos are mutable).

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

  // What a run of each typical request alone could not fill: for request t, as many of t as the
  // node's CPU and its fitting GPUs hold (shares per GPU, whole GPUs per request), and the free
  // compute they would leave is t's part (weighted by t's frequency). Where Of() counts every
  // fitting GPU usable once one t fits, this counts a node whose CPU runs out after k of t as
  // stranding the GPUs beyond k's, and a GPU with 700 thousandths free as stranding 200 of them for
  // shares of 500. Memoised on the free shares and on the CPU left as far as it matters: how many
  // of each typical request it holds, up to as many as the shape's GPUs could.
  double Stranded(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
                  const std::vector<ClassGpu>& gpus);

  // The whole cluster's fragmentation (sum over nodes, thousandths of a GPU).
  double OfCluster(const ClusterState& state);

  size_t memo_size() const { return memo_.size() + stranded_memo_.size(); }

  // Each memo is emptied when it reaches this many entries (a long-running server sees CPU and GPU
  // states without end); the values are recomputed as needed.
  static constexpr size_t kMemoLimit = size_t{1} << 20;

 private:
  struct KeyHash {
    size_t operator()(const std::vector<uint64_t>& k) const;
  };
  double Compute(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
                 const std::vector<ClassGpu>& gpus);
  double ComputeStranded(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
                         const std::vector<ClassGpu>& gpus);
  // The CPU amounts at which one more of some typical request fits on `shape`, ascending, capped
  // at what its GPUs could hold; built once per shape.
  const std::vector<int64_t>& StrandedCpuLevels(const NodeShape& shape, ShapeId shape_id);
  // Bitmask of the shape's GPU kinds that typical request t accepts.
  uint64_t Accepted(const NodeShape& shape, ShapeId shape_id, size_t t);

  std::vector<TypicalRequest> typical_;
  std::vector<int64_t> cpu_levels_;  // distinct typical CPU sizes, ascending
  using Memo = std::unordered_map<std::vector<uint64_t>, double, KeyHash>;
  // The memo key of a node state: (shape, `cpu`) then the healthy GPUs' (kind, compute left),
  // sorted.
  static std::vector<uint64_t> KeyOf(ShapeId shape_id, uint64_t cpu,
                                     const std::vector<ClassGpu>& gpus);
  static void Remember(Memo& memo, std::vector<uint64_t> key, double value);
  Memo memo_;
  Memo stranded_memo_;
  std::vector<std::vector<uint64_t>> accepted_;        // [shape][t]
  std::vector<std::vector<int64_t>> stranded_levels_;  // [shape]
};

}  // namespace tessera::sched
