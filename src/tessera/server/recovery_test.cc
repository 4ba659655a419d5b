// Recovery alone (recovery.h): a store as a stopped server left it, in a temporary folder, the
// machine's processes on a FakeLauncher behind a FakeJobHost, and a World that records what it is
// told. Each kind of stored job ends up in exactly one place.
#include "tessera/server/recovery.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "nlohmann/json.hpp"
#include "tessera/core/clock.h"
#include "tessera/server/fake_job_host.h"
#include "tessera/server/fake_launcher.h"
#include "tessera/server/store.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class RecoveryTest : public ::testing::Test, public Recovery::World {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-recovery-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/exit");
    fs::create_directories(dir_ + "/stop");
    fs::create_directories(dir_ + "/resize");
    auto store = Store::Open(dir_ + "/tessera.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // ---- Recovery::World ----
  void Enqueue(QueuedJob q) override { queued_[q.id] = std::move(q); }
  absl::Status Adopt(const JobRecord& r, std::shared_ptr<const JobSpec> spec,
                     std::optional<StopAsked> stop) override {
    if (refuse_.contains(r.id)) return absl::FailedPreconditionError("GPU 0 is held by job 1");
    adopted_[r.id] = std::move(spec);
    if (stop) stopping_[r.id] = *stop;
    return absl::OkStatus();
  }

  int64_t Insert(json spec, bool held = false) {
    JobRecord r;
    r.owner = "alice";
    r.owner_uid = 1000;
    r.spec_json = spec.dump();
    r.held = held;
    auto id = store_->Insert(r, 100);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }
  // Recorded running as the last server left it: with a process (pid > 0) or before one was made.
  void Running(int64_t id, pid_t pid) {
    TransitionFields f;
    f.started_at = 110;
    f.placement_json = R"({"gpus":[{"index":0}]})";
    if (pid > 0) {
      f.pid = pid;
      f.pid_start_time = static_cast<uint64_t>(pid);
    }
    ASSERT_TRUE(store_->Transition(id, JobState::kRunning, "started", 110, f).ok());
  }
  pid_t Process(double seconds) {
    LaunchSpec spec;
    spec.argv = {"sleep", std::to_string(seconds)};
    auto l = launcher_.Start(spec);
    EXPECT_TRUE(l.ok()) << l.status();
    return l->pid;
  }
  JobRecord Get(int64_t id) {
    auto r = store_->Get(id);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }
  Recovery::Counts Run(bool requeue_preempted = false, bool requeue_unhealthy = false) {
    Recovery recovery(*store_, host_,
                      {.state_dir = dir_,
                       .requeue_preempted = requeue_preempted,
                       .requeue_unhealthy = requeue_unhealthy,
                       .containers = true});
    auto n = recovery.Run(*this, 200);
    EXPECT_TRUE(n.ok()) << n.status();
    return *n;
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(1'800'000'000))};
  FakeLauncher launcher_{clock_};
  FakeJobHost host_{launcher_};
  std::map<int64_t, QueuedJob> queued_;
  std::map<int64_t, std::shared_ptr<const JobSpec>> adopted_;
  std::map<int64_t, StopAsked> stopping_;
  std::set<int64_t> refuse_;
};

TEST_F(RecoveryTest, EachStoredJobEndsUpInExactlyOnePlace) {
  const json sleep = {{"command", {"sleep", "100"}}};
  const int64_t queued = Insert(sleep);
  const int64_t held = Insert(sleep, /*held=*/true);
  const int64_t alive = Insert(sleep);
  Running(alive, Process(1000));
  const int64_t succeeded = Insert(sleep);
  Running(succeeded, 4001);  // no such process: it ended while the server was down
  std::ofstream(dir_ + "/exit/" + std::to_string(succeeded)) << "0\n";
  const int64_t failed = Insert(sleep);
  Running(failed, 4002);
  std::ofstream(dir_ + "/exit/" + std::to_string(failed)) << "3\n";
  const int64_t unknown = Insert(sleep);
  Running(unknown, 4003);  // gone, and no exit file
  const int64_t never = Insert(sleep);
  Running(never, 0);  // the server stopped while starting it
  const int64_t in_container = Insert({{"command", {"sleep", "1"}}, {"image", "busybox"}});
  Running(in_container, 4004);

  const Recovery::Counts n = Run();
  EXPECT_EQ(n.queued, 2);
  EXPECT_EQ(n.adopted, 1);
  EXPECT_EQ(n.ended, 5);
  EXPECT_EQ(n.lost, 0);
  ASSERT_EQ(queued_.size(), 2u);
  EXPECT_FALSE(queued_.at(queued).held);
  EXPECT_TRUE(queued_.at(held).held);
  EXPECT_EQ(queued_.at(queued).submitted, 100);  // its place in the queue is kept
  ASSERT_EQ(adopted_.size(), 1u);
  EXPECT_EQ(adopted_.at(alive)->command, std::vector<std::string>({"sleep", "100"}));
  EXPECT_EQ(Get(alive).state, JobState::kRunning);
  EXPECT_EQ(Get(succeeded).state, JobState::kSucceeded);
  EXPECT_EQ(Get(succeeded).exit_code, 0);
  EXPECT_EQ(Get(failed).state, JobState::kFailed);
  EXPECT_EQ(Get(failed).exit_code, 3);
  EXPECT_EQ(Get(unknown).state, JobState::kLost);
  EXPECT_EQ(Get(never).state, JobState::kLost);
  EXPECT_EQ(Get(in_container).state, JobState::kLost);
  // The exit files are gone with the ends they told; the container left behind is removed.
  EXPECT_FALSE(fs::exists(dir_ + "/exit/" + std::to_string(succeeded)));
  EXPECT_FALSE(fs::exists(dir_ + "/exit/" + std::to_string(failed)));
  EXPECT_EQ(host_.containers_removed(), std::vector<int64_t>{in_container});

  // A second recovery (the server restarted again at once) finds only what is still active.
  queued_.clear(), adopted_.clear();
  const Recovery::Counts again = Run();
  EXPECT_EQ(again.queued, 2);
  EXPECT_EQ(again.adopted, 1);
  EXPECT_EQ(again.ended, 0);
}

TEST_F(RecoveryTest, AJobWhoseGpusCannotBeHadAgainIsKilledAndLost) {
  const int64_t id = Insert({{"command", {"sleep", "100"}}});
  const pid_t pid = Process(1000);
  Running(id, pid);
  refuse_.insert(id);
  const Recovery::Counts n = Run();
  EXPECT_EQ(n.lost, 1);
  EXPECT_TRUE(adopted_.empty());
  const JobRecord r = Get(id);
  EXPECT_EQ(r.state, JobState::kLost);
  EXPECT_NE(r.reason.find("cannot re-adopt: GPU 0 is held by job 1"), std::string::npos)
      << r.reason;
  EXPECT_EQ(launcher_.signals(), (std::vector<std::pair<pid_t, int>>{{pid, SIGKILL}}));
  EXPECT_FALSE(launcher_.Alive(pid, 0));
}

TEST_F(RecoveryTest, APreemptedJobIsQueuedAgainOnlyWhenItsSpecOrTheServerSaysSo) {
  auto preempted = [&](json spec) {
    const int64_t id = Insert(spec);
    Running(id, 0);
    EXPECT_TRUE(store_->Transition(id, JobState::kPreempted, "preempted for job 9", 150).ok());
    return id;
  };
  const int64_t asks = preempted({{"command", {"sleep", "1"}}, {"requeue", true}});
  const int64_t refuses = preempted({{"command", {"sleep", "1"}}, {"requeue", false}});
  const int64_t by_default = preempted({{"command", {"sleep", "1"}}});
  Recovery::Counts n = Run(/*requeue_preempted=*/false);
  EXPECT_EQ(n.requeued, 1);
  EXPECT_EQ(queued_.size(), 1u);
  EXPECT_TRUE(queued_.contains(asks));
  EXPECT_EQ(Get(asks).state, JobState::kQueued);
  EXPECT_EQ(Get(refuses).state, JobState::kPreempted);
  EXPECT_EQ(Get(by_default).state, JobState::kPreempted);
  // The server's default now says so: the one without a wish of its own goes back too.
  queued_.clear();
  n = Run(/*requeue_preempted=*/true);
  EXPECT_EQ(n.requeued, 1);
  EXPECT_TRUE(queued_.contains(by_default));
  EXPECT_FALSE(queued_.contains(refuses));
}

// A stop asked before the server went down (its stop file) is carried out: a job that ended
// meanwhile ends as the stop asked, not by its exit code (SIGTERM's 143), and one still running
// is re-adopted still stopping.
TEST_F(RecoveryTest, AStopAskedBeforeTheServerWentDownIsCarriedOut) {
  auto stopped = [&](json spec, pid_t pid, const std::string& why, const std::string& reason) {
    const int64_t id = Insert(spec);
    Running(id, pid);
    if (pid >= 4000) std::ofstream(dir_ + "/exit/" + std::to_string(id)) << "143\n";
    WriteStopFile(dir_, id, {why, reason, 150});
    return id;
  };
  const json sleep = {{"command", {"sleep", "100"}}};
  json requeue = sleep;
  requeue["requeue"] = true;
  const int64_t back = stopped(requeue, 4101, "preempt", "preempted for job 9");
  const int64_t stays = stopped(sleep, 4102, "preempt", "preempted for job 9");
  const int64_t cancelled = stopped(sleep, 4103, "cancel", "cancelled by alice");
  const int64_t timed_out = stopped(sleep, 4104, "timeout", "ran past its max runtime of 60 s");
  const int64_t tried = stopped(json{{"command", {"serve"}},
                                     {"resources", {{"gpu_share", "auto"}, {"gpu_memory", "auto"}}},
                                     {"sized", {{"basis", "no runs yet"}, {"trial_s", 120}}}},
                                4105, "trial", "its trial of 2m is over");
  const int64_t alive = stopped(sleep, Process(1000), "cancel", "cancelled by alice");
  // Its GPU failed: re-queued by the server's rule for that (unhealthy.action requeue).
  const int64_t sick = stopped(sleep, 4107, "unhealthy", "its GPU 0 turned unhealthy (XID 79)");
  const Recovery::Counts n = Run(/*requeue_preempted=*/false, /*requeue_unhealthy=*/true);
  EXPECT_EQ(n.ended, 6);
  EXPECT_EQ(n.requeued, 3);
  EXPECT_TRUE(queued_.contains(sick));
  EXPECT_EQ(n.adopted, 1);
  JobRecord r = Get(back);
  EXPECT_EQ(r.state, JobState::kQueued);
  EXPECT_TRUE(queued_.contains(back));
  auto events = *store_->Events(back);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2].state, JobState::kPreempted);
  EXPECT_EQ(events[events.size() - 2].reason,
            "preempted for job 9 (ended while the server was down)");
  r = Get(stays);
  EXPECT_EQ(r.state, JobState::kPreempted) << "its spec and the server say no re-queue";
  EXPECT_EQ(r.exit_code, 143);
  EXPECT_FALSE(queued_.contains(stays));
  EXPECT_EQ(Get(cancelled).state, JobState::kCancelled);
  EXPECT_EQ(Get(cancelled).reason, "cancelled by alice (ended while the server was down)");
  EXPECT_EQ(Get(timed_out).state, JobState::kFailed);
  EXPECT_EQ(Get(timed_out).reason,
            "ran past its max runtime of 60 s (ended while the server was down)");
  EXPECT_EQ(Get(tried).state, JobState::kQueued) << "its trial measured nothing: tried again";
  events = *store_->Events(tried);
  EXPECT_EQ(events[events.size() - 2].reason,
            "its trial of 2m is over (ended while the server was down), unmeasured: re-queued to "
            "be tried again");
  EXPECT_TRUE(queued_.contains(tried));
  ASSERT_TRUE(stopping_.contains(alive));
  EXPECT_EQ(stopping_.at(alive).why, "cancel");
  EXPECT_EQ(stopping_.at(alive).at, 150) << "its grace counts from the stop";
  for (int64_t id : {back, stays, cancelled, timed_out, tried, sick})
    EXPECT_FALSE(fs::exists(dir_ + "/stop/" + std::to_string(id))) << id;
  EXPECT_TRUE(fs::exists(dir_ + "/stop/" + std::to_string(alive))) << "until its end is recorded";
  // A stop file that is not one is said and ignored: the exit code tells.
  const int64_t garbled = Insert(sleep);
  Running(garbled, 4106);
  std::ofstream(dir_ + "/exit/" + std::to_string(garbled)) << "143\n";
  std::ofstream(dir_ + "/stop/" + std::to_string(garbled)) << "{\"why\": 7}";
  Run();
  EXPECT_EQ(Get(garbled).state, JobState::kFailed);
  EXPECT_EQ(Get(garbled).exit_code, 143);
}

// An elastic job asked to resize before the server went down: one that ended for it meanwhile
// (exit 75 after its signal, stopped to be restarted, or gone before its new process was known)
// goes back to the queue at its place, never run twice; one still running is re-adopted (its
// resize is the dispatcher's to carry on); a resizable job that ended otherwise ends as its code
// says.
TEST_F(RecoveryTest, AnElasticJobThatEndedForItsResizeIsQueuedAgainAtItsPlace) {
  const json elastic = {{"command", {"train"}},
                        {"resources", {{"gpus", 1}, {"gpus_max", 4}}},
                        {"resize", {{"by", "signal"}}}};
  auto asked = [&](pid_t pid, std::optional<int> code) {
    const int64_t id = Insert(elastic);
    Running(id, pid);
    if (code) std::ofstream(dir_ + "/exit/" + std::to_string(id)) << *code << "\n";
    WriteResizeFile(dir_, id, {"GPU-a", "GPU-b"}, 150, 0);
    return id;
  };
  const int64_t answered = asked(4201, kResizeExitCode);
  const int64_t unknown = asked(4202, std::nullopt);
  const int64_t finished = asked(4203, 0);  // it ended on its own before it answered
  const int64_t alive = asked(Process(1000), std::nullopt);
  const int64_t stopped = Insert(elastic);
  Running(stopped, 4204);
  WriteStopFile(dir_, stopped, {"resize", "stopped to be started again on 2 GPUs (0,1)", 150});
  const Recovery::Counts n = Run();
  EXPECT_EQ(n.adopted, 1);
  EXPECT_TRUE(adopted_.contains(alive));
  EXPECT_TRUE(fs::exists(ResizeFilePath(dir_, alive))) << "the adopted job's resize goes on";
  for (int64_t id : {answered, unknown, stopped}) {
    EXPECT_EQ(Get(id).state, JobState::kQueued) << id;
    ASSERT_TRUE(queued_.contains(id)) << id;
    EXPECT_EQ(queued_.at(id).submitted, 100) << "its place: its submission";
    auto events = *store_->Events(id);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events[events.size() - 2].state, JobState::kPreempted) << id;
    EXPECT_FALSE(fs::exists(ResizeFilePath(dir_, id))) << id;
  }
  const auto events = *store_->Events(answered);
  EXPECT_EQ(events[events.size() - 2].reason,
            "ended for its resize (exit code 75) while the server was down");
  EXPECT_EQ(Get(finished).state, JobState::kSucceeded);
  EXPECT_FALSE(queued_.contains(finished));
  EXPECT_EQ(n.requeued, 3);
}

TEST_F(RecoveryTest, AnArraysTasksShareOneSpecAndAnUnreadableSpecIsLeftAsItIs) {
  JobRecord r;
  r.owner = "alice";
  r.owner_uid = 1000;
  r.spec_json = json{{"command", {"sleep", "1"}}, {"array", "0-2"}}.dump();
  auto first = store_->InsertArray(r, {0, 1, 2}, 100);
  ASSERT_TRUE(first.ok()) << first.status();
  JobRecord bad = r;
  bad.spec_json = R"({"command": 42})";
  const int64_t unreadable = *store_->Insert(bad, 100);
  const Recovery::Counts n = Run();
  EXPECT_EQ(n.unreadable, 1);
  ASSERT_EQ(queued_.size(), 3u);
  EXPECT_FALSE(queued_.contains(unreadable));
  EXPECT_EQ(Get(unreadable).state, JobState::kQueued);  // nothing recorded of it
  const JobSpec* spec = queued_.at(*first).spec.get();
  for (const auto& [id, q] : queued_) {
    EXPECT_EQ(q.spec.get(), spec) << "task " << id << " has a spec of its own";
    EXPECT_EQ(q.array_id, *first);
  }
  std::set<int> indices;
  for (const auto& [id, q] : queued_) indices.insert(q.array_index);
  EXPECT_EQ(indices, (std::set<int>{0, 1, 2}));
}

}  // namespace
}  // namespace tessera::server
