#pragma once
// What the Slurm benchmarks share: timing, and the folder their Slurm runs in.

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace tessera::bench {

using Clock = std::chrono::steady_clock;

// Milliseconds since `t0`.
inline double Ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The median and the 99th percentile of `v` (0, 0 when empty).
inline std::pair<double, double> P50P99(std::vector<double> v) {
  if (v.empty()) return {0, 0};
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

// A new folder under the temporary one, named `prefix`-XXXXXX, where MiniSlurm then makes its
// Slurm's (TEST_TMPDIR); empty when it cannot be made. The caller removes it.
inline std::string SlurmFolder(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  setenv("TEST_TMPDIR", tmpl.c_str(), 1);
  return tmpl;
}

}  // namespace tessera::bench
