#include "tessera/sched/cluster_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/sched/test_util.h"

namespace tessera::sched {
namespace {

using testing::Node;

Allocation Alloc(const std::string& id, NodeId node, std::vector<int> gpus, int milli,
                 int64_t cpu) {
  Allocation a;
  a.id = id;
  a.node = node;
  a.gpus = std::move(gpus);
  a.milli_per_gpu = milli;
  a.request.id = id;
  a.request.cpu_milli = cpu;
  return a;
}

TEST(ClusterState, IdenticalNodesShareAClass) {
  ClusterState s;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s.AddNode(Node("n" + std::to_string(i), 8)).ok());
  ASSERT_TRUE(s.AddNode(Node("small", 2)).ok());
  EXPECT_EQ(s.live_classes().size(), 2u);
  ASSERT_TRUE(s.Apply(Alloc("a", 3, {5}, 500, 1000)).ok());
  EXPECT_EQ(s.live_classes().size(), 3u);
  EXPECT_EQ(s.class_members(s.node_class(3)).size(), 1u);
}

TEST(ClusterState, GpuOrderDoesNotSplitClassesWithoutTopology) {
  ClusterState s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 4)).ok());
  ASSERT_TRUE(s.Apply(Alloc("x", 0, {0}, 300, 0)).ok());
  ASSERT_TRUE(s.Apply(Alloc("y", 1, {3}, 300, 0)).ok());
  EXPECT_EQ(s.node_class(0), s.node_class(1));
  // Position 0 in class order is the used GPU (less free sorts first) on each node.
  EXPECT_THAT(s.GpusForPositions(0, {0}), ::testing::ElementsAre(0));
  EXPECT_THAT(s.GpusForPositions(1, {0}), ::testing::ElementsAre(3));
}

TEST(ClusterState, RemoveRestoresExactState) {
  ClusterState s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ClassId before = s.node_class(0);
  ASSERT_TRUE(s.Apply(Alloc("x", 0, {1}, 250, 500)).ok());
  EXPECT_EQ(s.gpu_use(0, 1).milli, 250);
  EXPECT_EQ(s.cpu_used(0), 500);
  auto removed = s.Remove("x");
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(s.gpu_use(0, 1), GpuUse{});
  EXPECT_EQ(s.cpu_used(0), 0);
  EXPECT_EQ(s.node_class(0), before);
  EXPECT_EQ(s.Remove("x").status().code(), absl::StatusCode::kNotFound);
}

TEST(ClusterState, ApplyRefusesOverAllocationAndChangesNothing) {
  ClusterState s;
  ASSERT_TRUE(s.AddNode(Node("a", 1, 4000)).ok());
  ASSERT_TRUE(s.Apply(Alloc("x", 0, {0}, 700, 1000)).ok());
  EXPECT_FALSE(s.Apply(Alloc("y", 0, {0}, 400, 1000)).ok());
  EXPECT_FALSE(s.Apply(Alloc("z", 0, {}, 0, 3500)).ok());
  EXPECT_FALSE(s.Apply(Alloc("x", 0, {}, 0, 0)).ok()) << "duplicate id";
  EXPECT_FALSE(s.Apply(Alloc("w", 0, {0, 0}, 100, 0)).ok()) << "same GPU twice";
  EXPECT_EQ(s.gpu_use(0, 0).milli, 700);
  EXPECT_EQ(s.cpu_used(0), 1000);
}

TEST(ClusterState, ARemovedNodeGivesBackItsAllocationsItsClassAndItsName) {
  ClusterState s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 4)).ok());
  ASSERT_TRUE(s.Apply(Alloc("on-a", 0, {0, 1}, 1000, 2000)).ok());
  ASSERT_TRUE(s.Apply(Alloc("on-b", 1, {3}, 500, 1000)).ok());
  EXPECT_EQ(s.live_classes().size(), 2u);
  auto gone = s.RemoveNode(0);
  ASSERT_TRUE(gone.ok()) << gone.status();
  ASSERT_EQ(gone->size(), 1u);
  EXPECT_EQ((*gone)[0].id, "on-a");
  EXPECT_THAT((*gone)[0].gpus, ::testing::ElementsAre(0, 1));
  EXPECT_EQ(s.Find("on-a"), nullptr);
  EXPECT_NE(s.Find("on-b"), nullptr) << "another node's allocation stays";
  EXPECT_FALSE(s.node_live(0));
  EXPECT_EQ(s.FindNode("a"), -1);
  EXPECT_EQ(s.live_node_count(), 1);
  EXPECT_EQ(s.gpu_count(0), 0);
  ASSERT_EQ(s.live_classes().size(), 1u) << "a's class died with its only member";
  EXPECT_THAT(s.class_members(s.live_classes()[0]), ::testing::ElementsAre(1));
  // Nothing more lands on it, and it cannot be removed twice.
  EXPECT_EQ(s.Apply(Alloc("late", 0, {2}, 1000, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.SetGpuHealth(0, 0, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.RemoveNode(0).status().code(), absl::StatusCode::kNotFound);
  // The name comes back as a new node (another machine behind it), in b's class when alike.
  auto again = s.AddNode(Node("a", 4));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 2) << "ids are never reused";
  EXPECT_EQ(s.FindNode("a"), 2);
  EXPECT_EQ(s.live_classes().size(), 2u) << "b has a half-used GPU, the new a none";
  ASSERT_TRUE(s.Remove("on-b").ok());
  EXPECT_EQ(s.live_classes().size(), 1u);
  EXPECT_EQ(s.class_members(s.live_classes()[0]).size(), 2u);
}

TEST(ClusterState, RejectsBadNodes) {
  ClusterState s;
  ASSERT_TRUE(s.AddNode(Node("a", 1)).ok());
  EXPECT_FALSE(s.AddNode(Node("a", 1)).ok());
  EXPECT_FALSE(s.AddNode(Node("", 1)).ok());
  core::NodeSpec bad = Node("b", 2);
  bad.topology = core::Topology(3);
  EXPECT_FALSE(s.AddNode(bad).ok());
}

TEST(ClusterState, EmptiedClassesAreRecycled) {
  ClusterState s;
  ASSERT_TRUE(s.AddNode(Node("a", 1)).ok());
  ClassId first = s.node_class(0);
  uint32_t gen = s.class_generation(first);
  // The only node leaves its class, which empties; the new state reuses that id with a new
  // generation.
  ASSERT_TRUE(s.Apply(Alloc("x", 0, {0}, 100, 0)).ok());
  EXPECT_EQ(s.node_class(0), first);
  EXPECT_EQ(s.class_generation(first), gen + 1);
  ASSERT_TRUE(s.Remove("x").ok());
  ASSERT_TRUE(s.Apply(Alloc("y", 0, {0}, 200, 0)).ok());
  EXPECT_EQ(s.class_capacity(), 1);
  EXPECT_EQ(s.class_generation(first), gen + 3);
}

TEST(ClusterState, LogsEveryMembershipChange) {
  ClusterState s;
  ASSERT_TRUE(s.AddNode(Node("a", 1)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 1)).ok());
  const size_t before = s.class_changes().size();
  ClassId from = s.node_class(1);
  ASSERT_TRUE(s.Apply(Alloc("x", 1, {0}, 100, 0)).ok());
  ClassId to = s.node_class(1);
  ASSERT_EQ(s.class_changes().size(), before + 2);
  EXPECT_EQ(s.class_changes()[before], from);
  EXPECT_EQ(s.class_changes()[before + 1], to);
  EXPECT_EQ(s.class_sizes()[from], 1);
  EXPECT_EQ(s.class_sizes()[to], 1);
}

TEST(ClusterState, ChangeLogStaysBounded) {
  ClusterState s;
  ASSERT_TRUE(s.AddNode(Node("a", 1)).ok());
  for (int i = 0; i < 10000; ++i) {
    ASSERT_TRUE(s.Apply(Alloc("x", 0, {0}, 100, 0)).ok());
    ASSERT_TRUE(s.Remove("x").ok());
  }
  EXPECT_LE(s.class_changes().size(), 4096u + 4u * s.class_capacity());
  EXPECT_EQ(s.change_base() + s.class_changes().size(), 1u + 40000u);
}

}  // namespace
}  // namespace tessera::sched
