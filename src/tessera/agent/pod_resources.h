#pragma once
// The kubelet's PodResources API (v1, gRPC on a unix socket): which pod's container holds which
// device IDs. The agent joins its metrics to pods through it and learns which allocations ended.

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"

namespace tessera::agent {

struct ContainerRef {
  std::string pod_namespace;
  std::string pod;
  std::string container;
  friend bool operator==(const ContainerRef&, const ContainerRef&) = default;
};

// Device ID -> the containers holding it (one for a whole GPU; a share ID is held by one too).
using DeviceHolders = std::map<std::string, ContainerRef>;

class PodResourcesClient {
 public:
  // `socket`: /var/lib/kubelet/pod-resources/kubelet.sock.
  explicit PodResourcesClient(std::string socket);
  ~PodResourcesClient();

  // The devices of `resources` that live pods hold. kUnavailable with the socket named when the
  // kubelet does not answer within `timeout_ms`.
  absl::StatusOr<DeviceHolders> List(const std::set<std::string>& resources, int timeout_ms = 2000);

  struct Impl;

 private:
  std::string socket_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::agent
