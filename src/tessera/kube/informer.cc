#include "tessera/kube/informer.h"

#include <random>

#include "spdlog/spdlog.h"
#include "tessera/kube/object.h"

namespace tessera::kube {

std::string ObjectKey(const nlohmann::json& object) {
  std::string name = StringAt(object, {"metadata", "name"});
  std::string ns = StringAt(object, {"metadata", "namespace"});
  return ns.empty() ? name : ns + "/" + name;
}

Informer::Informer(Client& client, InformerOptions options, Handler handler)
    : client_(client), options_(std::move(options)), handler_(std::move(handler)) {
  thread_ = std::thread([this] { Run(); });
}

Informer::~Informer() { Stop(); }

void Informer::Stop() {
  {
    core::MutexLock lock(mu_);  // so a waiter cannot miss it between its check and its wait
    stop_ = true;
  }
  cv_.notify_all();
  client_.Wake();
  if (thread_.joinable()) thread_.join();
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) {
  core::MutexLock lock(mu_);
  return lock.WaitFor(cv_, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return synced_ || stop_.load();
  }) && synced_;
}

bool Informer::synced() const {
  core::MutexLock lock(mu_);
  return synced_;
}

std::vector<nlohmann::json> Informer::Snapshot() const {
  core::MutexLock lock(mu_);
  std::vector<nlohmann::json> out;
  out.reserve(objects_.size());
  for (const auto& [k, v] : objects_) out.push_back(v);
  return out;
}

std::optional<nlohmann::json> Informer::Get(const std::string& key) const {
  core::MutexLock lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

std::string Informer::resource_version() const {
  core::MutexLock lock(mu_);
  return resource_version_;
}

bool Informer::absent() const {
  core::MutexLock lock(mu_);
  return absent_;
}

std::string Informer::last_error() const {
  core::MutexLock lock(mu_);
  return last_error_;
}

void Informer::SleepBackoff(std::chrono::milliseconds& backoff) {
  static thread_local std::mt19937 rng(std::random_device{}());
  auto jittered = std::chrono::milliseconds(
      backoff.count() / 2 + std::uniform_int_distribution<int64_t>(0, backoff.count() / 2)(rng));
  core::MutexLock lock(mu_);
  lock.WaitFor(cv_, jittered, [&] { return stop_.load(); });
  backoff = std::min(backoff * 2, options_.max_backoff);
}

bool Informer::Relist() {
  ++counters_.lists;
  ListOptions lo;
  lo.label_selector = options_.label_selector;
  lo.field_selector = options_.field_selector;
  auto list = client_.List(options_.path, lo);
  bool absent = false;
  if (!list.ok() && options_.optional && HttpStatusOf(list.status()) == 404) {
    absent = true;
    list = ObjectList{};
  }
  if (!list.ok()) {
    ++counters_.errors;
    std::string err(list.status().message());
    spdlog::warn("informer {}: list failed: {}", options_.path, err);
    core::MutexLock lock(mu_);
    last_error_ = err;
    return false;
  }
  std::map<std::string, nlohmann::json> fresh;
  for (auto& item : list->items) {
    std::string key = ObjectKey(item);
    if (key.empty()) continue;
    fresh[key] = std::move(item);
  }
  // The difference against what the handler has seen, as events.
  std::vector<std::pair<EventType, nlohmann::json>> events;
  {
    core::MutexLock lock(mu_);
    for (const auto& [k, v] : objects_) {
      if (!fresh.contains(k)) events.emplace_back(EventType::kDeleted, v);
    }
    for (const auto& [k, v] : fresh) {
      auto it = objects_.find(k);
      if (it == objects_.end()) {
        events.emplace_back(EventType::kAdded, v);
      } else if (it->second != v) {
        events.emplace_back(EventType::kModified, v);
      }
    }
    objects_ = std::move(fresh);
    resource_version_ = list->resource_version;
    last_error_.clear();
    if (absent != absent_) {
      if (absent) {
        spdlog::info(
            "informer {}: not served by this API server (its CRD is not installed): "
            "taken as empty, asked again every {} s",
            options_.path, options_.absent_recheck.count() / 1000);
      } else if (synced_) {
        spdlog::info("informer {}: now served; watching it", options_.path);
      }
      absent_ = absent;
    }
  }
  for (const auto& [t, o] : events) {
    if (handler_) handler_(t, o);
  }
  {
    core::MutexLock lock(mu_);
    synced_ = true;
  }
  cv_.notify_all();
  return true;
}

void Informer::Apply(EventType type, const nlohmann::json& object) {
  std::string key = ObjectKey(object);
  std::string rv = StringAt(object, {"metadata", "resourceVersion"});
  {
    core::MutexLock lock(mu_);
    if (!rv.empty()) resource_version_ = rv;
    if (type == EventType::kBookmark || key.empty()) return;
    if (type == EventType::kDeleted) {
      objects_.erase(key);
    } else {
      objects_[key] = object;
    }
  }
  ++counters_.events;
  if (handler_) handler_(type, object);
}

void Informer::Run() {
  std::chrono::milliseconds backoff{100};
  bool need_list = true;
  while (!stop_) {
    if (need_list) {
      if (!Relist()) {
        SleepBackoff(backoff);
        continue;
      }
      if (absent()) {
        core::MutexLock lock(mu_);
        lock.WaitFor(cv_, options_.absent_recheck, [&] { return stop_.load(); });
        continue;
      }
      backoff = std::chrono::milliseconds(100);
      need_list = false;
    }
    ++counters_.watches;
    WatchOptions wo;
    wo.resource_version = resource_version();
    wo.label_selector = options_.label_selector;
    wo.field_selector = options_.field_selector;
    wo.timeout_seconds = options_.watch_timeout_seconds;
    wo.cancel = &stop_;
    bool got_event = false;
    auto started = std::chrono::steady_clock::now();
    absl::Status s = client_.Watch(options_.path, wo, [&](const WatchEvent& e) {
      if (!got_event) {
        // The server answers again: what failed before is over.
        core::MutexLock lock(mu_);
        last_error_.clear();
      }
      got_event = true;
      Apply(e.type, e.object);
      return !stop_;
    });
    if (stop_) break;
    if (got_event) backoff = std::chrono::milliseconds(100);
    if (s.ok()) {
      {
        core::MutexLock lock(mu_);
        last_error_.clear();  // a stream the server ended cleanly
      }
      // The server ended the stream: watch on from the last version (after a pause when it ended
      // at once and empty, so a server that closes every stream is not hammered).
      if (!got_event && std::chrono::steady_clock::now() - started < std::chrono::seconds(1)) {
        SleepBackoff(backoff);
      }
      continue;
    }
    if (IsGone(s)) {
      ++counters_.relists_gone;
      spdlog::info("informer {}: resource version {} expired, listing again", options_.path,
                   wo.resource_version);
      need_list = true;
      continue;
    }
    ++counters_.errors;
    std::string err(s.message());
    spdlog::warn("informer {}: watch failed: {}", options_.path, err);
    {
      core::MutexLock lock(mu_);
      last_error_ = err;
    }
    SleepBackoff(backoff);
    // A server that keeps failing the watch may have lost our version: list again on the next try
    // only when it says so (410); otherwise the cache stays and the watch resumes.
  }
}

}  // namespace tessera::kube
