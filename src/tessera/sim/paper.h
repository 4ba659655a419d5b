#pragma once
// The FGD paper's published figures (Weng et al., "Beware of Fragmentation", USENIX ATC'23): GPU
// allocation after workload inflation to 130% on the openb GPU nodes, the mean of its ten seeds
// (42..51), from its simulator's expected results (hkust-adsl/kubernetes-scheduler-simulator,
// experiments/analysis/expected_results/analysis_allo_discrete.csv, column 130). One table for the
// CLI's PAPER column, the validation tests and the variant sweep.

#include <optional>
#include <string_view>

namespace tessera::sim {

// The paper's allocation in percent for `policy` on the openb pod list `pod_list` (the name after
// "openb_pod_list_": "default", "gpushare40", ...): the six baselines (random, dotprod,
// gpuclustering, gpupacking, bestfit, fgd) on "default", and fgd on each of the 17 lists the paper
// evaluated. "fgd-paper" (FGD run as the paper's simulator runs it) has fgd's figures. Empty where
// the paper has none.
std::optional<double> PaperAllocationPercent(std::string_view policy, std::string_view pod_list);

}  // namespace tessera::sim
