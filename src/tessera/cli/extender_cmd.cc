#include "tessera/cli/extender_cmd.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <filesystem>

#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/extender/service.h"
#include "tessera/extender/tls_secret.h"
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
  std::string tls_secret;  // namespace/name
  std::vector<std::string> tls_dns;
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
  std::string tls_dir;  // the Secret's files for the listener, removed at the end
  if (!f.tls_secret.empty()) {
    const size_t slash = f.tls_secret.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == f.tls_secret.size() ||
        !f.o.tls_cert_file.empty() || !f.o.client_ca_file.empty()) {
      err << "tessera: --tls-secret takes namespace/name, and replaces --tls-cert, --tls-key and "
             "--client-ca\n";
      return kExitBadInput;
    }
    extender::TlsSecretOptions t;
    t.ns = f.tls_secret.substr(0, slash);
    t.name = f.tls_secret.substr(slash + 1);
    t.dns = f.tls_dns;
    if (t.dns.empty()) {
      for (const char* suffix : {"", ".{}", ".{}.svc", ".{}.svc.cluster.local"})
        t.dns.push_back("tessera-extender" + fmt::format(fmt::runtime(suffix), t.ns));
    }
    if (!f.o.client_names.empty()) t.client_name = f.o.client_names.front();
    char dir[] = "/tmp/tessera-extender-tls.XXXXXX";
    if (mkdtemp(dir) == nullptr) {
      err << "tessera: a folder for the TLS files: " << strerror(errno) << "\n";
      return kExitFailure;
    }
    tls_dir = t.dir = dir;
    auto files = extender::EnsureTlsSecret(**client, t);
    if (!files.ok()) {
      std::filesystem::remove_all(tls_dir);
      err << "tessera: " << files.status().message() << "\n";
      return kExitFailure;
    }
    f.o.tls_cert_file = files->cert_file;
    f.o.tls_key_file = files->key_file;
    f.o.client_ca_file = files->ca_file;
    if (f.o.client_names.empty()) f.o.client_names = {t.client_name};
    f.o.webhook_ca_file = files->ca_file;
  }
  if (!f.o.webhook_configuration.empty() && f.tls_secret.empty()) {
    std::filesystem::remove_all(tls_dir);
    err << "tessera: --webhook-configuration sets the CA of --tls-secret as its caBundle: give "
           "--tls-secret too (or set caBundle yourself and leave it out)\n";
    return kExitBadInput;
  }
  if (!f.o.webhook_configuration.empty() && f.o.webhook_listen.empty()) {
    std::filesystem::remove_all(tls_dir);
    err << "tessera: --webhook-configuration without --webhook-listen: nothing serves it\n";
    return kExitBadInput;
  }
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      if (!dir.empty()) std::filesystem::remove_all(dir);
    }
  } remove_tls_dir{tls_dir};
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
  e->add_option("--listen", f.o.listen,
                "host:port to serve kube-scheduler on (and /metrics without --metrics-listen)")
      ->capture_default_str();
  e->add_option("--tls-cert", f.o.tls_cert_file, "PEM certificate: serve HTTPS (with --tls-key)");
  e->add_option("--tls-key", f.o.tls_key_file, "PEM private key of --tls-cert");
  e->add_option("--client-ca", f.o.client_ca_file,
                "PEM CA: with TLS, only clients presenting a certificate of it may call (mutual "
                "TLS; kube-scheduler's extender tlsConfig certFile/keyFile)");
  e->add_option("--client-name", f.o.client_names,
                "The common name a client certificate must have (repeatable; default with "
                "--tls-secret: tessera-scheduler)");
  e->add_option("--tls-secret", f.tls_secret,
                "namespace/name of a Secret holding this extender's CA, server certificate and "
                "kube-scheduler's client certificate, made at the first start when missing; "
                "serves HTTPS to clients of that CA only (docs/kubernetes.md)");
  e->add_option(
      "--tls-dns", f.tls_dns,
      "The server certificate's DNS names with --tls-secret (repeatable; default "
      "tessera-extender, .<namespace>, .<namespace>.svc, .<namespace>.svc.cluster.local)");
  e->add_option("--metrics-listen", f.o.metrics_listen,
                "host:port of a plain-HTTP listener for GET /metrics and /healthz only (for "
                "Prometheus and probes when --listen wants client certificates); empty: none")
      ->capture_default_str();
  e->add_option("--webhook-listen", f.o.webhook_listen,
                "host:port of the mutating admission webhook that sizes pods asking "
                "tessera.io/gpu-share: auto (POST /mutate-pods) and DRA claims asking "
                "tessera.io/gpu-share or gpu-memory: auto (POST /mutate-resourceclaims), HTTPS "
                "with the --tls-secret or --tls-cert certificate (client certificates: "
                "--webhook-client-ca); deploy/components/auto-share; empty: none");
  e->add_option("--webhook-configuration", f.o.webhook_configuration,
                "Name of the MutatingWebhookConfiguration whose caBundle the extender keeps set to "
                "the CA of --tls-secret");
  e->add_option("--webhook-client-ca", f.o.webhook_client_ca_file,
                "PEM CA: only callers of the webhook presenting a certificate of it (an API server "
                "configured with one for admission webhooks)");
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
  f.o.history_configmap = "tessera-system/tessera-gpu-history";
  e->add_option("--history-configmap", f.o.history_configmap,
                "namespace/name of the ConfigMap where what ended pods used (the history "
                "tessera.io/gpu-memory and gpu-share: auto size from) is kept across restarts; "
                "empty: in memory only")
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
  e->add_option("--auto-size-margin", f.o.extender.auto_size_margin_pct,
                "A pod asking tessera.io/gpu-memory: auto gets the 95th percentile of the peak GPU "
                "memory pods of its kind used plus this percentage, one asking "
                "tessera.io/gpu-share: auto their busy share plus it (a trial's recommendation "
                "too)")
      ->check(CLI::Range(0, 200))
      ->capture_default_str();
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
  e->add_flag("--dra", f.o.dra,
              "Also help kube-scheduler place pods with DRA claims of Tessera's driver "
              "(gpu.tessera.io): POST /dra/filter and /dra/prioritize, from a second extender "
              "entry without managedResources (deploy/components/dra); watches ResourceSlices, "
              "ResourceClaims and ResourceClaimTemplates");
  e->callback([&, s] { action = [&, s] { return RunExtender(*s, err); }; });
  (void)out;
  return s;
}

}  // namespace tessera::cli
