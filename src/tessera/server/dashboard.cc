// The server's side of the dashboard (docs/dashboard.md): the event stream that pushes changes to
// open pages, the machine's history that their charts draw, and the embedded pages themselves.

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <map>
#include <tuple>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/devices/simulated_source.h"
#include "tessera/sched/cycle.h"
#include "tessera/sched/scheduler.h"
#include "tessera/server/api_response.h"
#include "tessera/server/server.h"
#include "tessera/server/web_assets.h"

namespace tessera::server {

using nlohmann::json;

namespace {

// A stream with nothing to say writes a comment this often: proxies keep it open, and a client
// that went away is noticed.
constexpr double kKeepAliveS = 15;
// Job events read from the store in one go, and at most replayed to a client that comes back.
constexpr int kEventBatch = 500;
constexpr int64_t kMaxReplay = 5000;

// A whole number 0..10^18 (an event number, a GPU index); nullopt for anything else.
std::optional<int64_t> ParseCount(std::string_view s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string SseEvent(std::string_view event, const std::string& data, int64_t id = 0) {
  return id > 0 ? fmt::format("id: {}\nevent: {}\ndata: {}\n\n", id, event, data)
                : fmt::format("event: {}\ndata: {}\n\n", event, data);
}

}  // namespace

void Server::Feed::Bump() {
  {
    std::lock_guard lock(mu_);
    ++version_;
  }
  cv_.notify_all();
}

bool Server::Feed::Wait(uint64_t* seen, double timeout_s) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
               [&] { return closed_ || version_ != *seen; });
  *seen = version_;
  return !closed_;
}

bool Server::Feed::SleepUntil(std::chrono::steady_clock::time_point t) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, t, [&] { return closed_; });
  return !closed_;
}

void Server::Feed::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void Server::StartHistory(bool thread) {
  store_->set_on_change([this] { feed_.Bump(); });
  if (!thread) return;
  sampler_ = std::thread([this] {
    auto next = std::chrono::steady_clock::now();
    do {
      TakeSample();
      next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(config_.history_interval_s));
    } while (feed_.SleepUntil(next));  // the interval, or until the server stops
  });
}

std::string Server::TakeSample() {
  const double now = Now();
  const std::vector<devices::GpuTelemetry> telemetry = Telemetry();
  // The fractional jobs' own files (the arbiter's GPU time, their regions' peaks), read without
  // the lock: for their history.
  std::vector<std::tuple<int64_t, int, std::string>> share_jobs;  // id, GPU, region
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, r] : running_) {
      if (!r.region.empty() && !r.gpus.empty()) share_jobs.emplace_back(id, r.gpus[0], r.region);
    }
  }
  std::map<int64_t, ShareReading> shares;
  for (const auto& [id, gpu, region] : share_jobs) {
    shares[id] = {ArbiterBusyMicros(id, gpu), ReadRegionMemory(region).peak};
  }
  json util = json::array(), mem = json::array(), alloc = json::array(), alloc_mem = json::array();
  int busy = 0, healthy = 0;
  double allocated = 0;
  size_t queued = 0, running = 0;
  {
    std::lock_guard lock(mu_);
    MeasureRunning(telemetry, shares);
    const auto& state = scheduler_->state();
    for (size_t g = 0; g < inventory_.gpus.size(); ++g) {
      const auto& use = state.gpu_use(0, static_cast<int>(g));
      alloc.push_back(static_cast<double>(use.milli) / core::kMilliPerGpu);
      alloc_mem.push_back(static_cast<uint64_t>(use.memory_mib) << 20);
      busy += use.milli > 0 || use.memory_mib > 0;
      allocated += static_cast<double>(use.milli) / core::kMilliPerGpu;
      healthy += gpu_healthy_[g] ? 1 : 0;
    }
    queued = queued_.size();
    running = running_.size();
  }
  for (const devices::GpuTelemetry& t : telemetry) {
    util.push_back(OrNull(t.utilization));
    mem.push_back(OrNull(t.memory_used_bytes));
  }
  const json j = {
      {"at", now},          {"queued", queued},       {"running", running}, {"busy", busy},
      {"healthy", healthy}, {"allocated", allocated}, {"util", util},       {"mem", mem},
      {"alloc", alloc},     {"alloc_mem", alloc_mem}};
  std::string data = j.dump();
  if (absl::Status st = store_->AddSample({now, data}, now - config_.history_window_s); !st.ok()) {
    spdlog::warn("history: sample not stored: {}", std::string(st.message()));
  }
  {
    std::lock_guard lock(history_mu_);
    last_sample_at_ = now;
    ++samples_taken_;
  }
  feed_.Bump();
  return data;
}

HttpResponse Server::History(const HttpRequest& req) {
  const double now = Now();
  double since = now - config_.history_window_s;
  if (auto it = req.query.find("since"); it != req.query.end()) {
    const std::optional<double> v = ParseEpochSeconds(it->second);
    if (!v) {
      return Error(400,
                   fmt::format("since: expected seconds since the epoch, got '{}'", it->second));
    }
    since = std::max(since, *v);
  }
  auto samples = store_->Samples(since);
  if (!samples.ok()) return Error(500, std::string(samples.status().message()));
  // The stored samples are JSON already: joined, not parsed again.
  std::string body =
      fmt::format(R"({{"interval_s":{},"window_s":{},"gpus":{},"samples":[)",
                  config_.history_interval_s, config_.history_window_s, inventory_.gpus.size());
  for (size_t i = 0; i < samples->size(); ++i) {
    if (i > 0) body += ',';
    body += (*samples)[i].data;
  }
  body += "]}";
  return HttpResponse{200, "application/json", std::move(body)};
}

HttpResponse Server::Stream(const HttpRequest& req, const std::string& user, bool admin) {
  // Where to start: after the event the client saw last (its Last-Event-ID on a reconnect, or
  // ?after=), else from now.
  std::string from = req.last_event_id;
  if (auto it = req.query.find("after"); from.empty() && it != req.query.end()) from = it->second;
  int64_t cursor = 0;
  if (!from.empty()) {
    const std::optional<int64_t> n = ParseCount(from);
    if (!n) {
      return Error(400,
                   fmt::format("Last-Event-ID/after: expected an event number, got '{}'", from));
    }
    cursor = *n;
  } else {
    auto last = store_->LastEventSeq();
    if (!last.ok()) return Error(500, std::string(last.status().message()));
    cursor = *last;
  }
  HttpResponse r;
  r.content_type = "text/event-stream";
  r.headers["Cache-Control"] = "no-store";
  r.headers["X-Accel-Buffering"] = "no";  // a proxy in front must not hold the events back
  r.stream = [this, cursor, user, admin](const StreamWrite& write) mutable {
    std::vector<bool> healthy_sent;
    {
      std::lock_guard lock(mu_);
      healthy_sent = gpu_healthy_;
    }
    // Samples: those after the last one taken before this stream began (or, when none was, from
    // now on); `samples_seen` tells that a new one was taken.
    double sample_since;
    uint64_t samples_seen;
    {
      std::lock_guard lock(history_mu_);
      sample_since = last_sample_at_ >= 0 ? std::nextafter(last_sample_at_, HUGE_VAL)
                                          : std::nextafter(Now(), -HUGE_VAL);
      samples_seen = samples_taken_;
    }
    spdlog::debug("event stream for {} from event {}", user, cursor);
    const json hello = {{"seq", cursor},
                        {"user", user},
                        {"admin", admin},
                        {"interval_s", config_.history_interval_s}};
    if (!write("retry: 2000\n" + SseEvent("hello", hello.dump()))) return;
    // A client that missed more than kMaxReplay events reads everything again (it does on hello
    // anyway) rather than be sent each of them: it is told so, and goes on from now.
    if (auto last = store_->LastEventSeq(); last.ok() && *last - cursor > kMaxReplay) {
      if (!write(SseEvent("reset", json{{"seq", *last}, {"missed", *last - cursor}}.dump(), *last)))
        return;
      cursor = *last;
    }
    uint64_t seen = 0;
    auto said = std::chrono::steady_clock::now();
    for (;;) {
      const bool open = feed_.Wait(&seen, kKeepAliveS);
      if (!open) return;
      std::string out;
      // Jobs' events, in the store's order: each names its event number, the resume point.
      for (;;) {
        auto events = store_->EventsAfter(cursor, kEventBatch);
        if (!events.ok()) {
          spdlog::warn("event stream: {}", std::string(events.status().message()));
          break;
        }
        for (const JobEvent& e : *events) {
          const json j = {{"job", e.job_id},
                          {"state", JobStateName(e.state)},
                          {"reason", e.reason},
                          {"at", e.at}};
          out += SseEvent("job", j.dump(-1, ' ', false, json::error_handler_t::replace), e.seq);
          cursor = e.seq;
        }
        if (events->size() < static_cast<size_t>(kEventBatch)) break;
        if (!write(out)) return;
        out.clear();
      }
      // GPUs whose health changed.
      {
        std::lock_guard lock(mu_);
        for (size_t g = 0; g < gpu_healthy_.size() && g < healthy_sent.size(); ++g) {
          if (gpu_healthy_[g] == healthy_sent[g]) continue;
          healthy_sent[g] = gpu_healthy_[g];
          out += SseEvent(
              "gpu",
              json{{"index", g}, {"healthy", gpu_healthy_[g]}, {"reason", gpu_health_reason_[g]}}
                  .dump());
        }
      }
      // New history samples.
      uint64_t taken;
      {
        std::lock_guard lock(history_mu_);
        taken = samples_taken_;
      }
      if (taken != samples_seen) {
        samples_seen = taken;
        if (auto samples = store_->Samples(sample_since); samples.ok()) {
          for (const Sample& s : *samples) {
            out += SseEvent("sample", s.data);
            sample_since = std::nextafter(s.at, HUGE_VAL);
          }
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (out.empty() && now - said >= std::chrono::duration<double>(kKeepAliveS))
        out = ": keep-alive\n\n";
      if (out.empty()) continue;
      if (!write(out)) return;
      said = now;
    }
  };
  return r;
}

HttpResponse Server::Quotas() {
  auto amount = [](const sched::GpuAmount& a) {
    auto v = [](int64_t x) { return x < 0 ? json(nullptr) : json(x); };  // null: no limit
    return json{{"gpus", v(a.gpus)},
                {"gpu_milli", v(a.gpu_milli)},
                {"gpu_memory_mib", v(a.gpu_memory_mib)}};
  };
  json out = json::array();
  std::lock_guard lock(mu_);
  const sched::QuotaManager& qm = scheduler_->quotas();
  auto add = [&](const std::string& kind, const std::string& name, const std::string& owner) {
    const sched::OwnerQuota* q = qm.Get(owner);
    if (q == nullptr) return;
    out.push_back({{"kind", kind},
                   {"name", name},
                   {"limit", amount(q->limit)},
                   {"used", amount(qm.Used(owner))},
                   {"borrow", q->borrow},
                   {"cohort", q->cohort}});
  };
  for (const auto& [user, q] : config_.quotas) add("user", user, user);
  for (const auto& [group, q] : config_.group_quotas) add("group", group, "group:" + group);
  return JsonResponse(200, json{{"quotas", out}});
}

HttpResponse Server::SetPriority(const std::string& ref, const HttpRequest& req,
                                 const std::string& user, uint32_t uid, bool admin) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object())
    return Error(400, "expected a JSON object: {\"priority\": N}");
  for (const auto& [k, v] : body.items()) {
    if (k != "priority") return Error(400, fmt::format("{}: unknown field", k));
  }
  if (!body.contains("priority") || !body["priority"].is_number_integer() ||
      body["priority"].get<int64_t>() < -1000 || body["priority"].get<int64_t>() > 1000) {
    return Error(400, "priority: expected a whole number -1000..1000");
  }
  const int priority = body["priority"].get<int>();
  auto ids = Resolve(ref, false);
  if (!ids.ok()) return RefError(ids.status());
  const int64_t id = ids->front();
  auto r = store_->Get(id);
  if (!r.ok()) return StatusError(r.status());
  if (r->owner != user && !admin) {
    return Error(
        403, fmt::format("job {} belongs to {}; only its owner or an admin may change its priority",
                         ref, r->owner));
  }
  if (int ceiling = PriorityCeiling(user, uid, admin); priority > ceiling) {
    return Error(403, fmt::format("priority {} is above {}'s ceiling of {} (priority_ceiling and "
                                  "priority_ceilings in the server's config)",
                                  priority, user, ceiling));
  }
  const double now = Now();
  std::unique_lock lock(mu_);
  // Out of the cycle while the change is stored without mu_; back at its new place after.
  const std::vector<int64_t> change = BeginChange(lock, {id});
  if (change.empty()) {  // not queued (any more: BeginChange may have waited)
    auto now_r = store_->Get(id);
    return Error(409, fmt::format("job {} is {}: only a queued job's priority can change", ref,
                                  JobStateName(now_r.ok() ? now_r->state : r->state)));
  }
  const std::string reason =
      fmt::format("priority {} -> {} by {}", queued_.at(id).priority, priority, user);
  lock.unlock();
  absl::Status st = store_->SetPriority(id, priority, reason, now);
  lock.lock();
  if (auto q = queued_.find(id); st.ok() && q != queued_.end()) {  // nothing takes it meanwhile
    q->second.priority = priority;
    q->second.waiting = "priority changed; not yet considered";
    spdlog::info("job {}: {}", id, reason);
  }
  EndChange(change);
  lock.unlock();
  if (!st.ok()) return Error(500, std::string(st.message()));
  wake_.notify_all();
  return GetJob(id, user, admin);
}

HttpResponse Server::SimulateHealth(const std::string& gpu, const HttpRequest& req, bool admin) {
  if (!admin) return Error(403, "only an admin may make a GPU sick");
  auto* sim = dynamic_cast<devices::SimulatedSource*>(source_.get());
  if (!inventory_.simulated || sim == nullptr)
    return Error(409, "this machine's GPUs are real: only a simulated machine's can be made sick");
  const std::optional<int64_t> n = ParseCount(gpu);
  if (!n || *n >= static_cast<int64_t>(inventory_.gpus.size()))
    return Error(404, fmt::format("gpu {}: no such GPU (0..{})", gpu, inventory_.gpus.size() - 1));
  const int index = static_cast<int>(*n);
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object() || body.size() != 1 ||
      !((body.contains("xid") && body["xid"].is_number_unsigned()) ||
        (body.contains("lost") && body["lost"].is_boolean()))) {
    return Error(400, "expected {\"xid\": N} (an XID error) or {\"lost\": true|false}");
  }
  absl::Status st;
  if (body.contains("xid")) {
    devices::HealthEvent e;
    e.gpu = index;
    e.kind = devices::HealthEvent::Kind::kXid;
    e.xid = body["xid"].get<uint64_t>();
    e.detail = "injected through the API";
    st = sim->Inject(e);
  } else {
    st = sim->SetLost(index, body["lost"].get<bool>());
  }
  if (!st.ok()) return Error(400, std::string(st.message()));
  spdlog::warn("gpu {}: simulated {} (an admin's request)", index, body.dump());
  return JsonResponse(202, json{{"gpu", index}, {"injected", body}});
}

HttpResponse Server::Asset(const std::string& path) const {
  std::string_view name = path == "/" || path == "/ui/" ? "index.html"
                          : path == "/favicon.ico"      ? "icon.svg"
                                                        : path;
  if (name.rfind("/ui/", 0) == 0) name.remove_prefix(4);
  for (const WebAsset& a : WebAssets()) {
    if (a.name != name) continue;
    HttpResponse r{200, std::string(a.content_type), std::string(a.body)};
    // The page's code comes from here only; nothing may frame it; it is checked again on each
    // load (a new server version brings new code).
    r.headers["Content-Security-Policy"] =
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";
    r.headers["X-Content-Type-Options"] = "nosniff";
    r.headers["Referrer-Policy"] = "no-referrer";
    r.headers["Cache-Control"] = "no-cache";
    return r;
  }
  return Error(404, fmt::format("no such page: {}", path));
}

}  // namespace tessera::server
