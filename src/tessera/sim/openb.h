#pragma once
// Loaders for the Alibaba GPU cluster trace (cluster-trace-gpu-v2023, "openb"): the node list and
// the pod list CSVs. Columns are found by their header name; a malformed row is an error naming the
// file, the line and the column ("pods.csv:812: num_gpu: expected 0..8, got 12"). Pure functions.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/request.h"

namespace tessera::sim {

struct TracePod {
  core::Request request;  // id = the pod's name
  std::string qos;        // LS, BE, Burstable, Guaranteed (empty when absent)
  std::string phase;      // Running, Succeeded, Failed, Pending
  std::optional<int64_t> creation_time;
  std::optional<int64_t> deletion_time;
  std::optional<int64_t> scheduled_time;
};

// GPU memory by openb model name, MiB; 0 when the trace's model is anonymised (G2, G3).
int64_t OpenbGpuMemoryMib(std::string_view model);

absl::StatusOr<std::vector<core::NodeSpec>> ParseOpenbNodes(std::string_view csv,
                                                            std::string_view filename);
absl::StatusOr<std::vector<TracePod>> ParseOpenbPods(std::string_view csv,
                                                     std::string_view filename);

// Read a file, then parse. kNotFound when the file cannot be read.
absl::StatusOr<std::vector<core::NodeSpec>> LoadOpenbNodes(const std::string& path);
absl::StatusOr<std::vector<TracePod>> LoadOpenbPods(const std::string& path);

}  // namespace tessera::sim
