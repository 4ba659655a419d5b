// libFuzzer target: the server's job format (POST /v1/jobs bodies) on arbitrary bytes: a spec or an
// invalid-argument error, never a crash; an accepted spec is a valid request and survives its
// stored form unchanged.
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
  auto stored = tessera::server::JobSpecToJson(*spec);
  auto again = tessera::server::JobSpecFromJson(stored);
  if (!again.ok() || tessera::server::JobSpecToJson(*again) != stored) __builtin_trap();
  return 0;
}
