#pragma once
// What a container given a share of GPUs needs, whichever kubelet API gave it (the device plugin's
// Allocate answer or a DRA claim's CDI spec): the intercept library preloaded with its memory
// limits, compute share and priority, the shared region file (created here), and the arbiter that
// paces every share on the node. One place, so both paths enforce the same limits.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tessera/core/gpu.h"

namespace tessera::agent {

struct PluginOptions;

struct ContainerMount {
  std::string host_path;
  std::string container_path;
  bool read_only = true;
};

struct ContainerEdits {
  std::map<std::string, std::string> env;
  std::vector<ContainerMount> mounts;
};

struct ShareRequest {
  std::vector<int> gpus;         // physical indices, in container ordinal order
  std::vector<uint64_t> limits;  // memory bytes per GPU, same order
  double share = 1;              // compute share, 0..1
  int priority = 0;
  std::string job_id;  // TESSERA_JOB_ID: the arbiter tells jobs apart by it
  std::string region;  // host path of the region file to create
  std::string gang;    // a gang's ID, with the physical GPUs of its shares on this node
  std::vector<int> gang_gpus;
};

// A share's region file at `path` with one memory limit per GPU, mode 0666 (the container's user
// is not known); created when missing (an existing one is kept, with what it counts). kInternal
// naming the file when it cannot be.
absl::Status MakeShareRegion(const std::string& path, const std::vector<uint64_t>& limits);

// Creates the region file (MakeShareRegion) and fills `out` with the
// environment and mounts. kInternal naming the region file when it cannot be created. A share of a
// GPU in MPS mode (IsMps) is a client of its daemon (MpsEdits) instead of being paced at the
// arbiter; the library's memory accounting stays on. kFailedPrecondition for a share of several
// GPUs any of which is in MPS mode: a process is the client of one MPS server, which has one GPU.
absl::Status ShareEdits(const ShareRequest& request, const core::NodeInventory& inventory,
                        const PluginOptions& options, ContainerEdits* out);

// What makes a container's processes clients of GPU `gpu`'s MPS daemon, with `share` (0..1) of its
// SMs, `memory` bytes of pinned memory (0: no limit) and `priority` (negative: below normal): the
// pipe folder and the daemons' /dev/shm mounted, MPS's environment (devices::MpsClientEnv).
void MpsEdits(int gpu, double share, uint64_t memory, int priority, const PluginOptions& options,
              ContainerEdits* out);

}  // namespace tessera::agent
