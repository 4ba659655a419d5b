#include "tessera/kube/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

namespace tessera::kube {
namespace {

using ::testing::HasSubstr;

constexpr char kKubeconfig[] = R"(apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: prod-cluster
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
- name: dev-cluster
  cluster:
    server: http://127.0.0.1:8080
    insecure-skip-tls-verify: true
contexts:
- name: prod
  context: {cluster: prod-cluster, user: robot, namespace: gpu-team}
- name: dev
  context: {cluster: dev-cluster, user: dev-user}
users:
- name: robot
  user:
    token: abc.def
- name: dev-user
  user:
    tokenFile: tokens/dev
)";

std::string Dir(const std::string& name) {
  std::string d = ::testing::TempDir() + name;
  std::filesystem::create_directories(d);
  return d;
}

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(Kubeconfig, CurrentContextGivesServerTrustTokenAndNamespace) {
  auto c = ParseKubeconfig(kKubeconfig, "/home/a/.kube/config");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "https://10.0.0.1:6443");  // trailing slash dropped
  EXPECT_EQ(c->ca_pem, "-----BEGIN CERTIFICATE-----\n");
  EXPECT_EQ(c->token, "abc.def");
  EXPECT_EQ(c->default_namespace, "gpu-team");
  EXPECT_FALSE(c->insecure_skip_tls_verify);
  EXPECT_THAT(c->origin, HasSubstr("context prod"));
}

TEST(Kubeconfig, NamedContextResolvesTokenFileBesideTheConfig) {
  std::string dir = Dir("kc1");
  Write(dir + "/config", kKubeconfig);
  Write(dir + "/tokens/dev", "rotated-token\n");
  auto c = LoadKubeconfig(dir + "/config", "dev");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "http://127.0.0.1:8080");
  EXPECT_TRUE(c->insecure_skip_tls_verify);
  EXPECT_EQ(c->token_file, dir + "/tokens/dev");
  EXPECT_EQ(c->default_namespace, "default");
  auto token = CurrentToken(*c);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "rotated-token");
  Write(dir + "/tokens/dev", "next-token");
  EXPECT_EQ(*CurrentToken(*c), "next-token");
}

TEST(Kubeconfig, BadFilesNameTheFileAndTheField) {
  struct Case {
    std::string yaml, context, want;
  } cases[] = {
      {"", "", "not a kubeconfig"},
      {"[1, 2", "", "/k/config"},
      {"current-context: x\n", "", "contexts has no entry named \"x\""},
      {"kind: Config\n", "", "no current-context"},
      {kKubeconfig, "staging", "contexts has no entry named \"staging\""},
      {"current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
       "clusters: [{name: c, cluster: {server: ftp://x}}]\n",
       "", "clusters[c].server: expected an http(s):// URL"},
      {"current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n"
       "clusters: [{name: c, cluster: {server: 'https://x', certificate-authority-data: '%%'}}]\n"
       "users: [{name: u, user: {token: t}}]\n",
       "", "certificate-authority-data: not valid base64"},
      {"current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n"
       "clusters: [{name: c, cluster: {server: 'https://x'}}]\n"
       "users: [{name: u, user: {exec: {command: aws}}}]\n",
       "", "users[u].exec: not supported"},
      {"current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n"
       "clusters: [{name: c, cluster: {server: 'https://x'}}]\n"
       "users: [{name: u, user: {client-certificate-data: 'YQ=='}}]\n",
       "", "needs its key"},
      {"current-context: a\ncontexts: {a: 1}\n", "", "contexts: expected a list"},
  };
  for (const Case& c : cases) {
    auto r = ParseKubeconfig(c.yaml, "/k/config", c.context);
    ASSERT_FALSE(r.ok()) << c.yaml;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.want)) << c.yaml;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("/k/config"));
  }
}

TEST(Kubeconfig, UnreadableFileIsNamed) {
  auto r = LoadKubeconfig(::testing::TempDir() + "no-such-kubeconfig");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no-such-kubeconfig"));
  std::string dir = Dir("kc2");
  Write(dir + "/config",
        "current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n"
        "clusters: [{name: c, cluster: {server: 'https://x', certificate-authority: ca.pem}}]\n");
  auto missing_ca = LoadKubeconfig(dir + "/config");
  ASSERT_FALSE(missing_ca.ok());
  EXPECT_THAT(std::string(missing_ca.status().message()), HasSubstr(dir + "/ca.pem"));
}

TEST(InCluster, ServiceAccountFilesAndEnvironment) {
  std::string sa = Dir("sa");
  Write(sa + "/token", "sa-token\n");
  Write(sa + "/ca.crt", "CA PEM");
  Write(sa + "/namespace", "tessera-system");
  std::map<std::string, std::string> env = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                            {"KUBERNETES_SERVICE_PORT", "443"}};
  auto getenv = [&](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  auto c = LoadInCluster(getenv, sa);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "https://10.96.0.1:443");
  EXPECT_EQ(c->ca_pem, "CA PEM");
  EXPECT_EQ(c->default_namespace, "tessera-system");
  EXPECT_EQ(*CurrentToken(*c), "sa-token");

  env["KUBERNETES_SERVICE_HOST"] = "fd00::1";
  EXPECT_EQ(LoadInCluster(getenv, sa)->server, "https://[fd00::1]:443");

  std::filesystem::remove(sa + "/token");
  auto no_token = LoadInCluster(getenv, sa);
  ASSERT_FALSE(no_token.ok());
  EXPECT_THAT(std::string(no_token.status().message()), HasSubstr(sa + "/token"));

  env.clear();
  auto outside = LoadInCluster(getenv, sa);
  ASSERT_FALSE(outside.ok());
  EXPECT_THAT(std::string(outside.status().message()), HasSubstr("KUBERNETES_SERVICE_HOST"));
}

}  // namespace
}  // namespace tessera::kube
