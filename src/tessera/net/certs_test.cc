#include "tessera/net/certs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "tessera/net/http.h"

namespace tessera::net {
namespace {

using ::testing::HasSubstr;

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Certs, AServerCertificateNamesItsHostsAndLastsItsDays) {
  auto ca = MakeCertificateAuthority("test-ca");
  ASSERT_TRUE(ca.ok()) << ca.status();
  auto server = IssueCertificate(*ca, {.common_name = "tessera-extender",
                                       .dns_names = {"localhost", "ext.ns.svc"},
                                       .server = true,
                                       .days = 10});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(NamesAll(server->cert, {"localhost", "ext.ns.svc"}));
  EXPECT_FALSE(NamesAll(server->cert, {"localhost", "other.ns.svc"}));
  EXPECT_FALSE(NamesAll("not a certificate", {"localhost"}));
  auto left = SecondsLeft(server->cert);
  ASSERT_TRUE(left.ok());
  EXPECT_GT(*left, 9 * 86400);
  EXPECT_LE(*left, 10 * 86400);
  EXPECT_FALSE(SecondsLeft("garbage").ok());
  // A CA whose key is another's issues nothing.
  auto other = MakeCertificateAuthority("other-ca");
  ASSERT_TRUE(other.ok());
  auto mixed = IssueCertificate({ca->cert, other->key}, {.common_name = "x"});
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IssueCertificate({"garbage", "garbage"}, {.common_name = "x"}).ok());
}

// Mutual TLS as the extender serves kube-scheduler: only a client certificate of the CA, with an
// allowed common name, gets an answer.
TEST(Certs, OnlyAClientOfTheCaWithAnAllowedNameIsServed) {
  auto ca = MakeCertificateAuthority("test-ca");
  auto other = MakeCertificateAuthority("other-ca");
  ASSERT_TRUE(ca.ok() && other.ok());
  auto server =
      IssueCertificate(*ca, {.common_name = "server", .dns_names = {"localhost"}, .server = true});
  auto good = IssueCertificate(*ca, {.common_name = "tessera-scheduler", .client = true});
  auto named = IssueCertificate(*ca, {.common_name = "someone-else", .client = true});
  auto foreign = IssueCertificate(*other, {.common_name = "tessera-scheduler", .client = true});
  ASSERT_TRUE(server.ok() && good.ok() && named.ok() && foreign.ok());
  HttpServerOptions o;
  o.tcp_address = "127.0.0.1:0";
  o.tls_cert_file = Write("server.crt", server->cert);
  o.tls_key_file = Write("server.key", server->key);
  o.tls_client_ca_file = Write("ca.crt", ca->cert);
  o.tls_client_names = {"tessera-scheduler"};
  auto srv = HttpServer::Start(o, [](const HttpRequest&) {
    return HttpResponse{200, "text/plain", "hello\n"};
  });
  ASSERT_TRUE(srv.ok()) << srv.status();
  const std::string url = "https://localhost:" + std::to_string((*srv)->tcp_port());
  const std::string ca_file = o.tls_client_ca_file;
  auto call = [&](const std::string& who, const Pem* pem) {
    std::string cert, key;
    if (pem != nullptr) cert = Write(who + ".crt", pem->cert), key = Write(who + ".key", pem->key);
    HttpClient c(url, "", ca_file, cert, key);
    return c.Send("GET", "/x");
  };
  auto ok = call("good", &*good);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->body, "hello\n");
  EXPECT_FALSE(call("none", nullptr).ok()) << "no client certificate";
  EXPECT_FALSE(call("named", &*named).ok()) << "a name not allowed";
  EXPECT_FALSE(call("foreign", &*foreign).ok()) << "another CA's certificate";
  // A client CA without TLS, or one that does not parse, is refused at start.
  HttpServerOptions plain;
  plain.tcp_address = "127.0.0.1:0";
  plain.tls_client_ca_file = ca_file;
  EXPECT_EQ(HttpServer::Start(plain, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  HttpServerOptions bad = o;
  bad.tls_client_ca_file = Write("bad-ca.crt", "garbage");
  auto refused = HttpServer::Start(bad, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("client CA"));
}

}  // namespace
}  // namespace tessera::net
