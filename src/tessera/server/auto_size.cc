#include "tessera/server/auto_size.h"

#include <algorithm>
#include <cmath>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tessera/server/server.h"

namespace tessera::server {
namespace {

double WithMargin(double value, int margin_pct, double step) {
  return core::SizeFromUse(value, margin_pct / 100.0, step);
}

}  // namespace

SizingPolicy SizingPolicyOf(const ServerConfig& config, const core::NodeInventory* inventory,
                            const std::vector<std::string>& models) {
  SizingPolicy policy{.margin_pct = config.auto_size_margin_pct};
  if (inventory == nullptr) return policy;
  for (const core::Gpu& g : inventory->gpus) {
    if (!g.memory_bytes || (!models.empty() && std::ranges::find(models, g.model) == models.end()))
      continue;
    const auto mib = static_cast<int64_t>(*g.memory_bytes >> 20);
    if (policy.gpu_memory_mib == 0 || mib < policy.gpu_memory_mib) policy.gpu_memory_mib = mib;
  }
  return policy;
}

void SizeAutomatically(JobSpec& spec, const sched::Prediction& p, const SizingPolicy& policy) {
  if (!spec.Auto()) return;
  std::vector<std::string> said;
  bool whole_compute = false, whole_memory = false;
  if (spec.gpu_share_auto) {
    spec.gpu_milli = 0;
    const double pct = p.util_high_pct > 0
                           ? WithMargin(p.util_high_pct, policy.margin_pct, policy.share_step_pct)
                           : 0;
    if (p.util_high_pct <= 0) {
      whole_compute = true;
      said.push_back("gpu_share: no measured runs of its kind yet, the whole GPU's compute");
    } else if (pct >= 100) {
      whole_compute = true;
      said.push_back(fmt::format("gpu_share: {:.0f}% busy ({}) + {}% is a whole GPU",
                                 p.util_high_pct, p.util_high_basis, policy.margin_pct));
    } else {
      spec.gpu_milli = static_cast<int>(std::lround(std::max(pct, 2.0) * 10));
      said.push_back(fmt::format("gpu_share {:g}%: {:.0f}% busy ({}) + {}%", spec.gpu_milli / 10.0,
                                 p.util_high_pct, p.util_high_basis, policy.margin_pct));
    }
  }
  if (spec.gpu_memory_auto) {
    spec.gpu_memory_mib = 0;
    const double mib = p.gpu_memory_peak_mib > 0
                           ? WithMargin(p.gpu_memory_peak_mib, policy.margin_pct,
                                        static_cast<double>(policy.memory_step_mib))
                           : 0;
    if (p.gpu_memory_peak_mib <= 0) {
      whole_memory = true;
      said.push_back("gpu_memory: no measured runs of its kind yet, not limited");
    } else if (policy.gpu_memory_mib > 0 && mib >= static_cast<double>(policy.gpu_memory_mib)) {
      whole_memory = true;
      said.push_back(fmt::format("gpu_memory: a peak of {:.0f}MiB ({}) + {}% is a whole GPU's",
                                 p.gpu_memory_peak_mib, p.memory_basis, policy.margin_pct));
    } else {
      spec.gpu_memory_mib = static_cast<int64_t>(mib);
      said.push_back(fmt::format("gpu_memory {}MiB: a peak of {:.0f}MiB ({}) + {}%",
                                 spec.gpu_memory_mib, p.gpu_memory_peak_mib, p.memory_basis,
                                 policy.margin_pct));
    }
  }
  // What was not auto stays as asked; a part that is whole leaves the other's limit alone. Both
  // whole (or the rest unasked): whole GPUs.
  const bool compute_whole = spec.gpu_share_auto ? whole_compute : spec.gpu_milli == 0;
  const bool memory_whole = spec.gpu_memory_auto ? whole_memory : spec.gpu_memory_mib == 0;
  if (compute_whole && memory_whole) {
    spec.gpu_milli = 0, spec.gpu_memory_mib = 0;
    spec.gpus = std::max(spec.gpus, 1);
    said.push_back("whole GPUs this time; its use is measured for the next");
  }
  spec.sizing = fmt::format("{}", fmt::join(said, "; "));
}

std::string TrialSummary(const std::string& over, std::optional<double> util_pct, int64_t peak_mib,
                         const SizingPolicy& policy) {
  std::vector<std::string> measured;
  if (util_pct) measured.push_back(fmt::format("GPU {:.0f}% busy", *util_pct));
  if (peak_mib > 0) measured.push_back(fmt::format("peak GPU memory {}MiB", peak_mib));
  if (measured.empty()) return over + "; nothing was measured (no GPU use seen)";
  JobSpec sized;
  sized.gpu_share_auto = sized.gpu_memory_auto = true;
  sched::Prediction p;
  p.util_high_pct = util_pct.value_or(0), p.util_high_basis = "the trial";
  p.gpu_memory_peak_mib = static_cast<double>(peak_mib), p.memory_basis = "the trial";
  SizeAutomatically(sized, p, policy);
  std::string ask = sized.Share() ? "" : "--gpus 1";
  if (sized.gpu_milli > 0) ask = fmt::format("--gpu-share {:g}%", sized.gpu_milli / 10.0);
  if (sized.gpu_memory_mib > 0)
    ask += fmt::format("{}--gpu-mem {}MiB", ask.empty() ? "" : " ", sized.gpu_memory_mib);
  return fmt::format(
      "{}: {}; recommended: {} (with {}% margin), or --gpu-share auto --gpu-mem auto, which sizes "
      "from this trial",
      over, fmt::join(measured, ", "), ask, policy.margin_pct);
}

std::vector<sched::RunKind> TrialKinds(const JobSpec& spec, const std::string& user) {
  std::vector<sched::RunKind> kinds = {RunKindOf(spec, user)};
  JobSpec as_auto = spec;
  as_auto.gpu_share_auto = as_auto.gpu_memory_auto = true;
  as_auto.gpus = spec.Share() ? spec.gpus : (spec.gpus > 1 ? spec.gpus : 0);
  sched::RunKind k = RunKindOf(as_auto, user);
  if (k.shape != kinds[0].shape) kinds.push_back(std::move(k));
  return kinds;
}

std::string OutgrewItsSize(const JobSpec& spec, int64_t peak_mib, const SizingPolicy& policy) {
  if (!spec.gpu_memory_auto || spec.gpu_memory_mib <= 0 || peak_mib <= 0) return "";
  if (peak_mib * 10 < spec.gpu_memory_mib * 9) return "";
  const double next = WithMargin(static_cast<double>(spec.gpu_memory_mib), policy.margin_pct,
                                 static_cast<double>(policy.memory_step_mib));
  return fmt::format(
      "it may have outgrown its automatic GPU memory: {}MiB, measured peak {}MiB; the next run of "
      "its kind is sized past it (or ask --gpu-mem {:.0f}MiB)",
      spec.gpu_memory_mib, peak_mib, next);
}

}  // namespace tessera::server
