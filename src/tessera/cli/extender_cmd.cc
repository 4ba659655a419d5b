#include "tessera/cli/extender_cmd.h"

#include <signal.h>

#include <CLI/CLI.hpp>

#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/extender/service.h"
#include "tessera/kube/config.h"
#include "tessera/sched/policy.h"

namespace tessera::cli {
namespace {

struct ExtenderFlags {
  extender::ServiceOptions o;
  std::string kubeconfig;
  std::string kube_context;
  std::string policies = "tessera";
  bool no_preemption = false;
  bool no_pod_groups = false;
  double fair_share_half_life_s = 0;
};

int RunExtender(ExtenderFlags& f, std::ostream& err) {
  auto policies = sched::ParsePolicies(f.policies);
  if (!policies.ok()) {
    err << "tessera: --policies: " << policies.status().message() << "\n";
    return kExitBadInput;
  }
  f.o.extender.scheduler.policies = *policies;
  f.o.extender.cycle.preemption = !f.no_preemption;
  f.o.extender.cycle.fair_share_half_life_s = f.fair_share_half_life_s;
  f.o.pod_groups = !f.no_pod_groups;
  auto config = kube::LoadDefault(f.kubeconfig, f.kube_context);
  if (!config.ok()) {
    err << "tessera: " << config.status().message() << "\n";
    return kExitBadInput;
  }
  auto client = kube::Client::Create(*config);
  if (!client.ok()) {
    err << "tessera: " << client.status().message() << "\n";
    return kExitFailure;
  }
  sigset_t set = BlockStopSignals();
  auto service = extender::Service::Start(**client, f.o, core::SteadyClock::Get());
  if (!service.ok()) {
    err << "tessera: " << service.status().message() << "\n";
    return service.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput
                                                                         : kExitFailure;
  }
  spdlog::info("tessera extender: policies {}, API server {}", f.policies, config->server);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("signal {}: stopping (reservations not yet bound are dropped)", sig);
  (*service)->Stop();
  (*client)->Shutdown();
  return kExitOk;
}

}  // namespace

std::shared_ptr<void> AddExtenderCommand(CLI::App& app, std::function<int()>& action,
                                         std::ostream& out, std::ostream& err) {
  auto s = std::make_shared<ExtenderFlags>();
  ExtenderFlags& f = *s;
  CLI::App* e = app.add_subcommand(
      "extender",
      "Run the Kubernetes scheduler extender: kube-scheduler asks it where tessera.io/gpu and "
      "tessera.io/gpu-share pods go (filter, prioritize, bind, preempt; docs/kubernetes.md)");
  e->add_option("--listen", f.o.listen, "host:port to serve kube-scheduler and /metrics on")
      ->capture_default_str();
  e->add_option("--tls-cert", f.o.tls_cert_file, "PEM certificate: serve HTTPS (with --tls-key)");
  e->add_option("--tls-key", f.o.tls_key_file, "PEM private key of --tls-cert");
  e->add_option("--kubeconfig", f.kubeconfig,
                "kubeconfig for the API server (default: $KUBECONFIG, else the pod's service "
                "account)");
  e->add_option("--kube-context", f.kube_context,
                "Context of the kubeconfig to use (default: its current-context)");
  e->add_option("--policies", f.policies,
                "Placement policies, as in 'tessera sim' (tessera, fgd, bestfit:1,topology:0.5, "
                "...)")
      ->capture_default_str();
  e->add_option("--seed", f.o.extender.scheduler.seed, "Seed of the tie-breaks between equal nodes")
      ->capture_default_str();
  e->add_option("--quota-configmap", f.o.quota_configmap,
                "namespace/name of the ConfigMap whose quotas.yaml sets per-namespace GPU quotas; "
                "empty: no quotas")
      ->capture_default_str();
  e->add_option("--reservation-timeout", f.o.extender.reservation_timeout_s,
                "Seconds a pod's chosen GPUs stay reserved for its bind (gang members: for the "
                "whole gang)")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  e->add_option("--utilization-ceiling", f.o.extender.utilization_ceiling_pct,
                "A share whose pod says its expected GPU utilization (annotation "
                "tessera.io/gpu-utilization) goes where its GPU's predicted utilization stays "
                "within this percentage, else on the least busy GPU with room; 0: off")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  e->add_flag("--utilization-ceiling-strict", f.o.extender.utilization_ceiling_strict,
              "Such a share waits rather than go over the ceiling");
  e->add_option("--fair-share-half-life", f.fair_share_half_life_s,
                "Order equal-priority pods by their namespace's recent GPU use, decaying by half "
                "in this many seconds; 0: off")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  e->add_flag("!--no-events", f.o.events,
              "Post no Kubernetes Events on the pods it keeps waiting or evicts (they need RBAC "
              "for events.k8s.io events: create, patch)");
  e->add_option("--event-instance", f.o.instance,
                "reportingInstance of its Events (default: the host name, in a pod its name)");
  e->add_flag("--no-preemption", f.no_preemption,
              "Never stop running pods, for priority or to reclaim lent quota");
  e->add_flag("--no-pod-groups", f.no_pod_groups,
              "Do not watch scheduling.x-k8s.io PodGroups (gangs then come only from Tessera's "
              "annotations)");
  e->callback([&, s] { action = [&, s] { return RunExtender(*s, err); }; });
  (void)out;
  return s;
}

}  // namespace tessera::cli
