#pragma once
// SchedulingLoop: the executor side's turns, and the engine's executor. Each turn (RunOnce, or
// the loop's thread):
// - looks at the running jobs (RunningJobs::Check): those whose process ended are taken out (their
//   GPUs freed in the engine, which says whether a stopped one goes back to the queue), their ends
//   recorded by JobEnds without the lock, the re-queued ones enqueued again; cgroups still busy
//   are retried, and about once a second the arbiter is repaired and kept ends recorded;
// - applies retention when due;
// - when something changed, takes one step of the scheduling cycle: admission's pass (jobs whose
//   dependencies can never be met are cancelled, stored without the lock), then the engine's step,
//   whose starts are planned under the lock (launch_plan.h), recorded and launched through the
//   JobHost without it, then committed (a job cancelled meanwhile is stopped at once), and whose
//   preemptions are asked of RunningJobs.
// The thread (Start) waits on DispatchState::wake between turns: a job's exit, a submission, a
// change; otherwise the poll interval. A pass that started and stopped nothing makes the next one
// wait as long as it took, so that a stream of submissions is admitted in batches.

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "tessera/core/clock.h"
#include "tessera/sched/engine.h"
#include "tessera/server/dispatch_state.h"
#include "tessera/server/job_host.h"
#include "tessera/server/launch_plan.h"

namespace tessera::server {

class SchedulingLoop {
 public:
  // `launch`: what a start's plan reads of the server (filled in before the first turn).
  SchedulingLoop(DispatchState& state, JobHost& host, const LaunchSetup& launch,
                 const core::Clock& clock);
  ~SchedulingLoop() { Stop(); }

  // What the engine is given to carry out its decisions (sched::Engine's executor).
  sched::Executor& executor() { return executor_; }
  // One turn at the clock's time; returns whether the scheduling cycle ran.
  bool RunOnce();
  // The loop's thread, and its end (joined).
  void Start();
  void Stop();
  // One history sample's readings of the running jobs' GPU use (RunningJobs::Measure), with how
  // many jobs hold each GPU from the engine's state; takes the lock.
  void Measure(const std::vector<devices::GpuTelemetry>& telemetry,
               const std::map<int64_t, JobHost::ShareUse>& shares) ABSL_LOCKS_EXCLUDED(state_.mu);

 private:
  // A start decided under the lock and carried out without it: its plan and what came of it.
  struct Launch : LaunchPlan {
    QueuedJob queued;
    absl::Status recorded;  // the store's transition to running
    absl::StatusOr<Launched> launched = Launched{};
    // A running elastic job started again on its new size (its end was its resize's): its store
    // record's placement changes, not its state.
    bool restart = false;
    bool cgroup_before = false;  // its run before the restart had a cgroup (its usage is read)
  };
  // What the engine decides in a pass: starts prepared (launched after the pass) and preemption
  // stops asked.
  struct PassExecutor : sched::Executor {
    explicit PassExecutor(SchedulingLoop& loop) : loop(loop) {}
    void Start(const std::string& id, const sched::Allocation& a, double now) override;
    void Stop(const std::vector<std::string>& victims, const std::string& for_id,
              const std::string& reason, double now) override;
    // Elastic jobs with a resize (JobSpec::resize_by) are resized while they run; one started in
    // this pass starts on all it holds.
    bool Resizes() const override { return true; }
    void Resize(const std::string& id, const sched::Allocation& holds, double now) override;
    SchedulingLoop& loop;
    std::vector<Launch> launches;
    size_t stops = 0;  // victims asked to stop in this pass
  };

  void Run();
  bool Turn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void CheckRunning(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);  // releases it for ends
  // One step of the scheduling cycle, carried out; releases the lock while starts are recorded
  // and launched.
  void SchedulePass(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Stores the end of the jobs admission found can never run, with the lock released meanwhile.
  void EndNeverMet(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // The launch of elastic `run`, ended for its resize, on what the engine says it holds now (a
  // shrink asked is done). Carried out as a start's.
  Launch PlanRestart(RunningJob run, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void ExecuteLaunch(Launch& l, double now);  // without the lock: store, files, fork and exec
  void CommitLaunch(Launch& l, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  DispatchState& state_;
  JobHost& host_;
  const LaunchSetup& launch_;
  const core::Clock& clock_;
  PassExecutor executor_{*this};
  // The last pass started or stopped something (Run).
  bool pass_decided_ ABSL_GUARDED_BY(state_.mu) = false;
  std::vector<std::pair<int64_t, std::string>> never_met_ ABSL_GUARDED_BY(state_.mu);  // id, why
  // Of ended jobs, not yet removable (retried each turn).
  std::set<int64_t> cgroups_left_ ABSL_GUARDED_BY(state_.mu);
  double arbiter_checked_ ABSL_GUARDED_BY(state_.mu) = 0;  // when the arbiter was last repaired
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tessera::server
