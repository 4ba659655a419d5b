// Compute shares and priority: cuda_client processes under the intercept library contend for the
// fake driver's virtual GPU, whose clock is shared between processes (FAKE_CUDA_CLOCK), so the GPU
// time each job gets is decided by the arbiter, not by the test. Each run measures the virtual GPU
// time of the kernels a process finished in the same window (300-1800 ms after its start). These
// tests run alone (RUN_SERIAL): they measure time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "client_util.h"

namespace {

using namespace tessera::shim_test;

constexpr double kWindowUs = 1500000;

struct Job {
  std::string settings;  // environment
  std::string work;      // the work command
};

// Runs the jobs at once; the GPU microseconds each finished in the window.
std::vector<double> Contend(const std::vector<Job>& jobs, bool preload = true) {
  std::string arbiter = TempPath("arbiter");
  std::string clock = TempPath("clock");
  std::filesystem::remove(arbiter);
  std::filesystem::remove(clock);
  std::vector<FILE*> pipes;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Env env{.preload = preload,
            .extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
                     " TESSERA_JOB_ID=job" + std::to_string(i) + " " + jobs[i].settings};
    pipes.push_back(popen(Command(env, "link", jobs[i].work + " 2>&1").c_str(), "r"));
  }
  std::vector<double> out;
  for (FILE* p : pipes) {
    char line[256] = "";
    double us = -1;
    while (fgets(line, sizeof line, p)) {
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

TEST(Pacing, HigherPriorityKeepsItsThroughputLowerGetsTheRoomLeft) {
  // The high-priority job computes 5 ms then pauses 5 ms (leaving room); the low one has 4 ms of
  // kernels queued at any time.
  const Job high{"TESSERA_CUDA_PRIORITY=10", "work:2000:1000:5:5000:300:1800"};
  const Job low{"TESSERA_CUDA_PRIORITY=0", "work:2000:200:20:0:300:1800"};
  const double high_alone = Contend({high})[0];
  const double low_alone = Contend({low})[0];
  std::vector<double> unpaced = Contend({high, low}, /*preload=*/false);
  EXPECT_LT(unpaced[0], 0.9 * high_alone)
      << "without the library the low job's queue slows the high one";
  std::vector<double> both = Contend({high, low});
  EXPECT_GE(both[0], 0.95 * high_alone) << both[0] << " of " << high_alone;
  EXPECT_GE(both[1], 0.20 * low_alone) << both[1] << " of " << low_alone;
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

TEST(Pacing, MalformedSettingsAreSaid) {
  std::string arbiter = TempPath("arbiter-bad");
  FILE* f = fopen(arbiter.c_str(), "w");
  fputs("not an arbiter", f);
  fclose(f);
  Env env{.extra = "TESSERA_CUDA_ARBITER=" + arbiter +
                   " TESSERA_CUDA_COMPUTE_SHARE=lots TESSERA_CUDA_PRIORITY=high "
                   "TESSERA_CUDA_ARBITER_GPUS=3,x"};
  std::string out = RunClient(env, "link", "launch:3 2>&1");
  EXPECT_THAT(out, ::testing::HasSubstr("TESSERA_CUDA_COMPUTE_SHARE='lots' is not a share"));
  EXPECT_THAT(out, ::testing::HasSubstr("TESSERA_CUDA_PRIORITY='high' is not a whole number"));
  EXPECT_THAT(out, ::testing::HasSubstr("not a Tessera GPU arbiter file"));
  EXPECT_THAT(out,
              ::testing::HasSubstr("TESSERA_CUDA_ARBITER_GPUS='3,x' is not a list of GPU indices"));
  EXPECT_THAT(out, ::testing::EndsWith("ok\n")) << "launches still go through, unpaced";
}

}  // namespace
