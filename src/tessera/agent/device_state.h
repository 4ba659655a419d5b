#pragma once
// The node agent's device plugin logic, apart from gRPC: which device IDs each resource advertises
// and their health, the preferred allocation (the scheduler's topology choice), what Allocate
// answers (CDI names, visible devices, and for shares the intercept library with its limits), and
// the checkpoint of allocations that survives an agent restart. Thread-safe.
//
// Resources (docs/kubernetes.md): `tessera.io/gpu`, one device per GPU (ID = the GPU's UUID), and
// `tessera.io/gpu-share`, `shares_per_gpu` devices per GPU (ID = "<UUID>::<k>"). Every ID maps back
// to one physical GPU. A GPU given whole is not given in shares at the same time, nor the other way
// round: its devices of the other resource are reported Unhealthy while it is in use, and Allocate
// refuses a mix.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "tessera/agent/change_feed.h"
#include "tessera/core/clock.h"
#include "tessera/core/gpu.h"
#include "tessera/core/mutex.h"
#include "tessera/core/request.h"
#include "tessera/devices/cdi.h"
#include "tessera/devices/mps.h"
#include "tessera/shim/region.h"

namespace tessera::agent {

inline constexpr char kGpuResource[] = "tessera.io/gpu";
inline constexpr char kShareResource[] = "tessera.io/gpu-share";

enum class Resource { kGpu, kShare };
std::string_view ResourceName(Resource r);

// Where the intercept library and the shared files are inside every container given shares.
inline constexpr char kContainerShim[] = "/usr/local/lib/tessera/libtessera-cuda.so";
inline constexpr char kContainerRegion[] = "/var/run/tessera/region";
inline constexpr char kContainerArbiter[] = "/var/run/tessera/gpu.arbiter";
// Where an MPS client's container finds its GPU's control daemon (CUDA_MPS_PIPE_DIRECTORY).
inline constexpr char kContainerMpsPipe[] = "/var/run/tessera/mps";

struct PluginOptions {
  int shares_per_gpu = 10;  // 1..100
  // Checkpoint, shared regions and the arbiter live here (created 0711).
  std::string state_dir;
  // The intercept library on the host, mounted into containers given shares. Empty: no share
  // resource is served.
  std::string shim_library;
  int default_priority = 0;           // TESSERA_CUDA_PRIORITY of a share without a pod annotation
  devices::DriverFiles driver_files;  // device nodes handed over as DeviceSpecs, when they exist
  // Wall time: when an allocation was made (its checkpoint record, the release grace). Null: the
  // system's. Must outlive the state.
  const core::Clock* clock = nullptr;
  // The GPUs in MPS mode and their control daemons (the agent runs them); null: none. A share of
  // one is a client of its daemon (ShareEdits). Must outlive the state.
  const devices::MpsDaemons* mps = nullptr;
  // The host folder that is the daemons' /dev/shm (MPS's server and clients meet there), mounted
  // at /dev/shm in their clients' containers.
  std::string mps_shm_dir = "/dev/shm";
};

// Wall time in whole seconds from `clock` (PluginOptions::clock; null: the system's).
int64_t UnixSeconds(const core::Clock* clock);

// Whether GPU `g` is in MPS mode, and its mode.
inline bool IsMps(const PluginOptions& o, int g) { return o.mps != nullptr && o.mps->Has(g); }
inline core::GpuSharing SharingOf(const PluginOptions& o, int g) {
  return IsMps(o, g) ? core::GpuSharing::kMps : core::GpuSharing::kTimeSlice;
}

// What the scheduler extender chose for a pod (its annotations), when there is such a pod.
struct PodHint {
  std::string pod_namespace;
  std::string pod_name;
  std::vector<std::string> gpus;   // UUIDs, for whole GPUs or for the GPU(s) of a share
  std::optional<uint64_t> memory;  // bytes per GPU, for shares
  std::optional<int> priority;     // for shares
  std::string pod_uid;             // with container_index, what Allocate marks as done
  int container_index = -1;        // into the pod's tessera.io/assignment containers
  // A gang member with shares: its gang and the GPUs (UUIDs) of the gang's shares on this node.
  std::string gang;
  std::vector<std::string> gang_gpus;
};

// One container's allocation, as the checkpoint keeps it.
struct Allocation {
  std::string id;  // "a<number>", names the region file too
  Resource resource = Resource::kGpu;
  std::vector<std::string> device_ids;  // sorted
  std::vector<std::string> gpus;        // UUIDs, in container ordinal order
  std::string region;                   // host path of the shared region; shares only
  std::string pod;                      // "namespace/name" when the extender named it
  int64_t created_unix = 0;
  // A share's job at the GPU arbiter (TESSERA_JOB_ID) when it is not `id`: a gang's, whose time
  // slices on this node are charged to the gang, not to this pod alone.
  std::string arbiter_job;
};

class DeviceState {
 public:
  // Loads the checkpoint from `options.state_dir` (kept allocations whose GPUs are still here) and
  // prepares the folder. kInvalidArgument for bad options, kFailedPrecondition when the folder or
  // the checkpoint cannot be read. A checkpoint that reads but cannot be used (truncated, garbled,
  // another version) is set aside (set_aside() names where) and the state starts empty: the
  // kubelet keeps which device IDs each pod holds.
  static absl::StatusOr<std::unique_ptr<DeviceState>> Create(core::NodeInventory inventory,
                                                             PluginOptions options);

  const core::NodeInventory& inventory() const { return inventory_; }
  const PluginOptions& options() const { return options_; }
  bool serves(Resource r) const { return r == Resource::kGpu || !options_.shim_library.empty(); }

  // The devices of resource `r` as ListAndWatch sends them.
  v1beta1::ListAndWatchResponse List(Resource r) const;
  // Bumped on every change a ListAndWatch stream must send.
  uint64_t generation() const;
  // Waits until generation() differs from `seen`, `timeout` passes or Shutdown; returns
  // generation().
  uint64_t WaitForChange(uint64_t seen, std::chrono::milliseconds timeout) const;
  void Shutdown();

  // Health from the watch. Returns whether it changed.
  bool SetHealth(int gpu, bool healthy, const std::string& reason);
  bool healthy(int gpu) const;

  // GetPreferredAllocation. kInvalidArgument naming a bad ID or size.
  absl::StatusOr<v1beta1::PreferredAllocationResponse> Preferred(
      Resource r, const v1beta1::PreferredAllocationRequest& request,
      const PodHint* hint = nullptr) const;

  // Allocate. Every container request is checked before anything changes: kInvalidArgument for an
  // unknown or repeated ID, an ID of another resource, more IDs than the node has; kUnavailable for
  // an unhealthy GPU; kFailedPrecondition when a GPU is in use by the other resource, or when
  // `hint` names GPUs that the kubelet's IDs disagree with. The checkpoint is written before
  // answering.
  absl::StatusOr<v1beta1::AllocateResponse> Allocate(Resource r,
                                                     const v1beta1::AllocateRequest& request,
                                                     const PodHint* hint = nullptr);

  // Forgets the allocations made before `made_before_unix` none of whose IDs is in `in_use` (what
  // the kubelet's PodResources says live pods hold): their regions are removed and their GPUs free
  // for the other resource. A young allocation is kept: the kubelet records it only after Allocate
  // answers. Returns how many were released.
  int Release(const std::set<std::string>& in_use, int64_t made_before_unix);
  // Called (outside the state's lock) for each allocation Release forgets, with what its region
  // said of it at the end (limits, peaks: null for whole GPUs or an unreadable region). Set once,
  // before serving.
  // An ended allocation, its region's head (null: none, or unreadable) and the kernel launches
  // its processes counted (ReadRegionLaunches; 0: none).
  using ReleaseHook = std::function<void(const Allocation&, const shim::RegionData*, uint64_t)>;
  void OnRelease(ReleaseHook hook) { on_release_ = std::move(hook); }

  std::vector<Allocation> Allocations() const;
  // The GPU index an advertised ID belongs to; nullopt for an unknown ID.
  std::optional<int> GpuOf(const std::string& device_id, Resource* resource = nullptr) const;
  // A share allocation's GPUs (their indices, in `a.gpus`' order) and how many of its device IDs
  // are on each: n of shares_per_gpu is its share of that GPU.
  std::vector<std::pair<int, int>> SharesOnGpus(const Allocation& a) const;
  // Where the shares' GPU arbiter file is (agent.cc makes it; ShareEdits mounts it).
  std::string arbiter_path() const { return ArbiterPath(options_); }
  static std::string ArbiterPath(const PluginOptions& o) { return o.state_dir + "/gpu.arbiter"; }
  std::string checkpoint_path() const { return options_.state_dir + "/checkpoint.json"; }
  // Where an unusable checkpoint was moved at start; empty when it was fine.
  std::string set_aside() const;

 private:
  DeviceState(core::NodeInventory inventory, PluginOptions options);
  absl::Status Load();
  absl::Status SaveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether GPU `g` is held by an allocation of the resource other than `r`.
  bool HeldByOtherLocked(int g, Resource r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateOneLocked(
      Resource r, const std::vector<std::string>& ids, const PodHint* hint,
      std::vector<Allocation>& made) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const core::NodeInventory inventory_;
  const PluginOptions options_;
  std::map<std::string, int> by_uuid_;

  mutable core::Mutex mu_;
  ChangeFeed feed_;  // bumped under mu_
  std::vector<bool> healthy_ ABSL_GUARDED_BY(mu_);
  std::vector<Allocation> allocations_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::string set_aside_ ABSL_GUARDED_BY(mu_);
  ReleaseHook on_release_;
};

}  // namespace tessera::agent
