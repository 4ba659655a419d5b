#pragma once
// A small certificate authority, for a component that must serve TLS and check its clients where
// no cluster PKI hands it certificates: the scheduler extender makes one CA, a server certificate
// for its Service's DNS names and a client certificate for kube-scheduler, keeps them in a Secret,
// and both sides mount what they need (docs/kubernetes.md, "Who may call the extender").
// ECDSA P-256 keys, SHA-256 signatures, PEM text (OpenSSL).

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::net {

struct Pem {
  std::string cert;  // X.509 certificate, PEM
  std::string key;   // its private key, PKCS#8 PEM
};

struct CertRequest {
  std::string common_name;
  std::vector<std::string> dns_names;  // subjectAltName DNS entries (a server's host names)
  bool server = false;                 // extendedKeyUsage serverAuth
  bool client = false;                 // extendedKeyUsage clientAuth
  int days = 1825;
};

// A self-signed CA (basicConstraints CA:TRUE, keyCertSign) valid for `days`.
absl::StatusOr<Pem> MakeCertificateAuthority(const std::string& common_name, int days = 3650);
// A leaf certificate signed by `ca`. kInvalidArgument when `ca` does not parse or its key is not
// the certificate's.
absl::StatusOr<Pem> IssueCertificate(const Pem& ca, const CertRequest& request);
// Seconds until the certificate in `cert_pem` expires (negative: expired); kInvalidArgument when it
// does not parse.
absl::StatusOr<int64_t> SecondsLeft(const std::string& cert_pem);
// Whether the certificate in `cert_pem` is valid for every host name in `dns` (false when it does
// not parse).
bool NamesAll(const std::string& cert_pem, const std::vector<std::string>& dns);

}  // namespace tessera::net
