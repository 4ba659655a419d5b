// libFuzzer target: the openb trace loaders (pods, then nodes) on arbitrary bytes: a result or an
// error that names the file and line, never a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/sim/openb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto pods = tessera::sim::ParseOpenbPods(text, "f.csv");
  if (!pods.ok() && pods.status().message().substr(0, 6) != "f.csv:") __builtin_trap();
  if (pods.ok()) {
    for (const auto& p : *pods) {
      if (p.request.gpu_milli < 0 || p.request.gpu_milli >= 1000 || p.request.gpus > 8)
        __builtin_trap();
    }
  }
  auto nodes = tessera::sim::ParseOpenbNodes(text, "f.csv");
  if (!nodes.ok() && nodes.status().message().substr(0, 6) != "f.csv:") __builtin_trap();
  return 0;
}
