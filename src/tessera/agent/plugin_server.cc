#include "tessera/agent/plugin_server.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace tessera::agent {
namespace {

// What an Allocate may name (our IDs are UUIDs and share names of a few dozen characters; a node
// has at most a few hundred shares).
constexpr int kMaxDevicesPerRequest = 4096;
constexpr size_t kMaxDeviceIdLength = 256;
// How soon a registration that failed on a kubelet socket which had just appeared is tried again.
constexpr std::chrono::milliseconds kFreshSocketRetry{200};

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl's canonical codes are gRPC's, number for number.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string Ids(const v1beta1::AllocateRequest& r) {
  std::vector<std::string> parts;
  for (const auto& c : r.container_requests()) {
    parts.push_back(absl::StrCat("[", absl::StrJoin(c.devices_ids(), ","), "]"));
  }
  return absl::StrJoin(parts, " ");
}

class Service final : public v1beta1::DevicePlugin::Service {
 public:
  Service(DeviceState& state, Resource r, PluginServer::HintLookup& hint,
          PluginServer::Reconcile& reconcile, PluginServer::HintUsed& hint_used,
          PluginServer::Refused& refused, PluginCounters& counters)
      : state_(state),
        r_(r),
        hint_(hint),
        reconcile_(reconcile),
        hint_used_(hint_used),
        refused_(refused),
        counters_(counters) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    out->set_pre_start_required(false);
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    uint64_t seen = state_.generation();
    std::string last;
    for (;;) {
      v1beta1::ListAndWatchResponse list = state_.List(r_);
      std::string bytes = list.SerializeAsString();
      // Only what changed for this resource is sent (an allocation of the other resource may
      // change nothing here).
      if (bytes != last) {
        if (!writer->Write(list)) return grpc::Status::OK;  // the kubelet went away
        last = std::move(bytes);
      }
      uint64_t now = seen;
      while (now == seen) {
        if (ctx->IsCancelled() || stopped_) return grpc::Status::OK;
        now = state_.WaitForChange(seen, std::chrono::milliseconds(200));
      }
      seen = now;
    }
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* out) override {
    ++counters_.preferred;
    int count =
        req->container_requests_size() > 0 ? req->container_requests(0).allocation_size() : 0;
    std::optional<PodHint> hint = hint_ ? hint_(r_, count) : std::nullopt;
    auto resp = state_.Preferred(r_, *req, hint ? &*hint : nullptr);
    if (!resp.ok()) {
      spdlog::warn("GetPreferredAllocation {}: {}", ResourceName(r_),
                   std::string(resp.status().message()));
      return ToGrpc(resp.status());
    }
    *out = std::move(*resp);
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* out) override {
    // Device IDs are ours (a GPU's UUID, a share's name): anything far longer or more numerous is
    // no request of the kubelet's, and is refused without being logged or echoed whole.
    for (const auto& c : req->container_requests()) {
      if (c.devices_ids_size() > kMaxDevicesPerRequest) {
        ++counters_.allocation_errors;
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            fmt::format("{} device IDs in one container request, over {}",
                                        c.devices_ids_size(), kMaxDevicesPerRequest));
      }
      for (const std::string& id : c.devices_ids()) {
        if (id.size() > kMaxDeviceIdLength) {
          ++counters_.allocation_errors;
          return grpc::Status(
              grpc::StatusCode::INVALID_ARGUMENT,
              fmt::format("a device ID of {} bytes, over {}", id.size(), kMaxDeviceIdLength));
        }
      }
    }
    int count =
        req->container_requests_size() > 0 ? req->container_requests(0).devices_ids_size() : 0;
    std::optional<PodHint> hint = hint_ ? hint_(r_, count) : std::nullopt;
    const PodHint* h = hint ? &*hint : nullptr;
    auto resp = state_.Allocate(r_, *req, h);
    // A GPU held by the other resource may belong to a pod that has ended since: ask the kubelet
    // what is still in use, then try once more.
    if (!resp.ok() && resp.status().code() == absl::StatusCode::kFailedPrecondition && reconcile_) {
      reconcile_();
      resp = state_.Allocate(r_, *req, h);
    }
    if (!resp.ok()) {
      ++counters_.allocation_errors;
      spdlog::warn("Allocate {} {}{}: refused: {}", ResourceName(r_), Ids(*req),
                   h ? " for pod " + h->pod_namespace + "/" + h->pod_name : "",
                   std::string(resp.status().message()));
      if (refused_) refused_(r_, h, std::string(resp.status().message()));
      return ToGrpc(resp.status());
    }
    ++counters_.allocations;
    if (h && hint_used_) hint_used_(*h);
    spdlog::info("Allocate {} {}{}", ResourceName(r_), Ids(*req),
                 h ? " for pod " + h->pod_namespace + "/" + h->pod_name : "");
    *out = std::move(*resp);
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

  void StopStreams() { stopped_ = true; }

 private:
  DeviceState& state_;
  const Resource r_;
  PluginServer::HintLookup& hint_;
  PluginServer::Reconcile& reconcile_;
  PluginServer::HintUsed& hint_used_;
  PluginServer::Refused& refused_;
  PluginCounters& counters_;
  std::atomic<bool> stopped_{false};
};

ino_t InodeOf(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) ? st.st_ino : 0;
}

}  // namespace

struct PluginServer::Endpoint {
  Resource resource;
  std::string socket_name;  // "tessera-gpu.sock"
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  ino_t inode = 0;
  ino_t kubelet_inode = 0;  // the kubelet socket it was registered through
  ino_t failed_inode = 0;   // the kubelet socket its last failed registration tried (0: none)
  bool registered = false;
  bool warned = false;
  std::chrono::milliseconds backoff{100};
  std::chrono::steady_clock::time_point next_try{};
};

PluginServer::PluginServer(DeviceState& state, PluginServerOptions options, HintLookup hint,
                           Reconcile reconcile, HintUsed hint_used, Refused refused)
    : state_(state),
      options_(std::move(options)),
      hint_(std::move(hint)),
      reconcile_(std::move(reconcile)),
      hint_used_(std::move(hint_used)),
      refused_(std::move(refused)) {
  if (options_.kubelet_socket.empty())
    options_.kubelet_socket = options_.plugin_dir + "/kubelet.sock";
  for (Resource r : {Resource::kGpu, Resource::kShare}) {
    if (!state_.serves(r)) continue;
    auto e = std::make_unique<Endpoint>();
    e->resource = r;
    e->socket_name = r == Resource::kGpu ? "tessera-gpu.sock" : "tessera-gpu-share.sock";
    endpoints_.push_back(std::move(e));
  }
}

PluginServer::~PluginServer() { Stop(); }

std::string PluginServer::SocketPath(Resource r) const {
  return options_.plugin_dir + "/" +
         (r == Resource::kGpu ? "tessera-gpu.sock" : "tessera-gpu-share.sock");
}

absl::Status PluginServer::Serve(Endpoint& e) {
  if (e.server) {
    e.service->StopStreams();
    e.server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    e.server.reset();
  }
  std::string path = options_.plugin_dir + "/" + e.socket_name;
  if (path.size() > 107) {
    return absl::FailedPreconditionError(fmt::format(
        "socket path {} is {} bytes, over the 107 a unix socket may have", path, path.size()));
  }
  unlink(path.c_str());
  e.service = std::make_unique<Service>(state_, e.resource, hint_, reconcile_, hint_used_, refused_,
                                        counters_);
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  b.RegisterService(e.service.get());
  e.server = b.BuildAndStart();
  if (!e.server) {
    return absl::FailedPreconditionError(fmt::format("cannot serve the device plugin on {}", path));
  }
  e.inode = InodeOf(path);
  e.registered = false;
  e.backoff = options_.initial_backoff;
  e.next_try = {};
  spdlog::info("device plugin {} serving on {}", ResourceName(e.resource), path);
  return absl::OkStatus();
}

bool PluginServer::Register(Endpoint& e) {
  auto channel =
      grpc::CreateChannel("unix:" + options_.kubelet_socket, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest req;
  req.set_version("v1beta1");
  req.set_endpoint(e.socket_name);
  req.set_resource_name(std::string(ResourceName(e.resource)));
  req.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::Empty out;
  grpc::Status s = stub->Register(&ctx, req, &out);
  if (!s.ok()) {
    if (!e.warned) {
      spdlog::warn("registering {} with the kubelet at {}: {}; retrying", ResourceName(e.resource),
                   options_.kubelet_socket, s.error_message());
      e.warned = true;
    }
    return false;
  }
  e.warned = false;
  e.kubelet_inode = InodeOf(options_.kubelet_socket);
  ++counters_.registrations;
  spdlog::info("registered {} with the kubelet ({})", ResourceName(e.resource),
               options_.kubelet_socket);
  return true;
}

absl::Status PluginServer::Start() {
  struct stat st;
  if (stat(options_.plugin_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(fmt::format("device-plugin folder {}: {}",
                                                     options_.plugin_dir,
                                                     errno ? strerror(errno) : "not a folder"));
  }
  for (auto& e : endpoints_) {
    if (absl::Status s = Serve(*e); !s.ok()) return s;
  }
  inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd_ >= 0) {
    inotify_add_watch(inotify_fd_, options_.plugin_dir.c_str(),
                      IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO);
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void PluginServer::Stop() {
  if (stop_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  for (auto& e : endpoints_) {
    if (!e->server) continue;
    e->service->StopStreams();
    e->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    e->server.reset();
    unlink((options_.plugin_dir + "/" + e->socket_name).c_str());
  }
  if (inotify_fd_ >= 0) close(inotify_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  inotify_fd_ = wake_fd_ = -1;
}

void PluginServer::Run() {
  while (!stop_) {
    auto now = std::chrono::steady_clock::now();
    const ino_t kubelet = InodeOf(options_.kubelet_socket);
    auto wait = std::chrono::milliseconds(1000);
    for (auto& e : endpoints_) {
      std::string path = options_.plugin_dir + "/" + e->socket_name;
      if (InodeOf(path) != e->inode || e->inode == 0) {
        spdlog::info("socket {} was removed (kubelet restart?): serving again", path);
        if (absl::Status s = Serve(*e); !s.ok()) {
          spdlog::error("{}", std::string(s.message()));
          continue;
        }
      } else if (e->registered && kubelet != 0 && kubelet != e->kubelet_inode) {
        spdlog::info("the kubelet's socket is new (kubelet restart): registering {} again",
                     ResourceName(e->resource));
        e->registered = false;
        e->next_try = {};
      }
      // A kubelet.sock that appeared since the last failed try (the kubelet is back): now, not
      // at the end of the backoff.
      bool fresh = false;
      if (!e->registered && kubelet != 0 && kubelet != e->failed_inode) {
        e->next_try = {};
        e->backoff = options_.initial_backoff;
        fresh = true;
      }
      if (!e->registered && now >= e->next_try) {
        e->registered = Register(*e);
        // The socket as it was before this try: one that appears while it fails is new to the
        // next round (read after the try, it would be taken for the one that failed).
        e->failed_inode = e->registered ? 0 : kubelet;
        if (!e->registered && fresh) {
          // A socket file exists from its bind(), before its server listens: one that just
          // appeared is tried once more soon, then by the backoff.
          e->next_try = now + std::min<std::chrono::milliseconds>(e->backoff, kFreshSocketRetry);
        } else if (!e->registered) {
          e->next_try = now + e->backoff;
          e->backoff = std::min(e->backoff * 2, options_.max_backoff);
        }
      }
      if (!e->registered) {
        wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(
                                  e->next_try - now + std::chrono::milliseconds(1)));
      }
    }
    pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int n = poll(fds, 2, static_cast<int>(std::max<int64_t>(wait.count(), 1)));
    if (n > 0 && (fds[0].revents & POLLIN)) {
      char buf[4096];
      while (read(inotify_fd_, buf, sizeof buf) > 0) {
      }
    }
  }
}

}  // namespace tessera::agent
