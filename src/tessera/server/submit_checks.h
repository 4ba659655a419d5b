#pragma once
// What a submission must pass before it is stored, beside who may submit it (Rights, asked by the
// API): the server's limits (grace period, max runtime; the default runtime filled in), containers
// where podman is there, the machine's models (a part of a name, "H100", stands for the machine's
// models that have it), and whether the job could ever start here - GPUs that exist and match it,
// GPU memory, the machine's CPUs and memory, quotas that could never allow it. The errors carry
// their HTTP status (400) and name the field. Pure: submit_checks_test.cc checks them alone.

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "tessera/core/request.h"
#include "tessera/sched/quota.h"
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

}  // namespace tessera::server
