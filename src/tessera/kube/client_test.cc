#include "tessera/kube/client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "fake_apiserver.h"

namespace tessera::kube {
namespace {

using fakes::FakeApiServer;
using nlohmann::json;
using ::testing::HasSubstr;

std::unique_ptr<Client> Connect(const FakeApiServer& api, const std::string& token = "test-token",
                                bool with_ca = true) {
  ClusterConfig c;
  c.server = api.url();
  c.token = token;
  if (with_ca) c.ca_pem = api.ca_pem();
  auto client = Client::Create(c);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

json Node(const std::string& name, const std::string& gpus = "8") {
  return {{"metadata", {{"name", name}, {"labels", {{"tessera.io/gpu.count", gpus}}}}}};
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(KubeClient, GetListAllPagesCreateAndMergePatch) {
  FakeApiServer api;
  for (int i = 0; i < 5; ++i) api.Put("/api/v1/nodes", Node("n" + std::to_string(i)));
  auto client = Connect(api);

  auto n2 = client->Get("/api/v1/nodes/n2");
  ASSERT_TRUE(n2.ok()) << n2.status();
  EXPECT_EQ((*n2)["metadata"]["name"], "n2");

  ListOptions lo;
  lo.page_size = 2;  // three pages
  auto all = client->List("/api/v1/nodes", lo);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->items.size(), 5u);
  EXPECT_EQ(all->items[4]["metadata"]["name"], "n4");
  EXPECT_EQ(all->resource_version, std::to_string(api.resource_version()));
  int pages = 0;
  for (const auto& r : api.Requests()) pages += r.verb == "list";
  EXPECT_EQ(pages, 3);

  auto pod = client->Create(
      "/api/v1/namespaces/team-a/pods",
      {{"metadata", {{"name", "train-0"}}}, {"spec", {{"containers", json::array()}}}});
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ((*pod)["metadata"]["namespace"], "team-a");
  auto again =
      client->Create("/api/v1/namespaces/team-a/pods", {{"metadata", {{"name", "train-0"}}}});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(HttpStatusOf(again.status()), 409);
  EXPECT_THAT(Message(again.status()), HasSubstr("already exists"));

  auto patched = client->MergePatch(
      "/api/v1/nodes/n1",
      {{"metadata", {{"labels", {{"tessera.io/gpu.count", nullptr}, {"tessera.io/x", "y"}}}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  auto labels = api.Get("/api/v1/nodes", "n1").value()["metadata"]["labels"];
  EXPECT_FALSE(labels.contains("tessera.io/gpu.count"));
  EXPECT_EQ(labels["tessera.io/x"], "y");
  EXPECT_EQ(api.Requests().back().content_type, "application/merge-patch+json");
  EXPECT_EQ(api.Requests().back().user, "tester");
}

TEST(KubeClient, ErrorsCarryVerbPathStatusAndTheServersMessage) {
  FakeApiServer api;
  auto client = Connect(api);
  auto missing = client->Get("/api/v1/nodes/gone");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()),
              HasSubstr("GET /api/v1/nodes/gone: HTTP 404: NotFound: nodes \"gone\" not found"));

  auto stranger = Connect(api, "wrong-token");
  auto denied = stranger->List("/api/v1/nodes");
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kUnauthenticated);

  api.SetGarbage(true);
  auto garbage = client->Get("/api/v1/nodes/x");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Message(garbage.status()), HasSubstr("not JSON"));
  EXPECT_THAT(Message(garbage.status()), HasSubstr("Bad Gateway"));
  api.SetGarbage(false);

  api.SetFailStatus(503);
  auto down = client->List("/api/v1/pods");
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable);
  api.SetFailStatus(0);

  ClusterConfig nowhere;
  nowhere.server = "http://127.0.0.1:1";  // nothing listens on port 1
  auto lost = (*Client::Create(nowhere))->Get("/api/v1/nodes");
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Message(lost.status()), HasSubstr("http://127.0.0.1:1"));
}

TEST(KubeClient, WatchStreamsEventsFromAVersionAndSaysGoneWhenCompacted) {
  FakeApiServer api;
  api.Put("/api/v1/nodes", Node("a"));
  auto client = Connect(api);
  auto list = client->List("/api/v1/nodes");
  ASSERT_TRUE(list.ok());

  std::thread writer([&] {
    FakeApiServer::WaitFor([&] { return api.open_watches() == 1; });
    api.Put("/api/v1/nodes", Node("b"));
    api.Put("/api/v1/nodes", Node("a", "4"));
    api.Delete("/api/v1/nodes", "b");
  });
  std::vector<std::string> seen;
  WatchOptions wo;
  wo.resource_version = list->resource_version;
  absl::Status s = client->Watch("/api/v1/nodes", wo, [&](const WatchEvent& e) {
    seen.push_back(std::string(EventTypeName(e.type)) + " " +
                   e.object["metadata"]["name"].get<std::string>());
    return seen.size() < 3;
  });
  writer.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(seen, ::testing::ElementsAre("ADDED b", "MODIFIED a", "DELETED b"));

  api.Compact();
  absl::Status gone = client->Watch("/api/v1/nodes", wo, [](const WatchEvent&) { return true; });
  EXPECT_TRUE(IsGone(gone)) << gone;
  EXPECT_THAT(Message(gone), HasSubstr("too old resource version"));
}

TEST(KubeClient, WatchEndsOnCancelAndOnShutdown) {
  FakeApiServer api;
  auto client = Connect(api);
  std::atomic<bool> cancel{false};
  WatchOptions wo;
  wo.cancel = &cancel;
  absl::Status result;
  std::thread watcher(
      [&] { result = client->Watch("/api/v1/pods", wo, [](const WatchEvent&) { return true; }); });
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return api.open_watches() == 1; }));
  cancel = true;
  client->Wake();
  watcher.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);

  std::thread second(
      [&] { result = client->Watch("/api/v1/pods", {}, [](const WatchEvent&) { return true; }); });
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return api.open_watches() >= 1; }));
  client->Shutdown();
  second.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(client->Get("/api/v1/nodes").status().code(), absl::StatusCode::kCancelled);
}

TEST(KubeClient, TlsWithTheClustersCaAndNotWithout) {
  fakes::FakeApiServerOptions o;
  o.tls = true;
  FakeApiServer api(o);
  api.Put("/api/v1/nodes", Node("secure"));
  ASSERT_THAT(api.url(), HasSubstr("https://"));

  auto trusted = Connect(api);
  auto ok = trusted->Get("/api/v1/nodes/secure");
  EXPECT_TRUE(ok.ok()) << ok.status();

  auto untrusted = Connect(api, "test-token", /*with_ca=*/false);
  auto refused = untrusted->Get("/api/v1/nodes/secure");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);

  // Through a kubeconfig with certificate-authority-data, as a user would write it.
  std::string path = api.WriteKubeconfig(::testing::TempDir() + "tls-kubeconfig");
  auto config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto via_file = (*Client::Create(*config))->Get("/api/v1/nodes/secure");
  EXPECT_TRUE(via_file.ok()) << via_file.status();
}

}  // namespace
}  // namespace tessera::kube
