#pragma once
// The launch plan: what a job is given when it starts on this machine, decided under the
// dispatcher's lock from the job, the engine's allocation and the server's setup, and carried out
// without it (SchedulingLoop::ExecuteLaunch, through the JobHost):
// - its placement (its GPUs by index, UUID and model; a share's milli and MiB per GPU), stored
//   with its start;
// - its LaunchSpec: command, environment (its own, then the names a batch script written for
//   Slurm reads: the job's id and name, its submit folder, its array's), its logs or its user's
//   output files, one process per task with the ranks torchrun, NCCL and MPI read, its GPUs;
// - a share's limits: its region, the arbiter, GPU memory and compute share, priority, the context
//   overhead;
// - the uid and gid it runs as when the server runs as root (its owner's own, looked up now);
// - its cgroup's limits when jobs are confined: the device nodes every process needs, the
//   driver's control nodes, its own GPUs' nodes; memory, CPU and pids;
// - why it must not run, when so: a container on a server without podman, a root job where
//   allow_root_jobs is off, an account that cannot be looked up.
// No I/O but the account's lookup and a free loopback port for a job of several tasks
// (launch_plan_test.cc checks plans alone).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/mps.h"
#include "tessera/sched/engine.h"
#include "tessera/server/admission.h"
#include "tessera/server/cgroup.h"
#include "tessera/server/runner.h"
#include "tessera/server/running_jobs.h"
#include "tessera/server/server.h"

namespace tessera::server {

// What of the server a plan reads; fixed once the server is set up.
struct LaunchSetup {
  const ServerConfig* config = nullptr;
  const core::NodeInventory* inventory = nullptr;
  const core::NodeSpec* node = nullptr;
  std::string hostname;
  std::string arbiter_file;
  bool confines = false;       // jobs get cgroups (JobHost::confines)
  bool containers = false;     // podman is there
  std::string containers_off;  // why not
  const devices::MpsDaemons* mps =
      nullptr;  // the GPUs in MPS mode and their daemons' pipes; null: none
};

// Where process `task` of a job writes its stdout (err false) or stderr when its spec names files
// of the user's (JobSpec::stdout_file): the expanded pattern; empty: the server's logs.
std::string OutputFilePath(const LaunchSetup& setup, int64_t id, int64_t array_id, int array_index,
                           const std::string& owner, const JobSpec& spec, int task, bool err);

// What is tracked of a running job from its spec (a fractional job on a GPU gets a region).
RunningJob NewRunningJob(const ServerConfig& config, int64_t id, const JobSpec& spec,
                         std::vector<int> gpus, double started);

struct LaunchPlan {
  LaunchSpec spec;
  RunningJob run;
  std::string where, placement_json;
  std::optional<CgroupLimits> limits;  // its cgroup, when jobs get one
  absl::Status refused;                // why it must not run
};
LaunchPlan PlanLaunch(const LaunchSetup& setup, const QueuedJob& q, const sched::Allocation& a,
                      double now);

}  // namespace tessera::server
