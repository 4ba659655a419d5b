#pragma once
// A kept-current copy of one kind of object: list, then watch from the list's resource version;
// on "too old" (410 Gone) list again and report the difference; on a broken stream or an error
// watch again after a backoff (100 ms doubling to `max_backoff`, with jitter). The handler sees
// every change once, in order, on the informer's own thread. Thread-safe: Snapshot and Get may be
// called from any thread.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "tessera/core/mutex.h"
#include "tessera/kube/client.h"

namespace tessera::kube {

struct InformerOptions {
  std::string path;  // "/api/v1/nodes", "/api/v1/pods"
  std::string label_selector;
  std::string field_selector;
  std::chrono::milliseconds max_backoff{10000};
  int watch_timeout_seconds = 300;
  // A kind the cluster may not serve (a CRD not installed): a 404 on the list is an empty list,
  // synced and no error, logged once; the list is tried again every `absent_recheck`, and the
  // kind is watched from the moment it is served.
  bool optional = false;
  std::chrono::milliseconds absent_recheck{60000};
};

struct InformerCounters {
  std::atomic<uint64_t> lists{0};
  std::atomic<uint64_t> watches{0};
  std::atomic<uint64_t> relists_gone{0};  // 410 Gone
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> events{0};
};

// "namespace/name", or "name" for a cluster-scoped object.
std::string ObjectKey(const nlohmann::json& object);

class Informer {
 public:
  // `object` is the new state (the last known one for kDeleted).
  using Handler = std::function<void(EventType type, const nlohmann::json& object)>;

  // Starts the thread. `client` must outlive the informer.
  Informer(Client& client, InformerOptions options, Handler handler);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Waits until the first list has been applied; false on timeout or Stop.
  bool WaitForSync(std::chrono::milliseconds timeout);
  bool synced() const;
  void Stop();

  std::vector<nlohmann::json> Snapshot() const;
  std::optional<nlohmann::json> Get(const std::string& key) const;
  std::string resource_version() const;
  const InformerCounters& counters() const { return counters_; }
  // The last error, empty when the last list or watch went well (a watch: once it delivers an
  // event, a bookmark included, or the server ends it cleanly).
  std::string last_error() const;
  // An optional kind the API server does not serve (its last list answered 404).
  bool absent() const;

 private:
  void Run();
  bool Relist();  // false on error
  void Apply(EventType type, const nlohmann::json& object);
  void SleepBackoff(std::chrono::milliseconds& backoff);

  Client& client_;
  const InformerOptions options_;
  Handler handler_;
  InformerCounters counters_;

  mutable core::Mutex mu_;
  mutable core::CondVar cv_;
  // Written under mu_ (for the condition variable), read without it by the client's watch.
  std::atomic<bool> stop_{false};
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, nlohmann::json> objects_ ABSL_GUARDED_BY(mu_);
  std::string resource_version_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool absent_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::kube
