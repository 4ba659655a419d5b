#include "tessera/shim/arbiter.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

namespace tessera::shim {
namespace {

TEST(ArbiterShare, Parses) {
  uint32_t p = 0;
  EXPECT_TRUE(ParseShare("30%", &p));
  EXPECT_EQ(p, 300u);
  EXPECT_TRUE(ParseShare("30", &p));
  EXPECT_EQ(p, 300u);
  EXPECT_TRUE(ParseShare("0.3", &p));
  EXPECT_EQ(p, 300u);
  EXPECT_TRUE(ParseShare("100%", &p));
  EXPECT_EQ(p, 1000u);
  EXPECT_TRUE(ParseShare("12.5%", &p));
  EXPECT_EQ(p, 125u);
  for (const char* bad : {"", "0", "0%", "101%", "1.5", "-30%", " 30", "30 %", "30%x", "lots"}) {
    EXPECT_FALSE(ParseShare(bad, &p)) << bad;
  }
}

std::string TempFile(const char* name) {
  return ::testing::TempDir() + "arbiter-" + std::to_string(getpid()) + "-" + name;
}

TEST(Arbiter, AloneAJobHoldsTheGpuAndIsChargedForIt) {
  std::string path = TempFile("alone");
  unlink(path.c_str());
  char err[256] = "";
  ArbiterConfig c;
  c.slice_us = 1000;
  std::unique_ptr<Arbiter> a(Arbiter::Attach(path.c_str(), 42, c, err, sizeof err));
  ASSERT_NE(a, nullptr) << err;
  const uint64_t t0 = Arbiter::NowMicros();
  a->BeforeLaunch(3, nullptr);  // the first launch takes the lease
  const uint64_t granted_by = Arbiter::NowMicros();
  uint64_t last = granted_by;
  while (Arbiter::NowMicros() < t0 + 20000) {  // never waits: alone
    last = Arbiter::NowMicros();
    a->BeforeLaunch(3, nullptr);
  }
  const uint64_t t1 = Arbiter::NowMicros();
  const ArbiterGpu& g = a->data()->gpus[3];
  const int slot = a->Slot(3);
  ASSERT_GE(slot, 0);
  EXPECT_EQ(g.jobs[slot].key.load(), 42u);
  EXPECT_EQ(g.jobs[slot].waits.load(), 1u) << "only the first launch looked for the lease";
  // Renewed every slice and charged for each: all the time it held the GPU but the slice still open
  // at its last launch, and never more than that time. Measured, not assumed to be 20 ms: a busy
  // machine may deschedule the loop.
  const uint64_t busy = g.jobs[slot].busy_us.load();
  EXPECT_GE(busy + c.slice_us, last - granted_by);
  EXPECT_LE(busy, t1 - t0);
  EXPECT_GE(busy, 15000u);
  EXPECT_EQ(a->data()->gpus[0].handovers.load(), 0u) << "other GPUs untouched";
  unlink(path.c_str());
}

TEST(Arbiter, RefusesAnotherFile) {
  std::string path = TempFile("bad");
  FILE* f = fopen(path.c_str(), "w");
  fputs("something else", f);
  fclose(f);
  char err[256] = "";
  EXPECT_EQ(Arbiter::Attach(path.c_str(), 1, ArbiterConfig{}, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("not a Tessera GPU arbiter file"), std::string::npos) << err;
  err[0] = 0;
  EXPECT_FALSE(CreateArbiterFile(path.c_str(), err, sizeof err));
  EXPECT_NE(std::string(err).find("not a Tessera GPU arbiter file"), std::string::npos) << err;
  unlink(path.c_str());
}

TEST(Arbiter, CreatedAheadForJobsToJoin) {
  std::string path = TempFile("ahead");
  unlink(path.c_str());
  char err[256] = "";
  ASSERT_TRUE(CreateArbiterFile(path.c_str(), err, sizeof err)) << err;
  ASSERT_TRUE(CreateArbiterFile(path.c_str(), err, sizeof err))
      << "an existing file is kept: " << err;
  std::unique_ptr<Arbiter> a(Arbiter::Attach(path.c_str(), 7, ArbiterConfig{}, err, sizeof err));
  ASSERT_NE(a, nullptr) << err;
  EXPECT_EQ(a->data()->gpus[0].jobs[0].key.load(), 0u) << "creating it joined nobody";
  a->BeforeLaunch(0, nullptr);
  EXPECT_EQ(a->data()->gpus[0].jobs[a->Slot(0)].key.load(), 7u);
  unlink(path.c_str());
}

}  // namespace
}  // namespace tessera::shim
