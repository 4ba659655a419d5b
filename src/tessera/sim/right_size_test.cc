// Right-sizing alone (right_size.h): the use model's draws, the right-sized requests, and a replay
// of the same jobs as asked and right-sized on a small cluster.
#include "tessera/sim/right_size.h"

#include <gtest/gtest.h>

#include <numeric>

#include "tessera/sched/policy.h"
#include "tessera/sched/test_util.h"
#include "tessera/sim/replay.h"

namespace tessera::sim {
namespace {

using sched::testing::Node;

SimJob Gpu(const std::string& id, int gpus, int milli = 0, double utilization = -1) {
  SimJob j;
  j.request.id = id;
  j.request.gpus = gpus;
  j.request.gpu_milli = milli;
  j.utilization = utilization;
  j.duration = 100;
  return j;
}

// Each GPU job without a figure gets one, its mean the model's, the same for the same seed and
// job whatever the order; a job whose trace says keeps its own, a CPU job gets none.
TEST(UseModel, DrawsEachJobsUseOnceFromTheSeed) {
  std::vector<SimJob> jobs;
  for (int i = 0; i < 4000; ++i) jobs.push_back(Gpu("j" + std::to_string(i), 1));
  jobs.push_back(Gpu("share", 0, 400));
  jobs.push_back(Gpu("known", 1, 0, 77));
  jobs.push_back(Gpu("cpu", 0));
  std::vector<SimJob> a = jobs, b(jobs.rbegin(), jobs.rend());
  const UseModel m{.mean = 0.3, .concentration = 4, .seed = 7};
  ASSERT_TRUE(CheckUseModel(m).ok());
  EXPECT_EQ(ApplyUseModel(a, m), 4001u);
  ApplyUseModel(b, m);
  EXPECT_EQ(a[5].utilization, b[b.size() - 6].utilization) << "same job, same draw";
  double sum = 0;
  for (int i = 0; i < 4000; ++i) {
    EXPECT_GE(a[i].utilization, 0);
    EXPECT_LE(a[i].utilization, 100);
    sum += a[i].utilization;
  }
  EXPECT_NEAR(sum / 4000, 30, 1.5) << "the model's mean, in percent of a whole GPU";
  EXPECT_LE(a[4000].utilization, 40) << "a 400-milli share uses at most 40% of the GPU";
  EXPECT_EQ(a[4001].utilization, 77);
  EXPECT_LT(a[4002].utilization, 0);
  std::vector<SimJob> c = jobs;
  ApplyUseModel(c, UseModel{.mean = 0.3, .concentration = 4, .seed = 8});
  EXPECT_NE(c[5].utilization, a[5].utilization) << "another seed, another draw";
  EXPECT_FALSE(CheckUseModel({.mean = 1}).ok());
  EXPECT_FALSE(CheckUseModel({.mean = 0.5, .concentration = 0}).ok());
  EXPECT_EQ(CheckUseModel({.mean = 1.5}).message(),
            "use model: mean 1.5 is not between 0 and 1 (exclusive)");
}

// Use plus margin, rounded up to the granularity, within [one granule, what was asked]; several
// whole GPUs and unknown use stay as asked; a job that uses its GPU keeps it whole.
TEST(RightSize, AsksForUsePlusMarginRoundedUp) {
  const std::vector<SimJob> asked = {
      Gpu("light", 1, 0, 30),   Gpu("busy", 1, 0, 90),  Gpu("idle", 1, 0, 0.5),
      Gpu("share", 0, 600, 20), Gpu("eight", 8, 0, 10), Gpu("unknown", 1),
  };
  const std::vector<SimJob> sized = RightSize(asked, {.margin = 0.2, .granularity_milli = 100});
  ASSERT_EQ(sized.size(), asked.size());
  EXPECT_EQ(sized[0].request.gpus, 0);
  EXPECT_EQ(sized[0].request.gpu_milli, 400) << "30% x 1.2 = 360, rounded up";
  EXPECT_EQ(sized[0].utilization, 30) << "the same work";
  EXPECT_EQ(sized[0].duration, 100);
  EXPECT_EQ(sized[1].request.gpus, 1) << "90% x 1.2 is over a GPU: it stays whole";
  EXPECT_EQ(sized[2].request.gpu_milli, 100) << "at least one granule";
  EXPECT_EQ(sized[3].request.gpu_milli, 300) << "20% of the GPU x 1.2 = 240 milli";
  EXPECT_EQ(sized[4].request.gpus, 8);
  EXPECT_EQ(sized[5].request.gpus, 1);
  EXPECT_EQ(RightSize({Gpu("s", 0, 250, 24)}, {.margin = 0.5, .granularity_milli = 100})[0]
                .request.gpu_milli,
            250)
      << "never more than it asked";
  EXPECT_FALSE(CheckRightSizing({.margin = -0.1}).ok());
  EXPECT_FALSE(CheckRightSizing({.granularity_milli = 0}).ok());
  EXPECT_FALSE(CheckRightSizing({.granularity_milli = 1001}).ok());
}

// Four GPUs, sixteen one-GPU jobs of 100 s that each use a fifth of their GPU, all at t=0: as
// asked they run four at a time (four rounds, the last starting at 300 s); right-sized (300 milli
// each) three share each GPU and all but four start at once. The GPUs are as busy either way.
TEST(RightSize, TheSameJobsRightSizedWaitLessOnFewerGpus) {
  std::vector<core::NodeSpec> nodes = {Node("a", 4)};
  std::vector<SimJob> jobs;
  for (int i = 0; i < 16; ++i) {
    SimJob j = Gpu("j" + std::to_string(i), 1, 0, 20);
    j.submit = 0;
    jobs.push_back(j);
  }
  ReplayConfig c;
  c.label = "bestfit";
  c.policies = *sched::ParsePolicies("bestfit");
  c.samples = 11;
  const ReplayResult asked = RunReplay(nodes, jobs, {}, c);
  const ReplayResult sized = RunReplay(nodes, RightSize(jobs, {}), {}, c);
  EXPECT_EQ(asked.finished, 16);
  EXPECT_EQ(sized.finished, 16);
  EXPECT_NEAR(asked.wait.max, 300, 1e-6);
  EXPECT_NEAR(sized.wait.max, 100, 1e-6) << "12 at once, the last four after the first round";
  EXPECT_LT(sized.wait.mean, asked.wait.mean / 2);
  EXPECT_LT(sized.jct.mean, asked.jct.mean);
  // Busy: 20% of each GPU a job runs on, however it was sized; what the GPUs did is the same
  // work, done sooner.
  const double asked_busy = MeanBusyOver(asked, 0, asked.end_time) * asked.end_time;
  const double sized_busy = MeanBusyOver(sized, 0, sized.end_time) * sized.end_time;
  EXPECT_NEAR(sized_busy, asked_busy, asked_busy * 0.01) << "GPU-seconds of work";
}

}  // namespace
}  // namespace tessera::sim
