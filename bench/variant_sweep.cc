// docs/simulator.md's tables of openb variants: workload inflation to 130% with a base policy set
// (FGD) and a candidate (Tessera's default) on every openb_pod_list_*.csv in a folder (the public
// repository's cluster-trace-gpu-v2023/csv holds 24), or on variants generated from the carried
// files (--generated: a tuning set none of the published lists nor the test's is), seeds 42..,
// in parallel. Usage:
//   variant_sweep DIR|--generated [--seeds N] [-j N] [--base POLICIES] [--policy POLICIES]
// Prints a markdown table: mean allocation (s.d.), unallocated GPUs, the candidate's lead over the
// base in points and in GPUs (paired by seed, with its standard error) and, for the 17 lists the
// FGD paper evaluated, the candidate's lead over the paper's FGD figure (sim/paper.h); then where
// the candidate's unallocated compute is at the end: GPUs left whole, and partly used GPUs by what
// they have left (the three commonest amounts).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tessera/sim/inflation.h"
#include "tessera/sim/paper.h"
#include "tessera/sim/trace.h"
#include "tessera/sim/variant.h"

using namespace tessera;

namespace {

std::vector<core::Request> Load(const std::string& path) {
  auto loaded = sim::LoadJobs(path, sim::TraceFormat::kOpenb);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    std::exit(1);
  }
  std::vector<core::Request> pods;
  for (const sim::SimJob& j : *loaded) pods.push_back(j.request);
  return pods;
}

// A tuning set: variants of the carried lists with parts none of the published lists or the
// test's generated ones has (seeds 201..).
std::vector<std::pair<std::string, std::vector<core::Request>>> Generated() {
  const std::string dir = TESSERA_SOURCE_DIR "/traces/openb/";
  std::vector<core::Request> base = Load(dir + "openb_pod_list_default.csv");
  const std::vector<core::Request> multi = Load(dir + "openb_pod_list_multigpu20.csv");
  base.insert(base.end(), multi.begin(), multi.end());
  const std::vector<core::Request> models = Load(dir + "openb_pod_list_gpuspec20.csv");
  struct Spec {
    const char* name;
    sim::VariantSpec spec;
  };
  const Spec specs[] = {
      {"g-share15", {.share = 0.15, .seed = 201}},
      {"g-share50", {.share = 0.5, .seed = 202}},
      {"g-share70-multi5", {.share = 0.7, .multi_gpu = 0.05, .seed = 203}},
      {"g-share95", {.share = 0.95, .multi_gpu = 0.02, .seed = 204}},
      {"g-multi15", {.multi_gpu = 0.15, .seed = 205}},
      {"g-multi25-share20", {.share = 0.2, .multi_gpu = 0.25, .seed = 206}},
      {"g-multi45", {.multi_gpu = 0.45, .seed = 207}},
      {"g-constrained15", {.constrained = 0.15, .seed = 208}},
      {"g-constrained30-share50", {.share = 0.5, .constrained = 0.3, .seed = 209}},
      {"g-cpu0.3", {.cpu_only = 0.3, .seed = 210}},
      {"g-cpu2", {.cpu_only = 2, .seed = 211}},
      {"g-mixed",
       {.share = 0.45, .multi_gpu = 0.2, .constrained = 0.2, .cpu_only = 1.5, .seed = 212}},
  };
  std::vector<std::pair<std::string, std::vector<core::Request>>> out;
  for (const Spec& s : specs) {
    auto v = sim::MakeVariant(base, models, s.spec);
    if (!v.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name, std::string(v.status().message()).c_str());
      std::exit(1);
    }
    out.emplace_back(s.name, std::move(*v));
  }
  return out;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

double Sd(const std::vector<double>& v) {
  const double m = Mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr,
                 "usage: variant_sweep DIR|--generated [--seeds N] [-j N] [--base POLICIES] "
                 "[--policy POLICIES]\n");
    return 2;
  }
  const std::string where = argv[1];
  std::string base = "fgd", candidate = "tessera";
  int seeds = 10, jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--seeds") {
      seeds = std::max(2, std::atoi(argv[i + 1]));
    } else if (a == "-j") {
      jobs = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--base") {
      base = argv[i + 1];
    } else if (a == "--policy") {
      candidate = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  for (const std::string& p : {base, candidate}) {
    if (auto parsed = sched::ParsePolicies(p); !parsed.ok()) {
      std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
  }
  std::string nodes_file = std::filesystem::path(where) / "openb_node_list_gpu_node.csv";
  if (where == "--generated" || !std::filesystem::exists(nodes_file))
    nodes_file = TESSERA_SOURCE_DIR "/traces/openb/openb_node_list_gpu_node.csv";
  auto nodes = sim::LoadNodes(nodes_file, sim::TraceFormat::kOpenb);
  if (!nodes.ok()) {
    std::fprintf(stderr, "%s\n", std::string(nodes.status().message()).c_str());
    return 1;
  }
  std::vector<std::pair<std::string, std::vector<core::Request>>> workloads;
  if (where == "--generated") {
    workloads = Generated();
  } else {
    std::vector<std::filesystem::path> lists;
    for (const auto& e : std::filesystem::directory_iterator(where)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("openb_pod_list_") && name.ends_with(".csv")) lists.push_back(e.path());
    }
    std::sort(lists.begin(), lists.end());
    for (const auto& list : lists) {
      workloads.emplace_back(list.stem().string().substr(std::string("openb_pod_list_").size()),
                             Load(list.string()));
    }
  }
  std::printf("base: %s; candidate: %s\n\n", base.c_str(), candidate.c_str());
  std::printf(
      "| pod list | base allocation (s.d.) | base unallocated | candidate allocation (s.d.) | "
      "candidate unallocated | candidate - base, points | GPUs (s.e.) | paper's FGD | "
      "candidate - paper |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double lead_sum = 0, paper_sum = 0, paper_worst = 1e9;
  int paper_n = 0;
  std::vector<std::string> where_rows;
  for (const auto& [name, pods] : workloads) {
    const auto typical = sched::TypicalRequests(pods);
    // alloc[policy][seed], unallocated[policy][seed]
    std::vector<double> alloc[2], unalloc[2];
    // The candidate's end states, summed over seeds: whole GPUs free, GPUs by thousandths left.
    double whole = 0;
    std::map<int32_t, double> left;
    std::mutex mu;
    for (auto* v : {alloc, unalloc})
      for (int p = 0; p < 2; ++p) v[p].assign(static_cast<size_t>(seeds), 0);
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < jobs; ++t) {
      threads.emplace_back([&] {
        for (int k; (k = next++) < 2 * seeds;) {
          const int p = k % 2, s = k / 2;
          const std::string& policy = p == 0 ? base : candidate;
          sim::InflationConfig c{.label = policy,
                                 .policies = *sched::ParsePolicies(policy),
                                 .seed = 42 + static_cast<uint64_t>(s)};
          auto r = sim::RunInflation(*nodes, pods, typical, c);
          alloc[p][size_t(s)] = 100 * r.final.allocated;
          unalloc[p][size_t(s)] = r.final.unallocated_gpus;
          if (p == 1) {
            std::lock_guard<std::mutex> lock(mu);
            whole += double(r.whole_free_gpus) / seeds;
            for (const auto& [milli, n] : r.gpus_by_milli_left) left[milli] += double(n) / seeds;
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    std::vector<double> diff;
    for (int s = 0; s < seeds; ++s) diff.push_back(unalloc[1][size_t(s)] - unalloc[0][size_t(s)]);
    const double lead = Mean(alloc[1]) - Mean(alloc[0]);
    lead_sum += lead;
    std::string paper = "-", over_paper = "-";
    if (const auto figure = sim::PaperAllocationPercent("fgd", name)) {
      const double d = Mean(alloc[1]) - *figure;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f%%", *figure);
      paper = buf;
      std::snprintf(buf, sizeof buf, "%+.2f", d);
      over_paper = buf;
      paper_sum += d;
      paper_worst = std::min(paper_worst, d);
      ++paper_n;
    }
    std::printf(
        "| %s | %.2f%% (%.2f) | %.1f | %.2f%% (%.2f) | %.1f | %+.2f | %+.1f (%.1f) | %s | %s |\n",
        name.c_str(), Mean(alloc[0]), Sd(alloc[0]), Mean(unalloc[0]), Mean(alloc[1]), Sd(alloc[1]),
        Mean(unalloc[1]), lead, Mean(diff), Sd(diff) / std::sqrt(double(seeds)), paper.c_str(),
        over_paper.c_str());
    std::fflush(stdout);
    std::vector<std::pair<double, int32_t>> by_amount;  // GPU-equivalents, thousandths left
    double partial = 0;
    for (const auto& [milli, n] : left) {
      by_amount.emplace_back(n * milli / 1000.0, milli);
      partial += n * milli / 1000.0;
    }
    std::sort(by_amount.rbegin(), by_amount.rend());
    std::string row = "| " + name + " | " + std::to_string(int(std::lround(whole))) + " | " +
                      std::to_string(int(std::lround(partial))) + " |";
    for (size_t i = 0; i < 3; ++i) {
      if (i < by_amount.size()) {
        const auto [gpus_worth, milli] = by_amount[i];
        row += " " + std::to_string(milli) + ": " + std::to_string(int(std::lround(left[milli]))) +
               " GPUs, " + std::to_string(int(std::lround(gpus_worth))) + " |";
      } else {
        row += " - |";
      }
    }
    where_rows.push_back(row);
  }
  std::printf("\nmean lead over the base: %+.2f points over %zu pod lists, %d seeds each\n",
              workloads.empty() ? 0.0 : lead_sum / double(workloads.size()), workloads.size(),
              seeds);
  if (paper_n > 0) {
    std::printf("mean lead over the paper's FGD: %+.2f points over %d pod lists (least %+.2f)\n",
                paper_sum / paper_n, paper_n, paper_worst);
  }
  std::printf(
      "\nWhere the candidate's unallocated compute is at the end (means over seeds; a partly used "
      "GPU by the thousandths it has left: how many such GPUs, and their sum in GPUs):\n\n"
      "| pod list | GPUs left whole | in partly used GPUs | commonest | second | third |\n"
      "| --- | ---: | ---: | --- | --- | --- |\n");
  for (const std::string& row : where_rows) std::printf("%s\n", row.c_str());
  return 0;
}
