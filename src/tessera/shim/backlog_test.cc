#include "tessera/shim/backlog.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace tessera::shim {
namespace {

// One stream of a GPU on a fake clock: a launch's work starts when the work before it is done;
// an event completes when the work recorded before it has.
struct FakeGpu {
  uint64_t now_us = 1000;
  uint64_t free_at_us = 0;    // when the queued work is done
  uint64_t kernel_us = 1000;  // the next launches' length
  bool hang = false;          // the queued work never finishes
  bool fail_events = false;
  std::map<CUevent, uint64_t> events;  // completion time
  uintptr_t next = 1;

  void Launch() { free_at_us = std::max(free_at_us, now_us) + kernel_us; }
  uint64_t QueuedUs() const { return free_at_us > now_us ? free_at_us - now_us : 0; }
};
FakeGpu* gpu = nullptr;

BacklogOps Ops() {
  BacklogOps o;
  o.event_create = [](CUevent* e, unsigned) {
    *e = reinterpret_cast<CUevent>(gpu->next++);
    return CUresult{CUDA_SUCCESS};
  };
  o.event_record = [](CUevent e, CUstream) {
    if (gpu->fail_events) return CUresult{CUDA_ERROR_INVALID_VALUE};
    gpu->events[e] = gpu->hang ? UINT64_MAX : std::max(gpu->free_at_us, gpu->now_us);
    return CUresult{CUDA_SUCCESS};
  };
  o.event_query = [](CUevent e) {
    return gpu->now_us >= gpu->events.at(e) ? CUresult{CUDA_SUCCESS} : kNotReady;
  };
  o.event_elapsed = [](float* ms, CUevent a, CUevent b) {
    *ms = static_cast<float>(gpu->events.at(b) - gpu->events.at(a)) / 1000.0f;
    return CUresult{CUDA_SUCCESS};
  };
  o.now_us = [] { return gpu->now_us; };
  o.sleep_us = [](uint64_t us) { gpu->now_us += us; };
  return o;
}

// A launch through the backlog as the library makes it; each launch costs 3 us of host time.
void Launch(Backlog& b) {
  if (b.Over(0)) b.Wait(0);
  const Backlog::Token t = b.Before(0, nullptr);
  gpu->Launch();
  b.Launched(t, 0, nullptr, true);
  gpu->now_us += 3;
}

class BacklogTest : public ::testing::Test {
 protected:
  void SetUp() override { gpu = &fake_; }
  void TearDown() override { gpu = nullptr; }
  FakeGpu fake_;
};

TEST_F(BacklogTest, ADeepQueueIsHeldNearTheBound) {
  // 200 launches of 1 ms queued at once: without a bound they are 200 ms ahead; with one of 5 ms,
  // never much more than that.
  auto b = std::make_unique<Backlog>();
  b->Init(Ops(), 5000);
  uint64_t most = 0;
  for (int i = 0; i < 200; ++i) {
    Launch(*b);
    most = std::max(most, fake_.QueuedUs());
  }
  EXPECT_LE(most, 9000u) << "the first launches go before the first estimate";
  EXPECT_GE(most, 4000u) << "the queue is used up to the bound, not kept empty";
  EXPECT_NEAR(static_cast<double>(b->estimate_ns(0)), 1e6, 1e4);
  EXPECT_EQ(b->launched(0), 200u);

  FakeGpu unbounded;
  gpu = &unbounded;
  Backlog none;
  none.Init(Ops(), 0);
  for (int i = 0; i < 200; ++i) Launch(none);
  EXPECT_GT(unbounded.QueuedUs(), 190000u);
}

TEST_F(BacklogTest, ShortKernelsAreNotHeldBack) {
  // 10 us kernels launched every 3 us pile up only to the bound (500 of them), never waiting
  // before that.
  fake_.kernel_us = 10;
  auto b = std::make_unique<Backlog>();
  b->Init(Ops(), 5000);
  uint64_t most = 0;
  for (int i = 0; i < 5000; ++i) {
    Launch(*b);
    most = std::max(most, fake_.QueuedUs());
  }
  EXPECT_GE(most, 4000u);
  EXPECT_LE(most, 6000u);
}

TEST_F(BacklogTest, AWaitForWorkThatNeverEndsIsCut) {
  // A kernel that waits on a later one (on another stream) never finishes until that one goes:
  // a launch waits at most kMaxWaitBounds bounds, then goes.
  auto b = std::make_unique<Backlog>();
  b->Init(Ops(), 5000);
  fake_.hang = true;
  for (int i = 0; i < 20; ++i) Launch(*b);
  EXPECT_EQ(b->launched(0), 20u);
  EXPECT_LE(fake_.now_us, 1000 + 20 * 3 + 20 * kMaxWaitBounds * 5000 + 1000);
}

TEST_F(BacklogTest, EventsTheDriverRefusesLeaveTheDeviceUnbounded) {
  fake_.fail_events = true;
  auto b = std::make_unique<Backlog>();
  b->Init(Ops(), 5000);
  for (int i = 0; i < 50; ++i) Launch(*b);
  EXPECT_TRUE(b->broken(0));
  EXPECT_FALSE(b->Over(0));
  EXPECT_GT(fake_.QueuedUs(), 40000u);
}

TEST_F(BacklogTest, ASynchronizeCountsEverythingBeforeItDone) {
  auto b = std::make_unique<Backlog>();
  b->Init(Ops(), 5000);
  for (int i = 0; i < 4; ++i) Launch(*b);
  const uint64_t before = b->launched(0);
  fake_.now_us = fake_.free_at_us;  // the synchronize
  b->Drained(0, before);
  EXPECT_EQ(b->done(0), 4u);
  EXPECT_FALSE(b->Over(0));
}

}  // namespace
}  // namespace tessera::shim
