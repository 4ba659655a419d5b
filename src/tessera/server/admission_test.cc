// The waiting room alone, against a World of the test's own: what enters the cycle's queue at a
// pass and why the others wait, what each user is counted for, and changes that keep jobs out.
#include "tessera/server/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace tessera::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

// The rest of the server, as the test sets it: dependencies' outcomes, what runs, a cycle's queue
// that can refuse a job, and how often each is asked.
struct FakeWorld final : Admission::World {
  std::map<std::string, DependencyState> outcomes;  // by DependencyText; absent: pending
  std::map<uint32_t, size_t> running_by_user;
  std::map<int64_t, int> running_by_array;
  std::set<int64_t> cycle, refuse;
  std::map<std::string, int> outcome_asks;
  std::string cycle_says = "no GPU free";

  DependencyState Outcome(const Dependency& d) override {
    ++outcome_asks[DependencyText(d)];
    auto it = outcomes.find(DependencyText(d));
    return it == outcomes.end() ? DependencyState{} : it->second;
  }
  void CountActive(std::map<uint32_t, size_t>& by_user, std::map<int64_t, int>& by_array) override {
    for (const auto& [uid, n] : running_by_user) by_user[uid] += n;
    for (const auto& [array, n] : running_by_array) by_array[array] += n;
  }
  absl::Status EnterCycle(const QueuedJob& q) override {
    if (refuse.contains(q.id)) return absl::InvalidArgumentError("no such GPU model");
    EXPECT_TRUE(cycle.insert(q.id).second) << "job " << q.id << " entered twice";
    return absl::OkStatus();
  }
  void LeaveCycle(int64_t id) override { EXPECT_EQ(cycle.erase(id), 1u) << id; }
  const std::string* CycleWaiting(int64_t id) const override {
    return cycle.contains(id) ? &cycle_says : nullptr;
  }
};

std::shared_ptr<const JobSpec> Spec(std::vector<std::string> after = {}, std::string array = "") {
  JobSpec s;
  s.command = {"true"};
  for (const std::string& a : after) s.after.push_back(*ParseDependency(a));
  s.array = std::move(array);
  return std::make_shared<const JobSpec>(std::move(s));
}

QueuedJob Job(int64_t id, std::shared_ptr<const JobSpec> spec, uint32_t uid = 1000,
              size_t bytes = 100) {
  QueuedJob q;
  q.id = id;
  q.uid = uid;
  q.owner = "user" + std::to_string(uid);
  q.throttle = ArrayThrottle(spec->array);
  q.spec = std::move(spec);
  q.spec_bytes = bytes;
  return q;
}

QueuedJob Task(int64_t id, int64_t array, std::shared_ptr<const JobSpec> spec) {
  QueuedJob q = Job(id, std::move(spec));
  q.array_id = array, q.array_index = static_cast<int>(id - array);
  return q;
}

TEST(Admission, HeldAndRefusedJobsStayOutAndSayWhy) {
  Admission a({});
  FakeWorld w;
  a.Add(Job(1, Spec()));
  QueuedJob held = Job(2, Spec());
  held.held = true;
  a.Add(held);
  a.Add(Job(3, Spec()));
  w.refuse = {3};
  EXPECT_EQ(a.Waiting(1, w), "not yet considered");
  EXPECT_THAT(a.Admit(w), IsEmpty());
  EXPECT_THAT(w.cycle, ElementsAre(1));
  EXPECT_EQ(a.Waiting(1, w), "no GPU free") << "in the cycle: the cycle's word";
  EXPECT_EQ(a.Waiting(2, w), "held (tessera release 2)");
  EXPECT_EQ(a.Waiting(3, w), "no such GPU model");
  EXPECT_EQ(a.Waiting(4, w), "") << "not queued";

  // Released: in at the next pass; the refused one is tried again.
  a.SetHeld(2, false, "released; not yet considered");
  EXPECT_EQ(a.Waiting(2, w), "released; not yet considered");
  w.refuse.clear();
  a.Admit(w);
  EXPECT_THAT(w.cycle, ElementsAre(1, 2, 3));
}

TEST(Admission, DependenciesParkJobsUntilSettledAndEndThoseNeverMet) {
  Admission a({});
  FakeWorld w;
  // An array's 50 tasks after job 1: one look at job 1 a pass, not one per task.
  auto after1 = Spec({"ok:1"});
  for (int64_t id = 10; id < 60; ++id) a.Add(Task(id, 10, after1));
  a.Add(Job(5, Spec({"ok:1", "any:2"})));
  a.Add(Job(6, Spec({"ok:99"})));
  w.outcomes["ok:99"] = {DependencyState::kMissing, "job 99 does not exist"};
  auto never = a.Admit(w);
  EXPECT_THAT(never, ElementsAre(Pair(6, "job 99 does not exist: after ok:99 can never be met")));
  EXPECT_EQ(a.Waiting(6, w), "a change to it (cancel, hold, release, priority) is being stored")
      << "its end is being stored";
  EXPECT_EQ(w.outcome_asks["ok:1"], 1);
  EXPECT_THAT(w.cycle, IsEmpty());
  EXPECT_EQ(a.Waiting(10, w), "waiting for job 1 to end (after ok:1)");
  EXPECT_EQ(a.Waiting(5, w), "waiting for job 1 to end (after ok:1)");

  // Parked: not looked at again until a job has left somewhere.
  a.Admit(w);
  EXPECT_EQ(w.outcome_asks["ok:1"], 1);
  w.outcomes["ok:1"] = {DependencyState::kOk, "job 1 succeeded"};
  a.Admit(w);
  EXPECT_THAT(w.cycle, IsEmpty()) << "nobody said a job left";
  a.NoteLeft();
  a.Admit(w);
  EXPECT_EQ(w.cycle.size(), 50u) << "job 1 met: the tasks enter; job 5 still waits for job 2";
  EXPECT_EQ(a.Waiting(5, w), "waiting for job 2 to end (after any:2)");
  w.outcomes["any:2"] = {DependencyState::kNotOk, "job 2 failed"};
  a.NoteLeft();
  a.Admit(w);
  EXPECT_TRUE(w.cycle.contains(5)) << "any: met whatever the outcome";
  // The never-met job's end stored: it leaves.
  a.Erase(6);
  a.EndChange({6});
  EXPECT_FALSE(a.Contains(6));
}

TEST(Admission, ArraysThrottlesWindowAndTheUsersCapHoldAtEachPass) {
  Admission a({.max_running_per_user = 6, .array_window = 3});
  FakeWorld w;
  auto throttled = Spec({}, "0-9%2");
  for (int64_t id = 100; id < 110; ++id) a.Add(Task(id, 100, throttled));
  w.running_by_array[100] = 1;  // one task runs already
  w.running_by_user[1000] = 1;
  a.Admit(w);
  EXPECT_THAT(w.cycle, ElementsAre(100)) << "%2 with one running: one more";
  EXPECT_EQ(a.Waiting(101, w), "array 100 runs at most 2 tasks at once (%2)");

  // Another array, no throttle: only the window's 3 wait in the cycle at once.
  auto wide = Spec({}, "0-9");
  for (int64_t id = 200; id < 210; ++id) a.Add(Task(id, 200, wide));
  a.Add(Job(300, Spec()));
  a.Admit(w);
  EXPECT_THAT(w.cycle, ElementsAre(100, 200, 201, 202, 300));
  EXPECT_EQ(a.Waiting(203, w), "behind the first 3 waiting tasks of array 200");
  // The user has 1 running and 5 in the cycle: at her cap, her next job says so.
  a.Add(Job(301, Spec()));
  a.Admit(w);
  EXPECT_EQ(a.Waiting(301, w),
            "user1000 has 6 jobs running or starting, the most per user "
            "(limits.max_running_jobs_per_user)");
  EXPECT_EQ(w.cycle.size(), 5u);
  // Another user is not held back by this one's cap.
  a.Add(Job(400, Spec(), 2000));
  a.Admit(w);
  EXPECT_TRUE(w.cycle.contains(400));
  // Task 200 starts (it leaves the cycle, runs) and the job that ran ends: room for one more,
  // the array's next task in its window.
  EXPECT_EQ(a.Take(200).id, 200);
  w.cycle.erase(200);
  w.running_by_user[1000] = 1, w.running_by_array[200] = 1;
  a.Admit(w);
  EXPECT_THAT(w.cycle, ElementsAre(100, 201, 202, 203, 300, 400));
}

TEST(Admission, CountsWhatEachUserHasWaitingUntilItStartsOrLeaves) {
  Admission a({});
  FakeWorld w;
  auto array = Spec({}, "0-2");
  for (int64_t id = 1; id <= 3; ++id) a.Add(Task(id, 1, array));  // one spec: its bytes once
  a.Add(Job(4, Spec(), 1000, 500));
  a.Add(Job(5, Spec(), 2000, 70));
  EXPECT_EQ(a.JobsOf(1000), 4u);
  EXPECT_EQ(a.BytesOf(1000), 600u);
  EXPECT_EQ(a.BytesOf(2000), 70u);
  a.Admit(w);
  // A start takes the job with its record whole (what a failed start puts back).
  QueuedJob started = a.Take(4);
  EXPECT_EQ(started.spec_bytes, 500u);
  ASSERT_NE(started.spec, nullptr);
  EXPECT_EQ(a.JobsOf(1000), 3u);
  EXPECT_EQ(a.BytesOf(1000), 100u) << "a started job holds nothing of the waiting cap";
  a.Add(started);  // its start failed: back, counted again, out of the cycle until the next pass
  EXPECT_EQ(a.BytesOf(1000), 600u);
  a.Add(Job(4, started.spec, 1000, 500));  // the same id again replaces it
  EXPECT_EQ(a.JobsOf(1000), 4u);
  EXPECT_EQ(a.BytesOf(1000), 600u);
  for (int64_t id = 1; id <= 2; ++id) a.Erase(id);
  EXPECT_EQ(a.BytesOf(1000), 600u) << "task 3 still holds the array's spec";
  a.Erase(3);
  a.Erase(4);
  a.Erase(5);
  EXPECT_EQ(a.BytesOf(1000), 0u);
  EXPECT_EQ(a.JobsOf(2000), 0u);
  EXPECT_EQ(a.size(), 0u);
}

TEST(Admission, AChangeKeepsJobsOutOfTheCycleUntilItEnds) {
  Admission a({});
  FakeWorld w;
  a.Add(Job(1, Spec()));
  a.Add(Job(2, Spec()));
  a.Admit(w);
  ASSERT_THAT(w.cycle, ElementsAre(1, 2));
  EXPECT_THAT(a.BeginChange({1, 7}, w), ElementsAre(1)) << "7 is not queued";
  EXPECT_THAT(w.cycle, ElementsAre(2)) << "taken out of the cycle's queue";
  EXPECT_TRUE(a.AnyChanging({1, 2}));
  EXPECT_FALSE(a.AnyChanging({2}));
  a.Admit(w);
  EXPECT_THAT(w.cycle, ElementsAre(2)) << "not while it changes";
  a.Find(1)->priority = 9;
  a.EndChange({1});
  a.Admit(w);
  EXPECT_THAT(w.cycle, ElementsAre(1, 2));
  EXPECT_EQ(a.Find(1)->priority, 9);
}

// A reader's copy of each queued job's facts, refreshed only for the jobs TakeNoted names (and
// the capped users whole), says what Waiting() says through adds, holds, releases, dependencies
// settled, arrays' throttles and windows, users reaching and leaving their cap, changes, starts
// and cancels; and a pass that changes nothing names nothing.
TEST(Admission, WhatTakeNotedNamesKeepsAReadersCopyOfWhyJobsWaitTrue) {
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    Admission a({.max_running_per_user = 3, .array_window = 2});
    FakeWorld w;
    std::map<int64_t, WaitingFacts> copy;
    auto refresh = [&] {
      size_t n = 0;
      for (int64_t id : a.TakeNoted()) {
        ++n;
        if (std::optional<WaitingFacts> f = a.FactsOf(id, w)) copy[id] = *std::move(f);
      }
      std::erase_if(copy, [&](const auto& kv) { return !a.Contains(kv.first); });
      return n;
    };
    auto check = [&](const std::string& after) {
      for (const auto& [id, q] : a.jobs()) {
        ASSERT_TRUE(copy.contains(id)) << id << " queued without being noted, after " << after;
        EXPECT_EQ(WaitingText(copy[id], a.capped()), a.Waiting(id, w)) << id << " after " << after;
      }
    };
    auto queued = [&] {
      std::vector<int64_t> ids;
      for (const auto& [id, q] : a.jobs()) ids.push_back(id);
      return ids;
    };
    int64_t next = 1;
    for (int step = 0; step < 80; ++step) {
      std::string what;
      switch (pick(8)) {
        case 0: {  // a job, maybe held, maybe after another
          std::vector<std::string> after;
          if (next > 1 && pick(3) == 0) after.push_back("ok:" + std::to_string(1 + pick(next - 1)));
          QueuedJob q = Job(next++, Spec(after), 1000 + pick(3));
          q.held = pick(4) == 0;
          a.Add(std::move(q));
          what = "add";
          break;
        }
        case 1: {  // an array of 4, throttled to 2
          const int64_t array = next;
          auto spec = Spec({}, "0-3%2");
          for (int i = 0; i < 4; ++i) a.Add(Task(next++, array, spec));
          what = "array";
          break;
        }
        case 2:
        case 3: {  // held or released, a change begun and ended, a new reason
          std::vector<int64_t> ids = queued();
          if (ids.empty()) break;
          const int64_t id = ids[static_cast<size_t>(pick(static_cast<int>(ids.size())))];
          if (a.AnyChanging({id})) {
            a.EndChange({id});
            what = "end a change";
          } else if (pick(3) == 0) {
            a.BeginChange({id}, w);
            what = "begin a change";
          } else if (pick(2) == 0) {
            a.SetHeld(id, !a.Find(id)->held, a.Find(id)->held ? "released" : "held");
            what = "hold or release";
          } else {
            a.SetWaiting(id, "priority changed; not yet considered");
            what = "a new reason";
          }
          break;
        }
        case 4: {  // one in the cycle starts, or a queued one is cancelled
          std::vector<int64_t> ids = queued();
          if (ids.empty()) break;
          const int64_t id = ids[static_cast<size_t>(pick(static_cast<int>(ids.size())))];
          if (a.AnyChanging({id})) break;
          const QueuedJob q = a.Take(id);
          if (w.cycle.erase(id) > 0) {
            ++w.running_by_user[q.uid];
            if (q.array_id != 0) ++w.running_by_array[q.array_id];
          }
          what = "start or cancel";
          break;
        }
        case 5: {  // a running job ends, settling dependencies on it
          for (auto& [uid, n] : w.running_by_user) {
            if (n > 0 && pick(2) == 0) --n;
          }
          for (auto& [array, n] : w.running_by_array) {
            if (n > 0 && pick(2) == 0) --n;
          }
          if (next > 1) {
            w.outcomes["ok:" + std::to_string(1 + pick(next - 1))] = {DependencyState::kOk, "ok"};
          }
          a.NoteLeft();
          what = "an end";
          break;
        }
        default:
          for (const auto& [id, why] : a.Admit(w)) a.Erase(id);  // never met: ended
          what = "a pass";
      }
      refresh();
      check(what);
    }
    // Quiet: a second pass over the same world changes no job's facts.
    for (const auto& [id, why] : a.Admit(w)) a.Erase(id);
    refresh();
    for (const auto& [id, why] : a.Admit(w)) ADD_FAILURE() << id << ": " << why;
    EXPECT_EQ(refresh(), 0u) << "a pass that changes nothing names nothing";
    check("quiet passes");
  }
}

}  // namespace
}  // namespace tessera::server
