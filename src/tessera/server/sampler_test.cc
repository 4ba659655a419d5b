// The sampler alone (sampler.h): a simulated machine's telemetry, views published by the test, a
// store in a temporary folder, a FakeJobHost's share readings, a fake clock.
#include "tessera/server/sampler.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "nlohmann/json.hpp"
#include "tessera/devices/simulated_source.h"
#include "tessera/server/fake_job_host.h"
#include "tessera/server/fake_launcher.h"
#include "tessera/server/store.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-sampler-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto store = Store::Open(dir_ + "/tessera.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto machine = devices::LoadSimulatedMachine("t4x2");
    ASSERT_TRUE(machine.ok()) << machine.status();
    source_ = std::make_unique<devices::SimulatedSource>(*std::move(machine), clock_);
    sampler_ =
        std::make_unique<Sampler>(*store_, *source_, 2, host_, views_, clock_, feed_,
                                  Sampler::Options{.interval_s = 5, .window_s = 60},
                                  [this](const std::vector<devices::GpuTelemetry>& t,
                                         const std::map<int64_t, JobHost::ShareUse>& shares) {
                                    measured_telemetry_ = t;
                                    measured_shares_ = shares;
                                  });
  }
  void TearDown() override {
    feed_.Close();
    sampler_.reset();
    fs::remove_all(dir_);
  }
  void Advance(double s) {
    clock_.Advance(std::chrono::duration_cast<core::Duration>(std::chrono::duration<double>(s)));
  }
  devices::GpuTelemetry Reading(double util, uint64_t mib) {
    devices::GpuTelemetry t;
    t.utilization = util;
    t.memory_used_bytes = mib << 20;
    return t;
  }

  std::string dir_;
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(1'800'000'000))};
  std::unique_ptr<Store> store_;
  std::unique_ptr<devices::SimulatedSource> source_;
  FakeLauncher launcher_{clock_};
  FakeJobHost host_{launcher_};
  Views views_;
  Feed feed_;
  std::unique_ptr<Sampler> sampler_;
  std::vector<devices::GpuTelemetry> measured_telemetry_;
  std::map<int64_t, JobHost::ShareUse> measured_shares_;
};

TEST_F(SamplerTest, ASampleIsWhatTheViewsAndTheTelemetrySayStoredAndTold) {
  ASSERT_TRUE(source_->SetTelemetry(0, Reading(0.75, 1000)).ok());
  // GPU 0 holds a share (half of it) of a running job and a starting one's; GPU 1 is sick.
  MachineView v;
  v.gpus = {{.healthy = true, .milli = 500, .memory_mib = 4096, .jobs = {1, 2}},
            {.healthy = false, .reason = "XID 79"}};
  v.active[1] = {.gpus = {0}, .pid = 10, .gpu_milli = 300, .region = dir_ + "/1.region"};
  v.active[2] = {.starting = true, .gpus = {0}, .gpu_milli = 200, .region = dir_ + "/2.region"};
  v.queued = 3;
  v.running = 1;
  views_.Publish(std::move(v), {});
  host_.SetShareUse(1, {.busy_us = 1'500'000, .peak_bytes = uint64_t{800} << 20});
  host_.SetShareUse(2, {.busy_us = 9, .peak_bytes = 9});

  const json j = json::parse(sampler_->TakeSample());
  const double now = core::Seconds(clock_.Now());
  EXPECT_EQ(j["at"], now);
  EXPECT_EQ(j["queued"], 3);
  EXPECT_EQ(j["running"], 1);
  EXPECT_EQ(j["busy"], 1);
  EXPECT_EQ(j["healthy"], 1);
  EXPECT_EQ(j["allocated"], 0.5);
  EXPECT_EQ(j["alloc"], json::array({0.5, 0.0}));
  EXPECT_EQ(j["alloc_mem"], json::array({uint64_t{4096} << 20, 0}));
  EXPECT_EQ(j["util"], json::array({0.75, nullptr}));  // GPU 1 gave no readings
  EXPECT_EQ(j["mem"], json::array({uint64_t{1000} << 20, nullptr}));
  // Stored, told to the streams, counted.
  auto stored = store_->Samples(0);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ(json::parse((*stored)[0].data), j);
  uint64_t seen = 0;
  EXPECT_TRUE(feed_.Wait(&seen, 0));
  EXPECT_EQ(seen, 1u);
  EXPECT_EQ(sampler_->Samples(), (std::pair<double, uint64_t>{now, 1}));
  // The running share's readings went to what jobs are measured to use; the starting one's not.
  ASSERT_EQ(measured_shares_.size(), 1u);
  EXPECT_EQ(measured_shares_.at(1).busy_us, 1'500'000u);
  EXPECT_EQ(measured_shares_.at(1).peak_bytes, uint64_t{800} << 20);
  ASSERT_EQ(measured_telemetry_.size(), 2u);
  EXPECT_EQ(measured_telemetry_[0].utilization, 0.75);
}

TEST_F(SamplerTest, TelemetryIsReadFromTheDriverAtMostOnceASecond) {
  ASSERT_TRUE(source_->SetTelemetry(1, Reading(0.1, 10)).ok());
  EXPECT_EQ(sampler_->Telemetry()[1].utilization, 0.1);
  ASSERT_TRUE(source_->SetTelemetry(1, Reading(0.9, 10)).ok());
  Advance(0.9);
  EXPECT_EQ(sampler_->Telemetry()[1].utilization, 0.1);  // the cached reading
  Advance(0.1);
  EXPECT_EQ(sampler_->Telemetry()[1].utilization, 0.9);
}

TEST_F(SamplerTest, SamplesOlderThanTheWindowGo) {
  views_.Publish(MachineView{.gpus = std::vector<GpuView>(2)}, {});
  sampler_->TakeSample();
  Advance(30);
  sampler_->TakeSample();
  Advance(31);  // the first is now 61 s old, over the 60 s window
  sampler_->TakeSample();
  auto stored = store_->Samples(0);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 2u);
  EXPECT_EQ(sampler_->Samples().second, 3u);
}

}  // namespace
}  // namespace tessera::server
