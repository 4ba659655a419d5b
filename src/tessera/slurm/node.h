#pragma once
// What `tessera slurm` reads of the plugin's node files (step.h): the accounting of ended jobs,
// and the running jobs' use as Prometheus metrics (the server's per-job names, with the Slurm job
// id), for `tessera slurm acct` and `tessera slurm exporter`.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tessera::slurm {

// The accounting records in <state_dir>/acct (acct/<job>.json), oldest job first; only `jobs`
// when not empty (a job with no record is an error naming it). A record that is not one is an
// error naming the file.
absl::StatusOr<std::vector<nlohmann::json>> ReadAccounting(const std::string& state_dir,
                                                           const std::vector<uint32_t>& jobs);

// The running jobs' page: per job and GPU its compute share, memory limit, memory in use and GPU
// time charged (labels job_id "slurm-<id>", slurm_job_id, user, gpu, hostname: the server's names),
// and whether its region reads as one. Records of jobs started before `boot_time` (BootTime(); 0:
// not checked) are an earlier boot's leftovers, not running jobs: left out, and counted.
std::string NodeMetrics(const std::string& state_dir, const std::string& hostname,
                        int64_t boot_time = 0);

}  // namespace tessera::slurm
