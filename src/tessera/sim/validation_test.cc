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
  const std::pair<const char*, double> kPaper[] = {
      {"random", 87.47}, {"bestfit", 93.08}, {"fgd", 95.39}};
  for (const auto& [policy, paper] : kPaper) {
    EXPECT_NEAR(Inflate("openb_pod_list_default.csv", policy, 10).allocated, paper, 1.0) << policy;
  }
}

// The paper's FGD allocation at 130% for the carried lists: mean of its ten seeds in the reference
// simulator's expected results (hkust-adsl/kubernetes-scheduler-simulator,
// experiments/analysis/expected_results/analysis_allo_discrete.csv).
struct PaperFigure {
  const char* list;
  double fgd;
};
void PrintTo(const PaperFigure& p, std::ostream* os) { *os << p.list; }

class OnEachCarriedList : public ::testing::TestWithParam<PaperFigure> {};

TEST_P(OnEachCarriedList, FgdPaperReproducesTheFigureAndTesseraBeatsBoth) {
  const std::string file = std::string("openb_pod_list_") + GetParam().list + ".csv";
  const Mean fgd = Inflate(file, "fgd", 10);
  const Mean paper_run = Inflate(file, "fgd-paper", 10);
  const Mean tessera = Inflate(file, "tessera", 10);
  EXPECT_NEAR(paper_run.allocated, GetParam().fgd, 0.5) << "fgd-paper against the paper";
  EXPECT_LT(tessera.unallocated, fgd.unallocated) << "tessera against our FGD";
  EXPECT_GE(tessera.allocated, GetParam().fgd) << "tessera against the paper's FGD";
}

INSTANTIATE_TEST_SUITE_P(
    PodLists, OnEachCarriedList,
    ::testing::Values(PaperFigure{"default", 95.39}, PaperFigure{"gpushare40", 94.15},
                      PaperFigure{"multigpu20", 95.65}, PaperFigure{"gpuspec20", 94.84}),
    [](const ::testing::TestParamInfo<PaperFigure>& i) { return std::string(i.param.list); });

}  // namespace
}  // namespace tessera::sim
