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

}  // namespace tessera::extender
