#include "tessera/extender/objects.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/devices/inventory.h"
#include "tessera/extender/test_objects.h"
#include "tessera/kube/gpu_annotations.h"

namespace tessera::extender {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(Quantity, KubernetesForms) {
  EXPECT_EQ(ParseQuantity("500m", 1000), 500);  // half a core in millicores
  EXPECT_EQ(ParseQuantity("500m", 1), 1);       // rounded up
  EXPECT_EQ(ParseQuantity("2", 1000), 2000);
  EXPECT_EQ(ParseQuantity("0.1", 1000), 100);
  EXPECT_EQ(ParseQuantity("1Gi", 1.0 / (1 << 20)), 1024);
  EXPECT_EQ(ParseQuantity("1.5Gi", 1.0 / (1 << 20)), 1536);
  EXPECT_EQ(ParseQuantity("16G", 1.0 / (1 << 20)), 15259);  // 16e9 bytes in MiB, rounded up
  EXPECT_EQ(ParseQuantity("1e3"), 1000);
  EXPECT_EQ(ParseQuantity("+3"), 3);
  for (const char* bad : {"", "-1", "1.2.3", "Gi", "1Xi", "1e", "1e99999", "abc", ".", "1 Gi"}) {
    EXPECT_FALSE(ParseQuantity(bad).has_value()) << bad;
  }
}

json GpuNode(const std::string& name) {
  auto m = devices::LoadSimulatedMachine("dgx-h100");
  kube::NodeGpus n{m->inventory, std::vector<bool>(8, true), 10};
  n.healthy[2] = false;
  return {{"metadata",
           {{"name", name},
            {"labels", {{"tessera.io/gpu.count", "8"}}},
            {"annotations", {{kube::kNodeGpusAnnotation, kube::FormatNodeGpus(n)}}}}},
          {"status", {{"allocatable", {{"cpu", "96"}, {"memory", "1Ti"}}}}}};
}

TEST(NodeOf, AllocatableLabelsAndTheAgentsGpus) {
  auto n = NodeOf(GpuNode("gpu-1"));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(n->has_agent);
  EXPECT_EQ(n->spec.name, "gpu-1");
  EXPECT_EQ(n->spec.cpu_milli, 96000);
  EXPECT_EQ(n->spec.memory_mib, 1 << 20);
  ASSERT_EQ(n->spec.gpus.size(), 8u);
  EXPECT_EQ(n->spec.gpus[0].memory_mib, 81559);
  EXPECT_EQ(n->spec.gpus[0].compute_capability.major, 9);
  EXPECT_FALSE(n->healthy[2]);
  EXPECT_EQ(n->shares_per_gpu, 10);
  EXPECT_TRUE(n->spec.topology.link(0, 1).has_nvlink());

  json cpu_only = {{"metadata", {{"name", "cpu-1"}}},
                   {"status", {{"allocatable", {{"cpu", "8"}}}}}};
  auto c = NodeOf(cpu_only);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->has_agent);
  EXPECT_TRUE(c->spec.gpus.empty());

  json broken = GpuNode("gpu-2");
  broken["metadata"]["annotations"][kube::kNodeGpusAnnotation] = "{";
  EXPECT_THAT(std::string(NodeOf(broken).status().message()), HasSubstr("node gpu-2: annotation"));
  json bad_cpu = GpuNode("gpu-3");
  bad_cpu["status"]["allocatable"]["cpu"] = "lots";
  EXPECT_THAT(std::string(NodeOf(bad_cpu).status().message()),
              HasSubstr("node gpu-3: status.allocatable.cpu: not a quantity"));
}

json Pod(json containers, json annotations = json::object()) {
  return {{"metadata", {{"name", "p"}, {"namespace", "team-a"}, {"annotations", annotations}}},
          {"spec", {{"containers", containers}, {"priority", 100}}}};
}

json Container(const std::string& name, const std::string& res, int n,
               const std::string& cpu = "1") {
  return {{"name", name},
          {"resources", {{"limits", {{res, std::to_string(n)}}}, {"requests", {{"cpu", cpu}}}}}};
}

TEST(PodDemandOf, WholeGpusAcrossContainersAndAnnotations) {
  auto d = PodDemandOf(
      Pod({Container("a", "tessera.io/gpu", 2), Container("b", "tessera.io/gpu", 1, "500m")},
          {{"tessera.io/gpu-model", "NVIDIA H100 80GB HBM3,A100"},
           {"tessera.io/topology", "require-nvlink"},
           {"tessera.io/preemptible", "false"},
           {"tessera.io/gang", "job-7"},
           {"tessera.io/gang-size", "4"}}),
      10);
  ASSERT_TRUE(d.ok()) << d.status();
  const core::Request& r = d->request;
  EXPECT_EQ(r.id, "team-a/p");
  EXPECT_EQ(r.owner, "team-a");
  EXPECT_EQ(r.gpus, 3);
  EXPECT_EQ(r.cpu_milli, 1500);
  EXPECT_EQ(r.priority, 100);
  EXPECT_EQ(r.models, (std::vector<std::string>{"NVIDIA H100 80GB HBM3", "A100"}));
  EXPECT_EQ(r.topology, core::TopologyMode::kRequire);
  EXPECT_EQ(r.topology_scope, core::TopologyScope::kNvlink);
  EXPECT_FALSE(r.preemptible);
  EXPECT_EQ(r.gang, "team-a/job-7");
  EXPECT_EQ(r.gang_size, 4);
  ASSERT_EQ(d->containers.size(), 2u);
  EXPECT_EQ(d->containers[1].container, "b");
  EXPECT_EQ(d->containers[1].count, 1);
}

// Names past Kubernetes' bounds are refused, and the refusal does not echo them.
TEST(PodDemandOf, ANameOverKubernetesBoundsIsRefusedWithoutEchoingIt) {
  json pod = Pod({Container("a", "tessera.io/gpu", 1)});
  pod["metadata"]["name"] = std::string(1 << 20, 'x');
  auto d = PodDemandOf(pod, 10);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(d.status().message().size(), 200u) << "the name is not in the message";
  EXPECT_NE(std::string(d.status().message()).find("1048576 characters"), std::string::npos);
  pod["metadata"]["name"] = std::string(253, 'x');
  EXPECT_TRUE(PodDemandOf(pod, 10).ok()) << "253 characters is a valid name";
  pod["metadata"]["namespace"] = std::string(64, 'n');
  EXPECT_FALSE(PodDemandOf(pod, 10).ok());
}

TEST(PodDemandOf, WhatHistoryKnowsAPodByAndFieldsOfTheWrongTypeIgnored) {
  json pod = extender::testing::GpuPod("ml", "train-x7k2p", {.gpus = 1});
  pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "train";
  pod["spec"]["containers"][0]["command"] = {"python", 3, "train.py"};  // a number: not an argument
  pod["spec"]["containers"][0]["args"] = {"--epochs=2"};
  pod["spec"]["activeDeadlineSeconds"] = 600;
  auto d = PodDemandOf(pod, 10);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind.user, "ml");
  EXPECT_EQ(d->kind.name, "train");
  EXPECT_EQ(d->kind.command, (std::vector<std::string>{"python", "train.py", "--epochs=2"}));
  EXPECT_EQ(d->kind.shape, "1 GPU");
  EXPECT_EQ(d->kind.max_runtime_s, 600);
  // Without the Job label: its controller, by kind and name; a deadline that is no number, or
  // negative, bounds nothing.
  pod["metadata"].erase("labels");
  pod["metadata"]["ownerReferences"] = {{{"kind", "Job"}, {"name", "train"}, {"controller", true}},
                                        {{"kind", "Other"}, {"name", 7}, {"controller", true}}};
  pod["spec"]["activeDeadlineSeconds"] = "600";
  d = PodDemandOf(pod, 10);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind.name, "Job/train");
  EXPECT_EQ(d->kind.max_runtime_s, 0);
  pod["spec"]["activeDeadlineSeconds"] = -5;
  pod["metadata"]["ownerReferences"] = "not a list";
  d = PodDemandOf(pod, 10);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind.name, "");
  EXPECT_EQ(d->kind.max_runtime_s, 0);
}

TEST(PodDemandOf, AShareWithMemory) {
  auto d = PodDemandOf(
      Pod({Container("nb", "tessera.io/gpu-share", 3)}, {{"tessera.io/gpu-memory", "10Gi"}}), 10);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->request.gpus, 0);
  EXPECT_EQ(d->request.gpu_milli, 300);
  EXPECT_EQ(d->request.gpu_memory_mib, 10240);
  EXPECT_TRUE(d->request.fractional());
  EXPECT_EQ(d->request.expected_util_pct, 0);
  auto busy = PodDemandOf(
      Pod({Container("nb", "tessera.io/gpu-share", 3)}, {{"tessera.io/gpu-utilization", "40%"}}),
      10);
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(busy->request.expected_util_pct, 40);
  EXPECT_FALSE(busy->request.sharing.has_value());
  auto mps = PodDemandOf(
      Pod({Container("nb", "tessera.io/gpu-share", 3)}, {{"tessera.io/sharing", "mps"}}), 10);
  ASSERT_TRUE(mps.ok()) << mps.status();
  EXPECT_TRUE(mps->request.mps());
  EXPECT_EQ(mps->request.owner, "team-a") << "MPS's one user: the namespace";
  // Memory "auto": the extender sizes it; its kind says "auto" whatever each run is given. A
  // trial's time.
  auto sized = PodDemandOf(Pod({Container("nb", "tessera.io/gpu-share", 3)},
                               {{"tessera.io/gpu-memory", "auto"}, {"tessera.io/trial", "90s"}}),
                           10);
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_TRUE(sized->memory_auto);
  EXPECT_EQ(sized->request.gpu_memory_mib, 0);
  EXPECT_EQ(sized->kind.shape, "30% auto");
  EXPECT_EQ(sized->trial_s, 90);
  // The kinds an ended share's use joins: its own and its "auto" ones (memory, share, both); a
  // pod named by nothing is its namespace's pods of its shape.
  std::vector<sched::RunKind> kinds = UseKinds(*d);
  ASSERT_EQ(kinds.size(), 4u);
  EXPECT_EQ(kinds[0].shape, "30% 10240MiB");
  EXPECT_EQ(kinds[1].shape, "30% auto");
  EXPECT_EQ(kinds[2].shape, "auto 10240MiB");
  EXPECT_EQ(kinds[3].shape, "auto auto");
  EXPECT_EQ(kinds[1].user, "team-a");
  EXPECT_EQ(kinds[1].command, std::vector<std::string>{kPodsOfItsShape});
  kinds = UseKinds(*sized);
  ASSERT_EQ(kinds.size(), 2u);
  EXPECT_EQ(kinds[1].shape, "auto auto");
}

// tessera.io/gpu-share "auto": sized at admission (the webhook's tessera.io/sizing), its kind's
// shape says "auto" whatever it got - a share or a whole GPU; never placed unsized.
TEST(PodDemandOf, AShareSizedAutoIsOfTheAutoKindAndNeverUnsized) {
  const json sized = {{"tessera.io/gpu-share", "auto"},
                      {"tessera.io/gpu-memory", "10Gi"},
                      {"tessera.io/sizing", "gpu-share 1 (of 10 per GPU): ..."}};
  auto share = PodDemandOf(Pod({Container("nb", "tessera.io/gpu-share", 1)}, sized), 10);
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_TRUE(share->share_auto);
  EXPECT_EQ(share->admitted_sizing, "gpu-share 1 (of 10 per GPU): ...");
  EXPECT_EQ(share->kind.shape, "auto 10240MiB");
  auto whole = PodDemandOf(Pod({Container("nb", "tessera.io/gpu", 1)}, sized), 10);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->kind.shape, "auto 10240MiB") << "sized a whole GPU, of the same kind";
  EXPECT_EQ(whole->request.gpus, 1);
  std::vector<sched::RunKind> kinds = UseKinds(*whole);
  ASSERT_EQ(kinds.size(), 2u);
  EXPECT_EQ(kinds[1].shape, "auto auto") << "its memory as asked, not the whole GPU's";
  auto unsized = PodDemandOf(
      Pod({Container("nb", "tessera.io/gpu-share", 2)}, {{"tessera.io/gpu-share", "auto"}}), 10);
  ASSERT_FALSE(unsized.ok());
  EXPECT_THAT(std::string(unsized.status().message()), HasSubstr("not sized when it was created"));
  auto count = PodDemandOf(
      Pod({Container("nb", "tessera.io/gpu-share", 2)}, {{"tessera.io/gpu-share", "2"}}), 10);
  ASSERT_FALSE(count.ok());
  EXPECT_THAT(std::string(count.status().message()), HasSubstr("expected auto"));
}

TEST(PodDemandOf, WhatTesseraCannotPlaceIsNamed) {
  struct Case {
    json pod;
    std::string want;
  } cases[] = {
      {Pod({Container("a", "cpu", 1)}), "requests neither tessera.io/gpu"},
      {Pod({Container("a", "tessera.io/gpu", 1), Container("b", "tessera.io/gpu-share", 1)}),
       "whole GPUs and shares together"},
      {Pod({Container("a", "tessera.io/gpu-share", 1), Container("b", "tessera.io/gpu-share", 1)}),
       "more than one container"},
      {Pod({Container("a", "tessera.io/gpu-share", 10)}), "ask for tessera.io/gpu instead"},
      {Pod({Container("a", "tessera.io/gpu-share", 2)}, {{"tessera.io/gpu-memory", "lots"}}),
       "tessera.io/gpu-memory: expected a quantity"},
      {Pod({Container("a", "tessera.io/gpu", 1)}, {{"tessera.io/topology", "close"}}),
       "tessera.io/topology: expected prefer-nvlink"},
      {Pod({Container("a", "tessera.io/gpu", 1)}, {{"tessera.io/gang", "g"}}),
       "tessera.io/gang-size: expected 1..10000"},
      {Pod({Container("a", "tessera.io/gpu", 1)}, {{"tessera.io/gpu-model", "A100,"}}),
       "an empty model name"},
      {Pod({Container("a", "tessera.io/gpu", 5000)}), "more than any node has"},
      {Pod({Container("a", "tessera.io/gpu-share", 2)}, {{"tessera.io/gpu-utilization", "0%"}}),
       "tessera.io/gpu-utilization: expected a percentage 1..100"},
      {Pod({Container("a", "tessera.io/gpu-share", 2)}, {{"tessera.io/gpu-utilization", "140"}}),
       "tessera.io/gpu-utilization: expected a percentage 1..100"},
      {Pod({Container("a", "tessera.io/gpu", 1)}, {{"tessera.io/gpu-utilization", "40%"}}),
       "only a pod asking for tessera.io/gpu-share"},
      {Pod({Container("a", "tessera.io/gpu-share", 2)}, {{"tessera.io/sharing", "spatial"}}),
       "tessera.io/sharing: expected time-slice or mps"},
      {Pod({Container("a", "tessera.io/gpu", 1)}, {{"tessera.io/sharing", "mps"}}),
       "mps is for a pod asking for tessera.io/gpu-share"},
      {Pod(json::object()), "spec.containers: expected a list"},
      {Pod({Container("a", "tessera.io/gpu-share", 2)}, {{"tessera.io/trial", "soon"}}),
       "tessera.io/trial: expected a duration from 1s to 7d"},
      {Pod({Container("a", "tessera.io/gpu-share", 2)}, {{"tessera.io/trial", "30d"}}),
       "tessera.io/trial: expected a duration from 1s to 7d"},
      {Pod({Container("a", "tessera.io/gpu-share", 2)}, {{"tessera.io/gpu-memory", "Auto"}}),
       "tessera.io/gpu-memory: expected a quantity such as 10Gi, or auto"},
  };
  for (const Case& c : cases) {
    auto d = PodDemandOf(c.pod, 10);
    ASSERT_FALSE(d.ok()) << c.pod.dump();
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(d.status().message()), HasSubstr("pod team-a/p: "));
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(c.want)) << c.pod.dump();
  }
  EXPECT_THAT(std::string(PodDemandOf(json::object(), 10).status().message()),
              HasSubstr("metadata.name is missing"));
}

}  // namespace
}  // namespace tessera::extender
