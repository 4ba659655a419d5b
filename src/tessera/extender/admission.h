#pragma once
// The extender's mutating admission webhook (issue 58): a pod asking tessera.io/gpu-share "auto"
// gets its compute share from what ended pods of its kind used, written into its spec before the
// API server stores it - a pod's resources cannot change after it is created, and a count is what
// the kubelet's device plugin hands out. The API server POSTs an AdmissionReview
// (admission.k8s.io/v1) for each pod CREATE its MutatingWebhookConfiguration matches
// (deploy/components/auto-share: only pods with that annotation); the answer allows every other
// pod unchanged and patches an "auto" pod (JSON Patch): its container's tessera.io/gpu-share
// count, or tessera.io/gpu: 1 where its measured busy share and the margin reach a whole GPU, and
// its tessera.io/sizing saying how. docs/kubernetes.md, "Pods sized from what they used".

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tessera::extender {

// What an "auto" pod's container gets: `count` shares of a GPU, or a whole GPU; `sizing` (its
// tessera.io/sizing) starts with "gpu-share".
struct ShareSize {
  int count = 0;
  bool whole_gpu = false;
  std::string sizing;
};

// Sizes the pod's container `container` (an index into spec.containers), which asks `asked`
// shares (0: none; then at most a whole GPU): kUnavailable when it cannot be sized now,
// kInvalidArgument for a pod Tessera cannot place.
using ShareSizer = std::function<absl::StatusOr<ShareSize>(const nlohmann::json& pod,
                                                           size_t container, int asked)>;

struct AdmissionAnswer {
  int http_status = 200;  // 400: not an AdmissionReview (the API server then applies its
                          // failurePolicy); 200 with the review's response otherwise
  nlohmann::json body;
  std::string said;  // for the log: what was decided and why; empty for pods left alone
};

// The webhook's answer to `body`. Never throws; a pod it cannot size is refused with a message
// naming what is wrong (the API server shows it to whoever created the pod).
AdmissionAnswer AdmitPod(const std::string& body, const ShareSizer& size);

// DRA (docs/kubernetes.md, "DRA claims sized from what their pods used"): a ResourceClaim that a
// pod's ResourceClaimTemplate makes carries the template's annotations tessera.io/gpu-share and
// tessera.io/gpu-memory "auto"; its one request of DeviceClass gpu-share.tessera.io is sized
// as it is created, from what ended pods of its pod's kind used.
struct ClaimAsk {
  std::string pod, pod_uid;  // the pod it is made for (its controller ownerReference)
  std::string request;       // its gpu-share.tessera.io request's name
  int count = 0;             // the shares that request asks (the most "auto" may give)
  bool share_auto = false, memory_auto = false;
};
// What it gets: `count` shares (its asked count where the share is not "auto"), a memory limit
// where memory is "auto" (0: none measured yet: its shares' part), and its tessera.io/sizing.
struct ClaimSize {
  int count = 0;
  int64_t memory_mib = 0;
  std::string sizing;
};
// kUnavailable when it cannot be sized now (its pod not seen yet: the resourceclaim controller
// tries again), kInvalidArgument for a claim Tessera cannot size.
using ClaimSizer =
    std::function<absl::StatusOr<ClaimSize>(const std::string& ns, const ClaimAsk& ask)>;
// The answer for a ResourceClaim's CREATE: claims not annotated "auto" are allowed unchanged; an
// "auto" one gets its request's count and, for memory, a ShareConfig for that request appended to
// spec.devices.config (later entries win), and tessera.io/sizing.
AdmissionAnswer AdmitClaim(const std::string& body, const ClaimSizer& size);

}  // namespace tessera::extender
