#include "tessera/sched/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/sched/test_util.h"

namespace tessera::sched {
namespace {

using ::testing::HasSubstr;
using testing::Node;
using testing::Share;
using ::testing::UnorderedElementsAre;
using testing::Whole;

core::Request Prio(core::Request r, int priority, bool preemptible = true) {
  r.priority = priority;
  r.preemptible = preemptible;
  return r;
}

TEST(Scheduler, PlaceAndReleaseAccountExactly) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  auto a = s.Place(Share("x", 300));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->gpus.size(), 1u);
  EXPECT_EQ(s.state().gpu_use(0, a->gpus[0]).milli, 300);
  EXPECT_EQ(s.Place(Share("x", 300)).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.Release("x").ok());
  EXPECT_EQ(s.state().gpu_use(0, a->gpus[0]).milli, 0);
  EXPECT_EQ(s.Release("x").status().code(), absl::StatusCode::kNotFound);
}

TEST(Scheduler, AShareOnSeveralGpusTakesItOnDifferentGpus) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 3)).ok());
  ASSERT_TRUE(s.Place(Share("small", 600)).ok());  // the fullest GPU for the next shares
  core::Request ranks = Share("ranks", 400);
  ranks.share_gpus = 2;
  ranks.gpu_memory_mib = 8192;
  auto a = s.Place(ranks);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->gpus.size(), 2u);
  EXPECT_NE(a->gpus[0], a->gpus[1]);
  EXPECT_EQ(a->milli_per_gpu, 400);
  EXPECT_EQ(a->memory_mib_per_gpu, 8192);
  int64_t milli = 0, memory = 0;
  for (int g = 0; g < 3; ++g) milli += s.state().gpu_use(0, g).milli;
  for (int g = 0; g < 3; ++g) memory += s.state().gpu_use(0, g).memory_mib;
  EXPECT_EQ(milli, 600 + 2 * 400);
  EXPECT_EQ(memory, 2 * 8192);
  // Packed: the GPU the small share is on is one of them (600 + 400 fits).
  const int small = s.state().Find("small")->gpus[0];
  EXPECT_TRUE(a->gpus[0] == small || a->gpus[1] == small);
  // Three more GPUs' worth of 400 does not fit on three GPUs with 0, 600 and 600 left.
  core::Request three = Share("three", 400);
  three.share_gpus = 3;
  auto no = s.Place(three);
  EXPECT_EQ(no.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(no.status().message()),
              HasSubstr("2 healthy GPUs have 400/1000 compute and 0 MiB free, wants 3"));
  ASSERT_TRUE(s.Release("ranks").ok());
  for (int g = 0; g < 3; ++g) milli -= s.state().gpu_use(0, g).milli;
  EXPECT_EQ(milli, 800) << "released on both GPUs";
  EXPECT_TRUE(s.Place(three).ok()) << "fits on three GPUs again";
  core::Request bad = Whole("bad", 0);
  bad.share_gpus = 2;
  EXPECT_THAT(std::string(s.Place(bad).status().message()),
              HasSubstr("share_gpus: a share on several GPUs needs gpu_milli or gpu_memory_mib"));
}

TEST(Scheduler, RejectsMalformedRequests) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  core::Request both = Whole("both", 1);
  both.gpu_milli = 500;
  EXPECT_THAT(std::string(s.Place(both).status().message()), HasSubstr("not both"));
  EXPECT_EQ(s.Place(Share("big", 1500)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Place(Whole("", 1)).status().code(), absl::StatusCode::kInvalidArgument);
  core::Request busy = Share("busy", 300);
  busy.expected_util_pct = 140;
  EXPECT_THAT(std::string(s.Place(busy).status().message()),
              HasSubstr("expected_util_pct: expected 0..100, got 140"));
  busy.expected_util_pct = 40;
  busy.util_ceiling_pct = -1;
  EXPECT_THAT(std::string(s.Place(busy).status().message()), HasSubstr("util_ceiling_pct"));
}

TEST(Scheduler, NoFitIsResourceExhaustedWithReason) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("node-17", 2)).ok());
  auto r = s.Place(Whole("big", 4));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("node-17: 2 healthy GPUs free, wants 4"));
}

// A shape that found no node is not decided again while the state is the same; what a trial did
// and undid leaves it so, and any real change (a release, a node, a GPU's health) decides again.
TEST(Scheduler, ANoFitIsRememberedOnlyWhileTheStateIsTheSame) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Whole("holder", 2)).ok());
  auto no = s.Place(Whole("w1", 1));
  ASSERT_EQ(no.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string why(no.status().message());
  // Inside a trial: released, it fits (nothing remembered is used); undone, it does not again.
  s.BeginTrial();
  auto held = s.Release("holder");
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE(s.Fits(Whole("w1", 1)));
  ASSERT_TRUE(s.Restore(*held).ok());
  s.EndTrial();
  auto again = s.Place(Whole("w2", 1));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("a: 0 healthy GPUs free"));
  // Real changes: a release, then a new node after everything is taken again.
  ASSERT_TRUE(s.Release("holder").ok());
  EXPECT_TRUE(s.Place(Whole("w3", 2)).ok());
  EXPECT_FALSE(s.Place(Whole("w4", 1)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 2)).ok());
  ASSERT_TRUE(s.SetGpuHealth(1, 0, false).ok());
  ASSERT_TRUE(s.SetGpuHealth(1, 1, false).ok());
  EXPECT_FALSE(s.Place(Whole("w4", 1)).ok()) << "b's GPUs are sick";
  ASSERT_TRUE(s.SetGpuHealth(1, 1, true).ok());
  EXPECT_TRUE(s.Place(Whole("w4", 1)).ok());
}

TEST(Scheduler, QuotaDeniesAndBorrowedWorkIsMarked) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 8)).ok());
  s.quotas().Set("alice", OwnerQuota{.limit = {2, -1, -1}});
  s.quotas().Set("bob",
                 OwnerQuota{.limit = {2, -1, -1}, .borrow = true, .borrow_limit = {4, -1, -1}});
  core::Request r = Whole("a1", 2);
  r.owner = "alice";
  ASSERT_TRUE(s.Place(r).ok());
  r.id = "a2";
  r.gpus = 1;
  auto denied = s.Place(r);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(denied.status().message()), HasSubstr("owner alice: 2 of 2 whole GPUs"));
  EXPECT_EQ(s.state().Find("a2"), nullptr) << "nothing placed";
  ASSERT_TRUE(s.Release("a1").ok());
  core::Request b = Whole("b1", 4);
  b.owner = "bob";
  auto borrowed = s.Place(b);
  ASSERT_TRUE(borrowed.ok()) << borrowed.status();
  EXPECT_TRUE(borrowed->borrowed);
  EXPECT_EQ(s.quotas().Used("bob").gpus, 4);
  ASSERT_TRUE(s.Release("b1").ok());
  EXPECT_EQ(s.quotas().Used("bob"), GpuAmount{});
}

TEST(Scheduler, GroupQuotaLimitsItsMembersTogether) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 8)).ok());
  s.quotas().Set("group:ml", OwnerQuota{.limit = {3, -1, -1}});
  auto member = [](const std::string& id, const std::string& owner, int gpus) {
    core::Request r = Whole(id, gpus);
    r.owner = owner;
    r.quota_groups = {"group:ml"};
    return r;
  };
  ASSERT_TRUE(s.Place(member("a1", "alice", 2)).ok());
  auto over =
      s.Place(member("b1", "bob", 2));  // bob has no quota of his own; the group has 1 GPU left
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("group:ml: 2 of 3 whole GPUs"));
  ASSERT_TRUE(s.Place(member("b2", "bob", 1)).ok());
  EXPECT_EQ(s.quotas().Used("group:ml").gpus, 3);
  EXPECT_EQ(s.quotas().Used("bob").gpus, 1);
  core::Request outsider = Whole("c1", 2);
  outsider.owner = "carol";
  EXPECT_TRUE(s.Place(outsider).ok()) << "not in the group: not limited by it";
  ASSERT_TRUE(s.Release("a1").ok());
  EXPECT_EQ(s.quotas().Used("group:ml").gpus, 1);
  // Restored allocations (a restarted server) are charged to the group too.
  auto released = s.Release("b2");
  ASSERT_TRUE(released.ok());
  ASSERT_TRUE(s.Restore(*released).ok());
  EXPECT_EQ(s.quotas().Used("group:ml").gpus, 1);
}

TEST(Scheduler, GangIsAllOrNothing) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 4)).ok());
  std::vector<core::Request> gang;
  for (int i = 0; i < 3; ++i) {
    core::Request r = Whole("w" + std::to_string(i), 4);
    r.gang = "train";
    r.gang_size = 3;
    gang.push_back(r);
  }
  auto placed = s.PlaceGang(gang);
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(placed.status().message()), HasSubstr("member 3 of 3"));
  EXPECT_TRUE(s.state().allocations().empty()) << "no partial gang";
  gang.pop_back();
  for (auto& r : gang) r.gang_size = 2;
  auto ok = s.PlaceGang(gang);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(s.state().allocations().size(), 2u);
  gang[0].gang_size = 5;
  EXPECT_EQ(s.PlaceGang(gang).status().code(), absl::StatusCode::kInvalidArgument);
}

// A node whose GPUs 0 and 1 are shared by MPS, 2 and 3 in time slices.
core::NodeSpec MpsNode(const std::string& name) {
  core::NodeSpec n = Node(name, 4);
  n.gpus[0].sharing = n.gpus[1].sharing = core::GpuSharing::kMps;
  return n;
}

core::Request Mps(core::Request r, const std::string& owner) {
  r.sharing = core::GpuSharing::kMps;
  r.owner = owner;
  return r;
}

TEST(Scheduler, ASharingModeAskedIsPlacedOnlyOnGpusInThatMode) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(MpsNode("a")).ok());
  // Three MPS shares of one user: on the MPS GPUs only, packed.
  for (int i = 0; i < 3; ++i) {
    auto a = s.Place(Mps(Share("m" + std::to_string(i), 300), "alice"));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_LT(a->gpus[0], 2) << "an MPS share goes on an MPS GPU";
  }
  // A share asking nothing goes in time slices, never on an MPS GPU, though they have room.
  for (int i = 0; i < 2; ++i) {
    auto t = s.Place(Share("t" + std::to_string(i), 900));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_GE(t->gpus[0], 2);
  }
  auto none = s.Place(Share("t2", 900));
  ASSERT_FALSE(none.ok()) << "the MPS GPUs' room is not for time-sliced shares";
  // Asked time slices explicitly: the same.
  core::Request ts = Share("ts", 50);
  ts.sharing = core::GpuSharing::kTimeSlice;
  auto t = s.Place(ts);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GE(t->gpus[0], 2);
  // Whole GPUs asking nothing may take an idle MPS GPU; asking MPS, only one.
  ASSERT_TRUE(s.Release("m0").ok());
  ASSERT_TRUE(s.Release("m1").ok());
  ASSERT_TRUE(s.Release("m2").ok());
  auto whole = s.Place(Mps(Whole("w", 2), "bob"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_THAT(whole->gpus, ::testing::ElementsAre(0, 1));
  EXPECT_FALSE(s.Place(Mps(Whole("w2", 1), "bob")).ok()) << "no MPS GPU left";
}

TEST(Scheduler, AnMpsGpuServesOneUsersClientsAtATime) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(MpsNode("a")).ok());
  ASSERT_TRUE(s.Place(Mps(Share("alice-1", 200), "alice")).ok());
  const int alice_gpu = s.state().Find("alice-1")->gpus[0];
  // Bob's client goes on the other MPS GPU, though alice's has more room packed.
  auto bob = s.Place(Mps(Share("bob-1", 200), "bob"));
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_NE(bob->gpus[0], alice_gpu);
  // Carol finds both MPS GPUs held by another user and waits, told why.
  auto carol = s.Place(Mps(Share("carol-1", 100), "carol"));
  ASSERT_EQ(carol.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(carol.status().message(), HasSubstr("another user's clients"));
  // Alice's second client joins her own GPU.
  auto alice2 = s.Place(Mps(Share("alice-2", 500), "alice"));
  ASSERT_TRUE(alice2.ok()) << alice2.status();
  EXPECT_EQ(alice2->gpus[0], alice_gpu);
  // The model refuses another owner's client on it, whatever the caller says.
  Allocation forced;
  forced.id = "forced";
  forced.node = 0;
  forced.gpus = {alice_gpu};
  forced.milli_per_gpu = 100;
  forced.request = Mps(Share("forced", 100), "carol");
  ClusterState copy = s.state();
  EXPECT_FALSE(copy.Apply(forced).ok());
  // A time-sliced share is not bound by it (it cannot go there anyway: wrong mode), and once
  // alice's clients end, carol's fits where alice's ran - not before the last one ends.
  ASSERT_TRUE(s.Release("alice-1").ok());
  EXPECT_FALSE(s.Place(Mps(Share("carol-1", 100), "carol")).ok());
  ASSERT_TRUE(s.Release("alice-2").ok());
  auto carol2 = s.Place(Mps(Share("carol-1", 100), "carol"));
  ASSERT_TRUE(carol2.ok()) << carol2.status();
  EXPECT_EQ(carol2->gpus[0], alice_gpu);
  EXPECT_EQ(s.state().gpu_use(0, alice_gpu).mps_user, MpsUserKey("carol"));
  EXPECT_EQ(s.state().gpu_use(0, alice_gpu).mps_holders, 1);
}

TEST(Scheduler, PreemptionFreesAnMpsGpuOfAnotherUsersClients) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(MpsNode("a")).ok());
  ASSERT_TRUE(s.Place(Prio(Mps(Share("a1", 100), "alice"), 1)).ok());
  ASSERT_TRUE(s.Place(Prio(Mps(Share("a2", 100), "alice"), 1)).ok());
  ASSERT_TRUE(s.Place(Prio(Mps(Share("b1", 100), "bob"), 2)).ok());
  const int alice_gpu = s.state().Find("a1")->gpus[0];
  ASSERT_EQ(s.state().Find("a2")->gpus[0], alice_gpu);
  // Room on both GPUs, but each has another user's clients: carol's urgent client must take one
  // GPU's clients all, and the cheapest are alice's (lower priority), both of them.
  PreemptionPlan plan = s.PlanPreemption(Prio(Mps(Share("c", 100), "carol"), 10));
  ASSERT_TRUE(plan.possible) << plan.why_not;
  EXPECT_THAT(plan.victims, UnorderedElementsAre("a1", "a2"));
}

TEST(Scheduler, PreemptionChoosesFewestLowestVictims) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 4)).ok());
  // Node a: four 1-GPU jobs of priority 1. Node b: one 4-GPU job of priority 2... placement decides
  // the nodes, so check them after.
  ASSERT_TRUE(s.Place(Prio(Whole("big", 4), 2)).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Place(Prio(Whole("s" + std::to_string(i), 1), 1)).ok());
  PreemptionPlan plan = s.PlanPreemption(Prio(Whole("urgent", 4), 10));
  ASSERT_TRUE(plan.possible) << plan.why_not;
  EXPECT_THAT(plan.victims, UnorderedElementsAre("big")) << "one victim beats four";
  EXPECT_EQ(plan.gpus.size(), 4u);
  // Equal counts: the lower priority goes.
  PreemptionPlan one = s.PlanPreemption(Prio(Whole("one", 1), 10));
  ASSERT_TRUE(one.possible);
  ASSERT_EQ(one.victims.size(), 1u);
  EXPECT_EQ(one.victims[0][0], 's');
  EXPECT_EQ(s.state().allocations().size(), 5u) << "a plan changes nothing";
}

TEST(Scheduler, PreemptionOfOtherOwnersWorkNeedsTheRight) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  core::Request alices = Prio(Whole("alice-low", 1), 0), bobs = Prio(Whole("bob-low", 1), 0);
  alices.owner = "alice";
  bobs.owner = "bob";
  ASSERT_TRUE(s.Place(alices).ok());
  ASSERT_TRUE(s.Place(bobs).ok());
  core::Request urgent = Prio(Whole("bob-urgent", 1), 10);
  urgent.owner = "bob";
  urgent.preempts_others = false;
  PreemptionPlan plan = s.PlanPreemption(urgent);
  ASSERT_TRUE(plan.possible) << plan.why_not;
  EXPECT_THAT(plan.victims, ::testing::ElementsAre("bob-low")) << "only bob's own work";
  urgent.gpus = 2;
  EXPECT_FALSE(s.PlanPreemption(urgent).possible) << "alice's job is not his to stop";
  urgent.preempts_others = true;
  EXPECT_TRUE(s.PlanPreemption(urgent).possible);
}

TEST(Scheduler, PreemptionNeverTakesProtectedOrHigherWork) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("keep", 1), 0, /*preemptible=*/false)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("high", 1), 50)).ok());
  PreemptionPlan plan = s.PlanPreemption(Prio(Whole("x", 1), 10));
  EXPECT_FALSE(plan.possible);
  EXPECT_THAT(plan.why_not, HasSubstr("no set of lower-priority preemptible work"));
}

TEST(Scheduler, PreemptingAGangMemberTakesTheGang) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 2)).ok());
  std::vector<core::Request> gang;
  for (int i = 0; i < 2; ++i) {
    core::Request r = Prio(Whole("g" + std::to_string(i), 2), 1);
    r.gang = "g";
    r.gang_size = 2;
    gang.push_back(r);
  }
  ASSERT_TRUE(s.PlaceGang(gang).ok());
  PreemptionPlan plan = s.PlanPreemption(Prio(Whole("x", 2), 10));
  ASSERT_TRUE(plan.possible);
  EXPECT_THAT(plan.victims, UnorderedElementsAre("g0", "g1"));
}

TEST(Scheduler, BorrowedWorkIsReclaimedForTheOwner) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  s.quotas().Set("owner", OwnerQuota{.limit = {2, -1, -1}});
  s.quotas().Set("guest",
                 OwnerQuota{.limit = {2, -1, -1}, .borrow = true, .borrow_limit = {4, -1, -1}});
  core::Request g = Whole("guest-job", 4);
  g.owner = "guest";
  g.priority = 5;
  auto placed = s.Place(g);
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_TRUE(placed->borrowed);
  core::Request o = Whole("owner-job", 2);
  o.owner = "owner";
  o.priority = 0;  // lower priority, yet within its own quota
  PreemptionPlan plan = s.PlanPreemption(o);
  ASSERT_TRUE(plan.possible) << plan.why_not;
  EXPECT_THAT(plan.victims, UnorderedElementsAre("guest-job"));
}

TEST(Scheduler, ExplainGivesEveryNodeAVerdict) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 1)).ok());
  auto verdicts = s.Explain(Whole("x", 2));
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_THAT(verdicts[0].second, HasSubstr("fits (score"));
  EXPECT_EQ(verdicts[1].second, "1 healthy GPU free, wants 2");
}

TEST(Scheduler, UnhealthyGpuTakesNoNewWork) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.SetGpuHealth(0, 0, false).ok());
  auto a = s.Place(Whole("x", 1));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->gpus, std::vector<int>{1});
  EXPECT_FALSE(s.Place(Whole("y", 1)).ok());
}

}  // namespace
}  // namespace tessera::sched
