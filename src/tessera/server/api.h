#pragma once
// The standalone server's HTTP API: who asks (the socket's peer credentials, or a bearer token on
// TCP), the routes of /v1 (docs/server.md; /v1/openapi.json), the requests' JSON checked and the
// answers written, the event stream and the dashboard's pages. It changes and reads the running
// server only through the dispatcher's operations and views (dispatcher.h), each checked here
// against who asks first; the job store it reads directly. Thread-safe: the listeners call Handle
// from many threads.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/net/http.h"
#include "tessera/server/acct.h"
#include "tessera/server/dispatcher.h"

namespace tessera::server {

// GET /v1/jobs pages: jobs per answer by default and at most, and about how many bytes of their
// specs one answer holds (a page ends early past it: "more", "next_before").
inline constexpr size_t kListDefault = 1000, kListMax = 10000;
inline constexpr size_t kListBytes = size_t{4} << 20;
// Failed bearer tokens from one address in a minute past which it is answered 429.
inline constexpr int kAuthFailuresLimit = 20;
// How old /metrics' accounting totals may be (a scrape recomputes them at most this often).
inline constexpr double kMetricsAcctMaxAgeS = 10;

class Api {
 public:
  explicit Api(Dispatcher& dispatcher);
  ~Api();

  // Answers one request.
  net::HttpResponse Handle(const net::HttpRequest& req);

  // /metrics' accounting totals (every job's record read: 0.24 s at 30,000 jobs) recomputed every
  // `period_s` by a thread of its own once /metrics has been asked for, so that scrapes only read
  // them; without it (tests driving the loop by hand) a scrape that finds them older than
  // kMetricsAcctMaxAgeS recomputes them. Server::Start starts it with the loop.
  void StartMetricsRefresher(double period_s);
  void StopMetricsRefresher();

 private:
  net::HttpResponse Submit(const net::HttpRequest& req, const Caller& c);
  // Others' jobs without their details (env, workdir); logs only for the owner and admins.
  net::HttpResponse ListJobs(const net::HttpRequest& req, const Caller& c);
  net::HttpResponse GetJob(int64_t id, const Caller& c);
  net::HttpResponse Cancel(const std::string& ref, const net::HttpRequest& req, const Caller& c);
  // Holds or releases queued jobs (every queued task of an array named by its id).
  net::HttpResponse Hold(const std::string& ref, bool hold, const Caller& c);
  // POST /v1/jobs/N/priority {"priority": P}: a queued job's new priority (its owner within their
  // ceiling, or an admin).
  net::HttpResponse SetPriority(const std::string& ref, const net::HttpRequest& req,
                                const Caller& c);
  net::HttpResponse Logs(const net::HttpRequest& req, int64_t id, const Caller& c);
  // GET /v1/jobs/N/wait?state=S&bytes=B&timeout_s=T (api_wait.cc): answers once the job's state
  // is not S or its output (every task's stdout and stderr, where the logs endpoint reads them) is
  // more than B bytes, or after T seconds (default 10, at most 30): how `tessera run` follows a
  // job with no polling delay.
  net::HttpResponse Wait(const net::HttpRequest& req, int64_t id, const Caller& c);
  // Where a task's stdout or stderr is read (by Logs, and watched by Wait): a file of the job's
  // user's (`user`: --stdout/--stderr; read only when a regular file its owner owns, never through
  // a link), else the server's own log. `spec` null: a spec that does not parse (the server's).
  struct LogFile {
    std::string path;
    bool user = false;
  };
  LogFile LogFileOf(const JobRecord& r, const JobSpec* spec, int task, bool stderr_stream);
  // POST /v1/gpus/N/simulate {"xid": X} | {"lost": bool}: an admin makes a simulated machine's
  // GPU sick (or well), to see what the server does; 409 on a real machine.
  net::HttpResponse SimulateHealth(const std::string& gpu, const net::HttpRequest& req,
                                   const Caller& c);
  net::HttpResponse Gpus();
  // POST /v1/admin/purge {"jobs_s": AGE, "logs_s": AGE, "environments_s": AGE}: an admin removes
  // now what retention would (api_admin.cc); answers the counts.
  net::HttpResponse Purge(const net::HttpRequest& req, const Caller& c);
  // GET /v1/acct?since=&until=[&user=]: accounting over a period (acct.h).
  net::HttpResponse Acct(const net::HttpRequest& req, const Caller& c);
  absl::StatusOr<AcctReport> Accounting(double since, double until, const std::string& only_user);
  // A GPU's memory in MiB by index (0 when not known): how a share's memory weighs against it.
  std::function<int64_t(int gpu)> GpuMemoryMib() const;
  // A user's primary group's name (accounting's group); cached.
  std::string PrimaryGroup(uint32_t uid);
  nlohmann::json Info();
  // The Prometheus page: the dispatcher's snapshot and the accounting.
  std::string Metrics();
  // The dashboard's side (dashboard.cc). GET /v1/stream: server-sent events (job events from the
  // store, GPU health changes, history samples), resumed from Last-Event-ID.
  net::HttpResponse Stream(const net::HttpRequest& req, const Caller& c);
  // GET /v1/history[?since=]: the samples of the last window.
  net::HttpResponse History(const net::HttpRequest& req);
  // GET /v1/quotas: each user's and group's quota from the config, and what they use now.
  net::HttpResponse Quotas();
  // Counts of every job by state (held ones also as "held") and by user: what the dashboard shows
  // whatever the number of jobs (a list is paged; counts are not).
  net::HttpResponse Summary();
  // "/" and "/ui/...": the embedded pages and their code.
  net::HttpResponse Asset(const std::string& path) const;

  // The ids a reference names: "12" (a job, or every task of array 12 when `whole_array`), "12_3"
  // (task 3 of array 12). kNotFound, or kInvalidArgument for what is not a reference.
  absl::StatusOr<std::vector<int64_t>> Resolve(std::string_view ref, bool whole_array);
  // The jobs `ref` names (every task of an array when `whole_array`) and the first one's record,
  // when `c` may `what` them: their owner or an admin. Errors carry their HTTP status.
  struct Owned {
    std::vector<int64_t> ids;
    JobRecord first;
  };
  absl::StatusOr<Owned> OwnedJobs(const std::string& ref, bool whole_array, const Caller& c,
                                  const std::string& what);
  // The tasks of an array by state ({"queued": 84, "running": 8}), with its range and size.
  nlohmann::json ArraySummary(int64_t array_id, const std::string& range);
  // A queued or running job's prediction and expected start/end, added to its JSON.
  static void AddExpectations(nlohmann::json& j, const Dispatcher::Live& live);

  Dispatcher& d_;
  const ServerConfig& config_;
  Store& store_;
  // Failed bearer tokens per client address (without its port): each one logged (at most every
  // 10 s per address, with the count) and answered late - 20 ms, doubling every 5 failures, at
  // most 1 s - and past kAuthFailuresLimit in a minute with 429. A guess took microseconds.
  struct AuthFailures {
    int count = 0;
    double window_start = 0, logged = 0;
  };
  // The delay before answering the failure, and whether it is over the limit.
  std::pair<double, bool> AuthFailed(const std::string& address);
  // /metrics' accounting totals, cached (Metrics).
  std::mutex metrics_mu_;
  std::optional<AcctReport> acct_cache_;
  double acct_cached_at_ = 0;
  bool acct_refreshing_ = false;
  bool scraped_ = false;  // /metrics has been asked for: worth refreshing
  uint64_t acct_on_request_ = 0, acct_refreshed_ = 0;  // computations, by where
  std::condition_variable refresher_cv_;
  bool refresher_stop_ = false;
  std::thread refresher_;
  std::mutex auth_mu_;
  std::map<std::string, AuthFailures> auth_failures_;
  std::mutex groups_mu_;  // the primary groups cache
  std::map<uint32_t, std::string> primary_group_;
};

}  // namespace tessera::server
