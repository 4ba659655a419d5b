// libFuzzer target: what `tessera slurm eff` reads of sacct - its lines (the job's and its steps',
// kEffFields split by kEffDelimiter) and the AdminComment parts the nodes wrote there, which
// anyone with sacctmgr's rights (or a site's own tool) may have changed. Input: the first line a
// job id, the rest sacct's lines (a tab stands for the delimiter), read as one job's and as a
// period's (`tessera slurm eff --since`). Whatever they hold: no crash, a part's share and busy
// figures in range, a job's busy GPU time at most what it held, and each user's sums likewise
// with as many jobs as were read.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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
  auto busy_in_held = [](const nlohmann::ordered_json& e) {
    if (e.contains("gpu_busy_seconds") &&
        e["gpu_busy_seconds"].get<double>() > e["gpu_held_seconds"].get<double>() * (1 + 1e-9))
      __builtin_trap();
  };
  if (auto period = slurm::ParseSacctEffAll(lines); period.ok()) {
    std::vector<nlohmann::ordered_json> effs;
    for (const slurm::SacctEff& j : period->jobs) {
      auto parts = slurm::ParseAdminComment(j.admin_comment);
      effs.push_back(slurm::EffOf(j, parts.ok() ? *parts : std::vector<slurm::NodePart>()));
    }
    size_t jobs = 0;
    for (const auto& u : slurm::EffByUser(effs)) {
      busy_in_held(u);
      jobs += u["jobs"].get<size_t>();
    }
    if (jobs != effs.size()) __builtin_trap();
  }
  auto job = slurm::ParseSacctEff(lines, id);
  if (!job.ok()) return 0;
  if (job->elapsed_s < 0 || job->total_cpu_s < 0 || job->nodes < 0 || job->cpus < 0)
    __builtin_trap();
  auto parts = slurm::ParseAdminComment(job->admin_comment);
  if (!parts.ok()) return 0;
  check(*parts);
  const nlohmann::ordered_json e = slurm::EffOf(*job, *parts);
  busy_in_held(e);
  // As `-o json` writes it (EmitStructured): a job name or comment that is not UTF-8 is replaced,
  // never a throw (the strict default threw on the fuzzer's first minute).
  (void)e.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return 0;
}
