#include "tessera/kube/informer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fake_apiserver.h"
#include "tessera/kube/test_client.h"

namespace tessera::kube {
namespace {

using fakes::FakeApiServer;
using nlohmann::json;

std::unique_ptr<Client> Connect(const FakeApiServer& api) { return testing::ConnectTo(api); }

json Pod(const std::string& name, const std::string& node, const std::string& phase = "Running") {
  return {{"metadata", {{"name", name}}},
          {"spec", {{"nodeName", node}}},
          {"status", {{"phase", phase}}}};
}

// What the handler saw, thread-safe.
struct Seen {
  std::mutex mu;
  std::vector<std::string> events;
  void Add(EventType t, const json& o) {
    std::lock_guard lock(mu);
    events.push_back(std::string(EventTypeName(t)) + " " + ObjectKey(o));
  }
  bool Has(const std::string& e) {
    std::lock_guard lock(mu);
    return std::find(events.begin(), events.end(), e) != events.end();
  }
};

InformerOptions Fast(const std::string& path, const std::string& field_selector = "") {
  InformerOptions o;
  o.path = path;
  o.field_selector = field_selector;
  o.max_backoff = std::chrono::milliseconds(200);
  return o;
}

TEST(Informer, ListsThenFollowsTheWatchWithinItsSelector) {
  FakeApiServer api;
  api.Put("/api/v1/namespaces/a/pods", Pod("p1", "gpu-1"));
  api.Put("/api/v1/namespaces/a/pods", Pod("p2", "gpu-2"));
  auto client = Connect(api);
  Seen seen;
  Informer inf(*client, Fast("/api/v1/pods", "spec.nodeName=gpu-1"),
               [&](EventType t, const json& o) { seen.Add(t, o); });
  ASSERT_TRUE(inf.WaitForSync(std::chrono::seconds(10)));
  EXPECT_TRUE(seen.Has("ADDED a/p1"));
  EXPECT_FALSE(seen.Has("ADDED a/p2"));
  ASSERT_TRUE(inf.Get("a/p1").has_value());

  api.Put("/api/v1/namespaces/b/pods", Pod("p3", "gpu-1", "Pending"));
  api.Put("/api/v1/namespaces/a/pods", Pod("p1", "gpu-1", "Succeeded"));
  api.Put("/api/v1/namespaces/a/pods", Pod("p2", "gpu-2", "Failed"));  // not ours
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return seen.Has("MODIFIED a/p1"); }));
  EXPECT_TRUE(seen.Has("ADDED b/p3"));
  EXPECT_FALSE(seen.Has("MODIFIED a/p2"));
  EXPECT_EQ((*inf.Get("a/p1"))["status"]["phase"], "Succeeded");
  EXPECT_EQ(inf.Snapshot().size(), 2u);

  api.Delete("/api/v1/namespaces/b/pods", "p3");
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return seen.Has("DELETED b/p3"); }));
  EXPECT_FALSE(inf.Get("b/p3").has_value());
  EXPECT_EQ(inf.counters().lists.load(), 1u);
}

TEST(Informer, ListsAgainOn410AndReportsWhatChangedMeanwhile) {
  FakeApiServer api;
  api.Put("/api/v1/nodes", {{"metadata", {{"name", "kept"}}}});
  api.Put("/api/v1/nodes", {{"metadata", {{"name", "removed"}}}});
  auto client = Connect(api);
  Seen seen;
  Informer inf(*client, Fast("/api/v1/nodes"), [&](EventType t, const json& o) { seen.Add(t, o); });
  ASSERT_TRUE(inf.WaitForSync(std::chrono::seconds(10)));
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return api.open_watches() == 1; }));

  // While the watch is broken the world moves on and history is compacted: the resumed watch
  // gets 410 Expired, and only a fresh list tells what happened.
  api.CloseWatches();
  api.Delete("/api/v1/nodes", "removed");
  api.Put("/api/v1/nodes", {{"metadata", {{"name", "new"}}}});
  api.Compact();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return seen.Has("ADDED new"); }));
  EXPECT_TRUE(seen.Has("DELETED removed"));
  EXPECT_GE(inf.counters().relists_gone.load(), 1u);
  EXPECT_EQ(inf.Snapshot().size(), 2u);
  EXPECT_EQ(inf.resource_version(), std::to_string(api.resource_version()));
}

TEST(Informer, RidesOutAFailingServerWithBackoffAndRecovers) {
  FakeApiServer api;
  api.SetFailStatus(500);
  auto client = Connect(api);
  Seen seen;
  Informer inf(*client, Fast("/api/v1/nodes"), [&](EventType t, const json& o) { seen.Add(t, o); });
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return inf.counters().errors.load() >= 2; }));
  EXPECT_FALSE(inf.synced());
  EXPECT_THAT(inf.last_error(), ::testing::HasSubstr("HTTP 500"));
  api.Put("/api/v1/nodes", {{"metadata", {{"name", "late"}}}});
  api.SetFailStatus(0);
  ASSERT_TRUE(inf.WaitForSync(std::chrono::seconds(10)));
  EXPECT_TRUE(seen.Has("ADDED late"));
  EXPECT_EQ(inf.last_error(), "");

  // And the watch that follows the recovered list delivers.
  api.Put("/api/v1/nodes", {{"metadata", {{"name", "after"}}}});
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return seen.Has("ADDED after"); }));
}

TEST(Informer, StopsPromptlyWhileWatching) {
  FakeApiServer api;
  auto client = Connect(api);
  auto inf = std::make_unique<Informer>(*client, Fast("/api/v1/pods"), nullptr);
  ASSERT_TRUE(inf->WaitForSync(std::chrono::seconds(10)));
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return api.open_watches() == 1; }));
  auto t0 = std::chrono::steady_clock::now();
  inf.reset();
  // Not a timing assertion on speed, only that Stop does not wait for the watch's 300 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_FALSE(client->shut_down());
}

// A CRD that is not installed (the coscheduling plugin's PodGroups): synced, empty, no error, no
// warning loop; watched from the moment the group is served.
TEST(Informer, AnOptionalKindNotServedIsEmptyAndWatchedOnceItIs) {
  FakeApiServer api;
  api.SetServed("scheduling.x-k8s.io", false);
  auto client = Connect(api);
  Seen seen;
  InformerOptions o = Fast("/apis/scheduling.x-k8s.io/v1alpha1/podgroups");
  o.optional = true;
  o.absent_recheck = std::chrono::milliseconds(50);
  Informer inf(*client, o, [&](EventType t, const json& obj) { seen.Add(t, obj); });
  ASSERT_TRUE(inf.WaitForSync(std::chrono::seconds(10)));
  EXPECT_TRUE(inf.absent());
  EXPECT_EQ(inf.last_error(), "");
  EXPECT_EQ(inf.counters().errors.load(), 0u);
  // Asked again now and then, never watched while absent.
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return inf.counters().lists.load() >= 3; }));
  EXPECT_EQ(inf.counters().watches.load(), 0u);
  EXPECT_EQ(api.open_watches(), 0);

  api.SetServed("scheduling.x-k8s.io", true);  // the CRD installed
  api.Put("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups",
          {{"metadata", {{"name", "job"}}}, {"spec", {{"minMember", 2}}}});
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return seen.Has("ADDED ml/job"); }));
  EXPECT_FALSE(inf.absent());
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return api.open_watches() == 1; }));
  api.Put("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups",
          {{"metadata", {{"name", "job2"}}}, {"spec", {{"minMember", 2}}}});
  EXPECT_TRUE(FakeApiServer::WaitFor([&] { return seen.Has("ADDED ml/job2"); }));

  // A required kind that is not served is an error, as before.
  api.SetServed("scheduling.x-k8s.io", false);
  Informer required(*client, Fast("/apis/scheduling.x-k8s.io/v1alpha1/podgroups"), nullptr);
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !required.last_error().empty(); }));
  EXPECT_FALSE(required.synced());
}

}  // namespace
}  // namespace tessera::kube
