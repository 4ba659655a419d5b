#include "tessera/extender/tls_secret.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "../../../tests/capture.h"
#include "absl/strings/escaping.h"
#include "fake_apiserver.h"
#include "tessera/net/certs.h"
#include "tessera/net/http.h"

namespace tessera::extender {
namespace {

using fakes::FakeApiServer;
using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kSecrets[] = "/api/v1/namespaces/tessera-system/secrets";

class TlsSecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kube::ClusterConfig c;
    c.server = api_.url();
    c.token = "test-token";
    client_ = std::move(*kube::Client::Create(c));
    o_.ns = "tessera-system";
    o_.name = "tessera-extender-tls";
    o_.dns = {"localhost", "tessera-extender.tessera-system.svc"};
    o_.dir = ::testing::TempDir() + "tls";
  }
  void TearDown() override {
    client_->Shutdown();
    std::filesystem::remove_all(o_.dir);
  }
  std::string Data(const char* key) {
    auto s = api_.Get(kSecrets, o_.name);
    std::string out;
    if (s) absl::Base64Unescape((*s)["data"].value(key, ""), &out);
    return out;
  }
  int Creates() {
    int n = 0;
    for (const auto& r : api_.Requests()) n += r.verb == "create" && r.resource == "secrets";
    return n;
  }

  FakeApiServer api_;
  std::unique_ptr<kube::Client> client_;
  TlsSecretOptions o_;
};

TEST_F(TlsSecretTest, MadeOnceKeptAcrossRestartsAndServesOnlyTheSchedulersCertificate) {
  auto files = EnsureTlsSecret(*client_, o_);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(Creates(), 1);
  for (const char* k : {"ca.crt", "ca.key", "tls.crt", "tls.key", "client.crt", "client.key"})
    EXPECT_THAT(Data(k), HasSubstr("-----BEGIN")) << k;
  EXPECT_TRUE(net::NamesAll(Data("tls.crt"), o_.dns));
  struct stat st;
  ASSERT_EQ(stat(files->key_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(tessera::test::ReadFile(files->cert_file), Data("tls.crt"));
  // A restart reads what is there: nothing made again.
  const std::string cert = Data("tls.crt");
  ASSERT_TRUE(EnsureTlsSecret(*client_, o_).ok());
  EXPECT_EQ(Creates(), 1);
  EXPECT_EQ(Data("tls.crt"), cert);
  // What kube-scheduler mounts (ca.crt, client.crt, client.key) gets an answer from a server with
  // the files; a certificate of the same CA for another name does not.
  net::HttpServerOptions h;
  h.tcp_address = "127.0.0.1:0";
  h.tls_cert_file = files->cert_file;
  h.tls_key_file = files->key_file;
  h.tls_client_ca_file = files->ca_file;
  h.tls_client_names = {o_.client_name};
  auto srv = net::HttpServer::Start(h, [](const net::HttpRequest&) {
    return net::HttpResponse{200, "text/plain", "ok"};
  });
  ASSERT_TRUE(srv.ok()) << srv.status();
  const std::string dir = o_.dir + "/";
  std::ofstream(dir + "c.crt") << Data("client.crt");
  std::ofstream(dir + "c.key") << Data("client.key");
  const std::string url = "https://localhost:" + std::to_string((*srv)->tcp_port());
  net::HttpClient scheduler(url, "", files->ca_file, dir + "c.crt", dir + "c.key");
  auto r = scheduler.Send("GET", "/healthz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  auto stranger = net::IssueCertificate({Data("ca.crt"), Data("ca.key")},
                                        {.common_name = "someone", .client = true});
  ASSERT_TRUE(stranger.ok());
  std::ofstream(dir + "s.crt") << stranger->cert;
  std::ofstream(dir + "s.key") << stranger->key;
  EXPECT_FALSE(net::HttpClient(url, "", files->ca_file, dir + "s.crt", dir + "s.key")
                   .Send("GET", "/healthz")
                   .ok());
}

TEST_F(TlsSecretTest, ANewNameGetsANewServerCertificateFromTheSameCa) {
  ASSERT_TRUE(EnsureTlsSecret(*client_, o_).ok());
  const std::string ca = Data("ca.crt"), client = Data("client.crt");
  o_.dns.push_back("tessera-extender.tessera-system.svc.cluster.local");
  ASSERT_TRUE(EnsureTlsSecret(*client_, o_).ok());
  EXPECT_TRUE(net::NamesAll(Data("tls.crt"), o_.dns));
  EXPECT_EQ(Data("ca.crt"), ca) << "kube-scheduler's CA file would no longer match";
  EXPECT_EQ(Data("client.crt"), client);
  EXPECT_EQ(Creates(), 1);
}

TEST_F(TlsSecretTest, ASecretThatLostAKeyOrCannotBeReadIsNamed) {
  api_.Put(kSecrets,
           {{"metadata", {{"name", o_.name}}}, {"data", {{"ca.crt", absl::Base64Escape("x")}}}});
  auto r = EnsureTlsSecret(*client_, o_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("tessera-system/tessera-extender-tls has no usable ca.key"));
  api_.SetFailStatus(403);
  r = EnsureTlsSecret(*client_, o_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("reading the TLS Secret"));
}

}  // namespace
}  // namespace tessera::extender
