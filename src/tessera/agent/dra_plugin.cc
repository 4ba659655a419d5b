#include "tessera/agent/dra_plugin.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "dra-health/v1/api.grpc.pb.h"
#include "dra-health/v1alpha1/api.grpc.pb.h"
#include "dra/v1/api.grpc.pb.h"
#include "fmt/format.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "tessera/core/clock.h"

namespace tessera::agent {

namespace dra = k8s::io::kubelet::pkg::apis::dra::v1;

namespace {

// What GetInfo advertises: upstream's DRAPluginService and both health services (kubelets 1.37+
// pick the health version from this list; 1.34-1.36 call v1alpha1 whatever it says).
constexpr const char* kSupportedVersions[] = {"v1.DRAPlugin", "v1.DRAResourceHealth",
                                              "v1alpha1.DRAResourceHealth"};
constexpr size_t kMaxSocketPath = 107;

grpc::Status Invalid(const std::string& why) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
}

// The request's claims, checked: every one named in full, no UID twice.
grpc::Status CheckClaims(const google::protobuf::RepeatedPtrField<dra::Claim>& claims) {
  std::set<std::string> uids;
  for (int i = 0; i < claims.size(); ++i) {
    const dra::Claim& c = claims[i];
    if (c.uid().empty() || c.name().empty() || c.namespace_().empty()) {
      return Invalid(
          fmt::format("claims[{}]: namespace, name and uid are required (got '{}', '{}', '{}')", i,
                      c.namespace_(), c.name(), c.uid()));
    }
    if (!uids.insert(c.uid()).second) {
      return Invalid(fmt::format("claims[{}]: UID {} asked twice", i, c.uid()));
    }
  }
  return grpc::Status::OK;
}

}  // namespace

struct DraPlugin::Services final : dra::DRAPlugin::Service,
                                   v1::DRAResourceHealth::Service,
                                   pluginregistration::Registration::Service {
  DraPlugin& p;
  std::atomic<bool> stopped{false};
  explicit Services(DraPlugin& plugin) : p(plugin), health_v1alpha1(*this) {}

  // The same stream in v1alpha1's package (its messages are v1's, field for field).
  struct HealthV1alpha1 final : v1alpha1::DRAResourceHealth::Service {
    explicit HealthV1alpha1(Services& s) : s(s) {}
    grpc::Status NodeWatchResources(
        grpc::ServerContext* ctx, const v1alpha1::NodeWatchResourcesRequest*,
        grpc::ServerWriter<v1alpha1::NodeWatchResourcesResponse>* w) override {
      return s.Watch(ctx, [w](const v1::NodeWatchResourcesResponse& r) {
        v1alpha1::NodeWatchResourcesResponse out;
        return out.ParseFromString(r.SerializeAsString()) && w->Write(out);
      });
    }
    Services& s;
  } health_v1alpha1;

  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* out) override {
    out->set_type("DRAPlugin");
    out->set_name(p.state_.options().driver);
    out->set_endpoint(p.plugin_socket());
    for (const char* v : kSupportedVersions) out->add_supported_versions(v);
    return grpc::Status::OK;
  }

  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* s,
                                        pluginregistration::RegistrationStatusResponse*) override {
    if (s->plugin_registered()) {
      ++p.counters_.registrations;
      spdlog::info("DRA driver {} registered with the kubelet", p.state_.options().driver);
      // A kubelet that (re)started wipes the node's slices: they are checked at once.
      if (p.options_.on_registered) p.options_.on_registered();
    } else {
      ++p.counters_.registration_errors;
      spdlog::error("the kubelet refused DRA driver {}: {}", p.state_.options().driver, s->error());
    }
    return grpc::Status::OK;
  }

  // One claim: from the checkpoint, else read and prepared. The error text for its entry.
  std::string PrepareOne(const dra::Claim& c, dra::NodePrepareResourceResponse* out) {
    std::optional<std::vector<PreparedDevice>> devs = p.state_.PreparedAndPresent(c.uid());
    if (!devs) {
      if (p.client_ == nullptr) {
        return fmt::format("claim {}/{}: the agent has no API server connection to read it",
                           c.namespace_(), c.name());
      }
      auto obj = p.client_->Get(fmt::format(
          "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}", c.namespace_(), c.name()));
      if (!obj.ok()) {
        return fmt::format("claim {}/{}: {}", c.namespace_(), c.name(),
                           std::string(obj.status().message()));
      }
      auto made = p.state_.Prepare(c.namespace_(), c.name(), c.uid(), *obj);
      if (!made.ok()) return std::string(made.status().message());
      devs = std::move(*made);
    }
    for (const PreparedDevice& d : *devs) {
      dra::Device* o = out->add_devices();
      for (const std::string& r : d.requests) o->add_request_names(r);
      o->set_pool_name(d.pool);
      o->set_device_name(d.device);
      for (const std::string& id : d.cdi_ids) o->add_cdi_device_ids(id);
      if (!d.share_id.empty()) o->set_share_id(d.share_id);
    }
    return "";
  }

  grpc::Status NodePrepareResources(grpc::ServerContext*,
                                    const dra::NodePrepareResourcesRequest* req,
                                    dra::NodePrepareResourcesResponse* out) override {
    if (grpc::Status st = CheckClaims(req->claims()); !st.ok()) return st;
    for (const dra::Claim& c : req->claims()) {
      dra::NodePrepareResourceResponse& entry = (*out->mutable_claims())[c.uid()];
      if (std::string err = PrepareOne(c, &entry); !err.empty()) {
        entry.Clear();
        entry.set_error(err);
        ++p.counters_.prepare_errors;
        spdlog::warn("NodePrepareResources: {}", err);
      } else {
        ++p.counters_.prepares;
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                      const dra::NodeUnprepareResourcesRequest* req,
                                      dra::NodeUnprepareResourcesResponse* out) override {
    if (grpc::Status st = CheckClaims(req->claims()); !st.ok()) return st;
    for (const dra::Claim& c : req->claims()) {
      dra::NodeUnprepareResourceResponse& entry = (*out->mutable_claims())[c.uid()];
      if (absl::Status st = p.state_.Unprepare(c.uid()); !st.ok()) {
        entry.set_error(
            fmt::format("claim {}/{}: {}", c.namespace_(), c.name(), std::string(st.message())));
      } else {
        ++p.counters_.unprepares;
      }
    }
    return grpc::Status::OK;
  }

  v1::NodeWatchResourcesResponse Health() const {
    v1::NodeWatchResourcesResponse r;
    const auto now = static_cast<int64_t>(core::Seconds(core::SystemClock::Get().Now()));
    for (const DraDevice& d : p.state_.devices()) {
      v1::DeviceHealth* h = r.add_devices();
      h->mutable_device()->set_pool_name(p.state_.options().pool);
      h->mutable_device()->set_device_name(d.name);
      bool ok = p.state_.healthy(d.gpu);
      h->set_health(ok ? v1::HEALTHY : v1::UNHEALTHY);
      h->set_last_updated_time(now);
      if (!ok) h->set_message(p.state_.health_reason(d.gpu).substr(0, 1024));
    }
    return r;
  }

  grpc::Status NodeWatchResources(grpc::ServerContext* ctx, const v1::NodeWatchResourcesRequest*,
                                  grpc::ServerWriter<v1::NodeWatchResourcesResponse>* w) override {
    return Watch(ctx, [w](const v1::NodeWatchResourcesResponse& r) { return w->Write(r); });
  }

  // Every device's health, again at each change, until the kubelet goes or the plugin stops.
  template <class Write>
  grpc::Status Watch(grpc::ServerContext* ctx, Write write) {
    uint64_t seen = p.state_.generation();
    for (;;) {
      if (!write(Health())) return grpc::Status::OK;
      uint64_t now = seen;
      while (now == seen) {
        if (ctx->IsCancelled() || stopped) return grpc::Status::OK;
        now = p.state_.WaitForChange(seen, std::chrono::milliseconds(200));
      }
      seen = now;
    }
  }
};

DraPlugin::DraPlugin(DraState& state, kube::Client* client, DraPluginOptions options)
    : state_(state), client_(client), options_(std::move(options)) {}

DraPlugin::~DraPlugin() { Stop(); }

std::string DraPlugin::plugin_socket() const {
  return fmt::format("{}/plugins/{}/dra.sock", options_.kubelet_dir, state_.options().driver);
}

std::string DraPlugin::registration_socket() const {
  return fmt::format("{}/plugins_registry/{}-reg.sock", options_.kubelet_dir,
                     state_.options().driver);
}

absl::Status DraPlugin::Start() {
  services_ = std::make_unique<Services>(*this);
  auto serve = [&](const std::string& path, std::vector<grpc::Service*> services,
                   std::unique_ptr<grpc::Server>* into) -> absl::Status {
    if (path.size() > kMaxSocketPath) {
      return absl::FailedPreconditionError(
          fmt::format("socket path {} is {} bytes, over the {} a unix socket may have", path,
                      path.size(), kMaxSocketPath));
    }
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    if (ec) {
      return absl::FailedPreconditionError(fmt::format("{}: {}", path, ec.message()));
    }
    unlink(path.c_str());  // a stale socket of an earlier run
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
    for (grpc::Service* s : services) b.RegisterService(s);
    *into = b.BuildAndStart();
    if (!*into) return absl::FailedPreconditionError(fmt::format("cannot serve on {}", path));
    return absl::OkStatus();
  };
  // The plugin's own service first: the kubelet calls it as soon as it sees the registration.
  dra::DRAPlugin::Service* plugin = services_.get();
  v1::DRAResourceHealth::Service* health = services_.get();
  grpc::Service* health_v1alpha1 = &services_->health_v1alpha1;
  if (absl::Status st = serve(plugin_socket(), {plugin, health, health_v1alpha1}, &plugin_server_);
      !st.ok()) {
    return st;
  }
  pluginregistration::Registration::Service* reg = services_.get();
  if (absl::Status st = serve(registration_socket(), {reg}, &registration_server_); !st.ok()) {
    Stop();
    return st;
  }
  spdlog::info("DRA driver {}: serving {}, registration at {}", state_.options().driver,
               plugin_socket(), registration_socket());
  return absl::OkStatus();
}

void DraPlugin::Stop() {
  if (services_) services_->stopped = true;
  // Registration first: the kubelet stops using the driver before its service goes.
  if (registration_server_) {
    registration_server_->Shutdown(std::chrono::system_clock::now() +
                                   std::chrono::milliseconds(500));
    registration_server_.reset();
    unlink(registration_socket().c_str());
  }
  if (plugin_server_) {
    plugin_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    plugin_server_.reset();
    unlink(plugin_socket().c_str());
  }
}

}  // namespace tessera::agent
