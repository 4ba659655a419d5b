#pragma once
// Kubernetes Events (events.k8s.io/v1) about the objects a component acts on, as kube-scheduler
// and the kubelet report them: `kubectl describe pod` and `kubectl events` show why a pod waits
// or was preempted without anyone reading the component's log. Recording never blocks the caller:
// events go to a bounded queue that a thread posts to the API server. The same event (object,
// reason) within `repeat_interval_s` is counted, not posted; after it, the event's `series` (count,
// last observed) is patched, as client-go's event broadcaster aggregates. Thread-safe.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>

#include "nlohmann/json.hpp"
#include "tessera/core/clock.h"
#include "tessera/core/mutex.h"
#include "tessera/kube/client.h"

namespace tessera::kube {

// The object an event is about (its `regarding`).
struct ObjectRef {
  std::string api_version = "v1";
  std::string kind;  // Pod, Node
  std::string ns;    // empty for cluster-scoped objects (their events go to "default")
  std::string name;
  std::string uid;
};

struct EventRecorderOptions {
  std::string controller;  // reportingController, "tessera.io/extender"
  std::string instance;    // reportingInstance: this process (host name, pod name)
  double repeat_interval_s = 60;
  size_t max_queued = 1000;    // events waiting to be posted; more are dropped and counted
  size_t max_tracked = 10000;  // (object, reason) pairs remembered for counting repeats
  // How a repeat after the interval is posted: patched into the first event's series (RBAC:
  // create and patch), or as a new event (create only).
  bool patch_series = true;
};

class EventRecorder {
 public:
  // `client` and `clock` (wall time: events carry dates) must outlive the recorder.
  EventRecorder(Client& client, EventRecorderOptions options,
                const core::Clock& clock = core::SystemClock::Get());
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // `type` Normal or Warning; `reason` UpperCamelCase (at most 128 characters); `action` what was
  // done or tried ("Scheduling", "Preempting", "Allocating"); `note` human-readable, cut at 1 KiB.
  void Record(const ObjectRef& regarding, std::string_view type, std::string_view reason,
              std::string_view action, std::string_view note);

  struct Stats {
    uint64_t created = 0, patched = 0, counted = 0, dropped = 0, failed = 0;
  };
  Stats stats() const;
  // Waits until every event recorded so far was posted (or failed); false after `timeout`.
  bool Flush(std::chrono::milliseconds timeout);

  // The Event object for a first occurrence (what Record posts), and its API path: for tests.
  static nlohmann::json EventObject(const ObjectRef& regarding, std::string_view type,
                                    std::string_view reason, std::string_view action,
                                    std::string_view note, const EventRecorderOptions& options,
                                    core::TimePoint now);
  static std::string EventsPath(const std::string& ns);

 private:
  struct Post {
    std::string path;
    nlohmann::json body;
    bool patch = false;
    std::tuple<std::string, std::string, std::string> key;  // of the event it is
  };
  struct Seen {
    std::string event_ns, event_name;  // once created
    int32_t count = 0;
    double last_posted = 0;  // seconds
    double last_seen = 0;
  };
  void Run();
  void Enqueue(Post p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Client& client_;
  const EventRecorderOptions options_;
  const core::Clock& clock_;
  mutable core::Mutex mu_;
  core::CondVar cv_;
  std::deque<Post> queue_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::tuple<std::string, std::string, std::string>, Seen> seen_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::kube
