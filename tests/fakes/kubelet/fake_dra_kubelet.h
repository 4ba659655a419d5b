#pragma once
// The kubelet's side of a DRA driver, for tests, over the real gRPC on unix sockets: its plugin
// watcher (finds <dir>/plugins_registry/*-reg.sock, asks GetInfo within 1 s, checks the type is
// DRAPlugin and that v1.DRAPlugin is offered, reports the outcome with NotifyRegistrationStatus),
// and its DRA manager (NodePrepareResources / NodeUnprepareResources with the kubelet's 45 s
// deadline, one NodeWatchResources stream kept open). The health stream is opened as the kubelet
// of `minor` (1.<minor>) does: 1.34-1.36 call v1alpha1 whatever the driver advertises; 1.37 and
// later pick v1, else v1alpha1, from GetInfo's supported versions, and open none when neither is.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dra-health/v1/api.grpc.pb.h"
#include "dra-health/v1alpha1/api.grpc.pb.h"
#include "dra/v1/api.grpc.pb.h"
#include "pluginregistration/v1/api.grpc.pb.h"

namespace tessera::test {

namespace dra = k8s::io::kubelet::pkg::apis::dra::v1;

class FakeDraKubelet {
 public:
  explicit FakeDraKubelet(std::string kubelet_dir, int minor = 34);
  ~FakeDraKubelet();

  // Waits for a registration socket of `driver`, registers it as the kubelet does; false with
  // why() when it never came or was refused.
  bool Register(const std::string& driver,
                std::chrono::milliseconds timeout = std::chrono::seconds(15));
  const pluginregistration::PluginInfo& info() const { return info_; }
  std::string why() const { return why_; }

  struct ClaimRef {
    std::string ns, name, uid;
  };
  grpc::Status Prepare(const std::vector<ClaimRef>& claims, dra::NodePrepareResourcesResponse* out);
  grpc::Status Unprepare(const std::vector<ClaimRef>& claims,
                         dra::NodeUnprepareResourcesResponse* out);

  // Opens the health stream (kept until the kubelet goes); LatestHealth waits until a message
  // satisfies `pred` or the timeout passes and returns the last one.
  void WatchHealth();
  // The health service the stream was opened with ("" when none), and how it ended ("" while
  // open or ended cleanly; "UNIMPLEMENTED: ..." for a driver that does not serve it).
  std::string health_service() const;
  std::string health_error() const;
  bool WaitHealth(const std::function<bool(const v1::NodeWatchResourcesResponse&)>& pred,
                  std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Whether any message since the stream opened satisfies `pred` (waiting for one until the
  // timeout): a state the driver said and left again (a GPU unhealthy, then recovered) is seen
  // however late the test looks.
  bool WaitHealthSeen(const std::function<bool(const v1::NodeWatchResourcesResponse&)>& pred,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  int health_messages() const;

  struct Impl;

 private:
  std::string dir_;
  int minor_;
  pluginregistration::PluginInfo info_;
  std::string why_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::test
