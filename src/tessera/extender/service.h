#pragma once
// `tessera extender`: the scheduler extender as kube-scheduler calls it. HTTP (or HTTPS with a
// certificate pair) with kube-scheduler's JSON (PascalCase, extender/v1): POST /filter,
// /prioritize, /bind, /preempt, plus GET /metrics and /healthz. The cluster comes from the API
// server (list + watch of nodes, pods, PodGroups and the quota ConfigMap) into an Extender; bind
// writes the pod's `tessera.io/assignment` and then creates its Binding; victims the cycle chose
// are evicted through the Eviction API by a worker thread, which also expires stale reservations.
// Thread-safe.

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/extender/dra.h"
#include "tessera/extender/extender.h"
#include "tessera/kube/client.h"
#include "tessera/kube/events.h"
#include "tessera/kube/informer.h"
#include "tessera/net/http.h"

namespace tessera::extender {

struct ServiceOptions {
  std::string listen = "0.0.0.0:8888";  // host:port; port 0 picks a free one
  std::string tls_cert_file;            // both set: HTTPS only
  std::string tls_key_file;
  // Set (with TLS): only clients with a certificate of this CA, named one of client_names when
  // any are given (kube-scheduler's tlsConfig certFile), may call it.
  std::string client_ca_file;
  std::vector<std::string> client_names;
  // host:port of a second, plain-HTTP listener for GET /metrics and /healthz only (Prometheus and
  // the kubelet's probes, which have no client certificate); empty: none, and the main listener
  // serves them.
  std::string metrics_listen;
  // The quota ConfigMap, "namespace/name"; empty: no quotas.
  std::string quota_configmap;
  // Where the measured use of ended pods (the history "auto" pods are sized from) is kept across
  // restarts, "namespace/name" (key history.json); empty: in memory only. Written when it
  // changed, at most once per history_write_interval_s.
  std::string history_configmap;
  double history_write_interval_s = 10;
  // The mutating admission webhook that sizes pods asking tessera.io/gpu-share "auto", and DRA
  // claims asking "auto" (admission.h): POST /mutate-pods and /mutate-resourceclaims on a
  // listener of its own, host:port, HTTPS with
  // tls_cert_file/tls_key_file (the API server calls webhooks over HTTPS only) and without the
  // scheduler's client certificates; empty: none.
  std::string webhook_listen;
  // Set: only callers presenting a certificate of this CA may call the webhook (an API server
  // given one in its AdmissionConfiguration's kubeConfigFile); else any caller, who learns no
  // more than the size of the pod it describes.
  std::string webhook_client_ca_file;
  // The MutatingWebhookConfiguration (its name) whose webhooks' clientConfig.caBundle the
  // extender keeps set to webhook_ca_file (the CA of its TLS Secret), checked every
  // webhook_ca_check_s and when it is not yet so; empty: whoever installs it sets caBundle.
  std::string webhook_configuration;
  std::string webhook_ca_file;
  double webhook_ca_check_s = 60;
  // Whether to watch scheduling.x-k8s.io/v1alpha1 PodGroups (their minMember makes gangs).
  bool pod_groups = true;
  // Seconds between sweeps of expired reservations.
  double sweep_interval_s = 1;
  // Kubernetes Events (events.k8s.io/v1) on the pods it keeps waiting (why: quota, gang,
  // preemption, GPUs) and on those it evicts, a pair (pod, reason) at most once a minute
  // (kube::EventRecorder); reported as `instance` (default: the host name).
  bool events = true;
  std::string instance;
  double event_repeat_s = 60;  // the same event on a pod at most once per this
  ExtenderOptions extender;
  // Help for pods with DRA claims of Tessera's driver (/dra/filter, /dra/prioritize): watches
  // ResourceSlices, ResourceClaims and ResourceClaimTemplates (resource.k8s.io/v1).
  bool dra = false;
};

class Service {
 public:
  // Starts the informers and the HTTP listener; `client` must outlive the service. Does not wait
  // for the informers: /healthz says 503 until nodes and pods are listed (WaitForSync).
  static absl::StatusOr<std::unique_ptr<Service>> Start(kube::Client& client,
                                                        ServiceOptions options,
                                                        const core::Clock& clock);
  ~Service();
  void Stop();

  bool WaitForSync(std::chrono::milliseconds timeout);
  // Nodes, pods and PodGroups listed: filter answers only then (before, every node "fails" with
  // the reason, and kube-scheduler asks again), so a restart never gives out GPUs that running
  // pods hold.
  bool Ready() const;
  int port() const;
  int metrics_port() const;
  int webhook_port() const { return webhook_http_ ? webhook_http_->tcp_port() : 0; }
  Extender& extender() { return *extender_; }
  DraAdvisor* dra() { return dra_.get(); }
  std::string Metrics() const;
  kube::EventRecorder* events() { return events_.get(); }

  // The HTTP handler, for tests that skip the socket.
  net::HttpResponse Handle(const net::HttpRequest& request);

 private:
  Service(kube::Client& client, ServiceOptions options, const core::Clock& clock);
  // The pod a request names, as the API server has it: the request's body only names it (its
  // namespace, name and UID). From the informer's cache, else asked of the API server; an error
  // (said to kube-scheduler) for a pod the API server does not have, of another UID, or whose
  // names are longer than Kubernetes allows. What is trusted of it (priority, requests,
  // annotations, labels) is never taken from the body.
  absl::StatusOr<nlohmann::json> TrustedPod(const nlohmann::json& claimed);
  // kube-scheduler's ExtenderArgs: the trusted pod and the nodes offered (NodeNames, else the
  // NodeList's objects); on a bad or untrusted request, the answer to give instead.
  struct Args {
    nlohmann::json pod;
    std::vector<std::string> names;
    std::map<std::string, const nlohmann::json*> node_objects;  // into `body` when Nodes came
    bool node_names = false;                                    // NodeNames came (node cache)
    nlohmann::json body;
  };
  std::variant<Args, net::HttpResponse> ReadArgs(const std::string& body, bool prioritize);
  // The filter answer for `nodes` of those offered, in the form they came in.
  static nlohmann::json FilterReply(const Args& a, const std::vector<std::string>& nodes,
                                    const std::map<std::string, std::string>& failed,
                                    const std::map<std::string, std::string>& unresolvable,
                                    const std::string& error);
  net::HttpResponse HandleFilter(const std::string& body, bool prioritize);
  // /dra/filter and /dra/prioritize: pods that ask for Tessera's GPUs through DRA (dra.h); every
  // other pod passes with all its nodes and no opinion.
  net::HttpResponse HandleDra(const std::string& body, bool prioritize);
  net::HttpResponse HandleBind(const std::string& body);
  net::HttpResponse HandlePreempt(const std::string& body);
  // POST /mutate-pods on the webhook listener: an AdmissionReview (admission.h).
  net::HttpResponse HandleAdmission(const std::string& body);
  // POST /mutate-resourceclaims: a DRA claim asking "auto" (admission.h's AdmitClaim).
  net::HttpResponse HandleClaimAdmission(const std::string& body);
  net::HttpResponse Answer(const AdmissionAnswer& a);  // counted and logged
  // Sets webhook_ca_file's CA as the caBundle of every webhook of webhook_configuration that
  // lacks it (Work's): true when each has it.
  bool EnsureCaBundle();
  void Work();  // evictions and reservation expiry
  // The history ConfigMap read into the extender (true: read, or there is none yet).
  bool LoadHistory();
  // `records` written to it (created when missing); false to try again later.
  bool SaveHistory(const std::string& records);
  void Observe(double seconds);

  kube::Client& client_;
  ServiceOptions options_;
  const core::Clock& clock_;
  std::unique_ptr<Extender> extender_;
  std::unique_ptr<DraAdvisor> dra_;  // when options_.dra
  std::vector<std::unique_ptr<kube::Informer>> informers_;
  kube::Informer* nodes_ = nullptr;
  kube::Informer* pods_ = nullptr;
  kube::Informer* pod_groups_ = nullptr;  // null with --no-pod-groups
  std::unique_ptr<net::HttpServer> http_, metrics_http_, webhook_http_;
  std::unique_ptr<kube::EventRecorder> events_;  // when options_.events

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::chrono::steady_clock::time_point next_expiry_{};  // Work's next look for lapsed reservations
  bool wake_ = false;
  std::thread worker_;
  // The history ConfigMap (Work's alone after Start): its path, whether it was read, what waits to
  // be written, and when it was last written.
  std::string history_path_;
  bool history_loaded_ = false;
  std::optional<std::string> history_pending_;  // a JSON array's text
  std::chrono::steady_clock::time_point history_written_{};
  // The webhook configuration's caBundle (Work's): the CA's PEM, and when it is next looked at.
  std::string webhook_ca_;
  std::chrono::steady_clock::time_point next_ca_check_{};

  // Counters for /metrics.
  struct Counters {
    std::atomic<uint64_t> filter_placed{0}, filter_unplaced{0}, filter_errors{0};
    std::atomic<uint64_t> prioritize{0};
    std::atomic<uint64_t> binds{0}, bind_errors{0};
    std::atomic<uint64_t> preempts{0}, preempt_victims{0};
    std::atomic<uint64_t> evictions{0}, eviction_errors{0};
    std::atomic<uint64_t> bad_requests{0};
    std::atomic<uint64_t> untrusted{0};  // requests naming a pod the API server does not have
    std::atomic<uint64_t> quota_loads{0}, quota_errors{0};
    std::atomic<uint64_t> history_writes{0}, history_errors{0};
    std::atomic<uint64_t> dra_filter{0}, dra_prioritize{0};  // DRA pods of Tessera's driver
    // Admission reviews: pods left alone, sized, refused; bodies that were no review.
    std::atomic<uint64_t> admit_unchanged{0}, admit_sized{0}, admit_refused{0}, admit_bad{0};
    std::atomic<uint64_t> ca_bundle_writes{0}, ca_bundle_errors{0};
    std::atomic<bool> ca_bundle_current{false};
  };
  mutable Counters counters_;
  // Filter latency histogram (seconds).
  static constexpr double kBuckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                        0.01,   0.025,   0.05,   0.1,   0.25,   1};
  static constexpr int kBucketCount = sizeof(kBuckets) / sizeof(kBuckets[0]);
  std::atomic<uint64_t> latency_counts_[kBucketCount + 1] = {};
  std::atomic<uint64_t> latency_sum_us_{0};
};

}  // namespace tessera::extender
