// The real `tessera server` binary on a temporary socket with a simulated machine: real processes
// (shell commands) submitted through the API and the CLI, then placement, environment, logs,
// cancel, preemption, quota, restart after kill -9, an unhealthy GPU and bad requests checked.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "../capture.h"
#include "daemon.h"
#include "fake_apiserver.h"
#include "tessera/net/http.h"
#include "tessera/server/cgroup.h"
#include "tessera/server/file_acl.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"
#include "tessera/shim/version5_arbiter_file.h"

extern char** environ;

namespace {

using nlohmann::json;
using tessera::net::HttpClient;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

constexpr char kToken[] = "bob-token-0123456789";

using tessera::test::Cli;
using tessera::test::Daemon;
using tessera::test::MpsServer;
using tessera::test::Shell;

TEST(TesseraServer, RunsAJobOnItsGpuWithEnvAndLogs) {
  Daemon d("basic");
  json info = d.Call("GET", "/v1/info");
  EXPECT_TRUE(info["simulated"].get<bool>()) << "a simulated machine is said in the API";
  int64_t id = d.Submit(
      Shell("echo gpu=$CUDA_VISIBLE_DEVICES nv=$NVIDIA_VISIBLE_DEVICES job=$TESSERA_JOB_ID; "
            "echo oops >&2; exit 3",
            {{"gpus", 1}}));
  json j = d.WaitFor(id, "failed");
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["reason"], "exit code 3");
  std::string uuid = j["placement"]["gpus"][0]["uuid"];
  EXPECT_THAT(uuid, HasSubstr("GPU-"));
  EXPECT_EQ(d.Logs(id), "gpu=" + uuid + " nv=" + uuid + " job=" + std::to_string(id) + "\n");
  EXPECT_EQ(d.Logs(id, "stderr"), "oops\n");
  std::vector<std::string> states;
  for (const json& e : j["events"]) states.push_back(e["state"]);
  EXPECT_EQ(states, (std::vector<std::string>{"queued", "running", "failed"}));
  // A model named as the machine names it is placed.
  json by_model = Shell("true", {{"gpus", 1}, {"model", "Tesla T4"}});
  d.WaitFor(d.Submit(by_model), "succeeded");
  // A job without GPUs sees none.
  int64_t none = d.Submit(Shell("echo [$CUDA_VISIBLE_DEVICES] $NVIDIA_VISIBLE_DEVICES"));
  d.WaitFor(none, "succeeded");
  EXPECT_EQ(d.Logs(none), "[] void\n");
}

TEST(TesseraServer, FractionalJobsGetTheInterceptLibraryAndTheirLimits) {
  Daemon d("fraction");
  int64_t id =
      d.Submit(Shell("echo $LD_PRELOAD; echo $TESSERA_CUDA_MEM_LIMIT $TESSERA_CUDA_COMPUTE_SHARE",
                     {{"gpu_memory", "4GiB"}, {"gpu_share", "30%"}}));
  d.WaitFor(id, "succeeded");
  std::string out = d.Logs(id);
  // The server's own copy, installed by rename in its state folder: a rebuild writes the build's
  // library in place, which would kill the jobs that have it mapped (issue 49).
  const std::string copy = d.dir() + "/state/lib/libtessera-cuda.so";
  EXPECT_THAT(out, HasSubstr(copy + "\n"));
  EXPECT_EQ(tessera::test::ReadFile(copy),
            tessera::test::ReadFile(fs::path(TESSERA_BINARY).parent_path() / "libtessera-cuda.so"));
  EXPECT_EQ(fs::status(copy).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                fs::perms::others_read | fs::perms::others_exec);
  EXPECT_THAT(out, HasSubstr(std::to_string(4ull << 30) + " 30%\n"));
  // Three 30% shares fit on two GPUs without a whole GPU being taken: the fourth still fits.
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(d.Submit(Shell("sleep 30", {{"gpu_share", 30}})));
  for (int64_t x : ids) d.WaitFor(x, "running");
  json gpus = d.Call("GET", "/v1/gpus");
  EXPECT_EQ(
      gpus["gpus"][0]["allocated_milli"].get<int>() + gpus["gpus"][1]["allocated_milli"].get<int>(),
      1800);
  for (int64_t x : ids) d.Call("POST", "/v1/jobs/" + std::to_string(x) + "/cancel");
}

TEST(TesseraServer, AShareOnTwoGpusGetsALimitOnEachAndOneGangAtTheArbiter) {
  Daemon d("ranks");
  // Two ranks, one per GPU, each with half of its GPU and 1 GiB of it: each rank's 800 MiB fits
  // on its own GPU and 300 MiB more does not (before, the region limited device 0 only, so the
  // second rank's GPU had no limit); their slices at the arbiter are one gang (both GPUs' indices
  // in TESSERA_CUDA_ARBITER_GPUS).
  const std::string rank = std::string("echo gpus=$TESSERA_CUDA_ARBITER_GPUS; exec ") +
                           TESSERA_CUDA_CLIENT +
                           " link device:$LOCAL_RANK alloc:800 alloc:300 work:200:500:4:0:0:200";
  json spec = Shell(rank, {{"gpus", 2}, {"gpu_share", "50%"}, {"gpu_memory", "1GiB"}});
  spec["tasks_per_gpu"] = 1;
  spec["env"] = {{"FAKE_CUDA_DEVICES", "2"}};
  const int64_t id = d.Submit(spec);
  json j = d.WaitFor(id, "succeeded");
  ASSERT_EQ(j["placement"]["gpus"].size(), 2u) << j.dump();
  const int g0 = j["placement"]["gpus"][0]["index"], g1 = j["placement"]["gpus"][1]["index"];
  EXPECT_NE(g0, g1);
  EXPECT_EQ(j["placement"]["milli_per_gpu"], 500);
  EXPECT_EQ(j["placement"]["memory_mib_per_gpu"], 1024);
  const std::string gpus = fmt::format("gpus={},{}\n", g0, g1);
  const std::string each = gpus + "ok\nok\noom\ngpu_us ";
  EXPECT_THAT(d.Logs(id), HasSubstr(each)) << d.Logs(id, "stderr");
  const std::string second =
      d.Call("GET", "/v1/jobs/" + std::to_string(id) + "/logs?stream=stdout&task=1")
          .value("data", "");
  EXPECT_THAT(second, HasSubstr(each));
  ASSERT_TRUE(j["usage"]["gpu_utilization_pct"].is_number()) << j.dump();
  EXPECT_EQ(j["usage"]["gpu_peak_memory_mib"], 800) << "the most on one GPU";
  // The same from the CLI (the README's line).
  const std::string out =
      Cli(d, "submit --gpus 2 --gpu-share 50% --tasks-per-gpu 1 -- sh -c 'echo $TESSERA_NTASKS'");
  int64_t cli = 0;
  ASSERT_EQ(sscanf(out.c_str(), "submitted job %ld", &cli), 1) << out;
  json c = d.WaitFor(cli, "succeeded");
  EXPECT_EQ(c["placement"]["gpus"].size(), 2u);
  EXPECT_EQ(d.Logs(cli), "2\n");
  EXPECT_THAT(Cli(d, "ls --ended"), HasSubstr("50% on 2 GPUs"));
}

TEST(TesseraServer, AShareIsMeasuredUnderTheInterceptLibraryAndItsNextRunIsPredicted) {
  Daemon d("measured");
  // A CUDA program (against the fake driver) holds 700 MiB at most and runs kernels for 300 ms
  // under its 50% share: the server reads what the intercept library counted - the region's peak
  // and the GPU time the arbiter charged it.
  const json spec = {{"name", "measured"},
                     {"command",
                      {TESSERA_CUDA_CLIENT, "link", "alloc:500", "alloc:200", "freeall",
                       "alloc:100", "work:300:1000:4:0:0:300", "freeall"}},
                     {"resources", {{"gpu_memory", "1GiB"}, {"gpu_share", "50%"}}}};
  const int64_t id = d.Submit(spec);
  json j = d.WaitFor(id, "succeeded");
  ASSERT_TRUE(j["usage"].is_object()) << j.dump();
  EXPECT_EQ(j["usage"]["gpu_peak_memory_mib"], 700) << d.Logs(id) << d.Logs(id, "stderr");
  ASSERT_TRUE(j["usage"]["gpu_utilization_pct"].is_number()) << j.dump();
  const double util = j["usage"]["gpu_utilization_pct"].get<double>();
  EXPECT_GT(util, 0);
  EXPECT_LE(util, 100);
  EXPECT_THAT(Cli(d, "show " + std::to_string(id)), HasSubstr("peak GPU memory 700 MiB"));
  // The next run of it is predicted to keep the GPU as busy.
  json again = spec;
  again["command"] = {"sleep", "30"};
  const int64_t next = d.Submit(again);
  json n = d.WaitFor(next, "running");
  EXPECT_EQ(n["expected_gpu_utilization_pct"], std::lround(util)) << n.dump();
  EXPECT_THAT(Cli(d, "show " + std::to_string(next)),
              HasSubstr("p75 of " + n["owner"].get<std::string>() + "'s runs of 'measured'"));
  d.Call("POST", "/v1/jobs/" + std::to_string(next) + "/cancel");
}

// Two CUDA programs that would each keep a GPU busy for `ms`, each given half of a GPU (the
// fullest that fits: the same one).
std::vector<int64_t> SubmitTwoBusyHalves(Daemon& d, int ms) {
  const std::string work = fmt::format("work:{0}:500:4:0:0:{0}", ms);
  std::vector<int64_t> ids;
  for (const char* name : {"held-a", "held-b"}) {
    ids.push_back(d.Submit({{"name", name},
                            {"command", {TESSERA_CUDA_CLIENT, "link", work}},
                            {"resources", {{"gpu_memory", "1GiB"}, {"gpu_share", "50%"}}}}));
  }
  return ids;
}

// Two CUDA programs that would each keep a GPU busy, given half of the same GPU: each is charged
// about its half, and its launches waited for the GPU meanwhile - its usage and `tessera eff` say
// how long, and that it would have used more than it was charged (what its kind learns).
TEST(TesseraServer, SharesThatWantMoreThanTheirShareSayTheyWereHeldBack) {
  Daemon d("held");
  const std::vector<int64_t> ids = SubmitTwoBusyHalves(d, 2000);
  std::vector<json> done;
  for (int64_t id : ids) done.push_back(d.WaitFor(id, "succeeded"));
  ASSERT_EQ(done[0]["placement"]["gpus"], done[1]["placement"]["gpus"])
      << "the fullest GPU that fits: the same one";
  for (const json& j : done) {
    const json& u = j["usage"];
    ASSERT_TRUE(u.contains("gpu_held_back_pct")) << j.dump();
    const double util = u["gpu_utilization_pct"].get<double>();
    const double held = u["gpu_held_back_pct"].get<double>();
    const double demand = u["gpu_demand_pct"].get<double>();
    // Overlapping most of their runs, each waited for the other's slices.
    EXPECT_GT(held, 15) << u.dump();
    EXPECT_LT(held + util, 105) << "waiting and running do not overlap: " << u.dump();
    EXPECT_GT(demand, util + 10) << u.dump();
    EXPECT_DOUBLE_EQ(j["efficiency"]["gpu_demand_pct"].get<double>(), demand);
    EXPECT_THAT(Cli(d, "eff " + std::to_string(j["id"].get<int64_t>())),
                HasSubstr(fmt::format("its launches waited for the GPU {:.1f}% of its run: it "
                                      "would have used {:.1f}% of each GPU's time",
                                      held, demand)));
  }
}

// A busy half share alone on its GPU: work-conserving sharing lends it the idle half, so it uses
// more of the GPU's time than its share. Its efficiency is all of what it held, and eff says how
// far past its share it went (what sizing reads as "a whole GPU's compute").
TEST(TesseraServer, AShareAloneThatUsedIdleTimePastItsShareSaysHowMuch) {
  Daemon d("lent");
  const int64_t id =
      d.Submit({{"name", "lent"},
                {"command", {TESSERA_CUDA_CLIENT, "link", "work:1500:500:4:0:0:1500"}},
                {"resources", {{"gpu_memory", "1GiB"}, {"gpu_share", "50%"}}}});
  const json j = d.WaitFor(id, "succeeded");
  const double util = j["usage"]["gpu_utilization_pct"].get<double>();
  ASSERT_GT(util, 50) << "alone, it ran past its half: " << j.dump();
  EXPECT_DOUBLE_EQ(j["efficiency"]["gpu_busy_pct"].get<double>(), 100) << j.dump();
  EXPECT_DOUBLE_EQ(j["efficiency"]["gpu_used_pct"].get<double>(), std::round(util * 10) / 10);
  EXPECT_THAT(Cli(d, "eff " + std::to_string(id)),
              HasSubstr(fmt::format("100.0% of what it held was busy; it used {:.1f}% of its GPU's "
                                    "time, past its share (idle time lent to it)",
                                    j["efficiency"]["gpu_used_pct"].get<double>())));
}

// An admin's question over many jobs: who held GPU time and left it idle. `acct --jobs` gives each
// job's efficiency as `eff` does (GPU-hours held, busy of what it held) and the idle GPU-hours it
// implies, and ranks the jobs by it: a share that launched a kernel every 20 ms comes before one
// that kept its GPU busy, whatever order they ran in.
TEST(TesseraServer, AcctJobsRanksJobsByTheGpuTimeTheyHeldIdle) {
  Daemon d("idle");
  std::vector<int64_t> ids;
  for (const char* work : {"work:1500:500:4:0:0:1500", "work:1500:500:1:20000:0:1500"}) {
    const std::string alloc = ids.empty() ? "alloc:256" : "alloc:512";
    ids.push_back(d.Submit({{"name", "ranked"},
                            {"command", {TESSERA_CUDA_CLIENT, "link", alloc, work}},
                            {"resources", {{"gpu_memory", "1GiB"}, {"gpu_share", "50%"}}}}));
    d.WaitFor(ids.back(), "succeeded");  // one at a time: neither waits for the other's slices
  }
  std::map<std::string, json> eff;  // by id, as GET /v1/jobs/N gives it
  for (int64_t id : ids)
    eff[std::to_string(id)] = d.Call("GET", "/v1/jobs/" + std::to_string(id))["efficiency"];
  const json busy = eff[std::to_string(ids[0])], idle = eff[std::to_string(ids[1])];
  ASSERT_TRUE(busy.contains("gpu_busy_pct") && idle.contains("gpu_busy_pct")) << busy << idle;
  ASSERT_LT(idle["gpu_busy_pct"].get<double>() + 20, busy["gpu_busy_pct"].get<double>())
      << busy << idle;
  const json rows =
      json::parse(Cli(d,
                      "acct --jobs --format id,gpu_hours,gpu_eff,idle_gpu_hours,gpu_mem_eff "
                      "--sort idle_gpu_hours -o json"));
  ASSERT_EQ(rows.size(), 2u) << rows.dump();
  EXPECT_EQ(rows[0]["id"], std::to_string(ids[1])) << "the idler first: " << rows.dump();
  EXPECT_EQ(rows[1]["id"], std::to_string(ids[0])) << rows.dump();
  for (const json& r : rows) {
    const json& e = eff[r["id"].get<std::string>()];
    // Held: half a GPU for its run (eff's gpu_hours, unrounded).
    const double held = e["gpus"].get<double>() * e["elapsed_s"].get<double>() / 3600;
    EXPECT_DOUBLE_EQ(e["gpus"].get<double>(), 0.5) << e;
    EXPECT_NEAR(r["gpu_hours"].get<double>(), held, 1e-12) << r << e;
    EXPECT_NEAR(e["gpu_hours"].get<double>(), held, 0.0005) << "eff's, rounded: " << e;
    EXPECT_EQ(r["gpu_eff"], e["gpu_busy_pct"]) << r << e;
    EXPECT_NEAR(r["idle_gpu_hours"].get<double>(),
                held * (1 - e["gpu_busy_pct"].get<double>() / 100), 1e-12)
        << r << e;
    EXPECT_EQ(r["gpu_mem_eff"], e["gpu_memory_pct"]) << r << e;
  }
  EXPECT_EQ(rows[0]["gpu_mem_eff"], 50) << "512 of its 1024 MiB";
  EXPECT_EQ(rows[1]["gpu_mem_eff"], 25) << "256 of its 1024 MiB";
  // The other way: the least efficient first; a table names the columns.
  const json reversed =
      json::parse(Cli(d, "acct --jobs --format id,gpu_eff --sort gpu_eff --reverse -o json"));
  ASSERT_EQ(reversed.size(), 2u);
  EXPECT_EQ(reversed[0]["id"], std::to_string(ids[1])) << "lowest efficiency first with --reverse";
  const std::string table = Cli(d, "acct --jobs --format id,gpu_eff,idle_gpu_hours --sort id");
  EXPECT_THAT(table, HasSubstr("GPU EFF")) << table;
  EXPECT_THAT(table, HasSubstr("IDLE GPU HOURS")) << table;
  EXPECT_LT(table.find("\n" + std::to_string(ids[1]) + " "),
            table.find("\n" + std::to_string(ids[0]) + " "))
      << "ids largest first: " << table;
  EXPECT_THAT(Cli(d, "acct --jobs --sort bogus"), HasSubstr("--sort: unknown field 'bogus'"));
  EXPECT_THAT(Cli(d, "acct --sort gpu_eff"), HasSubstr("--sort requires --jobs"));
  // The summary names the jobs that left GPU time idle too (the busy one left none).
  const json acct = json::parse(Cli(d, "acct -o json"));
  ASSERT_EQ(acct["most_idle"].size(), 1u) << acct.dump();
  EXPECT_EQ(acct["most_idle"][0]["id"], ids[1]) << acct.dump();
  EXPECT_EQ(acct["most_idle"][0]["name"], "ranked");
  EXPECT_EQ(acct["most_idle"][0]["gpu_busy_pct"], idle["gpu_busy_pct"]) << "as eff says";
  const std::string summary = Cli(d, "acct");
  EXPECT_THAT(summary, HasSubstr("the jobs that left the most GPU time idle")) << summary;
  EXPECT_THAT(summary, HasSubstr(fmt::format("\n{}   root  ranked  ", ids[1]))) << summary;
  auto bad = HttpClient(d.socket()).Send("GET", "/v1/jobs?efficiency=yes");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("efficiency: expected true or false"));
}

// The same two shares (4 s each) with the server killed (-9) as they start and started again
// only once they have waited 1.2 s each while it was down: the arbiter counted on, and the server
// that re-adopts them reads its whole count - the held-back time of each job's whole run, none of
// it lost to the restart (counted from the restart on, it would be at most 0.8 s). That they ran
// beside each other, which the old server knew, the new one tells again.
TEST(TesseraServer, AShareHeldBackWhileTheServerWasDownSaysSoForItsWholeRun) {
  Daemon d("held-restart");
  const std::string arbiter = d.Call("GET", "/v1/info")["arbiter"]["file"];
  const std::vector<int64_t> ids = SubmitTwoBusyHalves(d, 4000);
  std::vector<int> gpus;
  for (int64_t id : ids) {
    d.WaitForProcess(id);
    gpus.push_back(d.Call("GET", "/v1/jobs/" + std::to_string(id))["placement"]["gpus"][0]["index"]
                       .get<int>());
  }
  d.Kill(SIGKILL);
  auto held_us = [&](size_t k) {
    return tessera::shim::ArbiterJobUse(
               arbiter.c_str(), &gpus[k], 1,
               tessera::shim::ArbiterJobKey(std::to_string(ids[k]).c_str()))
        .held_us;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((held_us(0) < 1'200'000 || held_us(1) < 1'200'000) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const uint64_t down[2] = {held_us(0), held_us(1)};
  ASSERT_GE(std::min(down[0], down[1]), 1'200'000u)
      << "both waited 1.2 s while the server was down";
  d.Start();
  for (size_t k = 0; k < ids.size(); ++k) {
    const json j = d.WaitFor(ids[k], "succeeded");
    const json& u = j["usage"];
    ASSERT_TRUE(u.contains("gpu_held_back_pct")) << j.dump();
    EXPECT_EQ(u["shared_gpu"], true) << "it ran beside the other: " << u.dump();
    const double ran_s = j["ended_at"].get<double>() - j["started_at"].get<double>();
    const double held_s = u["gpu_held_back_pct"].get<double>() / 100 * ran_s;
    // What was counted before the restart is in it (its percentage is rounded to 0.1).
    EXPECT_GE(held_s + 0.001 * ran_s, static_cast<double>(down[k]) / 1e6) << u.dump();
    EXPECT_LT(u["gpu_held_back_pct"].get<double>() + u["gpu_utilization_pct"].get<double>(), 105)
        << "waiting and running do not overlap: " << u.dump();
    EXPECT_GT(u["gpu_demand_pct"].get<double>(), u["gpu_utilization_pct"].get<double>() + 10)
        << u.dump();
  }
}

// An upgrade under running work: the server is killed (-9) while a share runs, and the older
// Tessera's arbiter file (version 5) is where the new server starts, with the job's old processes
// charged in it - they keep that file mapped, and go on charging it after the new server renamed
// a fresh one over it. The re-adopted job's GPU time is what they were charged there: 1.6 s of
// its run (before, the new server read only the new file: 0, the job ended unmeasured). The old
// file is kept for the server alone at <arbiter>.previous, and the log says so; it goes at a
// sample once none of its jobs can use it or be unread - never while the server still runs the
// job, whatever its slot's times (a container's processes cannot be seen from the server).
TEST(TesseraServer, AShareRunningAcrossAnUpgradeIsMeasuredInTheFileItsOldProcessesKept) {
  Daemon d("upgrade-arbiter", "history: {interval_s: 0.2, window_s: 60}\n");
  const std::string arbiter = d.Call("GET", "/v1/info")["arbiter"]["file"];
  // The job runs until this is there, then 2 s more (its 1.6 s of GPU time fit in its run).
  const std::string go = d.dir() + "/go";
  const int64_t id = d.Submit(
      {{"name", "across"},
       {"command", {"sh", "-c", "while [ ! -e " + go + " ]; do sleep 0.05; done; sleep 2"}},
       {"resources", {{"gpu_memory", "1GiB"}, {"gpu_share", "50%"}}}});
  d.WaitForProcess(id);
  const int gpu =
      d.Call("GET", "/v1/jobs/" + std::to_string(id))["placement"]["gpus"][0]["index"].get<int>();
  d.Kill(SIGKILL);
  // The older Tessera's file in its place (renamed in, as it was there before the upgrade).
  const std::string older = arbiter + ".v5";
  tessera::shim::Version5ArbiterFile v5(older, 0600);
  ASSERT_TRUE(v5.ok());
  const uint64_t key = tessera::shim::ArbiterJobKey(std::to_string(id).c_str());
  v5.Put(gpu, 7, key, 1'000'000, tessera::shim::Arbiter::NowMicros(), getpid(),
         tessera::shim::PidNamespace());
  ASSERT_EQ(rename(older.c_str(), arbiter.c_str()), 0);
  d.Start();
  d.Call("GET", "/v1/info");  // up: the file replaced
  struct stat kept;
  ASSERT_EQ(stat((arbiter + ".previous").c_str(), &kept), 0);
  EXPECT_EQ(kept.st_mode & 07777, 0600u);
  EXPECT_THAT(d.Log(), HasSubstr("the one of before an upgrade is kept at " + arbiter +
                                 ".previous (the server's alone)"));
  // Its old processes charge on in the file they mapped.
  v5.Job(gpu, 7).busy_us = 1'600'000;
  // Its slot's last use and process from before this boot, as a container's would look idle: the
  // job still runs, so samples keep the file.
  v5.Job(gpu, 7).last_launch_us = tessera::shim::Arbiter::NowMicros() + 3'600'000'000ull;
  v5.Job(gpu, 7).window_start_us = 0;
  auto last_sample = [&] {
    const json h = d.Call("GET", "/v1/history");
    return h["samples"].empty() ? 0.0 : h["samples"].back()["at"].get<double>();
  };
  const double changed = last_sample();
  const auto samples_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (last_sample() < changed + 0.3 && std::chrono::steady_clock::now() < samples_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(last_sample(), changed + 0.3) << "samples taken since";
  EXPECT_EQ(d.Call("GET", "/v1/jobs/" + std::to_string(id))["state"], "running");
  EXPECT_TRUE(fs::exists(arbiter + ".previous")) << "kept while the server runs its job";
  std::ofstream(go) << "";
  const json j = d.WaitFor(id, "succeeded");
  const json& u = j["usage"];
  ASSERT_TRUE(u.value("gpu_utilization_pct", json()).is_number()) << "measured: " << j.dump();
  const double ran_s = j["ended_at"].get<double>() - j["started_at"].get<double>();
  EXPECT_NEAR(u["gpu_utilization_pct"].get<double>() / 100 * ran_s, 1.6, 0.002 * ran_s) << j.dump();
  // It goes at a sample once the job ended, no process of its jobs is left here and none used it
  // within the hour: here, its one slot's last use and process are from before this boot (the
  // kept file's rules in full: Arbiter.ThePreviousFileGoesOnceNoJobInItCanStillRunOrBeUnread).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (fs::exists(arbiter + ".previous") && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(fs::exists(arbiter + ".previous")) << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr("the one of before an upgrade is removed"));
}

// A CUDA program whose allocation its 1 GiB limit refused (the intercept library's count, read
// from its region at its end) fails saying so - what it held, what it asked at most, what to ask
// next time - and `tessera eff` shows the refusal.
TEST(TesseraServer, AJobItsGpuMemoryLimitRefusedSaysWhatItAskedAndWhatToAsk) {
  Daemon d("refused");
  const json spec = {{"name", "greedy"},
                     {"command", {TESSERA_CUDA_CLIENT, "link", "alloc:500", "alloc:800", "crash"}},
                     {"resources", {{"gpu_memory", "1GiB"}, {"gpu_share", "50%"}}}};
  const int64_t id = d.Submit(spec);
  json j = d.WaitFor(id, "failed");
  EXPECT_THAT(d.Logs(id), HasSubstr("ok\noom\n"));
  EXPECT_THAT(j.value("reason", ""),
              HasSubstr("its GPU memory limit of 1024MiB refused 1 allocation (measured peak "
                        "500MiB; it asked for 1300MiB at most): ask --gpu-mem 1792MiB next time"))
      << j.dump();
  EXPECT_EQ(j["usage"]["gpu_memory_refused"], 1) << j.dump();
  EXPECT_EQ(j["efficiency"]["gpu_memory_wanted_mib"], 1300) << j.dump();
  EXPECT_THAT(Cli(d, "eff " + std::to_string(id)),
              HasSubstr("peak 500 MiB of 1 GiB per GPU (48.8%); 1 allocation refused at its limit "
                        "(it asked for 1.3 GiB at most)"));
}

// A program that goes on after its limit refused an allocation (it ignores the error, as a
// framework that frees its cache would not need to) succeeds - and says so, never silently: asked
// outright, what to ask next time; sized automatically, its kind learns what it asked, and the
// next run is sized past it.
TEST(TesseraServer, ASuccessItsGpuMemoryLimitRefusedSaysSoAndTheNextRunIsSizedPastIt) {
  Daemon d("refusedok", "auto_size_trial: 0\n");
  const json asked = {{"name", "ignores"},
                      {"command", {TESSERA_CUDA_CLIENT, "link", "alloc:500", "alloc:800"}},
                      {"resources", {{"gpu_memory", "1GiB"}, {"gpu_share", "50%"}}}};
  const int64_t id = d.Submit(asked);
  json j = d.WaitFor(id, "succeeded");
  EXPECT_THAT(d.Logs(id), HasSubstr("ok\noom\n"));
  EXPECT_EQ(j.value("reason", ""),
            "exit code 0; its GPU memory limit of 1024MiB refused 1 allocation (measured peak "
            "500MiB; it asked for 1300MiB at most): ask --gpu-mem 1792MiB next time")
      << j.dump();
  EXPECT_THAT(Cli(d, "ls --ended"), HasSubstr("exit code 0; its GPU memory limit of 1024MiB"));
  // Sized automatically: a first run (whole GPU memory, no trial) that peaks at 500 MiB...
  json grows = {{"name", "grows"},
                {"command", {TESSERA_CUDA_CLIENT, "link", "alloc:500"}},
                {"resources", {{"gpu_memory", "auto"}, {"gpu_share", "50%"}}}};
  d.WaitFor(d.Submit(grows), "succeeded");
  // ...sizes the next at 768 MiB, which asks for 1300 and is refused, and goes on.
  grows["command"] = {TESSERA_CUDA_CLIENT, "link", "alloc:500", "alloc:800"};
  const int64_t second = d.Submit(grows);
  j = d.WaitFor(second, "succeeded");
  EXPECT_EQ(j["placement"]["memory_mib_per_gpu"], 768) << j.dump();
  EXPECT_THAT(j.value("reason", ""),
              HasSubstr("exit code 0; its GPU memory limit of 768MiB (sized automatically) refused "
                        "1 allocation (measured peak 500MiB; it asked for 1300MiB at most): the "
                        "next run of its kind is sized past it"))
      << j.dump();
  // The third is sized from what the second asked, not from its refused peak - by a server
  // started again, which reads the history back from the store by the same rule.
  d.Kill(SIGTERM);
  d.Start();
  const int64_t third = d.Submit(grows);
  j = d.WaitFor(third, "succeeded");
  EXPECT_EQ(j["placement"]["memory_mib_per_gpu"], 1792) << j.dump();
  EXPECT_EQ(j.value("reason", ""), "exit code 0") << "it fits now: nothing to say";
}

// A trial of a CUDA program (against the fake driver, under its 50% share) is stopped when its time
// is up and says what the intercept library measured - the 700 MiB it held at most, the GPU time
// it was charged - and the size that recommends; the same program asked "auto" is then sized from
// that trial, and starts on that size.
TEST(TesseraServer, ATrialRecommendsASizeAndAnAutoJobOfItsKindIsSizedFromIt) {
  Daemon d("trial");
  json spec = {{"name", "served"},
               {"command",
                {TESSERA_CUDA_CLIENT, "link", "alloc:500", "alloc:200", "freeall", "alloc:100",
                 "work:60000:1000:1:20000:0:60000"}},  // 1 ms kernels, 20 ms apart
               {"resources", {{"gpu_memory", "1GiB"}, {"gpu_share", "50%"}}},
               {"trial_s", 1},
               {"grace_period_s", 2}};
  const int64_t trial = d.Submit(spec);
  json t = d.WaitFor(trial, "succeeded");
  const std::string reason = t.value("reason", "");
  EXPECT_THAT(reason, HasSubstr("its trial of 1s is over: GPU ")) << t.dump();
  EXPECT_THAT(reason, HasSubstr("peak GPU memory 700MiB, "));
  EXPECT_THAT(reason, HasSubstr(" kernel launches (")) << "its kernel mix, from its region";
  EXPECT_THAT(reason, HasSubstr(" of GPU time each on average); recommended: --gpu-share "));
  ASSERT_TRUE(t["usage"]["gpu_utilization_pct"].is_number()) << t.dump();
  const double busy = t["usage"]["gpu_utilization_pct"].get<double>();
  EXPECT_LT(busy, 60) << "its kernels leave the GPU idle most of the time";
  EXPECT_THAT(reason, HasSubstr("--gpu-mem 1024MiB (with 20% margin)")) << "700 + 20%: 1024";
  EXPECT_EQ(t["usage"]["gpu_peak_memory_mib"], 700) << t.dump();
  // The same program, sized automatically: from the trial.
  json later = spec;
  later.erase("trial_s");
  later["command"] = {"sleep", "30"};
  later["resources"] = {{"gpu_memory", "auto"}, {"gpu_share", "auto"}};
  const int64_t sized = d.Submit(later);
  json s = d.WaitFor(sized, "running");
  EXPECT_EQ(s["spec"]["resources"]["gpu_memory"], "auto") << s.dump();
  EXPECT_EQ(s["spec"]["sized"]["gpu_memory"], "1024MiB") << s.dump();
  EXPECT_THAT(s["spec"]["sized"].value("basis", ""), HasSubstr("'s runs of 'served' (1 run)"));
  EXPECT_EQ(s["placement"]["memory_mib_per_gpu"], 1024) << s.dump();
  // Its share is the trial's busy share plus 20%, rounded up to 5%: what the trial recommended.
  const int share = static_cast<int>(std::ceil(busy * 1.2 / 5 - 1e-9)) * 5;
  EXPECT_EQ(s["spec"]["sized"]["gpu_share"], fmt::format("{}%", share)) << s.dump();
  EXPECT_THAT(reason, HasSubstr(fmt::format("--gpu-share {}% --gpu-mem 1024MiB", share)));
  EXPECT_EQ(s["placement"]["milli_per_gpu"], share * 10) << s.dump();
  EXPECT_THAT(Cli(d, "show " + std::to_string(sized)), HasSubstr("sized        gpu_"));
  d.Call("POST", "/v1/jobs/" + std::to_string(sized) + "/cancel");
  d.WaitFor(sized, "cancelled");  // (jobs outlive a stopped server: its cgroup would wait for it)
}

// A trial on a whole GPU (no share, no limit) says its kernel mix too: the intercept library
// counts its launches in a region of its own, and what it allocated is its peak on a simulated
// machine, whose GPUs report no memory use.
TEST(TesseraServer, AWholeGpuTrialSaysItsKernelMix) {
  Daemon d("whole-trial");
  json spec = {
      {"name", "whole"},
      {"command", {TESSERA_CUDA_CLIENT, "link", "alloc:500", "work:60000:1000:1:20000:0:60000"}},
      {"resources", {{"gpus", 1}}},
      {"trial_s", 1},
      {"grace_period_s", 2}};
  json t = d.WaitFor(d.Submit(spec), "succeeded");
  const std::string reason = t.value("reason", "");
  EXPECT_THAT(reason, HasSubstr("its trial of 1s is over: ")) << t.dump();
  EXPECT_THAT(reason, HasSubstr(" kernel launches (")) << "its kernel mix, from its region";
  EXPECT_EQ(t["usage"]["gpu_peak_memory_mib"], 500) << t.dump();
  EXPECT_GT(t["usage"].value("kernel_launches", 0), 0) << t.dump();
  EXPECT_TRUE(t["spec"]["resources"].value("gpu_memory", "").empty()) << "no limit was set";
}

// An "auto" memory size of a kind never measured: the job's first run is the server's trial (1 s
// here) without a memory limit; it is stopped (its SIGTERM), re-queued under its id and started
// again with a limit sized from the 500 MiB the trial measured (500 + 20%: 768 MiB), the trial's
// measurement on its record's events.
TEST(TesseraServer, AnAutoJobNeverMeasuredRunsATrialThenGoesOnSizedFromIt) {
  Daemon d("autotrial", "auto_size_trial: 1s\n");
  const json spec = {
      {"name", "fresh"},
      {"command", {TESSERA_CUDA_CLIENT, "link", "alloc:500", "work:60000:1000:1:20000:0:60000"}},
      {"resources", {{"gpu_share", "50%"}, {"gpu_memory", "auto"}}},
      {"grace_period_s", 2}};
  const int64_t id = d.Submit(spec);
  json j = d.WaitFor(id, "running");
  EXPECT_EQ(j["spec"]["sized"]["trial_s"], 1) << j.dump();
  EXPECT_FALSE(j["spec"]["sized"].contains("gpu_memory")) << "not limited during its trial";
  // Polled with a deadline: its trial ends, and it runs again, sized.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until &&
         !(j.value("state", "") == "running" && j["spec"]["sized"].contains("gpu_memory"))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    j = d.Call("GET", "/v1/jobs/" + std::to_string(id));
  }
  ASSERT_EQ(j["spec"]["sized"].value("gpu_memory", ""), "768MiB") << j.dump() << d.Log();
  EXPECT_FALSE(j["spec"]["sized"].contains("trial_s")) << "a trial once";
  EXPECT_EQ(j["placement"]["memory_mib_per_gpu"], 768) << j.dump();
  const json events = d.Call("GET", "/v1/jobs/" + std::to_string(id) + "/events");
  EXPECT_THAT(events.dump(), HasSubstr("its trial of 1s is over: GPU ")) << events.dump();
  EXPECT_THAT(events.dump(), HasSubstr("peak GPU memory 500MiB"));
  EXPECT_THAT(events.dump(),
              HasSubstr("re-queued sized from it: gpu_memory 768MiB: a peak of 500MiB"));
  d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  d.WaitFor(id, "cancelled");
}

// GPU 0 shared by MPS (the fake control daemon; the fake driver its client): an MPS job is a
// client of GPU 0's daemon with its share as MPS's limits, a share asking nothing goes in time
// slices on GPU 1; the daemon killed, its clients are stopped and requeued while GPU 0 takes no
// work, and it is started again and they run again.
TEST(TesseraServer, AnMpsGpusJobsAreClientsOfItsDaemonWhichIsStartedAgainWhenItDies) {
  MpsServer m("mps");
  Daemon& d = m.d;
  const std::string& pipe = m.pipe;
  json gpus = d.Call("GET", "/v1/gpus");
  EXPECT_EQ(gpus["gpus"][0]["sharing"], "mps") << gpus.dump();
  EXPECT_EQ(gpus["gpus"][1]["sharing"], "time-slice");
  EXPECT_FALSE(gpus["gpus"][1].contains("mps"));
  EXPECT_TRUE(gpus["gpus"][0]["mps"]["daemon_up"].get<bool>()) << "up before the API answers";
  EXPECT_TRUE(gpus["gpus"][0]["healthy"].get<bool>());
  json spec =
      Shell("env | grep ^CUDA_MPS_ | sort > " + d.dir() + "/mps.env; exec " + TESSERA_CUDA_CLIENT +
                " link alloc:700 kernel waitfile:" + d.dir() + "/never",
            {{"gpu_share", "40%"}, {"gpu_memory", "1GiB"}, {"sharing", "mps"}});
  spec["grace_period_s"] = 0;
  spec["priority"] = -1;  // below normal among the server's clients
  const int64_t mps = d.Submit(spec);
  json j = d.WaitFor(mps, "running");
  EXPECT_EQ(j["placement"]["gpus"][0]["index"], 0) << j.dump();
  EXPECT_EQ(j["spec"]["resources"]["sharing"], "mps");
  m.WaitForAClient();
  const std::string& log = m.log;
  EXPECT_EQ(tessera::test::ReadFile(d.dir() + "/mps.env"),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40\nCUDA_MPS_CLIENT_PRIORITY=1\n"
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M\n"
            "CUDA_MPS_PIPE_DIRECTORY=" +
                pipe + "\n");
  EXPECT_THAT(tessera::test::ReadFile(log),
              HasSubstr("active_thread_percentage 40 pinned_mem_limit 0=1024M"))
      << "the fake driver connected as a client of GPU 0's daemon";
  EXPECT_THAT(Cli(d, "show " + std::to_string(mps)), HasSubstr("40% 1024MiB MPS"));
  // From the command line: --sharing mps goes on GPU 0, and is refused where MPS cannot go.
  const std::string submitted = Cli(d, "submit --sharing mps --gpu-share 10% -o json -- sleep 30");
  const json cli = json::parse(submitted, nullptr, false);
  ASSERT_TRUE(cli.is_object()) << submitted;
  j = d.WaitFor(cli["id"].get<int64_t>(), "running");
  EXPECT_EQ(j["placement"]["gpus"][0]["index"], 0) << j.dump();
  d.Call("POST", "/v1/jobs/" + std::to_string(cli["id"].get<int64_t>()) + "/cancel");
  d.WaitFor(cli["id"].get<int64_t>(), "cancelled");
  EXPECT_THAT(Cli(d, "submit --sharing spatial -- sleep 1"), HasSubstr("--sharing"));
  // A share asking nothing: time slices, on the other GPU though GPU 0 has room.
  const int64_t sliced = d.Submit(Shell("sleep 60", {{"gpu_share", "50%"}}));
  j = d.WaitFor(sliced, "running");
  EXPECT_EQ(j["placement"]["gpus"][0]["index"], 1) << j.dump();
  // The daemon dies.
  pid_t daemon = m.DaemonPid();
  ASSERT_GT(daemon, 0);
  ASSERT_EQ(kill(daemon, SIGKILL), 0);
  // Its client is stopped and requeued, the daemon started again, and the job runs again on it.
  json back;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    back = d.Call("GET", "/v1/jobs/" + std::to_string(mps));
    if (back["state"] == "running" && back["events"].size() >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<std::string> states;
  for (const json& e : back["events"]) states.push_back(e["state"]);
  EXPECT_EQ(states,
            (std::vector<std::string>{"queued", "running", "preempted", "queued", "running"}))
      << back.dump();
  EXPECT_THAT(back["events"][2].value("reason", ""),
              HasSubstr("GPU 0 turned unhealthy: the MPS control daemon stopped"));
  gpus = d.Call("GET", "/v1/gpus");
  EXPECT_TRUE(gpus["gpus"][0]["healthy"].get<bool>()) << gpus.dump();
  EXPECT_EQ(gpus["gpus"][0]["mps"]["deaths"], 1);
  EXPECT_EQ(gpus["gpus"][0]["mps"]["starts"], 2);
  EXPECT_NE(m.DaemonPid(), daemon);
  EXPECT_EQ(d.Call("GET", "/v1/jobs/" + std::to_string(sliced))["state"], "running")
      << "a time-sliced job is no client of the daemon";
  HttpClient c(d.socket());
  const std::string metrics = c.Send("GET", "/metrics")->body;
  EXPECT_THAT(metrics, ::testing::ContainsRegex("tessera_gpu_mps_daemon_up\\{gpu=\"0\"[^}]*\\} 1"));
  EXPECT_THAT(metrics, ::testing::ContainsRegex(
                           "tessera_gpu_mps_daemon_deaths_total\\{gpu=\"0\"[^}]*\\} 1"));
  EXPECT_THAT(metrics, Not(HasSubstr("tessera_gpu_mps_daemon_up{gpu=\"1\"")));
  EXPECT_THAT(Cli(d, "top --once"), HasSubstr("ok (MPS)"));
  for (int64_t id : {mps, sliced}) d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  d.WaitFor(mps, "cancelled");
  d.WaitFor(sliced, "cancelled");
}

// The daemon outlives a server killed -9, as its clients (the jobs) do: the restarted server
// finds it answering, keeps it and re-adopts the job, which goes on as its client. Restarted
// with GPU 0 out of MPS mode, the server tells the daemon to quit.
TEST(TesseraServer, AnMpsDaemonAndItsClientsOutliveAServerRestartAndItQuitsWhenItsGpuLeavesMps) {
  MpsServer m("mps-restart");
  Daemon& d = m.d;
  json spec = Shell(std::string("exec ") + TESSERA_CUDA_CLIENT +
                        " link kernel waitfile:" + d.dir() + "/go kernel",
                    {{"gpus", 1}, {"sharing", "mps"}});
  const int64_t id = d.Submit(spec);
  d.WaitForProcess(id);
  m.WaitForAClient();
  const std::string& log = m.log;
  pid_t daemon = m.DaemonPid();
  ASSERT_GT(daemon, 0);
  d.Kill(SIGKILL);
  d.Start();
  json gpus = d.Call("GET", "/v1/gpus");
  EXPECT_TRUE(gpus["gpus"][0]["healthy"].get<bool>()) << gpus.dump();
  EXPECT_EQ(gpus["gpus"][0]["mps"]["starts"], 0) << "the running daemon was kept";
  const pid_t after = m.DaemonPid();
  EXPECT_EQ(after, daemon);
  EXPECT_EQ(d.Call("GET", "/v1/jobs/" + std::to_string(id))["state"], "running");
  std::ofstream(d.dir() + "/go").close();
  d.WaitFor(id, "succeeded");
  EXPECT_EQ(d.Logs(id), "ok\nok\n") << "its second kernel ran on the same server";
  EXPECT_THAT(tessera::test::ReadFile(log), Not(HasSubstr("quit")));
  // The daemon dies while the server is down: the restarted server stops the recovered client
  // (its server is gone) and requeues it, starts a daemon, and the job runs again on it.
  json again = spec;
  again["command"][2] = std::string("exec ") + TESSERA_CUDA_CLIENT +
                        " link kernel waitfile:" + d.dir() + "/go2 kernel";
  const int64_t second = d.Submit(again);
  d.WaitForProcess(second);
  d.Kill(SIGKILL);
  ASSERT_EQ(kill(daemon, SIGKILL), 0);
  d.Start();
  json j;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    j = d.Call("GET", "/v1/jobs/" + std::to_string(second));
    if (j["state"] == "running" && j["events"].size() >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(j["events"].size(), 4u) << j.dump();
  EXPECT_EQ(j["events"][2]["state"], "preempted") << j.dump();
  EXPECT_THAT(j["events"][2].value("reason", ""),
              HasSubstr("the MPS control daemon was not running"));
  daemon = m.DaemonPid();
  EXPECT_NE(daemon, after) << "a new daemon";
  std::ofstream(d.dir() + "/go2").close();
  d.WaitFor(second, "succeeded");
  // GPU 0 leaves MPS mode.
  {
    std::string config = tessera::test::ReadFile(d.dir() + "/server.yaml");
    const size_t at = config.find("mps: {gpus: [0]");
    ASSERT_NE(at, std::string::npos);
    config.replace(at, 15, "mps: {gpus: []");
    std::ofstream(d.dir() + "/server.yaml") << config;
  }
  d.Kill(SIGTERM);
  d.Start();
  until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (kill(daemon, 0) == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(kill(daemon, 0), 0) << "told to quit";
  EXPECT_THAT(d.Log(), HasSubstr("is no longer in MPS mode"));
  gpus = d.Call("GET", "/v1/gpus");
  EXPECT_EQ(gpus["gpus"][0]["sharing"], "time-slice") << gpus.dump();
}

TEST(TesseraServer, CancelStopsTheWholeProcessGroup) {
  Daemon d("cancel");
  // The shell's child pid goes to the daemon's folder (the job's working directory is the test's:
  // a source checkout when run by hand).
  const std::string pidfile = d.dir() + "/child";
  int64_t id = d.Submit(Shell("sleep 60 & echo $! > " + pidfile + "; wait", {{"gpus", 1}}));
  json j = d.WaitFor(id, "running");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  pid_t child = 0;
  while ((child = std::atoi(tessera::test::ReadFile(pidfile).c_str())) <= 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(child, 0) << "the job wrote its child's pid";
  std::string out = Cli(d, "cancel " + std::to_string(id));
  EXPECT_THAT(out, HasSubstr("SIGTERM sent"));
  j = d.WaitFor(id, "cancelled");
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("cancelled by"));
  // The shell's child (its own process, in the job's group) went with it.
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (kill(child, 0) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(kill(child, 0), 0) << "the sleep the shell started is gone too";
  // Cancelling again is a conflict, an unknown job is not found.
  int status = 0;
  d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel", "", &status);
  EXPECT_EQ(status, 409);
  d.Call("POST", "/v1/jobs/999/cancel", "", &status);
  EXPECT_EQ(status, 404);
}

TEST(TesseraServer, HigherPriorityPreemptsAndThePreemptedJobIsRequeued) {
  Daemon d("preempt");
  int64_t low1 = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  int64_t low2 = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  d.WaitFor(low1, "running");
  d.WaitFor(low2, "running");
  json high = Shell("sleep 60", {{"gpus", 1}});
  high["priority"] = 10;
  int64_t h = d.Submit(high);
  d.WaitFor(h, "running");
  // One of the low jobs went preempted -> queued (re-queued), the other still runs.
  json a = d.Call("GET", "/v1/jobs/" + std::to_string(low1));
  json b = d.Call("GET", "/v1/jobs/" + std::to_string(low2));
  json victim = a["state"] == "queued" ? a : b;
  EXPECT_EQ(victim["state"], "queued");
  EXPECT_EQ((a["state"] == "running") + (b["state"] == "running"), 1);
  std::vector<std::string> states;
  for (const json& e : victim["events"]) states.push_back(e["state"]);
  EXPECT_EQ(states, (std::vector<std::string>{"queued", "running", "preempted", "queued"}));
  EXPECT_THAT(victim["events"][2]["reason"].get<std::string>(),
              HasSubstr("preempted for job " + std::to_string(h)));
  for (int64_t x : {low1, low2, h}) d.Call("POST", "/v1/jobs/" + std::to_string(x) + "/cancel");
}

TEST(TesseraServer, QuotaKeepsAUsersJobsQueued) {
  passwd* me = getpwuid(geteuid());
  ASSERT_NE(me, nullptr);
  Daemon d("quota", std::string("quotas: {") + me->pw_name + ": {gpus: 1}}\n");
  int64_t a = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  int64_t b = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  d.WaitFor(a, "running");
  // Until the scheduler has looked at b and said why it waits (a poll with a deadline, not a
  // sleep).
  json j = d.Call("GET", "/v1/jobs/" + std::to_string(b));
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (j.value("waiting", "").find("quota") == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    j = d.Call("GET", "/v1/jobs/" + std::to_string(b));
  }
  EXPECT_EQ(j["state"], "queued");
  EXPECT_THAT(j.value("waiting", ""), HasSubstr("quota"));
  d.Call("POST", "/v1/jobs/" + std::to_string(a) + "/cancel");
  d.WaitFor(b, "running");
  d.Call("POST", "/v1/jobs/" + std::to_string(b) + "/cancel");
}

TEST(TesseraServer, GroupQuotaHoldsItsMembersJobsTogether) {
  passwd* me = getpwuid(geteuid());
  ASSERT_NE(me, nullptr);
  group* primary = getgrgid(me->pw_gid);
  ASSERT_NE(primary, nullptr);
  const std::string group_name = primary->gr_name;
  Daemon d("group-quota", "group_quotas: {" + group_name + ": {gpu_share: 1.5}}\n");
  int64_t a = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  int64_t b = d.Submit(Shell("sleep 60", {{"gpu_share", "40%"}}));
  int64_t c = d.Submit(Shell("sleep 60", {{"gpu_share", "20%"}}));
  d.WaitFor(a, "running");
  d.WaitFor(b, "running");
  json j = d.Call("GET", "/v1/jobs/" + std::to_string(c));
  for (int i = 0; i < 20 && j["waiting"].get<std::string>().find("quota") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    j = d.Call("GET", "/v1/jobs/" + std::to_string(c));
  }
  EXPECT_EQ(j["state"], "queued") << "1 + 0.4 of the group's 1.5 GPUs are used";
  EXPECT_THAT(j["waiting"].get<std::string>(), HasSubstr("group:" + group_name));
  d.Call("POST", "/v1/jobs/" + std::to_string(b) + "/cancel");
  d.WaitFor(c, "running");
  d.Call("POST", "/v1/jobs/" + std::to_string(a) + "/cancel");
  d.Call("POST", "/v1/jobs/" + std::to_string(c) + "/cancel");
}

TEST(TesseraServer, KillNineKeepsEveryJobAndReadoptsRunningOnes) {
  Daemon d("restart");
  int64_t running = d.Submit(Shell("sleep 1.5; echo done", {{"gpus", 1}}));
  int64_t ends_while_down = d.Submit(Shell("sleep 0.3; exit 4", {{"gpus", 1}}));
  d.WaitForProcess(running);
  d.WaitForProcess(ends_while_down);
  int64_t queued = d.Submit(Shell("echo later", {{"gpus", 2}}));  // waits: both GPUs are busy
  d.Kill(SIGKILL);
  // The short job ends while the server is down: its shepherd writes its exit file.
  const std::string exit_file = d.dir() + "/state/exit/" + std::to_string(ends_while_down);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fs::exists(exit_file) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(fs::exists(exit_file));
  d.Start();
  json j = d.Call("GET", "/v1/jobs/" + std::to_string(running));
  EXPECT_EQ(j["state"], "running") << "still running, re-adopted";
  EXPECT_THAT(d.Log(), HasSubstr("re-adopted"));
  j = d.WaitFor(ends_while_down, "failed");
  EXPECT_EQ(j["exit_code"], 4) << "its exit code was kept by its shepherd";
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("while the server was down"));
  j = d.WaitFor(running, "succeeded");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(d.Logs(running), "done\n");
  d.WaitFor(queued, "succeeded");
  EXPECT_EQ(d.Logs(queued), "later\n");
}

// Polls job `id` until the scheduler has said why it waits (not before its first look).
json WaitingSaid(Daemon& d, int64_t id) {
  json j = d.Call("GET", "/v1/jobs/" + std::to_string(id));
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (j["state"] == "queued" &&
         (j.value("waiting", "").empty() || j.value("waiting", "") == "not yet considered") &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    j = d.Call("GET", "/v1/jobs/" + std::to_string(id));
  }
  return j;
}

// An elastic job (1 to 2 GPUs of the machine's 2): started on both when nothing waits, for good
// (a job queued behind it waits, before and after a kill -9 of the server, which re-adopts it on
// both); started on its minimum when a queued job wants a GPU.
TEST(TesseraServer, AnElasticJobStartsOnWhatFitsAndKeepsItAcrossAKillNine) {
  Daemon d("elastic");
  const json elastic = {{"gpus", 1}, {"gpus_max", 2}};
  int64_t wide = d.Submit(Shell("echo $CUDA_VISIBLE_DEVICES; sleep 60", elastic));
  json j = d.WaitFor(wide, "running");
  EXPECT_EQ(j["placement"]["gpus"].size(), 2u) << j.dump();
  d.WaitForProcess(wide);
  EXPECT_THAT(Cli(d, "ls"), HasSubstr("1-2 GPU"));
  int64_t next = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  j = WaitingSaid(d, next);
  EXPECT_EQ(j["state"], "queued") << j.dump();
  d.Kill(SIGKILL);
  d.Start();
  j = d.Call("GET", "/v1/jobs/" + std::to_string(wide));
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["placement"]["gpus"].size(), 2u) << j.dump();
  // A pass after the restart has looked at `next`: one that started a job queued behind it.
  d.WaitFor(d.Submit(Shell("true")), "succeeded");
  j = d.Call("GET", "/v1/jobs/" + std::to_string(next));
  EXPECT_EQ(j["state"], "queued") << "the re-adopted elastic job holds both GPUs: " << j.dump();
  // Its log names both GPUs (the job reads its size from CUDA_VISIBLE_DEVICES).
  const std::string visible = d.Logs(wide);
  EXPECT_EQ(std::count(visible.begin(), visible.end(), ','), 1) << visible;
  d.Call("POST", "/v1/jobs/" + std::to_string(wide) + "/cancel");
  d.WaitFor(next, "running");
  // One GPU is free, and a job queued before it wants two: the elastic one starts on its minimum
  // (backfilled: it says it ends first).
  int64_t pair = d.Submit(Shell("sleep 60", {{"gpus", 2}}));
  WaitingSaid(d, pair);
  json narrow_spec = Shell("sleep 60", elastic);
  narrow_spec["max_runtime_s"] = 60;
  int64_t narrow = d.Submit(narrow_spec);
  j = d.WaitFor(narrow, "running");
  EXPECT_EQ(j["placement"]["gpus"].size(), 1u) << j.dump();
  EXPECT_EQ(d.Call("GET", "/v1/jobs/" + std::to_string(pair))["state"], "queued");
  for (int64_t id : {next, pair, narrow})
    d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  for (int64_t id : {wide, next, pair, narrow}) d.WaitFor(id, "cancelled");
}

// A cancel acknowledged just before a kill -9 of the server is not lost: the restarted server
// re-adopts the job still stopping (its stop file), SIGKILLs it when its grace from the cancel has
// passed (it ignores SIGTERM), and records it cancelled.
TEST(TesseraServer, ACancelAskedBeforeAKillNineIsCarriedOutAfterTheRestart) {
  Daemon d("cancel-restart");
  json spec = Shell("trap '' TERM; echo ready; while :; do sleep 0.1; done", {{"gpus", 1}});
  spec["grace_period_s"] = 2;
  const int64_t id = d.Submit(spec);
  d.WaitForProcess(id);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (d.Logs(id).empty() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its trap is set
  d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  d.Kill(SIGKILL);
  d.Start();
  json j = d.WaitFor(id, "cancelled");
  EXPECT_THAT(j.value("reason", ""), HasSubstr("cancelled by")) << j.dump();
  EXPECT_THAT(d.Log(), HasSubstr("re-adopted"));
}

// Polls job `id` until `ok` says yes of it (or 20 s have passed); returns what it was last.
json WaitUntil(Daemon& d, int64_t id, const std::function<bool(const json&)>& ok) {
  json j = d.Call("GET", "/v1/jobs/" + std::to_string(id));
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!ok(j) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    j = d.Call("GET", "/v1/jobs/" + std::to_string(id));
  }
  return j;
}
// Running on `n` GPUs, its process known, started again `restarts` times.
std::function<bool(const json&)> RunsOn(size_t n, int restarts) {
  return [=](const json& j) {
    return j.value("state", "") == "running" && !j["pid"].is_null() &&
           j["placement"]["gpus"].size() == n && j["placement"].value("restarts", 0) == restarts;
  };
}
std::string FourT4s(const std::string& name) {
  const std::string inv = ::testing::TempDir() + name + "-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(inv) << "name: four\ngpus:\n  - {model: Tesla T4, count: 4, memory: 15GiB, "
                        "compute_capability: \"7.5\"}\n";
  return inv;
}
// The indices of the GPUs a job's placement names.
std::set<int> GpusOf(const json& j) {
  std::set<int> out;
  for (const json& g : j["placement"]["gpus"]) out.insert(g["index"].get<int>());
  return out;
}

// An elastic job resized by signal (--gpus 1-4 --resize signal) on 4 GPUs: it starts on the two
// that are free, grows onto the two a job gives back (told in its file and by SIGUSR1, it exits 75
// and is started again on 4 under its id), and gives two back to a higher-priority job that wants
// two instead of being preempted (it keeps the other one it grew onto); it grows onto them again
// when that job ends. It is never preempted, no GPU is held twice, and its log says each size it
// ran at.
TEST(TesseraServer, AnElasticJobResizedBySignalGrowsAndShrinksUnderItsId) {
  Daemon d("resize-signal", "", FourT4s("resize-signal"));
  const int64_t busy = d.Submit(Shell("sleep 60", {{"gpus", 2}}));
  d.WaitForProcess(busy);
  json spec = Shell(
      "trap 'echo resize $(head -1 $TESSERA_RESIZE_FILE); exit 75' USR1; "
      "echo start ${TESSERA_RESTARTS:-0} $CUDA_VISIBLE_DEVICES; while :; do sleep 0.05; done",
      {{"gpus", 1}, {"gpus_max", 4}});
  spec["resize"] = {{"by", "signal"}, {"grace_s", 30}};
  const int64_t el = d.Submit(spec);
  json j = WaitUntil(d, el, RunsOn(2, 0));
  ASSERT_TRUE(RunsOn(2, 0)(j)) << j.dump();
  EXPECT_THAT(Cli(d, "show " + std::to_string(el)), HasSubstr("1-4 GPU"));
  d.Call("POST", "/v1/jobs/" + std::to_string(busy) + "/cancel");
  j = WaitUntil(d, el, RunsOn(4, 1));
  ASSERT_TRUE(RunsOn(4, 1)(j)) << j.dump() << d.Log();
  ASSERT_EQ(j["placement"]["sizes"].size(), 2u) << j.dump();
  EXPECT_EQ(j["placement"]["sizes"][0]["gpus"], 2);
  EXPECT_EQ(j["placement"]["sizes"][1]["gpus"], 4);
  bool said = false;
  for (const json& e : j["events"])
    said |= e["state"] == "running" &&
            e["reason"].get<std::string>().find("(resized from 2 to 4 GPUs, restart 1)") !=
                std::string::npos;
  EXPECT_TRUE(said) << j.dump();
  const std::string show = Cli(d, "show " + std::to_string(el));
  EXPECT_THAT(show, ::testing::ContainsRegex("2 GPUs from [0-9:]+, 4 GPUs from [0-9:]+"));
  EXPECT_THAT(show, HasSubstr("by signal (SIGUSR1, exit 75 within 30 s, else restart)"));
  // The higher-priority job takes two of them back: it shrinks by those two (to 2, not to its
  // minimum), and nothing is left for it to grow onto.
  json hi_spec = Shell("sleep 60", {{"gpus", 2}});
  hi_spec["priority"] = 10;
  const int64_t hi = d.Submit(hi_spec);
  json h = d.WaitFor(hi, "running");
  j = WaitUntil(d, el, RunsOn(2, 2));
  ASSERT_TRUE(RunsOn(2, 2)(j)) << j.dump() << d.Log();
  h = d.Call("GET", "/v1/jobs/" + std::to_string(hi));
  std::set<int> both = GpusOf(j);
  for (int g : GpusOf(h)) EXPECT_TRUE(both.insert(g).second) << "GPU " << g << " held twice";
  for (const json& e : j["events"]) EXPECT_NE(e["state"], "preempted") << j.dump();
  // That job ends: it grows onto its GPUs again.
  d.Call("POST", "/v1/jobs/" + std::to_string(hi) + "/cancel");
  d.WaitFor(hi, "cancelled");
  j = WaitUntil(d, el, RunsOn(4, 3));
  ASSERT_TRUE(RunsOn(4, 3)(j)) << j.dump() << d.Log();
  ASSERT_EQ(j["placement"]["sizes"].size(), 4u) << j.dump();
  EXPECT_EQ(j["placement"]["sizes"][2]["gpus"], 2);
  // Each run said its GPUs; each resize its new size.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string log = d.Logs(el);
  while (log.find("start 3 ") == std::string::npos && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    log = d.Logs(el);
  }
  EXPECT_THAT(log, HasSubstr("resize TESSERA_RESIZE_GPUS=4\nstart 1 GPU-"));
  EXPECT_THAT(log, HasSubstr("resize TESSERA_RESIZE_GPUS=2\nstart 2 GPU-"));
  EXPECT_THAT(log, HasSubstr("resize TESSERA_RESIZE_GPUS=4\nstart 3 GPU-"));
  EXPECT_THAT(d.Log(), HasSubstr("resizing to 4 GPUs"));
  d.Call("POST", "/v1/jobs/" + std::to_string(el) + "/cancel");
  j = d.WaitFor(el, "cancelled");
  EXPECT_FALSE(fs::exists(d.dir() + "/state/resize/" + std::to_string(el)));
}

// A job that does not answer its resize signal in its grace (resize.unanswered restart, the
// default) is stopped and started again on its new size.
TEST(TesseraServer, AnElasticJobThatIgnoresItsResizeSignalIsRestartedOnItsNewSize) {
  Daemon d("resize-ignored");
  const int64_t busy = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  d.WaitForProcess(busy);
  json spec = Shell("trap '' USR1; echo start ${TESSERA_RESTARTS:-0}; sleep 60",
                    {{"gpus", 1}, {"gpus_max", 2}});
  spec["resize"] = {{"by", "signal"}, {"grace_s", 1}};
  const int64_t el = d.Submit(spec);
  d.WaitForProcess(el);
  d.Call("POST", "/v1/jobs/" + std::to_string(busy) + "/cancel");
  json j = WaitUntil(d, el, RunsOn(2, 1));
  ASSERT_TRUE(RunsOn(2, 1)(j)) << j.dump() << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr("did not answer its resize in 1 s"));
  d.Call("POST", "/v1/jobs/" + std::to_string(el) + "/cancel");
  d.WaitFor(el, "cancelled");
}

// A kill -9 of the server while a job checkpoints for its resize: the job ends (exit 75) while the
// server is down; the restarted server queues it again at its place and starts it once - it never
// runs twice at a time (its lock folder), and nothing of it is lost.
TEST(TesseraServer, AResizeAcrossAKillNineRunsTheJobOnceAndLosesNothing) {
  Daemon d("resize-kill9");
  const std::string lock = d.dir() + "/el.lock";
  const int64_t busy = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  d.WaitForProcess(busy);
  json spec = Shell("mkdir " + lock +
                        " || { echo TWICE; exit 9; }; "
                        "trap 'echo got; sleep 1; rmdir " +
                        lock +
                        "; exit 75' USR1; "
                        "trap 'rmdir " +
                        lock +
                        "; exit 143' TERM; "
                        "echo start; while :; do sleep 0.05; done",
                    {{"gpus", 1}, {"gpus_max", 2}});
  spec["resize"] = {{"by", "signal"}};
  spec["workdir"] = d.dir();  // its lock folder is seen by each of its runs (a private /tmp)
  const int64_t el = d.Submit(spec);
  d.WaitForProcess(el);
  d.Call("POST", "/v1/jobs/" + std::to_string(busy) + "/cancel");
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (d.Logs(el).find("got") == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_THAT(d.Logs(el), HasSubstr("got")) << "the server's log:\n" << d.Log();
  d.Kill(SIGKILL);
  const std::string exit_file = d.dir() + "/state/exit/" + std::to_string(el);
  until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fs::exists(exit_file) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(exit_file));
  d.Start();
  json j = WaitUntil(d, el, [](const json& j) {
    return j.value("state", "") == "running" && !j["pid"].is_null();
  });
  ASSERT_EQ(j["state"], "running") << j.dump();
  bool requeued = false;
  for (const json& e : j["events"])
    requeued |= e["state"] == "preempted" &&
                e["reason"].get<std::string>().find("ended for its resize") != std::string::npos;
  EXPECT_TRUE(requeued) << j.dump();
  until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string log = d.Logs(el);
  while (log != "start\ngot\nstart\n" && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    log = d.Logs(el);
  }
  EXPECT_EQ(log, "start\ngot\nstart\n");
  d.Call("POST", "/v1/jobs/" + std::to_string(el) + "/cancel");
  d.WaitFor(el, "cancelled");
}

// A kill -9 of the server just after it asked an elastic job to give back two of the four GPUs it
// holds for a higher-priority job: the job checkpoints (2 s) while the server starts again - back
// before the job exits, it re-adopts it with its resize pending; later, it queues it again at its
// place - and either way the end is the same: the queued job runs on two GPUs, the elastic one on
// the other two under its id, no GPU held twice, and the elastic job never ran twice at a time.
TEST(TesseraServer, AShrinkAcrossAKillNineGivesTheQueuedJobItsGpusAndRunsTheJobOnce) {
  Daemon d("shrink-kill9", "", FourT4s("shrink-kill9"));
  const std::string lock = d.dir() + "/el.lock";
  json spec =
      Shell("mkdir " + lock + " || { echo TWICE; exit 9; }; trap 'echo got; sleep 2; rmdir " +
                lock + "; exit 75' USR1; trap 'rmdir " + lock +
                "; exit 143' TERM; echo start; while :; do sleep 0.05; done",
            {{"gpus", 1}, {"gpus_max", 4}});
  spec["resize"] = {{"by", "signal"}};
  spec["workdir"] = d.dir();  // its lock folder is seen by each of its runs (a private /tmp)
  const int64_t el = d.Submit(spec);
  json j = WaitUntil(d, el, RunsOn(4, 0));
  ASSERT_TRUE(RunsOn(4, 0)(j)) << j.dump();
  json hi_spec = Shell("sleep 60", {{"gpus", 2}});
  hi_spec["priority"] = 10;
  const int64_t hi = d.Submit(hi_spec);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (d.Logs(el).find("got") == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_THAT(d.Logs(el), HasSubstr("got")) << "the server's log:\n" << d.Log();
  d.Kill(SIGKILL);
  d.Start();
  json h = d.WaitFor(hi, "running");
  j = WaitUntil(d, el, [](const json& j) {
    return j.value("state", "") == "running" && !j["pid"].is_null() &&
           j["placement"]["gpus"].size() == 2;
  });
  ASSERT_EQ(j["placement"]["gpus"].size(), 2u) << j.dump() << d.Log();
  h = d.Call("GET", "/v1/jobs/" + std::to_string(hi));
  std::set<int> all = GpusOf(j);
  for (int g : GpusOf(h)) EXPECT_TRUE(all.insert(g).second) << "GPU " << g << " held twice";
  until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string log = d.Logs(el);
  while (log != "start\ngot\nstart\n" && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    log = d.Logs(el);
  }
  EXPECT_EQ(log, "start\ngot\nstart\n") << d.Log();
  for (int64_t id : {el, hi}) d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  for (int64_t id : {el, hi}) d.WaitFor(id, "cancelled");
}

// A job grown onto GPUs past its minimum and re-adopted after a kill -9 of the server still
// holds them as grown onto: a job queued after the restart makes it shrink, not wait for its end.
TEST(TesseraServer, AGrownJobReadoptedAfterAKillNineStillGivesBackWhatItGrewOnto) {
  Daemon d("resize-readopt");
  json spec =
      Shell("trap 'exit 75' USR1; while :; do sleep 0.05; done", {{"gpus", 1}, {"gpus_max", 2}});
  spec["resize"] = {{"by", "signal"}};
  const int64_t el = d.Submit(spec);
  json j = WaitUntil(d, el, RunsOn(2, 0));
  ASSERT_TRUE(RunsOn(2, 0)(j)) << j.dump();
  d.Kill(SIGKILL);
  d.Start();
  j = d.Call("GET", "/v1/jobs/" + std::to_string(el));
  EXPECT_TRUE(RunsOn(2, 0)(j)) << "re-adopted on both: " << j.dump();
  const int64_t one = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  json o = d.WaitFor(one, "running");
  j = WaitUntil(d, el, RunsOn(1, 1));
  ASSERT_TRUE(RunsOn(1, 1)(j)) << j.dump() << d.Log();
  o = d.Call("GET", "/v1/jobs/" + std::to_string(one));
  std::set<int> both = GpusOf(j);
  for (int g : GpusOf(o)) EXPECT_TRUE(both.insert(g).second) << "GPU " << g << " held twice";
  for (int64_t id : {el, one}) d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  for (int64_t id : {el, one}) d.WaitFor(id, "cancelled");
}

// The contract across ranks, with a real elastic launcher: torchrun's agents (--nnodes=1:2, c10d
// rendezvous; Debian's python3-torch, workers on gloo) started as jobs one by one as GPUs free up -
// as a Kubernetes elastic gang's members past its minimum are. The first trains alone (a world of
// 1); when the second starts, the agents re-form one world of 2 (the first's workers restarted by
// its agent, under the same job), and both jobs succeed.
TEST(TesseraServer, TorchrunAgentsStartedAsGpusFreeUpReformOneWorld) {
  ASSERT_TRUE(fs::exists("/usr/bin/torchrun"))
      << "python3-torch (scripts/debian-packages.txt) brings torchrun";
  Daemon d("torchrun");
  const std::string train = d.dir() + "/train.py";
  std::ofstream(train) << R"py(import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(1)
dist.all_reduce(t)
print(f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']} rank {rank} world {world} "
      f"sum {int(t.item())}", flush=True)
if world == 2:
    dist.barrier()
    sys.exit(0)
while True:  # a world of one trains until its agent re-forms the world
    time.sleep(0.1)
)py";
  const int port = tessera::net::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const json agent = {
      {"command",
       {"/usr/bin/torchrun", "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=c10d",
        "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=tessera",
        "--rdzv_conf=last_call_timeout=1", "--max_restarts=2", "--monitor_interval=1",
        // Workers' stdout teed to the agent's: Debian's torch 1.13 under Python 3.11 cannot read
        // the default "0" (its Std flag has no member 0 there).
        "--redirects=1", "--tee=1", train}},
      {"resources", {{"gpus", 1}}},
      // TMPDIR: torchrun's agent makes its log folder there (torchelastic_*), the test's not /tmp.
      {"env", {{"HOME", d.dir()}, {"PYTHONUNBUFFERED", "1"}, {"TMPDIR", d.dir()}}},
      {"workdir", d.dir()}};
  const int64_t busy = d.Submit(Shell("sleep 600", {{"gpus", 1}}));
  d.WaitForProcess(busy);
  const int64_t first = d.Submit(agent);
  d.WaitForProcess(first);
  auto said = [&](int64_t id, const std::string& what) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::string log = d.Logs(id);
    while (log.find(what) == std::string::npos && std::chrono::steady_clock::now() < until &&
           d.Call("GET", "/v1/jobs/" + std::to_string(id))["state"] == "running") {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      log = d.Logs(id);
    }
    return log;
  };
  EXPECT_THAT(said(first, "world 1"), HasSubstr("restart 0 rank 0 world 1 sum 1"))
      << d.Logs(first, "stderr");
  ASSERT_EQ(d.Call("GET", "/v1/jobs/" + std::to_string(first))["state"], "running");
  const int64_t second = d.Submit(agent);
  json j = WaitingSaid(d, second);
  EXPECT_EQ(j["state"], "queued") << "both GPUs are held";
  d.Call("POST", "/v1/jobs/" + std::to_string(busy) + "/cancel");
  j = d.WaitFor(first, "succeeded", 180);
  ASSERT_EQ(j["state"], "succeeded") << d.Logs(first, "stderr");
  j = d.WaitFor(second, "succeeded", 60);
  EXPECT_EQ(j["state"], "succeeded") << d.Logs(second, "stderr");
  // Its workers were restarted by its agent into the larger world (a membership change is no
  // failure: TORCHELASTIC_RESTART_COUNT stays 0).
  EXPECT_THAT(d.Logs(first),
              ::testing::ContainsRegex("world 1 sum 1\n.*restart 0 rank [01] world 2 sum 2"));
  EXPECT_THAT(d.Logs(second), ::testing::ContainsRegex("rank [01] world 2 sum 2"));
  d.WaitFor(busy, "cancelled");
}

TEST(TesseraServer, UnhealthyGpuTakesNoWorkAndItsJobIsRequeued) {
  std::string inv = ::testing::TempDir() + "unhealthy-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(inv) << "name: two\ngpus:\n  - {model: Tesla T4, count: 2, memory: 15GiB, "
                        "compute_capability: \"7.5\"}\n"
                        "health_events:\n  - {after: 1500ms, gpu: 0, xid: 79}\n";
  Daemon d("unhealthy", "", inv);
  int64_t id = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  json j = d.WaitFor(id, "running");
  ASSERT_EQ(j["placement"]["gpus"][0]["index"], 0);
  // XID 79 on GPU 0: the job is stopped and re-queued, and runs again on GPU 1.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < until) {
    j = d.Call("GET", "/v1/jobs/" + std::to_string(id));
    if (j["state"] == "running" && j["placement"]["gpus"][0]["index"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(j["placement"]["gpus"][0]["index"], 1) << j.dump();
  bool preempted = false;
  for (const json& e : j["events"])
    preempted |= e["state"] == "preempted" &&
                 e["reason"].get<std::string>().find("unhealthy") != std::string::npos;
  EXPECT_TRUE(preempted) << j.dump();
  json gpus = d.Call("GET", "/v1/gpus");
  EXPECT_FALSE(gpus["gpus"][0]["healthy"].get<bool>());
  HttpClient c(d.socket());
  std::string metrics = c.Send("GET", "/metrics")->body;
  EXPECT_THAT(metrics, HasSubstr("tessera_gpu_healthy{gpu=\"0\""));
  EXPECT_THAT(metrics, ::testing::ContainsRegex("tessera_gpu_healthy\\{gpu=\"0\"[^}]*\\} 0"));
  EXPECT_THAT(metrics,
              ::testing::ContainsRegex("tessera_gpu_xid_errors_total\\{gpu=\"0\"[^}]*\\} 1"));
  d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
}

// The real NVML path (the fake libnvidia-ml.so.1 through dlopen): GPUs by UUID, and each GPU's
// utilization, memory used, temperature and power in /metrics, /v1/gpus and `tessera top`.
TEST(TesseraServer, DriverGpusReportTelemetry) {
  const std::string scenario =
      ::testing::TempDir() + "telemetry-" + std::to_string(getpid()) + ".json";
  json devices = {{{"uuid", "GPU-11111111-aaaa"},
                   {"name", "NVIDIA A100-SXM4-40GB"},
                   {"memory_total", 42949672960ull},
                   {"utilization", 73},
                   {"memory_utilization", 21},
                   {"memory_used", 5000000000ull},
                   {"temperature", 64},
                   {"power_mw", 312500}},
                  {{"uuid", "GPU-22222222-bbbb"},
                   {"name", "NVIDIA A100-SXM4-40GB"},
                   {"memory_total", 42949672960ull},
                   {"utilization", 0},
                   {"temperature", 35},
                   {"errors", {{"nvmlDeviceGetPowerUsage", 3}}}}};
  std::ofstream(scenario) << json{{"devices", devices}}.dump();
  setenv("FAKE_NVML_SCENARIO", scenario.c_str(), 1);
  Daemon d("telemetry",
           "nvml_library: " TESSERA_TEST_FAKES_DIR
           "/nvml-full/libnvidia-ml.so.1\nfallback_simulate: \"\"\n",
           "");
  unsetenv("FAKE_NVML_SCENARIO");

  json info = d.Call("GET", "/v1/info");
  EXPECT_FALSE(info["simulated"].get<bool>()) << info.dump();
  int64_t id = d.Submit(Shell("echo $CUDA_VISIBLE_DEVICES", {{"gpus", 1}}));
  d.WaitFor(id, "succeeded");
  EXPECT_EQ(d.Logs(id), "GPU-11111111-aaaa\n");

  HttpClient c(d.socket());
  std::string metrics = c.Send("GET", "/metrics")->body;
  const std::string gpu0 = "gpu=\"0\",uuid=\"GPU-11111111-aaaa\",model=\"NVIDIA A100-SXM4-40GB\"";
  EXPECT_THAT(metrics, HasSubstr("tessera_gpu_utilization_ratio{" + gpu0));
  EXPECT_THAT(metrics,
              ::testing::ContainsRegex("tessera_gpu_utilization_ratio\\{gpu=\"0\"[^}]*\\} 0.73\n"));
  EXPECT_THAT(metrics,
              ::testing::ContainsRegex("tessera_gpu_utilization_ratio\\{gpu=\"1\"[^}]*\\} 0\n"));
  EXPECT_THAT(metrics, ::testing::ContainsRegex(
                           "tessera_gpu_memory_utilization_ratio\\{gpu=\"0\"[^}]*\\} 0.21\n"));
  EXPECT_THAT(metrics, ::testing::ContainsRegex(
                           "tessera_gpu_memory_used_bytes\\{gpu=\"0\"[^}]*\\} 5000000000\n"));
  EXPECT_THAT(metrics,
              ::testing::ContainsRegex("tessera_gpu_temperature_celsius\\{gpu=\"1\"[^}]*\\} 35\n"));
  EXPECT_THAT(metrics,
              ::testing::ContainsRegex("tessera_gpu_power_watts\\{gpu=\"0\"[^}]*\\} 312.5\n"));
  EXPECT_THAT(metrics, Not(::testing::ContainsRegex("tessera_gpu_power_watts\\{gpu=\"1\"")))
      << "a reading the driver does not offer is left out, not reported as 0";
  EXPECT_THAT(metrics, ::testing::ContainsRegex("tessera_gpu_simulated\\{[^}]*\\} 0\n"));

  json gpus = d.Call("GET", "/v1/gpus")["gpus"];
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_DOUBLE_EQ(gpus[0]["utilization"].get<double>(), 0.73);
  EXPECT_DOUBLE_EQ(gpus[0]["power_watts"].get<double>(), 312.5);
  EXPECT_EQ(gpus[0]["memory_used_bytes"].get<uint64_t>(), 5000000000u);
  EXPECT_TRUE(gpus[1]["power_watts"].is_null());

  std::string top = Cli(d, "top --once");
  EXPECT_THAT(top, ::testing::ContainsRegex("0 +NVIDIA A100-SXM4-40GB +ok .* 73% +64C +312W"));
  EXPECT_THAT(top, ::testing::ContainsRegex("1 +NVIDIA A100-SXM4-40GB +ok .* 0% +35C +- "));
}

// A podman wrapper around the fake podman (tests/fakes/podman), which knows the images `images`.
std::string FakePodmanDir(const std::string& name, const std::string& images) {
  const std::string dir =
      ::testing::TempDir() + "tessera-e2e-podman-" + std::to_string(getpid()) + "-" + name;
  fs::remove_all(dir);
  fs::create_directories(dir + "/state");
  std::ofstream(dir + "/state/images") << images;
  std::ofstream(dir + "/podman") << "#!/bin/sh\nexec " TESSERA_TEST_FAKES_DIR
                                    "/podman/fake_podman --fake-state "
                                 << dir << "/state \"$@\"\n";
  fs::permissions(dir + "/podman",
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  return dir;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in, nullptr, false);
}

// An elastic job in a container resized by restart: stopped (the stop reaches the container) and
// run again, the same container name, on both GPUs as CDI devices.
TEST(TesseraServer, AnElasticJobInAContainerIsResizedByRestart) {
  const std::string p = FakePodmanDir("resize", "example/train:1\n");
  Daemon d("containers-resize", "containers: {podman: " + p + "/podman, cdi_spec_dir: " + p +
                                    "/cdi, run_args: [--pull=never]}\n");
  const int64_t busy = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  d.WaitForProcess(busy);
  json spec = Shell("echo start $CUDA_VISIBLE_DEVICES; sleep 60", {{"gpus", 1}, {"gpus_max", 2}});
  spec["image"] = "example/train:1";
  spec["resize"] = {{"by", "restart"}};
  const int64_t el = d.Submit(spec);
  json j = WaitUntil(d, el, RunsOn(1, 0));
  ASSERT_TRUE(RunsOn(1, 0)(j)) << j.dump() << d.Log();
  d.Call("POST", "/v1/jobs/" + std::to_string(busy) + "/cancel");
  j = WaitUntil(d, el, RunsOn(2, 1));
  ASSERT_TRUE(RunsOn(2, 1)(j)) << j.dump() << d.Log();
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  json rec;
  while (std::chrono::steady_clock::now() < until) {
    rec = ReadJson(p + "/state/tessera-job-" + std::to_string(el) + ".json");
    if (rec.is_object() && rec["devices"].size() == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(rec["devices"].size(), 2u) << rec.dump();
  d.Call("POST", "/v1/jobs/" + std::to_string(el) + "/cancel");
  d.WaitFor(busy, "cancelled");
  d.WaitFor(el, "cancelled");
}

// Jobs with an image run under podman with their GPUs as CDI devices from the spec the server
// wrote; a stop reaches the container; podman's own failures are told apart from the job's.
TEST(TesseraServer, ImageJobsRunUnderPodmanWithCdiDevices) {
  const std::string p = FakePodmanDir("run", "example/train:1\n");
  Daemon d("containers", "containers: {podman: " + p + "/podman, cdi_spec_dir: " + p +
                             "/cdi, run_args: [--pull=never]}\n");
  json info = d.Call("GET", "/v1/info");
  ASSERT_TRUE(info["containers"]["available"].get<bool>()) << info.dump() << d.Log();
  EXPECT_EQ(info["containers"]["cdi_spec"], p + "/cdi/tessera.io-gpu.json");
  json gpus = d.Call("GET", "/v1/gpus")["gpus"];
  json spec = ReadJson(p + "/cdi/tessera.io-gpu.json");
  ASSERT_EQ(spec["kind"], "tessera.io/gpu");
  std::vector<std::string> names;
  for (const json& dev : spec["devices"]) names.push_back(dev["name"]);
  EXPECT_THAT(names, ::testing::IsSupersetOf(
                         {gpus[0]["uuid"].get<std::string>(), gpus[1]["uuid"].get<std::string>()}));

  // Whole GPU: the device by UUID; the job's env goes in with --env, not into podman's own.
  json whole =
      Shell("echo dev=$CUDA_VISIBLE_DEVICES foo=$FOO path=$PATH; env | grep '^TESSERA_GPU_'",
            {{"gpus", 1}});
  whole["image"] = "example/train:1";
  whole["env"] = {{"FOO", "bar"}};
  whole["resources"]["memory"] = "512MiB";
  whole["resources"]["cpus"] = 2;
  int64_t id = d.Submit(whole);
  json j = d.WaitFor(id, "succeeded");
  const int gpu = j["placement"]["gpus"][0]["index"];
  const std::string uuid = j["placement"]["gpus"][0]["uuid"];
  EXPECT_EQ(d.Logs(id),
            "dev=" + uuid +
                " foo=bar path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" +
                "TESSERA_GPU_" + std::to_string(gpu) + "_UUID=" + uuid + "\n")
      << "the image's PATH, the CDI device's environment";
  json rec = ReadJson(p + "/state/tessera-job-" + std::to_string(id) + ".json");
  EXPECT_EQ(rec["devices"], json::array({"tessera.io/gpu=" + uuid}));
  EXPECT_EQ(rec["image"], "example/train:1");
  EXPECT_EQ(rec["limits"], json({{"memory", "536870912"}, {"cpus", "2"}, {"pids-limit", "16384"}}))
      << "the job's limits, enforced by podman";
  EXPECT_THAT(rec["flags"].get<std::vector<std::string>>(),
              ::testing::ElementsAre("--rm", "--label io.tessera.job=" + std::to_string(id),
                                     "--pull=never"));
  for (const json& e : rec["podman_env"]) EXPECT_THAT(e.get<std::string>(), Not(HasSubstr("FOO=")));
  EXPECT_EQ(rec["global"],
            json::array({"--fake-state", p + "/state", "--cdi-spec-dir", p + "/cdi"}))
      << "this podman takes the spec folder";
  EXPECT_THAT(Cli(d, "show " + std::to_string(id)),
              HasSubstr("image        example/train:1 (podman)"));

  // A share of a GPU: the intercept library, the job's region (made before it starts) and the
  // arbiter's folder (the server replaces the file to revoke access; a bind mount of the file
  // would pin the old one) are bound into the container.
  json frac = Shell("test -s \"$TESSERA_CUDA_REGION\" && echo region-ok preload=$LD_PRELOAD",
                    {{"gpu_memory", "1GiB"}, {"gpu_share", "30%"}});
  frac["image"] = "example/train:1";
  id = d.Submit(frac);
  d.WaitFor(id, "succeeded");
  rec = ReadJson(p + "/state/tessera-job-" + std::to_string(id) + ".json");
  const std::string lib = rec["env"]["LD_PRELOAD"];
  EXPECT_EQ(d.Logs(id), "region-ok preload=" + lib + "\n");
  const std::string region = rec["env"]["TESSERA_CUDA_REGION"],
                    arbiter = rec["env"]["TESSERA_CUDA_ARBITER"];
  const std::string arbiter_dir = fs::path(arbiter).parent_path();
  EXPECT_EQ(fs::path(arbiter).filename(), "gpu.arbiter");
  // Its pids are not NVML's in there: its contexts count as the model's measured figure (the
  // test machine's Tesla T4 was not measured: 512 MiB).
  EXPECT_EQ(rec["env"]["TESSERA_CUDA_CONTEXT_OVERHEAD"], std::to_string(512ull << 20));
  EXPECT_THAT(rec["volumes"].get<std::vector<std::string>>(),
              ::testing::ElementsAre(lib + ":" + lib + ":ro", region + ":" + region + ":rw",
                                     arbiter_dir + ":" + arbiter_dir + ":rw"));

  // Cancel: SIGTERM is passed on; a container that ignores it is killed and removed by name.
  id = d.Submit([] {
    json k = Shell("trap '' TERM; echo started; sleep 30", {{"gpus", 1}});
    k["image"] = "example/train:1";
    return k;
  }());
  d.WaitFor(id, "running");
  for (int i = 0; i < 200 && d.Logs(id).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int status = 0;
  d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel", "", &status);
  EXPECT_EQ(status, 200);
  d.WaitFor(id, "cancelled");
  std::string rm;
  for (int i = 0; i < 250 && rm.find("tessera-job-" + std::to_string(id)) == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    rm = tessera::test::ReadFile(p + "/state/rm.log");
  }
  EXPECT_THAT(rm, HasSubstr("rm --force --ignore --time 0 tessera-job-" + std::to_string(id)));

  // podman's own failures (exit 125): an unknown image; a device the runtime cannot resolve.
  json unknown = Shell("true", {{"gpus", 1}});
  unknown["image"] = "example/missing:2";
  id = d.Submit(unknown);
  j = d.WaitFor(id, "failed");
  EXPECT_THAT(j["reason"].get<std::string>(),
              HasSubstr("podman could not run the container (exit code 125"));
  EXPECT_THAT(d.Logs(id, "stderr"), HasSubstr("example/missing:2: image not known"));
  fs::remove(p + "/cdi/tessera.io-gpu.json");
  id = d.Submit(whole);
  d.WaitFor(id, "failed");
  EXPECT_THAT(d.Logs(id, "stderr"), HasSubstr("unresolvable CDI devices tessera.io/gpu=GPU-"));
}

TEST(TesseraServer, QueuedImageJobFailsClearlyAfterARestartWithoutPodman) {
  const std::string p = FakePodmanDir("restart", "example/train:1\n");
  Daemon d("image-restart",
           "containers: {podman: " + p + "/podman, cdi_spec_dir: " + p + "/cdi}\n");
  int64_t blocker = d.Submit(Shell("sleep 60", {{"gpus", 2}}));
  d.WaitForProcess(blocker);
  json spec = Shell("true", {{"gpus", 1}});
  spec["image"] = "example/train:1";
  int64_t id = d.Submit(spec);
  d.Kill(SIGKILL);
  std::ofstream(d.dir() + "/server.yaml")
      << "preemption: {grace_period_s: 1}\nallow_root_jobs: true\ncontainers: {podman: \"\"}\n"
      << d.Confinement();
  d.Start();
  EXPECT_EQ(d.Call("GET", "/v1/jobs/" + std::to_string(id))["state"], "queued");
  d.Call("POST", "/v1/jobs/" + std::to_string(blocker) + "/cancel");
  json j = d.WaitFor(id, "failed");
  EXPECT_THAT(j["reason"].get<std::string>(),
              HasSubstr("this server cannot run containers: containers are turned off"));
  EXPECT_EQ(d.Call("GET", "/v1/info")["running"], 0) << "its GPU was given back";
}

TEST(TesseraServer, ImageWithoutPodmanIsRefusedAndSaid) {
  Daemon d("nopodman", "containers: {podman: /nonexistent/podman}\n");
  json info = d.Call("GET", "/v1/info");
  EXPECT_FALSE(info["containers"]["available"].get<bool>());
  EXPECT_THAT(info["containers"]["reason"].get<std::string>(),
              HasSubstr("/nonexistent/podman is not an executable file"));
  json spec = Shell("true", {{"gpus", 1}});
  spec["image"] = "example/train:1";
  int status = 0;
  json e = d.Call("POST", "/v1/jobs", spec.dump(), &status);
  EXPECT_EQ(status, 400);
  EXPECT_THAT(e["message"].get<std::string>(),
              HasSubstr("image: this server cannot run containers: podman:"));
  EXPECT_TRUE(d.Call("GET", "/v1/jobs")["jobs"].empty());
  std::string out = Cli(d, "submit --gpus 1 --image example/train:1 -- true");
  EXPECT_THAT(out, HasSubstr("cannot run containers"));
}

TEST(TesseraServer, BadRequestsGetClearErrorsAndChangeNothing) {
  Daemon d("bad", "max_body_bytes: 4096\n");
  auto count = [&] { return d.Call("GET", "/v1/jobs")["jobs"].size(); };
  const size_t before = count();
  HttpClient c(d.socket());
  struct Case {
    std::string method, target, body;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"POST", "/v1/jobs", "{not json", 400, "malformed JSON"},
      {"POST", "/v1/jobs", "[1,2]", 400, "expected a JSON object"},
      {"POST", "/v1/jobs", R"({"command": "ls"})", 400, "command: expected a non-empty array"},
      {"POST", "/v1/jobs", R"({"command": ["ls"], "colour": "red"})", 400,
       "unknown field 'colour'"},
      {"POST", "/v1/jobs", R"({"command": ["ls"], "resources": {"gpus": "1"}})", 400,
       "resources.gpus"},
      {"POST", "/v1/jobs", R"({"command": ["ls"], "resources": {"gpus": 8}})", 400,
       "could never start"},
      {"POST", "/v1/jobs", R"({"command": ["ls"], "resources": {"gpus": 3, "gpu_share": 10}})", 400,
       "this machine has 2 matching GPU(s) of 2; the job could never start"},
      // More memory than any GPU has: the largest said.
      {"POST", "/v1/jobs",
       R"({"command": ["ls"], "resources": {"gpu_memory": "100GiB", "gpu_share": 10}})", 400,
       "per GPU asked; the largest GPU here has 15"},
      // A model this machine lacks (whole words of a name; "T4" would be its Tesla T4).
      {"POST", "/v1/jobs", R"({"command": ["ls"], "resources": {"gpus": 1, "model": "H100"}})", 400,
       "'H100' is none of this machine's GPU models (Tesla T4)"},
      {"POST", "/v1/jobs", R"({"command": ["ls"], "resources": {"gpus": 1, "model": "T"}})", 400,
       "'T' is none of this machine's GPU models"},
      {"POST", "/v1/jobs", std::string(8000, ' '), 413, "over the limit"},
      {"GET", "/v1/jobs?state=sleeping", "", 400, "unknown state 'sleeping'"},
      {"GET", "/v1/jobs?colour=red", "", 400, "unknown query parameter"},
      {"GET", "/v1/jobs/abc", "", 400, "is not a job (a positive whole number)"},
      {"GET", "/v1/jobs/12345", "", 404, "not found"},
      {"DELETE", "/v1/jobs", "", 405, "does not take DELETE"},
      {"GET", "/v1/jobs/1/cancel", "", 405, "does not take GET"},
      {"GET", "/v1/jobs/12345/logs", "", 404, "not found"},
      {"GET", "/v2/jobs", "", 404, "no such endpoint"},
  };
  for (const Case& k : cases) {
    auto r = c.Send(k.method, k.target, k.body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, k.status) << k.method << " " << k.target << ": " << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    EXPECT_THAT(j["message"].get<std::string>(), HasSubstr(k.message)) << k.target;
    EXPECT_FALSE(j["code"].get<std::string>().empty());
  }
  EXPECT_EQ(count(), before) << "no job was created by a bad request";
  // The server still answers after all that.
  EXPECT_EQ(d.Call("GET", "/v1/health")["status"], "ok");
}

TEST(TesseraServer, TcpNeedsATokenAndUsersCancelOnlyTheirOwnJobs) {
  Daemon d("tcp",
           std::string("tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: ") + kToken +
               ", user: nobody}\n    - {token: scrape-0123456789abcdef, metrics_only: true}\n");
  int64_t mine = d.Submit(Shell("sleep 60", {{"gpus", 1}}));
  d.WaitFor(mine, "running");
  // The port is in the log.
  std::string log = d.Log();
  size_t at = log.find("tcp port ");
  ASSERT_NE(at, std::string::npos) << log;
  std::string endpoint = "tcp://127.0.0.1:" + std::to_string(std::stoi(log.substr(at + 9)));
  HttpClient anonymous(endpoint);
  EXPECT_EQ(anonymous.Send("GET", "/v1/jobs")->status, 401);
  HttpClient bob(endpoint, kToken);
  auto r = bob.Send("POST", "/v1/jobs/" + std::to_string(mine) + "/cancel");
  EXPECT_EQ(r->status, 403) << r->body;
  EXPECT_EQ(d.Call("GET", "/v1/jobs/" + std::to_string(mine))["state"], "running");
  // A scraper's token reads /metrics and nothing else.
  HttpClient prometheus(endpoint, "scrape-0123456789abcdef");
  auto metrics = prometheus.Send("GET", "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("\ntessera_jobs_running "));
  for (const auto& [method, target] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/jobs"},
           {"GET", "/v1/info"},
           {"POST", "/v1/jobs/" + std::to_string(mine) + "/cancel"}}) {
    auto no = prometheus.Send(method, target);
    ASSERT_TRUE(no.ok());
    EXPECT_EQ(no->status, 403) << target;
    EXPECT_THAT(no->body, HasSubstr("metrics_only")) << target;
  }
  d.Call("POST", "/v1/jobs/" + std::to_string(mine) + "/cancel");
  EXPECT_THAT(log, Not(HasSubstr("travel in clear"))) << "loopback is not warned about";
}

TEST(TesseraServer, TcpSpeaksTlsWithACertificateAndWarnsWithout) {
  const std::string cert = ::testing::TempDir() + "tls-" + std::to_string(getpid()) + ".crt";
  const std::string key = ::testing::TempDir() + "tls-" + std::to_string(getpid()) + ".key";
  tessera::fakes::WriteTestCertificate(cert, key);
  Daemon d("tls", std::string("tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: ") +
                      kToken + ", user: nobody}\n  tls: {cert: " + cert + ", key: " + key + "}\n");
  std::string log = d.Log();
  size_t at = log.find("tcp port ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string port = std::to_string(std::stoi(log.substr(at + 9)));
  EXPECT_THAT(log, HasSubstr("(TLS, " + cert + ")"));
  EXPECT_THAT(log, Not(HasSubstr("travel in clear")));
  // The server's certificate checked against the CA given: the token travels encrypted.
  HttpClient bob("https://127.0.0.1:" + port, kToken, cert);
  auto r = bob.Send("GET", "/v1/jobs");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << r->body;
  tessera::test::Captured cli = tessera::test::Capture(
      std::string("TESSERA_SOCKET=https://127.0.0.1:") + port + " TESSERA_TOKEN=" + kToken + " " +
      TESSERA_BINARY + " ls --all -o json --ca-cert " + cert + " 2>&1");
  EXPECT_EQ(cli.code, 0) << cli.out;
  EXPECT_EQ(cli.out, "[]\n");
  // A certificate no CA of this machine signed is refused; plain HTTP gets no answer.
  auto untrusted = HttpClient("https://127.0.0.1:" + port, kToken).Send("GET", "/v1/jobs");
  ASSERT_FALSE(untrusted.ok());
  EXPECT_THAT(std::string(untrusted.status().message()), HasSubstr("certificate verify failed"));
  auto plain = HttpClient("tcp://127.0.0.1:" + port, kToken).Send("GET", "/v1/jobs");
  EXPECT_FALSE(plain.ok() && plain->status == 200);
  std::remove(cert.c_str());
  std::remove(key.c_str());
}

// nobody's job with a compute share (30% and 1 GiB of a GPU, `sleep 60`), submitted over TCP with
// nobody's token (the daemon's config gives it): its id once its process runs, -1 (and a failure)
// when it was not accepted.
int64_t RunNobodysShareJob(Daemon& d) {
  const std::string log = d.Log();
  const std::string endpoint =
      "tcp://127.0.0.1:" + std::to_string(std::stoi(log.substr(log.find("tcp port ") + 9)));
  auto r = HttpClient(endpoint, kToken)
               .Send("POST", "/v1/jobs",
                     Shell("sleep 60", {{"gpu_share", "30%"}, {"gpu_memory", "1GiB"}}).dump());
  if (!r.ok() || r->status != 201) {
    ADD_FAILURE() << (r.ok() ? r->body : r.status().ToString());
    return -1;
  }
  const int64_t id = json::parse(r->body)["id"];
  d.WaitForProcess(id);
  return id;
}

// A process of another job paced by the arbiter at `arbiter` (job key 99), mapped as the library
// maps it, which looks whether the file was replaced at every launch that waits; null and why in
// `err` when it cannot attach.
std::unique_ptr<tessera::shim::Arbiter> Tenant(const std::string& arbiter, std::string* err) {
  tessera::shim::ArbiterConfig follow_now;
  follow_now.follow_us = 0;
  char why[256] = "";
  std::unique_ptr<tessera::shim::Arbiter> tenant(
      tessera::shim::Arbiter::Attach(arbiter.c_str(), 99, follow_now, why, sizeof why));
  *err = why;
  return tenant;
}

TEST(TesseraServer, OnlyUsersWithAComputeShareRunningMayWriteTheArbiter) {
  Daemon d("arbiter", std::string("tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: ") +
                          kToken + ", user: nobody}\n");
  json info = d.Call("GET", "/v1/info");
  EXPECT_THAT(info["arbiter"]["access"].get<std::string>(), HasSubstr("ACL entry per user"));
  const std::string arbiter = info["arbiter"]["file"];
  struct stat st;
  ASSERT_EQ(stat(arbiter.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "not 0666";
  // Its folders are open to pass through (the test's own temp folder is 0700).
  for (const std::string& dir : {::testing::TempDir(), d.dir()}) chmod(dir.c_str(), 0711);
  auto can_write = [&](const std::string& user) {
    const passwd* pw = getpwnam(user.c_str());
    return pw && tessera::test::Capture(fmt::format("setpriv --reuid={} --regid={} --clear-groups "
                                                    "test -w {}",
                                                    pw->pw_uid, pw->pw_gid, arbiter))
                         .code == 0;
  };
  EXPECT_FALSE(can_write("nobody"));
  EXPECT_FALSE(can_write("daemon"));
  // nobody's job with a compute share: nobody may write it while it runs, daemon still not.
  const int64_t id = RunNobodysShareJob(d);
  ASSERT_GT(id, 0);
  EXPECT_TRUE(can_write("nobody"));
  EXPECT_FALSE(can_write("daemon"));
  EXPECT_EQ(tessera::server::AclUsers(arbiter), std::set<uid_t>{getpwnam("nobody")->pw_uid});

  // While allowed, nobody opens the file and keeps the descriptor (a process outside the job).
  const passwd* nobody = getpwnam("nobody");
  const std::string zeros(sizeof(tessera::shim::ArbiterData), '\0');
  int to_kid[2], from_kid[2];
  ASSERT_EQ(pipe(to_kid), 0);
  ASSERT_EQ(pipe(from_kid), 0);
  const pid_t kid = fork();
  if (kid == 0) {
    if (setgroups(0, nullptr) != 0 || setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0)
      _exit(2);
    const int fd = open(arbiter.c_str(), O_RDWR);
    const char opened = fd >= 0 ? 'y' : 'n';
    char go = 0;
    if (write(from_kid[1], &opened, 1) != 1 || read(to_kid[0], &go, 1) != 1) _exit(3);
    // Access removed: what the kept descriptor can still do to the file it reaches.
    const bool zeroed =
        pwrite(fd, zeros.data(), zeros.size(), 0) == static_cast<ssize_t>(zeros.size());
    _exit(zeroed && ftruncate(fd, 0) == 0 ? 0 : 4);
  }
  char opened = 0;
  ASSERT_EQ(read(from_kid[0], &opened, 1), 1);
  EXPECT_EQ(opened, 'y');
  // A process of another job with a compute share, paced by the file.
  std::string err;
  std::unique_ptr<tessera::shim::Arbiter> tenant = Tenant(arbiter, &err);
  ASSERT_NE(tenant, nullptr) << err;
  tenant->BeforeLaunch(0, nullptr);
  struct stat before;
  ASSERT_EQ(stat(arbiter.c_str(), &before), 0);

  d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  d.WaitFor(id, "cancelled");
  EXPECT_FALSE(can_write("nobody")) << "its entry goes with its last such job";
  EXPECT_TRUE(tessera::server::AclUsers(arbiter).empty());
  struct stat after;
  ASSERT_EQ(stat(arbiter.c_str(), &after), 0);
  EXPECT_NE(after.st_ino, before.st_ino) << "a copy renamed over it: the kept descriptor's is gone";
  EXPECT_EQ(after.st_mode & 0777, 0600u);
  EXPECT_EQ(after.st_uid, 0u);
  tenant->data()->gpus[0].lease.store(0);  // past its slice: the next launch looks
  tenant->BeforeLaunch(0, nullptr);

  // The kept descriptor zeroes and truncates what it reaches: nothing anyone uses.
  const char go = 'g';
  ASSERT_EQ(write(to_kid[1], &go, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(kid, &status, 0), kid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {to_kid[0], to_kid[1], from_kid[0], from_kid[1]}) close(fd);
  auto now = std::make_unique<tessera::shim::ArbiterData>();
  EXPECT_TRUE(tessera::shim::ReadSharedFile(arbiter.c_str(), sizeof *now,
                                            tessera::shim::kArbiterMagic,
                                            tessera::shim::kArbiterVersion, now.get(), sizeof *now))
      << "the arbiter at its path is whole";
  const int slot = tenant->Slot(0);
  EXPECT_EQ(now->gpus[0].jobs[slot].key.load(), 99u) << "the other job keeps its slot";
  EXPECT_EQ(now->gpus[0].lease.load() >> 48, static_cast<uint64_t>(slot + 1))
      << "and its lease: pacing goes on";
  tenant->BeforeLaunch(0, nullptr);  // would fault (SIGBUS) on the truncated old file
  EXPECT_EQ(tenant->data()->magic.load(), tessera::shim::kArbiterMagic);
  EXPECT_THAT(d.Log(), HasSubstr("GPU arbiter file replaced: uid " +
                                 std::to_string(nobody->pw_uid) + " has no job"));
}

// A user with a running share job may write the arbiter, and so truncate it under every tenant:
// the tenants' processes live on (zero pages instead of SIGBUS, unpaced meanwhile), and the server
// replaces the file by a whole one within about a second, which they follow.
TEST(TesseraServer, AnArbiterTruncatedByAUserIsReplacedAndItsTenantsLive) {
  Daemon d("truncated", std::string("tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: ") +
                            kToken + ", user: nobody}\n");
  const std::string arbiter = d.Call("GET", "/v1/info")["arbiter"]["file"];
  for (const std::string& dir : {::testing::TempDir(), d.dir()}) chmod(dir.c_str(), 0711);
  const int64_t id = RunNobodysShareJob(d);
  ASSERT_GT(id, 0);
  // A tenant of another job, paced by the file (mapped, as the library maps it).
  std::string err;
  std::unique_ptr<tessera::shim::Arbiter> tenant = Tenant(arbiter, &err);
  ASSERT_NE(tenant, nullptr) << err;
  tenant->BeforeLaunch(0, nullptr);
  struct stat before;
  ASSERT_EQ(stat(arbiter.c_str(), &before), 0);
  // nobody truncates it.
  const passwd* nobody = getpwnam("nobody");
  const pid_t kid = fork();
  if (kid == 0) {
    if (setgroups(0, nullptr) != 0 || setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0)
      _exit(2);
    const int fd = open(arbiter.c_str(), O_RDWR);
    _exit(fd >= 0 && ftruncate(fd, 0) == 0 ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(kid, &status, 0), kid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  tenant->data()->gpus[0].lease.store(0);  // would be SIGBUS: zero pages now, unpaced
  tenant->BeforeLaunch(0, nullptr);
  // The server replaces it.
  auto whole = [&] {
    auto now = std::make_unique<tessera::shim::ArbiterData>();
    return tessera::shim::ReadSharedFile(arbiter.c_str(), sizeof *now, tessera::shim::kArbiterMagic,
                                         tessera::shim::kArbiterVersion, now.get(), sizeof *now);
  };
  // The server renames the fresh file into place, then says so: both are waited for (the file can
  // be whole a moment before the log line is written).
  const std::string said = "was damaged (truncated, or not an arbiter any more): replaced";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((!whole() || d.Log().find(said) == std::string::npos) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(whole()) << d.Log();
  struct stat after;
  ASSERT_EQ(stat(arbiter.c_str(), &after), 0);
  EXPECT_NE(after.st_ino, before.st_ino);
  EXPECT_EQ(after.st_mode & 07, 0u) << "nothing for others (the group bits are the ACL's mask)";
  EXPECT_EQ(tessera::server::AclUsers(arbiter), std::set<uid_t>{nobody->pw_uid})
      << "the running job's user keeps her entry";
  EXPECT_THAT(d.Log(), HasSubstr(said));
  tenant->BeforeLaunch(0, nullptr);  // follows the new file: paced again
  EXPECT_EQ(tenant->data()->magic.load(), tessera::shim::kArbiterMagic);
  d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  d.WaitFor(id, "cancelled");
}

TEST(TesseraServer, PlainTcpOffLoopbackIsWarnedAbout) {
  Daemon d("clear", std::string("tcp:\n  listen: \"0.0.0.0:0\"\n  tokens:\n    - {token: ") +
                        kToken + ", user: nobody}\n");
  EXPECT_THAT(d.Log(), HasSubstr("tcp.listen 0.0.0.0:0 is not a loopback address and has no TLS: "
                                 "bearer tokens and jobs' environments travel in clear"));
}

TEST(TesseraServer, CliSubmitLsShowLogsTopAndOpenApi) {
  Daemon d("cli");
  std::string out = Cli(d, "submit --gpus 1 --name hello --no-env -- /bin/echo hi there");
  EXPECT_THAT(out, HasSubstr("submitted job 1"));
  d.WaitFor(1, "succeeded");
  EXPECT_EQ(Cli(d, "logs 1"), "hi there\n");
  // ls: what is queued or running (none now, and said so), like squeue; --ended, like sacct.
  EXPECT_THAT(Cli(d, "ls"), ::testing::Not(HasSubstr("hello")));
  EXPECT_THAT(Cli(d, "ls"),
              HasSubstr("no queued or running jobs (ended ones: tessera ls --ended)"));
  EXPECT_THAT(Cli(d, "ls --ended"), ::testing::ContainsRegex("1 +hello +[^ ]+ +succeeded"));
  EXPECT_THAT(Cli(d, "ls -t all"), ::testing::ContainsRegex("1 +hello +[^ ]+ +succeeded"));
  // An admin's purge now: what to remove named, ages as written.
  EXPECT_THAT(Cli(d, "admin purge"), HasSubstr("name what to remove: --jobs AGE"));
  EXPECT_THAT(Cli(d, "admin purge --logs soon"),
              HasSubstr("--logs soon: expected an age such as 30d, 12h or 0"));
  EXPECT_EQ(Cli(d, "admin purge --logs 30d --environments 1h"),
            "purged the logs of 0 jobs; the stored environments of 0 jobs\n");
  EXPECT_EQ(json::parse(Cli(d, "admin purge --logs 0 -o json"))["logs"], 1);
  EXPECT_EQ(Cli(d, "logs 1"), "") << "its log is gone, its record stays";
  EXPECT_EQ(json::parse(Cli(d, "show 1 -o json"))["state"], "succeeded");
  json j = json::parse(Cli(d, "show 1 -o json"));
  EXPECT_EQ(j["state"], "succeeded");
  EXPECT_THAT(Cli(d, "show 1"), HasSubstr("exit code    0"));
  EXPECT_THAT(Cli(d, "top --once"), HasSubstr("[SIMULATED GPUs]"));
  // Repeatable options end at --: the command's own flags (-c) are not taken for tessera's.
  out = Cli(d,
            "submit --gpus 1 --model t4 --no-env --env A=1 --env B=2 --label k=v -- /bin/sh -c "
            "'echo $A$B'");
  EXPECT_THAT(out, HasSubstr("submitted job 2"));
  j = d.WaitFor(2, "succeeded");
  EXPECT_EQ(j["spec"]["resources"]["model"], json::array({"Tesla T4"}))
      << "a part of a name is stored as the exact one";
  EXPECT_EQ(Cli(d, "logs 2"), "12\n");
  EXPECT_THAT(Cli(d, "submit --gpus 1"), HasSubstr("needs a command"));
  EXPECT_THAT(Cli(d, "submit --env FOO -- true"), HasSubstr("--env FOO: expected NAME=VALUE"));
  EXPECT_THAT(Cli(d, "submit --label team -- true"), HasSubstr("--label team: expected KEY=VALUE"));
  EXPECT_THAT(Cli(d, "submit --gpu-share 300% -- true"), HasSubstr("resources.gpu_share"));
  EXPECT_THAT(Cli(d, "submit --gpu-share 1 -- true"), HasSubstr("1 is ambiguous"));
  // Units as users write them: a share as a fraction, Slurm's sizes and times.
  out = Cli(d,
            "submit --gpu-share 0.3 --gpu-mem 2G --mem 1G --max-runtime 1h30m --grace 2m --no-env "
            "-- true");
  EXPECT_THAT(out, HasSubstr("submitted job 3"));
  j = d.WaitFor(3, "succeeded");
  EXPECT_EQ(j["spec"]["resources"]["gpu_share"], "30%");
  EXPECT_EQ(j["spec"]["resources"]["gpu_memory"], "2048MiB");
  EXPECT_EQ(j["spec"]["resources"]["memory"], "1024MiB");
  EXPECT_EQ(j["spec"]["max_runtime_s"], 5400);
  EXPECT_EQ(j["spec"]["grace_period_s"], 120);
  out = Cli(d, "submit --max-runtime 01:00:00 --grace 0 --no-env -- true");
  EXPECT_THAT(out, HasSubstr("submitted job 4"));
  EXPECT_EQ(d.WaitFor(4, "succeeded")["spec"]["max_runtime_s"], 3600);
  EXPECT_THAT(Cli(d, "ls --state sleeping"), HasSubstr("unknown state 'sleeping'"));
  EXPECT_EQ(json::parse(Cli(d, "ls --ended -o json")).size(), 4u)
      << "none of the bad submissions was stored";
  EXPECT_THAT(Cli(d, "ls --ended --state queued"), HasSubstr("excludes"));
  // ls is your own jobs unless asked: another user's list is empty here, --all has everyone's.
  EXPECT_EQ(json::parse(Cli(d, "ls --user nobody --state all -o json")).size(), 0u);
  EXPECT_EQ(json::parse(Cli(d, "ls --all --state all -o json")).size(), 4u);
  EXPECT_THAT(Cli(d, "ls --all --user nobody"), HasSubstr("excludes"));
  json api = d.Call("GET", "/v1/openapi.json");
  EXPECT_TRUE(api["paths"].contains("/v1/jobs"));
  EXPECT_TRUE(api["paths"].contains("/metrics"));
  // Valid as the version it declares, by a real validator (npm, pinned; installed by scripts/test).
  std::ofstream(d.dir() + "/openapi.json") << api.dump();
  tessera::test::Captured v =
      tessera::test::Capture(std::string("node ") + TESSERA_SOURCE_DIR +
                             "/tests/deploy/openapi.mjs " + d.dir() + "/openapi.json 2>&1");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_EQ(v.out, "valid OpenAPI " + api["openapi"].get<std::string>().substr(0, 3) + "\n");
  std::string metrics = HttpClient(d.socket()).Send("GET", "/metrics")->body;
  EXPECT_THAT(metrics, HasSubstr("tessera_scheduling_latency_seconds_count 4"));
  EXPECT_THAT(metrics, HasSubstr("tessera_queue_length 0"));
}

// A running job whose predicted end has passed is shown overdue, not as an end in the past.
TEST(TesseraServer, LsShowsAPassedPredictedEndAsOverdue) {
  Daemon d("overdue");
  EXPECT_THAT(Cli(d, "submit --name quick --no-env -- true"), HasSubstr("submitted job 1"));
  d.WaitFor(1, "succeeded");  // history: 'quick' takes about no time
  EXPECT_THAT(Cli(d, "submit --name quick --no-env -- sleep 30"), HasSubstr("submitted job 2"));
  d.WaitFor(2, "running");
  std::string ls;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    ls = Cli(d, "ls");
    if (ls.find("overdue") == std::string::npos)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (ls.find("overdue") == std::string::npos && std::chrono::steady_clock::now() < until);
  EXPECT_THAT(ls, ::testing::ContainsRegex("2 +quick .*running.*overdue [0-9]+s")) << ls;
  EXPECT_THAT(ls, ::testing::Not(HasSubstr(" ago"))) << ls;
  d.Call("POST", "/v1/jobs/2/cancel");
}

TEST(TesseraServer, CancelSendsSigtermThatAJobCanTrapToSaveACheckpoint) {
  // The server blocks SIGTERM for itself; its jobs must not inherit that. The job asks for a long
  // grace period of its own, so only a SIGTERM that reaches it can end it in time for the wait
  // below.
  Daemon d("sigterm");
  json spec = Shell(
      "grep -E '^Sig(Blk|Ign)' /proc/self/status; trap 'echo checkpoint saved; exit 0' TERM; "
      "echo ready; while :; do sleep 0.05; done",
      {{"gpus", 1}});
  spec["grace_period_s"] = 300;
  int64_t id = d.Submit(spec);
  d.WaitFor(id, "running");
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (d.Logs(id).find("ready") == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string out = d.Logs(id);
  EXPECT_THAT(out, HasSubstr("SigBlk:\t0000000000000000"));
  EXPECT_THAT(out, HasSubstr("SigIgn:\t0000000000000000"));
  d.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  json j = d.WaitFor(id, "cancelled", 20);
  EXPECT_THAT(d.Logs(id), HasSubstr("checkpoint saved"));
  EXPECT_EQ(j["spec"]["grace_period_s"], 300);
  EXPECT_THAT(d.Log(), HasSubstr("SIGKILL after 300 s"));
  EXPECT_THAT(d.Log(), Not(HasSubstr("still running 300 s after SIGTERM")));
}

TEST(TesseraServer, RootJobsRunOnlyWhenTheConfigAllowsThem) {
  Daemon d("root-jobs", "allow_root_jobs: false\n");
  int status = 0;
  json j = d.Call("POST", "/v1/jobs", Shell("id -u", {{"gpus", 1}}).dump(), &status);
  if (geteuid() == 0) {
    // This test's process is root, and so is the server: the job would run as root.
    EXPECT_EQ(status, 403) << j.dump();
    EXPECT_THAT(j.value("message", ""), HasSubstr("jobs do not run as root"));
    EXPECT_TRUE(d.Call("GET", "/v1/jobs")["jobs"].empty()) << "nothing stored";
  } else {
    // A server that is not root runs every job as itself, never as root.
    EXPECT_EQ(status, 201) << j.dump();
    d.WaitFor(j.value("id", int64_t{0}), "succeeded");
    EXPECT_EQ(d.Logs(j.value("id", int64_t{0})), std::to_string(geteuid()) + "\n");
  }
}

TEST(TesseraServer, TokenWithoutALocalAccountIsRefusedAtStart) {
  // Before: the token was accepted and its jobs ran as root.
  std::string path = ::testing::TempDir() + "token-server-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(path) << "tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: " << kToken
                      << ", user: nobody}\n    - {token: " << kToken
                      << "-ci, user: tessera-no-such-account}\n";
  tessera::test::Captured r =
      tessera::test::Capture(std::string(TESSERA_BINARY) + " server -c " + path + " 2>&1");
  fs::remove(path);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(
      r.out,
      HasSubstr(path + ":5: tcp.tokens[1].user: 'tessera-no-such-account' has no local account"));
}

// A raw connection to the daemon's socket; -1 on failure.
int RawConnect(const std::string& socket_path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", socket_path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends until it closes the connection, waiting at most `seconds`.
std::string ReadUntilClosed(int fd, double seconds) {
  std::string got;
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    until - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0) return got + "<still open>";
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return got;
    got.append(buf, static_cast<size_t>(n));
  }
}

TEST(TesseraServer, ListenerTimesOutHalfSentRequestsAndCapsConnections) {
  Daemon d("listener", "listener: {request_timeout_s: 0.5, max_connections_per_peer: 3}\n");
  // A body announced and never sent: 408, and the connection is closed (it was held for ever).
  int half = RawConnect(d.socket());
  ASSERT_GE(half, 0);
  std::string head = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n";
  ASSERT_EQ(write(half, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  std::string got = ReadUntilClosed(half, 10);
  close(half);
  EXPECT_THAT(got, HasSubstr("408"));
  EXPECT_THAT(got, HasSubstr("request not complete within 0.5 s"));
  // Connections from one peer are capped: three idle ones are kept, the fourth is told why.
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(RawConnect(d.socket()));
  int fourth = RawConnect(d.socket());
  ASSERT_GE(fourth, 0);
  got = ReadUntilClosed(fourth, 10);
  close(fourth);
  EXPECT_THAT(got, HasSubstr("503"));
  EXPECT_THAT(got, HasSubstr("connections open from you, the limit"));
  for (int fd : idle) close(fd);
  // Once the server has seen them go (their threads notice the close on their own time; until then
  // a new connection may still be over the cap and refused), it answers again.
  bool answered = false;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    auto r = HttpClient(d.socket()).Send("GET", "/v1/health");
    answered = r.ok() && r->status == 200;
    if (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (!answered && std::chrono::steady_clock::now() < until);
  EXPECT_TRUE(answered);
}

// The unix socket's last 16 connections are root's and the admins' (issue 51: 8 accounts with 64
// idle connections each locked everyone out): idle connections of an ordinary account fill the
// rest, the next one of theirs is refused saying so, and root still gets an answer.
TEST(TesseraServer, IdleConnectionsOfUsersLeaveTheAdminsReserve) {
  ASSERT_EQ(geteuid(), 0u) << "this test opens connections as nobody";
  Daemon d("reserve", "listener: {max_connections: 24, max_connections_per_peer: 64}\n");
  // nobody must reach the socket: the test's folders let others through (not list).
  const fs::path top = fs::path(::testing::TempDir()).parent_path();  // (no trailing slash)
  for (fs::path p = fs::path(d.socket()).parent_path(); p != top.parent_path() && p != "/";
       p = p.parent_path())
    chmod(p.c_str(), 0711);
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t child = fork();
  if (child == 0) {
    if (setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0) _exit(1);
    std::vector<int> idle;
    for (int i = 0; i < 8; ++i) idle.push_back(RawConnect(d.socket()));
    const bool all = std::all_of(idle.begin(), idle.end(), [](int fd) { return fd >= 0; });
    const int ninth = RawConnect(d.socket());
    std::string got = all && ninth >= 0 ? ReadUntilClosed(ninth, 10) : "cannot connect";
    got.resize(std::min<size_t>(got.size(), 4000));
    if (write(report[1], got.data(), got.size()) < 0) _exit(1);
    close(report[1]);
    pause();
    _exit(0);
  }
  close(report[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = read(report[0], buf, sizeof buf)) > 0;) got.append(buf, n);
  close(report[0]);
  EXPECT_THAT(got, HasSubstr("503")) << got;
  EXPECT_THAT(got, HasSubstr("unix socket connections open, its limit")) << got;
  auto r = HttpClient(d.socket()).Send("GET", "/v1/health");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << "root has the reserve";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

// Idle connections from the network (unauthenticated: 1,008 from 16 addresses) fill only TCP's own
// budget: the unix socket keeps answering its users (it failed 20 of 20 health checks when one
// budget was shared). And a client that pipelines requests without reading the answers is closed
// once a write has waited request_timeout_s, instead of holding its thread.
TEST(TesseraServer, TcpConnectionsCannotLockOutTheUnixSocketNorHoldWrites) {
  Daemon d("budgets", std::string("tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: ") +
                          kToken +
                          ", user: nobody}\n"
                          "listener: {max_connections: 8, max_tcp_connections: 256, "
                          "max_connections_per_peer: 64, request_timeout_s: 0.5}\n");
  const std::string log = d.Log();
  const size_t at = log.find("tcp port ");
  ASSERT_NE(at, std::string::npos) << log;
  const int port = std::stoi(log.substr(at + 9));
  std::vector<int> idle;
  for (int a = 2; a < 18; ++a) {  // 127.0.0.2 .. 127.0.0.17, 63 each: 1,008 tried, 256 kept
    for (int i = 0; i < 63; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in from{}, to{};
      from.sin_family = to.sin_family = AF_INET;
      from.sin_addr.s_addr = htonl(0x7f000000 | a);
      to.sin_addr.s_addr = htonl(0x7f000001);
      to.sin_port = htons(static_cast<uint16_t>(port));
      ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
      ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
      idle.push_back(fd);
    }
  }
  // The TCP budget is full (one more is refused, saying so), the unix socket answers every time.
  {
    HttpClient anonymous("tcp://127.0.0.1:" + std::to_string(port));
    auto refused = anonymous.Send("GET", "/v1/health");
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_EQ(refused->status, 503);
    EXPECT_THAT(refused->body, HasSubstr("TCP connections open, its limit"));
  }
  for (int i = 0; i < 20; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = HttpClient(d.socket()).Send("GET", "/v1/health");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200) << r->body;
    if (i == 19) {
      std::printf(
          "unix socket health check with 1,008 idle TCP connections tried: %.2f ms\n",
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (int fd : idle) close(fd);
  // Pipelined requests never read: the server's writes fill the buffers and block; past
  // request_timeout_s the connection is closed (its slot in the socket's budget of 8 freed).
  int fd = RawConnect(d.socket());
  ASSERT_GE(fd, 0);
  std::string many;
  for (int i = 0; i < 20000; ++i) many += "GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n";
  std::thread writer([&] {  // the server stops reading once its writes block: so may we
    (void)!send(fd, many.data(), many.size(), MSG_NOSIGNAL);
  });
  bool closed = false;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!closed && std::chrono::steady_clock::now() < until) {
    std::vector<int> probes;
    for (int i = 0; i < 7; ++i) probes.push_back(RawConnect(d.socket()));
    auto r = HttpClient(d.socket()).Send("GET", "/v1/health");  // the 9th on the socket
    closed = r.ok() && r->status == 200;
    for (int p : probes) close(p);
    if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(closed) << "the unread connection still holds its slot";
  shutdown(fd, SHUT_RDWR);
  writer.join();
  close(fd);
}

// Requests whose body cannot be framed (RFC 9112 section 6.3) get 400 and a closed connection,
// before any of their body is read: a final coding other than chunked (framed by Content-Length
// before: what request smuggling is made of), and Transfer-Encoding beside Content-Length.
TEST(TesseraServer, RequestsWhoseBodyCannotBeFramedAreRefusedAndClosed) {
  Daemon d("framing");
  for (const std::string& head :
       {std::string("POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n"
                    "Content-Length: 0\r\n\r\n"),
        std::string("POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"),
        std::string("POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")}) {
    int fd = RawConnect(d.socket());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
    std::string got = ReadUntilClosed(fd, 10);
    close(fd);
    EXPECT_THAT(got, HasSubstr("HTTP/1.1 400")) << head;
    EXPECT_THAT(got, ::testing::Not(HasSubstr("<still open>"))) << head;
  }
  int fd = RawConnect(d.socket());
  const std::string gzip = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n";
  ASSERT_EQ(write(fd, gzip.data(), gzip.size()), static_cast<ssize_t>(gzip.size()));
  EXPECT_THAT(ReadUntilClosed(fd, 10), HasSubstr("final coding is not chunked"));
  close(fd);
  // A plain chunked request is served as before.
  fd = RawConnect(d.socket());
  const std::string chunked =
      "GET /v1/health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: "
      "close\r\n\r\n0\r\n\r\n";
  ASSERT_EQ(write(fd, chunked.data(), chunked.size()), static_cast<ssize_t>(chunked.size()));
  EXPECT_THAT(ReadUntilClosed(fd, 10), HasSubstr("HTTP/1.1 200"));
  close(fd);
}

// A proxy in front of the daemon's socket that loses the answer to the first request it passes
// on (the request reaches the server; the client sees its connection closed), as a crash of the
// network or of a load balancer would. Later requests pass both ways.
class LosingProxy {
 public:
  LosingProxy(const std::string& path, const std::string& target) : target_(target) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    unlink(path.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    thread_ = std::thread([this] { Run(); });
  }
  ~LosingProxy() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  int requests() const { return requests_; }

 private:
  // One request from `fd`: its headers and the body its Content-Length says.
  static std::string ReadRequest(int fd) {
    std::string got;
    char buf[4096];
    for (;;) {
      size_t end = got.find("\r\n\r\n");
      if (end != std::string::npos) {
        size_t cl = got.find("Content-Length: ");
        size_t body = cl == std::string::npos || cl > end ? 0 : std::stoul(got.substr(cl + 16));
        if (got.size() >= end + 4 + body) return got;
      }
      ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) return "";
      got.append(buf, static_cast<size_t>(n));
    }
  }
  void Run() {
    for (;;) {
      int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      std::string request = ReadRequest(client);
      if (!request.empty()) {
        // Passed on; the server answers and, the request's writing side shut, closes.
        int server = RawConnect(target_);
        ssize_t w = write(server, request.data(), request.size());
        (void)w;
        shutdown(server, SHUT_WR);
        std::string answer = ReadUntilClosed(server, 10);
        close(server);
        if (requests_++ > 0) w = write(client, answer.data(), answer.size());
      }
      close(client);
    }
  }
  std::string target_;
  int fd_ = -1;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

TEST(TesseraServer, ASubmissionWhoseAnswerIsLostIsStoredOnce) {
  Daemon d("idempotent");
  LosingProxy proxy(d.dir() + "/proxy.sock", d.socket());
  // The CLI sends the submission, loses the answer, sends it again with the same key.
  tessera::test::Captured r = tessera::test::Capture("TESSERA_SOCKET=" + d.dir() + "/proxy.sock " +
                                                     TESSERA_BINARY + " submit -- true 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "submitted job 1\n");
  EXPECT_EQ(proxy.requests(), 2) << "the server got the submission twice";
  EXPECT_EQ(json::parse(Cli(d, "ls --all --state all -o json")).size(), 1u) << "and stored it once";
  EXPECT_THAT(d.Log(), HasSubstr("job 1: submitted again by root (same Idempotency-Key)"));
  // A rerun with the key the user chose: the same job, said; the key for another job: refused.
  EXPECT_EQ(Cli(d, "submit --idempotency-key nightly-7 -- true"), "submitted job 2\n");
  EXPECT_EQ(Cli(d, "submit --idempotency-key nightly-7 -- true"),
            "submitted job 2 (already: this key's submission was stored before)\n");
  EXPECT_EQ(Cli(d, "submit --idempotency-key nightly-7 -- false"),
            "tessera: Idempotency-Key 'nightly-7' was used for another submission (job 2)\n");
  EXPECT_THAT(Cli(d, "submit --idempotency-key 'a b' -- true"), HasSubstr("Idempotency-Key: "));
  EXPECT_EQ(json::parse(Cli(d, "ls --all --state all -o json")).size(), 2u);
}

TEST(TesseraServer, BadConfigFileIsRefusedWithItsLine) {
  std::string path = ::testing::TempDir() + "bad-server-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(path) << "socket: /tmp/x.sock\npreemption: {grace_period_s: forever}\n";
  tessera::test::Captured r =
      tessera::test::Capture(std::string(TESSERA_BINARY) + " server -c " + path + " 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr(path + ":2: preemption.grace_period_s"));
}

// ---- confinement (cgroups) ----

std::string CgroupName(const std::string& daemon) {
  return "tessera-e2e-" + std::to_string(getpid()) + "-" + daemon;
}

// The path a /v1/info confinement entry names ("cgroup1 cpu /sys/fs/cgroup/cpu/x": the last word).
std::string BaseOf(const json& entry) {
  std::string s = entry.get<std::string>();
  return s.substr(s.rfind(' ') + 1);
}

class Confined : public ::testing::TestWithParam<std::string> {};

TEST_P(Confined, AJobOpensOnlyTheGpusItWasGiven) {
  const std::string mode = GetParam(), name = "confine-" + mode;
  const std::string dev = ::testing::TempDir() + "dev-" + std::to_string(getpid()) + "-" + mode;
  fs::create_directories(dev);
  // Stand-ins for the driver's nodes (its major, 195). No driver is behind them here: an open the
  // cgroup lets through fails with ENXIO, one it refuses with EPERM.
  for (auto [file, minor] : {std::pair{"nvidia0", 0}, {"nvidia1", 1}, {"nvidiactl", 255}}) {
    ASSERT_EQ(mknod((dev + "/" + file).c_str(), S_IFCHR | 0666, makedev(195, minor)), 0)
        << file << ": " << strerror(errno);
  }
  Daemon d(name, "confinement: {mode: " + mode + ", cgroup: " + CgroupName(name) +
                     ", device_dir: " + dev + "}\n");
  json info = d.Call("GET", "/v1/info");
  ASSERT_EQ(info["confinement"]["mode"], mode) << info.dump() << d.Log();
  const std::string script =
      "for f in nvidia0 nvidia1 nvidiactl; do cat \"$D/$f\" 2>&1 | sed \"s|.*: |$f: |\"; done";
  for (int gpus : {1, 0}) {
    json spec = Shell(script, {{"gpus", gpus}});
    spec["env"] = {{"D", dev}};
    int64_t id = d.Submit(spec);
    json j = d.WaitFor(id, "succeeded");
    std::string expect;
    for (int n : {0, 1}) {
      const bool given = gpus == 1 && j["placement"]["gpus"][0]["index"] == n;
      expect += fmt::format("nvidia{}: {}\n", n,
                            given ? "No such device or address" : "Operation not permitted");
    }
    expect += "nvidiactl: No such device or address\n";
    EXPECT_EQ(d.Logs(id), expect) << "a job with " << gpus << " GPU(s), " << mode;
  }
  fs::remove_all(dev);
}

INSTANTIATE_TEST_SUITE_P(Modes, Confined, ::testing::Values("cgroup1", "cgroup2"));

TEST(TesseraServer, AJobOverItsMemoryLimitIsKilledAndItsRecordSaysWhy) {
  Daemon d("oom");
  ASSERT_NE(d.Call("GET", "/v1/info")["confinement"]["memory"], "none");
  // The shell keeps what it reads in memory: far past 32 MiB.
  int64_t id = d.Submit(
      Shell("x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo survived", {{"memory", "32MiB"}}));
  json j = d.WaitFor(id, "failed", 60);
  EXPECT_THAT(j["reason"].get<std::string>(),
              HasSubstr("over its memory limit of 32 MiB: the kernel killed"));
  EXPECT_GE(j["usage"].value("oom_kills", 0), 1) << j.dump();
  EXPECT_LE(j["usage"].value("peak_memory_bytes", int64_t{-1}), int64_t{33} << 20);
  EXPECT_GT(j["usage"].value("peak_memory_bytes", int64_t{-1}), int64_t{16} << 20);
  EXPECT_EQ(d.Logs(id), "") << "it never got past the allocation";
  EXPECT_THAT(Cli(d, "show " + std::to_string(id)), HasSubstr("OOM kills"));
}

TEST(TesseraServer, AJobsCgroupHasItsLimitsAndTakesWhatItLeftBehind) {
  Daemon d("cgroup");
  json conf = d.Call("GET", "/v1/info")["confinement"];
  ASSERT_NE(conf["cpu"], "none") << conf.dump();
  ASSERT_NE(conf["pids"], "none") << conf.dump();
  const bool cpu_v2 = conf["cpu"].get<std::string>().rfind("cgroup2", 0) == 0;
  const std::string out = d.dir() + "/daemon.pid";
  // A daemon in a session of its own (out of the job's process group), then the job's limits as
  // its own cgroup files say them.
  json spec = Shell(
      "setsid sleep 300 >/dev/null 2>&1 & echo $! > \"$OUT\"; "
      "cat \"$CPU/user-0/job-$TESSERA_JOB_ID/$CPUFILE\" "
      "\"$PIDS/user-0/job-$TESSERA_JOB_ID/pids.max\" \"$PIDS/user-0/pids.max\"",
      {{"cpus", 0.5}});
  spec["env"] = {{"OUT", out},
                 {"CPU", BaseOf(conf["cpu"])},
                 {"CPUFILE", cpu_v2 ? "cpu.max" : "cpu.cfs_quota_us"},
                 {"PIDS", BaseOf(conf["pids"])}};
  int64_t id = d.Submit(spec);
  json j = d.WaitFor(id, "succeeded");
  // The user's cgroup: a quarter of what the host can have (confinement.user_pids_max: -1).
  EXPECT_EQ(d.Logs(id), std::string(cpu_v2 ? "50000 100000\n" : "50000\n") + "16384\n" +
                            std::to_string(tessera::server::UserPidsMax(-1)) + "\n");
  EXPECT_GE(j["usage"].value("cpu_seconds", -1.0), 0.0) << j.dump();
  EXPECT_GT(j["usage"].value("peak_memory_bytes", int64_t{-1}), 0) << j.dump();
  // The daemon went with the job.
  pid_t daemon = 0;
  std::ifstream(out) >> daemon;
  ASSERT_GT(daemon, 0);
  auto gone = [&] {
    std::ifstream stat("/proc/" + std::to_string(daemon) + "/stat");
    std::string pid, comm, state;
    return !(stat >> pid >> comm >> state) || state == "Z";
  };
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!gone() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(gone()) << "pid " << daemon << " outlived its job";
  if (!gone()) kill(daemon, SIGKILL);
  // Its cgroup goes once the killed processes are gone (the server's turns retry it).
  const std::string cgroup = BaseOf(conf["cpu"]) + "/user-0/job-" + std::to_string(id);
  until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (fs::exists(cgroup) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(fs::exists(cgroup)) << "the job's cgroup is removed";
}

TEST(TesseraServer, WithoutConfinementTheServerSaysSo) {
  Daemon d("unconfined", "confinement: {mode: off}\n");
  json conf = d.Call("GET", "/v1/info")["confinement"];
  EXPECT_EQ(conf["mode"], "none");
  EXPECT_EQ(conf["reason"], "confinement is off in the config");
  EXPECT_THAT(Cli(d, "top --once"),
              HasSubstr("[UNCONFINED: jobs can open any GPU; confinement is off in the config]"));
  EXPECT_THAT(d.Log(), HasSubstr("jobs are NOT confined to their GPUs"));
}

}  // namespace
