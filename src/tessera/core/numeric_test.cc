// The numeric rules several parts share (numeric.h).
#include "tessera/core/numeric.h"

#include <gtest/gtest.h>

namespace tessera::core {
namespace {

// A share's GPU time against the part of its run it was not waiting for the GPU.
TEST(DemandPct, WhatAJobWouldHaveUsedIsItsRateWhileNotHeldBack) {
  EXPECT_EQ(DemandPct(300, 0, 1000), 30) << "never held back: what it used";
  EXPECT_EQ(DemandPct(200, 800, 1000), 100) << "waiting whenever it did not run: all of it";
  EXPECT_EQ(DemandPct(200, 500, 1000), 40) << "busy 200 of the 500 it was let run";
  EXPECT_EQ(DemandPct(200, 1500, 1000), 100) << "waits past its run (clock noise): all of it";
  EXPECT_EQ(DemandPct(0, 500, 1000), -1) << "no GPU time: not known";
  EXPECT_EQ(DemandPct(200, 0, 0), -1) << "no run time: not known";
}

}  // namespace
}  // namespace tessera::core
