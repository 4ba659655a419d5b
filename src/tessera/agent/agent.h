#pragma once
// `tessera agent`: one per Kubernetes GPU node. Discovers the GPUs (NVML or a simulated machine),
// writes the node's CDI spec, serves the device plugin to the kubelet (plugin_server.h), watches
// health and reports it through ListAndWatch, releases the allocations of ended pods
// (PodResources), and serves /metrics joined to pods. See docs/kubernetes.md.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/agent/device_state.h"
#include "tessera/agent/dra_plugin.h"
#include "tessera/agent/dra_slices.h"
#include "tessera/agent/dra_state.h"
#include "tessera/agent/node_sync.h"
#include "tessera/agent/plugin_server.h"
#include "tessera/agent/pod_resources.h"
#include "tessera/core/mutex.h"
#include "tessera/devices/cdi.h"
#include "tessera/devices/health.h"
#include "tessera/devices/mps.h"
#include "tessera/devices/open.h"
#include "tessera/kube/events.h"
#include "tessera/kube/gpu_annotations.h"

namespace tessera::net {
class HttpServer;
}

namespace tessera::agent {

struct AgentOptions {
  std::string node_name;  // labels metrics; default: the host name
  devices::OpenOptions source;
  PluginOptions plugin;
  PluginServerOptions server;
  // The kubelet's PodResources socket; empty: no pod join, allocations kept until Allocate reuses
  // their IDs.
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::string cdi_dir = "/var/run/cdi";  // empty: no CDI spec written
  // Where the host's driver is (its libraries and tools for the CDI spec, NVML when no library is
  // named): root, the folder it is mounted at in this container; host_root, what that is on the
  // host. Device nodes come from this container's /dev (the host's).
  devices::DriverSearch driver{.dev_root = "/"};
  // /metrics on TCP ("0.0.0.0:9400", ":0" for any port); empty: only on <state_dir>/agent.sock.
  std::string metrics_address = "0.0.0.0:9400";
  // dcgm-exporter's --kubernetes-virtual-gpus: a shared GPU's series once per pod (RenderMetrics).
  bool metrics_virtual_gpus = false;
  devices::HealthPolicy health;
  std::chrono::milliseconds reconcile_interval{10000};
  // An allocation the kubelet does not list yet is kept this long (it records it after Allocate).
  std::chrono::seconds release_grace{60};
  // The API server, for node labels and the extender's GPU choices: `kubeconfig` (else
  // $KUBECONFIG, else the in-cluster service account when running in a pod). A config that cannot
  // be used is logged and the agent serves without (use_api_server=false: never).
  bool use_api_server = true;
  std::string kubeconfig;
  std::string kube_context;
  std::chrono::milliseconds label_resync{60000};
  // Which kubelet API serves the GPUs: the device plugin (tessera.io/gpu, tessera.io/gpu-share),
  // or DRA (resource.k8s.io/v1: the driver gpu.tessera.io, its ResourceSlices and kubelet plugin).
  // One per node: both at once would give a GPU twice.
  bool dra = false;
  DraOptions dra_options;  // pool (the node name), dir and cdi_dir filled in when empty
  DraPluginOptions dra_plugin;
  std::string sysfs_root = "/sys";  // PCIe roots for ResourceSlices
  // NVIDIA MPS (docs/kubernetes.md): the GPUs shared by MPS ("all", indices, UUIDs), each with its
  // control daemon (pipe and log folders under <state_dir>/mps); the control program; how often
  // each daemon is asked whether it answers. A GPU whose daemon is down is advertised Unhealthy.
  std::vector<std::string> mps_gpus;
  std::string mps_control = "nvidia-cuda-mps-control";
  std::chrono::milliseconds mps_check_interval{2000};
};

class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Start(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  void Stop();
  int metrics_port() const;
  std::string Metrics();
  // Asks PodResources what is in use and releases ended allocations; false when it cannot tell.
  bool Reconcile();
  DeviceState& state() { return *state_; }
  DraState* dra_state() { return dra_state_.get(); }
  DraPlugin* dra_plugin() { return dra_plugin_.get(); }
  SlicePublisher* slices() { return slices_.get(); }
  NodeSync* node_sync() { return node_sync_.get(); }
  const core::NodeInventory& inventory() const { return state_->inventory(); }

 private:
  explicit Agent(AgentOptions options);
  // Agent::Start's steps, in order.
  absl::StatusOr<core::NodeInventory> OpenDevices();         // NVML (or a simulated machine)
  absl::Status PrepareState(core::NodeInventory inventory);  // CDI spec, checkpoint, arbiter
  void WatchHealth();
  // The MPS daemons: those left behind for GPUs no longer in MPS mode told to quit, and each MPS
  // GPU offered Unhealthy until its daemon answers (before the kubelet is served); then each MPS
  // GPU's daemon started and watched (after: the watch's calls reach the kubelet's API).
  void PrepareMps();
  void StartMps();
  // A GPU's health as advertised: the driver's (the health watch) and, in MPS mode, its daemon's.
  void ApplyHealth(int gpu);
  absl::Status ServeKubelet();  // the API server, then the device plugin or DRA
  absl::Status ServeMetrics();
  void StartReconcile();  // PodResources: releases the allocations of ended pods
  void ConnectApiServer();
  absl::Status StartDra();
  // After the DRA checkpoint was set aside: the claims in use on this node prepared again from
  // the API server, and an Event on the node.
  void RebuildDra();
  // A Warning Event on the node: `what`'s checkpoint was moved to `aside` (nothing when empty).
  void ReportSetAside(const std::string& what, const std::string& aside);
  // An ended share's use of its GPU memory (its region's peaks) and of its GPU time (the arbiter's
  // charge against its share over its life): logged, an Event on its pod, and its namespace's
  // counters. A whole GPU's goes to ReportWholeUse.
  void ReportShareUse(const Allocation& a, const shim::RegionData* head, uint64_t launches);
  // Writes `use` on the ended pod (tessera.io/gpu-use) through the node sync: the extender's
  // history for pods sized "auto" learns from it.
  void TellUse(const std::string& ns, const std::string& name, const kube::GpuUse& use);
  // "its GPU share used a peak of 3072 MiB of the 10240 MiB given on GPU-... (30%)[, and N
  // allocations refused ...]" for a region's `gpus`, with the same figures into `use`.
  static std::string MemoryUseNote(const shim::RegionData& head,
                                   const std::vector<std::string>& gpus, kube::GpuUse* use);
  // What the arbiter charged `job` (its key) on `gpus` over its `held_s` with `share` (0..1) of
  // each: said in `note` ("; 42.0 s of GPU time in its 600 s (28% of its 25% share)"), its busy
  // share in `use`, and both added to the namespace's counters for `resource`. Nothing where the
  // arbiter file is not there.
  void AddGpuTime(const std::string& ns, std::string_view resource, const std::vector<int>& gpus,
                  double share, const std::string& job, double held_s, const std::string& arbiter,
                  std::string* note, kube::GpuUse* use);
  // An unprepared DRA claim's share requests: a GPUShareUse Event on the ResourceClaim.
  void ReportClaimUse(const std::vector<DraState::ShareUse>& used);
  // An ended allocation's pod (namespace, name): as the extender named it, else as `holder` (who
  // PodResources said held it) is; empty when neither is known.
  static std::pair<std::string, std::string> PodOf(const Allocation& a,
                                                   const std::optional<ContainerRef>& holder);
  // How long `a` has been held, in whole seconds (its age as created_unix counts it).
  double HeldSeconds(const Allocation& a) const;
  // Wall time (options_.plugin.clock, else the system's): the health watch, allocations' ages.
  const core::Clock& Clock() const {
    return options_.plugin.clock ? *options_.plugin.clock : core::SystemClock::Get();
  }

  AgentOptions options_;
  std::unique_ptr<devices::DeviceSource> source_;
  std::unique_ptr<DeviceState> state_;
  std::unique_ptr<devices::HealthWatch> health_;
  std::unique_ptr<devices::MpsDaemons> mps_;  // its gpus() empty when none is in MPS mode
  // What ApplyHealth combines, per GPU: the driver's word, and why its MPS daemon is down.
  core::Mutex gpu_health_mu_;
  std::vector<devices::GpuHealth> device_health_ ABSL_GUARDED_BY(gpu_health_mu_);
  std::map<int, std::string> mps_down_ ABSL_GUARDED_BY(gpu_health_mu_);
  std::unique_ptr<PluginServer> plugin_;
  std::unique_ptr<DraState> dra_state_;
  std::unique_ptr<DraPlugin> dra_plugin_;
  std::unique_ptr<SlicePublisher> slices_;
  std::unique_ptr<PodResourcesClient> pod_resources_;
  std::unique_ptr<kube::Client> kube_;
  std::unique_ptr<NodeSync> node_sync_;
  // Events for refused Allocates (on the pod the extender's choice names, else on the node).
  std::unique_ptr<kube::EventRecorder> events_;
  std::string kube_error_;  // why there is no API server connection
  std::unique_ptr<net::HttpServer> http_;
  std::vector<std::atomic<uint64_t>> health_changes_;
  std::atomic<uint64_t> pod_resources_errors_{0};
  // The pod each share allocation was last seen held by: its series keep one set of labels for the
  // allocation's life (a holder that leaves PodResources before the allocation is released keeps
  // its labels), and a share no pod has held yet has none (Metrics).
  core::Mutex share_holders_mu_;
  std::map<std::string, ContainerRef> share_holders_ ABSL_GUARDED_BY(share_holders_mu_);
  // Ended pods' GPU-seconds by namespace and resource since the agent started: given (its GPUs,
  // or its share of them, over its life) and busy (what the arbiter charged a share; a whole
  // GPU's sampled utilization). Metrics' tessera_pod_gpu_*_seconds_total.
  core::Mutex ended_mu_;
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> ended_gpu_seconds_
      ABSL_GUARDED_BY(ended_mu_);
  // Time-sliced shares': how long their launches waited for the GPU (other pods' slices), in
  // GPU-seconds. tessera_pod_gpu_held_back_seconds_total.
  std::map<std::pair<std::string, std::string>, double> ended_held_back_seconds_
      ABSL_GUARDED_BY(ended_mu_);
  // Whole-GPU allocations' utilization as sampled at each reconcile: the GPU-seconds sampled and
  // the utilization (percent) times them, summed over its GPUs; and when it was last sampled.
  struct WholeUse {
    double sampled_s = 0, busy_pct_s = 0, last_s = -1;
    std::optional<ContainerRef> holder;  // the pod PodResources last said holds it
  };
  std::map<std::string, WholeUse> whole_use_ ABSL_GUARDED_BY(ended_mu_);
  // Adds each whole-GPU allocation's utilization since its last sample, and who holds it
  // (Reconcile, with PodResources' holders).
  void SampleWholeGpus(const DeviceHolders& holders);
  // An ended whole-GPU allocation's busy share, sampled over its life: logged, an Event on its pod,
  // and its namespace's counters.
  void ReportWholeUse(const Allocation& a);
  std::mutex reconcile_mu_;  // one reconcile at a time

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread reconcile_thread_;
};

}  // namespace tessera::agent
