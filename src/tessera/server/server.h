#pragma once
// `tessera server`: the standalone daemon of one shared GPU machine. Jobs come in over the HTTP API
// (a unix socket; optionally TCP with bearer tokens), are stored durably (SQLite) before the answer
// goes out, placed by the scheduling core on the machine's GPUs (real through NVML, or a simulated
// machine said as such), started by the runner and watched until they end. After a crash the next
// start keeps every accepted job and re-adopts the jobs still running. See docs/server.md.

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
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/core/clock.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/device_source.h"
#include "tessera/sched/quota.h"
#include "tessera/server/acct.h"
#include "tessera/server/cgroup.h"
#include "tessera/server/container.h"
#include "tessera/server/http.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/launcher.h"
#include "tessera/server/predictor.h"
#include "tessera/server/runner.h"
#include "tessera/server/server_metrics.h"
#include "tessera/server/store.h"

namespace tessera::devices {
class HealthWatch;
}  // namespace tessera::devices
namespace tessera::sched {
struct Allocation;
class Cycle;
class Scheduler;
}  // namespace tessera::sched

namespace tessera::server {

// A bearer token for the TCP listener. Its user is a local account (checked at config load), whose
// uid and groups the token's jobs run with when the server runs as root.
struct ApiToken {
  std::string token;
  std::string user;
  bool admin = false;
  uint32_t uid = 0;  // the account's, resolved at load
};

struct ServerConfig {
  std::string socket;      // unix socket path
  std::string state_dir;   // database, logs, shared regions
  std::string tcp_listen;  // "127.0.0.1:7070"; empty: no TCP
  std::vector<ApiToken> tokens;
  // TLS on the TCP listener (PEM files); empty: plain HTTP, warned about unless on loopback.
  std::string tls_cert_file, tls_key_file;
  std::string simulate;            // a preset or inventory file instead of the driver
  std::string fallback_simulate;   // used when there is no driver; empty: fail
  std::string nvml_library;        // empty: the default
  std::string policy = "tessera";  // as `--policies` takes it
  std::set<std::string> admins;    // users who may cancel anyone's job (root always may)
  // Priorities: the highest a user who is not an admin may ask, and higher ceilings for some users
  // and groups ("alice", "group:ml"); a user gets the highest that applies. Admins: 1000.
  int priority_ceiling = 0;
  std::map<std::string, int> priority_ceilings;
  // Who may preempt other users' jobs ("alice", "group:ml"); admins always may. Anyone may preempt
  // their own lower-priority jobs.
  std::set<std::string> preempt_others;
  // Whether a root server may run jobs as root (a root caller on the socket, or a token for root).
  // Off: such a submission is refused (403) and a token for root is refused at config load.
  bool allow_root_jobs = false;
  std::map<std::string, sched::OwnerQuota> quotas;  // per user
  std::map<std::string, sched::OwnerQuota>
      group_quotas;  // per Unix group: its members' jobs together
  bool requeue_preempted = true;
  // Fair share between users (sched::CycleOptions::fair_share_half_life_s): equal priorities go to
  // whoever used the GPUs least lately. 0: off, submission order.
  double fair_share_half_life_s = 0;
  // Backfill with reservations (sched::CycleOptions::reservations): the first this many blocked
  // jobs get the GPUs where they will start when running jobs end (as predicted from history) and
  // an expected start; later jobs take those GPUs only if predicted to end before. 0: off.
  int backfill_reservations = 8;
  // Interference-aware sharing (core::Request::util_ceiling_pct): a fractional job whose history
  // predicts its GPU utilization goes where the predicted utilization of the GPU's jobs stays
  // within this many percent (the 70% rule of thumb for shared GPUs); where none does, on the
  // least busy GPU with room, or, strict, it waits. 0: no ceiling.
  int utilization_ceiling_pct = 70;
  bool utilization_ceiling_strict = false;
  double grace_period_s = 30;  // SIGTERM, then SIGKILL after this (a job may ask for its own)
  std::string unhealthy_action =
      "requeue";  // requeue | fail the jobs on a GPU that turns unhealthy
  size_t max_body_bytes = 1 << 20;
  size_t max_array_tasks = 10000;  // tasks in one array (submit --array)
  // The listener's limits (HttpServerOptions): idle keep-alive, time to send one request,
  // connections in all and per peer.
  double idle_timeout_s = 60;
  double request_timeout_s = 10;
  size_t max_connections = 512;
  size_t max_connections_per_peer = 64;
  std::string intercept_library;  // libtessera-cuda.so for fractional jobs; empty: found beside us
  uint64_t context_overhead_bytes = 0;
  double poll_interval_s =
      0.25;  // how often running jobs are checked (timed out, stop escalated);
             // ended jobs are reaped at once (ExitWatcher), this is the fallback
  // Job confinement by cgroups (cgroup.h): auto | cgroup2 | cgroup1 | off. Each job gets
  // <the server's cgroup>/<cgroup_name>/job-<id>: its own GPUs' device nodes (under device_dir)
  // and the control nodes only, its CPU and memory limits, at most pids_max tasks (0: no limit).
  std::string confinement = "auto";
  std::string cgroup_name = "tessera";
  std::string device_dir = "/dev";
  int64_t pids_max = 16384;
  std::string podman = "podman";  // for jobs with an image; empty: containers off
  std::string cdi_spec_dir;  // where the CDI spec goes; empty: /var/run/cdi (root), <state_dir>/cdi
  std::vector<std::string> podman_run_args;  // added to every `podman run`
  // The machine's history (GET /v1/history, the dashboard's charts): a sample every interval_s,
  // the last window_s kept in the store (across restarts).
  double history_interval_s = 5;
  double history_window_s = 3600;
};

// Reads a YAML config file (documented in docs/server.md); unknown keys and bad values are errors
// naming the file, line and key. Fields the file does not set keep the values already in `config`.
absl::Status LoadServerConfig(const std::string& path, ServerConfig* config);
// Defaults for whoever runs the server: root gets /run/tessera and /var/lib/tessera, others
// $XDG_RUNTIME_DIR (or /tmp) and ~/.local/state/tessera.
ServerConfig DefaultServerConfig();
std::string DefaultSocketPath();

// What the server works through; each left empty gets the real one. Tests pass fakes.
struct ServerDeps {
  const core::Clock* clock = nullptr;  // wall time (core::SystemClock); must outlive the server
  Launcher* launcher = nullptr;        // job processes (ProcessLauncher); must outlive the server
  std::unique_ptr<devices::DeviceSource>
      source;                    // the GPUs; default: from config (NVML or simulated)
  std::unique_ptr<Store> store;  // the jobs; default: <state_dir>/tessera.db
};

struct StartOptions {
  bool listen = true;  // the HTTP listeners (unix socket, TCP)
  bool loop = true;    // the scheduling thread; without it, RunOnce() is the loop, called by hand
  bool health = true;  // the GPU health watch thread
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Create(ServerConfig config, ServerDeps deps = {});
  ~Server();

  // Recovers state, then starts what `options` says: the health watch, the scheduling loop, the
  // listeners.
  absl::Status Start(StartOptions options = {});
  void Stop();
  // Answers one API request (what the HTTP listeners call).
  HttpResponse Handle(const HttpRequest& req);
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
  int tcp_port() const;

 private:
  struct Running {
    int64_t id = 0;
    pid_t pid = 0;
    uint64_t start_time = 0;
    bool adopted = false;  // started by an earlier server process: not our child
    std::vector<int> gpus;
    std::string stop;  // why a stop was asked: cancel | preempt | timeout | unhealthy; empty: none
    std::string stop_reason;
    double stop_at = 0;  // when SIGTERM went out
    bool killed = false;
    double started = 0;
    double max_runtime_s = 0;
    double grace_period_s = 0;     // SIGTERM, then SIGKILL after this
    int64_t memory_limit_mib = 0;  // fractional jobs: the job's GPU memory limit
    int gpu_milli = 0;
    std::string region;
    bool container = false;  // runs in a podman container (named ContainerName(id))
    int64_t memory_mib = 0;  // its host memory limit (0: none)
    bool cgroup = false;     // has its own cgroups (Cgroups::Create)
    uint32_t uid = 0;        // its owner's
    bool arbiter = false;    // its owner may write the GPU arbiter file for it (ArbiterUser)
    int64_t array_id = 0;    // a task of this array
    std::shared_ptr<const JobSpec> spec;  // for its history when it succeeds
    std::string owner;
    // What it is measured to use of its GPUs (TakeSample, Finish): utilization from the history
    // samples in which it held its GPUs alone, GPU time the arbiter charged it (shares with a
    // compute share), and the most GPU memory seen (MiB per GPU; shares: their region's peak).
    double util_sum = 0;
    int util_samples = 0;
    uint64_t arbiter_busy_us = 0;
    uint64_t arbiter_seen_us = 0;  // the arbiter's count when last read
    int64_t gpu_peak_mib = 0;
    bool shared_gpu = false;  // a share that another share's job ran beside (CommitLaunch)
  };
  struct Queued {
    int64_t id = 0;
    int priority = 0;
    std::string owner;
    uint32_t uid = 0;
    std::shared_ptr<const JobSpec> spec;  // one for all the tasks of an array
    double submitted = 0;  // when it was submitted: its place in the queue, kept when re-queued
    double since = 0;      // submitted or re-queued at: the start of its scheduling latency
    bool held = false;
    int64_t array_id = 0;  // a task of this array (0: none), with its index
    int array_index = -1;
    int throttle = 0;  // its array runs at most this many tasks at once (0: no limit)
    // In the cycle's queue: not held, its dependencies met, room in its array (Admit). Otherwise
    // `waiting` says why not.
    bool in_cycle = false;
    std::string waiting;
    // A cancel, hold, release or priority change to it is being stored (without mu_): it stays
    // out of the cycle until that is done (BeginChange, EndChange).
    bool changing = false;
  };
  // For a change to queued jobs written to the store without mu_: waits (on `lock`, over mu_)
  // until no other change to any of `ids` is under way, then marks those still queued as changing
  // and takes them out of the cycle's queue; returns them. EndChange (under mu_) lets them back.
  std::vector<int64_t> BeginChange(std::unique_lock<std::mutex>& lock,
                                   const std::vector<int64_t>& ids);
  void EndChange(const std::vector<int64_t>& ids);
  std::condition_variable changed_;  // a change ended (EndChange)
  // A queued job as its stored record says.
  static Queued QueuedOf(const JobRecord& r, std::shared_ptr<const JobSpec> spec, double since);
  // How a dependency stands: not yet settled, met (the outcome it asks), or never to be met.
  struct DependencyState {
    enum { kPending, kOk, kNotOk, kMissing } outcome = kPending;
    std::string what;  // "job 5 failed", "every task of array 7 succeeded"
  };
  DependencyState Outcome(const Dependency& d) const;  // under mu_
  // Why `d` can never be met given its outcome, empty when it is met or pending.
  static std::string Unmeetable(const Dependency& d, const DependencyState& state);
  // Moves the queued jobs that may now run into the cycle's queue (not held, dependencies met, room
  // in their array) and ends those whose dependencies can never be met. Under mu_.
  void Admit(double now);
  // Stores the end of the jobs Admit found can never run (never_met_), with `lock` (on mu_)
  // released meanwhile.
  void EndNeverMet(double now, std::unique_lock<std::mutex>& lock);
  std::vector<std::pair<int64_t, std::string>> never_met_;  // under mu_: id, why
  // The ids a reference names: "12" (a job, or every task of array 12 when `whole_array`), "12_3"
  // (task 3 of array 12). kNotFound, or kInvalidArgument for what is not a reference.
  absl::StatusOr<std::vector<int64_t>> Resolve(std::string_view ref, bool whole_array);
  // The tasks of an array by state ({"queued": 84, "running": 8}), with its range and size.
  nlohmann::json ArraySummary(int64_t array_id, const std::string& range);

  Server(ServerConfig config, ServerDeps deps);
  // Wall time in seconds since the epoch, from the clock.
  double Now() const { return core::Seconds(clock_->Now()); }
  // <state_dir>/<dir>/<id><suffix>: a job's log, exit or region file.
  std::string JobFile(const char* dir, int64_t id, const char* suffix = "") const;
  // <state_dir>/logs/<id>.<task><suffix>: the log of a job's task other than task 0.
  std::string TaskLog(int64_t id, int task, const char* suffix) const;
  // What is tracked of a running job, from its spec (fractional jobs on a GPU get a region).
  Running NewRunning(int64_t id, const JobSpec& spec, std::vector<int> gpus, double started) const;
  // The GPU arbiter file, made at start for the fractional jobs of every user.
  void SetUpSharing();
  std::string ArbiterFile() const;
  // Finds podman and writes the CDI spec; otherwise says why jobs with an image are refused.
  void SetUpContainers();
  absl::Status Recover();
  // The scheduling request of a job: RequestOf, plus the quota groups of its owner.
  core::Request RequestFor(const JobSpec& spec, int64_t id, const std::string& owner, uint32_t uid);
  // "group:<name>" for each group of `uid` (primary and supplementary); cached.
  std::vector<std::string> UserGroups(uint32_t uid);
  // Those of them that have a quota.
  std::vector<std::string> QuotaGroups(uint32_t uid);
  // `user` and "group:<name>" for each of their groups: whom per-user and per-group settings name.
  std::vector<std::string> Principals(const std::string& user, uint32_t uid);
  // The highest priority `user` may ask (admins 1000), and whether their jobs may preempt others'.
  int PriorityCeiling(const std::string& user, uint32_t uid, bool admin);
  bool MayPreemptOthers(const std::string& user, uint32_t uid, bool admin);
  // Whether the owner of a job is an admin: root, the server's own user, listed in `admins`, or the
  // user of a token marked admin.
  bool IsAdmin(const std::string& user, uint32_t uid) const;
  void Loop();
  bool Turn(
      std::unique_lock<std::mutex>& lock);  // RunOnce with mu_ held (released while launching)
  void CheckRunning(double now, std::unique_lock<std::mutex>& lock);  // unlocks for ends
  // Puts a job in queued_ (and, at the next pass, the cycle's queue: Admit), under mu_.
  void Enqueue(Queued q);
  // Why a queued job waits, from the cycle; empty when it is not queued.
  std::string WaitingReason(int64_t id) const;
  // One step of the scheduling cycle, carried out: starts and preemption stops. Releases `lock` (on
  // mu_) while the store records the starts and the processes are launched.
  void SchedulePass(double now, std::unique_lock<std::mutex>& lock);
  // A start decided under mu_ and carried out without it.
  struct Launch {
    Queued queued;
    LaunchSpec spec;
    Running run;
    std::string where, placement_json;
    absl::Status refused;   // why it must not run (decided under mu_)
    absl::Status recorded;  // the store's transition to running
    absl::StatusOr<Launched> launched = Launched{};
    std::optional<CgroupLimits> limits;  // its cgroup, when jobs get one
  };
  Launch PrepareLaunch(Queued q, const sched::Allocation& a, double now) const;  // under mu_
  void ExecuteLaunch(Launch& l, double now);  // without mu_: store writes, files, fork and exec
  void CommitLaunch(Launch& l, double now);   // under mu_
  // A job whose process ended: taken out of running_ (its GPUs freed) under mu_, the rest of its
  // end done by Finish without mu_, then its cgroup (if still busy) and re-queueing under mu_.
  struct Ending {
    Running run;
    int exit_code = -1;
    bool exit_known = false;
    bool cgroup_left = false;       // its cgroup could not be removed yet
    std::optional<Queued> requeue;  // re-queued: to be enqueued
  };
  void Finish(Ending& e, double now);  // without mu_: cgroup accounting, containers, the store
  // What a fractional job's files say of its use (read without mu_): the arbiter's GPU time and
  // its region's peak memory.
  struct ShareReading {
    uint64_t busy_us = 0;
    uint64_t peak_bytes = 0;
  };
  // Adds what one history sample shows of each running job's GPU use: `telemetry` for jobs that
  // hold their GPUs alone, `shares` for fractional ones. Under mu_.
  void MeasureRunning(const std::vector<devices::GpuTelemetry>& telemetry,
                      const std::map<int64_t, ShareReading>& shares);
  // The GPU time the arbiter charged job `id` on GPU `gpu` so far (us; 0: none known).
  uint64_t ArbiterBusyMicros(int64_t id, int gpu) const;
  static void AddArbiterBusy(Running& r, uint64_t busy_us);
  // A job's GPU utilization over its run (percent), when measured.
  static std::optional<double> GpuUtilizationOf(const Running& r, double now);
  // What a finished job's record says its utilization was, and whether it shared its GPU.
  static std::optional<double> MeasuredUtilization(const JobRecord& r);
  static std::optional<bool> SharedGpu(const JobRecord& r);
  void RequestStop(Running& r, const std::string& why, const std::string& reason, double now);
  void OnHealth(int gpu, bool healthy, const std::string& reason);
  std::string RenderMetrics();
  // Every GPU's utilization, memory used, temperature and power, read from the driver at most once
  // per kTelemetryMaxAgeS however often it is asked; a GPU that does not answer gets empty
  // readings.
  std::vector<devices::GpuTelemetry> Telemetry();

  // API
  HttpResponse Submit(const HttpRequest& req, const std::string& user, uint32_t uid, bool admin);
  // Others' jobs without their details (env, workdir); logs only for the owner and admins.
  HttpResponse ListJobs(const HttpRequest& req, const std::string& user, bool admin);
  HttpResponse GetJob(int64_t id, const std::string& user, bool admin);
  HttpResponse Cancel(const std::string& ref, const std::string& user, bool admin);
  // Holds or releases queued jobs (every queued task of an array named by its id).
  HttpResponse Hold(const std::string& ref, bool hold, const std::string& user, bool admin);
  HttpResponse Logs(const HttpRequest& req, int64_t id, const std::string& user, bool admin);
  // POST /v1/jobs/N/priority {"priority": P}: a queued job's new priority (its owner within their
  // ceiling, or an admin).
  HttpResponse SetPriority(const std::string& ref, const HttpRequest& req, const std::string& user,
                           uint32_t uid, bool admin);
  // POST /v1/gpus/N/simulate {"xid": X} | {"lost": bool}: an admin makes a simulated machine's
  // GPU sick (or well), to see what the server does; 409 on a real machine.
  HttpResponse SimulateHealth(const std::string& gpu, const HttpRequest& req, bool admin);
  HttpResponse Gpus();
  // GET /v1/acct?since=&until=[&user=]: accounting over a period (acct.h).
  HttpResponse Acct(const HttpRequest& req, const std::string& user, bool admin);
  absl::StatusOr<AcctReport> Accounting(double since, double until, const std::string& only_user);
  // A user's primary group's name (accounting's group); cached.
  std::string PrimaryGroup(uint32_t uid);
  nlohmann::json Info();

  // The dashboard's side (dashboard.cc). GET /v1/stream: server-sent events (job events from the
  // store, GPU health changes, history samples), resumed from Last-Event-ID.
  HttpResponse Stream(const HttpRequest& req, const std::string& user, bool admin);
  // GET /v1/history[?since=]: the samples of the last window.
  HttpResponse History(const HttpRequest& req);
  // GET /v1/quotas: each user's and group's quota from the config, and what they use now.
  HttpResponse Quotas();
  // "/" and "/ui/...": the embedded pages and their code.
  HttpResponse Asset(const std::string& path) const;
  // Loads the stored history and starts the sampler (a thread when `thread`; tests call
  // TakeSample by hand).
  void StartHistory(bool thread);

  // What wakes the event streams: a version bumped on every change worth telling.
  class Feed {
   public:
    void Bump();
    // Waits until the version passes `seen` (then updates it) or `timeout_s`; false once closed.
    bool Wait(uint64_t* seen, double timeout_s);
    // Waits until `t` or the close; false once closed.
    bool SleepUntil(std::chrono::steady_clock::time_point t);
    void Close();

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    uint64_t version_ = 0;
    bool closed_ = false;
  };
  Feed feed_;
  std::thread sampler_;
  std::mutex history_mu_;  // the two below; taken alone
  double last_sample_at_ = -1;
  uint64_t samples_taken_ = 0;

  ServerConfig config_;
  const core::Clock* clock_;
  ProcessLauncher process_launcher_;
  Launcher* launcher_;  // process_launcher_ unless a test gave one; podman_launcher_ over it
  std::unique_ptr<PodmanLauncher> podman_launcher_;  // when jobs can have an image
  std::unique_ptr<Store> store_;
  std::unique_ptr<devices::DeviceSource> source_;
  std::unique_ptr<devices::HealthWatch> health_;
  std::string fallback_reason_;
  core::NodeInventory inventory_;
  std::unique_ptr<HttpServer> http_;
  std::optional<ContainerRuntime> containers_;  // podman, when jobs can have an image
  // Who may write the GPU arbiter file: the owners of running jobs with a compute share, each
  // with how many (its ACL names them; `arbiter_access_` says how it is guarded).
  std::mutex arbiter_mu_;
  std::map<uint32_t, int> arbiter_users_;
  bool arbiter_acl_ = false;
  std::string arbiter_access_;
  // Counts a job of `uid` that uses the arbiter in (+1) or out (-1); the file's ACL follows.
  void ArbiterUser(uint32_t uid, int delta);
  DurationPredictor predictor_;  // run times of jobs that succeeded (thread-safe)
  // Loads the history of the jobs that succeeded (the newest kHistoryJobs) into predictor_.
  void LoadHistory();
  static constexpr size_t kHistoryJobs = 5000;
  // A queued or running job's prediction and expected start/end, added to its JSON (under mu_).
  void AddExpectations(nlohmann::json& j, int64_t id, double now) const;
  std::unique_ptr<Cgroups> cgroups_;  // confinement; mode "none" when it cannot be had
  std::set<int64_t> cgroups_left_;    // of ended jobs, not yet removable (retried each turn)
  std::string containers_off_;        // why not, when they cannot
  std::string cdi_spec_path_;
  std::string hostname_;

  std::mutex mu_;  // everything below
  std::condition_variable wake_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::unique_ptr<sched::Cycle> cycle_;  // the queue: sched's, shared with the simulator
  std::map<int64_t, Running> running_;
  std::map<int64_t, Queued> queued_;
  // Jobs being launched outside mu_: the user who cancelled one meanwhile, else empty.
  std::map<int64_t, std::string> starting_;
  // Jobs whose process ended and whose end is being recorded outside mu_.
  std::set<int64_t> finishing_;
  std::vector<bool> gpu_healthy_;
  std::vector<std::string> gpu_health_reason_;
  std::vector<uint64_t> gpu_xids_;
  bool dirty_ = true;           // something changed that may let a queued job start
  SchedulingStats scheduling_;  // latency (submit to start) and passes, for /metrics

  std::mutex groups_mu_;  // the quota groups cache; never held while taking mu_
  std::map<uint32_t, std::vector<std::string>> user_groups_;
  std::map<uint32_t, std::string> primary_group_;

  std::mutex telemetry_mu_;  // the telemetry cache; never held with mu_
  double telemetry_at_ = -1;
  std::vector<devices::GpuTelemetry> telemetry_;

  std::unique_ptr<ExitWatcher> exits_;  // wakes the loop when a job's process ends

  std::atomic<bool> stop_{false};
  std::thread loop_;
};

}  // namespace tessera::server
