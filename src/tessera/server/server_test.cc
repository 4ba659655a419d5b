// The server on a fake clock with a fake launcher: queue order, preemption, requeue, rights, stop
// escalation, limits, quotas, arrays, dependencies and holds, each driven turn by turn (RunOnce)
// with no sleep. History, restarts, views and health: server_state_test.cc.
#include "tessera/server/server_test_fixture.h"

namespace tessera::server {
namespace {

using namespace testing;  // NOLINT: the fixture

TEST_F(ServerTest, QueueOrderIsPriorityThenSubmitTime) {
  StartServer();
  int64_t a = Submit(2, 10, 0, {{"preemptible", false}});
  Settle();
  Advance(1);
  int64_t early = Submit(2, 5, 0);
  Advance(1);
  int64_t urgent = Submit(2, 5, 5);
  Advance(1);
  int64_t late = Submit(2, 5, 0);
  Settle();
  EXPECT_EQ(State(a), "running");
  EXPECT_THAT(Job(early).value("waiting", ""), HasSubstr("no node fits"));
  Advance(7);  // a ends at 10 s
  Settle();
  EXPECT_EQ(State(a), "succeeded");
  EXPECT_EQ(State(urgent), "running") << "priority first";
  Advance(5);
  Settle();
  EXPECT_EQ(State(early), "running") << "then the earlier submission";
  EXPECT_EQ(State(late), "queued");
  EXPECT_THAT(StartedJobs(), ::testing::ElementsAre(a, urgent, early));
}

TEST_F(ServerTest, PreemptionSendsSigtermWaitsForTheVictimAndRequeuesIt) {
  StartServer();
  int64_t low = Submit(2, 100);
  Settle();
  int64_t high = Submit(2, 10, 10);
  Settle();
  ASSERT_EQ(launcher_.signals().size(), 1u);
  EXPECT_EQ(launcher_.signals()[0].second, SIGTERM);
  EXPECT_THAT(Job(high).value("waiting", ""), HasSubstr("waiting for 1 preempted job(s) to stop"));
  EXPECT_EQ(State(low), "running") << "the victim holds its GPUs until it has stopped";
  Advance(2);  // the fake job's stop latency
  Settle();
  EXPECT_EQ(State(high), "running");
  json victim = Job(low);
  EXPECT_EQ(victim["state"], "queued") << "re-queued";
  std::string events = victim["events"].dump();
  EXPECT_THAT(events, HasSubstr("preempted for job " + std::to_string(high) + " (priority 10)"));
  Advance(10);
  Settle();
  EXPECT_EQ(State(low), "running") << "it starts again when the GPUs are free";
}

// Slurm's --requeue / --no-requeue: a job's own word over the server's preemption.requeue, on
// preemption and across a restart that finds it preempted.
TEST_F(ServerTest, AJobsOwnRequeueChoiceOverridesTheServers) {
  StartServer();  // preemption.requeue: true (the default)
  int64_t stays_out = Submit(2, 100, 0, {{"requeue", false}});
  Settle();
  int64_t high = Submit(2, 10, 10);
  Settle();
  Advance(2);  // the victim's stop latency
  Settle();
  EXPECT_EQ(State(high), "running");
  json victim = Job(stays_out);
  EXPECT_EQ(victim["state"], "preempted") << "--no-requeue: it ends preempted";
  EXPECT_EQ(victim["spec"]["requeue"], false);
  Advance(10);
  Settle();
  EXPECT_EQ(State(stays_out), "preempted") << "and does not start again when the GPUs are free";

  config_.requeue_preempted = false;
  StartServer();
  int64_t comes_back = Submit(2, 100, 0, {{"requeue", true}});
  int64_t plain = Submit(2, 100, 0);
  Settle();
  int64_t urgent = Submit(2, 10, 10);
  Settle();
  Advance(2);
  Settle();
  EXPECT_EQ(State(urgent), "running");
  EXPECT_EQ(State(comes_back), "queued") << "--requeue over the server's 'no'";
  EXPECT_EQ(State(plain), "queued") << "never started: nothing to requeue";
  Advance(10);
  Settle();
  EXPECT_EQ(State(comes_back), "running");
  EXPECT_EQ(State(stays_out), "preempted") << "a restart leaves a --no-requeue job ended";
}

TEST_F(ServerTest, ApiAnswersWhileAJobIsBeingLaunchedAndACancelThenTakes) {
  StartServer();
  launcher_.HoldStarts();  // the launch hangs, as a slow fork/exec would
  int64_t id = Submit(1, 100, 0, {{"max_runtime_s", 200}});
  std::thread loop([&] { server_->RunOnce(); });
  ASSERT_TRUE(launcher_.WaitForHeldStart(10));
  // The loop is inside the launch: reads, submissions and a cancel are answered all the same.
  int status = 0;
  Call("GET", "/v1/info", nullptr, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(State(id), "running") << "marked running just before its launch";
  EXPECT_TRUE(Job(id)["pid"].is_null()) << "no process yet";
  // What is expected of it is said already (it was left out while the launch went on).
  const json starting = Job(id);
  EXPECT_EQ(starting.value("prediction", ""), "its max runtime") << starting.dump();
  EXPECT_EQ(starting.value("expected_duration_s", 0.0), 200) << starting.dump();
  int64_t other = Submit(1, 5);
  Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel", nullptr, &status);
  EXPECT_EQ(status, 200);
  launcher_.ReleaseStarts();
  loop.join();
  // The cancel reached the process as soon as it existed.
  ASSERT_EQ(launcher_.signals().size(), 1u);
  EXPECT_EQ(launcher_.signals()[0].second, SIGTERM);
  Advance(2);
  Settle();
  EXPECT_EQ(State(id), "cancelled");
  EXPECT_EQ(State(other), "running");
}

TEST_F(ServerTest, ReadsAndTheLoopGoOnWhileACancelHoldOrPriorityIsBeingStored) {
  StartServer();
  Submit(2, 100);
  Settle();
  struct Change {
    std::string path;
    json body;
    std::function<void(const json&)> check;  // the job after
  };
  const std::vector<Change> changes = {
      {"/priority", {{"priority", 7}}, [](const json& j) { EXPECT_EQ(j["priority"], 7); }},
      {"/hold", nullptr, [](const json& j) { EXPECT_EQ(j["held"], true) << j.dump(); }},
      {"/cancel", nullptr, [](const json& j) { EXPECT_EQ(j["state"], "cancelled"); }},
  };
  const int64_t queued = Submit(2, 100);  // no room: waits
  Settle();
  for (const Change& c : changes) {
    SCOPED_TRACE(c.path);
    // Another connection holds the database's write lock: the change's transaction waits for it.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((config_.state_dir + "/tessera.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
    int status = 0;
    std::thread change(
        [&] { Call("POST", "/v1/jobs/" + std::to_string(queued) + c.path, c.body, &status); });
    // Meanwhile the API answers (it needs the server's lock) and says why the job is not
    // considered; a turn of the loop runs.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
    std::string waiting;
    while (std::chrono::steady_clock::now() < deadline &&
           (waiting = Job(queued).value("waiting", "")).find("being stored") == std::string::npos) {
      std::this_thread::yield();
    }
    EXPECT_THAT(waiting, HasSubstr("being stored"));
    Settle();
    EXPECT_EQ(State(queued), "queued");
    ASSERT_EQ(sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
    change.join();
    EXPECT_EQ(status, 200);
    c.check(Job(queued));
  }
}

TEST_F(ServerTest, OthersSeeAJobButNotItsEnvironmentWorkdirOrLogs) {
  StartServer();
  int64_t id = Submit(1, 100, 0, {{"env", {{"HF_TOKEN", "secret"}}}, {"workdir", "/tmp"}});
  Settle();
  auto as = [&](uid_t uid, const std::string& path, int* status) {
    net::HttpRequest r;
    r.method = "GET";
    r.path = r.target = path;
    r.peer.unix_socket = true;
    r.peer.uid = uid;
    net::HttpResponse out = server_->Handle(r);
    *status = out.status;
    return json::parse(out.body, nullptr, false);
  };
  const uid_t stranger = 65534;  // nobody: neither the owner, root nor the server's user here
  ASSERT_NE(stranger, geteuid());
  int status = 0;
  json theirs = as(stranger, "/v1/jobs/" + std::to_string(id), &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(theirs["state"], "running") << "the job itself is no secret";
  EXPECT_FALSE(theirs["spec"].contains("env"));
  EXPECT_FALSE(theirs["spec"].contains("workdir"));
  EXPECT_THAT(theirs.dump(), ::testing::Not(HasSubstr("secret")));
  json list = as(stranger, "/v1/jobs", &status);
  EXPECT_THAT(list.dump(), ::testing::Not(HasSubstr("secret")));
  json logs = as(stranger, "/v1/jobs/" + std::to_string(id) + "/logs", &status);
  EXPECT_EQ(status, 403);
  EXPECT_THAT(logs.value("message", ""), HasSubstr("shown to its owner and admins only"));
  // The owner sees everything.
  json mine = Job(id);
  EXPECT_EQ(mine["spec"]["env"]["HF_TOKEN"], "secret");
  EXPECT_EQ(mine["spec"]["workdir"], "/tmp");
  Call("GET", "/v1/jobs/" + std::to_string(id) + "/logs", nullptr, &status);
  EXPECT_EQ(status, 200);
}

// A submission as another local user (the kernel's peer credentials, set by hand here).
json SubmitAs(Server& server, uid_t uid, const json& spec, int* status) {
  net::HttpRequest r;
  r.method = "POST";
  r.path = r.target = "/v1/jobs";
  r.content_type = "application/json";
  r.body = spec.dump();
  r.peer.unix_socket = true;
  r.peer.uid = uid;
  net::HttpResponse out = server.Handle(r);
  *status = out.status;
  return json::parse(out.body, nullptr, false);
}

// A job runs with its user's own uid, gid and groups or not at all. A uid with no account (here
// one with no passwd entry, as `setpriv --reuid` makes; an account deleted after submitting or an
// NSS outage look the same) is refused at launch with the reason, never started in root's group.
TEST_F(ServerTest, AJobOfAUidWithNoAccountNeverStartsAndSaysWhy) {
  ASSERT_EQ(geteuid(), 0u) << "the server switches users as root; so does this test";
  StartServer();
  uid_t ghost = 4242;
  while (getpwuid(ghost) != nullptr) ++ghost;  // the first uid from 4242 with no account
  int status = 0;
  json j = SubmitAs(*server_, ghost, {{"command", {"sleep", "10"}}}, &status);
  ASSERT_EQ(status, 201) << j.dump();
  const int64_t id = j["id"].get<int64_t>();
  // Beside it, an account that resolves runs as itself, in its own primary group.
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  json n = SubmitAs(*server_, nobody->pw_uid, {{"command", {"sleep", "10"}}}, &status);
  ASSERT_EQ(status, 201) << n.dump();
  Settle();
  json ghost_job = Job(id);
  EXPECT_EQ(ghost_job["state"], "failed");
  EXPECT_THAT(ghost_job.dump(),
              HasSubstr(fmt::format("the account of uid {} cannot be looked up", ghost)));
  ASSERT_EQ(launcher_.started().size(), 1u) << "only the job with an account started";
  const auto started = launcher_.started()[0];
  EXPECT_EQ(started.job_id, n["id"].get<int64_t>());
  ASSERT_TRUE(started.uid && started.gid);
  EXPECT_EQ(*started.uid, nobody->pw_uid);
  EXPECT_EQ(*started.gid, nobody->pw_gid);
  EXPECT_NE(*started.gid, 0u);
}

TEST_F(ServerTest, OrdinaryUsersStayUnderTheirPriorityCeiling) {
  config_.priority_ceilings["group:tessera-no-such-group"] = 900;  // a group nobody is in
  StartServer();
  const uid_t nobody = 65534;
  ASSERT_NE(nobody, geteuid());
  int status = 0;
  json j = SubmitAs(*server_, nobody, {{"command", {"sleep", "5"}}, {"priority", 5}}, &status);
  EXPECT_EQ(status, 403) << j.dump();
  EXPECT_THAT(j.value("message", ""), HasSubstr("priority 5 is above nobody's ceiling of 0"));
  // An admin (this test's own user: root, or the server's user) may ask for any priority.
  EXPECT_GT(Submit(1, 5, 1000), 0);
  config_.priority_ceilings["nobody"] = 10;
  StartServer();
  j = SubmitAs(*server_, nobody, {{"command", {"sleep", "5"}}, {"priority", 5}}, &status);
  if (geteuid() == 0) {
    EXPECT_EQ(status, 201) << j.dump();
  } else {
    // Past the ceiling; a server that is not root runs no one's jobs but its own user's.
    EXPECT_THAT(j.value("message", ""), HasSubstr("cannot start jobs as"));
  }
}

TEST_F(ServerTest, OnlyUsersWithTheRightPreemptOthersJobs) {
  if (geteuid() != 0) GTEST_SKIP() << "acting as two other users needs a root server";
  const uid_t daemon_uid = 1, nobody = 65534;  // two ordinary accounts of every Debian system
  config_.priority_ceilings["daemon"] = 10;
  StartServer();
  int status = 0;
  json low = SubmitAs(*server_, nobody,
                      {{"command", {"sleep", "100"}}, {"resources", {{"gpus", 2}}}}, &status);
  ASSERT_EQ(status, 201) << low.dump();
  Settle();
  json high = SubmitAs(
      *server_, daemon_uid,
      {{"command", {"sleep", "5"}}, {"priority", 10}, {"resources", {{"gpus", 2}}}}, &status);
  ASSERT_EQ(status, 201) << high.dump();
  Settle();
  EXPECT_TRUE(launcher_.signals().empty()) << "daemon may not stop nobody's job";
  EXPECT_THAT(Job(high["id"]).value("waiting", ""), HasSubstr("no node fits"));
  // Given the right, the same request preempts.
  config_.preempt_others.insert("daemon");
  StartServer();
  Settle();
  ASSERT_EQ(launcher_.signals().size(), 1u);
  EXPECT_EQ(launcher_.signals()[0].second, SIGTERM);
}

TEST_F(ServerTest, StopEscalatesToSigkillAfterTheJobsGracePeriod) {
  launcher_.set_stop_latency(1000);  // a job that ignores SIGTERM
  StartServer();
  int64_t id = Submit(1, 500, 0, {{"grace_period_s", 5}});
  Settle();
  Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  Settle();
  Advance(4.9);
  Settle();
  ASSERT_EQ(launcher_.signals().size(), 1u) << "only SIGTERM within the grace period";
  Advance(0.2);
  Settle();
  ASSERT_EQ(launcher_.signals().size(), 2u);
  EXPECT_EQ(launcher_.signals()[1].second, SIGKILL);
  Settle();
  EXPECT_EQ(State(id), "cancelled");
}

// A job ignoring SIGTERM keeps its GPUs no longer than the server's maximum grace: a larger grace
// is refused at submit (naming the limit), one stored under an older, larger maximum is cut to it;
// and its owner can kill it at once with a forced cancel, which a stranger cannot.
TEST_F(ServerTest, GraceIsBoundedAndAForcedCancelKillsAtOnce) {
  launcher_.set_stop_latency(100000);  // jobs that ignore SIGTERM
  config_.max_grace_period_s = 3600;
  StartServer();
  const int64_t old = Submit(1, 5000, 0, {{"grace_period_s", 3600}});  // under a larger maximum
  config_.max_grace_period_s = 60;
  StartServer();
  int status = 0;
  json refused =
      Call("POST", "/v1/jobs", {{"command", {"sleep", "10"}}, {"grace_period_s", 600}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_THAT(refused.value("message", ""),
              HasSubstr("grace_period_s: 600 s is over this server's maximum of 60 s"));
  Settle();
  ASSERT_EQ(State(old), "running");
  Call("POST", "/v1/jobs/" + std::to_string(old) + "/cancel");
  Settle();
  Advance(60.1);
  Settle();
  ASSERT_EQ(launcher_.signals().size(), 2u) << "SIGKILL after 60 s, not 3600";
  EXPECT_EQ(launcher_.signals()[1].second, SIGKILL);
  Settle();
  EXPECT_EQ(State(old), "cancelled");
  // Forced: SIGKILL with the SIGTERM, the grace not waited out; a stranger may not.
  const int64_t id = Submit(1, 5000, 0, {{"grace_period_s", 60}});
  Settle();
  ASSERT_EQ(State(id), "running");
  net::HttpRequest r;
  r.method = "POST";
  r.path = "/v1/jobs/" + std::to_string(id) + "/cancel";
  r.target = r.path + "?force=true";
  r.query["force"] = "true";
  r.peer.unix_socket = true;
  r.peer.uid = 65534;
  ASSERT_NE(r.peer.uid, geteuid());
  EXPECT_EQ(server_->Handle(r).status, 403);
  r.query["force"] = "maybe";
  r.peer.uid = geteuid();
  EXPECT_EQ(server_->Handle(r).status, 400);
  const size_t before = launcher_.signals().size();
  json j = Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel?force=true");
  Settle();
  ASSERT_EQ(launcher_.signals().size(), before + 2);
  EXPECT_EQ(launcher_.signals()[before].second, SIGTERM);
  EXPECT_EQ(launcher_.signals()[before + 1].second, SIGKILL);
  EXPECT_EQ(State(id), "cancelled");
  EXPECT_THAT(Job(id).dump(), HasSubstr("(forced: SIGKILL)"));
}

// What can never start is refused at submit, naming the limit, instead of waiting for ever: more
// CPUs or host memory than the machine has.
TEST_F(ServerTest, AJobThatCouldNeverStartIsRefusedAtSubmit) {
  StartServer();
  int status = 0;
  json cpus =
      Call("POST", "/v1/jobs", {{"command", {"true"}}, {"resources", {{"cpus", 4096}}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_THAT(cpus.value("message", ""),
              ::testing::MatchesRegex("resources.cpus: 4096 CPUs asked, this machine has [0-9.]+; "
                                      "the job could never start"));
  json mem = Call("POST", "/v1/jobs",
                  {{"command", {"true"}}, {"resources", {{"memory", "1000TiB"}}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_THAT(mem.value("message", ""), HasSubstr("resources.memory: 1048576000 MiB asked"));
  EXPECT_EQ(Call("GET", "/v1/jobs")["jobs"].size(), 0u) << "nothing stored";
}

// A job whose logs pass the cap is stopped as one past its max runtime is, and its end recorded
// with the reason; and while the state folder's disk has less free than the reserve, new work is
// refused (507, naming the reserve) so that the store keeps room for every end.
TEST_F(ServerTest, LogsPastTheCapStopTheJobAndAFullDiskRefusesNewWork) {
  config_.max_log_bytes_per_job = 1 << 20;
  StartServer();
  const int64_t quiet = Submit(0, 100), loud = Submit(0, 100);
  Settle();
  ASSERT_EQ(State(loud), "running");
  // What the job wrote: its stdout log, 2 MiB (the fake launcher runs no process).
  std::ofstream(config_.state_dir + "/logs/" + std::to_string(loud) + ".out")
      << std::string(2 << 20, 'x');
  Advance(1.5);
  Settle();
  ASSERT_EQ(launcher_.signals().size(), 1u) << "SIGTERM to the loud job only";
  Advance(2);  // the fake's stop latency
  Settle();
  json j = Job(loud);
  EXPECT_EQ(j["state"], "failed");
  EXPECT_THAT(j.dump(), HasSubstr("its logs reached 2 MiB, over the limit of 1 MiB "
                                  "(limits.max_log_bytes_per_job)"));
  EXPECT_EQ(State(quiet), "running");
  // A reserve larger than any disk: nothing new is accepted, and says why.
  config_.min_free_disk_bytes = uint64_t{1} << 62;
  StartServer();
  int status = 0;
  json refused = Call("POST", "/v1/jobs", {{"command", {"true"}}}, &status);
  EXPECT_EQ(status, 507);
  EXPECT_THAT(refused.value("message", ""),
              HasSubstr("MiB free, under its reserve of 4398046511104 MiB (limits.min_free_disk)"));
}

TEST_F(ServerTest, MaxRuntimeStopsTheJobAndSaysWhy) {
  StartServer();
  int64_t id = Submit(1, 500, 0, {{"max_runtime_s", 30}});
  Settle();
  Advance(30.5);
  Settle();
  EXPECT_EQ(State(id), "running") << "SIGTERM sent; the job has 2 s to stop";
  Advance(2);
  Settle();
  json j = Job(id);
  EXPECT_EQ(j["state"], "failed");
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("max runtime of 30 s"));
}

TEST_F(ServerTest, QuotaKeepsAJobWaitingAndSaysWhy) {
  StartServer();
  const std::string me = Call("GET", "/v1/info")["caller"]["user"];  // who the server says we are
  sched::OwnerQuota q;
  q.limit.gpus = 1;
  config_.quotas[me] = q;
  StartServer();
  int64_t first = Submit(1, 50), second = Submit(1, 50);
  Settle();
  EXPECT_EQ(State(first), "running");
  EXPECT_THAT(Job(second).value("waiting", ""), HasSubstr("quota"));
  Advance(50);
  Settle();
  EXPECT_EQ(State(second), "running");
}

TEST_F(ServerTest, AJobOverItsOwnersHardQuotaIsRefusedAtSubmitNamingTheLimit) {
  StartServer();
  const std::string me = Call("GET", "/v1/info")["caller"]["user"];
  sched::OwnerQuota q;
  q.limit.gpus = 1;
  q.limit.gpu_memory_mib = 20000;
  config_.quotas[me] = q;
  StartServer();
  int status = 0;
  json j = Call("POST", "/v1/jobs", {{"command", {"true"}}, {"resources", {{"gpus", 2}}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j.value("message", ""),
            "resources: " + me +
                "'s quota: at most 1 whole GPUs at once; asks 2: the job could never start")
      << j.dump();
  j = Call("POST", "/v1/jobs",
           {{"command", {"true"}}, {"resources", {{"gpu_share", "50%"}, {"gpu_memory", "30GiB"}}}},
           &status);
  EXPECT_EQ(status, 400);
  EXPECT_THAT(j.value("message", ""),
              HasSubstr("at most 20000 MiB of GPU memory at once; asks 30720 MiB"));
  // Within the limit, or over it with room to borrow: accepted (they wait, not refused).
  Submit(1, 5);
  q.borrow = true;
  config_.quotas[me] = q;
  StartServer();
  Submit(2, 5);
  q.borrow_limit.gpus = 1;
  config_.quotas[me] = q;
  StartServer();
  Call("POST", "/v1/jobs", {{"command", {"true"}}, {"resources", {{"gpus", 2}}}}, &status);
  EXPECT_EQ(status, 400) << "over the borrowing ceiling too";
}

TEST_F(ServerTest, RestartReadoptsRunningJobsAndKeepsTheQueue) {
  StartServer();
  int64_t running = Submit(2, 50), queued = Submit(2, 10);
  Settle();
  ASSERT_EQ(State(running), "running");
  StartServer();  // a new server on the same state; the fake job runs on
  EXPECT_EQ(State(running), "running") << "re-adopted";
  EXPECT_EQ(State(queued), "queued");
  Advance(50);
  Settle();
  EXPECT_EQ(State(running), "succeeded") << "its exit code came through the exit file";
  EXPECT_EQ(State(queued), "running");
}

// ---- batch habits (arrays, dependencies, hold) ----

// One user's huge array cannot fill the process table or hold the loop: jobs waiting are capped per
// user at submit (429, naming the limit), jobs running per user too (the rest wait, saying why),
// and one pass starts at most max_starts_per_pass processes - a GPU job first, so a GPU is never
// left idle behind a stream of no-GPU tasks.
TEST_F(ServerTest, PerUserCapsAndStartsPerPassBoundOneUsersArray) {
  config_.max_queued_jobs_per_user = 20;
  config_.max_running_jobs_per_user = 6;
  config_.max_starts_per_pass = 3;
  StartServer();
  int status = 0;
  json over = Call("POST", "/v1/jobs", {{"command", {"sleep", "100"}}, {"array", "0-20"}}, &status);
  EXPECT_EQ(status, 429);
  EXPECT_THAT(over.value("message", ""),
              HasSubstr("has 0 jobs waiting and this would add 21: at most 20 per user "
                        "(limits.max_queued_jobs_per_user"));
  json a = Call("POST", "/v1/jobs", {{"command", {"sleep", "100"}}, {"array", "0-9"}}, &status);
  ASSERT_EQ(status, 201) << a.dump();
  // Another user's GPU job, submitted last.
  json g = SubmitAs(*server_, 65534, {{"command", {"sleep", "100"}}, {"resources", {{"gpus", 1}}}},
                    &status);
  ASSERT_EQ(status, 201) << g.dump();
  const int64_t gpu_job = g["id"];
  ASSERT_TRUE(server_->RunOnce());
  ASSERT_EQ(StartedJobs().size(), 3u) << "three starts in one pass";
  EXPECT_EQ(StartedJobs()[0], gpu_job) << "the GPU job first, though submitted last";
  Settle();
  EXPECT_EQ(StartedJobs().size(), 7u) << "then up to the array's user's running cap (6)";
  const int64_t first = a["id"];
  EXPECT_THAT(Call("GET", "/v1/jobs/" + std::to_string(first) + "_9").value("waiting", ""),
              HasSubstr("6 jobs running or starting, the most per user "
                        "(limits.max_running_jobs_per_user)"));
  Submit(0, 1, 0, {{"array", "0-9"}});  // 10 more: 4 + 10 waiting, within 20
  json refused = Call("POST", "/v1/jobs", {{"command", {"true"}}, {"array", "0-6"}}, &status);
  EXPECT_EQ(status, 429) << refused.dump();
  Advance(100);
  Settle();
  EXPECT_EQ(StartedJobs().size(), 13u) << "as they end, the next start";
}

TEST_F(ServerTest, AnArrayRunsEachIndexWithItsIdAndAtMostItsLimitAtOnce) {
  StartServer();
  json a =
      Call("POST", "/v1/jobs",
           {{"command", {"sleep", "10"}}, {"array", "3-9:2,20%2"}, {"resources", {{"gpus", 1}}}});
  const int64_t first = a["id"];
  EXPECT_EQ(a["array"]["tasks"], 5) << "3, 5, 7, 9 and 20";
  Settle();
  ASSERT_EQ(StartedJobs().size(), 2u) << "%2 although both GPUs would take more";
  EXPECT_EQ(launcher_.started()[0].env.at("TESSERA_ARRAY_TASK_ID"), "3");
  EXPECT_EQ(launcher_.started()[1].env.at("TESSERA_ARRAY_TASK_ID"), "5");
  EXPECT_EQ(launcher_.started()[1].env.at("TESSERA_ARRAY_JOB_ID"), std::to_string(first));
  // Slurm's names for the same, for scripts written for sbatch; not those MPI launchers take
  // for a Slurm allocation.
  const auto env = launcher_.started()[1].env;  // started() is a copy
  EXPECT_EQ(env.at("SLURM_ARRAY_TASK_ID"), "5");
  EXPECT_EQ(env.at("SLURM_ARRAY_JOB_ID"), std::to_string(first));
  EXPECT_EQ(env.at("SLURM_JOB_ID"), std::to_string(first + 1)) << "the task's own id";
  EXPECT_FALSE(env.contains("SLURM_JOBID"));
  EXPECT_FALSE(env.contains("SLURM_NTASKS"));
  EXPECT_THAT(Call("GET", "/v1/jobs/" + std::to_string(first) + "_20").value("waiting", ""),
              HasSubstr("at most 2 tasks at once (%2)"));
  for (int round = 0; round < 3; ++round) {
    Advance(10);
    Settle();
  }
  std::vector<std::string> order;
  for (const auto& s : launcher_.started()) order.push_back(s.env.at("TESSERA_ARRAY_TASK_ID"));
  EXPECT_THAT(order, ::testing::ElementsAre("3", "5", "7", "9", "20")) << "in index order";
  json folded = Call("GET", "/v1/jobs?arrays=fold");
  ASSERT_EQ(folded["jobs"].size(), 1u);
  EXPECT_EQ(folded["jobs"][0]["array"]["states"], json({{"succeeded", 5}}));
  EXPECT_EQ(Call("GET", "/v1/jobs?arrays=expand")["jobs"].size(), 5u);
}

TEST_F(ServerTest, DependenciesWaitForTheirJobsAndEndWhenTheyCanNeverBeMet) {
  StartServer();
  const int64_t fails = Submit(0, 0, 0, {{"command", {"false"}}, {"resources", json::object()}});
  const int64_t works = Submit(1, 5);
  const int64_t after_ok = Submit(1, 5, 0, {{"after", {"ok:" + std::to_string(works)}}});
  const int64_t on_failure = Submit(1, 5, 0, {{"after", {"notok:" + std::to_string(fails)}}});
  Settle();
  EXPECT_EQ(State(on_failure), "running") << "its job failed, as it asked";
  EXPECT_THAT(Job(after_ok).value("waiting", ""),
              HasSubstr("waiting for job " + std::to_string(works) + " to end"));
  // A dependency on a job that failed can never be met: the job ends, and so do its dependents.
  int status = 0;
  json refused =
      Call("POST", "/v1/jobs",
           {{"command", {"sleep", "1"}}, {"after", {"ok:" + std::to_string(fails)}}}, &status);
  EXPECT_EQ(status, 422) << "known at submission";
  EXPECT_THAT(refused.value("message", ""), HasSubstr("can never be met"));
  const int64_t chain = Submit(1, 5, 0, {{"after", {"ok:" + std::to_string(works)}}});
  const int64_t chain2 = Submit(1, 5, 0, {{"after", {"notok:" + std::to_string(works)}}});
  const int64_t chain3 = Submit(1, 5, 0, {{"after", {"ok:" + std::to_string(chain2)}}});
  Advance(5);
  Settle();
  EXPECT_EQ(State(after_ok), "running");
  json never = Job(chain2);
  EXPECT_EQ(never["state"], "cancelled");
  EXPECT_THAT(never["reason"].get<std::string>(),
              HasSubstr("job " + std::to_string(works) + " succeeded: after notok:"));
  EXPECT_EQ(State(chain3), "cancelled") << "its dependency was cancelled in turn";
  EXPECT_NE(State(chain), "cancelled");
}

// Jobs waiting on a dependency are parked (not looked at each pass) until one of their
// dependencies settles: each of them, not only the first, wakes them; a parked job held and
// released is looked at again.
TEST_F(ServerTest, AParkedDependentWakesWhenAnyOfItsDependenciesSettles) {
  StartServer();
  const int64_t long_one = Submit(1, 100);
  const int64_t short_one = Submit(0, 5, 0, {{"resources", json::object()}});
  const std::string l = std::to_string(long_one), s = std::to_string(short_one);
  const int64_t both =
      Submit(0, 1, 0, {{"after", {"ok:" + l, "notok:" + s}}, {"resources", json::object()}});
  const int64_t after_long =
      Submit(0, 1, 0, {{"after", {"ok:" + l}}, {"resources", json::object()}});
  Settle();
  EXPECT_THAT(Job(both).value("waiting", ""), HasSubstr("waiting for job " + l + " to end"));
  // Held and released while parked: it waits as before.
  int status = 0;
  Call("POST", "/v1/jobs/" + std::to_string(after_long) + "/hold", nullptr, &status);
  ASSERT_EQ(status, 200);
  Settle();
  Call("POST", "/v1/jobs/" + std::to_string(after_long) + "/release", nullptr, &status);
  ASSERT_EQ(status, 200);
  Settle();
  EXPECT_THAT(Job(after_long).value("waiting", ""), HasSubstr("waiting for job " + l + " to end"));
  // The short job succeeds: `both` can never run (notok), though the long one still runs.
  Advance(5);
  Settle();
  EXPECT_EQ(State(short_one), "succeeded");
  EXPECT_EQ(State(long_one), "running");
  EXPECT_EQ(State(both), "cancelled");
  EXPECT_THAT(Job(both)["reason"].get<std::string>(), HasSubstr("after notok:" + s));
  EXPECT_EQ(State(after_long), "queued");
  Advance(100);
  Settle();
  EXPECT_EQ(State(after_long), "running");
}

TEST_F(ServerTest, ADependencyOnAnArrayWaitsForEveryTask) {
  StartServer();
  json a = Call("POST", "/v1/jobs",
                {{"command", {"sleep", "10"}}, {"array", "0-2"}, {"resources", {{"gpus", 1}}}});
  const int64_t array = a["id"];
  const int64_t after = Submit(1, 1, 0, {{"after", {"ok:" + std::to_string(array)}}});
  const int64_t after_one = Submit(1, 1, 0, {{"after", {"ok:" + std::to_string(array) + "_0"}}});
  Settle();
  Advance(10);
  Settle();
  EXPECT_EQ(State(array), "succeeded") << "task 0";
  EXPECT_NE(State(after), "running") << "task 2 has not run yet";
  EXPECT_NE(State(after_one), "queued") << "it waited for task 0 only";
  Advance(10);
  Settle();
  EXPECT_EQ(State(after), "running");
}

TEST_F(ServerTest, AReleasedJobKeepsItsPlaceAndHoldingTakesItOutOfTheQueue) {
  StartServer();
  const int64_t busy = Submit(2, 10);
  Settle();
  const int64_t first = Submit(2, 10, 0, {{"hold", true}});
  Advance(1);
  const int64_t second = Submit(2, 10);
  Settle();
  EXPECT_TRUE(Job(first)["held"].get<bool>());
  EXPECT_THAT(Job(first).value("waiting", ""), HasSubstr("held"));
  // `ls --state held` lists the held ones (ls shows them as held); queued lists both.
  json held_jobs = Call("GET", "/v1/jobs?state=held")["jobs"];
  ASSERT_EQ(held_jobs.size(), 1u) << held_jobs.dump();
  EXPECT_EQ(held_jobs[0]["id"], first);
  EXPECT_EQ(Call("GET", "/v1/jobs?state=held,queued")["jobs"].size(), 2u);
  int status = 0;
  Call("POST", "/v1/jobs/" + std::to_string(first) + "/release", nullptr, &status);
  EXPECT_EQ(status, 200);
  Call("POST", "/v1/jobs/" + std::to_string(second) + "/hold", nullptr, &status);
  EXPECT_EQ(status, 200);
  Call("POST", "/v1/jobs/" + std::to_string(busy) + "/hold", nullptr, &status);
  EXPECT_EQ(status, 409) << "a running job cannot be held";
  Advance(10);
  Settle();
  EXPECT_EQ(State(first), "running") << "released: in its place, ahead of the later one";
  EXPECT_EQ(State(second), "queued");
  Advance(10);
  Settle();
  EXPECT_EQ(State(second), "queued") << "still held";
  Call("POST", "/v1/jobs/" + std::to_string(second) + "/release", nullptr, &status);
  Settle();
  EXPECT_EQ(State(second), "running");
  // Held across a restart.
  const int64_t held = Submit(1, 10, 0, {{"hold", true}});
  StartServer();
  Advance(20);
  Settle();
  EXPECT_EQ(State(held), "queued");
  EXPECT_TRUE(Job(held)["held"].get<bool>());
}

TEST_F(ServerTest, AJobOfSeveralTasksGetsOneProcessPerTaskWithItsRank) {
  StartServer();
  Submit(2, 10, 0, {{"tasks_per_gpu", 2}});
  Settle();
  ASSERT_EQ(launcher_.started().size(), 1u);
  const std::vector<TaskLaunch> tasks = launcher_.started()[0].tasks;
  ASSERT_EQ(tasks.size(), 4u);
  for (size_t r = 0; r < tasks.size(); ++r) {
    EXPECT_EQ(tasks[r].env.at("RANK"), std::to_string(r));
    EXPECT_EQ(tasks[r].env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(tasks[r].env.at("TESSERA_TASK_GPU"), std::to_string(r / 2));
    EXPECT_EQ(tasks[r].env.at("MASTER_PORT"), tasks[0].env.at("MASTER_PORT"));
  }
  EXPECT_NE(tasks[1].stdout_path, tasks[0].stdout_path) << "a log each";
}

TEST_F(ServerTest, AStreamOfSmallJobsDoesNotStarveALargeOne) {
  // Two GPUs; one-GPU jobs of 10 s arrive every 5 s, staggered, so that a GPU comes free every 5 s
  // but never both at once. Without reservations each freed GPU goes to the next small job; with
  // them the large job's GPUs are kept for it from when its start can be predicted.
  for (int reservations : {0, 8}) {
    config_.backfill_reservations = reservations;
    fs::remove_all(dir_);
    StartServer();
    const double t0 = core::Seconds(clock_.Now());
    const json small = {{"max_runtime_s", 30}};
    Submit(1, 10, 0, small);
    Settle();
    Advance(1);
    const int64_t large = Submit(2, 10);
    Settle();
    std::optional<double> started;
    for (int step = 0; step < 20 && !started; ++step) {
      Advance(step == 0 ? 4 : 5);
      Submit(1, 10, 0, small);
      Settle();
      json j = Job(large);
      if (j["state"] == "running") started = j["started_at"].get<double>();
      if (reservations > 0 && !started && step > 0) {
        EXPECT_THAT(j.value("waiting", ""), HasSubstr("reserved for it")) << j.dump();
        EXPECT_TRUE(j.value("reserved", false));
      }
    }
    if (reservations == 0) {
      EXPECT_FALSE(started) << "without reservations the large job starves";
    } else {
      ASSERT_TRUE(started) << "with them it starts";
      EXPECT_LE(*started - t0, 30) << "when the GPU it reserved came free";
    }
  }
}

}  // namespace
}  // namespace tessera::server
