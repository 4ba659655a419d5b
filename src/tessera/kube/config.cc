#include "tessera/kube/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "fmt/format.h"

namespace tessera::kube {
namespace {

absl::StatusOr<std::string> ReadText(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        fmt::format("{}: cannot read {}: {}", what, path, std::strerror(errno)));
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Resolve(const std::string& file, const std::string& kubeconfig_path) {
  if (file.empty() || file[0] == '/') return file;
  auto slash = kubeconfig_path.rfind('/');
  if (slash == std::string::npos) return file;
  return kubeconfig_path.substr(0, slash + 1) + file;
}

// One named entry of a kubeconfig list (contexts, clusters, users): its inner map.
absl::StatusOr<YAML::Node> Named(const YAML::Node& root, const std::string& list,
                                 const std::string& inner, const std::string& name,
                                 const std::string& path) {
  YAML::Node seq = root[list];
  if (seq && !seq.IsSequence()) {
    return absl::InvalidArgumentError(fmt::format("{}: {}: expected a list", path, list));
  }
  if (seq) {
    for (size_t i = 0; i < seq.size(); ++i) {
      const YAML::Node& e = seq[i];
      if (!e.IsMap()) {
        return absl::InvalidArgumentError(
            fmt::format("{}: {}[{}]: expected a map with name and {}", path, list, i, inner));
      }
      if (!e["name"] || e["name"].as<std::string>() != name) continue;
      YAML::Node body = e[inner];
      if (!body || !body.IsMap()) {
        return absl::InvalidArgumentError(
            fmt::format("{}: {}[{}] ({}): {}: expected a map", path, list, i, name, inner));
      }
      return body;
    }
  }
  return absl::NotFoundError(fmt::format("{}: {} has no entry named \"{}\"", path, list, name));
}

std::string Str(const YAML::Node& map, const char* key) {
  YAML::Node v = map[key];
  return v && v.IsScalar() ? v.as<std::string>() : std::string();
}

// A PEM from `<key>-data` (base64) or `<key>` (a file).
absl::StatusOr<std::string> Pem(const YAML::Node& map, const std::string& key,
                                const std::string& where, const std::string& path) {
  std::string data = Str(map, (key + "-data").c_str());
  if (!data.empty()) {
    std::string out;
    if (!absl::Base64Unescape(data, &out)) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {}.{}-data: not valid base64", path, where, key));
    }
    return out;
  }
  std::string file = Str(map, key.c_str());
  if (file.empty()) return std::string();
  return ReadText(Resolve(file, path), fmt::format("{}: {}.{}", path, where, key));
}

absl::StatusOr<ClusterConfig> ParseUnchecked(std::string_view yaml, const std::string& path,
                                             const std::string& wanted) {
  YAML::Node root = YAML::Load(std::string(yaml));
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(fmt::format("{}: not a kubeconfig (expected a map)", path));
  }
  std::string context = wanted.empty() ? Str(root, "current-context") : wanted;
  if (context.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: no current-context, and no context was named", path));
  }
  auto ctx = Named(root, "contexts", "context", context, path);
  if (!ctx.ok()) return ctx.status();
  std::string cluster_name = Str(*ctx, "cluster");
  std::string user_name = Str(*ctx, "user");
  if (cluster_name.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: context \"{}\" names no cluster", path, context));
  }
  auto cluster = Named(root, "clusters", "cluster", cluster_name, path);
  if (!cluster.ok()) return cluster.status();

  ClusterConfig c;
  c.origin = fmt::format("kubeconfig {} (context {})", path, context);
  c.server = Str(*cluster, "server");
  if (c.server.rfind("https://", 0) != 0 && c.server.rfind("http://", 0) != 0) {
    return absl::InvalidArgumentError(
        fmt::format("{}: clusters[{}].server: expected an http(s):// URL, got \"{}\"", path,
                    cluster_name, c.server));
  }
  while (c.server.size() > 8 && c.server.back() == '/') c.server.pop_back();
  std::string where = fmt::format("clusters[{}]", cluster_name);
  auto ca = Pem(*cluster, "certificate-authority", where, path);
  if (!ca.ok()) return ca.status();
  c.ca_pem = *ca;
  std::string insecure = Str(*cluster, "insecure-skip-tls-verify");
  c.insecure_skip_tls_verify = insecure == "true";
  if (std::string ns = Str(*ctx, "namespace"); !ns.empty()) c.default_namespace = ns;

  if (!user_name.empty()) {
    auto user = Named(root, "users", "user", user_name, path);
    if (!user.ok()) return user.status();
    where = fmt::format("users[{}]", user_name);
    for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
      if ((*user)[unsupported]) {
        return absl::InvalidArgumentError(
            fmt::format("{}: {}.{}: not supported (use a token, tokenFile or a client certificate)",
                        path, where, unsupported));
      }
    }
    c.token = Str(*user, "token");
    if (std::string f = Str(*user, "tokenFile"); !f.empty()) c.token_file = Resolve(f, path);
    auto cert = Pem(*user, "client-certificate", where, path);
    if (!cert.ok()) return cert.status();
    auto key = Pem(*user, "client-key", where, path);
    if (!key.ok()) return key.status();
    c.client_cert_pem = *cert;
    c.client_key_pem = *key;
    if (c.client_cert_pem.empty() != c.client_key_pem.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: {}: a client certificate needs its key and the other way round", path, where));
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<ClusterConfig> ParseKubeconfig(std::string_view yaml, const std::string& path,
                                              const std::string& context) {
  try {
    return ParseUnchecked(yaml, path, context);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", path, e.what()));
  }
}

absl::StatusOr<ClusterConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  auto text = ReadText(path, "kubeconfig");
  if (!text.ok()) return text.status();
  return ParseKubeconfig(*text, path, context);
}

absl::StatusOr<ClusterConfig> LoadInCluster(const Getenv& getenv, const std::string& sa_dir) {
  std::optional<std::string> host = getenv("KUBERNETES_SERVICE_HOST");
  std::optional<std::string> port = getenv("KUBERNETES_SERVICE_PORT");
  if (!host || host->empty()) {
    return absl::FailedPreconditionError(
        "in-cluster config: KUBERNETES_SERVICE_HOST is not set (not running in a pod?)");
  }
  ClusterConfig c;
  c.origin = "in-cluster";
  std::string h = host->find(':') != std::string::npos ? "[" + *host + "]" : *host;  // IPv6
  c.server = fmt::format("https://{}:{}", h, port && !port->empty() ? *port : "443");
  c.token_file = sa_dir + "/token";
  auto token = ReadText(c.token_file, "in-cluster config");
  if (!token.ok()) return token.status();
  auto ca = ReadText(sa_dir + "/ca.crt", "in-cluster config");
  if (!ca.ok()) return ca.status();
  c.ca_pem = *ca;
  if (auto ns = ReadText(sa_dir + "/namespace", "in-cluster config"); ns.ok()) {
    std::string n = *ns;
    while (!n.empty() && (n.back() == '\n' || n.back() == ' ')) n.pop_back();
    if (!n.empty()) c.default_namespace = n;
  }
  return c;
}

absl::StatusOr<ClusterConfig> LoadDefault(const std::string& kubeconfig,
                                          const std::string& context) {
  if (!kubeconfig.empty()) return LoadKubeconfig(kubeconfig, context);
  auto env = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  if (auto k = env("KUBECONFIG"); k && !k->empty()) {
    return LoadKubeconfig(k->substr(0, k->find(':')), context);
  }
  if (auto h = env("KUBERNETES_SERVICE_HOST"); h && !h->empty()) return LoadInCluster(env);
  if (auto home = env("HOME"); home && !home->empty()) {
    return LoadKubeconfig(*home + "/.kube/config", context);
  }
  return absl::FailedPreconditionError(
      "no API server config: pass --kubeconfig, set KUBECONFIG, or run in a pod");
}

absl::StatusOr<std::string> CurrentToken(const ClusterConfig& config) {
  if (config.token_file.empty()) return config.token;
  auto t = ReadText(config.token_file, "bearer token");
  if (!t.ok()) return t.status();
  std::string token = *t;
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  return token;
}

}  // namespace tessera::kube
