// The server's upkeep: default and maximum runtimes, retention of ended jobs, their logs and
// stored environments.
#include "tessera/server/server_test_fixture.h"

namespace tessera::server::testing {
namespace {

using namespace ::testing;  // NOLINT: the fixture

// Slurm's DefaultTime and MaxTime: a job that asks for no runtime gets the default (stored, so
// that show says it, and the backfill knows when its GPUs come free); more than the maximum is
// refused naming the limit; the default stops a job as an asked runtime does.
TEST_F(ServerTest, ADefaultRuntimeBoundsJobsAndTheMaximumIsRefusedNamingTheLimit) {
  config_.default_runtime_s = 3600;
  config_.max_runtime_s = 7 * 86400;
  StartServer();
  const int64_t plain = Submit(1, 100000);
  EXPECT_EQ(Job(plain)["spec"]["max_runtime_s"], 3600);
  const int64_t asked = Submit(1, 100000, 0, {{"max_runtime_s", 7200}});
  EXPECT_EQ(Job(asked)["spec"]["max_runtime_s"], 7200) << "what the job asked, not the default";
  int status = 0;
  json refused = Call("POST", "/v1/jobs",
                      {{"command", {"sleep", "10"}}, {"max_runtime_s", 8 * 86400}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_THAT(refused.value("message", ""),
              HasSubstr("max_runtime_s: 8d is over this server's maximum of 7d "
                        "(limits.max_runtime"));
  Settle();
  ASSERT_EQ(State(plain), "running");
  Advance(3601);
  Settle();
  Advance(3);  // the fake job's 2 s from SIGTERM to its end
  Settle();
  EXPECT_NE(State(plain), "running") << "stopped at the default runtime";
  EXPECT_THAT(Job(plain).dump(), HasSubstr("max runtime")) << Job(plain).dump();
  EXPECT_EQ(State(asked), "running");
}

// Fair share is on by default: another user's one job goes before the rest of a big array as
// GPUs come free (off, it waited behind every task: 2 min 16 s behind 10,000 `true`s in the lab).
TEST_F(ServerTest, ByDefaultAnotherUsersJobGoesBeforeTheRestOfABigArray) {
  ASSERT_GT(ServerConfig{}.fair_share_half_life_s, 0) << "on by default";
  for (const bool fair : {true, false}) {
    fs::remove_all(dir_);
    config_.fair_share_half_life_s = fair ? ServerConfig{}.fair_share_half_life_s : 0;
    StartServer();
    Call("POST", "/v1/jobs",
         {{"command", {"sleep", "10"}}, {"array", "0-49"}, {"resources", {{"gpus", 1}}}});
    Settle();
    Advance(1);
    int status = 0;
    json theirs =
        Call("POST", "/v1/jobs", {{"command", {"sleep", "10"}}, {"resources", {{"gpus", 1}}}},
             &status, 65534);
    ASSERT_EQ(status, 201) << theirs.dump();
    Settle();
    Advance(10);  // the first two tasks end
    Settle();
    EXPECT_EQ(State(theirs["id"].get<int64_t>()), fair ? "running" : "queued")
        << (fair ? "on: at the first GPU that comes free" : "off: behind the array");
  }
}

// Ended jobs' logs go after retention.logs, their stored environments (the users' tokens) after
// retention.environments, the jobs themselves after retention.jobs - except one a waiting job
// depends on; running and queued jobs keep everything.
TEST_F(ServerTest, RetentionRemovesOldLogsEnvironmentsAndJobsButNothingStillNeeded) {
  config_.retention_env_s = 86400;
  config_.retention_logs_s = 2 * 86400;
  config_.retention_jobs_s = 10 * 86400;
  config_.default_runtime_s = 0;
  StartServer();
  const json secret = {{"env", {{"API_KEY", "s3cret"}}}};
  const int64_t old = Submit(1, 1, 0, secret);
  const int64_t needed = Submit(1, 1, 0, secret);
  const int64_t running = Submit(1, 100 * 86400, 0, secret);
  Settle();
  Advance(2);
  Settle();
  ASSERT_EQ(State(old), "succeeded");
  ASSERT_EQ(State(needed), "succeeded");
  ASSERT_EQ(State(running), "running");
  const int64_t waiting =
      Submit(0, 1, 0,
             {{"hold", true}, {"after", {"ok:" + std::to_string(needed)}}, {"env", {{"A", "b"}}}});
  auto log = [&](int64_t id, const std::string& suffix) {
    return config_.state_dir + "/logs/" + std::to_string(id) + suffix;
  };
  for (int64_t id : {old, needed, running}) {
    for (const char* suffix : {".out", ".err", ".1.out", ".1.err", ".2.out"})
      std::ofstream(log(id, suffix)) << "output\n";
  }
  EXPECT_EQ(Job(old)["spec"]["env"]["API_KEY"], "s3cret");
  // A day and a bit: environments of ended jobs go; logs stay.
  Advance(86400 + 3600);
  Settle();
  EXPECT_FALSE(Job(old)["spec"].contains("env")) << Job(old).dump();
  EXPECT_EQ(Job(running)["spec"]["env"]["API_KEY"], "s3cret") << "a running job keeps its own";
  EXPECT_EQ(Job(waiting)["spec"]["env"]["A"], "b");
  EXPECT_TRUE(fs::exists(log(old, ".out")));
  // Two days: the ended jobs' logs go, every task's; the running job's stay.
  Advance(86400 + 3600);
  Settle();
  for (const char* suffix : {".out", ".err", ".1.out", ".1.err", ".2.out"}) {
    EXPECT_FALSE(fs::exists(log(old, suffix))) << suffix;
    EXPECT_TRUE(fs::exists(log(running, suffix))) << suffix;
  }
  EXPECT_EQ(State(old), "succeeded") << "the record stays";
  // Ten days: the ended jobs go, but for the one the held job waits on.
  Advance(8 * 86400);
  Settle();
  int status = 0;
  Call("GET", "/v1/jobs/" + std::to_string(old), json(), &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(State(needed), "succeeded") << "a waiting job depends on it";
  EXPECT_EQ(State(running), "running");
  EXPECT_EQ(State(waiting), "queued");
  // Released, the dependency is met as before.
  Call("POST", "/v1/jobs/" + std::to_string(waiting) + "/release");
  Settle();
  Advance(2);
  Settle();
  EXPECT_EQ(State(waiting), "succeeded");
}

// An admin's purge now (tessera admin purge), with no retention configured: each kind by its own
// age, in pages (an array of 1,200 cancelled tasks is more than one), never what a waiting job
// names or what runs; others are refused, and bad requests say what is wrong.
TEST_F(ServerTest, AnAdminsPurgeRemovesNowWhatRetentionWouldAndOnlyThat) {
  config_.default_runtime_s = 0;
  StartServer();
  const json secret = {{"env", {{"API_KEY", "s3cret"}}}};
  const int64_t old = Submit(1, 1, 0, secret);
  const int64_t needed = Submit(1, 1, 0, secret);
  const int64_t running = Submit(1, 100 * 86400, 0, secret);
  const int64_t sweep = Submit(1, 1, 0, {{"array", "0-1199"}, {"hold", true}});
  Settle();
  Call("POST", "/v1/jobs/" + std::to_string(sweep) + "/cancel");
  Advance(2);
  Settle();
  ASSERT_EQ(State(old), "succeeded");
  ASSERT_EQ(State(needed), "succeeded");
  ASSERT_EQ(State(sweep), "cancelled");
  const int64_t waiting =
      Submit(0, 1, 0, {{"hold", true}, {"after", {"ok:" + std::to_string(needed)}}});
  Advance(2 * 86400);
  const int64_t recent = Submit(1, 1, 0, secret);
  Settle();
  Advance(2);
  Settle();
  ASSERT_EQ(State(recent), "succeeded");
  auto log = [&](int64_t id) { return config_.state_dir + "/logs/" + std::to_string(id) + ".out"; };
  for (int64_t id : {old, needed, running, recent}) std::ofstream(log(id)) << "output\n";

  int status = 0;
  const std::string purge = "/v1/admin/purge";
  // Refused: not an admin; nothing named; a bad age or field; a GET.
  Call("POST", purge, {{"jobs_s", 0}}, &status, 65534);
  EXPECT_EQ(status, 403);
  for (const json& bad : {json::object(), json{{"jobs_s", -1}}, json{{"jobs_s", "30d"}},
                          json{{"colour", 1}}, json::array()}) {
    const json e = Call("POST", purge, bad, &status);
    EXPECT_EQ(status, 400) << bad.dump() << " " << e.dump();
  }
  Call("GET", purge, nullptr, &status);
  EXPECT_EQ(status, 405);
  EXPECT_EQ(State(old), "succeeded") << "nothing refused removed anything";

  // Environments over a day old: the two that ended two days ago; the recent and running keep.
  json done = Call("POST", purge, {{"environments_s", 86400}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(done, (json{{"jobs", 0}, {"logs", 0}, {"environments", 2}}));
  EXPECT_FALSE(Job(old)["spec"].contains("env"));
  EXPECT_EQ(Job(recent)["spec"]["env"]["API_KEY"], "s3cret");
  EXPECT_EQ(Job(running)["spec"]["env"]["API_KEY"], "s3cret");
  // Logs over a day old: the old ones (the array's tasks too); the recent and running keep theirs.
  done = Call("POST", purge, {{"logs_s", 86400}}, &status);
  EXPECT_EQ(done["logs"], 2 + 1200) << done.dump();
  EXPECT_FALSE(fs::exists(log(old)));
  EXPECT_FALSE(fs::exists(log(needed)));
  EXPECT_TRUE(fs::exists(log(recent)));
  EXPECT_TRUE(fs::exists(log(running)));
  EXPECT_EQ(State(old), "succeeded") << "the record stays";
  // Jobs over a day old: all but the one the waiting job names, over two pages.
  done = Call("POST", purge, {{"jobs_s", 86400}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(done["jobs"], 1 + 1200) << done.dump();
  Call("GET", "/v1/jobs/" + std::to_string(old), json(), &status);
  EXPECT_EQ(status, 404);
  Call("GET", "/v1/jobs/" + std::to_string(sweep + 1199), json(), &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(State(needed), "succeeded") << "a waiting job depends on it";
  EXPECT_EQ(State(recent), "succeeded");
  EXPECT_EQ(State(running), "running");
  EXPECT_EQ(State(waiting), "queued");
  // Again: nothing left of that age.
  EXPECT_EQ(Call("POST", purge, {{"jobs_s", 86400}}, &status)["jobs"], 0);
}

}  // namespace
}  // namespace tessera::server::testing
