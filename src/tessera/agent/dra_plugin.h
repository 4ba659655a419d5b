#pragma once
// The DRA driver's kubelet plugin on the wire (resource.k8s.io/v1 and the kubelet's dra v1 API):
// the DRAPlugin and DRAResourceHealth (v1 and v1alpha1) services on
// <kubelet>/plugins/<driver>/dra.sock, served
// first, then the Registration service on <kubelet>/plugins_registry/<driver>-reg.sock, which the
// kubelet's plugin watcher finds. Stale sockets are removed at start; both are removed at Stop (the
// kubelet takes a removed registration socket as deregistration).
//
// NodePrepareResources reads each claim from the API server (the kubelet sends only namespace,
// name and UID) unless the checkpoint has it prepared already (its CDI spec and regions written
// again if they are gone), and answers one entry per claim: its devices' CDI IDs or why not. A
// request that names a claim without namespace, name or UID, or one UID twice, is a gRPC
// INVALID_ARGUMENT (the kubelet sent something malformed).

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "tessera/agent/dra_state.h"
#include "tessera/kube/client.h"

namespace grpc {
class Server;
}

namespace tessera::agent {

struct DraPluginOptions {
  std::string kubelet_dir = "/var/lib/kubelet";
  // Called when the kubelet says the driver is registered (a start, a kubelet restart, a
  // re-registration after the registration socket came back); on a gRPC thread.
  std::function<void()> on_registered;
};

struct DraCounters {
  std::atomic<uint64_t> registrations{0};        // NotifyRegistrationStatus saying registered
  std::atomic<uint64_t> registration_errors{0};  // ... saying not
  std::atomic<uint64_t> prepares{0};             // claims prepared (or found prepared)
  std::atomic<uint64_t> prepare_errors{0};       // claims answered with an error
  std::atomic<uint64_t> unprepares{0};
};

class DraPlugin {
 public:
  // `client` may be null: then only claims already in the checkpoint can be prepared.
  DraPlugin(DraState& state, kube::Client* client, DraPluginOptions options);
  ~DraPlugin();
  DraPlugin(const DraPlugin&) = delete;
  DraPlugin& operator=(const DraPlugin&) = delete;

  // kFailedPrecondition naming the socket when one cannot be served.
  absl::Status Start();
  void Stop();

  std::string plugin_socket() const;        // <kubelet>/plugins/<driver>/dra.sock
  std::string registration_socket() const;  // <kubelet>/plugins_registry/<driver>-reg.sock
  const DraCounters& counters() const { return counters_; }

  struct Services;

 private:
  DraState& state_;
  kube::Client* client_;
  DraPluginOptions options_;
  DraCounters counters_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> plugin_server_;
  std::unique_ptr<grpc::Server> registration_server_;
};

}  // namespace tessera::agent
