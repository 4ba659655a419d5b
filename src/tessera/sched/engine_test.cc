// The engine: what its Executor is told, the requeue rules, the starts a step may make, and
// predictions from the one history.
#include "tessera/sched/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "tessera/sched/test_util.h"

namespace tessera::sched {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Node;
using testing::Share;
using testing::Whole;

// Records what the engine asks, nothing more.
struct Recorder : Executor {
  struct Stop {
    std::vector<std::string> victims;
    std::string for_id;
  };
  std::vector<std::string> started;
  std::vector<Allocation> allocations;
  std::vector<Stop> stops;
  void Start(const std::string& id, const Allocation& a, double) override {
    started.push_back(id);
    allocations.push_back(a);
  }
  void Stop(const std::vector<std::string>& victims, const std::string& for_id, const std::string&,
            double) override {
    stops.push_back({victims, for_id});
  }
};

std::unique_ptr<Scheduler> OneNode(int gpus) {
  auto s = std::make_unique<Scheduler>();
  EXPECT_TRUE(s->AddNode(Node("a", gpus)).ok());
  return s;
}

Submission Sub(core::Request r, double submitted, uint64_t seq, int priority = 0) {
  r.priority = priority;
  return Submission{QueueEntry{std::move(r), submitted, seq}, std::nullopt, std::nullopt};
}

TEST(Engine, TellsItsExecutorToStartAndToStopAndWaitsForTheStop) {
  Recorder x;
  Engine e(OneNode(2), x);
  ASSERT_TRUE(e.Submit(Sub(Whole("low", 2), 1, 1)).ok());
  EXPECT_EQ(e.Step(1), 1u);
  EXPECT_THAT(x.started, ElementsAre("low"));
  ASSERT_TRUE(e.Submit(Sub(Whole("high", 2), 2, 2, /*priority=*/5)).ok());
  EXPECT_EQ(e.Step(2), 0u);
  ASSERT_EQ(x.stops.size(), 1u);
  EXPECT_THAT(x.stops[0].victims, ElementsAre("low"));
  EXPECT_EQ(x.stops[0].for_id, "high");
  // Until the victim has stopped, nothing more is asked and nothing starts.
  EXPECT_EQ(e.Step(3), 0u);
  EXPECT_EQ(x.stops.size(), 1u);
  // Stopped: a preempted request goes back to the queue by default, under its id.
  EXPECT_TRUE(e.Stopped("low", StopCause::kPreempted));
  EXPECT_TRUE(e.cycle().Queued("low"));
  EXPECT_EQ(e.Step(4), 1u);
  EXPECT_THAT(x.started, ElementsAre("low", "high"));
}

// A driver that resizes running work: what it was asked, by request.
struct Resizer : Recorder {
  std::vector<std::pair<std::string, std::vector<int>>> resizes;
  bool Resizes() const override { return true; }
  void Resize(const std::string& id, const Allocation& holds, double) override {
    EXPECT_EQ(holds.request.gpus, static_cast<int>(holds.gpus.size()));
    resizes.emplace_back(id, holds.gpus);
  }
};

core::Request Elastic(const std::string& id, int min, int max) {
  core::Request r = Whole(id, min);
  r.gpus_max = max;
  r.resizable = true;
  return r;
}

// No GPU is held twice: every GPU of the node is in one allocation at most.
void ExpectNoGpuHeldTwice(const Engine& e) {
  std::map<std::pair<NodeId, int>, std::string> holder;
  for (const auto& [id, a] : e.scheduler().state().allocations()) {
    for (int g : a.gpus) {
      auto [it, fresh] = holder.emplace(std::make_pair(a.node, g), id);
      EXPECT_TRUE(fresh) << "GPU " << g << " held by " << it->second << " and " << id;
    }
  }
}

TEST(Engine, AnElasticRequestGrowsOntoIdleGpusAndGivesThemBackToAQueuedOne) {
  Resizer x;
  Engine e(OneNode(4), x);
  ASSERT_TRUE(e.Submit(Sub(Whole("busy", 2), 1, 1)).ok());
  ASSERT_TRUE(e.Submit(Sub(Elastic("el", 1, 4), 1, 2)).ok());
  // Started on its minimum, it grows at once onto the one GPU nobody queued wants.
  EXPECT_EQ(e.Step(1), 2u);
  ASSERT_EQ(x.resizes.size(), 1u);
  EXPECT_EQ(x.resizes[0].first, "el");
  EXPECT_EQ(x.resizes[0].second.size(), 2u);
  EXPECT_EQ(e.Holding("el")->gpus, x.resizes[0].second);
  ExpectNoGpuHeldTwice(e);
  // Two more GPUs free: it takes them, up to its maximum.
  EXPECT_TRUE(e.Ended("busy"));
  e.Step(2);
  ASSERT_EQ(x.resizes.size(), 2u);
  EXPECT_THAT(x.resizes[1].second, ElementsAre(0, 1, 2, 3));
  // A request of no higher priority arrives: the grown GPUs are the victims - the elastic request
  // is asked to give back the two it needs, nobody is stopped. It keeps its own and one more.
  ASSERT_TRUE(e.Submit(Sub(Whole("next", 2), 3, 3)).ok());
  EXPECT_EQ(e.Step(3), 0u);
  EXPECT_TRUE(x.stops.empty());
  ASSERT_EQ(x.resizes.size(), 3u);
  EXPECT_EQ(x.resizes[2].second.size(), 2u);
  const std::vector<int> kept = x.resizes[2].second;
  EXPECT_THAT(kept, Contains(e.scheduler().state().Find("el")->gpus[0])) << "its own GPU";
  EXPECT_TRUE(e.Shrinking("el"));
  // Until it says it shrank, its GPUs stay its own: nothing starts, nothing is asked twice.
  EXPECT_EQ(e.Step(4), 0u);
  EXPECT_EQ(x.resizes.size(), 3u);
  EXPECT_EQ(e.Holding("el")->gpus.size(), 4u);
  ExpectNoGpuHeldTwice(e);
  EXPECT_TRUE(e.Resized("el"));
  EXPECT_FALSE(e.Resized("el"));
  EXPECT_EQ(e.Holding("el")->gpus, kept);
  // The queued request starts on what it gave back; nothing is left to grow onto, so no second
  // resize (shrunk to its minimum, it would grow again onto the GPU left idle).
  EXPECT_EQ(e.Step(5), 1u);
  EXPECT_THAT(x.started, ElementsAre("busy", "el", "next"));
  EXPECT_EQ(x.resizes.size(), 3u);
  EXPECT_EQ(e.Holding("el")->gpus, kept);
  ExpectNoGpuHeldTwice(e);
  // When it ends, the elastic request grows back onto what it gave.
  EXPECT_TRUE(e.Ended("next"));
  e.Step(6);
  ASSERT_EQ(x.resizes.size(), 4u);
  EXPECT_THAT(x.resizes[3].second, ElementsAre(0, 1, 2, 3));
  // Its end frees what it grew onto too.
  EXPECT_TRUE(e.Ended("el"));
  EXPECT_TRUE(e.scheduler().state().allocations().empty());
}

// Two queued requests of one pass that each count on a GPU the elastic request grew onto: it is
// asked to give back both rooms before it restarts, and restarts once - not once for the first,
// then again when the second plans again.
TEST(Engine, TwoQueuedRequestsOfOnePassShrinkAnElasticRequestOnce) {
  Resizer x;
  Engine e(OneNode(4), x);
  ASSERT_TRUE(e.Submit(Sub(Elastic("el", 1, 4), 1, 1)).ok());
  e.Step(1);
  ASSERT_EQ(e.Holding("el")->gpus.size(), 4u);
  const size_t before = x.resizes.size();
  ASSERT_TRUE(e.Submit(Sub(Whole("a", 1), 2, 2)).ok());
  ASSERT_TRUE(e.Submit(Sub(Whole("b", 1), 2, 3)).ok());
  EXPECT_EQ(e.Step(2), 0u);
  EXPECT_TRUE(x.stops.empty());
  ASSERT_GT(x.resizes.size(), before);
  const std::vector<int> kept = x.resizes.back().second;
  EXPECT_EQ(kept.size(), 2u) << "its own GPU and one grown: each queued request takes one";
  EXPECT_THAT(kept, Contains(e.scheduler().state().Find("el")->gpus[0]));
  EXPECT_TRUE(e.Resized("el"));
  EXPECT_EQ(e.Holding("el")->gpus, kept);
  ExpectNoGpuHeldTwice(e);
  // Both start on what it gave back; it is not asked to shrink again.
  const size_t asked = x.resizes.size();
  EXPECT_EQ(e.Step(3), 2u);
  EXPECT_EQ(e.Step(4), 0u);
  EXPECT_EQ(x.resizes.size(), asked);
  EXPECT_FALSE(e.Shrinking("el"));
  EXPECT_EQ(e.Holding("el")->gpus, kept);
  ExpectNoGpuHeldTwice(e);
}

// Placed for its minimum, a packing policy would put an elastic request where it cannot grow; with
// nothing queued it starts on the largest size that fits anywhere, the rest of it grown.
TEST(Engine, AnElasticRequestStartsOnTheLargestSizeThatFitsNow) {
  Resizer x;
  auto s = std::make_unique<Scheduler>();
  ASSERT_TRUE(s->AddNode(Node("small", 2)).ok());
  ASSERT_TRUE(s->AddNode(Node("large", 4)).ok());
  Engine e(std::move(s), x);
  ASSERT_TRUE(e.Submit(Sub(Whole("one", 1), 1, 1)).ok());
  e.Step(1);
  ASSERT_TRUE(e.Submit(Sub(Elastic("el", 1, 4), 2, 2)).ok());
  e.Step(2);
  const Allocation holds = *e.Holding("el");
  EXPECT_EQ(e.scheduler().state().node_name(holds.node), "large");
  EXPECT_EQ(holds.gpus.size(), 4u);
  // The driver is told its own allocation at the start, then all it holds.
  ASSERT_EQ(x.allocations.size(), 2u);
  EXPECT_EQ(x.allocations[1].gpus.size(), 1u);
  EXPECT_EQ(x.allocations[1].node, holds.node);
  ASSERT_EQ(x.resizes.size(), 1u);
  EXPECT_EQ(x.resizes[0].second, holds.gpus);
  ExpectNoGpuHeldTwice(e);
}

TEST(Engine, AHigherPriorityArrivalShrinksAnElasticRequestBeforeItStopsAnyoneWhole) {
  Resizer x;
  Engine e(OneNode(4), x);
  ASSERT_TRUE(e.Submit(Sub(Whole("low", 1), 1, 1)).ok());
  ASSERT_TRUE(e.Submit(Sub(Elastic("el", 1, 4), 1, 2)).ok());
  e.Step(1);
  ASSERT_EQ(e.Holding("el")->gpus.size(), 3u);
  ASSERT_TRUE(e.Submit(Sub(Whole("high", 2), 2, 3, /*priority=*/5)).ok());
  EXPECT_EQ(e.Step(2), 0u);
  EXPECT_TRUE(x.stops.empty()) << x.stops[0].victims[0];
  EXPECT_TRUE(e.Shrinking("el"));
  EXPECT_TRUE(e.Resized("el"));
  EXPECT_EQ(e.Step(3), 1u);
  EXPECT_THAT(x.started, ElementsAre("low", "el", "high"));
  ExpectNoGpuHeldTwice(e);
  // Needing more than the grown GPUs, a later arrival stops work whole, and a stopped elastic
  // request frees all it held.
  ASSERT_TRUE(e.Submit(Sub(Whole("top", 4), 3, 4, /*priority=*/9)).ok());
  e.Step(4);
  ASSERT_EQ(x.stops.size(), 1u);
  EXPECT_THAT(x.stops[0].victims, ::testing::UnorderedElementsAre("low", "el", "high"));
  for (const char* id : {"low", "el", "high"}) e.Stopped(id, StopCause::kPreempted);
  EXPECT_EQ(e.Step(5), 1u);
  EXPECT_EQ(x.started.back(), "top");
  ExpectNoGpuHeldTwice(e);
}

TEST(Engine, AStoppedElasticRequestFreesWhatItGrewOntoWithoutAShrink) {
  Resizer x;
  Engine e(OneNode(4), x);
  ASSERT_TRUE(e.Submit(Sub(Elastic("el", 1, 4), 1, 1)).ok());
  e.Step(1);
  ASSERT_EQ(e.Holding("el")->gpus.size(), 4u);
  // All four wanted at a higher priority: the request and its grown GPUs are the victims; it is
  // stopped, not asked to shrink first.
  ASSERT_TRUE(e.Submit(Sub(Whole("big", 4), 2, 2, /*priority=*/5)).ok());
  e.Step(2);
  ASSERT_EQ(x.stops.size(), 1u);
  EXPECT_THAT(x.stops[0].victims, ElementsAre("el"));
  EXPECT_FALSE(e.Shrinking("el"));
  EXPECT_EQ(x.resizes.size(), 1u);
  EXPECT_TRUE(e.Stopped("el", StopCause::kPreempted));
  EXPECT_EQ(e.Step(3), 1u);
  EXPECT_EQ(x.started.back(), "big");
  ExpectNoGpuHeldTwice(e);
}

// Random arrivals, ends, acknowledged shrinks and stops with elastic requests among fixed ones, on
// three nodes: after every step no GPU is held twice, every elastic request holds between its
// minimum and its maximum, grown GPUs belong to a running elastic request, and nothing grew in a
// step that left a request wanting a GPU queued.
TEST(Engine, ElasticGrowthAndShrinkKeepTheirInvariantsUnderRandomTraffic) {
  struct Driver : Resizer {
    std::map<std::string, size_t> held;  // what each running request holds, as last told
    bool grew = false;
    void Start(const std::string& id, const Allocation& a, double now) override {
      Resizer::Start(id, a, now);
      held[id] = a.gpus.size();
    }
    void Resize(const std::string& id, const Allocation& holds, double now) override {
      Resizer::Resize(id, holds, now);
      grew = grew || holds.gpus.size() > held[id];
      held[id] = holds.gpus.size();
    }
  };
  const unsigned seed = 20261130;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Driver x;
  auto s = std::make_unique<Scheduler>();
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(s->AddNode(Node(n, 4)).ok());
  Engine e(std::move(s), x);
  std::map<std::string, core::Request> asked, queued, running;
  std::set<std::string> stopping;
  size_t shrinks_done = 0, grown_ever = 0;
  for (int step = 1; step <= 1500; ++step) {
    const int action = static_cast<int>(rng() % 10);
    if (action < 4) {
      const std::string id = "r" + std::to_string(step);
      core::Request r = rng() % 3 == 0 ? Elastic(id, 1 + static_cast<int>(rng() % 2), 4)
                                       : Whole(id, 1 + static_cast<int>(rng() % 3));
      ASSERT_TRUE(e.Submit(Sub(r, step, step, static_cast<int>(rng() % 3))).ok());
      asked[id] = queued[id] = r;
    } else if (action < 7 && !running.empty()) {
      auto it = std::next(running.begin(), static_cast<long>(rng() % running.size()));
      if (!stopping.contains(it->first)) {
        EXPECT_TRUE(e.Ended(it->first));
        x.held.erase(it->first);
        running.erase(it);
      }
    } else if (action < 9) {
      for (const auto& [id, r] : running) {
        if (e.Shrinking(id) && rng() % 2 == 0) {
          EXPECT_TRUE(e.Resized(id));
          ++shrinks_done;
        }
      }
    } else if (!stopping.empty()) {
      const std::string id = *stopping.begin();
      stopping.erase(stopping.begin());
      x.held.erase(id);
      running.erase(id);
      if (e.Stopped(id, StopCause::kPreempted)) queued[id] = asked[id];  // requeued as it was
    }
    x.grew = false;
    const size_t started_before = x.started.size();
    e.Step(step);
    for (size_t i = started_before; i < x.started.size(); ++i) {
      running[x.started[i]] = queued[x.started[i]];
      queued.erase(x.started[i]);
    }
    for (const auto& stop : x.stops)
      for (const std::string& v : stop.victims) stopping.insert(v);
    x.stops.clear();
    ExpectNoGpuHeldTwice(e);
    for (const auto& [id, a] : e.scheduler().state().allocations()) {
      if (!a.reclaimable) continue;
      ++grown_ever;
      EXPECT_EQ(id, Engine::GrownId(id.substr(0, id.size() - 6)));
      EXPECT_TRUE(running.contains(id.substr(0, id.size() - 6))) << id << " outlived its request";
    }
    for (const auto& [id, r] : running) {
      if (!r.elastic()) continue;
      const size_t n = e.Holding(id)->gpus.size();
      EXPECT_GE(n, static_cast<size_t>(r.gpus)) << id;
      EXPECT_LE(n, static_cast<size_t>(r.gpus_max)) << id;
    }
    bool wants = false;
    for (const auto& [id, r] : queued) wants = wants || (e.cycle().Queued(id) && r.wants_gpu());
    EXPECT_FALSE(x.grew && wants) << "grew at step " << step << " with a GPU request queued";
    if (::testing::Test::HasFailure()) break;
  }
  // The traffic exercised what it is about.
  EXPECT_GT(grown_ever, 0u);
  EXPECT_GT(shrinks_done, 0u);
}

TEST(Engine, AnElasticRequestGrowsWithinItsOwnersQuotaAndOnlyWithADriverThatResizes) {
  Resizer x;
  auto s = OneNode(8);
  s->quotas().Set("team", OwnerQuota{.limit = {3, -1, -1}});
  Engine e(std::move(s), x);
  core::Request r = Elastic("el", 1, 8);
  r.owner = "team";
  ASSERT_TRUE(e.Submit(Sub(r, 1, 1)).ok());
  e.Step(1);
  // Its owner may hold 3 GPUs: it grows by the 2 its quota has left, not onto all 8.
  EXPECT_EQ(e.Holding("el")->gpus.size(), 3u);
  EXPECT_EQ(e.scheduler().quotas().Used("team").gpus, 3);
  // A driver that does not resize: it starts on what its quota allows, for good.
  r.id = "el2";
  Recorder plain;
  auto capped = OneNode(8);
  capped->quotas().Set("team", OwnerQuota{.limit = {3, -1, -1}});
  Engine fixed(std::move(capped), plain);
  ASSERT_TRUE(fixed.Submit(Sub(r, 1, 1)).ok());
  fixed.Step(1);
  EXPECT_EQ(fixed.Holding("el2")->gpus.size(), 3u);
  EXPECT_EQ(fixed.scheduler().quotas().Used("team").gpus, 3);
}

TEST(Engine, ADriverThatDoesNotResizeStartsAnElasticRequestLargerForGood) {
  Recorder x;
  auto s = OneNode(8);
  s->quotas().Set("capped", OwnerQuota{.limit = {0, -1, -1}});
  Engine e(std::move(s), x);
  ASSERT_TRUE(e.Submit(Sub(Whole("busy", 4), 1, 1)).ok());
  e.Step(1);
  // Nothing queued wants a GPU: it starts on the 4 free GPUs, all its own (nothing reclaimable,
  // no grown part), and its request says 4.
  ASSERT_TRUE(e.Submit(Sub(Elastic("el", 2, 8), 2, 2)).ok());
  e.Step(2);
  ASSERT_EQ(x.started, (std::vector<std::string>{"busy", "el"}));
  EXPECT_EQ(x.allocations[1].gpus.size(), 4u);
  EXPECT_EQ(x.allocations[1].request.gpus, 4);
  const Allocation* own = e.scheduler().state().Find("el");
  ASSERT_NE(own, nullptr);
  EXPECT_FALSE(own->reclaimable);
  EXPECT_EQ(own->gpus.size(), 4u);
  EXPECT_EQ(e.scheduler().state().Find(Engine::GrownId("el")), nullptr);
  // GPUs freed later are not grown onto: it keeps the size it started with.
  EXPECT_TRUE(e.Ended("busy"));
  e.Step(3);
  EXPECT_EQ(e.Holding("el")->gpus.size(), 4u);
  EXPECT_TRUE(e.Ended("el"));
  // With a request queued that wants a GPU (here waiting for its quota), an elastic one starts on
  // its minimum: what it took past that would be kept from the queue to its end.
  core::Request waits = Whole("waits", 1);
  waits.owner = "capped";
  ASSERT_TRUE(e.Submit(Sub(waits, 4, 3)).ok());
  ASSERT_TRUE(e.Submit(Sub(Elastic("el2", 2, 8), 4, 4)).ok());
  e.Step(4);
  EXPECT_TRUE(e.cycle().Queued("waits"));
  ASSERT_EQ(x.started.back(), "el2");
  EXPECT_EQ(x.allocations.back().gpus.size(), 2u);
  // Stopped, it goes back to the queue as it was asked: 2 to 8 GPUs.
  EXPECT_TRUE(e.Stopped("el2", StopCause::kPreempted));
  EXPECT_TRUE(e.Cancel("waits"));
  e.Step(5);
  ASSERT_EQ(x.started.back(), "el2");
  EXPECT_EQ(x.allocations.back().gpus.size(), 8u);
  ExpectNoGpuHeldTwice(e);
}

TEST(Engine, AnElasticRequestRestoredLargerHoldsWhatItsAllocationLists) {
  Recorder x;
  Engine e(OneNode(8), x);
  Allocation a;
  a.id = "el";
  a.node = 0;
  a.gpus = {0, 1, 2, 3, 4};
  a.milli_per_gpu = 1000;
  a.request = Elastic("el", 2, 6);
  ASSERT_TRUE(e.Restore(a).ok());
  EXPECT_EQ(e.scheduler().state().Find("el")->request.gpus, 5);
  EXPECT_EQ(e.Holding("el")->gpus.size(), 5u);
  // More than its maximum (or fewer than its minimum) is no allocation it could have had.
  a.id = "bad";
  a.request = Elastic("bad", 1, 2);
  a.gpus = {5, 6, 7};
  const absl::Status st = e.Restore(a);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("3 GPUs, outside its request's 1 to 2"));
  EXPECT_EQ(e.scheduler().state().Find("bad"), nullptr);
}

TEST(Engine, AResizedRequestRestoredGivesBackWhatItGrewOntoFirst) {
  Resizer x;
  Engine e(OneNode(4), x);
  Allocation a;
  a.id = "el";
  a.node = 0;
  a.gpus = {2, 0, 3};  // its own first, as its driver recorded it
  a.milli_per_gpu = 1000;
  a.request = Elastic("el", 1, 4);
  ASSERT_TRUE(e.Restore(a, Sub(a.request, 1, 1)).ok());
  // Its first GPU its own, the two it grew onto held as grown (reclaimable).
  EXPECT_EQ(e.scheduler().state().Find("el")->gpus, std::vector<int>{2});
  const Allocation* grown = e.scheduler().state().Find(Engine::GrownId("el"));
  ASSERT_NE(grown, nullptr);
  EXPECT_TRUE(grown->reclaimable);
  EXPECT_EQ(grown->gpus, (std::vector<int>{0, 3}));
  EXPECT_EQ(e.Holding("el")->gpus, (std::vector<int>{0, 2, 3}));
  // A request that wants two GPUs (one is free): it gives back one it grew onto instead of being
  // stopped, and keeps its own.
  core::Request two = Whole("two", 2);
  two.priority = 5;
  ASSERT_TRUE(e.Submit(Sub(two, 2, 2)).ok());
  e.Step(2);
  EXPECT_TRUE(x.stops.empty());
  EXPECT_TRUE(e.Shrinking("el"));
  ASSERT_FALSE(x.resizes.empty());
  EXPECT_EQ(x.resizes.back().first, "el");
  EXPECT_EQ(x.resizes.back().second.size(), 2u);
  EXPECT_THAT(x.resizes.back().second, Contains(2));
  EXPECT_TRUE(e.Resized("el"));
  e.Step(3);
  EXPECT_EQ(x.started.back(), "two");
  EXPECT_EQ(e.Holding("el")->gpus, x.resizes.back().second);
  ExpectNoGpuHeldTwice(e);
}

TEST(Engine, AnElasticRequestThatIsNotResizableStartsLargerForGoodBesideResizedOnes) {
  Resizer x;
  Engine e(OneNode(8), x);
  core::Request fixed = Elastic("fixed", 2, 4);
  fixed.resizable = false;
  ASSERT_TRUE(e.Submit(Sub(fixed, 1, 1)).ok());
  e.Step(1);
  // All 4 its own, never resized; the driver is told of no resize.
  EXPECT_EQ(e.scheduler().state().Find("fixed")->gpus.size(), 4u);
  EXPECT_EQ(e.scheduler().state().Find(Engine::GrownId("fixed")), nullptr);
  ASSERT_TRUE(e.Submit(Sub(Elastic("el", 1, 8), 2, 2)).ok());
  e.Step(2);
  // The resizable one grows onto the other 4 and is told so.
  EXPECT_EQ(e.Holding("el")->gpus.size(), 4u);
  ASSERT_EQ(x.resizes.size(), 1u);
  EXPECT_EQ(x.resizes[0].first, "el");
  // Kept at its size (it did not answer the resize): what it grew onto is free, and it is not
  // grown again.
  EXPECT_TRUE(e.FixSize("el"));
  EXPECT_FALSE(e.FixSize("fixed"));
  EXPECT_EQ(e.Holding("el")->gpus.size(), 1u);
  e.Step(3);
  EXPECT_EQ(e.Holding("el")->gpus.size(), 1u);
  EXPECT_EQ(x.resizes.size(), 1u);
  ExpectNoGpuHeldTwice(e);
}

TEST(Engine, RequeueRulesByCauseAndTheRequestsOwnWish) {
  Recorder x;
  Engine e(OneNode(4), x, {.requeue_preempted = true, .requeue_unhealthy = false});
  Submission keep = Sub(Whole("keep", 1), 1, 1);
  Submission never = Sub(Whole("never", 1), 1, 2);
  never.requeue = false;
  Submission sick = Sub(Whole("sick", 1), 1, 3);
  Submission sick_wants = Sub(Whole("sick-wants", 1), 1, 4);
  sick_wants.requeue = true;
  for (Submission* s : {&keep, &never, &sick, &sick_wants}) ASSERT_TRUE(e.Submit(*s).ok());
  EXPECT_EQ(e.Step(1), 4u);
  EXPECT_TRUE(e.Stopped("keep", StopCause::kPreempted));
  EXPECT_FALSE(e.Stopped("never", StopCause::kPreempted));
  EXPECT_FALSE(e.Stopped("sick", StopCause::kUnhealthy));
  EXPECT_TRUE(e.Stopped("sick-wants", StopCause::kUnhealthy));
  EXPECT_THAT(e.cycle().Order(), ElementsAre("keep", "sick-wants"));
  // Every stop gave its GPU back.
  EXPECT_EQ(e.scheduler().state().allocations().size(), 0u);
}

TEST(Engine, ADriverWithItsOwnAdmissionIsOnlyToldToRequeue) {
  Recorder x;
  Engine e(OneNode(1), x, {.requeue_through_driver = true});
  ASSERT_TRUE(e.Submit(Sub(Whole("j", 1), 1, 1)).ok());
  e.Step(1);
  EXPECT_TRUE(e.Stopped("j", StopCause::kPreempted));
  EXPECT_FALSE(e.cycle().Queued("j"));
  // The driver submits it again, as it was.
  ASSERT_TRUE(e.Submit(Sub(Whole("j", 1), 1, 1)).ok());
  EXPECT_EQ(e.Step(2), 1u);
}

TEST(Engine, AStepStartsAtMostItsLimitGpusFirstAndAGangWhole) {
  Recorder x;
  Engine e(OneNode(8), x, {.max_starts_per_step = 3});
  core::Request cpu = Whole("cpu", 0);
  ASSERT_TRUE(e.Submit(Sub(cpu, 1, 1)).ok());
  for (int i = 0; i < 2; ++i) {
    core::Request m = Whole("gang-" + std::to_string(i), 1);
    m.gang = "g";
    m.gang_size = 2;
    ASSERT_TRUE(e.Submit(Sub(m, 2, 2 + i)).ok());
  }
  ASSERT_TRUE(e.Submit(Sub(Whole("one", 1), 3, 5)).ok());
  ASSERT_TRUE(e.Submit(Sub(Whole("two", 1), 4, 6)).ok());
  // Five could start; three do: those with GPUs first, in queue order (the gang whole, then
  // "one"); the CPU-only one waits though it was queued first.
  EXPECT_EQ(e.Step(1), 3u);
  EXPECT_THAT(x.started, ElementsAre("gang-0", "gang-1", "one"));
  // The others gave their place back and say why.
  EXPECT_EQ(e.scheduler().state().Find("two"), nullptr);
  EXPECT_THAT(*e.cycle().Waiting("two"),
              HasSubstr("starting in the next pass: it fits now, but this pass already started 3"));
  EXPECT_THAT(*e.cycle().Waiting("cpu"),
              HasSubstr("starting in the next pass: it fits now, but this pass already started 3"));
  EXPECT_EQ(e.deferred(), 2u);
  EXPECT_EQ(e.Step(2), 2u);
  EXPECT_THAT(x.started, ElementsAre("gang-0", "gang-1", "one", "two", "cpu"));
}

TEST(Engine, AGangThatWouldOverrunTheLimitWaitsWholeForTheNextStep) {
  Recorder x;
  Engine e(OneNode(8), x, {.max_starts_per_step = 2});
  ASSERT_TRUE(e.Submit(Sub(Whole("first", 1), 1, 1)).ok());
  for (int i = 0; i < 2; ++i) {
    core::Request m = Whole("gang-" + std::to_string(i), 1);
    m.gang = "g";
    m.gang_size = 2;
    ASSERT_TRUE(e.Submit(Sub(m, 2, 2 + i)).ok());
  }
  ASSERT_TRUE(e.Submit(Sub(Whole("last", 1), 3, 4)).ok());
  EXPECT_EQ(e.Step(1), 2u);
  EXPECT_THAT(x.started, ElementsAre("first", "last"));
  EXPECT_EQ(e.Step(2), 2u);
  EXPECT_THAT(x.started, ElementsAre("first", "last", "gang-0", "gang-1"));
}

TEST(Engine, AGangLargerThanTheLimitStartsAloneInAStep) {
  Recorder x;
  Engine e(OneNode(8), x, {.max_starts_per_step = 2});
  for (int i = 0; i < 4; ++i) {
    core::Request m = Whole("gang-" + std::to_string(i), 1);
    m.gang = "g";
    m.gang_size = 4;
    ASSERT_TRUE(e.Submit(Sub(m, 1, i)).ok());
  }
  ASSERT_TRUE(e.Submit(Sub(Whole("after", 1), 2, 9)).ok());
  EXPECT_EQ(e.Step(1), 4u);
  EXPECT_THAT(x.started, ElementsAre("gang-0", "gang-1", "gang-2", "gang-3"));
}

TEST(Engine, ExpectsWhatHistorySaysAndQueuesAgainWithAFreshPrediction) {
  Recorder x;
  Engine e(OneNode(1), x, {.utilization_ceiling_pct = 90});
  RunKind kind{.user = "alice", .name = "train", .command = {}, .shape = "30%"};
  // No history: the max runtime bounds an unknown duration; a request's own figure stands.
  core::Request r = Share("r1", 300);
  RunKind bounded = kind;
  bounded.max_runtime_s = 600;
  e.Expect(r, bounded);
  EXPECT_EQ(r.expected_duration_s, 600);
  core::Request known = Share("r2", 300);
  known.expected_duration_s = 42;
  e.Expect(known, bounded);
  EXPECT_EQ(known.expected_duration_s, 42);
  // With runs: their p75 (nearest rank) replaces it, and a share's utilization counts against the
  // ceiling.
  for (double s : {100.0, 200.0, 300.0, 400.0}) e.history().Add(kind, s, 50.0);
  e.Expect(known, kind);
  EXPECT_EQ(known.expected_duration_s, 300);
  EXPECT_EQ(known.expected_util_pct, 50);
  EXPECT_EQ(known.util_ceiling_pct, 90);
  // A whole-GPU request has no utilization to share.
  core::Request whole = Whole("w", 1);
  e.Expect(whole, kind);
  EXPECT_EQ(whole.expected_util_pct, 0);

  Submission s = Sub(Share("job", 300), 1, 1);
  s.kind = kind;
  ASSERT_TRUE(e.Submit(s).ok());
  e.Step(1);
  ASSERT_EQ(x.allocations.size(), 1u);
  EXPECT_EQ(x.allocations[0].request.expected_duration_s, 300);
  // History grows while it runs; requeued, it is predicted afresh from the request as submitted.
  for (int i = 0; i < 10; ++i) e.history().Add(kind, 1000, 50.0);
  EXPECT_TRUE(e.Stopped("job", StopCause::kPreempted));
  e.Step(2);
  ASSERT_EQ(x.allocations.size(), 2u);
  EXPECT_EQ(x.allocations[1].request.expected_duration_s, 1000);
}

TEST(Engine, ARemovedNodeReleasesWhatRanThereAndAReadoptedRunCanBeRequeued) {
  Recorder x;
  auto s = std::make_unique<Scheduler>();
  ASSERT_TRUE(s->AddNode(Node("a", 1)).ok());
  ASSERT_TRUE(s->AddNode(Node("b", 1)).ok());
  Engine e(std::move(s), x);
  ASSERT_TRUE(e.Submit(Sub(Whole("x", 1), 1, 1)).ok());
  ASSERT_TRUE(e.Submit(Sub(Whole("y", 1), 1, 2)).ok());
  EXPECT_EQ(e.Step(1), 2u);
  const NodeId on = e.scheduler().state().Find("x")->node;
  auto released = e.RemoveNode(on);
  ASSERT_TRUE(released.ok());
  ASSERT_EQ(released->size(), 1u);
  EXPECT_EQ((*released)[0].id, "x");
  EXPECT_FALSE(e.Ended("x")) << "its allocation went with the node";
  EXPECT_TRUE(e.Ended("y"));

  // Restored with its submission (a restarted server adopting a running job): the rules apply.
  Allocation a;
  a.id = "z";
  a.node = e.scheduler().state().FindNode(on == 0 ? "b" : "a");
  a.gpus = {0};
  a.request = Whole("z", 1);
  Submission z = Sub(Whole("z", 1), 0, 3);
  z.requeue = false;
  ASSERT_TRUE(e.Restore(a, z).ok());
  EXPECT_FALSE(e.Stopped("z", StopCause::kPreempted));
  EXPECT_FALSE(e.cycle().Queued("z"));
  EXPECT_THAT(e.scheduler().state().allocations(), ::testing::IsEmpty());
}

TEST(Engine, CancelTakesARequestOutOfTheQueue) {
  Recorder x;
  Engine e(OneNode(1), x);
  ASSERT_TRUE(e.Submit(Sub(Whole("a", 1), 1, 1)).ok());
  EXPECT_FALSE(e.Submit(Sub(Whole("a", 1), 1, 1)).ok()) << "an id queued twice";
  EXPECT_TRUE(e.Cancel("a"));
  EXPECT_FALSE(e.Cancel("a"));
  EXPECT_EQ(e.Step(1), 0u);
  EXPECT_THAT(x.started, ::testing::IsEmpty());
}

// A seeded stream on one 8-GPU node, run with `steps` Steps at every event (as the extender steps
// at every filter): the starts, in order, with their times and GPUs.
std::vector<std::string> RunStream(uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  struct Job {
    double submit, duration;
    core::Request r;
  };
  std::vector<Job> jobs;
  double t = 0;
  for (int i = 0; i < 60; ++i) {
    t += pick(0, 5);
    core::Request r = pick(0, 3) == 0 ? Share("j" + std::to_string(i), pick(1, 6) * 100)
                                      : Whole("j" + std::to_string(i), 1 << pick(0, 3));
    r.priority = pick(0, 2);
    const double duration = pick(5, 60);
    r.expected_duration_s = duration;
    jobs.push_back({t, duration, r});
  }
  // What runs, when it ends (naturally, or kStop after it was asked to stop).
  constexpr double kStop = 2;
  struct Exec : Executor {
    std::map<std::string, double> ends;
    std::set<std::string> stopping;
    std::map<std::string, double> duration;
    std::vector<std::string> log;
    void Start(const std::string& id, const Allocation& a, double now) override {
      ends[id] = now + duration[id];
      std::string g;
      for (int x : a.gpus) g += std::to_string(x) + ",";
      log.push_back(id + "@" + std::to_string(now) + "[" + g + "]");
    }
    void Stop(const std::vector<std::string>& victims, const std::string&, const std::string&,
              double now) override {
      for (const std::string& v : victims) {
        if (!ends.contains(v) || stopping.contains(v)) continue;
        stopping.insert(v);
        ends[v] = std::min(ends[v], now + kStop);
      }
    }
  } x;
  for (const Job& j : jobs) x.duration[j.r.id] = j.duration;
  Engine e(OneNode(8), x, {.cycle = {.reservations = 4}});
  size_t next = 0;
  while (next < jobs.size() || !x.ends.empty()) {
    double now = next < jobs.size() ? jobs[next].submit : 1e18;
    for (const auto& [id, end] : x.ends) now = std::min(now, end);
    for (auto it = x.ends.begin(); it != x.ends.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      if (x.stopping.erase(it->first)) {
        e.Stopped(it->first, StopCause::kPreempted);  // queued again
      } else {
        e.Ended(it->first);
      }
      it = x.ends.erase(it);
    }
    for (; next < jobs.size() && jobs[next].submit <= now; ++next)
      EXPECT_TRUE(e.Submit(Sub(jobs[next].r, jobs[next].submit, next, jobs[next].r.priority)).ok());
    for (int k = 0; k < steps; ++k) e.Step(now);
  }
  return x.log;
}

TEST(Engine, SteppingAgainAtTheSameInstantChangesNothing) {
  // The extender steps at every filter kube-scheduler sends, the server once per turn, the
  // replay once per event: their decisions must not depend on how often they step.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<std::string> once = RunStream(seed, 1);
    EXPECT_GT(once.size(), 60u) << "preempted jobs start again";
    EXPECT_EQ(RunStream(seed, 3), once) << "seed " << seed;
  }
}

}  // namespace
}  // namespace tessera::sched
