#pragma once
// The scheduler a simulation run places into: the production Scheduler with the run's policies and
// seed, the cluster's nodes and the workload FGD measures against, failure explanations off (runs
// only count failures).

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/core/request.h"
#include "tessera/sched/scheduler.h"

namespace tessera::sim {

// `capacity_milli` receives the cluster's GPU capacity in thousandths of a GPU. The nodes are
// assumed valid (the loaders checked them).
std::unique_ptr<sched::Scheduler> NewSimScheduler(
    const std::vector<core::NodeSpec>& nodes, const std::vector<sched::TypicalRequest>& typical,
    const std::vector<sched::WeightedPolicy>& policies, uint64_t seed, int64_t* capacity_milli);

}  // namespace tessera::sim
