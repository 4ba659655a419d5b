#include "tessera/kube/events.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fake_apiserver.h"
#include "tessera/kube/test_client.h"

namespace tessera::kube {
namespace {

using fakes::FakeApiServer;
using nlohmann::json;

std::unique_ptr<Client> Connect(const FakeApiServer& api) { return testing::ConnectTo(api); }

const ObjectRef kPod{.kind = "Pod", .ns = "ml", .name = "train-0", .uid = "u-1"};

TEST(EventRecorder, PostsAnEventsK8sIoV1EventWithEveryRequiredField) {
  FakeApiServer api;
  auto client = Connect(api);
  core::FakeClock clock(core::TimePoint(std::chrono::seconds(1'800'000'000)));
  EventRecorder events(*client, {.controller = "tessera.io/extender", .instance = "ext-1"}, clock);
  events.Record(kPod, "Normal", "WaitingForQuota", "Scheduling", "team ml is at its GPU quota");
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  auto list = api.List("/apis/events.k8s.io/v1/namespaces/ml/events");
  ASSERT_EQ(list.size(), 1u);
  const json& e = list[0];
  // What the API server's validation of events.k8s.io/v1 requires of a new Event.
  EXPECT_EQ(e["eventTime"], "2027-01-15T08:00:00.000000Z");
  EXPECT_EQ(e["reportingController"], "tessera.io/extender");
  EXPECT_EQ(e["reportingInstance"], "ext-1");
  EXPECT_EQ(e["action"], "Scheduling");
  EXPECT_EQ(e["reason"], "WaitingForQuota");
  EXPECT_EQ(e["type"], "Normal");
  EXPECT_EQ(e["note"], "team ml is at its GPU quota");
  EXPECT_EQ(e["regarding"], json({{"apiVersion", "v1"},
                                  {"kind", "Pod"},
                                  {"namespace", "ml"},
                                  {"name", "train-0"},
                                  {"uid", "u-1"}}));
  EXPECT_THAT(e["metadata"]["name"].get<std::string>(), ::testing::StartsWith("train-0."));
  EXPECT_EQ(events.stats().created, 1u);
  // A node's events (cluster-scoped) go to "default"; a long note is cut at 1 KiB, not refused.
  events.Record({.kind = "Node", .name = "gpu-3"}, "Warning", "AllocateRefused", "Allocating",
                std::string(5000, 'x'));
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  auto node_events = api.List("/apis/events.k8s.io/v1/namespaces/default/events");
  ASSERT_EQ(node_events.size(), 1u);
  EXPECT_EQ(node_events[0]["note"].get<std::string>().size(), 1024u);
  EXPECT_FALSE(node_events[0]["regarding"].contains("namespace"));
}

TEST(EventRecorder, RepeatsAreCountedAndPatchedIntoTheSeriesAtMostOncePerInterval) {
  FakeApiServer api;
  auto client = Connect(api);
  core::FakeClock clock(core::TimePoint(std::chrono::seconds(1'800'000'000)));
  EventRecorder events(*client, {.controller = "c", .instance = "i", .repeat_interval_s = 60},
                       clock);
  events.Record(kPod, "Normal", "WaitingForGang", "Scheduling", "2 of 4 members");
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  for (int i = 0; i < 50; ++i) {  // kube-scheduler retrying the pod within the minute
    clock.Advance(std::chrono::seconds(1));
    events.Record(kPod, "Normal", "WaitingForGang", "Scheduling", "2 of 4 members");
  }
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  auto list = api.List("/apis/events.k8s.io/v1/namespaces/ml/events");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_FALSE(list[0].contains("series")) << "nothing posted within the interval";
  EXPECT_EQ(events.stats().counted, 50u);
  clock.Advance(std::chrono::seconds(10));  // 60 s after the first
  events.Record(kPod, "Normal", "WaitingForGang", "Scheduling", "2 of 4 members");
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  list = api.List("/apis/events.k8s.io/v1/namespaces/ml/events");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["series"]["count"], 52);
  EXPECT_EQ(list[0]["series"]["lastObservedTime"], "2027-01-15T08:01:00.000000Z");
  EXPECT_EQ(events.stats().patched, 1u);
  int patches = 0;
  for (const auto& r : api.Requests())
    patches += r.verb == "patch" && r.resource == "events.events.k8s.io";
  EXPECT_EQ(patches, 1);
  // Another reason is another event; an event removed meanwhile (they live an hour) is made again.
  events.Record(kPod, "Normal", "WaitingForQuota", "Scheduling", "at quota");
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  EXPECT_EQ(api.List("/apis/events.k8s.io/v1/namespaces/ml/events").size(), 2u);
  ASSERT_TRUE(api.Delete("/apis/events.k8s.io/v1/namespaces/ml/events",
                         list[0]["metadata"]["name"].get<std::string>()));
  clock.Advance(std::chrono::seconds(61));
  events.Record(kPod, "Normal", "WaitingForGang", "Scheduling", "3 of 4 members");  // patch: 404
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  events.Record(kPod, "Normal", "WaitingForGang", "Scheduling", "3 of 4 members");  // new event
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  auto after = api.List("/apis/events.k8s.io/v1/namespaces/ml/events");
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(events.stats().failed, 1u);
  bool remade = false;
  for (const json& e : after) remade |= e["note"] == "3 of 4 members";
  EXPECT_TRUE(remade);
}

TEST(EventRecorder, AnApiServerThatRefusesCostsTheCallerNothing) {
  FakeApiServer api;
  api.SetFailStatus(403);  // no RBAC for events: the component still works
  auto client = Connect(api);
  EventRecorder events(*client, {.controller = "c", .instance = "i"});
  for (int i = 0; i < 3; ++i)
    events.Record({.kind = "Pod", .ns = "ml", .name = "p" + std::to_string(i)}, "Normal", "R", "A",
                  "n");
  ASSERT_TRUE(events.Flush(std::chrono::seconds(10)));
  EXPECT_EQ(events.stats().failed, 3u);
  EXPECT_EQ(events.stats().created, 0u);
}

}  // namespace
}  // namespace tessera::kube
