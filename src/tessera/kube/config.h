#pragma once
// Where the Kubernetes API server is and how to prove who we are to it: a kubeconfig file (the
// current or a named context) or the in-cluster service account. Plain values and pure parsing;
// reading files is the only side effect, and each loader names the file it could not use.

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera::kube {

struct ClusterConfig {
  std::string server;  // "https://10.0.0.1:6443", "http://127.0.0.1:8080"
  // Trust: a CA bundle (PEM, from a file or a kubeconfig's -data field) or no verification.
  std::string ca_pem;
  bool insecure_skip_tls_verify = false;
  // Identity: a bearer token (a literal, or a file re-read as the kubelet rotates it), and/or a
  // client certificate pair (PEM).
  std::string token;
  std::string token_file;
  std::string client_cert_pem;
  std::string client_key_pem;
  std::string default_namespace = "default";
  std::string origin;  // "kubeconfig /home/a/.kube/config (context prod)", "in-cluster"
};

// Parses a kubeconfig's YAML. `path` is where it came from: relative file references resolve
// against its folder, and errors name it. `context` empty: the file's current-context.
// kInvalidArgument naming the field that is wrong or missing; kNotFound for a context, cluster
// or user the file does not have.
absl::StatusOr<ClusterConfig> ParseKubeconfig(std::string_view yaml, const std::string& path,
                                              const std::string& context = "");
// Reads and parses a kubeconfig file (kFailedPrecondition when it cannot be read).
absl::StatusOr<ClusterConfig> LoadKubeconfig(const std::string& path,
                                             const std::string& context = "");

// The in-cluster config: KUBERNETES_SERVICE_HOST/PORT from `getenv` and the service account's
// files under `sa_dir` (token, ca.crt, namespace). kFailedPrecondition naming what is missing.
using Getenv = std::function<std::optional<std::string>(const std::string&)>;
inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";
absl::StatusOr<ClusterConfig> LoadInCluster(const Getenv& getenv,
                                            const std::string& sa_dir = kServiceAccountDir);

// What a command-line tool does: `kubeconfig` when given; else $KUBECONFIG (its first entry);
// else the in-cluster config when KUBERNETES_SERVICE_HOST is set; else ~/.kube/config.
absl::StatusOr<ClusterConfig> LoadDefault(const std::string& kubeconfig,
                                          const std::string& context = "");

// The token to send now: `token`, or the current content of `token_file` (trailing newline
// removed). kFailedPrecondition when the file cannot be read.
absl::StatusOr<std::string> CurrentToken(const ClusterConfig& config);

}  // namespace tessera::kube
