// The dispatcher's rooms without the Dispatcher: a DispatchState, a SchedulingLoop and
// JobOperations wired by hand as Dispatcher::Create wires them, on a simulated machine of two
// Tesla T4s, a store in a temporary folder, processes on a FakeLauncher (behind a FakeJobHost) and
// a fake clock. Each test drives the rooms' own interfaces and checks the store, the host and the
// read models.
#include "tessera/server/scheduling_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>

#include "tessera/core/clock.h"
#include "tessera/devices/simulated_source.h"
#include "tessera/sched/scheduler.h"
#include "tessera/server/dispatch_state.h"
#include "tessera/server/fake_job_host.h"
#include "tessera/server/fake_launcher.h"
#include "tessera/server/job_operations.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;

class RoomsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-rooms-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const char* sub : {"/logs", "/exit", "/regions"}) fs::create_directories(dir_ + sub);
    config_.state_dir = dir_;
    auto store = Store::Open(dir_ + "/tessera.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto machine = devices::LoadSimulatedMachine("t4x2");
    ASSERT_TRUE(machine.ok()) << machine.status();
    inventory_ = machine->inventory;
    auto scheduler = std::make_unique<sched::Scheduler>(sched::SchedulerConfig{});
    ASSERT_TRUE(scheduler->AddNode(core::NodeFromInventory(inventory_, 8000, 32768)).ok());
    state_ = std::make_unique<DispatchState>(config_, rights_, *store_, inventory_.gpus.size());
    loop_ = std::make_unique<SchedulingLoop>(*state_, host_, setup_, clock_);
    {
      core::MutexLock lock(state_->mu);
      state_->engine = std::make_unique<sched::Engine>(
          std::move(scheduler), loop_->executor(),
          sched::EngineOptions{.requeue_through_driver = true, .predict_from_kind_only = true});
      state_->history = &state_->engine->history();
      state_->retention = std::make_unique<Retention>(*store_, dir_, PurgeAges{});
      state_->runs = std::make_unique<RunningJobs>(host_, RunningJobs::Options{.state_dir = dir_});
      state_->Publish();
      node_ = state_->engine->scheduler().state().node_spec(0);
    }
    state_->ends = std::make_unique<JobEnds>(host_, *store_, *state_->history,
                                             JobEnds::Options{.state_dir = dir_});
    setup_ = {.config = &config_,
              .inventory = &inventory_,
              .node = &node_,
              .hostname = "rooms",
              .arbiter_file = dir_ + "/arbiter/gpu.arbiter",
              .containers_off = "not in this test"};
    ops_ = std::make_unique<JobOperations>(*state_, setup_, clock_);
  }
  void TearDown() override {
    ops_.reset();
    loop_.reset();
    state_.reset();
    fs::remove_all(dir_);
  }

  double Now() const { return core::Seconds(clock_.Now()); }
  void Advance(double s) {
    clock_.Advance(std::chrono::duration_cast<core::Duration>(std::chrono::duration<double>(s)));
  }
  // Alice's job of `gpus` GPUs running `seconds`, submitted through JobOperations.
  int64_t Submit(int gpus, double seconds, bool hold = false) {
    JobSpec spec;
    spec.command = {"sleep", std::to_string(seconds)};
    spec.gpus = gpus;
    spec.hold = hold;
    auto s = ops_->Submit(spec, Caller{"alice", 1000, false}, "");
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->record.id : 0;
  }
  JobState Stored(int64_t id) {
    auto r = store_->Get(id);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->state : JobState::kLost;
  }
  // The jobs the read models show on each GPU.
  std::vector<std::vector<int64_t>> OnGpus() const {
    std::vector<std::vector<int64_t>> out;
    for (const GpuView& g : state_->views.machine()->gpus) out.push_back(g.jobs);
    return out;
  }

  std::string dir_;
  ServerConfig config_;
  core::NodeInventory inventory_;
  core::NodeSpec node_;
  LaunchSetup setup_;
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(1'800'000'000))};
  FakeLauncher launcher_{clock_};
  FakeJobHost host_{launcher_};
  Rights rights_{config_};
  std::unique_ptr<Store> store_;
  std::unique_ptr<DispatchState> state_;
  std::unique_ptr<SchedulingLoop> loop_;
  std::unique_ptr<JobOperations> ops_;
};

// A submission is stored and queued at once; the loop's next turn places it, records it running
// and launches it through the host; once its process ends, a turn records its end and frees its
// GPUs, and the read models follow each step.
TEST_F(RoomsTest, ALoopTurnStartsWhatWasSubmittedAndRecordsItsEnd) {
  const int64_t id = Submit(2, 10);
  EXPECT_EQ(Stored(id), JobState::kQueued);
  EXPECT_TRUE(state_->views.Find(id).queued);
  EXPECT_TRUE(ops_->LiveOf(id).queued);
  EXPECT_TRUE(loop_->RunOnce());
  EXPECT_EQ(Stored(id), JobState::kRunning);
  ASSERT_EQ(launcher_.started().size(), 1u);
  EXPECT_EQ(launcher_.started()[0].job_id, id);
  EXPECT_EQ(launcher_.started()[0].gpu_uuids.size(), 2u);
  EXPECT_FALSE(state_->views.Find(id).queued);
  EXPECT_EQ(OnGpus(), (std::vector<std::vector<int64_t>>{{id}, {id}}));
  EXPECT_TRUE(ops_->LiveOf(id).pid.has_value());
  Advance(10);
  loop_->RunOnce();
  EXPECT_EQ(Stored(id), JobState::kSucceeded);
  EXPECT_EQ(OnGpus(), (std::vector<std::vector<int64_t>>{{}, {}}));
  EXPECT_FALSE(ops_->LiveOf(id).known);
  auto spec = ParseJobSpec(store_->Get(id)->spec_json);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const sched::Prediction p = state_->history->Predict(RunKindOf(*spec, "alice"));
  EXPECT_EQ(p.samples, 1) << "its run time joined the history: " << p.basis;
  EXPECT_EQ(p.seconds, 10);
}

// A held job stays queued through turns, saying why; released, it starts at the next turn. A
// cancel of a queued job ends it without a start; one of a running job asks its process to stop.
TEST_F(RoomsTest, HoldsReleasesAndCancelsAreCarriedOutByTheNextTurn) {
  const int64_t held = Submit(1, 10, /*hold=*/true);
  loop_->RunOnce();
  EXPECT_EQ(Stored(held), JobState::kQueued);
  EXPECT_EQ(ops_->LiveOf(held).waiting.substr(0, 5), "held ") << ops_->LiveOf(held).waiting;
  auto rec = store_->Get(held);
  ASSERT_TRUE(ops_->Hold({held}, "1", *rec, false, "alice").ok());
  loop_->RunOnce();
  EXPECT_EQ(Stored(held), JobState::kRunning);

  const int64_t queued = Submit(2, 10);  // waits: one GPU is held by the first
  loop_->RunOnce();
  EXPECT_EQ(Stored(queued), JobState::kQueued);
  rec = store_->Get(queued);
  ASSERT_TRUE(ops_->Cancel({queued}, std::to_string(queued), *rec, "alice").ok());
  EXPECT_EQ(Stored(queued), JobState::kCancelled);
  EXPECT_FALSE(state_->views.Find(queued).queued);

  rec = store_->Get(held);
  ASSERT_TRUE(ops_->Cancel({held}, std::to_string(held), *rec, "alice").ok());
  EXPECT_EQ(ops_->LiveOf(held).stopping, "cancelled by alice");
  ASSERT_FALSE(launcher_.signals().empty());
  EXPECT_EQ(launcher_.signals().back().second, SIGTERM);
  loop_->RunOnce();  // SIGTERM ends a fake job at once (stop latency 0)
  EXPECT_EQ(Stored(held), JobState::kCancelled);
  EXPECT_EQ(launcher_.started().size(), 1u) << "the cancelled queued job never started";
}

// Why a queued job waits is read from the views: LiveOf answers while the scheduling lock is held
// (a pass under way), with what admission and the cycle last said - held, then the cycle's
// reason, then a change being stored - and a turn that changes nothing leaves it as it was.
TEST_F(RoomsTest, AQueuedJobsReasonIsReadWithoutTheSchedulingLock) {
  const int64_t running = Submit(2, 100);
  loop_->RunOnce();
  ASSERT_EQ(Stored(running), JobState::kRunning);
  const int64_t waiting = Submit(2, 10, /*hold=*/true);
  auto live_under_the_lock = [&] {
    core::MutexLock lock(state_->mu);  // as a pass holds it
    auto live = std::async(std::launch::async, [&] { return ops_->LiveOf(waiting); });
    EXPECT_EQ(live.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "LiveOf waited for the scheduling lock";
    return live.get();  // (after the lock goes, should it have waited)
  };
  EXPECT_EQ(live_under_the_lock().waiting,
            "held (tessera release " + std::to_string(waiting) + ")");
  auto rec = store_->Get(waiting);
  ASSERT_TRUE(ops_->Hold({waiting}, std::to_string(waiting), *rec, false, "alice").ok());
  EXPECT_EQ(live_under_the_lock().waiting, "released; not yet considered");
  loop_->RunOnce();  // into the cycle, where both GPUs are taken
  const JobOperations::Live first = live_under_the_lock();
  EXPECT_TRUE(first.queued);
  EXPECT_NE(first.waiting.find("GPU"), std::string::npos) << first.waiting;
  Advance(1);
  state_->Publish();  // nothing changed: nothing of the queue is republished
  loop_->RunOnce();
  EXPECT_EQ(live_under_the_lock().waiting, first.waiting);
  // A change being stored says so while it is (the store's write is without the lock).
  {
    core::MutexLock lock(state_->mu);
    state_->BeginChange({waiting});
    state_->Publish();
  }
  EXPECT_EQ(live_under_the_lock().waiting,
            "a change to it (cancel, hold, release, priority) is being stored");
  {
    DispatchState::ChangeLock lock(*state_);
    state_->EndChange({waiting});
  }
  loop_->RunOnce();
  EXPECT_EQ(live_under_the_lock().waiting, first.waiting);
}

// A job asking "auto" is sized at submission from its kind's measured history and starts on that
// share (the views show its compute and memory limit); stored sized, it says how. Without history
// it runs first as a trial on a whole GPU; a submission that sets `sized` itself is refused.
TEST_F(RoomsTest, AnAutoJobIsSizedFromItsKindsHistoryAndStartsOnThatShare) {
  auto spec = ParseJobSpec(R"({"command": ["sleep", "10"], "name": "serve",
                               "resources": {"gpu_share": "auto", "gpu_memory": "auto"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Caller alice{"alice", 1000, false};
  auto first = ops_->Submit(*spec, alice, "");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(ParseJobSpec(store_->Get(first->record.id)->spec_json)->sizing,
              ::testing::HasSubstr("its first run is a trial of 2m"));
  loop_->RunOnce();
  ASSERT_NE(state_->views.Find(first->record.id).active, nullptr);
  EXPECT_EQ(state_->views.Find(first->record.id).active->gpu_milli, 0) << "a whole GPU";
  for (int i = 0; i < 5; ++i) {
    const sched::RunKind kind = RunKindOf(*spec, "alice");
    state_->history->Add(kind, 10, 20.0 + i);
    state_->history->AddGpuMemoryPeak(kind, 2000);
  }
  auto sized = ops_->Submit(*spec, alice, "");
  ASSERT_TRUE(sized.ok()) << sized.status();
  const JobSpec stored = *ParseJobSpec(store_->Get(sized->record.id)->spec_json);
  EXPECT_EQ(stored.gpu_milli, 300) << stored.sizing;        // p95 24% + 20% = 28.8%: 30%
  EXPECT_EQ(stored.gpu_memory_mib, 2560) << stored.sizing;  // 2000 + 20% = 2400: 2560
  loop_->RunOnce();
  const Views::Lookup l = state_->views.Find(sized->record.id);
  ASSERT_NE(l.active, nullptr);
  EXPECT_EQ(l.active->gpu_milli, 300);
  EXPECT_EQ(l.active->memory_limit_mib, 2560);
  JobSpec forged = *spec;
  forged.sizing = "mine";
  auto refused = ops_->Submit(forged, alice, "");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("sized: set by the server"));
}

// A trial runs until its time is up, is stopped as any stop is (SIGTERM), and ends as a success
// that says its trial is over.
TEST_F(RoomsTest, ATrialIsStoppedWhenItsTimeIsUpAndEndsAsASuccess) {
  JobSpec spec;
  spec.command = {"sleep", "1000"};
  spec.gpus = 1;
  spec.trial_s = 30;
  auto s = ops_->Submit(spec, Caller{"alice", 1000, false}, "");
  ASSERT_TRUE(s.ok()) << s.status();
  const int64_t id = s->record.id;
  loop_->RunOnce();
  ASSERT_EQ(Stored(id), JobState::kRunning);
  Advance(29);
  loop_->RunOnce();
  EXPECT_EQ(Stored(id), JobState::kRunning) << "not before its time";
  Advance(1);
  loop_->RunOnce();  // asked to stop (SIGTERM ends a fake job at once)
  loop_->RunOnce();
  EXPECT_EQ(Stored(id), JobState::kSucceeded);
  EXPECT_THAT(store_->Get(id)->reason, ::testing::HasSubstr("its trial of 30s is over"));
}

// An "auto" job of a kind never measured: its first run is the server's trial, stopped when its
// time is up and re-queued under its id (preempted, then queued: not a success the user would take
// for its end), its stored spec sized again and no longer a trial; it then runs on past the trial's
// time. (What the size is, from the trial's measured use: JobEndsTest.)
TEST_F(RoomsTest, AnAutoJobNeverMeasuredRunsATrialFirstAndGoesOnSizedFromIt) {
  auto spec = ParseJobSpec(R"({"command": ["sleep", "1000"], "name": "fresh",
                               "resources": {"gpu_share": "auto", "gpu_memory": "auto"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto s = ops_->Submit(*spec, Caller{"alice", 1000, false}, "");
  ASSERT_TRUE(s.ok()) << s.status();
  const int64_t id = s->record.id;
  EXPECT_EQ(ParseJobSpec(store_->Get(id)->spec_json)->sizing_trial_s, 120);
  loop_->RunOnce();
  ASSERT_EQ(Stored(id), JobState::kRunning);
  Advance(119);
  loop_->RunOnce();
  EXPECT_EQ(Stored(id), JobState::kRunning) << "not before its time";
  Advance(1);
  loop_->RunOnce();  // asked to stop (SIGTERM ends a fake job at once)
  loop_->RunOnce();  // its end: re-queued, and started again at once (the GPUs are free)
  const JobRecord rec = *store_->Get(id);
  EXPECT_EQ(rec.state, JobState::kRunning) << rec.reason;
  const JobSpec after = *ParseJobSpec(rec.spec_json);
  EXPECT_EQ(after.sizing_trial_s, 0) << after.sizing;
  EXPECT_TRUE(after.gpu_share_auto && after.gpu_memory_auto);
  std::vector<std::string> said;
  const std::vector<JobEvent> events = *store_->Events(id);
  for (const JobEvent& e : events)
    said.push_back(std::string(JobStateName(e.state)) + ": " + e.reason);
  EXPECT_THAT(said, ::testing::Contains(::testing::HasSubstr(
                        "preempted: its trial of 2m is over; nothing was measured (no GPU use "
                        "seen); re-queued sized from it: ")));
  EXPECT_THAT(said, ::testing::Contains("queued: re-queued"));
  Advance(500);
  loop_->RunOnce();
  EXPECT_EQ(Stored(id), JobState::kRunning) << "no longer a trial";
}

// Dependencies as DispatchState tells them: pending while the job is queued or running here,
// met once it has succeeded; a job that does not exist can never be waited on.
TEST_F(RoomsTest, ADependencyIsPendingUntilItsJobHasEnded) {
  const int64_t first = Submit(1, 5);
  auto outcome = [&](int64_t job) {
    core::MutexLock lock(state_->mu);
    return state_->Outcome(Dependency{.job = job}).outcome;
  };
  EXPECT_EQ(outcome(first), DependencyState::kPending) << "queued";
  loop_->RunOnce();
  EXPECT_EQ(outcome(first), DependencyState::kPending) << "running";
  Advance(5);
  loop_->RunOnce();
  EXPECT_EQ(outcome(first), DependencyState::kOk);
  EXPECT_EQ(outcome(first + 100), DependencyState::kMissing);
  JobSpec after;
  after.command = {"true"};
  after.after = {Dependency{.job = first + 100}};
  auto refused = ops_->Submit(after, Caller{"alice", 1000, false}, "");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(HttpStatusOf(refused.status()), 400) << refused.status();
}

}  // namespace
}  // namespace tessera::server
