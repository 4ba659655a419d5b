#include "tessera/server/rights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

TEST(Rights, CeilingsAdminsRootAndPreemptionComeFromTheConfig) {
  ServerConfig c;
  c.priority_ceiling = 10;
  c.priority_ceilings = {{"alice", 50}, {"group:no-such-group-here", 900}};
  c.preempt_others = {"alice"};
  c.admins = {"boss"};
  Rights r(c);
  const uint32_t someone = 54321;  // no account: no groups
  const Caller alice{"alice", someone, false}, bob{"bob", someone + 1, false};
  EXPECT_EQ(r.PriorityCeiling(alice), 50);
  EXPECT_EQ(r.PriorityCeiling(bob), 10);
  EXPECT_EQ(r.PriorityCeiling({"boss", someone + 2, true}), 1000);
  EXPECT_TRUE(r.IsAdmin("boss", someone + 2));
  EXPECT_TRUE(r.IsAdmin("anyone", 0)) << "root";
  EXPECT_FALSE(r.IsAdmin("bob", someone + 1));
  EXPECT_TRUE(r.MayPreemptOthers(alice));
  EXPECT_FALSE(r.MayPreemptOthers(bob));

  absl::Status st = r.MaySetPriority(51, alice);
  EXPECT_EQ(HttpStatusOf(st), 403);
  EXPECT_THAT(std::string(st.message()), HasSubstr("priority 51 is above alice's ceiling of 50"));
  EXPECT_TRUE(r.MaySetPriority(50, alice).ok());
  JobSpec spec;
  spec.priority = 11;
  EXPECT_EQ(HttpStatusOf(r.MaySubmit(spec, bob)), 403);
  spec.priority = 0;
  if (geteuid() == 0) {
    // A root server: anyone may be run as, but not root unless the config allows it.
    EXPECT_TRUE(r.MaySubmit(spec, bob).ok());
    st = r.MaySubmit(spec, {"root", 0, true});
    EXPECT_EQ(HttpStatusOf(st), 403);
    EXPECT_THAT(std::string(st.message()), HasSubstr("allow_root_jobs"));
    c.allow_root_jobs = true;
    EXPECT_TRUE(r.MaySubmit(spec, {"root", 0, true}).ok());
  } else {
    // An unprivileged server runs only its own user's jobs.
    st = r.MaySubmit(spec, bob);
    EXPECT_EQ(HttpStatusOf(st), 403);
    EXPECT_THAT(std::string(st.message()), HasSubstr("cannot start jobs as bob"));
  }
}

TEST(Rights, ADependencyMayNameOnlyTheCallersOwnJobsButAnAdminsAnyone) {
  ServerConfig c;
  Rights r(c);
  JobSpec spec;
  spec.after = {{.job = 7}, {.job = 9, .task = 2}};
  auto owner_of = [](int64_t job) -> std::optional<std::string> {
    if (job == 7) return "bob";
    if (job == 9) return "alice";
    return std::nullopt;  // no such job: the dispatcher's to refuse
  };
  EXPECT_TRUE(r.MayDependOn(spec, {"alice", 1001, false}, [&](int64_t j) {
                 return j == 7 ? std::optional<std::string>("alice") : owner_of(j);
               }).ok());
  absl::Status st = r.MayDependOn(spec, {"alice", 1001, false}, owner_of);
  EXPECT_EQ(HttpStatusOf(st), 403);
  EXPECT_THAT(std::string(st.message()), HasSubstr("job 7 belongs to bob"));
  EXPECT_TRUE(r.MayDependOn(spec, {"root", 0, true}, owner_of).ok());
  spec.after = {{.job = 12}};
  EXPECT_TRUE(r.MayDependOn(spec, {"alice", 1001, false}, owner_of).ok());
}

}  // namespace
}  // namespace tessera::server
