#pragma once
// The dispatcher: the standalone server's composition root. It makes the server's rooms - the
// waiting room (admission.h), the running jobs (running_jobs.h), recovery (recovery.h), the
// launch plans (launch_plan.h), a submission's checks (submit_checks.h), the read models
// (views.h), the sampler (sampler.h) - and holds the one lock that orders every change to them. It
// is the server's executor of the scheduling engine (sched::Engine, the simulator's and the
// extender's too): jobs are admitted to the engine's queue, its decisions carried out (launches
// through the JobHost, stops, re-queues), ends recorded in the Store. The HTTP API (api.h) asks it
// through the public operations and views below; the views answer from the read models without
// its lock, and none of the operations holds it while a process is forked or the store syncs.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/core/mutex.h"
#include "tessera/sched/engine.h"
#include "tessera/server/acct.h"
#include "tessera/server/admission.h"
#include "tessera/server/cgroup.h"
#include "tessera/server/container.h"
#include "tessera/server/job_ends.h"
#include "tessera/server/job_host.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/launch_plan.h"
#include "tessera/server/retention.h"
#include "tessera/server/rights.h"
#include "tessera/server/runner.h"
#include "tessera/server/running_jobs.h"
#include "tessera/server/sampler.h"
#include "tessera/server/server.h"
#include "tessera/server/server_metrics.h"
#include "tessera/server/views.h"

namespace tessera::devices {
class HealthWatch;
}  // namespace tessera::devices
namespace tessera::server {

class Dispatcher {
 public:
  static absl::StatusOr<std::unique_ptr<Dispatcher>> Create(ServerConfig config,
                                                            ServerDeps deps = {});
  ~Dispatcher();

  // Recovers state, then starts the health watch (`health`), the history sampler and the
  // scheduling loop (threads when `loop`; otherwise RunOnce and TakeSample are called by hand).
  absl::Status Start(bool loop, bool health);
  void Stop();
  // One turn of the scheduling loop at the clock's time: ended jobs are reaped, overdue stops
  // escalated, and, when something changed, the scheduling cycle takes a step. Returns whether the
  // cycle ran. What the loop thread does; tests with a fake clock call it instead.
  bool RunOnce();
  // One sample of the machine's history now (GET /v1/history), stored and told to the event
  // streams; returns its JSON. The sampler thread's work; tests with a fake clock call it.
  std::string TakeSample();
  // The machine as the scheduler sees it (one node).
  const core::NodeSpec& node() const;
  const core::NodeInventory& inventory() const { return inventory_; }
  const std::string& fallback_reason() const { return fallback_reason_; }
  const ServerConfig& config() const { return config_; }
  Store& store() const { return *store_; }
  // Wall time in seconds since the epoch, from the clock.
  double Now() const { return core::Seconds(clock_->Now()); }
  // Who may do what (the API asks it before it acts); the dispatcher only reads what a job's
  // request carries of it (its owner's quota groups, whether it may preempt others').
  Rights& rights() { return rights_; }
  // <state_dir>/<dir>/<id><suffix>: a job's log, exit or region file; and the log of a job's task
  // other than task 0.
  std::string JobFile(const char* dir, int64_t id, const char* suffix = "") const;
  std::string TaskLog(int64_t id, int task, const char* suffix) const;
  // Where a process of a job writes its stdout (err false) or stderr when its spec names files of
  // the user's (JobSpec::stdout_file): the expanded pattern; empty: the logs above.
  std::string OutputFile(int64_t id, int64_t array_id, int array_index, const std::string& owner,
                         const JobSpec& spec, int task, bool err) const;

  // ---- what the API asks (api.h): operations checked against nothing but the server's own rules
  // (who may is the API's to check), errors with their HTTP status (HttpError) ----

  // A submission: the priority ceiling, containers, the user it would run as, GPUs that exist, the
  // array, dependencies; then stored (durably, before the answer) and queued.
  struct Submitted {
    JobRecord record;       // as stored (the first task's, for an array)
    bool repeated = false;  // an Idempotency-Key seen before: the job it made then
    size_t tasks = 0;       // an array's tasks (0: not an array)
  };
  absl::StatusOr<Submitted> Submit(JobSpec spec, const Caller& caller,
                                   const std::string& idempotency_key);
  // Jobs `ids` (what `ref` names; `first` its first job's record) cancelled, held or released,
  // re-prioritised (a single queued job) by `caller`. A forced cancel kills running ones at once
  // (SIGKILL) instead of waiting out their grace period.
  absl::Status Cancel(const std::vector<int64_t>& ids, const std::string& ref,
                      const JobRecord& first, const std::string& user, bool force = false);
  absl::Status Hold(const std::vector<int64_t>& ids, const std::string& ref, const JobRecord& first,
                    bool hold, const std::string& user);
  absl::Status SetPriority(int64_t id, const std::string& ref, const JobRecord& first, int priority,
                           const Caller& caller);
  // An admin's purge now (tessera admin purge): the ended jobs, logs and stored environments of
  // jobs that ended over the given ages ago (unset: not that kind), in pages as retention does
  // (retention.h), the lock taken for each page only. Jobs a waiting job's --after names stay.
  using PurgeAges = server::PurgeAges;
  using Purged = server::Purged;
  absl::StatusOr<Purged> Purge(const PurgeAges& ages, double now);
  // A simulated machine's GPU made sick (an XID) or lost/found.
  absl::Status SimulateHealth(int gpu, std::optional<uint64_t> xid, std::optional<bool> lost);

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
  // Read from the views but for a queued job's, which the cycle says (under the lock).
  Live LiveOf(int64_t id) const;
  // Each GPU's state: health, what is allocated on it, its jobs and telemetry.
  struct GpuState {
    bool healthy = true;
    std::string reason;
    int32_t milli = 0;
    int64_t memory_mib = 0;
    std::vector<int64_t> jobs;
    devices::GpuTelemetry telemetry;
  };
  std::vector<GpuState> Gpus();
  // Each user's and group's quota and what they use now.
  using QuotaState = QuotaView;
  std::vector<QuotaState> Quotas() const;
  // The server's facts (GET /v1/info).
  struct Facts {
    std::string hostname, arbiter_file, arbiter_access, containers_off, cdi_spec;
    std::optional<ContainerRuntime> containers;
    nlohmann::json confinement;
    size_t queued = 0, running = 0;
  };
  Facts Describe() const;
  // The /metrics snapshot, but for the accounting (the API's).
  ServerMetricsSnapshot MetricsSnapshot();
  // The event streams' side (sampler.h): what wakes them, each GPU's health, and the history's
  // sample count.
  using Feed = server::Feed;
  Feed& feed() { return feed_; }
  void GpuHealth(std::vector<bool>* healthy, std::vector<std::string>* reasons) const;
  // The last sample's time (-1: none yet) and how many were taken.
  std::pair<double, uint64_t> Samples() const;

 private:
  using Running = RunningJob;  // running_jobs.h
  using Queued = QueuedJob;
  // For a change to queued jobs written to the store without mu_: waits (releasing mu_)
  // until no other change to any of `ids` is under way, then marks those still queued as changing
  // and takes them out of the cycle's queue; returns them. EndChange (under mu_) lets them back.
  std::vector<int64_t> BeginChange(const std::vector<int64_t>& ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndChange(const std::vector<int64_t>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  core::CondVar changed_;  // a change ended (EndChange)
  // How a dependency stands, from the store and what is active here.
  DependencyState Outcome(const Dependency& d) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores the end of the jobs admission found can never run (never_met_), with mu_ released
  // meanwhile.
  void EndNeverMet(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::pair<int64_t, std::string>> never_met_ ABSL_GUARDED_BY(mu_);  // id, why
  Dispatcher(ServerConfig config, ServerDeps deps);
  // The GPU arbiter file (made by the job host) that the fractional jobs of every user pace by.
  std::string ArbiterFile() const;
  // Finds podman and writes the CDI spec; otherwise says why jobs with an image are refused.
  void SetUpContainers();
  // Recovery (recovery.h) at Start, with what it asks of the dispatcher (dispatcher.cc).
  absl::Status Recover();
  struct RecoveryWorld;
  // What the engine is given for a job: its request (RequestOf, plus the quota groups of its owner
  // and whether it may preempt others' jobs), what history knows it by, its own requeue wish.
  sched::Submission SubmissionFor(const JobSpec& spec, int64_t id, const std::string& owner,
                                  uint32_t uid, double submitted = 0);
  // The groups of `uid` (Rights::UserGroups) that have a quota.
  std::vector<std::string> QuotaGroups(uint32_t uid);
  void Loop();
  // Publishes what the views show (views.h) with the queue's changes since the last time: before
  // every release of mu_ after a change (ChangeLock does it at the end of its scope).
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Views::QueueChange> queue_changes_ ABSL_GUARDED_BY(mu_);
  // mu_ held for a change: what changed is published before it is let go.
  class ABSL_SCOPED_LOCKABLE ChangeLock {
   public:
    explicit ChangeLock(Dispatcher& d) ABSL_EXCLUSIVE_LOCK_FUNCTION(d.mu_) : d_(d) {
      d_.mu_.lock();
    }
    ~ChangeLock() ABSL_UNLOCK_FUNCTION() {
      d_.mu_.AssertHeld();
      d_.Publish();
      d_.mu_.unlock();
    }
    ChangeLock(const ChangeLock&) = delete;
    ChangeLock& operator=(const ChangeLock&) = delete;

   private:
    Dispatcher& d_;
  };
  bool Turn()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // RunOnce with mu_ held (released while launching)
  void CheckRunning(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // releases mu_ for ends
  // Queues a job in admission_ (and, at the next pass, the cycle's queue), under mu_.
  void Enqueue(Queued q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a queued job waits, from the cycle; empty when it is not queued.
  std::string WaitingReason(int64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One step of the scheduling cycle, carried out: starts and preemption stops. Releases mu_ while
  // the store records the starts and the processes are launched.
  void SchedulePass(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A start decided under mu_ and carried out without it.
  // Its plan (launch_plan.h: PlanLaunch, decided under mu_) and what came of it.
  struct Launch : LaunchPlan {
    Queued queued;
    absl::Status recorded;  // the store's transition to running
    absl::StatusOr<Launched> launched = Launched{};
  };
  // What a plan reads of the server (set at the end of Create).
  LaunchSetup launch_setup_;
  void ExecuteLaunch(Launch& l, double now);  // without mu_: store writes, files, fork and exec
  void CommitLaunch(Launch& l, double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends (job_ends.h): a job whose process ended is taken out of runs_ (its GPUs freed) under
  // mu_, its end recorded by ends_ without mu_, then its cgroup (if still busy) and re-queueing
  // handled under mu_. Made at the end of Create; the loop thread's, but for disk_full().
  std::unique_ptr<JobEnds> ends_;
  // What a fractional job's files say of its use (read without mu_, JobHost::ReadShare): the
  // arbiter's GPU time and its region's peak memory.
  using ShareReading = JobHost::ShareUse;
  // Adds what one history sample shows of each running job's GPU use: `telemetry` for jobs that
  // hold their GPUs alone, `shares` for fractional ones (RunningJobs::Measure). Under mu_.
  void MeasureRunning(const std::vector<devices::GpuTelemetry>& telemetry,
                      const std::map<int64_t, ShareReading>& shares)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retention (retention.h): ended jobs, their logs and stored environments past the config's
  // ages go, a page at a time under mu_, from the loop (when due) and Purge. Made in Create.
  std::unique_ptr<Retention> retention_ ABSL_GUARDED_BY(mu_);
  // The jobs a waiting job's --after names: retention keeps them.
  std::set<int64_t> DependedOn() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double arbiter_checked_ = 0;  // when CheckRunning last looked whether the arbiter is whole
  void OnHealth(int gpu, bool healthy, const std::string& reason);
  // Every GPU's telemetry (Sampler::Telemetry).
  std::vector<devices::GpuTelemetry> Telemetry() { return sampler_->Telemetry(); }

  // Tells the event streams of the store's changes and starts the sampler (a thread when
  // `thread`).
  void StartHistory(bool thread);

  Feed feed_;
  std::unique_ptr<Sampler> sampler_;  // the history and the telemetry (sampler.h)

  ServerConfig config_;
  const core::Clock* clock_;
  ProcessLauncher process_launcher_;
  Launcher* launcher_;  // process_launcher_ unless a test gave one: the local host's
  // Where jobs run (job_host.h): a test's, or own_host_ (this machine, through launcher_).
  std::unique_ptr<JobHost> own_host_;
  JobHost* host_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<devices::DeviceSource> source_;
  std::unique_ptr<devices::HealthWatch> health_;
  std::string fallback_reason_;
  core::NodeInventory inventory_;
  std::optional<ContainerRuntime> containers_;  // podman, when jobs can have an image
  // Loads the history of the jobs that succeeded (the newest kHistoryJobs) into the engine's.
  void LoadHistory();
  static constexpr size_t kHistoryJobs = 5000;
  int state_lock_ = -1;             // <state_dir>/server.lock, flock'ed for this server's life
  std::set<int64_t> cgroups_left_;  // of ended jobs, not yet removable (retried each turn)
  std::string containers_off_;      // why not, when they cannot
  std::string cdi_spec_path_;
  std::string hostname_;

  mutable core::Mutex mu_;  // everything below
  core::CondVar wake_;
  // What the engine decides in a pass, carried out: starts prepared (launched after the pass,
  // without mu_) and preemption stops asked.
  struct PassExecutor : sched::Executor {
    explicit PassExecutor(Dispatcher& d) : d(d) {}
    void Start(const std::string& id, const sched::Allocation& a, double now) override;
    void Stop(const std::vector<std::string>& victims, const std::string& for_id,
              const std::string& reason, double now) override;
    Dispatcher& d;
    std::vector<Launch> launches;
    size_t stops = 0;  // victims asked to stop in this pass
  };
  bool pass_decided_ ABSL_GUARDED_BY(mu_) =
      false;  // the last pass started or stopped something (Loop)
  PassExecutor executor_{*this};
  // The scheduler, the queue and the history of run times (thread-safe alone: history()).
  std::unique_ptr<sched::Engine> engine_ ABSL_GUARDED_BY(mu_);
  // The executor side's table of running jobs and what is done to them (running_jobs.h); made
  // with the host.
  std::unique_ptr<RunningJobs> runs_ ABSL_GUARDED_BY(mu_);
  // The waiting room: the queued jobs, what keeps each out of the cycle's queue, what each user
  // has waiting. What it asks of the rest of the server, admission_world_ answers under mu_.
  Admission admission_ ABSL_GUARDED_BY(mu_){
      {config_.max_running_jobs_per_user, 4 * config_.max_starts_per_pass}};
  struct AdmissionWorld final : Admission::World {
    explicit AdmissionWorld(Dispatcher& d) : d(d) {}
    DependencyState Outcome(const Dependency& dep) override;
    void CountActive(std::map<uint32_t, size_t>& by_user,
                     std::map<int64_t, int>& by_array) override;
    absl::Status EnterCycle(const QueuedJob& q) override;
    void LeaveCycle(int64_t id) override;
    const std::string* CycleWaiting(int64_t id) const override;
    Dispatcher& d;
  };
  AdmissionWorld admission_world_{*this};
  // Jobs being launched outside mu_: what they are (their state says running already), and the
  // user who cancelled one meanwhile.
  struct Starting {
    std::string cancelled_by;  // empty: not cancelled
    std::shared_ptr<const JobSpec> spec;
    std::string owner;
    uint32_t uid = 0;  // counted against limits.max_running_jobs_per_user
    // Its GPUs: listed on them from the pass that placed it (its start is recorded, and said on
    // the event stream, before it moves to runs_).
    std::vector<int> gpus;
  };
  std::map<int64_t, Starting> starting_ ABSL_GUARDED_BY(mu_);
  // Jobs whose process ended and whose end is being recorded outside mu_.
  std::set<int64_t> finishing_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> gpu_healthy_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> gpu_health_reason_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> gpu_xids_ ABSL_GUARDED_BY(mu_);
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;  // something changed that may let a queued job start
  SchedulingStats scheduling_
      ABSL_GUARDED_BY(mu_);  // latency (submit to start) and passes, for /metrics

  Rights rights_{config_};  // its groups cache is never held while taking mu_
  Views views_;
  // The engine's history of run times, which is safe to use without mu_ (sched::Engine::history).
  sched::DurationPredictor* history_ = nullptr;

  std::unique_ptr<ExitWatcher> exits_;  // wakes the loop when a job's process ends

  std::atomic<bool> stop_{false};
  std::thread loop_;
};

}  // namespace tessera::server
