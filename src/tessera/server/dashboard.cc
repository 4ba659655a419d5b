// The API's side of the dashboard (docs/dashboard.md): the event stream that pushes changes to
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
#include "tessera/server/api.h"
#include "tessera/server/api_response.h"
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

net::HttpResponse Api::History(const net::HttpRequest& req) {
  const double now = d_.Now();
  double since = now - config_.history_window_s;
  if (auto it = req.query.find("since"); it != req.query.end()) {
    const std::optional<double> v = ParseEpochSeconds(it->second);
    if (!v) {
      return Error(400,
                   fmt::format("since: expected seconds since the epoch, got '{}'", it->second));
    }
    since = std::max(since, *v);
  }
  auto samples = store_.Samples(since);
  if (!samples.ok()) return Error(500, std::string(samples.status().message()));
  // The stored samples are JSON already: joined, not parsed again.
  std::string body =
      fmt::format(R"({{"interval_s":{},"window_s":{},"gpus":{},"samples":[)",
                  config_.history_interval_s, config_.history_window_s, d_.inventory().gpus.size());
  for (size_t i = 0; i < samples->size(); ++i) {
    if (i > 0) body += ',';
    body += (*samples)[i].data;
  }
  body += "]}";
  return net::HttpResponse{200, "application/json", std::move(body)};
}

net::HttpResponse Api::Stream(const net::HttpRequest& req, const Caller& caller) {
  const std::string& user = caller.user;
  const bool admin = caller.admin;
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
    auto last = store_.LastEventSeq();
    if (!last.ok()) return Error(500, std::string(last.status().message()));
    cursor = *last;
  }
  net::HttpResponse r;
  r.content_type = "text/event-stream";
  r.headers["Cache-Control"] = "no-store";
  r.headers["X-Accel-Buffering"] = "no";  // a proxy in front must not hold the events back
  r.stream = [this, cursor, user, admin](const net::StreamWrite& write) mutable {
    std::vector<bool> healthy_sent;
    d_.GpuHealth(&healthy_sent, nullptr);
    // Samples: those after the last one taken before this stream began (or, when none was, from
    // now on); `samples_seen` tells that a new one was taken.
    auto [last_sample_at, samples_seen] = d_.Samples();
    double sample_since = last_sample_at >= 0 ? std::nextafter(last_sample_at, HUGE_VAL)
                                              : std::nextafter(d_.Now(), -HUGE_VAL);
    spdlog::debug("event stream for {} from event {}", user, cursor);
    const json hello = {{"seq", cursor},
                        {"user", user},
                        {"admin", admin},
                        {"interval_s", config_.history_interval_s}};
    if (!write("retry: 2000\n" + SseEvent("hello", hello.dump()))) return;
    // A client that missed more than kMaxReplay events reads everything again (it does on hello
    // anyway) rather than be sent each of them: it is told so, and goes on from now.
    if (auto last = store_.LastEventSeq(); last.ok() && *last - cursor > kMaxReplay) {
      if (!write(SseEvent("reset", json{{"seq", *last}, {"missed", *last - cursor}}.dump(), *last)))
        return;
      cursor = *last;
    }
    uint64_t seen = 0;
    auto said = std::chrono::steady_clock::now();
    for (;;) {
      const bool open = d_.feed().Wait(&seen, kKeepAliveS);
      if (!open) return;
      std::string out;
      // Jobs' events, in the store's order: each names its event number, the resume point.
      for (;;) {
        auto events = store_.EventsAfter(cursor, kEventBatch);
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
        std::vector<bool> healthy;
        std::vector<std::string> reasons;
        d_.GpuHealth(&healthy, &reasons);
        for (size_t g = 0; g < healthy.size() && g < healthy_sent.size(); ++g) {
          if (healthy[g] == healthy_sent[g]) continue;
          healthy_sent[g] = healthy[g];
          out += SseEvent(
              "gpu", json{{"index", g}, {"healthy", healthy[g]}, {"reason", reasons[g]}}.dump());
        }
      }
      // New history samples.
      const uint64_t taken = d_.Samples().second;
      if (taken != samples_seen) {
        samples_seen = taken;
        if (auto samples = store_.Samples(sample_since); samples.ok()) {
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

net::HttpResponse Api::Quotas() {
  auto amount = [](const sched::GpuAmount& a) {
    auto v = [](int64_t x) { return x < 0 ? json(nullptr) : json(x); };  // null: no limit
    return json{{"gpus", v(a.gpus)},
                {"gpu_milli", v(a.gpu_milli)},
                {"gpu_memory_mib", v(a.gpu_memory_mib)}};
  };
  json out = json::array();
  for (const Dispatcher::QuotaState& q : d_.Quotas()) {
    out.push_back({{"kind", q.kind},
                   {"name", q.name},
                   {"limit", amount(q.quota.limit)},
                   {"used", amount(q.used)},
                   {"borrow", q.quota.borrow},
                   {"cohort", q.quota.cohort}});
  }
  return JsonResponse(200, json{{"quotas", out}});
}

net::HttpResponse Api::SetPriority(const std::string& ref, const net::HttpRequest& req,
                                   const Caller& c) {
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
  auto o = OwnedJobs(ref, false, c, "change its priority");
  if (!o.ok()) return Error(HttpStatusOf(o.status()), std::string(o.status().message()));
  if (absl::Status may = d_.rights().MaySetPriority(priority, c); !may.ok())
    return Error(HttpStatusOf(may), std::string(may.message()));
  if (absl::Status st = d_.SetPriority(o->first.id, ref, o->first, priority, c); !st.ok())
    return Error(HttpStatusOf(st), std::string(st.message()));
  return GetJob(o->first.id, c);
}

net::HttpResponse Api::SimulateHealth(const std::string& gpu, const net::HttpRequest& req,
                                      const Caller& c) {
  if (!c.admin) return Error(403, "only an admin may make a GPU sick");
  const size_t gpus = d_.inventory().gpus.size();
  const std::optional<int64_t> n = ParseCount(gpu);
  if (d_.inventory().simulated && (!n || *n >= static_cast<int64_t>(gpus)))
    return Error(404, fmt::format("gpu {}: no such GPU (0..{})", gpu, gpus - 1));
  json body = json::parse(req.body, nullptr, false);
  if (d_.inventory().simulated && (body.is_discarded() || !body.is_object() || body.size() != 1 ||
                                   !((body.contains("xid") && body["xid"].is_number_unsigned()) ||
                                     (body.contains("lost") && body["lost"].is_boolean())))) {
    return Error(400, "expected {\"xid\": N} (an XID error) or {\"lost\": true|false}");
  }
  std::optional<uint64_t> xid;
  std::optional<bool> lost;
  if (body.is_object() && body.contains("xid")) xid = body["xid"].get<uint64_t>();
  if (body.is_object() && body.contains("lost")) lost = body["lost"].get<bool>();
  if (absl::Status st = d_.SimulateHealth(n ? static_cast<int>(*n) : -1, xid, lost); !st.ok())
    return Error(HttpStatusOf(st), std::string(st.message()));
  spdlog::warn("gpu {}: simulated {} (an admin's request)", *n, body.dump());
  return JsonResponse(202, json{{"gpu", *n}, {"injected", body}});
}

net::HttpResponse Api::Asset(const std::string& path) const {
  std::string_view name = path == "/" || path == "/ui/" ? "index.html"
                          : path == "/favicon.ico"      ? "icon.svg"
                                                        : path;
  if (name.rfind("/ui/", 0) == 0) name.remove_prefix(4);
  for (const WebAsset& a : WebAssets()) {
    if (a.name != name) continue;
    net::HttpResponse r{200, std::string(a.content_type), std::string(a.body)};
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
