#include "tessera/devices/health.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/devices/inventory.h"
#include "tessera/devices/simulated_source.h"

namespace tessera::devices {
namespace {

using namespace std::chrono_literals;

HealthEvent Xid(int gpu, uint64_t xid) {
  return HealthEvent{.gpu = gpu, .kind = HealthEvent::Kind::kXid, .xid = xid, .detail = "XID"};
}

class HealthTrackerTest : public ::testing::Test {
 protected:
  HealthPolicy Policy() {
    HealthPolicy p;
    p.recovery_quiet_period = 60s;
    p.probe_interval = 10s;
    return p;
  }
  core::FakeClock clock_;
};

TEST_F(HealthTrackerTest, CriticalXidMakesGpuSickAtOnce) {
  HealthTracker t(2, Policy(), clock_.Now());
  EXPECT_TRUE(t.OnEvent(Xid(1, 79), clock_.Now()));
  EXPECT_FALSE(t.health(1).healthy);
  EXPECT_EQ(t.health(1).reason, "XID 79");
  EXPECT_TRUE(t.health(0).healthy);
  EXPECT_EQ(t.health(1).xid_count, 1u);
}

TEST_F(HealthTrackerTest, ApplicationXidsAreIgnoredButCounted) {
  HealthTracker t(1, Policy(), clock_.Now());
  for (uint64_t xid : {13, 31, 43, 45, 68, 109}) EXPECT_FALSE(t.OnEvent(Xid(0, xid), clock_.Now()));
  EXPECT_TRUE(t.health(0).healthy);
  EXPECT_EQ(t.health(0).xid_count, 6u);
}

TEST_F(HealthTrackerTest, IgnoredXidListIsConfigurable) {
  HealthPolicy p = Policy();
  p.ignored_xids = {79};
  HealthTracker t(1, p, clock_.Now());
  EXPECT_FALSE(t.OnEvent(Xid(0, 79), clock_.Now()));
  EXPECT_TRUE(t.OnEvent(Xid(0, 13), clock_.Now()));
}

TEST_F(HealthTrackerTest, SingleBitEccIsHarmlessUnlessConfigured) {
  HealthEvent sbe{.gpu = 0, .kind = HealthEvent::Kind::kEccSingleBit};
  HealthTracker lenient(1, Policy(), clock_.Now());
  EXPECT_FALSE(lenient.OnEvent(sbe, clock_.Now()));
  HealthPolicy p = Policy();
  p.single_bit_ecc_is_critical = true;
  HealthTracker strict(1, p, clock_.Now());
  EXPECT_TRUE(strict.OnEvent(sbe, clock_.Now()));
  HealthTracker dbe(1, Policy(), clock_.Now());
  EXPECT_TRUE(dbe.OnEvent({.gpu = 0, .kind = HealthEvent::Kind::kEccDoubleBit}, clock_.Now()));
  EXPECT_EQ(dbe.health(0).reason, "double-bit ECC error");
}

TEST_F(HealthTrackerTest, RecoversAfterQuietPeriodAndGoodProbe) {
  HealthTracker t(1, Policy(), clock_.Now());
  t.OnEvent(Xid(0, 79), clock_.Now());
  clock_.Advance(59s);
  EXPECT_FALSE(t.ProbeDue(0, clock_.Now()));
  EXPECT_FALSE(t.OnProbe(0, absl::OkStatus(), clock_.Now())) << "quiet period not over";
  EXPECT_FALSE(t.health(0).healthy);
  clock_.Advance(1s);
  EXPECT_TRUE(t.ProbeDue(0, clock_.Now()));
  EXPECT_TRUE(t.OnProbe(0, absl::OkStatus(), clock_.Now()));
  EXPECT_TRUE(t.health(0).healthy);
  EXPECT_TRUE(t.health(0).reason.empty());
}

TEST_F(HealthTrackerTest, NewErrorRestartsQuietPeriod) {
  HealthTracker t(1, Policy(), clock_.Now());
  t.OnEvent(Xid(0, 79), clock_.Now());
  clock_.Advance(50s);
  EXPECT_FALSE(t.OnEvent(Xid(0, 48), clock_.Now())) << "already sick: no state change";
  EXPECT_EQ(t.health(0).reason, "XID 48");
  clock_.Advance(20s);
  EXPECT_FALSE(t.OnProbe(0, absl::OkStatus(), clock_.Now()));
  clock_.Advance(40s);
  EXPECT_TRUE(t.OnProbe(0, absl::OkStatus(), clock_.Now()));
}

TEST_F(HealthTrackerTest, FailedProbeMakesSickAndDelaysRecovery) {
  HealthTracker t(1, Policy(), clock_.Now());
  EXPECT_TRUE(t.OnProbe(0, absl::UnavailableError("GPU is lost"), clock_.Now()));
  EXPECT_THAT(t.health(0).reason, ::testing::HasSubstr("not answering: GPU is lost"));
  clock_.Advance(60s);
  EXPECT_FALSE(t.OnProbe(0, absl::UnavailableError("GPU is lost"), clock_.Now()));
  clock_.Advance(60s);
  EXPECT_TRUE(t.OnProbe(0, absl::OkStatus(), clock_.Now()));
}

TEST_F(HealthTrackerTest, ZeroQuietPeriodNeverRecovers) {
  HealthPolicy p = Policy();
  p.recovery_quiet_period = core::Duration::zero();
  HealthTracker t(1, p, clock_.Now());
  t.OnEvent(Xid(0, 79), clock_.Now());
  clock_.Advance(24h);
  EXPECT_FALSE(t.ProbeDue(0, clock_.Now()));
  EXPECT_FALSE(t.OnProbe(0, absl::OkStatus(), clock_.Now()));
  EXPECT_FALSE(t.health(0).healthy);
}

TEST_F(HealthTrackerTest, HealthyGpusAreProbedEveryInterval) {
  HealthTracker t(1, Policy(), clock_.Now());
  EXPECT_FALSE(t.ProbeDue(0, clock_.Now()));
  clock_.Advance(10s);
  EXPECT_TRUE(t.ProbeDue(0, clock_.Now()));
  t.OnProbe(0, absl::OkStatus(), clock_.Now());
  EXPECT_FALSE(t.ProbeDue(0, clock_.Now()));
}

TEST_F(HealthTrackerTest, EventForUnknownGpuChangesNothing) {
  HealthTracker t(2, Policy(), clock_.Now());
  EXPECT_FALSE(t.OnEvent(Xid(7, 79), clock_.Now()));
  EXPECT_FALSE(t.OnEvent(Xid(-1, 79), clock_.Now()));
  EXPECT_TRUE(t.health(0).healthy && t.health(1).healthy);
}

// The watch, end to end over a simulated machine and a fake clock.
class HealthWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadSimulatedMachine("t4x2");
    ASSERT_TRUE(m.ok());
    source_ = std::make_unique<SimulatedSource>(*m, clock_);
    HealthPolicy p;
    p.recovery_quiet_period = 30s;
    p.probe_interval = 5s;
    watch_ = std::make_unique<HealthWatch>(
        *source_, 2, p, clock_,
        [this](int gpu, const GpuHealth& h) { changes_.emplace_back(gpu, h.healthy); });
  }
  core::FakeClock clock_;
  std::unique_ptr<SimulatedSource> source_;
  std::unique_ptr<HealthWatch> watch_;
  std::vector<std::pair<int, bool>> changes_;
};

TEST_F(HealthWatchTest, InjectedXidReportsWithinOneStep) {
  ASSERT_TRUE(source_->Inject(Xid(1, 79)).ok());
  watch_->Step(0ms);
  EXPECT_THAT(changes_, ::testing::ElementsAre(std::pair(1, false)));
  EXPECT_FALSE(watch_->Snapshot()[1].healthy);
  EXPECT_TRUE(watch_->Snapshot()[0].healthy);
}

TEST_F(HealthWatchTest, LostGpuFoundByProbeAndRecovers) {
  ASSERT_TRUE(source_->SetLost(0, true).ok());
  watch_->Step(0ms);
  EXPECT_TRUE(changes_.empty()) << "no probe due yet";
  clock_.Advance(5s);
  watch_->Step(0ms);
  EXPECT_THAT(changes_, ::testing::ElementsAre(std::pair(0, false)));
  ASSERT_TRUE(source_->SetLost(0, false).ok());
  clock_.Advance(29s);
  watch_->Step(0ms);
  EXPECT_EQ(changes_.size(), 1u) << "quiet period not over";
  clock_.Advance(1s);
  watch_->Step(0ms);
  EXPECT_THAT(changes_, ::testing::ElementsAre(std::pair(0, false), std::pair(0, true)));
}

TEST_F(HealthWatchTest, RunsOnItsOwnThread) {
  std::atomic<int> seen{0};
  auto m = LoadSimulatedMachine("t4x2");
  ASSERT_TRUE(m.ok());
  SimulatedSource source(*m);
  HealthWatch watch(source, 2, HealthPolicy{}, core::SteadyClock::Get(),
                    [&](int, const GpuHealth& h) {
                      if (!h.healthy) ++seen;
                    });
  watch.Start();
  ASSERT_TRUE(source.Inject(Xid(0, 94)).ok());
  for (int i = 0; i < 200 && seen == 0; ++i) std::this_thread::sleep_for(5ms);
  watch.Stop();
  EXPECT_EQ(seen, 1);
}

}  // namespace
}  // namespace tessera::devices
