// libFuzzer target: the Tessera CSV loaders (jobs, then nodes) on arbitrary bytes: a result or an
// error that names the file and line, never a crash, and results that satisfy the request
// invariants.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/sim/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto jobs = tessera::sim::ParseTesseraJobs(text, "f.csv");
  if (!jobs.ok() && jobs.status().message().substr(0, 6) != "f.csv:") __builtin_trap();
  if (jobs.ok()) {
    for (const auto& j : *jobs) {
      if (!tessera::core::ValidateRequest(j.request).empty() || j.submit < 0) __builtin_trap();
    }
  }
  auto nodes = tessera::sim::ParseTesseraNodes(text, "f.csv");
  if (!nodes.ok() && nodes.status().message().substr(0, 6) != "f.csv:") __builtin_trap();
  if (nodes.ok() && nodes->size() > 1'000'000) __builtin_trap();
  return 0;
}
