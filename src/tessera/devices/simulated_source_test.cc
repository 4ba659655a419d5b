#include "tessera/devices/simulated_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::devices {
namespace {

using namespace std::chrono_literals;

TEST(SimulatedSource, ScriptedEventsArriveWhenDue) {
  auto m = ParseInventory(R"(name: box
gpus: [{model: X, count: 2, memory: 16GiB, compute_capability: "8.6"}]
health_events:
  - {after: 1s, gpu: 1, xid: 79}
  - {after: 2s, gpu: 0, lost: true}
  - {after: 3s, gpu: 0, lost: false}
)",
                          "box.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  core::FakeClock clock;
  SimulatedSource source(*m, clock);
  auto none = source.WaitHealthEvents(0ms);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  clock.Advance(1s);
  auto one = source.WaitHealthEvents(0ms);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].gpu, 1);
  EXPECT_EQ((*one)[0].xid, 79u);
  EXPECT_TRUE(source.Probe(0).ok());
  clock.Advance(1s);
  absl::Status lost = source.Probe(0);
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(lost.message()), ::testing::HasSubstr("gpu 0 (GPU-"));
  clock.Advance(1s);
  EXPECT_TRUE(source.Probe(0).ok());
}

TEST(SimulatedSource, WaitReturnsEarlyOnInjection) {
  auto m = LoadSimulatedMachine("t4x2");
  ASSERT_TRUE(m.ok());
  SimulatedSource source(*m);
  std::thread injector([&] {
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(source.Inject({.gpu = 1, .kind = HealthEvent::Kind::kEccDoubleBit}).ok());
  });
  auto start = std::chrono::steady_clock::now();
  auto events = source.WaitHealthEvents(10s);
  injector.join();
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(SimulatedSource, RejectsUnknownGpus) {
  auto m = LoadSimulatedMachine("t4x2");
  ASSERT_TRUE(m.ok());
  SimulatedSource source(*m);
  EXPECT_EQ(source.Inject({.gpu = 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(source.SetLost(-1, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(source.Probe(5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(source.ReadTelemetry(2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimulatedSource, TelemetryIsUnknownAndFailsWhileLost) {
  auto m = LoadSimulatedMachine("t4x2");
  ASSERT_TRUE(m.ok());
  SimulatedSource source(*m);
  auto t = source.ReadTelemetry(1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, GpuTelemetry{}) << "a simulated GPU invents no readings";
  ASSERT_TRUE(source.SetLost(1, true).ok());
  EXPECT_EQ(source.ReadTelemetry(1).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tessera::devices
