// The agent against a fake API server: node labels applied, kept current and cleaned; the
// extender's choice found for Allocate and marked done; bad annotations skipped and reported.
#include "tessera/agent/node_sync.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "fake_apiserver.h"
#include "tessera/devices/inventory.h"
#include "tessera/kube/gpu_annotations.h"

namespace tessera::agent {
namespace {

using fakes::FakeApiServer;
using nlohmann::json;

constexpr char kNode[] = "gpu-node-1";

json PendingPod(const std::string& name, const kube::Assignment& a, const std::string& node = kNode,
                const std::string& phase = "Pending") {
  return {{"metadata",
           {{"name", name},
            {"namespace", "team-a"},
            {"uid", "uid-" + name},
            {"annotations", {{kube::kAssignmentAnnotation, kube::FormatAssignment(a)}}}}},
          {"spec", {{"nodeName", node}}},
          {"status", {{"phase", phase}}}};
}

kube::Assignment Whole(std::vector<std::string> gpus, int64_t at) {
  kube::Assignment a;
  a.node = kNode;
  a.assigned_unix_ms = at;
  a.containers.push_back({"main", "tessera.io/gpu", gpus, static_cast<int>(gpus.size()), {}, {}});
  return a;
}

TEST(ChooseHint, OldestPendingPodWhoseNextContainerFits) {
  kube::Assignment two = Whole({"GPU-a", "GPU-b"}, 2000);
  kube::Assignment older = Whole({"GPU-c", "GPU-d"}, 1000);
  kube::Assignment share;
  share.node = kNode;
  share.containers.push_back({"nb", "tessera.io/gpu-share", {"GPU-e"}, 3, uint64_t{1} << 30, 5});
  share.gang = "team-a/job";
  share.gang_gpus = {"GPU-e", "GPU-f"};
  json bad = PendingPod("bad", two);
  bad["metadata"]["annotations"][kube::kAssignmentAnnotation] = "{not json";
  std::vector<json> pods = {PendingPod("newer", two),
                            PendingPod("older", older),
                            PendingPod("running", Whole({"GPU-x", "GPU-y"}, 1), kNode, "Running"),
                            PendingPod("share", share),
                            bad,
                            PendingPod("moved", Whole({"GPU-z", "GPU-w"}, 1), kNode)};
  pods.back()["metadata"]["annotations"][kube::kAssignmentAnnotation] = kube::FormatAssignment([] {
    kube::Assignment m = Whole({"GPU-z", "GPU-w"}, 1);
    m.node = "gpu-node-9";
    return m;
  }());
  std::vector<std::string> problems;
  auto h = ChooseHint(pods, kNode, Resource::kGpu, 2, {}, &problems);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->pod_name, "older");
  EXPECT_EQ(h->gpus, (std::vector<std::string>{"GPU-c", "GPU-d"}));
  EXPECT_EQ(h->pod_uid, "uid-older");
  EXPECT_EQ(h->container_index, 0);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_THAT(problems[0], ::testing::HasSubstr("team-a/bad: annotation tessera.io/assignment"));
  EXPECT_THAT(problems[1], ::testing::HasSubstr("assigned to node gpu-node-9"));

  // Once the older pod's container is done, the newer pod is next.
  std::map<std::string, std::set<int>> done = {{"uid-older", {0}}};
  EXPECT_EQ(ChooseHint(pods, kNode, Resource::kGpu, 2, done, nullptr)->pod_name, "newer");
  EXPECT_FALSE(ChooseHint(pods, kNode, Resource::kGpu, 3, {}, nullptr).has_value());
  auto s = ChooseHint(pods, kNode, Resource::kShare, 3, {}, nullptr);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->memory, uint64_t{1} << 30);
  EXPECT_EQ(s->priority, 5);
  EXPECT_EQ(s->gang, "team-a/job");
  EXPECT_EQ(s->gang_gpus, (std::vector<std::string>{"GPU-e", "GPU-f"}));
  EXPECT_TRUE(h->gang.empty());
}

TEST(UnplacedCandidate, APendingPodThatAsksForTheCountWithoutAnAssignment) {
  json plain = {
      {"metadata", {{"name", "p"}}},
      {"spec",
       {{"nodeName", kNode},
        {"containers", {{{"name", "a"}, {"resources", {{"limits", {{"tessera.io/gpu", "2"}}}}}}}}}},
      {"status", {{"phase", "Pending"}}}};
  EXPECT_TRUE(UnplacedCandidate({plain}, kNode, Resource::kGpu, 2));
  EXPECT_FALSE(UnplacedCandidate({plain}, kNode, Resource::kGpu, 1));
  EXPECT_FALSE(UnplacedCandidate({plain}, kNode, Resource::kShare, 2));
  EXPECT_FALSE(UnplacedCandidate({plain}, "other-node", Resource::kGpu, 2));
  json placed = plain;
  placed["metadata"]["annotations"][kube::kAssignmentAnnotation] = "{}";
  EXPECT_FALSE(UnplacedCandidate({placed}, kNode, Resource::kGpu, 2));
  json running = plain;
  running["status"]["phase"] = "Running";
  EXPECT_FALSE(UnplacedCandidate({running}, kNode, Resource::kGpu, 2));
}

class NodeSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "ns-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
    auto m = devices::LoadSimulatedMachine("dgx-h100");
    ASSERT_TRUE(m.ok());
    PluginOptions o;
    o.state_dir = dir_ + "/state";
    state_ = std::move(*DeviceState::Create(m->inventory, o));
    kube::ClusterConfig c;
    c.server = api_.url();
    c.token = "test-token";
    client_ = std::move(*kube::Client::Create(c));
  }
  std::unique_ptr<NodeSync> Start() {
    NodeSyncOptions o;
    o.node_name = kNode;
    o.max_backoff = std::chrono::milliseconds(200);
    return std::make_unique<NodeSync>(*client_, *state_, o);
  }
  json Labels() {
    auto n = api_.Get("/api/v1/nodes", kNode);
    return n ? (*n)["metadata"].value("labels", json::object()) : json::object();
  }
  bool LabelIs(const std::string& k, const std::string& v) {
    json l = Labels();
    return l.contains(k) && l[k] == v;
  }

  FakeApiServer api_;
  std::string dir_;
  std::unique_ptr<DeviceState> state_;
  std::unique_ptr<kube::Client> client_;
};

TEST_F(NodeSyncTest, LabelsAppliedKeptCurrentAndCleaned) {
  api_.Put("/api/v1/nodes",
           {{"metadata",
             {{"name", kNode},
              {"labels", {{"tessera.io/gpu.old", "x"}, {"tessera.io/pool", "research"}}},
              {"annotations", {{"tessera.io/agent-labels", "tessera.io/gpu.old"}}}}}});
  auto sync = Start();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return LabelIs("tessera.io/gpu.count", "8"); }));
  EXPECT_TRUE(LabelIs("tessera.io/gpu.healthy", "8"));
  EXPECT_FALSE(Labels().contains("tessera.io/gpu.old"));  // ours, no longer set
  EXPECT_TRUE(LabelIs("tessera.io/pool", "research"));    // not ours
  auto node = api_.Get("/api/v1/nodes", kNode);
  auto gpus =
      kube::ParseNodeGpus((*node)["metadata"]["annotations"]["tessera.io/gpus"].get<std::string>());
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ(gpus->inventory.gpus.size(), 8u);

  // A GPU falls sick: the count follows.
  state_->SetHealth(3, false, "XID 79");
  sync->Poke();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return LabelIs("tessera.io/gpu.healthy", "7"); }));

  // Someone edits our label: the node watch sees it and it is put back.
  json n = *api_.Get("/api/v1/nodes", kNode);
  n["metadata"]["labels"]["tessera.io/gpu.count"] = "99";
  api_.Put("/api/v1/nodes", n);
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return LabelIs("tessera.io/gpu.count", "8"); }));
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return sync->counters().label_updates.load() >= 3; }));
  EXPECT_TRUE(sync->labels_current());
}

TEST_F(NodeSyncTest, AMissingNodeIsRetriedUntilItAppears) {
  auto sync = Start();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return sync->counters().label_errors.load() >= 2; }));
  EXPECT_FALSE(sync->labels_current());
  api_.Put("/api/v1/nodes", {{"metadata", {{"name", kNode}}}});
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return LabelIs("tessera.io/gpu.count", "8"); }));
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return sync->labels_current(); }));
}

TEST_F(NodeSyncTest, SaysWhetherTheApiServerAnswers) {
  api_.Put("/api/v1/nodes", {{"metadata", {{"name", kNode}}}});
  auto sync = Start();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return sync->api_server_up(); }));
  // The API server fails everything and its watches break: said.
  api_.SetFailStatus(503);
  api_.CloseWatches();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !sync->api_server_up(); }));
  // Back: once its watches deliver again (the real server's bookmarks come every minute).
  api_.SetFailStatus(0);
  EXPECT_TRUE(FakeApiServer::WaitFor([&] {
    api_.SendBookmarks();
    return sync->api_server_up();
  }));
}

TEST_F(NodeSyncTest, HintFoundEvenBeforeTheWatchAndMarkedAllocated) {
  api_.Put("/api/v1/nodes", {{"metadata", {{"name", kNode}}}});
  auto sync = Start();
  const auto& inv = state_->inventory();
  // Put while the agent runs: whether the watch or the fresh list finds it, Hint does.
  api_.Put("/api/v1/namespaces/team-a/pods",
           PendingPod("train", Whole({inv.gpus[2].uuid, inv.gpus[3].uuid}, 5)));
  auto h = sync->Hint(Resource::kGpu, 2);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->pod_name, "train");
  sync->Allocated(*h);
  EXPECT_FALSE(sync->Hint(Resource::kGpu, 2).has_value());  // done, even before it is written
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    auto p = api_.Get("/api/v1/namespaces/team-a/pods", "train");
    return p && (*p)["metadata"]["annotations"].value(kube::kAllocatedAnnotation, "") == "0";
  }));
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return sync->counters().allocated_marks.load() == 1; }));
  EXPECT_EQ(sync->counters().hints_found.load(), 1u);
}

}  // namespace
}  // namespace tessera::agent
