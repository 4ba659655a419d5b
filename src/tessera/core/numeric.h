#pragma once
// Small numeric rules that more than one part of Tessera must compute alike: the simulator and the
// run-time predictor (a percentile), the Slurm plugin's sizing, the simulator and the
// differential test's fake launcher (an elastic job's speed), and what a share held back by its
// time slices would have used (the server, the node agent's annotation, the Slurm plugin).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tessera::core {

// The nearest-rank percentile `p` (0..1) of `sorted` (ascending): its value at rank ceil(p * n),
// counted from 1 and kept within 1..n; 0 when empty.
inline double PercentileOfSorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// The same of `values` in any order (taken by value and partly sorted).
inline double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size())));
  const size_t at = std::clamp<size_t>(rank, 1, values.size()) - 1;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(at), values.end());
  return values[at];
}

// How fast an elastic job works on `n` GPUs relative to `base` GPUs, by Amdahl's law with
// `serial_fraction` (0..1): speedup(n) / speedup(base), speedup(g) = 1 / (s + (1 - s) / g).
inline double ElasticSpeed(double serial_fraction, int n, int base) {
  const double s = serial_fraction;
  auto speedup = [&](double g) { return 1 / (s + (1 - s) / g); };
  return speedup(n) / speedup(base);
}

// What a job would have used of a GPU had its launches not waited for it, in percent: its GPU time
// `busy` over the part of its run `run` in which it was not waiting (`held`, the arbiter's held
// time; all three in one unit, per GPU) - its rate while it ran as it wished. A job that computes
// between its kernels waits less than one that only launches, so this is its own rate, not the
// whole GPU. At most 100 (held back whenever it did not run: all it was let); -1 when the run or
// the busy time is not known.
inline double DemandPct(double busy, double held, double run) {
  if (!(run > 0) || !(busy > 0)) return -1;
  if (held + busy >= run) return 100;
  return std::min(100.0, 100 * busy / (run - held));
}

}  // namespace tessera::core
