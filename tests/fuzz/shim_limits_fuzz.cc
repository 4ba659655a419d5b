// libFuzzer target: the intercept library's limit and share parsers (TESSERA_CUDA_MEM_LIMIT,
// TESSERA_CUDA_COMPUTE_SHARE), which read what a job's environment says: never a crash or a read
// past the text, and every accepted limit a number of bytes for a device index below kMaxDevices
// (a limit that parses is never silently 0 for a device it names: none means refused).
#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);  // NUL-terminated copy
  uint64_t limits[tessera::shim::kMaxDevices] = {};
  int count = -1;
  if (tessera::shim::ParseLimits(text.c_str(), limits, &count)) {
    if (count < 1 || count > tessera::shim::kMaxDevices) __builtin_trap();
  }
  uint32_t permille = 0;
  if (tessera::shim::ParseShare(text.c_str(), &permille) && (permille < 1 || permille > 1000))
    __builtin_trap();
  return 0;
}
