// The executor side's table alone (running_jobs.h): processes on a FakeLauncher behind a
// FakeJobHost, on a fake clock; logs and exit files in a temporary folder.
#include "tessera/server/running_jobs.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "tessera/core/clock.h"
#include "tessera/server/fake_job_host.h"
#include "tessera/server/fake_launcher.h"
#include "tessera/server/store.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;

class RunningJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-running-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/logs");
    fs::create_directories(dir_ + "/exit");
    runs_ = std::make_unique<RunningJobs>(host_, RunningJobs::Options{.state_dir = dir_});
  }
  void TearDown() override { fs::remove_all(dir_); }

  double Now() const { return core::Seconds(clock_.Now()); }
  void Advance(double s) {
    clock_.Advance(std::chrono::duration_cast<core::Duration>(std::chrono::duration<double>(s)));
  }
  // A job running `seconds` on `gpus`, tracked.
  RunningJob& Start(int64_t id, double seconds, std::vector<int> gpus = {0}) {
    LaunchSpec spec;
    spec.job_id = id;
    spec.argv = {"sleep", std::to_string(seconds)};
    auto l = launcher_.Start(spec);
    EXPECT_TRUE(l.ok()) << l.status();
    RunningJob r;
    r.id = id;
    r.pid = l->pid;
    r.start_time = l->start_time;
    r.gpus = std::move(gpus);
    r.started = Now();
    r.grace_period_s = 5;
    return runs_->Add(std::move(r));
  }
  std::vector<int> Signals(pid_t pid) const {
    std::vector<int> out;
    for (const auto& [p, sig] : launcher_.signals()) {
      if (p == pid) out.push_back(sig);
    }
    return out;
  }

  std::string dir_;
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(1'800'000'000))};
  FakeLauncher launcher_{clock_, /*stop_latency_s=*/1000};  // SIGTERM is ignored
  FakeJobHost host_{launcher_};
  std::unique_ptr<RunningJobs> runs_;  // made in SetUp, with dir_
};

TEST_F(RunningJobsTest, AStopIsSigtermOnceThenSigkillWhenTheGraceHasPassed) {
  RunningJob& r = Start(1, 100);
  const pid_t pid = r.pid;
  runs_->RequestStop(r, "cancel", "cancelled by alice", Now());
  runs_->RequestStop(r, "preempt", "preempted for job 2", Now());  // the first reason stays
  EXPECT_EQ(r.stop, "cancel");
  EXPECT_EQ(r.stop_reason, "cancelled by alice");
  EXPECT_EQ(Signals(pid), std::vector<int>{SIGTERM});
  Advance(4.9);
  EXPECT_TRUE(runs_->Check(Now()).empty());
  EXPECT_EQ(Signals(pid), std::vector<int>{SIGTERM});  // within its grace
  Advance(0.1);
  EXPECT_TRUE(runs_->Check(Now()).empty());
  EXPECT_EQ(Signals(pid), (std::vector<int>{SIGTERM, SIGKILL}));
  EXPECT_TRUE(runs_->Find(1)->killed);
  // The next look finds it ended, killed; it is told once and stays in the table until taken.
  const auto ended = runs_->Check(Now());
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].first, 1);
  EXPECT_EQ(ended[0].second, 128 + SIGKILL);
  const RunningJob gone = runs_->Take(1);
  EXPECT_EQ(gone.stop, "cancel");
  EXPECT_EQ(runs_->size(), 0u);
  EXPECT_EQ(Signals(pid).size(), 2u);  // nothing more was sent
}

// An elastic job resized by signal: told once (its file rewritten when asked again), and when it
// does not answer in its grace, stopped to be started again ("restart") or, asked to grow, left as
// it is ("keep"); a shrink is carried out whatever it declared; another stop takes a resize's
// place.
TEST_F(RunningJobsTest, AResizeBySignalIsToldOnceAndAnUnansweredOneIsCarriedOutAsDeclared) {
  fs::create_directories(dir_ + "/resize");
  fs::create_directories(dir_ + "/stop");
  auto spec = [](const std::string& unanswered) {
    auto s = std::make_shared<JobSpec>();
    s->gpus = 1;
    s->gpus_max = 4;
    s->resize_by = "signal";
    s->resize_grace_s = 10;
    s->resize_unanswered = unanswered;
    return std::shared_ptr<const JobSpec>(s);
  };
  RunningJob& grows = Start(1, 100, {0});
  grows.spec = spec("restart");
  const pid_t pid = grows.pid;
  runs_->AskResize(grows, {0, 1, 2}, {"GPU-a", "GPU-b", "GPU-c"}, Now());
  EXPECT_EQ(Signals(pid), std::vector<int>{SIGUSR1});
  std::ifstream in(ResizeFilePath(dir_, 1));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("TESSERA_RESIZE_GPUS=3\nCUDA_VISIBLE_DEVICES=GPU-a,GPU-b,GPU-c\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(fs::status(ResizeFilePath(dir_, 1)).permissions() & fs::perms::all,
            fs::perms::owner_read);
  EXPECT_EQ(ReadResizeFile(dir_, 1), Now());
  Advance(4);
  runs_->AskResize(grows, {0, 1, 2, 3}, {"GPU-a", "GPU-b", "GPU-c", "GPU-d"}, Now());
  EXPECT_EQ(Signals(pid), std::vector<int>{SIGUSR1}) << "signalled once";
  EXPECT_EQ(grows.resize_to, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ReadResizeFile(dir_, 1), Now() - 4) << "asked when it was first told";
  // It exits 75: the end its resize asked. Another code is its own end.
  EXPECT_TRUE(RunningJobs::EndsForResize(grows, kResizeExitCode));
  EXPECT_FALSE(RunningJobs::EndsForResize(grows, 0));
  EXPECT_TRUE(RunningJobs::EndsForResize(grows, 128 + SIGUSR1)) << "killed by it: no handler yet";
  EXPECT_FALSE(RunningJobs::EndsForResize(grows, 128 + SIGSEGV));
  // Its grace passes unanswered: stopped to be started again on its new size.
  Advance(6);
  EXPECT_TRUE(runs_->Check(Now()).empty());
  EXPECT_EQ(grows.stop, "resize");
  EXPECT_EQ(Signals(pid), (std::vector<int>{SIGUSR1, SIGTERM}));
  EXPECT_TRUE(RunningJobs::EndsForResize(grows, std::nullopt));
  // A cancel meanwhile is its end: it is not started again.
  runs_->RequestStop(grows, "cancel", "cancelled by alice", Now());
  EXPECT_EQ(grows.stop, "cancel");
  EXPECT_FALSE(RunningJobs::EndsForResize(grows, std::nullopt));
  EXPECT_FALSE(fs::exists(ResizeFilePath(dir_, 1)));
  EXPECT_EQ(Signals(pid), (std::vector<int>{SIGUSR1, SIGTERM})) << "no second SIGTERM";

  // Declared "keep": a growth not answered is given up, the job told nothing more.
  RunningJob& keeps = Start(2, 100, {1});
  keeps.spec = spec("keep");
  runs_->AskResize(keeps, {1, 2}, {"GPU-b", "GPU-c"}, Now());
  Advance(10);
  EXPECT_TRUE(runs_->Check(Now()).empty());
  EXPECT_TRUE(keeps.stop.empty());
  EXPECT_TRUE(keeps.resize_to.empty());
  EXPECT_EQ(runs_->TakeKept(), std::vector<int64_t>{2});
  EXPECT_TRUE(runs_->TakeKept().empty());
  EXPECT_FALSE(fs::exists(ResizeFilePath(dir_, 2)));
  EXPECT_EQ(Signals(keeps.pid), std::vector<int>{SIGUSR1});
  // ...but a shrink not answered is carried out: a job waits for the GPUs.
  runs_->AskResize(keeps, {1}, {"GPU-b"}, Now());  // what it runs on, nothing asked: nothing
  EXPECT_EQ(Signals(keeps.pid), std::vector<int>{SIGUSR1});
  keeps.gpus = {1, 2};
  runs_->AskResize(keeps, {1}, {"GPU-b"}, Now());
  Advance(10);
  runs_->Check(Now());
  EXPECT_EQ(keeps.stop, "resize");
  EXPECT_EQ(Signals(keeps.pid), (std::vector<int>{SIGUSR1, SIGUSR1, SIGTERM}));

  // By restart: stopped at once, its stop kept for a restarted server.
  RunningJob& restarts = Start(3, 100, {3});
  auto by_restart = std::make_shared<JobSpec>(*spec("restart"));
  by_restart->resize_by = "restart";
  restarts.spec = by_restart;
  runs_->AskResize(restarts, {2, 3}, {"GPU-c", "GPU-d"}, Now());
  EXPECT_EQ(Signals(restarts.pid), std::vector<int>{SIGTERM});
  EXPECT_FALSE(fs::exists(ResizeFilePath(dir_, 3)));
  ASSERT_TRUE(ReadStopFile(dir_, 3).has_value());
  EXPECT_EQ(ReadStopFile(dir_, 3)->why, "resize");
  // A job that is not resizable is never resized.
  RunningJob& fixed = Start(4, 100, {0});
  fixed.spec = std::make_shared<const JobSpec>();
  runs_->AskResize(fixed, {0, 1}, {"GPU-a", "GPU-b"}, Now());
  EXPECT_TRUE(Signals(fixed.pid).empty());
  EXPECT_TRUE(fixed.resize_to.empty());
}

// A job restarted for its resizes has a cgroup per run: its end counts them all.
TEST(RunningJob, ItsUsageAddsWhatItsRunsBeforeItsRestartsUsed) {
  RunningJob r;
  const CgroupUsage last{.cpu_seconds = 2.5, .peak_memory_bytes = 100, .oom_kills = 1};
  EXPECT_EQ(r.WithEarlier(last).cpu_seconds, 2.5) << "never restarted: its one run";
  r.restarts = 1;
  EXPECT_EQ(r.WithEarlier(last).cpu_seconds, 2.5) << "nothing known of the run before";
  r.earlier = {.cpu_seconds = 4, .peak_memory_bytes = 300, .oom_kills = 2};
  const CgroupUsage all = r.WithEarlier(last);
  EXPECT_EQ(all.cpu_seconds, 6.5);
  EXPECT_EQ(all.peak_memory_bytes, 300);
  EXPECT_EQ(all.oom_kills, 3);
  EXPECT_EQ(r.WithEarlier(CgroupUsage{}).cpu_seconds, 4) << "the last run's not known";
}

TEST_F(RunningJobsTest, AJobPastItsMaxRuntimeIsStoppedAsATimeout) {
  RunningJob& r = Start(1, 100);
  r.max_runtime_s = 10;
  Advance(10);
  EXPECT_TRUE(runs_->Check(Now()).empty());
  EXPECT_TRUE(runs_->Find(1)->stop.empty());
  Advance(0.5);
  EXPECT_TRUE(runs_->Check(Now()).empty());
  EXPECT_EQ(runs_->Find(1)->stop, "timeout");
  EXPECT_EQ(runs_->Find(1)->stop_reason, "ran past its max runtime of 10 s");
}

TEST_F(RunningJobsTest, AJobOverItsLogLimitIsStoppedAndLogsAreMeasuredAboutOnceASecond) {
  RunningJobs runs(host_, {.state_dir = dir_, .max_log_bytes_per_job = 2 << 20});
  LaunchSpec spec;
  spec.argv = {"sleep", "100"};
  RunningJob r;
  r.id = 7;
  r.pid = launcher_.Start(spec)->pid;
  r.tasks = 2;
  r.grace_period_s = 5;
  runs.Add(r);
  runs.Check(Now());  // measured now: no logs yet
  // Task 1's stderr grows past the limit (task 0's logs are the job's own .out/.err).
  const std::string err = TaskLogPath(dir_, 7, 1, ".err");
  std::ofstream(err).close();
  fs::resize_file(err, (2 << 20) + 1);
  EXPECT_EQ(runs.LogBytes(*runs.Find(7)), uint64_t{(2 << 20) + 1});
  Advance(0.5);
  runs.Check(Now());
  EXPECT_TRUE(runs.Find(7)->stop.empty()) << "measured again within the second";
  Advance(0.5);
  runs.Check(Now());
  EXPECT_EQ(runs.Find(7)->stop, "logs");
  EXPECT_NE(runs.Find(7)->stop_reason.find("over the limit of 2 MiB"), std::string::npos);
}

TEST_F(RunningJobsTest, AnAdoptedJobsEndIsReadFromItsExitFile) {
  RunningJob& r = Start(3, 10);
  r.adopted = true;  // not this process's child: never reaped, looked at as a pid
  Advance(10);
  std::ofstream(JobFilePath(dir_, "exit", 3)) << "4\n";
  const auto ended = runs_->Check(Now());
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].second, 4);
}

TEST_F(RunningJobsTest, AFailedGpuStopsOnlyTheJobsOnIt) {
  Start(1, 100, {0});
  Start(2, 100, {1, 2});
  Start(3, 100, {});
  runs_->StopOn(2, "unhealthy", "GPU 2 turned unhealthy: XID 79", Now());
  EXPECT_TRUE(runs_->Find(1)->stop.empty());
  EXPECT_EQ(runs_->Find(2)->stop, "unhealthy");
  EXPECT_TRUE(runs_->Find(3)->stop.empty());
}

TEST_F(RunningJobsTest, UseIsMeasuredWhereAJobHoldsItsGpusAloneAndSharesByTheirOwnReadings) {
  Start(1, 100, {0});  // alone on GPU 0
  Start(2, 100, {1});  // beside another job on GPU 1
  RunningJob& s = Start(3, 100, {2});
  s.region = dir_ + "/regions/3.region";
  s.gpu_milli = 500;
  RunningJob& t = Start(4, 100, {2});
  t.region = dir_ + "/regions/4.region";
  runs_->NoteSharing(*runs_->Find(4));
  EXPECT_TRUE(runs_->Find(3)->shared_gpu);
  EXPECT_TRUE(runs_->Find(4)->shared_gpu);
  EXPECT_FALSE(runs_->Find(1)->shared_gpu);
  std::vector<devices::GpuTelemetry> telemetry(3);
  telemetry[0].utilization = 0.8;
  telemetry[0].memory_used_bytes = uint64_t{3000} << 20;
  telemetry[1].utilization = 0.1;
  telemetry[2].utilization = 0.5;
  const std::vector<int> holders = {1, 2, 2};
  runs_->Measure(telemetry, holders,
                 {{3, {.busy_us = 2'000'000, .peak_bytes = uint64_t{700} << 20}}});
  telemetry[0].utilization = 0.4;
  // The share's arbiter count started again (a process of it came back): what was counted stays.
  runs_->Measure(telemetry, holders,
                 {{3, {.busy_us = 1'000'000, .peak_bytes = uint64_t{600} << 20}}});
  Advance(10);
  EXPECT_DOUBLE_EQ(*runs_->Find(1)->GpuUtilization(Now()), 60.0);
  EXPECT_EQ(runs_->Find(1)->gpu_peak_mib, 3000);
  EXPECT_FALSE(runs_->Find(2)->GpuUtilization(Now()).has_value());  // never alone on its GPU
  EXPECT_EQ(runs_->Find(3)->arbiter_busy_us, 3'000'000u);
  EXPECT_DOUBLE_EQ(*runs_->Find(3)->GpuUtilization(Now()), 30.0);  // 3 s of GPU time in 10 s
  EXPECT_EQ(runs_->Find(3)->gpu_peak_mib, 700);
}

// A restarted server re-adopts shares without knowing which ran beside another (the mark is not
// stored): a share re-adopted with another on its GPU, or one whose GPU another share had when it
// started, or got later and gave up while the server was down, ran shared; one that never had
// company, or whose company was on other GPUs, a whole GPU before it, or ended before it started,
// did not.
TEST_F(RunningJobsTest, ReAdoptedSharesAreToldAgainWhetherTheyRanBesideAnother) {
  auto share = [&](int64_t id, std::vector<int> gpus, double started) -> RunningJob& {
    RunningJob& r = Start(id, 100, std::move(gpus));
    r.region = dir_ + "/regions/" + std::to_string(id) + ".region";
    r.gpu_milli = 300;
    r.started = started;
    r.adopted = true;
    return r;
  };
  const double t = Now();
  share(1, {0}, t - 50);  // beside 2, both re-adopted
  share(2, {0}, t - 40);
  share(3, {1}, t - 50);  // beside job 10 (ended while the server was down)
  share(4, {2}, t - 50);  // job 11 on GPUs 2 and 3, job 12 a whole GPU, 13 ended before it
  share(5, {3}, t - 50);  // its partner ended a second after it started
  RunningJob& fresh = Start(6, 100, {4});  // started by this server: NoteSharing's to mark
  fresh.region = dir_ + "/regions/6.region";
  auto ended = [](int64_t id, const char* placement, double started, double ended_at) {
    JobRecord r;
    r.id = id;
    r.placement_json = placement;
    r.started_at = started;
    r.ended_at = ended_at;
    return r;
  };
  const std::vector<JobRecord> period = {
      ended(10, R"({"gpus":[{"index":1}],"milli_per_gpu":500})", t - 60, t),
      ended(11, R"({"gpus":[{"index":2},{"index":3}],"milli_per_gpu":500})", t - 60, t - 10),
      ended(12, R"({"gpus":[{"index":2}],"milli_per_gpu":1000})", t - 90, t - 45),
      ended(13, R"({"gpus":[{"index":2}],"milli_per_gpu":200})", t - 90, t - 51),
      ended(14, R"({"gpus":[{"index":3}],"milli_per_gpu":200})", t - 90, t - 49),
      ended(15, R"({"gpus":[{"index":4}],"milli_per_gpu":200})", t - 90, t - 1),
      ended(16, "not json", t - 90, t - 1),
  };
  EXPECT_EQ(runs_->EarliestAdoptedShare(), t - 50);
  runs_->NoteSharingSince(period);
  EXPECT_TRUE(runs_->Find(1)->shared_gpu);
  EXPECT_TRUE(runs_->Find(2)->shared_gpu);
  EXPECT_TRUE(runs_->Find(3)->shared_gpu) << "its partner ended while the server was down";
  EXPECT_FALSE(runs_->Find(4)->shared_gpu)
      << "other GPUs, a whole GPU, a share that ended before it started";
  EXPECT_TRUE(runs_->Find(5)->shared_gpu);
  EXPECT_FALSE(runs_->Find(6)->shared_gpu) << "not re-adopted: what this server saw is its mark";
}

}  // namespace
}  // namespace tessera::server
