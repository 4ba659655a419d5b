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
  SizingPolicy policy{.margin_pct = config.auto_size_margin_pct,
                      .trial_s = config.auto_size_trial_s};
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
  const bool unmeasured = (spec.gpu_share_auto && p.util_high_pct <= 0) ||
                          (spec.gpu_memory_auto && p.gpu_memory_peak_mib <= 0);
  const bool trial = unmeasured && policy.trial_s > 0 && spec.trial_s <= 0 && spec.array.empty();
  spec.sizing_trial_s = trial ? policy.trial_s : 0;
  if (compute_whole && memory_whole) {
    spec.gpu_milli = 0, spec.gpu_memory_mib = 0;
    spec.gpus = std::max(spec.gpus, 1);
    if (!trial) said.push_back("whole GPUs this time; its use is measured for the next");
  }
  if (trial) {
    said.push_back(fmt::format(
        "its first run is a trial of {} with that headroom, then it is re-queued sized from it",
        core::FormatDuration(policy.trial_s)));
  }
  spec.sizing = fmt::format("{}", fmt::join(said, "; "));
}

JobSpec ResizeAfterTrial(const JobSpec& spec, const sched::Prediction& history,
                         SizingPolicy policy) {
  JobSpec next = spec;
  next.sizing.clear();
  next.sizing_trial_s = 0;
  policy.trial_s = 0;
  SizeAutomatically(next, history, policy);
  return next;
}

std::string TrialSummary(const std::string& over, const TrialUse& use, const SizingPolicy& policy) {
  const std::optional<double> util_pct = use.util_pct;
  const int64_t peak_mib = use.peak_mib;
  std::vector<std::string> measured;
  if (util_pct) measured.push_back(fmt::format("GPU {:.0f}% busy", *util_pct));
  if (util_pct && use.held_back_pct && use.demand_pct) {
    measured.back() += fmt::format(
        " (its launches waited for the GPU {:.0f}% of its run: it would have used {:.0f}%)",
        *use.held_back_pct, *use.demand_pct);
  }
  if (peak_mib > 0) {
    measured.push_back(fmt::format("peak GPU memory {}MiB", peak_mib));
    if (use.refused > 0) {
      measured.back() +=
          fmt::format(" (its limit refused {} allocation{}: it asked for {}MiB at most)",
                      use.refused, use.refused == 1 ? "" : "s", use.wanted_mib);
    }
  }
  if (use.kernel_launches > 0 && use.run_s > 0) {
    const double n = static_cast<double>(use.kernel_launches);
    std::string mix =
        fmt::format("{} kernel launches ({:.0f}/s", use.kernel_launches, n / use.run_s);
    if (util_pct && *util_pct > 0) {
      const double us = *util_pct / 100 * use.run_s * 1e6 / n;
      mix += us >= 1000 ? fmt::format(", {:.1f} ms of GPU time each on average", us / 1000)
                        : fmt::format(", {:.0f} us of GPU time each on average", us);
    }
    measured.push_back(mix + ")");
  }
  if (measured.empty()) return over + "; nothing was measured (no GPU use seen)";
  JobSpec sized;
  sized.gpu_share_auto = sized.gpu_memory_auto = true;
  sched::Prediction p;
  p.util_high_pct = use.demand_pct.value_or(util_pct.value_or(0));
  p.util_high_basis = "the trial";
  p.gpu_memory_peak_mib =
      static_cast<double>(std::max(peak_mib, use.refused > 0 ? use.wanted_mib : int64_t{0}));
  p.memory_basis = "the trial";
  SizeAutomatically(sized, p, policy);
  std::string ask = sized.Share() ? "" : "--gpus 1";
  if (sized.gpu_milli > 0) ask = fmt::format("--gpu-share {:g}%", sized.gpu_milli / 10.0);
  if (sized.gpu_memory_mib > 0)
    ask += fmt::format("{}--gpu-mem {}MiB", ask.empty() ? "" : " ", sized.gpu_memory_mib);
  // Its memory is a part of a GPU but its compute is all of one: a share of memory alone, whose
  // kernels are not time-sliced - said, so that no one reads it as a small job.
  std::string whole_compute;
  if (sized.Share() && sized.gpu_milli == 0 && p.util_high_pct > 0) {
    whole_compute =
        fmt::format(" and no --gpu-share ({:.0f}% busy + {}% is all of a GPU's compute)",
                    p.util_high_pct, policy.margin_pct);
  }
  return fmt::format(
      "{}: {}; recommended: {} (with {}% margin){}, or --gpu-share auto --gpu-mem auto, which "
      "sizes "
      "from this trial",
      over, fmt::join(measured, ", "), ask, policy.margin_pct, whole_compute);
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

std::string OutgrewItsSize(const JobSpec& spec, const GpuMemoryUse& use, const SizingPolicy& policy,
                           int64_t* learn_mib) {
  *learn_mib = 0;
  const int64_t limit = spec.gpu_memory_mib;
  if (limit <= 0) return "";
  const bool refused = use.refused > 0 && use.wanted_mib > limit;
  if (!refused && (!spec.gpu_memory_auto || use.peak_mib <= 0 || use.peak_mib * 10 < limit * 9))
    return "";
  // What it needed at least: what it asked at most when refused, else past its size.
  const int64_t needed = refused ? use.wanted_mib : limit;
  const double next = WithMargin(static_cast<double>(needed), policy.margin_pct,
                                 static_cast<double>(policy.memory_step_mib));
  const bool whole =
      policy.gpu_memory_mib > 0 && next >= static_cast<double>(policy.gpu_memory_mib);
  const std::string ask =
      whole ? fmt::format("a whole GPU (--gpus 1{})", needed > policy.gpu_memory_mib
                                                          ? ", and less memory: it asked more than "
                                                            "one GPU has"
                                                          : "")
            : fmt::format("--gpu-mem {:.0f}MiB", next);
  if (spec.gpu_memory_auto) *learn_mib = std::max(needed, use.peak_mib);
  const std::string next_time = spec.gpu_memory_auto
                                    ? fmt::format(
                                          "the next run of its kind is sized past it (or "
                                          "ask {})",
                                          ask)
                                    : fmt::format("ask {} next time", ask);
  if (refused) {
    return fmt::format(
        "its GPU memory limit of {}MiB{} refused {} allocation{} (measured peak {}MiB; it asked "
        "for {}MiB at most): {}",
        limit, spec.gpu_memory_auto ? " (sized automatically)" : "", use.refused,
        use.refused == 1 ? "" : "s", use.peak_mib, use.wanted_mib, next_time);
  }
  return fmt::format(
      "it may have outgrown its automatic GPU memory: {}MiB, measured peak {}MiB; {}", limit,
      use.peak_mib, next_time);
}

std::string MemoryOutgrownAtEnd(const JobSpec& spec, bool failed, bool trial,
                                const GpuMemoryUse& use, const SizingPolicy& policy,
                                int64_t* learn_mib) {
  *learn_mib = 0;
  std::string said;
  if (failed || use.refused > 0) said = OutgrewItsSize(spec, use, policy, learn_mib);
  if (!trial) return said;
  if (use.refused > 0) *learn_mib = std::max({*learn_mib, use.wanted_mib, use.peak_mib});
  return "";
}

}  // namespace tessera::server
