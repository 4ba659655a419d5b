// How long a restarted extender takes to have its model back (issue 49): the openb cluster (1,213
// GPU nodes) filled to `fill` of its GPUs with pods placed and bound by an extender, then a new
// extender fed every Node and bound Pod as a relist gives them, in three orders - nodes first,
// pods first (every bound pod waits for its node), shuffled - timed from the first event to the
// last, and checked: the same GPU compute allocated, nothing unaccounted.
//   extender_restart_bench [FILL=0.8] [ROUNDS=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "spdlog/spdlog.h"
#include "tessera/core/clock.h"
#include "tessera/extender/extender.h"
#include "tessera/extender/test_objects.h"
#include "tessera/sim/openb.h"

using nlohmann::json;
using namespace tessera;

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::err);
  const double fill = argc > 1 ? std::atof(argv[1]) : 0.8;
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  const char* env = std::getenv("TESSERA_TRACES");
  const std::string dir = env && *env ? env : TESSERA_SOURCE_DIR "/traces/openb";
  auto specs = sim::LoadOpenbNodes(dir + "/openb_node_list_gpu_node.csv");
  auto trace = sim::LoadOpenbPods(dir + "/openb_pod_list_default.csv");
  if (!specs.ok() || !trace.ok()) {
    std::fprintf(stderr, "no openb traces in %s (set TESSERA_TRACES)\n", dir.c_str());
    return 1;
  }
  std::vector<json> nodes;
  std::vector<std::string> names;
  int64_t capacity = 0;
  for (const core::NodeSpec& n : *specs) {
    nodes.push_back(extender::testing::OpenbNode(n));
    names.push_back(n.name);
    capacity += static_cast<int64_t>(n.gpus.size()) * core::kMilliPerGpu;
  }
  // The running cluster: pods placed and bound until `fill` of the GPUs is taken.
  core::FakeClock clock;
  extender::ExtenderOptions o;
  o.scheduler.random_ties = false;
  auto live = std::make_unique<extender::Extender>(o, clock);
  for (const json& n : nodes) live->OnNode(kube::EventType::kAdded, n);
  std::vector<json> bound;
  std::mt19937_64 draw(42);
  std::vector<core::Request> gpu_pods;
  for (const auto& p : *trace) {
    if (p.request.wants_gpu()) gpu_pods.push_back(p.request);
  }
  for (int i = 0; live->stats().gpu_milli_allocated < fill * capacity && i < 200000; ++i) {
    json pod =
        extender::testing::OpenbPod(gpu_pods[draw() % gpu_pods.size()], "p-" + std::to_string(i));
    auto f = live->Filter(pod, names);
    if (f.nodes.size() != 1) continue;
    auto plan =
        live->PrepareBind("openb", pod["metadata"]["name"], pod["metadata"]["uid"], f.nodes[0]);
    if (!plan.ok()) continue;
    pod["spec"]["nodeName"] = f.nodes[0];
    pod["metadata"]["annotations"][kube::kAssignmentAnnotation] =
        kube::FormatAssignment(plan->assignment);
    pod["status"]["phase"] = "Running";
    live->OnPod(kube::EventType::kModified, pod);
    bound.push_back(pod);
  }
  const int64_t want = live->stats().gpu_milli_allocated;
  std::printf("openb: %zu nodes, %zu bound pods, %.1f%% of %lld GPUs allocated\n", nodes.size(),
              bound.size(), 100.0 * want / capacity, static_cast<long long>(capacity / 1000));
  std::printf("%-14s %8s %8s %8s   %s\n", "order", "min ms", "median", "max ms", "check");
  double nodes_first_median = 0;
  for (const char* order : {"nodes-first", "pods-first", "shuffled"}) {
    std::vector<double> ms;
    bool ok = true;
    for (int r = 0; r < rounds; ++r) {
      std::vector<std::pair<bool, const json*>> events;  // (is node, object)
      for (const json& n : nodes) events.emplace_back(true, &n);
      for (const json& p : bound) events.emplace_back(false, &p);
      if (std::string(order) == "pods-first") {
        std::stable_partition(events.begin(), events.end(), [](auto& e) { return !e.first; });
      } else if (std::string(order) == "shuffled") {
        std::shuffle(events.begin(), events.end(), std::mt19937_64(r));
      }
      extender::Extender restarted(o, clock);
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& [is_node, obj] : events) {
        if (is_node) {
          restarted.OnNode(kube::EventType::kAdded, *obj);
        } else {
          restarted.OnPod(kube::EventType::kAdded, *obj);
        }
      }
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      const auto s = restarted.stats();
      ok = ok && s.gpu_milli_allocated == want && s.unaccounted == 0 &&
           s.bound == static_cast<int>(bound.size());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    if (std::string(order) == "nodes-first") nodes_first_median = median;
    std::printf("%-14s %8.1f %8.1f %8.1f   %s (x%.2f of nodes-first)\n", order, ms.front(), median,
                ms.back(), ok ? "same model" : "DIFFERENT MODEL", median / nodes_first_median);
    if (!ok) return 1;
  }
  return 0;
}
