// What --tessera-mem=auto costs a Slurm step (issue 58): the plugin's step setup in slurmstepd with
// a size asked against the same step asking "auto" (its user's history read: kHistoryKept records,
// kHistorySized of them of its name), the history read alone, and the epilog that keeps a record
// (writes it and drops the oldest past kHistoryKept, adds it to the node's per-user totals), and
// reading those totals with one user and a thousand; and `tessera slurm eff`'s reading of what
// sacct says of a job of 1 and 64 nodes (its lines, a step per node, and the nodes' parts). Node
// files in a temporary folder, as root writes them on a node (run as root: the plugin's folders
// must be its own user's).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/slurm/eff.h"
#include "tessera/slurm/step.h"

namespace {

namespace fs = std::filesystem;
using tessera::slurm::PluginConfig;

struct Node {
  Node() {
    dir = fs::temp_directory_path() / ("slurm-history-bench-" + std::to_string(getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "lib.so") << "";
    config = *tessera::slurm::ParsePluginArgs({"library=" + (dir / "lib.so").string(),
                                               "shards_per_gpu=8", "gpu_memory=80GiB",
                                               "state_dir=" + (dir / "state").string()});
    // The user's history full: every tenth job of the name the step asks by.
    for (uint32_t id = 1; id <= tessera::slurm::kHistoryKept; ++id)
      Run(id, id % 10 ? "other" : "train", "4G");
  }
  ~Node() { fs::remove_all(dir); }
  // A job of `name` asking `mem` set up and ended (what its epilog keeps).
  void Run(uint32_t id, const std::string& name, const std::string& mem) {
    Setup(id, name, mem);
    (void)tessera::slurm::EndJob(config, id, 2000 + id);
  }
  bool Setup(uint32_t id, const std::string& name, const std::string& mem) {
    auto limits = tessera::slurm::DecideLimits(
        config, {.gpus = "0", .shards = "2", .mem_option = mem, .job_name = name});
    return limits.ok() &&
           tessera::slurm::SetUpStep(config, id, 1000, 1000, *limits, "", 1000 + id).ok();
  }
  fs::path dir;
  PluginConfig config;
  uint32_t next = 100000;
};

Node& TheNode() {
  static Node node;
  return node;
}

void Step(benchmark::State& state, const char* mem) {
  Node& n = TheNode();
  for (auto _ : state) {
    const uint32_t id = ++n.next;
    if (!n.Setup(id, "train", mem)) state.SkipWithError("SetUpStep failed");
    state.PauseTiming();
    (void)tessera::slurm::EndJob(n.config, id, 3000);
    state.ResumeTiming();
  }
}
void BM_StepSetUpSized(benchmark::State& state) { Step(state, "4G"); }
void BM_StepSetUpAuto(benchmark::State& state) { Step(state, "auto"); }
BENCHMARK(BM_StepSetUpSized)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StepSetUpAuto)->Unit(benchmark::kMicrosecond);

void BM_HistoryOf(benchmark::State& state) {
  Node& n = TheNode();
  for (auto _ : state) benchmark::DoNotOptimize(tessera::slurm::HistoryOf(n.config, 1000, "train"));
}
BENCHMARK(BM_HistoryOf)->Unit(benchmark::kMicrosecond);

void BM_EpilogKeepsARecord(benchmark::State& state) {
  Node& n = TheNode();
  for (auto _ : state) {
    state.PauseTiming();
    const uint32_t id = ++n.next;
    n.Setup(id, "train", "4G");
    state.ResumeTiming();
    if (!tessera::slurm::EndJob(n.config, id, 3000).ok()) state.SkipWithError("EndJob failed");
  }
}
BENCHMARK(BM_EpilogKeepsARecord)->Unit(benchmark::kMicrosecond);

// The node's per-user totals each epilog reads and writes again (totals.json), with state.range(0)
// users in it: what they add to the epilog above (whose node has one user).
void BM_ReadTotals(benchmark::State& state) {
  const fs::path dir =
      fs::temp_directory_path() / ("slurm-totals-bench-" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "totals.json");
    out << "{\"users\": {";
    for (int64_t u = 0; u < state.range(0); ++u) {
      out << (u ? "," : "") << "\"" << 1000 + u
          << "\": {\"jobs\": 812, \"whole_gpu_seconds\": 5123456.5, \"fractional_gpu_seconds\": "
             "912345.25, \"measured_gpu_seconds\": 912345.25, \"busy_gpu_seconds\": 401234.75, "
             "\"memory_refused_jobs\": 3}";
    }
    out << "}}\n";
  }
  for (auto _ : state) {
    const tessera::slurm::NodeTotals t = tessera::slurm::ReadTotals(dir.string());
    if (t.users.size() != static_cast<size_t>(state.range(0))) state.SkipWithError("not read");
    benchmark::DoNotOptimize(t);
  }
  fs::remove_all(dir);
}
BENCHMARK(BM_ReadTotals)->Arg(1)->Arg(1000)->Unit(benchmark::kMicrosecond);

// sacct's answer for a job on state.range(0) nodes, each with its part of the AdminComment and a
// step, read into the job's efficiency.
void BM_SlurmEff(benchmark::State& state) {
  const std::string d = tessera::slurm::kEffDelimiter;
  std::string comment = "site: checked";
  for (int64_t n = 0; n < state.range(0); ++n) {
    comment += " | tessera@node-" + std::to_string(n) +
               ": gpus 0,1 (50% share each): 60% busy, 1h2m3s of gpu time idle, peak 6.2 gib of 8 "
               "gib (78%), 2 allocations refused at its limit";
  }
  std::string text = "42" + d + "train" + d + "alice" + d + "COMPLETED" + d + "0:0" + d +
                     std::to_string(state.range(0)) + d + "64" + d + "7200" + d + "1-02:03:04" + d +
                     "256000M" + d + d + comment + d +
                     "billing=64,cpu=64,gres/shard=" + std::to_string(8 * state.range(0)) +
                     ",node=" + std::to_string(state.range(0)) + "\n";
  for (int64_t n = 0; n < state.range(0); ++n) {
    text += "42." + std::to_string(n) + d + "python" + d + d + "COMPLETED" + d + "0:0" + d + "1" +
            d + "64" + d + "7100" + d + "10:11:12" + d + d + std::to_string(1000000 + n) + "K" + d +
            d + "\n";
  }
  for (auto _ : state) {
    auto job = tessera::slurm::ParseSacctEff(text, "42");
    auto parts = job.ok() ? tessera::slurm::ParseAdminComment(job->admin_comment)
                          : absl::StatusOr<std::vector<tessera::slurm::NodePart>>(job.status());
    if (!parts.ok() || parts->size() != static_cast<size_t>(state.range(0))) {
      state.SkipWithError("not read");
      break;
    }
    benchmark::DoNotOptimize(tessera::slurm::EffOf(*job, *parts));
  }
}
BENCHMARK(BM_SlurmEff)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);

// sacct's answer for a period of state.range(0) jobs of 100 users (each on one node with its part,
// a batch step and a step), read, each job's efficiency, and summed per user: `tessera slurm eff
// --since 7d --by user` less sacct.
void BM_SlurmEffPeriod(benchmark::State& state) {
  const std::string d = tessera::slurm::kEffDelimiter;
  std::string text;
  for (int64_t j = 0; j < state.range(0); ++j) {
    const std::string id = std::to_string(1000 + j);
    text += id + d + "train" + d + "user" + std::to_string(j % 100) + d + "COMPLETED" + d + "0:0" +
            d + "1" + d + "8" + d + "3600" + d + "05:11:12" + d + "32000M" + d + d +
            "tessera@node-" + std::to_string(j % 64) +
            ": gpu 3 (25% share): 41% busy, 8m51s of gpu time idle, peak 3.1 gib of 4 gib (78%)" +
            d + "billing=8,cpu=8,gres/shard=2,mem=32000M,node=1\n";
    text += id + ".batch" + d + "batch" + d + d + "COMPLETED" + d + "0:0" + d + "1" + d + "8" + d +
            "3600" + d + "00:01.000" + d + d + "10240K" + d + d + "cpu=8,mem=32000M,node=1\n";
    text += id + ".0" + d + "python" + d + d + "COMPLETED" + d + "0:0" + d + "1" + d + "8" + d +
            "3598" + d + "05:11:11" + d + d + "20480000K" + d + d + "cpu=8,mem=32000M,node=1\n";
  }
  for (auto _ : state) {
    auto jobs = tessera::slurm::ParseSacctEffAll(text);
    if (!jobs.ok() || jobs->jobs.size() != static_cast<size_t>(state.range(0))) {
      state.SkipWithError("not read");
      break;
    }
    std::vector<nlohmann::ordered_json> effs;
    effs.reserve(jobs->jobs.size());
    for (const auto& job : jobs->jobs) {
      auto parts = tessera::slurm::ParseAdminComment(job.admin_comment);
      effs.push_back(tessera::slurm::EffOf(job, *parts));
    }
    benchmark::DoNotOptimize(tessera::slurm::EffByUser(effs));
  }
  state.counters["per_job_us"] = benchmark::Counter(
      static_cast<double>(state.range(0)),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(text.size()));
}
BENCHMARK(BM_SlurmEffPeriod)->Arg(1000)->Arg(100000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
