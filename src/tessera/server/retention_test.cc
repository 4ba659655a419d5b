// Retention alone (retention.h): a store in a temporary folder with jobs that ended at known
// times and their log files; each kind goes at its own age, never what `keep` names, in pages.
#include "tessera/server/retention.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "nlohmann/json.hpp"
#include "tessera/server/running_jobs.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kDay = 86400;

class RetentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-retention-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const char* sub : {"/logs", "/exit"}) fs::create_directories(dir_ + sub);
    auto store = Store::Open(dir_ + "/tessera.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A job with an environment that ended (succeeded) at `ended`, with logs of two tasks.
  int64_t Ended(double ended) {
    JobRecord r;
    r.owner = "alice";
    r.owner_uid = 1000;
    r.spec_json = json{{"command", {"train"}}, {"env", {{"API_KEY", "s3cret"}}}}.dump();
    auto id = store_->Insert(r, ended - 10);
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE(store_->Transition(*id, JobState::kRunning, "placed", ended - 5).ok());
    TransitionFields f;
    f.ended_at = ended;
    f.exit_code = 0;
    EXPECT_TRUE(store_->Transition(*id, JobState::kSucceeded, "exit code 0", ended, f).ok());
    for (const std::string& p :
         {JobFilePath(dir_, "logs", *id, ".out"), JobFilePath(dir_, "logs", *id, ".err"),
          TaskLogPath(dir_, *id, 1, ".out"), TaskLogPath(dir_, *id, 2, ".err")})
      std::ofstream(p) << "output\n";
    return *id;
  }
  bool Exists(int64_t id) { return store_->Get(id).ok(); }
  bool HasEnv(int64_t id) {
    auto r = store_->Get(id);
    return r.ok() && json::parse(r->spec_json).contains("env");
  }
  bool Logs(int64_t id) {
    return fs::exists(JobFilePath(dir_, "logs", id, ".out")) ||
           fs::exists(TaskLogPath(dir_, id, 1, ".out")) ||
           fs::exists(TaskLogPath(dir_, id, 2, ".err"));
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
};

// Environments after a day, logs (every task's) after two, jobs after ten - but for the one kept.
TEST_F(RetentionTest, EachKindGoesAtItsOwnAgeButNeverWhatIsKept) {
  const double now = 100 * kDay;
  const int64_t week_old = Ended(now - 7 * kDay), old = Ended(now - 30 * kDay),
                needed = Ended(now - 30 * kDay), fresh = Ended(now - 3600);
  Retention r(*store_, dir_, PurgeAges{10 * kDay, 2 * kDay, 1 * kDay});
  EXPECT_TRUE(r.Due(now)) << "at start";
  r.Apply(now, /*keep=*/{needed});
  EXPECT_FALSE(Exists(old));
  EXPECT_FALSE(Logs(old));
  EXPECT_TRUE(Exists(needed)) << "a waiting job depends on it";
  EXPECT_TRUE(Exists(week_old));
  EXPECT_FALSE(Logs(week_old));
  EXPECT_FALSE(HasEnv(week_old));
  EXPECT_TRUE(Exists(fresh));
  EXPECT_TRUE(Logs(fresh));
  EXPECT_TRUE(HasEnv(fresh));
  EXPECT_FALSE(r.Due(now + 3599)) << "a page not full: the next in an hour";
  EXPECT_TRUE(r.Due(now + 3600));
}

// Only the kinds asked: a purge of logs alone leaves every record and environment.
TEST_F(RetentionTest, APageOfOneKindLeavesTheOthers) {
  const double now = 100 * kDay;
  const int64_t old = Ended(now - 30 * kDay);
  Retention r(*store_, dir_, PurgeAges{});
  Store::Ended from;
  auto p = r.PurgePage(PurgeAges{.logs_s = kDay}, now, {}, &from, "purge");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->logs, 1);
  EXPECT_EQ(p->jobs, 0);
  EXPECT_EQ(p->environments, 0);
  EXPECT_FALSE(p->more);
  EXPECT_EQ(from.id, old) << "the next page starts past it";
  EXPECT_TRUE(Exists(old));
  EXPECT_TRUE(HasEnv(old));
  EXPECT_FALSE(Logs(old));
}

// An array of kBatch + 1 cancelled tasks is two pages: the first full (more; due again in a
// second), the second takes the rest (due in an hour).
TEST_F(RetentionTest, AFullPageIsFollowedByTheNextTurn) {
  const double now = 100 * kDay;
  JobRecord rec;
  rec.owner = "alice";
  rec.owner_uid = 1000;
  rec.spec_json = json{{"command", {"sweep"}}}.dump();
  std::vector<int> indices(Retention::kBatch + 1);
  std::iota(indices.begin(), indices.end(), 0);
  auto first = store_->InsertArray(rec, indices, now - 30 * kDay);
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<int64_t> ids(indices.size());
  std::iota(ids.begin(), ids.end(), *first);
  ASSERT_TRUE(store_->TransitionMany(ids, JobState::kCancelled, "by alice", now - 30 * kDay).ok());
  Retention r(*store_, dir_, PurgeAges{.logs_s = kDay});
  r.Apply(now, {});
  EXPECT_TRUE(r.Due(now + 1)) << "a full page: more at the next turn";
  r.Apply(now + 1, {});
  EXPECT_FALSE(r.Due(now + 2));
  Store::Ended from;
  auto p = r.PurgePage(PurgeAges{.logs_s = kDay}, now + 2, {}, &from, "purge");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->logs, static_cast<int64_t>(Retention::kBatch)) << "a purge starts from the oldest";
  EXPECT_TRUE(p->more);
}

}  // namespace
}  // namespace tessera::server
