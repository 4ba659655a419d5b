#pragma once
// The agent's checkpoints (the device plugin's allocations, the DRA driver's prepared claims): JSON
// files with a version, written atomically (devices/atomic_file.h) and read back at start.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace tessera::agent {

// Why checkpoint `path` cannot be used, and what moving it away costs (`records`: "allocations").
inline absl::Status CheckpointError(const std::string& path, const std::string& why,
                                    const std::string& records) {
  return absl::FailedPreconditionError(fmt::format(
      "checkpoint {}: {} (move it away to start without the {} it records)", path, why, records));
}

// The checkpoint at `path` when it is JSON of `version`; null when there is none (a first start).
// kDataLoss for a file that is there but cannot be used (not JSON, truncated, another version):
// the caller sets it aside (SetCheckpointAside) and rebuilds from its sources of truth;
// kFailedPrecondition when it cannot be read at all (permissions).
inline absl::StatusOr<nlohmann::json> ReadCheckpoint(const std::string& path, int version,
                                                     const std::string& records) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return nlohmann::json();
    return CheckpointError(path, strerror(errno), records);
  }
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(CheckpointError(path, "not JSON", records).message());
  }
  const nlohmann::json* v = j.contains("version") ? &j["version"] : nullptr;
  if (v == nullptr || !v->is_number_integer() || v->get<int>() != version) {
    return absl::DataLossError(CheckpointError(path,
                                               fmt::format("version {} (this agent reads {})",
                                                           v ? v->dump() : "missing", version),
                                               records)
                                   .message());
  }
  return j;
}

// Moves an unusable checkpoint to "<path>.corrupt-<unix seconds>" (kept for a person to look at)
// and returns that name; logged as an error with `why`. The caller starts empty and rebuilds.
inline absl::StatusOr<std::string> SetCheckpointAside(const std::string& path,
                                                      const std::string& why) {
  const std::string aside = fmt::format("{}.corrupt-{}", path, static_cast<long>(time(nullptr)));
  if (rename(path.c_str(), aside.c_str()) != 0) {
    return absl::FailedPreconditionError(fmt::format(
        "checkpoint {} cannot be used ({}) nor set aside: {}", path, why, strerror(errno)));
  }
  spdlog::error(
      "checkpoint {} cannot be used ({}): set aside as {}; starting without it and "
      "rebuilding from the kubelet and the API server",
      path, why, aside);
  return aside;
}

// ReadCheckpoint, with a file that cannot be used set aside: then null (as for a first start) and
// `*aside` names where it went; errors only for a file that cannot be read or moved.
inline absl::StatusOr<nlohmann::json> ReadCheckpointOrSetAside(const std::string& path, int version,
                                                               const std::string& records,
                                                               std::string* aside) {
  auto read = ReadCheckpoint(path, version, records);
  if (read.ok() || read.status().code() != absl::StatusCode::kDataLoss) return read;
  auto moved = SetCheckpointAside(path, std::string(read.status().message()));
  if (!moved.ok()) return moved.status();
  *aside = *std::move(moved);
  return nlohmann::json();
}

}  // namespace tessera::agent
