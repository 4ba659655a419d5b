#pragma once
// `tessera server`: the standalone daemon of one shared GPU machine. Jobs come in over the HTTP API
// (a unix socket; optionally TCP with bearer tokens), are stored durably (SQLite) before the answer
// goes out, placed by the scheduling core on the machine's GPUs (real through NVML, or a simulated
// machine said as such), started by the runner and watched until they end. After a crash the next
// start keeps every accepted job and re-adopts the jobs still running. See docs/server.md.
//
// Its parts: the Dispatcher (dispatcher.h) owns the machine's state and drives the scheduling
// cycle; the Api (api.h) answers requests - who asks, routes, JSON - through the dispatcher's
// operations; processes go through a Launcher (launcher.h: bare processes, or podman); /metrics is
// server_metrics.h. Clock, Store, Launcher and DeviceSource come in through ServerDeps.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
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
#include "tessera/core/request.h"
#include "tessera/devices/device_source.h"
#include "tessera/net/http.h"
#include "tessera/sched/quota.h"
#include "tessera/server/launcher.h"
#include "tessera/server/socket_path.h"
#include "tessera/server/store.h"

namespace tessera::server {

// A bearer token for the TCP listener. Its user is a local account (checked at config load), whose
// uid and groups the token's jobs run with when the server runs as root.
struct ApiToken {
  std::string token;
  std::string user;
  bool admin = false;
  uint32_t uid = 0;  // the account's, resolved at load
  // A scraper's token: /metrics and /v1/health only; no user, runs nothing.
  bool metrics_only = false;
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
  // whoever used the GPUs least lately (a day's half-life by default). 0: off, submission order.
  double fair_share_half_life_s = 86400;
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
  // A job asking gpu_share/gpu_memory "auto" is sized at the 95th percentile of what its kind used
  // plus this margin, percent (auto_size.h).
  int auto_size_margin_pct = 20;
  // A job asking "auto" of a kind never measured runs first as a trial this long on a whole GPU,
  // then is re-queued sized from it (0: it runs on a whole GPU, measured for the next run).
  double auto_size_trial_s = 120;
  double grace_period_s = 30;  // SIGTERM, then SIGKILL after this (a job may ask for its own)
  // The most a job's own grace period may be: a job ignoring SIGTERM keeps its GPUs this long at
  // most after a stop (cancel --force kills at once).
  double max_grace_period_s = 300;
  std::string unhealthy_action =
      "requeue";  // requeue | fail the jobs on a GPU that turns unhealthy
  size_t max_body_bytes = 1 << 20;
  size_t max_array_tasks = 10000;  // tasks in one array (submit --array)
  // Per-user caps (limits:): jobs waiting (an array's tasks each count; more is refused at submit)
  // and jobs running or being started at once (more wait, saying so), so that one user's huge
  // array neither fills the machine's process table nor holds the scheduling loop; and processes
  // started in one scheduling pass (GPU jobs first; the rest go in the next pass).
  size_t max_queued_jobs_per_user = 20000;
  // What one user's waiting jobs' specs (commands, environments) hold in all, as stored (an
  // array's spec once): 300 held jobs of 0.9 MB commands made the server run out of memory and
  // slowed everyone's starts. More is refused at submit (429).
  uint64_t max_queued_bytes_per_user = uint64_t{64} << 20;
  size_t max_running_jobs_per_user = 1024;
  size_t max_starts_per_pass = 64;
  // Slurm's DefaultTime and MaxTime: a job that asks no max runtime gets default_runtime_s (so the
  // backfill knows when its GPUs come free: a job with no expected end holds back every job
  // reserved behind it); one asking more than max_runtime_s is refused at submit. 0: none.
  double default_runtime_s = 24 * 3600;
  // Retention (retention:): ended jobs go from the store (and their logs) after retention_jobs_s,
  // their logs after retention_logs_s, the environments stored with them (what the users' shells
  // held: tokens, keys) after retention_env_s. 0 keeps them.
  double retention_jobs_s = 365 * 86400.0;
  double retention_logs_s = 30 * 86400.0;
  double retention_env_s = 7 * 86400.0;
  double max_runtime_s = 0;
  // A job whose logs (stdout and stderr, every task's) grow past this is stopped, as a job past its
  // max runtime is (0: no cap). Checked about once a second: a fast writer may pass it by what it
  // writes in that time.
  uint64_t max_log_bytes_per_job = uint64_t{1} << 30;
  // New jobs are refused (507) while the state folder's file system has less free than this, so
  // that the store keeps room to record every end.
  uint64_t min_free_disk_bytes = uint64_t{1} << 30;
  // The listener's limits (HttpServerOptions): idle keep-alive, time to send one request,
  // connections in all and per peer.
  double idle_timeout_s = 60;
  double request_timeout_s = 10;
  size_t max_connections = 512;      // on the unix socket
  size_t max_tcp_connections = 512;  // on TCP: a budget of its own, so TCP cannot fill the socket's
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
  // Default: "tessera" for the default state folder, else "tessera-<8 hex of the state folder's
  // path>", so that two servers on one host never sweep each other's jobs (StateCgroupName).
  std::string cgroup_name = "tessera";
  bool cgroup_name_set = false;  // the config named it
  std::string device_dir = "/dev";
  int64_t pids_max = 16384;
  // Tasks of all of a user's running jobs together (a cgroup per user above their jobs'): two jobs
  // at pids_max exhausted a host with pid_max 32768. -1: a quarter of what the host can have
  // (the lesser of kernel.pid_max and kernel.threads-max), 0: no limit.
  int64_t user_pids_max = -1;
  // Each job gets its own /tmp and /dev/shm, removed when it ends (private_dirs.h); needs root.
  bool private_tmp = true;
  // Where jobs leave shared memory (POSIX shm_open, NCCL's segments): what a user's jobs left
  // there is removed when the last of them ends (it stayed in RAM outside every limit), unless
  // the user is root. Empty: nothing removed.
  std::string shm_dir = "/dev/shm";
  std::string podman = "podman";  // for jobs with an image; empty: containers off
  std::string cdi_spec_dir;  // where the CDI spec goes; empty: /var/run/cdi (root), <state_dir>/cdi
  std::vector<std::string> podman_run_args;  // added to every `podman run`
  // GPUs shared by NVIDIA MPS instead of time slices (mps:): by index or UUID, or "all"; each gets
  // its own control daemon, run by this program (mps.h), asked every mps_check_interval_s.
  std::vector<std::string> mps_gpus;
  std::string mps_control = "nvidia-cuda-mps-control";
  double mps_check_interval_s = 2;
  // The machine's history (GET /v1/history, the dashboard's charts): a sample every interval_s,
  // the last window_s kept in the store (across restarts).
  double history_interval_s = 5;
  double history_window_s = 3600;
};

// Reads a YAML config file (documented in docs/server.md); unknown keys and bad values are errors
// naming the file, line and key. Fields the file does not set keep the values already in `config`.
absl::Status LoadServerConfig(const std::string& path, ServerConfig* config);
// The token of `user` (an admin's when `admin`) in the config file at `path`: the first such entry
// of tcp.tokens, or a new random one added (`added`), the file created (0600) when missing. An edit
// goes through the YAML library, keeps every other key and entry, leaves the file as it was in
// `path`.bak (comments are not kept) and replaces the file by rename. A file the loader refuses is
// refused unchanged, with the loader's error.
absl::StatusOr<std::string> EnsureToken(const std::string& path, const std::string& user,
                                        bool admin, bool* added);
// Defaults for whoever runs the server: root gets /run/tessera and /var/lib/tessera, others
// $XDG_RUNTIME_DIR (or /tmp) and ~/.local/state/tessera.
ServerConfig DefaultServerConfig();
// The confinement cgroup of a server whose config names none: "tessera" for the default state
// folder (what servers before this rule used), else "tessera-" and 8 hex digits of a hash of the
// state folder's path, so that servers with other state folders never share (and sweep) a subtree.
std::string StateCgroupName(const std::string& state_dir);

// What the server works through; each left empty gets the real one. Tests pass fakes.
class JobHost;

struct ServerDeps {
  const core::Clock* clock = nullptr;  // wall time (core::SystemClock); must outlive the server
  Launcher* launcher = nullptr;        // job processes (ProcessLauncher); must outlive the server
  // Where jobs run (job_host.h); must outlive the server. Default: this machine (LocalJobHost,
  // through `launcher`, with the config's confinement).
  JobHost* host = nullptr;
  std::unique_ptr<devices::DeviceSource>
      source;                    // the GPUs; default: from config (NVML or simulated)
  std::unique_ptr<Store> store;  // the jobs; default: <state_dir>/tessera.db
};

struct StartOptions {
  bool listen = true;  // the HTTP listeners (unix socket, TCP)
  bool loop = true;    // the scheduling thread; without it, RunOnce() is the loop, called by hand
  bool health = true;  // the GPU health watch thread
};

class Dispatcher;
class Api;

// The daemon: its dispatcher (dispatcher.h: the queue, the scheduling cycle, the jobs' processes),
// its HTTP API (api.h: who asks, routing, JSON) and the listeners that serve the API.
class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Create(ServerConfig config, ServerDeps deps = {});
  ~Server();

  // Recovers state, then starts what `options` says: the health watch, the scheduling loop, the
  // listeners.
  absl::Status Start(StartOptions options = {});
  void Stop();
  // Answers one API request (what the HTTP listeners call).
  net::HttpResponse Handle(const net::HttpRequest& req);
  // One turn of the scheduling loop at the clock's time (Dispatcher::RunOnce).
  bool RunOnce();
  // /metrics' accounting refreshed off the request path (Api::StartMetricsRefresher; Start does
  // it with the loop, every 5 s).
  void StartMetricsRefresher(double period_s);
  // One sample of the machine's history now (Dispatcher::TakeSample).
  std::string TakeSample();
  // The machine as the scheduler sees it (one node).
  const core::NodeSpec& node() const;
  const core::NodeInventory& inventory() const;
  const std::string& fallback_reason() const;
  int tcp_port() const;

 private:
  Server() = default;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<Api> api_;
  std::unique_ptr<net::HttpServer> http_;
};

}  // namespace tessera::server
