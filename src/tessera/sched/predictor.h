#pragma once
// How long a job will run, predicted from the runs of jobs like it that succeeded before: the one
// predictor of the standalone server (its history is rebuilt from the job store at start and grows
// as jobs end) and of `sim replay` (fed with the jobs that finished earlier in the replay). Keys,
// nearest first: the same user, name, command and shape (a named job); the same user, name (the
// command when unnamed) and shape; the user's jobs of that shape; any user's jobs of that shape.
// (The shape keys only where DurationPredictor's kind_only is off.)
// The prediction is the 75th percentile of the last 50 runs under the nearest key with at least 3
// runs (else the nearest with any), capped by the job's own max runtime, which is the prediction
// when there is no history. The same keys give its GPU utilization (percent of its GPUs' time, as
// measured while the runs ran; runs without a measurement do not count): the 75th percentile of
// those runs, for interference-aware sharing; and, for shares, how much slower their runs that
// shared the GPU were than those that had it alone (the nearest key with at least 2 of each: the
// medians' ratio). Thread-safe.

#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/core/mutex.h"
#include "tessera/core/request.h"

namespace tessera::sched {

// What history knows a run by.
struct RunKind {
  std::string user;
  std::string name;                  // empty: the run is known by its command
  std::vector<std::string> command;  // program and arguments; empty where unknown (a trace)
  std::string shape;                 // HistoryShape
  double max_runtime_s = 0;          // its own limit: caps the prediction; 0 none
};

// A run's shape as history keys it: "2 GPU", "30% 10240MiB", "50% 10240MiB on 2 GPUs x2", with
// its models ("1 GPU [H100]"); `tasks`: processes started (each with the whole request).
// `memory_auto`: a share sized automatically, known by what it asked ("30% auto"), whatever each
// run was given.
std::string HistoryShape(const core::Request& r, int tasks = 1, bool memory_auto = false);

struct Prediction {
  double seconds = 0;   // 0: unknown
  int samples = 0;      // runs it comes from (0: the max runtime, or nothing)
  std::string basis;    // "p75 of alice's last 12 runs of 'train'", "its max runtime", ""
  double util_pct = 0;  // GPU utilization, percent (0: unknown)
  int util_samples = 0;
  std::string util_basis;  // "p75 of alice's runs of 'train' (4 runs)", ""
  // A share's runs that shared their GPU against those that had it alone: how much slower sharing
  // made it (the medians' ratio, 1..4; 1 when not known), and from what.
  double sharing_slowdown = 1;
  std::string sharing_basis;  // "alice's runs of 'infer': 3 shared, 2 alone"
  // For sizing a job from what jobs like it used (kSizingPercentile of the same keys): its GPU
  // utilization (0: unknown), and the most GPU memory per GPU its runs held, MiB (0: unknown).
  double util_high_pct = 0;
  std::string util_high_basis;
  double gpu_memory_peak_mib = 0;
  int memory_samples = 0;
  std::string memory_basis;  // "p95 of alice's runs of 'train' (6 runs)"
};

class DurationPredictor {
 public:
  // kind_only: a run known by a name or command is predicted from runs of that name or command
  // alone (the user's own), never from other jobs of its shape (the server); false also takes the
  // user's, then everyone's, jobs of its shape (the simulator's traces).
  explicit DurationPredictor(bool kind_only = false) : kind_only_(kind_only) {}
  // Records a successful run, with its measured GPU utilization (percent, 0..100) when there is
  // one and, for a share, whether another job shared its GPU while it ran.
  void Add(const RunKind& kind, double runtime_s, std::optional<double> util_pct = std::nullopt,
           std::optional<bool> shared_gpu = std::nullopt);
  // Records the most GPU memory per GPU a run held (MiB): a run that succeeded, or one that failed
  // at its automatic memory size (the next is sized past it).
  void AddGpuMemoryPeak(const RunKind& kind, double mib);
  // Records a run's measured GPU utilization (percent) without its run time: a trial, cut short.
  void AddUtilization(const RunKind& kind, double util_pct);
  Prediction Predict(const RunKind& kind) const;
  size_t keys() const;

  static constexpr size_t kKept = 50;      // runs kept per key
  static constexpr size_t kConfident = 3;  // runs a key needs to be preferred to a wider one
  static constexpr int kSizingPercentile = 95;

 private:
  const bool kind_only_;
  mutable core::Mutex mu_;
  std::unordered_map<std::string, std::deque<double>> runs_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::deque<double>> utils_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::deque<double>> peaks_ ABSL_GUARDED_BY(mu_);  // GPU MiB
  // A share's run times by whether another job shared its GPU while it ran.
  std::unordered_map<std::string, std::deque<double>> shared_runs_ ABSL_GUARDED_BY(mu_), alone_runs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::sched
