// libFuzzer target: the annotations the extender and the agent exchange (tessera.io/assignment,
// tessera.io/allocated, tessera.io/gpus, tessera.io/gpu-use), which anyone allowed to edit a pod or
// node can write. Arbitrary bytes give a value or an invalid-argument error, never a crash; an
// accepted value survives its formatted form unchanged. The first byte picks the parser.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/kube/gpu_annotations.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  namespace k = tessera::kube;
  switch (data[0] % 4) {
    case 0: {
      auto a = k::ParseAssignment(text);
      if (!a.ok()) {
        if (a.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
        return 0;
      }
      auto again = k::ParseAssignment(k::FormatAssignment(*a));
      if (!again.ok() || !(*again == *a)) __builtin_trap();
      break;
    }
    case 1: {
      auto d = k::ParseAllocated(text);
      if (!d.ok()) return 0;
      auto again = k::ParseAllocated(k::FormatAllocated(*d));
      if (!again.ok() || *again != *d) __builtin_trap();
      break;
    }
    case 3: {
      auto u = k::ParseGpuUse(text);
      if (!u.ok()) {
        if (u.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
        return 0;
      }
      auto again = k::ParseGpuUse(k::FormatGpuUse(*u));
      if (!again.ok() || !(*again == *u)) __builtin_trap();
      // What it would have used: a part of one GPU, never less than what it used.
      if (const auto w = u->WantedPermille();
          w && (*w < 0 || *w > 1000 || *w < u->busy_permille.value_or(0))) {
        __builtin_trap();
      }
      break;
    }
    default: {
      auto n = k::ParseNodeGpus(text);
      if (!n.ok()) {
        if (n.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
        return 0;
      }
      std::string formatted = k::FormatNodeGpus(*n);
      auto again = k::ParseNodeGpus(formatted);
      if (!again.ok() || k::FormatNodeGpus(*again) != formatted) __builtin_trap();
    }
  }
  return 0;
}
