#include "tessera/agent/share_edits.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <set>

#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/agent/device_state.h"
#include "tessera/shim/region.h"

namespace tessera::agent {

absl::Status MakeShareRegion(const std::string& path, const std::vector<uint64_t>& limits) {
  char err[256] = "";
  if (!shim::CreateRegionFile(path.c_str(), limits.data(), static_cast<int>(limits.size()), err,
                              sizeof err)) {
    return absl::InternalError(fmt::format("shared region {}: {}", path, err));
  }
  // The container's processes run as a user the agent does not know.
  chmod(path.c_str(), 0666);
  return absl::OkStatus();
}

absl::Status ShareEdits(const ShareRequest& request, const core::NodeInventory& inventory,
                        const PluginOptions& options, ContainerEdits* out) {
  if (request.gpus.empty() || request.gpus.size() != request.limits.size()) {
    return absl::InvalidArgumentError("a share names no GPU, or not one limit per GPU");
  }
  const bool mps = IsMps(options, request.gpus[0]);
  for (int g : request.gpus) {
    if (request.gpus.size() == 1 || !IsMps(options, g)) continue;
    return absl::FailedPreconditionError(fmt::format(
        "a share of GPUs {} includes GPU {} in MPS mode: a process is the client of one GPU's "
        "MPS server, so an MPS share is of one GPU",
        absl::StrJoin(request.gpus, ","), g));
  }
  if (absl::Status st = MakeShareRegion(request.region, request.limits); !st.ok()) return st;
  std::vector<std::string> limit_text;
  for (size_t i = 0; i < request.limits.size(); ++i) {
    limit_text.push_back(fmt::format("{}:{}", i, request.limits[i]));
  }
  auto& env = out->env;
  env["LD_PRELOAD"] = kContainerShim;
  env["TESSERA_CUDA_MEM_LIMIT"] = absl::StrJoin(limit_text, ",");
  // In percent: a bare "1" (a whole GPU's share as a fraction) would read as 1%.
  env["TESSERA_CUDA_COMPUTE_SHARE"] = fmt::format("{:g}%", request.share * 100);
  env["TESSERA_CUDA_PRIORITY"] = std::to_string(request.priority);
  env["TESSERA_CUDA_REGION"] = kContainerRegion;
  // A pod's processes are in a pid namespace of their own: NVML does not show them to the
  // library, which cannot measure what its contexts take. The measured figure for the model.
  env["TESSERA_CUDA_CONTEXT_OVERHEAD"] =
      std::to_string(core::DefaultContextOverhead(inventory.gpus[request.gpus[0]].model));
  env["TESSERA_JOB_ID"] = request.job_id;
  // A gang's pods with shares on this node: one job at the arbiter, whose slices on all the
  // gang's GPUs here are granted together (its ranks wait for each other every step).
  if (!request.gang.empty() && request.gang_gpus.size() >= 2) {
    std::set<int> gang(request.gang_gpus.begin(), request.gang_gpus.end());
    bool holds = true;
    for (int g : request.gpus) holds = holds && gang.contains(g);
    if (holds) {
      env["TESSERA_JOB_ID"] = "gang:" + request.gang;
      env["TESSERA_CUDA_GANG_GPUS"] = absl::StrJoin(gang, ",");
    } else {
      spdlog::warn(
          "gang {} names GPUs {} that leave out the share's own {}; its shares are time-sliced "
          "on their own",
          request.gang, absl::StrJoin(gang, ","), absl::StrJoin(request.gpus, ","));
    }
  }
  out->mounts.push_back({options.shim_library, kContainerShim, true});
  out->mounts.push_back({request.region, kContainerRegion, false});
  if (mps) {
    // Its kernels run beside the other clients' on the SMs MPS gives it, not in time slices.
    MpsEdits(request.gpus[0], request.share, request.limits[0], request.priority, options, out);
    return absl::OkStatus();
  }
  const std::string arbiter = DeviceState::ArbiterPath(options);
  if (access(arbiter.c_str(), F_OK) == 0) {
    out->mounts.push_back({arbiter, kContainerArbiter, false});
    env["TESSERA_CUDA_ARBITER"] = kContainerArbiter;
    env["TESSERA_CUDA_ARBITER_GPUS"] = absl::StrJoin(request.gpus, ",");
  }
  return absl::OkStatus();
}

void MpsEdits(int gpu, double share, uint64_t memory, int priority, const PluginOptions& options,
              ContainerEdits* out) {
  const int milli = static_cast<int>(std::lround(share * 1000));
  for (const auto& [k, v] :
       devices::MpsClientEnv(kContainerMpsPipe, milli < 1000 ? milli : 0,
                             static_cast<int64_t>(memory >> 20), 1, priority)) {
    out->env[k] = v;
  }
  out->mounts.push_back({options.mps->PipeDir(gpu), kContainerMpsPipe, false});
  out->mounts.push_back({options.mps_shm_dir, "/dev/shm", false});
}

}  // namespace tessera::agent
