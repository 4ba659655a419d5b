#include "tessera/kube/gpu_annotations.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/devices/inventory.h"

namespace tessera::kube {
namespace {

using ::testing::HasSubstr;

TEST(Assignment, RoundTripsAndValidates) {
  Assignment a;
  a.node = "gpu-7";
  a.assigned_unix_ms = 1700000000123;
  a.containers.push_back({"trainer", "tessera.io/gpu", {"GPU-a", "GPU-b"}, 2, {}, {}});
  a.containers.push_back({"notebook", "tessera.io/gpu-share", {"GPU-c"}, 3, uint64_t{5} << 30, 7});
  auto back = ParseAssignment(FormatAssignment(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, a);
  EXPECT_EQ(FormatAssignment(a).find("gang"), std::string::npos) << "no gang, no field";
  a.gang = "ml/job";
  a.gang_gpus = {"GPU-c", "GPU-d"};
  back = ParseAssignment(FormatAssignment(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, a);
}

TEST(Assignment, BadAnnotationsNameTheField) {
  struct Case {
    std::string text, want;
  } cases[] = {
      {"", "not JSON"},
      {"[]", "expected a JSON object"},
      {R"({"containers":[]})", "containers: expected 1..64"},
      {R"({"containers":[{"resource":"nvidia.com/gpu","gpus":["G"]}]})",
       "containers[0].resource: expected tessera.io/gpu"},
      {R"({"containers":[{"resource":"tessera.io/gpu","gpus":[]}]})", "containers[0].gpus"},
      {R"({"containers":[{"resource":"tessera.io/gpu","gpus":["a b"]}]})",
       "containers[0].gpus[0]: a GPU UUID has no spaces"},
      {R"({"containers":[{"resource":"tessera.io/gpu","gpus":["A"],"count":3}]})",
       "count must equal"},
      {R"({"containers":[{"resource":"tessera.io/gpu-share","gpus":["A"],"count":1e3}]})",
       "containers[0].count: expected a whole number"},
      {R"({"containers":[{"resource":"tessera.io/gpu-share","gpus":["A"],"count":99999999999}]})",
       "containers[0].count: out of range"},
      {R"({"containers":[{"resource":"tessera.io/gpu-share","gpus":["A"],"memory":-1}]})",
       "containers[0].memory: expected a whole number >= 0"},
      {R"({"containers":[{"resource":"tessera.io/gpu-share","gpus":["A"],"priority":5000}]})",
       "priority: expected -1000..1000"},
      {R"({"node":7,"containers":[]})", "node: expected a string"},
      {R"({"containers":[{"resource":"tessera.io/gpu","gpus":["A"]}],"gang":"x"})",
       "gang: expected an object"},
      {R"({"containers":[{"resource":"tessera.io/gpu","gpus":["A"]}],"gang":{"id":"job"}})",
       "gang.id: expected namespace/name"},
      {R"({"containers":[{"resource":"tessera.io/gpu","gpus":["A"]}],"gang":{"id":"a/b"}})",
       "gang.gpus: expected a list"},
      {R"({"containers":[{"resource":"tessera.io/gpu","gpus":["A"]}],)"
       R"("gang":{"id":"a/b","gpus":[1]}})",
       "gang.gpus[0]: expected a string"},
  };
  for (const Case& c : cases) {
    auto r = ParseAssignment(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.want)) << c.text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("tessera.io/assignment"));
  }
}

TEST(Allocated, IndicesRoundTripAndGarbageIsRefused) {
  EXPECT_EQ(*ParseAllocated(FormatAllocated({0, 2})), (std::set<int>{0, 2}));
  EXPECT_TRUE(ParseAllocated("")->empty());
  for (const char* bad : {"x", "1,,2", "-1", "64", "1;2"}) {
    EXPECT_FALSE(ParseAllocated(bad).ok()) << bad;
  }
}

TEST(GpuUse, RoundTripsWhatWasMeasuredAndRefusesWhatCannotBe) {
  GpuUse u{.seconds = 600, .busy_permille = 70, .peak_mib = 3072, .limit_mib = 10240};
  EXPECT_EQ(FormatGpuUse(u),
            R"({"busyPermille":70,"limitMiB":10240,"peakMiB":3072,"seconds":600})");
  EXPECT_EQ(*ParseGpuUse(FormatGpuUse(u)), u);
  GpuUse whole{.seconds = 2, .busy_permille = 100};
  EXPECT_EQ(*ParseGpuUse(FormatGpuUse(whole)), whole);
  struct Case {
    const char* text;
    const char* want;
  };
  for (const Case& c : std::vector<Case>{
           {"", "expected a JSON object"},
           {"[1]", "expected a JSON object"},
           {R"({"busyPermille":70})", "seconds: missing"},
           {R"({"seconds":1,"busyPermille":1001})", "busyPermille: expected 0..1000, got 1001"},
           {R"({"seconds":-1})", "seconds: expected 0.."},
           {R"({"seconds":1,"peakMiB":"3Gi"})", "peakMiB: expected a whole number"},
           {R"({"seconds":1.5})", "seconds: expected a whole number"},
           {R"({"seconds":1,"heldBackPermille":1200})", "heldBackPermille: expected 0..1000"},
       }) {
    auto r = ParseGpuUse(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.want)) << c.text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("tessera.io/gpu-use")) << c.text;
  }
}

// A share whose launches waited for the GPU: what it would have used is its GPU time over the
// time it ran as it wished.
TEST(GpuUse, WhatAShareHeldBackWouldHaveUsed) {
  GpuUse u{.seconds = 100, .busy_permille = 250, .held_back_permille = 700};
  EXPECT_EQ(FormatGpuUse(u), R"({"busyPermille":250,"heldBackPermille":700,"seconds":100})");
  EXPECT_EQ(*ParseGpuUse(FormatGpuUse(u)), u);
  EXPECT_EQ(u.WantedPermille(), 833) << "250 of the 300 it was let run";
  u.held_back_permille = 750;
  EXPECT_EQ(u.WantedPermille(), 1000) << "waiting whenever it did not run: all of it";
  u.held_back_permille = std::nullopt;
  EXPECT_EQ(u.WantedPermille(), 250) << "never held back: what it used";
  u.busy_permille = std::nullopt;
  EXPECT_EQ(u.WantedPermille(), std::nullopt) << "nothing measured";
}

TEST(NodeGpus, RoundTripsAPresetWithTopologyAndHealth) {
  auto machine = devices::LoadSimulatedMachine("dgx-h100");
  ASSERT_TRUE(machine.ok()) << machine.status();
  NodeGpus n{machine->inventory, std::vector<bool>(machine->inventory.gpus.size(), true), 10};
  n.healthy[3] = false;
  auto back = ParseNodeGpus(FormatNodeGpus(n));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shares_per_gpu, 10);
  EXPECT_EQ(back->healthy, n.healthy);
  ASSERT_EQ(back->inventory.gpus.size(), n.inventory.gpus.size());
  for (size_t i = 0; i < n.inventory.gpus.size(); ++i) {
    const core::Gpu& want = n.inventory.gpus[i];
    const core::Gpu& got = back->inventory.gpus[i];
    EXPECT_EQ(got.uuid, want.uuid);
    EXPECT_EQ(got.memory_bytes, want.memory_bytes);
    EXPECT_EQ(got.compute_capability, want.compute_capability);
    EXPECT_EQ(got.numa_node, want.numa_node);
  }
  EXPECT_EQ(back->inventory.topology, n.inventory.topology);
  EXPECT_TRUE(back->inventory.simulated);
  EXPECT_EQ(back->sharing, std::vector<core::GpuSharing>(8, core::GpuSharing::kTimeSlice))
      << "no word of MPS: every GPU time-sliced";
  // GPUs in MPS mode say so, and only they (an older reader sees the rest as before).
  n.sharing.assign(8, core::GpuSharing::kTimeSlice);
  n.sharing[6] = core::GpuSharing::kMps;
  const std::string text = FormatNodeGpus(n);
  EXPECT_EQ(text.find("\"sharing\""), text.rfind("\"sharing\"")) << text;
  back = ParseNodeGpus(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sharing, n.sharing);
}

TEST(NodeGpus, BadAnnotationsNameTheField) {
  struct Case {
    std::string text, want;
  } cases[] = {
      {R"({"v":2,"gpus":[]})", "v: expected 1"},
      {R"({"v":1,"gpus":[{"uuid":"A"},{"uuid":"A"}]})", "gpus[1].uuid: A twice"},
      {R"({"v":1,"gpus":[{"uuid":"A","cc":"x"}]})", "gpus[0].cc"},
      {R"({"v":1,"gpus":[{"uuid":"A"}],"links":[{"a":0,"b":0,"pcie":"PIX"}]})", "links[0].a, b"},
      {R"({"v":1,"gpus":[{"uuid":"A"},{"uuid":"B"}],"links":[{"a":0,"b":1,"pcie":"Q"}]})",
       "links[0].pcie"},
      {R"({"v":1,"shares":1000,"gpus":[]})", "shares: expected 0..100"},
      {R"({"v":1,"gpus":[{"uuid":"A","sharing":"spatial"}]})",
       "gpus[0].sharing: expected time-slice or mps"},
  };
  for (const Case& c : cases) {
    auto r = ParseNodeGpus(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.want)) << c.text;
  }
}

}  // namespace
}  // namespace tessera::kube
