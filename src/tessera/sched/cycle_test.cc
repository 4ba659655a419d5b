// The scheduling cycle: queue order, the shape memo, quotas, preemption that waits for its victims
// to stop, gangs, and bad input.
#include "tessera/sched/cycle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/sched/test_util.h"

namespace tessera::sched {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Node;
using testing::Whole;

core::Request Prio(core::Request r, int priority, bool preemptible = true) {
  r.priority = priority;
  r.preemptible = preemptible;
  return r;
}

QueueEntry Entry(core::Request r, double submitted, uint64_t seq) {
  return QueueEntry{std::move(r), submitted, seq};
}

std::vector<std::string> Started(const std::vector<CycleDecision>& ds) {
  std::vector<std::string> ids;
  for (const CycleDecision& d : ds) {
    if (d.kind == CycleDecision::Kind::kStart) ids.push_back(d.id);
  }
  return ids;
}

TEST(Cycle, OrdersByPriorityThenSubmitTimeThenSequence) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 1)).ok());
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("late-low", 1), 0), 5, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("early-low-b", 1), 0), 1, 3)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("early-low-a", 1), 0), 1, 2)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("high", 1), 9), 9, 4)).ok());
  EXPECT_THAT(c.Order(), ElementsAre("high", "early-low-a", "early-low-b", "late-low"));
  // One GPU: the first in order gets it, the rest wait, saying why.
  EXPECT_THAT(Started(c.Step(10)), ElementsAre("high"));
  EXPECT_EQ(c.size(), 3u);
  EXPECT_THAT(*c.Waiting("late-low"), HasSubstr("no node fits"));
  ASSERT_TRUE(s.Release("high").ok());
  EXPECT_THAT(Started(c.Step(11)), ElementsAre("early-low-a"));
}

TEST(Cycle, LaterSmallerRequestsBackfillAroundABlockedOne) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  ASSERT_TRUE(s.Place(Whole("running", 2)).ok());
  Cycle c(s, {.preemption = false});
  ASSERT_TRUE(c.Enqueue(Entry(Whole("big", 4), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Whole("big-twin", 4), 2, 2)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Whole("small", 1), 3, 3)).ok());
  std::vector<CycleDecision> ds = c.Step(5);
  EXPECT_THAT(Started(ds), ElementsAre("small"));
  // The twin of a shape that did not fit was not tried again, and says the same.
  EXPECT_EQ(*c.Waiting("big-twin"), *c.Waiting("big"));
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].allocation.gpus.size(), 1u);
  EXPECT_NE(s.state().Find("small"), nullptr) << "a start is recorded in the scheduler";
}

// A request expected to run `seconds`.
core::Request Timed(core::Request r, double seconds) {
  r.expected_duration_s = seconds;
  return r;
}

TEST(Cycle, AReservationKeepsAStreamOfSmallRequestsFromStarvingALargeOne) {
  // Two GPUs, one busy until t=100 (expected); a request for both waits. Small requests keep
  // coming: without reservations each takes the GPU that comes free, and the large one never
  // starts; with one, small requests only go where they end before it begins.
  for (int reservations : {0, 1}) {
    Scheduler s;
    ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
    Allocation running = *s.Place(Timed(Whole("running", 1), 100), 0);
    Cycle c(s, {.preemption = false, .reservations = reservations});
    ASSERT_TRUE(c.Enqueue(Entry(Timed(Whole("large", 2), 50), 1, 1)).ok());
    ASSERT_TRUE(c.Enqueue(Entry(Timed(Whole("ends-after", 1), 200), 2, 2)).ok());
    ASSERT_TRUE(c.Enqueue(Entry(Whole("unknown", 1), 3, 3)).ok());
    ASSERT_TRUE(c.Enqueue(Entry(Timed(Whole("ends-before", 1), 60), 4, 4)).ok());
    std::vector<std::string> started = Started(c.Step(10));
    if (reservations == 0) {
      EXPECT_THAT(started, ElementsAre("ends-after")) << "the first that fits takes the GPU";
      EXPECT_FALSE(c.ExpectedStart("large").has_value());
      continue;
    }
    // ends-before (10 + 60 = 70 < 100) backfills; the others would delay the large request.
    EXPECT_THAT(started, ElementsAre("ends-before"));
    ASSERT_TRUE(c.ExpectedStart("large").has_value());
    EXPECT_EQ(*c.ExpectedStart("large"), 100);
    EXPECT_THAT(*c.Waiting("large"),
                HasSubstr("GPU 0,1 of a reserved for it (expected start in 90 s)"));
    EXPECT_THAT(*c.Waiting("ends-after"),
                HasSubstr("the free GPUs are reserved for large (expected start in 90 s); it would "
                          "end after that"));
    EXPECT_THAT(*c.Waiting("unknown"), HasSubstr("have no expected end before that"));
    EXPECT_EQ(s.state().allocations().size(), 2u) << "no phantom is left after the step";
    // The running work ends late (its prediction was wrong): the reservation moves, nothing is
    // stopped; when both GPUs are free the large request starts first.
    ASSERT_TRUE(s.Release("ends-before").ok());
    EXPECT_THAT(Started(c.Step(120)), ::testing::IsEmpty());
    EXPECT_EQ(*c.ExpectedStart("large"), 120) << "overdue work is expected to end now";
    ASSERT_TRUE(s.Release(running.id).ok());
    EXPECT_THAT(Started(c.Step(130)), ElementsAre("large"));
  }
}

TEST(Cycle, WithoutExpectedEndsAReservationStillHoldsTheGpusThatComeFree) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Whole("running", 1), 0).ok());
  Cycle c(s, {.preemption = false, .reservations = 1});
  ASSERT_TRUE(c.Enqueue(Entry(Whole("large", 2), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Timed(Whole("small", 1), 5), 2, 2)).ok());
  EXPECT_THAT(Started(c.Step(10)), ::testing::IsEmpty())
      << "nothing is known to end before the large one starts";
  EXPECT_EQ(*c.ExpectedStart("large"), std::numeric_limits<double>::infinity());
  EXPECT_THAT(*c.Waiting("large"), HasSubstr("start unknown"));
}

// A request that found no room keeps its answer while the scheduler's state is the same, but not
// past what changes it: a reservation freed ahead of it in the queue, room that comes free.
TEST(Cycle, ASettledAnswerGivesWayToAFreedReservationAndToRoom) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Timed(Whole("running", 2), 100), 0).ok());
  Cycle c(s, {.preemption = true, .reservations = 1});
  ASSERT_TRUE(c.Enqueue(Entry(Whole("first", 2), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Whole("second", 1), 2, 2)).ok());
  EXPECT_THAT(Started(c.Step(10)), ::testing::IsEmpty());
  ASSERT_TRUE(c.ExpectedStart("first").has_value());
  EXPECT_FALSE(c.ExpectedStart("second").has_value()) << "one reservation, taken by the first";
  const std::string second = *c.Waiting("second");
  EXPECT_THAT(c.Step(11), ::testing::IsEmpty());
  EXPECT_EQ(*c.Waiting("second"), second) << "nothing changed: the same answer";
  // The first leaves the queue: the reservation is the second's, though the state is the same.
  ASSERT_TRUE(c.Remove("first"));
  EXPECT_THAT(c.Step(12), ::testing::IsEmpty());
  ASSERT_TRUE(c.ExpectedStart("second").has_value());
  EXPECT_EQ(*c.ExpectedStart("second"), 100);
  // Room: it starts.
  ASSERT_TRUE(s.Release("running").ok());
  EXPECT_THAT(Started(c.Step(13)), ElementsAre("second"));
}

TEST(Cycle, QuotaRefusalOfOneOwnerDoesNotBlockTheSameShapeOfAnother) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  OwnerQuota q;
  q.limit.gpus = 1;
  s.quotas().Set("alice", q);
  core::Request a1 = Whole("a1", 1), a2 = Whole("a2", 1), b1 = Whole("b1", 1);
  a1.owner = a2.owner = "alice";
  b1.owner = "bob";
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(a1, 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(a2, 2, 2)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(b1, 3, 3)).ok());
  EXPECT_THAT(Started(c.Step(5)), ElementsAre("a1", "b1"));
  EXPECT_THAT(*c.Waiting("a2"), HasSubstr("quota"));
}

TEST(Cycle, PreemptionWaitsForItsVictimsToStopAndAsksOnce) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("low", 2), 0)).ok());
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("urgent", 2), 10), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("urgent-too", 2), 10), 2, 2)).ok());
  std::vector<CycleDecision> ds = c.Step(5);
  ASSERT_EQ(ds.size(), 2u);
  // The second urgent request waits for the same victim, asking nothing more (its decision says
  // what it waits for, for an elastic victim's shrink).
  EXPECT_EQ(ds[1].id, "urgent-too");
  EXPECT_THAT(ds[1].victims, ::testing::IsEmpty());
  EXPECT_THAT(ds[1].already_stopping, ElementsAre("low"));
  EXPECT_EQ(ds[0].kind, CycleDecision::Kind::kPreempt);
  EXPECT_EQ(ds[0].id, "urgent");
  EXPECT_THAT(ds[0].victims, ElementsAre("low"));
  EXPECT_THAT(ds[0].reason, HasSubstr("preempted for urgent (priority 10)"));
  EXPECT_EQ(c.stopping(), 1u);
  EXPECT_THAT(*c.Waiting("urgent"), HasSubstr("waiting for 1 preempted job(s) to stop"));
  // The victim has not stopped yet: nothing new is asked, nothing starts.
  EXPECT_TRUE(c.Step(6).empty());
  EXPECT_NE(s.state().Find("low"), nullptr) << "a victim keeps its resources until it stopped";
  // It stopped: the consumer releases it and requeues it; the request it made room for starts.
  ASSERT_TRUE(s.Release("low").ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("low", 2), 0), 0, 0)).ok());
  ds = c.Step(7);
  EXPECT_THAT(Started(ds), ElementsAre("urgent"));
  EXPECT_EQ(c.stopping(), 0u);
  EXPECT_THAT(*c.Waiting("urgent-too"), HasSubstr("no node fits"))
      << "equal priority: 'urgent' is not a victim for 'urgent-too'";
}

// A node that goes while a request waits for victims there: the victims are no longer stopping,
// the room is given up and planned again elsewhere; quota use of what ran there is given back.
TEST(Cycle, ANodeRemovedUnderAPreemptionIsPlannedAgainElsewhere) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 2)).ok());
  core::Request low_a = Prio(Whole("low-a", 2), 0), low_b = Prio(Whole("low-b", 2), 1);
  low_a.owner = low_b.owner = "team";
  ASSERT_TRUE(s.Place(low_a).ok());
  ASSERT_TRUE(s.Place(low_b).ok());
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("urgent", 2), 10), 1, 1)).ok());
  std::vector<CycleDecision> ds = c.Step(5);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_THAT(ds[0].victims, ElementsAre("low-a")) << "the lowest priority first";
  auto awaited = c.Awaiting("urgent");
  ASSERT_TRUE(awaited);
  EXPECT_EQ(awaited->node, s.state().FindNode("a"));
  EXPECT_THAT(awaited->victims, ElementsAre("low-a"));
  EXPECT_FALSE(c.Awaiting("nosuch"));
  const int64_t used = s.quotas().Used("team").gpus;
  auto released = c.RemoveNode(s.state().FindNode("a"));
  ASSERT_TRUE(released.ok()) << released.status();
  ASSERT_EQ(released->size(), 1u);
  EXPECT_EQ((*released)[0].id, "low-a");
  EXPECT_EQ(c.stopping(), 0u);
  EXPECT_FALSE(c.Awaiting("urgent")) << "its room went with the node";
  EXPECT_EQ(s.quotas().Used("team").gpus, used - 2) << "a's GPUs no longer count";
  // The next Step plans again, on b.
  ds = c.Step(6);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_THAT(ds[0].victims, ElementsAre("low-b"));
  EXPECT_EQ(c.Awaiting("urgent")->node, s.state().FindNode("b"));
  EXPECT_EQ(c.RemoveNode(0).status().code(), absl::StatusCode::kNotFound) << "removed already";
}

TEST(Cycle, ALenderReclaimsItsQuotaAndAnEarlierBorrowerDoesNotTakeItBack) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  s.quotas().Set("a",
                 OwnerQuota{.limit = {1, -1, -1}, .borrow = true, .borrow_limit = {2, -1, -1}});
  s.quotas().Set("b", OwnerQuota{.limit = {1, -1, -1}});
  auto owned = [](core::Request r, const char* owner) {
    r.owner = owner;
    return r;
  };
  ASSERT_TRUE(s.Place(owned(Whole("a1", 1), "a")).ok());
  auto borrowed = s.Place(owned(Whole("a2", 1), "a"));
  ASSERT_TRUE(borrowed.ok());
  EXPECT_TRUE(borrowed->borrowed);
  Cycle c(s);
  // a's next request queues first; b's (same shape, same priority) must not share its memo.
  ASSERT_TRUE(c.Enqueue(Entry(owned(Whole("a3", 1), "a"), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(owned(Whole("b1", 1), "b"), 2, 2)).ok());
  std::vector<CycleDecision> ds = c.Step(5);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].id, "b1");
  EXPECT_THAT(ds[0].victims, ElementsAre("a2"));
  ASSERT_TRUE(s.Release("a2").ok());
  // The freed GPU is b1's, though a3 comes first in the queue and a could borrow again.
  EXPECT_THAT(Started(c.Step(6)), ElementsAre("b1"));
  EXPECT_TRUE(c.Queued("a3"));
}

TEST(Cycle, RoomMadeByPreemptionIsNotTakenByALaterRequest) {
  // 4 GPUs: a low-priority 2-GPU job runs, 2 are free. The urgent 4-GPU request's plan counts on
  // the free two as well as the victim's; a later small request must not take them meanwhile (it
  // would, and the urgent request would preempt again for ever).
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("low", 2), 0)).ok());
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("urgent", 4), 10), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("small", 2), 0), 2, 2)).ok());
  std::vector<CycleDecision> ds = c.Step(5);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].kind, CycleDecision::Kind::kPreempt);
  EXPECT_THAT(*c.Waiting("small"), HasSubstr("reserved for urgent"));
  EXPECT_EQ(s.state().Find("small"), nullptr);
  ASSERT_TRUE(s.Release("low").ok());
  EXPECT_THAT(Started(c.Step(6)), ElementsAre("urgent"));
  EXPECT_THAT(*c.Waiting("small"), HasSubstr("no node fits"));
}

TEST(Cycle, CpuFreedByPreemptionIsNotTakenBesideTheReservedGpus) {
  // 2 GPUs, 16 cores. GPU 0: a low-priority 60% share with 4 cores (the victim); GPU 1: a 50% share
  // that may not be preempted, 1 core. The urgent whole GPU wants 12 cores: 11 are free, so the
  // victim must go and GPU 0 is the urgent request's. A later 50% share of 8 cores fits now on
  // GPU 1: placed, it would take the cores the urgent request counts on, which would then preempt
  // it, and so on for ever (seen in a replay of the openb trace). The whole node is the urgent
  // request's until it starts.
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2, 16000)).ok());
  ASSERT_TRUE(s.Place(Prio(testing::Share("victim", 600, 4000), 0)).ok());
  auto pinned = s.Place(Prio(testing::Share("pinned", 500, 1000), 0, /*preemptible=*/false));
  ASSERT_TRUE(pinned.ok());
  ASSERT_THAT(pinned->gpus, ElementsAre(1));
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("urgent", 1, 12000), 10), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(testing::Share("later", 500, 8000), 0), 2, 2)).ok());
  std::vector<CycleDecision> ds = c.Step(5);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].kind, CycleDecision::Kind::kPreempt);
  EXPECT_THAT(ds[0].victims, ElementsAre("victim"));
  EXPECT_THAT(*c.Waiting("later"), HasSubstr("its node is reserved for urgent"));
  EXPECT_EQ(s.state().Find("later"), nullptr);
  ASSERT_TRUE(s.Release("victim").ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(testing::Share("victim", 600, 4000), 0), 0, 0)).ok());
  ds = c.Step(6);
  EXPECT_THAT(Started(ds), ElementsAre("urgent"));
  for (const CycleDecision& d : ds) EXPECT_NE(d.kind, CycleDecision::Kind::kPreempt);
}

TEST(Cycle, FairShareServesTheOwnerWhoUsedLeastFirstWithinAPriority) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  Cycle c(s, {.preemption = false, .fair_share_half_life_s = 3600});
  auto owned = [](const std::string& id, const std::string& owner, int priority = 0) {
    core::Request r = Prio(Whole(id, 2), priority);
    r.owner = owner;
    return r;
  };
  // Alice holds both GPUs for an hour.
  ASSERT_TRUE(c.Enqueue(Entry(owned("a1", "alice"), 0, 1)).ok());
  EXPECT_THAT(Started(c.Step(0)), ElementsAre("a1"));
  // Alice's next job was submitted before Bob's; Bob has used nothing.
  ASSERT_TRUE(c.Enqueue(Entry(owned("a2", "alice"), 10, 2)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(owned("b1", "bob"), 20, 3)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(owned("urgent", "alice", 5), 30, 4)).ok());
  EXPECT_TRUE(c.Step(3600).empty());
  EXPECT_NEAR(c.Usage("alice"), 2 * 3600, 1e-6) << "two GPUs for an hour";
  EXPECT_EQ(c.Usage("bob"), 0);
  EXPECT_THAT(c.Order(), ElementsAre("urgent", "b1", "a2")) << "priority first, then least use";
  ASSERT_TRUE(s.Release("a1").ok());
  EXPECT_THAT(Started(c.Step(3601)), ElementsAre("urgent"));
  ASSERT_TRUE(s.Release("urgent").ok());
  EXPECT_THAT(Started(c.Step(3602)), ElementsAre("b1"));
  // Use decays by half every half-life.
  const double d = std::exp2(-1.0 / 3600);  // one second of decay
  EXPECT_NEAR(c.Usage("alice"), (2 * 3600 * d + 2) * d + 2, 1e-6)
      << "decayed by the second, plus what she ran each second (urgent: 2 GPUs for 1 s)";
  // Off: submission order decides.
  Scheduler s2;
  ASSERT_TRUE(s2.AddNode(Node("a", 2)).ok());
  Cycle plain(s2, {.preemption = false});
  ASSERT_TRUE(plain.Enqueue(Entry(owned("a2", "alice"), 10, 2)).ok());
  ASSERT_TRUE(plain.Enqueue(Entry(owned("b1", "bob"), 20, 3)).ok());
  EXPECT_THAT(plain.Order(), ElementsAre("a2", "b1"));
}

TEST(Cycle, NoPreemptionWhenOff) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 1)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("low", 1), 0)).ok());
  Cycle c(s, {.preemption = false});
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("urgent", 1), 10), 1, 1)).ok());
  EXPECT_TRUE(c.Step(2).empty());
  EXPECT_EQ(c.stopping(), 0u);
}

TEST(Cycle, GangStartsWhenAllMembersAreQueuedAndFit) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 2)).ok());
  auto member = [](int i) {
    core::Request r = Whole("w" + std::to_string(i), 2);
    r.gang = "train";
    r.gang_size = 2;
    return r;
  };
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(member(0), 1, 1)).ok());
  EXPECT_TRUE(c.Step(2).empty());
  EXPECT_THAT(*c.Waiting("w0"), HasSubstr("gang train: 1 of 2 members queued"));
  ASSERT_TRUE(c.Enqueue(Entry(member(1), 2, 2)).ok());
  EXPECT_THAT(Started(c.Step(3)), ElementsAre("w0", "w1"));
  EXPECT_EQ(c.size(), 0u);
}

TEST(Cycle, AGangDoesNotTakeGpusReservedForAnEarlierRequest) {
  // A share runs on GPU 0 until t=100; a request for both GPUs reserves them from then. A gang of
  // two shares would fit in what is left of GPU 0 - and delay the reservation: it waits.
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Timed(testing::Share("running", 500), 100), 0).ok());
  Cycle c(s, {.preemption = false, .reservations = 1});
  ASSERT_TRUE(c.Enqueue(Entry(Whole("large", 2), 1, 1)).ok());
  for (int i = 0; i < 2; ++i) {
    core::Request m = testing::Share("g" + std::to_string(i), 200);
    m.gang = "pair";
    m.gang_size = 2;
    ASSERT_TRUE(c.Enqueue(Entry(m, 2, 2 + i)).ok());
  }
  EXPECT_THAT(Started(c.Step(10)), ::testing::IsEmpty());
  EXPECT_THAT(*c.Waiting("g0"),
              HasSubstr("gang pair: the GPUs it could take are reserved for large"));
  EXPECT_EQ(s.state().allocations().size(), 1u) << "nothing of the gang, no phantom left";
  // Expected to be done before the reservation begins, it goes.
  Cycle quick(s, {.preemption = false, .reservations = 1});
  ASSERT_TRUE(quick.Enqueue(Entry(Whole("large", 2), 1, 1)).ok());
  for (int i = 0; i < 2; ++i) {
    core::Request m = Timed(testing::Share("q" + std::to_string(i), 200), 30);
    m.gang = "quick";
    m.gang_size = 2;
    ASSERT_TRUE(quick.Enqueue(Entry(m, 2, 2 + i)).ok());
  }
  EXPECT_THAT(Started(quick.Step(10)), ElementsAre("q0", "q1"));
}

TEST(Cycle, AGangDoesNotTakeRoomMadeByPreemption) {
  // GPU 0 runs a low-priority job, GPU 1 is free; an urgent request for both preempts it. A gang of
  // two small shares queued after it would fit on GPU 1 now: it waits until the urgent one started.
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("low", 1), 0)).ok());
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Whole("urgent", 2), 10), 1, 1)).ok());
  for (int i = 0; i < 2; ++i) {
    core::Request m = testing::Share("g" + std::to_string(i), 200);
    m.gang = "pair";
    m.gang_size = 2;
    ASSERT_TRUE(c.Enqueue(Entry(m, 2, 2 + i)).ok());
  }
  std::vector<CycleDecision> ds = c.Step(5);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_THAT(ds[0].victims, ElementsAre("low"));
  EXPECT_THAT(*c.Waiting("g0"),
              HasSubstr("gang pair: a node it could take is reserved for urgent"));
  EXPECT_EQ(s.state().allocations().size(), 1u) << "nothing of the gang placed";
  // The victim stopped: the urgent request starts; the gang waits for room (none is left).
  ASSERT_TRUE(s.Release("low").ok());
  ds = c.Step(6);
  EXPECT_THAT(Started(ds), ElementsAre("urgent"));
  for (const CycleDecision& d : ds) EXPECT_NE(d.kind, CycleDecision::Kind::kPreempt);
}

core::Request Member(core::Request r, const std::string& gang, int size) {
  r.gang = gang;
  r.gang_size = size;
  return r;
}

TEST(Cycle, AGangPreemptsForAllItsMembersAndStartsWhenEveryVictimStopped) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("low0", 1), 0)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("low1", 1), 0)).ok());
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Member(Whole("m0", 1), "pair", 2), 10), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Member(Whole("m1", 1), "pair", 2), 10), 1, 2)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(testing::Share("later", 100), 0), 2, 3)).ok());
  std::vector<CycleDecision> ds = c.Step(5);
  std::set<std::string> victims;
  for (const CycleDecision& d : ds) {
    ASSERT_EQ(d.kind, CycleDecision::Kind::kPreempt);
    EXPECT_THAT(d.reason, HasSubstr("preempted for gang pair (priority 10)"));
    victims.insert(d.victims.begin(), d.victims.end());
  }
  EXPECT_THAT(victims, ElementsAre("low0", "low1"));
  EXPECT_THAT(*c.Waiting("m0"), HasSubstr("gang pair: waiting for 2 preempted job(s) to stop"));
  EXPECT_EQ(c.stopping(), 2u);
  // One victim stopped: still waiting, nothing asked again, nobody takes the freed GPU.
  ASSERT_TRUE(s.Release("low0").ok());
  ds = c.Step(6);
  EXPECT_TRUE(ds.empty());
  EXPECT_THAT(*c.Waiting("m1"), HasSubstr("waiting for 1 preempted job(s) to stop"));
  EXPECT_THAT(*c.Waiting("later"), HasSubstr("reserved for m"));
  ASSERT_TRUE(s.Release("low1").ok());
  EXPECT_THAT(Started(c.Step(7)), ElementsAre("m0", "m1"));
}

TEST(Cycle, AGangAsksNothingWhenOneMemberCannotFindRoom) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("low", 1), 0)).ok());
  ASSERT_TRUE(s.Place(Prio(Whole("pinned", 1), 0, /*preemptible=*/false)).ok());
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Member(Whole("m0", 1), "pair", 2), 10), 1, 1)).ok());
  ASSERT_TRUE(c.Enqueue(Entry(Prio(Member(Whole("m1", 1), "pair", 2), 10), 1, 2)).ok());
  EXPECT_TRUE(c.Step(5).empty()) << "one member's room is not worth a victim";
  EXPECT_EQ(c.stopping(), 0u);
  EXPECT_THAT(*c.Waiting("m0"), HasSubstr("no node fits"));
  EXPECT_EQ(s.state().allocations().size(), 2u) << "the scratch plan left nothing behind";
  EXPECT_NE(s.state().Find("low"), nullptr);
}

TEST(Cycle, RefusesMalformedAndDuplicateEntries) {
  Scheduler s;
  Cycle c(s);
  EXPECT_EQ(c.Enqueue(Entry(Whole("", 1), 0, 0)).code(), absl::StatusCode::kInvalidArgument);
  core::Request bad = Whole("bad", 1);
  bad.gpu_milli = 300;  // whole GPUs and a share at once
  absl::Status st = c.Enqueue(Entry(bad, 0, 0));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("request bad: "));
  ASSERT_TRUE(c.Enqueue(Entry(Whole("x", 1), 0, 0)).ok());
  EXPECT_EQ(c.Enqueue(Entry(Whole("x", 1), 0, 0)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(c.Remove("x"));
  EXPECT_FALSE(c.Remove("x"));
  EXPECT_EQ(c.Waiting("x"), nullptr);
}

TEST(RequestShapeKey, CountsEveryPlacementFieldAndNotTheIdentity) {
  core::Request a = Whole("a", 2), b = Whole("b", 2);
  b.owner = "someone";
  b.priority = 7;
  EXPECT_EQ(core::RequestShapeKey(a), core::RequestShapeKey(b));
  auto differs = [&](auto change) {
    core::Request c = a;
    change(c);
    return core::RequestShapeKey(c) != core::RequestShapeKey(a);
  };
  EXPECT_TRUE(differs([](core::Request& r) { r.cpu_milli += 1; }));
  EXPECT_TRUE(differs([](core::Request& r) { r.memory_mib += 1; }));
  EXPECT_TRUE(differs([](core::Request& r) { r.gpus = 3; }));
  EXPECT_TRUE(differs([](core::Request& r) { r.min_gpu_memory_mib = 1; }));
  EXPECT_TRUE(differs([](core::Request& r) {
    r.min_compute_capability = core::ComputeCapability{9, 0};
  }));
  EXPECT_TRUE(differs([](core::Request& r) { r.topology = core::TopologyMode::kRequire; }));
  EXPECT_TRUE(differs([](core::Request& r) { r.models = {"H100"}; }));
  EXPECT_TRUE(differs([](core::Request& r) { r.expected_util_pct = 40; }));
  EXPECT_TRUE(differs([](core::Request& r) { r.util_ceiling_pct = 70; }));
  EXPECT_FALSE(differs([](core::Request& r) { r.expected_duration_s = 60; }));
}

TEST(Cycle, AGpuHealthChangeAtTheSameInstantIsAChange) {
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 1)).ok());
  ASSERT_TRUE(s.SetGpuHealth(0, 0, false).ok());
  Cycle c(s);
  ASSERT_TRUE(c.Enqueue(Entry(Whole("j", 1), 1, 1)).ok());
  EXPECT_THAT(c.Step(1), ::testing::IsEmpty());
  ASSERT_TRUE(s.SetGpuHealth(0, 0, true).ok());
  EXPECT_THAT(Started(c.Step(1)), ElementsAre("j"));
}

// A reader's copy of why each request waits and when it is expected to start, refreshed only for
// the requests TakeNoted names, stays equal to the cycle's own through starts, ends, preemption,
// reservations and removals; without note_changes nothing is kept.
TEST(Cycle, WhatTakeNotedNamesKeepsAReadersCopyOfTheQueueTrue) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    Scheduler s;
    ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
    ASSERT_TRUE(s.AddNode(Node("b", 2)).ok());
    Cycle c(s, {.preemption = seed % 2 == 0, .reservations = pick(3), .note_changes = true});
    struct Said {
      std::string waiting;
      std::optional<double> start;
    };
    std::map<std::string, Said> copy;
    std::vector<std::string> running;
    size_t noted = 0, queued_looks = 0;
    for (int step = 0, next = 0; step < 60; ++step) {
      for (int n = pick(4); n > 0; --n, ++next) {
        core::Request r = Prio(Whole("r" + std::to_string(next), 1 + pick(4)), pick(3));
        if (pick(2) == 0) r.expected_duration_s = 10 + pick(50);
        ASSERT_TRUE(c.Enqueue(Entry(std::move(r), step, next)).ok());
      }
      if (!running.empty() && pick(3) == 0) {  // one ends
        const size_t i = static_cast<size_t>(pick(static_cast<int>(running.size())));
        (void)s.Release(running[i]);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (c.size() > 0 && pick(5) == 0) (void)c.Remove(c.Order().front());  // one cancelled
      for (const CycleDecision& d : c.Step(step)) {
        if (d.kind == CycleDecision::Kind::kStart) running.push_back(d.id);
        for (const std::string& v : d.victims) {
          (void)s.Release(v);  // stopped at once
          std::erase(running, v);
        }
      }
      for (const std::string& id : c.TakeNoted()) {
        ++noted;
        if (const std::string* w = c.Waiting(id)) copy[id] = {*w, c.ExpectedStart(id)};
      }
      for (const std::string& id : c.Order()) {
        ++queued_looks;
        ASSERT_TRUE(copy.contains(id)) << id << " was queued without being noted";
        EXPECT_EQ(copy[id].waiting, *c.Waiting(id)) << id << " at step " << step;
        EXPECT_EQ(copy[id].start, c.ExpectedStart(id)) << id << " at step " << step;
      }
    }
    EXPECT_LT(noted, queued_looks) << "only what changed is noted, not the queue at each step";
  }
  Scheduler s;
  ASSERT_TRUE(s.AddNode(Node("a", 1)).ok());
  Cycle quiet(s);
  ASSERT_TRUE(quiet.Enqueue(Entry(Whole("x", 2), 1, 1)).ok());
  quiet.Step(1);
  EXPECT_TRUE(quiet.TakeNoted().empty()) << "not asked for: nothing kept";
}

}  // namespace
}  // namespace tessera::sched
