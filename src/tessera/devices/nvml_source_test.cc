// NvmlSource against the fake libnvidia-ml.so.1 variants, loaded through the real dlopen path.
#include "tessera/devices/nvml_source.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/devices/health.h"

namespace tessera::devices {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using ::testing::HasSubstr;

std::string FakeNvml(const std::string& variant) {
  return std::string(TESSERA_TEST_FAKES_DIR) + "/nvml-" + variant + "/libnvidia-ml.so.1";
}

class NvmlSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tessera-nvml-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    unsetenv("FAKE_NVML_SCENARIO");
    std::filesystem::remove_all(dir_);
  }

  void Scenario(const json& j) {
    std::string path = dir_ / "scenario.json";
    std::ofstream(path) << j.dump();
    setenv("FAKE_NVML_SCENARIO", path.c_str(), 1);
  }

  std::unique_ptr<NvmlSource> Open(const std::string& variant = "full") {
    NvmlSourceOptions o;
    o.library_path = FakeNvml(variant);
    o.sysfs_root = dir_.string();
    auto s = NvmlSource::Create(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Calls of NVML function `fn` in the fake loaded from `variant` (which must be loaded).
  long Calls(const std::string& variant, const char* fn) {
    void* h = dlopen(FakeNvml(variant).c_str(), RTLD_NOW | RTLD_NOLOAD);
    EXPECT_NE(h, nullptr);
    auto count = reinterpret_cast<long (*)(const char*)>(dlsym(h, "fakeNvmlCallCount"));
    long n = count(fn);
    dlclose(h);
    return n;
  }

  static json TwoGpus() {
    return {{"driver_version", "550.54.15"},
            {"cuda_driver_version", 12040},
            {"devices",
             {{{"uuid", "GPU-aaaa"},
               {"name", "NVIDIA H100 80GB HBM3"},
               {"memory_total", 85899345920ull},
               {"pci_bus_id", "00000000:18:00.0"},
               {"cc", {9, 0}},
               {"ecc", 1},
               {"mig", 0},
               {"numa", 0},
               {"minor", 3}},
              {{"uuid", "GPU-bbbb"},
               {"name", "NVIDIA H100 80GB HBM3"},
               {"memory_total", 85899345920ull},
               {"pci_bus_id", "00000000:2a:00.0"},
               {"cc", {9, 0}},
               {"ecc", 0},
               {"numa", -1},
               {"minor", 4}}}},
            {"topology", {{0, 10}, {10, 0}}}};
  }

  std::filesystem::path dir_;
};

TEST_F(NvmlSourceTest, NoLibraryIsANormalStateWithOneLineReason) {
  NvmlSourceOptions o;
  o.library_path = (dir_ / "nothing-here" / "libnvidia-ml.so.1").string();
  auto s = NvmlSource::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("no NVIDIA driver"));
  EXPECT_EQ(std::string(s.status().message()).find('\n'), std::string::npos);
}

TEST_F(NvmlSourceTest, MissingRequiredSymbolIsNamed) {
  Scenario(TwoGpus());
  NvmlSourceOptions o;
  o.library_path = FakeNvml("nouuid");
  auto s = NvmlSource::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("nvmlDeviceGetUUID"));
}

TEST_F(NvmlSourceTest, InitFailureSaysWhy) {
  Scenario({{"init_error", 9}});
  NvmlSourceOptions o;
  o.library_path = FakeNvml("full");
  auto s = NvmlSource::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("nvmlInit: Driver Not Loaded (9)"));
}

TEST_F(NvmlSourceTest, ReportsEveryAttribute) {
  Scenario(TwoGpus());
  auto src = Open();
  ASSERT_NE(src, nullptr);
  auto inv = src->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_FALSE(inv->simulated);
  EXPECT_EQ(inv->source, "nvml");
  EXPECT_EQ(inv->driver_version, "550.54.15");
  EXPECT_EQ(inv->cuda_driver_version, "12.4");
  ASSERT_EQ(inv->gpus.size(), 2u);
  const core::Gpu& g = inv->gpus[0];
  EXPECT_EQ(g.index, 0);
  EXPECT_EQ(g.uuid, "GPU-aaaa");
  EXPECT_EQ(g.model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(g.memory_bytes, 85899345920ull);
  EXPECT_EQ(g.compute_capability, (core::ComputeCapability{9, 0}));
  EXPECT_EQ(g.pci_bus_id, "00000000:18:00.0");
  EXPECT_EQ(g.numa_node, 0);
  EXPECT_EQ(g.minor, 3);
  EXPECT_EQ(g.ecc_enabled, true);
  EXPECT_EQ(g.mig_enabled, false);
  EXPECT_EQ(inv->gpus[1].pci_bus_id, "00000000:2A:00.0") << "bus ids are canonical";
  EXPECT_EQ(inv->gpus[1].ecc_enabled, false);
  EXPECT_EQ(inv->gpus[1].mig_enabled, false) << "MIG not supported means MIG off";
  EXPECT_EQ(inv->topology.link(0, 1).pcie, core::PcieLevel::kSingleSwitch);
  EXPECT_EQ(Calls("full", "nvmlInit_v2"), 1);
  EXPECT_EQ(Calls("full", "nvmlInit"), 0) << "the versioned name is preferred";
  EXPECT_GT(Calls("full", "nvmlDeviceGetMemoryInfo_v2"), 0);
  EXPECT_GT(Calls("full", "nvmlDeviceGetPciInfo_v3"), 0);
}

TEST_F(NvmlSourceTest, NumaNodeFallsBackToSysfs) {
  Scenario(TwoGpus());
  std::filesystem::create_directories(dir_ / "sys/bus/pci/devices/0000:2a:00.0");
  std::ofstream(dir_ / "sys/bus/pci/devices/0000:2a:00.0/numa_node") << "1\n";
  auto src = Open();
  ASSERT_NE(src, nullptr);
  auto inv = src->Discover();
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ(inv->gpus[1].numa_node, 1);
}

TEST_F(NvmlSourceTest, SysfsMinusOneMeansUnknown) {
  Scenario(TwoGpus());
  std::filesystem::create_directories(dir_ / "sys/bus/pci/devices/0000:2a:00.0");
  std::ofstream(dir_ / "sys/bus/pci/devices/0000:2a:00.0/numa_node") << "-1\n";
  auto src = Open();
  auto inv = src->Discover();
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ(inv->gpus[1].numa_node, std::nullopt);
}

TEST_F(NvmlSourceTest, FailingOptionalCallLeavesAttributeUnknown) {
  json s = TwoGpus();
  s["errors"] = {{"nvmlDeviceGetEccMode", 3}, {"nvmlDeviceGetCudaComputeCapability", 999}};
  s["devices"][0]["errors"] = {{"nvmlDeviceGetName", 4}};
  Scenario(s);
  auto src = Open();
  auto inv = src->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->gpus[0].ecc_enabled, std::nullopt);
  EXPECT_EQ(inv->gpus[0].compute_capability, std::nullopt);
  EXPECT_EQ(inv->gpus[0].model, "");
  EXPECT_EQ(inv->gpus[1].model, "NVIDIA H100 80GB HBM3");
}

TEST_F(NvmlSourceTest, FailingRequiredCallFailsDiscoveryWithContext) {
  json s = TwoGpus();
  s["devices"][1]["errors"] = {{"nvmlDeviceGetUUID", 15}};
  Scenario(s);
  auto src = Open();
  auto inv = src->Discover();
  ASSERT_FALSE(inv.ok());
  EXPECT_THAT(std::string(inv.status().message()),
              HasSubstr("gpu 1: nvmlDeviceGetUUID: nvml: GPU is lost (15)"));
}

TEST_F(NvmlSourceTest, MinimalLibraryLeavesOptionalAttributesUnknown) {
  Scenario(TwoGpus());
  auto src = Open("minimal");
  ASSERT_NE(src, nullptr);
  auto inv = src->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status();
  const core::Gpu& g = inv->gpus[0];
  EXPECT_EQ(g.uuid, "GPU-aaaa");
  EXPECT_EQ(g.model, "");
  EXPECT_EQ(g.memory_bytes, std::nullopt);
  EXPECT_EQ(g.compute_capability, std::nullopt);
  EXPECT_EQ(g.pci_bus_id, "");
  EXPECT_EQ(g.numa_node, std::nullopt);
  EXPECT_EQ(g.minor, std::nullopt);
  EXPECT_EQ(g.ecc_enabled, std::nullopt);
  EXPECT_EQ(g.mig_enabled, std::nullopt);
  EXPECT_EQ(inv->driver_version, "");
  EXPECT_EQ(inv->topology.link(0, 1).pcie, core::PcieLevel::kUnknown);
  auto events = src->WaitHealthEvents(0ms);
  EXPECT_EQ(events.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(src->Probe(0).ok());
}

TEST_F(NvmlSourceTest, LegacyLibraryUsesUnversionedNamesAndOldPciLayout) {
  json s = TwoGpus();
  s["devices"][0]["nvlinks"] = {{{"remote", "00000000:2A:00.0"}}, {{"remote", "00000000:2A:00.0"}}};
  s["devices"][1]["nvlinks"] = {{{"remote", "00000000:18:00.0"}}, {{"remote", "00000000:18:00.0"}}};
  Scenario(s);
  auto src = Open("legacy");
  ASSERT_NE(src, nullptr);
  auto inv = src->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->gpus[0].pci_bus_id, "00000000:18:00.0");
  EXPECT_EQ(inv->gpus[0].memory_bytes, 85899345920ull);
  EXPECT_EQ(inv->topology.link(0, 1).nvlinks, 2);
  EXPECT_EQ(Calls("legacy", "nvmlInit"), 1);
  EXPECT_GT(Calls("legacy", "nvmlDeviceGetPciInfo"), 0);
}

TEST_F(NvmlSourceTest, ShutsNvmlDownOnDestruction) {
  Scenario(TwoGpus());
  // Keep the library mapped across the source's lifetime so its counters survive.
  void* keep = dlopen(FakeNvml("full").c_str(), RTLD_NOW);
  ASSERT_NE(keep, nullptr);
  auto shutdowns = reinterpret_cast<long (*)()>(dlsym(keep, "fakeNvmlShutdownCount"));
  auto refs = reinterpret_cast<int (*)()>(dlsym(keep, "fakeNvmlInitRefs"));
  long before = shutdowns();
  {
    auto src = Open();
    ASSERT_NE(src, nullptr);
    EXPECT_EQ(refs(), 1);
  }
  EXPECT_EQ(shutdowns(), before + 1);
  EXPECT_EQ(refs(), 0);
  dlclose(keep);
}

TEST_F(NvmlSourceTest, NvswitchFabricLinksEveryPair) {
  json devices = json::array();
  std::vector<std::vector<int>> topo(4, std::vector<int>(4, 50));
  for (int i = 0; i < 4; ++i) {
    devices.push_back({{"nvswitch_links", 18}, {"numa", i / 2}});
    topo[i][i] = 0;
  }
  topo[0][1] = topo[1][0] = 40;
  Scenario({{"devices", devices}, {"topology", topo}});
  auto src = Open();
  auto inv = src->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status();
  for (int a = 0; a < 4; ++a) {
    for (int b = a + 1; b < 4; ++b) {
      EXPECT_EQ(inv->topology.link(a, b).nvlinks, 18);
      EXPECT_TRUE(inv->topology.link(a, b).via_nvswitch);
    }
  }
  EXPECT_EQ(inv->topology.link(0, 1).pcie, core::PcieLevel::kNumaNode);
  EXPECT_EQ(inv->topology.link(0, 2).pcie, core::PcieLevel::kSystem);
}

TEST_F(NvmlSourceTest, DirectNvlinksAreCountedNotAssumed) {
  json s;
  s["devices"] = json::array();
  for (int i = 0; i < 3; ++i) s["devices"].push_back(json::object());
  // GPU0 has 4 links to GPU1, one of them down; GPU2 has none.
  s["devices"][0]["nvlinks"] = {{{"remote", "00000000:11:00.0"}},
                                {{"remote", "00000000:11:00.0"}},
                                {{"remote", "00000000:11:00.0"}},
                                {{"remote", "00000000:11:00.0"}, {"active", false}}};
  s["devices"][1]["nvlinks"] = {{{"remote", "00000000:10:00.0"}},
                                {{"remote", "00000000:10:00.0"}},
                                {{"remote", "00000000:10:00.0"}},
                                {{"remote", "00000000:10:00.0"}, {"active", false}}};
  Scenario(s);
  auto src = Open();
  auto inv = src->Discover();
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->topology.link(0, 1).nvlinks, 3);
  EXPECT_FALSE(inv->topology.link(0, 1).via_nvswitch);
  EXPECT_EQ(inv->topology.link(0, 2).nvlinks, 0);
  EXPECT_EQ(inv->topology.link(1, 2).pcie, core::PcieLevel::kSystem);
}

TEST_F(NvmlSourceTest, XidEventMakesGpuUnhealthyWithinOneEvent) {
  json s = TwoGpus();
  s["events"] = {{{"at_ms", 0}, {"device", 1}, {"type", 8}, {"data", 13}},
                 {{"at_ms", 0}, {"device", 1}, {"type", 8}, {"data", 79}}};
  Scenario(s);
  auto src = Open();
  std::vector<std::pair<int, bool>> changes;
  HealthWatch watch(*src, 2, HealthPolicy{}, core::SteadyClock::Get(),
                    [&](int gpu, const GpuHealth& h) { changes.emplace_back(gpu, h.healthy); });
  watch.Step(1000ms);
  EXPECT_THAT(changes, ::testing::ElementsAre(std::pair(1, false)));
  auto snap = watch.Snapshot();
  EXPECT_EQ(snap[1].reason, "XID 79");
  EXPECT_EQ(snap[1].xid_count, 2u) << "the ignored XID 13 is counted too";
  EXPECT_TRUE(snap[0].healthy);
}

TEST_F(NvmlSourceTest, EccEventIsReported) {
  json s = TwoGpus();
  s["events"] = {{{"at_ms", 0}, {"device", 0}, {"type", 2}, {"data", 0}}};
  Scenario(s);
  auto src = Open();
  auto events = src->WaitHealthEvents(1000ms);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].kind, HealthEvent::Kind::kEccDoubleBit);
  EXPECT_EQ((*events)[0].gpu, 0);
}

TEST_F(NvmlSourceTest, EventsAreDeliveredOverTime) {
  json s = TwoGpus();
  s["events"] = {{{"at_ms", 150}, {"device", 0}, {"type", 8}, {"data", 48}}};
  Scenario(s);
  auto src = Open();
  auto early = src->WaitHealthEvents(10ms);
  ASSERT_TRUE(early.ok());
  EXPECT_TRUE(early->empty());
  auto later = src->WaitHealthEvents(5000ms);
  ASSERT_TRUE(later.ok());
  ASSERT_EQ(later->size(), 1u);
  EXPECT_EQ((*later)[0].xid, 48u);
}

TEST_F(NvmlSourceTest, LostGpuBecomesUnhealthyThenRecovers) {
  json s = TwoGpus();
  s["devices"][0]["lost_from_ms"] = 0;
  s["devices"][0]["lost_until_ms"] = 300;
  Scenario(s);
  auto src = Open();
  HealthPolicy policy;
  policy.probe_interval = 0ms;
  policy.recovery_quiet_period = 100ms;
  std::vector<std::pair<int, bool>> changes;
  HealthWatch watch(*src, 2, policy, core::SteadyClock::Get(),
                    [&](int gpu, const GpuHealth& h) { changes.emplace_back(gpu, h.healthy); });
  watch.Step(0ms);
  EXPECT_THAT(changes, ::testing::ElementsAre(std::pair(0, false)));
  EXPECT_THAT(watch.Snapshot()[0].reason, HasSubstr("GPU is lost"));
  for (int i = 0; i < 100 && changes.size() < 2; ++i) watch.Step(20ms);
  EXPECT_THAT(changes, ::testing::ElementsAre(std::pair(0, false), std::pair(0, true)));
}

TEST_F(NvmlSourceTest, FailedEventWaitProbesEveryGpu) {
  json s = TwoGpus();
  s["errors"] = {{"nvmlEventSetWait_v2", 999}};
  s["devices"][1]["lost_from_ms"] = 0;
  Scenario(s);
  auto src = Open();
  HealthPolicy policy;
  policy.probe_interval = std::chrono::hours(1);
  std::vector<std::pair<int, bool>> changes;
  HealthWatch watch(*src, 2, policy, core::SteadyClock::Get(),
                    [&](int gpu, const GpuHealth& h) { changes.emplace_back(gpu, h.healthy); });
  watch.Step(1ms);
  EXPECT_THAT(changes, ::testing::ElementsAre(std::pair(1, false)))
      << "only the GPU that does not answer is sick, not every GPU";
}

TEST_F(NvmlSourceTest, ReadsTelemetryInSiUnits) {
  json s = TwoGpus();
  s["devices"][0].update({{"utilization", 73},
                          {"memory_utilization", 21},
                          {"memory_used", 5000000000ull},
                          {"temperature", 64},
                          {"power_mw", 312500}});
  s["devices"][1].update(
      {{"utilization", 0}, {"memory_used", 0}, {"temperature", 31}, {"power_mw", 61000}});
  Scenario(s);
  auto src = Open();
  auto t0 = src->ReadTelemetry(0);
  ASSERT_TRUE(t0.ok()) << t0.status();
  EXPECT_DOUBLE_EQ(t0->utilization.value(), 0.73);
  EXPECT_DOUBLE_EQ(t0->memory_utilization.value(), 0.21);
  EXPECT_EQ(t0->memory_used_bytes, 5000000000ull);
  EXPECT_DOUBLE_EQ(t0->temperature_celsius.value(), 64);
  EXPECT_DOUBLE_EQ(t0->power_watts.value(), 312.5);
  auto t1 = src->ReadTelemetry(1);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_DOUBLE_EQ(t1->utilization.value(), 0.0) << "an idle GPU reads 0, not unknown";
  EXPECT_EQ(t1->memory_used_bytes, 0u);
  EXPECT_DOUBLE_EQ(t1->power_watts.value(), 61);
  EXPECT_EQ(src->ReadTelemetry(2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(src->ReadTelemetry(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

// What dcgm-exporter's dashboards read besides the basics: clocks, free memory, and tensor-core
// activity from GPU performance monitoring (two samples: none at the first reading; Hopper only).
TEST_F(NvmlSourceTest, ClocksFreeMemoryAndTensorActivityFromGpm) {
  json s = TwoGpus();
  s["devices"][0].update({{"sm_clock_mhz", 1980},
                          {"mem_clock_mhz", 2619},
                          {"tensor_util", 37.5},
                          {"memory_used", 5000000000ull}});
  s["devices"][1].update({{"gpm", false}, {"tensor_util", 90}});
  Scenario(s);
  auto src = Open();
  const long samples_before = Calls("full", "nvmlGpmSampleGet");
  auto first = src->ReadTelemetry(0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_DOUBLE_EQ(first->sm_clock_mhz.value(), 1980);
  EXPECT_DOUBLE_EQ(first->memory_clock_mhz.value(), 2619);
  // The driver's own free figure: what it reserves for itself is neither used nor free.
  EXPECT_EQ(first->memory_free_bytes, 85899345920ull - 5000000000ull - 85899345920ull / 200);
  EXPECT_EQ(first->tensor_active, std::nullopt) << "one sample is no interval yet";
  auto second = src->ReadTelemetry(0);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_DOUBLE_EQ(second->tensor_active.value(), 0.375);
  EXPECT_DOUBLE_EQ(src->ReadTelemetry(0)->tensor_active.value(), 0.375) << "and every one after";
  // A board without GPM: no tensor reading, ever, and no sample asked for.
  EXPECT_EQ(src->ReadTelemetry(1)->tensor_active, std::nullopt);
  EXPECT_EQ(src->ReadTelemetry(1)->tensor_active, std::nullopt);
  EXPECT_EQ(Calls("full", "nvmlGpmSampleGet") - samples_before, 3) << "GPU 0's three readings only";
}

// dcgm-exporter's other default fields, each from its NVML call: energy, PCIe replays and
// throughput, the video engines, memory temperature and NVLink traffic (field values: HBM and
// NVLink boards only), remapped rows (Ampere+; a Turing board answers NOT_SUPPORTED and they stay
// unknown), and DRAM activity from GPM beside tensor activity.
TEST_F(NvmlSourceTest, EnergyPcieVideoEnginesRemappedRowsAndDramActivity) {
  json s = TwoGpus();
  s["devices"][0].update(
      {{"energy_mj", 123456789},
       {"pcie_replays", 7},
       {"pcie_tx_kbps", 1500},
       {"pcie_rx_kbps", 250},
       {"enc_util", 12},
       {"dec_util", 34},
       {"dram_util", 61.5},
       {"memory_temp", 71},
       {"nvswitch_links", 18},
       {"nvlink_tx_kib", 5000000000ull},
       {"nvlink_rx_kib", 4000000007ull},
       {"remapped_rows",
        {{"correctable", 3}, {"uncorrectable", 1}, {"pending", 1}, {"failure", 0}}}});
  s["devices"][1].update({{"cc", {7, 5}}, {"gpm", false}, {"name", "Tesla T4"}});
  Scenario(s);
  auto src = Open();
  ASSERT_TRUE(src->ReadTelemetry(0).ok());  // GPM's first sample
  auto t = src->ReadTelemetry(0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->energy_mj, 123456789u);
  EXPECT_EQ(t->pcie_replays, 7u);
  EXPECT_DOUBLE_EQ(t->pcie_tx_kbps.value(), 1500);
  EXPECT_DOUBLE_EQ(t->pcie_rx_kbps.value(), 250);
  EXPECT_DOUBLE_EQ(t->encoder_utilization.value(), 0.12);
  EXPECT_DOUBLE_EQ(t->decoder_utilization.value(), 0.34);
  EXPECT_DOUBLE_EQ(t->dram_active.value(), 0.615);
  EXPECT_DOUBLE_EQ(t->memory_temperature_celsius.value(), 71);
  EXPECT_EQ(t->nvlink_data_kib, 9000000007u) << "sent and received, every link once";
  EXPECT_EQ(t->memory_reserved_bytes, 85899345920ull / 200) << "what the fake driver keeps";
  EXPECT_EQ(t->remapped_rows_correctable, 3u);
  EXPECT_EQ(t->remapped_rows_uncorrectable, 1u);
  EXPECT_EQ(t->row_remap_pending, true);
  EXPECT_EQ(t->row_remap_failure, false);
  auto turing = src->ReadTelemetry(1);
  ASSERT_TRUE(turing.ok()) << turing.status();
  EXPECT_EQ(turing->remapped_rows_correctable, std::nullopt);
  EXPECT_EQ(turing->row_remap_pending, std::nullopt);
  EXPECT_EQ(turing->dram_active, std::nullopt);
  EXPECT_EQ(turing->memory_temperature_celsius, std::nullopt) << "GDDR: no memory temperature";
  EXPECT_EQ(turing->nvlink_data_kib, std::nullopt) << "no NVLink: no NVLink traffic, not 0";
  EXPECT_TRUE(turing->energy_mj.has_value()) << "its power over time, as a board counts it";
}

TEST_F(NvmlSourceTest, TelemetryTheDriverDoesNotOfferStaysUnknown) {
  json s = TwoGpus();
  s["devices"][0]["utilization"] = 40;
  s["devices"][0]["errors"] = {{"nvmlDeviceGetPowerUsage", 3}, {"nvmlDeviceGetTemperature", 4}};
  Scenario(s);
  auto src = Open();
  auto t = src->ReadTelemetry(0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->power_watts, std::nullopt) << "NOT_SUPPORTED";
  EXPECT_EQ(t->temperature_celsius, std::nullopt) << "NO_PERMISSION";
  EXPECT_DOUBLE_EQ(t->utilization.value(), 0.4);
  EXPECT_TRUE(t->memory_used_bytes.has_value());

  // A library without the telemetry symbols: nothing known, and not an error.
  Scenario(TwoGpus());
  auto minimal = Open("minimal");
  ASSERT_NE(minimal, nullptr);
  auto m = minimal->ReadTelemetry(1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, GpuTelemetry{});
}

TEST_F(NvmlSourceTest, LegacyLibraryReportsMemoryUsedThroughTheOldCall) {
  json s = TwoGpus();
  s["devices"][1]["memory_used"] = 123456789;
  Scenario(s);
  auto src = Open("legacy");
  ASSERT_NE(src, nullptr);
  auto t = src->ReadTelemetry(1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->memory_used_bytes, 123456789u);
}

TEST_F(NvmlSourceTest, TelemetryOfALostGpuIsAnError) {
  json s = TwoGpus();
  s["devices"][1]["lost_from_ms"] = 0;
  Scenario(s);
  auto src = Open();
  EXPECT_TRUE(src->ReadTelemetry(0).ok());
  auto t = src->ReadTelemetry(1);
  ASSERT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("gpu 1: utilization"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("GPU is lost"));
}

TEST(CanonicalPciBusId, NormalisesForms) {
  EXPECT_EQ(CanonicalPciBusId("0000:18:00.0"), "00000000:18:00.0");
  EXPECT_EQ(CanonicalPciBusId("00000000:2a:00.0"), "00000000:2A:00.0");
  EXPECT_EQ(CanonicalPciBusId("garbage"), "");
  EXPECT_EQ(CanonicalPciBusId("0000:18:00.0x"), "");
  EXPECT_EQ(CanonicalPciBusId("0000:1ff:00.0"), "");
}

}  // namespace
}  // namespace tessera::devices
