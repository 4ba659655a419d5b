// libFuzzer target: the Slurm trace readers (`sacct -P` jobs, `scontrol show node -o` nodes) on
// arbitrary bytes: a result or an error that names the file and line, never a crash, and results
// that satisfy the request invariants.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/sim/slurm_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (int shards : {0, 8}) {
    auto jobs = tessera::sim::ParseSacctJobs(text, "j.txt", shards, 40960);
    if (!jobs.ok() && jobs.status().message().substr(0, 6) != "j.txt:") __builtin_trap();
    if (jobs.ok()) {
      for (const auto& j : *jobs) {
        if (!tessera::core::ValidateRequest(j.request).empty() || j.submit < 0) __builtin_trap();
      }
    }
  }
  auto nodes = tessera::sim::ParseScontrolNodes(text, "n.txt", 40960);
  if (!nodes.ok() && nodes.status().message().substr(0, 6) != "n.txt:") __builtin_trap();
  return 0;
}
