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

// DRA: a ResourceClaim as kube-controller-manager's resourceclaim controller makes it from a
// pod's ResourceClaimTemplate - the template's annotations, the pod its controller owner.
json ClaimReview(const json& claim) {
  json r = Review(claim);
  r["request"]["kind"] = {
      {"group", "resource.k8s.io"}, {"version", "v1"}, {"kind", "ResourceClaim"}};
  r["request"]["resource"] = {
      {"group", "resource.k8s.io"}, {"version", "v1"}, {"resource", "resourceclaims"}};
  return r;
}

json Claim(json annotations, json requests, json config = nullptr) {
  json c = {{"apiVersion", "resource.k8s.io/v1"},
            {"kind", "ResourceClaim"},
            {"metadata",
             {{"generateName", "infer-0-gpu-"},
              {"annotations", annotations},
              {"ownerReferences",
               {{{"apiVersion", "v1"},
                 {"kind", "Pod"},
                 {"name", "infer-0"},
                 {"uid", "p-1"},
                 {"controller", true},
                 {"blockOwnerDeletion", true}}}}}},
            {"spec", {{"devices", {{"requests", requests}}}}}};
  if (!config.is_null()) c["spec"]["devices"]["config"] = config;
  return c;
}

json Exactly(const std::string& name, const std::string& cls, json count = nullptr) {
  json r = {{"name", name}, {"exactly", {{"deviceClassName", cls}}}};
  if (!count.is_null()) r["exactly"]["count"] = count;
  return r;
}

struct ClaimSizerDouble {
  absl::StatusOr<ClaimSize> answer;
  int calls = 0;
  std::string ns;
  ClaimAsk ask;
  ClaimSizer Get() {
    return [this](const std::string& n, const ClaimAsk& a) -> absl::StatusOr<ClaimSize> {
      ++calls, ns = n, ask = a;
      return answer;
    };
  }
};

// Its share request gets its count, and its memory a ShareConfig for that request after the
// claim's own (later entries win); the other requests are left as they are.
TEST(WebhookAdmission, AnAutoClaimGetsItsShareRequestsCountAndAShareConfigOfItsMemory) {
  ClaimSizerDouble s{ClaimSize{.count = 2, .memory_mib = 1536, .sizing = "count 2; memory 1536Mi"}};
  const json own = {{{"requests", {"share"}},
                     {"opaque",
                      {{"driver", "gpu.tessera.io"},
                       {"parameters",
                        {{"apiVersion", "gpu.tessera.io/v1alpha1"},
                         {"kind", "ShareConfig"},
                         {"priority", "high"}}}}}}};
  const json claim =
      Claim({{"tessera.io/gpu-share", "auto"}, {"tessera.io/gpu-memory", "auto"}},
            {Exactly("nic", "nic.example.com"), Exactly("share", "gpu-share.tessera.io", 4)}, own);
  AdmissionAnswer a = AdmitClaim(ClaimReview(claim).dump(), s.Get());
  ASSERT_EQ(a.http_status, 200) << a.said;
  EXPECT_EQ(a.body["response"]["allowed"], true);
  EXPECT_EQ(s.ns, "ml");
  EXPECT_EQ(s.ask.pod, "infer-0");
  EXPECT_EQ(s.ask.pod_uid, "p-1");
  EXPECT_EQ(s.ask.request, "share");
  EXPECT_EQ(s.ask.count, 4);
  EXPECT_TRUE(s.ask.share_auto && s.ask.memory_auto);
  const json after = Patched(claim, a);
  EXPECT_EQ(after["spec"]["devices"]["requests"][1]["exactly"]["count"], 2);
  EXPECT_EQ(after["spec"]["devices"]["requests"][0], claim["spec"]["devices"]["requests"][0]);
  const json& config = after["spec"]["devices"]["config"];
  ASSERT_EQ(config.size(), 2u);
  EXPECT_EQ(config[0], own[0]);
  EXPECT_EQ(config[1]["requests"], json({"share"}));
  EXPECT_EQ(config[1]["opaque"]["driver"], "gpu.tessera.io");
  EXPECT_EQ(config[1]["opaque"]["parameters"], json({{"apiVersion", "gpu.tessera.io/v1alpha1"},
                                                     {"kind", "ShareConfig"},
                                                     {"memory", "1536Mi"}}));
  EXPECT_EQ(after["metadata"]["annotations"]["tessera.io/sizing"], "count 2; memory 1536Mi");
  EXPECT_THAT(a.said, HasSubstr("ResourceClaim ml/infer-0-gpu-* (pod infer-0): request share"));

  // Memory alone, nothing measured (0): the count as asked (1 when unsaid), no ShareConfig.
  s.answer = ClaimSize{.count = 1, .memory_mib = 0, .sizing = "memory: none measured yet"};
  const json bare =
      Claim({{"tessera.io/gpu-memory", "auto"}}, {Exactly("s", "gpu-share.tessera.io")});
  a = AdmitClaim(ClaimReview(bare).dump(), s.Get());
  ASSERT_EQ(a.http_status, 200);
  EXPECT_EQ(s.ask.count, 1);
  EXPECT_FALSE(s.ask.share_auto);
  const json kept = Patched(bare, a);
  EXPECT_FALSE(kept["spec"]["devices"].contains("config"));
  EXPECT_FALSE(kept["spec"]["devices"]["requests"][0]["exactly"].contains("count"));
  EXPECT_EQ(kept["metadata"]["annotations"]["tessera.io/sizing"], "memory: none measured yet");
  // Memory measured, no config of its own: the list is made.
  s.answer = ClaimSize{.count = 1, .memory_mib = 768, .sizing = "memory 768Mi"};
  a = AdmitClaim(ClaimReview(bare).dump(), s.Get());
  EXPECT_EQ(Patched(bare, a)["spec"]["devices"]["config"][0]["opaque"]["parameters"]["memory"],
            "768Mi");
}

TEST(WebhookAdmission, ClaimsNotAskingAutoPassUnchangedAndWhatCannotBeSizedIsRefusedSayingWhy) {
  ClaimSizerDouble s{ClaimSize{.count = 1, .sizing = "x"}};
  const json share = Exactly("s", "gpu-share.tessera.io", 2);
  for (const json& claim :
       {Claim({{"tessera.io/gpu-share", "2"}}, {share}), Claim(json::object(), {share})}) {
    AdmissionAnswer a = AdmitClaim(ClaimReview(claim).dump(), s.Get());
    EXPECT_EQ(a.http_status, 200);
    EXPECT_EQ(a.body["response"]["allowed"], true);
    EXPECT_FALSE(a.body["response"].contains("patch"));
    EXPECT_TRUE(a.said.empty());
  }
  json update = ClaimReview(Claim({{"tessera.io/gpu-share", "auto"}}, {share}));
  update["request"]["operation"] = "UPDATE";
  EXPECT_FALSE(AdmitClaim(update.dump(), s.Get()).body["response"].contains("patch"));
  EXPECT_EQ(s.calls, 0);

  auto refused = [&](const json& claim, const std::string& why, int code = 400) {
    AdmissionAnswer a = AdmitClaim(ClaimReview(claim).dump(), s.Get());
    EXPECT_EQ(a.http_status, 200);
    EXPECT_EQ(a.body["response"]["allowed"], false) << why;
    EXPECT_EQ(a.body["response"]["status"]["code"], code) << why;
    EXPECT_THAT(a.body["response"]["status"]["message"].get<std::string>(), HasSubstr(why));
    EXPECT_FALSE(a.body["response"].contains("patch"));
  };
  const json autos = {{"tessera.io/gpu-share", "auto"}};
  json unowned = Claim(autos, {share});
  unowned["metadata"].erase("ownerReferences");
  refused(unowned, "no Pod owns this one");
  refused(Claim(autos, {share, Exactly("t", "gpu-share.tessera.io")}),
          "spec.devices.requests[0] and [1] both ask for gpu-share.tessera.io");
  refused(Claim(autos, {Exactly("g", "gpu.tessera.io")}), "no request of spec.devices.requests");
  json all = share;
  all["exactly"]["allocationMode"] = "All";
  refused(Claim(autos, {all}), "allocationMode All");
  refused(Claim(autos, {Exactly("s", "gpu-share.tessera.io", 0)}), "exactly.count");
  refused(Claim(autos, {Exactly("s", "gpu-share.tessera.io", "2")}), "exactly.count");
  refused(Claim(autos, "x"), "spec.devices.requests: expected a list");
  s.answer = absl::UnavailableError("its pod: not seen yet");
  refused(Claim(autos, {share}), "its pod: not seen yet", 503);
  s.answer = absl::InvalidArgumentError("bad");
  refused(Claim(autos, {share}), "ResourceClaim ml/infer-0-gpu-*: auto: bad");
}

// A DRA pod's trial: kube-scheduler binds it, so its deadline is set as it is created; its own
// shorter deadline is kept; a device-plugin pod's trial is the Binding's (not changed here).
TEST(WebhookAdmission, ADraPodsTrialGetsItsDeadlineAsItIsCreated) {
  Sizer s{ShareSize{.count = 1, .sizing = "x"}};
  auto dra_pod = [](const std::string& trial) {
    json pod = {
        {"metadata", {{"generateName", "try-"}, {"annotations", {{"tessera.io/trial", trial}}}}},
        {"spec",
         {{"containers", {{{"name", "main"}, {"image", "infer:1"}}}},
          {"resourceClaims", {{{"name", "gpu"}, {"resourceClaimTemplateName", "share"}}}}}}};
    return pod;
  };
  json pod = dra_pod("2m");
  AdmissionAnswer a = AdmitPod(Review(pod).dump(), s.Get());
  ASSERT_EQ(a.http_status, 200);
  EXPECT_EQ(a.body["response"]["allowed"], true);
  EXPECT_EQ(Patched(pod, a)["spec"]["activeDeadlineSeconds"], 120);
  EXPECT_THAT(a.said, HasSubstr("ml/try-*: DRA trial of 2m: spec.activeDeadlineSeconds 120"));
  // A longer deadline of its own is lowered; a shorter one kept.
  pod["spec"]["activeDeadlineSeconds"] = 3600;
  EXPECT_EQ(Patched(pod, AdmitPod(Review(pod).dump(), s.Get()))["spec"]["activeDeadlineSeconds"],
            120);
  pod["spec"]["activeDeadlineSeconds"] = 60;
  a = AdmitPod(Review(pod).dump(), s.Get());
  EXPECT_FALSE(a.body["response"].contains("patch"));
  // A trial that is no duration is refused, naming it.
  for (const std::string bad : {"soon", "0s", "30d"}) {
    a = AdmitPod(Review(dra_pod(bad)).dump(), s.Get());
    EXPECT_EQ(a.body["response"]["allowed"], false) << bad;
    EXPECT_THAT(a.body["response"]["status"]["message"].get<std::string>(),
                HasSubstr("annotation tessera.io/trial: expected a duration from 1s to 7d"));
  }
  // A device-plugin pod's trial, and a DRA pod without one: unchanged.
  json plugin = Pod({{"tessera.io/gpu-share", "1"}}, nullptr, {{"tessera.io/trial", "2m"}});
  EXPECT_FALSE(AdmitPod(Review(plugin).dump(), s.Get()).body["response"].contains("patch"));
  json plain = dra_pod("2m");
  plain["metadata"]["annotations"].erase("tessera.io/trial");
  EXPECT_FALSE(AdmitPod(Review(plain).dump(), s.Get()).body["response"].contains("patch"));
  EXPECT_EQ(s.calls, 0) << "a trial is not sized";
}

}  // namespace
}  // namespace tessera::extender
