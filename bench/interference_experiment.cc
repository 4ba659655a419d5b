// The interference-aware sharing experiment of docs/simulator.md. No public trace has per-job GPU
// utilization beside shares (openb has neither utilization nor run-time interference), so this
// replays a synthetic, seeded workload of GPU shares whose kinds are stated below, with the
// replay's interference model on (shares on one GPU busier than 100% together each run 100/total
// as fast) and utilization predicted only from jobs that finished earlier. Three configurations:
//   no ceiling  - today's packing: FGD puts shares on the fullest GPU that fits;
//   soft 70%    - the server's default: within the ceiling where possible, else the least busy GPU;
//   strict 70%  - wait rather than go over it.
// Usage: interference_experiment [--seeds N] [--nodes N]. Prints one markdown table per offered
// load (mean over the seeds).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "tessera/sched/policy.h"
#include "tessera/sim/replay.h"

using namespace tessera;

namespace {

// A kind of share: compute share (thousandths), how busy it keeps its GPU (percent, +-10 per
// job), its mean duration (each job 0.5x to 1.5x) and its part of the arrivals.
struct Kind {
  const char* name;
  int milli;
  int util;
  double duration_s;
  double weight;
};
const Kind kKinds[] = {
    {"notebook", 200, 15, 1800, 0.3},  // interactive: mostly idle
    {"infer", 300, 50, 600, 0.3},      // a model server under load
    {"finetune", 500, 80, 1200, 0.2},  // small training: keeps the GPU busy
    {"eval", 250, 65, 300, 0.2},       // batch evaluation
};

// `jobs` shares arriving as a Poisson stream whose GPU demand (utilization x duration) is `load`
// of `gpus` GPUs' time; three users per kind (history keys are owner and shape).
std::vector<sim::SimJob> Workload(int jobs, int gpus, double load, uint64_t seed) {
  std::mt19937_64 rng(seed);
  double weight_sum = 0, demand = 0;  // expected GPU-seconds of work per job
  for (const Kind& k : kKinds) weight_sum += k.weight;
  for (const Kind& k : kKinds) demand += k.weight / weight_sum * k.util / 100.0 * k.duration_s;
  const double rate = load * gpus / demand;  // arrivals per second
  std::exponential_distribution<double> gap(rate);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<sim::SimJob> out;
  double t = 0;
  for (int i = 0; i < jobs; ++i) {
    t += gap(rng);
    double pick = unit(rng) * weight_sum;
    const Kind* k = &kKinds[0];
    for (const Kind& c : kKinds) {
      k = &c;
      if ((pick -= c.weight) < 0) break;
    }
    sim::SimJob j;
    j.request.id = fmt::format("j{}", i);
    j.request.cpu_milli = 1000;
    j.request.memory_mib = 4096;
    j.request.gpu_milli = k->milli;
    j.request.owner = fmt::format("{}-{}", k->name, rng() % 3);
    j.submit = t;
    j.duration = k->duration_s * (0.5 + unit(rng));
    j.utilization = std::clamp(k->util + static_cast<int>(rng() % 21) - 10, 1, 100);
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<core::NodeSpec> Cluster(int nodes) {
  std::vector<core::NodeSpec> out;
  for (int n = 0; n < nodes; ++n) {
    core::NodeSpec s;
    s.name = fmt::format("node-{}", n);
    s.cpu_milli = 96000;
    s.memory_mib = 1 << 20;
    for (int g = 0; g < 8; ++g) s.gpus.push_back(core::NodeGpu{"A100", 81920, {8, 0}, 0, ""});
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int seeds = 5, nodes = 8, jobs = 3000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seeds" && i + 1 < argc) {
      seeds = std::atoi(argv[++i]);
    } else if (a == "--nodes" && i + 1 < argc) {
      nodes = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: interference_experiment [--seeds N] [--nodes N]\n");
      return 2;
    }
  }
  if (seeds < 1 || nodes < 1) {
    std::fprintf(stderr, "interference_experiment: --seeds and --nodes must be at least 1\n");
    return 2;
  }
  const std::vector<core::NodeSpec> cluster = Cluster(nodes);
  struct Config {
    const char* label;
    int ceiling;
    bool strict;
  };
  const Config configs[] = {
      {"no ceiling", 0, false}, {"soft 70%", 70, false}, {"strict 70%", 70, true}};
  for (double load : {0.4, 0.6, 0.8, 1.0}) {
    std::printf("\noffered load %.0f%% of %d GPUs' time, %d jobs, %d seeds\n\n", load * 100,
                nodes * 8, jobs, seeds);
    std::printf(
        "| configuration | JCT mean | JCT p95 | wait mean | share slowdown mean | slowdown max | "
        "allocation (busy mean) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const Config& c : configs) {
      double jct = 0, p95 = 0, wait = 0, slow = 0, slow_max = 0, alloc = 0;
      for (int s = 0; s < seeds; ++s) {
        sim::ReplayConfig rc;
        rc.label = c.label;
        rc.policies = sched::DefaultPolicies();
        rc.seed = 42 + s;
        rc.preemption = false;
        rc.predict = true;
        rc.interference = true;
        rc.utilization_ceiling_pct = c.ceiling;
        rc.utilization_ceiling_strict = c.strict;
        const sim::ReplayResult r =
            sim::RunReplay(cluster, Workload(jobs, nodes * 8, load, 1000 + s), {}, rc);
        jct += r.jct.mean / seeds;
        p95 += r.jct.p95 / seeds;
        wait += r.wait.mean / seeds;
        slow += r.share_slowdown_mean / seeds;
        slow_max = std::max(slow_max, r.share_slowdown_max);
        alloc += r.busy_mean_allocated / seeds;
      }
      std::printf("| %s | %.0f s | %.0f s | %.0f s | %.3fx | %.2fx | %.1f%% |\n", c.label, jct, p95,
                  wait, slow, slow_max, 100 * alloc);
    }
  }
  return 0;
}
