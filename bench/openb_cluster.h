#pragma once
// The experiments' cluster and workload: the openb GPU nodes and default pod list from
// $TESSERA_TRACES, else the checkout's traces/openb; `fraction` of the nodes kept, evenly through
// the list (every node type stays), to raise the load.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "tessera/sim/trace.h"

namespace tessera::bench {

struct OpenbCluster {
  std::vector<core::NodeSpec> nodes;
  std::vector<sim::SimJob> jobs;
  int64_t gpus = 0;
};

inline std::optional<OpenbCluster> LoadOpenbCluster(double fraction) {
  const char* env = std::getenv("TESSERA_TRACES");
  const std::string dir = env && *env ? env : TESSERA_SOURCE_DIR "/traces/openb";
  auto nodes = sim::LoadNodes(dir + "/openb_node_list_gpu_node.csv", sim::TraceFormat::kOpenb);
  auto jobs = sim::LoadJobs(dir + "/openb_pod_list_default.csv", sim::TraceFormat::kOpenb);
  if (!nodes.ok() || !jobs.ok()) {
    std::fprintf(stderr, "no openb traces in %s (set TESSERA_TRACES)\n", dir.c_str());
    return std::nullopt;
  }
  OpenbCluster out;
  for (size_t i = 0; i < nodes->size(); ++i) {
    // Node i is kept when the running count of kept nodes falls behind the fraction.
    if (static_cast<double>(out.nodes.size()) < fraction * static_cast<double>(i + 1))
      out.nodes.push_back((*nodes)[i]);
  }
  for (const core::NodeSpec& n : out.nodes) out.gpus += static_cast<int64_t>(n.gpus.size());
  out.jobs = *std::move(jobs);
  return out;
}

}  // namespace tessera::bench
