#pragma once
// Variants of a pod list, made the way the published openb variants were made from the default
// list (cluster-trace-gpu-v2023: gpushare*, multigpu*, gpuspec*, cpu*): the GPU pods resampled so
// that a chosen part of them share a GPU, ask for several GPUs, or name GPU models, and the
// CPU-only pods scaled in number. For testing a policy on workloads it was not tuned to.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/request.h"

namespace tessera::sim {

struct VariantSpec {
  // Parts of the GPU pods, each in [0, 1]; below 0: the base list's own. Pods that share a GPU,
  // pods of two or more whole GPUs (one-GPU pods are the rest), pods that name GPU models.
  double share = -1;
  double multi_gpu = -1;
  double constrained = -1;
  // CPU-only pods, as a multiple of the base list's number (0..10).
  double cpu_only = 1;
  uint64_t seed = 1;
};

// As many GPU pods as `base` has, each drawn (with replacement, seeded) from the base pods of its
// class - share, one GPU, several GPUs - with the classes in the asked proportions; with
// `constrained` set, each GPU pod names the models of a pod drawn from the constrained pods of
// `models_from` (of the same class where it has any), or none. Pods are named v0, v1, ... Refuses
// a part outside [0, 1], share + multi_gpu above 1, a class asked for that `base` has no pod of,
// and constraints without a constrained pod to take them from, naming which.
absl::StatusOr<std::vector<core::Request>> MakeVariant(
    const std::vector<core::Request>& base, const std::vector<core::Request>& models_from,
    const VariantSpec& spec);

}  // namespace tessera::sim
