// Job ends alone (job_ends.h): what an end means (EndOf), and its record against a store in a
// temporary folder and a FakeJobHost: the last GPU use read, what the job left removed, the
// history told of a success, a re-queue, and a full disk (a small tmpfs the test mounts) that
// loses no end.
#include "tessera/server/job_ends.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/core/clock.h"
#include "tessera/sched/predictor.h"
#include "tessera/server/fake_job_host.h"
#include "tessera/server/fake_launcher.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(EndOf, EachWayAJobEndsHasItsStateAndReason) {
  RunningJob r;
  auto end = [&](int code, bool known = true, bool requeue = false,
                 const CgroupUsage& u = CgroupUsage{}) {
    return EndOf(r, code, known, u, requeue);
  };
  EndOutcome e = end(0);
  EXPECT_EQ(e.to, JobState::kSucceeded);
  EXPECT_EQ(e.reason, "exit code 0");
  EXPECT_EQ(end(3).reason, "exit code 3");
  EXPECT_EQ(end(137).reason, "ended by signal 9 (exit code 137)");
  e = end(137, true, false, CgroupUsage{.oom_kills = 2});
  EXPECT_EQ(e.to, JobState::kFailed);
  EXPECT_EQ(e.reason,
            "over its memory limit of 0 MiB: the kernel killed 2 of its processes (OOM); ended by "
            "signal 9 (exit code 137)");
  e = end(-1, /*known=*/false);
  EXPECT_EQ(e.to, JobState::kLost);
  EXPECT_EQ(end(127).reason, "exit code 127") << "not in a container: the shell's code";
  r.container = true;
  EXPECT_EQ(end(127).reason, "the command was not found in the container (exit code 127)");
  EXPECT_EQ(end(126).reason, "the command cannot be run in the container (exit code 126)");
  EXPECT_EQ(end(125).to, JobState::kFailed);
  // A stop asked says why, whatever the exit code.
  r.stop = "cancel", r.stop_reason = "cancelled by alice";
  e = end(0);
  EXPECT_EQ(e.to, JobState::kCancelled);
  EXPECT_EQ(e.reason, "cancelled by alice");
  EXPECT_FALSE(e.requeue);
  r.stop = "preempt", r.stop_reason = "preempted for job 9";
  EXPECT_EQ(end(143, true, true).to, JobState::kPreempted);
  EXPECT_TRUE(end(143, true, true).requeue);
  EXPECT_FALSE(end(143, true, false).requeue);
  r.stop = "unhealthy", r.stop_reason = "GPU 0 turned unhealthy";
  EXPECT_EQ(end(143, true, true).to, JobState::kPreempted) << "re-queued: preempted";
  EXPECT_EQ(end(143, true, false).to, JobState::kFailed) << "not re-queued: failed";
  r.stop = "timeout", r.stop_reason = "over its max runtime";
  EXPECT_EQ(end(0).to, JobState::kFailed);
  r.stop = "logs";
  EXPECT_EQ(end(0).to, JobState::kFailed);
}

class JobEndsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-ends-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    OpenStore();
  }
  void TearDown() override {
    ends_.reset();
    store_.reset();
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
    fs::remove_all(dir_);
  }
  void OpenStore() {
    fs::create_directories(dir_ + "/exit");
    auto store = Store::Open(dir_ + "/tessera.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    ends_ = std::make_unique<JobEnds>(host_, *store_, history_,
                                      JobEnds::Options{.state_dir = dir_, .containers = true});
  }
  // A job recorded running since t=100, with its exit file as its wrapper leaves it.
  RunningJob Running(json spec = {{"command", {"train"}}, {"name", "train"}}) {
    JobRecord rec;
    rec.owner = "alice";
    rec.owner_uid = 1000;
    rec.spec_json = spec.dump();
    auto id = store_->Insert(rec, 90);
    EXPECT_TRUE(id.ok()) << id.status();
    TransitionFields f;
    f.started_at = 100;
    EXPECT_TRUE(store_->Transition(*id, JobState::kRunning, "placed", 100, f).ok());
    std::ofstream(JobFilePath(dir_, "exit", *id)) << "0\n";
    RunningJob r;
    r.id = *id;
    r.started = 100;
    r.gpus = {0};
    r.owner = "alice";
    auto parsed = ParseJobSpec(spec.dump());
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    r.spec = std::make_shared<const JobSpec>(*parsed);
    return r;
  }
  JobRecord Stored(int64_t id) {
    auto r = store_->Get(id);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : JobRecord{};
  }
  bool ExitFile(int64_t id) const { return fs::exists(JobFilePath(dir_, "exit", id)); }

  std::string dir_;
  bool mounted_ = false;
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(1'800'000'000))};
  FakeLauncher launcher_{clock_};
  FakeJobHost host_{launcher_};
  sched::DurationPredictor history_{/*kind_only=*/true};
  std::unique_ptr<Store> store_;
  std::unique_ptr<JobEnds> ends_;
};

// A share that ran 100 s: its last arbiter reading and region peak are read before its region
// goes; its cgroup's accounting, its GPU use and whether it shared are in its record; its exit
// file, region, cgroup and private folders are gone; its run time is in the history before the
// record says it ended.
TEST_F(JobEndsTest, ASuccessIsMeasuredCleanedUpRecordedAndJoinsTheHistory) {
  RunningJob r = Running();
  r.region = dir_ + "/regions/share";
  r.gpu_milli = 500;
  r.cgroup = true;
  r.shared_gpu = true;
  host_.SetShareUse(r.id, {.busy_us = 40'000'000, .peak_bytes = uint64_t{3} << 30});
  host_.SetUsage(r.id, CgroupUsage{.cpu_seconds = 12.5, .peak_memory_bytes = 1 << 30});
  const int64_t id = r.id;
  Ending e{std::move(r), 0, true};
  ends_->Record(e, 200);
  const JobRecord rec = Stored(id);
  EXPECT_EQ(rec.state, JobState::kSucceeded);
  EXPECT_EQ(rec.exit_code, 0);
  const json usage = json::parse(rec.usage_json);
  EXPECT_EQ(usage["gpu_utilization_pct"], 40.0) << "40 s of GPU time over 100 s: " << usage;
  EXPECT_EQ(usage["gpu_peak_memory_mib"], 3072);
  EXPECT_EQ(usage["cpu_seconds"], 12.5);
  EXPECT_EQ(usage["peak_memory_bytes"], 1 << 30);
  EXPECT_EQ(usage["shared_gpu"], true);
  EXPECT_FALSE(ExitFile(id)) << "recorded: the exit file is no longer needed";
  EXPECT_EQ(host_.unconfine_calls(id), 1);
  EXPECT_FALSE(e.cgroup_left);
  EXPECT_EQ(host_.private_dirs_removed(), std::vector<int64_t>{id});
  EXPECT_TRUE(host_.containers_removed().empty()) << "not in a container";
  const sched::Prediction p = history_.Predict(RunKindOf(*e.run.spec, "alice"));
  EXPECT_EQ(p.seconds, 100) << p.basis;
  EXPECT_EQ(p.gpu_memory_peak_mib, 3072) << "its peak too, for sizing jobs of its kind";
  EXPECT_FALSE(e.requeue);
}

// A trial stopped at its end succeeds, saying what it measured and the size that recommends; its
// use (not its cut-short run time) joins the history under its kind and its "auto" kind, so that a
// later --gpu-share/--gpu-mem auto submission is sized from it.
TEST_F(JobEndsTest, ATrialSaysWhatItUsedAndRecommendsASizeThatAutoThenUses) {
  const json spec = {
      {"command", {"serve"}}, {"name", "serve"}, {"resources", {{"gpus", 1}}}, {"trial_s", 100}};
  RunningJob r = Running(spec);
  r.stop = "trial";
  r.stop_reason = "its trial of 1m40s is over";
  r.util_sum = 0.4 * 10, r.util_samples = 10;  // NVML's samples of its GPU, held alone: 40%
  r.gpu_peak_mib = 3072;
  const int64_t id = r.id;
  Ending e{std::move(r), 143, true};  // its SIGTERM
  ends_->Record(e, 200);
  const JobRecord rec = Stored(id);
  EXPECT_EQ(rec.state, JobState::kSucceeded);
  // 40% + 20% = 48%: 50%; 3072 MiB + 20% = 3686: 3840 (15 x 256).
  EXPECT_EQ(rec.reason,
            "its trial of 1m40s is over: GPU 40% busy, peak GPU memory 3072MiB; recommended: "
            "--gpu-share 50% --gpu-mem 3840MiB (with 20% margin), or --gpu-share auto --gpu-mem "
            "auto, which sizes from this trial");
  EXPECT_EQ(history_.Predict(RunKindOf(*e.run.spec, "alice")).samples, 0)
      << "a trial's run time is cut short: not history";
  JobSpec later = *e.run.spec;
  later.gpus = 0, later.trial_s = 0;
  later.gpu_share_auto = later.gpu_memory_auto = true;
  const sched::Prediction p = history_.Predict(RunKindOf(later, "alice"));
  EXPECT_EQ(p.util_high_pct, 40) << p.util_high_basis;
  EXPECT_EQ(p.gpu_memory_peak_mib, 3072) << p.memory_basis;
  SizeAutomatically(later, p, {});
  EXPECT_EQ(later.gpu_milli, 500);
  EXPECT_EQ(later.gpu_memory_mib, 3840);
}

// A share sized automatically whose launches waited for its slices (held to 25% of a GPU by its
// share while it wanted more): its usage says for how long and what it would have used, and that
// is what its kind learns - so the next run is sized past its share, not at it plus the margin.
// A restart reads the same back from its record (UsageOf). One never held back teaches its use.
TEST_F(JobEndsTest, AShareHeldBackByItsSlicesTeachesWhatItWouldHaveUsed) {
  for (const uint64_t held_s : {70, 0}) {
    SCOPED_TRACE(held_s);
    const json spec = {{"command", {"serve"}},
                       {"name", fmt::format("serve-{}", held_s)},  // a kind of its own
                       {"resources", {{"gpu_share", "auto"}, {"gpu_memory", "4GiB"}}},
                       {"sized", {{"basis", "gpu_share 25%: ..."}, {"gpu_share", "25%"}}}};
    RunningJob r = Running(spec);
    ASSERT_EQ(r.spec->gpu_milli, 250);
    r.region = dir_ + "/regions/share";
    r.gpu_milli = 250;
    // 100 s: 25 s of GPU time, 70 s waiting for it - it ran as it wished for 30 s, 25 of them busy.
    host_.SetShareUse(r.id, {.busy_us = 25'000'000, .held_us = held_s * 1'000'000});
    const int64_t id = r.id;
    Ending e{std::move(r), 0, true};
    ends_->Record(e, 200);
    const JobRecord rec = Stored(id);
    ASSERT_EQ(rec.state, JobState::kSucceeded);
    const json usage = json::parse(rec.usage_json);
    EXPECT_EQ(usage["gpu_utilization_pct"], 25.0) << usage;
    const sched::RunKind kind = RunKindOf(*e.run.spec, "alice");
    JobSpec next = *e.run.spec;
    next.sizing.clear();
    SizeAutomatically(next, history_.Predict(kind), {});
    if (held_s == 0) {
      EXPECT_FALSE(usage.contains("gpu_held_back_pct")) << usage;
      EXPECT_EQ(history_.Predict(kind).util_high_pct, 25);
      EXPECT_EQ(next.gpu_milli, 300) << "25% + 20%: " << next.sizing;
      continue;
    }
    EXPECT_EQ(usage["gpu_held_back_pct"], 70.0) << usage;
    EXPECT_EQ(usage["gpu_demand_pct"], 83.3) << "25 s busy of the 30 s it was let run";
    EXPECT_DOUBLE_EQ(history_.Predict(kind).util_high_pct, 83.3);
    EXPECT_EQ(next.gpu_milli, 0) << "83% + 20% is a whole GPU's compute: " << next.sizing;
    EXPECT_THAT(next.sizing, ::testing::HasSubstr("83% busy (p95 of "));
    EXPECT_THAT(next.sizing, ::testing::HasSubstr("+ 20% is a whole GPU"));
    // A restart learns the same from the record.
    const RecordedUse use = UsageOf(rec);
    ASSERT_TRUE(use.util.has_value());
    EXPECT_DOUBLE_EQ(*use.util, 83.3);
  }
}

// A share's trial says its kernel mix too: the launches its region counted, per second of its run,
// and - with its GPU time - the mean GPU time of one (here 40 s of GPU time over 20,000 launches).
TEST_F(JobEndsTest, AShareTrialSaysItsKernelMix) {
  const json spec = {{"command", {"serve"}},
                     {"name", "serve"},
                     {"resources", {{"gpu_share", "50%"}}},
                     {"trial_s", 100}};
  RunningJob r = Running(spec);
  r.region = dir_ + "/regions/trial";
  r.gpu_milli = 500;
  r.stop = "trial";
  r.stop_reason = "its trial of 1m40s is over";
  host_.SetShareUse(r.id, {.busy_us = 40'000'000, .peak_bytes = uint64_t{1000} << 20});
  host_.SetKernelLaunches(r.region, 20'000);
  const int64_t id = r.id;
  Ending e{std::move(r), 143, true};
  ends_->Record(e, 200);
  const JobRecord rec = Stored(id);
  EXPECT_THAT(rec.reason,
              ::testing::HasSubstr("its trial of 1m40s is over: GPU 40% busy, peak GPU memory "
                                   "1000MiB, 20000 kernel launches (200/s, 2.0 ms of GPU time each "
                                   "on average); recommended: "));
  EXPECT_EQ(json::parse(rec.usage_json)["kernel_launches"], 20'000);
}

// The server's trial of an "auto" job never measured: it says what it measured, is re-queued
// under its id (preempted, then queued) with its stored spec sized from that - no longer a trial -
// and the re-queued job the dispatcher gets is that spec.
TEST_F(JobEndsTest, TheServersTrialOfAnAutoJobReQueuesItSizedFromWhatItMeasured) {
  JobSpec spec = *ParseJobSpec(R"({"command": ["serve"], "name": "serve",
                                   "resources": {"gpu_share": "auto", "gpu_memory": "auto"}})");
  SizeAutomatically(spec, sched::Prediction{}, {.trial_s = 120});
  ASSERT_EQ(spec.sizing_trial_s, 120);
  RunningJob r = Running(JobSpecToJson(spec));
  r.stop = "trial";
  r.stop_reason = "its trial of 2m is over";
  r.util_sum = 0.4 * 10, r.util_samples = 10;  // its GPU, held alone: 40% busy
  r.gpu_peak_mib = 3072;
  const int64_t id = r.id;
  Ending e{std::move(r), 143, true};
  ends_->Record(e, 220);
  const JobRecord rec = Stored(id);
  EXPECT_EQ(rec.state, JobState::kQueued);
  const auto events = *store_->Events(id);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2].state, JobState::kPreempted);
  EXPECT_THAT(events[events.size() - 2].reason,
              ::testing::HasSubstr("its trial of 2m is over: GPU 40% busy, peak GPU memory "
                                   "3072MiB; recommended: --gpu-share 50% --gpu-mem 3840MiB"));
  EXPECT_THAT(events[events.size() - 2].reason,
              ::testing::HasSubstr("; re-queued sized from it: gpu_share 50%: 40% busy"));
  const JobSpec stored = *ParseJobSpec(rec.spec_json);
  EXPECT_EQ(stored.sizing_trial_s, 0);
  EXPECT_EQ(stored.gpu_milli, 500);
  EXPECT_EQ(stored.gpu_memory_mib, 3840);
  ASSERT_TRUE(e.requeue.has_value());
  EXPECT_EQ(e.requeue->spec->gpu_milli, 500) << "the dispatcher queues the sized spec";
  EXPECT_EQ(e.requeue->spec->sizing_trial_s, 0);
}

// A job whose GPU memory was sized automatically and that failed with its peak at its size says
// it may have outgrown it, with the peak and what to ask; its size joins the history (it needed at
// least that), so that the next run of its kind is sized past it. One that failed far below its
// size, with nothing refused, is another failure.
TEST_F(JobEndsTest, AJobThatOutgrewItsAutomaticMemorySaysSoAndTheNextIsSizedPastIt) {
  const json spec = {{"command", {"serve"}},
                     {"name", "serve"},
                     {"resources", {{"gpu_share", "30%"}, {"gpu_memory", "auto"}}},
                     {"sized", {{"basis", "gpu_memory 4864MiB: ..."}, {"gpu_memory", "4864MiB"}}}};
  for (const uint64_t peak_mib : {4800, 1000}) {
    RunningJob r = Running(spec);
    ASSERT_EQ(r.spec->gpu_memory_mib, 4864);
    r.region = dir_ + "/regions/share";
    r.gpu_milli = 300;
    host_.SetShareUse(r.id, {.busy_us = 1'000'000, .peak_bytes = peak_mib << 20});
    const int64_t id = r.id;
    std::ofstream(JobFilePath(dir_, "exit", id)) << "1\n";
    Ending e{std::move(r), 1, true};
    ends_->Record(e, 200);
    const JobRecord rec = Stored(id);
    EXPECT_EQ(rec.state, JobState::kFailed);
    const sched::Prediction p = history_.Predict(RunKindOf(*e.run.spec, "alice"));
    if (peak_mib == 4800) {
      EXPECT_THAT(rec.reason,
                  ::testing::HasSubstr("it may have outgrown its automatic GPU memory: 4864MiB, "
                                       "measured peak 4800MiB"));
      EXPECT_THAT(rec.reason, ::testing::HasSubstr("or ask --gpu-mem 5888MiB"));
      EXPECT_EQ(p.gpu_memory_peak_mib, 4864) << "at least its size: it needed more";
    } else {
      EXPECT_EQ(rec.reason.find("outgrown"), std::string::npos) << rec.reason;
      EXPECT_EQ(p.memory_samples, 1) << "a failure far below its size is not history";
    }
  }
}

// A job whose GPU memory limit refused allocations says so at its failure - how many, the most it
// asked, what to ask next time - and keeps the figures in its usage; a job sized automatically
// teaches its kind's history what it asked, so that the next run is sized past it.
TEST_F(JobEndsTest, AJobItsLimitRefusedSaysWhatItAskedAndAnAutoOnesKindLearnsIt) {
  for (const bool automatic : {false, true}) {
    json spec = {{"command", {"train"}},
                 {"name", "train"},
                 {"resources", {{"gpu_share", "30%"}, {"gpu_memory", "1GiB"}}}};
    if (automatic) {
      spec["resources"]["gpu_memory"] = "auto";
      spec["sized"] = {{"basis", "gpu_memory 1024MiB: ..."}, {"gpu_memory", "1024MiB"}};
    }
    RunningJob r = Running(spec);
    ASSERT_EQ(r.spec->gpu_memory_mib, 1024);
    r.region = dir_ + "/regions/share";
    r.gpu_milli = 300;
    host_.SetShareUse(r.id, {.busy_us = 1'000'000,
                             .peak_bytes = uint64_t{500} << 20,
                             .refused = 2,
                             .wanted_bytes = (uint64_t{1300} << 20) - 5});
    const int64_t id = r.id;
    Ending e{std::move(r), 1, true};
    ends_->Record(e, 200);
    const JobRecord rec = Stored(id);
    EXPECT_EQ(rec.state, JobState::kFailed);
    EXPECT_THAT(rec.reason, ::testing::HasSubstr("exit code 1; its GPU memory limit of 1024MiB"));
    EXPECT_THAT(rec.reason, ::testing::HasSubstr("refused 2 allocations (measured peak 500MiB; it "
                                                 "asked for 1300MiB at most)"));
    const json usage = json::parse(rec.usage_json);
    EXPECT_EQ(usage["gpu_memory_refused"], 2) << usage;
    EXPECT_EQ(usage["gpu_memory_wanted_mib"], 1300) << "rounded up to a MiB";
    const sched::Prediction p = history_.Predict(RunKindOf(*e.run.spec, "alice"));
    if (automatic) {
      EXPECT_THAT(rec.reason, ::testing::HasSubstr("the next run of its kind is sized past it"));
      EXPECT_EQ(p.gpu_memory_peak_mib, 1300) << p.memory_basis;
    } else {
      EXPECT_THAT(rec.reason, ::testing::HasSubstr("ask --gpu-mem 1792MiB next time"));
      EXPECT_EQ(p.memory_samples, 0) << "a size asked outright is not the history's to learn";
    }
  }
}

// A failure is not history; a container whose client was stopped is removed by name; a cgroup
// still busy is left for the dispatcher to retry.
TEST_F(JobEndsTest, AStoppedContainerIsRemovedAndABusyCgroupLeftForLater) {
  RunningJob r = Running();
  r.container = true;
  r.cgroup = true;
  r.stop = "cancel";
  r.stop_reason = "cancelled by bob";
  host_.KeepBusy(r.id, 1);
  const int64_t id = r.id;
  Ending e{std::move(r), 143, true};
  ends_->Record(e, 150);
  EXPECT_EQ(Stored(id).state, JobState::kCancelled);
  EXPECT_EQ(Stored(id).reason, "cancelled by bob");
  EXPECT_EQ(host_.containers_removed(), std::vector<int64_t>{id});
  EXPECT_TRUE(e.cgroup_left);
  EXPECT_EQ(history_.Predict(RunKindOf(*e.run.spec, "alice")).samples, 0);
}

// Preempted with the engine's leave to re-queue: recorded preempted, then queued again, and handed
// back with its first submission time (its place in the queue).
TEST_F(JobEndsTest, APreemptedJobIsRecordedThenQueuedAgain) {
  RunningJob r = Running();
  r.stop = "preempt";
  r.stop_reason = "preempted for job 7";
  const int64_t id = r.id;
  Ending e{std::move(r), 143, true, /*requeue_wanted=*/true};
  ends_->Record(e, 150);
  const JobRecord rec = Stored(id);
  EXPECT_EQ(rec.state, JobState::kQueued);
  auto events = store_->Events(id);
  ASSERT_TRUE(events.ok() && events->size() >= 2);
  EXPECT_EQ((*events)[events->size() - 2].state, JobState::kPreempted);
  EXPECT_EQ((*events)[events->size() - 2].reason, "preempted for job 7");
  ASSERT_TRUE(e.requeue.has_value());
  EXPECT_EQ(e.requeue->id, id);
  EXPECT_EQ(e.requeue->submitted, 90);
  EXPECT_EQ(e.requeue->since, 150);
}

// The state folder on a 12 MiB tmpfs (the reserve is 8): filled to the last block, an end is
// recorded with the reserve (disk_full from then on); filled again, the next end is kept, its exit
// file with it; once there is room, Tend records it, removes its exit file and makes the reserve
// again.
TEST_F(JobEndsTest, AFullDiskLosesNoEnd) {
  ASSERT_EQ(geteuid(), 0u) << "this test mounts a small file system (root, as in CI)";
  ends_.reset();
  store_.reset();
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  ASSERT_EQ(mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=12m,mode=0755"), 0) << strerror(errno);
  mounted_ = true;
  OpenStore();
  ASSERT_TRUE(ends_->MakeReserve()) << strerror(errno);
  EXPECT_FALSE(ends_->disk_full());
  RunningJob a = Running(), b = Running(), c = Running();
  const int64_t ida = a.id, idb = b.id, idc = c.id;
  c.stop = "preempt";
  c.stop_reason = "preempted for job 7";
  auto fill = [&](const std::string& name) {
    const int fd = open((dir_ + "/" + name).c_str(), O_WRONLY | O_CREAT, 0600);
    static char block[1 << 16];
    while (write(fd, block, sizeof block) > 0) {
    }
    while (write(fd, block, 512) > 0) {
    }
    close(fd);
  };
  fill("fill-1");
  Ending ea{std::move(a), 0, true};
  ends_->Record(ea, 200);
  EXPECT_EQ(Stored(ida).state, JobState::kSucceeded) << "recorded with the reserve";
  EXPECT_TRUE(ends_->disk_full());
  EXPECT_FALSE(fs::exists(dir_ + "/reserve"));
  fill("fill-2");
  Ending eb{std::move(b), 0, true};
  ends_->Record(eb, 210);
  EXPECT_EQ(ends_->kept(), 1u);
  EXPECT_EQ(Stored(idb).state, JobState::kRunning) << "not recorded yet";
  EXPECT_TRUE(ExitFile(idb)) << "kept: a restart still tells how it ended";
  // A preempted job the rules put back in the queue: kept too, and queued again once recorded.
  Ending ec{std::move(c), 143, true, /*requeue_wanted=*/true};
  ends_->Record(ec, 212);
  EXPECT_FALSE(ec.requeue.has_value()) << "not recorded: not queued yet";
  EXPECT_EQ(ends_->kept(), 2u);
  EXPECT_THAT(ends_->Tend(215), ::testing::IsEmpty());
  EXPECT_EQ(ends_->kept(), 2u) << "still no room";
  EXPECT_TRUE(ends_->disk_full());
  fs::remove(dir_ + "/fill-1");
  fs::remove(dir_ + "/fill-2");
  const std::vector<QueuedJob> requeued = ends_->Tend(220);
  ASSERT_EQ(requeued.size(), 1u);
  EXPECT_EQ(requeued[0].id, idc);
  EXPECT_EQ(requeued[0].since, 220);
  EXPECT_EQ(Stored(idc).state, JobState::kQueued);
  const auto events = *store_->Events(idc);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2].state, JobState::kPreempted);
  EXPECT_EQ(events[events.size() - 2].at, 212) << "when it was stopped";
  EXPECT_EQ(ends_->kept(), 0u);
  const JobRecord rec = Stored(idb);
  EXPECT_EQ(rec.state, JobState::kSucceeded);
  ASSERT_TRUE(rec.ended_at.has_value());
  EXPECT_EQ(*rec.ended_at, 210) << "when it ended, not when it was recorded";
  EXPECT_FALSE(ExitFile(idb));
  EXPECT_FALSE(ends_->disk_full());
  EXPECT_TRUE(fs::exists(dir_ + "/reserve"));
}

// What a user's jobs left in shared memory: their files go, others' and root's stay.
TEST(RemoveUserShm, RemovesOnlyThatUsersFiles) {
  ASSERT_EQ(geteuid(), 0u) << "files of other users are made by chown (root, as in CI)";
  char tmpl[] = "/tmp/tessera-shm-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  for (const auto& [name, uid] : {std::pair{"a1", 1000}, {"a2", 1000}, {"b", 1001}, {"r", 0}}) {
    const std::string p = dir + "/" + name;
    std::ofstream(p) << "x";
    ASSERT_EQ(chown(p.c_str(), uid, uid), 0);
  }
  EXPECT_EQ(RemoveUserShm(dir, 1000), 2u);
  EXPECT_FALSE(fs::exists(dir + "/a1"));
  EXPECT_TRUE(fs::exists(dir + "/b"));
  EXPECT_TRUE(fs::exists(dir + "/r"));
  EXPECT_EQ(RemoveUserShm(dir, 0), 0u) << "root's files are never a job's leftovers";
  EXPECT_EQ(RemoveUserShm("", 1001), 0u);
  fs::remove_all(dir);
}

// A file a live process of the user still holds - open, or mapped after its descriptor was closed
// (POSIX shared memory, a semaphore) - is no leftover: kept until nothing holds it.
TEST(RemoveUserShm, KeepsWhatALiveProcessOfTheUserHolds) {
  ASSERT_EQ(geteuid(), 0u) << "files of other users are made by chown (root, as in CI)";
  char tmpl[] = "/tmp/tessera-shm-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  for (const char* name : {"open", "mapped", "left"}) {
    std::ofstream(dir + "/" + name) << "x";
    ASSERT_EQ(chown((dir + "/" + name).c_str(), 1000, 1000), 0);
  }
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t kid = fork();
  if (kid == 0) {
    // A process of the user outside the server: one file open, one mapped and closed.
    if (setgid(1000) != 0 || setuid(1000) != 0) _exit(2);
    const int open_fd = open((dir + "/open").c_str(), O_RDWR);
    const int map_fd = open((dir + "/mapped").c_str(), O_RDWR);
    if (open_fd < 0 || map_fd < 0) _exit(3);
    if (mmap(nullptr, 1, PROT_READ, MAP_SHARED, map_fd, 0) == MAP_FAILED) _exit(4);
    close(map_fd);
    close(done[1]);
    (void)!write(ready[1], "r", 1);
    char c;
    (void)!read(done[0], &c, 1);  // until the test closes its end
    _exit(0);
  }
  close(ready[1]);
  close(done[0]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  EXPECT_EQ(RemoveUserShm(dir, 1000), 1u);
  EXPECT_FALSE(fs::exists(dir + "/left"));
  EXPECT_TRUE(fs::exists(dir + "/open"));
  EXPECT_TRUE(fs::exists(dir + "/mapped"));
  close(done[1]);
  int status = 0;
  ASSERT_EQ(waitpid(kid, &status, 0), kid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(RemoveUserShm(dir, 1000), 2u) << "nothing holds them now";
  close(ready[0]);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::server
