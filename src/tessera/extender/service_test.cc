// The extender over its real wire: kube-scheduler's JSON over HTTP(S) in, the API server (the
// fake, over real HTTP) for nodes, pods, PodGroups, quotas, Bindings and Evictions.
#include "tessera/extender/service.h"

#include <curl/curl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "fake_apiserver.h"
#include "tessera/extender/test_objects.h"
#include "tessera/extender/tls_secret.h"
#include "tessera/net/certs.h"
#include "yaml-cpp/yaml.h"
#include "yaml_object.h"

namespace tessera::extender {
namespace {

using fakes::FakeApiServer;
using nlohmann::json;
using testing::GpuNode;
using testing::GpuPod;
using ::testing::HasSubstr;

constexpr char kNodes[] = "/api/v1/nodes";

std::string Pods(const std::string& ns) { return "/api/v1/namespaces/" + ns + "/pods"; }

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api_.Put(kNodes, GpuNode("n1"));
    api_.Put(kNodes, GpuNode("n2"));
    api_.Put(kNodes,
             {{"metadata", {{"name", "cpu-only"}}}, {"status", {{"allocatable", {{"cpu", "8"}}}}}});
    kube::ClusterConfig c;
    c.server = api_.url();
    c.token = "test-token";
    client_ = std::move(*kube::Client::Create(c));
  }
  void Start(ServiceOptions o = {}) {
    o.listen = "127.0.0.1:0";
    o.extender.scheduler.random_ties = false;
    o.sweep_interval_s = 0.05;
    auto s = Service::Start(*client_, o, clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    service_ = std::move(*s);
    ASSERT_TRUE(service_->WaitForSync(std::chrono::seconds(10)));
    http_ =
        std::make_unique<net::HttpClient>("tcp://127.0.0.1:" + std::to_string(service_->port()));
  }
  void TearDown() override {
    if (service_) service_->Stop();
    client_->Shutdown();
  }
  json Post(const std::string& verb, const json& body, int want_status = 200) {
    auto r = http_->Send("POST", "/scheduler/" + verb, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return json();
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body, nullptr, false);
  }
  // The pod as the API server stores it (uid, creationTimestamp stamped).
  json Create(const json& pod) { return api_.Put(Pods(pod["metadata"]["namespace"]), pod); }
  bool Eventually(const std::function<bool()>& pred) { return FakeApiServer::WaitFor(pred); }
  // The note of the Event with `reason` on pod ml/`pod` (events.k8s.io/v1), empty when none.
  std::string EventOn(const std::string& pod, const std::string& reason) {
    for (const json& e : api_.List("/apis/events.k8s.io/v1/namespaces/ml/events")) {
      if (e["regarding"]["name"] == pod && e["reason"] == reason &&
          e["reportingController"] == "tessera.io/extender")
        return e["note"].get<std::string>();
    }
    return "";
  }

  FakeApiServer api_;
  std::unique_ptr<kube::Client> client_;
  core::FakeClock clock_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<net::HttpClient> http_;
};

TEST_F(ServiceTest, FilterPrioritizeBindAsKubeSchedulerCallsThem) {
  Start();
  EXPECT_TRUE(Eventually([&] { return service_->extender().stats().nodes == 2; }));
  json pod = Create(GpuPod("ml", "train", {.gpus = 2}));
  json names = {"n1", "n2", "cpu-only"};
  json f = Post("filter", {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", names}});
  ASSERT_EQ(f["NodeNames"].size(), 1u) << f.dump();
  std::string node = f["NodeNames"][0];
  EXPECT_TRUE(f["Nodes"].is_null());
  EXPECT_EQ(f["Error"], "");
  EXPECT_TRUE(f["FailedNodes"].empty());  // the others were not chosen, not failed
  json scores = Post("prioritize", {{"Pod", pod}, {"NodeNames", f["NodeNames"]}});
  ASSERT_TRUE(scores.is_array());
  EXPECT_EQ(scores[0]["Host"], node);
  EXPECT_EQ(scores[0]["Score"], 10);

  json b = Post("bind", {{"PodName", "train"},
                         {"PodNamespace", "ml"},
                         {"PodUID", pod["metadata"]["uid"]},
                         {"Node", node}});
  EXPECT_EQ(b["Error"], "");
  // The Binding set the node and carried the assignment onto the pod, in one call.
  json stored = *api_.Get(Pods("ml"), "train");
  EXPECT_EQ(stored["spec"]["nodeName"], node);
  auto as = kube::ParseAssignment(
      stored["metadata"]["annotations"][kube::kAssignmentAnnotation].get<std::string>());
  ASSERT_TRUE(as.ok()) << as.status();
  EXPECT_EQ(as->node, node);
  EXPECT_EQ(as->containers.at(0).gpus.size(), 2u);
  EXPECT_TRUE(Eventually([&] { return service_->extender().stats().bound == 1; }));

  // A second bind of the same pod: the API server refuses (409), the answer says so.
  json again = Post("bind", {{"PodName", "train"}, {"PodNamespace", "ml"}, {"Node", node}});
  EXPECT_NE(again["Error"], "");

  std::string metrics = service_->Metrics();
  EXPECT_THAT(metrics, HasSubstr("tessera_extender_filter_duration_seconds_count 1"));
  EXPECT_THAT(metrics, HasSubstr("tessera_extender_filter_total{result=\"placed\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("tessera_extender_bind_total{result=\"bound\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("tessera_extender_nodes 2"));
  auto m = http_->Send("GET", "/metrics");
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(m->body, HasSubstr("tessera_extender_pods{state=\"bound\"} 1"));
}

// Issue 58 on Kubernetes: a trial pod is bound with its deadline set first (the kubelet ends it
// there), its end - with what its agent measured - is told on it with what to ask, and a pod of its
// kind asking tessera.io/gpu-memory "auto" is then sized from it, which the pod says.
TEST_F(ServiceTest, ATrialIsBoundWithItsDeadlineAndItsEndSizesTheNextAutoPod) {
  Start();
  ASSERT_TRUE(Eventually([&] { return service_->extender().stats().nodes == 2; }));
  auto schedule = [&](const json& pod) {
    json f = Post("filter", {{"Pod", pod}, {"NodeNames", {"n1"}}});
    EXPECT_EQ(f["NodeNames"], json({"n1"})) << f.dump();
    return Post("bind", {{"PodName", pod["metadata"]["name"]},
                         {"PodNamespace", "ml"},
                         {"PodUID", pod["metadata"]["uid"]},
                         {"Node", "n1"}});
  };
  json trial =
      Create(GpuPod("ml", "try", {.shares = 1, .annotations = {{"tessera.io/trial", "2m"}}}));
  EXPECT_EQ(schedule(trial)["Error"], "");
  json stored = *api_.Get(Pods("ml"), "try");
  EXPECT_EQ(stored["spec"]["nodeName"], "n1");
  EXPECT_EQ(stored["spec"]["activeDeadlineSeconds"], 120);
  // (What the bind relies on: the API server never lets that deadline be raised or removed.)
  EXPECT_FALSE(
      client_->MergePatch(Pods("ml") + "/try", {{"spec", {{"activeDeadlineSeconds", 600}}}}).ok());
  // The kubelet ended it at its deadline; its agent wrote what it used.
  stored["status"] = {{"phase", "Failed"}, {"reason", "DeadlineExceeded"}};
  stored["metadata"]["annotations"][kube::kGpuUseAnnotation] =
      kube::FormatGpuUse({.seconds = 120, .busy_permille = 180, .peak_mib = 3000});
  api_.Put(Pods("ml"), stored);
  ASSERT_TRUE(Eventually([&] { return !EventOn("try", "TrialResult").empty(); }));
  EXPECT_EQ(
      EventOn("try", "TrialResult"),
      "its trial of 2m ended after 120 s: its GPU 18% busy, peak GPU memory 3000MiB; "
      "recommended: tessera.io/gpu-share: 1 (of 4 per GPU) with tessera.io/gpu-memory: "
      "3840Mi (with 20% margin), or tessera.io/gpu-share and tessera.io/gpu-memory: auto, which "
      "size from this trial");
  json sized = Create(
      GpuPod("ml", "try-2", {.shares = 1, .annotations = {{"tessera.io/gpu-memory", "auto"}}}));
  EXPECT_EQ(schedule(sized)["Error"], "");
  stored = *api_.Get(Pods("ml"), "try-2");
  EXPECT_FALSE(stored["spec"].contains("activeDeadlineSeconds")) << "not a trial";
  const std::string sizing = stored["metadata"]["annotations"].value("tessera.io/sizing", "");
  EXPECT_EQ(sizing,
            "gpu-memory 3840Mi: a peak of 3000MiB (p95 of ml's runs of 'pods of its shape' (1 "
            "run)) + 20%");
  auto as = kube::ParseAssignment(
      stored["metadata"]["annotations"][kube::kAssignmentAnnotation].get<std::string>());
  ASSERT_TRUE(as.ok()) << as.status();
  EXPECT_EQ(as->containers.at(0).memory, uint64_t{3840} << 20);
  ASSERT_TRUE(Eventually([&] { return EventOn("try-2", "SizedAutomatically") == sizing; }));
}

// The use history outlives the extender: what ended pods used is kept in its ConfigMap, read back
// at a restart - after the ended pods are gone - and a pod still in the API server is not counted
// twice; unreadable records are skipped, the rest read.
TEST_F(ServiceTest, TheUseHistoryOutlivesARestartAndTheEndedPodsGone) {
  ServiceOptions o;
  o.history_configmap = "tessera-system/tessera-gpu-history";
  o.history_write_interval_s = 0;
  Start(o);
  ASSERT_TRUE(Eventually([&] { return service_->extender().stats().nodes == 2; }));
  auto ended = [&](const std::string& name, int64_t peak) {
    json pod = GpuPod("ml", name, {.shares = 1, .annotations = {{"tessera.io/gpu-memory", "4Gi"}}});
    pod["spec"]["nodeName"] = "n1";
    pod["status"]["phase"] = "Succeeded";
    pod["metadata"]["annotations"][kube::kGpuUseAnnotation] =
        kube::FormatGpuUse({.seconds = 60, .peak_mib = peak, .limit_mib = 4096});
    return Create(pod);
  };
  auto stored = [&]() -> json {
    auto cm = api_.Get("/api/v1/namespaces/tessera-system/configmaps", "tessera-gpu-history");
    return cm ? json::parse((*cm)["data"].value("history.json", "[]"), nullptr, false) : json();
  };
  ended("gone", 3000);
  // One record per pod: its own kind's shape, and those of the "auto" kinds it sizes too.
  ASSERT_TRUE(Eventually([&] { return stored().is_array() && stored().size() == 1; }))
      << stored().dump();
  EXPECT_EQ(stored()[0]["shape"], "25% 4096MiB");
  EXPECT_EQ(stored()[0]["alsoShapes"], json({"25% auto", "auto 4096MiB", "auto auto"}));
  ended("kept", 2000);
  ASSERT_TRUE(Eventually([&] { return stored().size() == 2; })) << stored().dump();
  service_->Stop();
  service_.reset();
  ASSERT_TRUE(api_.Delete(Pods("ml"), "gone"));
  // A record someone broke by hand is skipped; the others are read.
  auto cm = *api_.Get("/api/v1/namespaces/tessera-system/configmaps", "tessera-gpu-history");
  json records = stored();
  records.push_back({{"uid", "x"}, {"shape", 7}});
  cm["data"]["history.json"] = records.dump();
  api_.Put("/api/v1/namespaces/tessera-system/configmaps", cm);
  Start(o);
  ASSERT_TRUE(Eventually([&] { return service_->extender().stats().nodes == 2; }));
  json pod = Create(
      GpuPod("ml", "sized", {.shares = 1, .annotations = {{"tessera.io/gpu-memory", "auto"}}}));
  json f = Post("filter", {{"Pod", pod}, {"NodeNames", {"n1"}}});
  ASSERT_EQ(f["NodeNames"], json({"n1"})) << f.dump();
  EXPECT_EQ(Post("bind", {{"PodName", "sized"}, {"PodNamespace", "ml"}, {"Node", "n1"}})["Error"],
            "");
  // The two pods' peaks - not three: the kept pod, listed again, was learned already.
  // p95 of 2000 and 3000 MiB is 3000; + 20% = 3600, rounded up to 256 MiB: 3840.
  EXPECT_EQ(
      (*api_.Get(Pods("ml"), "sized"))["metadata"]["annotations"].value("tessera.io/sizing", ""),
      "gpu-memory 3840Mi: a peak of 3000MiB (p95 of ml's runs of 'pods of its shape' (2 runs)) + "
      "20%");
  EXPECT_THAT(service_->Metrics(),
              HasSubstr("tessera_extender_use_history_writes_total{result=\"error\"} 0"));
}

// Restarted while the API server fails: until nodes, pods and PodGroups are listed, every node
// waits with the reason (a placement now could give out GPUs a running pod holds). A cluster
// without the coscheduling CRD is ready all the same.
TEST_F(ServiceTest, ACoschedulingCrdThatIsNotInstalledIsNoErrorAndNoWait) {
  api_.SetServed("scheduling.x-k8s.io", false);
  json running = GpuPod("ml", "running", {.gpus = 2});
  running["spec"]["nodeName"] = "n1";
  running["status"]["phase"] = "Running";
  Create(running);
  Start();
  EXPECT_TRUE(service_->Ready());
  EXPECT_EQ(service_->extender().stats().bound, 1);
  EXPECT_THAT(service_->Metrics(), HasSubstr("tessera_extender_api_server_up 1"));
  json f = Post("filter", {{"Pod", Create(GpuPod("ml", "new", {.gpus = 2}))},
                           {"Nodes", nullptr},
                           {"NodeNames", {"n1", "n2"}}});
  ASSERT_EQ(f["NodeNames"].size(), 1u) << f.dump();
  EXPECT_EQ(f["NodeNames"][0], "n2");
}

TEST_F(ServiceTest, FilterBeforeThePodsAreListedAnswersEveryNodeWaits) {
  // The pod list fails (a slow or failing list after a restart); the pod itself can be read.
  json running = GpuPod("ml", "running", {.gpus = 2});
  running["spec"]["nodeName"] = "n1";
  running["status"]["phase"] = "Running";
  Create(running);
  json pod = Create(GpuPod("ml", "new", {.gpus = 2}));
  api_.SetFailStatus(500, "/api/v1/pods");
  ServiceOptions o;
  o.listen = "127.0.0.1:0";
  o.extender.scheduler.random_ties = false;
  auto s = Service::Start(*client_, o, clock_);
  ASSERT_TRUE(s.ok()) << s.status();
  service_ = std::move(*s);
  http_ = std::make_unique<net::HttpClient>("tcp://127.0.0.1:" + std::to_string(service_->port()));
  ASSERT_TRUE(Eventually([&] { return service_->extender().stats().nodes == 2; }));
  json names = {"n1", "n2"};
  json f = Post("filter", {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", names}});
  EXPECT_TRUE(f["NodeNames"].empty()) << f.dump();
  EXPECT_THAT(f["FailedNodes"]["n1"].get<std::string>(), HasSubstr("starting"));
  EXPECT_THAT(f["FailedNodes"]["n2"].get<std::string>(), HasSubstr("starting"));
  EXPECT_EQ(f["Error"], "");
  EXPECT_EQ(service_->extender().stats().reserved, 0);
  // Listed: the running pod's GPUs are known, and the new one goes where they are not.
  api_.SetFailStatus(0);
  ASSERT_TRUE(service_->WaitForSync(std::chrono::seconds(30)));  // the informer's backoff first
  f = Post("filter", {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", names}});
  ASSERT_EQ(f["NodeNames"].size(), 1u) << f.dump();
  EXPECT_EQ(f["NodeNames"][0], "n2");
}

TEST_F(ServiceTest, NodeListFormWhenNotNodeCacheCapable) {
  Start();
  json pod = Create(GpuPod("ml", "p", {.gpus = 1}));
  json list = {{"items", json::array({*api_.Get(kNodes, "n1"), *api_.Get(kNodes, "n2")})}};
  json f = Post("filter", {{"Pod", pod}, {"Nodes", list}, {"NodeNames", nullptr}});
  ASSERT_EQ(f["Nodes"]["items"].size(), 1u) << f.dump();
  EXPECT_EQ(f["Nodes"]["items"][0]["metadata"]["name"], "n1");
  EXPECT_TRUE(f["NodeNames"].is_null());
}

TEST_F(ServiceTest, UnplacedPodsGetReasonsAndBadRequestsAre400) {
  Start();
  json big = Create(GpuPod("ml", "big", {.gpus = 3}));
  json f = Post("filter", {{"Pod", big}, {"NodeNames", {"n1", "n2", "cpu-only"}}});
  EXPECT_TRUE(f["NodeNames"].empty());
  EXPECT_THAT(f["FailedNodes"]["n1"].get<std::string>(), HasSubstr("GPU"));
  EXPECT_THAT(f["FailedAndUnresolvableNodes"]["cpu-only"].get<std::string>(),
              HasSubstr("no Tessera GPUs"));

  json err = Post("filter", {{"Pod", Create(GpuPod("ml", "plain", {}))}, {"NodeNames", {"n1"}}});
  EXPECT_THAT(err["Error"].get<std::string>(), HasSubstr("requests neither tessera.io/gpu"));

  auto raw = http_->Send("POST", "/filter", "{not json");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->status, 400);
  EXPECT_THAT(raw->body, HasSubstr("filter: the body is not a JSON object"));
  Post("filter", {{"Pod", "x"}, {"NodeNames", {"n1"}}}, 400);
  Post("filter", {{"Pod", big}}, 400);
  Post("filter", {{"Pod", big}, {"NodeNames", {1, 2}}}, 400);
  Post("bind", {{"PodName", "big"}}, 400);
  Post("preempt", json::array(), 400);
  Post("schedule", json::object(), 400);
  // A bind for a pod with nothing reserved is an Error, not a crash.
  json b = Post("bind", {{"PodName", "ghost"}, {"PodNamespace", "ml"}, {"Node", "n1"}});
  EXPECT_THAT(b["Error"].get<std::string>(), HasSubstr("no GPUs reserved"));
  EXPECT_THAT(service_->Metrics(), HasSubstr("tessera_extender_bad_requests_total 7"));
  // Nothing changed: the pod that waits is still the only one queued.
  EXPECT_EQ(service_->extender().stats().queued, 1);
  EXPECT_EQ(service_->extender().stats().reserved, 0);
}

TEST_F(ServiceTest, PreemptionEvictsThroughTheApiAndThePodStartsAfter) {
  Start();
  json low = Create(GpuPod("ml", "low", {.gpus = 2, .priority = 1}));
  json f = Post("filter", {{"Pod", low}, {"NodeNames", {"n1"}}});
  ASSERT_EQ(f["NodeNames"][0], "n1");
  Post("bind", {{"PodName", "low"}, {"PodNamespace", "ml"}, {"Node", "n1"}});
  json high = Create(GpuPod("ml", "high", {.gpus = 2, .priority = 100}));
  json victims = {{"Pods", json::array({json{{"UID", low["metadata"]["uid"]}}})},
                  {"NumPDBViolations", 0}};
  json args = {{"Pod", high}, {"NodeNameToMetaVictims", {{"n1", victims}}}};
  // Before any filter (kube-scheduler always filters first), nothing was asked: nothing to answer.
  EXPECT_TRUE(Post("preempt", args)["NodeNameToMetaVictims"].empty());
  // Filter: the cycle chooses the victim and the extender evicts it itself (kube-scheduler
  // preempts only for higher priority; reclaiming quota needs no priority).
  json w = Post("filter", {{"Pod", high}, {"NodeNames", {"n1"}}});
  EXPECT_THAT(w["FailedNodes"]["n1"].get<std::string>(), HasSubstr("preempted"));
  // (kube-scheduler's preempt then hears the same victim while it is still there: the eviction
  // runs on its own thread here, so that is the extender's unit tests' to check.)
  // The extender evicted it through the Eviction API.
  ASSERT_TRUE(Eventually([&] { return !api_.Get(Pods("ml"), "low").has_value(); }));
  bool evicted = false;
  for (const auto& r : api_.Requests()) evicted |= r.resource == "pods/eviction";
  EXPECT_TRUE(evicted);
  ASSERT_TRUE(Eventually([&] { return !service_->extender().AllocationOf("ml/low"); }));
  json again = Post("filter", {{"Pod", high}, {"NodeNames", {"n1"}}});
  EXPECT_EQ(again["NodeNames"][0], "n1");
  // Both pods say so in their Events: the victim why it went, the other why it waited.
  ASSERT_TRUE(Eventually([&] {
    return EventOn("low", "Preempted").find("preempted for ml/high") != std::string::npos &&
           !EventOn("high", "WaitingForPreemption").empty();
  })) << EventOn("low", "Preempted");
}

// Anyone who can reach the extender can post to it: what it acts on is the API server's pod, never
// the request's. A forged pod (not on the API server) at priority 2e9 evicts nothing; a real pod's
// body claiming a higher priority than it has is read at its own; a 60 MiB name is neither looked
// up nor echoed.
TEST_F(ServiceTest, OnlyTheApiServersPodIsBelievedNotTheRequestsBody) {
  Start();
  json low = Create(GpuPod("ml", "low", {.gpus = 2, .priority = 1}));
  ASSERT_EQ(Post("filter", {{"Pod", low}, {"NodeNames", {"n1"}}})["NodeNames"][0], "n1");
  Post("bind", {{"PodName", "low"}, {"PodNamespace", "ml"}, {"Node", "n1"}});
  json forged = GpuPod("ml", "forged", {.gpus = 2, .priority = 2000000000});
  forged["metadata"]["uid"] = "f0f0";
  json f = Post("filter", {{"Pod", forged}, {"NodeNames", {"n1"}}});
  EXPECT_THAT(f["Error"].get<std::string>(), HasSubstr("ml/forged is not on the API server"));
  EXPECT_TRUE(
      Post("preempt",
           {{"Pod", forged},
            {"NodeNameToMetaVictims",
             {{"n1", {{"Pods", {{{"UID", low["metadata"]["uid"]}}}}}}}}})["NodeNameToMetaVictims"]
          .empty());
  // A real pod, its body lying about its priority.
  json modest = Create(GpuPod("ml", "modest", {.gpus = 2, .priority = 0}));
  json lying = modest;
  lying["spec"]["priority"] = 2000000000;
  json w = Post("filter", {{"Pod", lying}, {"NodeNames", {"n1"}}});
  EXPECT_TRUE(w["NodeNames"].empty());
  EXPECT_THAT(w["FailedNodes"].dump(), ::testing::Not(HasSubstr("preempted")));
  // The same name with another UID (a pod deleted and made again) is not the pod asked about.
  json stale = modest;
  stale["metadata"]["uid"] = "not-its-uid";
  EXPECT_THAT(Post("filter", {{"Pod", stale}, {"NodeNames", {"n1"}}})["Error"].get<std::string>(),
              HasSubstr("UID not-its-uid is not the API server's"));
  json huge = forged;
  huge["metadata"]["name"] = std::string(60 << 20, 'x');
  json h = Post("filter", {{"Pod", huge}, {"NodeNames", {"n1"}}});
  EXPECT_LT(h.dump().size(), 1000u) << "nothing echoed whole";
  EXPECT_THAT(h["Error"].get<std::string>(), HasSubstr("62914560 bytes"));
  // Nothing was evicted, and low still holds its GPUs.
  ASSERT_TRUE(service_->events()->Flush(std::chrono::seconds(10)));
  for (const auto& r : api_.Requests()) EXPECT_NE(r.resource, "pods/eviction");
  EXPECT_TRUE(api_.Get(Pods("ml"), "low").has_value());
  EXPECT_THAT(service_->Metrics(), HasSubstr("tessera_extender_unknown_pods_total 4"));
}

TEST_F(ServiceTest, QuotasComeFromTheConfigMapAndABadOneIsReported) {
  api_.Put("/api/v1/namespaces/tessera-system/configmaps",
           testing::QuotaConfigMap("namespaces:\n  ml: {guaranteed: {gpus: 1}}\n"));
  ServiceOptions o;
  o.quota_configmap = "tessera-system/tessera-quotas";
  Start(o);
  json p1 = Create(GpuPod("ml", "p1", {.gpus = 1}));
  json p2 = Create(GpuPod("ml", "p2", {.gpus = 1}));
  EXPECT_EQ(Post("filter", {{"Pod", p1}, {"NodeNames", {"n1", "n2"}}})["NodeNames"].size(), 1u);
  json f = Post("filter", {{"Pod", p2}, {"NodeNames", {"n1", "n2"}}});
  EXPECT_THAT(f["FailedNodes"]["n1"].get<std::string>(), HasSubstr("quota"));
  ASSERT_TRUE(Eventually([&] { return !EventOn("p2", "WaitingForQuota").empty(); }));
  EXPECT_THAT(EventOn("p2", "WaitingForQuota"), HasSubstr("quota"));
  EXPECT_TRUE(EventOn("p1", "WaitingForQuota").empty()) << "placed: no event";
  EXPECT_THAT(service_->Metrics(),
              HasSubstr("tessera_extender_quota_used_gpus{namespace=\"ml\"} 1"));
  api_.Put("/api/v1/namespaces/tessera-system/configmaps",
           testing::QuotaConfigMap("namespaces:\n  ml: {guaranteed: {gpus: many}}\n"));
  ASSERT_TRUE(Eventually([&] {
    return service_->Metrics().find("tessera_extender_quota_error 1") != std::string::npos;
  }));
  // The quota in force stays.
  EXPECT_THAT(Post("filter", {{"Pod", p2}, {"NodeNames", {"n1", "n2"}}})["FailedNodes"].dump(),
              HasSubstr("quota"));
}

// deploy/'s RBAC for the extender grants exactly the (verb, resource) pairs it uses: every flow is
// run against the fake API server, which records each request's verb and resource.
TEST_F(ServiceTest, RbacInDeployCoversExactlyTheVerbsUsed) {
  api_.Put("/api/v1/namespaces/tessera-system/configmaps",
           testing::QuotaConfigMap("namespaces:\n  ml: {guaranteed: {gpus: 4}}\n"));
  api_.Put("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups",
           testing::PodGroup("ml", "job", 2));
  ServiceOptions o;
  o.quota_configmap = "tessera-system/tessera-quotas";
  o.history_configmap = "tessera-system/tessera-gpu-history";
  o.history_write_interval_s = 0;
  o.event_repeat_s = 0;  // the waiting gang member's repeats patch its event
  Start(o);
  // Two pods end with their use measured: the use history is made, then replaced.
  for (const char* name : {"done-0", "done-1"}) {
    json pod = GpuPod("ml", name, {.shares = 1});
    pod["spec"]["nodeName"] = "n1";
    pod["status"]["phase"] = "Succeeded";
    pod["metadata"]["annotations"][kube::kGpuUseAnnotation] =
        kube::FormatGpuUse({.seconds = 60, .peak_mib = 1000});
    const std::string uid = Create(pod)["metadata"]["uid"];
    ASSERT_TRUE(Eventually([&] {
      auto cm = api_.Get("/api/v1/namespaces/tessera-system/configmaps", "tessera-gpu-history");
      return cm &&
             (*cm)["data"].value("history.json", "").find('"' + uid + '"') != std::string::npos;
    }));
  }
  // A gang of two on n2: the first waits, the second completes it, the first is marked reserved.
  json g0 = Create(GpuPod("ml", "g0", {.gpus = 1, .pod_group = "job"}));
  ASSERT_TRUE(Eventually([&] {
    json f = Post("filter", {{"Pod", g0}, {"NodeNames", {"n2"}}});
    return f["FailedNodes"].dump().find("1 of 2") != std::string::npos;
  }));
  json g1 = Create(GpuPod("ml", "g1", {.gpus = 1, .pod_group = "job"}));
  ASSERT_EQ(Post("filter", {{"Pod", g1}, {"NodeNames", {"n2"}}})["NodeNames"].size(), 1u);
  ASSERT_TRUE(Eventually([&] {
    auto pod = api_.Get(Pods("ml"), "g0");
    return pod && (*pod)["metadata"]["annotations"].value("tessera.io/reservation", "") == "n2";
  }));
  json low = Create(GpuPod("ml", "low", {.gpus = 2, .priority = 1}));
  ASSERT_EQ(Post("filter", {{"Pod", low}, {"NodeNames", {"n1"}}})["NodeNames"].size(), 1u);
  Post("bind", {{"PodName", "low"}, {"PodNamespace", "ml"}, {"Node", "n1"}});
  json high = Create(GpuPod("ml", "high", {.gpus = 2, .priority = 100}));
  Post("filter", {{"Pod", high}, {"NodeNames", {"n1"}}});
  ASSERT_TRUE(Eventually([&] { return !api_.Get(Pods("ml"), "low").has_value(); }));
  // A pod that waits, asked about again once its Event exists: the repeat patches the Event.
  json big = Create(GpuPod("ml", "big", {.gpus = 3}));
  Post("filter", {{"Pod", big}, {"NodeNames", {"n2"}}});
  ASSERT_TRUE(Eventually([&] { return !EventOn("big", "WaitingForGpus").empty(); }));
  // The recorder knows the Event's name once the create has answered (the API server may show
  // the Event a moment before): a repeat before that is only counted.
  ASSERT_TRUE(service_->events()->Flush(std::chrono::seconds(10)));
  Post("filter", {{"Pod", big}, {"NodeNames", {"n2"}}});
  ASSERT_TRUE(service_->events()->Flush(std::chrono::seconds(10)));
  EXPECT_GE(service_->events()->stats().patched, 1u);
  service_->Stop();
  // What `tessera extender --tls-secret` does before it serves: its Secret made, read at a
  // restart, and patched with a server certificate for a new name.
  TlsSecretOptions tls{.ns = "tessera-system",
                       .name = "tessera-extender-tls",
                       .dns = {"localhost"},
                       .dir = ::testing::TempDir() + "rbac-tls"};
  ASSERT_TRUE(EnsureTlsSecret(*client_, tls).ok());
  tls.dns.push_back("tessera-extender.tessera-system.svc");
  ASSERT_TRUE(EnsureTlsSecret(*client_, tls).ok());

  std::set<std::string> used;
  for (const auto& r : api_.Requests()) {
    if (r.user == "tester" && !r.verb.empty()) used.insert(r.verb + " " + r.resource);
  }
  // A pod kube-scheduler asks about before the extender's watch has seen it is read from the API
  // server (TrustedPod): whether that happened in this run is timing, so it counts as used.
  used.insert("get pods");
  std::set<std::string> granted;
  for (const YAML::Node& doc :
       YAML::LoadAllFromFile(TESSERA_SOURCE_DIR "/deploy/base/rbac-extender.yaml")) {
    std::string kind = doc["kind"].as<std::string>();
    if (kind != "ClusterRole" && kind != "Role") continue;
    for (const YAML::Node& rule : doc["rules"]) {
      for (const YAML::Node& group : rule["apiGroups"]) {
        for (const YAML::Node& res : rule["resources"]) {
          std::string resource = res.as<std::string>();
          std::string g = group.as<std::string>();
          if (!g.empty()) {
            size_t slash = resource.find('/');
            resource = slash == std::string::npos
                           ? resource + "." + g
                           : resource.substr(0, slash) + "." + g + resource.substr(slash);
          }
          for (const YAML::Node& verb : rule["verbs"]) {
            granted.insert(verb.as<std::string>() + " " + resource);
          }
        }
      }
    }
  }
  EXPECT_EQ(used, granted);
}

size_t Collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// With client certificates on the main port, Prometheus and the kubelet's probes use a plain port
// that answers nothing but GET /metrics and /healthz.
TEST_F(ServiceTest, MetricsAndHealthHaveAPlainPortOfTheirOwn) {
  ServiceOptions o;
  o.metrics_listen = "127.0.0.1:0";
  Start(o);
  ASSERT_GT(service_->metrics_port(), 0);
  net::HttpClient m("tcp://127.0.0.1:" + std::to_string(service_->metrics_port()));
  auto metrics = m.Send("GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("tessera_extender_"));
  auto health = m.Send("GET", "/healthz");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200);
  auto filter = m.Send("POST", "/filter", R"({"Pod": {}})");
  ASSERT_TRUE(filter.ok());
  EXPECT_EQ(filter->status, 404) << "a scheduling verb on the metrics port";
  ServiceOptions clash = o;
  clash.listen = "127.0.0.1:0";
  clash.metrics_listen = "127.0.0.1:" + std::to_string(service_->metrics_port());
  auto s = Service::Start(*client_, clash, clock_);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--metrics-listen"));
}

TEST_F(ServiceTest, ServesHttpsWithACertificatePair) {
  std::string dir = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp");
  std::string cert = dir + "/extender.crt", key = dir + "/extender.key";
  fakes::WriteTestCertificate(cert, key);
  ServiceOptions o;
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  Start(o);
  std::string url = "https://127.0.0.1:" + std::to_string(service_->port()) + "/healthz";
  CURL* c = curl_easy_init();
  std::string body;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_CAINFO, cert.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  ASSERT_EQ(curl_easy_perform(c), CURLE_OK);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  EXPECT_EQ(code, 200);
  EXPECT_EQ(body, "ok\n");
  curl_easy_cleanup(c);
  // Plain HTTP on the TLS port gets no answer.
  auto plain = http_->Send("GET", "/healthz");
  EXPECT_TRUE(!plain.ok() || plain->status != 200);
  // A key that does not exist is named.
  ServiceOptions bad = o;
  bad.tls_key_file = dir + "/missing.key";
  bad.listen = "127.0.0.1:0";
  auto s = Service::Start(*client_, bad, clock_);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("missing.key"));
}

TEST_F(ServiceTest, DraPodsAreFilteredAndScoredByTheirClaimsAndOthersPassUntouched) {
  const std::string slices = "/apis/resource.k8s.io/v1/resourceslices";
  api_.Put(slices, testing::DraSlice("n1"));
  api_.Put(slices, testing::DraSlice("n2"));
  // n1's share GPU is half taken, n2's untouched; n1 has no whole GPU left.
  api_.Put("/apis/resource.k8s.io/v1/namespaces/a/resourceclaims",
           testing::DraAllocated("c1", "n1",
                                 {"gpu-0", "gpu-1", "gpu-2", "gpu-3-share-0", "gpu-3-share-1"}));
  for (const auto& [name, cls, n] : std::vector<std::tuple<std::string, const char*, int>>{
           {"whole", kDraGpuClass, 1}, {"one", kDraShareClass, 1}}) {
    api_.Put("/apis/resource.k8s.io/v1/namespaces/a/resourceclaimtemplates",
             testing::DraTemplate(name, cls, n));
  }
  ServiceOptions o;
  o.dra = true;
  Start(o);
  ASSERT_TRUE(Eventually([&] { return service_->dra()->Free().size() == 2; }));
  auto post = [&](const std::string& verb, const json& pod) {
    json stored = Create(pod);
    return Post("../dra/" + verb, {{"Pod", stored}, {"NodeNames", {"n1", "n2", "cpu-only"}}});
  };
  // A whole GPU: n1 has none free.
  json whole = testing::DraPod("whole");
  whole["metadata"]["name"] = "w";
  json f = post("filter", whole);
  EXPECT_EQ(f["NodeNames"], json({"n2", "cpu-only"})) << f.dump();
  EXPECT_THAT(f["FailedNodes"]["n1"].get<std::string>(), HasSubstr("0 whole, 2 shares"));
  // kube-scheduler asks prioritize next: the pod's shape joins the typical workload FGD uses.
  Post("../dra/prioritize", {{"Pod", api_.Get(Pods("a"), "w").value()}, {"NodeNames", {"n2"}}});
  // A share: where it fills the GPU already split (n1) scores above where it splits one (n2).
  json share = testing::DraPod("one");
  share["metadata"]["name"] = "s";
  json scores = post("prioritize", share);
  ASSERT_EQ(scores.size(), 3u) << scores.dump();
  EXPECT_EQ(scores[0]["Host"], "n1");
  EXPECT_GT(scores[0]["Score"].get<int>(), scores[1]["Score"].get<int>()) << scores.dump();
  // A pod with Tessera's extended resources belongs to the other entry; a CPU pod to nobody: both
  // get every node back and no opinion.
  json gpu_pod = Create(GpuPod("ml", "dp", {.gpus = 1}));
  f = Post("../dra/filter", {{"Pod", gpu_pod}, {"NodeNames", {"n1", "n2"}}});
  EXPECT_EQ(f["NodeNames"], json({"n1", "n2"}));
  json cpu =
      Create({{"metadata", {{"name", "cpu"}, {"namespace", "a"}}}, {"spec", json::object()}});
  scores = Post("../dra/prioritize", {{"Pod", cpu}, {"NodeNames", {"n1", "n2"}}});
  EXPECT_EQ(scores, json::parse(R"([{"Host":"n1","Score":0},{"Host":"n2","Score":0}])"));
  EXPECT_THAT(service_->Metrics(),
              HasSubstr("tessera_extender_dra_calls_total{verb=\"filter\"} 1"));

  // deploy/components/dra grants the extender exactly the resource.k8s.io verbs it used.
  std::set<std::string> used, granted;
  auto collect_used = [&] {
    used.clear();
    for (const auto& r : api_.Requests()) {
      if (r.user == "tester" && r.resource.ends_with(".resource.k8s.io")) {
        used.insert(r.verb + " " + r.resource);
      }
    }
  };
  for (const YAML::Node& doc :
       YAML::LoadAllFromFile(TESSERA_SOURCE_DIR "/deploy/components/dra/rbac.yaml")) {
    if (doc["kind"].as<std::string>() != "ClusterRole" ||
        doc["metadata"]["name"].as<std::string>() != "tessera-extender-dra") {
      continue;
    }
    for (const YAML::Node& rule : doc["rules"]) {
      for (const YAML::Node& group : rule["apiGroups"]) {
        for (const YAML::Node& res : rule["resources"]) {
          for (const YAML::Node& verb : rule["verbs"]) {
            granted.insert(verb.as<std::string>() + " " + res.as<std::string>() + "." +
                           group.as<std::string>());
          }
        }
      }
    }
  }
  // Each informer's watch begins after its list, on its own thread: waited for, not assumed.
  Eventually([&] {
    collect_used();
    return used == granted;
  });
  collect_used();
  EXPECT_EQ(used, granted);
}

}  // namespace
}  // namespace tessera::extender

namespace tessera::extender {
namespace {

// tessera.io/gpu-share: auto end to end with deploy/components/auto-share's own webhook
// configuration: the extender writes its CA into it, the API server (the fake, calling webhooks
// as the real one does: only pods its matchConditions select, the certificate checked against
// that caBundle) sends each "auto" pod's creation to the extender, which sizes its share from what
// ended pods of its kind used; the pod is stored sized, and bound with its sizing said. With the
// extender away, an "auto" pod is not created (failurePolicy Fail), other pods are. The RBAC of
// the component is exactly what the extender used.
class AutoShareTest : public ServiceTest {
 protected:
  void TearDown() override {
    ServiceTest::TearDown();
    std::filesystem::remove_all(dir_);
  }
  // The extender started with its webhook (and `o`'s other options), deploy/components/auto-share's
  // webhook configuration stored, its Service reached at the webhook's port, and its caBundle
  // written by the extender.
  void StartWebhook(ServiceOptions o = {}) {
    auto tls = EnsureTlsSecret(*client_, {.ns = "tessera-system",
                                          .name = "tessera-extender-tls",
                                          .dns = {"localhost"},
                                          .dir = dir_});
    ASSERT_TRUE(tls.ok()) << tls.status();
    tls_ = *tls;
    config_ = fakes::JsonOfYaml(
        YAML::LoadFile(TESSERA_SOURCE_DIR "/deploy/components/auto-share/webhook.yaml"));
    ASSERT_EQ(config_["kind"], "MutatingWebhookConfiguration");
    api_.Put("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", config_);
    api_.ClearRequests();
    o.tls_cert_file = tls_.cert_file;
    o.tls_key_file = tls_.key_file;
    o.webhook_listen = "127.0.0.1:0";
    o.webhook_configuration = config_["metadata"]["name"];
    o.webhook_ca_file = tls_.ca_file;
    o.webhook_ca_check_s = 0.05;
    Start(o);
    ASSERT_GT(service_->webhook_port(), 0);
    http_ = std::make_unique<net::HttpClient>(
        "https://localhost:" + std::to_string(service_->port()), "", tls_.ca_file);
    const json& ref = config_["webhooks"][0]["clientConfig"]["service"];
    api_.SetServiceAddress(ref["namespace"], ref["name"], ref.value("port", 443),
                           "localhost:" + std::to_string(service_->webhook_port()));
    ASSERT_TRUE(Eventually([&] {
      auto c = api_.Get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                        "tessera-auto-share");
      return c && !(*c)["webhooks"][0]["clientConfig"].value("caBundle", "").empty();
    }));
  }
  // A pod of Job "infer" asking `shares`, annotated gpu-share: auto when `automatic`.
  static json Infer(const std::string& name, int shares, bool automatic) {
    json pod = GpuPod("ml", name, {.shares = shares});
    pod["metadata"].erase("uid");
    pod["metadata"]["labels"] = {{"batch.kubernetes.io/job-name", "infer"}};
    if (automatic) pod["metadata"]["annotations"]["tessera.io/gpu-share"] = "auto";
    return pod;
  }
  const std::string dir_ = ::testing::TempDir() + "auto-share-tls";
  TlsFiles tls_;
  json config_;
};

TEST_F(AutoShareTest, AnAutoSharePodIsSizedAsTheApiServerCreatesIt) {
  ASSERT_NO_FATAL_FAILURE(StartWebhook());
  const json& config = config_;
  ASSERT_TRUE(Eventually([&] {
    return service_->Metrics().find("tessera_extender_webhook_ca_bundle_current 1") !=
           std::string::npos;
  }));
  // The configuration applied again (kubectl apply, helm upgrade) without a caBundle: set again.
  api_.Put("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", config);
  ASSERT_TRUE(Eventually([&] {
    auto c = api_.Get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                      "tessera-auto-share");
    return c && !(*c)["webhooks"][0]["clientConfig"].value("caBundle", "").empty();
  }));
  auto create = [&](json pod) { return client_->Create(Pods("ml"), pod); };
  auto infer = &AutoShareTest::Infer;
  // Not asking auto: never sent to the webhook (matchConditions), created as asked.
  ASSERT_TRUE(create(infer("plain", 2, false)).ok());
  EXPECT_EQ(api_.admission_calls(), 0);
  // Nothing measured yet: what its container asks.
  auto first = create(infer("first", 3, true));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(api_.admission_calls(), 1);
  EXPECT_EQ((*first)["spec"]["containers"][0]["resources"]["limits"]["tessera.io/gpu-share"], "3");
  EXPECT_EQ((*first)["metadata"]["annotations"]["tessera.io/sizing"],
            "gpu-share 3 (of 4 per GPU): no measured runs of its kind yet, the count its "
            "container asks; its use is measured for the next");
  // Pods of its kind end, measured 10%, 20% and 15% busy (by hand-sized shares, and by itself).
  int i = 0;
  for (int permille : {100, 200, 150}) {
    json pod =
        i == 2 ? *api_.Get(Pods("ml"), "first") : infer("done-" + std::to_string(i), 2, false);
    pod["spec"]["nodeName"] = "n1";
    pod["status"]["phase"] = "Succeeded";
    pod["metadata"]["annotations"][kube::kGpuUseAnnotation] =
        kube::FormatGpuUse({.seconds = 600, .busy_permille = permille, .peak_mib = 900});
    api_.Put(Pods("ml"), pod);
    ++i;
  }
  // p95 of 10, 20, 15% is 20%; + 20% is 24%: one share of four.
  json sized;
  ASSERT_TRUE(Eventually([&] {
    auto p = create(infer("next-" + std::to_string(++i), 3, true));
    if (!p.ok()) return false;
    sized = *p;  // once the extender has learned all three
    return sized["metadata"]["annotations"].value("tessera.io/sizing", "").find("(3 runs)") !=
           std::string::npos;
  })) << sized.dump();
  EXPECT_EQ(sized["spec"]["containers"][0]["resources"]["limits"]["tessera.io/gpu-share"], "1");
  const std::string sizing = sized["metadata"]["annotations"]["tessera.io/sizing"];
  EXPECT_EQ(
      sizing,
      "gpu-share 1 (of 4 per GPU): 20% busy (p95 of ml's runs of 'infer' with this command (3 "
      "runs)) + 20%");
  // Placed and bound as sized; the Binding keeps how, and an Event says it.
  const std::string name = sized["metadata"]["name"];
  json f = Post("filter", {{"Pod", sized}, {"NodeNames", {"n2"}}});
  ASSERT_EQ(f["NodeNames"], json({"n2"})) << f.dump();
  EXPECT_EQ(Post("bind", {{"PodName", name},
                          {"PodNamespace", "ml"},
                          {"PodUID", sized["metadata"]["uid"]},
                          {"Node", "n2"}})["Error"],
            "");
  json bound = *api_.Get(Pods("ml"), name);
  EXPECT_EQ(bound["metadata"]["annotations"]["tessera.io/sizing"], sizing);
  auto as = kube::ParseAssignment(
      bound["metadata"]["annotations"][kube::kAssignmentAnnotation].get<std::string>());
  ASSERT_TRUE(as.ok()) << as.status();
  EXPECT_EQ(as->containers.at(0).count, 1);
  ASSERT_TRUE(Eventually([&] { return EventOn(name, "SizedAutomatically") == sizing; }));
  // A pod that says auto but was never sized (created before the webhook was installed) is not
  // placed as if it had been.
  json unsized = Create(infer("unsized", 2, true));
  EXPECT_THAT(Post("filter", {{"Pod", unsized}, {"NodeNames", {"n2"}}})["Error"].dump(),
              HasSubstr("not sized when it was created"));
  EXPECT_THAT(service_->Metrics(), HasSubstr("tessera_extender_admission_total{result=\"sized\"} " +
                                             std::to_string(api_.admission_calls())));

  // The webhook configuration's RBAC (deploy/components/auto-share/rbac.yaml) is what was used.
  std::set<std::string> used, granted;
  for (const auto& r : api_.Requests()) {
    if (r.resource.find("mutatingwebhookconfigurations") != std::string::npos)
      used.insert(r.verb + " " + r.resource);
  }
  for (const YAML::Node& doc :
       YAML::LoadAllFromFile(TESSERA_SOURCE_DIR "/deploy/components/auto-share/rbac.yaml")) {
    if (doc["kind"].as<std::string>() != "ClusterRole") continue;
    for (const YAML::Node& rule : doc["rules"]) {
      EXPECT_EQ(rule["resourceNames"][0].as<std::string>(), "tessera-auto-share");
      for (const YAML::Node& verb : rule["verbs"])
        granted.insert(verb.as<std::string>() + " mutatingwebhookconfigurations." +
                       rule["apiGroups"][0].as<std::string>());
    }
  }
  EXPECT_EQ(used, granted);

  // The extender away: an auto pod is refused (never created unsized), others are created.
  service_->Stop();
  auto refused = create(infer("while-away", 2, true));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(kube::HttpStatusOf(refused.status()), 500);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("failed calling webhook \"auto-share.tessera.io\""));
  EXPECT_FALSE(api_.Get(Pods("ml"), "while-away").has_value());
  EXPECT_TRUE(create(infer("plain-2", 2, false)).ok());
}

// DRA: kube-controller-manager's resourceclaim controller makes a pod's claim from its
// ResourceClaimTemplate (the template's annotations, the pod its controller owner) - the claim
// asking "auto" is sized as the API server creates it (deploy/components/auto-share's second
// webhook): its gpu-share.tessera.io request's count from the busy share of its pod's kind's
// ended pods, in the driver's shares of a GPU (the ResourceSlices'), and a ShareConfig memory
// limit from their peaks. A claim not asking "auto" is never sent; one whose pod the API server
// does not have, or while the extender is away, is refused and not created.
TEST_F(AutoShareTest, AnAutoDraClaimIsSizedAsTheApiServerCreatesIt) {
  api_.Put("/apis/resource.k8s.io/v1/resourceslices", testing::DraSlice("n1"));  // 4 per GPU
  ServiceOptions o;
  o.dra = true;
  ASSERT_NO_FATAL_FAILURE(StartWebhook(o));
  ASSERT_TRUE(Eventually([&] { return service_->dra()->SharesPerGpu() == 4; }));
  const std::string claims = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";
  auto pod_of_job = [](const std::string& name) {
    json pod = GpuPod("ml", name, {.shares = 1});
    pod["metadata"].erase("uid");
    pod["metadata"]["labels"] = {{"batch.kubernetes.io/job-name", "infer"}};
    pod["spec"]["containers"][0]["resources"] = json::object();
    pod["spec"]["resourceClaims"] = {{{"name", "gpu"}, {"resourceClaimTemplateName", "share"}}};
    return pod;
  };
  auto claim_of = [](const json& pod, const std::string& name, json annotations) {
    return json{
        {"apiVersion", "resource.k8s.io/v1"},
        {"kind", "ResourceClaim"},
        {"metadata",
         {{"name", name},
          {"namespace", "ml"},
          {"annotations", annotations},
          {"ownerReferences",
           {{{"apiVersion", "v1"},
             {"kind", "Pod"},
             {"name", pod["metadata"]["name"]},
             {"uid", pod["metadata"].value("uid", "none")},
             {"controller", true},
             {"blockOwnerDeletion", true}}}}}},
        {"spec",
         {{"devices",
           {{"requests",
             {{{"name", "share"},
               {"exactly", {{"deviceClassName", "gpu-share.tessera.io"}, {"count", 3}}}}}}}}}}};
  };
  const json autos = {{"tessera.io/gpu-share", "auto"}, {"tessera.io/gpu-memory", "auto"}};
  // Not asking auto: never sent (matchConditions), created as asked.
  auto first_pod = client_->Create(Pods("ml"), pod_of_job("first"));
  ASSERT_TRUE(first_pod.ok()) << first_pod.status();
  ASSERT_TRUE(client_->Create(claims, claim_of(*first_pod, "plain", {{"team", "a"}})).ok());
  EXPECT_EQ(api_.admission_calls(), 0);
  // Nothing measured yet: as asked.
  auto first = client_->Create(claims, claim_of(*first_pod, "first-gpu", autos));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(api_.admission_calls(), 1);
  EXPECT_EQ((*first)["spec"]["devices"]["requests"][0]["exactly"]["count"], 3);
  EXPECT_FALSE((*first)["spec"]["devices"].contains("config"));
  EXPECT_THAT((*first)["metadata"]["annotations"].value("tessera.io/sizing", ""),
              HasSubstr("no measured runs of its kind yet"));
  // Pods of its kind end; their agents wrote their claims' use: 10%, 20%, 15% busy, peaks of 600,
  // 900 and 700 MiB.
  int i = 0;
  for (auto [permille, peak] : {std::pair{100, 600}, {200, 900}, {150, 700}}) {
    json pod = pod_of_job("done-" + std::to_string(i++));
    pod["metadata"]["uid"] = "done-uid-" + std::to_string(i);
    pod["spec"]["nodeName"] = "n1";
    pod["status"]["phase"] = "Succeeded";
    pod["metadata"]["annotations"][kube::kGpuUseAnnotation] =
        kube::FormatGpuUse({.seconds = 600, .busy_permille = permille, .peak_mib = peak});
    api_.Put(Pods("ml"), pod);
  }
  // p95 of 10, 20, 15% is 20%, + 20%: 24%, one share of four; a peak of 900 MiB + 20%: 1280 MiB.
  auto next_pod = client_->Create(Pods("ml"), pod_of_job("next"));
  ASSERT_TRUE(next_pod.ok());
  json sized;
  ASSERT_TRUE(Eventually([&] {
    auto c = client_->Create(claims, claim_of(*next_pod, "next-gpu-" + std::to_string(++i), autos));
    if (!c.ok()) return false;
    sized = *c;
    return sized["metadata"]["annotations"].value("tessera.io/sizing", "").find("(3 runs)") !=
           std::string::npos;
  })) << sized.dump();
  EXPECT_EQ(sized["spec"]["devices"]["requests"][0]["exactly"]["count"], 1) << sized.dump();
  const json& config = sized["spec"]["devices"]["config"];
  ASSERT_EQ(config.size(), 1u) << sized.dump();
  EXPECT_EQ(config[0]["requests"], json({"share"}));
  EXPECT_EQ(config[0]["opaque"]["driver"], "gpu.tessera.io");
  EXPECT_EQ(config[0]["opaque"]["parameters"]["kind"], "ShareConfig");
  EXPECT_EQ(config[0]["opaque"]["parameters"]["memory"], "1280Mi");
  EXPECT_EQ(sized["metadata"]["annotations"]["tessera.io/sizing"],
            "count 1 (of 4 per GPU): 20% busy (p95 of ml's runs of 'infer' with this command (3 "
            "runs)) + 20%; memory 1280Mi: a peak of 900MiB (p95 of ml's runs of 'infer' with this "
            "command (3 runs)) + 20%");
  // A DRA pod's trial gets its deadline as it is created (the pods' webhook, matched by its
  // annotation and spec.resourceClaims); a device-plugin pod's trial is not sent (its Binding's).
  const int calls = api_.admission_calls();
  json trial = pod_of_job("try");
  trial["metadata"]["annotations"] = {{"tessera.io/trial", "90s"}};
  auto tried = client_->Create(Pods("ml"), trial);
  ASSERT_TRUE(tried.ok()) << tried.status();
  EXPECT_EQ((*tried)["spec"]["activeDeadlineSeconds"], 90);
  EXPECT_EQ(api_.admission_calls(), calls + 1);
  json plugin_trial = Infer("plugin-try", 1, false);
  plugin_trial["metadata"]["annotations"] = {{"tessera.io/trial", "90s"}};
  auto plugin_tried = client_->Create(Pods("ml"), plugin_trial);
  ASSERT_TRUE(plugin_tried.ok());
  EXPECT_FALSE((*plugin_tried)["spec"].contains("activeDeadlineSeconds"));
  EXPECT_EQ(api_.admission_calls(), calls + 1) << "not sent";
  // Its pod not on the API server (deleted as its claim is made): refused, not created.
  json ghost = pod_of_job("ghost");
  ghost["metadata"]["uid"] = "ghost-uid";
  auto refused = client_->Create(claims, claim_of(ghost, "ghost-gpu", autos));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(kube::HttpStatusOf(refused.status()), 503) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("pod ml/ghost"));
  EXPECT_FALSE(api_.Get(claims, "ghost-gpu").has_value());
  // The extender away: refused (never created unsized); others are created.
  service_->Stop();
  refused = client_->Create(claims, claim_of(*next_pod, "while-away", autos));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(kube::HttpStatusOf(refused.status()), 500);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("failed calling webhook \"auto-claim.tessera.io\""));
  EXPECT_FALSE(api_.Get(claims, "while-away").has_value());
  EXPECT_TRUE(client_->Create(claims, claim_of(*next_pod, "plain-2", json::object())).ok());
}

// --webhook-client-ca: the webhook answers only a caller presenting a certificate of that CA (the
// API server's, from its admission kubeconfig); one with none, or of another CA, fails its TLS
// handshake, and the pod is not created (failurePolicy Fail).
TEST_F(AutoShareTest, TheWebhookAnswersOnlyAClientCertificateOfItsCa) {
  auto ca = net::MakeCertificateAuthority("kube-apiserver-webhook-client");
  auto other = net::MakeCertificateAuthority("someone-else");
  ASSERT_TRUE(ca.ok() && other.ok());
  std::filesystem::create_directories(dir_);
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  ServiceOptions o;
  o.webhook_client_ca_file = write("client-ca.crt", ca->cert);
  ASSERT_NO_FATAL_FAILURE(StartWebhook(o));
  auto create = [&](const std::string& name) {
    return client_->Create(Pods("ml"), Infer(name, 2, true));
  };
  auto refused = [&](const std::string& name) {
    auto r = create(name);
    EXPECT_FALSE(r.ok()) << name;
    if (r.ok()) return;
    EXPECT_EQ(kube::HttpStatusOf(r.status()), 500);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("failed calling webhook \"auto-share.tessera.io\": failed to call "
                          "webhook: Post \"https://localhost:"));
    EXPECT_FALSE(api_.Get(Pods("ml"), name).has_value()) << "never stored unsized";
  };
  refused("no-certificate");
  auto stranger = net::IssueCertificate(*other, {.common_name = "kube-apiserver", .client = true});
  ASSERT_TRUE(stranger.ok());
  api_.SetWebhookClientCertificate(write("other.crt", stranger->cert),
                                   write("other.key", stranger->key));
  refused("another-ca");
  auto apiserver = net::IssueCertificate(*ca, {.common_name = "kube-apiserver", .client = true});
  ASSERT_TRUE(apiserver.ok());
  api_.SetWebhookClientCertificate(write("apiserver.crt", apiserver->cert),
                                   write("apiserver.key", apiserver->key));
  auto sized = create("its-ca");
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ((*sized)["spec"]["containers"][0]["resources"]["limits"]["tessera.io/gpu-share"], "2");
  EXPECT_THAT((*sized)["metadata"]["annotations"].value("tessera.io/sizing", ""),
              HasSubstr("gpu-share 2 (of 4 per GPU)"));
  // Only the caller with its certificate got as far as a review.
  EXPECT_THAT(service_->Metrics(),
              HasSubstr("tessera_extender_admission_total{result=\"sized\"} 1"));
  EXPECT_EQ(api_.admission_calls(), 3);
}

}  // namespace
}  // namespace tessera::extender
