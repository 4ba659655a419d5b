#include "tessera/sched/predictor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tessera/core/numeric.h"

namespace tessera::sched {
namespace {

// What runs are keyed by: its name, else its command (program and arguments).
std::string WhatRuns(const RunKind& k) {
  return k.name.empty() ? fmt::format("{}", fmt::join(k.command, " ")) : k.name;
}

struct Key {
  std::string text, describe;
};

std::vector<Key> KeysOf(const RunKind& kind, bool kind_only) {
  const std::string& user = kind.user;
  const std::string& shape = kind.shape;
  std::string what = WhatRuns(kind);
  std::string shown = what.size() > 40 ? what.substr(0, 37) + "..." : what;
  std::vector<Key> keys;
  // A named job's runs of this very command first (`train.py --epochs 100` and `--epochs 1` are
  // not comparable), then its runs under that name whatever the command.
  if (!kind.name.empty()) {
    keys.push_back(
        {fmt::format("{}\x1f{}\x1e{}\x1f{}", user, what, fmt::join(kind.command, "\x1e"), shape),
         fmt::format("{}'s runs of '{}' with this command", user, shown)});
  }
  // A run known by neither name nor command (a trace's) has no key of its own before its shape.
  if (!what.empty()) {
    keys.push_back({fmt::format("{}\x1f{}\x1f{}", user, what, shape),
                    fmt::format("{}'s runs of '{}'", user, shown)});
  }
  // Another job of the same shape says little of this one ("overdue" from someone's `true`): only
  // where a run is known by nothing else (a trace's), unless asked.
  if (kind_only && !what.empty()) return keys;
  keys.push_back(
      {fmt::format("{}\x1f\x1f{}", user, shape), fmt::format("{}'s {} jobs", user, shape)});
  keys.push_back({fmt::format("\x1f\x1f{}", shape), fmt::format("all {} jobs", shape)});
  return keys;
}

using Runs = std::unordered_map<std::string, std::deque<double>>;

void Push(Runs& runs, const std::string& key, double v) {
  std::deque<double>& d = runs[key];
  d.push_back(v);
  if (d.size() > DurationPredictor::kKept) d.pop_front();
}

// The `pct`th percentile of the nearest key with enough values (else the nearest with any), with
// how many values and what it is "p75 of alice's runs of 'train' (4 runs)"; nullopt when none has
// any.
struct Quantile {
  double value = 0;
  int samples = 0;
  std::string basis;
};
std::optional<Quantile> Percentile(const Runs& runs, const std::vector<Key>& keys, int pct) {
  const std::deque<double>* chosen = nullptr;
  std::string basis;
  for (const Key& k : keys) {
    auto it = runs.find(k.text);
    if (it == runs.end() || it->second.empty()) continue;
    if (it->second.size() >= DurationPredictor::kConfident) {
      chosen = &it->second;
      basis = k.describe;
      break;
    }
    if (!chosen) chosen = &it->second, basis = k.describe;
  }
  if (!chosen) return std::nullopt;
  const size_t n = chosen->size();
  return Quantile{
      core::Percentile(std::vector<double>(chosen->begin(), chosen->end()), pct / 100.0),
      static_cast<int>(n), fmt::format("p{} of {} ({} run{})", pct, basis, n, n == 1 ? "" : "s")};
}

double Median(const std::deque<double>& d) {
  std::vector<double> v(d.begin(), d.end());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::string HistoryShape(const core::Request& r, int tasks, bool memory_auto) {
  const bool share = r.fractional();
  const std::string memory =
      memory_auto ? std::string("auto") : fmt::format("{}MiB", r.gpu_memory_mib);
  std::string s = share        ? fmt::format("{:g}% {}", r.gpu_milli / 10.0, memory)
                  : r.gpus > 0 ? fmt::format("{} GPU", r.gpus)
                               : std::string("no-GPU");
  if (share && r.share_gpus > 1) s += fmt::format(" on {} GPUs", r.share_gpus);
  if (tasks > 1) s += fmt::format(" x{}", tasks);
  if (!r.models.empty()) s += fmt::format(" [{}]", fmt::join(r.models, ","));
  return s;
}

void DurationPredictor::Add(const RunKind& kind, double runtime_s, std::optional<double> util_pct,
                            std::optional<bool> shared_gpu) {
  if (!(runtime_s >= 0) || !std::isfinite(runtime_s)) return;
  const bool util = util_pct && *util_pct >= 0 && *util_pct <= 100;
  const std::vector<Key> keys = KeysOf(kind, kind_only_);
  core::MutexLock lock(mu_);
  for (const Key& k : keys) {
    Push(runs_, k.text, runtime_s);
    if (util) Push(utils_, k.text, *util_pct);
    if (shared_gpu) Push(*shared_gpu ? shared_runs_ : alone_runs_, k.text, runtime_s);
  }
}

void DurationPredictor::AddGpuMemoryPeak(const RunKind& kind, double mib) {
  if (!(mib > 0) || !std::isfinite(mib)) return;
  const std::vector<Key> keys = KeysOf(kind, kind_only_);
  core::MutexLock lock(mu_);
  for (const Key& k : keys) Push(peaks_, k.text, mib);
}

void DurationPredictor::AddUtilization(const RunKind& kind, double util_pct) {
  if (!(util_pct >= 0 && util_pct <= 100)) return;
  const std::vector<Key> keys = KeysOf(kind, kind_only_);
  core::MutexLock lock(mu_);
  for (const Key& k : keys) Push(utils_, k.text, util_pct);
}

Prediction DurationPredictor::Predict(const RunKind& kind) const {
  Prediction p;
  {
    const std::vector<Key> keys = KeysOf(kind, kind_only_);
    core::MutexLock lock(mu_);
    if (std::optional<Quantile> q = Percentile(runs_, keys, 75)) {
      p.seconds = q->value, p.samples = q->samples, p.basis = std::move(q->basis);
    }
    if (std::optional<Quantile> q = Percentile(utils_, keys, 75)) {
      p.util_pct = q->value, p.util_samples = q->samples, p.util_basis = std::move(q->basis);
    }
    if (std::optional<Quantile> q = Percentile(utils_, keys, kSizingPercentile)) {
      p.util_high_pct = q->value, p.util_high_basis = std::move(q->basis);
    }
    if (std::optional<Quantile> q = Percentile(peaks_, keys, kSizingPercentile)) {
      p.gpu_memory_peak_mib = q->value, p.memory_samples = q->samples;
      p.memory_basis = std::move(q->basis);
    }
    // The nearest key with at least two runs of each kind.
    for (const Key& k : keys) {
      auto shared = shared_runs_.find(k.text), alone = alone_runs_.find(k.text);
      if (shared == shared_runs_.end() || alone == alone_runs_.end() || shared->second.size() < 2 ||
          alone->second.size() < 2) {
        continue;
      }
      const double alone_median = Median(alone->second);
      if (alone_median > 0) {
        p.sharing_slowdown = std::clamp(Median(shared->second) / alone_median, 1.0, 4.0);
        p.sharing_basis = fmt::format("{}: {} shared, {} alone", k.describe, shared->second.size(),
                                      alone->second.size());
      }
      break;
    }
  }
  if (kind.max_runtime_s > 0 && (p.seconds == 0 || kind.max_runtime_s < p.seconds)) {
    p.seconds = kind.max_runtime_s;
    p.basis = p.samples > 0 ? p.basis + ", capped by its max runtime" : "its max runtime";
  }
  return p;
}

size_t DurationPredictor::keys() const {
  core::MutexLock lock(mu_);
  return runs_.size();
}

}  // namespace tessera::sched
