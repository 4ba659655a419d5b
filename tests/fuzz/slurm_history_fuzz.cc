// libFuzzer target: what the Slurm plugin reads in slurmstepd, where a crash takes a step (or an
// exception the whole step daemon) with it: its options as srun and sbatch pass them
// (--tessera-share, --tessera-mem, --tessera-trial), its plugstack.conf words, and the history
// records "auto" is sized from. Input: the first line a job name, the next three the options, the
// fourth plugstack.conf's words, the rest history records, one per line. Whatever they hold, a
// size is never past what the shards mean, and the counts are what was given.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tessera/slurm/step.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace slurm = tessera::slurm;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  lines.resize(std::max<size_t>(lines.size(), 5));
  const std::string& name = lines[0];
  (void)slurm::CheckStepOptions(lines[1], lines[2], lines[3]);
  std::vector<std::string> words = absl::StrSplit(lines[4], ' ', absl::SkipEmpty());
  words.push_back("library=/usr/lib/tessera/libtessera-cuda.so");
  auto config = slurm::ParsePluginArgs(words);
  // auto_trial= is a length of at most a day, or none.
  if (config.ok() && (config->auto_trial_s < 0 || config->auto_trial_s > slurm::kMaxTrialSeconds))
    __builtin_trap();
  if (!config.ok())
    config = slurm::ParsePluginArgs({"library=/l.so", "shards_per_gpu=8", "gpu_memory=16GiB"});
  const std::vector<std::string> records(lines.begin() + 5, lines.end());
  const slurm::KindUse use = slurm::KindUseOf(records, name);
  if (use.memory_runs < 0 || static_cast<size_t>(use.memory_runs) > records.size() ||
      use.util_runs < 0 || static_cast<size_t>(use.util_runs) > records.size())
    __builtin_trap();
  if (use.util_pct < 0 || use.util_pct > 100) __builtin_trap();
  auto limits = slurm::DecideLimits(*config, {.gpus = "0",
                                              .shards = "2",
                                              .share_option = lines[1],
                                              .mem_option = lines[2],
                                              .trial_option = lines[3],
                                              .job_name = name});
  if (!limits.ok()) return 0;
  const slurm::StepLimits asked = *limits;
  (void)slurm::SizeAuto(*config, use, *limits);
  // "auto" never gives more than the shards mean.
  if (asked.memory_auto && asked.memory_bytes > 0 && limits->memory_bytes > asked.memory_bytes)
    __builtin_trap();
  if (asked.share_auto && limits->share_permille > asked.share_permille) __builtin_trap();
  return 0;
}
