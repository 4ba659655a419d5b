#include "tessera/sim/right_size.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "fmt/format.h"

namespace tessera::sim {
namespace {

bool UsesGpuCompute(const core::Request& r) { return r.gpus > 0 || r.gpu_milli > 0; }

// The share of a whole GPU's time a job was given per GPU (1 for whole GPUs).
double GivenPerGpu(const core::Request& r) {
  return r.gpus > 0 ? 1.0 : r.gpu_milli / static_cast<double>(core::kMilliPerGpu);
}

}  // namespace

absl::Status CheckUseModel(const UseModel& m) {
  if (!(m.mean > 0 && m.mean < 1)) {
    return absl::InvalidArgumentError(
        fmt::format("use model: mean {} is not between 0 and 1 (exclusive)", m.mean));
  }
  if (!(m.concentration > 0) || !std::isfinite(m.concentration)) {
    return absl::InvalidArgumentError(
        fmt::format("use model: concentration {} is not above 0", m.concentration));
  }
  return absl::OkStatus();
}

size_t ApplyUseModel(std::vector<SimJob>& jobs, const UseModel& m) {
  const double a = m.mean * m.concentration, b = (1 - m.mean) * m.concentration;
  size_t drawn = 0;
  for (SimJob& j : jobs) {
    if (j.utilization >= 0 || !UsesGpuCompute(j.request)) continue;
    // One generator per job, from the seed and its id: the same draw whatever the order.
    std::seed_seq seq{static_cast<uint32_t>(m.seed), static_cast<uint32_t>(m.seed >> 32),
                      static_cast<uint32_t>(std::hash<std::string>{}(j.request.id))};
    std::mt19937_64 rng(seq);
    const double x = std::gamma_distribution<double>(a, 1.0)(rng);
    const double y = std::gamma_distribution<double>(b, 1.0)(rng);
    const double used = x + y > 0 ? x / (x + y) : m.mean;
    j.utilization = 100 * used * GivenPerGpu(j.request);
    ++drawn;
  }
  return drawn;
}

absl::Status CheckRightSizing(const RightSizing& r) {
  if (!(r.margin >= 0) || !std::isfinite(r.margin)) {
    return absl::InvalidArgumentError(fmt::format("right-sizing: margin {} is negative", r.margin));
  }
  if (r.granularity_milli < 1 || r.granularity_milli > core::kMilliPerGpu) {
    return absl::InvalidArgumentError(fmt::format(
        "right-sizing: granularity {} milli is not within 1..1000", r.granularity_milli));
  }
  return absl::OkStatus();
}

std::vector<SimJob> RightSize(const std::vector<SimJob>& jobs, const RightSizing& r) {
  std::vector<SimJob> out = jobs;
  const int32_t g = r.granularity_milli;
  for (SimJob& j : out) {
    core::Request& q = j.request;
    if (j.utilization < 0 || !UsesGpuCompute(q) || q.gpus > 1) continue;
    // Its use of one GPU, in milli of the GPU's time, with the margin; never more than it asked.
    const int32_t asked = q.gpus == 1 ? core::kMilliPerGpu : q.gpu_milli;
    int32_t milli =
        static_cast<int32_t>(core::SizeFromUse(std::min(j.utilization, 100.0) * 10, r.margin, g));
    milli = std::clamp(milli, std::min(g, asked), asked);
    if (milli >= core::kMilliPerGpu) continue;  // a whole GPU stays a whole GPU
    q.gpus = 0;
    q.gpu_milli = milli;
  }
  return out;
}

}  // namespace tessera::sim
