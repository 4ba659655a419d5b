#pragma once
// JobOperations: what the API asks of jobs, checked against nothing but the server's own rules
// (who may is the API's to ask of Rights first), each error with its HTTP status (HttpError):
// - Submit: the disk's room, the server's limits, whether the job could ever start here, the
//   array, the user's caps on what waits, dependencies (submit_checks.h); then stored durably
//   before the answer (an Idempotency-Key seen before answers with the job it made) and queued;
// - Cancel, Hold (and release), SetPriority: a change to queued jobs is stored without the lock
//   while they are kept out of the cycle (DispatchState::BeginChange), so that the scheduling
//   loop never waits for the store's fsync; running jobs are asked to stop (forced: SIGKILL);
// - LiveOf: what only the running server knows of a job - from the views but for a queued job's
//   wait reason and expected start, which the cycle says under the lock;
// - Purge: retention's pages now (tessera admin purge), the lock taken for each page only.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/clock.h"
#include "tessera/sched/predictor.h"
#include "tessera/server/dispatch_state.h"
#include "tessera/server/launch_plan.h"

namespace tessera::server {

class JobOperations {
 public:
  // `setup`: the server's config, machine and containers (as a start's plan reads them).
  JobOperations(DispatchState& state, const LaunchSetup& setup, const core::Clock& clock)
      : state_(state), setup_(setup), clock_(clock) {}

  struct Submitted {
    JobRecord record;       // as stored (the first task's, for an array)
    bool repeated = false;  // an Idempotency-Key seen before: the job it made then
    size_t tasks = 0;       // an array's tasks (0: not an array)
  };
  absl::StatusOr<Submitted> Submit(JobSpec spec, const Caller& caller,
                                   const std::string& idempotency_key);
  // Jobs `ids` (what `ref` names; `first` its first job's record) cancelled, held or released,
  // re-prioritised (a single queued job) by a user. A forced cancel kills running ones at once
  // (SIGKILL) instead of waiting out their grace period.
  absl::Status Cancel(const std::vector<int64_t>& ids, const std::string& ref,
                      const JobRecord& first, const std::string& user, bool force = false);
  absl::Status Hold(const std::vector<int64_t>& ids, const std::string& ref, const JobRecord& first,
                    bool hold, const std::string& user);
  absl::Status SetPriority(int64_t id, const std::string& ref, const JobRecord& first, int priority,
                           const Caller& caller);

  // What only the running server knows of a job: why it waits, what is expected of it, its
  // process.
  struct Live {
    bool queued = false;
    std::string waiting;
    bool known = false;  // queued or running: the fields below are set
    std::optional<double> expected_start;
    bool reserved = false;
    sched::Prediction prediction;
    std::optional<double> expected_end;
    std::optional<int64_t> pid;
    std::string stopping;
  };
  Live LiveOf(int64_t id) const;

  // The ended jobs, logs and stored environments of jobs that ended over the given ages ago.
  absl::StatusOr<Purged> Purge(const PurgeAges& ages, double now);

 private:
  double Now() const { return core::Seconds(clock_.Now()); }

  DispatchState& state_;
  const LaunchSetup& setup_;
  const core::Clock& clock_;
};

}  // namespace tessera::server
