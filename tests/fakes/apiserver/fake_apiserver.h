#pragma once
// A fake Kubernetes API server for tests: real HTTP (or HTTPS with a generated CA) on 127.0.0.1
// port 0, speaking the REST paths, JSON and watch streams of the real one for any resource:
// get, list (label and field selectors, limit/continue pages), watch (from a resource version,
// replayed from history; ERROR 410 Expired once compacted; objects leaving a selector are sent as
// DELETED; timeoutSeconds; bookmarks), create, replace, JSON merge patch, delete, and the pod
// `binding` subresource. A pod's creation goes through the mutating admission webhooks of the
// stored MutatingWebhookConfigurations as the real one calls them (below). Every request needs
// `Authorization: Bearer <token>` of a known user (else 401). Faults for tests: garbage answers, a
// forced HTTP status, compaction, closing every watch. Every request is recorded with the
// Kubernetes verb and resource it used. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace tessera::fakes {

struct FakeApiServerOptions {
  bool tls = false;
  // Bearer tokens and the user each one stands for.
  std::map<std::string, std::string> tokens = {{"test-token", "tester"}};
  // As the real API server treats a pod bound to a node: a DELETE or an Eviction only marks it
  // (metadata.deletionTimestamp and deletionGracePeriodSeconds, 30 or the request's, a MODIFIED
  // event) and it stays, holding its node's resources, until its kubelet says it has stopped - here
  // the test's Delete(). Off: removed at once (what most tests need, and kinder than reality).
  bool graceful_pod_deletion = false;
};

struct ApiRequest {
  std::string user;      // "" when unauthenticated
  std::string method;    // "GET"
  std::string verb;      // get, list, watch, create, update, patch, delete
  std::string resource;  // "pods", "nodes", "pods/binding", "podgroups.scheduling.x-k8s.io"
  std::string path;      // with the query
  std::string content_type;
  std::string body;
  int status = 0;
};

// Writes a self-signed certificate for 127.0.0.1 and localhost (its own CA) and its private key as
// PEM files, for tests of TLS servers; returns the certificate's PEM (the CA to trust).
std::string WriteTestCertificate(const std::string& cert_path, const std::string& key_path);

class FakeApiServer {
 public:
  // Listens on 127.0.0.1, port 0. Aborts the test process if it cannot.
  explicit FakeApiServer(FakeApiServerOptions options = {});
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  std::string url() const;  // "http://127.0.0.1:34567"
  std::string ca_pem() const { return ca_pem_; }
  // Writes a kubeconfig for this server and `token` (with the CA when TLS) and returns `path`.
  std::string WriteKubeconfig(const std::string& path, const std::string& token = "test-token",
                              const std::string& ns = "default") const;

  // Objects by API path of their collection: "/api/v1/nodes", "/api/v1/namespaces/a/pods",
  // "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/a/podgroups". Put creates or replaces,
  // stamping metadata (resourceVersion, uid, creationTimestamp, namespace) and records a watch
  // event; returns the stored object.
  nlohmann::json Put(const std::string& collection, nlohmann::json object);
  bool Delete(const std::string& collection, const std::string& name);
  std::optional<nlohmann::json> Get(const std::string& collection, const std::string& name) const;
  std::vector<nlohmann::json> List(const std::string& collection) const;
  uint64_t resource_version() const;

  // Faults.
  void Compact();                 // every version before now is gone (watches from it: 410)
  void SetGarbage(bool garbage);  // answer every request 200 with a body that is not JSON
  // Answer every request (whose path starts with `path_prefix`) with this status (0: normal).
  void SetFailStatus(int http, const std::string& path_prefix = "");
  // An API group ("scheduling.x-k8s.io") not served: every path under /apis/<group>/ is a 404, as
  // for a CRD that is not installed. Every group is served until said otherwise.
  void SetServed(const std::string& group, bool served);
  void CloseWatches();  // ends every open watch stream

  // Mutating admission webhooks, as the real API server calls them on the CREATE of a pod or a
  // ResourceClaim (resource.k8s.io/v1; the objects this fake admits): each webhook
  // of each stored admissionregistration.k8s.io/v1 MutatingWebhookConfiguration (in name order)
  // whose rules, namespaceSelector, objectSelector and matchConditions match gets an
  // AdmissionReview (v1) over HTTPS, the server's certificate checked against its caBundle (none:
  // refused, as the real one has no system CAs for a Service); its JSON Patch is applied, a denial
  // answered with its status (a code under 400 made 400), and a failed call answered 500 under
  // failurePolicy Fail (the default), skipped under Ignore. matchConditions are CEL: this fake
  // reads `&&`, `||` and parentheses over has(object.metadata.annotations|labels),
  // 'k' in object.metadata.annotations and object.metadata.annotations['k'] == 'v' (and labels),
  // has(object.spec.field),
  // with CEL's errors (a missing key; absorbed by `false &&` and `true ||`), and fails the request
  // on an error or anything else (so a manifest and this fake never disagree silently). A webhook's
  // Service is reached at `address` ("localhost:1234"), set here for "namespace/name:port" (a
  // Service with no address set has no endpoints: the call fails).
  void SetServiceAddress(const std::string& ns, const std::string& name, int port,
                         const std::string& address);
  // The client certificate it presents to every webhook (files, PEM), as the real one does where
  // its --admission-control-config-file gives a kubeconfig with one for the webhook's Service;
  // empty (the default): none.
  void SetWebhookClientCertificate(const std::string& cert_file, const std::string& key_file);
  int admission_calls() const;
  void SendBookmarks();  // a BOOKMARK on every watch that asked for them
  int open_watches() const;

  std::vector<ApiRequest> Requests() const;
  void ClearRequests();
  // Polls `pred` every 5 ms until it holds or `timeout` passes.
  static bool WaitFor(const std::function<bool()>& pred,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10));

  struct Event {
    uint64_t rv;
    std::string type;           // ADDED, MODIFIED, DELETED
    std::string store;          // the collection's store key
    nlohmann::json old_object;  // null for ADDED
    nlohmann::json object;
  };

 private:
  void Handle(const httplib::Request& req, httplib::Response& res);
  struct Denial {
    int code = 0;
    std::string reason, message;
  };
  // What a webhook's rules match: the object's API group, version, resource and kind.
  struct Kind {
    std::string group, version, resource, kind;
  };
  // The mutating webhooks on the creation of `object` (a `kind`) in `ns` by `user` (outside mu_:
  // a webhook may be slow); `object` patched. A denial or a failed call under failurePolicy Fail
  // says why.
  std::optional<Denial> Admit(const std::string& ns, const std::string& user, const Kind& kind,
                              nlohmann::json& object);
  void Record(ApiRequest r);
  // graceful_pod_deletion: marks a bound pod terminating instead of removing it; false when it is
  // to be removed now (off, unbound, or a grace of 0).
  bool TerminateLocked(const std::string& store, nlohmann::json& pod, const nlohmann::json* grace);
  nlohmann::json StampLocked(const std::string& store, nlohmann::json object,
                             const nlohmann::json* old);

  FakeApiServerOptions options_;
  std::string ca_pem_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopping_ = false;
  uint64_t rv_ = 100;
  uint64_t compacted_rv_ = 0;
  uint64_t watch_epoch_ = 0;     // bumped by CloseWatches
  uint64_t bookmark_epoch_ = 0;  // bumped by SendBookmarks
  int open_watches_ = 0;
  bool garbage_ = false;
  int fail_status_ = 0;
  std::string fail_prefix_;
  std::set<std::string> unserved_groups_;
  uint64_t uid_ = 0;
  // store key ("v1/pods") -> "ns/name" or "name" -> object
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_;
  std::vector<Event> history_;
  std::vector<ApiRequest> requests_;
  std::map<std::string, std::string> service_addresses_;  // "ns/name:port" -> "host:port"
  int admission_calls_ = 0;
  std::string webhook_client_cert_, webhook_client_key_;
};

}  // namespace tessera::fakes
