#pragma once
// What a submission must pass before it is stored, beside who may submit it (Rights, asked by the
// API): the server's limits (grace period, max runtime; the default runtime filled in), containers
// where podman is there, the machine's models (a part of a name, "H100", stands for the machine's
// models that have it), and whether the job could ever start here - GPUs that exist and match it,
// GPU memory, the machine's CPUs and memory, quotas that could never allow it. The errors carry
// their HTTP status (400) and name the field. Then what the server's state says: room on the
// state folder's disk (507), the user's caps on waiting jobs (429), dependencies that exist and can
// still be met. Pure but for the disk's free space: submit_checks_test.cc checks them alone.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tessera/core/request.h"
#include "tessera/sched/quota.h"
#include "tessera/server/admission.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/server.h"

namespace tessera::server {

struct SubmitSetup {
  const ServerConfig* config = nullptr;
  const core::NodeInventory* inventory = nullptr;
  bool containers = false;     // podman is there
  std::string containers_off;  // why not
};

// The server's limits and its models; `spec` gets the default runtime and its exact models.
absl::Status CheckSubmitLimits(JobSpec& spec, const SubmitSetup& setup);
// Whether `r` (the request made of `spec`) could ever start on `node` under `quotas`.
absl::Status CheckFits(const JobSpec& spec, const core::Request& r, const core::NodeSpec& node,
                       const sched::QuotaManager& quotas, size_t machine_gpus);

// Room on the state folder's disk: over limits.min_free_disk free, and its reserve for recording
// ends not given up (`disk_full`, JobEnds::disk_full). 507 otherwise.
absl::Status CheckDiskRoom(const ServerConfig& config, bool disk_full);
// An Idempotency-Key: at most 128 printable characters without spaces (400).
absl::Status CheckIdempotencyKey(const std::string& key);
// The user's caps on what waits (429): `waiting_jobs` jobs and `waiting_bytes` of specs now, with
// `jobs` jobs (an array's tasks each) and `bytes` more.
absl::Status CheckQueueRoom(const ServerConfig& config, const std::string& user,
                            size_t waiting_jobs, size_t jobs, uint64_t waiting_bytes,
                            uint64_t bytes);
// How a dependency stands (the dispatcher's Outcome), and whether a job (a task, when task >= 0)
// exists in the store.
struct DependencyLookup {
  std::function<absl::Status(int64_t job, int task)> exists;  // NotFound: no such job
  std::function<DependencyState(const Dependency&)> outcome;
};
// Each of `after` names a job submitted before (400: so dependencies never form a cycle) that can
// still turn out as asked (422).
absl::Status CheckDependencies(const std::vector<Dependency>& after, const DependencyLookup& look);

}  // namespace tessera::server
