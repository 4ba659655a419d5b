// The extender decides as the simulator does: the openb default trace's GPU pods, drawn as `tessera
// sim inflate --policies tessera` draws them, are filtered and bound through the extender (as
// Kubernetes objects: nodes annotated by the agent, pods with Tessera's requests) and land on the
// same nodes and GPUs as in the simulator's own run, with the same totals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/extender/extender.h"
#include "tessera/extender/test_objects.h"
#include "tessera/kube/gpu_annotations.h"
#include "tessera/sched/policy.h"
#include "tessera/sim/cluster.h"
#include "tessera/sim/inflation.h"
#include "tessera/sim/openb.h"

namespace tessera::extender {
namespace {

using nlohmann::json;

std::string Traces() {
  const char* env = std::getenv("TESSERA_TRACES");
  return env && *env ? env : TESSERA_SOURCE_DIR "/traces/openb";
}

}  // namespace

namespace {

TEST(Placement, ExtenderMatchesTheSimulatorOnTheOpenbTrace) {
  const std::string dir = Traces();
  ASSERT_TRUE(std::filesystem::exists(dir)) << "no traces at " << dir << " (set TESSERA_TRACES)";
  auto nodes = sim::LoadOpenbNodes(dir + "/openb_node_list_gpu_node.csv");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  auto trace = sim::LoadOpenbPods(dir + "/openb_pod_list_default.csv");
  ASSERT_TRUE(trace.ok()) << trace.status();
  std::vector<core::Request> all, gpu_pods;
  for (const auto& p : *trace) {
    all.push_back(p.request);
    // CPU-only pods never reach the extender (kube-scheduler calls it only for its resources).
    if (p.request.wants_gpu()) gpu_pods.push_back(p.request);
  }
  const std::vector<sched::TypicalRequest> typical = sched::TypicalRequests(all);
  auto policies = sched::ParsePolicies("tessera");
  ASSERT_TRUE(policies.ok());
  const uint64_t seed = 7;

  sim::InflationConfig config;
  config.label = "tessera";
  config.policies = *policies;
  config.seed = seed;
  config.ratio = 1.3;
  sim::InflationResult want = sim::RunInflation(*nodes, gpu_pods, typical, config);

  // The simulator's own placements, pod by pod (RunInflation's loop, recorded).
  int64_t capacity = 0;
  auto direct = sim::NewSimScheduler(*nodes, typical, *policies, seed, &capacity);

  ExtenderOptions o;
  o.scheduler.policies = *policies;
  o.scheduler.seed = seed;
  core::FakeClock clock;
  Extender ex(o, clock);
  ex.SetTypicalRequests(typical);
  std::vector<std::string> names;
  for (const core::NodeSpec& n : *nodes) {
    ex.OnNode(kube::EventType::kAdded, testing::OpenbNode(n));
    names.push_back(n.name);
  }
  ASSERT_EQ(ex.stats().nodes, static_cast<int>(nodes->size()));

  // One log line per decision is what operators want; ten thousand here are noise.
  spdlog::set_level(spdlog::level::warn);
  sim::ArrivalOrder arrivals(gpu_pods.size(), seed);
  const double target = config.ratio * static_cast<double>(capacity);
  int64_t arrived = 0, failed = 0, n = 0, mismatches = 0;
  while (static_cast<double>(arrived) < target) {
    core::Request r = gpu_pods[arrivals.Next()];
    r.id = fmt::format("i{}", n);
    const std::string name = r.id;
    ++n;
    arrived += r.gpu_milli_total();
    auto a = direct->Place(r);
    json pod = testing::OpenbPod(r, name);
    FilterResult f = ex.Filter(pod, names);
    ASSERT_TRUE(f.error.empty()) << name << ": " << f.error;
    if (!a.ok()) {
      ++failed;
      mismatches += !f.nodes.empty();
      ex.OnPod(kube::EventType::kDeleted, pod);  // failed pods are not retried, as in inflation
      continue;
    }
    if (f.nodes.size() != 1 || f.nodes[0] != direct->state().node_name(a->node)) {
      ++mismatches;
      ADD_FAILURE() << name << ": simulator " << direct->state().node_name(a->node) << ", extender "
                    << (f.nodes.empty() ? f.reason : f.nodes[0]);
      break;
    }
    auto plan = ex.PrepareBind("openb", name, "uid-" + name, f.nodes[0]);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(ex.AllocationOf("openb/" + name)->gpus, a->gpus) << name;
    pod["spec"]["nodeName"] = f.nodes[0];
    pod["metadata"]["annotations"][kube::kAssignmentAnnotation] =
        kube::FormatAssignment(plan->assignment);
    ex.OnPod(kube::EventType::kModified, pod);
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(n, want.final.pods_arrived);
  EXPECT_EQ(failed, want.final.pods_failed);
  EXPECT_GT(failed, 0) << "the run should reach a full cluster";
  EXPECT_DOUBLE_EQ(ex.stats().gpu_milli_allocated / static_cast<double>(capacity),
                   want.final.allocated);
  EXPECT_EQ(ex.stats().bound, n - failed);
  spdlog::set_level(spdlog::level::info);
}

}  // namespace
}  // namespace tessera::extender
