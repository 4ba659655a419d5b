#pragma once
// The agent's checkpoints (the device plugin's allocations, the DRA driver's prepared claims): JSON
// files with a version, written atomically (devices/atomic_file.h) and read back at start.

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace tessera::agent {

// Why checkpoint `path` cannot be used, and what moving it away costs (`records`: "allocations").
inline absl::Status CheckpointError(const std::string& path, const std::string& why,
                                    const std::string& records) {
  return absl::FailedPreconditionError(fmt::format(
      "checkpoint {}: {} (move it away to start without the {} it records)", path, why, records));
}

// The checkpoint at `path` when it is JSON of `version`; null when there is none (a first start).
inline absl::StatusOr<nlohmann::json> ReadCheckpoint(const std::string& path, int version,
                                                     const std::string& records) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return nlohmann::json();
    return CheckpointError(path, strerror(errno), records);
  }
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return CheckpointError(path, "not JSON", records);
  const nlohmann::json* v = j.contains("version") ? &j["version"] : nullptr;
  if (v == nullptr || !v->is_number_integer() || v->get<int>() != version) {
    return CheckpointError(
        path, fmt::format("version {} (this agent reads {})", v ? v->dump() : "missing", version),
        records);
  }
  return j;
}

}  // namespace tessera::agent
