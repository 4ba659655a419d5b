#include "tessera/net/certs.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

#include "fmt/format.h"

namespace tessera::net {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;

absl::Status Failed(const std::string& what) {
  return absl::InternalError(fmt::format("{}: OpenSSL failed", what));
}

std::string Text(BIO* b) {
  char* data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<Pem> Encode(X509* cert, EVP_PKEY* key) {
  Bio c(BIO_new(BIO_s_mem())), k(BIO_new(BIO_s_mem()));
  if (!c || !k || PEM_write_bio_X509(c.get(), cert) != 1 ||
      PEM_write_bio_PrivateKey(k.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return Failed("writing PEM");
  }
  return Pem{Text(c.get()), Text(k.get())};
}

bool AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `cn`, valid from an hour ago (clocks differ) for `days`, with a
// random 128-bit serial; issuer and signature are the caller's.
Cert NewCert(EVP_PKEY* key, const std::string& cn, int days) {
  Cert cert(X509_new());
  if (!cert) return nullptr;
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1) return nullptr;
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  const bool ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) &&
                  X509_set_version(cert.get(), 2) == 1 &&
                  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) != nullptr &&
                  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400L * days) != nullptr &&
                  X509_set_pubkey(cert.get(), key) == 1 &&
                  X509_NAME_add_entry_by_NID(
                      X509_get_subject_name(cert.get()), NID_commonName, MBSTRING_UTF8,
                      reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0) == 1;
  BN_free(bn);
  return ok ? std::move(cert) : nullptr;
}

absl::StatusOr<std::pair<Cert, Key>> Decode(const Pem& pem) {
  Bio c(BIO_new_mem_buf(pem.cert.data(), static_cast<int>(pem.cert.size())));
  Bio k(BIO_new_mem_buf(pem.key.data(), static_cast<int>(pem.key.size())));
  Cert cert(c ? PEM_read_bio_X509(c.get(), nullptr, nullptr, nullptr) : nullptr);
  Key key(k ? PEM_read_bio_PrivateKey(k.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert || !key)
    return absl::InvalidArgumentError("the CA's certificate or key does not parse");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError("the CA's key is not its certificate's");
  }
  return std::make_pair(std::move(cert), std::move(key));
}

}  // namespace

absl::StatusOr<Pem> MakeCertificateAuthority(const std::string& common_name, int days) {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return Failed("a CA key");
  Cert cert = NewCert(key.get(), common_name, days);
  if (!cert || X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get())) != 1 ||
      !AddExtension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE") ||
      !AddExtension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !AddExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash") ||
      X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) {
    return Failed("the CA certificate");
  }
  return Encode(cert.get(), key.get());
}

absl::StatusOr<Pem> IssueCertificate(const Pem& ca, const CertRequest& r) {
  auto issuer = Decode(ca);
  if (!issuer.ok()) return issuer.status();
  auto& [ca_cert, ca_key] = *issuer;
  Key key(EVP_EC_gen("P-256"));
  if (!key) return Failed("a key");
  Cert cert = NewCert(key.get(), r.common_name, r.days);
  std::string usage;
  if (r.server) usage += "serverAuth";
  if (r.client) usage += std::string(usage.empty() ? "" : ",") + "clientAuth";
  std::string san;
  for (const std::string& d : r.dns_names) san += (san.empty() ? "DNS:" : ",DNS:") + d;
  if (!cert || X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get())) != 1 ||
      !AddExtension(cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE") ||
      !AddExtension(cert.get(), ca_cert.get(), NID_key_usage,
                    "critical,digitalSignature,keyEncipherment") ||
      (!usage.empty() && !AddExtension(cert.get(), ca_cert.get(), NID_ext_key_usage, usage)) ||
      (!san.empty() && !AddExtension(cert.get(), ca_cert.get(), NID_subject_alt_name, san)) ||
      !AddExtension(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always") ||
      X509_sign(cert.get(), ca_key.get(), EVP_sha256()) <= 0) {
    return Failed(fmt::format("the certificate of {}", r.common_name));
  }
  return Encode(cert.get(), key.get());
}

absl::StatusOr<int64_t> SecondsLeft(const std::string& cert_pem) {
  Bio b(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  Cert cert(b ? PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) return absl::InvalidArgumentError("the certificate does not parse");
  int days = 0, seconds = 0;
  if (ASN1_TIME_diff(&days, &seconds, nullptr, X509_get0_notAfter(cert.get())) != 1) {
    return absl::InvalidArgumentError("the certificate's end date does not parse");
  }
  return int64_t{days} * 86400 + seconds;
}

bool NamesAll(const std::string& cert_pem, const std::vector<std::string>& dns) {
  Bio b(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  Cert cert(b ? PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) return false;
  for (const std::string& d : dns) {
    if (X509_check_host(cert.get(), d.data(), d.size(), X509_CHECK_FLAG_NO_WILDCARDS, nullptr) != 1)
      return false;
  }
  return true;
}

}  // namespace tessera::net
