#include "tessera/server/views.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace tessera::server {
namespace {

MachineView WithActive(std::vector<int64_t> ids, bool starting) {
  MachineView v;
  v.gpus.resize(1);
  for (int64_t id : ids) {
    v.active[id] = ActiveJob{.starting = starting, .owner = "alice", .gpus = {0}, .pid = 100};
    v.gpus[0].jobs.push_back(id);
  }
  v.running = starting ? 0 : ids.size();
  return v;
}

TEST(Views, BeforeThePublicationReadersSeeAnEmptyMachine) {
  Views views;
  EXPECT_EQ(views.machine()->version, 0u);
  EXPECT_TRUE(views.machine()->gpus.empty());
  const Views::Lookup l = views.Find(1);
  EXPECT_FALSE(l.queued);
  EXPECT_EQ(l.active, nullptr);
}

TEST(Views, QueueChangesApplyInTheOrderTheyWereMade) {
  Views views;
  // Job 1 entered, was taken for its start that failed to be recorded, and entered again; job 2
  // entered and was cancelled; job 3 entered.
  views.Publish(MachineView{},
                {{1, true}, {2, true}, {1, false}, {1, true}, {2, false}, {3, true}});
  EXPECT_TRUE(views.Find(1).queued);
  EXPECT_FALSE(views.Find(2).queued);
  EXPECT_TRUE(views.Find(3).queued);
  views.Publish(MachineView{}, {{3, false}});
  EXPECT_FALSE(views.Find(3).queued);
  EXPECT_EQ(views.machine()->version, 2u);
}

// A queued job's facts come with the publication that queues it and stay until new ones come;
// facts for a job no longer queued are dropped; the capped users stay until replaced.
TEST(Views, QueuedFactsAreKeptPerJobUntilReplacedAndDroppedWithTheJob) {
  Views views;
  auto facts = [](std::string why, uint32_t uid = 1000) {
    return QueuedView{.owner = "alice", .facts = {.uid = uid, .cappable = true, .waiting = why}};
  };
  auto capped = std::make_shared<const CappedUsers>(
      CappedUsers{.pass = 4, .users = {{1000, "alice is at her cap"}}});
  views.Publish(MachineView{}, {{1, true}, {2, true}, {3, true}, {3, false}},
                {{1, facts("no GPU free")}, {2, facts("held", 2000)}, {3, facts("gone")}}, capped);
  Views::Lookup l = views.Find(1);
  ASSERT_TRUE(l.queued);
  EXPECT_EQ(l.queued->facts.waiting, "no GPU free");
  EXPECT_EQ(WaitingText(l.queued->facts, *l.capped), "alice is at her cap")
      << "not examined in the capped pass: her cap is why";
  EXPECT_EQ(WaitingText(views.Find(2).queued->facts, *views.Find(2).capped), "held")
      << "another user";
  EXPECT_FALSE(views.Find(3).queued) << "cancelled in the same publication";
  // A publication without facts or capped users keeps those it had.
  views.Publish(MachineView{}, {});
  EXPECT_EQ(views.Find(1).queued->facts.waiting, "no GPU free");
  EXPECT_EQ(views.Find(1).capped, capped);
  views.Publish(MachineView{}, {{1, false}}, {{1, facts("late")}, {2, facts("released")}},
                std::make_shared<const CappedUsers>(CappedUsers{.pass = 5}));
  EXPECT_FALSE(views.Find(1).queued) << "facts do not bring back a job that left";
  l = views.Find(2);
  EXPECT_EQ(WaitingText(l.queued->facts, *l.capped), "released");
}

TEST(Views, APublishedViewStaysWholeForItsReaderWhileNewOnesArePublished) {
  Views views;
  views.Publish(WithActive({7}, false), {});
  const std::shared_ptr<const MachineView> held = views.machine();
  const Views::Lookup l = views.Find(7);
  views.Publish(WithActive({}, false), {});
  ASSERT_NE(l.active, nullptr);  // into the view it was read from, which lives as long as `l`
  EXPECT_EQ(l.active->pid, 100);
  EXPECT_EQ(held->gpus[0].jobs, std::vector<int64_t>{7});
  EXPECT_EQ(views.Find(7).active, nullptr);
}

// A job goes queued -> starting -> running -> ended, one publication each (the queue's change with
// the view that shows its start), while readers look at it: each reader sees those states in that
// order, never a job that is neither queued nor started before it ended, and versions that only
// grow.
TEST(Views, AReaderSeesAJobQueuedOrStartedNeverNeitherUntilItEnds) {
  Views views;
  constexpr int kJobs = 1000;
  std::atomic<int64_t> ended{0};   // jobs up to this one have ended
  std::atomic<int64_t> ending{0};  // set before the publication of this job's end
  std::atomic<bool> done{false};
  std::atomic<int> violations{0}, looks{0};
  auto reader = [&] {
    uint64_t last_version = 0;
    while (!done.load()) {
      const int64_t before = ended.load();
      const int64_t id = before + 1;  // the job being moved now (or the next)
      const Views::Lookup l = views.Find(id);
      if (l.view->version < last_version) ++violations;
      last_version = l.view->version;
      // Job `id` entered the queue before `ended` reached `before`: from then on it is queued,
      // started, or ended (its end's publication came after `ending` was set).
      if (l.queued && l.active != nullptr) ++violations;
      if (!l.queued && l.active == nullptr && ending.load() < id) ++violations;
      ++looks;
    }
  };
  views.Publish(MachineView{}, {{1, true}});
  std::thread r1(reader), r2(reader);
  for (int64_t id = 1; id <= kJobs; ++id) {
    views.Publish(WithActive({id}, true), {{id, false}});
    views.Publish(WithActive({id}, false), {});
    // It ends as the next one enters the queue, in one publication.
    ending.store(id);
    views.Publish(WithActive({}, false), {{id + 1, true}});
    ended.store(id);
    // The readers look at least once per job (they may not have been scheduled yet at all).
    for (const int seen = looks.load(); looks.load() == seen;) std::this_thread::yield();
  }
  done = true;
  r1.join();
  r2.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GE(looks.load(), kJobs);
  EXPECT_EQ(views.machine()->version, 3u * kJobs + 1);
}

}  // namespace
}  // namespace tessera::server
