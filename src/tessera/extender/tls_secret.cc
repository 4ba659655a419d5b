#include "tessera/extender/tls_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/net/certs.h"

namespace tessera::extender {
namespace {

using nlohmann::json;

constexpr const char* kKeys[] = {"ca.crt",  "ca.key",     "tls.crt",
                                 "tls.key", "client.crt", "client.key"};

absl::Status WriteFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return absl::InternalError(fmt::format("{}: {}", path, strerror(errno)));
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok ? absl::OkStatus() : absl::InternalError(fmt::format("{}: short write", path));
}

absl::StatusOr<std::map<std::string, std::string>> Make(const TlsSecretOptions& o) {
  auto ca = net::MakeCertificateAuthority("tessera-extender-ca");
  if (!ca.ok()) return ca.status();
  auto server = net::IssueCertificate(
      *ca, {.common_name = "tessera-extender", .dns_names = o.dns, .server = true});
  if (!server.ok()) return server.status();
  auto client = net::IssueCertificate(*ca, {.common_name = o.client_name, .client = true});
  if (!client.ok()) return client.status();
  return std::map<std::string, std::string>{
      {"ca.crt", ca->cert},     {"ca.key", ca->key},          {"tls.crt", server->cert},
      {"tls.key", server->key}, {"client.crt", client->cert}, {"client.key", client->key}};
}

json Data(const std::map<std::string, std::string>& files) {
  json data = json::object();
  for (const auto& [k, v] : files) data[k] = absl::Base64Escape(v);
  return data;
}

}  // namespace

absl::StatusOr<TlsFiles> EnsureTlsSecret(kube::Client& client, const TlsSecretOptions& o) {
  const std::string what = fmt::format("the TLS Secret {}/{}", o.ns, o.name);
  const std::string path = fmt::format("/api/v1/namespaces/{}/secrets/{}", o.ns, o.name);
  std::map<std::string, std::string> files;
  auto got = client.Get(path);
  if (!got.ok() && kube::HttpStatusOf(got.status()) == 404) {
    auto made = Make(o);
    if (!made.ok()) return made.status();
    json secret = {{"apiVersion", "v1"},
                   {"kind", "Secret"},
                   {"metadata",
                    {{"name", o.name},
                     {"namespace", o.ns},
                     {"labels", {{"app.kubernetes.io/part-of", "tessera"}}}}},
                   {"type", "Opaque"},
                   {"data", Data(*made)}};
    auto created = client.Create(fmt::format("/api/v1/namespaces/{}/secrets", o.ns), secret);
    if (created.ok()) {
      spdlog::info("extender: made a CA and certificates in {}", what);
      files = std::move(*made);
    } else if (kube::HttpStatusOf(created.status()) == 409) {
      got = client.Get(path);  // another extender made it first
    } else {
      return absl::Status(
          created.status().code(),
          fmt::format("creating {}: {}", what, std::string(created.status().message())));
    }
  }
  if (files.empty()) {
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          fmt::format("reading {}: {}", what, std::string(got.status().message())));
    }
    const json data = got->value("data", json::object());
    for (const char* k : kKeys) {
      std::string text;
      if (!data.contains(k) || !data[k].is_string() ||
          !absl::Base64Unescape(data[k].get<std::string>(), &text) || text.empty()) {
        return absl::InvalidArgumentError(fmt::format("{} has no usable {}", what, k));
      }
      files[k] = text;
    }
    auto left = net::SecondsLeft(files["tls.crt"]);
    if (!left.ok())
      return absl::InvalidArgumentError(
          fmt::format("{}: tls.crt: {}", what, std::string(left.status().message())));
    if (*left < int64_t{o.renew_days} * 86400 || !net::NamesAll(files["tls.crt"], o.dns)) {
      auto server = net::IssueCertificate(
          {files["ca.crt"], files["ca.key"]},
          {.common_name = "tessera-extender", .dns_names = o.dns, .server = true});
      if (!server.ok()) {
        return absl::InvalidArgumentError(fmt::format("{}: issuing a new server certificate: {}",
                                                      what,
                                                      std::string(server.status().message())));
      }
      files["tls.crt"] = server->cert, files["tls.key"] = server->key;
      json patch = {
          {"metadata", {{"resourceVersion", (*got)["metadata"].value("resourceVersion", "")}}},
          {"data", Data(files)}};
      if (auto p = client.MergePatch(path, patch); !p.ok()) {
        return absl::Status(p.status().code(), fmt::format("updating {}: {}", what,
                                                           std::string(p.status().message())));
      }
      spdlog::info(
          "extender: issued a new server certificate into {} (it ended within {} days or "
          "did not name {})",
          what, o.renew_days, fmt::join(o.dns, ", "));
    }
  }
  if (mkdir(o.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(fmt::format("{}: {}", o.dir, strerror(errno)));
  }
  TlsFiles out{o.dir + "/ca.crt", o.dir + "/tls.crt", o.dir + "/tls.key"};
  for (auto [file, key] : {std::pair{&out.ca_file, "ca.crt"}, std::pair{&out.cert_file, "tls.crt"},
                           std::pair{&out.key_file, "tls.key"}}) {
    if (absl::Status st = WriteFile(*file, files[key]); !st.ok()) return st;
  }
  return out;
}

}  // namespace tessera::extender
