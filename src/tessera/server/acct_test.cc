// Accounting from jobs and their runs: GPU-seconds whole and fractional (weighted by share or
// memory), outcomes, waits, running jobs, per user, group and model, inside a period only.
#include "tessera/server/acct.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace tessera::server {
namespace {

AcctJob Job(int64_t id, const std::string& owner, JobState state, double submitted,
            std::vector<AcctJob::Run> runs, const std::string& placement) {
  AcctJob j;
  j.id = id;
  j.owner = owner;
  j.owner_uid = owner == "alice" ? 1000 : 1001;
  j.state = state;
  j.submitted_at = submitted;
  if (state != JobState::kRunning && !runs.empty()) j.ended_at = runs.back().end;
  j.runs = std::move(runs);
  j.placement_json = placement;
  return j;
}

const char kTwoH100[] =
    R"({"gpus":[{"index":0,"model":"H100"},{"index":1,"model":"H100"}],"milli_per_gpu":1000,)"
    R"("memory_mib_per_gpu":81920})";
// A quarter of the compute, half of the memory: counts as half a GPU.
const char kHalfT4[] =
    R"({"gpus":[{"index":2,"model":"T4"}],"milli_per_gpu":250,"memory_mib_per_gpu":8000})";

AcctOptions Period(double since, double until) {
  AcctOptions o;
  o.since = since;
  o.until = until;
  o.group_of = [](uint32_t uid) { return uid == 1000 ? std::string("ml") : std::string("cv"); };
  o.gpu_memory_mib = [](int g) -> int64_t { return g == 2 ? 16000 : 81920; };
  return o;
}

TEST(Acct, SumsGpuTimeInsideThePeriodPerUserGroupAndModel) {
  std::vector<AcctJob> jobs = {
      // 2 GPUs from 100 to 200, preempted and run again 300..400: 100 s of it inside [150, 350].
      Job(1, "alice", JobState::kSucceeded, 90, {{100, 200}, {300, 400}}, kTwoH100),
      // Half a T4 from 160, still running.
      Job(2, "bob", JobState::kRunning, 150, {{160, std::nullopt}}, kHalfT4),
      // Failed within the period after 10 s on half a T4.
      Job(3, "bob", JobState::kFailed, 200, {{210, 220}}, kHalfT4),
      // Ended before the period: not counted.
      Job(4, "alice", JobState::kSucceeded, 0, {{10, 20}}, kTwoH100),
      // Still queued, submitted inside: a job, no GPU time.
      Job(5, "alice", JobState::kQueued, 300, {}, ""),
  };
  AcctReport r = Account(jobs, Period(150, 350));
  EXPECT_EQ(r.total.jobs, 4);
  EXPECT_DOUBLE_EQ(r.total.whole_gpu_seconds, 2 * (50 + 50));
  EXPECT_DOUBLE_EQ(r.total.fractional_gpu_seconds, 0.5 * 190 + 0.5 * 10);
  EXPECT_EQ(r.total.failed, 1);
  EXPECT_EQ(r.total.succeeded, 0) << "job 1 ended after the period";
  EXPECT_EQ(r.total.running, 2) << "jobs 1 and 2 run at its end";
  ASSERT_EQ(r.by_user.size(), 2u);
  EXPECT_EQ(r.by_user[0].key, "alice") << "most GPU time first";
  EXPECT_DOUBLE_EQ(r.by_user[1].gpu_seconds, 100);
  EXPECT_EQ(r.by_group[0].key, "ml");
  ASSERT_EQ(r.by_model.size(), 2u);
  EXPECT_EQ(r.by_model[1].key, "T4");
  EXPECT_EQ(r.by_model[1].jobs, 2);
  // Waits of the starts inside the period: job 2 waited 10 s, job 3 10 s, job 1's second start
  // (re-queued at 200) 100 s.
  EXPECT_EQ(r.total.started, 3);
  EXPECT_DOUBLE_EQ(r.total.wait_seconds, 120);
  EXPECT_DOUBLE_EQ(r.total.max_wait_seconds, 100);
  nlohmann::json j = AcctJson(r);
  EXPECT_DOUBLE_EQ(j["total"]["gpu_hours"].get<double>(), (200 + 100) / 3600.0);
  EXPECT_EQ(j["by_model"][0]["key"], "H100");
}

}  // namespace
}  // namespace tessera::server
