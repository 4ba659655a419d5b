#pragma once
// What the simulator replays: a cluster (nodes) and jobs with arrival times and durations, loaded
// from the Alibaba openb CSVs or from Tessera's own documented CSV format (docs/simulator.md).
// Malformed rows are errors naming the file, line and column. Pure functions apart from reading the
// files.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/request.h"

namespace tessera::sim {

// openb: the Alibaba CSVs; tessera: Tessera's CSV; slurm: `scontrol show node -o` and `sacct -P`
// (slurm_trace.h).
enum class TraceFormat { kAuto, kOpenb, kTessera, kSlurm };
absl::StatusOr<TraceFormat> ParseTraceFormat(std::string_view text);  // auto, openb, tessera, slurm

struct SimJob {
  core::Request request;  // id, resources, priority, preemptible
  double submit = 0;      // seconds on the trace's clock
  double duration = -1;   // seconds; < 0 when unknown (the job runs to the end of the replay)
  // What the trace predicted for its run time (a user's estimate, another predictor's output);
  // < 0 when it says nothing. Never read as the job's real duration.
  double predicted_duration = -1;
  // How busy it kept its GPU, in percent of the GPU's time (a measurement, as the server's history
  // records it); < 0 when the trace does not say. A share's drives interference and its
  // predictions; any job's, the replay's busy figure (ReplaySample::busy). The replay never reads a
  // job's own figure as a prediction: predictions come from the jobs that finished before
  // (ReplayConfig).
  double utilization = -1;
  // What run-time history knows it by besides its owner and shape (sched::RunKind), where the
  // trace says: a name and command (a server's own jobs), processes started, its own run-time
  // limit. A trace of another cluster has none of them.
  std::string name;
  std::vector<std::string> command;
  int tasks = 1;
  double max_runtime_s = 0;
};

// The longest duration (and predicted duration) a trace may give: ten years, in seconds.
inline constexpr double kMaxTraceDurationS = 10 * 365 * 86400.0;

// openb qos -> priority: LS 3, Guaranteed 2, Burstable 1, BE 0 (and empty 1); BE and Burstable are
// preemptible.
int OpenbPriority(std::string_view qos);

// Tessera CSV. Nodes: name,cpu_milli,memory_mib,gpus[,gpu_model][,gpu_memory_mib][,count] - count >
// 1 makes that many nodes named name-0, name-1, ... Jobs:
// name,cpu_milli,memory_mib[,gpus][,gpu_milli]
// [,gpu_memory_mib][,gpu_models][,priority][,preemptible][,submit_time][,duration]
// [,predicted_duration][,user][,utilization] (utilization: percent 0..100, shares only).
absl::StatusOr<std::vector<core::NodeSpec>> ParseTesseraNodes(std::string_view csv,
                                                              std::string_view filename);
absl::StatusOr<std::vector<SimJob>> ParseTesseraJobs(std::string_view csv,
                                                     std::string_view filename);

// What a Slurm trace does not say itself: each GPU's memory (0: unknown; shares are then placed by
// compute alone) and the shards per GPU (0: from the nodes' Gres, ShardsPerGpu).
struct TraceOptions {
  int64_t gpu_memory_mib = 0;
  int shards_per_gpu = 0;
};

// Reads a node or job file in the given format; kAuto tells the formats apart by their first line.
absl::StatusOr<std::vector<core::NodeSpec>> LoadNodes(const std::string& path, TraceFormat format,
                                                      const TraceOptions& options = {});
absl::StatusOr<std::vector<SimJob>> LoadJobs(const std::string& path, TraceFormat format,
                                             const TraceOptions& options = {});

}  // namespace tessera::sim
