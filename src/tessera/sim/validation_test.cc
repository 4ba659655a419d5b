// The simulator against the FGD paper (Weng et al., USENIX ATC'23) on the real openb traces:
// workload inflation to 130%, seeds 42..51. Policies whose implementation follows the paper's
// simulator must land within one percentage point of its published allocation ratios; Tessera's
// default must leave fewer GPUs unallocated than FGD on every pod list. (docs/simulator.md explains
// the policies that differ.)
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

class TesseraBeatsFgd : public ::testing::TestWithParam<const char*> {};

TEST_P(TesseraBeatsFgd, FewerUnallocatedGpus) {
  // On gpuspec20 the two are closest (FGD breaks its own ties by best fit too; tessera's edge is
  // its larger best-fit weight): 20 seeds there, 2 GPUs apart (about one standard error).
  const std::string list = GetParam();
  const int seeds = list == "default" ? 10 : list == "gpuspec20" ? 20 : 5;
  std::string file = std::string("openb_pod_list_") + GetParam() + ".csv";
  Mean fgd = Inflate(file, "fgd", seeds);
  Mean tessera = Inflate(file, "tessera", seeds);
  EXPECT_LT(tessera.unallocated, fgd.unallocated) << file;
}

INSTANTIATE_TEST_SUITE_P(PodLists, TesseraBeatsFgd,
                         ::testing::Values("default", "gpushare40", "multigpu20", "gpuspec20"));

}  // namespace
}  // namespace tessera::sim
