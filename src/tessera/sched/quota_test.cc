#include "tessera/sched/quota.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::sched {
namespace {

TEST(Quota, HardLimitSaysWhich) {
  QuotaManager q;
  q.Set("alice", OwnerQuota{.limit = {4, -1, -1}});
  q.Add("alice", {3, 3000, 0});
  std::string why;
  EXPECT_EQ(q.Check("alice", {1, 1000, 0}, &why), QuotaVerdict::kAllowed);
  EXPECT_EQ(q.Check("alice", {2, 2000, 0}, &why), QuotaVerdict::kDenied);
  EXPECT_EQ(why, "owner alice: 3 of 4 whole GPUs used, wants 2 more");
  EXPECT_EQ(q.Check("nobody", {100, 0, 0}, &why), QuotaVerdict::kAllowed) << "no quota, no limit";
}

TEST(Quota, ShareAndMemoryLimits) {
  QuotaManager q;
  q.Set("bob", OwnerQuota{.limit = {-1, 1500, 20480}});
  std::string why;
  EXPECT_EQ(q.Check("bob", {0, 1600, 0}, &why), QuotaVerdict::kDenied);
  EXPECT_THAT(why, ::testing::HasSubstr("GPU-thousandths"));
  EXPECT_EQ(q.Check("bob", {0, 500, 30000}, &why), QuotaVerdict::kDenied);
  EXPECT_THAT(why, ::testing::HasSubstr("MiB GPU memory"));
}

TEST(Quota, BorrowsOnlyIdleQuotaUpToTheCeiling) {
  QuotaManager q;
  q.Set("a", OwnerQuota{.limit = {2, -1, -1}, .borrow = true, .borrow_limit = {5, -1, -1}});
  q.Set("b", OwnerQuota{.limit = {4, -1, -1}});
  q.Add("a", {2, 2000, 0});
  q.Add("b", {2, 2000, 0});  // b leaves 2 idle
  std::string why;
  EXPECT_EQ(q.Check("a", {2, 2000, 0}, &why), QuotaVerdict::kBorrowing);
  EXPECT_EQ(q.Check("a", {4, 4000, 0}, &why), QuotaVerdict::kDenied);
  EXPECT_THAT(why, ::testing::HasSubstr("borrowing ceiling"));
  q.Add("b", {1, 1000, 0});  // now only 1 idle
  EXPECT_EQ(q.Check("a", {2, 2000, 0}, &why), QuotaVerdict::kDenied);
  EXPECT_THAT(why, ::testing::HasSubstr("not enough idle quota"));
}

TEST(Quota, BorrowsOnlyWithinItsCohortAndNotWhatAnotherBorrowed) {
  QuotaManager q;
  OwnerQuota borrower{.limit = {1, -1, -1}, .borrow = true, .borrow_limit = {8, -1, -1}};
  borrower.cohort = "research";
  q.Set("a", borrower);
  q.Set("c", borrower);
  OwnerQuota lender{.limit = {4, -1, -1}};
  lender.cohort = "research";
  q.Set("b", lender);
  OwnerQuota stranger{.limit = {16, -1, -1}};
  stranger.cohort = "prod";
  q.Set("p", stranger);  // 16 idle GPUs, but in another cohort
  q.Add("a", {1, 1000, 0});
  q.Add("c", {1, 1000, 0});
  std::string why;
  // b lends 4: a may borrow them...
  EXPECT_EQ(q.Check("a", {4, 4000, 0}, &why), QuotaVerdict::kBorrowing);
  EXPECT_EQ(q.Check("a", {5, 5000, 0}, &why), QuotaVerdict::kDenied);
  EXPECT_THAT(why, ::testing::HasSubstr("not enough idle quota"));
  // ...and once c has borrowed 3 of them, a may borrow only the one left.
  q.Add("c", {3, 3000, 0});
  EXPECT_EQ(q.Check("a", {1, 1000, 0}, &why), QuotaVerdict::kBorrowing);
  EXPECT_EQ(q.Check("a", {2, 2000, 0}, &why), QuotaVerdict::kDenied);
}

}  // namespace
}  // namespace tessera::sched
