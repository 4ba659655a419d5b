#pragma once
// Kubernetes objects in the scheduling core's vocabulary, for the scheduler extender (issue 15):
// a Node (its allocatable CPU and memory, labels, and the GPUs its agent published in the
// `tessera.io/gpus` annotation) as a core::NodeSpec, and a Pod (its containers' requests of
// `tessera.io/gpu` / `tessera.io/gpu-share` and Tessera's annotations) as a core::Request plus
// the per-container split the assignment annotation needs. Pure functions over untrusted JSON:
// kInvalidArgument naming the object and the field.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/core/request.h"
#include "tessera/kube/quantity.h"
#include "tessera/sched/predictor.h"

namespace tessera::extender {

// The longest object name Kubernetes accepts (a DNS subdomain, RFC 1123).
inline constexpr size_t kMaxNameLength = 253;

using kube::ParseQuantity;

// Pod annotations the extender reads (docs/kubernetes.md).
inline constexpr char kGpuMemoryAnnotation[] = "tessera.io/gpu-memory";  // a share's memory
inline constexpr char kGpuModelAnnotation[] = "tessera.io/gpu-model";    // "A100,H100"
inline constexpr char kTopologyAnnotation[] = "tessera.io/topology";     // prefer-nvlink, ...
inline constexpr char kPreemptibleAnnotation[] = "tessera.io/preemptible";
inline constexpr char kGangAnnotation[] = "tessera.io/gang";
inline constexpr char kGangSizeAnnotation[] = "tessera.io/gang-size";
// A share's expected GPU utilization ("40%"), for the utilization ceiling (interference-aware
// sharing): set by whoever knows the workload (its owner, or a controller from its history).
inline constexpr char kGpuUtilizationAnnotation[] = "tessera.io/gpu-utilization";
// How its GPU is shared: "mps" (a share placed only on GPUs in MPS mode, one namespace's pods at a
// time on each) or "time-slice"; none: a share goes on a time-sliced GPU.
inline constexpr char kSharingAnnotation[] = "tessera.io/sharing";
inline constexpr char kPodGroupLabel[] = "scheduling.x-k8s.io/pod-group";
// A trial run ("2m"): the pod runs that long at most (the extender sets its
// spec.activeDeadlineSeconds as it binds it, which the kubelet enforces), and its end says what it
// used and what to ask (Event TrialResult); its use joins the history "auto" sizes from.
inline constexpr char kTrialAnnotation[] = "tessera.io/trial";
// "auto" on a pod: its compute share is sized at admission from what ended pods of its kind used
// (the extender's mutating webhook, admission.h), which sets its container's tessera.io/gpu-share
// count (or tessera.io/gpu: 1) before the pod is created.
inline constexpr char kGpuShareAnnotation[] = "tessera.io/gpu-share";
// Written by the extender on a pod sized "auto" (tessera.io/gpu-share or tessera.io/gpu-memory:
// auto): its size and from what. The webhook writes the share's part ("gpu-share ..."), the
// Binding adds the memory's.
inline constexpr char kSizingAnnotation[] = "tessera.io/sizing";

struct NodeGpusInfo {
  core::NodeSpec spec;
  std::vector<bool> healthy;  // per GPU
  int shares_per_gpu = 0;     // 0: the node serves no shares
  bool has_agent = false;     // the node carries a tessera.io/gpus annotation
};

// A Node object. A node without the annotation has no GPUs for Tessera (has_agent false).
absl::StatusOr<NodeGpusInfo> NodeOf(const nlohmann::json& node);

// One container's part of a pod's GPU request.
struct ContainerDemand {
  std::string container;
  std::string resource;  // "tessera.io/gpu" or "tessera.io/gpu-share"
  int count = 0;
};

struct PodDemand {
  core::Request request;                    // id "namespace/name", owner the namespace
  std::vector<ContainerDemand> containers;  // in the kubelet's allocation order
  std::string pod_group;                    // the scheduling.x-k8s.io/pod-group label, when set
  // What run-time history knows it by: its namespace, its Job (the batch.kubernetes.io/job-name
  // label, else its controller's name), its first container's command and arguments, its shape
  // and its spec.activeDeadlineSeconds.
  sched::RunKind kind;
  // tessera.io/gpu-memory "auto": its memory is the extender's to size (Extender::DemandOf) from
  // the history of `kind`, whose shape says "auto" in place of a size; `sizing` says how.
  bool memory_auto = false;
  std::string sizing;
  double trial_s = 0;  // tessera.io/trial; 0: none
  // tessera.io/gpu-share "auto": its share (or whole GPU) was sized at admission, which said how
  // in `admitted_sizing` (its tessera.io/sizing); its kind's shape says "auto" in place of its
  // share, so that what it measures sizes the next pod of its kind whatever this one got.
  bool share_auto = false;
  std::string admitted_sizing;
  // Its memory as tessera.io/gpu-memory asks it ("auto", or MiB; 0: none), whatever it was sized
  // (a share sized a whole GPU keeps it in its kinds' shapes).
  bool memory_auto_asked = false;
  int64_t memory_mib_asked = 0;
};

// The history shape of a pod of request `r`: its share (or "auto" when `share_auto`) and its
// memory (or "auto" when `memory_auto`; `memory_mib` else), as sched::HistoryShape writes them.
std::string PodShape(const core::Request& r, bool share_auto, bool memory_auto, int64_t memory_mib);

// The history kinds an ended pod's measured use joins: its own, and for a share (or a pod sized
// "auto"), those of the same pod asking "auto" for its share, its memory or both (which its use
// sizes too).
std::vector<sched::RunKind> UseKinds(const PodDemand& d);
// The kind measured use is kept and sized under: `kind`, known by kPodsOfItsShape when a Job, a
// controller or a command does not name it, so that no namespace's use sizes another's pods.
inline constexpr char kPodsOfItsShape[] = "pods of its shape";
sched::RunKind UseKind(sched::RunKind kind);
// A pod's kind, its shape aside: its namespace, its Job (or controller, "Kind/name") and its
// first container's command and args; its activeDeadlineSeconds.
sched::RunKind PodKindOf(const nlohmann::json& pod);
// The shape of a pod's DRA share claims (gpu-share.tessera.io) in the history: what they used,
// whatever count or memory they got, sizes the next claims of its kind's pods.
inline constexpr char kDraShareShape[] = "dra gpu-share";
// Whether the pod asks for DRA claims (spec.resourceClaims).
bool AsksDraClaims(const nlohmann::json& pod);

// A Pod object. `shares_per_gpu` converts a share count to compute thousandths (the node's; the
// extender checks them per node, this uses the cluster's common value). kInvalidArgument for what
// Tessera cannot place: no GPU request, whole GPUs and shares together, shares in more than one
// container, a bad annotation.
absl::StatusOr<PodDemand> PodDemandOf(const nlohmann::json& pod, int shares_per_gpu);

// Whether a container of the pod asks for tessera.io/gpu or tessera.io/gpu-share: a Tessera pod,
// whether or not its demand can be read now.
bool HasTesseraResources(const nlohmann::json& pod);

}  // namespace tessera::extender
