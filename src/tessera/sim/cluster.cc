#include "tessera/sim/cluster.h"

namespace tessera::sim {

std::unique_ptr<sched::Scheduler> NewSimScheduler(
    const std::vector<core::NodeSpec>& nodes, const std::vector<sched::TypicalRequest>& typical,
    const std::vector<sched::WeightedPolicy>& policies, uint64_t seed, int64_t* capacity_milli) {
  sched::SchedulerConfig config;
  config.policies = policies;
  config.seed = seed;
  config.explain_failures = false;
  auto s = std::make_unique<sched::Scheduler>(config);
  *capacity_milli = 0;
  for (const core::NodeSpec& n : nodes) {
    (void)s->AddNode(n);
    *capacity_milli += static_cast<int64_t>(n.gpus.size()) * core::kMilliPerGpu;
  }
  s->SetTypicalRequests(typical);
  return s;
}

}  // namespace tessera::sim
