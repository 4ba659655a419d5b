// Placement throughput of the scheduling core, per policy, on the real openb cluster (1,213 nodes,
// pods drawn from openb_pod_list_default.csv) and on a synthetic 10,000-node cluster (the openb
// node list repeated). One placement = one Scheduler::Place call of a pod drawn at random (seeded),
// as in the FGD paper's workload inflation; the cluster is rebuilt, untimed, once arrived GPU
// demand passes 130%.
//   build/bench/bench/sched_bench --benchmark_min_time=2
// Cases: each registered policy alone, and "tessera" (the default set); policy sets of one's own
// in $SCHED_BENCH_POLICIES, separated by ';' (e.g. "fgd,bestfit:0.01;tessera:2").
// Traces: $TESSERA_TRACES or the copy the checkout carries (traces/openb).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "tessera/sched/scheduler.h"
#include "tessera/sim/openb.h"

namespace {

using namespace tessera;

std::string TraceDir() {
  const char* env = std::getenv("TESSERA_TRACES");
  return env && *env ? env : TESSERA_SOURCE_DIR "/traces/openb";
}

const std::vector<core::NodeSpec>& OpenbNodes() {
  static auto nodes = [] {
    auto n = sim::LoadOpenbNodes(TraceDir() + "/openb_node_list_gpu_node.csv");
    if (!n.ok()) {
      std::cerr << n.status() << "\n";
      std::exit(2);
    }
    return *n;
  }();
  return nodes;
}

const std::vector<core::Request>& Pods() {
  static auto pods = [] {
    auto p = sim::LoadOpenbPods(TraceDir() + "/openb_pod_list_default.csv");
    if (!p.ok()) {
      std::cerr << p.status() << "\n";
      std::exit(2);
    }
    std::vector<core::Request> out;
    for (auto& tp : *p) out.push_back(tp.request);
    return out;
  }();
  return pods;
}

std::vector<core::NodeSpec> Synthetic(int count) {
  std::vector<core::NodeSpec> out;
  const auto& base = OpenbNodes();
  for (int i = 0; i < count; ++i) {
    core::NodeSpec n = base[i % base.size()];
    n.name = fmt::format("syn-{:05d}", i);
    out.push_back(std::move(n));
  }
  return out;
}

std::unique_ptr<sched::Scheduler> Build(const std::string& policy,
                                        const std::vector<core::NodeSpec>& nodes,
                                        int64_t* gpu_capacity) {
  sched::SchedulerConfig c;
  auto parsed = sched::ParsePolicies(policy);
  if (!parsed.ok()) {
    std::cerr << parsed.status() << "\n";
    std::exit(2);
  }
  c.policies = *parsed;
  c.explain_failures = false;
  auto s = std::make_unique<sched::Scheduler>(c);
  *gpu_capacity = 0;
  for (const auto& n : nodes) {
    (void)s->AddNode(n);
    *gpu_capacity += static_cast<int64_t>(n.gpus.size()) * 1000;
  }
  s->SetTypicalRequests(sched::TypicalRequests(Pods()));
  return s;
}

void Place(benchmark::State& state, const std::string& policy,
           const std::vector<core::NodeSpec>& nodes) {
  int64_t capacity = 0;
  auto s = Build(policy, nodes, &capacity);
  std::mt19937_64 rng(42);
  const auto& pods = Pods();
  int64_t arrived = 0, placed = 0, attempts = 0, rounds = 1;
  size_t bytes_per_node = 0;
  for (auto _ : state) {
    core::Request r = pods[rng() % pods.size()];
    r.id = fmt::format("p{}", attempts++);
    arrived += r.gpu_milli_total();
    auto a = s->Place(r);
    placed += a.ok();
    if (arrived > capacity * 13 / 10) {
      state.PauseTiming();
      bytes_per_node = std::max(bytes_per_node, s->state().ApproxBytesPerNode());
      s = Build(policy, nodes, &capacity);
      arrived = 0;
      ++rounds;
      state.ResumeTiming();
    }
  }
  bytes_per_node = std::max(bytes_per_node, s->state().ApproxBytesPerNode());
  state.SetItemsProcessed(attempts);
  state.counters["placed_ratio"] = attempts ? double(placed) / attempts : 0;
  state.counters["bytes_per_node"] = static_cast<double>(bytes_per_node);
  state.counters["rounds"] = static_cast<double>(rounds);
}

void Register() {
  static const std::vector<core::NodeSpec> synthetic = Synthetic(10000);
  std::vector<std::string> sets = sched::AllPolicyNames();
  sets.push_back("tessera");
  if (const char* extra = std::getenv("SCHED_BENCH_POLICIES")) {
    for (absl::string_view set : absl::StrSplit(extra, ';', absl::SkipEmpty()))
      sets.emplace_back(set);
  }
  for (const std::string& k : sets) {
    const std::string& name = k;
    benchmark::RegisterBenchmark(("Place/openb/" + name).c_str(), [k](benchmark::State& st) {
      Place(st, k, OpenbNodes());
    })->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("Place/synthetic10k/" + name).c_str(), [k](benchmark::State& st) {
      Place(st, k, synthetic);
    })->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
