// What the Slurm plugin's AdminComment write (admin_comment=, issue 58) costs a node, in one run on
// a one-node Slurm with its accounting database (slurmctld, slurmdbd and MariaDB started here as
// the Slurm tests start them, the plugin loaded):
//   - the write itself, as each epilog logs it ("AdminComment (written in N ms)": slurm_update_job,
//     refused for a job that has ended, then sacct and sacctmgr on its accounting record), p50/p99;
//   - back-to-back jobs that each take both GPUs of the node (`srun --gres=gpu:2 true`): the next
//     one starts only once the last one's epilog is done, so a job's whole cycle is what the
//     node's GPUs are held per job, with the write and without it (admin_comment=no), in
//     alternating rounds; with --baseline, also with another build of the plugin (an earlier
//     commit's tessera-spank.so) writing it;
//   - then, over the jobs those rounds ran (each with its part and its step), `tessera slurm eff`
//     for the period (one line per job, and --by user) against sacct's own answer to the same
//     question, alternating, 10 calls each: what reading and summing the jobs adds to sacct.
// Usage (root: Slurm's daemons, MariaDB, mknod):
//   slurm_epilog_bench [--jobs N] [--rounds R] [--baseline PLUGIN.so]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../tests/capture.h"
#include "../tests/slurm/mini_slurm.h"
#include "fmt/format.h"
#include "slurm_bench.h"

namespace {

namespace fs = std::filesystem;
using tessera::bench::Clock;
using tessera::bench::Ms;
using tessera::bench::P50P99;
using tessera::slurm_test::MiniSlurm;

// `jobs` back-to-back jobs holding both GPUs; the mean cycle in ms, -1 when one failed.
double Cycle(const MiniSlurm& slurm, int jobs) {
  const auto t0 = Clock::now();
  for (int i = 0; i < jobs; ++i) {
    auto run = tessera::test::Capture(slurm.Env() + "srun -Q -t 5 --gres=gpu:2 true 2>&1");
    if (run.code != 0) {
      fmt::print(stderr, "slurm_epilog_bench: srun failed: {}\n", run.out);
      return -1;
    }
  }
  const double cycle = Ms(t0) / jobs;
  // Its last job's epilog done (squeue lists a completing job) before plugstack.conf changes: an
  // epilog reads it when it starts, after srun has returned.
  while (!tessera::test::Capture(slurm.Env() + "squeue -h -o %i").out.empty() && Ms(t0) < 60000)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return cycle;
}

}  // namespace

int main(int argc, char** argv) {
  int jobs = 20, rounds = 3;
  std::string baseline;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if ((a == "--jobs" || a == "--rounds") && i + 1 < argc) {
      (a == "--jobs" ? jobs : rounds) = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--baseline" && i + 1 < argc && fs::exists(argv[i + 1])) {
      baseline = fs::absolute(argv[i + 1]).string();
    } else {
      fmt::print(stderr,
                 "usage: slurm_epilog_bench [--jobs N] [--rounds R] [--baseline PLUGIN.so]\n");
      return 2;
    }
  }
  if (const std::string why = MiniSlurm::Unavailable(true); !why.empty()) {
    fmt::print(stderr, "slurm_epilog_bench: {}\n", why);
    return 1;
  }
  const std::string dir = tessera::bench::SlurmFolder("slurm-epilog-bench");
  if (dir.empty()) return 1;
  int code = 0;
  {
    fmt::print(stderr, "starting a one-node Slurm with slurmdbd and the plugin under {}\n", dir);
    const std::string args =
        "library=" TESSERA_CUDA_LIBRARY " shards_per_gpu=8 gpu_memory=16GiB admin_comment=";
    MiniSlurm slurm(
        {.plugin = TESSERA_SPANK_PLUGIN, .plugin_args = args + "yes", .accounting = true});
    if (!slurm.error().empty()) {
      fmt::print(stderr, "slurm_epilog_bench: Slurm did not start: {}\n", slurm.error());
      fs::remove_all(dir);
      return 1;
    }
    (void)Cycle(slurm, 2);  // warm: the first jobs' database rows, the daemons' caches
    // A job's cycle: written by this build, by the baseline's, not written.
    std::vector<double> with, base, without;
    for (int r = 0; r < rounds && code == 0; ++r) {
      for (int mode = 0; mode < 3; ++mode) {
        if (mode == 1 && baseline.empty()) continue;
        slurm.SetPluginArgs(args + (mode == 2 ? "no" : "yes"), mode == 1 ? baseline : "");
        const double c = Cycle(slurm, jobs);
        if (c < 0) code = 1;
        (mode == 0 ? with : mode == 1 ? base : without).push_back(c);
        fmt::print(stderr, "round {}: {}: {:.0f} ms a job\n", r + 1,
                   mode == 0   ? "written"
                   : mode == 1 ? "written by the baseline"
                               : "not written",
                   c);
      }
    }
    // Each write as its epilog logged it.
    std::ifstream log(slurm.dir() + "/log/slurmd.log");
    std::stringstream text;
    text << log.rdbuf();
    const std::string all = text.str();
    static const std::regex kWritten("AdminComment \\(slurmdbd, written in ([0-9]+) ms\\)");
    std::vector<double> writes;
    for (auto it = std::sregex_iterator(all.begin(), all.end(), kWritten);
         it != std::sregex_iterator(); ++it)
      writes.push_back(std::stod((*it)[1]));
    size_t failed = 0;
    for (size_t at = all.find("AdminComment was not written"); at != std::string::npos;
         at = all.find("AdminComment was not written", at + 1)) {
      ++failed;
      const size_t line = all.rfind('\n', at) + 1;
      fmt::print(stderr, "{}\n", all.substr(line, all.find('\n', at) - line));
    }
    const auto [w50, w99] = P50P99(writes);
    fmt::print("| what | figure | note |\n| --- | ---: | --- |\n");
    fmt::print(
        "| the epilog's AdminComment write, p50 / p99 ({} writes, {} failed) | {:.0f} / "
        "{:.0f} ms | |\n",
        writes.size(), failed, w50, w99);
    for (size_t r = 0; r < with.size() && r < without.size(); ++r) {
      fmt::print(
          "| round {}: a job's cycle, `srun --gres=gpu:2 true` back to back ({} jobs), "
          "written / not | {:.0f} / {:.0f} ms | {:.2f}x |\n",
          r + 1, jobs, with[r], without[r], with[r] / std::max(without[r], 1e-9));
      if (r < base.size())
        fmt::print(
            "| round {}: the same, written by the baseline | {:.0f} ms | {:.2f}x of not "
            "written; this build {:.2f}x of it |\n",
            r + 1, base[r], base[r] / std::max(without[r], 1e-9),
            with[r] / std::max(base[r], 1e-9));
    }
    if (failed > 0 || writes.empty()) code = 1;
    // The period's jobs, as sacct gives them and as `tessera slurm eff` reads them.
    const std::vector<std::pair<std::string, std::string>> calls = {
        {"sacct alone (the same selection, -S now-1hours -E now -s <ended> -a)",
         "sacct -P -n --noconvert -o JobID,JobName,User,State,ExitCode,NNodes,AllocCPUS,"
         "ElapsedRaw,TotalCPU,ReqMem,MaxRSS,AdminComment,AllocTRES -S now-1hours -E now -s "
         "CD,F,CA,TO,OOM,NF,PR,DL -a"},
        {"`tessera slurm eff --since 1h -a`",
         std::string(TESSERA_BINARY) + " slurm eff --since 1h -a"},
        {"`tessera slurm eff --since 1h -a --by user`",
         std::string(TESSERA_BINARY) + " slurm eff --since 1h -a --by user"}};
    std::vector<std::vector<double>> took(calls.size());
    size_t listed = 0;
    for (int i = 0; i < 10 && code == 0; ++i) {
      for (size_t c = 0; c < calls.size(); ++c) {
        const auto t0 = Clock::now();
        auto run = tessera::test::Capture(slurm.Env() + calls[c].second + " 2>&1");
        took[c].push_back(Ms(t0));
        if (run.code != 0) {
          fmt::print(stderr, "slurm_epilog_bench: {} failed: {}\n", calls[c].second, run.out);
          code = 1;
        }
        if (c == 0) listed = static_cast<size_t>(std::count(run.out.begin(), run.out.end(), '\n'));
      }
    }
    const double sacct = P50P99(took[0]).first;
    for (size_t c = 0; c < calls.size() && code == 0; ++c) {
      const double p50 = P50P99(took[c]).first;
      fmt::print("| {} ({} lines of jobs and steps), p50 of 10 | {:.0f} ms | {:.2f}x |\n",
                 calls[c].first, listed, p50, p50 / std::max(sacct, 1e-9));
    }
  }
  fs::remove_all(dir);
  return code;
}
