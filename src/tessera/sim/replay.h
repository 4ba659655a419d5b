#pragma once
// Time-based replay: jobs arrive at their submit times, run for their durations and leave. Each
// time something changes, the production scheduling engine (sched::Engine: queue order, backfill,
// the shape memo, preemption planning, requeue, predictions) takes a step at the simulated time,
// exactly as the standalone server and the extender do; the replay is its executor. A preempted job
// stops `stop_latency_s` after it was asked, or at its natural end if that comes first (holding its
// resources until then), goes back to the queue and starts over - as the server re-queues a job
// that ends after it was asked to stop. Uses the production Scheduler. Deterministic for given
// inputs and seed.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
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
  // Every job queued at one priority, so the queue is in arrival order (and nothing preempts by
  // priority): the stock-Kubernetes-like baseline of docs/simulator.md's experiment.
  bool arrival_order = false;
  // Seconds a preempted job takes to stop (SIGTERM to exit) and give its resources back.
  double stop_latency_s = 0;
  // Whether a preempted job goes back to the queue and starts over (the server's default); false:
  // it ends there, as a Kubernetes pod evicted by preemption does (its controller makes a new one).
  bool requeue_preempted = true;
  // Fair share between owners (sched::CycleOptions::fair_share_half_life_s); 0: off.
  double fair_share_half_life_s = 0;
  // Backfill reservations (sched::CycleOptions::reservations); 0: none.
  int reservations = 0;
  // Expected durations for reservations from history, by the server's own predictor
  // (sched::DurationPredictor) fed with the jobs that finished earlier in the replay only (never a
  // job's own duration): the 75th percentile of the last 50 runs under the nearest key (owner,
  // name and command where the trace has them, shape); a job without history falls back to its
  // trace's predicted duration (SimJob::predicted_duration), then its own limit. Off: the trace's
  // predicted duration where it has one, else unknown.
  bool predict = false;
  // With `predict`: a job with a name or command is predicted from that name's or command's runs
  // alone, as the server does (sched::EngineOptions::predict_from_kind_only).
  bool predict_from_kind_only = false;
  // Interference-aware sharing: a share whose utilization is predicted (with `predict`: the 75th
  // percentile of the measured utilization, SimJob::utilization, of the last 50 jobs of the same
  // owner and shape that finished earlier) shares a GPU only under this ceiling
  // (core::Request::util_ceiling_pct), as the server does; 0: no ceiling.
  int utilization_ceiling_pct = 0;
  bool utilization_ceiling_strict = false;  // wait rather than go over it (Request)
  // Model interference: the shares on one GPU progress at the rate the GPU can serve them. When
  // their utilizations (SimJob::utilization; a share without one counts its compute share) add up
  // to more than 100%, each runs 100/total as fast, and the end of each is moved whenever the
  // GPU's set of shares changes. Off: every job runs its duration.
  bool interference = false;
  // With `interference`: the shares on one GPU are served by priority, as the arbiter of
  // libtessera-cuda.so serves them (docs/sharing.md): the highest priority first (up to what the
  // GPU can serve), each lower one from what the higher ones leave, those of one priority alike.
  // A share beside busy shares of lower priority runs `priority_share_efficiency` as fast as it
  // would alone (the arbiter's cost of switching; measured on an H100: 0.93-0.94). Off: all alike.
  bool interference_priorities = false;
  double priority_share_efficiency = 1;
  // NVIDIA MPS instead of time slices (docs/sharing.md): every GPU in MPS mode and every share its
  // client, placed by MPS's rule (one owner's shares on a GPU at a time), as the server places
  // them. With `interference`: the shares of one GPU run at once on its SMs, so they slow down
  // only when their utilizations add up to more than `mps_capacity` GPUs' worth (time slices: 1),
  // all alike (MPS has no priorities to speak of: interference_priorities is not applied). The
  // figure is measured by tessera-gpu-check (MpsCapacityOf).
  bool mps = false;
  double mps_capacity = 1;
  // Elastic jobs (docs/simulator.md): this share of the trace's jobs of 2 or more whole GPUs (not
  // of a gang), drawn by the seed, asks for half its GPUs (rounded up) to the number the trace
  // gave it, and the production engine grows and shrinks it (sched::Engine). A job that arrives
  // resizable (core::Request::resizable, as the server builds one with `resize`) is elastic as it
  // asks. Its traced duration is its work at the traced size (one that arrives resizable: at its
  // minimum); on n GPUs it runs at Amdahl's speedup(n) / speedup(traced) with
  // `elastic_serial_fraction`. A resize is the server's contract (docs/server.md): the job
  // checkpoints and exits `stop_latency_s` after it is asked (a growth's new GPUs held meanwhile,
  // a shrink's given back then), and starts again on its new size after `resize_overhead_s` of no
  // progress.
  double elastic = 0;
  double elastic_serial_fraction = 0.05;
  double resize_overhead_s = 60;
  // Whether the result lists every start (ReplayResult::runs).
  bool record_runs = false;
  // Points of each time series: ReplayResult::series over the busy period, ::whole over the replay.
  int samples = 200;
};

struct ReplaySample {
  double time = 0;
  double allocated = 0;  // allocated GPU compute / capacity
  double fragmented_gpus = 0;
  int64_t queued = 0;
  int64_t running = 0;
  // How busy the GPUs are (the modelled work on them over their capacity): per GPU the summed
  // utilization of its holders up to 100% (SimJob::utilization; a share without one counts its
  // compute share, a whole GPU without one 100%), over every GPU.
  double busy = 0;
};

// One start of a job: where and when (a preempted job starts again, with a run of its own).
struct ReplayRun {
  std::string id;
  double start = 0;
  sched::NodeId node = -1;
  std::vector<int> gpus;
  bool resized = false;  // started again on a new size (an elastic job's resize)
};

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p95 = 0, p99 = 0, max = 0;
};
Distribution Summarize(std::vector<double> values);

// The size class of a request for ReplayResult::wait_by_gpus: "cpu", "share" (a fraction of one
// GPU), "1", "2", "3-4", "5+".
std::string GpuSizeClass(const core::Request& r);
// Every size class, smallest first (the order of reports).
inline constexpr const char* kGpuSizeClasses[] = {"cpu", "share", "1", "2", "3-4", "5+"};

struct ReplayResult {
  std::string label;
  uint64_t seed = 0;
  // The busy period: from the first arrival until the last job started (or the last arrival, when
  // later) - the stretch where jobs arrive and wait, which a trace with long-running jobs can make
  // a sliver of the whole replay. Its series has `samples` points evenly over the busy period and a
  // tenth of its length after it (the drain's start); each point is the highest value of each
  // field since the point before (so short spikes show), from the state after every event.
  double busy_start = 0, busy_end = 0;
  std::vector<ReplaySample> events;  // the state after every event, in time order
  std::vector<ReplaySample> series;
  std::vector<ReplaySample> whole;  // `samples` points evenly over the whole replay
  double busy_mean_allocated = 0;   // time-weighted over the busy period
  double busy_mean_queued = 0;      // time-weighted over the busy period
  int64_t peak_queued = 0;
  Distribution wait;          // seconds from submit to (last) start, jobs that started
  std::vector<double> waits;  // every started job's wait, ascending (for the report's plots)
  // Waits by how many GPUs a job asks for (GpuSizeClass): the largest jobs' longest wait shows
  // starvation.
  std::map<std::string, Distribution> wait_by_gpus;
  Distribution jct;  // seconds from submit to finish, jobs that finished
  // JCT by how many GPUs the trace's job asks for (GpuSizeClass; an elastic job by its traced
  // size, so the same jobs compare between elastic and fixed-size runs).
  std::map<std::string, Distribution> jct_by_gpus;
  // By the trace's priority (also with `arrival_order`), jobs that finished: JCT, and slowdown =
  // JCT over duration (jobs of at least a second): waiting and interference together.
  std::map<int, Distribution> jct_by_priority, slowdown_by_priority;
  // Whether any job had a measured utilization (SimJob::utilization): the busy figures then mean
  // more than allocation.
  bool utilization_known = false;
  int64_t jobs = 0;
  int64_t finished = 0;
  int64_t never_started = 0;  // never ran (still queued at the end, or larger than any node)
  int64_t queued_at_end = 0;  // waiting when the replay ended (preempted jobs included)
  int64_t preemptions = 0;    // evictions
  int64_t elastic_jobs = 0;   // jobs made elastic (ReplayConfig::elastic)
  // Resizes that took effect (the job started again larger or smaller; asked again before it
  // checkpointed, once), and growths at its start.
  int64_t grows = 0, shrinks = 0;
  double mean_allocated = 0;  // time-weighted over the whole replay
  double peak_allocated = 0;  // the highest allocation (reached within the busy period)
  // Shares that finished: their run time over their duration (above 1: slowed by interference,
  // ReplayConfig::interference), mean and highest.
  double share_slowdown_mean = 0, share_slowdown_max = 0;
  double end_time = 0;
  double seconds = 0;           // wall time
  std::vector<ReplayRun> runs;  // in start order, when ReplayConfig::record_runs
};

// MPS's capacity (ReplayConfig::mps_capacity) from a tessera-gpu-check --json report: its check
// "MPS: 4 tenants of small kernels", total throughput under MPS over that in time slices.
// kInvalidArgument naming what the report lacks.
absl::StatusOr<double> MpsCapacityOf(const nlohmann::json& report);

ReplayResult RunReplay(const std::vector<core::NodeSpec>& nodes, const std::vector<SimJob>& jobs,
                       const std::vector<sched::TypicalRequest>& typical,
                       const ReplayConfig& config);

// Sets the busy period of a replay to [from, to]: its means and series over it.
void SetBusyPeriod(ReplayResult& r, double from, double to, int samples);
// Gives runs compared side by side one busy period, from the earliest first arrival until the
// latest last start among them, so that their means cover the same time.
void AlignBusyPeriods(std::vector<ReplayResult>& runs);
// The time-weighted mean allocation of a replay over [from, to] (from its events).
double MeanAllocatedOver(const ReplayResult& r, double from, double to);
// The time-weighted mean of how busy the GPUs were (ReplaySample::busy) over [from, to].
double MeanBusyOver(const ReplayResult& r, double from, double to);

}  // namespace tessera::sim
