// The standalone server's HTTP API (docs/server.md, /v1/openapi.json): who asks, the routes, the
// requests' JSON and the answers'. What it changes or reads of the running server it asks the
// dispatcher (dispatcher.h); the job store it reads directly.
#include "tessera/server/api.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"
#include "tessera/devices/cdi.h"
#include "tessera/server/api_response.h"
#include "tessera/server/efficiency.h"
#include "tessera/server/openapi.h"
#include "tessera/server/server_util.h"

namespace tessera::server {

using nlohmann::json;

Api::Api(Dispatcher& d) : d_(d), config_(d.config()), store_(d.store()) {}

Api::~Api() { StopMetricsRefresher(); }

void Api::StartMetricsRefresher(double period_s) {
  std::lock_guard lock(metrics_mu_);
  if (refresher_.joinable()) return;
  refresher_stop_ = false;
  refresher_ = std::thread([this, period_s] {
    std::unique_lock lock(metrics_mu_);
    while (!refresher_cv_.wait_for(lock, std::chrono::duration<double>(period_s),
                                   [&] { return refresher_stop_; })) {
      if (!scraped_ || acct_refreshing_) continue;
      acct_refreshing_ = true;
      lock.unlock();
      const double now = d_.Now();
      auto all = Accounting(0, now, "");
      lock.lock();
      acct_refreshing_ = false;
      if (all.ok()) {
        acct_cache_ = *std::move(all);
        acct_cached_at_ = now;
        ++acct_refreshed_;
      }
    }
  });
}

void Api::StopMetricsRefresher() {
  {
    std::lock_guard lock(metrics_mu_);
    refresher_stop_ = true;
  }
  refresher_cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
}

// Long by design: the route table (who asks, then one block per path and method), each route a
// call to its own handler.
net::HttpResponse Api::Handle(const net::HttpRequest& req) {
  // The dashboard's page and code: the same for everyone, no data in them (that comes from the
  // API below, with the caller's token).
  if (req.method == "GET" &&
      (req.path == "/" || req.path == "/favicon.ico" || req.path.rfind("/ui/", 0) == 0))
    return Asset(req.path);
  // Who is asking.
  Caller c;
  if (req.peer.unix_socket) {
    c.uid = req.peer.uid;
    c.user = UserName(c.uid);
    c.admin = d_.rights().IsAdmin(c.user, c.uid);
  } else {
    const std::string prefix = "Bearer ";
    if (req.authorization.rfind(prefix, 0) != 0) {
      return Error(401, "TCP clients need 'Authorization: Bearer <token>'");
    }
    std::string token = req.authorization.substr(prefix.size());
    const ApiToken* found = nullptr;
    for (const ApiToken& t : config_.tokens) {
      if (t.token.size() == token.size() && SameSecret(t.token, token)) found = &t;
    }
    if (found == nullptr) {
      const auto [delay_s, over] = AuthFailed(req.peer.address);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
      if (over)
        return Error(429, fmt::format("too many unknown bearer tokens from this address (over {} "
                                      "in a minute); try again later",
                                      kAuthFailuresLimit));
      return Error(401, "unknown bearer token");
    }
    if (found->metrics_only && req.path != "/metrics" && req.path != "/v1/health")
      return Error(403, "this token is a metrics_only one: it reads /metrics and /v1/health only");
    c.user = found->user;
    c.admin = found->admin;
    c.uid = found->uid;  // a local account, checked at config load
  }
  const std::string& path = req.path;
  const std::string& m = req.method;
  auto only = [&](std::initializer_list<const char*> methods) -> std::optional<net::HttpResponse> {
    for (const char* x : methods) {
      if (m == x) return std::nullopt;
    }
    return Error(405, fmt::format("{} does not take {}", path, m));
  };
  if (path == "/metrics") {
    if (auto e = only({"GET"})) return *e;
    return net::HttpResponse{200, "text/plain; version=0.0.4", Metrics()};
  }
  if (path == "/v1/health") {
    if (auto e = only({"GET"})) return *e;
    return JsonResponse(200, json{{"status", "ok"}});
  }
  if (path == "/v1/openapi.json") {
    if (auto e = only({"GET"})) return *e;
    return net::HttpResponse{200, "application/json", std::string(OpenApiDocument())};
  }
  if (path == "/v1/info") {
    if (auto e = only({"GET"})) return *e;
    json j = Info();
    j["caller"] = {{"user", c.user}, {"admin", c.admin}};
    return JsonResponse(200, j);
  }
  if (path == "/v1/acct") {
    if (auto e = only({"GET"})) return *e;
    return Acct(req, c);
  }
  if (path == "/v1/gpus") {
    if (auto e = only({"GET"})) return *e;
    return Gpus();
  }
  if (const std::string gp = "/v1/gpus/"; path.rfind(gp, 0) == 0) {
    std::string rest = path.substr(gp.size());
    const size_t slash = rest.find('/');
    if (slash != std::string::npos && rest.substr(slash + 1) == "simulate") {
      if (auto e = only({"POST"})) return *e;
      return SimulateHealth(rest.substr(0, slash), req, c);
    }
  }
  if (path == "/v1/stream") {
    if (auto e = only({"GET"})) return *e;
    return Stream(req, c);
  }
  if (path == "/v1/summary") {
    if (auto e = only({"GET"})) return *e;
    return Summary();
  }
  if (path == "/v1/quotas") {
    if (auto e = only({"GET"})) return *e;
    return Quotas();
  }
  if (path == "/v1/history") {
    if (auto e = only({"GET"})) return *e;
    return History(req);
  }
  if (path == "/v1/admin/purge") {
    if (auto e = only({"POST"})) return *e;
    return Purge(req, c);
  }
  if (path == "/v1/jobs") {
    if (auto e = only({"GET", "POST"})) return *e;
    return m == "POST" ? Submit(req, c) : ListJobs(req, c);
  }
  const std::string jobs_prefix = "/v1/jobs/";
  if (path.rfind(jobs_prefix, 0) == 0) {
    std::string rest = path.substr(jobs_prefix.size());
    std::string tail;
    if (size_t slash = rest.find('/'); slash != std::string::npos)
      tail = rest.substr(slash + 1), rest.resize(slash);
    if (tail == "cancel") {
      if (auto e = only({"POST"})) return *e;
      return Cancel(rest, req, c);
    }
    if (tail == "priority") {
      if (auto e = only({"POST"})) return *e;
      return SetPriority(rest, req, c);
    }
    if (tail == "hold" || tail == "release") {
      if (auto e = only({"POST"})) return *e;
      return Hold(rest, tail == "hold", c);
    }
    // One job: "12", or an array's task "12_3".
    auto ids = Resolve(rest, false);
    if (!ids.ok()) return RefError(ids.status());
    const std::optional<int64_t> id = ids->front();
    if (tail.empty()) {
      if (auto e = only({"GET"})) return *e;
      return GetJob(*id, c);
    }
    if (tail == "logs") {
      if (auto e = only({"GET"})) return *e;
      return Logs(req, *id, c);
    }
    if (tail == "wait") {
      if (auto e = only({"GET"})) return *e;
      return Wait(req, *id, c);
    }
    if (tail == "events") {
      if (auto e = only({"GET"})) return *e;
      auto ev = store_.Events(*id);
      if (!ev.ok()) return Error(500, std::string(ev.status().message()));
      if (ev->empty()) return Error(404, fmt::format("job {}: not found", *id));
      return JsonResponse(200, json{{"events", EventsJson(*ev)}});
    }
  }
  return Error(404, fmt::format("no such endpoint: {} (see /v1/openapi.json)", path));
}

net::HttpResponse Api::Submit(const net::HttpRequest& req, const Caller& c) {
  if (!req.content_type.empty() && req.content_type.rfind("application/json", 0) != 0) {
    return Error(415,
                 fmt::format("expected Content-Type application/json, got {}", req.content_type));
  }
  auto spec = ParseJobSpec(req.body);
  if (!spec.ok()) return Error(400, std::string(spec.status().message()));
  if (absl::Status may = d_.rights().MaySubmit(*spec, c); !may.ok())
    return Error(HttpStatusOf(may), std::string(may.message()));
  absl::Status may =
      d_.rights().MayDependOn(*spec, c, [&](int64_t job) -> std::optional<std::string> {
        auto r = d_.store().Get(job);
        return r.ok() ? std::optional<std::string>(r->owner) : std::nullopt;
      });
  if (!may.ok()) return Error(HttpStatusOf(may), std::string(may.message()));
  auto done = d_.Submit(*std::move(spec), c, req.idempotency_key);
  if (!done.ok()) return Error(HttpStatusOf(done.status()), std::string(done.status().message()));
  json j = JobJson(done->record);
  if (done->repeated) {
    j["repeated"] = true;
    return JsonResponse(200, j);
  }
  if (done->tasks > 0) {
    const int64_t id = done->record.id;
    j["array"] = {{"id", id},
                  {"range", j["spec"].is_object() ? j["spec"].value("array", "") : ""},
                  {"tasks", done->tasks},
                  {"last_id", id + static_cast<int64_t>(done->tasks) - 1}};
  }
  return JsonResponse(201, j);
}

net::HttpResponse Api::Summary() {
  auto jobs = store_.List({}, 0);
  if (!jobs.ok()) return Error(500, std::string(jobs.status().message()));
  auto zero = [] {
    json z = json::object();
    for (const char* s :
         {"queued", "held", "running", "succeeded", "failed", "cancelled", "preempted", "lost"})
      z[s] = 0;
    z["total"] = 0;
    return z;
  };
  json all = zero();
  std::map<std::string, json> users;
  for (const JobRecord& r : *jobs) {
    auto [it, fresh] = users.try_emplace(r.owner, json());
    if (fresh) it->second = zero();
    for (json* c : {&all, &it->second}) {
      json& n = (*c)[std::string(JobStateName(r.state))];
      n = n.get<int64_t>() + 1;
      if (r.state == JobState::kQueued && r.held) (*c)["held"] = (*c)["held"].get<int64_t>() + 1;
      (*c)["total"] = (*c)["total"].get<int64_t>() + 1;
    }
  }
  json by_user = json::array();
  for (auto& [user, counts] : users) {
    counts["user"] = user;
    by_user.push_back(std::move(counts));
  }
  return JsonResponse(200, json{{"jobs", all}, {"users", by_user}});
}

std::pair<double, bool> Api::AuthFailed(const std::string& peer) {
  // The address without its port ("[::1]:5000", "10.0.0.7:5000").
  const std::string address = peer.substr(0, peer.rfind(':'));
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard lock(auth_mu_);
  if (auth_failures_.size() > 10000) {  // many addresses: those quiet for a minute go
    std::erase_if(auth_failures_, [&](const auto& e) { return now - e.second.window_start > 60; });
  }
  AuthFailures& f = auth_failures_[address];
  if (now - f.window_start > 60) f.count = 0, f.window_start = now;
  ++f.count;
  if (now - f.logged >= 10) {
    f.logged = now;
    spdlog::warn("TCP client {}: unknown bearer token ({} from this address in the last minute{})",
                 LogText(address, 64), f.count,
                 f.count > kAuthFailuresLimit ? "; answered 429" : "");
  }
  const double delay = std::min(1.0, 0.02 * static_cast<double>(1 << std::min(f.count / 5, 6)));
  return {delay, f.count > kAuthFailuresLimit};
}

net::HttpResponse Api::ListJobs(const net::HttpRequest& req, const Caller& c) {
  std::vector<JobState> states;
  // "held", as `tessera ls` shows it: queued jobs that are held (with "queued": all queued ones).
  bool held_only = false, queued_too = false;
  if (auto it = req.query.find("state"); it != req.query.end() && !it->second.empty()) {
    std::string_view rest = it->second;
    while (!rest.empty()) {
      size_t c = rest.find(',');
      std::string_view name = rest.substr(0, c);
      auto s = name == "held" ? std::optional<JobState>(JobState::kQueued) : ParseJobState(name);
      if (!s) {
        return Error(400, fmt::format("state: unknown state '{}' (queued, held, running, "
                                      "succeeded, failed, cancelled, preempted, lost)",
                                      name));
      }
      held_only = held_only || name == "held";
      queued_too = queued_too || name == "queued";
      states.push_back(*s);
      if (c == std::string_view::npos) break;
      rest = rest.substr(c + 1);
    }
  }
  // Paged, newest first from the store, so that no request holds more than a page: `limit` jobs
  // (default kListDefault, at most kListMax) and about kListBytes of their specs; `before` pages
  // on (the answer's "next_before" when "more" is true).
  size_t limit = kListDefault;
  if (auto it = req.query.find("limit"); it != req.query.end()) {
    auto v = ParseId(it->second);
    if (!v || *v > static_cast<int64_t>(kListMax))
      return Error(400, fmt::format("limit: expected 1..{}, got '{}' (page on with before=)",
                                    kListMax, it->second));
    limit = static_cast<size_t>(*v);
  }
  int64_t before = 0;
  if (auto it = req.query.find("before"); it != req.query.end()) {
    auto v = ParseId(it->second);
    if (!v) return Error(400, fmt::format("before: expected a job id, got '{}'", it->second));
    before = *v;
  }
  // arrays=fold: an array is one entry (its first task) with its tasks counted by state.
  bool fold = false;
  if (auto it = req.query.find("arrays"); it != req.query.end()) {
    if (it->second != "fold" && it->second != "expand")
      return Error(400, fmt::format("arrays: expected fold or expand, got '{}'", it->second));
    fold = it->second == "fold";
  }
  for (const auto& [k, v] : req.query) {
    if (k != "state" && k != "limit" && k != "user" && k != "arrays" && k != "before" &&
        k != "env" && k != "efficiency")
      return Error(400, fmt::format("unknown query parameter '{}'", k));
  }
  // env=false: without each job's stored environment (most of a listing's bytes; a table shows
  // none of it).
  bool with_env = true;
  if (auto it = req.query.find("env"); it != req.query.end()) {
    if (it->second != "true" && it->second != "false")
      return Error(400, fmt::format("env: expected true or false, got '{}'", it->second));
    with_env = it->second == "true";
  }
  // efficiency=true: each job that started with its `efficiency`, as GET /v1/jobs/N gives it
  // (`tessera acct --jobs` ranks jobs by the GPU time they held idle).
  bool with_efficiency = false;
  if (auto it = req.query.find("efficiency"); it != req.query.end()) {
    if (it->second != "true" && it->second != "false")
      return Error(400, fmt::format("efficiency: expected true or false, got '{}'", it->second));
    with_efficiency = it->second == "true";
  }
  const std::string only_user = req.query.contains("user") ? req.query.at("user") : "";
  std::vector<JobRecord> page;
  std::set<int64_t> arrays;
  size_t bytes = 0;
  bool more = false;
  absl::Status listed = store_.ForEachNewest(states, only_user, before, [&](JobRecord&& r) {
    if (held_only && !queued_too && r.state == JobState::kQueued && !r.held) return true;
    if (fold && r.array_id != 0 && !arrays.insert(r.array_id).second) return true;
    if (page.size() >= limit || bytes >= kListBytes) {
      more = true;
      return false;
    }
    bytes += r.spec_json.size() + 512;
    page.push_back(std::move(r));
    return true;
  });
  if (!listed.ok()) return Error(500, std::string(listed.message()));
  // A folded array's entry is its first task (its id is the array's), wherever its newest task
  // fell in the page; newest last.
  for (JobRecord& r : page) {
    if (!fold || r.array_id == 0 || r.id == r.array_id) continue;
    if (auto first = store_.Get(r.array_id); first.ok()) r = *std::move(first);
  }
  std::sort(page.begin(), page.end(),
            [](const JobRecord& a, const JobRecord& b) { return a.id < b.id; });
  json out = json::array();
  const auto gpu_memory_mib = GpuMemoryMib();
  const double now = d_.Now();
  for (const JobRecord& r : page) {
    json j = JobJson(r);
    const Dispatcher::Live live = d_.LiveOf(r.id);
    if (live.queued) j["waiting"] = live.waiting;
    if (r.state == JobState::kQueued || r.state == JobState::kRunning) AddExpectations(j, live);
    if (fold && r.array_id != 0) {
      j["array"] =
          ArraySummary(r.array_id, j["spec"].is_object() ? j["spec"].value("array", "") : "");
      j["array"]["folded"] = true;
      const json& c = j["array"]["states"];
      // The array's state: running while a task runs, queued while one waits, else how it ended.
      j["state"] = "succeeded";
      for (const char* state : {"running", "queued", "preempted", "lost", "failed", "cancelled"}) {
        if (c.contains(state)) {
          j["state"] = state;
          break;
        }
      }
    }
    if (!c.admin && r.owner != c.user) HideDetails(j);
    if (!with_env && j["spec"].is_object()) j["spec"].erase("env");
    if (with_efficiency && !(fold && r.array_id != 0)) {
      if (json e = EfficiencyOf(j, now, gpu_memory_mib); !e.is_null())
        j["efficiency"] = std::move(e);
    }
    out.push_back(std::move(j));
  }
  json answer = {{"jobs", std::move(out)}};
  if (more && !page.empty()) answer["more"] = true, answer["next_before"] = page.front().id;
  return JsonResponse(200, answer);
}

net::HttpResponse Api::GetJob(int64_t id, const Caller& c) {
  std::vector<JobEvent> events;
  auto r = store_.Get(id, &events);
  if (!r.ok()) return StatusError(r.status());
  json j = JobJson(*r);
  if (!c.admin && r->owner != c.user) HideDetails(j);
  j["events"] = EventsJson(events);
  if (r->array_id != 0)
    j["array"] =
        ArraySummary(r->array_id, j["spec"].is_object() ? j["spec"].value("array", "") : "");
  const Dispatcher::Live live = d_.LiveOf(id);
  if (live.queued) j["waiting"] = live.waiting;
  AddExpectations(j, live);
  if (live.pid) j["pid"] = *live.pid;
  if (!live.stopping.empty()) j["stopping"] = live.stopping;
  if (json e = EfficiencyOf(j, d_.Now(), GpuMemoryMib()); !e.is_null())
    j["efficiency"] = std::move(e);
  return JsonResponse(200, j);
}

absl::StatusOr<Api::Owned> Api::OwnedJobs(const std::string& ref, bool whole_array, const Caller& c,
                                          const std::string& what) {
  auto ids = Resolve(ref, whole_array);
  if (!ids.ok()) return ids.status();
  auto r = store_.Get(ids->front());
  if (!r.ok()) {
    return HttpError(r.status().code() == absl::StatusCode::kNotFound ? 404 : 500,
                     std::string(r.status().message()));
  }
  if (r->owner != c.user && !c.admin) {
    return HttpError(403, fmt::format("job {} belongs to {}; only its owner or an admin may {}",
                                      ref, r->owner, what));
  }
  return Owned{*std::move(ids), *std::move(r)};
}

net::HttpResponse Api::Cancel(const std::string& ref, const net::HttpRequest& req,
                              const Caller& c) {
  // ?force=true: SIGKILL now, for a job that ignores SIGTERM (the owner's or an admin's right, as
  // a cancel is).
  bool force = false;
  if (auto f = req.query.find("force"); f != req.query.end()) {
    if (f->second != "true" && f->second != "false" && f->second != "1" && f->second != "0")
      return Error(400, fmt::format("force: expected true or false, got '{}'", f->second));
    force = f->second == "true" || f->second == "1";
  }
  auto o = OwnedJobs(ref, true, c, force ? "force-cancel it" : "cancel it");
  if (!o.ok()) return Error(HttpStatusOf(o.status()), std::string(o.status().message()));
  if (absl::Status st = d_.Cancel(o->ids, ref, o->first, c.user, force); !st.ok())
    return Error(HttpStatusOf(st), std::string(st.message()));
  return GetJob(o->first.id, c);
}

net::HttpResponse Api::Hold(const std::string& ref, bool hold, const Caller& c) {
  auto o = OwnedJobs(ref, true, c, hold ? "hold it" : "release it");
  if (!o.ok()) return Error(HttpStatusOf(o.status()), std::string(o.status().message()));
  if (absl::Status st = d_.Hold(o->ids, ref, o->first, hold, c.user); !st.ok())
    return Error(HttpStatusOf(st), std::string(st.message()));
  return GetJob(o->first.id, c);
}

absl::StatusOr<std::vector<int64_t>> Api::Resolve(std::string_view ref, bool whole_array) {
  const size_t us = ref.find('_');
  const std::optional<int64_t> job = ParseId(ref.substr(0, us));
  const std::optional<int> index =
      us == std::string_view::npos ? std::nullopt : ParseIndex(ref.substr(us + 1));
  if (!job || (us != std::string_view::npos && !index)) {
    return absl::InvalidArgumentError(fmt::format(
        "job id '{}' is not a job (a positive whole number) or an array's task (12_3)", ref));
  }
  if (index) {
    auto t = store_.TaskId(*job, *index);
    if (!t.ok()) return t.status();
    return std::vector<int64_t>{*t};
  }
  if (!whole_array) return std::vector<int64_t>{*job};
  auto r = store_.Get(*job);
  if (!r.ok()) return r.status();
  if (r->array_id != r->id) return std::vector<int64_t>{*job};
  auto tasks = store_.Tasks(*job);
  if (!tasks.ok()) return tasks.status();
  std::vector<int64_t> ids;
  for (const Store::TaskState& t : *tasks) ids.push_back(t.id);
  return ids;
}

json Api::ArraySummary(int64_t array_id, const std::string& range) {
  json j = {{"id", array_id}, {"range", range}};
  auto tasks = store_.Tasks(array_id);
  if (!tasks.ok()) return j;
  json states = json::object();
  int64_t held = 0;
  for (const Store::TaskState& t : *tasks) {
    json& c = states[std::string(JobStateName(t.state))];
    c = c.is_number() ? c.get<int64_t>() + 1 : 1;
    if (t.state == JobState::kQueued && t.held) ++held;
  }
  j["tasks"] = tasks->size();
  j["states"] = states;
  j["held"] = held;
  return j;
}

net::HttpResponse Api::Logs(const net::HttpRequest& req, int64_t id, const Caller& c) {
  auto r = store_.Get(id);
  if (!r.ok()) return StatusError(r.status());
  if (!c.admin && r->owner != c.user) {
    return Error(
        403, fmt::format("job {} belongs to {}; its logs are shown to its owner and admins only",
                         id, r->owner));
  }
  std::string stream = req.query.contains("stream") ? req.query.at("stream") : "stdout";
  if (stream != "stdout" && stream != "stderr")
    return Error(400, "stream: expected stdout or stderr, got '" + stream + "'");
  // A job of several processes: task 0's logs are the job's, the others' their own.
  int task = 0;
  auto spec = ParseJobSpec(r->spec_json);
  if (auto it = req.query.find("task"); it != req.query.end()) {
    const int n = spec.ok() ? spec->Tasks() : 1;
    auto v = ParseIndex(it->second);
    if (!v || *v >= n) {
      return Error(400, fmt::format("task: job {} has {} task(s), 0..{}; got '{}'", id, n, n - 1,
                                    it->second));
    }
    task = *v;
  }
  int64_t offset = 0;
  if (auto it = req.query.find("offset"); it != req.query.end() && it->second != "0") {
    auto v = ParseId(it->second);
    if (!v) return Error(400, fmt::format("offset: expected a byte offset, got '{}'", it->second));
    offset = *v;
  }
  const size_t kMax = 1 << 20;
  std::string data;
  // Output the job sent to a file of its user's (--stdout/--stderr) is read from there - only a
  // regular file its owner owns, not through a symbolic link: whoever may read this job's logs
  // learns nothing its owner could not read.
  const LogFile file = LogFileOf(*r, spec.ok() ? &*spec : nullptr, task, stream == "stderr");
  std::string file_error;
  int fd = -1;
  if (file.user) {
    fd = open(file.path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    struct stat st {};
    if (fd < 0) {
      file_error = errno == ENOENT  ? "not written yet"
                   : errno == ELOOP ? "a symbolic link; not shown"
                                    : strerror(errno);
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != r->owner_uid) {
      file_error = fmt::format("not a regular file of {}'s; not shown", r->owner);
      close(fd);
      fd = -1;
    }
  } else {
    fd = open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd >= 0) {
    data.resize(kMax);
    const ssize_t n = pread(fd, data.data(), kMax, offset);
    data.resize(static_cast<size_t>(std::max<ssize_t>(0, n)));
    close(fd);
  }
  json out{{"data", data},
           {"offset", offset},
           {"next_offset", offset + static_cast<int64_t>(data.size())},
           {"ended", IsTerminal(r->state)},
           {"state", JobStateName(r->state)}};
  if (file.user) out["file"] = file.path;
  if (!file_error.empty()) out["file_error"] = file_error;
  return JsonResponse(200, out);
}

json Api::Info() {
  const Dispatcher::Facts f = d_.Describe();
  const core::NodeInventory& inv = d_.inventory();
  json j;
  j["version"] = PROJECT_VERSION_STRING;
  j["hostname"] = f.hostname;
  j["simulated"] = inv.simulated;
  j["source"] = inv.source;
  j["fallback_reason"] = d_.fallback_reason();
  j["gpus"] = inv.gpus.size();
  j["policy"] = config_.policy;
  j["confinement"] = f.confinement;
  j["arbiter"] = {{"file", f.arbiter_file}, {"access", f.arbiter_access}};
  if (f.containers) {
    j["containers"] = {{"available", true},
                       {"runtime", f.containers->version},
                       {"podman", f.containers->podman},
                       {"cdi_spec", f.cdi_spec},
                       {"cdi_kind", devices::kCdiKind}};
  } else {
    j["containers"] = {{"available", false}, {"reason", f.containers_off}};
  }
  j["queued"] = f.queued;
  j["running"] = f.running;
  return j;
}

net::HttpResponse Api::Gpus() {
  const core::NodeInventory& inventory = d_.inventory();
  const std::vector<Dispatcher::GpuState> states = d_.Gpus();
  json out = json::array();
  for (size_t g = 0; g < inventory.gpus.size() && g < states.size(); ++g) {
    const core::Gpu& gpu = inventory.gpus[g];
    const Dispatcher::GpuState& s = states[g];
    out.push_back({{"index", g},
                   {"uuid", gpu.uuid},
                   {"model", gpu.model},
                   {"memory_bytes", gpu.memory_bytes.value_or(0)},
                   {"healthy", s.healthy},
                   {"health_reason", s.reason},
                   {"allocated_milli", s.milli},
                   {"allocated_memory_mib", s.memory_mib},
                   {"utilization", OrNull(s.telemetry.utilization)},
                   {"memory_utilization", OrNull(s.telemetry.memory_utilization)},
                   {"memory_used_bytes", OrNull(s.telemetry.memory_used_bytes)},
                   {"temperature_celsius", OrNull(s.telemetry.temperature_celsius)},
                   {"power_watts", OrNull(s.telemetry.power_watts)},
                   {"numa_node", OrNull(gpu.numa_node)},
                   {"sharing", core::GpuSharingName(s.sharing)},
                   {"jobs", s.jobs}});
    if (s.mps) {
      out.back()["mps"] = {{"daemon_up", s.mps->up},
                           {"reason", s.mps->reason},
                           {"starts", s.mps->starts},
                           {"deaths", s.mps->deaths},
                           {"server_faults", s.mps->server_faults}};
    }
  }
  // The links between GPUs: NVLink where there is some, else the PCIe level (nvidia-smi's codes).
  json links = json::array();
  const core::Topology& topo = inventory.topology;
  for (int a = 0; a < topo.size(); ++a) {
    for (int b = a + 1; b < topo.size(); ++b) {
      const core::GpuLink& l = topo.link(a, b);
      links.push_back({{"a", a},
                       {"b", b},
                       {"label", core::LinkLabel(l)},
                       {"nvlinks", l.nvlinks},
                       {"nvswitch", l.via_nvswitch}});
    }
  }
  return JsonResponse(200, json{{"simulated", inventory.simulated},
                                {"source", inventory.source},
                                {"gpus", out},
                                {"links", links}});
}

std::string Api::PrimaryGroup(uint32_t uid) {
  std::lock_guard lock(groups_mu_);
  if (auto it = primary_group_.find(uid); it != primary_group_.end()) return it->second;
  std::string name = fmt::format("uid:{}", uid);
  passwd pw;
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found) {
    group gr;
    group* g = nullptr;
    std::vector<char> gbuf(16384);
    name = getgrgid_r(pw.pw_gid, &gr, gbuf.data(), gbuf.size(), &g) == 0 && g
               ? std::string(gr.gr_name)
               : fmt::format("gid:{}", pw.pw_gid);
  }
  return primary_group_[uid] = name;
}

absl::StatusOr<AcctReport> Api::Accounting(double since, double until,
                                           const std::string& only_user) {
  auto jobs = AcctJobs(store_, since, until);
  if (!jobs.ok()) return jobs.status();
  if (!only_user.empty()) {
    std::erase_if(*jobs, [&](const AcctJob& j) { return j.owner != only_user; });
  }
  AcctOptions o;
  o.since = since;
  o.until = until;
  o.group_of = [this](uint32_t uid) { return PrimaryGroup(uid); };
  o.gpu_memory_mib = GpuMemoryMib();
  return Account(*jobs, o);
}

std::function<int64_t(int gpu)> Api::GpuMemoryMib() const {
  return [this](int g) -> int64_t {
    const core::NodeInventory& inventory = d_.inventory();
    if (g < 0 || static_cast<size_t>(g) >= inventory.gpus.size()) return 0;
    return static_cast<int64_t>(inventory.gpus[g].memory_bytes.value_or(0) >> 20);
  };
}

net::HttpResponse Api::Acct(const net::HttpRequest& req, const Caller& c) {
  const std::string& user = c.user;
  const bool admin = c.admin;
  const double now = d_.Now();
  double since = now - 7 * 86400, until = now;
  for (const auto& [k, v] : req.query) {
    if (k != "since" && k != "until" && k != "user")
      return Error(400, fmt::format("unknown query parameter '{}'", k));
    if (k == "user") continue;
    const std::optional<double> t = ParseEpochSeconds(v);
    if (!t) return Error(400, fmt::format("{}: expected seconds since the epoch, got '{}'", k, v));
    (k == "since" ? since : until) = *t;
  }
  if (until < since)
    return Error(400, fmt::format("until ({}) is before since ({})", until, since));
  // Users see their own work; admins anyone's (all, or ?user=).
  std::string only = admin ? "" : user;
  if (auto it = req.query.find("user"); it != req.query.end() && !it->second.empty()) {
    if (!admin && it->second != user) {
      return Error(403,
                   fmt::format("accounting of {} is shown to them and admins only", it->second));
    }
    only = it->second;
  }
  auto report = Accounting(since, std::min(until, now), only);
  if (!report.ok()) return Error(500, std::string(report.status().message()));
  json j = AcctJson(*report);
  j["until"] = until;
  j["scope"] = only.empty() ? "every user's jobs" : only + "'s jobs";
  return JsonResponse(200, j);
}

std::string Api::Metrics() {
  ServerMetricsSnapshot snap = d_.MetricsSnapshot();
  // The accounting totals read every job's record (0.24 s at 30,000 jobs): kept fresh by the
  // refresher (StartMetricsRefresher), so a scrape only reads them; without it, computed at most
  // every kMetricsAcctMaxAgeS by one scrape while the others get the last ones (8 scrapers each
  // recomputing them delayed submits to 9 s).
  const double now = d_.Now();
  bool refresh = false;
  {
    std::lock_guard lock(metrics_mu_);
    scraped_ = true;
    if (acct_cache_ && now - acct_cached_at_ < kMetricsAcctMaxAgeS) {
      snap.acct = *acct_cache_;
    } else if (!acct_refreshing_) {
      acct_refreshing_ = refresh = true;
    } else if (acct_cache_) {
      snap.acct = *acct_cache_;
    }
  }
  if (refresh) {
    auto all = Accounting(0, now, "");
    std::lock_guard lock(metrics_mu_);
    acct_refreshing_ = false;
    ++acct_on_request_;
    if (all.ok()) {
      acct_cache_ = *all;
      acct_cached_at_ = now;
      snap.acct = *std::move(all);
    }
  } else if (!snap.acct.has_value()) {
    // The first scrape while another computes them: they are computed here too.
    if (auto all = Accounting(0, now, ""); all.ok()) snap.acct = std::move(*all);
    std::lock_guard lock(metrics_mu_);
    ++acct_on_request_;
  }
  {
    std::lock_guard lock(metrics_mu_);
    snap.acct_on_request = acct_on_request_;
    snap.acct_refreshed = acct_refreshed_;
    snap.acct_age_s = acct_cache_ ? now - acct_cached_at_ : -1;
  }
  return RenderServerMetrics(snap);
}

void Api::AddExpectations(json& j, const Dispatcher::Live& l) {
  if (!l.known) return;
  if (l.queued) {
    // null: no reservation, or one whose start is unknown ("reserved": true says which).
    j["expected_start"] = l.expected_start ? json(*l.expected_start) : json();
    if (l.reserved) j["reserved"] = true;
  }
  const sched::Prediction& p = l.prediction;
  j["expected_duration_s"] = p.seconds > 0 ? json(p.seconds) : json();
  j["prediction"] = p.basis;
  if (p.util_samples > 0) {
    j["expected_gpu_utilization_pct"] = std::lround(p.util_pct);
    j["utilization_prediction"] = p.util_basis;
  }
  if (p.sharing_slowdown > 1) {
    j["sharing_slowdown"] = std::round(p.sharing_slowdown * 100) / 100;
    j["sharing_prediction"] = p.sharing_basis;
  }
  if (l.expected_end) j["expected_end"] = *l.expected_end;
}

}  // namespace tessera::server
