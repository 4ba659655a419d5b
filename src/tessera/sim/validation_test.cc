// The simulator against the FGD paper (Weng et al., USENIX ATC'23) on the real openb traces:
// workload inflation to 130%, seeds 42..51. Policies whose implementation follows the paper's
// simulator must land within one percentage point of its published allocation ratios, and FGD run
// as the paper's simulator runs it (fgd-paper) within half a point on every carried pod list;
// Tessera's default must leave fewer GPUs unallocated than FGD and allocate at least the paper's
// FGD figure on each. (docs/simulator.md explains the policies that differ.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "tessera/sim/inflation.h"
#include "tessera/sim/paper.h"
#include "tessera/sim/trace.h"

namespace tessera::sim {
namespace {

std::string TraceDir() {
  const char* env = std::getenv("TESSERA_TRACES");
  return env && *env ? env : TESSERA_SOURCE_DIR "/traces/openb";
}

struct Mean {
  double allocated = 0, unallocated = 0;
};

Mean Inflate(const std::string& pod_list, const std::string& policy, int seeds) {
  const std::string dir = TraceDir();
  auto nodes = LoadNodes(dir + "/openb_node_list_gpu_node.csv", TraceFormat::kOpenb);
  auto jobs = LoadJobs(dir + "/" + pod_list, TraceFormat::kOpenb);
  EXPECT_TRUE(nodes.ok() && jobs.ok()) << "traces missing under " << dir << " (set TESSERA_TRACES)";
  if (!nodes.ok() || !jobs.ok()) return {};
  std::vector<core::Request> pods;
  for (const SimJob& j : *jobs) pods.push_back(j.request);
  auto typical = sched::TypicalRequests(pods);
  Mean m;
  for (int s = 0; s < seeds; ++s) {
    InflationConfig c;
    c.label = policy;
    c.policies = *sched::ParsePolicies(policy);
    c.seed = 42 + s;
    InflationResult r = RunInflation(*nodes, pods, typical, c);
    m.allocated += 100 * r.final.allocated / seeds;
    m.unallocated += r.final.unallocated_gpus / seeds;
  }
  return m;
}

TEST(PaperValidation, MatchedPoliciesWithinOnePoint) {
  for (const char* policy : {"random", "bestfit", "fgd"}) {
    const auto paper = PaperAllocationPercent(policy, "default");
    ASSERT_TRUE(paper.has_value()) << policy;
    EXPECT_NEAR(Inflate("openb_pod_list_default.csv", policy, 10).allocated, *paper, 1.0) << policy;
  }
}

TEST(PaperValidation, TheFiguresAreThePapersAndOnlyThose) {
  EXPECT_EQ(PaperAllocationPercent("gpupacking", "default"), 92.00);
  EXPECT_EQ(PaperAllocationPercent("fgd", "multigpu40"), 96.99);
  EXPECT_EQ(PaperAllocationPercent("fgd-paper", "multigpu40"), 96.99) << "FGD's figure";
  EXPECT_FALSE(PaperAllocationPercent("tessera", "default")) << "not in the paper";
  EXPECT_FALSE(PaperAllocationPercent("fgd", "cpu0")) << "a list the paper did not evaluate";
  EXPECT_FALSE(PaperAllocationPercent("bestfit", "gpushare40")) << "baselines: default only";
}

class OnEachCarriedList : public ::testing::TestWithParam<const char*> {};

TEST_P(OnEachCarriedList, FgdPaperReproducesTheFigureAndTesseraBeatsBoth) {
  const std::string file = std::string("openb_pod_list_") + GetParam() + ".csv";
  const auto paper = PaperAllocationPercent("fgd", GetParam());
  ASSERT_TRUE(paper.has_value()) << "the paper evaluated " << GetParam();
  const Mean fgd = Inflate(file, "fgd", 10);
  const Mean paper_run = Inflate(file, "fgd-paper", 10);
  const Mean tessera = Inflate(file, "tessera", 10);
  EXPECT_NEAR(paper_run.allocated, *paper, 0.5) << "fgd-paper against the paper";
  EXPECT_LT(tessera.unallocated, fgd.unallocated) << "tessera against our FGD";
  EXPECT_GE(tessera.allocated, *paper) << "tessera against the paper's FGD";
}

INSTANTIATE_TEST_SUITE_P(PodLists, OnEachCarriedList,
                         ::testing::Values("default", "gpushare40", "multigpu20", "gpuspec20"));

}  // namespace
}  // namespace tessera::sim
