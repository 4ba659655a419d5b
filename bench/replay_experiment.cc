// The experiment of docs/simulator.md: the openb default trace replayed with its arrivals
// compressed, under three configurations, through the production scheduling cycle:
//   (a) a stock-Kubernetes-like baseline: pods retried in arrival order (priorities ignored, so no
//       priority preemption), kube-scheduler's LeastAllocated spreading, no backfill reservations;
//   (b) Tessera as before issue 17: its default policy set and priorities;
//   (c) (b) with predicted durations (from the jobs that finished earlier in the replay) and
//       backfill with 8 reservations.
// Preemption is off in all three unless --preemption turns it on for (b) and (c), as the standalone
// server has it ((a) ignores priorities, so it would preempt nothing). Usage:
// replay_experiment [COMPRESSION...] [--cluster FRACTION] [--preemption] [--out DIR].
// --cluster keeps that fraction of the openb nodes (evenly through the list, so every node type
// stays), which raises the load: the openb pod list is a snapshot sized to fit its whole cluster,
// so compressing arrivals alone never asks for more than ~94% of its GPUs. Prints one markdown
// table per compression (the runs of one compression share one busy period) and, with --out, each
// compression's CSV files and report.html, and each plot as an SVG file (allocation.svg, queue.svg,
// waits.svg, ...) under DIR/<compression>x/.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fmt/format.h"
#include "openb_cluster.h"
#include "tessera/sched/policy.h"
#include "tessera/sim/replay.h"
#include "tessera/sim/report.h"
#include "tessera/sim/trace.h"

using namespace tessera;

namespace {

struct Setup {
  const char* label;
  const char* policies;
  bool arrival_order, preemption;
  int reservations;
  bool predict;
};

const Setup kSetups[] = {
    {"(a) k8s-like", "spread", true, false, 0, false},
    {"(b) tessera", "tessera", false, false, 0, false},
    {"(c) tessera+backfill", "tessera", false, false, 8, true},
};

void Write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> compressions;
  std::string out;
  double fraction = 1;
  bool preemption = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--preemption") {
      preemption = true;
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--cluster" && i + 1 < argc) {
      fraction = std::atof(argv[++i]);
      if (!(fraction > 0 && fraction <= 1)) {
        std::fprintf(stderr, "--cluster: expected a fraction in (0, 1], got '%s'\n", argv[i]);
        return 2;
      }
    } else if (double c = std::atof(a.c_str()); c > 0) {
      compressions.push_back(c);
    } else {
      std::fprintf(stderr,
                   "usage: replay_experiment [COMPRESSION...] [--cluster FRACTION] [--preemption] "
                   "[--out DIR]\n");
      return 2;
    }
  }
  if (compressions.empty()) compressions = {10000};
  auto cluster = bench::LoadOpenbCluster(fraction);
  if (!cluster) return 1;
  const std::vector<core::NodeSpec>* nodes = &cluster->nodes;
  const std::vector<sim::SimJob>* jobs = &cluster->jobs;
  const int64_t gpus = cluster->gpus;
  std::vector<core::Request> requests;
  for (const sim::SimJob& j : *jobs) requests.push_back(j.request);
  const auto typical = sched::TypicalRequests(requests);
  for (double compression : compressions) {
    std::vector<sim::SimJob> scaled = *jobs;
    for (sim::SimJob& j : scaled) j.submit /= compression;
    std::vector<sim::ReplayResult> results(std::size(kSetups));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < std::size(kSetups); ++i) {
      threads.emplace_back([&, i] {
        const Setup& s = kSetups[i];
        sim::ReplayConfig c;
        c.label = s.label;
        c.policies = *sched::ParsePolicies(s.policies);
        c.arrival_order = s.arrival_order;
        c.preemption = s.preemption || (preemption && !s.arrival_order);
        c.reservations = s.reservations;
        c.predict = s.predict;
        results[i] = sim::RunReplay(*nodes, scaled, typical, c);
      });
    }
    for (std::thread& t : threads) t.join();
    // Allocation while jobs arrive (first to last arrival): the same demand offered to all three.
    double first = 1e300, last = -1e300;
    for (const sim::SimJob& j : scaled) {
      first = std::min(first, j.submit);
      last = std::max(last, j.submit);
    }
    std::vector<double> arriving;
    for (const sim::ReplayResult& r : results)
      arriving.push_back(sim::MeanAllocatedOver(r, first, last));
    sim::AlignBusyPeriods(results);
    std::printf(
        "\nopenb default trace on %zu nodes (%lld GPUs), arrivals compressed %gx; busy period %.0f "
        "s (first arrival to the last start in any run)\n\n",
        nodes->size(), static_cast<long long>(gpus), compression,
        results[0].busy_end - results[0].busy_start);
    std::printf(
        "| configuration | JCT mean | JCT p95 | wait mean | wait p95 | longest wait, 5+ GPU jobs "
        "| longest wait, any | allocation while arriving | allocation (busy mean) | peak |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const sim::ReplayResult& r = results[i];
      auto big = r.wait_by_gpus.find("5+");
      std::printf(
          "| %s | %.0f s | %.0f s | %.1f s | %.0f s | %.0f s | %.0f s | %.2f%% | %.2f%% | %.2f%% "
          "|\n",
          r.label.c_str(), r.jct.mean, r.jct.p95, r.wait.mean, r.wait.p95,
          big == r.wait_by_gpus.end() ? 0.0 : big->second.max, r.wait.max, 100 * arriving[i],
          100 * r.busy_mean_allocated, 100 * r.peak_allocated);
    }
    const sim::ReplayResult &a = results[0], &c = results[2];
    std::printf(
        "\n(c) against (a): mean JCT %+.2f%%, mean wait %+.1f s, allocation while arriving %+.2f "
        "points (%+.1f%%), busy-period allocation %+.2f points\n",
        100 * (c.jct.mean / a.jct.mean - 1), c.wait.mean - a.wait.mean,
        100 * (arriving[2] - arriving[0]), 100 * (arriving[2] / arriving[0] - 1),
        100 * (c.busy_mean_allocated - a.busy_mean_allocated));
    if (!out.empty()) {
      std::filesystem::path d = std::filesystem::path(out) / fmt::format("{}x", compression);
      std::filesystem::create_directories(d);
      Write(d / "replay_runs.csv", sim::ReplayRunsCsv(results));
      Write(d / "replay_waits.csv", sim::ReplayWaitsCsv(results));
      Write(d / "replay_series.csv", sim::ReplaySeriesCsv(results));
      for (const auto& [slug, svg] : sim::ReplayCharts(results)) Write(d / (slug + ".svg"), svg);
      Write(d / "report.html",
            sim::HtmlReport(fmt::format("Replay experiment: openb default on {} nodes, arrivals "
                                        "compressed {}x",
                                        nodes->size(), compression),
                            "(a) stock-Kubernetes-like, (b) Tessera, (c) Tessera with predicted "
                            "durations and backfill reservations",
                            {}, results));
    }
  }
  return 0;
}
