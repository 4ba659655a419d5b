#include "tessera/extender/extender.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "fmt/format.h"
#include "tessera/extender/test_objects.h"

namespace tessera::extender {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using testing::GpuNode;
using testing::GpuPod;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::PodOptions;
using Ev = kube::EventType;

class ExtenderTest : public ::testing::Test {
 protected:
  ExtenderTest() { Make({}); }
  void Make(ExtenderOptions o) {
    o.scheduler.random_ties = false;
    o.reservation_timeout_s = 30;
    ex_ = std::make_unique<Extender>(o, clock_);
  }
  // A pod as kube-scheduler would see it after bind: on its node, with the annotation.
  json Bound(json pod, const BindPlan& plan) {
    pod["spec"]["nodeName"] = plan.assignment.node;
    pod["metadata"]["annotations"][kube::kAssignmentAnnotation] =
        kube::FormatAssignment(plan.assignment);
    pod["status"]["phase"] = "Running";
    return pod;
  }
  // filter + bind, as kube-scheduler does for a pod that fits; returns the node.
  std::string Schedule(const json& pod, const std::vector<std::string>& nodes) {
    FilterResult f = ex_->Filter(pod, nodes);
    if (f.nodes.size() != 1) return "";
    auto plan = ex_->PrepareBind(pod["metadata"]["namespace"], pod["metadata"]["name"],
                                 pod["metadata"]["uid"], f.nodes[0]);
    if (!plan.ok()) return "";
    ex_->OnPod(Ev::kModified, Bound(pod, *plan));
    return f.nodes[0];
  }

  core::FakeClock clock_;
  std::unique_ptr<Extender> ex_;
};

TEST_F(ExtenderTest, FilterChoosesOneNodeAndBindRecordsTheGpus) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  json pod = GpuPod("ml", "train", {.gpus = 1});
  ex_->OnPod(Ev::kAdded, pod);
  FilterResult f = ex_->Filter(pod, {"a", "b"});
  ASSERT_EQ(f.nodes.size(), 1u) << f.reason;
  EXPECT_TRUE(f.error.empty());
  EXPECT_THAT(f.failed, IsEmpty());
  // The decision is made: prioritize points at it.
  auto scores = ex_->Prioritize(pod, {"a", "b"});
  ASSERT_EQ(scores.size(), 2u);
  for (auto& [node, score] : scores) EXPECT_EQ(score, node == f.nodes[0] ? 10 : 0);

  auto plan = ex_->PrepareBind("ml", "train", "uid-ml-train", f.nodes[0]);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->assignment.node, f.nodes[0]);
  ASSERT_EQ(plan->assignment.containers.size(), 1u);
  const auto& c = plan->assignment.containers[0];
  EXPECT_EQ(c.container, "main");
  EXPECT_EQ(c.resource, "tessera.io/gpu");
  EXPECT_EQ(c.count, 1);
  ASSERT_EQ(c.gpus.size(), 1u);
  EXPECT_THAT(c.gpus[0], HasSubstr("GPU-"));

  // Best fit packs: the next one-GPU pod goes to the same node, the other GPU.
  ex_->OnPod(Ev::kModified, Bound(pod, *plan));
  json second = GpuPod("ml", "second", {.gpus = 1});
  EXPECT_EQ(Schedule(second, {"a", "b"}), f.nodes[0]);
  auto a1 = ex_->AllocationOf("ml/train");
  auto a2 = ex_->AllocationOf("ml/second");
  ASSERT_TRUE(a1 && a2);
  EXPECT_NE(a1->gpus, a2->gpus);
  Extender::Stats s = ex_->stats();
  EXPECT_EQ(s.bound, 2);
  EXPECT_EQ(s.reserved, 0);
  EXPECT_EQ(s.gpu_milli_allocated, 2000);

  // The pods end: their GPUs come back.
  json done = Bound(pod, *plan);
  done["status"]["phase"] = "Succeeded";
  ex_->OnPod(Ev::kModified, done);
  EXPECT_FALSE(ex_->AllocationOf("ml/train"));
  ex_->OnPod(Ev::kDeleted, second);
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, 0);
}

TEST_F(ExtenderTest, FractionalPodsGetOneGpuWithMemory) {
  ex_->OnNode(Ev::kAdded, GpuNode("a", "t4x2", {}, 4));
  json pod =
      GpuPod("ml", "small", {.shares = 1, .annotations = {{"tessera.io/gpu-memory", "2Gi"}}});
  FilterResult f = ex_->Filter(pod, {"a"});
  ASSERT_EQ(f.nodes, std::vector<std::string>{"a"}) << f.reason;
  auto plan = ex_->PrepareBind("ml", "small", "", "a");
  ASSERT_TRUE(plan.ok());
  const auto& c = plan->assignment.containers.at(0);
  EXPECT_EQ(c.resource, "tessera.io/gpu-share");
  EXPECT_EQ(c.count, 1);
  EXPECT_EQ(c.gpus.size(), 1u);
  EXPECT_EQ(c.memory, uint64_t{2} << 30);
  auto a = ex_->AllocationOf("ml/small");
  EXPECT_EQ(a->milli_per_gpu, 250);  // one of four shares
}

TEST_F(ExtenderTest, SharesThatSayTheirUtilizationAreKeptUnderTheCeiling) {
  for (bool strict : {false, true}) {
    ExtenderOptions o;
    o.utilization_ceiling_strict = strict;
    Make(o);
    ex_->OnNode(Ev::kAdded, GpuNode("a", "t4x2", {}, 4));
    auto busy = [](const std::string& name) {
      return GpuPod("ml", name,
                    {.shares = 1, .annotations = {{"tessera.io/gpu-utilization", "50%"}}});
    };
    // Packing would put two quarter-GPU shares on one GPU; at 50% each that GPU would be 100%
    // busy, over the 70% ceiling: the second goes to the other GPU.
    ASSERT_EQ(Schedule(busy("one"), {"a"}), "a");
    ASSERT_EQ(Schedule(busy("two"), {"a"}), "a");
    EXPECT_NE(ex_->AllocationOf("ml/one")->gpus, ex_->AllocationOf("ml/two")->gpus);
    // A third fits within the ceiling nowhere: soft, it still goes (over it); strict, it waits.
    FilterResult third = ex_->Filter(busy("three"), {"a"});
    if (strict) {
      EXPECT_TRUE(third.nodes.empty());
      EXPECT_THAT(third.failed["a"], HasSubstr("70% utilization ceiling with this job's 50%"));
    } else {
      EXPECT_EQ(third.nodes, std::vector<std::string>{"a"}) << third.reason;
    }
  }
  // A pod without the annotation is not held back, and a bad one is an error naming it.
  FilterResult plain = ex_->Filter(GpuPod("ml", "plain", {.shares = 1}), {"a"});
  EXPECT_EQ(plain.nodes, std::vector<std::string>{"a"});
  FilterResult bad = ex_->Filter(
      GpuPod("ml", "bad", {.shares = 1, .annotations = {{"tessera.io/gpu-utilization", "lots"}}}),
      {"a"});
  EXPECT_THAT(bad.error, HasSubstr("tessera.io/gpu-utilization: expected a percentage"));
}

TEST_F(ExtenderTest, AnMpsGpuTakesOneNamespacesSharesAtATime) {
  // GPU 0 in MPS mode, GPU 1 time-sliced.
  ex_->OnNode(Ev::kAdded, GpuNode("a", "t4x2", {}, 4, {0}));
  auto mps = [](const std::string& ns, const std::string& name) {
    return GpuPod(ns, name, {.shares = 1, .annotations = {{"tessera.io/sharing", "mps"}}});
  };
  const json one = mps("ml", "one"), two = mps("ml", "two");
  ASSERT_EQ(Schedule(one, {"a"}), "a");
  ASSERT_EQ(Schedule(two, {"a"}), "a");
  EXPECT_EQ(ex_->AllocationOf("ml/one")->gpus, std::vector<int>{0}) << "the MPS GPU";
  EXPECT_EQ(ex_->AllocationOf("ml/two")->gpus, std::vector<int>{0}) << "beside its namespace's";
  // Another namespace's MPS share waits, saying why; a share that asks no mode goes in slices.
  FilterResult other = ex_->Filter(mps("web", "three"), {"a"});
  EXPECT_TRUE(other.nodes.empty());
  EXPECT_THAT(other.failed["a"], HasSubstr("MPS"));
  ASSERT_EQ(Schedule(GpuPod("web", "plain", {.shares = 1}), {"a"}), "a");
  EXPECT_EQ(ex_->AllocationOf("web/plain")->gpus, std::vector<int>{1});
  // Once the first namespace's pods are gone, the other's is placed there.
  for (const json& p : {one, two}) {
    json gone = p;
    gone["spec"]["nodeName"] = "a";
    ex_->OnPod(Ev::kDeleted, gone);
  }
  ASSERT_EQ(Schedule(mps("web", "three"), {"a"}), "a");
  EXPECT_EQ(ex_->AllocationOf("web/three")->gpus, std::vector<int>{0});
}

TEST_F(ExtenderTest, ThePodsOfAJobArePredictedFromItsRunsThatSucceeded) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  auto of_job = [](const std::string& name) {
    json pod = GpuPod("ml", name, {.gpus = 1});
    pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "train";
    pod["spec"]["containers"][0]["command"] = {"python", "train.py"};
    return pod;
  };
  // No history: its activeDeadlineSeconds bounds it; none at all: unknown.
  json first = of_job("train-1");
  first["spec"]["activeDeadlineSeconds"] = 3600;
  ASSERT_EQ(Schedule(first, {"a"}), "a");
  ASSERT_TRUE(ex_->AllocationOf("ml/train-1"));
  EXPECT_EQ(ex_->AllocationOf("ml/train-1")->request.expected_duration_s, 3600);
  clock_.Advance(std::chrono::seconds(100));
  json done = first;
  done["spec"]["nodeName"] = "a";
  done["status"]["phase"] = "Succeeded";
  ex_->OnPod(Ev::kModified, done);
  EXPECT_FALSE(ex_->AllocationOf("ml/train-1")) << "its GPU is given back";
  // The next pod of the Job is expected to take what the first took (from when the extender saw
  // it bound to when it saw it succeed: the pod carries no status.startTime here).
  ASSERT_EQ(Schedule(of_job("train-2"), {"a"}), "a");
  EXPECT_EQ(ex_->AllocationOf("ml/train-2")->request.expected_duration_s, 100);
  // A pod of another Job in the namespace has no runs of its own: unknown - another workload's
  // runs of the same shape say nothing of it (as on the server).
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  json other = GpuPod("ml", "infer-1", {.gpus = 1});
  other["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "infer";
  ASSERT_EQ(Schedule(other, {"b"}), "b");
  EXPECT_EQ(ex_->AllocationOf("ml/infer-1")->request.expected_duration_s, 0);
}

// DRA claims asking "auto" (the admission webhook's SizeClaim): sized from what the claims of
// ended pods of their pod's kind used (the agent writes it on the pods), 95th percentile plus the
// margin - memory rounded up to 256 MiB, a count of the driver's shares of a GPU held to what
// the claim asks; another namespace's pods never size them; nothing measured: as asked.
TEST_F(ExtenderTest, DraShareClaimsOfAKindAreSizedFromWhatItsEndedPodsClaimsUsed) {
  auto of_job = [](const std::string& ns, const std::string& name) {
    json pod = GpuPod(ns, name, {.shares = 1});
    pod["spec"]["containers"][0]["resources"] = json::object();
    pod["spec"]["resourceClaims"] = {{{"name", "gpu"}, {"resourceClaimTemplateName", "share"}}};
    pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "infer";
    pod["spec"]["containers"][0]["command"] = {"python", "serve.py"};
    return pod;
  };
  const ClaimAsk both{
      .pod = "next", .request = "s", .count = 4, .share_auto = true, .memory_auto = true};
  auto first = ex_->SizeClaim(of_job("ml", "next"), both, 8);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->count, 4) << "nothing measured: the count it asks";
  EXPECT_EQ(first->memory_mib, 0) << "nothing measured: its shares' part";
  EXPECT_THAT(first->sizing, HasSubstr("no measured runs of its kind yet"));
  EXPECT_THAT(first->sizing, HasSubstr("its use is measured for the next"));
  EXPECT_EQ(ex_->SizeClaim(of_job("ml", "next"), both, 0).status().code(),
            absl::StatusCode::kUnavailable)
      << "an auto count before any node publishes shares";
  for (int i = 0; i < 3; ++i) {
    for (const std::string ns : {"ml", "other"}) {
      json pod = of_job(ns, "infer-" + std::to_string(i));
      pod["spec"]["nodeName"] = "a";
      pod["status"]["phase"] = "Succeeded";
      pod["metadata"]["uid"] = ns + std::to_string(i);
      // Its namespace's: 20% of a GPU busy, a peak of 700 MiB; the other's far more.
      pod["metadata"]["annotations"][kube::kGpuUseAnnotation] = kube::FormatGpuUse(
          ns == "ml" ? kube::GpuUse{.seconds = 60, .busy_permille = 200, .peak_mib = 700}
                     : kube::GpuUse{.seconds = 60, .busy_permille = 900, .peak_mib = 9000});
      ex_->OnPod(Ev::kModified, pod);
    }
  }
  auto sized = ex_->SizeClaim(of_job("ml", "next"), both, 8);
  ASSERT_TRUE(sized.ok()) << sized.status();
  // 20% + 20% = 24% of a GPU of 8 shares (12.5% each): 2 shares; 700 MiB + 20% = 840: 1024 MiB.
  EXPECT_EQ(sized->count, 2) << sized->sizing;
  EXPECT_EQ(sized->memory_mib, 1024) << sized->sizing;
  EXPECT_THAT(sized->sizing, HasSubstr("count 2 (of 8 per GPU): 20% busy"));
  EXPECT_THAT(sized->sizing, HasSubstr("memory 1024Mi: a peak of 700MiB"));
  // Held to what it asks; a count not "auto" is left as asked.
  auto held = ex_->SizeClaim(of_job("ml", "next"),
                             {.pod = "next", .request = "s", .count = 1, .share_auto = true}, 8);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->count, 1);
  EXPECT_THAT(held->sizing, HasSubstr("held to the 1 it asks"));
  auto memory = ex_->SizeClaim(of_job("ml", "next"),
                               {.pod = "next", .request = "s", .count = 3, .memory_auto = true}, 0);
  ASSERT_TRUE(memory.ok()) << "memory alone needs no shares published";
  EXPECT_EQ(memory->count, 3);
  EXPECT_EQ(memory->memory_mib, 1024);
  EXPECT_THAT(memory->sizing, Not(HasSubstr("measured for the next"))) << "what it asked is";
  // A DRA pod's trial ended (its deadline set at its creation): an Event says what it measured
  // and what to ask, and its use sizes its kind's claims as any ended pod's does.
  (void)ex_->TakeNotices();
  json trial = of_job("ml", "try");
  trial["metadata"]["uid"] = "try-uid";
  trial["metadata"]["annotations"]["tessera.io/trial"] = "2m";
  trial["spec"]["nodeName"] = "a";
  trial["status"]["phase"] = "Failed";
  trial["metadata"]["annotations"][kube::kGpuUseAnnotation] = kube::FormatGpuUse(
      {.seconds = 120, .busy_permille = 180, .peak_mib = 3000, .kernel_launches = 12000});
  ex_->OnPod(Ev::kModified, trial);
  const std::vector<Notice> notices = ex_->TakeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].reason, "TrialResult");
  EXPECT_EQ(notices[0].name, "try");
  EXPECT_EQ(notices[0].note,
            "its trial of 2m ended after 120 s: its GPU 18% busy, peak GPU memory 3000MiB, 12000 "
            "kernel launches (100/s, 1.8 ms of GPU time each on average); recommended: shares for "
            "22% of a GPU and a ShareConfig memory of 3840Mi (with 20% margin), or "
            "tessera.io/gpu-share and tessera.io/gpu-memory: auto on its ResourceClaimTemplate, "
            "which size its claims from this trial");
}

// Issue 58 on Kubernetes: an ended pod's measured use (tessera.io/gpu-use, written by its agent)
// sizes the next pods of its kind that ask tessera.io/gpu-memory "auto" - the 95th percentile of
// their peaks plus the margin, rounded up to 256 MiB - and one that outgrows its size is told so
// and teaches its kind what it asked.
TEST_F(ExtenderTest, APodAskingAutoMemoryIsSizedFromWhatEndedPodsOfItsKindUsed) {
  ex_->OnNode(Ev::kAdded, GpuNode("a", "t4x2", {}, 4));
  auto of_job = [](const std::string& name, const std::string& memory) {
    json pod =
        GpuPod("ml", name, {.shares = 1, .annotations = {{"tessera.io/gpu-memory", memory}}});
    pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "infer";
    pod["spec"]["containers"][0]["command"] = {"python", "serve.py"};
    return pod;
  };
  auto ended = [&](json pod, const std::string& phase, const kube::GpuUse& use) {
    pod["spec"]["nodeName"] = "a";
    pod["status"]["phase"] = phase;
    pod["metadata"]["annotations"][kube::kGpuUseAnnotation] = kube::FormatGpuUse(use);
    ex_->OnPod(Ev::kModified, pod);
  };
  auto bind = [&](const json& pod) -> BindPlan {
    FilterResult f = ex_->Filter(pod, {"a"});
    EXPECT_EQ(f.nodes, std::vector<std::string>{"a"}) << f.reason;
    auto plan = ex_->PrepareBind("ml", pod["metadata"]["name"], pod["metadata"]["uid"], "a");
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : BindPlan{};
  };
  // Another namespace's pods of the same shape never size this one's (whoever may edit a pod can
  // write its tessera.io/gpu-use).
  for (int i = 0; i < 3; ++i) {
    json theirs = GpuPod("other", "p" + std::to_string(i), {.shares = 1});
    theirs["spec"]["nodeName"] = "a";
    theirs["status"]["phase"] = "Succeeded";
    theirs["metadata"]["annotations"][kube::kGpuUseAnnotation] =
        kube::FormatGpuUse({.seconds = 9, .peak_mib = 1});
    ex_->OnPod(Ev::kModified, theirs);
  }
  (void)ex_->TakeUseHistory();
  // A DRA pod (no tessera.io/gpu: its claims' use told by the agent) is learned as its claims'
  // kind (DraShareClaimsOfAKindAreSizedFromWhatItsEndedPodsClaimsUsed), never a share's.
  json dra = GpuPod("ml", "dra", {.shares = 1});
  dra["spec"]["containers"][0]["resources"] = json::object();
  dra["spec"]["resourceClaims"] = {{{"name", "gpu"}, {"resourceClaimTemplateName", "share"}}};
  dra["spec"]["nodeName"] = "a";
  dra["status"]["phase"] = "Succeeded";
  dra["metadata"]["annotations"][kube::kGpuUseAnnotation] =
      kube::FormatGpuUse({.seconds = 9, .busy_permille = 100, .peak_mib = 500});
  ex_->OnPod(Ev::kModified, dra);
  const auto dra_record = ex_->TakeUseHistory();
  ASSERT_TRUE(dra_record.has_value());
  EXPECT_THAT(*dra_record, HasSubstr("\"shape\":\"dra gpu-share\"")) << "its claims' kind alone";
  json bare =
      GpuPod("ml", "bare", {.shares = 1, .annotations = {{"tessera.io/gpu-memory", "auto"}}});
  ASSERT_EQ(ex_->Filter(bare, {"a"}).nodes, std::vector<std::string>{"a"});
  EXPECT_THAT(ex_->PrepareBind("ml", "bare", "", "a")->sizing,
              HasSubstr("gpu-memory: no measured runs of its kind yet"));
  // Nothing measured of its kind yet: its share's part of the GPU's memory, as without the
  // annotation (no memory in the assignment), and said so.
  json first = of_job("infer-1", "auto");
  BindPlan plan = bind(first);
  EXPECT_FALSE(plan.assignment.containers.at(0).memory);
  EXPECT_THAT(plan.sizing, HasSubstr("gpu-memory: no measured runs of its kind yet"));
  ex_->OnPod(Ev::kModified, Bound(first, plan));
  ended(first, "Succeeded", {.seconds = 60, .busy_permille = 150, .peak_mib = 2000});
  // Three runs of the same Job with a size of their own teach its "auto" kind too.
  for (int i = 0; i < 3; ++i) {
    ended(of_job("fixed-" + std::to_string(i), "6Gi"), "Succeeded",
          {.seconds = 60, .peak_mib = 3000 + 500 * i, .limit_mib = 6144});
  }
  // An ended pod seen again (another field changed) is not counted twice.
  json again = of_job("fixed-2", "6Gi");
  again["metadata"]["labels"]["seen"] = "twice";
  ended(again, "Succeeded", {.seconds = 60, .peak_mib = 4000, .limit_mib = 6144});
  // 4 runs: p95 is the largest, 4000 MiB; + 20% = 4800, rounded up to 256 MiB: 4864.
  json second = of_job("infer-2", "auto");
  plan = bind(second);
  EXPECT_EQ(plan.assignment.containers.at(0).memory, uint64_t{4864} << 20);
  EXPECT_EQ(ex_->AllocationOf("ml/infer-2")->memory_mib_per_gpu, 4864);
  EXPECT_THAT(plan.sizing, HasSubstr("gpu-memory 4864Mi: a peak of 4000MiB (p95 of ml's runs of "
                                     "'infer' with this command (4 runs)) + 20%"));
  ex_->OnPod(Ev::kModified, Bound(second, plan));
  EXPECT_TRUE(ex_->TakeNotices().empty()) << "nothing outgrown, no trial";
  // It outgrew its size: its limit refused allocations of up to 6000 MiB. Told, and learned.
  ended(second, "Failed",
        {.seconds = 30, .peak_mib = 4700, .limit_mib = 4864, .refused = 2, .wanted_mib = 6000});
  std::vector<Notice> told = ex_->TakeNotices();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].name, "infer-2");
  EXPECT_EQ(told[0].type, "Warning");
  EXPECT_EQ(told[0].reason, "OutgrewGPUMemory");
  // (6000 + 20% = 7200: 7424, rounded up to 256 MiB.)
  EXPECT_EQ(told[0].note,
            "its automatic GPU memory of 4864Mi refused 2 allocations (measured peak 4700MiB; it "
            "asked for 6000MiB at most): the next pod of its kind is sized past it (or set "
            "tessera.io/gpu-memory: 7424Mi)");
  plan = bind(of_job("infer-3", "auto"));
  EXPECT_EQ(plan.assignment.containers.at(0).memory, uint64_t{7424} << 20);
}

// A trial pod (tessera.io/trial) is bound with its deadline, and its end says what it used and
// what to ask.
TEST_F(ExtenderTest, ATrialPodRunsItsTimeAndItsEndSaysWhatToAsk) {
  ex_->OnNode(Ev::kAdded, GpuNode("a", "t4x2", {}, 4));
  json trial = GpuPod("ml", "try", {.shares = 2, .annotations = {{"tessera.io/trial", "2m"}}});
  FilterResult f = ex_->Filter(trial, {"a"});
  ASSERT_EQ(f.nodes, std::vector<std::string>{"a"}) << f.reason;
  auto plan = ex_->PrepareBind("ml", "try", "", "a");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->trial_s, 120);
  // A pod whose own deadline is shorter keeps it.
  json short_one =
      GpuPod("ml", "short", {.shares = 1, .annotations = {{"tessera.io/trial", "2m"}}});
  short_one["spec"]["activeDeadlineSeconds"] = 60;
  ASSERT_EQ(ex_->Filter(short_one, {"a"}).nodes, std::vector<std::string>{"a"});
  EXPECT_EQ(ex_->PrepareBind("ml", "short", "", "a")->trial_s, 0);
  // Its kubelet ended it at the deadline; its agent measured 18% of the GPU busy, 3000 MiB.
  json done = Bound(trial, *plan);
  done["status"]["phase"] = "Failed";
  done["status"]["reason"] = "DeadlineExceeded";
  done["metadata"]["annotations"][kube::kGpuUseAnnotation] =
      kube::FormatGpuUse({.seconds = 120, .busy_permille = 180, .peak_mib = 3000});
  ex_->OnPod(Ev::kModified, done);
  std::vector<Notice> told = ex_->TakeNotices();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].reason, "TrialResult");
  EXPECT_EQ(told[0].type, "Normal");
  // 18% + 20% is 21.6%: one share of 4 (25%); 3000 MiB + 20%: 3840 MiB.
  EXPECT_EQ(
      told[0].note,
      "its trial of 2m ended after 120 s: its GPU 18% busy, peak GPU memory 3000MiB; "
      "recommended: tessera.io/gpu-share: 1 (of 4 per GPU) with tessera.io/gpu-memory: "
      "3840Mi (with 20% margin), or tessera.io/gpu-share and tessera.io/gpu-memory: auto, which "
      "size from this trial");
  // The same pod asking "auto" now is sized from the trial.
  json sized =
      GpuPod("ml", "try-2", {.shares = 2, .annotations = {{"tessera.io/gpu-memory", "auto"}}});
  ASSERT_EQ(ex_->Filter(sized, {"a"}).nodes, std::vector<std::string>{"a"});
  EXPECT_EQ(ex_->PrepareBind("ml", "try-2", "", "a")->assignment.containers.at(0).memory,
            uint64_t{3840} << 20);
}

// The use history as the service keeps it in a ConfigMap: read back with bad records skipped, and
// never more than a ConfigMap holds (the oldest records go first).
TEST_F(ExtenderTest, TheUseHistoryReadsBackSkipsBadRecordsAndStaysWithinAConfigMap) {
  ex_->OnNode(Ev::kAdded, GpuNode("a", "t4x2", {}, 4));
  EXPECT_EQ(ex_->LoadUseHistory(json::object()), 1);
  json records = json::array();
  const std::string long_arg(10000, 'x');  // 300 records of 10 KB: over a ConfigMap's room
  for (int i = 0; i < 300; ++i) {
    records.push_back({{"uid", "old-" + std::to_string(i)},
                       {"user", "ml"},
                       {"name", ""},
                       {"command", {"python", long_arg}},
                       {"shape", "25% auto"},
                       {"peakMiB", 1000}});
  }
  records.push_back({{"uid", "bad"}, {"user", "ml"}, {"shape", "25% auto"}});  // no name, command
  records.push_back({{"uid", "bad"},
                     {"user", "ml"},
                     {"name", ""},
                     {"command", json::array()},
                     {"shape", "25% auto"},
                     {"busyPercent", 250}});
  EXPECT_EQ(ex_->LoadUseHistory(records), 2);
  EXPECT_FALSE(ex_->TakeUseHistory()) << "what was read is what is stored";
  // A pod ends: the history is written again, within 900 KiB, its newest record last.
  json pod = GpuPod("ml", "new", {.shares = 1});
  pod["spec"]["nodeName"] = "a";
  pod["status"]["phase"] = "Succeeded";
  pod["metadata"]["annotations"][kube::kGpuUseAnnotation] =
      kube::FormatGpuUse({.seconds = 9, .peak_mib = 500});
  ex_->OnPod(Ev::kModified, pod);
  auto text = ex_->TakeUseHistory();
  ASSERT_TRUE(text);
  EXPECT_LE(text->size(), Extender::kUseHistoryBytes);
  json h = json::parse(*text);
  EXPECT_GT(h.size(), 50u);
  EXPECT_EQ(h.back()["uid"], "uid-ml-new");
  EXPECT_EQ(h.back()["peakMiB"], 500);
  EXPECT_EQ(h.back()["command"], json::array({kPodsOfItsShape}));
  // Read back by another extender: the same records.
  Extender again({}, clock_);
  EXPECT_EQ(again.LoadUseHistory(h), 0);
}

TEST(TrialAdvice, AskWholeGpusSharesOrNothingFromWhatWasMeasured) {
  PodDemand d;
  d.trial_s = 300;
  d.request.gpus = 1;
  // A whole GPU kept 90% busy: 108% with the margin, a whole GPU.
  EXPECT_EQ(TrialAdvice(d, {.seconds = 300, .busy_permille = 900}, 10, 20),
            "its trial of 5m ended after 300 s: its GPU 90% busy; recommended: tessera.io/gpu: 1 "
            "(with 20% margin)");
  // 12%: 14.4% with the margin, 2 shares of 10.
  EXPECT_THAT(TrialAdvice(d, {.seconds = 300, .busy_permille = 120}, 10, 20),
              HasSubstr("recommended: tessera.io/gpu-share: 2 (of 10 per GPU) (with 20% margin)"));
  // Its kernel mix: 18% of 300 s over 27000 launches is 2.0 ms each.
  EXPECT_THAT(
      TrialAdvice(d, {.seconds = 300, .busy_permille = 180, .kernel_launches = 27000}, 10, 20),
      HasSubstr("its GPU 18% busy, 27000 kernel launches (90/s, 2.0 ms of GPU time each on "
                "average); recommended: tessera.io/gpu-share: 3 (of 10 per GPU)"));
  // Held back by other pods' slices 70% of its run: 12% busy of the 30% it ran as it wished is
  // 40% wanted; with the margin 48%, 5 shares of 10.
  EXPECT_THAT(
      TrialAdvice(d, {.seconds = 300, .busy_permille = 120, .held_back_permille = 700}, 10, 20),
      HasSubstr("its GPU 12% busy (its launches waited for the GPU 70% of the time: it would have "
                "used 40%); recommended: tessera.io/gpu-share: 5 (of 10 per GPU)"));
  EXPECT_EQ(TrialAdvice(d, {.seconds = 3}, 10, 20),
            "its trial of 5m ended after 3 s; nothing was measured (no GPU use seen)");
  // Several GPUs: what they did, no share to ask.
  d.request.gpus = 2;
  EXPECT_EQ(TrialAdvice(d, {.seconds = 300, .busy_permille = 400}, 10, 20),
            "its trial of 5m ended after 300 s: its GPUs 40% busy");
}

// A pod sized `tessera.io/gpu-share: auto` whose launches waited for its slices (it wanted more
// than its share) teaches its kind what it would have used, so the next is sized past its share
// in one step; one never held back teaches its busy share (plus the margin, whole shares).
TEST_F(ExtenderTest, AnAutoShareHeldBackByItsSlicesSizesTheNextPastItsShare) {
  ex_->OnNode(Ev::kAdded, GpuNode("a", "t4x2", {}, 4));
  for (const int held : {700, 0}) {
    SCOPED_TRACE(held);
    const std::string job = fmt::format("infer-{}", held);  // a kind of its own
    auto pod = [&](const std::string& name) {
      json p = GpuPod("ml", name, {.shares = 1, .annotations = {{"tessera.io/gpu-share", "auto"}}});
      p["metadata"]["labels"]["batch.kubernetes.io/job-name"] = job;
      return p;
    };
    json done = pod(job + "-1");
    done["spec"]["nodeName"] = "a";
    done["status"]["phase"] = "Succeeded";
    done["metadata"]["annotations"]["tessera.io/sizing"] = "gpu-share 1 (of 4 per GPU): ...";
    // One share of four (25%), busy all of it, waiting for the GPU 70% of its run.
    done["metadata"]["annotations"][kube::kGpuUseAnnotation] = kube::FormatGpuUse(
        {.seconds = 600,
         .busy_permille = 250,
         .held_back_permille = held > 0 ? std::optional<int64_t>(held) : std::nullopt});
    ex_->OnPod(Ev::kModified, done);
    auto size = ex_->SizeShare(pod(job + "-2"), 0, 0);
    ASSERT_TRUE(size.ok()) << size.status();
    ASSERT_THAT(size->sizing, HasSubstr("(1 run)")) << "learned";
    if (held > 0) {
      // 250 of the 300 it ran as it wished: 83.3%; + 20% is a whole GPU.
      EXPECT_TRUE(size->whole_gpu) << size->sizing;
      EXPECT_THAT(size->sizing, HasSubstr("83% busy (p95 of"));
    } else {
      // 25% + 20% = 30%: two shares of four.
      EXPECT_FALSE(size->whole_gpu) << size->sizing;
      EXPECT_EQ(size->count, 2) << size->sizing;
    }
  }
}

TEST_F(ExtenderTest, APendingPodIsQueuedWhenSeenNotAtItsFirstFilter) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));  // 2 GPUs
  json low = GpuPod("ml", "low", {.gpus = 2});
  json high = GpuPod("ml", "high", {.gpus = 2, .priority = 5});
  ex_->OnPod(Ev::kAdded, low);
  ex_->OnPod(Ev::kAdded, high);
  // kube-scheduler asks about `low` first: the queue already holds `high`, which goes first.
  FilterResult f = ex_->Filter(low, {"a"});
  EXPECT_TRUE(f.nodes.empty());
  ASSERT_TRUE(ex_->AllocationOf("ml/high"));
  // Never filtered yet, it is in kube-scheduler's active queue and comes anyway: no nudge (an API
  // call per pod) for it.
  EXPECT_THAT(ex_->TakeNudges(), IsEmpty());
  EXPECT_EQ(ex_->Filter(high, {"a"}).nodes, std::vector<std::string>{"a"});
}

TEST_F(ExtenderTest, AReservationNotYetBoundIsGivenBackNotEvicted) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  json low = GpuPod("ml", "low", {.gpus = 2});
  ex_->OnPod(Ev::kAdded, low);
  ASSERT_EQ(ex_->Filter(low, {"a"}).nodes, std::vector<std::string>{"a"});
  // Before kube-scheduler binds it, a pod of higher priority comes: the reservation is released
  // (evicting would delete a pod that never ran) and the new pod placed in the same filter.
  json high = GpuPod("ml", "high", {.gpus = 2, .priority = 5});
  ex_->OnPod(Ev::kAdded, high);
  EXPECT_EQ(ex_->Filter(high, {"a"}).nodes, std::vector<std::string>{"a"});
  EXPECT_THAT(ex_->TakeEvictions(), IsEmpty());
  EXPECT_FALSE(ex_->AllocationOf("ml/low"));
  EXPECT_THAT(*ex_->Waiting("ml/low"), HasSubstr("no node fits"));
  // Its bind, late, finds no reservation: kube-scheduler schedules it again.
  EXPECT_FALSE(ex_->PrepareBind("ml", "low", "uid-ml-low", "a").ok());
  // Once a bind is under way the pod may run any moment: then it is evicted.
  ASSERT_TRUE(ex_->PrepareBind("ml", "high", "uid-ml-high", "a").ok());
  json top = GpuPod("ml", "top", {.gpus = 2, .priority = 9});
  ex_->OnPod(Ev::kAdded, top);
  EXPECT_TRUE(ex_->Filter(top, {"a"}).nodes.empty());
  std::vector<Victim> v = ex_->TakeEvictions();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].name, "high");
}

TEST_F(ExtenderTest, UnplacedPodsSayWhyPerNode) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  json big = GpuPod("ml", "big", {.gpus = 4});
  FilterResult f = ex_->Filter(big, {"a", "cpu-only"});
  EXPECT_THAT(f.nodes, IsEmpty());
  EXPECT_EQ(f.wait_kind, "no-fit");
  ASSERT_TRUE(f.failed.contains("a"));
  EXPECT_THAT(f.failed["a"], HasSubstr("GPU"));
  ASSERT_TRUE(f.unresolvable.contains("cpu-only"));
  EXPECT_THAT(f.unresolvable["cpu-only"], HasSubstr("tessera.io/gpus"));
  EXPECT_EQ(ex_->stats().queued, 1);

  // A pod that asks for nothing of Tessera's is an error, and changes nothing.
  json plain = GpuPod("ml", "plain", {});
  FilterResult e = ex_->Filter(plain, {"a"});
  EXPECT_THAT(e.error, HasSubstr("requests neither tessera.io/gpu"));
  EXPECT_EQ(ex_->stats().queued, 1);
}

TEST_F(ExtenderTest, TheLongestWaitIsToldPerReasonAndEndsWhenThePodIsPlaced) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));  // 2 GPUs
  json holder = GpuPod("ml", "holder", {.gpus = 1});
  ASSERT_EQ(Schedule(holder, {"a"}), "a");
  json big = GpuPod("ml", "big", {.gpus = 4});
  EXPECT_EQ(ex_->Filter(big, {"a"}).wait_kind, "no-fit");
  clock_.Advance(std::chrono::seconds(100));
  json unseen = GpuPod("ml", "unseen", {.gpus = 8});
  ex_->OnPod(Ev::kAdded, unseen);  // queued by the informer, not filtered yet
  clock_.Advance(std::chrono::seconds(20));
  json pair = GpuPod("ml", "pair", {.gpus = 2});
  EXPECT_EQ(ex_->Filter(pair, {"a"}).wait_kind, "no-fit");
  Extender::Stats s = ex_->stats();
  EXPECT_EQ(s.pending_by_reason["no-fit"], 2);
  EXPECT_DOUBLE_EQ(s.oldest_pending_seconds["no-fit"], 120) << "the oldest, not the newest";
  EXPECT_EQ(s.pending_by_reason["not-yet-considered"], 1);
  EXPECT_DOUBLE_EQ(s.oldest_pending_seconds["not-yet-considered"], 20);

  // The oldest leaves: the next one's wait is told, from its first filter, not its last.
  ex_->OnPod(Ev::kDeleted, big);
  clock_.Advance(std::chrono::seconds(5));
  EXPECT_EQ(ex_->Filter(pair, {"a"}).wait_kind, "no-fit");
  EXPECT_DOUBLE_EQ(ex_->stats().oldest_pending_seconds["no-fit"], 5);
  // Room made: it is placed and waits no more.
  ex_->OnPod(Ev::kDeleted, holder);
  EXPECT_EQ(ex_->Filter(pair, {"a"}).nodes, std::vector<std::string>{"a"});
  s = ex_->stats();
  EXPECT_FALSE(s.oldest_pending_seconds.contains("no-fit"));
  EXPECT_DOUBLE_EQ(s.oldest_pending_seconds["not-yet-considered"], 25);
}

TEST_F(ExtenderTest, OnlyNodesKubeSchedulerOfferedAreChosen) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  ASSERT_EQ(Schedule(GpuPod("ml", "p1", {.gpus = 1}), {"a", "b"}), "a");
  // Best fit would pick a again; kube-scheduler ruled it out.
  EXPECT_EQ(Schedule(GpuPod("ml", "p2", {.gpus = 1}), {"b"}), "b");
  // The fence is lifted after the decision: a still has a free GPU.
  EXPECT_EQ(Schedule(GpuPod("ml", "p3", {.gpus = 1}), {"a", "b"}), "b");  // b is fuller: 1 free
  EXPECT_EQ(Schedule(GpuPod("ml", "p4", {.gpus = 1}), {"a", "b"}), "a");
}

TEST_F(ExtenderTest, UnboundReservationsExpire) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  json pod = GpuPod("ml", "p", {.gpus = 2});
  ASSERT_EQ(ex_->Filter(pod, {"a"}).nodes.size(), 1u);
  json other = GpuPod("ml", "other", {.gpus = 1});
  EXPECT_THAT(ex_->Filter(other, {"a"}).nodes, IsEmpty());
  clock_.Advance(std::chrono::seconds(31));
  ex_->Expire();
  EXPECT_FALSE(ex_->AllocationOf("ml/p"));
  EXPECT_EQ(ex_->Filter(other, {"a"}).nodes, std::vector<std::string>{"a"});
  // A bind after expiry is refused: kube-scheduler tries the pod again.
  auto late = ex_->PrepareBind("ml", "p", "", "a");
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("no GPUs reserved"));
}

TEST_F(ExtenderTest, BindToAnotherNodeReleasesTheReservation) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  json pod = GpuPod("ml", "p", {.gpus = 1});
  auto f = ex_->Filter(pod, {"a", "b"});
  ASSERT_EQ(f.nodes.size(), 1u);
  std::string other = f.nodes[0] == "a" ? "b" : "a";
  auto plan = ex_->PrepareBind("ml", "p", "", other);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("reserved on node " + f.nodes[0]));
  EXPECT_FALSE(ex_->AllocationOf("ml/p"));
}

TEST_F(ExtenderTest, PodsBoundByOthersAreAccountedFromTheirAssignment) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  json pod = GpuPod("ml", "elsewhere", {.gpus = 1});
  pod["spec"]["nodeName"] = "a";
  auto node = NodeOf(GpuNode("a"));
  kube::Assignment as{"a", 1, {{"main", "tessera.io/gpu", {node->spec.gpus[1].uuid}, 1}}};
  pod["metadata"]["annotations"][kube::kAssignmentAnnotation] = kube::FormatAssignment(as);
  ex_->OnPod(Ev::kAdded, pod);
  auto a = ex_->AllocationOf("ml/elsewhere");
  ASSERT_TRUE(a);
  EXPECT_THAT(a->gpus, ElementsAre(1));
  // Without an annotation: the first free GPU.
  json bare = GpuPod("ml", "bare", {.gpus = 1});
  bare["spec"]["nodeName"] = "a";
  ex_->OnPod(Ev::kAdded, bare);
  EXPECT_THAT(ex_->AllocationOf("ml/bare")->gpus, ElementsAre(0));
  EXPECT_THAT(ex_->Filter(GpuPod("ml", "more", {.gpus = 1}), {"a"}).nodes, IsEmpty());
}

TEST_F(ExtenderTest, UnhealthyGpusTakeNoNewPods) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnNode(Ev::kModified, GpuNode("a", "t4x2", {0, 1}));
  FilterResult f = ex_->Filter(GpuPod("ml", "p", {.gpus = 1}), {"a"});
  EXPECT_THAT(f.nodes, IsEmpty());
  EXPECT_THAT(f.failed["a"], HasSubstr("unhealthy"));
  EXPECT_EQ(ex_->stats().gpus_healthy, 0);
  ex_->OnNode(Ev::kModified, GpuNode("a", "t4x2", {1}));
  EXPECT_EQ(ex_->Filter(GpuPod("ml", "p", {.gpus = 1}), {"a"}).nodes,
            std::vector<std::string>{"a"});
  EXPECT_EQ(ex_->AllocationOf("ml/p")->gpus, std::vector<int>{0});
  EXPECT_EQ(ex_->stats().node_updates, 1u) << "health changes are no node update";
}

TEST_F(ExtenderTest, NodeChangesAndDeletionsUpdateTheModelInPlace) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  ASSERT_EQ(Schedule(GpuPod("ml", "on-a", {.gpus = 2}), {"a", "b"}), "a");
  ASSERT_EQ(Schedule(GpuPod("ml", "on-b", {.gpus = 1}), {"a", "b"}), "b");
  ex_->OnNode(Ev::kDeleted, GpuNode("a"));
  // b keeps its pod; a's pod lost its node.
  EXPECT_EQ(ex_->Filter(GpuPod("ml", "next", {.gpus = 1}), {"b"}).nodes,
            std::vector<std::string>{"b"});
  EXPECT_EQ(ex_->stats().node_updates, 3u);
  EXPECT_TRUE(ex_->AllocationOf("ml/on-b"));
  EXPECT_FALSE(ex_->AllocationOf("ml/on-a"));
  EXPECT_EQ(ex_->stats().nodes, 1);
  // A node whose agent now reports another machine is replaced in place.
  ex_->OnNode(Ev::kModified, GpuNode("b", "dgx-h100"));
  EXPECT_EQ(ex_->Filter(GpuPod("ml", "wide", {.gpus = 4}), {"b"}).nodes,
            std::vector<std::string>{"b"});
  EXPECT_EQ(ex_->stats().node_updates, 4u);
}

TEST_F(ExtenderTest, GangsArePlacedWholeOrNotAtAll) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  // No PodGroup of that name: the pod says so.
  json orphan = GpuPod("ml", "orphan", {.gpus = 1, .pod_group = "nosuch"});
  EXPECT_THAT(ex_->Filter(orphan, {"a", "b"}).error, HasSubstr("no PodGroup ml/nosuch"));

  ex_->OnPodGroup(Ev::kAdded, testing::PodGroup("ml", "job", 3));
  json w0 = GpuPod("ml", "w0", {.gpus = 2, .pod_group = "job"});
  json w1 = GpuPod("ml", "w1", {.gpus = 1, .pod_group = "job"});
  json w2 = GpuPod("ml", "w2", {.gpus = 1, .pod_group = "job"});
  FilterResult f0 = ex_->Filter(w0, {"a", "b"});
  EXPECT_THAT(f0.nodes, IsEmpty());
  EXPECT_EQ(f0.wait_kind, "gang");
  EXPECT_THAT(f0.failed["a"], HasSubstr("1 of 3 members"));
  EXPECT_EQ(ex_->stats().gangs_waiting, 1);
  // Nothing is held while the gang is incomplete.
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, 0);
  EXPECT_THAT(ex_->Filter(w1, {"a", "b"}).nodes, IsEmpty());
  // The last member completes it: all three are reserved at once.
  FilterResult f2 = ex_->Filter(w2, {"a", "b"});
  ASSERT_EQ(f2.nodes.size(), 1u) << f2.reason;
  EXPECT_EQ(ex_->stats().reserved, 3);
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, 4000);
  // Retried by kube-scheduler, the others get their reserved node.
  FilterResult again = ex_->Filter(w0, {"a", "b"});
  ASSERT_EQ(again.nodes.size(), 1u);
  EXPECT_EQ(again.reason, "reserved earlier");
  // w1 and w2 were started by w2's filter: they are to be nudged, w2 (which asked) is not.
  auto nudges = ex_->TakeNudges();
  ASSERT_EQ(nudges.size(), 2u);
  EXPECT_EQ(nudges[0].first == "ml/w0" || nudges[1].first == "ml/w0", true);
  for (auto& [id, node] : nudges) EXPECT_NE(id, "ml/w2");
  auto plan = ex_->PrepareBind("ml", "w0", "", again.nodes[0]);
  ASSERT_TRUE(plan.ok());
  json bound = w0;
  bound["spec"]["nodeName"] = again.nodes[0];
  bound["metadata"]["annotations"][kube::kAssignmentAnnotation] =
      kube::FormatAssignment(plan->assignment);
  ex_->OnPod(Ev::kModified, bound);
  EXPECT_EQ(ex_->stats().bound, 1);
  // kube-scheduler never comes back for the rest: their reservations lapse, and the member already
  // bound is stopped too. No partial gang keeps GPUs.
  clock_.Advance(std::chrono::seconds(31));
  ex_->Expire();
  auto victims = ex_->TakeEvictions();
  ASSERT_EQ(victims.size(), 1u);
  EXPECT_EQ(victims[0].name, "w0");
  EXPECT_THAT(victims[0].reason, HasSubstr("gang ml/job did not bind whole"));
  EXPECT_EQ(ex_->stats().reserved, 0);
  ex_->OnPod(Ev::kDeleted, bound);
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, 0);
}

// An elastic gang (issue 59): a PodGroup whose minMember is below its replicas starts when its
// minimum fits, whole; the members past it are placed one by one as GPUs free up, and a member
// that waits holds nothing and never holds the started gang back.
TEST_F(ExtenderTest, AGangStartsAtItsMinMemberAndGrowsToItsReplicasAsGpusFree) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));  // two GPUs each
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  json busy = GpuPod("ml", "busy", {.gpus = 2});
  FilterResult fb = ex_->Filter(busy, {"b"});
  ASSERT_EQ(fb.nodes, std::vector<std::string>{"b"}) << fb.reason;
  auto pb = ex_->PrepareBind("ml", "busy", "", "b");
  ASSERT_TRUE(pb.ok());
  const json busy_bound = Bound(busy, *pb);
  ex_->OnPod(Ev::kModified, busy_bound);
  // minMember 2 of 4 replicas, a GPU each.
  ex_->OnPodGroup(Ev::kAdded, testing::PodGroup("ml", "job", 2));
  std::vector<json> w;
  for (int i = 0; i < 4; ++i)
    w.push_back(GpuPod("ml", "w" + std::to_string(i), {.gpus = 1, .pod_group = "job"}));
  FilterResult f0 = ex_->Filter(w[0], {"a", "b"});
  EXPECT_THAT(f0.nodes, IsEmpty());
  EXPECT_EQ(f0.wait_kind, "gang");
  EXPECT_EQ(Schedule(w[1], {"a", "b"}), "a") << "its minimum fits on a: it starts";
  EXPECT_EQ(Schedule(w[0], {"a", "b"}), "a");
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, 4000);
  // The third member is placed on its own: no GPU is free, so it waits, holding nothing, and not
  // for a gang.
  FilterResult f2 = ex_->Filter(w[2], {"a", "b"});
  EXPECT_THAT(f2.nodes, IsEmpty());
  EXPECT_NE(f2.wait_kind, "gang") << f2.reason;
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, 4000);
  // The started gang keeps running whatever its later members do (no "did not bind whole").
  clock_.Advance(std::chrono::seconds(31));
  ex_->Expire();
  EXPECT_THAT(ex_->TakeEvictions(), IsEmpty());
  // GPUs free up: the rest of its replicas start, up to its size.
  ex_->OnPod(Ev::kDeleted, busy_bound);
  EXPECT_EQ(Schedule(w[2], {"a", "b"}), "b");
  EXPECT_EQ(Schedule(w[3], {"a", "b"}), "b");
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, 4000);
  EXPECT_EQ(ex_->stats().bound, 4);
  // A higher-priority pod takes a GPU back from a member past the minimum (the gang shrinks
  // toward it), not from the gang's first two, which would be stopped whole.
  json high = GpuPod("ml", "high", {.gpus = 1, .priority = 100});
  FilterResult fh = ex_->Filter(high, {"a", "b"});
  EXPECT_EQ(fh.wait_kind, "preemption") << fh.reason;
  auto victims = ex_->TakeEvictions();
  ASSERT_EQ(victims.size(), 1u);
  EXPECT_TRUE(victims[0].name == "w2" || victims[0].name == "w3") << victims[0].name;
  EXPECT_EQ(victims[0].node, "b");
}

// kube-scheduler may offer a pod only some nodes (percentageOfNodesToScore, its own filters): a
// gang member reserved on a node left out waits for it rather than go elsewhere.
TEST_F(ExtenderTest, AGangMemberWhoseReservedNodeIsNotOfferedWaitsForIt) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  ex_->OnPodGroup(Ev::kAdded, testing::PodGroup("ml", "job", 2));
  json w0 = GpuPod("ml", "w0", {.gpus = 2, .pod_group = "job"});  // a whole node each
  json w1 = GpuPod("ml", "w1", {.gpus = 2, .pod_group = "job"});
  EXPECT_THAT(ex_->Filter(w0, {"a", "b"}).nodes, IsEmpty());
  FilterResult f1 = ex_->Filter(w1, {"a", "b"});
  ASSERT_EQ(f1.nodes.size(), 1u) << f1.reason;
  const std::string other = f1.nodes[0] == "a" ? "b" : "a";  // w0's reserved node
  const int64_t held = ex_->stats().gpu_milli_allocated;
  FilterResult f0 = ex_->Filter(w0, {f1.nodes[0]});
  EXPECT_THAT(f0.nodes, IsEmpty()) << "placed away from its reservation on " << other;
  EXPECT_THAT(f0.failed[f1.nodes[0]], HasSubstr("reserved with its gang on node " + other));
  EXPECT_EQ(f0.wait_kind, "gang");
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, held) << "a second set of GPUs held";
  EXPECT_EQ(ex_->Filter(w0, {"a", "b"}).nodes, std::vector<std::string>{other});
}

// The node agent makes a gang's shares on a node one gang at its GPU arbiter: the bind names the
// gang and every GPU its members' shares have on that node.
TEST_F(ExtenderTest, AGangsSharesOnANodeAreNamedTogetherForTheArbiter) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnPodGroup(Ev::kAdded, testing::PodGroup("ml", "job", 2));
  json w0 = GpuPod("ml", "w0", {.shares = 3, .pod_group = "job"});  // 3 of 4: a GPU each
  json w1 = GpuPod("ml", "w1", {.shares = 3, .pod_group = "job"});
  EXPECT_THAT(ex_->Filter(w0, {"a"}).nodes, IsEmpty());
  ASSERT_EQ(ex_->Filter(w1, {"a"}).nodes, std::vector<std::string>{"a"});
  auto p0 = ex_->PrepareBind("ml", "w0", "", "a");
  auto p1 = ex_->PrepareBind("ml", "w1", "", "a");
  ASSERT_TRUE(p0.ok() && p1.ok());
  const std::vector<std::string>& gpus = p1->assignment.gang_gpus;
  EXPECT_EQ(p1->assignment.gang, "ml/job");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(p0->assignment.gang_gpus, gpus) << "every member names the same GPUs";
  EXPECT_NE(p0->assignment.containers[0].gpus[0], p1->assignment.containers[0].gpus[0]);
  for (const auto* p : {&*p0, &*p1}) {
    EXPECT_NE(std::find(gpus.begin(), gpus.end(), p->assignment.containers[0].gpus[0]), gpus.end());
  }
  // A pod in no gang, or a gang of whole GPUs, names none.
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  json solo = GpuPod("ml", "solo", {.shares = 1});
  ASSERT_EQ(ex_->Filter(solo, {"b"}).nodes, std::vector<std::string>{"b"});
  auto ps = ex_->PrepareBind("ml", "solo", "", "b");
  ASSERT_TRUE(ps.ok());
  EXPECT_TRUE(ps->assignment.gang.empty());
  EXPECT_TRUE(ps->assignment.gang_gpus.empty());
}

TEST_F(ExtenderTest, TessseraGangAnnotationsWork) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  json annotations = {{"tessera.io/gang", "g"}, {"tessera.io/gang-size", "2"}};
  json p0 = GpuPod("ml", "p0", {.gpus = 1, .annotations = annotations});
  json p1 = GpuPod("ml", "p1", {.gpus = 1, .annotations = annotations});
  EXPECT_EQ(ex_->Filter(p0, {"a"}).wait_kind, "gang");
  EXPECT_EQ(ex_->Filter(p1, {"a"}).nodes, std::vector<std::string>{"a"});
  EXPECT_EQ(ex_->Filter(p0, {"a"}).nodes, std::vector<std::string>{"a"});
}

TEST_F(ExtenderTest, PriorityPreemptsLowerPriorityPods) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ASSERT_EQ(Schedule(GpuPod("ml", "low", {.gpus = 2, .priority = 1}), {"a"}), "a");
  json high = GpuPod("ml", "high", {.gpus = 2, .priority = 100});
  FilterResult f = ex_->Filter(high, {"a"});
  EXPECT_THAT(f.nodes, IsEmpty());
  EXPECT_EQ(f.wait_kind, "preemption");
  auto victims = ex_->TakeEvictions();
  ASSERT_EQ(victims.size(), 1u);
  EXPECT_EQ(victims[0].name, "low");
  EXPECT_EQ(victims[0].uid, "uid-ml-low");
  EXPECT_EQ(victims[0].node, "a");
  // kube-scheduler's preempt gets the same victim, on the node the core chose.
  PreemptResult p = ex_->Preempt(high, {{"a", {"uid-ml-low"}}});
  EXPECT_EQ(p.victims["a"], std::vector<std::string>{"uid-ml-low"});
  EXPECT_THAT(ex_->Preempt(high, {{"elsewhere", {}}}).victims, IsEmpty());
  // The victim goes; the next filter starts the pod.
  ex_->OnPod(Ev::kDeleted, GpuPod("ml", "low", {.gpus = 2, .priority = 1}));
  EXPECT_EQ(ex_->Filter(high, {"a"}).nodes, std::vector<std::string>{"a"});
}

// kube-scheduler's preempt verb, after a filter that asked a victim to stop on one node, offering
// only another node: no second victim there (it once evicted one on each node for one pod).
TEST_F(ExtenderTest, PreemptAnswersWhatTheCycleAskedAndNeverASecondVictim) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  ASSERT_EQ(Schedule(GpuPod("ml", "low-a", {.gpus = 2, .priority = 1}), {"a"}), "a");
  ASSERT_EQ(Schedule(GpuPod("ml", "low-b", {.gpus = 2, .priority = 1}), {"b"}), "b");
  json high = GpuPod("ml", "high", {.gpus = 2, .priority = 100});
  EXPECT_THAT(ex_->Preempt(high, {{"a", {"uid-ml-low-a"}}, {"b", {"uid-ml-low-b"}}}).victims,
              IsEmpty())
      << "no filter yet: nothing asked";
  EXPECT_EQ(ex_->Filter(high, {"a", "b"}).wait_kind, "preemption");
  auto victims = ex_->TakeEvictions();
  ASSERT_EQ(victims.size(), 1u);
  const std::string node = victims[0].node, other = node == "a" ? "b" : "a";
  EXPECT_EQ(victims[0].uid, "uid-ml-low-" + node);
  EXPECT_THAT(ex_->Preempt(high, {{other, {"uid-ml-low-" + other}}}).victims, IsEmpty());
  PreemptResult same = ex_->Preempt(high, {{"a", {"uid-ml-low-a"}}, {"b", {"uid-ml-low-b"}}});
  ASSERT_EQ(same.victims.size(), 1u);
  EXPECT_EQ(same.victims[node], std::vector<std::string>{"uid-ml-low-" + node});
  EXPECT_TRUE(ex_->TakeEvictions().empty()) << "nothing more asked";
  EXPECT_TRUE(ex_->AllocationOf("ml/low-" + other)) << "the other node's pod keeps running";
}

// The nodes kube-scheduler did not offer the pod that asks are closed for that pod alone: another
// pod that can start in the same step starts where its own filter allowed, not where this one's
// did (the whole step was fenced once, and a pod waiting for node a stayed waiting while a pod
// offered only node b was filtered).
TEST_F(ExtenderTest, OnlyThePodThatAsksIsNarrowedToItsCandidates) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));  // two GPUs each
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  json on_a = GpuPod("ml", "on-a", {.gpus = 2});
  ASSERT_EQ(Schedule(on_a, {"a"}), "a");
  ASSERT_EQ(Schedule(GpuPod("ml", "on-b", {.gpus = 2}), {"b"}), "b");
  json big = GpuPod("ml", "big", {.gpus = 2});
  EXPECT_THAT(ex_->Filter(big, {"a", "b"}).nodes, IsEmpty());
  // a comes free; the next filter is for a pod kube-scheduler offers node b only.
  on_a["spec"]["nodeName"] = "a";
  ex_->OnPod(Ev::kDeleted, on_a);
  json small = GpuPod("ml", "small", {.gpus = 1});
  FilterResult f = ex_->Filter(small, {"b"});
  EXPECT_THAT(f.nodes, IsEmpty()) << "b is full";
  auto a = ex_->AllocationOf("ml/big");
  ASSERT_TRUE(a) << "big started on a in the same step: " << *ex_->Waiting("ml/big");
  auto nudges = ex_->TakeNudges();
  ASSERT_EQ(nudges.size(), 1u);
  EXPECT_EQ(nudges[0], std::make_pair(std::string("ml/big"), std::string("a")));
  // What small was told is about b, its one candidate, which is full - not sick.
  EXPECT_THAT(f.failed["b"], Not(HasSubstr("unhealthy")));
  EXPECT_FALSE(f.failed.contains("a"));
  EXPECT_EQ(ex_->stats().gpus_healthy, 4) << "no GPU left marked sick";
}

// A node that comes, changes or goes leaves the queue, its reasons and the other pods alone.
TEST_F(ExtenderTest, ANodeChangeKeepsTheQueueAndItsReasons) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));  // two GPUs
  ASSERT_EQ(Schedule(GpuPod("ml", "small", {.gpus = 1}), {"a"}), "a");
  json big = GpuPod("ml", "big", {.gpus = 4});
  EXPECT_THAT(ex_->Filter(big, {"a"}).nodes, IsEmpty());
  auto why = ex_->Waiting("ml/big");
  ASSERT_TRUE(why);
  EXPECT_THAT(*why, HasSubstr("no node fits"));
  ex_->OnNode(Ev::kAdded, GpuNode("b"));
  ex_->OnNode(Ev::kModified, GpuNode("a", "dgx-h100"));  // now eight GPUs
  EXPECT_EQ(ex_->Waiting("ml/big"), why) << "still queued, for the same reason";
  EXPECT_EQ(ex_->stats().queued, 1);
  auto small = ex_->AllocationOf("ml/small");
  ASSERT_TRUE(small) << "the bound pod kept its GPU on the changed node";
  EXPECT_EQ(small->gpus, std::vector<int>{0});
  EXPECT_EQ(ex_->Filter(big, {"a", "b"}).nodes, std::vector<std::string>{"a"});
  ex_->OnNode(Ev::kDeleted, GpuNode("a"));
  EXPECT_FALSE(ex_->AllocationOf("ml/small"));
  EXPECT_EQ(ex_->stats().gpus, 2) << "b's";
  EXPECT_EQ(ex_->stats().gpu_milli_allocated, 0);
}

TEST_F(ExtenderTest, AGangOfHigherPriorityPreemptsAsAWhole) {
  ex_->OnNode(Ev::kAdded, GpuNode("a"));  // two GPUs
  json low0 = GpuPod("ml", "low0", {.gpus = 1, .priority = 1});
  json low1 = GpuPod("ml", "low1", {.gpus = 1, .priority = 1});
  ASSERT_EQ(Schedule(low0, {"a"}), "a");
  ASSERT_EQ(Schedule(low1, {"a"}), "a");
  json annotations = {{"tessera.io/gang", "pair"}, {"tessera.io/gang-size", "2"}};
  json p0 = GpuPod("ml", "p0", {.gpus = 1, .priority = 100, .annotations = annotations});
  json p1 = GpuPod("ml", "p1", {.gpus = 1, .priority = 100, .annotations = annotations});
  EXPECT_EQ(ex_->Filter(p0, {"a"}).wait_kind, "gang");
  // Complete, it fits nowhere: both low pods are evicted for it, and nothing is placed yet.
  FilterResult f = ex_->Filter(p1, {"a"});
  EXPECT_THAT(f.nodes, IsEmpty());
  EXPECT_EQ(f.wait_kind, "preemption");
  EXPECT_THAT(f.reason, HasSubstr("gang ml/pair: waiting for 2 preempted job(s) to stop"));
  std::vector<std::string> evicted;
  for (const Victim& v : ex_->TakeEvictions()) evicted.push_back(v.name);
  std::sort(evicted.begin(), evicted.end());
  EXPECT_THAT(evicted, ElementsAre("low0", "low1"));
  // One victim gone: still waiting for the other, nothing asked again.
  ex_->OnPod(Ev::kDeleted, low0);
  EXPECT_THAT(ex_->Filter(p1, {"a"}).nodes, IsEmpty());
  EXPECT_THAT(ex_->TakeEvictions(), IsEmpty());
  ex_->OnPod(Ev::kDeleted, low1);
  // Both gone: the gang is placed whole.
  EXPECT_EQ(ex_->Filter(p1, {"a"}).nodes, std::vector<std::string>{"a"});
  EXPECT_EQ(ex_->stats().reserved, 2);
}

TEST_F(ExtenderTest, BorrowedQuotaIsReclaimedForTheLender) {
  ASSERT_TRUE(ex_->SetQuotas(nullptr).ok());
  json cm = testing::QuotaConfigMap(R"(
namespaces:
  team-a: {cohort: lab, guaranteed: {gpus: 1}, limit: {gpus: 2}}
  team-b: {cohort: lab, guaranteed: {gpus: 1}}
)");
  ASSERT_TRUE(ex_->SetQuotas(&cm).ok());
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ASSERT_EQ(Schedule(GpuPod("team-a", "own", {.gpus = 1}), {"a"}), "a");
  // team-b is idle: team-a borrows its GPU.
  ASSERT_EQ(Schedule(GpuPod("team-a", "borrowed", {.gpus = 1}), {"a"}), "a");
  // team-a's next pod finds no room and may not take it back from itself (same priority).
  FilterResult q = ex_->Filter(GpuPod("team-a", "third", {.gpus = 1}), {"a"});
  EXPECT_EQ(q.wait_kind, "no-fit");
  EXPECT_THAT(ex_->TakeEvictions(), IsEmpty());
  auto use = ex_->quota_use();
  EXPECT_EQ(use["team-a"].used.gpus, 2);
  // team-b comes back at the same priority: the borrowed pod is reclaimed, not the owned one.
  json lender = GpuPod("team-b", "back", {.gpus = 1});
  EXPECT_THAT(ex_->Filter(lender, {"a"}).nodes, IsEmpty());
  auto victims = ex_->TakeEvictions();
  ASSERT_EQ(victims.size(), 1u);
  EXPECT_EQ(victims[0].ns, "team-a");
  EXPECT_EQ(victims[0].name, "borrowed");
  ex_->OnPod(Ev::kDeleted, GpuPod("team-a", "borrowed", {.gpus = 1}));
  EXPECT_EQ(ex_->Filter(lender, {"a"}).nodes, std::vector<std::string>{"a"});
}

TEST_F(ExtenderTest, ABadQuotaConfigMapChangesNothing) {
  json good = testing::QuotaConfigMap("namespaces:\n  team-a: {guaranteed: {gpus: 1}}\n");
  ASSERT_TRUE(ex_->SetQuotas(&good).ok());
  json bad = testing::QuotaConfigMap("namespaces:\n  team-a: {guaranteed: {gpus: lots}}\n");
  absl::Status st = ex_->SetQuotas(&bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("ConfigMap tessera-system/tessera-quotas: quotas.yaml: "
                        "namespaces.team-a.guaranteed.gpus"));
  EXPECT_THAT(ex_->stats().quota_error, HasSubstr("gpus"));
  // The old quota still holds.
  ex_->OnNode(Ev::kAdded, GpuNode("a"));
  ASSERT_EQ(Schedule(GpuPod("team-a", "p1", {.gpus = 1}), {"a"}), "a");
  EXPECT_EQ(ex_->Filter(GpuPod("team-a", "p2", {.gpus = 1}), {"a"}).wait_kind, "quota");
}

TEST(ParseQuotas, FormAndErrors) {
  auto q = ParseQuotas(R"(
namespaces:
  a: {cohort: lab, guaranteed: {gpus: 2, gpuCompute: "2500m", gpuMemory: 80Gi}, limit: {gpus: 4}}
  b: {limit: {gpus: 3}}
)");
  ASSERT_TRUE(q.ok()) << q.status();
  const sched::OwnerQuota& a = q->at("a");
  EXPECT_EQ(a.limit.gpus, 2);
  EXPECT_EQ(a.limit.gpu_milli, 2500);
  EXPECT_EQ(a.limit.gpu_memory_mib, 80 * 1024);
  EXPECT_TRUE(a.borrow);
  EXPECT_EQ(a.borrow_limit.gpus, 4);
  EXPECT_EQ(a.cohort, "lab");
  const sched::OwnerQuota& b = q->at("b");
  EXPECT_EQ(b.limit.gpus, 3);  // a hard limit alone: no borrowing
  EXPECT_FALSE(b.borrow);
  EXPECT_TRUE(ParseQuotas("").ok());
  struct Case {
    const char* yaml;
    const char* error;
  };
  for (const Case& c : {
           Case{"[", "not YAML"},
           Case{"teams: {}", "unknown key 'teams'"},
           Case{"namespaces: {a: {}}", "needs guaranteed, limit or both"},
           Case{"namespaces: {a: {guaranteed: {gpus: 2}, limit: {gpus: 1}}}", "below guaranteed"},
           Case{"namespaces: {a: {guaranteed: {gpus: 1.5}}}",
                "gpus: expected a non-negative whole"},
           Case{"namespaces: {a: {guaranteed: {cpus: 1}}}", "unknown key 'cpus'"},
           Case{"namespaces: {a: {guaranteed: {gpuMemory: -1Gi}}}", "gpuMemory"},
           Case{"namespaces: {a: {borrow: true}}", "unknown key 'borrow'"},
       }) {
    auto r = ParseQuotas(c.yaml);
    EXPECT_FALSE(r.ok()) << c.yaml;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.error)) << c.yaml;
  }
}

}  // namespace
}  // namespace tessera::extender
