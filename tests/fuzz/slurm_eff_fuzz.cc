// libFuzzer target: what `tessera slurm eff` reads of sacct - its lines (the job's and its steps',
// kEffFields split by kEffDelimiter) and the AdminComment parts the nodes wrote there, which
// anyone with sacctmgr's rights (or a site's own tool) may have changed. Input: the first line a
// job id, the rest sacct's lines (a tab stands for the delimiter). Whatever they hold: no crash, a
// part's share and busy figures in range, and the job's busy GPU time at most what it held.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_replace.h"
#include "tessera/slurm/eff.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace slurm = tessera::slurm;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t nl = text.find('\n');
  const std::string id = text.substr(0, nl);
  const std::string lines =
      nl == std::string::npos
          ? std::string()
          : absl::StrReplaceAll(text.substr(nl + 1), {{"\t", slurm::kEffDelimiter}});
  auto check = [](const std::vector<slurm::NodePart>& parts) {
    for (const slurm::NodePart& p : parts) {
      if (p.share_percent < 0 || p.share_percent > 100) __builtin_trap();
      if (p.busy_percent && (*p.busy_percent < 0 || *p.busy_percent > 100)) __builtin_trap();
      if (p.idle_s && *p.idle_s < 0) __builtin_trap();
    }
  };
  if (auto parts = slurm::ParseAdminComment(text); parts.ok()) check(*parts);
  auto job = slurm::ParseSacctEff(lines, id);
  if (!job.ok()) return 0;
  if (job->elapsed_s < 0 || job->total_cpu_s < 0 || job->nodes < 0 || job->cpus < 0)
    __builtin_trap();
  auto parts = slurm::ParseAdminComment(job->admin_comment);
  if (!parts.ok()) return 0;
  check(*parts);
  const nlohmann::ordered_json e = slurm::EffOf(*job, *parts);
  if (e.contains("gpu_busy_seconds") &&
      e["gpu_busy_seconds"].get<double>() > e["gpu_held_seconds"].get<double>() * (1 + 1e-9))
    __builtin_trap();
  // As `-o json` writes it (EmitStructured): a job name or comment that is not UTF-8 is replaced,
  // never a throw (the strict default threw on the fuzzer's first minute).
  (void)e.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return 0;
}
