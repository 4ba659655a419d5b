#pragma once
// Time-based replay: jobs arrive at their submit times, run for their durations and leave. Each
// time something changes, the production scheduling cycle (sched::Cycle: queue order, backfill, the
// shape memo, preemption planning) takes a step at the simulated time, exactly as the standalone
// server does; the replay carries out its decisions. A preempted job stops `stop_latency_s` after
// it was asked, or at its natural end if that comes first (holding its resources until then), goes
// back to the queue and starts over - as the server re-queues a job that ends after it was asked to
// stop. Uses the production Scheduler. Deterministic for given inputs and seed.

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/sched/cluster_state.h"
#include "tessera/sched/fragmentation.h"
#include "tessera/sched/policy.h"
#include "tessera/sim/trace.h"

namespace tessera::sim {

struct ReplayConfig {
  std::string label;
  std::vector<sched::WeightedPolicy> policies;
  uint64_t seed = 42;
  bool preemption = true;
  // Seconds a preempted job takes to stop (SIGTERM to exit) and give its resources back.
  double stop_latency_s = 0;
  // Fair share between owners (sched::CycleOptions::fair_share_half_life_s); 0: off.
  double fair_share_half_life_s = 0;
  // Backfill reservations (sched::CycleOptions::reservations); 0: none.
  int reservations = 0;
  // Expected durations for reservations, from history as the server keeps it but built from the
  // jobs that finished earlier in the replay only (never a job's own duration): the 75th
  // percentile of the last 50 of the same owner and shape. Off: every duration unknown.
  bool predict = false;
  // Whether the result lists every start (ReplayResult::runs).
  bool record_runs = false;
  // Points of the time series over the span the trace asks for (last submit + duration); more when
  // queueing makes the replay run longer.
  int samples = 200;
};

struct ReplaySample {
  double time = 0;
  double allocated = 0;  // allocated GPU compute / capacity
  double fragmented_gpus = 0;
  int64_t queued = 0;
  int64_t running = 0;
};

// One start of a job: where and when (a preempted job starts again, with a run of its own).
struct ReplayRun {
  std::string id;
  double start = 0;
  sched::NodeId node = -1;
  std::vector<int> gpus;
};

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p95 = 0, p99 = 0, max = 0;
};
Distribution Summarize(std::vector<double> values);

struct ReplayResult {
  std::string label;
  uint64_t seed = 0;
  std::vector<ReplaySample> series;
  Distribution wait;  // seconds from submit to (last) start, jobs that started
  Distribution jct;   // seconds from submit to finish, jobs that finished
  int64_t jobs = 0;
  int64_t finished = 0;
  int64_t never_started = 0;  // never ran (still queued at the end, or larger than any node)
  int64_t queued_at_end = 0;  // waiting when the replay ended (preempted jobs included)
  int64_t preemptions = 0;    // evictions
  double mean_allocated = 0;  // time-weighted over the replay
  double peak_allocated = 0;
  double end_time = 0;
  double seconds = 0;           // wall time
  std::vector<ReplayRun> runs;  // in start order, when ReplayConfig::record_runs
};

ReplayResult RunReplay(const std::vector<core::NodeSpec>& nodes, const std::vector<SimJob>& jobs,
                       const std::vector<sched::TypicalRequest>& typical,
                       const ReplayConfig& config);

}  // namespace tessera::sim
