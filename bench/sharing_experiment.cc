// The GPU-sharing experiment of docs/simulator.md (issue 36): the openb default trace replayed on
// the openb cluster under contention, three ways, through the production scheduling engine:
//   (a) stock Kubernetes without sharing: the NVIDIA device plugin gives a pod that asks for a
//       fraction of a GPU a whole one (rounded up, on as many GPUs as it asked shares of);
//       kube-scheduler's LeastAllocated spreading; pods retried in arrival order (priorities
//       ignored, so nothing preempts); no reservations;
//   (b) GPU sharing with time slicing and Tessera's placement: shares as asked, co-located shares
//       slowing each other by their summed utilization (the replay's interference model), the
//       default policy set, still arrival order;
//   (c) (b) plus priorities (the queue's order, preemption, and the arbiter serving a GPU's shares
//       by priority at the efficiency measured on an H100), backfill with 8 reservations and
//       predictions from the jobs finished earlier (durations and, for the 70% soft utilization
//       ceiling of the server's default, utilization).
// openb records no GPU utilization, so each job is given one by its kind (stated in Assumptions()
// and printed with the figures): a share is one of the interference experiment's four kinds, a job
// of whole GPUs is training. Usage:
//   sharing_experiment [--compress X] [--cluster FRACTION] [--seeds N] [--out DIR]
// Prints the assumptions, the offered load and a markdown table (means over the seeds); with
// --out, the first seed's CSV files, report.html and each plot as an SVG file under DIR (over
// three times the contention window).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
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

// How busy a job keeps its GPUs, by kind: percent, +-10 per job (uniform), at most 100.
struct Kind {
  const char* name;
  int util;
  double weight;  // part of the shares (the whole-GPU kind is every job of whole GPUs)
};
const Kind kShareKinds[] = {
    {"notebook", 15, 0.3},  // interactive: mostly idle
    {"infer", 50, 0.3},     // a model server under load
    {"finetune", 80, 0.2},  // small training
    {"eval", 65, 0.2},      // batch evaluation
};
const Kind kTraining = {"training", 85, 1};  // whole GPUs: data loading and communication idle it

// The arbiter's efficiency for a share beside lower-priority busy ones: a high-priority job kept
// 97.6-97.9% of its throughput beside one or two low tenants on an H100 (2026-11-26, since a low
// tenant outranked during its drain no longer launches; 93-94% before; docs/sharing.md).
constexpr double kPriorityEfficiency = 0.978;

std::string Assumptions() {
  std::string s = "utilization per job (openb records none), +-10 points per job, at most 100%: ";
  for (const Kind& k : kShareKinds)
    s += fmt::format("share {} {}% ({:.0f}% of shares), ", k.name, k.util, 100 * k.weight);
  s += fmt::format(
      "whole GPUs {} {}%; high priority = openb LS and Guaranteed (not preemptible), low = "
      "Burstable and BE; the arbiter serves a GPU's shares by priority at {:.3f} efficiency",
      kTraining.name, kTraining.util, kPriorityEfficiency);
  return s;
}

// Gives each job its kind's utilization (seeded: the same for all three configurations).
void DrawUtilization(std::vector<sim::SimJob>& jobs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0, 1);
  double weights = 0;
  for (const Kind& k : kShareKinds) weights += k.weight;
  for (sim::SimJob& j : jobs) {
    const Kind* kind = nullptr;
    if (j.request.fractional()) {
      double pick = unit(rng) * weights;
      for (const Kind& k : kShareKinds) {
        kind = &k;
        if ((pick -= k.weight) < 0) break;
      }
    } else if (j.request.gpus > 0) {
      kind = &kTraining;
    }
    const double jitter = unit(rng) * 20 - 10;
    if (kind != nullptr) j.utilization = std::clamp(std::round(kind->util + jitter), 1.0, 100.0);
  }
}

// The device plugin's answer to a fraction: whole GPUs.
std::vector<sim::SimJob> RoundedUp(std::vector<sim::SimJob> jobs) {
  for (sim::SimJob& j : jobs) {
    core::Request& r = j.request;
    if (!r.fractional()) continue;
    r.gpus = r.shared_gpu_count();
    r.gpu_milli = 0;
    r.gpu_memory_mib = 0;
    r.share_gpus = 0;
  }
  return jobs;
}

struct Setup {
  const char* label;
  const char* policies;
  bool whole, priorities;
};
const Setup kSetups[] = {
    {"(a) k8s, no sharing", "spread", true, false},
    {"(b) sharing", "tessera", false, false},
    {"(c) sharing+priorities+backfill", "tessera", false, true},
};

sim::ReplayConfig ConfigOf(const Setup& s, uint64_t seed) {
  sim::ReplayConfig c;
  c.label = s.label;
  c.seed = seed;
  c.policies = *sched::ParsePolicies(s.policies);
  c.arrival_order = !s.priorities;
  c.preemption = s.priorities;
  c.interference = !s.whole;
  c.interference_priorities = s.priorities;
  c.priority_share_efficiency = kPriorityEfficiency;
  if (s.priorities) {
    c.reservations = 8;
    c.predict = true;
    c.utilization_ceiling_pct = 70;
  }
  return c;
}

// The figures of one run.
struct Figures {
  double jct_mean = 0, jct_p50 = 0, jct_p95 = 0, wait_mean = 0, slow = 0, alloc = 0, busy = 0,
         high_slow = 0, high_slow_p95 = 0, low_slow = 0, low_jct = 0, share_slow = 0,
         preemptions = 0, alloc_long = 0, busy_long = 0;
};

Figures FiguresOf(const sim::ReplayResult& r, double first, double last) {
  Figures f;
  f.jct_mean = r.jct.mean;
  f.jct_p50 = r.jct.p50;
  f.jct_p95 = r.jct.p95;
  f.wait_mean = r.wait.mean;
  f.alloc = sim::MeanAllocatedOver(r, first, last);
  f.busy = sim::MeanBusyOver(r, first, last);
  // Means over the priorities `keep` takes, weighted by their counts; the highest p95 among them.
  auto merge = [](const std::map<int, sim::Distribution>& by, auto keep, double* mean,
                  double* p95) {
    double sum = 0, n = 0, worst = 0;
    for (const auto& [p, d] : by) {
      if (!keep(p)) continue;
      sum += d.mean * double(d.count);
      n += double(d.count);
      worst = std::max(worst, d.p95);
    }
    *mean = n > 0 ? sum / n : 0;
    if (p95 != nullptr) *p95 = worst;
  };
  auto high = [](int p) { return p >= 2; };
  auto low = [](int p) { return p < 2; };
  merge(r.slowdown_by_priority, high, &f.high_slow, &f.high_slow_p95);
  merge(r.slowdown_by_priority, low, &f.low_slow, nullptr);
  merge(
      r.slowdown_by_priority, [](int) { return true; }, &f.slow, nullptr);
  merge(r.jct_by_priority, low, &f.low_jct, nullptr);
  f.share_slow = r.share_slowdown_mean;
  f.preemptions = double(r.preemptions);
  return f;
}

void Write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

}  // namespace

int main(int argc, char** argv) {
  double compression = 1000, fraction = 1;
  int seeds = 3;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto number = [&](double lo, double hi) {
      double v = i + 1 < argc ? std::atof(argv[++i]) : 0;
      if (!(v >= lo && v <= hi)) {
        std::fprintf(stderr, "%s: expected a number in [%g, %g]\n", a.c_str(), lo, hi);
        std::exit(2);
      }
      return v;
    };
    if (a == "--compress") {
      compression = number(1, 1e9);
    } else if (a == "--cluster") {
      fraction = number(0.01, 1);
    } else if (a == "--seeds") {
      seeds = static_cast<int>(number(1, 100));
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: sharing_experiment [--compress X] [--cluster FRACTION] [--seeds N] "
                   "[--out DIR]\n");
      return 2;
    }
  }
  auto cluster = bench::LoadOpenbCluster(fraction);
  if (!cluster) return 1;
  const std::vector<core::NodeSpec>* nodes = &cluster->nodes;
  const int64_t gpus = cluster->gpus;
  std::vector<sim::SimJob> jobs = cluster->jobs;
  double first = 1e300, last = -1e300;
  for (sim::SimJob& j : jobs) {
    j.submit /= compression;
    first = std::min(first, j.submit);
    last = std::max(last, j.submit);
  }
  // Offered load while jobs arrive: GPU-seconds asked (allocated, and busy by the drawn
  // utilization) over the GPUs' time from the first arrival to the last.
  {
    std::vector<sim::SimJob> probe = jobs;
    DrawUtilization(probe, 1);
    double asked = 0, whole = 0, busy = 0;
    for (const sim::SimJob& j : probe) {
      const double d = std::max(j.duration, 0.0);
      const double g = double(j.request.gpu_milli_total()) / core::kMilliPerGpu;
      asked += g * d;
      whole += double(j.request.gpu_count()) * d;
      busy += double(j.request.gpu_count()) * std::max(j.utilization, 0.0) / 100 * d;
    }
    const double cap = double(gpus) * (last - first);
    std::printf(
        "openb default (%zu jobs) on %zu nodes (%lld GPUs), arrivals compressed %gx over %.0f s; "
        "offered load: %.2f of the GPUs' time as asked, %.2f rounded up to whole GPUs, %.2f busy "
        "(%d seeds)\n%s\n\n",
        jobs.size(), nodes->size(), static_cast<long long>(gpus), compression, last - first,
        asked / cap, whole / cap, busy / cap, seeds, Assumptions().c_str());
  }
  std::vector<core::Request> requests;
  for (const sim::SimJob& j : jobs) requests.push_back(j.request);
  const auto typical = sched::TypicalRequests(requests);
  std::vector<core::Request> rounded_requests;
  for (const sim::SimJob& j : RoundedUp(jobs)) rounded_requests.push_back(j.request);
  const auto rounded_typical = sched::TypicalRequests(rounded_requests);

  constexpr size_t kRuns = std::size(kSetups);
  std::vector<std::vector<sim::ReplayResult>> results(static_cast<size_t>(seeds),
                                                      std::vector<sim::ReplayResult>(kRuns));
  for (int seed = 0; seed < seeds; ++seed) {
    // The same draws for all three: a share keeps its kind's utilization on a whole GPU.
    std::vector<sim::SimJob> drawn = jobs;
    DrawUtilization(drawn, 42 + static_cast<uint64_t>(seed));
    const std::vector<sim::SimJob> drawn_whole = RoundedUp(drawn);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < kRuns; ++i) {
      threads.emplace_back([&, i, seed] {
        const Setup& s = kSetups[i];
        results[size_t(seed)][i] = sim::RunReplay(*nodes, s.whole ? drawn_whole : drawn,
                                                  s.whole ? rounded_typical : typical,
                                                  ConfigOf(s, 42 + static_cast<uint64_t>(seed)));
      });
      if (threads.size() == 2 || i + 1 == kRuns) {
        for (std::thread& t : threads) t.join();
        threads.clear();
      }
    }
    std::fprintf(stderr, "seed %d of %d done (%.1f s, %.1f s, %.1f s)\n", seed + 1, seeds,
                 results[size_t(seed)][0].seconds, results[size_t(seed)][1].seconds,
                 results[size_t(seed)][2].seconds);
  }
  // Allocation and busy time under contention, over two windows from the first arrival (the
  // arrivals alone, 129 s, see only the cluster filling up): until the first of the three
  // configurations had an empty queue after the last arrival (`until`: a few jobs too large for any
  // free node can keep a queue from emptying long after the rest started), and until the first of
  // them had fewer than 1% of the jobs waiting (`long_until`: the backlog of the burst).
  std::vector<double> until(static_cast<size_t>(seeds)), long_until(static_cast<size_t>(seeds));
  const int64_t backlog = static_cast<int64_t>(jobs.size() / 100);
  for (int seed = 0; seed < seeds; ++seed) {
    until[size_t(seed)] = long_until[size_t(seed)] = 1e300;
    for (const sim::ReplayResult& r : results[size_t(seed)]) {
      double drained = r.end_time, short_queue = r.end_time;
      for (const sim::ReplaySample& e : r.events) {
        if (e.time < last) continue;
        if (e.queued < backlog) short_queue = std::min(short_queue, e.time);
        if (e.queued == 0) {
          drained = e.time;
          break;
        }
      }
      std::fprintf(stderr, "%s: queue under %lld jobs at %.0f s, empty at %.0f s\n",
                   r.label.c_str(), static_cast<long long>(backlog), short_queue - first,
                   drained - first);
      until[size_t(seed)] = std::min(until[size_t(seed)], drained);
      long_until[size_t(seed)] = std::min(long_until[size_t(seed)], short_queue);
    }
  }
  std::vector<Figures> mean(kRuns);
  for (size_t i = 0; i < kRuns; ++i) {
    for (int seed = 0; seed < seeds; ++seed) {
      Figures f = FiguresOf(results[size_t(seed)][i], first, until[size_t(seed)]);
      f.alloc_long =
          sim::MeanAllocatedOver(results[size_t(seed)][i], first, long_until[size_t(seed)]);
      f.busy_long = sim::MeanBusyOver(results[size_t(seed)][i], first, long_until[size_t(seed)]);
      Figures& m = mean[i];
      const double w = 1.0 / seeds;
      m.jct_mean += w * f.jct_mean, m.jct_p95 += w * f.jct_p95, m.wait_mean += w * f.wait_mean;
      m.jct_p50 += w * f.jct_p50, m.slow += w * f.slow;
      m.alloc += w * f.alloc, m.busy += w * f.busy, m.high_slow += w * f.high_slow;
      m.high_slow_p95 += w * f.high_slow_p95, m.low_slow += w * f.low_slow;
      m.low_jct += w * f.low_jct, m.share_slow += w * f.share_slow;
      m.preemptions += w * f.preemptions;
      m.alloc_long += w * f.alloc_long, m.busy_long += w * f.busy_long;
    }
  }
  std::printf(
      "| configuration | JCT mean | JCT p50 | JCT p95 | wait mean | slowdown mean | allocation, "
      "backlog | busy, backlog | allocation, until a queue empties | busy, until a queue empties "
      "| high-priority slowdown mean (p95) | low-priority slowdown mean | low-priority JCT mean | "
      "share slowdown | preemptions |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
      "| ---: | ---: |\n");
  for (size_t i = 0; i < kRuns; ++i) {
    const Figures& f = mean[i];
    std::printf(
        "| %s | %.0f s | %.0f s | %.0f s | %.0f s | %.2fx | %.2f%% | %.2f%% | %.2f%% | %.2f%% | "
        "%.3fx (%.2fx) | %.3fx | %.0f s | %.3fx | %.0f |\n",
        kSetups[i].label, f.jct_mean, f.jct_p50, f.jct_p95, f.wait_mean, f.slow, 100 * f.alloc_long,
        100 * f.busy_long, 100 * f.alloc, 100 * f.busy, f.high_slow, f.high_slow_p95, f.low_slow,
        f.low_jct, f.share_slow, f.preemptions);
  }
  for (size_t i = 1; i < kRuns; ++i) {
    const Figures &a = mean[0], &x = mean[i];
    std::printf(
        "\n%s against (a): mean JCT %+.1f%%, p50 JCT %+.1f%%, p95 JCT %+.1f%%, GPU busy %+.2f "
        "points (%+.1f%%) in the backlog and %+.2f points (%+.1f%%) until a queue empties, "
        "allocation %+.2f and %+.2f points, high-priority slowdown %+.1f%%, low-priority JCT "
        "%+.1f%%",
        kSetups[i].label, 100 * (x.jct_mean / a.jct_mean - 1), 100 * (x.jct_p50 / a.jct_p50 - 1),
        100 * (x.jct_p95 / a.jct_p95 - 1), 100 * (x.busy_long - a.busy_long),
        100 * (x.busy_long / a.busy_long - 1), 100 * (x.busy - a.busy), 100 * (x.busy / a.busy - 1),
        100 * (x.alloc_long - a.alloc_long), 100 * (x.alloc - a.alloc),
        100 * (x.high_slow / a.high_slow - 1), 100 * (x.low_jct / a.low_jct - 1));
  }
  double window = 0, long_window = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    window += (until[size_t(seed)] - first) / seeds;
    long_window += (long_until[size_t(seed)] - first) / seeds;
  }
  std::printf(
      "\nwindows from the first arrival (means over the seeds): the backlog, until one of the "
      "three had fewer than %lld jobs waiting, %.0f s; until one of them had an empty queue, "
      "%.0f s\n",
      static_cast<long long>(backlog), long_window, window);
  if (!out.empty()) {
    // The plots show three times the contention window: the baseline's starved job would stretch
    // a common busy period to weeks, with the contention a sliver at its start.
    std::vector<sim::ReplayResult> shown = results[0];
    for (sim::ReplayResult& r : shown)
      sim::SetBusyPeriod(r, first, first + 3 * (until[0] - first), 200);
    std::filesystem::create_directories(out);
    Write(std::filesystem::path(out) / "replay_runs.csv", sim::ReplayRunsCsv(shown));
    Write(std::filesystem::path(out) / "replay_series.csv", sim::ReplaySeriesCsv(shown));
    for (const auto& [slug, svg] : sim::ReplayCharts(shown))
      Write(std::filesystem::path(out) / (slug + ".svg"), svg);
    Write(std::filesystem::path(out) / "report.html",
          sim::HtmlReport(
              fmt::format("GPU sharing experiment: openb default on {} nodes, arrivals compressed "
                          "{}x (seed 42)",
                          nodes->size(), compression),
              "(a) stock Kubernetes without sharing, (b) sharing with time slicing, (c) (b) with "
              "priorities, preemption and backfill with predictions. " +
                  Assumptions(),
              {}, shown));
  }
  return 0;
}
