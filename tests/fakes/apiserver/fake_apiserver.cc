#include "fake_apiserver.h"

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

namespace tessera::fakes {
namespace {

using nlohmann::json;

json StatusBody(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},
          {"apiVersion", "v1"},
          {"metadata", json::object()},
          {"status", code < 300 ? "Success" : "Failure"},
          {"message", message},
          {"reason", reason},
          {"code", code}};
}

void Reply(httplib::Response& res, int code, const json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void Fail(httplib::Response& res, int code, const std::string& reason, const std::string& msg) {
  Reply(res, code, StatusBody(code, reason, msg));
}

// A parsed API path.
struct Target {
  bool ok = false;
  std::string group_version;  // "v1", "scheduling.x-k8s.io/v1alpha1"
  std::string resource;       // "pods"
  std::string ns;             // empty: cluster-scoped or all namespaces
  std::string name;
  std::string sub;  // "binding", "status"
  std::string store() const { return group_version + "/" + resource; }
  std::string rbac_resource() const {
    auto slash = group_version.find('/');
    std::string r =
        slash == std::string::npos ? resource : resource + "." + group_version.substr(0, slash);
    return sub.empty() ? r : r + "/" + sub;
  }
  std::string key() const { return ns.empty() ? name : ns + "/" + name; }
};

Target ParsePath(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '/');) {
    if (!p.empty()) parts.push_back(p);
  }
  Target t;
  size_t i = 0;
  if (parts.size() >= 2 && parts[0] == "api") {
    t.group_version = parts[1];
    i = 2;
  } else if (parts.size() >= 3 && parts[0] == "apis") {
    t.group_version = parts[1] + "/" + parts[2];
    i = 3;
  } else {
    return t;
  }
  if (i + 2 < parts.size() && parts[i] == "namespaces") {
    t.ns = parts[i + 1];
    i += 2;
  }
  if (i >= parts.size()) return t;
  t.resource = parts[i++];
  if (i < parts.size()) t.name = parts[i++];
  if (i < parts.size()) t.sub = parts[i++];
  t.ok = i == parts.size();
  return t;
}

std::string FieldOf(const json& obj, const std::string& dotted) {
  const json* cur = &obj;
  std::stringstream ss(dotted);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!cur->is_object() || !cur->contains(part)) return "";
    cur = &(*cur)[part];
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_null()) return "";
  return cur->dump();
}

struct Term {
  std::string key;
  std::string op;  // "=", "!=", "exists", "!exists"
  std::string value;
};

// Equality-based selectors ("a=b,c!=d,e,!f"); false for anything else.
bool ParseSelector(const std::string& text, std::vector<Term>& out) {
  std::stringstream ss(text);
  for (std::string t; std::getline(ss, t, ',');) {
    while (!t.empty() && t.front() == ' ') t.erase(0, 1);
    while (!t.empty() && t.back() == ' ') t.pop_back();
    if (t.empty()) return false;
    Term term;
    if (auto p = t.find("!="); p != std::string::npos) {
      term = {t.substr(0, p), "!=", t.substr(p + 2)};
    } else if (auto q = t.find("=="); q != std::string::npos) {
      term = {t.substr(0, q), "=", t.substr(q + 2)};
    } else if (auto r = t.find('='); r != std::string::npos) {
      term = {t.substr(0, r), "=", t.substr(r + 1)};
    } else if (t[0] == '!') {
      term = {t.substr(1), "!exists", ""};
    } else {
      term = {t, "exists", ""};
    }
    if (term.key.empty() || term.key.find_first_of(" ()") != std::string::npos) return false;
    out.push_back(term);
  }
  return true;
}

bool LabelsMatch(const json& obj, const std::vector<Term>& terms) {
  json labels = obj.contains("metadata") && obj["metadata"].contains("labels")
                    ? obj["metadata"]["labels"]
                    : json::object();
  for (const Term& t : terms) {
    bool has = labels.is_object() && labels.contains(t.key) && labels[t.key].is_string();
    std::string v = has ? labels[t.key].get<std::string>() : "";
    if (t.op == "exists" && !has) return false;
    if (t.op == "!exists" && has) return false;
    if (t.op == "=" && (!has || v != t.value)) return false;
    if (t.op == "!=" && has && v == t.value) return false;
  }
  return true;
}

bool FieldsMatch(const json& obj, const std::vector<Term>& terms) {
  for (const Term& t : terms) {
    std::string v = FieldOf(obj, t.key);
    if (t.op == "=" && v != t.value) return false;
    if (t.op == "!=" && v == t.value) return false;
  }
  return true;
}

std::string KindOf(const std::string& resource) {
  static const std::map<std::string, std::string> m = {
      {"nodes", "Node"},         {"pods", "Pod"},     {"configmaps", "ConfigMap"},
      {"podgroups", "PodGroup"}, {"events", "Event"}, {"namespaces", "Namespace"},
      {"bindings", "Binding"},   {"leases", "Lease"}};
  auto it = m.find(resource);
  if (it != m.end()) return it->second;
  std::string k = resource;
  if (!k.empty() && k.back() == 's') k.pop_back();
  if (!k.empty()) k[0] = static_cast<char>(std::toupper(k[0]));
  return k;
}

// As the real API server stores a quantity: a whole number of bytes in the largest binary unit
// that keeps it whole ("1024Mi" becomes "1Gi", "1073741824" too). Other forms are left.
void CanonicalQuantity(json& q) {
  if (!q.is_string()) return;
  std::string s = q.get<std::string>();
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0 || i > 18) return;
  static const std::map<std::string, int> kUnit = {
      {"", 0}, {"Ki", 1}, {"Mi", 2}, {"Gi", 3}, {"Ti", 4}};
  auto u = kUnit.find(s.substr(i));
  if (u == kUnit.end()) return;
  unsigned __int128 v = std::stoull(s.substr(0, i));
  for (int k = 0; k < u->second; ++k) v *= 1024;
  if (s.substr(i).empty() && v % 1024 != 0) return;  // plain bytes stay as written
  static const char* kNames[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi"};
  int unit = 0;
  while (unit < 5 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++unit;
  }
  q = std::to_string(static_cast<uint64_t>(v)) + kNames[unit];
}

// ResourceSlices' capacities and counters, canonical as the API server stores them.
void CanonicalQuantities(json& slice) {
  json* spec = slice.contains("spec") ? &slice["spec"] : nullptr;
  if (spec == nullptr || !spec->is_object()) return;
  if (spec->contains("devices") && (*spec)["devices"].is_array()) {
    for (json& d : (*spec)["devices"]) {
      if (!d.is_object() || !d.contains("capacity") || !d["capacity"].is_object()) continue;
      for (auto& [name, c] : d["capacity"].items()) {
        if (c.is_object() && c.contains("value")) CanonicalQuantity(c["value"]);
      }
    }
  }
}

std::string Now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// A self-signed certificate for 127.0.0.1 and localhost, its own CA.
void MakeCertificate(X509** cert_out, EVP_PKEY** key_out, std::string& pem) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("tessera-fake-apiserver"), -1,
                             -1, 0);
  X509_set_issuer_name(cert, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost"},
                            std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509_sign(cert, key, EVP_sha256());
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  long len = BIO_get_mem_data(bio, &data);
  pem.assign(data, len);
  BIO_free(bio);
  *cert_out = cert;
  *key_out = key;
}

}  // namespace

std::string WriteTestCertificate(const std::string& cert_path, const std::string& key_path) {
  X509* cert = nullptr;
  EVP_PKEY* key = nullptr;
  std::string pem;
  MakeCertificate(&cert, &key, pem);
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long len = BIO_get_mem_data(bio, &data);
  std::string key_pem(data, len);
  BIO_free(bio);
  X509_free(cert);
  EVP_PKEY_free(key);
  std::ofstream(cert_path) << pem;
  std::ofstream(key_path) << key_pem;
  return pem;
}

FakeApiServer::FakeApiServer(FakeApiServerOptions options) : options_(std::move(options)) {
  if (options_.tls) {
    X509* cert = nullptr;
    EVP_PKEY* key = nullptr;
    MakeCertificate(&cert, &key, ca_pem_);
    server_ = std::make_unique<httplib::SSLServer>(cert, key);
    X509_free(cert);
    EVP_PKEY_free(key);
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  // Watches hold a thread each for their whole life.
  server_->new_task_queue = [] { return new httplib::ThreadPool(64); };
  server_->set_keep_alive_max_count(1000);
  // As the real API server (Go) does: no Nagle delay between a response's header and body writes.
  // Accepted sockets inherit the listening socket's options on Linux.
  server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  });
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); };
  server_->Get(".*", handler);
  server_->Post(".*", handler);
  server_->Put(".*", handler);
  server_->Patch(".*", handler);
  server_->Delete(".*", handler);
  port_ = server_->bind_to_any_port("127.0.0.1");
  if (port_ <= 0) {
    std::fprintf(stderr, "fake apiserver: cannot listen on 127.0.0.1\n");
    std::abort();
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  WaitFor([this] { return server_->is_running(); });
}

FakeApiServer::~FakeApiServer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string FakeApiServer::url() const {
  return (options_.tls ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(port_);
}

std::string FakeApiServer::WriteKubeconfig(const std::string& path, const std::string& token,
                                           const std::string& ns) const {
  std::ofstream out(path);
  out << "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
      << "clusters:\n- name: fake\n  cluster:\n    server: " << url() << "\n";
  if (options_.tls) {
    std::string b64(4 * ((ca_pem_.size() + 2) / 3) + 1, '\0');
    int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(b64.data()),
                            reinterpret_cast<const unsigned char*>(ca_pem_.data()),
                            static_cast<int>(ca_pem_.size()));
    b64.resize(n);
    out << "    certificate-authority-data: " << b64 << "\n";
  }
  out << "users:\n- name: fake\n  user:\n    token: " << token << "\n"
      << "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
      << "    namespace: " << ns << "\n";
  return path;
}

json FakeApiServer::StampLocked(const std::string& store, json object, const json* old) {
  if (store.ends_with("/resourceslices")) CanonicalQuantities(object);
  auto& meta = object["metadata"];
  if (!meta.is_object()) meta = json::object();
  meta["resourceVersion"] = std::to_string(++rv_);
  if (old && old->contains("metadata")) {
    const json& om = (*old)["metadata"];
    if (om.contains("uid")) meta["uid"] = om["uid"];
    if (om.contains("creationTimestamp")) meta["creationTimestamp"] = om["creationTimestamp"];
  } else {
    meta["uid"] = "uid-" + std::to_string(++uid_);
    if (!meta.contains("creationTimestamp")) meta["creationTimestamp"] = Now();
  }
  history_.push_back({rv_, old ? "MODIFIED" : "ADDED", store, old ? *old : json(nullptr), object});
  changed_.notify_all();
  return object;
}

bool FakeApiServer::TerminateLocked(const std::string& store, json& pod, const json* grace) {
  if (!options_.graceful_pod_deletion || !pod.contains("spec") ||
      pod["spec"].value("nodeName", "").empty()) {
    return false;
  }
  const int64_t seconds = grace && grace->is_number_integer() ? grace->get<int64_t>() : 30;
  if (seconds <= 0) return false;                                  // a forced deletion
  if (pod["metadata"].contains("deletionTimestamp")) return true;  // already terminating
  json marked = pod;
  marked["metadata"]["deletionTimestamp"] = Now();
  marked["metadata"]["deletionGracePeriodSeconds"] = seconds;
  pod = StampLocked(store, marked, &pod);
  return true;
}

json FakeApiServer::Put(const std::string& collection, json object) {
  Target t = ParsePath(collection + "/x");
  std::lock_guard lock(mu_);
  if (!t.ns.empty()) object["metadata"]["namespace"] = t.ns;
  std::string name = object["metadata"].value("name", "");
  std::string ns = object["metadata"].value("namespace", "");
  std::string key = ns.empty() ? name : ns + "/" + name;
  if (!object.contains("kind")) object["kind"] = KindOf(t.resource);
  if (!object.contains("apiVersion")) object["apiVersion"] = t.group_version;
  auto& objs = objects_[t.store()];
  auto it = objs.find(key);
  json stored = StampLocked(t.store(), object, it == objs.end() ? nullptr : &it->second);
  objs[key] = stored;
  return stored;
}

bool FakeApiServer::Delete(const std::string& collection, const std::string& name) {
  Target t = ParsePath(collection + "/" + name);
  std::lock_guard lock(mu_);
  auto& objs = objects_[t.store()];
  auto it = objs.find(t.key());
  if (it == objs.end()) return false;
  json last = it->second;
  objs.erase(it);
  last["metadata"]["resourceVersion"] = std::to_string(++rv_);
  history_.push_back({rv_, "DELETED", t.store(), last, last});
  changed_.notify_all();
  return true;
}

std::optional<json> FakeApiServer::Get(const std::string& collection,
                                       const std::string& name) const {
  Target t = ParsePath(collection + "/" + name);
  std::lock_guard lock(mu_);
  auto s = objects_.find(t.store());
  if (s == objects_.end()) return std::nullopt;
  auto it = s->second.find(t.key());
  if (it == s->second.end()) return std::nullopt;
  return it->second;
}

std::vector<json> FakeApiServer::List(const std::string& collection) const {
  Target t = ParsePath(collection + "/x");
  std::lock_guard lock(mu_);
  std::vector<json> out;
  auto s = objects_.find(t.store());
  if (s == objects_.end()) return out;
  for (const auto& [k, v] : s->second) {
    if (t.ns.empty() || FieldOf(v, "metadata.namespace") == t.ns) out.push_back(v);
  }
  return out;
}

uint64_t FakeApiServer::resource_version() const {
  std::lock_guard lock(mu_);
  return rv_;
}

void FakeApiServer::Compact() {
  std::lock_guard lock(mu_);
  compacted_rv_ = rv_;
  history_.clear();
}

void FakeApiServer::SetGarbage(bool garbage) {
  std::lock_guard lock(mu_);
  garbage_ = garbage;
}

void FakeApiServer::SetServed(const std::string& group, bool served) {
  std::lock_guard lock(mu_);
  if (served) {
    unserved_groups_.erase(group);
  } else {
    unserved_groups_.insert(group);
  }
}

void FakeApiServer::SetFailStatus(int http, const std::string& path_prefix) {
  std::lock_guard lock(mu_);
  fail_status_ = http;
  fail_prefix_ = path_prefix;
}

void FakeApiServer::CloseWatches() {
  {
    std::lock_guard lock(mu_);
    ++watch_epoch_;
  }
  changed_.notify_all();
}

void FakeApiServer::SendBookmarks() {
  {
    std::lock_guard lock(mu_);
    ++bookmark_epoch_;
  }
  changed_.notify_all();
}

int FakeApiServer::open_watches() const {
  std::lock_guard lock(mu_);
  return open_watches_;
}

std::vector<ApiRequest> FakeApiServer::Requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

void FakeApiServer::ClearRequests() {
  std::lock_guard lock(mu_);
  requests_.clear();
}

bool FakeApiServer::WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void FakeApiServer::Record(ApiRequest r) {
  std::lock_guard lock(mu_);
  requests_.push_back(std::move(r));
}

void FakeApiServer::SetServiceAddress(const std::string& ns, const std::string& name, int port,
                                      const std::string& address) {
  std::lock_guard lock(mu_);
  service_addresses_[ns + "/" + name + ":" + std::to_string(port)] = address;
}

void FakeApiServer::SetWebhookClientCertificate(const std::string& cert_file,
                                                const std::string& key_file) {
  std::lock_guard lock(mu_);
  webhook_client_cert_ = cert_file;
  webhook_client_key_ = key_file;
}

int FakeApiServer::admission_calls() const {
  std::lock_guard lock(mu_);
  return admission_calls_;
}

namespace {

std::string Base64Decode(const std::string& in) {
  std::string out(in.size(), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  if (n < 0) return "";
  out.resize(static_cast<size_t>(n));
  // EVP_DecodeBlock counts the padding's zero bytes.
  for (size_t i = in.size(); i > 0 && in[i - 1] == '='; --i) out.pop_back();
  return out;
}

bool Contains(const json& list, const std::string& want) {
  if (!list.is_array()) return false;
  for (const json& v : list)
    if (v.is_string() && (v == want || v == "*")) return true;
  return false;
}

// A metav1.LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against
// `labels`; an absent or empty selector matches everything.
bool SelectorMatches(const json& selector, const json& labels) {
  if (!selector.is_object()) return true;
  auto label = [&](const std::string& k) -> const json* {
    return labels.is_object() && labels.contains(k) ? &labels[k] : nullptr;
  };
  for (auto& [k, v] : selector.value("matchLabels", json::object()).items()) {
    const json* l = label(k);
    if (!l || *l != v) return false;
  }
  for (const json& e : selector.value("matchExpressions", json::array())) {
    const std::string op = e.value("operator", ""), key = e.value("key", "");
    const json* l = label(key);
    const bool in = l && Contains(e.value("values", json::array()), l->get<std::string>());
    if ((op == "In" && !in) || (op == "NotIn" && in) || (op == "Exists" && !l) ||
        (op == "DoesNotExist" && l))
      return false;
  }
  return true;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(0, 1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// One quoted CEL string ('x' or "x") at the start of `s`; its text and what follows it.
std::optional<std::pair<std::string, std::string>> Quoted(const std::string& s) {
  if (s.empty() || (s[0] != '\'' && s[0] != '"')) return std::nullopt;
  const size_t end = s.find(s[0], 1);
  if (end == std::string::npos) return std::nullopt;
  return std::pair{s.substr(1, end - 1), Trim(s.substr(end + 1))};
}

// CEL's three outcomes of a condition's term: true, false, or an error (a missing key), which
// `false && error` and `true || error` absorb, as CEL's commutative && and || do.
enum class Cel { kFalse, kTrue, kError };

// One term of the header's subset; nullopt for anything else.
std::optional<Cel> EvalTerm(const std::string& term, const json& meta, const json& spec) {
  if (term.rfind("has(object.spec.", 0) == 0 && term.back() == ')') {
    const std::string field = term.substr(16, term.size() - 17);
    if (field.empty() || field.find_first_of(".()[]'\" ") != std::string::npos) return std::nullopt;
    return spec.contains(field) ? Cel::kTrue : Cel::kFalse;
  }
  for (const char* map : {"annotations", "labels"}) {
    const std::string field = std::string("object.metadata.") + map;
    const json m = meta.value(map, json::object());
    auto of = [](bool b) { return b ? Cel::kTrue : Cel::kFalse; };
    if (term == "has(" + field + ")") return of(meta.contains(map));
    if (auto q = Quoted(term); q && q->second == "in " + field) return of(m.contains(q->first));
    if (term.rfind(field + "[", 0) == 0) {
      auto key = Quoted(term.substr(field.size() + 1));
      if (!key || key->second.rfind("]", 0) != 0) return std::nullopt;
      const std::string cmp = Trim(key->second.substr(1));
      if (cmp.rfind("==", 0) != 0) return std::nullopt;
      auto value = Quoted(Trim(cmp.substr(2)));
      if (!value || !value->second.empty()) return std::nullopt;
      if (!m.contains(key->first)) return Cel::kError;  // CEL: no such key
      return of(m[key->first] == value->first);
    }
  }
  return std::nullopt;
}

// expr := and ('||' and)*; and := unary ('&&' unary)*; unary := '(' expr ')' | term. `at` moves
// past what was read; nullopt for what the subset does not hold.
std::optional<Cel> EvalOr(const std::string& s, size_t& at, const json& meta, const json& spec);

void SkipSpace(const std::string& s, size_t& at) {
  while (at < s.size() && std::isspace(static_cast<unsigned char>(s[at]))) ++at;
}

std::optional<Cel> EvalUnary(const std::string& s, size_t& at, const json& meta, const json& spec) {
  SkipSpace(s, at);
  if (at < s.size() && s[at] == '(') {
    ++at;
    auto v = EvalOr(s, at, meta, spec);
    SkipSpace(s, at);
    if (!v || at >= s.size() || s[at] != ')') return std::nullopt;
    ++at;
    return v;
  }
  // A term runs to the next && or || or unmatched ')' outside quotes and brackets.
  size_t end = at;
  int depth = 0;
  char quote = 0;
  for (; end < s.size(); ++end) {
    const char c = s[end];
    if (quote) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') quote = c;
    if (c == '(' || c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ')' && depth-- == 0) break;
    if (depth == 0 && (s.compare(end, 2, "&&") == 0 || s.compare(end, 2, "||") == 0)) break;
  }
  const std::string term = Trim(s.substr(at, end - at));
  at = end;
  return EvalTerm(term, meta, spec);
}

// A chain of `op` ("&&" or "||") over what `next` reads: `absorbing` (false for &&, true for ||)
// wins over all, then an error.
std::optional<Cel> EvalChain(const std::string& s, size_t& at, const json& meta, const json& spec,
                             const char* op,
                             std::optional<Cel> (*next)(const std::string&, size_t&, const json&,
                                                        const json&),
                             Cel absorbing) {
  auto v = next(s, at, meta, spec);
  for (SkipSpace(s, at); v && s.compare(at, 2, op) == 0; SkipSpace(s, at)) {
    at += 2;
    auto w = next(s, at, meta, spec);
    if (!w) return std::nullopt;
    const Cel other = absorbing == Cel::kTrue ? Cel::kFalse : Cel::kTrue;
    v = *v == absorbing || *w == absorbing       ? absorbing
        : *v == Cel::kError || *w == Cel::kError ? Cel::kError
                                                 : other;
  }
  return v;
}

std::optional<Cel> EvalAnd(const std::string& s, size_t& at, const json& meta, const json& spec) {
  return EvalChain(s, at, meta, spec, "&&", EvalUnary, Cel::kFalse);
}

std::optional<Cel> EvalOr(const std::string& s, size_t& at, const json& meta, const json& spec) {
  return EvalChain(s, at, meta, spec, "||", EvalAnd, Cel::kTrue);
}

// The CEL subset of the header's comment: true or false; nullopt for anything else, and for an
// error (the real API server then fails the request under failurePolicy Fail, as this does).
std::optional<bool> EvalCondition(const std::string& expression, const json& object) {
  const json meta = object.value("metadata", json::object());
  const json spec = object.value("spec", json::object());
  size_t at = 0;
  auto v = EvalOr(expression, at, meta, spec);
  SkipSpace(expression, at);
  if (!v || at != expression.size() || *v == Cel::kError) return std::nullopt;
  return *v == Cel::kTrue;
}

}  // namespace

std::optional<FakeApiServer::Denial> FakeApiServer::Admit(const std::string& ns,
                                                          const std::string& user, const Kind& kind,
                                                          json& pod) {
  std::vector<json> configs;
  json ns_labels = json::object();
  std::map<std::string, std::string> addresses;
  std::string client_cert, client_key;
  {
    std::lock_guard lock(mu_);
    client_cert = webhook_client_cert_;
    client_key = webhook_client_key_;
    for (const auto& [name, c] :
         objects_["admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"])
      configs.push_back(c);
    auto& nss = objects_["v1/namespaces"];
    if (auto it = nss.find(ns); it != nss.end())
      ns_labels = it->second["metadata"].value("labels", json::object());
    addresses = service_addresses_;
  }
  ns_labels["kubernetes.io/metadata.name"] = ns;  // as the real one labels every namespace
  for (const json& config : configs) {
    for (const json& w : config.value("webhooks", json::array())) {
      const std::string name = w.value("name", "");
      bool rule = false;
      for (const json& r : w.value("rules", json::array())) {
        rule = rule || (Contains(r.value("operations", json()), "CREATE") &&
                        Contains(r.value("apiGroups", json()), kind.group) &&
                        Contains(r.value("apiVersions", json()), kind.version) &&
                        Contains(r.value("resources", json()), kind.resource));
      }
      if (!rule || !SelectorMatches(w.value("namespaceSelector", json()), ns_labels) ||
          !SelectorMatches(w.value("objectSelector", json()),
                           pod["metadata"].value("labels", json::object())))
        continue;
      const bool ignore = w.value("failurePolicy", "Fail") == "Ignore";
      auto failed = [&](const std::string& why) -> std::optional<Denial> {
        if (ignore) return std::nullopt;
        return Denial{500, "InternalError",
                      "Internal error occurred: failed calling webhook \"" + name +
                          "\": failed to call webhook: " + why};
      };
      bool conditions = true;
      for (const json& c : w.value("matchConditions", json::array())) {
        auto v = EvalCondition(c.value("expression", ""), pod);
        if (!v) {
          return Denial{500, "InternalError",
                        "fake API server: matchCondition '" + c.value("name", "") + "' (" +
                            c.value("expression", "") + ") is CEL this fake does not read"};
        }
        conditions = conditions && *v;
      }
      if (!conditions) continue;
      if (!Contains(w.value("admissionReviewVersions", json()), "v1"))
        return failed("admissionReviewVersions names no version this API server speaks (v1)");
      const std::string effects = w.value("sideEffects", "");
      if (effects != "None" && effects != "NoneOnDryRun")
        return failed("sideEffects must be None or NoneOnDryRun, not '" + effects + "'");
      const json cc = w.value("clientConfig", json::object());
      std::string address, path = "/";
      if (cc.contains("service")) {
        const json& svc = cc["service"];
        const std::string key = svc.value("namespace", "") + "/" + svc.value("name", "") + ":" +
                                std::to_string(svc.value("port", 443));
        if (auto it = addresses.find(key); it != addresses.end()) address = it->second;
        path = svc.value("path", "/");
        if (address.empty()) return failed("service \"" + key + "\" has no endpoints");
      } else {
        return failed("this fake calls Services only (clientConfig.url is not read)");
      }
      const std::string ca = Base64Decode(cc.value("caBundle", ""));
      if (ca.find("BEGIN CERTIFICATE") == std::string::npos)
        return failed(
            "tls: failed to verify certificate: x509: certificate signed by unknown "
            "authority (no caBundle)");
      char ca_path[] = "/tmp/fake-apiserver-ca.XXXXXX";
      const int fd = mkstemp(ca_path);
      if (fd < 0 || write(fd, ca.data(), ca.size()) != static_cast<ssize_t>(ca.size())) {
        if (fd >= 0) close(fd);
        return failed("writing its caBundle");
      }
      close(fd);
      const size_t colon = address.rfind(':');
      const std::string host = address.substr(0, colon);
      const int port = std::stoi(address.substr(colon + 1));
      auto tls = client_cert.empty()
                     ? std::make_unique<httplib::SSLClient>(host, port)
                     : std::make_unique<httplib::SSLClient>(host, port, client_cert, client_key);
      httplib::SSLClient& client = *tls;
      client.set_ca_cert_path(ca_path);
      client.enable_server_certificate_verification(true);
      const int timeout = w.value("timeoutSeconds", 10);
      client.set_connection_timeout(timeout);
      client.set_read_timeout(timeout);
      const std::string uid = "admission-" + std::to_string(++uid_);
      json review = {
          {"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", uid},
            {"kind", {{"group", kind.group}, {"version", kind.version}, {"kind", kind.kind}}},
            {"resource",
             {{"group", kind.group}, {"version", kind.version}, {"resource", kind.resource}}},
            {"requestKind",
             {{"group", kind.group}, {"version", kind.version}, {"kind", kind.kind}}},
            {"requestResource",
             {{"group", kind.group}, {"version", kind.version}, {"resource", kind.resource}}},
            {"namespace", ns},
            {"operation", "CREATE"},
            {"userInfo", {{"username", user}}},
            {"object", pod},
            {"oldObject", nullptr},
            {"dryRun", false},
            {"options", {{"apiVersion", "meta.k8s.io/v1"}, {"kind", "CreateOptions"}}}}}};
      {
        std::lock_guard lock(mu_);
        ++admission_calls_;
      }
      auto r = client.Post(path.c_str(), review.dump(), "application/json");
      unlink(ca_path);
      if (!r)
        return failed("Post \"https://" + address + path + "\": " + httplib::to_string(r.error()));
      if (r->status != 200)
        return failed("expected response code 200, got " + std::to_string(r->status));
      const json answer = json::parse(r->body, nullptr, false);
      const json* response =
          answer.is_object() && answer.contains("response") && answer["response"].is_object()
              ? &answer["response"]
              : nullptr;
      if (!response || answer.value("apiVersion", "") != "admission.k8s.io/v1" ||
          answer.value("kind", "") != "AdmissionReview")
        return failed("the response is not an admission.k8s.io/v1 AdmissionReview");
      if (response->value("uid", "") != uid)
        return failed("expected response.uid=\"" + uid + "\", got \"" + response->value("uid", "") +
                      "\"");
      if (!response->value("allowed", false)) {
        const json st = response->value("status", json::object());
        int code = st.value("code", 0);
        if (code < 400) code = 400;
        std::string msg = "admission webhook \"" + name + "\" denied the request";
        if (!st.value("message", "").empty()) msg += ": " + st.value("message", "");
        return Denial{code, st.value("reason", "BadRequest"), msg};
      }
      if (response->contains("patch")) {
        if (response->value("patchType", "") != "JSONPatch")
          return failed("patchType must be JSONPatch");
        const json ops = json::parse(Base64Decode(response->value("patch", "")), nullptr, false);
        try {
          pod = pod.patch(ops);
        } catch (const json::exception& e) {
          return Denial{500, "InternalError",
                        "Internal error occurred: webhook \"" + name +
                            "\": its JSON Patch does not apply: " + e.what()};
        }
      }
    }
  }
  return std::nullopt;
}

void FakeApiServer::Handle(const httplib::Request& req, httplib::Response& res) {
  ApiRequest rec;
  rec.method = req.method;
  rec.path = req.target;
  rec.content_type = req.get_header_value("Content-Type");
  rec.body = req.body;
  Target t = ParsePath(req.path);
  rec.resource = t.ok ? t.rbac_resource() : "";
  bool watch = req.get_param_value("watch") == "1" || req.get_param_value("watch") == "true";
  if (req.method == "GET") {
    rec.verb = watch ? "watch" : t.name.empty() ? "list" : "get";
  } else if (req.method == "POST") {
    rec.verb = "create";
  } else if (req.method == "PUT") {
    rec.verb = "update";
  } else if (req.method == "PATCH") {
    rec.verb = "patch";
  } else if (req.method == "DELETE") {
    rec.verb = "delete";
  }
  auto finish = [&](int status) {
    rec.status = status;
    Record(rec);
  };

  std::string auth = req.get_header_value("Authorization");
  const std::string bearer = "Bearer ";
  if (auth.rfind(bearer, 0) == 0) {
    auto it = options_.tokens.find(auth.substr(bearer.size()));
    if (it != options_.tokens.end()) rec.user = it->second;
  }
  if (rec.user.empty()) {
    Fail(res, 401, "Unauthorized", "Unauthorized");
    return finish(401);
  }
  {
    std::lock_guard lock(mu_);
    if (garbage_) {
      res.status = 200;
      res.set_content("<html><body>502 Bad Gateway (not an API server)</body></html>", "text/html");
      requests_.push_back(rec);
      requests_.back().status = 200;
      return;
    }
    if (fail_status_ && req.path.rfind(fail_prefix_, 0) == 0) {
      Fail(res, fail_status_, "InternalError", "injected failure");
      requests_.push_back(rec);
      requests_.back().status = fail_status_;
      return;
    }
    for (const std::string& g : unserved_groups_) {
      if (req.path.rfind("/apis/" + g + "/", 0) == 0) {
        // As the real one answers for an API group whose CRD is not installed.
        Fail(res, 404, "NotFound", "the server could not find the requested resource");
        requests_.push_back(rec);
        requests_.back().status = 404;
        return;
      }
    }
  }
  if (!t.ok) {
    Fail(res, 404, "NotFound", "the server could not find the requested resource");
    return finish(404);
  }
  const std::string store = t.store();
  std::vector<Term> labels, fields;
  if (!ParseSelector(req.get_param_value("labelSelector"), labels) &&
      req.has_param("labelSelector") && !req.get_param_value("labelSelector").empty()) {
    Fail(res, 400, "BadRequest",
         "unable to parse requirement: " + req.get_param_value("labelSelector"));
    return finish(400);
  }
  if (!ParseSelector(req.get_param_value("fieldSelector"), fields) &&
      req.has_param("fieldSelector") && !req.get_param_value("fieldSelector").empty()) {
    Fail(res, 400, "BadRequest", "invalid field selector: " + req.get_param_value("fieldSelector"));
    return finish(400);
  }
  // By value: a watch's stream outlives this call.
  auto in_scope = [ns = t.ns, labels, fields](const json& o) {
    if (!ns.empty() && FieldOf(o, "metadata.namespace") != ns) return false;
    return LabelsMatch(o, labels) && FieldsMatch(o, fields);
  };

  if (req.method == "GET" && t.name.empty() && !watch) {
    std::lock_guard lock(mu_);
    json items = json::array();
    int limit = req.has_param("limit") ? std::atoi(req.get_param_value("limit").c_str()) : 0;
    std::string after = req.get_param_value("continue");
    std::string last;
    bool more = false;
    for (const auto& [k, v] : objects_[store]) {
      if (!after.empty() && k <= after) continue;
      if (!in_scope(v)) continue;
      if (limit > 0 && static_cast<int>(items.size()) == limit) {
        more = true;
        break;
      }
      items.push_back(v);
      last = k;
    }
    json meta = {{"resourceVersion", std::to_string(rv_)}};
    if (more) meta["continue"] = last;
    Reply(res, 200,
          {{"kind", KindOf(t.resource) + "List"},
           {"apiVersion", t.group_version},
           {"metadata", meta},
           {"items", items}});
    requests_.push_back(rec);
    requests_.back().status = 200;
    return;
  }

  if (req.method == "GET" && watch) {
    std::string from = req.get_param_value("resourceVersion");
    int timeout_s = req.has_param("timeoutSeconds")
                        ? std::atoi(req.get_param_value("timeoutSeconds").c_str())
                        : 1800;
    bool bookmarks = req.get_param_value("allowWatchBookmarks") == "true";
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    std::vector<std::string> initial;
    uint64_t cursor = 0;
    uint64_t epoch = 0, bookmark_epoch = 0;
    {
      std::lock_guard lock(mu_);
      epoch = watch_epoch_;
      bookmark_epoch = bookmark_epoch_;
      ++open_watches_;
      if (from.empty() || from == "0") {
        for (const auto& [k, v] : objects_[store]) {
          if (in_scope(v)) initial.push_back(json{{"type", "ADDED"}, {"object", v}}.dump());
        }
        cursor = rv_;
      } else {
        uint64_t n = std::strtoull(from.c_str(), nullptr, 10);
        if (n < compacted_rv_) {
          initial.push_back(json{{"type", "ERROR"},
                                 {"object", StatusBody(410, "Expired",
                                                       "too old resource version: " + from + " (" +
                                                           std::to_string(compacted_rv_) + ")")}}
                                .dump());
          cursor = UINT64_MAX;  // nothing more: the stream ends after the error
        } else {
          cursor = n;
        }
      }
    }
    rec.status = 200;
    Record(rec);
    res.status = 200;
    res.set_chunked_content_provider(
        "application/json",
        [this, initial = std::move(initial), cursor, epoch, bookmark_epoch, bookmarks, deadline,
         store, in_scope, sent_initial = false](size_t, httplib::DataSink& sink) mutable {
          if (!sent_initial) {
            sent_initial = true;
            for (const std::string& line : initial) {
              std::string l = line + "\n";
              if (!sink.write(l.data(), l.size())) return false;
            }
            if (cursor == UINT64_MAX) {
              sink.done();
              return true;
            }
          }
          std::vector<std::string> lines;
          {
            std::unique_lock lock(mu_);
            changed_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() +
                                                             std::chrono::milliseconds(100)));
            if (stopping_ || watch_epoch_ != epoch) return false;  // the connection breaks
            for (const Event& e : history_) {
              if (e.rv <= cursor || e.store != store) continue;
              bool was = !e.old_object.is_null() && in_scope(e.old_object);
              bool is = e.type != "DELETED" && in_scope(e.object);
              std::string type = e.type;
              if (e.type == "DELETED") {
                if (!was) continue;
              } else if (was && !is) {
                type = "DELETED";
              } else if (!was && is) {
                type = "ADDED";
              } else if (!is) {
                continue;
              }
              lines.push_back(json{{"type", type}, {"object", e.object}}.dump());
            }
            if (!history_.empty()) cursor = std::max(cursor, history_.back().rv);
            if (bookmarks && bookmark_epoch_ != bookmark_epoch) {
              bookmark_epoch = bookmark_epoch_;
              lines.push_back(json{{"type", "BOOKMARK"},
                                   {"object",
                                    {{"kind", KindOf(store.substr(store.rfind('/') + 1))},
                                     {"metadata", {{"resourceVersion", std::to_string(rv_)}}}}}}
                                  .dump());
            }
          }
          for (const std::string& line : lines) {
            std::string l = line + "\n";
            if (!sink.write(l.data(), l.size())) return false;
          }
          if (std::chrono::steady_clock::now() >= deadline) sink.done();
          return true;
        },
        [this](bool) {
          std::lock_guard lock(mu_);
          --open_watches_;
        });
    return;
  }

  // A pod's or a ResourceClaim's creation passes the mutating admission webhooks first, outside
  // the lock.
  std::string admitted;
  std::optional<Kind> admits;
  if (t.group_version == "v1" && t.resource == "pods")
    admits = Kind{"", "v1", "pods", "Pod"};
  else if (t.group_version == "resource.k8s.io/v1" && t.resource == "resourceclaims")
    admits = Kind{"resource.k8s.io", "v1", "resourceclaims", "ResourceClaim"};
  if (req.method == "POST" && admits && t.sub.empty()) {
    json pod = json::parse(req.body, nullptr, false);
    if (pod.is_object()) {
      if (!pod.contains("metadata") || !pod["metadata"].is_object())
        pod["metadata"] = json::object();
      if (auto denied = Admit(t.ns, rec.user, *admits, pod)) {
        Fail(res, denied->code, denied->reason, denied->message);
        return finish(denied->code);
      }
      admitted = pod.dump();
    }
  }
  std::lock_guard lock(mu_);
  auto& objs = objects_[store];
  auto reply = [&](int code, const json& body) {
    Reply(res, code, body);
    rec.status = code;
    requests_.push_back(rec);
  };
  auto fail = [&](int code, const std::string& reason, const std::string& msg) {
    reply(code, StatusBody(code, reason, msg));
  };
  const std::string what = t.resource + " \"" + t.name + "\"";

  if (req.method == "GET") {
    auto it = objs.find(t.key());
    if (it == objs.end()) return fail(404, "NotFound", what + " not found");
    return reply(200, it->second);
  }

  json body;
  if (req.method != "DELETE") {
    try {
      body = json::parse(admitted.empty() ? req.body : admitted);
    } catch (const json::exception& e) {
      return fail(400, "BadRequest", std::string("the body is not JSON: ") + e.what());
    }
    if (!body.is_object()) return fail(400, "BadRequest", "the body is not a JSON object");
    if (body.contains("metadata") && !body["metadata"].is_object()) {
      return fail(422, "Invalid", "metadata: expected an object");
    }
  }

  if (req.method == "POST" && t.resource == "pods" && t.sub == "binding") {
    auto it = objs.find(t.key());
    if (it == objs.end()) return fail(404, "NotFound", what + " not found");
    std::string node = body.contains("target") ? body["target"].value("name", "") : "";
    if (node.empty()) return fail(400, "BadRequest", "binding: target.name is required");
    std::string bound = FieldOf(it->second, "spec.nodeName");
    if (!bound.empty()) {
      return fail(409, "Conflict",
                  "pod " + t.name + " is already assigned to node \"" + bound + "\"");
    }
    json updated = it->second;
    updated["spec"]["nodeName"] = node;
    if (body.contains("metadata") && body["metadata"].contains("annotations")) {
      for (auto& [k, v] : body["metadata"]["annotations"].items()) {
        updated["metadata"]["annotations"][k] = v;
      }
    }
    it->second = StampLocked(store, updated, &it->second);
    return reply(201, StatusBody(201, "", ""));
  }
  if (req.method == "POST" && t.resource == "pods" && t.sub == "eviction") {
    // policy/v1 Eviction: deletes the pod (no PodDisruptionBudgets here), honouring a UID
    // precondition as the real one does.
    if (body.value("kind", "") != "Eviction") {
      return fail(400, "BadRequest", "eviction: kind must be Eviction");
    }
    auto it = objs.find(t.key());
    if (it == objs.end()) return fail(404, "NotFound", what + " not found");
    const json* pre = nullptr;
    if (body.contains("deleteOptions") && body["deleteOptions"].is_object() &&
        body["deleteOptions"].contains("preconditions")) {
      pre = &body["deleteOptions"]["preconditions"];
    }
    if (pre && pre->is_object() && pre->contains("uid") &&
        (*pre)["uid"] != it->second["metadata"].value("uid", "")) {
      return fail(409, "Conflict", "the UID in the precondition does not match " + what);
    }
    const json* grace = nullptr;
    if (body.contains("deleteOptions") && body["deleteOptions"].is_object() &&
        body["deleteOptions"].contains("gracePeriodSeconds"))
      grace = &body["deleteOptions"]["gracePeriodSeconds"];
    if (TerminateLocked(store, it->second, grace)) return reply(201, StatusBody(201, "", ""));
    json last = it->second;
    objs.erase(it);
    last["metadata"]["resourceVersion"] = std::to_string(++rv_);
    history_.push_back({rv_, "DELETED", store, last, last});
    changed_.notify_all();
    return reply(201, StatusBody(201, "", ""));
  }
  if (!t.sub.empty() && t.sub != "status") {
    return fail(404, "NotFound", "no subresource " + t.sub + " for " + t.resource);
  }

  if (req.method == "POST") {
    if (!t.name.empty()) return fail(405, "MethodNotAllowed", "POST to an object");
    if (!body.contains("metadata")) body["metadata"] = json::object();
    std::string name = FieldOf(body, "metadata.name");
    if (name.empty() && body["metadata"].contains("generateName")) {
      name = body["metadata"]["generateName"].get<std::string>() + std::to_string(uid_ + 1);
      body["metadata"]["name"] = name;
    }
    if (name.empty()) return fail(422, "Invalid", "metadata.name: Required value");
    if (!t.ns.empty()) body["metadata"]["namespace"] = t.ns;
    std::string key = t.ns.empty() ? name : t.ns + "/" + name;
    if (objs.contains(key)) {
      return fail(409, "AlreadyExists", t.resource + " \"" + name + "\" already exists");
    }
    if (!body.contains("kind")) body["kind"] = KindOf(t.resource);
    if (!body.contains("apiVersion")) body["apiVersion"] = t.group_version;
    objs[key] = StampLocked(store, body, nullptr);
    return reply(201, objs[key]);
  }

  auto it = objs.find(t.key());
  if (it == objs.end()) return fail(404, "NotFound", what + " not found");
  if (req.method == "DELETE") {
    if (t.resource == "pods") {
      json options = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
      if (!options.is_object()) options = json::object();
      if (!options.contains("gracePeriodSeconds")) {
        auto q = req.params.find("gracePeriodSeconds");
        if (q != req.params.end()) options["gracePeriodSeconds"] = std::atoll(q->second.c_str());
      }
      const json* grace =
          options.contains("gracePeriodSeconds") ? &options["gracePeriodSeconds"] : nullptr;
      if (TerminateLocked(store, it->second, grace)) return reply(200, it->second);
    }
    json last = it->second;
    objs.erase(it);
    last["metadata"]["resourceVersion"] = std::to_string(++rv_);
    history_.push_back({rv_, "DELETED", store, last, last});
    changed_.notify_all();
    return reply(200, last);
  }
  auto check_version = [&](const json& b) {
    if (!b.contains("metadata") || !b["metadata"].is_object() ||
        !b["metadata"].contains("resourceVersion")) {
      return true;
    }
    return b["metadata"]["resourceVersion"] == it->second["metadata"]["resourceVersion"];
  };
  if (!check_version(body)) {
    return fail(409, "Conflict",
                "Operation cannot be fulfilled on " + what +
                    ": the object has been modified; please apply your changes to the latest "
                    "version and try again");
  }
  json updated;
  if (req.method == "PUT") {
    updated = body;
  } else {
    std::string ct = rec.content_type;
    if (ct.find("application/merge-patch+json") == 0 ||
        ct.find("application/strategic-merge-patch+json") == 0) {
      updated = it->second;
      updated.merge_patch(body);
    } else {
      return fail(415, "UnsupportedMediaType", "the patch type " + ct + " is not supported");
    }
  }
  if (FieldOf(updated, "metadata.name") != t.name) {
    return fail(422, "Invalid", "metadata.name: cannot be changed");
  }
  // A write naming another object's UID is a failed precondition (a newer object of that name).
  if (const json* u = body.contains("metadata") && body["metadata"].is_object() &&
                              body["metadata"].contains("uid")
                          ? &body["metadata"]["uid"]
                          : nullptr;
      u && *u != it->second["metadata"].value("uid", "")) {
    return fail(409, "Conflict",
                "Precondition failed: UID in precondition: " + u->dump() +
                    ", UID in object meta: " + it->second["metadata"].value("uid", ""));
  }
  if (t.resource == "pods" && t.sub.empty()) {
    // The API server's pod update rules for spec.activeDeadlineSeconds: set, or lowered; never
    // raised or removed.
    auto deadline = [](const json& pod) -> const json* {
      if (!pod.contains("spec") || !pod["spec"].is_object()) return nullptr;
      auto d = pod["spec"].find("activeDeadlineSeconds");
      return d == pod["spec"].end() || d->is_null() ? nullptr : &*d;
    };
    const json* was = deadline(it->second);
    const json* now = deadline(updated);
    if (now && (!now->is_number_integer() || now->get<int64_t>() < 0 ||
                now->get<int64_t>() > 2147483647)) {
      return fail(422, "Invalid", "spec.activeDeadlineSeconds: must be between 0 and 2147483647");
    }
    if (was && now && was->get<int64_t>() < now->get<int64_t>()) {
      return fail(422, "Invalid",
                  "spec.activeDeadlineSeconds: must be less than or equal to previous value");
    }
    if (was && !now) {
      return fail(422, "Invalid",
                  "spec.activeDeadlineSeconds: must not update from a positive integer to nil "
                  "value");
    }
  }
  it->second = StampLocked(store, updated, &it->second);
  return reply(200, it->second);
}

}  // namespace tessera::fakes
