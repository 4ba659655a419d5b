#include "tessera/slurm/node.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"
#include "tessera/slurm/step.h"

namespace tessera::slurm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SlurmNode : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("slurm-node-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "lib.so") << "";
    auto c = ParsePluginArgs({"library=" + (dir_ / "lib.so").string(), "shards_per_gpu=4",
                              "gpu_memory=8GiB", "state_dir=" + (dir_ / "state").string()});
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A job's labels on the page: the server's names, its user among them (this test's).
  static std::string Labels(uint32_t job, int gpu) {
    const passwd* pw = getpwuid(getuid());
    const std::string user = pw != nullptr ? pw->pw_name : "uid:" + std::to_string(getuid());
    return "{job_id=\"slurm-" + std::to_string(job) + "\",slurm_job_id=\"" + std::to_string(job) +
           "\",user=\"" + user + "\",gpu=\"" + std::to_string(gpu) + "\",hostname=\"node7\"}";
  }
  fs::path dir_;
  PluginConfig config_;
};

TEST_F(SlurmNode, RunningJobsAreMetricsWithTheSlurmJobId) {
  auto limits = DecideLimits(config_, {.gpus = "1", .shards = "1"});
  ASSERT_TRUE(limits.ok());
  ASSERT_TRUE(SetUpStep(config_, 31, getuid(), getgid(), *limits, "", 100).ok());
  auto whole = DecideLimits(config_, {.gpus = "0"});
  ASSERT_TRUE(SetUpStep(config_, 32, getuid(), getgid(), *whole, "", 100).ok());
  {
    const uint64_t l[] = {uint64_t{2} << 30};
    char err[256] = "";
    std::unique_ptr<shim::Region> r(shim::Region::Attach(
        (config_.state_dir + "/regions/31.region").c_str(), l, 1, err, sizeof err));
    ASSERT_NE(r, nullptr) << err;
    ASSERT_TRUE(r->Reserve(0, 512 << 20));
    std::unique_ptr<shim::Arbiter> a(
        shim::Arbiter::Attach((config_.state_dir + "/arbiter/gpu.arbiter").c_str(),
                              shim::ArbiterJobKey("slurm-31"), {}, err, sizeof err));
    ASSERT_NE(a, nullptr) << err;
    a->data()->gpus[1].jobs[a->Slot(1)].busy_us.store(2'500'000);
    const std::string page = NodeMetrics(config_.state_dir, "node7");
    const std::string job31 = Labels(31, 1);
    const std::string job32 = Labels(32, 0);
    EXPECT_THAT(page, HasSubstr("tessera_job_gpu_share_ratio" + job31 + " 0.25\n"));
    EXPECT_THAT(page, HasSubstr("tessera_job_gpu_share_ratio" + job32 + " 1\n"));
    EXPECT_THAT(page, HasSubstr("tessera_job_gpu_memory_limit_bytes" + job31 + " 2147483648\n"));
    EXPECT_THAT(page, HasSubstr("tessera_job_gpu_memory_used_bytes" + job31 + " 536870912\n"));
    EXPECT_THAT(page, HasSubstr("tessera_job_gpu_busy_seconds_total" + job31 + " 2.5\n"));
    EXPECT_THAT(page, HasSubstr("tessera_job_usage_readable" + job31 + " 1\n"));
    EXPECT_THAT(page, ::testing::Not(HasSubstr("tessera_job_gpu_memory_limit_bytes" + job32)))
        << "a whole GPU has no limit";
  }
  // A job that truncates its region: no memory sample, marked unreadable.
  ASSERT_EQ(truncate((config_.state_dir + "/regions/31.region").c_str(), 10), 0);
  const std::string page = NodeMetrics(config_.state_dir, "node7");
  const std::string job31 = Labels(31, 1);
  EXPECT_THAT(page, HasSubstr("tessera_job_usage_readable" + job31 + " 0\n"));
  EXPECT_THAT(page,
              ::testing::Not(HasSubstr(R"(tessera_job_gpu_memory_used_bytes{job_id="slurm-31")")));
  // Ended: gone from the page, in the accounting.
  ASSERT_TRUE(EndJob(config_, 31, 110).ok());
  ASSERT_TRUE(EndJob(config_, 32, 120).ok());
  EXPECT_THAT(NodeMetrics(config_.state_dir, "node7"), ::testing::Not(HasSubstr("slurm-3")));
  auto all = ReadAccounting(config_.state_dir, {});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0]["job_id"], 31);
  EXPECT_EQ((*all)[1]["job_id"], 32);
  auto one = ReadAccounting(config_.state_dir, {32});
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  auto missing = ReadAccounting(config_.state_dir, {33});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("job 33: no accounting in"));
  std::ofstream(config_.state_dir + "/acct/40.json") << "{not json";
  auto bad = ReadAccounting(config_.state_dir, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("40.json: not an accounting record"));
  auto nowhere = ReadAccounting((dir_ / "elsewhere").string(), {});
  ASSERT_FALSE(nowhere.ok());
  EXPECT_THAT(std::string(nowhere.status().message()), HasSubstr("no such folder"));
}

// The node's totals of ended jobs per user (the exporter's counters): each job counted once, at
// its epilog; a share's GPU-seconds weighed by its share, its busy time at most what it held;
// they never go down when a record is removed or its id given again, and a totals file that is
// not one is set aside and counted anew, said.
TEST_F(SlurmNode, EndedJobsAreCountedOncePerUserAndTheCountersNeverGoDown) {
  auto share = DecideLimits(config_, {.gpus = "1", .shards = "1"});  // 25%, 2 GiB
  auto whole = DecideLimits(config_, {.gpus = "0"});
  ASSERT_TRUE(share.ok() && whole.ok());
  const std::string region = config_.state_dir + "/regions/31.region";
  // Job 31's use: `busy_s` of GPU time, and an allocation past its limit when `refuse`.
  auto use = [&](uint64_t busy_s, bool refuse) {
    char err[256] = "";
    const uint64_t l[] = {uint64_t{2} << 30};
    std::unique_ptr<shim::Region> r(shim::Region::Attach(region.c_str(), l, 1, err, sizeof err));
    ASSERT_NE(r, nullptr) << err;
    if (refuse) {
      ASSERT_FALSE(r->Reserve(0, uint64_t{3} << 30));
    }
    std::unique_ptr<shim::Arbiter> a(
        shim::Arbiter::Attach((config_.state_dir + "/arbiter/gpu.arbiter").c_str(),
                              shim::ArbiterJobKey("slurm-31"), {}, err, sizeof err));
    ASSERT_NE(a, nullptr) << err;
    a->data()->gpus[1].jobs[a->Slot(1)].busy_us.store(busy_s * 1'000'000);
  };
  ASSERT_TRUE(SetUpStep(config_, 31, getuid(), getgid(), *share, "", 1000).ok());
  ASSERT_TRUE(SetUpStep(config_, 32, getuid(), getgid(), *whole, "", 1000).ok());
  use(6, true);  // 6 s busy of the 25 GPU-seconds a quarter held over 100 s
  ASSERT_TRUE(EndJob(config_, 31, 1100).ok());
  ASSERT_TRUE(EndJob(config_, 32, 1200).ok());
  NodeTotals t = ReadTotals(config_.state_dir);
  EXPECT_EQ(t.unreadable, "");
  ASSERT_EQ(t.users.count(getuid()), 1u);
  EXPECT_EQ(t.users[getuid()].jobs, 2u);
  EXPECT_DOUBLE_EQ(t.users[getuid()].fractional_gpu_seconds, 25);
  EXPECT_DOUBLE_EQ(t.users[getuid()].whole_gpu_seconds, 200);
  EXPECT_DOUBLE_EQ(t.users[getuid()].measured_gpu_seconds, 25) << "a whole GPU is not measured";
  EXPECT_DOUBLE_EQ(t.users[getuid()].busy_gpu_seconds, 6);
  EXPECT_EQ(t.users[getuid()].memory_refused_jobs, 1u);
  struct stat st;
  ASSERT_EQ(stat((config_.state_dir + "/totals.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  // The exporter's page: the same, per user and node.
  const passwd* pw = getpwuid(getuid());
  const std::string user =
      "{user=\"" + std::string(pw != nullptr ? pw->pw_name : "uid:" + std::to_string(getuid())) +
      "\",hostname=\"node7\"";
  std::string page = NodeMetrics(config_.state_dir, "node7");
  EXPECT_THAT(page, HasSubstr("tessera_slurm_acct_jobs_ended_total" + user + "} 2\n"));
  EXPECT_THAT(page,
              HasSubstr("tessera_slurm_acct_gpu_seconds_total" + user + ",kind=\"whole\"} 200\n"));
  EXPECT_THAT(page, HasSubstr("tessera_slurm_acct_gpu_seconds_total" + user +
                              ",kind=\"fractional\"} 25\n"));
  EXPECT_THAT(page, HasSubstr("tessera_slurm_acct_measured_gpu_seconds_total" + user + "} 25\n"));
  EXPECT_THAT(page, HasSubstr("tessera_slurm_acct_busy_gpu_seconds_total" + user + "} 6\n"));
  EXPECT_THAT(page, HasSubstr("tessera_slurm_acct_gpu_memory_refused_jobs_total" + user + "} 1\n"));
  EXPECT_THAT(page, HasSubstr("tessera_slurm_acct_totals_readable{hostname=\"node7\"} 1\n"));

  // A second epilog of 31 counts nothing; its record removed by an admin and its id given again
  // (100 s of GPU time over 300 s on a quarter: it used idle time past its share, counted as the
  // 75 GPU-seconds it held) add, never lower.
  ASSERT_EQ(*EndJob(config_, 31, 1300), "");
  ASSERT_TRUE(fs::remove(config_.state_dir + "/acct/31.json"));
  ASSERT_TRUE(SetUpStep(config_, 31, getuid(), getgid(), *share, "", 2000).ok());
  use(100, false);
  ASSERT_TRUE(EndJob(config_, 31, 2300).ok());
  t = ReadTotals(config_.state_dir);
  EXPECT_EQ(t.users[getuid()].jobs, 3u);
  EXPECT_DOUBLE_EQ(t.users[getuid()].fractional_gpu_seconds, 100);
  EXPECT_DOUBLE_EQ(t.users[getuid()].measured_gpu_seconds, 100);
  EXPECT_DOUBLE_EQ(t.users[getuid()].busy_gpu_seconds, 81);
  EXPECT_EQ(t.users[getuid()].memory_refused_jobs, 1u);

  // A totals file that is not one: read as none, said on the page; the next epilog accounts its
  // job, sets the file aside and counts anew, and says so.
  std::ofstream(config_.state_dir + "/totals.json", std::ios::trunc) << R"({"users": [1]})";
  t = ReadTotals(config_.state_dir);
  EXPECT_THAT(t.unreadable, HasSubstr("totals.json: not the plugin's totals"));
  EXPECT_TRUE(t.users.empty());
  page = NodeMetrics(config_.state_dir, "node7");
  EXPECT_THAT(page, HasSubstr("tessera_slurm_acct_totals_readable{hostname=\"node7\"} 0\n"));
  EXPECT_THAT(page, ::testing::Not(HasSubstr("tessera_slurm_acct_jobs_ended_total{")));
  ASSERT_TRUE(SetUpStep(config_, 33, getuid(), getgid(), *whole, "", 3000).ok());
  nlohmann::json record;
  auto said = EndJob(config_, 33, 3050, std::nullopt, &record);
  ASSERT_FALSE(said.ok());
  EXPECT_EQ(record.value("job_id", 0u), 33u)
      << "the record as built, for the epilog's AdminComment";
  EXPECT_THAT(std::string(said.status().message()), HasSubstr("set aside as " + config_.state_dir +
                                                              "/totals.json.unreadable.3050, "
                                                              "counted anew from this job"));
  EXPECT_TRUE(fs::exists(config_.state_dir + "/acct/33.json")) << "its job accounted still";
  EXPECT_TRUE(fs::exists(config_.state_dir + "/totals.json.unreadable.3050"));
  t = ReadTotals(config_.state_dir);
  EXPECT_EQ(t.unreadable, "");
  EXPECT_EQ(t.users[getuid()].jobs, 1u);
  EXPECT_DOUBLE_EQ(t.users[getuid()].whole_gpu_seconds, 50);
}

// After a reboot with leftovers (slurmd never ran the epilog of jobs that were running): their
// records are not running jobs - left out of the page and counted - and the next job Slurm gives
// one of their ids, even the same user's, never meets their files.
TEST_F(SlurmNode, AJobFromBeforeTheBootIsNotRunningAndItsIdStartsClean) {
  auto limits = DecideLimits(config_, {.gpus = "1", .shards = "2"});
  ASSERT_TRUE(limits.ok());
  // Set up at 100; the node then boots at 1000.
  ASSERT_TRUE(SetUpStep(config_, 41, getuid(), getgid(), *limits, "", 100).ok());
  ASSERT_TRUE(SetUpStep(config_, 42, getuid(), getgid(), *limits, "", 100).ok());
  EXPECT_THAT(NodeMetrics(config_.state_dir, "node7", 50), HasSubstr(Labels(41, 1)))
      << "booted before it: running";
  const std::string page = NodeMetrics(config_.state_dir, "node7", 1000);
  EXPECT_THAT(page, ::testing::Not(HasSubstr("slurm-41")));
  EXPECT_THAT(page, HasSubstr("tessera_slurm_stale_job_records{hostname=\"node7\"} 2\n"));
  // Slurm gives 41 again, to the same user, after the boot: set aside, said, a new region.
  std::ofstream(config_.state_dir + "/regions/41.region", std::ios::app) << "earlier job's bytes";
  auto env = SetUpStep(config_, 41, getuid(), getgid(), *limits, "", 1100, 1000);
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_EQ(env->notes.size(), 1u);
  EXPECT_THAT(env->notes[0], HasSubstr("a record of an earlier job 41"));
  EXPECT_FALSE(fs::is_empty(config_.state_dir + "/stale"));
  auto jobs = NodeJobs(config_.state_dir);
  EXPECT_EQ(jobs.at(41).started, 1100);
  EXPECT_THAT(NodeMetrics(config_.state_dir, "node7", 1000), HasSubstr(Labels(41, 1)));
  EXPECT_THAT(NodeMetrics(config_.state_dir, "node7", 1000),
              HasSubstr("tessera_slurm_stale_job_records{hostname=\"node7\"} 1\n"));
  // A later step of the new job (same id, same boot) reuses its files.
  env = SetUpStep(config_, 41, getuid(), getgid(), *limits, "", 1200, 1000);
  ASSERT_TRUE(env.ok());
  EXPECT_TRUE(env->notes.empty());
  EXPECT_EQ(NodeJobs(config_.state_dir).at(41).started, 1100);
  EXPECT_GT(BootTime(), 0) << "this machine's /proc/stat says when it booted";
}

}  // namespace
}  // namespace tessera::slurm
