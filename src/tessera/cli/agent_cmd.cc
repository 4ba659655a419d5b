#include "tessera/cli/agent_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <ctime>

#include "spdlog/spdlog.h"
#include "tessera/agent/agent.h"
#include "tessera/cli/app.h"
#include "tessera/devices/atomic_file.h"
#include "tessera/shim/arbiter.h"

namespace tessera::cli {
namespace {

struct AgentFlags {
  agent::AgentOptions o;
  std::string fallback_simulate;
  double recovery_s = 300;
  double probe_s = 10;
  double reconcile_s = 10;
  double release_grace_s = 60;
  bool no_shares = false;
  double driver_retry_s = 60;
  bool no_api_server = false;
  double label_resync_s = 60;
  std::vector<int> dra_share_gpus;
  double mps_check_s = 2;
  std::string install_from, install_to;
};

int RunAgent(AgentFlags& f, std::ostream& err) {
  agent::AgentOptions o = f.o;
  if (o.plugin.shim_library.empty() && !f.no_shares) o.plugin.shim_library = FindInterceptLibrary();
  if (f.no_shares) o.plugin.shim_library.clear();
  if (o.plugin.shim_library.empty() && !f.no_shares) {
    err << "tessera: no libtessera-cuda.so next to this binary: name it with --shim-library, or "
           "serve whole GPUs only with --no-shares\n";
    return kExitBadInput;
  }
  o.health.recovery_quiet_period =
      std::chrono::milliseconds(static_cast<int64_t>(f.recovery_s * 1000));
  o.health.probe_interval = std::chrono::milliseconds(static_cast<int64_t>(f.probe_s * 1000));
  o.reconcile_interval = std::chrono::milliseconds(static_cast<int64_t>(f.reconcile_s * 1000));
  o.release_grace = std::chrono::seconds(static_cast<int64_t>(f.release_grace_s));
  o.source.fallback_simulate = f.fallback_simulate;
  o.use_api_server = !f.no_api_server;
  o.label_resync = std::chrono::milliseconds(static_cast<int64_t>(f.label_resync_s * 1000));
  o.dra_options.share_gpus = {f.dra_share_gpus.begin(), f.dra_share_gpus.end()};
  o.mps_check_interval = std::chrono::milliseconds(static_cast<int64_t>(f.mps_check_s * 1000));
  if (!o.dra &&
      (!f.dra_share_gpus.empty() || o.dra_options.partitionable || o.dra_options.consumable)) {
    err << "tessera: --dra-share-gpus, --dra-partitionable and --dra-consumable need --dra\n";
    return kExitBadInput;
  }
  if (o.dra && o.cdi_dir.empty()) {
    err << "tessera: --dra answers claims with CDI IDs: --cdi-dir must not be empty\n";
    return kExitBadInput;
  }
  // Stop on SIGTERM/SIGINT, taken synchronously; the agent's threads never see them.
  sigset_t set = BlockStopSignals();
  // Without a usable driver (not installed yet, the container not given it) the agent says so and
  // tries again, 1 s after the first failure, doubling up to f.driver_retry_s; a stop signal ends
  // the wait.
  auto a = agent::Agent::Start(o);
  for (double wait_s = 1;
       !a.ok() && a.status().code() == absl::StatusCode::kUnavailable && f.driver_retry_s > 0;
       wait_s = std::min(2 * wait_s, f.driver_retry_s)) {
    wait_s = std::min(wait_s, f.driver_retry_s);
    spdlog::warn(
        "{}; is the NVIDIA driver installed on this node and reachable from the agent "
        "(docs/kubernetes.md, \"Node prerequisites\")? trying again in {:g} s",
        std::string(a.status().message()), wait_s);
    const timespec t{static_cast<time_t>(wait_s),
                     static_cast<long>((wait_s - static_cast<time_t>(wait_s)) * 1e9)};
    if (const int sig = sigtimedwait(&set, nullptr, &t); sig > 0) {
      spdlog::info("signal {}: stopping before the driver was found", sig);
      return kExitOk;
    }
    a = agent::Agent::Start(o);
  }
  if (!a.ok()) {
    err << "tessera: " << a.status().message() << "\n";
    return a.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  if (o.dra) {
    spdlog::info("tessera agent ready: {} GPU(s), DRA driver {} under {}, state in {}",
                 (*a)->inventory().gpus.size(), o.dra_options.driver, o.dra_plugin.kubelet_dir,
                 o.plugin.state_dir);
  } else {
    spdlog::info("tessera agent ready: {} GPU(s), plugins in {}, state in {}",
                 (*a)->inventory().gpus.size(), o.server.plugin_dir, o.plugin.state_dir);
  }
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("signal {}: stopping (allocations stay in the checkpoint)", sig);
  (*a)->Stop();
  return kExitOk;
}

}  // namespace

std::shared_ptr<void> AddAgentCommand(CLI::App& app, std::function<int()>& action,
                                      std::ostream& out, std::ostream& err) {
  auto s = std::make_shared<AgentFlags>();
  AgentFlags& f = *s;
  f.o.plugin.state_dir = "/var/lib/tessera/agent";
  CLI::App* a = app.add_subcommand(
      "agent",
      "Run the Kubernetes node agent: device plugin for tessera.io/gpu and tessera.io/gpu-share, "
      "health, CDI spec, per-pod metrics (docs/kubernetes.md)");
  a->add_option("--node-name", f.o.node_name,
                "This node's name in metrics (default: $NODE_NAME, else the host name)")
      ->envname("NODE_NAME");
  a->add_option("--simulate", f.o.source.simulate,
                "Simulate this machine (a preset or inventory file) instead of the driver");
  a->add_option("--fallback-simulate", f.fallback_simulate,
                "Preset to simulate when no NVIDIA driver is found (default: fail)");
  a->add_option(
      "--nvml-library", f.o.source.nvml_library,
      "The NVML library to load (default: $TESSERA_NVML_LIBRARY, else libnvidia-ml.so.1)");
  a->add_option("--driver-root", f.o.driver.root,
                "Where the host's NVIDIA driver root is mounted in this container (the host's / "
                "or the GPU operator's /run/nvidia/driver): its libraries and tools go into the "
                "CDI spec, and NVML is loaded from it unless --nvml-library names one")
      ->capture_default_str();
  a->add_option("--host-driver-root", f.o.driver.host_root,
                "What --driver-root is on the host: the CDI spec's host paths are under it")
      ->capture_default_str();
  a->add_option("--driver-retry", f.driver_retry_s,
                "Without a usable driver, try again after 1 s, doubling up to this many seconds; "
                "0: exit at once")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  a->add_option("--device-plugin-dir", f.o.server.plugin_dir,
                "The kubelet's device-plugin folder (our sockets go there; kubelet.sock in it)")
      ->capture_default_str();
  a->add_option("--kubelet-socket", f.o.server.kubelet_socket,
                "The kubelet's registration socket (default: <device-plugin-dir>/kubelet.sock)");
  a->add_option("--pod-resources-socket", f.o.pod_resources_socket,
                "The kubelet's PodResources socket, for per-pod metrics and releasing ended "
                "allocations; empty: none")
      ->capture_default_str();
  a->add_option("--state-dir", f.o.plugin.state_dir,
                "Checkpoint of allocations, shared regions and the GPU arbiter")
      ->capture_default_str();
  a->add_option("--cdi-dir", f.o.cdi_dir, "Where the node's CDI spec is written; empty: none")
      ->capture_default_str();
  a->add_option("--metrics-address", f.o.metrics_address,
                "host:port for /metrics and /healthz (:0 any free port; empty: only the unix "
                "socket <state-dir>/agent.sock)")
      ->capture_default_str();
  a->add_option("--kubeconfig", f.o.kubeconfig,
                "kubeconfig for the API server (node labels, the extender's GPU choices); default: "
                "$KUBECONFIG, else the pod's service account; none: the agent serves the kubelet "
                "without them");
  a->add_option("--kube-context", f.o.kube_context,
                "Context of the kubeconfig to use (default: its current-context)");
  a->add_flag("--no-api-server", f.no_api_server,
              "Never talk to the API server: no node labels, Allocate ignores pod annotations");
  a->add_option("--label-resync", f.label_resync_s,
                "Seconds between checks of the node's labels when nothing changed")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  // At most the arbiter's jobs per GPU: a share pod beyond them would run unpaced (issue 50).
  a->add_option("--shares-per-gpu", f.o.plugin.shares_per_gpu,
                "tessera.io/gpu-share devices per GPU: one share is 1/N of its compute and memory "
                "(at most 64, the jobs the GPU arbiter paces on one GPU)")
      ->check(CLI::Range(1, shim::kArbiterJobs))
      ->capture_default_str();
  a->add_option("--shim-library", f.o.plugin.shim_library,
                "libtessera-cuda.so on the host, mounted into containers given shares (default: "
                "the one next to this binary)");
  a->add_flag("--no-shares", f.no_shares, "Serve whole GPUs only (no tessera.io/gpu-share)");
  a->add_flag("--kubernetes-virtual-gpus", f.o.metrics_virtual_gpus,
              "As dcgm-exporter's flag: a GPU shared by several pods has its DCGM_FI_* series once "
              "per pod, each with its labels (default: once per GPU, its first holder's labels)");
  a->add_option("--default-priority", f.o.plugin.default_priority,
                "Time-slice priority of shares whose pod names none")
      ->check(CLI::Range(-1000, 1000))
      ->capture_default_str();
  a->add_option("--health-recovery", f.recovery_s,
                "Seconds without a critical event (and a good probe) before a sick GPU is healthy "
                "again; 0: never")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  a->add_option("--health-probe", f.probe_s, "Seconds between probes of every GPU")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  a->add_option("--reconcile-interval", f.reconcile_s,
                "Seconds between PodResources checks that release ended pods' allocations")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  a->add_flag("--dra", f.o.dra,
              "Serve the GPUs through Kubernetes DRA (resource.k8s.io/v1, driver gpu.tessera.io: "
              "ResourceSlices and the kubelet plugin) instead of the device plugin");
  a->add_option("--dra-driver", f.o.dra_options.driver, "The DRA driver's name")
      ->capture_default_str();
  a->add_option("--kubelet-dir", f.o.dra_plugin.kubelet_dir,
                "The kubelet's folder: DRA sockets go in its plugins/ and plugins_registry/")
      ->capture_default_str();
  a->add_option("--dra-share-gpus", f.dra_share_gpus,
                "GPU indices published as --shares-per-gpu share devices instead of whole GPUs "
                "(with --dra; comma-separated)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1023));
  a->add_flag("--dra-partitionable", f.o.dra_options.partitionable,
              "Publish every GPU both whole and as --shares-per-gpu shares, tied by a counter set "
              "per GPU (DRA partitionable devices: needs the DRAPartitionableDevices feature gate "
              "on the API server and kube-scheduler; with --dra)");
  a->add_flag("--dra-consumable", f.o.dra_options.consumable,
              "Publish every GPU as one device claims share by amounts of its capacities memory "
              "and compute (percent), enforced as shares (DRA consumable capacity: needs the "
              "DRAConsumableCapacity feature gate; with --dra)");
  a->add_option("--sysfs-root", f.o.sysfs_root,
                "Where sysfs is, for the PCIe root of each GPU in ResourceSlices")
      ->capture_default_str();
  a->add_option("--mps-gpus", f.o.mps_gpus,
                "GPUs shared by NVIDIA MPS instead of time slices: all, or indices and UUIDs "
                "(comma-separated). Each gets its own nvidia-cuda-mps-control daemon; a share of "
                "one is a client of it")
      ->delimiter(',');
  a->add_option("--mps-control", f.o.mps_control,
                "The MPS control program (a path, or a name the PATH finds)")
      ->capture_default_str();
  a->add_option("--mps-check-interval", f.mps_check_s,
                "Seconds between checks that each MPS daemon answers (a dead one is started again)")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  a->add_option("--mps-shm-dir", f.o.plugin.mps_shm_dir,
                "The host folder that is the MPS daemons' /dev/shm, mounted at /dev/shm in their "
                "clients' containers (the agent's own /dev/shm must be this folder)")
      ->capture_default_str();
  a->add_option("--release-grace", f.release_grace_s,
                "Seconds an allocation is kept although PodResources does not list it (the kubelet "
                "records it only after Allocate answers)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  a->callback([&, s] { action = [&, s] { return RunAgent(*s, err); }; });

  // The agent image's init container and package scripts: the intercept library into the folder
  // CDI mounts it from, by rename (issue 49: `cp` over a preloaded library killed running pods).
  CLI::App* inst = app.add_subcommand(
      "install-library",
      "Install libtessera-cuda.so into a folder without touching the copy running processes have "
      "mapped (a new file renamed over the old; nothing written when the bytes are the same)");
  inst->add_option("--from", f.install_from,
                   "The library to install (default: the one beside this binary)");
  inst->add_option("--to", f.install_to, "The folder to install it into")->required();
  inst->callback([&, s] {
    action = [&, s] {
      std::string from = f.install_from.empty() ? FindInterceptLibrary() : f.install_from;
      if (from.empty()) {
        err << "tessera: no libtessera-cuda.so beside this binary: name it with --from\n";
        return kExitBadInput;
      }
      const std::string to = f.install_to + "/libtessera-cuda.so";
      bool changed = false;
      if (absl::Status st = devices::InstallFile(from, to, 0755, &changed); !st.ok()) {
        err << "tessera: install-library: " << st.message() << "\n";
        return kExitFailure;
      }
      out << (changed ? "installed " : "already current: ") << to << " (from " << from << ")\n";
      return kExitOk;
    };
  });
  return s;
}

}  // namespace tessera::cli
