#include "tessera/extender/service.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/extender/admission.h"
#include "tessera/kube/object.h"
#include "tessera/net/prometheus.h"

namespace tessera::extender {
namespace {

using nlohmann::json;

constexpr char kStarting[] =
    "the Tessera extender is starting: it answers once it has listed the nodes, pods and "
    "PodGroups";

net::HttpResponse JsonReply(int status, const json& body) {
  return net::HttpResponse{status, "application/json", body.dump()};
}

// kube-scheduler reads `Error` from every answer; a request it could not have meant is a 400.
net::HttpResponse BadRequest(const std::string& verb, const std::string& why) {
  spdlog::warn("extender: bad {} request: {}", verb, why);
  return JsonReply(400, json{{"Error", fmt::format("{}: {}", verb, why)}});
}

std::string Escape(const std::string& s) { return kube::QueryEscape(s); }

// The reason of the Event on a pod that waits, by why (FilterResult::wait_kind).
const char* WaitReason(const std::string& kind) {
  if (kind == "quota") return "WaitingForQuota";
  if (kind == "gang") return "WaitingForGang";
  if (kind == "preemption") return "WaitingForPreemption";
  return "WaitingForGpus";
}

}  // namespace

Service::Service(kube::Client& client, ServiceOptions options, const core::Clock& clock)
    : client_(client), options_(std::move(options)), clock_(clock) {
  extender_ = std::make_unique<Extender>(options_.extender, clock_);
  if (options_.events) {
    std::string instance = options_.instance;
    if (instance.empty()) {
      char host[256] = {};
      instance = gethostname(host, sizeof host - 1) == 0 ? host : "tessera-extender";
    }
    events_ = std::make_unique<kube::EventRecorder>(
        client_, kube::EventRecorderOptions{.controller = "tessera.io/extender",
                                            .instance = instance,
                                            .repeat_interval_s = options_.event_repeat_s});
  }
}

absl::StatusOr<std::unique_ptr<Service>> Service::Start(kube::Client& client,
                                                        ServiceOptions options,
                                                        const core::Clock& clock) {
  std::string quota_ns, quota_name;
  if (!options.quota_configmap.empty()) {
    size_t slash = options.quota_configmap.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == options.quota_configmap.size()) {
      return absl::InvalidArgumentError(
          fmt::format("quota ConfigMap '{}': expected namespace/name", options.quota_configmap));
    }
    quota_ns = options.quota_configmap.substr(0, slash);
    quota_name = options.quota_configmap.substr(slash + 1);
  }
  std::string history_path;
  if (!options.history_configmap.empty()) {
    const std::string& h = options.history_configmap;
    const size_t slash = h.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == h.size() ||
        h.find('/', slash + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("history ConfigMap '{}': expected namespace/name", h));
    }
    history_path = "/api/v1/namespaces/" + Escape(h.substr(0, slash)) + "/configmaps/" +
                   Escape(h.substr(slash + 1));
  }
  std::unique_ptr<Service> s(new Service(client, std::move(options), clock));
  Service* self = s.get();
  // The history first: an ended pod the informer lists next is then known as learned already.
  s->history_path_ = history_path;
  if (!history_path.empty()) s->LoadHistory();
  Extender* ex = s->extender_.get();
  auto add = [&](kube::InformerOptions o, kube::Informer::Handler h) {
    s->informers_.push_back(std::make_unique<kube::Informer>(client, std::move(o), std::move(h)));
    return s->informers_.back().get();
  };
  s->nodes_ =
      add({.path = "/api/v1/nodes"}, [ex](kube::EventType t, const json& o) { ex->OnNode(t, o); });
  s->pods_ =
      add({.path = "/api/v1/pods"}, [ex](kube::EventType t, const json& o) { ex->OnPod(t, o); });
  if (s->options_.pod_groups) {
    // The coscheduling plugin's CRD is optional: without it there are no gangs, and no warning.
    s->pod_groups_ = add({.path = "/apis/scheduling.x-k8s.io/v1alpha1/podgroups", .optional = true},
                         [ex](kube::EventType t, const json& o) { ex->OnPodGroup(t, o); });
  }
  if (s->options_.dra) {
    s->dra_ = std::make_unique<DraAdvisor>();
    DraAdvisor* dra = s->dra_.get();
    add({.path = "/apis/resource.k8s.io/v1/resourceslices",
         .field_selector = std::string("spec.driver=") + kDraDriverName},
        [dra](kube::EventType t, const json& o) {
          if (t != kube::EventType::kBookmark) dra->OnSlice(o, t == kube::EventType::kDeleted);
        });
    add({.path = "/apis/resource.k8s.io/v1/resourceclaims"},
        [dra](kube::EventType t, const json& o) {
          if (t != kube::EventType::kBookmark) dra->OnClaim(o, t == kube::EventType::kDeleted);
        });
    add({.path = "/apis/resource.k8s.io/v1/resourceclaimtemplates"},
        [dra](kube::EventType t, const json& o) {
          if (t != kube::EventType::kBookmark) dra->OnTemplate(o, t == kube::EventType::kDeleted);
        });
  }
  if (!quota_name.empty()) {
    add({.path = "/api/v1/namespaces/" + Escape(quota_ns) + "/configmaps",
         .field_selector = "metadata.name=" + quota_name},
        [ex, self](kube::EventType t, const json& o) {
          if (t == kube::EventType::kBookmark) return;
          absl::Status st = ex->SetQuotas(t == kube::EventType::kDeleted ? nullptr : &o);
          if (st.ok()) {
            ++self->counters_.quota_loads;
          } else {
            ++self->counters_.quota_errors;
            spdlog::error("extender: quotas unchanged: {}", std::string(st.message()));
          }
        });
  }
  net::HttpServerOptions http;
  http.tcp_address = s->options_.listen;
  http.tls_cert_file = s->options_.tls_cert_file;
  http.tls_key_file = s->options_.tls_key_file;
  http.tls_client_ca_file = s->options_.client_ca_file;
  http.tls_client_names = s->options_.client_names;
  http.max_body_bytes = 64 << 20;  // a NodeList of thousands of nodes when not node-cache-capable
  http.error_response = [](int status, const std::string& message) {
    return JsonReply(status, json{{"Error", message}});
  };
  auto srv =
      net::HttpServer::Start(http, [self](const net::HttpRequest& r) { return self->Handle(r); });
  if (!srv.ok()) {
    s->Stop();
    return srv.status();
  }
  s->http_ = std::move(*srv);
  if (!s->options_.metrics_listen.empty()) {
    net::HttpServerOptions m;
    m.tcp_address = s->options_.metrics_listen;
    m.max_body_bytes = 1 << 10;
    auto metrics = net::HttpServer::Start(m, [self](const net::HttpRequest& r) {
      if (r.method == "GET" &&
          (r.path == "/metrics" || r.path == "/healthz" || r.path == "/readyz"))
        return self->Handle(r);
      return net::HttpResponse{404, "text/plain", "this port serves only GET /metrics, /healthz\n"};
    });
    if (!metrics.ok()) {
      s->Stop();
      return absl::Status(metrics.status().code(),
                          fmt::format("--metrics-listen {}: {}", s->options_.metrics_listen,
                                      std::string(metrics.status().message())));
    }
    s->metrics_http_ = std::move(*metrics);
    spdlog::info("extender: /metrics and /healthz on {} (port {}, HTTP)",
                 s->options_.metrics_listen, s->metrics_port());
  }
  if (!s->options_.webhook_listen.empty()) {
    if (s->options_.tls_cert_file.empty() || s->options_.tls_key_file.empty()) {
      s->Stop();
      return absl::InvalidArgumentError(
          "--webhook-listen: the API server calls admission webhooks over HTTPS only: give "
          "--tls-secret (or --tls-cert and --tls-key)");
    }
    if (!s->options_.webhook_configuration.empty()) {
      std::ifstream in(s->options_.webhook_ca_file);
      std::stringstream text;
      text << in.rdbuf();
      s->webhook_ca_ = text.str();
      if (s->webhook_ca_.find("BEGIN CERTIFICATE") == std::string::npos) {
        s->Stop();
        return absl::InvalidArgumentError(fmt::format(
            "--webhook-configuration {}: no CA certificate to set as its caBundle in '{}' (give "
            "--tls-secret, whose CA it is)",
            s->options_.webhook_configuration, s->options_.webhook_ca_file));
      }
    }
    net::HttpServerOptions w;
    w.tcp_address = s->options_.webhook_listen;
    w.tls_cert_file = s->options_.tls_cert_file;
    w.tls_key_file = s->options_.tls_key_file;
    w.tls_client_ca_file = s->options_.webhook_client_ca_file;
    w.max_body_bytes = 8 << 20;  // a pod: at most the API server's 3 MiB request, reviewed
    auto webhook = net::HttpServer::Start(w, [self](const net::HttpRequest& r) {
      if (r.method == "POST" && r.path == "/mutate-pods") return self->HandleAdmission(r.body);
      if (r.method == "POST" && r.path == "/mutate-resourceclaims")
        return self->HandleClaimAdmission(r.body);
      if (r.method == "GET" && r.path == "/healthz") return self->Handle(r);
      return net::HttpResponse{
          404, "text/plain",
          "this port serves only POST /mutate-pods and POST /mutate-resourceclaims\n"};
    });
    if (!webhook.ok()) {
      s->Stop();
      return absl::Status(webhook.status().code(),
                          fmt::format("--webhook-listen {}: {}", s->options_.webhook_listen,
                                      std::string(webhook.status().message())));
    }
    s->webhook_http_ = std::move(*webhook);
    spdlog::info(
        "extender: the admission webhook (POST /mutate-pods, /mutate-resourceclaims) on {} (port "
        "{}, HTTPS{})",
        s->options_.webhook_listen, s->webhook_http_->tcp_port(),
        s->options_.webhook_client_ca_file.empty() ? "" : ", client certificates only");
  }
  s->worker_ = std::thread([self] { self->Work(); });
  spdlog::info("extender: listening on {} (port {}, {})", s->options_.listen, s->port(),
               s->options_.tls_cert_file.empty()    ? "HTTP"
               : s->options_.client_ca_file.empty() ? "HTTPS"
                                                    : "HTTPS, client certificates of its CA only");
  return s;
}

Service::~Service() { Stop(); }

void Service::Stop() {
  if (http_) http_->Stop();
  if (metrics_http_) metrics_http_->Stop();
  if (webhook_http_) webhook_http_->Stop();
  for (auto& i : informers_) i->Stop();
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  events_.reset();
}

bool Service::WaitForSync(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto& i : informers_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !i->WaitForSync(left)) return false;
  }
  return true;
}

bool Service::Ready() const {
  return nodes_->synced() && pods_->synced() && (!pod_groups_ || pod_groups_->synced());
}

int Service::port() const { return http_ ? http_->tcp_port() : 0; }
int Service::metrics_port() const { return metrics_http_ ? metrics_http_->tcp_port() : 0; }

void Service::Observe(double seconds) {
  int i = 0;
  while (i < kBucketCount && seconds > kBuckets[i]) ++i;
  ++latency_counts_[i];
  latency_sum_us_ += static_cast<uint64_t>(seconds * 1e6);
}

net::HttpResponse Service::Handle(const net::HttpRequest& r) {
  // kube-scheduler calls urlPrefix + "/" + verb: the verb is the last path segment.
  std::string verb = r.path.substr(r.path.rfind('/') + 1);
  if (r.method == "GET") {
    if (r.path == "/metrics") {
      return net::HttpResponse{200, "text/plain; version=0.0.4", Metrics()};
    }
    if (r.path == "/healthz" || r.path == "/readyz") {
      bool ready = Ready();
      return net::HttpResponse{ready ? 200 : 503, "text/plain",
                               ready ? "ok\n" : "listing nodes and pods\n"};
    }
    return net::HttpResponse{404, "text/plain",
                             "not found: POST filter, prioritize, bind, preempt; GET /metrics, "
                             "/healthz\n"};
  }
  if (r.method != "POST") {
    return JsonReply(405, json{{"Error", "only POST (and GET /metrics, /healthz)"}});
  }
  // The DRA entry's urlPrefix ends in /dra (deploy/components/dra).
  if (r.path.size() > verb.size() + 4 &&
      r.path.compare(r.path.size() - verb.size() - 5, 5, "/dra/") == 0) {
    if (!dra_) {
      return JsonReply(404, json{{"Error", "DRA help is off: start the extender with --dra"}});
    }
    if (verb == "filter") return HandleDra(r.body, false);
    if (verb == "prioritize") return HandleDra(r.body, true);
  }
  if (verb == "filter") return HandleFilter(r.body, false);
  if (verb == "prioritize") return HandleFilter(r.body, true);
  if (verb == "bind") return HandleBind(r.body);
  if (verb == "preempt") return HandlePreempt(r.body);
  ++counters_.bad_requests;
  return BadRequest(verb.empty() ? r.path : verb,
                    "unknown verb (expected filter, prioritize, bind or preempt)");
}

absl::StatusOr<json> Service::TrustedPod(const json& claimed) {
  const std::string ns = kube::StringAt(claimed, {"metadata", "namespace"});
  const std::string name = kube::StringAt(claimed, {"metadata", "name"});
  const std::string uid = kube::StringAt(claimed, {"metadata", "uid"});
  // Kubernetes' own bounds (a namespace is a DNS label, a pod name a DNS subdomain, a UID a UUID):
  // anything longer is no pod, and is neither looked up nor repeated whole.
  if (ns.empty() || name.empty() || ns.size() > 63 || name.size() > 253 || uid.size() > 64) {
    return absl::InvalidArgumentError(fmt::format(
        "Pod: metadata.namespace and metadata.name must name a pod (got {} and {} bytes{})",
        ns.size(), name.size(),
        uid.size() > 64 ? ", and a UID of " + std::to_string(uid.size()) : ""));
  }
  std::optional<json> cached = pods_ ? pods_->Get(ns + "/" + name) : std::nullopt;
  if (cached && (uid.empty() || kube::StringAt(*cached, {"metadata", "uid"}) == uid))
    return *cached;
  // Not seen yet (the watch lags kube-scheduler's by a moment), or recreated: ask.
  auto live = client_.Get("/api/v1/namespaces/" + Escape(ns) + "/pods/" + Escape(name));
  if (!live.ok()) {
    if (kube::HttpStatusOf(live.status()) == 404) {
      return absl::NotFoundError(fmt::format("pod {}/{} is not on the API server", ns, name));
    }
    return absl::UnavailableError(fmt::format("pod {}/{}: the API server did not say: {}", ns, name,
                                              std::string(live.status().message())));
  }
  if (!uid.empty() && kube::StringAt(*live, {"metadata", "uid"}) != uid) {
    return absl::NotFoundError(
        fmt::format("pod {}/{}: UID {} is not the API server's pod of that name", ns, name, uid));
  }
  return *std::move(live);
}

std::variant<Service::Args, net::HttpResponse> Service::ReadArgs(const std::string& body,
                                                                 bool prioritize) {
  const char* verb = prioritize ? "prioritize" : "filter";
  Args a;
  a.body = json::parse(body, nullptr, false);
  if (a.body.is_discarded() || !a.body.is_object()) {
    ++counters_.bad_requests;
    return BadRequest(verb, "the body is not a JSON object (ExtenderArgs)");
  }
  const json* claimed = kube::FieldAt(a.body, {"Pod"});
  if (!claimed || !claimed->is_object()) {
    ++counters_.bad_requests;
    return BadRequest(verb, "Pod: expected a v1.Pod object");
  }
  auto trusted = TrustedPod(*claimed);
  if (!trusted.ok()) {
    ++counters_.untrusted;
    spdlog::warn("extender: {}: {}", verb, std::string(trusted.status().message()));
    if (prioritize) return JsonReply(200, json::array());
    return JsonReply(200, json{{"NodeNames", nullptr},
                               {"Nodes", nullptr},
                               {"FailedNodes", json::object()},
                               {"FailedAndUnresolvableNodes", json::object()},
                               {"Error", std::string(trusted.status().message())}});
  }
  a.pod = *std::move(trusted);
  // NodeNames when kube-scheduler is told the extender caches nodes, else a whole NodeList.
  const json* node_names = kube::FieldAt(a.body, {"NodeNames"});
  const json* nodes = kube::FieldAt(a.body, {"Nodes"});
  if (node_names && node_names->is_array()) {
    a.node_names = true;
    for (const json& n : *node_names) {
      if (!n.is_string()) {
        ++counters_.bad_requests;
        return BadRequest(verb, "NodeNames: expected a list of strings");
      }
      a.names.push_back(n.get<std::string>());
    }
  } else if (nodes && nodes->is_object()) {
    const json* items = kube::FieldAt(*nodes, {"items"});
    if (items && !items->is_array()) {
      ++counters_.bad_requests;
      return BadRequest(verb, "Nodes.items: expected a list of v1.Node");
    }
    static const json kNone = json::array();
    for (const json& n : items ? *items : kNone) {
      std::string name = kube::StringAt(n, {"metadata", "name"});
      if (name.empty()) {
        ++counters_.bad_requests;
        return BadRequest(verb, "Nodes.items: a node without metadata.name");
      }
      a.names.push_back(name);
      a.node_objects[name] = &n;
    }
  } else {
    ++counters_.bad_requests;
    return BadRequest(verb, "neither NodeNames nor Nodes");
  }
  return a;
}

json Service::FilterReply(const Args& a, const std::vector<std::string>& nodes,
                          const std::map<std::string, std::string>& failed,
                          const std::map<std::string, std::string>& unresolvable,
                          const std::string& error) {
  json out;
  out["FailedNodes"] = failed;
  out["FailedAndUnresolvableNodes"] = unresolvable;
  out["Error"] = error;
  if (a.node_names) {
    out["NodeNames"] = nodes;
    out["Nodes"] = nullptr;
  } else {
    json list = {{"apiVersion", "v1"}, {"kind", "NodeList"}, {"items", json::array()}};
    for (const std::string& n : nodes) list["items"].push_back(*a.node_objects.at(n));
    out["Nodes"] = std::move(list);
    out["NodeNames"] = nullptr;
  }
  return out;
}

net::HttpResponse Service::HandleDra(const std::string& body, bool prioritize) {
  auto read = ReadArgs(body, prioritize);
  if (auto* early = std::get_if<net::HttpResponse>(&read)) return std::move(*early);
  Args& a = std::get<Args>(read);
  // A pod with Tessera's extended resources is the other extender entry's; a pod that asks
  // nothing of Tessera's DRA driver is none of ours: both pass with every node offered.
  DraDemand demand = dra_ && !HasTesseraResources(a.pod) ? dra_->DemandOf(a.pod) : DraDemand{};
  if (prioritize) {
    json out = json::array();
    if (!demand.empty()) {
      ++counters_.dra_prioritize;
      for (auto& [host, score] : dra_->Prioritize(demand, a.names)) {
        out.push_back({{"Host", host}, {"Score", score}});
      }
    } else {
      for (const std::string& n : a.names) out.push_back({{"Host", n}, {"Score", 0}});
    }
    return JsonReply(200, out);
  }
  std::map<std::string, std::string> failed;
  std::vector<std::string> keep = a.names;
  if (!demand.empty()) {
    ++counters_.dra_filter;
    keep = dra_->Filter(demand, a.names, &failed);
    spdlog::info("extender: dra filter {}: {} of {} node(s)", kube::ObjectKey(a.pod), keep.size(),
                 a.names.size());
  }
  return JsonReply(200, FilterReply(a, keep, failed, {}, ""));
}

net::HttpResponse Service::HandleFilter(const std::string& body, bool prioritize) {
  auto t0 = std::chrono::steady_clock::now();
  auto read = ReadArgs(body, prioritize);
  if (auto* early = std::get_if<net::HttpResponse>(&read)) return std::move(*early);
  const Args& a = std::get<Args>(read);
  const json* pod = &a.pod;
  const std::vector<std::string>& names = a.names;
  const std::string pod_id = kube::ObjectKey(*pod);
  if (prioritize) {
    ++counters_.prioritize;
    json out = json::array();
    for (auto& [host, score] : extender_->Prioritize(*pod, names)) {
      out.push_back({{"Host", host}, {"Score", score}});
    }
    return JsonReply(200, out);
  }
  if (!Ready()) {
    // Until nodes, pods and PodGroups are listed, the GPUs running pods hold are not all known:
    // a placement now could give them out twice (issue 49). kube-scheduler asks again.
    ++counters_.filter_unplaced;
    std::map<std::string, std::string> failed;
    for (const std::string& n : names) failed[n] = kStarting;
    spdlog::info("extender: filter {}: waits: {}", pod_id, kStarting);
    return JsonReply(200, FilterReply(a, {}, failed, {}, ""));
  }
  FilterResult f = extender_->Filter(*pod, names);
  json out = FilterReply(a, f.nodes, f.failed, f.unresolvable, f.error);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Observe(seconds);
  if (!f.error.empty()) {
    ++counters_.filter_errors;
    spdlog::warn("extender: filter {}: {}", pod_id, f.error);
  } else if (f.nodes.empty()) {
    ++counters_.filter_unplaced;
    spdlog::info("extender: filter {}: waits ({}): {}", pod_id, f.wait_kind, f.reason);
  } else {
    ++counters_.filter_placed;
    spdlog::info("extender: filter {}: node {} ({}, {:.2f} ms)", pod_id, f.nodes[0], f.reason,
                 seconds * 1e3);
  }
  if (events_ && f.nodes.empty()) {
    const kube::ObjectRef ref{.kind = "Pod",
                              .ns = kube::StringAt(*pod, {"metadata", "namespace"}),
                              .name = kube::StringAt(*pod, {"metadata", "name"}),
                              .uid = kube::StringAt(*pod, {"metadata", "uid"})};
    if (!f.error.empty()) {
      events_->Record(ref, "Warning", "InvalidGpuRequest", "Scheduling", f.error);
    } else {
      events_->Record(ref, "Normal", WaitReason(f.wait_kind), "Scheduling", f.reason);
    }
  }
  {
    std::lock_guard lock(mu_);
    wake_ = true;  // victims to evict, maybe
  }
  cv_.notify_all();
  return JsonReply(200, out);
}

net::HttpResponse Service::HandleBind(const std::string& body) {
  json args = json::parse(body, nullptr, false);
  if (args.is_discarded() || !args.is_object()) {
    ++counters_.bad_requests;
    return BadRequest("bind", "the body is not a JSON object (ExtenderBindingArgs)");
  }
  std::string name = kube::StringAt(args, {"PodName"});
  std::string ns = kube::StringAt(args, {"PodNamespace"});
  std::string uid = kube::StringAt(args, {"PodUID"});
  std::string node = kube::StringAt(args, {"Node"});
  if (name.empty() || ns.empty() || node.empty()) {
    ++counters_.bad_requests;
    return BadRequest("bind", "PodName, PodNamespace and Node are required");
  }
  auto plan = extender_->PrepareBind(ns, name, uid, node);
  if (!plan.ok()) {
    ++counters_.bind_errors;
    spdlog::warn("extender: bind {}/{} to {}: {}", ns, name, node,
                 std::string(plan.status().message()));
    return JsonReply(200, json{{"Error", std::string(plan.status().message())}});
  }
  const std::string pod_path = "/api/v1/namespaces/" + Escape(ns) + "/pods/" + Escape(name);
  if (plan->trial_s > 0) {
    // A trial: the kubelet ends it at its deadline (counted from its start on the node). Set
    // before the Binding, so that it never runs without it; the API server lets a pod's
    // activeDeadlineSeconds be set or lowered, never raised.
    json patch = {{"spec", {{"activeDeadlineSeconds", static_cast<int64_t>(plan->trial_s)}}}};
    if (!uid.empty()) patch["metadata"] = {{"uid", uid}};
    auto patched = client_.MergePatch(pod_path, patch);
    if (!patched.ok()) {
      ++counters_.bind_errors;
      std::string why = "setting its trial's spec.activeDeadlineSeconds: " +
                        std::string(patched.status().message());
      extender_->BindFailed(plan->pod_id, why);
      return JsonReply(200, json{{"Error", "binding " + plan->pod_id + ": " + why}});
    }
  }
  // One call: the API server copies a Binding's annotations onto the pod as it binds it, so the
  // agent never sees the pod bound without its GPUs.
  json annotations = {{kube::kAssignmentAnnotation, kube::FormatAssignment(plan->assignment)}};
  if (!plan->sizing.empty()) annotations[kSizingAnnotation] = plan->sizing;
  json binding = {{"apiVersion", "v1"},
                  {"kind", "Binding"},
                  {"metadata", {{"name", name}, {"namespace", ns}, {"annotations", annotations}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  if (!uid.empty()) binding["metadata"]["uid"] = uid;
  auto created = client_.Create(pod_path + "/binding", binding);
  if (!created.ok()) {
    ++counters_.bind_errors;
    std::string why = std::string(created.status().message());
    extender_->BindFailed(plan->pod_id, why);
    return JsonReply(200, json{{"Error", "binding " + plan->pod_id + ": " + why}});
  }
  ++counters_.binds;
  std::string gpus;
  for (const auto& c : plan->assignment.containers) {
    for (const auto& g : c.gpus) gpus += (gpus.empty() ? "" : ",") + g;
  }
  spdlog::info("extender: bound {} to {} (GPUs {}{}{})", plan->pod_id, node, gpus,
               plan->sizing.empty() ? "" : "; sized ", plan->sizing.empty() ? "" : plan->sizing);
  if (events_ && !plan->sizing.empty()) {
    events_->Record({.kind = "Pod", .ns = ns, .name = name, .uid = uid}, "Normal",
                    "SizedAutomatically", "Binding", plan->sizing);
  }
  return JsonReply(200, json{{"Error", ""}});
}

net::HttpResponse Service::Answer(const AdmissionAnswer& a) {
  if (a.http_status != 200) {
    ++counters_.admit_bad;
    spdlog::warn("extender: admission: {}", a.said);
  } else if (a.said.empty()) {
    ++counters_.admit_unchanged;
  } else if (a.body["response"].value("allowed", false)) {
    ++counters_.admit_sized;
    spdlog::info("extender: admission: {}", a.said);
  } else {
    ++counters_.admit_refused;
    spdlog::warn("extender: admission refused: {}", a.said);
  }
  return JsonReply(a.http_status, a.body);
}

net::HttpResponse Service::HandleAdmission(const std::string& body) {
  AdmissionAnswer a = AdmitPod(
      body, [this](const json& pod, size_t container, int asked) -> absl::StatusOr<ShareSize> {
        // Sized from the history and the nodes as listed: not before they are (a restarted
        // extender would size from nothing).
        if (!Ready()) return absl::UnavailableError(kStarting);
        return extender_->SizeShare(pod, container, asked);
      });
  return Answer(a);
}

net::HttpResponse Service::HandleClaimAdmission(const std::string& body) {
  AdmissionAnswer a = AdmitClaim(
      body, [this](const std::string& ns, const ClaimAsk& ask) -> absl::StatusOr<ClaimSize> {
        if (!Ready()) return absl::UnavailableError(kStarting);
        // Its pod (the resourceclaim controller makes a pod's claims once the pod exists): from
        // the watch, or asked.
        auto pod = TrustedPod(json{{"metadata",
                                    {{"namespace", ns.empty() ? "default" : ns},
                                     {"name", ask.pod},
                                     {"uid", ask.pod_uid}}}});
        if (!pod.ok()) {
          return absl::UnavailableError(fmt::format("its pod: {}; it is sized when its pod is seen",
                                                    std::string(pod.status().message())));
        }
        return extender_->SizeClaim(*pod, ask, dra_ ? dra_->SharesPerGpu() : 0);
      });
  return Answer(a);
}

bool Service::EnsureCaBundle() {
  const std::string path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/" +
                           Escape(options_.webhook_configuration);
  const std::string bundle = absl::Base64Escape(webhook_ca_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto got = client_.Get(path);
    if (!got.ok()) {
      ++counters_.ca_bundle_errors;
      spdlog::warn("extender: reading the MutatingWebhookConfiguration {}: {}; will retry",
                   options_.webhook_configuration, std::string(got.status().message()));
      return false;
    }
    json config = std::move(*got);
    bool changed = false;
    if (config.is_object() && config.contains("webhooks") && config["webhooks"].is_array()) {
      for (json& h : config["webhooks"]) {
        if (!h.is_object()) continue;
        json& cc = h["clientConfig"];
        if (!cc.is_object()) cc = json::object();
        if (cc.value("caBundle", json()) != bundle) cc["caBundle"] = bundle, changed = true;
      }
    }
    if (!changed) return true;
    auto put = client_.Replace(path, config);  // at its resourceVersion: a 409 reads it again
    if (put.ok()) {
      ++counters_.ca_bundle_writes;
      spdlog::info("extender: set its CA as the caBundle of the MutatingWebhookConfiguration {}",
                   options_.webhook_configuration);
      return true;
    }
    if (kube::HttpStatusOf(put.status()) != 409) {
      ++counters_.ca_bundle_errors;
      spdlog::warn(
          "extender: setting the caBundle of the MutatingWebhookConfiguration {}: {}; "
          "will retry",
          options_.webhook_configuration, std::string(put.status().message()));
      return false;
    }
  }
  return false;
}

net::HttpResponse Service::HandlePreempt(const std::string& body) {
  json args = json::parse(body, nullptr, false);
  if (args.is_discarded() || !args.is_object()) {
    ++counters_.bad_requests;
    return BadRequest("preempt", "the body is not a JSON object (ExtenderPreemptionArgs)");
  }
  const json* claimed = kube::FieldAt(args, {"Pod"});
  if (!claimed || !claimed->is_object()) {
    ++counters_.bad_requests;
    return BadRequest("preempt", "Pod: expected a v1.Pod object");
  }
  auto trusted = TrustedPod(*claimed);
  if (!trusted.ok()) {
    ++counters_.untrusted;
    spdlog::warn("extender: preempt: {}", std::string(trusted.status().message()));
    return JsonReply(200, json{{"NodeNameToMetaVictims", json::object()},
                               {"Error", std::string(trusted.status().message())}});
  }
  const json* pod = &*trusted;
  // Candidates as UIDs per node, from either form.
  std::map<std::string, std::vector<std::string>> candidates;
  for (const char* key : {"NodeNameToMetaVictims", "NodeNameToVictims"}) {
    const json* m = kube::FieldAt(args, {key});
    if (!m || m->is_null()) continue;
    if (!m->is_object()) {
      ++counters_.bad_requests;
      return BadRequest("preempt", std::string(key) + ": expected an object");
    }
    for (auto& [node, victims] : m->items()) {
      auto& uids = candidates[node];
      const json* pods = victims.is_object() ? kube::FieldAt(victims, {"Pods"}) : nullptr;
      if (!pods || !pods->is_array()) continue;
      for (const json& p : *pods) {
        std::string uid = kube::StringAt(p, {"UID"});
        if (uid.empty()) uid = kube::StringAt(p, {"metadata", "uid"});
        if (!uid.empty()) uids.push_back(uid);
      }
    }
  }
  ++counters_.preempts;
  PreemptResult r = extender_->Preempt(*pod, candidates);
  if (!r.error.empty()) {
    return JsonReply(200, json{{"NodeNameToMetaVictims", json::object()}, {"Error", r.error}});
  }
  json out = json::object();
  for (auto& [node, uids] : r.victims) {
    json pods = json::array();
    for (const std::string& u : uids) pods.push_back({{"UID", u}});
    counters_.preempt_victims += uids.size();
    out[node] = {{"Pods", pods}, {"NumPDBViolations", 0}};
  }
  return JsonReply(200, json{{"NodeNameToMetaVictims", out}});
}

bool Service::LoadHistory() {
  auto cm = client_.Get(history_path_);
  if (!cm.ok() && cm.status().code() != absl::StatusCode::kNotFound) {
    spdlog::warn(
        "extender: reading the use history {}: {}; sizing from what this start learns, "
        "read again later",
        options_.history_configmap, std::string(cm.status().message()));
    return false;
  }
  history_loaded_ = true;
  if (!cm.ok()) {
    spdlog::info("extender: no use history {} yet: made when a pod's use is first learned",
                 options_.history_configmap);
    return true;
  }
  const std::string text = kube::StringAt(*cm, {"data", "history.json"});
  const json records = json::parse(text.empty() ? "[]" : text, nullptr, false);
  const int bad = extender_->LoadUseHistory(records);
  spdlog::info("extender: use history {}: {} record(s) read{}", options_.history_configmap,
               records.is_array() ? records.size() : 0,
               bad > 0 ? fmt::format(", {} unreadable and skipped", bad) : "");
  return true;
}

bool Service::SaveHistory(const std::string& records) {
  const size_t slash = options_.history_configmap.find('/');
  json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata",
              {{"name", options_.history_configmap.substr(slash + 1)},
               {"namespace", options_.history_configmap.substr(0, slash)},
               {"labels", {{"app.kubernetes.io/name", "tessera"}}}}},
             {"data", {{"history.json", records}}}};
  auto have = client_.Get(history_path_);
  absl::StatusOr<json> wrote = absl::UnknownError("not written");
  if (!have.ok()) wrote = have.status();
  if (have.ok()) {
    // Replaced as read: another writer in between is a 409, and this is tried again.
    cm["metadata"]["resourceVersion"] = kube::StringAt(*have, {"metadata", "resourceVersion"});
    wrote = client_.Replace(history_path_, cm);
  } else if (have.status().code() == absl::StatusCode::kNotFound) {
    wrote = client_.Create(history_path_.substr(0, history_path_.rfind('/')), cm);
  }
  if (!wrote.ok()) {
    ++counters_.history_errors;
    spdlog::warn("extender: writing the use history {}: {}; will retry", options_.history_configmap,
                 std::string(wrote.status().message()));
    return false;
  }
  ++counters_.history_writes;
  return true;
}

void Service::Work() {
  std::vector<Victim> retry;
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::duration<double>(options_.sweep_interval_s),
                 [&] { return stop_ || wake_; });
    if (stop_) break;
    wake_ = false;
    lock.unlock();
    // Woken after every filter (victims to evict, maybe): the look for lapsed reservations, which
    // reads every one of them, once a sweep interval at most.
    if (const auto now = std::chrono::steady_clock::now(); now >= next_expiry_) {
      extender_->Expire();
      next_expiry_ = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(options_.sweep_interval_s));
    }
    // Pods started for a gang while kube-scheduler asked about another member: a pod update makes
    // kube-scheduler try them again now rather than after its unschedulable-pod timeout.
    for (const auto& [id, node] : extender_->TakeNudges()) {
      size_t slash = id.find('/');
      json patch = {{"metadata", {{"annotations", {{"tessera.io/reservation", node}}}}}};
      auto r = client_.MergePatch("/api/v1/namespaces/" + Escape(id.substr(0, slash)) + "/pods/" +
                                      Escape(id.substr(slash + 1)),
                                  patch);
      if (!r.ok()) {
        spdlog::warn("extender: marking {} reserved on {}: {}", id, node,
                     std::string(r.status().message()));
      }
    }
    // The webhook's caBundle: set until it is, then looked at again now and then (a manifest
    // applied again may clear it).
    if (!webhook_ca_.empty()) {
      if (const auto now = std::chrono::steady_clock::now(); now >= next_ca_check_) {
        const bool current = EnsureCaBundle();
        counters_.ca_bundle_current = current;
        next_ca_check_ =
            now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(current ? options_.webhook_ca_check_s : 2.0));
      }
    }
    // The use history kept across restarts: read once it can be, written when it changed.
    if (!history_path_.empty() && (history_loaded_ || LoadHistory())) {
      if (auto h = extender_->TakeUseHistory()) history_pending_ = std::move(*h);
      const auto now = std::chrono::steady_clock::now();
      if (history_pending_ &&
          now - history_written_ >=
              std::chrono::duration<double>(options_.history_write_interval_s) &&
          SaveHistory(*history_pending_)) {
        history_pending_.reset();
        history_written_ = now;
      }
    }
    for (const Notice& n : extender_->TakeNotices()) {
      spdlog::info("extender: pod {}/{}: {}: {}", n.ns, n.name, n.reason, n.note);
      if (events_) {
        events_->Record({.kind = "Pod", .ns = n.ns, .name = n.name, .uid = n.uid}, n.type, n.reason,
                        n.action, n.note);
      }
    }
    std::vector<Victim> victims = extender_->TakeEvictions();
    victims.insert(victims.end(), retry.begin(), retry.end());
    retry.clear();
    for (const Victim& v : victims) {
      json eviction = {{"apiVersion", "policy/v1"},
                       {"kind", "Eviction"},
                       {"metadata", {{"name", v.name}, {"namespace", v.ns}}}};
      if (!v.uid.empty()) eviction["deleteOptions"] = {{"preconditions", {{"uid", v.uid}}}};
      auto r = client_.Create(
          "/api/v1/namespaces/" + Escape(v.ns) + "/pods/" + Escape(v.name) + "/eviction", eviction);
      int status = r.ok() ? 201 : kube::HttpStatusOf(r.status());
      if (r.ok() || status == 404 || status == 409) {
        ++counters_.evictions;
        spdlog::info("extender: evicted {}/{} from {}: {}", v.ns, v.name, v.node, v.reason);
        if (events_ && r.ok()) {
          events_->Record({.kind = "Pod", .ns = v.ns, .name = v.name, .uid = v.uid}, "Normal",
                          "Preempted", "Preempting", fmt::format("on {}: {}", v.node, v.reason));
        }
      } else {
        ++counters_.eviction_errors;
        spdlog::warn("extender: evicting {}/{}: {}; will retry", v.ns, v.name,
                     std::string(r.status().message()));
        retry.push_back(v);
      }
    }
    lock.lock();
  }
}

std::string Service::Metrics() const {
  net::MetricsPage p;
  using Labels = net::MetricsPage::Labels;
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    p.Family(name, type, help);
    p.Sample({}, v);
  };
  // A family with one sample per value of label `label`.
  auto by = [&](const char* name, const char* type, const char* help, const char* label,
                std::initializer_list<std::pair<const char*, double>> values) {
    p.Family(name, type, help);
    for (auto [value, v] : values) p.Sample({{label, value}}, v);
  };

  p.Family("tessera_extender_filter_duration_seconds", "histogram",
           "Time to answer kube-scheduler's filter.");
  uint64_t cumulative = 0;
  for (int i = 0; i < kBucketCount; ++i) {
    cumulative += latency_counts_[i].load();
    p.Sample({{"le", fmt::format("{}", kBuckets[i])}}, cumulative, "_bucket");
  }
  cumulative += latency_counts_[kBucketCount].load();
  p.Sample({{"le", "+Inf"}}, cumulative, "_bucket");
  p.Sample({}, static_cast<double>(latency_sum_us_.load()) / 1e6, "_sum");
  p.Sample({}, cumulative, "_count");

  const Counters& c = counters_;
  by("tessera_extender_filter_total", "counter", "Filter answers by result.", "result",
     {{"placed", c.filter_placed}, {"unplaced", c.filter_unplaced}, {"error", c.filter_errors}});
  one("tessera_extender_prioritize_total", "counter", "Prioritize calls.", c.prioritize);
  by("tessera_extender_dra_calls_total", "counter",
     "Filter and prioritize calls for pods with DRA claims of Tessera's driver (/dra/...).", "verb",
     {{"filter", c.dra_filter}, {"prioritize", c.dra_prioritize}});
  by("tessera_extender_bind_total", "counter", "Bind answers by result.", "result",
     {{"bound", c.binds}, {"error", c.bind_errors}});
  one("tessera_extender_preempt_total", "counter", "Preempt calls.", c.preempts);
  one("tessera_extender_preempt_victims_total", "counter", "Victims answered to preempt.",
      c.preempt_victims);
  by("tessera_extender_evictions_total", "counter", "Pods evicted for preemption or reclaim.",
     "result", {{"evicted", c.evictions}, {"error", c.eviction_errors}});
  one("tessera_extender_bad_requests_total", "counter", "Requests refused as malformed.",
      c.bad_requests);
  one("tessera_extender_unknown_pods_total", "counter",
      "Requests refused because the API server has no such pod (or it has another UID).",
      c.untrusted);
  by("tessera_extender_quota_loads_total", "counter", "Quota ConfigMap loads by result.", "result",
     {{"ok", c.quota_loads}, {"error", c.quota_errors}});
  by("tessera_extender_admission_total", "counter",
     "Admission reviews of pod creations (the webhook that sizes tessera.io/gpu-share: auto) by "
     "result: left unchanged, sized, refused, not a review.",
     "result",
     {{"unchanged", c.admit_unchanged},
      {"sized", c.admit_sized},
      {"refused", c.admit_refused},
      {"bad", c.admit_bad}});
  if (!webhook_ca_.empty()) {
    one("tessera_extender_webhook_ca_bundle_current", "gauge",
        "1 when every webhook of the MutatingWebhookConfiguration carries the extender's CA.",
        c.ca_bundle_current ? 1 : 0);
    by("tessera_extender_webhook_ca_bundle_writes_total", "counter",
       "Writes of the extender's CA into the MutatingWebhookConfiguration by result.", "result",
       {{"ok", c.ca_bundle_writes}, {"error", c.ca_bundle_errors}});
  }
  by("tessera_extender_use_history_writes_total", "counter",
     "Writes of the use history ConfigMap (what ended pods used, which sizes \"auto\" pods) by "
     "result.",
     "result", {{"ok", c.history_writes}, {"error", c.history_errors}});

  Extender::Stats s = extender_->stats();
  one("tessera_extender_nodes", "gauge", "Nodes with Tessera GPUs in the extender's state.",
      s.nodes);
  by("tessera_extender_gpus", "gauge", "GPUs on them, by health.", "health",
     {{"healthy", s.gpus_healthy}, {"unhealthy", s.gpus - s.gpus_healthy}});
  one("tessera_extender_gpu_allocated_gpus", "gauge", "GPU compute allocated, in GPUs.",
      s.gpu_milli_allocated / 1000.0);
  by("tessera_extender_pods", "gauge", "Tessera pods by state.", "state",
     {{"queued", s.queued},
      {"reserved", s.reserved},
      {"bound", s.bound},
      {"unaccounted", s.unaccounted}});
  // Every reason a pod waits, each with its sample (0: none now), so that a series never vanishes.
  auto by_reason = [&](const char* name, const char* help, const auto& values) {
    p.Family(name, "gauge", help);
    for (const char* kind : {"gang", "quota", "preemption", "no-fit", "not-yet-considered"}) {
      auto it = values.find(kind);
      p.Sample({{"reason", kind}}, it == values.end() ? 0 : static_cast<double>(it->second));
    }
  };
  by_reason("tessera_extender_pods_pending", "Queued pods by why they wait.", s.pending_by_reason);
  by_reason("tessera_extender_pods_pending_oldest_seconds",
            "How long the longest-waiting queued pod has waited, by why it waits (0: none).",
            s.oldest_pending_seconds);
  one("tessera_extender_gangs_waiting", "gauge", "Gangs with members queued, not yet placed.",
      s.gangs_waiting);
  one("tessera_extender_node_updates_total", "counter",
      "Nodes added, changed or removed in the model (each in place).",
      static_cast<double>(s.node_updates));
  one("tessera_extender_quota_error", "gauge", "1 when the quota ConfigMap has an error.",
      s.quota_error.empty() ? 0 : 1);
  // Whether what it knows of the cluster is current: every informer listed, its last list or
  // watch gone well. 0 says the figures above are old (all zeros would look like an empty cluster).
  bool up = !informers_.empty();
  for (const auto& i : informers_) up = up && i->synced() && i->last_error().empty();
  one("tessera_extender_api_server_up", "gauge",
      "1 when every watch of the API server is synced and its last list or watch succeeded.",
      up ? 1 : 0);
  auto quotas = extender_->quota_use();
  p.Family("tessera_extender_quota_used_gpus", "gauge",
           "GPUs in use per namespace (whole + shares).");
  for (auto& [ns, q] : quotas) p.Sample(Labels{{"namespace", ns}}, q.used.gpu_milli / 1000.0);
  p.Family("tessera_extender_quota_guaranteed_gpus", "gauge",
           "Guaranteed GPU compute per namespace, in GPUs (-1: none set).");
  for (auto& [ns, q] : quotas) {
    if (!q.has_quota) continue;
    const sched::GpuAmount& g = q.quota.limit;
    int64_t milli = g.gpu_milli >= 0 ? g.gpu_milli : (g.gpus >= 0 ? g.gpus * 1000 : -1000);
    p.Sample(Labels{{"namespace", ns}}, milli / 1000.0);
  }
  net::AddSelfMetrics(p, "extender");
  return p.Take();
}

}  // namespace tessera::extender
