#include "fake_dra_kubelet.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

namespace tessera::test {

struct FakeDraKubelet::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<dra::DRAPlugin::Stub> plugin;
  std::unique_ptr<v1::DRAResourceHealth::Stub> health;
  std::unique_ptr<v1alpha1::DRAResourceHealth::Stub> health_v1alpha1;
  std::string health_service, health_error;
  grpc::ClientContext health_ctx;
  std::thread health_thread;
  mutable std::mutex mu;
  std::condition_variable cv;
  v1::NodeWatchResourcesResponse last;
  std::vector<v1::NodeWatchResourcesResponse> seen;  // every message, in order
  int messages = 0;
};

FakeDraKubelet::FakeDraKubelet(std::string kubelet_dir, int minor)
    : dir_(std::move(kubelet_dir)), minor_(minor), impl_(std::make_unique<Impl>()) {}

FakeDraKubelet::~FakeDraKubelet() {
  if (impl_->health_thread.joinable()) {
    impl_->health_ctx.TryCancel();
    impl_->health_thread.join();
  }
}

namespace {
bool IsSocket(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}
}  // namespace

bool FakeDraKubelet::Register(const std::string& driver, std::chrono::milliseconds timeout) {
  const std::string reg = dir_ + "/plugins_registry/" + driver + "-reg.sock";
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!IsSocket(reg)) {
    if (std::chrono::steady_clock::now() > until) {
      why_ = "no registration socket " + reg;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto ch = grpc::CreateChannel("unix:" + reg, grpc::InsecureChannelCredentials());
  auto stub = pluginregistration::Registration::NewStub(ch);
  // The kubelet's reconciler asks again on its next pass (every second) when a socket that has
  // appeared does not answer yet (bound, not listening).
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));  // the kubelet's
    grpc::Status s = stub->GetInfo(&ctx, pluginregistration::InfoRequest(), &info_);
    if (s.ok()) break;
    if (std::chrono::steady_clock::now() > until) {
      why_ = "GetInfo: " + s.error_message();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::string error;
  const auto& v = info_.supported_versions();
  if (info_.type() != "DRAPlugin") {
    error = "type " + info_.type() + ", not DRAPlugin";
  } else if (info_.name() != driver) {
    error = "name " + info_.name() + ", not " + driver;
  } else if (std::find(v.begin(), v.end(), "v1.DRAPlugin") == v.end()) {
    error = "no supported version the kubelet speaks (v1.DRAPlugin)";
  } else if (!IsSocket(info_.endpoint())) {
    error = "endpoint " + info_.endpoint() + " is not a socket";
  }
  pluginregistration::RegistrationStatus status;
  status.set_plugin_registered(error.empty());
  status.set_error(error);
  grpc::ClientContext nctx;
  nctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  pluginregistration::RegistrationStatusResponse ignored;
  if (grpc::Status n = stub->NotifyRegistrationStatus(&nctx, status, &ignored); !n.ok()) {
    why_ = "NotifyRegistrationStatus: " + n.error_message();
    return false;
  }
  if (!error.empty()) {
    why_ = error;
    return false;
  }
  impl_->channel =
      grpc::CreateChannel("unix:" + info_.endpoint(), grpc::InsecureChannelCredentials());
  impl_->plugin = dra::DRAPlugin::NewStub(impl_->channel);
  impl_->health = v1::DRAResourceHealth::NewStub(impl_->channel);
  impl_->health_v1alpha1 = v1alpha1::DRAResourceHealth::NewStub(impl_->channel);
  return true;
}

namespace {

// A request naming `claims`, as the kubelet sends it (prepare and unprepare alike).
template <class Request>
Request Naming(const std::vector<FakeDraKubelet::ClaimRef>& claims) {
  Request req;
  for (const FakeDraKubelet::ClaimRef& c : claims) {
    auto* r = req.add_claims();
    r->set_namespace_(c.ns);
    r->set_name(c.name);
    r->set_uid(c.uid);
  }
  return req;
}

// The kubelet's deadline for each DRA call.
void KubeletDeadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(45));
}

}  // namespace

grpc::Status FakeDraKubelet::Prepare(const std::vector<ClaimRef>& claims,
                                     dra::NodePrepareResourcesResponse* out) {
  grpc::ClientContext ctx;
  KubeletDeadline(ctx);
  return impl_->plugin->NodePrepareResources(&ctx, Naming<dra::NodePrepareResourcesRequest>(claims),
                                             out);
}

grpc::Status FakeDraKubelet::Unprepare(const std::vector<ClaimRef>& claims,
                                       dra::NodeUnprepareResourcesResponse* out) {
  grpc::ClientContext ctx;
  KubeletDeadline(ctx);
  return impl_->plugin->NodeUnprepareResources(
      &ctx, Naming<dra::NodeUnprepareResourcesRequest>(claims), out);
}

void FakeDraKubelet::WatchHealth() {
  const auto& v = info_.supported_versions();
  auto offers = [&](const char* s) { return std::find(v.begin(), v.end(), s) != v.end(); };
  std::string service;
  if (minor_ < 37) {
    service = "v1alpha1.DRAResourceHealth";
  } else if (offers("v1.DRAResourceHealth")) {
    service = "v1.DRAResourceHealth";
  } else if (offers("v1alpha1.DRAResourceHealth")) {
    service = "v1alpha1.DRAResourceHealth";
  }
  {
    std::lock_guard lock(impl_->mu);
    impl_->health_service = service;
  }
  if (service.empty()) return;
  impl_->health_thread = std::thread([this, service] {
    auto keep = [this](const v1::NodeWatchResourcesResponse& r) {
      std::lock_guard lock(impl_->mu);
      impl_->last = r;
      impl_->seen.push_back(r);
      ++impl_->messages;
      impl_->cv.notify_all();
    };
    grpc::Status end;
    if (service == "v1.DRAResourceHealth") {
      auto reader =
          impl_->health->NodeWatchResources(&impl_->health_ctx, v1::NodeWatchResourcesRequest());
      v1::NodeWatchResourcesResponse r;
      while (reader->Read(&r)) keep(r);
      end = reader->Finish();
    } else {
      auto reader = impl_->health_v1alpha1->NodeWatchResources(
          &impl_->health_ctx, v1alpha1::NodeWatchResourcesRequest());
      v1alpha1::NodeWatchResourcesResponse r;
      while (reader->Read(&r)) {
        v1::NodeWatchResourcesResponse same;  // the same fields, as the kubelet converts them
        same.ParseFromString(r.SerializeAsString());
        keep(same);
      }
      end = reader->Finish();
    }
    std::lock_guard lock(impl_->mu);
    if (!end.ok() && end.error_code() != grpc::StatusCode::CANCELLED) {
      impl_->health_error =
          (end.error_code() == grpc::StatusCode::UNIMPLEMENTED ? std::string("UNIMPLEMENTED: ")
                                                               : std::string("error: ")) +
          end.error_message();
    }
    impl_->cv.notify_all();
  });
}

std::string FakeDraKubelet::health_service() const {
  std::lock_guard lock(impl_->mu);
  return impl_->health_service;
}

std::string FakeDraKubelet::health_error() const {
  std::lock_guard lock(impl_->mu);
  return impl_->health_error;
}

bool FakeDraKubelet::WaitHealth(
    const std::function<bool(const v1::NodeWatchResourcesResponse&)>& pred,
    std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout,
                            [&] { return impl_->messages > 0 && pred(impl_->last); });
}

bool FakeDraKubelet::WaitHealthSeen(
    const std::function<bool(const v1::NodeWatchResourcesResponse&)>& pred,
    std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  return impl_->cv.wait_for(
      lock, timeout, [&] { return std::any_of(impl_->seen.begin(), impl_->seen.end(), pred); });
}

int FakeDraKubelet::health_messages() const {
  std::lock_guard lock(impl_->mu);
  return impl_->messages;
}

}  // namespace tessera::test
