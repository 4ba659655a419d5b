#include "tessera/kube/events.h"

#include <algorithm>
#include <ctime>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/kube/object.h"

namespace tessera::kube {
namespace {

// MicroTime: RFC 3339 with microseconds, UTC.
std::string MicroTime(core::TimePoint t) {
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const std::time_t s = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:06d}Z", buf, static_cast<int>(us % 1000000));
}

// Cut to at most `n` bytes without splitting a UTF-8 sequence.
std::string Cut(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  size_t end = n;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return std::string(s.substr(0, end));
}

}  // namespace

std::string EventRecorder::EventsPath(const std::string& ns) {
  return "/apis/events.k8s.io/v1/namespaces/" + QueryEscape(ns.empty() ? "default" : ns) +
         "/events";
}

nlohmann::json EventRecorder::EventObject(const ObjectRef& regarding, std::string_view type,
                                          std::string_view reason, std::string_view action,
                                          std::string_view note,
                                          const EventRecorderOptions& options,
                                          core::TimePoint now) {
  // client-go's name: the object's name and the time in nanoseconds, in hex (a DNS subdomain:
  // the object's part cut so that the whole stays within 253 characters).
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  const std::string name = fmt::format("{}.{:x}", Cut(regarding.name, 253 - 17), ns);
  nlohmann::json ref = {
      {"apiVersion", regarding.api_version}, {"kind", regarding.kind}, {"name", regarding.name}};
  if (!regarding.ns.empty()) ref["namespace"] = regarding.ns;
  if (!regarding.uid.empty()) ref["uid"] = regarding.uid;
  return {{"apiVersion", "events.k8s.io/v1"},
          {"kind", "Event"},
          {"metadata",
           {{"name", name}, {"namespace", regarding.ns.empty() ? "default" : regarding.ns}}},
          {"eventTime", MicroTime(now)},
          {"reportingController", options.controller},
          {"reportingInstance", Cut(options.instance, 128)},
          {"action", Cut(action, 128)},
          {"reason", Cut(reason, 128)},
          {"regarding", std::move(ref)},
          {"note", Cut(note, 1024)},
          {"type", std::string(type)}};
}

EventRecorder::EventRecorder(Client& client, EventRecorderOptions options, const core::Clock& clock)
    : client_(client), options_(std::move(options)), clock_(clock) {
  thread_ = std::thread([this] { Run(); });
}

EventRecorder::~EventRecorder() {
  {
    core::MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void EventRecorder::Enqueue(Post p) {
  if (queue_.size() >= options_.max_queued) {
    ++stats_.dropped;
    return;
  }
  queue_.push_back(std::move(p));
  cv_.notify_all();
}

void EventRecorder::Record(const ObjectRef& regarding, std::string_view type,
                           std::string_view reason, std::string_view action,
                           std::string_view note) {
  const core::TimePoint now = clock_.Now();
  const double t = core::Seconds(now);
  core::MutexLock lock(mu_);
  auto key = std::make_tuple(regarding.ns, regarding.uid.empty() ? regarding.name : regarding.uid,
                             std::string(reason));
  auto it = seen_.find(key);
  if (it == seen_.end()) {
    if (seen_.size() >= options_.max_tracked) {
      // Forget the pair seen longest ago.
      auto oldest = std::min_element(seen_.begin(), seen_.end(), [](const auto& a, const auto& b) {
        return a.second.last_seen < b.second.last_seen;
      });
      seen_.erase(oldest);
    }
    Seen& s = seen_[key];
    s.count = 1;
    s.last_posted = s.last_seen = t;
    Enqueue({EventsPath(regarding.ns),
             EventObject(regarding, type, reason, action, note, options_, now), false, key});
    return;
  }
  Seen& s = it->second;
  ++s.count;
  s.last_seen = t;
  if (t - s.last_posted < options_.repeat_interval_s ||
      (options_.patch_series && s.event_name.empty())) {
    ++stats_.counted;  // within the interval, or the first still being posted
    return;
  }
  s.last_posted = t;
  if (!options_.patch_series) {
    Enqueue({EventsPath(regarding.ns),
             EventObject(regarding, type, reason, action, note, options_, now), false, key});
    return;
  }
  Enqueue({EventsPath(s.event_ns) + "/" + QueryEscape(s.event_name),
           {{"series", {{"count", s.count}, {"lastObservedTime", MicroTime(now)}}}},
           true,
           key});
}

void EventRecorder::Run() {
  core::MutexLock lock(mu_);
  while (true) {
    lock.Wait(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Post p = std::move(queue_.front());
    queue_.pop_front();
    ++in_flight_;
    mu_.unlock();
    auto r = p.patch ? client_.MergePatch(p.path, p.body) : client_.Create(p.path, p.body);
    mu_.lock();
    --in_flight_;
    if (r.ok()) {
      ++(p.patch ? stats_.patched : stats_.created);
      if (auto it = seen_.find(p.key); it != seen_.end() && !p.patch) {
        it->second.event_ns = StringAt(*r, {"metadata", "namespace"});
        it->second.event_name = StringAt(*r, {"metadata", "name"});
      }
    } else {
      ++stats_.failed;
      // The event was removed (events live an hour): the next repeat creates a new one.
      if (p.patch && HttpStatusOf(r.status()) == 404) seen_.erase(p.key);
      spdlog::debug("event for {}: {}", p.path, std::string(r.status().message()));
    }
    cv_.notify_all();
  }
}

EventRecorder::Stats EventRecorder::stats() const {
  core::MutexLock lock(mu_);
  return stats_;
}

bool EventRecorder::Flush(std::chrono::milliseconds timeout) {
  core::MutexLock lock(mu_);
  return lock.WaitFor(cv_, timeout, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return stop_ || (queue_.empty() && in_flight_ == 0);
  });
}

}  // namespace tessera::kube
