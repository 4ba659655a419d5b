// The server on a fake clock with a fake launcher: queue order, preemption, stop escalation, max
// runtime, quotas and recovery after a restart, each driven turn by turn (RunOnce) with no sleep.
#include "tessera/server/server.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/devices/simulated_source.h"
#include "tessera/server/fake_launcher.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"

namespace tessera::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "tessera-server-test-" + std::to_string(getpid());
    fs::remove_all(dir_);
    config_.socket = dir_ + "/s.sock";
    config_.state_dir = dir_ + "/state";
    config_.confinement = "off";  // jobs of the fake launcher are no processes
    config_.simulate = "t4x2";    // two GPUs
    config_.podman = "";
    config_.allow_root_jobs = true;  // the test's jobs are its own user's, root in CI
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  void StartServer(bool health = false) {
    server_.reset();
    ServerDeps deps;
    deps.clock = &clock_;
    deps.launcher = &launcher_;
    if (own_source_) {
      auto machine = devices::LoadSimulatedMachine(config_.simulate);
      ASSERT_TRUE(machine.ok()) << machine.status();
      auto source = std::make_unique<devices::SimulatedSource>(*std::move(machine), clock_);
      source_ = source.get();
      deps.source = std::move(source);
    }
    auto s = Server::Create(config_, std::move(deps));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->Start({.listen = false, .loop = false, .health = health}).ok());
  }

  json Call(const std::string& method, const std::string& path, const json& body = nullptr,
            int* status = nullptr) {
    net::HttpRequest r;
    r.method = method;
    r.target = path;
    r.path = path.substr(0, path.find('?'));
    // The query, as the listener splits it (plain names and values only, in these tests).
    for (size_t at = path.find('?'); at != std::string::npos;) {
      const size_t amp = path.find('&', at + 1);
      const std::string kv = path.substr(at + 1, amp == std::string::npos ? amp : amp - at - 1);
      r.query[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
      at = amp;
    }
    r.content_type = "application/json";
    if (!body.is_null()) r.body = body.dump();
    r.peer.unix_socket = true;
    r.peer.uid = geteuid();
    net::HttpResponse out = server_->Handle(r);
    if (status) *status = out.status;
    return json::parse(out.body, nullptr, false);
  }
  int64_t Submit(int gpus, double seconds, int priority = 0, json extra = json::object()) {
    json spec = {{"command", {"sleep", std::to_string(seconds)}}, {"priority", priority}};
    if (gpus > 0) spec["resources"] = {{"gpus", gpus}};
    spec.update(extra);
    int status = 0;
    json j = Call("POST", "/v1/jobs", spec, &status);
    EXPECT_EQ(status, 201) << j.dump();
    return j.value("id", int64_t{0});
  }
  json Job(int64_t id) { return Call("GET", "/v1/jobs/" + std::to_string(id)); }
  std::string State(int64_t id) { return Job(id).value("state", ""); }
  void Advance(double seconds) {
    clock_.Advance(
        std::chrono::duration_cast<core::Duration>(std::chrono::duration<double>(seconds)));
  }
  // Turns the loop until it has nothing more to do at this time.
  void Settle() {
    for (int i = 0; i < 100 && server_->RunOnce(); ++i) {
    }
  }
  std::vector<int64_t> StartedJobs() const {
    std::vector<int64_t> ids;
    for (const auto& s : launcher_.started()) ids.push_back(s.job_id);
    return ids;
  }

  std::string dir_;
  ServerConfig config_;
  bool own_source_ = false;  // StartServer makes the simulated GPUs (source_) itself
  devices::SimulatedSource* source_ = nullptr;
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(1'800'000'000))};
  FakeLauncher launcher_{clock_, /*stop_latency_s=*/2};
  std::unique_ptr<Server> server_;
};

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

TEST_F(ServerTest, HistoryPredictsRunTimesAndAQueuedJobSaysWhenItShouldStart) {
  StartServer();
  // Three runs of "train" teach the predictor; a fourth runs, a two-GPU job waits behind it.
  for (int i = 0; i < 3; ++i) {
    Submit(2, 40, 0, {{"name", "train"}});
    Settle();
    Advance(40);
    Settle();
  }
  const int64_t run = Submit(2, 40, 0, {{"name", "train"}});
  Settle();
  json running = Job(run);
  EXPECT_EQ(running["expected_duration_s"], 40);
  EXPECT_THAT(running["prediction"].get<std::string>(),
              HasSubstr("runs of 'train' with this command (3 runs)"));
  EXPECT_EQ(running["expected_end"].get<double>(), running["started_at"].get<double>() + 40);
  Advance(10);
  const int64_t waiting = Submit(2, 5, 0, {{"name", "eval"}, {"max_runtime_s", 5}});
  Settle();
  json w = Job(waiting);
  EXPECT_EQ(w["expected_start"].get<double>(), running["started_at"].get<double>() + 40);
  EXPECT_EQ(w["expected_duration_s"], 5);
  EXPECT_THAT(w["prediction"].get<std::string>(),
              HasSubstr("p75 of root's 2 GPU jobs (3 runs), capped by its max runtime"));
  // It survives a restart: the history is rebuilt from the store.
  StartServer();
  EXPECT_THAT(Job(run)["prediction"].get<std::string>(), HasSubstr("(3 runs)"));
}

TEST_F(ServerTest, HistoryLearnsEachJobsGpuUseAndKeepsBusySharesApart) {
  own_source_ = true;
  config_.utilization_ceiling_strict = true;
  StartServer();
  auto telemetry = [&](double util, int64_t mem_mib) {
    for (int g = 0; g < 2; ++g) {
      ASSERT_TRUE(
          source_
              ->SetTelemetry(g, {.utilization = util, .memory_used_bytes = uint64_t(mem_mib) << 20})
              .ok());
    }
  };
  // A whole-GPU job: its GPU's own readings, sampled while it runs (60% then 80%; 5000 MiB at
  // most).
  const int64_t whole = Submit(1, 20, 0, {{"name", "train"}});
  Settle();
  ASSERT_EQ(State(whole), "running");
  telemetry(0.6, 3000);
  Advance(5);
  server_->TakeSample();
  telemetry(0.8, 5000);
  Advance(10);
  server_->TakeSample();
  Advance(5);
  Settle();
  json w = Job(whole);
  ASSERT_EQ(w["state"], "succeeded");
  EXPECT_DOUBLE_EQ(w["usage"]["gpu_utilization_pct"].get<double>(), 70);
  EXPECT_EQ(w["usage"]["gpu_peak_memory_mib"], 5000);

  // A share: the GPU time the arbiter charged it (10 s of its 20 s: 50%) and its region's peak,
  // written as the intercept library in its processes would.
  const json share = {{"name", "infer"}, {"resources", {{"gpu_share", "30%"}}}};
  const int64_t first = Submit(0, 20, 0, share);
  Settle();
  json f = Job(first);
  ASSERT_EQ(f["state"], "running");
  const int gpu = f["placement"]["gpus"][0]["index"].get<int>();
  char err[256] = "";
  std::unique_ptr<shim::Arbiter> arbiter(shim::Arbiter::Attach(
      (config_.state_dir + "/arbiter/gpu.arbiter").c_str(),
      shim::ArbiterJobKey(std::to_string(first).c_str()), {}, err, sizeof err));
  ASSERT_NE(arbiter, nullptr) << err;
  const int slot = arbiter->Slot(gpu);
  ASSERT_GE(slot, 0);
  arbiter->data()->gpus[gpu].jobs[slot].busy_us.store(8'000'000);
  const uint64_t limit = 0;
  std::unique_ptr<shim::Region> region(shim::Region::Attach(
      (config_.state_dir + "/regions/" + std::to_string(first) + ".region").c_str(), &limit, 1, err,
      sizeof err));
  ASSERT_NE(region, nullptr) << err;
  ASSERT_TRUE(region->Reserve(0, uint64_t{3000} << 20));
  region->Release(0, uint64_t{3000} << 20);
  Advance(10);
  server_->TakeSample();
  // A process of the job that died and came back starts the arbiter's count again (lower than
  // before); what was counted before stays: 8 s + 2 s.
  arbiter->data()->gpus[gpu].jobs[slot].busy_us.store(2'000'000);
  Advance(10);
  Settle();
  f = Job(first);
  ASSERT_EQ(f["state"], "succeeded");
  EXPECT_DOUBLE_EQ(f["usage"]["gpu_utilization_pct"].get<double>(), 50);
  EXPECT_EQ(f["usage"]["gpu_peak_memory_mib"], 3000);
  arbiter.reset();
  region.reset();

  // Two more runs of "infer" at 50%: each now predicted so, and kept off a GPU where another's
  // predicted 50% would make 100% (over the 70% ceiling) - though packing would put them on one.
  const int64_t a = Submit(0, 600, 0, share);
  const int64_t b = Submit(0, 600, 0, share);
  Settle();
  json ja = Job(a), jb = Job(b);
  ASSERT_EQ(ja["state"], "running");
  ASSERT_EQ(jb["state"], "running");
  EXPECT_EQ(ja["expected_gpu_utilization_pct"], 50);
  EXPECT_EQ(ja["utilization_prediction"], "p75 of root's runs of 'infer' (1 run)");
  EXPECT_NE(ja["placement"]["gpus"][0]["index"], jb["placement"]["gpus"][0]["index"]);
  // A third waits, and says why; a share nobody has measured still fits beside them (short enough
  // not to delay the third's reservation).
  const int64_t c = Submit(0, 600, 0, share);
  const int64_t unknown = Submit(
      0, 5, 0, {{"name", "new"}, {"max_runtime_s", 5}, {"resources", {{"gpu_share", "20%"}}}});
  Settle();
  EXPECT_EQ(State(c), "queued");
  EXPECT_THAT(Job(c)["waiting"].get<std::string>(), HasSubstr("70% utilization ceiling"));
  EXPECT_EQ(State(unknown), "running");
  // The history survives a restart: the measurement is in the store.
  StartServer();
  EXPECT_EQ(Job(c)["expected_gpu_utilization_pct"], 50);
  // With a soft ceiling (the default) it goes over it rather than wait, to the less busy GPU.
  config_.utilization_ceiling_strict = false;
  StartServer();
  Settle();
  EXPECT_EQ(State(c), "running");
}

TEST_F(ServerTest, HistoryLearnsHowMuchSharingSlowsAShare) {
  StartServer();
  const json infer = {{"name", "infer"}, {"resources", {{"gpu_share", "30%"}}}};
  // Twice alone (20 s), then twice two at once - packed on one GPU, each 30 s.
  for (int i = 0; i < 2; ++i) {
    const int64_t id = Submit(0, 20, 0, infer);
    Settle();
    Advance(20);
    Settle();
    ASSERT_EQ(State(id), "succeeded");
    EXPECT_EQ(Job(id)["usage"]["shared_gpu"], false);
  }
  for (int i = 0; i < 2; ++i) {
    const int64_t a = Submit(0, 30, 0, infer), b = Submit(0, 30, 0, infer);
    Settle();
    ASSERT_EQ(Job(a)["placement"]["gpus"], Job(b)["placement"]["gpus"]);
    Advance(30);
    Settle();
    EXPECT_EQ(Job(a)["usage"]["shared_gpu"], true);
    EXPECT_EQ(Job(b)["usage"]["shared_gpu"], true);
  }
  const int64_t next = Submit(0, 600, 0, infer);
  Settle();
  json j = Job(next);
  EXPECT_EQ(j["sharing_slowdown"], 1.5);
  EXPECT_EQ(j["sharing_prediction"], "root's runs of 'infer': 4 shared, 2 alone");
  // From the store after a restart, the same.
  StartServer();
  EXPECT_EQ(Job(next)["sharing_slowdown"], 1.5);
}

TEST_F(ServerTest, ASocketHeldByAChildOfAKilledServerIsTakenOverButALiveServersIsNot) {
  // What a server killed while forking a job leaves: its listening socket, still open in the child
  // for a moment (until the child closes it). Held here; the new server's probe connects, and the
  // holder closes it then - as the child would.
  fs::create_directories(dir_);
  const int held = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(held, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", config_.socket.c_str());
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(held, 8), 0);
  auto start = [&]() -> absl::StatusOr<std::unique_ptr<Server>> {
    ServerDeps deps;
    deps.clock = &clock_;
    deps.launcher = &launcher_;
    auto s = Server::Create(config_, std::move(deps));
    if (!s.ok()) return s.status();
    if (absl::Status st = (*s)->Start({.listen = true, .loop = false, .health = false}); !st.ok())
      return st;
    return s;
  };
  absl::StatusOr<std::unique_ptr<Server>> first = absl::UnknownError("not started");
  std::thread starting([&] { first = start(); });
  const int probe = accept(held, nullptr, nullptr);  // the new server's first probe
  EXPECT_GE(probe, 0);
  close(probe);
  close(held);
  starting.join();
  ASSERT_TRUE(first.ok()) << first.status();
  // A live server's socket is not taken over (a server with a state folder of its own: one on the
  // same folder is refused before that, below).
  config_.state_dir = dir_ + "/state-of-the-second";
  auto second = start();
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("a server is already listening"));
}

// One server per state folder, refused before it reads anything there (recovery would re-adopt or
// end the live server's jobs, its sweep remove their cgroups): the lock names the holder's pid.
TEST_F(ServerTest, ASecondServerOnTheSameStateFolderIsRefusedBeforeRecovery) {
  StartServer();
  const int64_t id = Submit(1, 100);
  Settle();
  ASSERT_EQ(State(id), "running");
  ServerConfig other = config_;
  other.socket = dir_ + "/other.sock";  // even with a socket of its own
  ServerDeps deps;
  deps.clock = &clock_;
  deps.launcher = &launcher_;
  auto second = Server::Create(other, std::move(deps));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(fmt::format("another tessera server (pid {}) is using the state folder {}",
                                    getpid(), config_.state_dir)));
  EXPECT_EQ(State(id), "running");
  EXPECT_EQ(launcher_.signals().size(), 0u) << "nothing of the first server's was touched";
  // Once the first is gone, the folder is free.
  server_.reset();
  StartServer();
  EXPECT_EQ(State(id), "running") << "re-adopted by the next server";
}

// Servers with other state folders get other confinement subtrees; the default folder keeps the
// name servers used before.
TEST(StateCgroupName, DiffersPerStateFolder) {
  EXPECT_EQ(StateCgroupName(DefaultServerConfig().state_dir), "tessera");
  const std::string a = StateCgroupName("/srv/tessera-a"), b = StateCgroupName("/srv/tessera-b");
  EXPECT_NE(a, b);
  EXPECT_THAT(a, ::testing::MatchesRegex("tessera-[0-9a-f]{8}"));
  EXPECT_EQ(StateCgroupName("/srv/tessera-a/"), a) << "the same folder, however written";
}

TEST_F(ServerTest, AnArbiterFileOfAnOlderVersionIsReplaced) {
  // What a server of an older Tessera left (another layout: another size).
  fs::create_directories(config_.state_dir + "/arbiter");
  std::ofstream(config_.state_dir + "/arbiter/gpu.arbiter") << std::string(4096, 'x');
  StartServer();
  EXPECT_EQ(fs::file_size(config_.state_dir + "/arbiter/gpu.arbiter"), sizeof(shim::ArbiterData));
  EXPECT_THAT(Call("GET", "/v1/info")["arbiter"]["access"].get<std::string>(),
              ::testing::Not(HasSubstr("none")));
}

// ---- the dashboard's side (dashboard.cc) ----

TEST_F(ServerTest, RaisingAQueuedJobsPriorityMovesItAhead) {
  StartServer();
  int64_t running = Submit(2, 10, 0, {{"preemptible", false}});
  Settle();
  Advance(1);
  int64_t early = Submit(2, 5);
  Advance(1);
  int64_t late = Submit(2, 5);
  Settle();
  int status = 0;
  json j =
      Call("POST", "/v1/jobs/" + std::to_string(late) + "/priority", {{"priority", 3}}, &status);
  EXPECT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["priority"], 3);
  EXPECT_THAT(j["events"].back()["reason"].get<std::string>(), HasSubstr("priority 0 -> 3 by"));
  // A running job's priority is fixed; bad bodies and unknown jobs are said.
  Call("POST", "/v1/jobs/" + std::to_string(running) + "/priority", {{"priority", 3}}, &status);
  EXPECT_EQ(status, 409);
  j = Call("POST", "/v1/jobs/" + std::to_string(early) + "/priority", {{"priority", "high"}},
           &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["message"], "priority: expected a whole number -1000..1000");
  Call("POST", "/v1/jobs/" + std::to_string(early) + "/priority", {{"priority", 1}, {"x", 1}},
       &status);
  EXPECT_EQ(status, 400);
  Call("POST", "/v1/jobs/999/priority", {{"priority", 1}}, &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(Job(early)["priority"], 0);
  Advance(8);  // the running job ends at 10 s: the raised one goes first
  Settle();
  EXPECT_EQ(State(late), "running");
  EXPECT_EQ(State(early), "queued");
}

TEST_F(ServerTest, HistoryKeepsItsWindowAcrossARestart) {
  config_.history_window_s = 60;
  StartServer();
  const double t0 = core::Seconds(clock_.Now());
  server_->TakeSample();
  Submit(1, 100);
  Settle();
  Advance(30);
  json second = json::parse(server_->TakeSample());
  EXPECT_EQ(second["running"], 1);
  EXPECT_EQ(second["busy"], 1);
  EXPECT_EQ(second["allocated"], 1.0);
  EXPECT_EQ(second["alloc"], json({1.0, 0.0}));
  EXPECT_EQ(second["util"], json({nullptr, nullptr}));  // a simulated machine measures none
  Advance(40);
  server_->TakeSample();
  json h = Call("GET", "/v1/history");
  ASSERT_EQ(h["samples"].size(), 2u) << h.dump();  // the first is older than the window
  EXPECT_EQ(h["samples"][0]["at"], t0 + 30);
  EXPECT_EQ(h["gpus"], 2);
  EXPECT_EQ(h["window_s"], 60);
  StartServer();  // a restart keeps them
  EXPECT_EQ(Call("GET", "/v1/history")["samples"].size(), 2u);
  EXPECT_EQ(Call("GET", "/v1/history?since=" + std::to_string(t0 + 50))["samples"].size(), 1u);
  int status = 0;
  json bad = Call("GET", "/v1/history?since=yesterday", nullptr, &status);
  EXPECT_EQ(status, 400);
  EXPECT_THAT(bad["message"].get<std::string>(), HasSubstr("since"));
}

TEST_F(ServerTest, QuotasShowTheirLimitsAndUse) {
  StartServer();
  const std::string me = Call("GET", "/v1/info")["caller"]["user"];
  sched::OwnerQuota q;
  q.limit.gpus = 2;
  config_.quotas[me] = q;
  StartServer();
  Submit(1, 50);
  Settle();
  json j = Call("GET", "/v1/quotas");
  ASSERT_EQ(j["quotas"].size(), 1u) << j.dump();
  EXPECT_EQ(j["quotas"][0]["name"], me);
  EXPECT_EQ(j["quotas"][0]["limit"]["gpus"], 2);
  EXPECT_EQ(j["quotas"][0]["limit"]["gpu_memory_mib"], nullptr);  // no limit
  EXPECT_EQ(j["quotas"][0]["used"]["gpus"], 1);
}

TEST_F(ServerTest, TheSummaryCountsEveryJobByStateAndUserWhateverTheirNumber) {
  StartServer();
  const std::string me = Call("GET", "/v1/info")["caller"]["user"];
  // More queued tasks than any list the dashboard pages through, two running, one held, one done.
  const int64_t quick = Submit(0, 1);
  Settle();
  Advance(2);
  Settle();
  ASSERT_EQ(State(quick), "succeeded");
  for (int i = 0; i < 2; ++i) Submit(1, 100);  // both GPUs of the test machine
  Submit(0, 0, 0, {{"array", "0-2999"}, {"resources", {{"gpus", 1}}}});
  const int64_t held = Submit(1, 5, 0, {{"hold", true}});
  Settle();
  json j = Call("GET", "/v1/summary");
  EXPECT_EQ(j["jobs"]["running"], 2) << j.dump();
  EXPECT_EQ(j["jobs"]["queued"], 3001) << "the array's tasks and the held job";
  EXPECT_EQ(j["jobs"]["held"], 1);
  EXPECT_EQ(j["jobs"]["succeeded"], 1);
  EXPECT_EQ(j["jobs"]["total"], 3004);
  ASSERT_EQ(j["users"].size(), 1u);
  EXPECT_EQ(j["users"][0]["user"], me);
  EXPECT_EQ(j["users"][0]["queued"], 3001);
  EXPECT_EQ(State(held), "queued");
  int status = 0;
  Call("POST", "/v1/summary", nullptr, &status);
  EXPECT_EQ(status, 405);
}

// A user's small job is not stuck behind her own large array: only the array's first tasks wait in
// the scheduling cycle (they share one shape), so the rest do not fill her room there.
TEST_F(ServerTest, AUsersSmallJobStartsBesideHerOwnLargeArrayWaitingForGpus) {
  StartServer();
  for (int i = 0; i < 2; ++i) Submit(1, 100);  // both GPUs of the test machine
  const int64_t array = Submit(0, 5, 0, {{"array", "0-2999"}, {"resources", {{"gpus", 1}}}});
  const int64_t quick = Submit(0, 1);  // no GPU
  Settle();
  EXPECT_EQ(State(quick), "running");
  Advance(2);
  Settle();
  EXPECT_EQ(State(quick), "succeeded");
  EXPECT_THAT(Job(array + 2999).value("waiting", ""),
              HasSubstr(fmt::format("behind the first 256 waiting tasks of array {}", array)));
  EXPECT_EQ(State(array), "queued");
  // The GPUs free: the array's tasks start, 64 at most in a pass, the rest coming in.
  Advance(100);
  Settle();
  EXPECT_EQ(State(array), "running");
}

TEST_F(ServerTest, StreamSendsJobEventsHealthAndSamplesAndResumes) {
  StartServer(/*health=*/true);
  net::HttpRequest req;
  req.method = "GET";
  req.path = req.target = "/v1/stream";
  req.peer.unix_socket = true;
  req.peer.uid = geteuid();
  net::HttpResponse res = server_->Handle(req);
  ASSERT_EQ(res.status, 200);
  EXPECT_EQ(res.content_type, "text/event-stream");
  ASSERT_TRUE(res.stream);
  std::mutex mu;
  std::condition_variable cv;
  std::string got;
  std::thread reader([&] {
    res.stream([&](std::string_view piece) {
      std::lock_guard lock(mu);
      got += piece;
      cv.notify_all();
      return true;
    });
  });
  auto wait_for = [&](const std::string& what) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10),
                       [&] { return got.find(what) != std::string::npos; });
  };
  EXPECT_TRUE(wait_for("event: hello"));
  int64_t id = Submit(1, 50);
  Settle();
  EXPECT_TRUE(wait_for(R"("reason":"placed on GPU 0","state":"running")")) << got;
  server_->TakeSample();
  EXPECT_TRUE(wait_for("event: sample")) << got;
  Call("POST", "/v1/gpus/1/simulate", {{"xid", 79}});
  EXPECT_TRUE(wait_for("event: gpu\ndata: {\"healthy\":false,\"index\":1,\"reason\":\"XID 79"))
      << got;
  server_->Stop();  // the stream ends with the server
  reader.join();
  EXPECT_THAT(got, HasSubstr("id: 1\nevent: job\ndata: {\"at\":"));
  EXPECT_THAT(got, HasSubstr("id: 2\nevent: job"));
  EXPECT_THAT(got, HasSubstr("\"job\":" + std::to_string(id)));

  // Resumed after event 1: event 2 comes first.
  StartServer();
  req.last_event_id = "1";
  net::HttpResponse again = server_->Handle(req);
  std::string resumed;
  std::thread r2([&] {
    again.stream([&](std::string_view piece) {
      std::lock_guard lock(mu);
      resumed += piece;
      cv.notify_all();
      return resumed.find("id: 2\n") == std::string::npos;  // enough: the client goes
    });
  });
  {
    std::unique_lock lock(mu);
    // Anything that wakes the stream sends what it missed.
    lock.unlock();
    server_->TakeSample();
    lock.lock();
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10),
                            [&] { return resumed.find("id: 2\n") != std::string::npos; }));
  }
  r2.join();
  EXPECT_EQ(resumed.find("id: 1\n"), std::string::npos) << resumed;
  req.last_event_id = "two";
  int status = server_->Handle(req).status;
  EXPECT_EQ(status, 400);
}

TEST_F(ServerTest, AStreamThatMissedMoreThanFiveThousandEventsIsToldToStartAfresh) {
  StartServer();
  // 5,100 tasks of one array: 5,100 events in one transaction, all missed by a client that comes
  // back from event 0.
  json a = Call("POST", "/v1/jobs",
                {{"command", {"true"}}, {"array", "0-5099"}, {"resources", {{"gpus", 1}}}});
  ASSERT_EQ(a["array"]["tasks"], 5100) << a.dump();
  net::HttpRequest req;
  req.method = "GET";
  req.path = req.target = "/v1/stream";
  req.peer.unix_socket = true;
  req.peer.uid = geteuid();
  req.last_event_id = "0";
  net::HttpResponse res = server_->Handle(req);
  ASSERT_TRUE(res.stream);
  std::string got;
  // The hello, then the reset; nothing of the 5,100 events is replayed before it.
  res.stream([&](std::string_view piece) {
    got += piece;
    // Enough once the reset or (were there none) the last event came: the client goes.
    return got.find("event: reset") == std::string::npos &&
           got.find("id: 5100\n") == std::string::npos;
  });
  EXPECT_THAT(got, HasSubstr("event: reset\ndata: {\"missed\":5100,\"seq\":5100}"));
  EXPECT_EQ(got.find("event: job"), std::string::npos) << got.substr(0, 400);
  // Resumed within reach, the events are replayed instead.
  req.last_event_id = "1000";
  net::HttpResponse near = server_->Handle(req);
  std::string replayed;
  near.stream([&](std::string_view piece) {
    replayed += piece;
    return replayed.find("id: 1001\n") == std::string::npos;
  });
  EXPECT_EQ(replayed.find("event: reset"), std::string::npos);
}

TEST_F(ServerTest, MetricsShowJobsGpusAndLatencyInValidPrometheusText) {
  StartServer();
  const int64_t whole = Submit(1, 100);
  const int64_t part =
      Submit(0, 100, 0, {{"resources", {{"gpu_share", "30%"}, {"gpu_memory", "4GiB"}}}});
  Settle();
  ASSERT_EQ(State(part), "running");
  net::HttpRequest req;
  req.method = "GET";
  req.path = req.target = "/metrics";
  req.peer.unix_socket = true;
  req.peer.uid = geteuid();
  const std::string page = server_->Handle(req).body;
  const std::string host = Call("GET", "/v1/info").value("hostname", "");
  const std::string me = Call("GET", "/v1/info")["caller"]["user"];
  auto labels = [&](int64_t id, int gpu) {
    return fmt::format("{{job_id=\"{}\",gpu=\"{}\",user=\"{}\",hostname=\"{}\"}}", id, gpu, me,
                       host);
  };
  EXPECT_THAT(page, HasSubstr("tessera_job_gpu_share_ratio" + labels(whole, 0) + " 1\n"));
  EXPECT_THAT(page, HasSubstr("tessera_job_gpu_share_ratio" + labels(part, 1) + " 0.3\n"));
  EXPECT_THAT(page,
              HasSubstr("tessera_job_gpu_memory_limit_bytes" + labels(part, 1) + " 4294967296\n"));
  // What every component says of itself.
  EXPECT_THAT(page, ::testing::ContainsRegex(
                        "tessera_build_info\\{component=\"server\",version=\"[0-9.]+\"\\} 1\n"));
  for (const char* series : {"process_cpu_seconds_total ", "process_resident_memory_bytes ",
                             "process_start_time_seconds ", "process_open_fds "})
    EXPECT_THAT(page, HasSubstr(std::string("\n") + series)) << series;
  EXPECT_THAT(page, HasSubstr("tessera_scheduling_latency_seconds_count 2\n"));
  EXPECT_THAT(page, HasSubstr("tessera_jobs_running 2\n"));
  // A job on both GPUs: a series for each, the same job.
  Call("POST", "/v1/jobs/" + std::to_string(whole) + "/cancel");
  Call("POST", "/v1/jobs/" + std::to_string(part) + "/cancel");
  Advance(5);
  Settle();
  const int64_t both = Submit(2, 100);
  Settle();
  ASSERT_EQ(State(both), "running");
  const std::string two = server_->Handle(req).body;
  EXPECT_THAT(two, HasSubstr("tessera_job_gpu_share_ratio" + labels(both, 0) + " 1\n"));
  EXPECT_THAT(two, HasSubstr("tessera_job_gpu_share_ratio" + labels(both, 1) + " 1\n"));
  // The whole page is what Prometheus accepts, lint included.
  std::ofstream(dir_ + "/metrics.txt") << page;
  FILE* p = popen(("promtool check metrics < " + dir_ + "/metrics.txt 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  EXPECT_EQ(pclose(p), 0) << out;
}

// A share job owns its region file and may write the arbiter: truncating them (here in a loop that
// restores and shrinks them, as a hostile tenant would, so that some reads start on a whole file)
// while /metrics is scraped and the sampler runs leaves the server alive; the job's figures are
// marked unreadable instead. Mapped files killed the server with SIGBUS within a few scrapes.
TEST_F(ServerTest, AJobTruncatingItsRegionAndTheArbiterCannotCrashTheServer) {
  StartServer();
  const int64_t id =
      Submit(0, 100, 0, {{"resources", {{"gpu_share", "30%"}, {"gpu_memory", "1GiB"}}}});
  Settle();
  ASSERT_EQ(State(id), "running");
  const int gpu = Job(id)["placement"]["gpus"][0]["index"].get<int>();
  const std::string region = config_.state_dir + "/regions/" + std::to_string(id) + ".region";
  const std::string arbiter = config_.state_dir + "/arbiter/gpu.arbiter";
  auto contents = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string whole_region = contents(region), whole_arbiter = contents(arbiter);
  ASSERT_EQ(whole_region.size(), sizeof(shim::RegionData));
  ASSERT_EQ(whole_arbiter.size(), sizeof(shim::ArbiterData));
  net::HttpRequest req;
  req.method = "GET";
  req.path = req.target = "/metrics";
  req.peer.unix_socket = true;
  req.peer.uid = geteuid();
  std::atomic<bool> stop{false};
  std::thread tenant([&] {
    const int r = open(region.c_str(), O_RDWR), a = open(arbiter.c_str(), O_RDWR);
    while (!stop.load()) {
      (void)!pwrite(r, whole_region.data(), whole_region.size(), 0);
      (void)!pwrite(a, whole_arbiter.data(), whole_arbiter.size(), 0);
      (void)!ftruncate(r, 0);
      (void)!ftruncate(a, 4096);
    }
    close(r);
    close(a);
  });
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(server_->Handle(req).status, 200);
    server_->TakeSample();
  }
  stop = true;
  tenant.join();
  // Left truncated: the job's usage reads as unknown, the rest of the page as before.
  ASSERT_EQ(truncate(region.c_str(), 0), 0);
  const std::string page = server_->Handle(req).body;
  const std::string host = Call("GET", "/v1/info").value("hostname", "");
  const std::string me = Call("GET", "/v1/info")["caller"]["user"];
  EXPECT_THAT(page,
              HasSubstr(fmt::format("tessera_job_usage_readable{{job_id=\"{}\",gpu=\"{}\",user="
                                    "\"{}\",hostname=\"{}\"}} 0\n",
                                    id, gpu, me, host)));
  EXPECT_THAT(page, ::testing::Not(HasSubstr(
                        fmt::format("tessera_job_gpu_memory_used_bytes{{job_id=\"{}\"", id))));
  EXPECT_THAT(page, HasSubstr("tessera_jobs_running 1\n"));
  // Restored as a region again, it reads again.
  std::ofstream(region, std::ios::binary) << whole_region;
  EXPECT_THAT(server_->Handle(req).body,
              HasSubstr(fmt::format("tessera_job_usage_readable{{job_id=\"{}\",gpu=\"{}\",user="
                                    "\"{}\",hostname=\"{}\"}} 1\n",
                                    id, gpu, me, host)));
  Advance(100);
  Settle();
  EXPECT_EQ(State(id), "succeeded") << "its end is recorded";
}

TEST_F(ServerTest, AnAdminMakesASimulatedGpuSick) {
  StartServer();
  int status = 0;
  json j = Call("POST", "/v1/gpus/1/simulate", {{"xid", 79}}, &status);
  EXPECT_EQ(status, 202) << j.dump();
  Call("POST", "/v1/gpus/7/simulate", {{"xid", 79}}, &status);
  EXPECT_EQ(status, 404);
  Call("POST", "/v1/gpus/1/simulate", {{"xid", -1}}, &status);
  EXPECT_EQ(status, 400);
  Call("POST", "/v1/gpus/1/simulate", {{"lost", true}, {"xid", 1}}, &status);
  EXPECT_EQ(status, 400);
  Call("GET", "/v1/gpus/1/simulate", nullptr, &status);
  EXPECT_EQ(status, 405);
}

TEST_F(ServerTest, PagesAreServedToAnyoneTheApiOnlyWithAToken) {
  StartServer();
  net::HttpRequest r;
  r.method = "GET";
  r.peer.address = "127.0.0.1:5555";  // TCP, no token
  for (const char* page : {"/", "/ui/", "/ui/app.js", "/ui/app.css"}) {
    r.path = r.target = page;
    net::HttpResponse res = server_->Handle(r);
    EXPECT_EQ(res.status, 200) << page;
    EXPECT_THAT(res.headers["Content-Security-Policy"], HasSubstr("script-src 'self'")) << page;
    EXPECT_FALSE(res.body.empty()) << page;
  }
  r.path = r.target = "/";
  EXPECT_EQ(server_->Handle(r).content_type, "text/html; charset=utf-8");
  r.path = r.target = "/ui/nothing.js";
  EXPECT_EQ(server_->Handle(r).status, 404);
  r.path = r.target = "/v1/gpus";
  EXPECT_EQ(server_->Handle(r).status, 401);
  r.path = r.target = "/v1/stream";
  EXPECT_EQ(server_->Handle(r).status, 401);
}

// The health watch is a thread of its own (reading the simulated machine's events); what follows
// is the server's, turn by turn on the fake clock.
TEST_F(ServerTest, AnUnhealthyGpusJobIsStoppedAndRunsAgainOnAnother) {
  StartServer(/*health=*/true);
  int64_t id = Submit(1, 100);
  Settle();
  ASSERT_EQ(Job(id)["placement"]["gpus"][0]["index"], 0);
  int status = 0;
  Call("POST", "/v1/gpus/0/simulate", {{"xid", 79}}, &status);
  ASSERT_EQ(status, 202);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Call("GET", "/v1/gpus")["gpus"][0]["healthy"].get<bool>()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the health watch never told";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Settle();  // SIGTERM to the job on it
  EXPECT_EQ(State(id), "running") << "still stopping";
  Advance(2);  // the fake launcher's stop latency
  Settle();
  json j = Job(id);
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["placement"]["gpus"][0]["index"], 1) << j.dump();
  std::vector<std::string> states;
  for (const json& e : j["events"]) states.push_back(e["state"]);
  EXPECT_THAT(states,
              ::testing::ElementsAre("queued", "running", "preempted", "queued", "running"));
  EXPECT_THAT(j["events"][2]["reason"].get<std::string>(), HasSubstr("GPU 0 turned unhealthy"));
  json gpus = Call("GET", "/v1/gpus");
  EXPECT_EQ(gpus["gpus"][0]["health_reason"], "XID 79");
  EXPECT_EQ(gpus["gpus"][0]["allocated_milli"], 0);
}

}  // namespace
}  // namespace tessera::server
