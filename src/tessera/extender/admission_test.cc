// The admission webhook's answers (admission.h) as the API server reads them: a JSON Patch that
// applies to the pod it reviewed, a refusal with a status, or nothing for pods not asking "auto".
#include "tessera/extender/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"

namespace tessera::extender {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json Review(const json& pod, const std::string& operation = "CREATE") {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"namespace", "ml"},
            {"operation", operation},
            {"object", pod}}}};
}

json Pod(json limits, json requests = nullptr,
         json annotations = {{"tessera.io/gpu-share", "auto"}}) {
  json c = {{"name", "main"}, {"image", "infer:1"}, {"resources", {{"limits", limits}}}};
  if (!requests.is_null()) c["resources"]["requests"] = requests;
  return {{"metadata", {{"generateName", "infer-"}, {"annotations", annotations}}},
          {"spec", {{"containers", {{{"name", "side"}, {"image", "log:1"}}, c}}}}};
}

// The pod after the answer's patch, as the API server applies it.
json Patched(const json& pod, const AdmissionAnswer& a) {
  const json& r = a.body["response"];
  EXPECT_EQ(r["patchType"], "JSONPatch");
  std::string text;
  EXPECT_TRUE(absl::Base64Unescape(r["patch"].get<std::string>(), &text));
  return pod.patch(json::parse(text));
}

struct Sizer {
  absl::StatusOr<ShareSize> answer;
  int calls = 0;
  size_t container = 99;
  int asked = -1;
  ShareSizer Get() {
    return [this](const json&, size_t c, int a) -> absl::StatusOr<ShareSize> {
      ++calls, container = c, asked = a;
      return answer;
    };
  }
};

TEST(WebhookAdmission, SetsTheSizedCountOnTheContainerThatAsksAndSaysHow) {
  Sizer s{ShareSize{.count = 1, .sizing = "gpu-share 1 (of 4 per GPU): 20% busy + 20%"}};
  const json pod =
      Pod({{"tessera.io/gpu-share", "3"}, {"memory", "1Gi"}}, {{"tessera.io/gpu-share", "3"}});
  AdmissionAnswer a = AdmitPod(Review(pod).dump(), s.Get());
  ASSERT_EQ(a.http_status, 200);
  EXPECT_EQ(a.body["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(a.body["kind"], "AdmissionReview");
  EXPECT_EQ(a.body["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_EQ(a.body["response"]["allowed"], true);
  EXPECT_EQ(s.container, 1u);
  EXPECT_EQ(s.asked, 3);
  json after = Patched(pod, a);
  const json& res = after["spec"]["containers"][1]["resources"];
  EXPECT_EQ(res["limits"], json({{"tessera.io/gpu-share", "1"}, {"memory", "1Gi"}}));
  EXPECT_EQ(res["requests"], json({{"tessera.io/gpu-share", "1"}})) << "a request equals its limit";
  EXPECT_EQ(after["spec"]["containers"][0], pod["spec"]["containers"][0]);
  EXPECT_EQ(after["metadata"]["annotations"]["tessera.io/sizing"],
            "gpu-share 1 (of 4 per GPU): 20% busy + 20%");
  EXPECT_EQ(after["metadata"]["annotations"]["tessera.io/gpu-share"], "auto");
  EXPECT_THAT(a.said, HasSubstr("ml/infer-*: container main: gpu-share 1"));
}

TEST(WebhookAdmission, AWholeGpuReplacesTheShareAndAPodAskingNoneGetsItOnItsFirstContainer) {
  Sizer s{ShareSize{.count = 4, .whole_gpu = true, .sizing = "gpu-share: ... a whole GPU"}};
  json pod = Pod({{"tessera.io/gpu-share", "2"}});
  json after = Patched(pod, AdmitPod(Review(pod).dump(), s.Get()));
  EXPECT_EQ(after["spec"]["containers"][1]["resources"]["limits"], json({{"tessera.io/gpu", "1"}}));
  // No share asked: the first container, within a whole GPU.
  pod = Pod(json::object());
  pod["spec"]["containers"][1].erase("resources");
  s.answer = ShareSize{.count = 2, .sizing = "gpu-share 2 (of 4 per GPU): ..."};
  after = Patched(pod, AdmitPod(Review(pod).dump(), s.Get()));
  EXPECT_EQ(s.container, 0u);
  EXPECT_EQ(s.asked, 0);
  EXPECT_EQ(after["spec"]["containers"][0]["resources"],
            json({{"limits", {{"tessera.io/gpu-share", "2"}}}}));
}

TEST(WebhookAdmission, PodsNotAskingAutoAndOtherOperationsPassUnchanged) {
  Sizer s{ShareSize{.count = 1, .sizing = "gpu-share 1"}};
  for (const json& review :
       {Review(Pod({{"tessera.io/gpu-share", "1"}}, nullptr, json::object())),
        Review(Pod({{"tessera.io/gpu-share", "1"}}, nullptr, {{"tessera.io/gpu-share", "2"}})),
        Review(Pod({{"tessera.io/gpu-share", "1"}}), "UPDATE")}) {
    AdmissionAnswer a = AdmitPod(review.dump(), s.Get());
    EXPECT_EQ(a.http_status, 200);
    EXPECT_EQ(a.body["response"], json({{"uid", review["request"]["uid"]}, {"allowed", true}}));
    EXPECT_TRUE(a.said.empty());
  }
  EXPECT_EQ(s.calls, 0);
}

TEST(WebhookAdmission, RefusesWhatItCannotSizeWithAStatusNamingWhy) {
  Sizer s{ShareSize{.count = 1, .sizing = "gpu-share 1"}};
  auto refused = [&](const json& pod) {
    AdmissionAnswer a = AdmitPod(Review(pod).dump(), s.Get());
    EXPECT_EQ(a.http_status, 200);
    EXPECT_EQ(a.body["response"]["allowed"], false);
    return a.body["response"]["status"];
  };
  json two = Pod({{"tessera.io/gpu-share", "1"}});
  two["spec"]["containers"][0]["resources"]["limits"]["tessera.io/gpu-share"] = "1";
  EXPECT_THAT(refused(two)["message"].get<std::string>(),
              HasSubstr("spec.containers[0] and [1] both ask for tessera.io/gpu-share"));
  EXPECT_THAT(refused(Pod({{"tessera.io/gpu", "1"}}))["message"].get<std::string>(),
              HasSubstr("spec.containers[1] asks for tessera.io/gpu"));
  EXPECT_THAT(refused(Pod({{"tessera.io/gpu-share", "two"}}))["message"].get<std::string>(),
              HasSubstr("expected a whole count"));
  json init = Pod({{"tessera.io/gpu-share", "1"}});
  init["spec"]["initContainers"] = {
      {{"name", "warm"}, {"resources", {{"limits", {{"tessera.io/gpu-share", "1"}}}}}}};
  EXPECT_THAT(refused(init)["message"].get<std::string>(), HasSubstr("spec.initContainers"));
  EXPECT_EQ(s.calls, 0);
  s.answer = absl::UnavailableError("no node serves tessera.io/gpu-share yet");
  json st = refused(Pod({{"tessera.io/gpu-share", "1"}}));
  EXPECT_EQ(st["code"], 503);
  EXPECT_EQ(st["message"],
            "ml/infer-*: tessera.io/gpu-share: auto: no node serves tessera.io/gpu-share yet");
}

TEST(WebhookAdmission, WhatIsNoReviewIsA400) {
  Sizer s{ShareSize{}};
  for (const std::string body :
       {std::string("not json"), std::string("[]"), json({{"kind", "AdmissionReview"}}).dump(),
        json({{"apiVersion", "admission.k8s.io/v1beta1"}, {"kind", "AdmissionReview"}}).dump(),
        json({{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"request", 1}})
            .dump(),
        json({{"apiVersion", "admission.k8s.io/v1"},
              {"kind", "AdmissionReview"},
              {"request", json::object()}})
            .dump()}) {
    AdmissionAnswer a = AdmitPod(body, s.Get());
    EXPECT_EQ(a.http_status, 400) << body;
    EXPECT_THAT(a.body["error"].get<std::string>(), HasSubstr("AdmissionReview")) << body;
  }
}

}  // namespace
}  // namespace tessera::extender
