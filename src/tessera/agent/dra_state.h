#pragma once
// The DRA driver's node logic, apart from gRPC and the API server: the devices this node publishes
// (dra_slices.h turns them into ResourceSlices), and what preparing a ResourceClaim allocated to
// them means - a CDI spec of the claim's own (tessera.io/claim=<uid>-<request>) with the
// environment and mounts of each request, beside the node's GPU spec (tessera.io/gpu=<uuid>), and
// for shares the intercept library with its limits (share_edits.h). Prepared claims are kept in a
// checkpoint in the plugin's folder, so that preparing again after a restart of the agent or the
// kubelet answers the same CDI IDs, and unpreparing finds what to remove. Thread-safe.
//
// Devices: "gpu-<index>", one per GPU given whole; "gpu-<index>-share-<k>", shares_per_gpu per GPU
// given in shares (DraOptions::share_gpus). A GPU is published one way or the other, never both, so
// that kube-scheduler, which does not know they overlap, cannot give it twice - unless the devices
// are partitionable (DraOptions::partitionable): then every GPU is published both ways and a
// counter set per GPU tells kube-scheduler they overlap.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/agent/change_feed.h"
#include "tessera/agent/device_state.h"
#include "tessera/core/gpu.h"
#include "tessera/core/mutex.h"

namespace tessera::agent {

inline constexpr char kDraDriver[] = "gpu.tessera.io";
inline constexpr char kCdiClaimKind[] = "tessera.io/claim";

struct DraOptions {
  std::string driver = kDraDriver;
  std::string pool;          // the node's name: one pool per node
  std::string dir;           // the checkpoint's folder: <kubelet>/plugins/<driver>
  std::string cdi_dir;       // where claims' CDI specs are written
  std::set<int> share_gpus;  // GPU indices published as shares (needs the intercept library)
  // Every GPU published both whole and in shares, the two tied by a counter set per GPU (its
  // memory and its shares) so that kube-scheduler gives a GPU one way or the other
  // (partitionable devices: the DRAPartitionableDevices feature gate of the API server and
  // kube-scheduler must be on, else the API server drops the counters). Excludes share_gpus.
  bool partitionable = false;
  // Every GPU one device that several claims may share (allowMultipleAllocations), each taking an
  // amount of its capacities `memory` and `compute` (percent): the amounts become the share's
  // memory limit and compute share (consumable capacity: the DRAConsumableCapacity feature gate
  // must be on). A claim that asks no amount takes the whole GPU. Excludes the two above.
  bool consumable = false;
};

struct DraDevice {
  std::string name;  // "gpu-0", "gpu-0-share-3"
  int gpu = 0;
  bool share = false;
};

// One device of a prepared claim, as NodePrepareResources answers it.
struct PreparedDevice {
  std::vector<std::string> requests;  // the claim's request names it serves (no subrequest part)
  std::string pool;
  std::string device;
  std::vector<std::string> cdi_ids;
  std::string share_id;  // the allocation's shareID (a consumable device's), else empty

  friend bool operator==(const PreparedDevice&, const PreparedDevice&) = default;
};

class DraState {
 public:
  // Loads the checkpoint from options.dir (created 0700 when missing) and writes again the CDI
  // spec and regions of every prepared claim that lacks them (after a reboot the CDI folder is
  // empty). kInvalidArgument for bad options (a share GPU not on the node, shares without the
  // intercept library), kFailedPrecondition naming the file for a checkpoint that cannot be read.
  // A checkpoint that reads but cannot be used (truncated, garbled, another version) is set aside
  // (set_aside() names where) and the state starts empty, to be rebuilt from the API server.
  static absl::StatusOr<std::unique_ptr<DraState>> Create(core::NodeInventory inventory,
                                                          PluginOptions plugin, DraOptions options);
  ~DraState();
  DraState(const DraState&) = delete;
  DraState& operator=(const DraState&) = delete;

  const core::NodeInventory& inventory() const { return inventory_; }
  const DraOptions& options() const { return options_; }
  const PluginOptions& plugin_options() const { return plugin_; }
  const std::vector<DraDevice>& devices() const { return devices_; }
  std::optional<DraDevice> Find(const std::string& name) const;

  // What an earlier Prepare of claim `uid` answered (kept across restarts); nullopt if none.
  std::optional<std::vector<PreparedDevice>> Prepared(const std::string& uid) const;
  // The same, once its CDI spec and regions are there again (written from the checkpoint when
  // missing); nullopt when it was never prepared, or its files cannot be made again from what
  // the checkpoint has (then Prepare it from the claim).
  std::optional<std::vector<PreparedDevice>> PreparedAndPresent(const std::string& uid);
  // Prepares claim `uid` from its resource.k8s.io/v1 object as read from the API server: only the
  // allocation results of this driver count. kFailedPrecondition when the object is another claim
  // (UID), is not allocated, names another pool, or a device given to another claim; kNotFound
  // for a device this node does not publish; kUnavailable for an unhealthy GPU; kInvalidArgument
  // for an opaque configuration this driver cannot read. Nothing is kept when it fails.
  absl::StatusOr<std::vector<PreparedDevice>> Prepare(const std::string& ns,
                                                      const std::string& name,
                                                      const std::string& uid,
                                                      const nlohmann::json& claim);
  // Removes the claim's CDI spec and regions and forgets it; a claim never prepared is OK.
  absl::Status Unprepare(const std::string& uid);
  // What a share request of an unprepared claim used, read from its region before it is removed:
  // the claim, the request, its GPUs' UUIDs (in the region's device order) and the region's head
  // (limits, peaks, refusals; null when it could not be read).
  struct ShareUse {
    std::string ns, name, request;
    std::vector<std::string> pods;  // the pods it was reserved for at prepare (its namespace's)
    bool auto_memory = false;       // its claim asked tessera.io/gpu-memory "auto" (the extender's)
    std::vector<std::string> gpus;
    std::unique_ptr<shim::RegionData> head;
    // Its GPU time: its GPUs' physical indices (the arbiter's), its compute share of each (0..1),
    // the key the arbiter charges it under, how long it was prepared (seconds; -1: not known - a
    // claim of an earlier agent's checkpoint), and whether it was paced in time slices (none of
    // its GPUs in MPS mode).
    std::vector<int> indices;
    double share = 0;
    std::string arbiter_job;
    double held_s = -1;
    bool sliced = false;
  };
  // The arbiter the claims' shares are paced by (the device plugin's).
  std::string arbiter_path() const;
  // Called by Unprepare, after the claim is forgotten, with each of its share requests' use.
  void OnUnprepare(std::function<void(const std::vector<ShareUse>&)> hook);
  std::vector<std::string> PreparedClaims() const;
  // The jobs (TESSERA_JOB_ID) the prepared claims' shares are paced as at the arbiter.
  std::vector<std::string> ArbiterJobs() const;

  // Health from the watch. Returns whether it changed.
  bool SetHealth(int gpu, bool healthy, const std::string& reason);
  bool healthy(int gpu) const;
  std::string health_reason(int gpu) const;
  // Bumped on every health change; WaitForChange as DeviceState's.
  uint64_t generation() const;
  uint64_t WaitForChange(uint64_t seen, std::chrono::milliseconds timeout) const;
  void Shutdown();

  std::string checkpoint_path() const { return options_.dir + "/checkpoint.json"; }
  // Where an unusable checkpoint was moved at start; empty when it was fine.
  std::string set_aside() const;
  std::string CdiSpecPath(const std::string& uid) const;
  // Where a share request's region is: its limits at prepare, what it used at unprepare.
  std::string RegionPath(const std::string& uid, const std::string& request) const;

  struct Claim;
  struct ClaimAllocation;
  struct Consumed;
  struct RequestConfig;

 private:
  // Prepare's steps: the claim's allocation of this driver's devices (kFailedPrecondition,
  // kNotFound, kInvalidArgument as Prepare says); each device checked against what is prepared;
  // the regions, CDI spec and checkpoint written (nothing kept when one fails).
  absl::StatusOr<ClaimAllocation> ReadAllocation(const std::string& who,
                                                 const nlohmann::json& claim) const;
  absl::Status CheckLocked(const std::string& who, const ClaimAllocation& a) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<PreparedDevice>> WriteLocked(const std::string& ns,
                                                          const std::string& name,
                                                          const std::string& uid,
                                                          const ClaimAllocation& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The namespace of a prepared claim other than `except_uid` with a device on GPU `gpu` (whose
  // MPS server then runs that namespace's clients); empty when none.
  std::string MpsNamespaceLocked(int gpu, const std::string& except_uid) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  DraState(core::NodeInventory inventory, PluginOptions plugin, DraOptions options);
  absl::Status Load();
  absl::Status SaveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The claim's CDI spec and regions as the checkpoint has them, written where missing or changed.
  absl::Status RestoreFilesLocked(const std::string& uid, const Claim& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const core::NodeInventory inventory_;
  const PluginOptions plugin_;
  const DraOptions options_;
  std::vector<DraDevice> devices_;
  std::map<std::string, int> by_name_;  // into devices_

  mutable core::Mutex mu_;
  ChangeFeed feed_;  // bumped under mu_
  std::vector<bool> healthy_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> reasons_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Claim>> claims_ ABSL_GUARDED_BY(mu_);  // by UID
  std::string set_aside_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::vector<ShareUse>&)> on_unprepare_;  // set before use
};

}  // namespace tessera::agent
