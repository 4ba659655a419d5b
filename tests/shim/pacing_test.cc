// Compute shares and priority: cuda_client processes under the intercept library contend for the
// fake driver's virtual GPU, whose clock is shared between processes (FAKE_CUDA_CLOCK), so the GPU
// time each job gets is decided by the arbiter, not by the test. Each run measures the virtual GPU
// time of the kernels a process finished in the same window (300-1800 ms after its start). These
// tests run alone (RUN_SERIAL): they measure time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "tessera/core/numeric.h"
#include "tessera/shim/arbiter.h"

namespace {

// The random stops of the tests below: seeded by TESSERA_TEST_SEED when set (to replay a failure),
// else 1; every failure message names the seed.
unsigned TestSeed() {
  const char* v = getenv("TESSERA_TEST_SEED");
  return v && *v ? static_cast<unsigned>(strtoul(v, nullptr, 10)) : 1u;
}

using namespace tessera::shim_test;

constexpr double kWindowUs = 1500000;

// A start shared by several processes (WORK_START_MS: CLOCK_MONOTONIC, ms), so that their windows
// are the same stretch of time however long each took to start.
std::string SharedStartMs(std::chrono::steady_clock::time_point origin) {
  return std::to_string(
      std::chrono::duration<double, std::milli>(origin.time_since_epoch()).count());
}

struct Job {
  std::string settings;  // environment
  std::string work;      // the work command
  std::string prefix;    // before the command ("unshare --time --monotonic 5 ")
  std::string id;        // TESSERA_JOB_ID; empty: job<index> (processes of one job share an id)
};

// Runs the jobs at once; the GPU microseconds each finished in the window. `maker`: the settings
// of a process that makes the arbiter file first (as the server or the node agent does); none:
// whichever job comes first makes it.
std::vector<double> Contend(const std::vector<Job>& jobs, bool preload = true,
                            const std::string* maker = nullptr) {
  std::string arbiter = TempPath("arbiter");
  std::string clock = TempPath("clock");
  std::filesystem::remove(arbiter);
  std::filesystem::remove(clock);
  if (maker != nullptr) {
    Env env{.extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
                     " TESSERA_JOB_ID=maker " + *maker};
    EXPECT_EQ(RunClient(env, "link", "launch:1"), "ok\n");
  }
  std::vector<FILE*> pipes;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Env env{.preload = preload,
            .extra =
                "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
                " TESSERA_JOB_ID=" + (jobs[i].id.empty() ? "job" + std::to_string(i) : jobs[i].id) +
                " " + jobs[i].settings};
    pipes.push_back(
        popen((jobs[i].prefix + Command(env, "link", jobs[i].work + " 2>&1")).c_str(), "r"));
  }
  std::vector<double> out;
  for (FILE* p : pipes) {
    char line[256] = "";
    double us = -1;
    while (fgets(line, sizeof line, p)) {
      // (a tenant told that its own pacing settings are not used says so once: expected)
      if (strstr(line, "the arbiter's settings are its maker's") != nullptr) continue;
      if (sscanf(line, "gpu_us %lf", &us) != 1) ADD_FAILURE() << "unexpected output: " << line;
    }
    pclose(p);
    out.push_back(us);
  }
  return out;
}

const char* kSaturate = "work:2000:500:4:0:300:1800";  // 0.5 ms kernels, 4 at a time, no pause

TEST(Pacing, ComputeSharesThirtySeventy) {
  std::vector<double> us = Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30%", kSaturate},
                                    {"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate}});
  ASSERT_GT(us[0] + us[1], 0.6 * kWindowUs) << "the GPU stays busy";
  EXPECT_NEAR(100 * us[0] / (us[0] + us[1]), 30, 5) << us[0] << " vs " << us[1];
}

// A job of several processes (an inference server's workers, a data-parallel job's ranks on one
// GPU) gets its share as a job: at a handover every process of the holder drains, not only the
// one that noticed, so their queued work does not run in the next holder's slice.
TEST(Pacing, AJobOfSeveralProcessesGetsItsShareAsAJob) {
  const char* work = "work:2000:1000:4:0:300:1800";  // 4 x 1 ms per synchronize
  // 16 processes only where there are cores for them: on 2 (CI's machines) their drains at a
  // handover queue for the CPU longer than a slice, and the job got 35% for its 30% in 1 run of 4
  // (74% at 8 processes before the fix); the issue's own measure went to 8.
  std::vector<int> counts = {2, 4, 8};
  if (std::thread::hardware_concurrency() >= 4) counts.push_back(16);
  for (int procs : counts) {
    SCOPED_TRACE(std::to_string(procs) + " processes");
    std::vector<Job> jobs;
    for (int i = 0; i < procs; ++i)
      jobs.push_back({"TESSERA_CUDA_COMPUTE_SHARE=30%", work, "", "many"});
    jobs.push_back({"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate, "", "other"});
    std::vector<double> us = Contend(jobs);
    double many = 0;
    for (int i = 0; i < procs; ++i) many += us[i];
    const double other = us.back();
    ASSERT_GT(many + other, 0.6 * kWindowUs) << "the GPU stays busy";
    EXPECT_NEAR(100 * many / (many + other), 30, 5) << many << " vs " << other;
  }
}

// Kernels far longer than a slice (a 200 ms kernel; 200 x 10 us and 4 x 50 ms per synchronize):
// the slice a co-tenant takes while one still runs is the long kernel's owner's, not the
// co-tenant's (it got 58% of the GPU for its 30% before).
TEST(Pacing, WorkRunningPastASliceIsBilledToItsOwner) {
  const char* other = "work:4000:500:4:0:300:3800";
  for (const char* work : {"work:4000:200000:1:0:300:3800", "work:4000:50000:4:0:300:3800:small"}) {
    SCOPED_TRACE(work);
    std::vector<double> us = Contend(
        {{"TESSERA_CUDA_COMPUTE_SHARE=30%", work}, {"TESSERA_CUDA_COMPUTE_SHARE=70%", other}});
    ASSERT_GT(us[0] + us[1], 0.6 * 3500000) << "the GPU stays busy";
    EXPECT_NEAR(100 * us[0] / (us[0] + us[1]), 30, 5) << us[0] << " vs " << us[1];
  }
}

TEST(Pacing, ATenantInATimeNamespaceNeitherHoldsNorLosesTheGpu) {
  // A tenant whose CLOCK_MONOTONIC is shifted (a time namespace: `unshare -Ur -T`, unprivileged,
  // or a container restored from a checkpoint) reads times seconds apart from the others'. The
  // arbiter compares times across processes: ahead, it held the GPU for the offset while the
  // others hung in their launches; behind, it waited. Shares hold either way.
  ASSERT_EQ(tessera::test::Capture("unshare --time --monotonic 5 true").code, 0)
      << "this test needs time namespaces (Linux 5.6+, and root or user namespaces)";
  for (const char* offset : {"5", "3"}) {
    SCOPED_TRACE(std::string("offset ") + offset + " s");
    const std::string shifted = std::string("unshare --time --monotonic ") + offset + " ";
    std::vector<double> us = Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30%", kSaturate, shifted},
                                      {"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate}});
    ASSERT_GT(us[0] + us[1], 0.6 * kWindowUs) << "the GPU stays busy: nobody is frozen";
    EXPECT_NEAR(100 * us[0] / (us[0] + us[1]), 30, 5) << us[0] << " vs " << us[1];
    us = Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30%", kSaturate},
                  {"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate, shifted}});
    ASSERT_GT(us[0] + us[1], 0.6 * kWindowUs) << "the GPU stays busy: nobody is frozen";
    EXPECT_NEAR(100 * us[0] / (us[0] + us[1]), 30, 5) << us[0] << " vs " << us[1];
  }
}

// The pacing settings are the arbiter file's (its maker's: the server, the agent): a tenant that
// sets a queue bound of 10 s and a slice of 1 s in its own environment runs 200 x 1 ms deep queues
// within its 30% like any other.
TEST(Pacing, ATenantsOwnPacingSettingsDoNotReopenTheDeepQueue) {
  const std::string defaults;
  const std::string greedy = "TESSERA_CUDA_QUEUE_US=10000000 TESSERA_CUDA_TIMESLICE_US=1000000";
  const std::string deep = "work:2000:1000:200:0:300:1800";  // 200 x 1 ms per synchronize
  std::vector<double> us = Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30% " + greedy, deep},
                                    {"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate}},
                                   true, &defaults);
  ASSERT_GT(us[0] + us[1], 0.6 * kWindowUs);
  EXPECT_NEAR(100 * us[0] / (us[0] + us[1]), 30, 5) << us[0] << " vs " << us[1];
  // And it is told so.
  std::string arbiter = TempPath("arbiter-said");
  std::filesystem::remove(arbiter);
  Env maker{.extra = "TESSERA_CUDA_ARBITER=" + arbiter + " TESSERA_JOB_ID=maker"};
  ASSERT_EQ(RunClient(maker, "link", "launch:1"), "ok\n");
  Env tenant{.extra = "TESSERA_CUDA_ARBITER=" + arbiter + " TESSERA_JOB_ID=t " + greedy};
  EXPECT_THAT(RunClient(tenant, "link", "launch:1 2>&1"),
              ::testing::HasSubstr("the arbiter's settings are its maker's (slice 5000 us, queue "
                                   "5000 us, idle 1000 us)"));
  std::filesystem::remove(arbiter);
}

TEST(Pacing, WithoutTheLibraryTheGpuIsSharedByQueueing) {
  // The same two jobs unpaced: first come, first served splits the GPU evenly, whatever the shares.
  std::vector<double> us = Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30%", kSaturate},
                                    {"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate}},
                                   /*preload=*/false);
  EXPECT_NEAR(100 * us[0] / (us[0] + us[1]), 50, 10) << us[0] << " vs " << us[1];
}

TEST(Pacing, EveryLaunchKindIsPaced) {
  // Cooperative launches and graphs against extended launches: none escapes the shares.
  std::vector<double> us =
      Contend({{"TESSERA_CUDA_COMPUTE_SHARE=70% FAKE_CUDA_GRAPH_US=500",
                "work:2000:500:4:0:300:1800:graph"},
               {"TESSERA_CUDA_COMPUTE_SHARE=30%", "work:2000:500:4:0:300:1800:coop"}});
  EXPECT_NEAR(100 * us[1] / (us[0] + us[1]), 30, 5) << us[0] << " vs " << us[1];
  us = Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30%", "work:2000:500:4:0:300:1800:ex"},
                {"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate}});
  EXPECT_NEAR(100 * us[0] / (us[0] + us[1]), 30, 5) << us[0] << " vs " << us[1];
}

TEST(Pacing, WorkConservingUsesIdleTimeCappedDoesNot) {
  std::vector<double> alone = Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30%", kSaturate}});
  EXPECT_GT(alone[0], 0.6 * kWindowUs) << "alone, a 30% job may use the whole GPU by default";
  std::vector<double> capped =
      Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30% TESSERA_CUDA_WORK_CONSERVING=0", kSaturate}});
  // The share is of the GPU time the job can use: measured against the same job running uncapped
  // alone, so the client's own time between kernels (sync wake-ups, 10-20% of the window on a busy
  // 2-core machine) is not counted against the library.
  EXPECT_NEAR(100 * capped[0] / alone[0], 30, 5) << "capped: its share even when the GPU is idle";
}

// One job alone, `settings` its environment: what the arbiter charged it, how long it was held
// back, and its run time (from before its process started to after it ended: a little more than
// the arbiter saw, as the server's or the agent's run time of a job is).
struct Measured {
  double busy_us = 0, held_us = 0, run_us = 0;
  double Demand() const { return tessera::core::DemandPct(busy_us, held_us, run_us); }
};
Measured RunAlone(const std::string& settings, const std::string& work) {
  std::string arbiter = TempPath("arbiter");
  std::string clock = TempPath("clock");
  std::filesystem::remove(arbiter);
  std::filesystem::remove(clock);
  Env env{.extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
                   " TESSERA_JOB_ID=alone " + settings};
  const auto start = std::chrono::steady_clock::now();
  const std::string out = RunClient(env, "link", work);
  const double run_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(out, ::testing::StartsWith("gpu_us")) << settings;
  const int gpu = 0;
  const tessera::shim::ArbiterUse use =
      tessera::shim::ArbiterJobUse(arbiter.c_str(), &gpu, 1, tessera::shim::ArbiterJobKey("alone"));
  return {static_cast<double>(use.busy_us), static_cast<double>(use.held_us), run_us};
}

// A capped share is measured at most at its share; how long its launches were held back tells
// what it would have used: the same job's use alone, whether it only launches (about all of the
// GPU) or pauses between its batches (about 37% alone: then it waits less, and says 37%, not
// all of it).
TEST(Pacing, AJobHeldToItsShareSaysWhatItWouldHaveUsed) {
  for (const char* work : {"work:1500:500:4:0:0:1500", "work:1500:500:4:6000:0:1500"}) {
    SCOPED_TRACE(work);
    const Measured alone = RunAlone("TESSERA_CUDA_COMPUTE_SHARE=100%", work);
    const Measured capped =
        RunAlone("TESSERA_CUDA_COMPUTE_SHARE=20% TESSERA_CUDA_WORK_CONSERVING=0", work);
    printf(
        "%s: alone %.1f%% busy; capped at 20%%: %.1f%% busy, held back %.1f%%, would have used "
        "%.1f%%\n",
        work, 100 * alone.busy_us / alone.run_us, 100 * capped.busy_us / capped.run_us,
        100 * capped.held_us / capped.run_us, capped.Demand());
    EXPECT_LT(alone.held_us, 0.02 * alone.run_us) << "alone on its GPU, nothing holds it back";
    EXPECT_LT(100 * capped.busy_us / capped.run_us, 25) << "capped: charged its share at most";
    EXPECT_GT(capped.held_us, 0.2 * capped.run_us) << "its launches waited for its share";
    // What it would have used: what it used alone (the client's own time between kernels, 10-20%
    // of its run on a busy 2-core machine, is in both).
    EXPECT_NEAR(capped.Demand(), alone.Demand(), 12)
        << "alone " << alone.busy_us << "/" << alone.run_us << " us busy; capped " << capped.busy_us
        << " busy, " << capped.held_us << " held of " << capped.run_us;
    EXPECT_GT(capped.Demand(), 100 * capped.busy_us / capped.run_us + 15);
  }
}

TEST(Pacing, HigherPriorityKeepsItsThroughputLowerGetsTheRoomLeft) {
  // The high-priority job computes 5 ms then pauses 5 ms (leaving room); the low one has 4 ms of
  // kernels queued at any time. On a quiet machine the high job keeps 96-99% of its throughput
  // paced and 77% unpaced (the defect this guards against). The bound is 88%: a shared 2-core CI
  // machine measured 91% once (the runs are seconds apart and the client's own wake-ups vary).
  const Job high{"TESSERA_CUDA_PRIORITY=10", "work:2000:1000:5:5000:300:1800"};
  const Job low{"TESSERA_CUDA_PRIORITY=0", "work:2000:200:20:0:300:1800"};
  const double high_alone = Contend({high})[0];
  const double low_alone = Contend({low})[0];
  std::vector<double> unpaced = Contend({high, low}, /*preload=*/false);
  EXPECT_LT(unpaced[0], 0.9 * high_alone)
      << "without the library the low job's queue slows the high one";
  std::vector<double> both = Contend({high, low});
  EXPECT_GE(both[0], 0.88 * high_alone) << both[0] << " of " << high_alone;
  EXPECT_GE(both[1], 0.20 * low_alone) << both[1] << " of " << low_alone;
}

// A higher-priority job that is nearly idle (one 100 us kernel every 100 ms: 0.1% of the GPU)
// leaves a low job of short kernels (20 us, 50 per synchronize) most of its throughput. Before,
// every launch of the low job drained the one before it for a second after each of the high
// job's: the low job kept 18% of its throughput beside a job that used 0.1% of the GPU. Now it
// keeps up to 1 ms queued (kBoundedQueueUs): 98% here on a quiet machine (92-93% with 500 us).
// The bound is 85%: a shared 2-core CI machine measured 94.6% once (the two runs are seconds apart
// and the client's own wake-ups vary), and the defect this guards against kept 18%.
TEST(Pacing, ANearlyIdleHigherPriorityJobLeavesALowJobOfShortKernelsItsThroughput) {
  const Job high{"TESSERA_CUDA_PRIORITY=10", "work:2000:100:1:100000:300:1800"};
  const Job low{"TESSERA_CUDA_PRIORITY=0", "work:2000:20:50:0:300:1800"};
  const double low_alone = Contend({low})[0];
  std::vector<double> both = Contend({high, low});
  EXPECT_GE(both[1], 0.85 * low_alone) << both[1] << " of " << low_alone;
  EXPECT_GT(both[0], 0) << "the high job ran";
}

TEST(Pacing, AJobThatDiesHoldingTheGpuDoesNotBlockIt) {
  // The first job takes the GPU and is killed while holding it; the second gets on within the idle
  // time (1 ms) instead of waiting out the dead job's 10 s slice.
  std::string arbiter = TempPath("arbiter-crash");
  std::string clock = TempPath("clock-crash");
  std::filesystem::remove(arbiter);
  Env env{.extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter};
  Env first = env, second = env;
  first.extra += " TESSERA_JOB_ID=first TESSERA_CUDA_TIMESLICE_US=10000000";
  second.extra += " TESSERA_JOB_ID=second";
  EXPECT_EQ(RunClient(first, "link", "launch:1 crash"), "ok\n");
  std::string out = RunClient(second, "link", "work:1000:500:4:0:100:900");
  double us = 0;
  ASSERT_EQ(sscanf(out.c_str(), "gpu_us %lf", &us), 1) << out;
  EXPECT_GT(us, 0.5 * 800000);
}

TEST(Pacing, SharesHoldWhileOtherTenantsAreKilledAndStoppedAtRandom) {
  // Two steady tenants (20% and 30%) share the GPU with a bursty one (25%) that is stopped
  // (SIGSTOP) for 20-60 ms at random moments, and with a job (25%) whose processes are killed
  // inside a synchronize again and again and restart 0.1 s later. The steady pair keeps its 40:60
  // ratio within 5 points over a 2 s window. (The fork-based tests in arbiter_test.cc show each
  // fault's own effect; this one is the mix, as a regression guard.)
  std::string arbiter = TempPath("arbiter-chaos");
  std::string clock = TempPath("clock-chaos");
  std::filesystem::remove(arbiter);
  std::filesystem::remove(clock);
  // The measured tenants share one start (WORK_START_MS): the same 2 s for all, however long each
  // took to start. The killed job's short runs keep their own.
  const auto origin = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  const std::string start_ms = SharedStartMs(origin);
  auto env = [&](const std::string& job, const std::string& share, bool shared_start = true) {
    return Env{.extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
                        " TESSERA_JOB_ID=" + job + " TESSERA_CUDA_COMPUTE_SHARE=" + share +
                        (shared_start ? " WORK_START_MS=" + start_ms : std::string())};
  };
  const std::string window = "2600:500:4:0:500:2500";  // 2 s measured
  Running a = Spawn("exec " + Command(env("steady-a", "20%"), "link", "work:" + window));
  Running b = Spawn("exec " + Command(env("steady-b", "30%"), "link", "work:" + window));
  Running c =
      Spawn("exec " + Command(env("bursty", "25%"), "link", "work:2600:1000:3:4000:500:2500"));
  Running d =
      Spawn("end=$(($(date +%s) + 3)); while [ $(date +%s) -lt $end ]; do " +
            Command(env("killed", "25%", false), "link", "work:40:500:4:0:0:0 syncdie:20000") +
            " >/dev/null 2>&1; sleep 0.1; done");
  // SIGSTOP the bursty tenant now and then, whatever it holds.
  const unsigned seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "TESSERA_TEST_SEED=" << seed);
  std::mt19937 rng(seed);
  const auto until = origin + std::chrono::milliseconds(2500);
  int stops = 0;
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60 + rng() % 120));
    kill(c.pid, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 40));
    kill(c.pid, SIGCONT);
    ++stops;
  }
  double us_a = -1, us_b = -1;
  std::string out_a = a.Output(), out_b = b.Output();
  ASSERT_EQ(sscanf(out_a.c_str(), "gpu_us %lf", &us_a), 1) << out_a;
  ASSERT_EQ(sscanf(out_b.c_str(), "gpu_us %lf", &us_b), 1) << out_b;
  const std::string out_c = c.Output();
  kill(d.pid, SIGKILL);
  d.Output();
  SCOPED_TRACE("steady " + out_a + " / " + out_b + ", bursty " + out_c);
  const double window_us = 2000000;
  double us_c = -1;
  ASSERT_EQ(sscanf(out_c.c_str(), "gpu_us %lf", &us_c), 1) << out_c;
  EXPECT_GE(stops, 5);
  EXPECT_NEAR(100 * us_a / (us_a + us_b), 40, 5) << us_a << " vs " << us_b;
  // The GPU is not left to a dead or stopped holder: the three measured tenants alone keep it busy
  // (here 53-69% of the window, the killed job's kernels using part of the rest).
  EXPECT_GE(100 * (us_a + us_b + us_c) / window_us, 35);
}

// A tenant stopped (SIGSTOP) for 1.5 s while it waits for the GPU banks no credit: after SIGCONT
// the two 50% tenants share the GPU evenly again (it took about 100% for as long as it had been
// stopped before), measured over the same 2 s after the resume by both.
TEST(Pacing, ATenantStoppedWhileWaitingBanksNoCredit) {
  std::string arbiter = TempPath("arbiter-stopped");
  std::string clock = TempPath("clock-stopped");
  std::filesystem::remove(arbiter);
  std::filesystem::remove(clock);
  const auto origin = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  const std::string start_ms = SharedStartMs(origin);
  auto env = [&](const std::string& job) {
    return Env{.extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
                        " TESSERA_JOB_ID=" + job +
                        " TESSERA_CUDA_COMPUTE_SHARE=50% WORK_START_MS=" + start_ms};
  };
  const std::string work = "work:4000:500:4:0:1900:3900";  // measured: 1.9 s to 3.9 s
  Running stopped = Spawn("exec " + Command(env("stopped"), "link", work));
  Running steady = Spawn("exec " + Command(env("steady"), "link", work));
  std::this_thread::sleep_until(origin + std::chrono::milliseconds(200));
  kill(stopped.pid, SIGSTOP);
  std::this_thread::sleep_until(origin + std::chrono::milliseconds(1700));
  kill(stopped.pid, SIGCONT);
  double us_stopped = -1, us_steady = -1;
  const std::string out_stopped = stopped.Output(), out_steady = steady.Output();
  ASSERT_EQ(sscanf(out_stopped.c_str(), "gpu_us %lf", &us_stopped), 1) << out_stopped;
  ASSERT_EQ(sscanf(out_steady.c_str(), "gpu_us %lf", &us_steady), 1) << out_steady;
  ASSERT_GT(us_stopped + us_steady, 0);
  EXPECT_NEAR(100 * us_stopped / (us_stopped + us_steady), 50, 5)
      << us_stopped << " vs " << us_steady;
}

// The same mix with 2, 5 and 8 steady tenants of unequal shares: beside a bursty tenant stopped at
// random and a job killed inside synchronizes over and over, each steady tenant's part of what the
// steady ones got stays within 5 points of its part of their shares, over one 4 s window that all
// of them measure (WORK_START_MS: the same stretch of time, however long each took to start).
// Over 2 s windows, 8 tenants were 5.2 points off once in CI (up to 3.9 here in 30 runs, quiet or
// beside two busy loops); over 4 s, at most 2.7 here in 5 runs beside two busy loops (2 tenants
// 2.0, 5 tenants 1.8). Before the windows were aligned, 8 tenants reached 5.3.
class PacingTenants : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(PacingTenants, EachSteadyShareHoldsBesideStoppedAndKilledTenants) {
  const std::vector<int>& shares = GetParam();
  const std::string tag = std::to_string(shares.size());
  std::string arbiter = TempPath("arbiter-tenants-" + tag);
  std::string clock = TempPath("clock-tenants-" + tag);
  std::filesystem::remove(arbiter);
  std::filesystem::remove(clock);
  // One start for every tenant, a little ahead: their 2 s windows are the same stretch of time
  // however long each process took to start on a busy machine.
  const auto origin = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  const std::string start_ms = SharedStartMs(origin);
  // The killed job's short runs keep their own starts (each restart works for 40 ms).
  auto env = [&](const std::string& job, int share, bool shared_start = true) {
    return Env{.extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
                        " TESSERA_JOB_ID=" + job +
                        " TESSERA_CUDA_COMPUTE_SHARE=" + std::to_string(share) + "%" +
                        (shared_start ? " WORK_START_MS=" + start_ms : std::string())};
  };
  std::vector<Running> steady;
  int total = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    steady.push_back(Spawn("exec " + Command(env("steady-" + std::to_string(i), shares[i]), "link",
                                             "work:4600:500:4:0:500:4500")));
    total += shares[i];
  }
  Running bursty =
      Spawn("exec " + Command(env("bursty", 10), "link", "work:4600:1000:3:4000:500:4500"));
  Running killed =
      Spawn("end=$(($(date +%s) + 5)); while [ $(date +%s) -lt $end ]; do " +
            Command(env("killed", 10, false), "link", "work:40:500:4:0:0:0 syncdie:20000") +
            " >/dev/null 2>&1; sleep 0.1; done");
  const unsigned seed = TestSeed() + static_cast<unsigned>(shares.size());
  SCOPED_TRACE(::testing::Message() << "TESSERA_TEST_SEED=" << TestSeed());
  std::mt19937 rng(seed);
  const auto until = origin + std::chrono::milliseconds(4500);
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60 + rng() % 120));
    kill(bursty.pid, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 40));
    kill(bursty.pid, SIGCONT);
  }
  std::vector<double> us;
  double sum = 0;
  std::string outs;
  for (Running& r : steady) {
    const std::string out = r.Output();
    outs += out;
    double v = -1;
    ASSERT_EQ(sscanf(out.c_str(), "gpu_us %lf", &v), 1) << out;
    us.push_back(v);
    sum += v;
  }
  bursty.Output();
  kill(killed.pid, SIGKILL);
  killed.Output();
  ASSERT_GT(sum, 0) << outs;
  for (size_t i = 0; i < shares.size(); ++i) {
    EXPECT_NEAR(100 * us[i] / sum, 100.0 * shares[i] / total, 5)
        << "tenant " << i << " of " << shares.size() << " (share " << shares[i] << "%): " << outs;
  }
}

INSTANTIATE_TEST_SUITE_P(Tenants, PacingTenants,
                         ::testing::Values(std::vector<int>{20, 60},
                                           std::vector<int>{10, 15, 15, 20, 20},
                                           std::vector<int>{5, 5, 10, 10, 10, 15, 15, 20}),
                         [](const auto& info) { return std::to_string(info.param.size()); });

// What a low-priority job running `low_work` printed beside a higher-priority job running
// `high_work`, both on a fresh arbiter and virtual GPU of their own (`tag`): the low job drains its
// queue before every launch while the high one is around.
std::string BesideAHigherPriorityJob(const std::string& tag, const std::string& high_work,
                                     const std::string& low_work) {
  const std::string arbiter = TempPath("arbiter-" + tag), clock = TempPath("clock-" + tag);
  std::filesystem::remove(arbiter);
  std::filesystem::remove(clock);
  Env env{.extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter};
  Env high = env, low = env;
  high.extra += " TESSERA_JOB_ID=high TESSERA_CUDA_PRIORITY=10";
  low.extra += " TESSERA_JOB_ID=low TESSERA_CUDA_PRIORITY=0";
  Running h = Spawn("exec " + Command(high, "link", high_work));
  const std::string out = RunClient(low, "link", low_work + " 2>&1");
  h.Output();
  return out;
}

TEST(Pacing, AGraphCapturedUnderContentionSurvives) {
  // A higher-priority job is around, so the lower one drains its queue before every launch; were
  // it to do so while recording a CUDA graph (PyTorch's global capture mode), the capture would be
  // invalidated. Launches being recorded are not run: the library lets them through.
  const std::string out = BesideAHigherPriorityJob("capture", "work:1500:500:2:2000:0:0",
                                                   "work:400:500:2:0:0:0 capture:500:20");
  EXPECT_THAT(out, ::testing::HasSubstr("captured 20")) << out;
  // What the test relies on: the fake driver, like the real one, invalidates a capture that a
  // synchronize in the process meets.
  EXPECT_EQ(RunClient(Env{.preload = false}, "link", "capture:500:3 2>&1"), "captured 3\n");
  EXPECT_EQ(RunClient(Env{.preload = false}, "link", "capture:500:3:sync 2>&1"),
            "capture failed: launch 0, end 901\n");
}

// A capture left open on a side stream (relaxed mode: it forbids no synchronize) does not turn
// pacing off for the process's other launches: the 30% tenant keeps about 30% (it got 50% when
// any capture in the process let every launch through).
TEST(Pacing, AnOpenCaptureOnASideStreamLeavesTheOtherLaunchesPaced) {
  std::vector<double> us =
      Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30%", std::string("capturebegin:2 ") + kSaturate},
               {"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate}});
  ASSERT_GT(us[0] + us[1], 0.6 * kWindowUs) << "the GPU stays busy";
  EXPECT_NEAR(100 * us[0] / (us[0] + us[1]), 30, 5) << us[0] << " vs " << us[1];
}

// The library's drain never meets a capture: a process records 1,000,000 graphs (global mode) in
// one thread while another of its threads launches beside a higher-priority tenant (so the library
// drains before its launches). None is invalidated (the drain's check and its synchronize raced a
// capture's begin before: 1,277 of 17.2 M).
// A capture in the global mode left open on a side stream forbids every synchronize and event
// query in the process: the library can neither drain nor look at its queue. The tenant's
// launches on other streams still keep to its share: its co-tenant gets its 70%.
TEST(Pacing, AnOpenGlobalCaptureLeavesTheOtherLaunchesBoundedAndBilled) {
  std::vector<double> us =
      // (it would queue twice the GPU's time without the bound: a 1 ms pause per 2 ms batch
      // keeps a reopened hole from queueing for minutes)
      Contend({{"TESSERA_CUDA_COMPUTE_SHARE=30%", "capturebegin:0 work:2000:500:4:1000:300:1800"},
               {"TESSERA_CUDA_COMPUTE_SHARE=70%", kSaturate}});
  EXPECT_GE(100 * us[1] / kWindowUs, 65) << us[0] << " vs " << us[1];
  // (its own figure counts what it launched: its synchronizes are refused)
  EXPECT_LE(100 * us[0] / kWindowUs, 35) << us[0] << " vs " << us[1];
}

TEST(Pacing, NoCaptureIsInvalidatedByTheLibrarysDrain) {
  EXPECT_EQ(
      BesideAHigherPriorityJob("capture-race", "work:4000:200:2:100:0:0", "capturerace:1000000"),
      "captures 1000000 invalidated 0\n");
}

// A malformed pacing setting refuses CUDA in the process (a share that fails to parse would
// otherwise mean 100%); each is said.
TEST(Pacing, MalformedSettingsAreSaidAndRefuseCuda) {
  const std::string arbiter = TempPath("arbiter-settings");
  Env env{.extra = "TESSERA_CUDA_ARBITER=" + arbiter +
                   " TESSERA_CUDA_COMPUTE_SHARE=lots TESSERA_CUDA_PRIORITY=high "
                   "TESSERA_CUDA_ARBITER_GPUS=3,x TESSERA_CUDA_GANG=no TESSERA_CUDA_QUEUE_US=deep"};
  std::string out = RunClient(env, "link", "alloc:1 2>&1");
  EXPECT_THAT(out, ::testing::HasSubstr("TESSERA_CUDA_COMPUTE_SHARE='lots' is not a share"));
  EXPECT_THAT(out, ::testing::HasSubstr("TESSERA_CUDA_PRIORITY='high' is not a whole number"));
  EXPECT_THAT(out,
              ::testing::HasSubstr("TESSERA_CUDA_ARBITER_GPUS='3,x' is not a list of GPU indices"));
  EXPECT_THAT(out, ::testing::HasSubstr("TESSERA_CUDA_GANG='no' is not a whole number in [0, 1]"));
  EXPECT_THAT(out, ::testing::HasSubstr(
                       "TESSERA_CUDA_QUEUE_US='deep' is not a whole number in [100, 10000000]"));
  EXPECT_THAT(out, ::testing::HasSubstr("CUDA is refused in this process"));
  EXPECT_THAT(out, ::testing::EndsWith("err 3\n")) << "refused, not run unpaced";
  // A gang that leaves out the process's own GPU, or does not parse.
  for (const char* gang : {"2,3", "0,y"}) {
    Env pod{.extra = "TESSERA_CUDA_ARBITER=" + arbiter +
                     " TESSERA_CUDA_ARBITER_GPUS=1 TESSERA_CUDA_GANG_GPUS=" + gang};
    out = RunClient(pod, "link", "alloc:1 2>&1");
    EXPECT_THAT(out, ::testing::HasSubstr(std::string("TESSERA_CUDA_GANG_GPUS='") + gang +
                                          "' is not a list of GPU indices (0,1) that holds "
                                          "TESSERA_CUDA_ARBITER_GPUS"));
    EXPECT_THAT(out, ::testing::EndsWith("err 3\n")) << gang;
  }
  std::remove(arbiter.c_str());
}

// A file in the arbiter's place that is not one is said, and launches go on unpaced (one damaged
// under running processes: Shim.ATruncatedOrScribbledArbiterKillsNoTenant).
TEST(Pacing, AnArbiterFileOfAnotherKindIsSaid) {
  std::string arbiter = TempPath("arbiter-bad");
  FILE* f = fopen(arbiter.c_str(), "w");
  fputs("not an arbiter", f);
  fclose(f);
  Env env{.extra = "TESSERA_CUDA_ARBITER=" + arbiter + " TESSERA_CUDA_COMPUTE_SHARE=30%"};
  std::string out = RunClient(env, "link", "launch:3 2>&1");
  EXPECT_THAT(out, ::testing::HasSubstr("not a Tessera GPU arbiter file"));
  EXPECT_THAT(out, ::testing::EndsWith("ok\n"));
  std::remove(arbiter.c_str());
}

}  // namespace

namespace {

// A data-parallel job of two ranks, one on each of two GPUs, whose steps wait for each other (an
// all-reduce's coupling), beside a saturating single-GPU job on each GPU; every job asks 50%.
// What each finished in the same 1.8 s: the ranks' steps and GPU time, and the others' GPU time.
struct RanksRun {
  double steps = -1, rank_us = -1, x_us = -1, y_us = -1;
};

// `pods`: each rank in a container of its own that sees only its GPU (CUDA_VISIBLE_DEVICES, its
// device 0), the gang's GPUs named by TESSERA_CUDA_GANG_GPUS, as the node agent hands a gang's pods
// their shares.
RanksRun RunRanks(bool gang, bool pods = false) {
  const std::string tag = std::string(gang ? "gang" : "nogang") + (pods ? "-pods" : "");
  const std::string arbiter = TempPath("arbiter-" + tag), clock = TempPath("clock-" + tag),
                    barrier = TempPath("barrier-" + tag);
  for (const std::string& p : {arbiter, clock, barrier}) std::filesystem::remove(p);
  const std::string common =
      "FAKE_CUDA_DEVICES=2 FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
      " TESSERA_CUDA_COMPUTE_SHARE=50% WORK_START_MS=" +
      SharedStartMs(std::chrono::steady_clock::now() + std::chrono::milliseconds(300));
  // The job's GPUs as the server hands them over (TESSERA_CUDA_ARBITER_GPUS); TESSERA_CUDA_GANG=0
  // is each GPU arbitrated on its own, as before gangs.
  const std::string job = common + " TESSERA_JOB_ID=ranks TESSERA_CUDA_ARBITER_GPUS=0,1" +
                          (gang ? "" : " TESSERA_CUDA_GANG=0");
  const std::string steps = "ranks:2300:500:4:300:2100:" + barrier;
  std::vector<Running> procs;
  for (const std::string rank : {"0", "1"}) {
    const std::string pod = common + " TESSERA_JOB_ID=gang:ml/ranks CUDA_VISIBLE_DEVICES=" + rank +
                            " TESSERA_CUDA_ARBITER_GPUS=" + rank + " TESSERA_CUDA_GANG_GPUS=0,1";
    procs.push_back(Spawn(
        "exec " + Command(Env{.extra = pods ? pod : job}, "link",
                          "device:" + (pods ? "0" : rank) + " " + steps + ":" + rank + ":2")));
  }
  for (const std::string device : {"0", "1"}) {
    procs.push_back(
        Spawn("exec " + Command(Env{.extra = common + " TESSERA_JOB_ID=single" + device}, "link",
                                "device:" + device + " work:2300:500:4:0:300:2100")));
  }
  RanksRun r;
  std::vector<std::string> out;
  for (Running& p : procs) out.push_back(p.Output());
  double other = 0;
  EXPECT_EQ(sscanf(out[0].c_str(), "ok\nsteps %lf gpu_us %lf", &r.steps, &r.rank_us), 2) << out[0];
  EXPECT_EQ(sscanf(out[1].c_str(), "ok\nsteps %lf gpu_us %lf", &other, &other), 2) << out[1];
  EXPECT_EQ(sscanf(out[2].c_str(), "ok\ngpu_us %lf", &r.x_us), 1) << out[2];
  EXPECT_EQ(sscanf(out[3].c_str(), "ok\ngpu_us %lf", &r.y_us), 1) << out[3];
  for (const std::string& p : {arbiter, clock, barrier}) std::filesystem::remove(p);
  return r;
}

TEST(Pacing, AJobsRanksOnSeveralGpusGetTheirSlicesTogether) {
  // Arbitrated GPU by GPU, a rank holds its GPU while the other's belongs to another job, so the
  // ranks seldom run at once and their steps crawl (measured: 19-52 steps, 2-6% of the window;
  // up to 124 with both cores busy). With gang time-slicing both GPUs are the job's at the same
  // time: 359-362 steps (40%; 351-354 with both cores busy), and the single-GPU jobs keep their
  // shares (47-49% each).
  const RanksRun apart = RunRanks(false);
  const RanksRun together = RunRanks(true);
  for (const auto& [how, r] : {std::pair{"apart", apart}, std::pair{"together", together}}) {
    std::printf("%-8s steps %4.0f  rank gpu_us %7.0f  single GPU 0 %7.0f  single GPU 1 %7.0f\n",
                how, r.steps, r.rank_us, r.x_us, r.y_us);
  }
  EXPECT_LT(apart.rank_us, 0.45 * apart.x_us) << apart.steps << " steps apart";
  EXPECT_GT(together.rank_us, 0.55 * together.x_us)
      << together.steps << " steps together; " << together.x_us << " us for the job on GPU 0";
  EXPECT_GT(together.steps, 2 * apart.steps);
  EXPECT_NEAR(together.y_us / together.x_us, 1.0, 0.25) << "the single-GPU jobs' shares hold";
  EXPECT_GT(together.x_us, 0.35 * 1800000) << "of the 1.8 s";
}

TEST(Pacing, AGangsRanksInPodsOfTheirOwnGetTheirSlicesTogether) {
  // The same job, its ranks in two containers that each see one GPU (the pods of a distributed
  // job, given their shares by the node agent): one TESSERA_JOB_ID and TESSERA_CUDA_GANG_GPUS make
  // them one gang, as one container's ranks are.
  const RanksRun apart = RunRanks(false);
  const RanksRun pods = RunRanks(true, /*pods=*/true);
  std::printf("apart: %.0f steps; pods: %.0f steps, rank %.0f us, singles %.0f / %.0f us\n",
              apart.steps, pods.steps, pods.rank_us, pods.x_us, pods.y_us);
  EXPECT_GT(pods.rank_us, 0.55 * pods.x_us) << pods.steps << " steps";
  EXPECT_GT(pods.steps, 2 * apart.steps);
  EXPECT_NEAR(pods.y_us / pods.x_us, 1.0, 0.25) << "the single-GPU jobs' shares hold";
}

TEST(Pacing, TwoJobsOnTheSameGpusTakeThemInTurnByShare) {
  // Two two-rank jobs on the same two GPUs, 30% and 70%: each takes its GPUs in ascending order,
  // so neither holds one while waiting for the other's (no deadlock), and their steps split by
  // share (measured: 28/72, 81-86% of the GPU time in steps).
  const std::string arbiter = TempPath("arbiter-gangs"), clock = TempPath("clock-gangs");
  for (const std::string& p : {arbiter, clock}) std::filesystem::remove(p);
  const std::string common =
      "FAKE_CUDA_DEVICES=2 FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
      " TESSERA_CUDA_ARBITER_GPUS=0,1 WORK_START_MS=" +
      SharedStartMs(std::chrono::steady_clock::now() + std::chrono::milliseconds(300));
  std::vector<Running> procs;
  for (const std::string job : {"30", "70"}) {
    const std::string barrier = TempPath("barrier-gang" + job);
    std::filesystem::remove(barrier);
    const Env env{.extra = common + " TESSERA_JOB_ID=gang" + job +
                           " TESSERA_CUDA_COMPUTE_SHARE=" + job + "%"};
    for (const std::string rank : {"0", "1"}) {
      procs.push_back(Spawn("exec " + Command(env, "link",
                                              "device:" + rank + " ranks:2300:500:4:300:2100:" +
                                                  barrier + ":" + rank + ":2")));
    }
  }
  double us[4] = {-1, -1, -1, -1}, steps = 0;
  for (int i = 0; i < 4; ++i) {
    const std::string out = procs[i].Output();
    EXPECT_EQ(sscanf(out.c_str(), "ok\nsteps %lf gpu_us %lf", &steps, &us[i]), 2) << out;
  }
  std::printf("30%%: %.0f us in steps, 70%%: %.0f us in steps, of 1800000\n", us[0], us[2]);
  EXPECT_NEAR(us[0], us[1], 2 * 2000) << "a job's ranks finish the same steps, give or take one";
  EXPECT_GT(us[0] + us[2], 0.6 * 1800000) << "of the 1.8 s: the GPUs are seldom idle";
  EXPECT_NEAR(100 * us[0] / (us[0] + us[2]), 30, 5) << us[0] << " vs " << us[2];
  for (const std::string& p :
       {arbiter, clock, TempPath("barrier-gang30"), TempPath("barrier-gang70")})
    std::filesystem::remove(p);
}

}  // namespace
