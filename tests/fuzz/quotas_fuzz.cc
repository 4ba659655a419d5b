// libFuzzer target: the extender's quota ConfigMap (`quotas.yaml`, YAML written by a cluster admin)
// on arbitrary bytes: quotas or an invalid-argument error naming quotas.yaml; never a crash, and
// accepted quotas are consistent (amounts -1 for "not limited" or >= 0, a borrowing limit at or
// above the guaranteed share).
#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/extender/extender.h"

namespace {
bool Valid(const tessera::sched::GpuAmount& a) {
  return a.gpus >= -1 && a.gpu_milli >= -1 && a.gpu_memory_mib >= -1;
}
bool AtLeast(int64_t limit, int64_t guaranteed) {
  return limit < 0 || (guaranteed >= 0 && limit >= guaranteed);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto q = tessera::extender::ParseQuotas(text);
  if (!q.ok()) {
    if (q.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    if (q.status().message().find("quotas.yaml") == std::string::npos) __builtin_trap();
    return 0;
  }
  for (const auto& [ns, oq] : *q) {
    if (ns.empty() || !Valid(oq.limit) || !Valid(oq.borrow_limit)) __builtin_trap();
    if (oq.borrow && !(AtLeast(oq.borrow_limit.gpus, oq.limit.gpus) &&
                       AtLeast(oq.borrow_limit.gpu_milli, oq.limit.gpu_milli) &&
                       AtLeast(oq.borrow_limit.gpu_memory_mib, oq.limit.gpu_memory_mib))) {
      __builtin_trap();
    }
  }
  return 0;
}
