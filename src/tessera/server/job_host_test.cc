// The dispatcher and its job host (job_host.h): what a job is given on the machine - its cgroup's
// device rules and limits, its share's region and the arbiter's users - asked of a FakeJobHost,
// which touches nothing; and what the dispatcher does with the host's answers (a refusal to
// confine, a cgroup's OOM count, a cgroup still busy).
#include <future>

#include "tessera/server/server_test_fixture.h"

namespace tessera::server::testing {
namespace {

class JobHostTest : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    // Device nodes as the server finds them: character devices under device_dir, here links to
    // three of the machine's own that no job gets by default, standing for nvidia0, nvidia1 and
    // nvidiactl.
    config_.device_dir = dir_ + "/dev";
    fs::create_directories(config_.device_dir);
    const char* names[] = {"nvidia0", "nvidia1", "nvidiactl"};
    size_t n = 0;
    for (const char* dev : {"/dev/kmsg", "/dev/console", "/dev/fuse", "/dev/autofs", "/dev/tty0",
                            "/dev/tty1", "/dev/loop-control", "/dev/cpu_dma_latency"}) {
      const std::optional<DeviceRule> rule = RuleFor(dev);
      if (n == 3 || !rule || Allows(BaseDeviceRules(), rule->major, rule->minor)) continue;
      fs::create_symlink(dev, config_.device_dir + "/" + names[n]);
      nodes_.push_back(*rule);
      ++n;
    }
    ASSERT_EQ(n, 3u) << "this machine has too few character devices for the test";
    host_ = std::make_unique<FakeJobHost>(launcher_);
  }
  static bool Allows(const std::vector<DeviceRule>& rules, int64_t major, int64_t minor) {
    for (const DeviceRule& r : rules) {
      if (r.type == 'c' && r.major == major && r.minor == minor && r.access == "rwm") return true;
    }
    return false;
  }
  bool Allows(const CgroupLimits& l, int node) const {
    return Allows(l.devices, nodes_[node].major, nodes_[node].minor);
  }
  std::vector<DeviceRule> nodes_;  // nvidia0, nvidia1, nvidiactl
};

TEST_F(JobHostTest, AConfinedJobsCgroupHasItsOwnGpuTheControlNodeAndItsLimits) {
  host_->set_confines(true);
  config_.pids_max = 512;
  StartServer();
  const int64_t a =
      Submit(1, 100, 0, {{"resources", {{"gpus", 1}, {"memory", "2GiB"}, {"cpus", 1.5}}}});
  const int64_t b = Submit(1, 100);
  Settle();
  ASSERT_EQ(State(a), "running");
  ASSERT_EQ(State(b), "running");
  const auto launches = host_->launches();
  const int gpu_a = Job(a)["placement"]["gpus"][0]["index"];
  ASSERT_TRUE(launches.at(a).limits.has_value());
  const CgroupLimits& la = *launches.at(a).limits;
  // Its own GPU's node, never the other's; the control node.
  EXPECT_TRUE(Allows(la, gpu_a));
  EXPECT_FALSE(Allows(la, 1 - gpu_a));
  EXPECT_TRUE(Allows(la, 2));
  EXPECT_EQ(la.memory_bytes, int64_t{2} << 30);
  EXPECT_EQ(la.cpu_milli, 1500);
  EXPECT_EQ(la.pids_max, 512);
  const CgroupLimits& lb = *launches.at(b).limits;
  EXPECT_TRUE(Allows(lb, 1 - gpu_a));
  EXPECT_FALSE(Allows(lb, gpu_a));
  EXPECT_TRUE(Allows(lb, 2));
  EXPECT_EQ(host_->cgroups(), (std::set<int64_t>{a, b}));
}

TEST_F(JobHostTest, AJobTheHostCannotConfineFailsUnstartedAndItsGpuGoesToTheNext) {
  host_->set_confines(true);
  host_->RefuseConfinement("no device controller");
  StartServer();
  const int64_t a = Submit(2, 100);
  Settle();
  EXPECT_EQ(State(a), "failed");
  EXPECT_THAT(Job(a)["reason"].get<std::string>(),
              HasSubstr("cannot confine the job: no device controller"));
  EXPECT_TRUE(StartedJobs().empty());  // never started unconfined
  host_->RefuseConfinement("");
  const int64_t b = Submit(2, 100);
  Settle();
  EXPECT_EQ(State(b), "running");
  EXPECT_EQ(StartedJobs(), std::vector<int64_t>{b});
}

TEST_F(JobHostTest, TheCgroupsOomCountNamesTheMemoryLimitAndABusyCgroupIsRemovedLater) {
  host_->set_confines(true);
  StartServer();
  int status = 0;
  json j =
      Call("POST", "/v1/jobs",
           {{"command", {"false"}}, {"resources", {{"gpus", 1}, {"memory", "1GiB"}}}}, &status);
  ASSERT_EQ(status, 201) << j.dump();
  const int64_t id = j["id"];
  host_->SetUsage(id,
                  CgroupUsage{.cpu_seconds = 0.5, .peak_memory_bytes = 1 << 30, .oom_kills = 2});
  host_->KeepBusy(id, 2);
  Settle();
  EXPECT_EQ(State(id), "failed");
  EXPECT_THAT(Job(id)["reason"].get<std::string>(),
              HasSubstr("over its memory limit of 1024 MiB: the kernel killed 2 of its processes"));
  // Still busy at its end: asked again at later turns until it goes.
  for (int i = 0; i < 5 && host_->cgroups().contains(id); ++i) {
    Advance(1);
    server_->RunOnce();
  }
  EXPECT_FALSE(host_->cgroups().contains(id));
  EXPECT_EQ(host_->unconfine_calls(id), 3);
}

// GET /v1/jobs/N says what a job used of what it held (tessera eff): so far while it runs, then
// with its cgroup's CPU and memory at its end.
TEST_F(JobHostTest, AJobsEfficiencyIsWhatItUsedOfWhatItHeld) {
  host_->set_confines(true);
  StartServer();
  const int64_t id =
      Submit(1, 100, 0, {{"resources", {{"gpus", 1}, {"cpus", 2}, {"memory", "4GiB"}}}});
  Settle();
  ASSERT_EQ(State(id), "running");
  Advance(40);
  json e = Job(id)["efficiency"];
  ASSERT_TRUE(e.is_object()) << Job(id).dump();

  EXPECT_EQ(e["running"], true);
  EXPECT_DOUBLE_EQ(e["elapsed_s"].get<double>(), 40);
  EXPECT_DOUBLE_EQ(e["gpus"].get<double>(), 1);
  host_->SetUsage(id, CgroupUsage{.cpu_seconds = 100, .peak_memory_bytes = int64_t{1} << 30});
  Advance(60);
  Settle();
  ASSERT_EQ(State(id), "succeeded");
  e = Job(id)["efficiency"];
  ASSERT_TRUE(e.contains("cpu_pct")) << Job(id).dump();
  EXPECT_EQ(e["running"], false);
  EXPECT_DOUBLE_EQ(e["elapsed_s"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(e["cpu_pct"].get<double>(), 50) << "100 CPU-s of 2 CPUs over 100 s";
  EXPECT_DOUBLE_EQ(e["memory_pct"].get<double>(), 25);
  EXPECT_GT(e["gpu_memory_given_mib"].get<int64_t>(), 0) << "the whole GPU's memory";
  const int64_t queued = Submit(1, 100, 0, {{"hold", true}});
  EXPECT_FALSE(Job(queued).contains("efficiency")) << "never started: nothing to say";
}

TEST_F(JobHostTest, AShareGetsItsRegionAndItsOwnerTheArbiterWhileItRuns) {
  StartServer();
  const int64_t id =
      Submit(0, 10, 0, {{"resources", {{"gpu_share", "30%"}, {"gpu_memory", "4GiB"}}}});
  const int64_t whole = Submit(1, 10);
  Settle();
  ASSERT_EQ(State(id), "running");
  const auto launches = host_->launches();
  ASSERT_TRUE(launches.at(id).share.has_value());
  const ShareLimits& share = *launches.at(id).share;
  EXPECT_EQ(share.memory_bytes, uint64_t{4} << 30);
  EXPECT_EQ(share.share_milli, 300);
  EXPECT_EQ(share.physical_gpus.size(), 1u);
  EXPECT_EQ(share.arbiter, config_.state_dir + "/arbiter/gpu.arbiter");
  EXPECT_EQ(host_->regions(), std::set<std::string>{share.region});
  EXPECT_FALSE(launches.at(whole).share.has_value());  // a whole GPU has no region
  EXPECT_EQ(host_->arbiter_users(), (std::map<uint32_t, int>{{geteuid(), 1}}));
  Advance(11);
  Settle();
  EXPECT_EQ(State(id), "succeeded");
  EXPECT_TRUE(host_->regions().empty());
  EXPECT_TRUE(host_->arbiter_users().empty());
}

// A job's start is recorded (and said on the event stream) before its process is made; a reader
// in between (the dashboard, woken by that event) sees it running and on its GPU, never running on
// none: no further event comes to correct it.
TEST_F(JobHostTest, AJobBeingLaunchedIsListedOnItsGpuAsSoonAsItsStartIsRecorded) {
  StartServer();
  std::vector<json> seen;
  host_->set_on_launch([&](int64_t) {
    seen.push_back(Call("GET", "/v1/gpus"));
    seen.push_back(Call("GET", "/v1/jobs?state=running"));
  });
  const int64_t id = Submit(1, 10);
  Settle();
  ASSERT_EQ(State(id), "running");
  ASSERT_EQ(seen.size(), 2u);
  const json& running = seen[1]["jobs"];
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0]["id"], id);
  const int gpu = Job(id)["placement"]["gpus"][0]["index"];
  for (const json& g : seen[0]["gpus"]) {
    EXPECT_EQ(g["jobs"], g["index"] == gpu ? json::array({id}) : json::array()) << g.dump();
  }
  // And once running, the same.
  EXPECT_EQ(Call("GET", "/v1/gpus")["gpus"][gpu]["jobs"], json::array({id}));
}

// The readers (the API's job, GPU, quota and info pages, /metrics) answer from the views (views.h)
// while the scheduling loop holds its lock - here for as long as the host takes to look at the
// arbiter - and what they answer is the machine as it stands: the running job on its GPU, and a
// queued job with why it waits.
TEST_F(JobHostTest, ReadersAnswerWhileTheSchedulingLoopHoldsItsLock) {
  StartServer();
  const int64_t id = Submit(1, 100);
  Settle();
  ASSERT_EQ(State(id), "running");
  const int gpu = Job(id)["placement"]["gpus"][0]["index"];
  const int64_t queued = Submit(static_cast<int>(Call("GET", "/v1/gpus")["gpus"].size()), 10);
  Settle();
  ASSERT_EQ(State(queued), "queued");
  const json waiting = Job(queued)["waiting"];
  ASSERT_TRUE(waiting.is_string() && !waiting.get<std::string>().empty()) << Job(queued).dump();
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  host_->set_on_repair_arbiter([&entered, released] {
    entered.set_value();
    released.wait();
  });
  Advance(2);  // the loop looks at the arbiter about once a second
  std::thread loop([&] { server_->RunOnce(); });
  entered.get_future().wait();  // the loop now holds its lock until `release`
  auto reads = std::async(std::launch::async, [&] {
    json out;
    out["job"] = Job(id);
    out["queued"] = Job(queued);
    out["gpus"] = Call("GET", "/v1/gpus");
    out["info"] = Call("GET", "/v1/info");
    out["quotas"] = Call("GET", "/v1/quotas");
    out["metrics"] = Call("GET", "/metrics");  // text: parsed as nothing, asked all the same
    return out;
  });
  const bool answered = reads.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  host_->set_on_repair_arbiter(nullptr);
  release.set_value();
  loop.join();
  ASSERT_TRUE(answered) << "a reader waited for the scheduling lock";
  const json out = reads.get();
  EXPECT_EQ(out["job"]["state"], "running");
  EXPECT_EQ(out["queued"]["state"], "queued");
  EXPECT_EQ(out["queued"]["waiting"], waiting) << out["queued"].dump();
  EXPECT_EQ(out["gpus"]["gpus"][gpu]["jobs"], json::array({id})) << out["gpus"].dump();
  EXPECT_EQ(out["info"]["running"], 1) << out["info"].dump();
}

}  // namespace
}  // namespace tessera::server::testing
