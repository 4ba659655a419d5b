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

// How busy and how full each user kept what they held, over the GPU-seconds of their measured
// jobs, each job weighed by its GPU-seconds (the figures `tessera eff` gives per job).
// An elastic job resized while it ran counts the GPUs it held at each time (its placement's
// sizes), inside the period only; its models by its last placement.
TEST(Acct, AnElasticJobCountsItsSizesOverTime) {
  const std::string resized =
      R"({"gpus":[{"index":0,"model":"H100"},{"index":1,"model":"H100"}],"milli_per_gpu":1000,)"
      R"("sizes":[{"at":100,"gpus":1},{"at":200,"gpus":4},{"at":300,"gpus":2}],"restarts":2})";
  // 1 GPU 100..200, 4 GPUs 200..300, 2 GPUs 300..400.
  std::vector<AcctJob> jobs = {Job(1, "alice", JobState::kSucceeded, 90, {{100, 400}}, resized)};
  AcctReport all = Account(jobs, Period(0, 1000));
  EXPECT_DOUBLE_EQ(all.total.gpu_seconds, 1 * 100 + 4 * 100 + 2 * 100);
  ASSERT_EQ(all.by_model.size(), 1u);
  EXPECT_EQ(all.by_model[0].key, "H100");
  EXPECT_DOUBLE_EQ(all.by_model[0].gpu_seconds, 700);
  // Inside [150, 350]: 1 GPU for 50 s, 4 for 100 s, 2 for 50 s.
  AcctReport part = Account(jobs, Period(150, 350));
  EXPECT_DOUBLE_EQ(part.total.gpu_seconds, 50 + 400 + 100);
  EXPECT_DOUBLE_EQ(part.total.whole_gpu_seconds, 550);
  // Still running at the period's end: its last size until then.
  jobs[0].state = JobState::kRunning;
  jobs[0].runs = {{100, std::nullopt}};
  jobs[0].ended_at.reset();
  EXPECT_DOUBLE_EQ(Account(jobs, Period(0, 500)).total.gpu_seconds, 100 + 400 + 2 * 200);
}

TEST(Acct, EfficiencyPerUserIsTheirMeasuredJobsWeighedByGpuTime) {
  std::vector<AcctJob> jobs = {
      // 2 whole GPUs for 100 s, 50% busy, 20,480 of 81,920 MiB at its peak: 200 GPU-s.
      Job(1, "alice", JobState::kSucceeded, 0, {{0, 100}}, kTwoH100),
      // 2 whole GPUs for 50 s, 80% busy, no memory figure: 100 GPU-s.
      Job(2, "alice", JobState::kSucceeded, 0, {{0, 50}}, kTwoH100),
      // Never measured (no usage): GPU time counted, not in the efficiency.
      Job(3, "alice", JobState::kFailed, 0, {{0, 100}}, kTwoH100),
      // A quarter of a T4's compute, its part of the T4 busy 20% of the time (5% of the GPU), and
      // 4,000 of its 8,000 MiB: as a whole T4 half of it (memory), for 100 s: 50 GPU-s.
      Job(4, "bob", JobState::kSucceeded, 0, {{0, 100}}, kHalfT4),
  };
  jobs[0].usage_json = R"({"gpu_utilization_pct": 50, "gpu_peak_memory_mib": 20480})";
  jobs[1].usage_json = R"({"gpu_utilization_pct": 80})";
  jobs[3].usage_json = R"({"gpu_utilization_pct": 5, "gpu_peak_memory_mib": 4000})";
  AcctReport r = Account(jobs, Period(0, 1000));
  ASSERT_EQ(r.by_user.size(), 2u);
  const AcctLine& alice = r.by_user[0];
  EXPECT_DOUBLE_EQ(alice.gpu_seconds, 500);
  EXPECT_DOUBLE_EQ(alice.measured_gpu_seconds, 300);
  EXPECT_DOUBLE_EQ(alice.busy_gpu_seconds, 0.5 * 200 + 0.8 * 100);
  EXPECT_DOUBLE_EQ(alice.memory_measured_gpu_seconds, 200);
  EXPECT_DOUBLE_EQ(alice.memory_used_gpu_seconds, 0.25 * 200);
  const AcctLine& bob = r.by_user[1];
  EXPECT_DOUBLE_EQ(bob.busy_gpu_seconds, 0.2 * 50);
  nlohmann::json j = AcctJson(r);
  EXPECT_EQ(j["by_user"][0]["gpu_busy_pct"], 60.0);  // 180 of 300
  EXPECT_EQ(j["by_user"][0]["gpu_memory_used_pct"], 25.0);
  EXPECT_EQ(j["by_user"][1]["gpu_busy_pct"], 20.0);
  EXPECT_EQ(j["by_user"][1]["gpu_memory_used_pct"], 50.0);
  EXPECT_DOUBLE_EQ(j["total"]["gpu_busy_pct"].get<double>(), 54.3);  // 190 of 350
  // A user with nothing measured has no figure, not 0%.
  AcctReport none =
      Account({Job(5, "carol", JobState::kSucceeded, 0, {{0, 10}}, kTwoH100)}, Period(0, 1000));
  EXPECT_TRUE(AcctJson(none)["by_user"][0]["gpu_busy_pct"].is_null());
}

// The jobs that left the most of what they held idle inside the period, most first: what to look
// at first. Unmeasured jobs and jobs that kept all they held busy are not in it.
TEST(Acct, TheJobsThatLeftTheMostGpuTimeIdleComeFirst) {
  std::vector<AcctJob> jobs = {
      // 200 GPU-s, 50% busy: 100 idle.
      Job(1, "alice", JobState::kSucceeded, 0, {{0, 100}}, kTwoH100),
      // 100 GPU-s, 80% busy: 20 idle.
      Job(2, "alice", JobState::kSucceeded, 0, {{0, 50}}, kTwoH100),
      // Not measured.
      Job(3, "alice", JobState::kFailed, 0, {{0, 100}}, kTwoH100),
      // Half a T4 for 100 s (50 GPU-s), its share 20% busy: 40 idle.
      Job(4, "bob", JobState::kSucceeded, 0, {{0, 100}}, kHalfT4),
      // All it held busy: nothing idle.
      Job(5, "bob", JobState::kSucceeded, 0, {{0, 100}}, kTwoH100),
  };
  jobs[0].usage_json = R"({"gpu_utilization_pct": 50})";
  jobs[1].usage_json = R"({"gpu_utilization_pct": 80})";
  jobs[3].usage_json = R"({"gpu_utilization_pct": 5})";
  jobs[4].usage_json = R"({"gpu_utilization_pct": 100})";
  jobs[0].name = "train";
  AcctReport r = Account(jobs, Period(0, 1000));
  ASSERT_EQ(r.most_idle.size(), 3u);
  EXPECT_EQ(r.most_idle[0].id, 1);
  EXPECT_EQ(r.most_idle[0].name, "train");
  EXPECT_DOUBLE_EQ(r.most_idle[0].gpu_seconds, 200);
  EXPECT_DOUBLE_EQ(r.most_idle[0].idle_gpu_seconds, 100);
  EXPECT_EQ(r.most_idle[1].id, 4);
  EXPECT_DOUBLE_EQ(r.most_idle[1].idle_gpu_seconds, 0.8 * 50);
  EXPECT_EQ(r.most_idle[2].id, 2);
  EXPECT_DOUBLE_EQ(r.most_idle[2].idle_gpu_seconds, 0.2 * 100);
  // Inside the period only: the first 25 s of each.
  AcctReport part = Account(jobs, Period(0, 25));
  ASSERT_EQ(part.most_idle.size(), 3u);
  EXPECT_DOUBLE_EQ(part.most_idle[0].idle_gpu_seconds, 0.5 * 2 * 25);
  nlohmann::json j = AcctJson(r);
  ASSERT_EQ(j["most_idle"].size(), 3u);
  EXPECT_EQ(j["most_idle"][0]["owner"], "alice");
  EXPECT_DOUBLE_EQ(j["most_idle"][0]["idle_gpu_hours"].get<double>(), 100 / 3600.0);
  EXPECT_DOUBLE_EQ(j["most_idle"][0]["gpu_hours"].get<double>(), 200 / 3600.0);
  EXPECT_EQ(j["most_idle"][1]["gpu_busy_pct"], 20.0);
  // At most kMostIdle, ties the older job first.
  std::vector<AcctJob> many;
  for (int i = 1; i <= 12; ++i) {
    many.push_back(Job(i, "carol", JobState::kSucceeded, 0, {{0, 10}}, kTwoH100));
    many.back().usage_json =
        i == 12 ? R"({"gpu_utilization_pct": 10})" : R"({"gpu_utilization_pct": 50})";
  }
  AcctReport capped = Account(many, Period(0, 1000));
  ASSERT_EQ(capped.most_idle.size(), kMostIdle);
  EXPECT_EQ(capped.most_idle[0].id, 12) << "the idlest";
  for (size_t i = 1; i < kMostIdle; ++i) EXPECT_EQ(capped.most_idle[i].id, static_cast<int64_t>(i));
}

}  // namespace
}  // namespace tessera::server
