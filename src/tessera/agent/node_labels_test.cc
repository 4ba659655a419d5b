// The node's labels and annotation from a discovered machine, and the merge patch that gets a
// Node there without touching labels the agent does not own.
#include "tessera/agent/node_labels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/devices/inventory.h"
#include "tessera/kube/gpu_annotations.h"

namespace tessera::agent {
namespace {

using nlohmann::json;
using ::testing::Contains;
using ::testing::Pair;

core::NodeInventory Preset(const std::string& name) {
  auto m = devices::LoadSimulatedMachine(name);
  EXPECT_TRUE(m.ok()) << m.status();
  return m->inventory;
}

TEST(LabelValue, KeepsWhatKubernetesAcceptsAndReplacesTheRest) {
  EXPECT_EQ(LabelValue("NVIDIA H100 80GB HBM3"), "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(LabelValue("550.54.15"), "550.54.15");
  EXPECT_EQ(LabelValue(" (Tesla) T4 "), "Tesla--T4");
  EXPECT_EQ(LabelValue(std::string(80, 'a')).size(), 63u);
  EXPECT_EQ(LabelValue("---"), "");
}

TEST(DesiredLabels, DescribeTheMachine) {
  core::NodeInventory inv = Preset("dgx-h100");
  NodeFacts f{&inv, std::vector<bool>(8, true), 10};
  f.healthy[5] = false;
  auto l = DesiredLabels(f);
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.count", "8")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.healthy", "7")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.product", LabelValue(inv.gpus[0].model))));
  EXPECT_THAT(
      l, Contains(Pair("tessera.io/gpu.memory", std::to_string(*inv.gpus[0].memory_bytes >> 20))));
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.compute.major", "9")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.compute.minor", "0")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.nvlink", "true")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/driver.version", "550.54.15")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/driver.major", "550")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/cuda.version", "12.4")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/cuda.major", "12")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.shares", "10")));
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.simulated", "true")));
  for (const auto& [k, v] : l) {
    EXPECT_EQ(LabelValue(v), v) << k;
    EXPECT_EQ(k.rfind(kLabelPrefix, 0), 0u) << k;
  }

  core::NodeInventory mixed = Preset("mixed-a100-t4");
  NodeFacts m{&mixed, std::vector<bool>(mixed.gpus.size(), true), 0};
  auto ml = DesiredLabels(m);
  EXPECT_THAT(ml, Contains(Pair("tessera.io/gpu.product", "mixed")));
  uint64_t smallest = UINT64_MAX;
  for (const auto& g : mixed.gpus) smallest = std::min(smallest, *g.memory_bytes);
  EXPECT_THAT(ml, Contains(Pair("tessera.io/gpu.memory", std::to_string(smallest >> 20))));
  EXPECT_FALSE(ml.contains("tessera.io/gpu.shares"));

  auto a = DesiredAnnotations(f);
  auto parsed = kube::ParseNodeGpus(a.at(kube::kNodeGpusAnnotation));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->healthy[5]);
  EXPECT_EQ(parsed->shares_per_gpu, 10);

  // How the GPUs are shared: a label to select on, and each GPU's mode for the extender.
  EXPECT_THAT(l, Contains(Pair("tessera.io/gpu.sharing", "time-slice")));
  f.sharing.assign(8, core::GpuSharing::kTimeSlice);
  f.sharing[2] = core::GpuSharing::kMps;
  EXPECT_THAT(DesiredLabels(f), Contains(Pair("tessera.io/gpu.sharing", "mixed")));
  parsed = kube::ParseNodeGpus(DesiredAnnotations(f).at(kube::kNodeGpusAnnotation));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->sharing, f.sharing);
  f.sharing.assign(8, core::GpuSharing::kMps);
  EXPECT_THAT(DesiredLabels(f), Contains(Pair("tessera.io/gpu.sharing", "mps")));
}

TEST(NodePatch, SetsChangesRemovesOwnedAndLeavesTheRest) {
  std::map<std::string, std::string> want = {{"tessera.io/gpu.count", "8"},
                                             {"tessera.io/gpu.product", "H100"}};
  std::map<std::string, std::string> ann = {{"tessera.io/gpus", "{}"}};
  json node = {{"metadata",
                {{"name", "n"},
                 {"labels",
                  {{"kubernetes.io/hostname", "n"},
                   {"tessera.io/pool", "research"},  // an admin's, not ours
                   {"tessera.io/gpu.count", "4"},
                   {"tessera.io/gpu.mig", "true"}}},
                 {"annotations",
                  {{"tessera.io/agent-labels", "tessera.io/gpu.count,tessera.io/gpu.mig"}}}}}};
  auto patch = NodePatch(node, want, ann);
  ASSERT_TRUE(patch.has_value());
  json labels = (*patch)["metadata"]["labels"];
  EXPECT_EQ(labels["tessera.io/gpu.count"], "8");
  EXPECT_EQ(labels["tessera.io/gpu.product"], "H100");
  EXPECT_TRUE(labels.contains("tessera.io/gpu.mig"));
  EXPECT_TRUE(labels["tessera.io/gpu.mig"].is_null());
  EXPECT_FALSE(labels.contains("tessera.io/pool"));
  EXPECT_FALSE(labels.contains("kubernetes.io/hostname"));
  EXPECT_EQ((*patch)["metadata"]["annotations"]["tessera.io/agent-labels"],
            "tessera.io/gpu.count,tessera.io/gpu.product");

  node.merge_patch(*patch);
  EXPECT_FALSE(NodePatch(node, want, ann).has_value());  // already there: nothing to write
  EXPECT_EQ(node["metadata"]["labels"]["tessera.io/pool"], "research");
}

}  // namespace
}  // namespace tessera::agent
