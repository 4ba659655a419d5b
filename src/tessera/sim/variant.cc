#include "tessera/sim/variant.h"

#include <cmath>
#include <random>
#include <string>

#include "fmt/format.h"

namespace tessera::sim {
namespace {

enum Class { kShare, kOne, kMulti, kClasses };
constexpr const char* kClassNames[] = {"GPU-sharing", "one-GPU", "multi-GPU"};

int ClassOf(const core::Request& r) {
  if (r.fractional()) return kShare;
  return r.gpus >= 2 ? kMulti : kOne;
}

}  // namespace

absl::StatusOr<std::vector<core::Request>> MakeVariant(
    const std::vector<core::Request>& base, const std::vector<core::Request>& models_from,
    const VariantSpec& spec) {
  for (auto [name, v] : {std::pair{"share", spec.share}, std::pair{"multi_gpu", spec.multi_gpu},
                         std::pair{"constrained", spec.constrained}}) {
    if (std::isnan(v) || v > 1)
      return absl::InvalidArgumentError(
          fmt::format("variant: {} must be a part of the GPU pods in [0, 1], got {}", name, v));
  }
  if (!(spec.cpu_only >= 0 && spec.cpu_only <= 10))
    return absl::InvalidArgumentError(
        fmt::format("variant: cpu_only must be a multiple of the CPU-only pods in [0, 10], got {}",
                    spec.cpu_only));
  std::vector<const core::Request*> pool[kClasses], cpu_only;
  for (const core::Request& r : base) {
    if (r.wants_gpu()) {
      pool[ClassOf(r)].push_back(&r);
    } else {
      cpu_only.push_back(&r);
    }
  }
  const size_t gpu_pods = pool[kShare].size() + pool[kOne].size() + pool[kMulti].size();
  if (gpu_pods == 0) return absl::InvalidArgumentError("variant: the base list has no GPU pods");
  auto own = [&](int c) { return double(pool[c].size()) / double(gpu_pods); };
  double part[kClasses];
  part[kShare] = spec.share >= 0 ? spec.share : own(kShare);
  part[kMulti] = spec.multi_gpu >= 0 ? spec.multi_gpu : own(kMulti);
  part[kOne] = 1 - part[kShare] - part[kMulti];
  if (part[kOne] < -1e-9)
    return absl::InvalidArgumentError(
        fmt::format("variant: share ({}) and multi_gpu ({}) add up to more than all GPU pods",
                    part[kShare], part[kMulti]));
  part[kOne] = std::max(0.0, part[kOne]);
  for (int c = 0; c < kClasses; ++c) {
    if (part[c] > 0 && pool[c].empty())
      return absl::InvalidArgumentError(
          fmt::format("variant: {} pods asked for ({:.0f}%) but the base list has none",
                      kClassNames[c], 100 * part[c]));
  }
  std::vector<const core::Request*> models[kClasses + 1];  // by class, and all
  for (const core::Request& r : models_from) {
    if (!r.wants_gpu() || r.models.empty()) continue;
    models[ClassOf(r)].push_back(&r);
    models[kClasses].push_back(&r);
  }
  if (spec.constrained > 0 && models[kClasses].empty())
    return absl::InvalidArgumentError(
        "variant: constrained pods asked for but no pod to take GPU models from names any");

  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<double> unit(0, 1);
  auto pick = [&](const std::vector<const core::Request*>& from) {
    return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
  };
  std::vector<core::Request> out;
  out.reserve(gpu_pods + cpu_only.size());
  for (size_t i = 0; i < gpu_pods; ++i) {
    double x = unit(rng);
    int c = kShare;
    while (c + 1 < kClasses && (x -= part[c]) >= 0) ++c;
    if (pool[c].empty()) c = part[kOne] > 0 ? kOne : part[kShare] > 0 ? kShare : kMulti;
    core::Request r = *pick(pool[c]);
    if (spec.constrained >= 0) {
      r.models.clear();
      if (unit(rng) < spec.constrained)
        r.models = pick(models[c].empty() ? models[kClasses] : models[c])->models;
    }
    out.push_back(std::move(r));
  }
  const auto cpu_pods = static_cast<size_t>(std::llround(spec.cpu_only * double(cpu_only.size())));
  for (size_t i = 0; i < cpu_pods; ++i) out.push_back(*pick(cpu_only));
  for (size_t i = 0; i < out.size(); ++i) out[i].id = fmt::format("v{}", i);
  return out;
}

}  // namespace tessera::sim
