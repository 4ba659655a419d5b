#include "tessera/shim/host_clock.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "../../../tests/capture.h"

namespace tessera::shim {
namespace {

TEST(HostClock, ReadsTheMonotonicOffsetOfTimensOffsets) {
  EXPECT_EQ(ParseMonotonicOffsetNs("monotonic           0         0\nboottime 0 0\n"), 0);
  EXPECT_EQ(ParseMonotonicOffsetNs("monotonic 5 250\nboottime 9 0\n"), 5000000250);
  EXPECT_EQ(ParseMonotonicOffsetNs("boottime 9 0\nmonotonic -3 0\n"), -3000000000);
  EXPECT_EQ(ParseMonotonicOffsetNs("1 7 0\n"), 7000000000);  // by clock id
  EXPECT_EQ(ParseMonotonicOffsetNs(""), 0);
}

// A process in a time namespace reads its CLOCK_MONOTONIC shifted; the host clock is not.
TEST(HostClock, IsTheSameInsideATimeNamespace) {
  if (tessera::test::Capture("unshare --time --monotonic 5 true").code != 0)
    GTEST_FAIL() << "unshare --time fails here: time namespaces are needed (Linux 5.6+, root)";
  // The shifted process prints both clocks; the host's is compared with ours around it.
  auto r = tessera::test::Capture("unshare --time --monotonic 5 cat /proc/self/timens_offsets");
  ASSERT_EQ(r.code, 0);
  EXPECT_EQ(ParseMonotonicOffsetNs(r.out.c_str()), 5000000000) << r.out;
  EXPECT_EQ(MonotonicOffsetNs(), 0);  // this test's own process: the host's namespace
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  const uint64_t raw = static_cast<uint64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  EXPECT_LT(HostMonotonicNs() - raw, 1000000000u);
}

}  // namespace
}  // namespace tessera::shim
