// libFuzzer target: the server's job format (POST /v1/jobs bodies) on arbitrary bytes: a spec or an
// invalid-argument error, never a crash; an accepted spec is a valid request and survives its
// stored form unchanged; its array's indices (ParseArray) come out bounded, sorted and once each.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "nlohmann/json.hpp"
#include "tessera/server/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = tessera::server::ParseJobSpec(text);
  if (!spec.ok()) {
    if (spec.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  if (!tessera::core::ValidateRequest(tessera::server::RequestOf(*spec, 1, "u")).empty())
    __builtin_trap();
  // An array's indices: expanded within a bound, or refused as bad input; sorted, each once.
  if (!spec->array.empty()) {
    auto range = tessera::server::ParseArray(spec->array, 10000);
    if (!range.ok() && range.status().code() != absl::StatusCode::kInvalidArgument)
      __builtin_trap();
    if (range.ok()) {
      if (range->indices.empty() || range->indices.size() > 10000) __builtin_trap();
      for (size_t i = 1; i < range->indices.size(); ++i) {
        if (range->indices[i] <= range->indices[i - 1]) __builtin_trap();
      }
      if (range->throttle != tessera::server::ArrayThrottle(spec->array)) __builtin_trap();
    }
  }
  auto stored = tessera::server::JobSpecToJson(*spec);
  auto again = tessera::server::JobSpecFromJson(stored);
  if (!again.ok() || tessera::server::JobSpecToJson(*again) != stored) __builtin_trap();
  return 0;
}
