#pragma once
// Accounting (`tessera acct`, GET /v1/acct, the tessera_acct_* metrics): what jobs used over a
// period - GPU-hours, whole and fractional (a fraction of a GPU weighted by the larger of its
// compute share and its part of the GPU's memory), how busy and how full they kept what they held,
// jobs by outcome, waits - per user, group and GPU model. Pure: built from the store's rows and run
// intervals, with the time given.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json_fwd.hpp"
#include "tessera/server/store.h"

namespace tessera::server {

// A job as accounting reads it, with the intervals it ran (from its events: each start to the
// event that ended that run; an open one runs still).
struct AcctJob {
  int64_t id = 0;
  std::string owner;
  std::string name;
  uint32_t owner_uid = 0;
  JobState state = JobState::kQueued;
  double submitted_at = 0;
  std::optional<double> ended_at;  // terminal jobs
  std::string placement_json;      // its last placement: the GPUs weighed
  std::string usage_json;          // what it used, measured at its end (efficiency)
  struct Run {
    double start = 0;
    std::optional<double> end;  // none: running
  };
  std::vector<Run> runs;
};

struct AcctLine {
  std::string key;                                   // the user, group or model
  int64_t jobs = 0;                                  // submitted, running or ended in the period
  int64_t succeeded = 0, failed = 0, cancelled = 0;  // ended in the period (failed: lost too)
  int64_t running = 0;                               // running at the period's end
  double gpu_seconds = 0;                            // whole + fractional, in GPUs
  double whole_gpu_seconds = 0, fractional_gpu_seconds = 0;
  int64_t started = 0;                            // runs started in the period, for the waits
  double wait_seconds = 0, max_wait_seconds = 0;  // submission (or re-queue) to start, summed
  // Efficiency (what jobs used of what they held), over the GPU-seconds of jobs whose use was
  // measured: of those, the busy part (each job's GPU busy share of what it held, as `tessera eff`
  // says), and the part of the GPU memory given that their peaks took.
  double measured_gpu_seconds = 0, busy_gpu_seconds = 0;
  double memory_measured_gpu_seconds = 0, memory_used_gpu_seconds = 0;
};

// A measured job's GPU time inside the period and the part of it its GPUs (or its share) sat idle:
// what an admin tired of half-idle GPUs asks first.
struct AcctIdleJob {
  int64_t id = 0;
  std::string owner, name;
  double gpu_seconds = 0;       // what it held inside the period, weighed as the lines weigh it
  double busy = 0;              // the busy part of what it held, 0..1 (as `tessera eff` says)
  double idle_gpu_seconds = 0;  // gpu_seconds x (1 - busy)
};

struct AcctReport {
  double since = 0, until = 0;
  AcctLine total;
  std::vector<AcctLine> by_user, by_group, by_model;  // sorted by GPU-seconds, most first
  // The kMostIdle measured jobs that left the most GPU time idle in the period, most first (ties:
  // the older job first); none left no time idle.
  std::vector<AcctIdleJob> most_idle;
};

inline constexpr size_t kMostIdle = 10;

struct AcctOptions {
  double since = 0, until = 0;
  // The group a job counts under (its owner's primary group).
  std::function<std::string(uint32_t uid)> group_of;
  // A GPU's memory in MiB by index (0: unknown), to weigh fractions of it by memory.
  std::function<int64_t(int gpu)> gpu_memory_mib;
};

AcctReport Account(const std::vector<AcctJob>& jobs, const AcctOptions& options);
nlohmann::json AcctJson(const AcctReport& report);

// The jobs accounting needs for [since, until]: every job not ended before `since` nor submitted
// after `until`, with its runs.
absl::StatusOr<std::vector<AcctJob>> AcctJobs(Store& store, double since, double until);

}  // namespace tessera::server
