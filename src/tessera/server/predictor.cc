#include "tessera/server/predictor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace tessera::server {
namespace {

// What runs are keyed by: its name, else its command (program and arguments).
std::string WhatRuns(const JobSpec& spec) {
  return spec.name.empty() ? fmt::format("{}", fmt::join(spec.command, " ")) : spec.name;
}

struct Key {
  std::string text, describe;
};

std::vector<Key> KeysOf(const JobSpec& spec, const std::string& user) {
  const std::string shape = HistoryShape(spec);
  std::string what = WhatRuns(spec);
  std::string shown = what.size() > 40 ? what.substr(0, 37) + "..." : what;
  std::vector<Key> keys;
  // A named job's runs of this very command first (`train.py --epochs 100` and `--epochs 1` are
  // not comparable), then its runs under that name whatever the command.
  if (!spec.name.empty()) {
    keys.push_back(
        {fmt::format("{}\x1f{}\x1e{}\x1f{}", user, what, fmt::join(spec.command, "\x1e"), shape),
         fmt::format("{}'s runs of '{}' with this command", user, shown)});
  }
  keys.push_back({fmt::format("{}\x1f{}\x1f{}", user, what, shape),
                  fmt::format("{}'s runs of '{}'", user, shown)});
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

// The 75th percentile of the nearest key with enough values (else the nearest with any), with how
// many values and what it is "p75 of alice's runs of 'train' (4 runs)"; nullopt when none has any.
struct Quantile {
  double value = 0;
  int samples = 0;
  std::string basis;
};
std::optional<Quantile> P75(const Runs& runs, const std::vector<Key>& keys) {
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
  std::vector<double> v(chosen->begin(), chosen->end());
  const size_t at = std::min(v.size() - 1, static_cast<size_t>(std::ceil(0.75 * v.size())) - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
  return Quantile{v[at], static_cast<int>(v.size()),
                  fmt::format("p75 of {} ({} run{})", basis, v.size(), v.size() == 1 ? "" : "s")};
}

double Median(const std::deque<double>& d) {
  std::vector<double> v(d.begin(), d.end());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::string HistoryShape(const JobSpec& spec) {
  const bool share = spec.Share();
  std::string s = share ? fmt::format("{:g}% {}MiB", spec.gpu_milli / 10.0, spec.gpu_memory_mib)
                  : spec.gpus > 0 ? fmt::format("{} GPU", spec.gpus)
                                  : std::string("no-GPU");
  if (share && spec.gpus > 1) s += fmt::format(" on {} GPUs", spec.gpus);
  if (spec.Tasks() > 1) s += fmt::format(" x{}", spec.Tasks());
  if (!spec.models.empty()) s += fmt::format(" [{}]", fmt::join(spec.models, ","));
  return s;
}

void DurationPredictor::Add(const JobSpec& spec, const std::string& user, double runtime_s,
                            std::optional<double> util_pct, std::optional<bool> shared_gpu) {
  if (!(runtime_s >= 0) || !std::isfinite(runtime_s)) return;
  const bool util = util_pct && *util_pct >= 0 && *util_pct <= 100;
  std::lock_guard lock(mu_);
  for (const Key& k : KeysOf(spec, user)) {
    Push(runs_, k.text, runtime_s);
    if (util) Push(utils_, k.text, *util_pct);
    if (shared_gpu) Push(*shared_gpu ? shared_runs_ : alone_runs_, k.text, runtime_s);
  }
}

Prediction DurationPredictor::Predict(const JobSpec& spec, const std::string& user) const {
  Prediction p;
  {
    const std::vector<Key> keys = KeysOf(spec, user);
    std::lock_guard lock(mu_);
    if (std::optional<Quantile> q = P75(runs_, keys)) {
      p.seconds = q->value, p.samples = q->samples, p.basis = std::move(q->basis);
    }
    if (std::optional<Quantile> q = P75(utils_, keys)) {
      p.util_pct = q->value, p.util_samples = q->samples, p.util_basis = std::move(q->basis);
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
  if (spec.max_runtime_s > 0 && (p.seconds == 0 || spec.max_runtime_s < p.seconds)) {
    p.seconds = spec.max_runtime_s;
    p.basis = p.samples > 0 ? p.basis + ", capped by its max runtime" : "its max runtime";
  }
  return p;
}

size_t DurationPredictor::keys() const {
  std::lock_guard lock(mu_);
  return runs_.size();
}

}  // namespace tessera::server
