#pragma once
// The contract between the scheduler extender and the node agent, written on Kubernetes objects
// (docs/kubernetes.md): the agent publishes its node's GPUs on the Node (annotation
// `tessera.io/gpus`), the extender records the GPUs it chose on the Pod (`tessera.io/assignment`),
// and the agent marks the containers it has allocated (`tessera.io/allocated`). Pure functions;
// the parsers take untrusted text (anyone allowed to edit a pod can write an annotation) and
// answer kInvalidArgument naming the field.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/gpu.h"
#include "tessera/core/request.h"

namespace tessera::kube {

inline constexpr char kNodeGpusAnnotation[] = "tessera.io/gpus";
inline constexpr char kAssignmentAnnotation[] = "tessera.io/assignment";
inline constexpr char kAllocatedAnnotation[] = "tessera.io/allocated";
// What an ended pod used of its GPUs, written on it by the agent that released them, read by the
// extender into the history that sizes pods asking `tessera.io/gpu-memory: auto`.
inline constexpr char kGpuUseAnnotation[] = "tessera.io/gpu-use";

// One container's GPUs as the extender chose them.
struct ContainerAssignment {
  std::string container;           // the container's name
  std::string resource;            // "tessera.io/gpu" or "tessera.io/gpu-share"
  std::vector<std::string> gpus;   // UUIDs: the whole GPUs, or the GPU(s) the shares are on
  int count = 0;                   // devices of `resource` the container requests
  std::optional<uint64_t> memory;  // shares: bytes of GPU memory per GPU
  std::optional<int> priority;     // shares: the time-slice priority
  friend bool operator==(const ContainerAssignment&, const ContainerAssignment&) = default;
};

struct Assignment {
  std::string node;
  int64_t assigned_unix_ms = 0;  // when the extender bound the pod; orders pending pods
  std::vector<ContainerAssignment> containers;
  // A gang member with shares: the gang ("namespace/group") and the GPUs its members' shares have
  // on this node, so that the node agent makes them one gang at the GPU arbiter (their time
  // slices granted together). Empty when the pod is in no gang or has no share.
  std::string gang;
  std::vector<std::string> gang_gpus;
  friend bool operator==(const Assignment&, const Assignment&) = default;
};

std::string FormatAssignment(const Assignment& a);
absl::StatusOr<Assignment> ParseAssignment(std::string_view text);

// `tessera.io/allocated`: the indices (into Assignment::containers) already allocated, "0,2".
std::string FormatAllocated(const std::set<int>& done);
absl::StatusOr<std::set<int>> ParseAllocated(std::string_view text);

// `tessera.io/gpu-use`: what a pod measured while it held its GPUs (per GPU; the largest of its
// GPUs where it had several). Each part is left out where it was not measured.
struct GpuUse {
  int64_t seconds = 0;                     // how long it held them
  std::optional<int64_t> busy_permille;    // its GPU time against that time, of one GPU (0..1000)
  std::optional<int64_t> peak_mib;         // the most GPU memory its processes held
  std::optional<int64_t> limit_mib;        // its memory limit (a share)
  std::optional<int64_t> refused;          // allocations its limit refused
  std::optional<int64_t> wanted_mib;       // the most it would have held had they been given
  std::optional<int64_t> kernel_launches;  // a share: the kernels its processes launched
  // A time-sliced share: how much of that time its launches waited for the GPU (another pod's
  // slices), 0..1000. Left out when they never did.
  std::optional<int64_t> held_back_permille;
  friend bool operator==(const GpuUse&, const GpuUse&) = default;
  // What it would have used of one GPU had its launches not waited (0..1000): its GPU time over
  // the time it ran as it wished (core::DemandPct); its busy share when never held back.
  std::optional<int64_t> WantedPermille() const;
};
std::string FormatGpuUse(const GpuUse& u);
absl::StatusOr<GpuUse> ParseGpuUse(std::string_view text);

// What a node has, for the extender: every GPU with its health, the links between them, and how
// many shares the agent divides a GPU into.
struct NodeGpus {
  core::NodeInventory inventory;
  std::vector<bool> healthy;
  int shares_per_gpu = 0;                 // 0: no share resource served
  std::vector<core::GpuSharing> sharing;  // per GPU ("sharing": "mps"); empty: all time-sliced
};

std::string FormatNodeGpus(const NodeGpus& n);
absl::StatusOr<NodeGpus> ParseNodeGpus(std::string_view text);

}  // namespace tessera::kube
