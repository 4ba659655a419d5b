// The server on a fake clock with a fake launcher: run-time history and predictions, restarts and
// a second server, the arbiter file, priorities, quotas and summaries, the event stream, metrics,
// hostile region files and GPU health.
#include <sys/mount.h>

#include <set>

#include "tessera/server/api.h"
#include "tessera/server/server_test_fixture.h"
#include "tessera/server/server_util.h"

namespace tessera::server {
namespace {

using namespace testing;  // NOLINT: the fixture

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
  EXPECT_EQ(w["prediction"].get<std::string>(), "its max runtime")
      << "not from 'train': another job's runs say nothing of this one";
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

// A restart learns from the store what the ends taught as they happened: a failure whose limit
// refused allocations teaches its kind what it asked (the next runs are sized past it), and a trial
// teaches the "auto" kind its use (not its cut-short run time as a run of its own kind).
TEST_F(ServerTest, ARestartRelearnsWhatTrialsAndOutgrownFailuresTaught) {
  config_.auto_size_trial_s = 0;  // a kind never measured runs unlimited (the trial: below)
  StartServer();
  char err[256] = "";
  const uint64_t none = 0;
  auto hold = [&](int64_t id, std::initializer_list<uint64_t> mibs) {
    std::unique_ptr<shim::Region> region(shim::Region::Attach(
        (config_.state_dir + "/regions/" + std::to_string(id) + ".region").c_str(), &none, 1, err,
        sizeof err));
    EXPECT_NE(region, nullptr) << err;
    int refused = 0;
    for (uint64_t mib : mibs) refused += region && !region->Reserve(0, mib << 20);
    return refused;
  };
  const json grow = {{"name", "grow"},
                     {"resources", {{"gpu_share", "30%"}, {"gpu_memory", "auto"}}},
                     {"max_runtime_s", 5}};
  auto sized_mib = [&](int64_t id) { return ParseJobSpec(Job(id)["spec"].dump())->gpu_memory_mib; };
  // Measured once: 800 MiB.
  const int64_t first = Submit(0, 4, 0, grow);
  Settle();
  ASSERT_EQ(State(first), "running");
  EXPECT_EQ(hold(first, {800}), 0);
  Advance(4);
  Settle();
  ASSERT_EQ(State(first), "succeeded");
  // Sized 1024 MiB from it; asks 600 then 700 more, refused: it wanted 1300 MiB. Its time runs
  // out: failed, saying so.
  const int64_t second = Submit(0, 100, 0, grow);
  Settle();
  ASSERT_EQ(sized_mib(second), 1024);
  EXPECT_EQ(hold(second, {600, 700}), 1);
  Advance(6);
  Settle();
  Advance(3);
  Settle();
  json j = Job(second);
  ASSERT_EQ(j["state"], "failed") << j.dump();
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("refused 1 allocation"));
  const int64_t third = Submit(0, 1, 0, grow);
  const int64_t learnt = sized_mib(third);
  EXPECT_GE(learnt, 1300 * 12 / 10) << "sized past what it asked";
  // A trial of another job, on a share: its 2000 MiB teach the "auto" kind of it.
  const json probe = {{"name", "probe"}, {"resources", {{"gpu_share", "50%"}}}, {"trial_s", 10}};
  const int64_t trial = Submit(0, 100, 0, probe);
  Settle();
  ASSERT_EQ(State(trial), "running");
  EXPECT_EQ(hold(trial, {2000}), 0);
  Advance(10);
  Settle();
  Advance(3);
  Settle();
  ASSERT_EQ(State(trial), "succeeded");
  json asked_auto = probe;
  asked_auto.erase("trial_s");
  asked_auto["resources"] = {{"gpu_share", "auto"}, {"gpu_memory", "auto"}};
  EXPECT_EQ(sized_mib(Submit(0, 1, 0, asked_auto)), 2560) << "2000 + 20%, rounded up";

  // After a restart, the same.
  StartServer();
  EXPECT_EQ(sized_mib(Submit(0, 1, 0, grow)), learnt);
  EXPECT_EQ(sized_mib(Submit(0, 1, 0, asked_auto)), 2560);
  json again = probe;
  again.erase("trial_s");
  again["max_runtime_s"] = 100;
  const int64_t run = Submit(0, 100, 0, again);
  Settle();
  EXPECT_EQ(Job(run).value("prediction", ""), "its max runtime")
      << "the trial's cut-short run time predicts nothing: " << Job(run).dump();
}

// The server's trial of an "auto" job re-queues it sized from what the trial measured. A restart
// before that run ends keeps what the trial taught: the next job of its kind is sized from it, not
// tried again.
TEST_F(ServerTest, ARestartBeforeATriedJobEndsKeepsWhatItsTrialMeasured) {
  config_.auto_size_trial_s = 10;
  own_source_ = true;
  StartServer();
  const json svc = {{"name", "svc"},
                    {"resources", {{"gpu_share", "auto"}, {"gpu_memory", "auto"}}}};
  auto spec_of = [&](int64_t id) { return *ParseJobSpec(Job(id)["spec"].dump()); };
  const int64_t first = Submit(0, 1000, 0, svc);
  Settle();
  ASSERT_EQ(State(first), "running");
  ASSERT_EQ(spec_of(first).sizing_trial_s, 10) << "never measured: tried first";
  // Its trial runs on a whole GPU: the GPU's readings are its use (40% busy, 2000 MiB).
  const int gpu = Job(first)["placement"]["gpus"][0]["index"].get<int>();
  ASSERT_TRUE(
      source_->SetTelemetry(gpu, {.utilization = 0.4, .memory_used_bytes = uint64_t{2000} << 20})
          .ok());
  Advance(5);
  server_->TakeSample();
  Advance(5);
  Settle();
  Advance(3);
  Settle();
  json j = Job(first);
  ASSERT_NE(j["state"], "succeeded") << j.dump();
  ASSERT_EQ(spec_of(first).sizing_trial_s, 0) << "re-queued sized from its trial: " << j.dump();
  StartServer();
  const JobSpec next = spec_of(Submit(0, 1, 0, svc));
  EXPECT_EQ(next.sizing_trial_s, 0) << "not tried again";
  EXPECT_EQ(next.gpu_memory_mib, 2560) << "2000 MiB measured + 20%, rounded up";
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

// A full disk loses no job end (issue 51): the state folder on a 24 MiB file system the test
// mounts, filled to the last block while two jobs run. The first end is recorded at once (the
// server gives up its 8 MiB reserve for it, and refuses submits: 507); filled again, the second
// end is kept and recorded as soon as there is room; then the reserve is made again and submits
// are taken. Before, the end failed with "database or disk is full" and the job stayed running.
TEST_F(ServerTest, AFullDiskLosesNoJobsEnd) {
  ASSERT_EQ(geteuid(), 0u) << "this test mounts a small file system (root, as in CI)";
  fs::create_directories(config_.state_dir);
  ASSERT_EQ(mount("tmpfs", config_.state_dir.c_str(), "tmpfs", 0, "size=24m,mode=0755"), 0)
      << strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{config_.state_dir};
  // (limits.min_free_disk keeps new work off a nearly full disk; a running job fills it anyway)
  config_.min_free_disk_bytes = 0;
  auto fill = [&](const std::string& name) {
    const int fd = open((config_.state_dir + "/" + name).c_str(), O_WRONLY | O_CREAT, 0600);
    static char block[1 << 16];
    while (write(fd, block, sizeof block) > 0) {
    }
    while (write(fd, block, 512) > 0) {
    }
    close(fd);
  };
  StartServer();
  const int64_t a = Submit(1, 5), b = Submit(1, 10);
  Settle();
  ASSERT_EQ(State(a), "running");
  ASSERT_EQ(State(b), "running");
  fill("fill-1");
  Advance(6);
  Settle();
  EXPECT_EQ(State(a), "succeeded") << "recorded with the reserve";
  int status = 0;
  json refused = Call("POST", "/v1/jobs", {{"command", {"true"}}}, &status);
  EXPECT_EQ(status, 507) << refused.dump();
  fill("fill-2");  // what the reserve gave back, taken too
  Advance(5);
  Settle();
  EXPECT_EQ(State(b), "running") << "its end could not be recorded yet";
  fs::remove(config_.state_dir + "/fill-1");
  fs::remove(config_.state_dir + "/fill-2");
  Advance(1);
  Settle();
  EXPECT_EQ(State(b), "succeeded") << "recorded once there was room";
  EXPECT_TRUE(fs::exists(config_.state_dir + "/reserve"));
  Call("POST", "/v1/jobs", {{"command", {"true"}}}, &status);
  EXPECT_EQ(status, 201);
  server_.reset();
}

}  // namespace
}  // namespace tessera::server
