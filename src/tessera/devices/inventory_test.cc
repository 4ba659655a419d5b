#include "tessera/devices/inventory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace tessera::devices {
namespace {

using core::PcieLevel;
using ::testing::HasSubstr;

SimulatedMachine MustLoad(const std::string& spec) {
  auto m = LoadSimulatedMachine(spec);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : SimulatedMachine{};
}

TEST(Presets, AllParseAndAreLabelledSimulated) {
  std::vector<std::string> names = PresetNames();
  EXPECT_THAT(names, ::testing::IsSupersetOf(
                         {"dgx-h100", "hgx-a100", "pcie-l40s-2socket", "t4x2", "mixed-a100-t4"}));
  for (const std::string& name : names) {
    SimulatedMachine m = MustLoad(name);
    EXPECT_TRUE(m.inventory.simulated) << name;
    EXPECT_THAT(m.inventory.source, HasSubstr(name));
    EXPECT_FALSE(m.inventory.gpus.empty()) << name;
    EXPECT_EQ(m.inventory.topology.size(), static_cast<int>(m.inventory.gpus.size()));
  }
}

TEST(Presets, DgxH100HasNvlinkBetweenEveryPair) {
  SimulatedMachine m = MustLoad("dgx-h100");
  ASSERT_EQ(m.inventory.gpus.size(), 8u);
  for (int a = 0; a < 8; ++a) {
    EXPECT_EQ(m.inventory.gpus[a].model, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(m.inventory.gpus[a].memory_bytes, 81559ull << 20);
    EXPECT_EQ(m.inventory.gpus[a].compute_capability, (core::ComputeCapability{9, 0}));
    EXPECT_EQ(m.inventory.gpus[a].numa_node, a < 4 ? 0 : 1);
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      EXPECT_EQ(m.inventory.topology.link(a, b).nvlinks, 18);
      EXPECT_TRUE(m.inventory.topology.link(a, b).via_nvswitch);
    }
  }
  EXPECT_EQ(m.inventory.topology.link(0, 1).pcie, PcieLevel::kNumaNode);
  EXPECT_EQ(m.inventory.topology.link(0, 4).pcie, PcieLevel::kSystem);
}

TEST(Presets, L40sSplitsAcrossTwoSockets) {
  SimulatedMachine m = MustLoad("pcie-l40s-2socket");
  const core::Topology& t = m.inventory.topology;
  for (int g = 0; g < 8; ++g) EXPECT_EQ(m.inventory.gpus[g].numa_node, g < 4 ? 0 : 1);
  EXPECT_EQ(t.link(0, 1).pcie, PcieLevel::kSingleSwitch);
  EXPECT_EQ(t.link(0, 2).pcie, PcieLevel::kNumaNode);
  EXPECT_EQ(t.link(0, 4).pcie, PcieLevel::kSystem);
  EXPECT_EQ(t.link(6, 7).pcie, PcieLevel::kSingleSwitch);
  EXPECT_EQ(t.link(0, 1).nvlinks, 0);
}

TEST(Presets, HgxA100PairsMeetBehindTwoSwitchLevels) {
  SimulatedMachine m = MustLoad("hgx-a100");
  EXPECT_EQ(m.inventory.topology.link(0, 1).pcie, PcieLevel::kMultipleSwitches);
  EXPECT_EQ(m.inventory.topology.link(0, 2).pcie, PcieLevel::kNumaNode);
  EXPECT_EQ(m.inventory.topology.link(0, 7).nvlinks, 12);
}

TEST(Presets, MixedBoxHasTwoModelsAndBridgedPairs) {
  SimulatedMachine m = MustLoad("mixed-a100-t4");
  std::set<std::string> models;
  for (const auto& g : m.inventory.gpus) models.insert(g.model);
  EXPECT_EQ(models.size(), 2u);
  const core::Topology& t = m.inventory.topology;
  EXPECT_EQ(t.link(0, 1).nvlinks, 12);
  EXPECT_FALSE(t.link(0, 1).via_nvswitch);
  EXPECT_EQ(t.link(0, 2).nvlinks, 0);
  EXPECT_EQ(t.link(0, 2).pcie, PcieLevel::kSystem);
  EXPECT_EQ(t.link(0, 4).pcie, PcieLevel::kNumaNode);
  EXPECT_EQ(m.inventory.gpus[4].ecc_enabled, false);
}

TEST(Inventory, UuidsAreStableAndUnique) {
  SimulatedMachine a = MustLoad("dgx-h100"), b = MustLoad("dgx-h100"), c = MustLoad("hgx-a100");
  std::set<std::string> uuids;
  for (size_t i = 0; i < a.inventory.gpus.size(); ++i) {
    EXPECT_EQ(a.inventory.gpus[i].uuid, b.inventory.gpus[i].uuid);
    EXPECT_THAT(a.inventory.gpus[i].uuid,
                ::testing::MatchesRegex(
                    "GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"));
    uuids.insert(a.inventory.gpus[i].uuid);
    uuids.insert(c.inventory.gpus[i].uuid);
  }
  EXPECT_EQ(uuids.size(), 16u);
}

TEST(Inventory, MinimalFileDefaultsToOneHostBridge) {
  auto m = ParseInventory(
      "name: box\ngpus:\n  - {model: X, count: 2, memory: 16GiB, "
      "compute_capability: \"8.6\"}\n",
      "box.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->inventory.hostname, "sim-box");
  EXPECT_EQ(m->inventory.topology.link(0, 1).pcie, PcieLevel::kHostBridge);
  EXPECT_EQ(m->inventory.gpus[1].numa_node, 0);
  EXPECT_EQ(m->inventory.gpus[1].ecc_enabled, true);
  EXPECT_EQ(m->inventory.gpus[1].mig_enabled, false);
}

TEST(Inventory, ScriptedHealthEventsAreSortedAndTyped) {
  auto m = ParseInventory(R"(name: box
gpus: [{model: X, count: 2, memory: 16GiB, compute_capability: "8.6"}]
health_events:
  - {after: 2s, gpu: 1, lost: true}
  - {after: 500ms, gpu: 0, xid: 79}
  - {after: 1m, gpu: 1, lost: false}
  - {after: 3s, gpu: 0, ecc: double_bit}
)",
                          "box.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  const auto& ev = m->health_events;
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].after, std::chrono::milliseconds(500));
  EXPECT_EQ(ev[0].event.xid, 79u);
  EXPECT_EQ(ev[1].action, ScriptedHealthEvent::Action::kLose);
  EXPECT_EQ(ev[2].event.kind, HealthEvent::Kind::kEccDoubleBit);
  EXPECT_EQ(ev[3].action, ScriptedHealthEvent::Action::kRestore);
  EXPECT_EQ(ev[3].after, std::chrono::minutes(1));
}

struct BadCase {
  const char* name;
  const char* yaml;
  const char* error;  // the expected message, with its line
};

constexpr const char* kHead =
    "name: box\n"
    "gpus:\n"
    "  - model: X\n"
    "    count: 4\n"
    "    memory: 16GiB\n"
    "    compute_capability: \"8.6\"\n";  // lines 1-6

class BadInventory : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInventory, SaysFileLineAndWhat) {
  std::string yaml = GetParam().yaml;
  if (yaml.rfind("HEAD", 0) == 0) yaml = kHead + yaml.substr(4);
  auto m = ParseInventory(yaml, "bad.yaml");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(GetParam().error));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadInventory,
    ::testing::Values(
        BadCase{"Empty", "", "bad.yaml:1: the inventory is empty"},
        BadCase{"NotYaml", "name: [unclosed\n", "bad.yaml:2: not valid YAML"},
        BadCase{"TopLevelList", "- a\n- b\n", "bad.yaml:1: inventory: expected a mapping"},
        BadCase{"UnknownTopKey", "HEADcolour: red\n",
                "bad.yaml:7: unknown key 'colour' in inventory"},
        BadCase{"UnknownGroupKey", "HEAD    memroy: 1GiB\n",
                "bad.yaml:7: unknown key 'memroy' in gpu group"},
        BadCase{"DuplicateKey", "HEADname: again\n",
                "bad.yaml:7: inventory: key 'name' given twice"},
        BadCase{"MissingName", "gpus: []\n", "bad.yaml:1: inventory: 'name' is required"},
        BadCase{"CountNotInt",
                "name: b\ngpus:\n  - model: X\n    count: eight\n    memory: 1GiB\n    "
                "compute_capability: \"8.0\"\n",
                "bad.yaml:4: count: expected an integer 1..64, got 'eight'"},
        BadCase{"CountTooBig",
                "name: b\ngpus:\n  - {model: X, count: 65, memory: 1GiB, compute_capability: "
                "\"8.0\"}\n",
                "bad.yaml:3: count: expected an integer 1..64, got '65'"},
        BadCase{"MemoryUnit",
                "name: b\ngpus:\n  - {model: X, count: 1, memory: 16 furlongs, compute_capability: "
                "\"8.0\"}\n",
                "bad.yaml:3: memory: expected a size"},
        BadCase{
            "ComputeCapability",
            "name: b\ngpus:\n  - {model: X, count: 1, memory: 1GiB, compute_capability: nine}\n",
            "bad.yaml:3: compute_capability: expected MAJOR.MINOR"},
        BadCase{"EccNotBool",
                "name: b\ngpus:\n  - {model: X, count: 1, memory: 1GiB, compute_capability: "
                "\"8.0\", ecc: maybe}\n",
                "bad.yaml:3: ecc: expected true or false, got 'maybe'"},
        BadCase{"GpusNotList", "name: b\ngpus: 4\n",
                "bad.yaml:2: gpus: expected a list of GPU groups"},
        BadCase{"PlacedTwice",
                "HEADpcie:\n  - socket: 0\n    host_bridges:\n      - gpus: [0, 1, 2, 3]\n      - "
                "gpus: [2]\n",
                "bad.yaml:11: gpu 2 is placed twice (first at line 10)"},
        BadCase{"NotPlaced",
                "HEADpcie:\n  - socket: 0\n    host_bridges:\n      - gpus: [0, 1, 2]\n",
                "bad.yaml:8: pcie: gpu 3 is not placed under any socket"},
        BadCase{"PlacedOutOfRange",
                "HEADpcie:\n  - socket: 0\n    host_bridges:\n      - gpus: [0, 1, 2, 3, 4]\n",
                "bad.yaml:10: gpus: expected an integer 0..3, got '4'"},
        BadCase{"SameNumaTwoSockets",
                "HEADpcie:\n  - {socket: 0, numa_node: 0, host_bridges: [{gpus: [0, 1]}]}\n"
                "  - {socket: 1, numa_node: 0, host_bridges: [{gpus: [2, 3]}]}\n",
                "bad.yaml:9: NUMA node 0 already belongs to the socket at line 8"},
        BadCase{"SocketTwice",
                "HEADpcie:\n  - {socket: 0, host_bridges: [{gpus: [0, 1]}]}\n"
                "  - {socket: 0, host_bridges: [{gpus: [2, 3]}]}\n",
                "bad.yaml:9: socket 0 is listed twice"},
        BadCase{"EmptySwitch", "HEADpcie:\n  - {socket: 0, host_bridges: [{switches: [{}]}]}\n",
                "bad.yaml:8: PCIe switch: has neither gpus nor switches"},
        BadCase{"NvlinkSelf", "HEADnvlink:\n  links: [[1, 1, 4]]\n",
                "bad.yaml:8: nvlink.links: gpu 1 cannot link to itself"},
        BadCase{"NvlinkTooMany", "HEADnvlink:\n  links:\n    - [0, 1, 12]\n    - [0, 2, 12]\n",
                "bad.yaml:10: nvlink: gpu 0 would have 24 NVLink links; no GPU has more than 18"},
        BadCase{"NvlinkTwice", "HEADnvlink:\n  links: [[0, 1, 2], [1, 0, 2]]\n",
                "bad.yaml:8: nvlink.links: gpu 1 and gpu 0 are linked twice"},
        BadCase{"NvlinkShape", "HEADnvlink:\n  links: [[0, 1]]\n",
                "bad.yaml:8: nvlink.links: expected [gpu, gpu, count]"},
        BadCase{"NvswitchTooWide", "HEADnvlink:\n  nvswitch: {links: 40}\n",
                "bad.yaml:8: nvswitch.links: expected an integer 1..18, got '40'"},
        BadCase{"NvswitchAndDirectOverCap",
                "HEADnvlink:\n  nvswitch: {links: 18, gpus: [0, 1]}\n  links: [[0, 2, 1]]\n",
                "bad.yaml:9: nvlink: gpu 0 would have 19 NVLink links"},
        BadCase{"BoardAcrossSwitches",
                "HEADpcie:\n  - {socket: 0, host_bridges: [{gpus: [0, 1]}, {gpus: [2, 3]}]}\n"
                "boards: [[1, 2]]\n",
                "bad.yaml:9: boards: gpu 2 and gpu 1 share a board but not a PCIe parent"},
        BadCase{"EventTwoKinds",
                "HEADhealth_events:\n  - {after: 1s, gpu: 0, xid: 79, lost: true}\n",
                "bad.yaml:8: health event: give exactly one of xid, ecc, lost"},
        BadCase{"EventBadDuration", "HEADhealth_events:\n  - {after: soon, gpu: 0, xid: 79}\n",
                "bad.yaml:8: after: expected a duration like 500ms, 2s or 1m, got 'soon'"},
        BadCase{"EventBadGpu", "HEADhealth_events:\n  - {after: 1s, gpu: 9, xid: 79}\n",
                "bad.yaml:8: gpu: expected an integer 0..3, got '9'"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(LoadSimulatedMachine, UnknownPresetListsPresets) {
  auto m = LoadSimulatedMachine("dgx-h1000");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("unknown preset 'dgx-h1000'"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("dgx-h100"));
}

TEST(LoadSimulatedMachine, MissingFileIsNotFound) {
  auto m = LoadSimulatedMachine("/nonexistent/machine.yaml");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("/nonexistent/machine.yaml"));
}

}  // namespace
}  // namespace tessera::devices
