#include "tessera/agent/pod_resources.h"

#include <grpcpp/grpcpp.h>

#include "fmt/format.h"
#include "podresources/v1/api.grpc.pb.h"

namespace tessera::agent {

struct PodResourcesClient::Impl {
  std::unique_ptr<v1::PodResourcesLister::Stub> stub;
};

PodResourcesClient::PodResourcesClient(std::string socket)
    : socket_(std::move(socket)), impl_(std::make_unique<Impl>()) {
  impl_->stub = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
}

PodResourcesClient::~PodResourcesClient() = default;

absl::StatusOr<DeviceHolders> PodResourcesClient::List(const std::set<std::string>& resources,
                                                       int timeout_ms) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  v1::ListPodResourcesRequest req;
  v1::ListPodResourcesResponse resp;
  grpc::Status s = impl_->stub->List(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::UnavailableError(
        fmt::format("PodResources List on {}: {}", socket_, s.error_message()));
  }
  DeviceHolders out;
  for (const auto& pod : resp.pod_resources()) {
    for (const auto& c : pod.containers()) {
      for (const auto& d : c.devices()) {
        if (!resources.contains(d.resource_name())) continue;
        for (const std::string& id : d.device_ids()) {
          out[id] = ContainerRef{pod.namespace_(), pod.name(), c.name()};
        }
      }
    }
  }
  return out;
}

}  // namespace tessera::agent
