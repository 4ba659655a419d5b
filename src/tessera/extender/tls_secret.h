#pragma once
// Who may call the extender: HTTPS with a client certificate kube-scheduler presents. Without a
// cluster PKI to hand them out, the extender keeps its own small CA in a Secret (made at its first
// start) with its server certificate (its Service's DNS names) and kube-scheduler's client
// certificate; kube-scheduler mounts ca.crt, client.crt and client.key of it (its extender
// tlsConfig), the extender serves with tls.crt/tls.key and accepts only clients of that CA named
// `client_name`. docs/kubernetes.md, "Who may call the extender".

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/kube/client.h"

namespace tessera::extender {

struct TlsSecretOptions {
  std::string ns, name;                           // the Secret
  std::vector<std::string> dns;                   // the server certificate's names
  std::string client_name = "tessera-scheduler";  // the client certificate's common name
  std::string dir;      // where the files are written for the HTTP server (0700)
  int renew_days = 30;  // a server certificate this close to its end is issued again
};

struct TlsFiles {
  std::string ca_file, cert_file, key_file;  // under TlsSecretOptions::dir, mode 0600
};

// Reads the Secret, or makes the CA and both certificates and creates it when there is none (an
// extender that loses a race to create it - 409 - reads the winner's). A server certificate that
// does not name every `dns` name or ends within renew_days is issued again from the same CA and
// the Secret patched (at its resourceVersion). Errors name the Secret: it cannot be read or
// created (RBAC), or holds what does not parse.
absl::StatusOr<TlsFiles> EnsureTlsSecret(kube::Client& client, const TlsSecretOptions& options);

}  // namespace tessera::extender
