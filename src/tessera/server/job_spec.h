#pragma once
// A job as submitted to the standalone server (POST /v1/jobs): parsed strictly from JSON - wrong
// types, out-of-range values and unknown fields are refused with the field's name - and turned into
// a scheduling request.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "tessera/core/request.h"

namespace tessera::server {

struct JobSpec {
  std::vector<std::string> command;  // argv; required
  std::map<std::string, std::string> env;
  std::string workdir;  // absolute; empty: the server's state directory
  std::string name;
  std::map<std::string, std::string> labels;
  // Resources: whole GPUs, or a fraction of one (compute share in thousandths and/or memory).
  int gpus = 0;
  int gpu_milli = 0;
  int64_t gpu_memory_mib = 0;
  std::vector<std::string>
      models;  // acceptable GPU models, exact names as NVML gives them; empty: any
  int64_t min_gpu_memory_mib = 0;
  std::string topology = "none";  // none | prefer | require (NVLink between the GPUs)
  // Host CPU (thousandths of a CPU) and memory: scheduled against the machine's, and limits of
  // the job's cgroup. 0: not asked (no limit).
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int priority = 0;  // -1000..1000, higher first
  bool preemptible = true;
  double max_runtime_s = 0;  // 0: none
  // Seconds between the SIGTERM of a stop (cancel, preemption, timeout) and the SIGKILL; negative:
  // the server's default (preemption.grace_period_s).
  double grace_period_s = -1;
  std::string image;  // run in a container (podman) with the GPUs as CDI devices
};

// kInvalidArgument naming the field ("resources.gpu_share: expected a share between 1% and 100%").
absl::StatusOr<JobSpec> ParseJobSpec(std::string_view json);
absl::StatusOr<JobSpec> JobSpecFromJson(const nlohmann::json& j);
nlohmann::json JobSpecToJson(const JobSpec& spec);

// Turns each of `spec`'s models into exact names of `available` (the machine's models): an exact
// name stays; otherwise the models that contain it as whole words, case aside ("H100", "a100",
// "T4", "H100 80GB"; not "100"), so that what is stored and scheduled is exact. kInvalidArgument
// naming the model and the machine's models when one matches none.
absl::Status ResolveModels(JobSpec* spec, const std::vector<std::string>& available);

// The scheduling request for a job.
core::Request RequestOf(const JobSpec& spec, int64_t job_id, const std::string& owner);

}  // namespace tessera::server
