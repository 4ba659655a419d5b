#include "tessera/extender/admission.h"

#include <cmath>

#include "absl/strings/escaping.h"
#include "fmt/format.h"
#include "tessera/core/gpu.h"
#include "tessera/extender/dra.h"
#include "tessera/extender/objects.h"
#include "tessera/kube/object.h"
#include "tessera/kube/quantity.h"

namespace tessera::extender {
namespace {

using kube::FieldAt;
using kube::StringAt;
using nlohmann::json;

constexpr char kShare[] = "tessera.io/gpu-share";
constexpr char kWhole[] = "tessera.io/gpu";

// A container's count of `resource` in limits or requests (-1: malformed; 0: none).
int64_t CountOf(const json& container, const char* resource) {
  int64_t out = 0;
  for (const char* part : {"limits", "requests"}) {
    const json* v = FieldAt(container, {"resources", part, resource});
    if (!v || v->is_null()) continue;
    std::optional<int64_t> n;
    if (v->is_string()) {
      n = kube::ParseQuantity(v->get<std::string>(), 1);
    } else if (v->is_number_integer() && v->get<int64_t>() >= 0) {
      n = v->get<int64_t>();
    }
    if (!n || *n > 1000) return -1;
    out = std::max(out, *n);
  }
  return out;
}

// The review's request, with `a` set to allow it unchanged; nullptr with `a` a 400 when `body` is
// not an admission.k8s.io/v1 AdmissionReview.
const json* OpenReview(const std::string& body, json& review, AdmissionAnswer& a) {
  review = json::parse(body, nullptr, false);
  auto bad = [&](const std::string& why) -> const json* {
    a.http_status = 400;
    a.body = {{"error", "not an admission.k8s.io/v1 AdmissionReview: " + why}};
    a.said = a.body["error"];
    return nullptr;
  };
  if (review.is_discarded() || !review.is_object()) return bad("the body is not a JSON object");
  if (StringAt(review, {"apiVersion"}) != "admission.k8s.io/v1" ||
      StringAt(review, {"kind"}) != "AdmissionReview") {
    return bad(
        fmt::format("apiVersion \"{}\", kind \"{}\" (this webhook speaks "
                    "admission.k8s.io/v1 only: admissionReviewVersions [v1])",
                    StringAt(review, {"apiVersion"}), StringAt(review, {"kind"})));
  }
  const json* request = FieldAt(review, {"request"});
  if (!request || !request->is_object()) return bad("request: expected an object");
  const std::string uid = StringAt(*request, {"uid"});
  if (uid.empty()) return bad("request.uid is missing");
  a.body = {{"apiVersion", "admission.k8s.io/v1"},
            {"kind", "AdmissionReview"},
            {"response", {{"uid", uid}, {"allowed", true}}}};
  return request;
}

// The object's "ns/name" for messages (generateName's prefix and "*" before it has a name).
std::string IdOf(const json& request, const json& object) {
  const std::string ns = StringAt(request, {"namespace"});
  std::string name = StringAt(object, {"metadata", "name"});
  if (name.empty()) name = StringAt(object, {"metadata", "generateName"}) + "*";
  return (ns.empty() ? "default" : ns) + "/" + name.substr(0, kMaxNameLength);
}

// Refuses the review with `code` (503: try again later; else 400) and `message`.
AdmissionAnswer& Refuse(AdmissionAnswer& a, int code, const std::string& message) {
  json& response = a.body["response"];
  response["allowed"] = false;
  response["status"] = {{"status", "Failure"},
                        {"code", code},
                        {"reason", code == 503 ? "ServiceUnavailable" : "BadRequest"},
                        {"message", message}};
  a.said = message;
  return a;
}

}  // namespace

AdmissionAnswer AdmitPod(const std::string& body, const ShareSizer& size) {
  AdmissionAnswer a;
  json review;
  const json* request = OpenReview(body, review, a);
  if (!request) return a;
  json& response = a.body["response"];
  const json* pod = FieldAt(*request, {"object"});
  if (StringAt(*request, {"operation"}) != "CREATE" ||
      StringAt(*request, {"resource", "resource"}) != "pods" ||
      !StringAt(*request, {"subResource"}).empty() || !pod || !pod->is_object()) {
    return a;  // not ours to change
  }
  const std::string id = IdOf(*request, *pod);
  // A DRA pod's trial (tessera.io/trial): no Binding of the extender's sets its deadline (the
  // scheduler binds DRA pods itself), so it is set as the pod is created; the kubelet counts it
  // from the pod's start on its node.
  if (const std::string trial = StringAt(*pod, {"metadata", "annotations", kTrialAnnotation});
      !trial.empty() && AsksDraClaims(*pod) && !HasTesseraResources(*pod)) {
    const std::optional<double> t = core::ParseDuration(trial);
    if (!t || *t < 1 || *t > 7 * 86400) {
      return Refuse(a, 400,
                    fmt::format("{}: annotation {}: expected a duration from 1s to 7d such as 2m "
                                "or 90s, got \"{}\"",
                                id, kTrialAnnotation, trial.substr(0, 64)));
    }
    const auto seconds = static_cast<int64_t>(std::ceil(*t));
    const json* own = FieldAt(*pod, {"spec", "activeDeadlineSeconds"});
    if (own && own->is_number_integer() && own->get<int64_t>() <= seconds)
      return a;  // its own deadline, shorter, ends it first
    const json patch = {
        {{"op", "add"}, {"path", "/spec/activeDeadlineSeconds"}, {"value", seconds}}};
    json& response = a.body["response"];
    response["patchType"] = "JSONPatch";
    response["patch"] = absl::Base64Escape(patch.dump());
    a.said = fmt::format("{}: DRA trial of {}: spec.activeDeadlineSeconds {}", id, trial, seconds);
    return a;
  }
  if (StringAt(*pod, {"metadata", "annotations", kGpuShareAnnotation}) != "auto")
    return a;  // not ours to change
  auto refuse = [&](int code, const std::string& why) {
    return Refuse(a, code, fmt::format("{}: {}: auto: {}", id, kGpuShareAnnotation, why));
  };
  for (const char* list : {"initContainers", "ephemeralContainers"}) {
    const json* cs = FieldAt(*pod, {"spec", list});
    if (!cs || !cs->is_array()) continue;
    for (const json& c : *cs) {
      if (c.is_object() && (CountOf(c, kShare) != 0 || CountOf(c, kWhole) != 0))
        return refuse(400, fmt::format("spec.{} ask for Tessera GPUs: it sizes one of "
                                       "spec.containers",
                                       list));
    }
  }
  const json* containers = FieldAt(*pod, {"spec", "containers"});
  if (!containers || !containers->is_array() || containers->empty())
    return refuse(400, "spec.containers: expected a list of at least one container");
  std::optional<size_t> which;
  int asked = 0;
  for (size_t i = 0; i < containers->size(); ++i) {
    const json& c = (*containers)[i];
    if (!c.is_object())
      return refuse(400, fmt::format("spec.containers[{}]: expected an object", i));
    const int64_t whole = CountOf(c, kWhole), share = CountOf(c, kShare);
    if (whole != 0) {
      return refuse(400, fmt::format("spec.containers[{}] asks for {}: auto sizes a share (ask "
                                     "for neither, or for the most shares it may have)",
                                     i, kWhole));
    }
    if (share < 0)
      return refuse(400, fmt::format("spec.containers[{}]: {}: expected a whole count", i, kShare));
    if (share == 0) continue;
    if (which) {
      return refuse(400, fmt::format("spec.containers[{}] and [{}] both ask for {}: it sizes one "
                                     "container's share",
                                     *which, i, kShare));
    }
    which = i;
    asked = static_cast<int>(share);
  }
  const size_t index = which.value_or(0);
  auto sized = size(*pod, index, asked);
  if (!sized.ok()) {
    return refuse(sized.status().code() == absl::StatusCode::kUnavailable ? 503 : 400,
                  std::string(sized.status().message()));
  }
  // Its container's resources with the size in them (requests too where it has them: an extended
  // resource's request must equal its limit).
  const json& c = (*containers)[index];
  json resources =
      c.contains("resources") && c["resources"].is_object() ? c["resources"] : json::object();
  for (const char* part : {"limits", "requests"}) {
    if (resources.contains(part) && !resources[part].is_object()) resources.erase(part);
    const bool had = resources.contains(part) && resources[part].contains(kShare);
    if (std::string(part) == "requests" && !had) continue;
    json& r = resources[part];
    if (!r.is_object()) r = json::object();
    r.erase(kShare);
    if (sized->whole_gpu) {
      r[kWhole] = "1";
    } else {
      r[kShare] = std::to_string(sized->count);
    }
  }
  json patch = json::array();
  patch.push_back({{"op", "add"},
                   {"path", fmt::format("/spec/containers/{}/resources", index)},
                   {"value", resources}});
  patch.push_back(
      {{"op", "add"},
       {"path", (json::json_pointer("/metadata/annotations") / kSizingAnnotation).to_string()},
       {"value", sized->sizing}});
  response["patchType"] = "JSONPatch";
  response["patch"] = absl::Base64Escape(patch.dump());
  a.said = fmt::format("{}: container {}: {}", id, StringAt(c, {"name"}), sized->sizing);
  return a;
}

AdmissionAnswer AdmitClaim(const std::string& body, const ClaimSizer& size) {
  AdmissionAnswer a;
  json review;
  const json* request = OpenReview(body, review, a);
  if (!request) return a;
  const json* claim = FieldAt(*request, {"object"});
  if (StringAt(*request, {"operation"}) != "CREATE" ||
      StringAt(*request, {"resource", "resource"}) != "resourceclaims" || !claim ||
      !claim->is_object())
    return a;  // not ours to change
  ClaimAsk ask;
  ask.share_auto = StringAt(*claim, {"metadata", "annotations", kGpuShareAnnotation}) == "auto";
  ask.memory_auto = StringAt(*claim, {"metadata", "annotations", kGpuMemoryAnnotation}) == "auto";
  if (!ask.share_auto && !ask.memory_auto) return a;
  const std::string id = IdOf(*request, *claim);
  auto refuse = [&](int code, const std::string& why) {
    return Refuse(a, code, fmt::format("ResourceClaim {}: auto: {}", id, why));
  };
  if (const json* owners = FieldAt(*claim, {"metadata", "ownerReferences"});
      owners && owners->is_array()) {
    for (const json& o : *owners) {
      if (o.is_object() && o.value("kind", "") == "Pod" && o.value("controller", false) &&
          o.contains("name") && o["name"].is_string())
        ask.pod = o["name"].get<std::string>(), ask.pod_uid = o.value("uid", "");
    }
  }
  if (ask.pod.empty())
    return refuse(400,
                  "sized for the pod it is made for: a claim of a pod's ResourceClaimTemplate "
                  "(no Pod owns this one)");
  const json* requests = FieldAt(*claim, {"spec", "devices", "requests"});
  if (!requests || !requests->is_array())
    return refuse(400, "spec.devices.requests: expected a list");
  std::optional<size_t> which;
  for (size_t i = 0; i < requests->size(); ++i) {
    const json& r = (*requests)[i];
    if (StringAt(r, {"exactly", "deviceClassName"}) != kDraShareClass) continue;
    if (which)
      return refuse(400, fmt::format("spec.devices.requests[{}] and [{}] both ask for {}: it "
                                     "sizes one request",
                                     *which, i, kDraShareClass));
    which = i;
  }
  if (!which)
    return refuse(400, fmt::format("no request of spec.devices.requests asks for DeviceClass {} "
                                   "exactly (a prioritized list is not sized)",
                                   kDraShareClass));
  const json& r = (*requests)[*which];
  ask.request = StringAt(r, {"name"});
  const std::string mode = StringAt(r, {"exactly", "allocationMode"});
  if (!mode.empty() && mode != "ExactCount")
    return refuse(400, fmt::format("spec.devices.requests[{}]: allocationMode {}: it sizes a count",
                                   *which, mode));
  const json* count = FieldAt(r, {"exactly", "count"});
  ask.count = 1;
  if (count && !count->is_null()) {
    if (!count->is_number_integer() || count->get<int64_t>() < 1 || count->get<int64_t>() > 1000)
      return refuse(
          400, fmt::format("spec.devices.requests[{}].exactly.count: expected a count", *which));
    ask.count = static_cast<int>(count->get<int64_t>());
  }
  auto sized = size(StringAt(*request, {"namespace"}), ask);
  if (!sized.ok()) {
    return refuse(sized.status().code() == absl::StatusCode::kUnavailable ? 503 : 400,
                  std::string(sized.status().message()));
  }
  json patch = json::array();
  if (ask.share_auto) {
    patch.push_back({{"op", "add"},
                     {"path", fmt::format("/spec/devices/requests/{}/exactly/count", *which)},
                     {"value", sized->count}});
  }
  if (ask.memory_auto && sized->memory_mib > 0) {
    const json config = {{"requests", {ask.request}},
                         {"opaque",
                          {{"driver", kDraDriverName},
                           {"parameters",
                            {{"apiVersion", "gpu.tessera.io/v1alpha1"},
                             {"kind", "ShareConfig"},
                             {"memory", fmt::format("{}Mi", sized->memory_mib)}}}}}};
    const json* configs = FieldAt(*claim, {"spec", "devices", "config"});
    if (configs && configs->is_array()) {
      patch.push_back({{"op", "add"}, {"path", "/spec/devices/config/-"}, {"value", config}});
    } else {
      patch.push_back(
          {{"op", "add"}, {"path", "/spec/devices/config"}, {"value", json::array({config})}});
    }
  }
  patch.push_back(
      {{"op", "add"},
       {"path", (json::json_pointer("/metadata/annotations") / kSizingAnnotation).to_string()},
       {"value", sized->sizing}});
  json& response = a.body["response"];
  response["patchType"] = "JSONPatch";
  response["patch"] = absl::Base64Escape(patch.dump());
  a.said = fmt::format("ResourceClaim {} (pod {}): request {}: {}", id, ask.pod, ask.request,
                       sized->sizing);
  return a;
}

}  // namespace tessera::extender
