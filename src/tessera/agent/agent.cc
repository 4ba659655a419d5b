#include "tessera/agent/agent.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/agent/metrics.h"
#include "tessera/core/clock.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/cdi.h"
#include "tessera/kube/object.h"
#include "tessera/net/http.h"
#include "tessera/shim/arbiter.h"

namespace tessera::agent {

Agent::Agent(AgentOptions options) : options_(std::move(options)) {}

Agent::~Agent() { Stop(); }

// The start in the order docs/kubernetes.md gives it: the GPUs, the CDI spec and the state, the
// health watch, the kubelet's API (device plugin or DRA) with the API server, metrics, the
// reconcile loop. A step that fails returns its error; what earlier steps started is stopped by
// the destructor.
absl::StatusOr<std::unique_ptr<Agent>> Agent::Start(AgentOptions options) {
  std::unique_ptr<Agent> a(new Agent(std::move(options)));
  auto inventory = a->OpenDevices();
  if (!inventory.ok()) return inventory.status();
  if (absl::Status s = a->PrepareState(*std::move(inventory)); !s.ok()) return s;
  a->WatchHealth();
  a->PrepareMps();
  if (absl::Status s = a->ServeKubelet(); !s.ok()) return s;
  a->health_->Start();
  a->StartMps();
  if (absl::Status s = a->ServeMetrics(); !s.ok()) return s;
  a->StartReconcile();
  return a;
}

absl::StatusOr<core::NodeInventory> Agent::OpenDevices() {
  AgentOptions& o = options_;
  // NVML: the library named (flag or $TESSERA_NVML_LIBRARY), else the driver root's, else the one
  // the dynamic loader finds (injected by the NVIDIA container toolkit).
  const char* env = getenv("TESSERA_NVML_LIBRARY");
  std::string not_in_root;
  if (o.source.simulate.empty() && o.source.nvml_library.empty() && (env == nullptr || !*env)) {
    if (std::string nvml = devices::FindDriverLibrary(o.driver, "libnvidia-ml.so.1");
        !nvml.empty()) {
      o.source.nvml_library = nvml;
      spdlog::info("NVML from the driver root: {}", nvml);
    } else {
      not_in_root = fmt::format(" (nor in the driver root {})", o.driver.root);
    }
  }
  // A driver that is not there (yet: the GPU operator may still be installing it) or not usable
  // is kUnavailable: the caller may try again.
  auto opened = devices::OpenDeviceSource(o.source);
  if (!opened.ok()) {
    return absl::UnavailableError(fmt::format("cannot read this node's GPUs: {}{}",
                                              std::string(opened.status().message()), not_in_root));
  }
  if (!opened->fallback_reason.empty()) {
    spdlog::warn("{}: using a simulated machine", opened->fallback_reason);
  }
  source_ = std::move(opened->source);
  auto inventory = source_->Discover();
  if (!inventory.ok()) {
    return absl::UnavailableError(
        fmt::format("cannot read this node's GPUs: {}", std::string(inventory.status().message())));
  }
  if (o.node_name.empty()) o.node_name = inventory->hostname;
  spdlog::info("node {}: {} GPU(s) from {}", o.node_name, inventory->gpus.size(),
               inventory->source);
  return inventory;
}

absl::Status Agent::PrepareState(core::NodeInventory inventory) {
  AgentOptions& o = options_;
  // The flags checked against the machine first: a bad one leaves nothing written.
  if (!o.plugin.shim_library.empty() && access(o.plugin.shim_library.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(
        fmt::format("--shim-library {}: {}", o.plugin.shim_library, strerror(errno)));
  }
  absl::StatusOr<std::vector<devices::MpsGpu>> mps = std::vector<devices::MpsGpu>{};
  if (!o.mps_gpus.empty()) mps = devices::MpsGpusOf(o.mps_gpus, inventory);
  if (!mps.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("--mps-gpus: {}", std::string(mps.status().message())));
  }
  o.plugin.driver_files = devices::FindDriverFiles(inventory, o.driver);
  if (!o.cdi_dir.empty()) {
    auto path =
        devices::WriteCdiSpec(o.cdi_dir, devices::BuildCdiSpec(inventory, o.plugin.driver_files));
    if (!path.ok()) return path.status();
    spdlog::info("CDI spec written to {}", *path);
  }
  // Made without MPS GPUs too: the daemons an earlier start ran are found and told to quit.
  mps_ = std::make_unique<devices::MpsDaemons>(o.mps_control, o.plugin.state_dir + "/mps", *mps);
  o.plugin.mps = mps_.get();
  auto state = DeviceState::Create(std::move(inventory), o.plugin);
  if (!state.ok()) return state.status();
  state_ = std::move(*state);
  state_->OnRelease([this](const Allocation& a, const shim::RegionData* head, uint64_t launches) {
    if (a.resource == Resource::kGpu) {
      ReportWholeUse(a);
    } else {
      ReportShareUse(a, head, launches);
    }
  });
  if (!o.plugin.shim_library.empty()) {
    // Every container given shares paces its launches through this one file.
    std::string arbiter = DeviceState::ArbiterPath(o.plugin);
    char err[256] = "";
    if (!shim::CreateArbiterFile(arbiter.c_str(), err, sizeof err)) {
      spdlog::warn("GPU arbiter {}: {}; compute shares will not be enforced", arbiter, err);
    } else {
      chmod(arbiter.c_str(), 0666);
      if (char previous[4200];
          shim::ArbiterPreviousKept(arbiter.c_str(), previous, sizeof previous))
        spdlog::info(
            "GPU arbiter {}: the one of before an upgrade is kept at {} (the agent's "
            "alone) while containers that mapped it may run: their GPU time is read from "
            "both",
            arbiter, previous);
    }
  }
  return absl::OkStatus();
}

void Agent::WatchHealth() {
  const int n = static_cast<int>(state_->inventory().gpus.size());
  health_changes_ = std::vector<std::atomic<uint64_t>>(n);
  health_ = std::make_unique<devices::HealthWatch>(
      *source_, n, options_.health, Clock(), [this](int gpu, const devices::GpuHealth& h) {
        if (gpu < 0 || gpu >= static_cast<int>(health_changes_.size())) return;
        ++health_changes_[gpu];
        const core::Gpu& g = state_->inventory().gpus[gpu];
        if (h.healthy) {
          spdlog::info("GPU {} ({}) is healthy again", gpu, g.uuid);
        } else {
          spdlog::warn("GPU {} ({}) is unhealthy: {}", gpu, g.uuid, h.reason);
        }
        {
          core::MutexLock lock(gpu_health_mu_);
          device_health_[gpu] = h;
        }
        ApplyHealth(gpu);
      });
  core::MutexLock lock(gpu_health_mu_);
  device_health_.assign(n, devices::GpuHealth{});
}

void Agent::PrepareMps() {
  mps_->QuitLeftBehind();  // each said in the log
  {
    // No MPS GPU is offered until its daemon answers (StartMps).
    core::MutexLock lock(gpu_health_mu_);
    for (const devices::MpsGpu& g : mps_->gpus()) mps_down_[g.index] = "not started yet";
  }
  for (const devices::MpsGpu& g : mps_->gpus()) ApplyHealth(g.index);
}

void Agent::StartMps() {
  if (mps_->gpus().empty()) return;
  // After the kubelet's API and the API server's clients exist: the watch's calls use them. Its
  // first round (each daemon started) is done before this returns.
  mps_->Start(options_.mps_check_interval, [this](int gpu, bool up, const std::string& reason) {
    const core::Gpu& g = state_->inventory().gpus[gpu];
    bool died = false;
    {
      core::MutexLock lock(gpu_health_mu_);
      died = !up && !mps_down_.contains(gpu);
      if (up) {
        mps_down_.erase(gpu);
      } else {
        mps_down_[gpu] = reason;
      }
    }
    if (up) {
      spdlog::info("GPU {} ({}): its MPS daemon answers", gpu, g.uuid);
    } else {
      // A death is news; a daemon not running yet at the start is not.
      spdlog::log(died ? spdlog::level::warn : spdlog::level::info,
                  "GPU {} ({}): its MPS daemon is down ({}); the GPU is offered as Unhealthy "
                  "until it answers",
                  gpu, g.uuid, reason);
    }
    ApplyHealth(gpu);
    // The pods whose processes were its clients lost their MPS server: said on each.
    if (!died || !events_) return;
    for (const Allocation& a : state_->Allocations()) {
      const size_t slash = a.pod.find('/');
      if (slash == std::string::npos ||
          std::find(a.gpus.begin(), a.gpus.end(), g.uuid) == a.gpus.end()) {
        continue;
      }
      events_->Record(
          {.kind = "Pod", .ns = a.pod.substr(0, slash), .name = a.pod.substr(slash + 1)}, "Warning",
          "MpsDaemonDied", "Serving",
          fmt::format("GPU {} ({}): its MPS control daemon {}; this pod's CUDA processes lost "
                      "their MPS server (a new daemon is started for new ones)",
                      gpu, g.uuid, reason));
    }
  });
}

void Agent::ApplyHealth(int gpu) {
  bool healthy = true;
  std::string reason;
  {
    core::MutexLock lock(gpu_health_mu_);
    if (gpu < 0 || gpu >= static_cast<int>(device_health_.size())) return;
    healthy = device_health_[gpu].healthy;
    reason = device_health_[gpu].reason;
    if (auto it = mps_down_.find(gpu); it != mps_down_.end()) {
      reason = healthy ? "MPS daemon: " + it->second : reason + "; MPS daemon: " + it->second;
      healthy = false;
    }
  }
  state_->SetHealth(gpu, healthy, reason);
  if (dra_state_) dra_state_->SetHealth(gpu, healthy, reason);
  if (slices_) slices_->Poke();
  if (node_sync_) node_sync_->Poke();
}

absl::Status Agent::ServeKubelet() {
  const AgentOptions& o = options_;
  if (!o.pod_resources_socket.empty()) {
    pod_resources_ = std::make_unique<PodResourcesClient>(o.pod_resources_socket);
  }
  ConnectApiServer();
  ReportSetAside("device plugin", state_->set_aside());
  if (o.dra) return StartDra();
  PluginServer::HintLookup hint;
  PluginServer::HintUsed hint_used;
  if (node_sync_) {
    hint = [this](Resource r, int count) { return node_sync_->Hint(r, count); };
    hint_used = [this](const PodHint& h) { node_sync_->Allocated(h); };
  }
  PluginServer::Refused refused;
  if (events_) {
    refused = [this](Resource r, const PodHint* h, const std::string& why) {
      const std::string note = fmt::format("{}: {}", ResourceName(r), why);
      if (h != nullptr) {
        events_->Record(
            {.kind = "Pod", .ns = h->pod_namespace, .name = h->pod_name, .uid = h->pod_uid},
            "Warning", "AllocateRefused", "Allocating", note);
      } else {
        events_->Record({.kind = "Node", .name = options_.node_name}, "Warning", "AllocateRefused",
                        "Allocating", note);
      }
    };
  }
  plugin_ = std::make_unique<PluginServer>(
      *state_, o.server, hint, [this] { Reconcile(); }, hint_used, refused);
  return plugin_->Start();
}

absl::Status Agent::ServeMetrics() {
  net::HttpServerOptions http;
  http.unix_path = options_.plugin.state_dir + "/agent.sock";
  http.tcp_address = options_.metrics_address;
  auto srv = net::HttpServer::Start(http, [this](const net::HttpRequest& r) {
    net::HttpResponse resp;
    if (r.method != "GET") {
      resp.status = 405;
      resp.content_type = "text/plain";
      resp.body = "only GET\n";
    } else if (r.path == "/metrics") {
      resp.content_type = "text/plain; version=0.0.4";
      resp.body = Metrics();
    } else if (r.path == "/healthz") {
      resp.content_type = "text/plain";
      resp.body = "ok\n";
    } else {
      resp.status = 404;
      resp.content_type = "text/plain";
      resp.body = "not found: try /metrics or /healthz\n";
    }
    return resp;
  });
  if (!srv.ok()) return srv.status();
  http_ = std::move(*srv);
  if (!options_.metrics_address.empty()) {
    spdlog::info("metrics on {} (port {})", options_.metrics_address, http_->tcp_port());
  }
  return absl::OkStatus();
}

void Agent::StartReconcile() {
  if (!pod_resources_) return;
  reconcile_thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, options_.reconcile_interval);
      if (stop_) break;
      lock.unlock();
      Reconcile();
      lock.lock();
    }
  });
}

absl::Status Agent::StartDra() {
  AgentOptions& o = options_;
  DraOptions d = o.dra_options;
  if (d.pool.empty()) d.pool = o.node_name;
  if (d.dir.empty()) d.dir = fmt::format("{}/plugins/{}", o.dra_plugin.kubelet_dir, d.driver);
  if (d.cdi_dir.empty()) d.cdi_dir = o.cdi_dir;
  auto state = DraState::Create(state_->inventory(), o.plugin, d);
  if (!state.ok()) return state.status();
  dra_state_ = std::move(*state);
  dra_state_->OnUnprepare(
      [this](const std::vector<DraState::ShareUse>& used) { ReportClaimUse(used); });
  // What is already known of the GPUs (an MPS GPU whose daemon has not answered yet).
  for (int g = 0; g < static_cast<int>(state_->inventory().gpus.size()); ++g) ApplyHealth(g);
  if (!dra_state_->set_aside().empty()) RebuildDra();
  DraPluginOptions po = o.dra_plugin;
  // A (re)started kubelet wipes the node's slices: looked at when it registers the driver.
  po.on_registered = [this] {
    if (slices_) slices_->Poke();
  };
  dra_plugin_ = std::make_unique<DraPlugin>(*dra_state_, kube_.get(), po);
  if (absl::Status s = dra_plugin_->Start(); !s.ok()) return s;
  if (kube_) {
    slices_ = std::make_unique<SlicePublisher>(
        *kube_, *dra_state_,
        SlicePublisherOptions{.node_name = o.node_name,
                              .resync = o.label_resync,
                              .sysfs_root = o.sysfs_root,
                              // An upgraded driver shows in the slices at the next pass.
                              .driver_version = [this]() -> std::string {
                                auto now = source_->Discover();
                                return now.ok() ? now->driver_version : "";
                              }});
    slices_->Start();
  } else {
    spdlog::warn(
        "DRA without an API server: no ResourceSlices are published and only claims "
        "in the checkpoint can be prepared");
  }
  return absl::OkStatus();
}

// Bounded whatever the API server does: its calls in flight are cut first (a hung API server
// would otherwise hold each thread for the client's request timeout). The node's ResourceSlices
// stay, as upstream's kubelet plugin helper leaves them: the kubelet deletes them if the driver
// has not registered again within its grace period, and an upgrade's new pod finds them current.
void Agent::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (kube_) kube_->Shutdown();
  if (reconcile_thread_.joinable()) reconcile_thread_.join();
  if (state_) state_->Shutdown();
  if (plugin_) plugin_->Stop();
  if (dra_state_) dra_state_->Shutdown();
  if (dra_plugin_) dra_plugin_->Stop();
  if (slices_) slices_->Stop();
  if (node_sync_) node_sync_->Stop();
  events_.reset();
  if (health_) health_->Stop();
  // The daemons stay: the pods that are their clients outlive the agent (an upgrade, a restart).
  if (mps_) mps_->StopWatch(false);
  if (http_) http_->Stop();
}

void Agent::ConnectApiServer() {
  const AgentOptions& o = options_;
  if (!o.use_api_server) return;
  const char* env_kubeconfig = std::getenv("KUBECONFIG");
  const char* env_host = std::getenv("KUBERNETES_SERVICE_HOST");
  if (o.kubeconfig.empty() && !(env_kubeconfig && *env_kubeconfig) && !(env_host && *env_host)) {
    kube_error_ = "no API server configured (--kubeconfig, KUBECONFIG or a pod's service account)";
    spdlog::info("{}: node labels and the extender's GPU choices are off", kube_error_);
    return;
  }
  auto config = kube::LoadDefault(o.kubeconfig, o.kube_context);
  absl::StatusOr<std::unique_ptr<kube::Client>> client =
      config.ok() ? kube::Client::Create(*config) : config.status();
  if (!client.ok()) {
    kube_error_ = std::string(client.status().message());
    spdlog::error(
        "API server: {}; the agent serves the kubelet without node labels or the "
        "extender's GPU choices",
        kube_error_);
    return;
  }
  kube_ = std::move(*client);
  spdlog::info("API server {} ({})", config->server, config->origin);
  NodeSyncOptions so;
  so.node_name = o.node_name;
  so.resync = o.label_resync;
  node_sync_ = std::make_unique<NodeSync>(*kube_, *state_, so);
  // A repeat after the minute is a new event: the agent's RBAC grants events create only.
  events_ = std::make_unique<kube::EventRecorder>(
      *kube_,
      kube::EventRecorderOptions{
          .controller = "tessera.io/agent", .instance = o.node_name, .patch_series = false});
}

void Agent::ReportSetAside(const std::string& what, const std::string& aside) {
  if (aside.empty() || !events_) return;
  events_->Record(
      {.kind = "Node", .name = options_.node_name}, "Warning", "CheckpointSetAside", "Starting",
      fmt::format("the {} checkpoint could not be used and was moved to {}; {}", what, aside,
                  what == "DRA" ? "claims in use on this node were prepared again from the "
                                  "API server"
                                : "the kubelet's own record of each pod's devices stands"));
}

std::pair<std::string, std::string> Agent::PodOf(const Allocation& a,
                                                 const std::optional<ContainerRef>& holder) {
  if (const size_t slash = a.pod.find('/'); slash != std::string::npos)
    return {a.pod.substr(0, slash), a.pod.substr(slash + 1)};
  if (holder) return {holder->pod_namespace, holder->pod};
  return {};
}

double Agent::HeldSeconds(const Allocation& a) const {
  const auto now = static_cast<int64_t>(core::Seconds(Clock().Now()));
  return static_cast<double>(std::max<int64_t>(0, now - a.created_unix));
}

std::string Agent::MemoryUseNote(const shim::RegionData& head, const std::vector<std::string>& gpus,
                                 kube::GpuUse* use) {
  std::vector<std::string> parts;
  auto most = [](std::optional<int64_t>& at, int64_t v) { at = std::max(at.value_or(0), v); };
  for (size_t i = 0; i < gpus.size() && i < head.device_count; ++i) {
    const uint64_t peak = head.peak[i].load(), limit = head.limit[i];
    most(use->peak_mib, static_cast<int64_t>(core::MibRoundedUp(peak)));
    if (limit > 0) most(use->limit_mib, static_cast<int64_t>(limit >> 20));
    std::string part =
        limit > 0 ? fmt::format("{} MiB of the {} MiB given on {} ({:.0f}%)", peak >> 20,
                                limit >> 20, gpus[i], 100.0 * static_cast<double>(peak) / limit)
                  : fmt::format("{} MiB on {}", peak >> 20, gpus[i]);
    if (const uint64_t n = head.refused[i].load(); n > 0) {
      const uint64_t wanted = head.wanted_peak[i].load();
      use->refused = use->refused.value_or(0) + static_cast<int64_t>(n);
      most(use->wanted_mib, static_cast<int64_t>(core::MibRoundedUp(wanted)));
      part +=
          fmt::format(", and {} allocation{} refused at that limit (it asked for {} MiB at most)",
                      n, n == 1 ? "" : "s", core::MibRoundedUp(wanted));
    }
    parts.push_back(std::move(part));
  }
  return fmt::format("its GPU share used a peak of {}", absl::StrJoin(parts, "; "));
}

void Agent::ReportClaimUse(const std::vector<DraState::ShareUse>& used) {
  // A DRA claim's share requests, as a device plugin share's pod is told (its memory and GPU
  // time): on the ResourceClaim, which `kubectl describe` shows, and in the log; and on each pod
  // it was reserved for, in tessera.io/gpu-use once it has ended (its requests together: the
  // longest held, the busiest, the highest peak, the refusals and launches of all).
  std::optional<kube::GpuUse> together;
  auto most = [](std::optional<int64_t>& a, const std::optional<int64_t>& b) {
    if (b) a = std::max(a.value_or(*b), *b);
  };
  auto sum = [](std::optional<int64_t>& a, const std::optional<int64_t>& b) {
    if (b) a = a.value_or(0) + *b;
  };
  for (const DraState::ShareUse& u : used) {
    if (!u.head) continue;
    kube::GpuUse use;
    std::string note =
        fmt::format("request {}: {}", u.request, MemoryUseNote(*u.head, u.gpus, &use));
    // Its GPU time, as a device plugin share's (not for an MPS client: no time slices; not for
    // a claim of an earlier agent, which did not keep when it was prepared).
    if (u.sliced && u.held_s >= 0)
      AddGpuTime(u.ns, kDraDriver, u.indices, u.share, u.arbiter_job, u.held_s,
                 dra_state_->arbiter_path(), &note, &use);
    spdlog::info("claim {}/{}: {}", u.ns, u.name, note);
    auto tell = [&](const char* type, const char* reason, const std::string& what) {
      if (events_)
        events_->Record({.api_version = "resource.k8s.io/v1",
                         .kind = "ResourceClaim",
                         .ns = u.ns,
                         .name = u.name},
                        type, reason, "Unprepared", what);
    };
    tell(use.refused ? "Warning" : "Normal", "GPUShareUse", note);
    // Outgrown: its memory was sized "auto" (the extender's webhook) and its limit refused
    // allocations - never silent; its pods' tessera.io/gpu-use teaches its kind the most it
    // asked, so the next claim is sized past it.
    if (u.auto_memory && use.refused.value_or(0) > 0) {
      const std::string outgrew = fmt::format(
          "request {}: its automatic GPU memory of {}Mi refused {} allocation{} (measured peak "
          "{}MiB; it asked for {}MiB at most): the next claim of its kind is sized past it (or "
          "set a ShareConfig memory of at least {}Mi)",
          u.request, use.limit_mib.value_or(0), *use.refused, *use.refused == 1 ? "" : "s",
          use.peak_mib.value_or(0), use.wanted_mib.value_or(0),
          std::max(use.wanted_mib.value_or(0), use.peak_mib.value_or(0)));
      spdlog::warn("claim {}/{}: {}", u.ns, u.name, outgrew);
      tell("Warning", "OutgrewGPUMemory", outgrew);
    }
    if (u.held_s >= 0) use.seconds = static_cast<int64_t>(u.held_s);
    if (!together) {
      together = use;
      continue;
    }
    together->seconds = std::max(together->seconds, use.seconds);
    most(together->busy_permille, use.busy_permille);
    most(together->held_back_permille, use.held_back_permille);
    most(together->peak_mib, use.peak_mib);
    most(together->limit_mib, use.limit_mib);
    most(together->wanted_mib, use.wanted_mib);
    sum(together->refused, use.refused);
    sum(together->kernel_launches, use.kernel_launches);
  }
  if (together && !used.empty())
    for (const std::string& pod : used.front().pods) TellUse(used.front().ns, pod, *together);
}

void Agent::ReportShareUse(const Allocation& a, const shim::RegionData* head, uint64_t launches) {
  if (head == nullptr) return;  // a whole GPU, or a region that cannot be read
  // What the share's pod used of the GPU memory it was given, per GPU (as `tessera eff` says of a
  // server's job): logged, and a Normal Event on the pod, which outlives it in the API server.
  // Allocations its limit refused make it a Warning, with the most it asked.
  const double held_s = HeldSeconds(a);
  kube::GpuUse use{.seconds = static_cast<int64_t>(held_s)};
  if (launches > 0) use.kernel_launches = static_cast<int64_t>(launches);
  std::string note = MemoryUseNote(*head, a.gpus, &use);
  const bool refused = use.refused.has_value();
  std::optional<ContainerRef> holder;
  {
    core::MutexLock lock(share_holders_mu_);
    if (auto it = share_holders_.find(a.id); it != share_holders_.end()) holder = it->second;
  }
  const auto [ns, name] = PodOf(a, holder);
  // Its GPU time: what the arbiter charged it over its life, against its share of its GPUs then
  // (seff's question, as `tessera eff` answers it on the standalone server). Not for a gang's
  // share (its time slices are the gang's on this node) or an MPS client (no time slices).
  std::vector<int> gpus;
  double share = 1;
  bool sliced = a.arbiter_job.empty();
  for (const auto& [g, n] : state_->SharesOnGpus(a)) {
    sliced = sliced && !IsMps(state_->options(), g);
    gpus.push_back(g);
    share = std::min(share, static_cast<double>(n) / state_->options().shares_per_gpu);
  }
  if (sliced)
    AddGpuTime(ns, kShareResource, gpus, share, a.id, held_s, state_->arbiter_path(), &note, &use);
  spdlog::info("allocation {} ({}): {}", a.id, name.empty() ? "pod unknown" : ns + "/" + name,
               note);
  if (events_ && !name.empty())
    events_->Record({.kind = "Pod", .ns = ns, .name = name}, refused ? "Warning" : "Normal",
                    "GPUShareUse", "Released", note);
  TellUse(ns, name, use);
}

void Agent::AddGpuTime(const std::string& ns, std::string_view resource,
                       const std::vector<int>& gpus, double share, const std::string& job,
                       double held_s, const std::string& arbiter, std::string* note,
                       kube::GpuUse* use) {
  if (gpus.empty() || access(arbiter.c_str(), F_OK) != 0) return;
  const shim::ArbiterUse arbiter_use =
      shim::ArbiterJobUse(arbiter.c_str(), gpus.data(), static_cast<int>(gpus.size()),
                          shim::ArbiterJobKey(job.c_str()));
  const double busy_s = static_cast<double>(arbiter_use.busy_us) / 1e6;
  const double waited_s = static_cast<double>(arbiter_use.held_us) / 1e6;
  const double given_s = held_s * share * static_cast<double>(gpus.size());
  *note += fmt::format("; {:.1f} s of GPU time in its {:.0f} s", busy_s, held_s);
  if (given_s > 0) {
    *note += fmt::format(" ({:.0f}% of its {:g}% share{})", 100 * busy_s / given_s, 100 * share,
                         gpus.size() > 1 ? " of each GPU" : "");
  }
  if (held_s > 0) {
    const double n = static_cast<double>(gpus.size());
    use->busy_permille = std::clamp<int64_t>(std::llround(1000 * busy_s / held_s / n), 0, 1000);
    // Its launches waited for the GPU (other pods' slices): how long, and what it would have used
    // had they not - what its kind learns (a share held to its slices measures at most its size).
    const int64_t held_back =
        std::clamp<int64_t>(std::llround(1000 * waited_s / held_s / n), 0, 1000);
    if (held_back > 0) {
      use->held_back_permille = held_back;
      *note += fmt::format(
          "; its launches waited for the GPU {:.0f}% of the time: it would have "
          "used {:.0f}% of a GPU",
          static_cast<double>(held_back) / 10,
          static_cast<double>(use->WantedPermille().value_or(0)) / 10);
    }
  }
  core::MutexLock lock(ended_mu_);
  std::pair<double, double>& seconds = ended_gpu_seconds_[{ns, std::string(resource)}];
  seconds.first += given_s;
  seconds.second += busy_s;
  ended_held_back_seconds_[{ns, std::string(resource)}] += waited_s;
}

void Agent::TellUse(const std::string& ns, const std::string& name, const kube::GpuUse& use) {
  if (node_sync_ && !name.empty()) node_sync_->Used(ns, name, kube::FormatGpuUse(use));
}

void Agent::RebuildDra() {
  const std::string aside = dra_state_->set_aside();
  if (!kube_) {
    spdlog::error(
        "DRA checkpoint set aside ({}) and no API server: claims are prepared again "
        "only as the kubelet asks",
        aside);
    return;
  }
  // The claims allocated on this node's pool and reserved for a pod: in use, to be prepared
  // again now (their CDI specs and regions written) rather than when a pod restarts.
  auto list = kube_->List("/apis/resource.k8s.io/v1/resourceclaims");
  int done = 0, failed = 0;
  if (!list.ok()) {
    spdlog::error("DRA checkpoint set aside; listing ResourceClaims to rebuild: {}",
                  std::string(list.status().message()));
  } else {
    const DraOptions& d = dra_state_->options();
    for (const nlohmann::json& c : list->items) {
      const nlohmann::json* results =
          kube::FieldAt(c, {"status", "allocation", "devices", "results"});
      const nlohmann::json* reserved = kube::FieldAt(c, {"status", "reservedFor"});
      if (!results || !results->is_array() || !reserved || !reserved->is_array() ||
          reserved->empty()) {
        continue;
      }
      bool ours = false;
      for (const nlohmann::json& r : *results) {
        ours = ours ||
               (kube::StringAt(r, {"driver"}) == d.driver && kube::StringAt(r, {"pool"}) == d.pool);
      }
      if (!ours) continue;
      auto made = dra_state_->Prepare(kube::StringAt(c, {"metadata", "namespace"}),
                                      kube::StringAt(c, {"metadata", "name"}),
                                      kube::StringAt(c, {"metadata", "uid"}), c);
      if (made.ok()) {
        ++done;
      } else {
        ++failed;
        spdlog::error("rebuilding DRA state: {}", std::string(made.status().message()));
      }
    }
  }
  spdlog::warn(
      "DRA state rebuilt from the API server after the checkpoint was set aside: {} "
      "claim(s) prepared again, {} failed",
      done, failed);
  ReportSetAside("DRA", aside);
}

int Agent::metrics_port() const { return http_ ? http_->tcp_port() : 0; }

bool Agent::Reconcile() {
  if (!pod_resources_) return false;
  std::lock_guard lock(reconcile_mu_);
  auto held = pod_resources_->List({kGpuResource, kShareResource});
  if (!held.ok()) {
    if (pod_resources_errors_++ == 0) spdlog::warn("{}", std::string(held.status().message()));
    return false;
  }
  std::set<std::string> in_use;
  for (const auto& [id, c] : *held) in_use.insert(id);
  SampleWholeGpus(*held);
  char previous[4200];
  if (!options_.plugin.shim_library.empty() &&
      shim::ArbiterPreviousKept(DeviceState::ArbiterPath(options_.plugin).c_str(), previous,
                                sizeof previous)) {
    const std::string arbiter = DeviceState::ArbiterPath(options_.plugin);
    // The jobs of the containers it still holds keep it (theirs run in pid namespaces of their
    // own: idle, they cannot be told from gone).
    std::vector<uint64_t> jobs;
    for (const Allocation& a : state_->Allocations()) {
      if (!a.region.empty())
        jobs.push_back(shim::ArbiterJobKey((a.arbiter_job.empty() ? a.id : a.arbiter_job).c_str()));
    }
    if (dra_state_) {
      for (const std::string& job : dra_state_->ArbiterJobs())
        jobs.push_back(shim::ArbiterJobKey(job.c_str()));
    }
    if (shim::RemoveStaleArbiterPrevious(arbiter.c_str(), jobs.data(), jobs.size()))
      spdlog::info(
          "GPU arbiter {}: the one of before an upgrade is removed: none of the "
          "containers that mapped it is held here any more, used it for an hour, or is left",
          arbiter);
  }
  const auto now_unix = static_cast<int64_t>(core::Seconds(Clock().Now()));
  state_->Release(in_use, now_unix - options_.release_grace.count());
  return true;
}

void Agent::SampleWholeGpus(const DeviceHolders& holders) {
  const double now = core::Seconds(Clock().Now());
  std::map<int, std::optional<double>> util;  // percent, read once per GPU
  const std::vector<Allocation> held = state_->Allocations();
  core::MutexLock lock(ended_mu_);
  std::map<std::string, WholeUse> next;
  for (const Allocation& a : held) {
    if (a.resource != Resource::kGpu) continue;
    auto known = whole_use_.find(a.id);
    WholeUse use = known != whole_use_.end() ? known->second : WholeUse{};
    const double dt = use.last_s < 0 ? 0 : now - use.last_s;
    use.last_s = now;
    for (const std::string& id : a.device_ids) {
      if (auto h = holders.find(id); h != holders.end()) use.holder = h->second;
      const std::optional<int> g = state_->GpuOf(id);
      if (!g || dt <= 0) continue;
      if (!util.contains(*g)) {
        auto t = source_->ReadTelemetry(*g);
        util[*g] =
            t.ok() && t->utilization ? std::optional<double>(100 * *t->utilization) : std::nullopt;
      }
      if (!util[*g]) continue;  // not read: this stretch is not counted
      use.sampled_s += dt;
      use.busy_pct_s += *util[*g] * dt;
    }
    next[a.id] = use;
  }
  // Only what is held now: Reconcile releases right after (ReportWholeUse takes what it ends).
  whole_use_ = std::move(next);
}

void Agent::ReportWholeUse(const Allocation& a) {
  WholeUse use;
  {
    core::MutexLock lock(ended_mu_);
    auto it = whole_use_.find(a.id);
    if (it == whole_use_.end()) return;
    use = it->second;
    whole_use_.erase(it);
  }
  if (use.sampled_s <= 0) return;  // never sampled twice while held: nothing to say
  const auto [ns, name] = PodOf(a, use.holder);
  const double gpus = static_cast<double>(a.gpus.size());
  const double held_s = HeldSeconds(a);
  const double busy_pct = use.busy_pct_s / use.sampled_s;
  const std::string note = fmt::format(
      "its GPU{} {} busy {:.0f}% of the time sampled ({:.0f} s of its {:.0f} s, every {:g} s)",
      a.gpus.size() == 1 ? "" : "s", a.gpus.size() == 1 ? "was" : "were", busy_pct,
      use.sampled_s / gpus, held_s,
      std::chrono::duration<double>(options_.reconcile_interval).count());
  spdlog::info("allocation {} ({}): {}", a.id, name.empty() ? "pod unknown" : ns + "/" + name,
               note);
  {
    core::MutexLock lock(ended_mu_);
    std::pair<double, double>& seconds = ended_gpu_seconds_[{ns, std::string(kGpuResource)}];
    seconds.first += held_s * gpus;
    seconds.second += held_s * gpus * busy_pct / 100;
  }
  if (events_ && !name.empty())
    events_->Record({.kind = "Pod", .ns = ns, .name = name}, "Normal", "GPUUse", "Released", note);
  TellUse(ns, name,
          {.seconds = static_cast<int64_t>(held_s),
           .busy_permille = std::clamp<int64_t>(std::llround(busy_pct * 10), 0, 1000)});
}

std::string Agent::Metrics() {
  DeviceHolders holders;
  if (pod_resources_) {
    auto held = pod_resources_->List({kGpuResource, kShareResource});
    if (held.ok()) {
      holders = std::move(*held);
    } else {
      ++pod_resources_errors_;
    }
  }
  const core::NodeInventory& inv = state_->inventory();
  std::vector<devices::GpuHealth> health = health_->Snapshot();
  std::vector<GpuSample> gpus(inv.gpus.size());
  for (size_t i = 0; i < gpus.size(); ++i) {
    gpus[i].gpu = &inv.gpus[i];
    if (i < health.size()) gpus[i].health = health[i];
    // As advertised: an MPS GPU whose daemon is down is not healthy.
    gpus[i].health.healthy = state_->healthy(static_cast<int>(i));
    gpus[i].health_changes = health_changes_[i];
    auto t = source_->ReadTelemetry(static_cast<int>(i));
    if (t.ok()) {
      gpus[i].telemetry = *t;
      // dcgm-exporter's XID_ERRORS, where the driver gives readings at all.
      if (t->utilization || t->memory_used_bytes)
        gpus[i].telemetry->last_xid = gpus[i].health.last_xid;
    }
  }
  for (const auto& [id, c] : holders) {
    std::optional<int> g = state_->GpuOf(id);
    if (!g) continue;
    auto& list = gpus[*g].holders;
    if (std::find(list.begin(), list.end(), c) == list.end()) list.push_back(c);
  }
  for (const devices::MpsDaemonState& m : mps_->States()) {
    if (m.gpu >= 0 && m.gpu < static_cast<int>(gpus.size())) gpus[m.gpu].mps = m;
  }
  std::vector<ShareSample> shares;
  AgentCountersSample counters;
  {
    core::MutexLock lock(share_holders_mu_);
    std::map<std::string, ContainerRef> seen;
    for (const Allocation& a : state_->Allocations()) {
      (a.resource == Resource::kGpu ? counters.whole_allocations : counters.share_allocations)++;
      if (a.resource != Resource::kShare) continue;
      ShareSample s;
      s.allocation = a;
      for (const std::string& id : a.device_ids) {
        if (auto it = holders.find(id); it != holders.end()) s.holder = it->second;
      }
      if (auto known = share_holders_.find(a.id); !s.holder && known != share_holders_.end())
        s.holder = known->second;
      // Not held by any pod yet (the kubelet has not listed it): no series until it is, so that
      // the allocation's series have one identity, pod labels included.
      if (!s.holder) continue;
      seen[a.id] = *s.holder;
      ReadRegion(a.region, &s.used, &s.limit);
      shares.push_back(std::move(s));
    }
    share_holders_ = std::move(seen);  // released allocations forgotten
  }
  if (plugin_) {
    const PluginCounters& pc = plugin_->counters();
    counters.registrations = pc.registrations;
    counters.allocations = pc.allocations;
    counters.allocation_errors = pc.allocation_errors;
    counters.preferred = pc.preferred;
  }
  if (dra_plugin_) {
    const DraCounters& dc = dra_plugin_->counters();
    counters.registrations = dc.registrations;
    counters.allocations = dc.prepares;
    counters.allocation_errors = dc.prepare_errors;
  }
  counters.pod_resources_errors = pod_resources_errors_;
  {
    core::MutexLock lock(ended_mu_);
    counters.ended_gpu_seconds = ended_gpu_seconds_;
    counters.ended_held_back_seconds = ended_held_back_seconds_;
  }
  counters.api_server_configured = node_sync_ != nullptr;
  if (node_sync_) {
    const NodeSyncCounters& nc = node_sync_->counters();
    counters.labels_current = node_sync_->labels_current();
    counters.api_server_up = node_sync_->api_server_up();
    counters.label_updates = nc.label_updates;
    counters.label_errors = nc.label_errors;
    counters.hints_found = nc.hints_found;
    counters.hints_none = nc.hints_none;
    counters.hint_errors = nc.hint_errors;
    counters.allocated_marks = nc.allocated_marks;
    counters.mark_errors = nc.mark_errors;
    counters.use_marks = nc.use_marks;
    counters.use_errors = nc.use_errors;
  }
  return RenderMetrics(options_.node_name, gpus, shares, counters, options_.metrics_virtual_gpus);
}

}  // namespace tessera::agent
