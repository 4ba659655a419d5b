#pragma once
// DispatchState: what the server's rooms change together, under its one lock (`mu`), and the
// steps that keep it whole. It holds:
// - the scheduling engine (scheduler, queue, history), the running jobs (running_jobs.h), the
//   waiting room (admission.h), the jobs being started and those whose end is being recorded,
//   each GPU's health and the scheduling stats, all under `mu`;
// - the read models (views.h): Publish makes them from the above before every release of `mu`
//   after a change (ChangeLock does it at the end of its scope), with the queue's changes in the
//   order they were made; readers never take `mu`;
// - the rooms the lock's holders share: retention (under `mu`), job ends and the exit watcher
//   (the loop's, safe without `mu`).
// Its steps: Enqueue, how a dependency stands (Outcome), what the engine is given
// for a job (SubmissionFor), and a change to queued jobs stored without `mu` (BeginChange, then
// EndChange: the jobs stay out of the cycle meanwhile). Admission asks the rest of the server
// through it (AdmissionWorld).
// Who takes `mu`: the Dispatcher (setup, recovery, health), JobOperations (what the API asks),
// SchedulingLoop (the loop's turns) and the sampler's measurements; none of them holds it while a
// process is forked or the store syncs.

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "tessera/core/mutex.h"
#include "tessera/sched/engine.h"
#include "tessera/server/admission.h"
#include "tessera/server/job_ends.h"
#include "tessera/server/retention.h"
#include "tessera/server/rights.h"
#include "tessera/server/runner.h"
#include "tessera/server/running_jobs.h"
#include "tessera/server/server.h"
#include "tessera/server/server_metrics.h"
#include "tessera/server/store.h"
#include "tessera/server/views.h"

namespace tessera::server {

class DispatchState {
 public:
  // `gpus`: the machine's count, all healthy at first.
  DispatchState(const ServerConfig& config, Rights& rights, Store& store, size_t gpus);
  DispatchState(const DispatchState&) = delete;
  DispatchState& operator=(const DispatchState&) = delete;

  const ServerConfig& config;
  Rights& rights;  // its groups cache is never held while taking `mu`
  Store& store;

  mutable core::Mutex mu;
  core::CondVar wake;     // the loop has something to do
  core::CondVar changed;  // a change to queued jobs ended (EndChange)

  // The scheduler, the queue and the history of run times (thread-safe alone: *history).
  std::unique_ptr<sched::Engine> engine ABSL_GUARDED_BY(mu);
  sched::DurationPredictor* history = nullptr;  // the engine's, used without `mu`
  std::unique_ptr<RunningJobs> runs ABSL_GUARDED_BY(mu);
  Admission admission ABSL_GUARDED_BY(mu);
  // Jobs being launched without `mu`: what they are (their state says running already), and the
  // user who cancelled one meanwhile.
  struct Starting {
    std::string cancelled_by;  // empty: not cancelled
    std::shared_ptr<const JobSpec> spec;
    std::string owner;
    uint32_t uid = 0;  // counted against limits.max_running_jobs_per_user
    // Its GPUs: listed on them from the pass that placed it (its start is recorded, and said on
    // the event stream, before it moves to runs).
    std::vector<int> gpus;
  };
  std::map<int64_t, Starting> starting ABSL_GUARDED_BY(mu);
  // Jobs whose process ended and whose end is being recorded without `mu`.
  std::set<int64_t> finishing ABSL_GUARDED_BY(mu);
  // Each GPU's health as the scheduler takes it: the device's (the health watch's) and, for a GPU
  // in MPS mode, its control daemon's; the reason of whichever is not well.
  std::vector<bool> gpu_healthy ABSL_GUARDED_BY(mu);
  std::vector<std::string> gpu_health_reason ABSL_GUARDED_BY(mu);
  std::vector<bool> gpu_device_healthy ABSL_GUARDED_BY(mu);
  std::vector<std::string> gpu_device_reason ABSL_GUARDED_BY(mu);
  std::vector<std::string> gpu_mps_down ABSL_GUARDED_BY(mu);  // why its daemon is down; empty: up
  bool dirty ABSL_GUARDED_BY(mu) = true;  // something changed that may let a queued job start
  SchedulingStats scheduling ABSL_GUARDED_BY(mu);  // submit to start, and passes (/metrics)
  std::unique_ptr<Retention> retention ABSL_GUARDED_BY(mu);
  std::unique_ptr<JobEnds> ends;       // the loop thread's, but for disk_full()
  std::unique_ptr<ExitWatcher> exits;  // wakes the loop when a job's process ends (may be null)
  Views views;

  // ---- the steps ----
  // Publishes the views with the queue's changes since the last time.
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Queues a job in admission (and, at the next pass, the cycle's queue).
  void Enqueue(QueuedJob q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A queued job that leaves for good (cancelled, never to be met).
  void Dequeue(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A queued job taken out for its start.
  QueuedJob TakeQueued(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // How a dependency stands, from the store and what is active here.
  DependencyState Outcome(const Dependency& d) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The jobs a waiting job's --after names (retention keeps them).
  std::set<int64_t> DependedOn() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // For a change to queued jobs stored without `mu`: waits (releasing `mu`) until no other change
  // to any of `ids` is under way, then marks those still queued as changing and takes them out of
  // the cycle's queue; returns them. EndChange lets them back (at the next pass).
  std::vector<int64_t> BeginChange(const std::vector<int64_t>& ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void EndChange(const std::vector<int64_t>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Admission's pass (Admission::Admit) with this state as its world.
  std::vector<std::pair<int64_t, std::string>> Admit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What the engine is given for a job: its request (RequestOf, plus the quota groups of its owner
  // and whether it may preempt others' jobs), what history knows it by, its own requeue wish.
  sched::Submission SubmissionFor(const JobSpec& spec, int64_t id, const std::string& owner,
                                  uint32_t uid, double submitted = 0) const;

  // `mu` held for a change: what changed is published before it is let go.
  class ABSL_SCOPED_LOCKABLE ChangeLock {
   public:
    explicit ChangeLock(DispatchState& s) ABSL_EXCLUSIVE_LOCK_FUNCTION(s.mu) : s_(s) {
      s_.mu.lock();
    }
    ~ChangeLock() ABSL_UNLOCK_FUNCTION() {
      s_.mu.AssertHeld();
      s_.Publish();
      s_.mu.unlock();
    }
    ChangeLock(const ChangeLock&) = delete;
    ChangeLock& operator=(const ChangeLock&) = delete;

   private:
    DispatchState& s_;
  };

 private:
  // What admission asks of the rest of the server, answered under `mu`.
  struct AdmissionWorld final : Admission::World {
    explicit AdmissionWorld(DispatchState& s) : s(s) {}
    DependencyState Outcome(const Dependency& dep) override;
    void CountActive(std::map<uint32_t, size_t>& by_user,
                     std::map<int64_t, int>& by_array) override;
    absl::Status EnterCycle(const QueuedJob& q) override;
    void LeaveCycle(int64_t id) override;
    const std::string* CycleWaiting(int64_t id) const override;
    DispatchState& s;
  };
  // For Publish: the facts of the queued jobs that admission or the cycle noted as changed, and
  // the users capped when they changed (else null).
  std::vector<std::pair<int64_t, QueuedView>> QueuedFacts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::shared_ptr<const CappedUsers> CappedChange() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  AdmissionWorld admission_world_{*this};
  std::vector<Views::QueueChange> queue_changes_ ABSL_GUARDED_BY(mu);
  std::shared_ptr<const CappedUsers> published_capped_ ABSL_GUARDED_BY(mu);
};

}  // namespace tessera::server
