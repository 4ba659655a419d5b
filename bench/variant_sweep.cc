// docs/simulator.md's table of the published openb variants: workload inflation to 130% with FGD
// and Tessera's default policy on every openb_pod_list_*.csv in a folder (the public repository's
// cluster-trace-gpu-v2023/csv holds 24), seeds 42.., in parallel. Usage:
//   variant_sweep DIR [--seeds N] [-j N]
// Prints a markdown table: mean allocation (s.d.), unallocated GPUs, and Tessera's lead over FGD in
// points and in GPUs, paired by seed with its standard error.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tessera/sim/inflation.h"
#include "tessera/sim/trace.h"

using namespace tessera;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: variant_sweep DIR [--seeds N] [-j N]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  int seeds = 10, jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--seeds") {
      seeds = std::max(2, std::atoi(argv[i + 1]));
    } else if (a == "-j") {
      jobs = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  std::string nodes_file = dir / "openb_node_list_gpu_node.csv";
  if (!std::filesystem::exists(nodes_file))
    nodes_file = TESSERA_SOURCE_DIR "/traces/openb/openb_node_list_gpu_node.csv";
  auto nodes = sim::LoadNodes(nodes_file, sim::TraceFormat::kOpenb);
  if (!nodes.ok()) {
    std::fprintf(stderr, "%s\n", std::string(nodes.status().message()).c_str());
    return 1;
  }
  std::vector<std::filesystem::path> lists;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("openb_pod_list_") && name.ends_with(".csv")) lists.push_back(e.path());
  }
  std::sort(lists.begin(), lists.end());
  std::printf(
      "| pod list | FGD allocation (s.d.) | FGD unallocated | Tessera allocation (s.d.) | "
      "Tessera unallocated | Tessera - FGD, points | GPUs (s.e.) |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double lead_sum = 0;
  for (const auto& list : lists) {
    auto loaded = sim::LoadJobs(list.string(), sim::TraceFormat::kOpenb);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
      return 1;
    }
    std::vector<core::Request> pods;
    for (const sim::SimJob& j : *loaded) pods.push_back(j.request);
    const auto typical = sched::TypicalRequests(pods);
    // alloc[policy][seed], unallocated[policy][seed]
    std::vector<double> alloc[2], unalloc[2];
    for (auto* v : {alloc, unalloc})
      for (int p = 0; p < 2; ++p) v[p].assign(static_cast<size_t>(seeds), 0);
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < jobs; ++t) {
      threads.emplace_back([&] {
        for (int k; (k = next++) < 2 * seeds;) {
          const int p = k % 2, s = k / 2;
          const char* policy = p == 0 ? "fgd" : "tessera";
          sim::InflationConfig c{.label = policy,
                                 .policies = *sched::ParsePolicies(policy),
                                 .seed = 42 + static_cast<uint64_t>(s)};
          auto r = sim::RunInflation(*nodes, pods, typical, c);
          alloc[p][size_t(s)] = 100 * r.final.allocated;
          unalloc[p][size_t(s)] = r.final.unallocated_gpus;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    auto mean = [&](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return s / double(v.size());
    };
    auto sd = [&](const std::vector<double>& v) {
      const double m = mean(v);
      double s = 0;
      for (double x : v) s += (x - m) * (x - m);
      return std::sqrt(s / double(v.size() - 1));
    };
    std::vector<double> diff;
    for (int s = 0; s < seeds; ++s) diff.push_back(unalloc[1][size_t(s)] - unalloc[0][size_t(s)]);
    const double lead = mean(alloc[1]) - mean(alloc[0]);
    lead_sum += lead;
    std::string name = list.stem().string().substr(std::string("openb_pod_list_").size());
    std::printf("| %s | %.2f%% (%.2f) | %.1f | %.2f%% (%.2f) | %.1f | %+.2f | %+.1f (%.1f) |\n",
                name.c_str(), mean(alloc[0]), sd(alloc[0]), mean(unalloc[0]), mean(alloc[1]),
                sd(alloc[1]), mean(unalloc[1]), lead, mean(diff),
                sd(diff) / std::sqrt(double(seeds)));
    std::fflush(stdout);
  }
  std::printf("\nmean lead over FGD: %+.2f points over %zu pod lists, %d seeds each\n",
              lists.empty() ? 0.0 : lead_sum / double(lists.size()), lists.size(), seeds);
  return 0;
}
