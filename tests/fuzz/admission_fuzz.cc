// libFuzzer target: AdmissionReviews as the extender's webhook reads them (admission.h), on
// arbitrary bytes, with a sizer answering a share, a whole GPU or an error: an answer is always a
// 400 or a review's response for the request's uid; never a crash; and a patch always applies to
// the pod that was reviewed, leaving the container it sized with that size. The same bytes as a
// ResourceClaim's review (AdmitClaim): a patch applies to the claim, its request counted as sized
// and its ShareConfig last in spec.devices.config.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "nlohmann/json.hpp"
#include "tessera/extender/admission.h"
#include "tessera/extender/objects.h"

namespace {

void FuzzClaim(const std::string& body, int pick) {
  using nlohmann::json;
  using tessera::extender::ClaimAsk;
  using tessera::extender::ClaimSize;
  ClaimAsk asked;
  auto answer = tessera::extender::AdmitClaim(
      body, [&](const std::string&, const ClaimAsk& a) -> absl::StatusOr<ClaimSize> {
        asked = a;
        if (a.count < 1 || a.pod.empty() || (!a.share_auto && !a.memory_auto)) __builtin_trap();
        if (pick == 2) return absl::UnavailableError("not now");
        return ClaimSize{.count = 2, .memory_mib = pick == 0 ? 1024 : 0, .sizing = "x"};
      });
  if (answer.http_status == 400) return;
  if (answer.http_status != 200) __builtin_trap();
  const json review = json::parse(body);
  const json& response = answer.body.at("response");
  if (response.at("uid") != review.at("request").at("uid")) __builtin_trap();
  if (!response.contains("patch")) return;
  std::string text;
  if (!absl::Base64Unescape(response["patch"].get<std::string>(), &text)) __builtin_trap();
  json claim;
  try {
    claim = review["request"]["object"].patch(json::parse(text));
  } catch (const json::exception&) {
    __builtin_trap();  // the API server would fail the claim's creation
  }
  if (claim["metadata"]["annotations"].value("tessera.io/sizing", "") != "x") __builtin_trap();
  if (pick == 0 && asked.memory_auto) {
    const json& config = claim["spec"]["devices"]["config"];
    if (!config.is_array() || config.empty() ||
        config.back()["opaque"]["parameters"].value("memory", "") != "1024Mi" ||
        config.back()["requests"] != json::array({asked.request}))
      __builtin_trap();
  }
  if (asked.share_auto) {
    bool counted = false;
    for (const json& r : claim["spec"]["devices"]["requests"])
      counted =
          counted || (r["exactly"].value("deviceClassName", json()) == "gpu-share.tessera.io" &&
                      r["exactly"].value("count", json()) == 2);
    if (!counted) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  using tessera::extender::ShareSize;
  const std::string body(reinterpret_cast<const char*>(data), size);
  const int pick = size > 0 ? data[size - 1] % 3 : 0;
  FuzzClaim(body, pick);
  size_t sized_container = 0;
  auto answer = tessera::extender::AdmitPod(
      body, [&](const json&, size_t container, int asked) -> absl::StatusOr<ShareSize> {
        sized_container = container;
        if (asked < 0) __builtin_trap();
        if (pick == 0) return ShareSize{.count = 2, .sizing = "gpu-share 2 (of 4 per GPU): x"};
        if (pick == 1) return ShareSize{.count = 4, .whole_gpu = true, .sizing = "gpu-share: x"};
        return absl::UnavailableError("not now");
      });
  if (answer.http_status == 400) return 0;
  if (answer.http_status != 200) __builtin_trap();
  const json review = json::parse(body);  // a 200 means it was a review
  const json& response = answer.body.at("response");
  if (response.at("uid") != review.at("request").at("uid")) __builtin_trap();
  if (!response.contains("patch")) return 0;
  std::string text;
  if (!absl::Base64Unescape(response["patch"].get<std::string>(), &text)) __builtin_trap();
  json pod;
  try {
    pod = review["request"]["object"].patch(json::parse(text));
  } catch (const json::exception&) {
    __builtin_trap();  // the API server would fail the pod's creation
  }
  const json& limits = pod["spec"]["containers"][sized_container]["resources"]["limits"];
  const bool ok = pick == 0 ? limits.value("tessera.io/gpu-share", "") == "2"
                            : limits.value("tessera.io/gpu", "") == "1" &&
                                  !limits.contains("tessera.io/gpu-share");
  if (!ok) __builtin_trap();
  auto d = tessera::extender::PodDemandOf(pod, 4);
  if (!d.ok() && d.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
  return 0;
}
