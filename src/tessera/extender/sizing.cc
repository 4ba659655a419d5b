// Pods that ask for what they use (issue 58): an ended pod's measured use (tessera.io/gpu-use,
// written by its node's agent) joins the history of its kind; a pod asking
// tessera.io/gpu-memory "auto" is sized from that history as it is first seen; a trial pod's end
// says what it used and what to ask.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/extender/extender.h"
#include "tessera/kube/object.h"

namespace tessera::extender {
namespace {

using kube::StringAt;
using nlohmann::json;

constexpr double kMemoryStepMib = 256;

std::string PodIdOf(const json& pod) {
  std::string ns = StringAt(pod, {"metadata", "namespace"});
  return (ns.empty() ? "default" : ns) + "/" + StringAt(pod, {"metadata", "name"});
}

}  // namespace

namespace {

// What a pod would have used of one GPU, in percent (kube::GpuUse::WantedPermille): a share held
// back by its time slices is measured at most at what it was given.
std::optional<double> WantedPct(const kube::GpuUse& use) {
  const std::optional<int64_t> w = use.WantedPermille();
  return w ? std::optional<double>(static_cast<double>(*w) / 10) : std::nullopt;
}

// What a trial of `trial_s` on `gpus` GPUs measured, in words (TrialAdvice's first part); `any`
// says whether anything was.
std::string TrialMeasured(double trial_s, int gpus, const kube::GpuUse& use, bool* any) {
  std::vector<std::string> measured;
  if (use.busy_permille) {
    measured.push_back(fmt::format("its GPU{} {:g}% busy", gpus > 1 ? "s" : "",
                                   static_cast<double>(*use.busy_permille) / 10));
    if (use.held_back_permille && *use.held_back_permille > 0) {
      measured.back() += fmt::format(
          " (its launches waited for the GPU {:g}% of the time: it would have used {:g}%)",
          static_cast<double>(*use.held_back_permille) / 10, *WantedPct(use));
    }
  }
  if (use.peak_mib && *use.peak_mib > 0)
    measured.push_back(fmt::format("peak GPU memory {}MiB", *use.peak_mib));
  // Its kernel mix, as the server's trial says it: many short kernels pay the most for time
  // slices' switches (and gain the most from MPS).
  if (use.kernel_launches && *use.kernel_launches > 0 && use.seconds > 0) {
    const auto n = static_cast<double>(*use.kernel_launches);
    const auto run_s = static_cast<double>(use.seconds);
    std::string mix = fmt::format("{} kernel launches ({:.0f}/s", *use.kernel_launches, n / run_s);
    if (use.busy_permille && *use.busy_permille > 0) {
      const double us = static_cast<double>(*use.busy_permille) / 1000 * run_s * 1e6 / n;
      mix += us >= 1000 ? fmt::format(", {:.1f} ms of GPU time each on average", us / 1000)
                        : fmt::format(", {:.0f} us of GPU time each on average", us);
    }
    measured.push_back(mix + ")");
  }
  std::string said =
      fmt::format("its trial of {} ended after {} s", core::FormatDuration(trial_s), use.seconds);
  *any = !measured.empty();
  if (measured.empty()) return said + "; nothing was measured (no GPU use seen)";
  return said + ": " + absl::StrJoin(measured, ", ");
}

}  // namespace

std::string TrialAdvice(const PodDemand& d, const kube::GpuUse& use, int shares_per_gpu,
                        int margin_pct) {
  const double margin = margin_pct / 100.0;
  bool any = false;
  const std::string said = TrialMeasured(d.trial_s, d.request.gpu_count(), use, &any);
  if (!any) return said;
  // What to ask: shares of one GPU where one GPU held it, from its busy share and peak memory.
  if (d.request.gpu_count() > 1 || shares_per_gpu <= 0) return said;
  std::string ask;
  if (use.busy_permille) {
    const double pct = *WantedPct(use);
    const int count = std::max(
        1,
        static_cast<int>(
            core::SizeFromUse(pct, margin, 100.0 / shares_per_gpu) * shares_per_gpu / 100 + 0.5));
    ask = count >= shares_per_gpu
              ? "tessera.io/gpu: 1"
              : fmt::format("tessera.io/gpu-share: {} (of {} per GPU)", count, shares_per_gpu);
  }
  if (use.peak_mib && *use.peak_mib > 0 && ask != "tessera.io/gpu: 1") {
    const auto mib = static_cast<int64_t>(
        core::SizeFromUse(static_cast<double>(*use.peak_mib), margin, kMemoryStepMib));
    ask += fmt::format("{}tessera.io/gpu-memory: {}Mi", ask.empty() ? "" : " with ", mib);
  }
  if (ask.empty()) return said;
  return fmt::format("{}; recommended: {} (with {}% margin){}", said, ask, margin_pct,
                     ask == "tessera.io/gpu: 1"
                         ? ""
                         : ", or tessera.io/gpu-share and tessera.io/gpu-memory: auto, which "
                           "size from this trial");
}

std::string DraTrialAdvice(double trial_s, const kube::GpuUse& use, int margin_pct) {
  bool any = false;
  const std::string said = TrialMeasured(trial_s, 1, use, &any);
  if (!any) return said;
  std::vector<std::string> ask;
  if (use.busy_permille) {
    ask.push_back(fmt::format("shares for {:.0f}% of a GPU",
                              core::SizeFromUse(*WantedPct(use), margin_pct / 100.0, 1)));
  }
  if (use.peak_mib && *use.peak_mib > 0) {
    ask.push_back(
        fmt::format("a ShareConfig memory of {}Mi",
                    static_cast<int64_t>(core::SizeFromUse(static_cast<double>(*use.peak_mib),
                                                           margin_pct / 100.0, kMemoryStepMib))));
  }
  if (ask.empty()) return said;
  return fmt::format(
      "{}; recommended: {} (with {}% margin), or tessera.io/gpu-share and tessera.io/gpu-memory: "
      "auto on its ResourceClaimTemplate, which size its claims from this trial",
      said, absl::StrJoin(ask, " and "), margin_pct);
}

void Extender::SizeAuto(PodDemand& d) const {
  if (!d.memory_auto) return;
  const sched::Prediction p = engine_->history().Predict(UseKind(d.kind));
  d.request.gpu_memory_mib = 0;
  if (p.gpu_memory_peak_mib <= 0) {
    d.sizing =
        "gpu-memory: no measured runs of its kind yet, its shares' part of its GPU's memory; its "
        "use is measured for the next";
    return;
  }
  d.request.gpu_memory_mib = static_cast<int64_t>(core::SizeFromUse(
      p.gpu_memory_peak_mib, options_.auto_size_margin_pct / 100.0, kMemoryStepMib));
  d.sizing =
      fmt::format("gpu-memory {}Mi: a peak of {:.0f}MiB ({}) + {}%", d.request.gpu_memory_mib,
                  p.gpu_memory_peak_mib, p.memory_basis, options_.auto_size_margin_pct);
}

absl::StatusOr<ShareSize> Extender::SizeShare(const json& pod, size_t container, int asked) {
  core::MutexLock lock(mu_);
  const int n = SharesPerGpu();
  if (n <= 1) {
    return absl::UnavailableError(
        "no node serves tessera.io/gpu-share yet (the extender has seen no node whose agent says "
        "how many shares a GPU has): an auto share cannot be sized now; create the pod again "
        "later");
  }
  // Its kind as the pod will have it, whatever it gets: a share of any size (its shape says
  // "auto" in place of it). At admission a pod may have no name yet (generateName).
  json p = pod;
  json& meta = p["metadata"];
  if (!meta.is_object()) return absl::InvalidArgumentError("pod: metadata: expected an object");
  if (StringAt(p, {"metadata", "name"}).empty())
    meta["name"] = StringAt(p, {"metadata", "generateName"}) + "0";
  if (meta.contains("annotations") && meta["annotations"].is_object())
    meta["annotations"].erase(kGpuShareAnnotation);
  json& resources = p["spec"]["containers"][container]["resources"];
  if (!resources.is_object()) resources = json::object();
  for (const char* part : {"limits", "requests"}) {
    if (resources.contains(part) && resources[part].is_object()) {
      resources[part].erase("tessera.io/gpu");
      resources[part].erase("tessera.io/gpu-share");
    }
  }
  resources["limits"]["tessera.io/gpu-share"] = "1";
  auto d = PodDemandOf(p, n);
  if (!d.ok()) return d.status();
  sched::RunKind kind = UseKind(d->kind);
  kind.shape = PodShape(d->request, /*share_auto=*/true, d->memory_auto, d->request.gpu_memory_mib);
  const int ceiling = asked > 0 ? std::min(asked, n) : n;
  const int margin = options_.auto_size_margin_pct;
  const sched::Prediction pr = engine_->history().Predict(kind);
  ShareSize out;
  std::string why;
  if (pr.util_high_pct <= 0) {
    out.count = ceiling;
    why = asked > 0 ? "no measured runs of its kind yet, the count its container asks"
                    : "no measured runs of its kind yet";  // then a whole GPU, said below
  } else {
    const double pct = core::SizeFromUse(pr.util_high_pct, margin / 100.0, 100.0 / n);
    out.count = std::max(1, static_cast<int>(std::lround(pct * n / 100)));
    why = fmt::format("{:.0f}% busy ({}) + {}%", pr.util_high_pct, pr.util_high_basis, margin);
    if (out.count > ceiling) {
      out.count = ceiling;
      if (ceiling < n) why += fmt::format(", held to the {} its container asks", ceiling);
    }
  }
  out.whole_gpu = out.count >= n;
  out.sizing = out.whole_gpu ? fmt::format("gpu-share: {}, a whole GPU (tessera.io/gpu: 1)", why)
                             : fmt::format("gpu-share {} (of {} per GPU): {}", out.count, n, why);
  if (pr.util_high_pct <= 0) out.sizing += "; its use is measured for the next";
  return out;
}

absl::StatusOr<ClaimSize> Extender::SizeClaim(const json& pod, const ClaimAsk& ask,
                                              int shares_per_gpu) {
  core::MutexLock lock(mu_);
  sched::RunKind kind = UseKind(PodKindOf(pod));
  kind.shape = kDraShareShape;
  const sched::Prediction pr = engine_->history().Predict(kind);
  const int margin = options_.auto_size_margin_pct;
  ClaimSize out{.count = ask.count};
  std::vector<std::string> said;
  if (ask.share_auto) {
    if (shares_per_gpu <= 0) {
      return absl::UnavailableError(
          "no node publishes gpu-share.tessera.io devices yet (the extender has seen no "
          "ResourceSlice of them): an auto count cannot be sized now; create the claim again "
          "later");
    }
    if (pr.util_high_pct <= 0) {
      said.push_back(
          fmt::format("count {}: no measured runs of its kind yet, the count it asks", ask.count));
    } else {
      const int n = shares_per_gpu;
      const double pct = core::SizeFromUse(pr.util_high_pct, margin / 100.0, 100.0 / n);
      out.count = std::max(1, static_cast<int>(std::lround(pct * n / 100)));
      std::string why = fmt::format("count {} (of {} per GPU): {:.0f}% busy ({}) + {}%",
                                    std::min(out.count, ask.count), n, pr.util_high_pct,
                                    pr.util_high_basis, margin);
      if (out.count > ask.count) {
        out.count = ask.count;
        why += fmt::format(", held to the {} it asks", ask.count);
      }
      said.push_back(std::move(why));
    }
  }
  if (ask.memory_auto) {
    if (pr.gpu_memory_peak_mib <= 0) {
      said.push_back(
          "memory: no measured runs of its kind yet, its shares' part of its GPU's memory");
    } else {
      out.memory_mib = static_cast<int64_t>(
          core::SizeFromUse(pr.gpu_memory_peak_mib, margin / 100.0, kMemoryStepMib));
      said.push_back(fmt::format("memory {}Mi: a peak of {:.0f}MiB ({}) + {}%", out.memory_mib,
                                 pr.gpu_memory_peak_mib, pr.memory_basis, margin));
    }
  }
  out.sizing = absl::StrJoin(said, "; ");
  if ((ask.share_auto && pr.util_high_pct <= 0) || (ask.memory_auto && pr.gpu_memory_peak_mib <= 0))
    out.sizing += "; its use is measured for the next";
  return out;
}

void Extender::LearnUse(const json& pod) {
  const std::string uid = StringAt(pod, {"metadata", "uid"});
  const std::string text = StringAt(pod, {"metadata", "annotations", kube::kGpuUseAnnotation});
  if (text.empty() || uid.empty() || learned_.contains(uid)) return;
  const std::string id = PodIdOf(pod);
  auto use = kube::ParseGpuUse(text);
  if (!use.ok()) {
    learned_.insert(uid);
    spdlog::warn("extender: pod {}: {}; not learned from", id, std::string(use.status().message()));
    return;
  }
  if (!HasTesseraResources(pod) && AsksDraClaims(pod)) {
    // Its DRA claims' use (their agents write it on the pods they were reserved for): the kind
    // of its pod's claims, whatever count and memory they got.
    learned_.insert(uid);
    sched::RunKind kind = UseKind(PodKindOf(pod));
    kind.shape = kDraShareShape;
    int64_t learn_mib = use->peak_mib.value_or(0);
    if (use->refused.value_or(0) > 0) learn_mib = std::max(learn_mib, use->wanted_mib.value_or(0));
    Learn(uid, {kind}, WantedPct(*use), static_cast<double>(learn_mib));
    spdlog::info("extender: pod {} ended; its kind's DRA claims ({}) learn {}", id,
                 kind.name.empty() ? kind.user : kind.name, text);
    // A trial (its deadline set as it was created, admission.h): what it measured, what to ask.
    const std::optional<double> trial =
        core::ParseDuration(StringAt(pod, {"metadata", "annotations", kTrialAnnotation}));
    if (trial && *trial >= 1) {
      const std::string ns = StringAt(pod, {"metadata", "namespace"});
      notices_.push_back(
          {.ns = ns.empty() ? "default" : ns,
           .name = StringAt(pod, {"metadata", "name"}),
           .uid = uid,
           .type = "Normal",
           .reason = "TrialResult",
           .action = "Sizing",
           .note = DraTrialAdvice(std::ceil(*trial), *use, options_.auto_size_margin_pct)});
    }
    return;
  }
  auto d = PodDemandOf(pod, SharesPerGpu());
  if (!d.ok()) {
    spdlog::info("extender: pod {} ended; its use is not learned: {}", id,
                 std::string(d.status().message()));
    return;  // read again at its next event (a node may say how many shares a GPU has by then)
  }
  learned_.insert(uid);
  const bool refused = use->refused.value_or(0) > 0;
  // What its kind needs: its peak, or what it asked at most where its limit refused it.
  int64_t learn_mib = use->peak_mib.value_or(0);
  if (refused) learn_mib = std::max(learn_mib, use->wanted_mib.value_or(0));
  // What it would have used: a share held back by its slices learns past its size (its busy
  // share alone would grow its kind by the margin only).
  Learn(uid, UseKinds(*d), WantedPct(*use), static_cast<double>(learn_mib));
  spdlog::info("extender: pod {} ended; its kind ({}) learns {}", id, d->kind.shape, text);
  const std::string ns = StringAt(pod, {"metadata", "namespace"});
  auto notice = [&](const char* type, const char* reason, std::string note) {
    notices_.push_back({.ns = ns.empty() ? "default" : ns,
                        .name = StringAt(pod, {"metadata", "name"}),
                        .uid = uid,
                        .type = type,
                        .reason = reason,
                        .action = "Sizing",
                        .note = std::move(note)});
  };
  // An automatic size it outgrew: never silent (its next run of its kind is sized past it).
  const int64_t limit = use->limit_mib.value_or(0);
  const int64_t peak = use->peak_mib.value_or(0);
  const bool failed = StringAt(pod, {"status", "phase"}) == "Failed";
  if (d->memory_auto && limit > 0 && (refused || (failed && peak * 10 >= limit * 9))) {
    const auto next = static_cast<int64_t>(
        core::SizeFromUse(static_cast<double>(std::max(learn_mib, limit)),
                          options_.auto_size_margin_pct / 100.0, kMemoryStepMib));
    notice("Warning", "OutgrewGPUMemory",
           refused ? fmt::format("its automatic GPU memory of {}Mi refused {} allocation{} "
                                 "(measured peak {}MiB; it asked for {}MiB at most): the next pod "
                                 "of its kind is sized past it (or set "
                                 "tessera.io/gpu-memory: {}Mi)",
                                 limit, *use->refused, *use->refused == 1 ? "" : "s", peak,
                                 use->wanted_mib.value_or(0), next)
                   : fmt::format("it failed near its automatic GPU memory of {}Mi (measured peak "
                                 "{}MiB): it may have outgrown it; the next pod of its kind is "
                                 "sized from this peak too (or set tessera.io/gpu-memory: {}Mi)",
                                 limit, peak, next));
  }
  if (d->trial_s > 0)
    notice("Normal", "TrialResult",
           TrialAdvice(*d, *use, SharesPerGpu(), options_.auto_size_margin_pct));
}

void Extender::Learn(const std::string& uid, const std::vector<sched::RunKind>& kinds,
                     std::optional<double> busy_pct, double peak_mib) {
  if (kinds.empty()) return;
  for (const sched::RunKind& kind : kinds) {
    if (busy_pct) engine_->history().AddUtilization(kind, *busy_pct);
    if (peak_mib > 0) engine_->history().AddGpuMemoryPeak(kind, peak_mib);
  }
  const sched::RunKind& kind = kinds.front();
  json r = {{"uid", uid},
            {"user", kind.user},
            {"name", kind.name},
            {"command", kind.command},
            {"shape", kind.shape}};
  if (kinds.size() > 1) {
    json also = json::array();
    for (size_t i = 1; i < kinds.size(); ++i) also.push_back(kinds[i].shape);
    r["alsoShapes"] = std::move(also);
  }
  if (busy_pct) r["busyPercent"] = *busy_pct;
  if (peak_mib > 0) r["peakMiB"] = peak_mib;
  // Kept as text once: writing the history out then joins them (under the lock every filter
  // takes: dumping 2,000 records each time took 20 ms, docs/benchmarks.md).
  use_records_.push_back(r.dump());
  use_bytes_ += use_records_.back().size() + 1;
  // Within what a ConfigMap holds (1 MiB in all): the oldest records go first.
  while (!use_records_.empty() &&
         (use_records_.size() > kUseRecordsKept || use_bytes_ > kUseHistoryBytes)) {
    use_bytes_ -= use_records_.front().size() + 1;
    use_records_.pop_front();
  }
  use_records_changed_ = true;
}

std::optional<std::string> Extender::TakeUseHistory() {
  core::MutexLock lock(mu_);
  if (!use_records_changed_) return std::nullopt;
  use_records_changed_ = false;
  std::string out;
  out.reserve(use_bytes_);
  out += '[';
  for (const std::string& r : use_records_) {
    if (out.size() > 1) out += ',';
    out += r;
  }
  out += ']';
  return out;
}

int Extender::LoadUseHistory(const json& records) {
  core::MutexLock lock(mu_);
  if (!records.is_array()) return 1;
  const bool learned_since_start = !use_records_.empty();
  int bad = 0;
  std::unordered_set<std::string> loaded;  // a pod's records (one per kind) all replayed
  for (const json& r : records) {
    auto text = [&](const char* key) -> const json* {
      auto it = r.is_object() ? r.find(key) : r.end();
      return r.is_object() && it != r.end() && it->is_string() ? &*it : nullptr;
    };
    const json* uid = text("uid");
    const json* shape = text("shape");
    const json* user = text("user");
    const json* name = text("name");
    const json* command = r.is_object() && r.contains("command") ? &r["command"] : nullptr;
    const json* busy = r.is_object() && r.contains("busyPercent") ? &r["busyPercent"] : nullptr;
    const json* peak = r.is_object() && r.contains("peakMiB") ? &r["peakMiB"] : nullptr;
    const json* also = r.is_object() && r.contains("alsoShapes") ? &r["alsoShapes"] : nullptr;
    if (!uid || !shape || !user || !name || !command || !command->is_array() ||
        (also && (!also->is_array() ||
                  std::ranges::any_of(*also, [](const json& a) { return !a.is_string(); }))) ||
        (busy && (!busy->is_number() || *busy < 0 || *busy > 100)) ||
        (peak && (!peak->is_number() || *peak <= 0))) {
      ++bad;
      continue;
    }
    sched::RunKind kind{.user = *user, .name = *name, .shape = *shape};
    bool words = true;
    for (const json& a : *command) {
      if (!a.is_string()) words = false;
      if (words) kind.command.push_back(a.get<std::string>());
    }
    if (!words) {
      ++bad;
      continue;
    }
    const std::string id = uid->get<std::string>();
    if (learned_.contains(id) && !loaded.contains(id)) continue;  // learned since this start
    learned_.insert(id);
    loaded.insert(id);
    // Records of one pod per kind (an older extender's) are each read; one record names them all.
    std::vector<sched::RunKind> kinds = {kind};
    if (also) {
      for (const json& a : *also) {
        kinds.push_back(kind);
        kinds.back().shape = a.get<std::string>();
      }
    }
    Learn(id, kinds, busy ? std::optional<double>(busy->get<double>()) : std::nullopt,
          peak ? peak->get<double>() : 0);
  }
  // What was just read is what is stored; what was learned before it still needs writing.
  use_records_changed_ = learned_since_start;
  return bad;
}

std::vector<Notice> Extender::TakeNotices() {
  core::MutexLock lock(mu_);
  std::vector<Notice> out;
  out.swap(notices_);
  return out;
}

}  // namespace tessera::extender
