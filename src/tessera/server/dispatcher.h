#pragma once
// The dispatcher: the standalone server's composition root. It makes the server's rooms and wires
// them: the state they change under one lock and its read models (dispatch_state.h, views.h), the
// waiting room (admission.h), the running jobs (running_jobs.h) and their ends (job_ends.h), the
// scheduling loop that carries out the engine's decisions (scheduling_loop.h), what the API asks
// of jobs (job_operations.h), recovery at start (recovery.h), retention (retention.h), the launch
// plans (launch_plan.h), a submission's checks (submit_checks.h), the state folder
// (state_dir.h) and the sampler (sampler.h). The scheduling engine (sched::Engine, the
// simulator's and the extender's too) decides; jobs run through the JobHost; the Store records.
// The HTTP API (api.h) asks it through the operations and views below; the views answer from the
// read models without the lock, and no operation holds the lock while a process is forked or the
// store syncs. Besides wiring, it keeps the machine's facts, containers, health and recovery.

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/devices/mps.h"
#include "tessera/sched/engine.h"
#include "tessera/server/acct.h"
#include "tessera/server/container.h"
#include "tessera/server/dispatch_state.h"
#include "tessera/server/job_host.h"
#include "tessera/server/job_operations.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/launch_plan.h"
#include "tessera/server/rights.h"
#include "tessera/server/runner.h"
#include "tessera/server/sampler.h"
#include "tessera/server/scheduling_loop.h"
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

  // ---- what the API asks (api.h): operations on jobs (job_operations.h), checked against nothing
  // but the server's own rules (who may is the API's to check), errors with their HTTP status
  // (HttpError) ----
  using Submitted = JobOperations::Submitted;
  absl::StatusOr<Submitted> Submit(JobSpec spec, const Caller& caller,
                                   const std::string& idempotency_key) {
    return ops_->Submit(std::move(spec), caller, idempotency_key);
  }
  absl::Status Cancel(const std::vector<int64_t>& ids, const std::string& ref,
                      const JobRecord& first, const std::string& user, bool force = false) {
    return ops_->Cancel(ids, ref, first, user, force);
  }
  absl::Status Hold(const std::vector<int64_t>& ids, const std::string& ref, const JobRecord& first,
                    bool hold, const std::string& user) {
    return ops_->Hold(ids, ref, first, hold, user);
  }
  absl::Status SetPriority(int64_t id, const std::string& ref, const JobRecord& first, int priority,
                           const Caller& caller) {
    return ops_->SetPriority(id, ref, first, priority, caller);
  }
  // An admin's purge now (tessera admin purge), in pages as retention does (retention.h).
  using PurgeAges = server::PurgeAges;
  using Purged = server::Purged;
  absl::StatusOr<Purged> Purge(const PurgeAges& ages, double now) { return ops_->Purge(ages, now); }
  // A simulated machine's GPU made sick (an XID) or lost/found.
  absl::Status SimulateHealth(int gpu, std::optional<uint64_t> xid, std::optional<bool> lost);

  // What only the running server knows of a job (job_operations.h).
  using Live = JobOperations::Live;
  Live LiveOf(int64_t id) const { return ops_->LiveOf(id); }
  // Each GPU's state: health, what is allocated on it, its jobs and telemetry.
  struct GpuState {
    bool healthy = true;
    std::string reason;
    int32_t milli = 0;
    int64_t memory_mib = 0;
    std::vector<int64_t> jobs;
    devices::GpuTelemetry telemetry;
    core::GpuSharing sharing = core::GpuSharing::kTimeSlice;
    std::optional<devices::MpsDaemonState> mps;  // its MPS daemon, when in MPS mode
  };
  std::vector<GpuState> Gpus();
  // The MPS daemons' states (none when no GPU is in MPS mode).
  std::vector<devices::MpsDaemonState> MpsStates() const { return mps_->States(); }
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
  Dispatcher(ServerConfig config, ServerDeps deps);
  // The GPU arbiter file (made by the job host) that the fractional jobs of every user pace by.
  std::string ArbiterFile() const;
  // Finds podman and writes the CDI spec; otherwise says why jobs with an image are refused.
  void SetUpContainers();
  // Recovery (recovery.h) at Start, with what it asks of the dispatcher (dispatcher.cc).
  absl::Status Recover();
  struct RecoveryWorld;
  // Loads the history of the jobs that succeeded (the newest kHistoryJobs) into the engine's.
  void LoadHistory();
  static constexpr size_t kHistoryJobs = 5000;
  // A GPU's health changed (the health watch): the engine told, jobs on a failed GPU stopped.
  void OnHealth(int gpu, bool healthy, const std::string& reason);
  // A GPU's MPS daemon went down or came back (MpsDaemons' watch): the GPU takes no new work while
  // it is down, and its MPS clients are stopped (they lost their server).
  void OnMps(int gpu, bool up, const std::string& reason);
  // Sets a GPU's health from its device's and its MPS daemon's (under the lock); `mps_only`: only
  // its MPS clients are stopped when it turns unhealthy.
  void ApplyHealth(DispatchState& state, int gpu, bool mps_only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu);
  // Every GPU's telemetry (Sampler::Telemetry).
  std::vector<devices::GpuTelemetry> Telemetry() { return sampler_->Telemetry(); }
  // Tells the event streams of the store's changes and starts the sampler (a thread when
  // `thread`).
  void StartHistory(bool thread);

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
  std::unique_ptr<devices::MpsDaemons> mps_;  // GPUs in MPS mode (mps.gpus); null when none
  std::string fallback_reason_;
  core::NodeInventory inventory_;
  std::optional<ContainerRuntime> containers_;  // podman, when jobs can have an image
  int state_lock_ = -1;         // <state_dir>/server.lock, flock'ed for this server's life
  std::string containers_off_;  // why not, when they cannot
  std::string cdi_spec_path_;
  std::string hostname_;
  Rights rights_{config_};  // its groups cache is never held while taking the lock
  Feed feed_;
  // What a plan and a submission's checks read of the server (set at the end of Create).
  LaunchSetup launch_setup_;

  // The rooms, made in Create in this order (and gone in the reverse one): the state under the
  // lock, the loop (the engine's executor), the history sampler, the API's operations.
  std::unique_ptr<DispatchState> state_;
  std::unique_ptr<SchedulingLoop> loop_;
  std::unique_ptr<Sampler> sampler_;  // the history and the telemetry (sampler.h)
  std::unique_ptr<JobOperations> ops_;
  std::atomic<bool> stop_{false};
};

}  // namespace tessera::server
