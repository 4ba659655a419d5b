// What the Slurm plugin's automatic trial (auto_trial=, issue 58) costs, in one run on a one-node
// Slurm started here as the Slurm tests start it (Debian's slurm-wlm, the plugin loaded, its
// requeue delay - AuthInfo cred_expire - at Slurm's minimum of 5 s):
//   - the question a batch step asking "auto" puts to slurmctld (slurm_load_job: how often the job
//     was requeued, whether it may be), against `srun -Q true` (p50, p99 of N);
//   - an "auto" batch job's wall time, sbatch to its end, of a name never measured (a trial of
//     2 s, requeued, run again sized) against the same job once its name is measured.
// Usage (root: Slurm's daemons and mknod): slurm_trial_bench [--runs N]
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" {
#include <slurm/slurm.h>
}

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
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

// sbatch `args` and wait for its end (COMPLETED or failed); its wall time in s, -1 when it did
// not end in 60 s.
double BatchWall(const MiniSlurm& slurm, const std::string& args) {
  const auto t0 = Clock::now();
  auto submit = tessera::test::Capture(slurm.Env() + "sbatch --parsable " + args + " 2>&1");
  if (submit.code != 0) return -1;
  const std::string job = submit.out.substr(0, submit.out.find_first_of(";\n"));
  while (Ms(t0) < 60000) {
    auto state = tessera::test::Capture(slurm.Env() + "scontrol show job -o " + job + " 2>&1");
    if (state.out.find("JobState=COMPLETED") != std::string::npos) return Ms(t0) / 1000;
    if (state.out.find("JobState=FAILED") != std::string::npos ||
        state.out.find("JobState=CANCELLED") != std::string::npos)
      return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 200;
  for (int i = 1; i < argc; i += 2) {
    if (std::string(argv[i]) == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[i + 1]);
    } else {
      fmt::print(stderr, "usage: slurm_trial_bench [--runs N]\n");
      return 2;
    }
  }
  if (const std::string why = MiniSlurm::Unavailable(); !why.empty()) {
    fmt::print(stderr, "slurm_trial_bench: {}\n", why);
    return 1;
  }
  const std::string dir = tessera::bench::SlurmFolder("slurm-trial-bench");
  if (dir.empty()) return 1;
  int code = 0;
  {
    fmt::print(stderr, "starting a one-node Slurm with the plugin under {}\n", dir);
    MiniSlurm slurm({.plugin = TESSERA_SPANK_PLUGIN,
                     .plugin_args = "library=" TESSERA_CUDA_LIBRARY
                                    " shards_per_gpu=8 gpu_memory=16GiB auto_trial=2s",
                     .cred_expire_s = 5});
    if (!slurm.error().empty()) {
      fmt::print(stderr, "slurm_trial_bench: Slurm did not start: {}\n", slurm.error());
      fs::remove_all(dir);
      return 1;
    }
    setenv("SLURM_CONF", (slurm.dir() + "/slurm.conf").c_str(), 1);
    slurm_init(nullptr);
    const std::string held =
        tessera::test::Capture(slurm.Env() + "sbatch --parsable --hold --wrap true").out;
    const uint32_t id = static_cast<uint32_t>(std::strtoul(held.c_str(), nullptr, 10));
    std::vector<double> ask, srun;
    for (int i = 0; i < runs; ++i) {
      const auto t0 = Clock::now();
      job_info_msg_t* info = nullptr;
      if (slurm_load_job(&info, id, SHOW_ALL) != 0) ++code;
      ask.push_back(Ms(t0) * 1000);
      slurm_free_job_info_msg(info);
    }
    for (int i = 0; i < std::max(5, runs / 10); ++i) {
      const auto t0 = Clock::now();
      if (tessera::test::Capture(slurm.Env() + "srun -Q true").code != 0) ++code;
      srun.push_back(Ms(t0));
    }
    (void)tessera::test::Capture(slurm.Env() + "scancel " + std::to_string(id));
    const auto [a50, a99] = P50P99(ask);
    const auto [s50, s99] = P50P99(srun);
    // A script that would hold until stopped on its first run (the trial), and ends at once when
    // run again; the measured job's ends at once.
    // (The fake driver's client: 100 MiB of GPU memory, what the trial measures.)
    const std::string client = "srun -Q " TESSERA_CUDA_CLIENT " link alloc:100";
    const std::string script =
        " --gres=shard:2 --tessera-mem=auto -o /dev/null --wrap 'if [ -z "
        "\"$SLURM_RESTART_COUNT\" ]; then " +
        client + " hold; else " + client + "; fi'";
    setenv("LD_LIBRARY_PATH", TESSERA_FAKE_CUDA_DIR, 1);  // passed on to the job
    const double tried = BatchWall(slurm, "-J never-measured" + script);
    const double sized = BatchWall(
        slurm,
        "-J never-measured --gres=shard:2 --tessera-mem=auto -o /dev/null --wrap '" + client + "'");
    fmt::print("| what | p50 | p99 | note |\n| --- | ---: | ---: | --- |\n");
    fmt::print(
        "| the plugin's question to slurmctld (`slurm_load_job`, {} runs) | {:.0f} us | {:.0f} "
        "us | {:.1f}% of `srun -Q true` |\n",
        ask.size(), a50, a99, 100 * a50 / 1000 / std::max(s50, 1e-9));
    fmt::print("| `srun -Q true` ({} runs) | {:.1f} ms | {:.1f} ms | |\n", srun.size(), s50, s99);
    fmt::print(
        "| an `auto` batch job of a name never measured, sbatch to its end | {:.1f} s | | "
        "a 2 s trial, Slurm's requeue delay (5 s + 1), the sized run |\n",
        tried);
    fmt::print("| the same job again, its name measured | {:.1f} s | | {:.1f}x less |\n", sized,
               sized > 0 ? tried / sized : 0);
    if (tried < 0 || sized < 0) code = 1;
  }
  fs::remove_all(dir);
  return code;
}
