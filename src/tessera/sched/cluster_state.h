#pragma once
// ClusterState: the scheduling model of a cluster. Nodes (static NodeSpec + what is allocated on
// them), live allocations, and the partition of nodes into classes of identical state: two nodes in
// one class have the same shape and the same free resources, so every policy scores them alike.
// Policies score classes, not nodes, which keeps exact placement fast on large clusters. Not
// thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/core/request.h"

namespace tessera::sched {

using NodeId = int32_t;
using ClassId = int32_t;
using ShapeId = int32_t;

// What does not change about a node: capacities, GPU kinds and links. Nodes of one shape share it.
struct NodeShape {
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  std::vector<core::NodeGpu> gpus;  // uuid cleared: the shape is about kinds, not identities
  core::Topology topology;
  // GPU kinds: distinct (model, memory, compute capability, NUMA node); gpu_kind[i] indexes them.
  std::vector<core::NodeGpu> kinds;
  std::vector<uint16_t> gpu_kind;
  // True when GPU positions matter (links or NUMA differ between GPUs, or some GPU is shared by
  // MPS): class keys then keep GPUs in index order instead of sorting them.
  bool positional = false;
  // Whether any GPU is in MPS mode: class keys then carry whose MPS clients hold each GPU.
  bool has_mps = false;
};

// What is allocated on one GPU.
struct GpuUse {
  int32_t milli = 0;       // compute, thousandths
  int64_t memory_mib = 0;  // GPU memory
  int32_t holders = 0;     // allocations on it
  int32_t util_pct = 0;    // its shares' predicted utilization, summed (Request::expected_util_pct)
  bool healthy = true;
  // MPS clients on it: how many allocations, and their owner's MpsUserKey (0: none).
  int32_t mps_holders = 0;
  uint64_t mps_user = 0;
  friend bool operator==(const GpuUse&, const GpuUse&) = default;
};

// An owner as the class keys carry the user of an MPS GPU: a 64-bit hash, never 0.
uint64_t MpsUserKey(const std::string& owner);
// Whether a request may go on a GPU whose MPS clients are `mps_user`'s: none there, or its own
// owner's (only a request in MPS mode is limited).
inline bool MpsUserAllows(uint64_t mps_user, const core::Request& r) {
  return mps_user == 0 || !r.mps() || mps_user == MpsUserKey(r.owner);
}

// An allocation tag by size, for policies that cluster alike work (GPU clustering).
int AffinityTag(const core::Request& r);  // 0 none, 1 share, 2.. = 1 + whole GPU count (capped)
inline constexpr int kAffinityTags = 11;

struct Allocation {
  std::string id;
  NodeId node = -1;
  std::vector<int> gpus;      // GPU indices on the node
  int32_t milli_per_gpu = 0;  // 1000 for whole GPUs
  int64_t memory_mib_per_gpu = 0;
  core::Request request;
  double start_time = 0;  // caller's clock, seconds
  bool borrowed = false;  // placed on quota borrowed from other owners (reclaimable)
  // GPUs an elastic request grew onto (sched::Engine): any queued request that can use them takes
  // them back, whatever its priority or owner (the request holding them shrinks).
  bool reclaimable = false;
};

// A class of nodes in identical state, decoded for policies.
struct ClassGpu {
  uint16_t kind = 0;
  bool healthy = true;
  int32_t milli_left = 0;
  int64_t memory_left_mib = 0;
  int32_t util_pct = 0;   // GpuUse::util_pct, capped at 255
  uint64_t mps_user = 0;  // GpuUse::mps_user
};

class ClusterState {
 public:
  ClusterState() = default;
  ClusterState(const ClusterState&) = default;
  ClusterState& operator=(const ClusterState&) = default;

  // Adds a node; kInvalidArgument for a duplicate name, negative capacity or a topology whose size
  // does not match the GPU count.
  absl::StatusOr<NodeId> AddNode(core::NodeSpec spec);

  // Takes a node out of the model: its allocations are removed (and returned, for the caller to
  // requeue or forget) and its name may be added again (as a new node with a new id; a node whose
  // GPUs changed is removed and added). kNotFound for an unknown or removed node.
  absl::StatusOr<std::vector<Allocation>> RemoveNode(NodeId n);

  // Node ids run 0..node_count()-1, removed nodes included (node_live false: no GPUs, no class,
  // found by no name).
  int node_count() const { return static_cast<int>(nodes_.size()); }
  bool node_live(NodeId n) const { return nodes_[n].cls >= 0; }
  int live_node_count() const { return node_count() - removed_; }
  const std::string& node_name(NodeId n) const { return nodes_[n].name; }
  const core::NodeSpec& node_spec(NodeId n) const { return nodes_[n].spec; }
  const NodeShape& shape(ShapeId s) const { return shapes_[s]; }
  ShapeId node_shape(NodeId n) const { return nodes_[n].shape; }
  int64_t cpu_used(NodeId n) const { return nodes_[n].cpu_used; }
  int64_t memory_used(NodeId n) const { return nodes_[n].memory_used; }
  const GpuUse& gpu_use(NodeId n, int gpu) const { return gpu_uses_[nodes_[n].gpu_offset + gpu]; }
  int gpu_count(NodeId n) const { return static_cast<int>(nodes_[n].spec.gpus.size()); }
  // Node by name, -1 if none.
  NodeId FindNode(const std::string& name) const;

  // Records `a` (its request's resources on a.node and a.gpus). kInvalidArgument if the id is taken
  // or the resources do not fit: nothing changes then.
  absl::Status Apply(Allocation a);
  // Removes an allocation and gives its resources back; kNotFound if there is none with that id.
  absl::StatusOr<Allocation> Remove(const std::string& id);
  const Allocation* Find(const std::string& id) const;
  const std::unordered_map<std::string, Allocation>& allocations() const { return allocations_; }
  // Allocations on one node, in no particular order.
  std::vector<const Allocation*> AllocationsOn(NodeId n) const;
  // Whether any preemptible allocation has a priority below `priority`; whether any preemptible
  // one is on borrowed quota (kept as allocations come and go: a preemption planner's first
  // question, which a scan of every allocation answered slowly in a full cluster).
  bool AnyPreemptibleBelow(int priority) const {
    return !preemptible_by_priority_.empty() && preemptible_by_priority_.begin()->first < priority;
  }
  bool AnyBorrowedPreemptible() const { return borrowed_preemptible_ > 0; }

  // Marks a GPU sick or well. A sick GPU takes no new work; what runs on it stays accounted.
  absl::Status SetGpuHealth(NodeId n, int gpu, bool healthy);

  // Classes of identical nodes. live_classes() lists those with members (order is deterministic).
  const std::vector<ClassId>& live_classes() const { return live_; }
  const std::vector<NodeId>& class_members(ClassId c) const { return classes_[c].members; }
  ShapeId class_shape(ClassId c) const { return classes_[c].shape; }
  int64_t class_cpu_left(ClassId c) const { return classes_[c].cpu_left; }
  int64_t class_memory_left(ClassId c) const { return classes_[c].memory_left; }
  uint16_t class_tags(ClassId c) const { return classes_[c].tags; }
  const std::vector<ClassGpu>& class_gpus(ClassId c) const { return classes_[c].gpus; }
  ClassId node_class(NodeId n) const { return nodes_[n].cls; }
  // Generation of a class id: bumped when an emptied class id is reused for another state, so
  // caches keyed by class id can tell a stale entry.
  uint32_t class_generation(ClassId c) const { return generations_[c]; }
  // Log of class ids whose membership changed (or that were reused), for incremental consumers.
  // Entry i of the log has sequence number change_base() + i. The log is bounded: when it grows
  // past a few times the class count it is dropped and change_base() moves on, so a consumer whose
  // cursor is behind change_base() must rescan every class.
  const std::vector<ClassId>& class_changes() const { return changes_; }
  uint64_t change_base() const { return change_base_; }
  // Members per class id (0 for a dead class), for scans in class-id order.
  const std::vector<int32_t>& class_sizes() const { return sizes_; }
  int class_capacity() const { return static_cast<int>(classes_.size()); }

  // Maps a choice of GPU positions in a class's GPU order to GPU indices of node `n` in that class.
  std::vector<int> GpusForPositions(NodeId n, const std::vector<int>& positions) const;

  // Bytes of model memory per node (specs excluded), for benchmarks.
  size_t ApproxBytesPerNode() const;

 private:
  struct Node {
    std::string name;
    core::NodeSpec spec;
    ShapeId shape = 0;
    int64_t cpu_used = 0;
    int64_t memory_used = 0;
    int32_t gpu_offset = 0;
    uint16_t tag_counts[kAffinityTags] = {};
    ClassId cls = -1;
    int32_t pos_in_class = -1;
  };
  struct Class {
    std::vector<uint64_t> key;
    ShapeId shape = 0;
    int64_t cpu_left = 0;
    int64_t memory_left = 0;
    uint16_t tags = 0;
    std::vector<ClassGpu> gpus;
    std::vector<NodeId> members;
    int32_t live_pos = -1;
  };
  struct KeyHash {
    size_t operator()(const std::vector<uint64_t>& k) const;
  };

  std::vector<uint64_t> KeyOf(NodeId n) const;
  // GPU order of node n in its class key: position -> GPU index.
  std::vector<int> GpuOrder(NodeId n) const;
  void Reclassify(NodeId n);
  void Unclassify(NodeId n);  // out of its class (the class dies when it was its last member)
  ShapeId InternShape(const core::NodeSpec& spec);

  std::vector<Node> nodes_;
  int removed_ = 0;
  std::vector<GpuUse> gpu_uses_;
  std::vector<NodeShape> shapes_;
  std::unordered_map<std::string, NodeId> by_name_;
  std::unordered_map<std::string, Allocation> allocations_;
  std::vector<std::vector<std::string>> node_allocs_;
  std::map<int, int64_t> preemptible_by_priority_;  // preemptible allocations by priority
  int64_t borrowed_preemptible_ = 0;

  std::vector<Class> classes_;
  std::unordered_map<std::vector<uint64_t>, ClassId, KeyHash> class_index_;
  std::vector<ClassId> live_;
  std::vector<ClassId> free_classes_;
  std::vector<uint32_t> generations_;
  std::vector<ClassId> changes_;
  uint64_t change_base_ = 0;
  std::vector<int32_t> sizes_;
  void LogChange(ClassId c);
};

}  // namespace tessera::sched
