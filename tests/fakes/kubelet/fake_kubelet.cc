#include "fake_kubelet.h"

#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <set>

namespace tessera::test {
namespace {

// The device manager's checks of a RegisterRequest (pkg/kubelet/cm/devicemanager): a supported
// version, an extended resource name (domain/name, not in kubernetes.io), an endpoint that is a
// file name in the folder.
std::string Validate(const v1beta1::RegisterRequest& r) {
  if (r.version() != "v1beta1") return "unsupported version '" + r.version() + "'";
  const std::string& n = r.resource_name();
  size_t slash = n.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == n.size()) {
    return "resource name '" + n + "' is not an extended resource name";
  }
  std::string domain = n.substr(0, slash);
  if (domain == "kubernetes.io" || domain.ends_with(".kubernetes.io")) {
    return "resource name '" + n + "' is in the kubernetes.io namespace";
  }
  if (r.endpoint().empty() || r.endpoint().find('/') != std::string::npos) {
    return "endpoint '" + r.endpoint() + "' is not a socket file name";
  }
  return "";
}

}  // namespace

struct FakeKubelet::Impl : public v1beta1::Registration::Service,
                           public v1::PodResourcesLister::Service {
  std::string dir;
  std::string pr_socket;
  std::unique_ptr<grpc::Server> reg_server, pr_server;

  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Plugin> plugins;
  std::map<std::string, std::shared_ptr<v1beta1::DevicePlugin::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::ClientContext>> streams;
  std::vector<std::thread> threads;
  std::vector<PodDevices> pods;
  std::vector<std::string> errors;
  int registrations = 0;
  std::atomic<bool> stopping{false};

  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* req,
                        v1beta1::Empty*) override {
    if (std::string why = Validate(*req); !why.empty()) {
      std::lock_guard lock(mu);
      errors.push_back(why);
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
    }
    auto channel = grpc::CreateChannel("unix:" + dir + "/" + req->endpoint(),
                                       grpc::InsecureChannelCredentials());
    auto stub =
        std::shared_ptr<v1beta1::DevicePlugin::Stub>(v1beta1::DevicePlugin::NewStub(channel));
    v1beta1::DevicePluginOptions opts;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1beta1::Empty e;
      grpc::Status s = stub->GetDevicePluginOptions(&ctx, e, &opts);
      if (!s.ok()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, s.error_message());
    }
    auto ctx = std::make_unique<grpc::ClientContext>();
    grpc::ClientContext* raw = ctx.get();
    std::lock_guard lock(mu);
    ++registrations;
    Plugin& p = plugins[req->resource_name()];
    p = Plugin{};
    p.request = *req;
    p.options = opts;
    stubs[req->resource_name()] = stub;
    streams.push_back(std::move(ctx));
    std::string name = req->resource_name();
    threads.emplace_back([this, stub, raw, name] {
      v1beta1::Empty e;
      auto reader = stub->ListAndWatch(raw, e);
      v1beta1::ListAndWatchResponse resp;
      while (reader->Read(&resp)) {
        std::lock_guard l(mu);
        Plugin& p = plugins[name];
        p.devices.assign(resp.devices().begin(), resp.devices().end());
        ++p.lists;
        for (const auto& d : resp.devices()) {
          if (d.health() == "Unhealthy") p.ever_unhealthy.insert(d.id());
        }
        p.last_list = std::chrono::steady_clock::now();
        cv.notify_all();
      }
      reader->Finish();
    });
    cv.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* out) override {
    std::lock_guard lock(mu);
    std::map<std::pair<std::string, std::string>, v1::PodResources*> by_pod;
    for (const PodDevices& d : pods) {
      v1::PodResources*& p = by_pod[{d.ns, d.pod}];
      if (!p) {
        p = out->add_pod_resources();
        p->set_name(d.pod);
        p->set_namespace_(d.ns);
      }
      v1::ContainerResources* c = nullptr;
      for (auto& existing : *p->mutable_containers()) {
        if (existing.name() == d.container) c = &existing;
      }
      if (!c) {
        c = p->add_containers();
        c->set_name(d.container);
      }
      auto* dev = c->add_devices();
      dev->set_resource_name(d.resource);
      for (const std::string& id : d.ids) dev->add_device_ids(id);
    }
    return grpc::Status::OK;
  }

  // The client of the plugin registered for `resource`; null when none is.
  std::shared_ptr<v1beta1::DevicePlugin::Stub> StubOf(const std::string& resource) {
    std::lock_guard lock(mu);
    auto it = stubs.find(resource);
    return it == stubs.end() ? nullptr : it->second;
  }

  void Serve() {
    stopping = false;
    std::string sock = dir + "/kubelet.sock";
    unlink(sock.c_str());
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + sock, grpc::InsecureServerCredentials());
    b.RegisterService(static_cast<v1beta1::Registration::Service*>(this));
    reg_server = b.BuildAndStart();
    if (!pr_socket.empty()) {
      unlink(pr_socket.c_str());
      grpc::ServerBuilder pb;
      pb.AddListeningPort("unix:" + pr_socket, grpc::InsecureServerCredentials());
      pb.RegisterService(static_cast<v1::PodResourcesLister::Service*>(this));
      pr_server = pb.BuildAndStart();
    }
  }

  void Shutdown() {
    stopping = true;
    if (reg_server) reg_server->Shutdown(std::chrono::system_clock::now());
    if (pr_server) pr_server->Shutdown(std::chrono::system_clock::now());
    reg_server.reset();
    pr_server.reset();
    std::vector<std::thread> ts;
    {
      std::lock_guard lock(mu);
      for (auto& c : streams) c->TryCancel();
      ts.swap(threads);
    }
    for (auto& t : ts) t.join();
    std::lock_guard lock(mu);
    streams.clear();
    stubs.clear();
  }
};

FakeKubelet::FakeKubelet(std::string dir, std::string pod_resources_socket)
    : impl_(std::make_unique<Impl>()) {
  impl_->dir = std::move(dir);
  impl_->pr_socket = std::move(pod_resources_socket);
}

FakeKubelet::~FakeKubelet() { Stop(); }

void FakeKubelet::Start() { impl_->Serve(); }

void FakeKubelet::Stop() { impl_->Shutdown(); }

void FakeKubelet::Restart() {
  Stop();
  {
    std::lock_guard lock(impl_->mu);
    impl_->plugins.clear();
  }
  if (DIR* d = opendir(impl_->dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string p = impl_->dir + "/" + e->d_name;
      struct stat st;
      if (lstat(p.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(p.c_str());
    }
    closedir(d);
  }
  Start();
}

bool FakeKubelet::WaitFor(const std::function<bool(const std::map<std::string, Plugin>&)>& pred,
                          std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout, [&] { return pred(impl_->plugins); });
}

std::map<std::string, FakeKubelet::Plugin> FakeKubelet::plugins() {
  std::lock_guard lock(impl_->mu);
  return impl_->plugins;
}

int FakeKubelet::registrations() {
  std::lock_guard lock(impl_->mu);
  return impl_->registrations;
}

std::vector<std::string> FakeKubelet::register_errors() {
  std::lock_guard lock(impl_->mu);
  return impl_->errors;
}

grpc::Status FakeKubelet::Allocate(const std::string& resource,
                                   const std::vector<std::vector<std::string>>& ids,
                                   v1beta1::AllocateResponse* out) {
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub = impl_->StubOf(resource);
  if (!stub) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, resource + " is not registered");
  }
  v1beta1::AllocateRequest req;
  for (const auto& c : ids) {
    auto* cr = req.add_container_requests();
    for (const std::string& id : c) cr->add_devices_ids(id);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub->Allocate(&ctx, req, out);
}

grpc::Status FakeKubelet::Preferred(const std::string& resource,
                                    const std::vector<std::string>& available,
                                    const std::vector<std::string>& must, int size,
                                    std::vector<std::string>* out) {
  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub = impl_->StubOf(resource);
  if (!stub) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, resource + " is not registered");
  }
  v1beta1::PreferredAllocationRequest req;
  auto* c = req.add_container_requests();
  for (const std::string& id : available) c->add_available_deviceids(id);
  for (const std::string& id : must) c->add_must_include_deviceids(id);
  c->set_allocation_size(size);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1beta1::PreferredAllocationResponse resp;
  grpc::Status s = stub->GetPreferredAllocation(&ctx, req, &resp);
  out->clear();
  if (s.ok() && resp.container_responses_size() == 1) {
    for (const std::string& id : resp.container_responses(0).deviceids()) out->push_back(id);
  }
  return s;
}

void FakeKubelet::SetPods(std::vector<PodDevices> pods) {
  std::lock_guard lock(impl_->mu);
  impl_->pods = std::move(pods);
}

}  // namespace tessera::test
