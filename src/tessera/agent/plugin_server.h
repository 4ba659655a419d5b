#pragma once
// The device plugin on the wire: one gRPC server per resource on a unix socket in the kubelet's
// device-plugin folder, registered with the kubelet after it serves. A thread keeps it so: when the
// kubelet restarts (it deletes every socket in the folder, or makes a new kubelet.sock) the servers
// are started again and registered again; a kubelet that is not up yet is retried with backoff.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "tessera/agent/device_state.h"

namespace tessera::agent {

struct PluginServerOptions {
  std::string plugin_dir = "/var/lib/kubelet/device-plugins";
  std::string kubelet_socket;  // empty: <plugin_dir>/kubelet.sock
  // Between failed registrations: from initial_backoff, doubling to max_backoff - but at once when
  // a new kubelet.sock appears (the kubelet is back), whatever is left of the wait; a try on a
  // socket that has just appeared that fails (its server not listening yet) is made again within
  // 200 ms before the backoff applies.
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
};

struct PluginCounters {
  std::atomic<uint64_t> registrations{0};
  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> allocation_errors{0};
  std::atomic<uint64_t> preferred{0};
};

class PluginServer {
 public:
  // The pending pod the extender chose GPUs for (its annotations) whose next container needs
  // `count` devices of the resource, if any; may be empty.
  using HintLookup = std::function<std::optional<PodHint>(Resource, int count)>;
  // Called after an Allocate that followed a hint succeeded; may be empty.
  using HintUsed = std::function<void(const PodHint&)>;
  // Brings the allocations up to date with the kubelet's PodResources (releases ended ones).
  using Reconcile = std::function<void()>;
  // Called when an Allocate is refused (after the retry): the pod when the extender's choice
  // named it, and why. May be empty.
  using Refused = std::function<void(Resource, const PodHint*, const std::string& why)>;

  PluginServer(DeviceState& state, PluginServerOptions options, HintLookup hint,
               Reconcile reconcile, HintUsed hint_used = nullptr, Refused refused = nullptr);
  ~PluginServer();
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Serves every resource the state serves and starts the thread that registers them.
  // kFailedPrecondition when the folder is missing or a socket cannot be served.
  absl::Status Start();
  void Stop();

  const PluginCounters& counters() const { return counters_; }
  // The socket path of a resource's server.
  std::string SocketPath(Resource r) const;

  struct Endpoint;

 private:
  absl::Status Serve(Endpoint& e);
  bool Register(Endpoint& e);
  void Run();

  DeviceState& state_;
  PluginServerOptions options_;
  HintLookup hint_;
  Reconcile reconcile_;
  HintUsed hint_used_;
  Refused refused_;
  PluginCounters counters_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<bool> stop_{false};
  int inotify_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace tessera::agent
