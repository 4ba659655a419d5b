// The registry of placement policies. A new score policy: a ScorePlugin in a file of its own, its
// factory declared below, and one line in ScorePolicies(). Order is the order `--policies all` and
// the benchmarks use.
#include <algorithm>

#include "tessera/sched/policy.h"

namespace tessera::sched {

std::unique_ptr<ScorePlugin> NewRandomScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewSpreadScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewBinpackScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewBestFitScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewDotProductScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewGpuPackingScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewGpuClusteringScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewFgdScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewStrandedScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewFgdPaperScore(Fragmentation*);
std::unique_ptr<ScorePlugin> NewTopologyScore(Fragmentation*);

const std::vector<PolicyDef>& ScorePolicies() {
  static const std::vector<PolicyDef> kPolicies = {
      {"random", "uniformly random among feasible nodes (seeded)", NewRandomScore},
      {"spread", "least allocated after placement (kube-scheduler LeastAllocated)", NewSpreadScore},
      {"binpack", "most allocated after placement (MostAllocated)", NewBinpackScore},
      {"bestfit", "least CPU and GPU left over, normalised by the largest node", NewBestFitScore},
      {"dotprod", "Tetris: smallest dot product of free and requested resources",
       NewDotProductScore},
      {"gpupacking", "shared GPUs first, then used nodes, then idle nodes", NewGpuPackingScore},
      {"gpuclustering", "nodes already running work of the same GPU size", NewGpuClusteringScore},
      {"fgd", "fragmentation gradient descent: least growth of fragmentation", NewFgdScore},
      {"stranded", "least growth of the GPU compute runs of typical requests could not fill",
       NewStrandedScore},
      {"fgd-paper", "FGD as the paper's simulator runs it: integer score, ties to the first node",
       NewFgdPaperScore},
      {"topology", "best-linked GPU set; satisfies 'prefer' topology wishes", NewTopologyScore},
  };
  return kPolicies;
}

const PolicyDef* FindScorePolicy(std::string_view name) {
  const std::vector<PolicyDef>& all = ScorePolicies();
  auto it =
      std::find_if(all.begin(), all.end(), [&](const PolicyDef& d) { return d.name == name; });
  return it == all.end() ? nullptr : &*it;
}

// Filters beyond the core's own (CPU, memory, and the GPU fit that choosing GPUs checks). None yet;
// a new one is a FilterPlugin in a file of its own and a line here.
const std::vector<std::unique_ptr<FilterPlugin>>& Filters() {
  static const std::vector<std::unique_ptr<FilterPlugin>> kFilters;
  return kFilters;
}

}  // namespace tessera::sched
