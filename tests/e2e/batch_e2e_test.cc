// The batch habits users bring from Slurm, end to end through the CLI against the real server:
// arrays (one task per index, %N at once, compact storage, folded in ls, cancel/hold/release of the
// whole or of one task), dependencies (ok, notok, any; never met ends the job; bad ones refused),
// hold and release keeping a job's place, `tessera run` (live output, exit code, Ctrl-C), several
// processes per job with their ranks, and accounting - as root and as a second user where rights
// matter (a token for `nobody` on the TCP listener). Each row of docs/server.md's "Coming from
// Slurm" table is exercised here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "../capture.h"
#include "daemon.h"

namespace {

using nlohmann::json;
using tessera::test::Cli;
using tessera::test::Daemon;
using tessera::test::MpsServer;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr char kNobodyToken[] = "nobody-token-0123456789";

// A daemon with a TCP listener whose token is nobody's: the second user.
std::string TwoUsers(const std::string& extra = "") {
  return std::string("tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: ") + kNobodyToken +
         ", user: nobody}\n" + extra;
}

// The CLI as nobody (through the token) or as root (the socket); output and exit code.
tessera::test::Captured As(const Daemon& d, const std::string& user, const std::string& args) {
  std::string env = "TESSERA_SOCKET=" + d.socket();
  if (user == "nobody") {
    const std::string log = d.Log();
    const size_t at = log.find("tcp port ");
    if (at == std::string::npos) return {};
    env = fmt::format("TESSERA_SOCKET=tcp://127.0.0.1:{} TESSERA_TOKEN={}",
                      std::stoi(log.substr(at + 9)), kNobodyToken);
  }
  return tessera::test::Capture(env + " " + TESSERA_BINARY + " " + args + " 2>&1");
}

int64_t SubmittedId(const std::string& out) {
  const size_t at = out.find("submitted ");
  if (at == std::string::npos) return 0;
  const size_t digits = out.find_first_of("0123456789", at);
  return digits == std::string::npos ? 0 : std::stoll(out.substr(digits));
}

// A folder in the daemon's for jobs of root and nobody alike: writable by both, its parents
// traversable (private /tmp binds it back into each job's own).
std::string SharedWorkFolder(const Daemon& d) {
  const std::string work = d.dir() + "/work";
  fs::create_directories(work);
  for (fs::path p = work; p != "/tmp" && p != "/"; p = p.parent_path()) chmod(p.c_str(), 0711);
  chmod(work.c_str(), 0777);
  return work;
}

// Polls for `path` to exist, for at most 20 s.
bool WaitForFile(const std::string& path) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fs::exists(path) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return fs::exists(path);
}

// Polls `ls -o json` (folded) until the entry for job `id` is in `state`.
json WaitForLs(Daemon& d, int64_t id, const std::string& state, double seconds = 20) {
  json entry;
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    json all = json::parse(Cli(d, "ls --all --state all --limit 1000 -o json"), nullptr, false);
    for (const json& j : all.is_array() ? all : json::array()) {
      if (j.value("id", int64_t{0}) == id) entry = j;
    }
    if (entry.value("state", "") == state) return entry;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "job " << id << " never became " << state << ": " << entry.dump();
  return entry;
}

size_t JobCount(Daemon& d) {
  return json::parse(Cli(d, "ls --all --state all --expand --limit 100000 -o json")).size();
}

TEST(Batch, AnArrayRunsEveryIndexAtMostItsLimitAtOnceAndLsFoldsIt) {
  Daemon d("array");
  const std::string marks = d.dir() + "/running";
  fs::create_directories(marks);
  const std::string script = fmt::format(
      "touch {0}/$TESSERA_ARRAY_TASK_ID; ls {0} | wc -l >> {1}/counts; "
      "echo task $TESSERA_ARRAY_TASK_ID of $TESSERA_ARRAY_JOB_ID; sleep 0.3; "
      "rm {0}/$TESSERA_ARRAY_TASK_ID",
      marks, d.dir());
  const std::string out =
      Cli(d, "submit --array 0-5%2 --gpus 1 --workdir /tmp -- /bin/sh -c '" + script + "'");
  ASSERT_THAT(out, HasSubstr("submitted array")) << out;
  const int64_t id = SubmittedId(out);
  json folded = WaitForLs(d, id, "succeeded");
  EXPECT_EQ(folded["array"]["states"], json({{"succeeded", 6}}));
  std::istringstream counts(tessera::test::ReadFile(d.dir() + "/counts"));
  int most = 0, n = 0;
  for (int c; counts >> c; ++n) most = std::max(most, c);
  EXPECT_EQ(n, 6);
  EXPECT_LE(most, 2) << "%2: never more than two tasks at once";
  EXPECT_EQ(Cli(d, fmt::format("logs {}_3", id)), fmt::format("task 3 of {}\n", id));
  const std::string table = Cli(d, "ls --ended");
  EXPECT_THAT(table, HasSubstr(fmt::format("{}_[0-5%2]", id)));
  EXPECT_THAT(table, HasSubstr("succeeded:6"));
  json expanded = json::parse(Cli(d, "ls --expand --ended -o json"));
  ASSERT_EQ(expanded.size(), 6u);
  EXPECT_EQ(expanded[5]["array_index"], 5);
  EXPECT_THAT(Cli(d, fmt::format("show {}_4", id)),
              HasSubstr(fmt::format("{}_4 (job {})", id, id + 4)));
}

TEST(Batch, AnArrayIsStoredCompactlyAndCancelHoldReleaseTakeAllOrOneTask) {
  Daemon d("array-ops");
  const std::string out = Cli(d, "submit --array 0-999 --gpus 2 -- sleep 60");
  const int64_t id = SubmittedId(out);
  ASSERT_GT(id, 0) << out;
  WaitForLs(d, id, "running");
  // 1,000 tasks, one spec.
  sqlite3* db = nullptr;
  ASSERT_EQ(
      sqlite3_open_v2((d.dir() + "/state/tessera.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr),
      SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT count(*), sum(spec != '') FROM jobs", -1, &s, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(s, 0), 1000);
  EXPECT_EQ(sqlite3_column_int(s, 1), 1) << "the spec is stored once, in the first task";
  sqlite3_finalize(s);
  sqlite3_close(db);
  EXPECT_THAT(Cli(d, fmt::format("hold {}", id)), HasSubstr("(held:999)"));
  EXPECT_THAT(Cli(d, fmt::format("release {}_7", id)),
              HasSubstr(fmt::format("job {}_7: queued", id)));
  EXPECT_THAT(Cli(d, fmt::format("ls --expand --state queued --limit 2000")),
              HasSubstr(fmt::format("{}_7 ", id)));
  json seven = json::parse(Cli(d, fmt::format("show {}_7 -o json", id)));
  EXPECT_FALSE(seven["held"].get<bool>());
  EXPECT_TRUE(json::parse(Cli(d, fmt::format("show {}_8 -o json", id)))["held"].get<bool>());
  EXPECT_THAT(Cli(d, fmt::format("cancel {}_8", id)), HasSubstr("cancelled"));
  EXPECT_THAT(Cli(d, fmt::format("cancel {}", id)), HasSubstr(fmt::format("array {}:", id)));
  json all = WaitForLs(d, id, "cancelled");
  EXPECT_EQ(all["array"]["states"], json({{"cancelled", 1000}}))
      << "the running task stopped, every queued one cancelled";
}

TEST(Batch, DependenciesWaitRunOnTheOutcomeAskedAndEndWhenNeverMet) {
  Daemon d("after");
  // The job depended on is held until every dependent is in: no race with its end.
  const int64_t a = SubmittedId(Cli(d, "submit --hold -- /bin/sh -c 'exit 1'"));
  ASSERT_GT(a, 0);
  const int64_t ok = SubmittedId(Cli(d, fmt::format("submit --after ok:{} -- true", a)));
  const int64_t notok = SubmittedId(Cli(d, fmt::format("submit --after notok:{} -- true", a)));
  const int64_t any = SubmittedId(Cli(d, fmt::format("submit --after any:{} -- true", a)));
  const int64_t chained = SubmittedId(Cli(d, fmt::format("submit --after ok:{} -- true", ok)));
  // Slurm's afterok:A:B form, and a list with commas.
  const int64_t both = SubmittedId(
      Cli(d, fmt::format("submit --after any:{}:{} --after notok:{},{} -- true", a, notok, a, a)));
  ASSERT_GT(both, 0);
  EXPECT_THAT(Cli(d, fmt::format("show {}", ok)),
              HasSubstr(fmt::format("waiting for job {} to end (after ok:{})", a, a)));
  Cli(d, fmt::format("release {}", a));
  WaitForLs(d, a, "failed");
  WaitForLs(d, notok, "succeeded");
  WaitForLs(d, any, "succeeded");
  WaitForLs(d, both, "succeeded");
  json never = WaitForLs(d, ok, "cancelled");
  EXPECT_THAT(never["reason"].get<std::string>(),
              HasSubstr(fmt::format("job {} failed: after ok:{} can never be met", a, a)));
  json cascade = WaitForLs(d, chained, "cancelled");
  EXPECT_THAT(cascade["reason"].get<std::string>(), HasSubstr(fmt::format("job {} cancelled", ok)));
}

TEST(Batch, BadArraysDependenciesAndTasksAreRefusedAndNothingIsStored) {
  Daemon d("bad", TwoUsers("max_array_tasks: 100\n"));
  const int64_t roots = SubmittedId(Cli(d, "submit --hold -- true"));
  ASSERT_GT(roots, 0);
  const size_t before = JobCount(d);
  struct Bad {
    std::string user, args, says;
  };
  const std::vector<Bad> cases = {
      {"root", "--array 5-2", "the range 5-2 runs backwards (write 2-5)"},
      {"root", "--array ''", "--array: empty"},
      {"root", "--array 0-100", "more than 100 tasks, this server's most for one array"},
      {"root", "--array 0-9%0", "after % comes how many tasks may run at once"},
      {"root", "--after ok:9999", "job 9999 does not exist"},
      // A job may only wait for one submitted before it: no cycle can form.
      {"root", fmt::format("--after ok:{}", roots + 1),
       fmt::format("job {} does not exist", roots + 1)},
      {"root", "--after maybe:1", "expected ok:ID, notok:ID or any:ID"},
      {"root", fmt::format("--after ok:{}_3", roots),
       fmt::format("job {}_3 does not exist", roots)},
      {"nobody", fmt::format("--workdir /tmp --after ok:{}", roots), "belongs to root"},
      // Ranks on shares of more GPUs than the machine has.
      {"root", "--tasks-per-gpu 1 --gpus 9 --gpu-mem 1GiB", "the job could never start"},
      {"root", "--tasks-per-gpu 2", "asks for no GPU"},
      // Elastic ranges: backwards, with a share, more than the machine has at its minimum.
      {"root", "--gpus 3-1", "--gpus: '3-1': its most (1) is below its fewest (3)"},
      {"root", "--gpus 1-2 --gpu-mem 1GiB", "an elastic job asks for whole GPUs"},
      {"root", "--gpus 3-4", "the job could never start"},
  };
  for (const Bad& b : cases) {
    auto r = As(d, b.user, "submit " + b.args + " -- true");
    // Exit codes: 2 for a bad request, 1 for one refused (another user's job: forbidden).
    EXPECT_EQ(r.code, std::string(b.says) == "belongs to root" ? 1 : 2) << b.args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(b.says)) << b.args;
  }
  EXPECT_EQ(JobCount(d), before) << "nothing stored";
  // Only the owner (or an admin) holds, releases and cancels.
  for (const char* verb : {"release", "hold", "cancel"}) {
    auto r = As(d, "nobody", fmt::format("{} {}", verb, roots));
    EXPECT_EQ(r.code, 1) << verb << ": " << r.out << " (forbidden: 1; 2 is for usage)";
    EXPECT_THAT(r.out, HasSubstr("belongs to root")) << verb;
  }
  EXPECT_THAT(Cli(d, "hold 9999"), HasSubstr("not found"));
  EXPECT_THAT(Cli(d, "release 1_x"), HasSubstr("is not a job"));
}

TEST(Batch, AReleasedJobStartsInThePlaceItHeld) {
  Daemon d("hold");
  // sbatch --parsable's habit: the id alone, for id=$(tessera submit --parsable ...).
  const std::string parsable = Cli(d, "submit --parsable --hold -- true");
  ASSERT_THAT(parsable, ::testing::MatchesRegex("[0-9]+\n"));
  EXPECT_THAT(Cli(d, "show " + parsable.substr(0, parsable.size() - 1)), HasSubstr("queued, held"));
  EXPECT_THAT(Cli(d, "submit --parsable --array 0-2 --hold -- true"),
              ::testing::MatchesRegex("[0-9]+\n"));
  const int64_t busy = SubmittedId(Cli(d, "submit --gpus 2 -- sleep 60"));
  WaitForLs(d, busy, "running");
  const int64_t first = SubmittedId(Cli(d, "submit --hold --gpus 2 -- sleep 60"));
  const int64_t second = SubmittedId(Cli(d, "submit --gpus 2 -- sleep 60"));
  EXPECT_THAT(Cli(d, "ls"), HasSubstr(fmt::format("{}  ", first)));
  EXPECT_THAT(Cli(d, fmt::format("show {}", first)), HasSubstr("queued, held"));
  EXPECT_THAT(Cli(d, fmt::format("release {}", first)), HasSubstr("queued"));
  Cli(d, fmt::format("cancel {}", busy));
  WaitForLs(d, first, "running");
  EXPECT_EQ(WaitForLs(d, second, "queued")["state"], "queued") << "the later job waits its turn";
  Cli(d, fmt::format("cancel {} {}", first, second));
  WaitForLs(d, first, "cancelled");
}

TEST(Batch, APriorityChangeMovesAQueuedJobAhead) {
  Daemon d("priority", TwoUsers());
  // Not preemptible: the raised job must wait for it, not stop it.
  const int64_t busy = SubmittedId(Cli(d, "submit --no-preempt --gpus 2 -- sleep 60"));
  WaitForLs(d, busy, "running");
  const int64_t first = SubmittedId(Cli(d, "submit --gpus 2 -- sleep 60"));
  const int64_t second = SubmittedId(Cli(d, "submit --gpus 2 -- sleep 60"));
  EXPECT_THAT(Cli(d, fmt::format("priority {} 5", second)),
              HasSubstr(fmt::format("job {}: priority 5 (queued", second)));
  EXPECT_THAT(Cli(d, fmt::format("show {}", second)), HasSubstr("priority 0 -> 5 by root"));
  // Refused: a running job, another user's job, a priority out of range.
  EXPECT_THAT(Cli(d, fmt::format("priority {} 5", busy)),
              HasSubstr("only a queued job's priority can change"));
  auto r = As(d, "nobody", fmt::format("priority {} 9", first));
  EXPECT_EQ(r.code, 1) << r.out << " (forbidden)";
  EXPECT_THAT(r.out, HasSubstr("belongs to root"));
  EXPECT_THAT(Cli(d, fmt::format("priority {} 5000", first)), HasSubstr("not in range"));
  Cli(d, fmt::format("cancel {}", busy));
  WaitForLs(d, second, "running");
  EXPECT_EQ(WaitForLs(d, first, "queued")["state"], "queued") << "the raised job went first";
  Cli(d, fmt::format("cancel {} {}", first, second));
  WaitForLs(d, second, "cancelled");
}

// `tessera run` in the background, its stdout and stderr in files.
struct RunCli {
  pid_t pid = -1;
  int Wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

RunCli StartRun(const Daemon& d, const std::string& args, const std::string& out,
                const std::string& err) {
  RunCli r;
  const std::string cmd = fmt::format("exec env TESSERA_SOCKET={} {} run {} >{} 2>{}", d.socket(),
                                      TESSERA_BINARY, args, out, err);
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  EXPECT_EQ(posix_spawn(&r.pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  return r;
}

TEST(Batch, RunStreamsTheJobsOutputAndExitsWithItsCodeAndCtrlCCancels) {
  Daemon d("run");
  const std::string out = d.dir() + "/out", err = d.dir() + "/err";
  RunCli r =
      StartRun(d, "--gpus 1 -- /bin/sh -c 'echo to stdout; echo to stderr >&2; exit 3'", out, err);
  EXPECT_EQ(r.Wait(), 3) << tessera::test::ReadFile(err);
  EXPECT_EQ(tessera::test::ReadFile(out), "to stdout\n");
  EXPECT_THAT(tessera::test::ReadFile(err), HasSubstr("to stderr\n"));
  EXPECT_THAT(tessera::test::ReadFile(err), HasSubstr("failed: exit code 3"));
  // A command that is not there: 127, as a shell and srun say it.
  RunCli missing = StartRun(d, "-- no-such-command-tessera", out, err);
  EXPECT_EQ(missing.Wait(), 127) << tessera::test::ReadFile(err);
  EXPECT_THAT(tessera::test::ReadFile(err), HasSubstr("cannot execute 'no-such-command-tessera'"));
  // Ctrl-C: the job is cancelled (its process gets SIGTERM) and run says so.
  RunCli sleeper = StartRun(d, "-- /bin/sh -c 'echo started; exec sleep 60'", out, err);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (tessera::test::ReadFile(out) != "started\n" && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(tessera::test::ReadFile(out), "started\n");
  kill(sleeper.pid, SIGINT);
  EXPECT_EQ(sleeper.Wait(), 128 + SIGTERM) << "the job's own code: ended by SIGTERM";
  EXPECT_THAT(tessera::test::ReadFile(err), HasSubstr("cancelling job"));
  json jobs = json::parse(Cli(d, "ls --ended -o json"));
  EXPECT_EQ(jobs.back()["state"], "cancelled");
  // Every process's output, as srun: whole lines, with -l each prefixed by its rank.
  const std::string ranks =
      "-n 3 -- /bin/sh -c 'echo rank $RANK; printf \"no newline $RANK\"; echo oops $RANK >&2'";
  RunCli all = StartRun(d, ranks, out, err);
  EXPECT_EQ(all.Wait(), 0) << tessera::test::ReadFile(err);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(tessera::test::ReadFile(out), HasSubstr(fmt::format("rank {}\n", rank)));
    EXPECT_THAT(tessera::test::ReadFile(out), HasSubstr(fmt::format("no newline {}\n", rank)));
    EXPECT_THAT(tessera::test::ReadFile(err), HasSubstr(fmt::format("oops {}\n", rank)));
  }
  RunCli labelled = StartRun(d, "-l " + ranks, out, err);
  EXPECT_EQ(labelled.Wait(), 0) << tessera::test::ReadFile(err);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(tessera::test::ReadFile(out), HasSubstr(fmt::format("{0}: rank {0}\n", rank)));
    EXPECT_THAT(tessera::test::ReadFile(out),
                HasSubstr(fmt::format("{0}: no newline {0}\n", rank)));
    EXPECT_THAT(tessera::test::ReadFile(err), HasSubstr(fmt::format("{0}: oops {0}\n", rank)));
  }
}

TEST(Batch, SeveralProcessesGetTheirRanksShareTheCgroupAndFailTogether) {
  Daemon d("tasks");
  const std::string out = d.dir() + "/out", err = d.dir() + "/err";
  RunCli r =
      StartRun(d,
               "--gpus 2 --tasks-per-gpu 2 -- /bin/sh -c 'echo $RANK/$WORLD_SIZE $LOCAL_RANK "
               "$MASTER_ADDR $TESSERA_TASK_GPU; grep -c tessera /proc/self/cgroup'",
               out, err);
  ASSERT_EQ(r.Wait(), 0) << tessera::test::ReadFile(err);
  std::string first = tessera::test::ReadFile(out);
  EXPECT_THAT(first, HasSubstr("0/4 0 127.0.0.1 0\n"));
  EXPECT_THAT(first, HasSubstr("3/4 3 127.0.0.1 1\n")) << "every process's output";
  const int64_t id = json::parse(Cli(d, "ls --ended -o json")).back()["id"];
  EXPECT_THAT(Cli(d, fmt::format("logs {} --task 3", id)), HasSubstr("3/4 3 127.0.0.1 1\n"));
  EXPECT_THAT(Cli(d, fmt::format("logs {} --task 3", id)), ::testing::Not(HasSubstr("\n0\n")))
      << "in the job's cgroup";
  // One fails: the others are stopped and the job fails with its code.
  const auto t0 = std::chrono::steady_clock::now();
  RunCli fail = StartRun(d, "-n 3 -- /bin/sh -c 'if [ $RANK = 1 ]; then exit 7; fi; exec sleep 60'",
                         out, err);
  EXPECT_EQ(fail.Wait(), 7) << tessera::test::ReadFile(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30))
      << "not the others' 60 s";
  const int64_t failed = json::parse(Cli(d, "ls --ended -o json")).back()["id"];
  EXPECT_THAT(Cli(d, fmt::format("logs {} --stderr", failed)),
              HasSubstr("task 1 ended with code 7; stopping the other tasks"));
  // --task-failure wait: the others run to their end.
  RunCli wait =
      StartRun(d,
               "-n 3 --task-failure wait -- /bin/sh -c 'if [ $RANK = 1 ]; then exit 7; fi; "
               "sleep 0.3; echo done $RANK'",
               out, err);
  EXPECT_EQ(wait.Wait(), 7);
  const std::string done = tessera::test::ReadFile(out);
  EXPECT_THAT(done, HasSubstr("done 0\n"));
  EXPECT_THAT(done, HasSubstr("done 2\n")) << "every process's output";
  EXPECT_THAT(done, ::testing::Not(HasSubstr("done 1")));
  EXPECT_THAT(Cli(d, "logs 1 --task 9"), HasSubstr("has 4 task(s)"));
}

TEST(Batch, AcctSumsGpuHoursPerUserForThoseAllowedToSeeThem) {
  Daemon d("acct", TwoUsers());
  Cli(d, "run --gpus 1 -- sleep 0.5");
  auto r = As(d, "nobody",
              "run --workdir /tmp --gpu-mem 4GiB --gpu-share 50% -- /bin/sh -c 'sleep 0.5'");
  ASSERT_EQ(r.code, 0) << r.out;
  json all = json::parse(Cli(d, "acct -o json"));
  ASSERT_EQ(all["by_user"].size(), 2u) << all.dump();
  for (const json& u : all["by_user"]) {
    if (u["key"] == "root") {
      EXPECT_GT(u["whole_gpu_hours"].get<double>(), 0.4 / 3600);
      EXPECT_EQ(u["fractional_gpu_hours"].get<double>(), 0);
    } else {
      EXPECT_EQ(u["key"], "nobody");
      // Half the compute, 4 GiB of a T4's 15 GiB: half a GPU.
      EXPECT_GT(u["fractional_gpu_hours"].get<double>(), 0.2 / 3600);
      EXPECT_EQ(u["whole_gpu_hours"].get<double>(), 0);
    }
    EXPECT_EQ(u["succeeded"], 1);
  }
  EXPECT_EQ(all["by_model"][0]["key"], "Tesla T4");
  json mine = json::parse(As(d, "nobody", "acct -o json").out);
  ASSERT_EQ(mine["by_user"].size(), 1u) << "a user sees their own";
  EXPECT_EQ(mine["by_user"][0]["key"], "nobody");
  auto refused = As(d, "nobody", "acct --user root");
  EXPECT_EQ(refused.code, 1) << "forbidden: 1";
  EXPECT_THAT(refused.out, HasSubstr("shown to them and admins only"));
  EXPECT_THAT(Cli(d, "acct --by model -o csv"),
              HasSubstr("model,jobs,succeeded,failed,cancelled,running,gpu_hours,"));
  EXPECT_THAT(Cli(d, "acct --since 2026-13-01"), HasSubstr("--since 2026-13-01: expected"));
  // sacct's habits: words and now-N<unit>; the jobs of today are in both.
  EXPECT_EQ(json::parse(Cli(d, "acct --since yesterday -o json"))["total"],
            json::parse(Cli(d, "acct --since now-2days -o json"))["total"]);
  EXPECT_GT(json::parse(Cli(d, "acct --since today -o json"))["total"]["jobs"], 0);
  // Per job, like sacct: the columns asked, everyone's for an admin, one's own for a user.
  const std::string jobs = Cli(d, "acct --jobs --format id,user,state,exit,gpus -o csv");
  EXPECT_THAT(jobs, HasSubstr("id,user,state,exit,gpus\n")) << jobs;
  EXPECT_THAT(jobs, HasSubstr("\n1,root,succeeded,0,1\n")) << jobs;
  EXPECT_THAT(jobs, HasSubstr("\n2,nobody,succeeded,0,1\n")) << jobs;
  json own = json::parse(As(d, "nobody", "acct --jobs -o json").out);
  ASSERT_EQ(own.size(), 1u) << own.dump();
  EXPECT_EQ(own[0]["user"], "nobody");
  EXPECT_EQ(own[0]["state"], "succeeded");
  EXPECT_GT(own[0]["elapsed"].get<double>(), 0.4);
  auto bad = As(d, "nobody", "acct --jobs --format id,bogus");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.out, HasSubstr("--format: unknown field 'bogus'"));
  // What each used of what it held, as seff: a share holds its part of its GPU and its memory.
  json eff = json::parse(Cli(d, "eff 2 -o json"));
  EXPECT_EQ(eff["owner"], "nobody");
  EXPECT_DOUBLE_EQ(eff["gpus"].get<double>(), 0.5) << eff.dump();
  EXPECT_EQ(eff["gpu_memory_given_mib"], 4096);
  EXPECT_GT(eff["elapsed_s"].get<double>(), 0.4);
  // The user's line in acct says the same of their one job (weighed by GPU time: the same; here
  // nothing on the GPU was measured - no CUDA ran - so neither gives a figure).
  for (const char* key : {"gpu_busy_pct", "gpu_memory_pct"}) {
    const std::string line_key = std::string(key) == "gpu_memory_pct" ? "gpu_memory_used_pct" : key;
    json own_line = json::parse(As(d, "nobody", "acct -o json").out)["by_user"][0];
    EXPECT_EQ(own_line.value(line_key, json()), eff.value(key, json()))
        << key << ": " << own_line.dump() << " / " << eff.dump();
  }
  EXPECT_THAT(Cli(d, "acct"), HasSubstr("GPU MEM USED"));
  const std::string table = Cli(d, "eff 1");
  EXPECT_THAT(table, HasSubstr("GPUs held          1 x ")) << table;
  EXPECT_THAT(table, HasSubstr("GPU memory")) << table;
  auto none = As(d, "nobody", "eff 999");
  EXPECT_EQ(none.code, 1) << "no such job: " << none.out;
  EXPECT_THAT(none.out, HasSubstr("999"));
  const int64_t held = SubmittedId(Cli(d, "submit --hold -- true"));
  auto waiting = As(d, "root", "eff " + std::to_string(held));
  EXPECT_EQ(waiting.code, 1);
  EXPECT_THAT(waiting.out, HasSubstr("has not started (queued): nothing used yet"));
  auto metrics = tessera::net::HttpClient(d.socket()).Send("GET", "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(metrics->body,
              HasSubstr("tessera_acct_gpu_seconds_total{user=\"nobody\",kind=\"fractional\"}"));
  EXPECT_THAT(metrics->body,
              HasSubstr("tessera_acct_jobs_ended_total{user=\"root\",outcome=\"succeeded\"} 1"));
  std::ofstream(d.dir() + "/metrics.txt") << metrics->body;
  auto check = tessera::test::PromtoolCheck(d.dir() + "/metrics.txt");
  EXPECT_EQ(check.code, 0) << check.out;
  // A share of GPU memory only holds its memory's part of its GPU: eff and acct weigh it alike
  // (before, eff said it held no GPU and showed none of its GPU memory).
  const double before = json::parse(Cli(d, "acct -o json"))["total"]["fractional_gpu_hours"];
  Cli(d, "run --gpu-mem 6GiB -- sleep 0.5");
  const std::string memory_only =
      std::to_string(json::parse(Cli(d, "ls --ended -o json")).back()["id"].get<int64_t>());
  json m = json::parse(Cli(d, "eff " + memory_only + " -o json"));
  const json gpus = d.Call("GET", "/v1/gpus")["gpus"];
  const int index = d.Call("GET", "/v1/jobs/" + memory_only)["placement"]["gpus"][0]["index"];
  const double total_mib = gpus[index]["memory_bytes"].get<double>() / (1 << 20);
  EXPECT_NEAR(m["gpus"].get<double>(), 6144 / total_mib, 0.001) << m.dump();
  EXPECT_EQ(m["share"], true);
  EXPECT_EQ(m["gpu_memory_given_mib"], 6144);
  const double after = json::parse(Cli(d, "acct -o json"))["total"]["fractional_gpu_hours"];
  EXPECT_NEAR(after - before, 6144 / total_mib * m["elapsed_s"].get<double>() / 3600, 0.2 / 3600)
      << "acct adds what eff says it held";
  const std::string shown = Cli(d, "eff " + memory_only);
  EXPECT_THAT(shown, HasSubstr("(its memory's part of each GPU)")) << shown;
  EXPECT_THAT(shown, HasSubstr("a share of GPU memory only")) << shown;
  EXPECT_THAT(shown, HasSubstr("GPU memory         not measured (6 GiB per GPU given)")) << shown;
}

// Slurm's --output/--error as --stdout/--stderr (and as #SBATCH lines): the user's own files named
// by %A %a %t %j, written by the job as its user in its working directory; tessera logs reads them
// there (never through a symbolic link); a file that cannot be opened fails the job saying so.
TEST(Batch, OutputFilesFollowSlurmsPatternsAndLogsReadsThem) {
  Daemon d("output", TwoUsers());
  const std::string dir = d.dir() + "/work";
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::all);  // the job's user writes here (root or nobody alike)
  const int64_t id =
      SubmittedId(Cli(d, "submit --array 0-1 --ntasks 2 --workdir " + dir +
                             " --stdout 'o-%A_%a.%t.txt' -- /bin/sh -c "
                             "'echo out $TESSERA_ARRAY_TASK_ID $RANK; echo err $RANK >&2'"));
  ASSERT_GT(id, 0);
  WaitForLs(d, id, "succeeded");
  auto read = [](const std::string& path) {
    std::stringstream s;
    s << std::ifstream(path).rdbuf();
    return s.str();
  };
  for (int a = 0; a < 2; ++a) {
    for (int t = 0; t < 2; ++t) {
      const std::string file = fmt::format("{}/o-{}_{}.{}.txt", dir, id, a, t);
      const std::string text = read(file);
      EXPECT_THAT(text, HasSubstr(fmt::format("out {} {}\n", a, t))) << file;
      EXPECT_THAT(text, HasSubstr(fmt::format("err {}\n", t))) << "stderr follows stdout";
    }
  }
  const std::string logs = Cli(d, fmt::format("logs {}_1", id));
  EXPECT_THAT(logs, HasSubstr(fmt::format("writes its stdout to {}/o-{}_1.0.txt", dir, id)));
  EXPECT_THAT(logs, HasSubstr("out 1 0\n"));
  EXPECT_THAT(Cli(d, fmt::format("logs {}_1 --task 1", id)), HasSubstr("out 1 1\n"));

  // --stderr apart, %j; the #SBATCH spellings through a script.
  const std::string script = dir + "/job.sh";
  std::ofstream(script) << "#!/bin/sh\n#SBATCH --output=a-%j.out --error=a-%j.err\n"
                           "echo to-out; echo to-err >&2\n";
  const int64_t apart = SubmittedId(Cli(d, "submit --workdir " + dir + " " + script));
  ASSERT_GT(apart, 0);
  WaitForLs(d, apart, "succeeded");
  EXPECT_EQ(read(fmt::format("{}/a-{}.out", dir, apart)), "to-out\n");
  EXPECT_EQ(read(fmt::format("{}/a-{}.err", dir, apart)), "to-err\n");
  EXPECT_THAT(Cli(d, fmt::format("logs {} --stderr", apart)), HasSubstr("to-err\n"));
  // Swapped for a symbolic link (to a file the job's user could not name otherwise): not read.
  const std::string out = fmt::format("{}/a-{}.out", dir, apart);
  fs::remove(out);
  fs::create_symlink("/etc/hostname", out);
  const std::string linked = Cli(d, fmt::format("logs {}", apart));
  EXPECT_THAT(linked, HasSubstr("a symbolic link; not shown"));
  EXPECT_EQ(linked.find(read("/etc/hostname")), std::string::npos) << linked;

  // A file that cannot be opened: the job fails and says which.
  const int64_t bad = SubmittedId(Cli(d, "submit --stdout /proc/nonexistent/out -- true"));
  ASSERT_GT(bad, 0);
  WaitForLs(d, bad, "failed");
  EXPECT_THAT(Cli(d, fmt::format("show {}", bad)),
              HasSubstr("cannot open its stdout file '/proc/nonexistent/out'"));
  // Opened as the job's user, not as the server: nobody's job cannot create a file in a folder only
  // root may write (the server, root, could). Only where the test is root and nobody is another
  // user.
  if (geteuid() == 0) {
    const std::string root_only = d.dir() + "/root-only";
    fs::create_directories(root_only);
    fs::permissions(root_only, fs::perms::owner_all | fs::perms::group_read |
                                   fs::perms::group_exec | fs::perms::others_read |
                                   fs::perms::others_exec);
    const int64_t theirs = SubmittedId(
        As(d, "nobody", "submit --workdir /tmp --stdout " + root_only + "/o-%j.out -- true").out);
    ASSERT_GT(theirs, 0);
    WaitForLs(d, theirs, "failed");
    EXPECT_THAT(Cli(d, fmt::format("show {}", theirs)),
                HasSubstr("cannot open its stdout file '" + root_only + "/o-" +
                          std::to_string(theirs) + ".out': Permission denied"));
    EXPECT_TRUE(fs::is_empty(root_only)) << "nothing created there";
  }
  // Patterns refused at submission, nothing stored; -o with a file name gets a hint.
  const size_t before = JobCount(d);
  auto unknown = tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                                        " submit --stdout '/tmp/o-%q' -- true 2>&1");
  EXPECT_NE(unknown.code, 0);
  EXPECT_THAT(unknown.out, HasSubstr("stdout_file: unknown escape '%q'"));
  auto format = tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                                       " submit -o out-%j.txt -- true 2>&1");
  EXPECT_EQ(format.code, 2);
  EXPECT_THAT(format.out, HasSubstr("submit's --stdout FILE (Slurm's --output)"));
  EXPECT_EQ(JobCount(d), before);
  // --requeue / --no-requeue go with the job (what they do: ServerTest.AJobsOwnRequeueChoice...).
  const int64_t out_of_queue = SubmittedId(Cli(d, "submit --hold --no-requeue -- true"));
  ASSERT_GT(out_of_queue, 0);
  EXPECT_EQ(json::parse(Cli(d, fmt::format("show {} -o json", out_of_queue)))["spec"]["requeue"],
            false);
  const int64_t back = SubmittedId(Cli(d, "submit --hold --requeue -- true"));
  EXPECT_EQ(json::parse(Cli(d, fmt::format("show {} -o json", back)))["spec"]["requeue"], true);
  auto both = tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                                     " submit --requeue --no-requeue -- true 2>&1");
  EXPECT_EQ(both.code, 2);
  EXPECT_THAT(both.out, HasSubstr("excludes"));
}

// What a user's jobs leave in shared memory (issue 51: 1 GiB stayed in RAM after the job ended,
// outside every limit) is removed when the last of their jobs ends - not while another runs, and
// never another user's.
TEST(Batch, SharedMemoryAJobLeftGoesWhenItsUsersLastJobEnds) {
  ASSERT_EQ(geteuid(), 0u) << "this test runs jobs as nobody";
  const std::string name = "shm";
  const std::string shm = ::testing::TempDir() + "tessera-e2e-shm-" + std::to_string(getpid());
  fs::create_directories(shm);
  chmod(shm.c_str(), 01777);
  const fs::path top = fs::path(::testing::TempDir()).parent_path();
  for (fs::path p = fs::path(shm).parent_path(); p != top.parent_path() && p != "/";
       p = p.parent_path())
    chmod(p.c_str(), 0711);
  Daemon d(name, TwoUsers(fmt::format("confinement: {{cgroup: tessera-e2e-{}-{}, shm_dir: {}}}\n",
                                      getpid(), name, shm)));
  std::ofstream(shm + "/roots") << "root's own";
  const int64_t longer = SubmittedId(
      As(d, "nobody", "submit --workdir /tmp -- /bin/sh -c 'echo a > " + shm + "/a; sleep 2'").out);
  const int64_t quick = SubmittedId(
      As(d, "nobody",
         "submit --workdir /tmp -- /bin/sh -c 'head -c 1048576 /dev/zero > " + shm + "/b'")
          .out);
  ASSERT_GT(longer, 0);
  ASSERT_GT(quick, 0);
  WaitForLs(d, quick, "succeeded");
  EXPECT_TRUE(fs::exists(shm + "/b")) << "another job of nobody's still runs";
  WaitForLs(d, longer, "succeeded");
  // The sweep follows the end's record (the job reads as succeeded a moment before): wait for it.
  const std::string removed = "user nobody: removed 2 files (1 MiB) their jobs left in " + shm;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (d.Log().find(removed) == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_THAT(d.Log(), HasSubstr(removed));
  EXPECT_FALSE(fs::exists(shm + "/a"));
  EXPECT_FALSE(fs::exists(shm + "/b"));
  EXPECT_TRUE(fs::exists(shm + "/roots")) << "root's files stay";
  fs::remove_all(shm);
}

// An MPS job keeps the host's /dev/shm, where its MPS server's segments are (NVIDIA's MPS puts
// cuda.shm.* there, shared by the control daemon and its clients); its /tmp stays its own.
TEST(Batch, AnMpsJobKeepsTheHostsDevShmForItsServerAndItsOwnTmp) {
  ASSERT_EQ(geteuid(), 0u) << "this test runs jobs as nobody";
  MpsServer m("mps-shm", TwoUsers());
  Daemon& d = m.d;
  const std::string work = SharedWorkFolder(d);
  // A file of root's in the host's /dev/shm, which the job must see. (Not a file of nobody's
  // there: another test's server removes nobody's files when its own last job of nobody ends.)
  const std::string marker = "tessera-mps-host-" + std::to_string(getpid());
  std::ofstream("/dev/shm/" + marker) << "host";
  const int64_t id = SubmittedId(
      As(d, "nobody",
         "submit --sharing mps --gpu-share 20% --workdir " + work +
             " -- /bin/sh -c 'cat /dev/shm/" + marker +
             " > shm && echo t > /tmp/tessera-mps-$TESSERA_JOB_ID && env | grep ^CUDA_MPS_PIPE > "
             "pipe && touch written && n=0; while [ ! -e go ] && [ $n -lt 600 ]; do sleep 0.05; "
             "n=$((n+1)); done'")
          .out);
  ASSERT_GT(id, 0) << d.Log();
  ASSERT_TRUE(WaitForFile(work + "/written")) << d.Log();
  const std::string name = "tessera-mps-" + std::to_string(id);
  EXPECT_EQ(tessera::test::ReadFile(work + "/shm"), "host") << "the host's /dev/shm, its server's";
  EXPECT_FALSE(fs::exists("/tmp/" + name)) << "its own /tmp";
  EXPECT_EQ(tessera::test::ReadFile(work + "/pipe"), "CUDA_MPS_PIPE_DIRECTORY=" + m.pipe + "\n");
  std::ofstream(work + "/go") << "";
  WaitForLs(d, id, "succeeded");
  std::error_code ec;
  fs::remove("/dev/shm/" + marker, ec);
}

// Each job's /tmp and /dev/shm are its own (issue 51: what jobs left there outlived them, outside
// every limit): another job does not see them, the host neither, they go when the job ends, the
// tasks of one job share them, and the job's working directory under /tmp stays where it is.
TEST(Batch, AJobsTmpAndDevShmAreItsOwnAndGoWithIt) {
  ASSERT_EQ(geteuid(), 0u) << "this test runs jobs as nobody";
  const std::string name = "private-tmp";
  Daemon d(name, TwoUsers());
  EXPECT_THAT(d.Call("GET", "/v1/info")["confinement"].value("tmp", ""), HasSubstr("private"));
  const std::string work = SharedWorkFolder(d);
  const std::string wait_go =
      "n=0; while [ ! -e go ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done";
  const int64_t first = SubmittedId(
      As(d, "nobody",
         "submit --workdir " + work +
             " -- /bin/sh -c 'echo t > /tmp/leak-$TESSERA_JOB_ID && "
             "head -c 1048576 /dev/zero > /dev/shm/leak-$TESSERA_JOB_ID && touch written && " +
             wait_go + "'")
          .out);
  ASSERT_GT(first, 0);
  ASSERT_TRUE(WaitForFile(work + "/written")) << d.Log();
  const std::string leak = "leak-" + std::to_string(first);
  EXPECT_FALSE(fs::exists("/tmp/" + leak)) << "the host's /tmp";
  EXPECT_FALSE(fs::exists("/dev/shm/" + leak)) << "the host's /dev/shm";
  // Where they are: the job's folders, in root's 0700 parents.
  auto folder_with = [&](const std::string& base) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(base, ec)) {
      const fs::path f = e.path() / ("job-" + std::to_string(first)) / leak;
      if (e.path().filename().string().rfind(".tessera-", 0) == 0 && fs::exists(f)) return f;
    }
    return fs::path();
  };
  const fs::path tmp_copy = folder_with("/tmp"), shm_copy = folder_with("/dev/shm");
  ASSERT_FALSE(tmp_copy.empty());
  ASSERT_FALSE(shm_copy.empty());
  struct stat st;
  ASSERT_EQ(stat(tmp_copy.parent_path().parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  // Another job of the same user, at the same time: sees none of it.
  const int64_t second =
      SubmittedId(As(d, "nobody",
                     "submit --workdir " + work + " -- /bin/sh -c 'ls /tmp/" + leak + " /dev/shm/" +
                         leak + " >/dev/null 2>&1 && echo seen > second || echo unseen > second'")
                      .out);
  WaitForLs(d, second, "succeeded");
  EXPECT_EQ(tessera::test::ReadFile(work + "/second"), "unseen\n");
  std::ofstream(work + "/go") << "";
  WaitForLs(d, first, "succeeded");
  EXPECT_FALSE(fs::exists(tmp_copy.parent_path())) << "its /tmp went with it";
  EXPECT_FALSE(fs::exists(shm_copy.parent_path())) << "its /dev/shm went with it";
  // Two tasks of one job share them, as processes of one machine would.
  const int64_t pair = SubmittedId(
      As(d, "nobody",
         "submit --ntasks 2 --workdir " + work +
             " -- /bin/sh -c 'if [ $RANK = 0 ]; then echo r0 > /dev/shm/r0; else n=0; "
             "while [ ! -e /dev/shm/r0 ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done; "
             "cat /dev/shm/r0 > shared; fi'")
          .out);
  WaitForLs(d, pair, "succeeded");
  EXPECT_EQ(tessera::test::ReadFile(work + "/shared"), "r0\n");
  EXPECT_FALSE(fs::exists("/dev/shm/r0"));
}

// One user's jobs together cannot take the host's tasks (issue 51: two jobs at pids_max 16,384
// exhausted pid_max 32,768): their user's cgroup bounds them all, while another user still starts.
TEST(Batch, AUsersJobsTogetherStayUnderTheirTaskLimit) {
  ASSERT_EQ(geteuid(), 0u) << "this test runs jobs as nobody";
  const std::string name = "user-pids";
  Daemon d(name,
           TwoUsers(fmt::format(
               "confinement: {{cgroup: tessera-e2e-{}-{}, pids_max: 50, user_pids_max: 60}}\n",
               getpid(), name)));
  if (d.Call("GET", "/v1/info")["confinement"].value("pids", "none") == "none")
    GTEST_SKIP() << "no pids controller on this machine";
  const std::string work = SharedWorkFolder(d);
  // 40 tasks, within the job's 50: then waits.
  const int64_t first = SubmittedId(
      As(d, "nobody",
         "submit --workdir " + work +
             " -- /bin/sh -c 'for i in $(seq 40); do sleep 60 & done; touch ready; wait'")
          .out);
  ASSERT_GT(first, 0);
  ASSERT_TRUE(WaitForFile(work + "/ready")) << d.Log();
  // Another 40 of the same user: within its own job's 50, past the user's 60.
  const int64_t second = SubmittedId(
      As(d, "nobody",
         "submit --workdir " + work +
             " -- /bin/sh -c 'for i in $(seq 40); do sleep 60 & done; echo all started'")
          .out);
  WaitForLs(d, second, "failed");
  EXPECT_THAT(d.Logs(second), ::testing::Not(HasSubstr("all started")));
  EXPECT_THAT(d.Logs(second, "stderr"),
              ::testing::AnyOf(HasSubstr("fork"), HasSubstr("Resource temporarily")));
  // Root's job is not nobody's to share.
  const int64_t roots =
      SubmittedId(Cli(d, "submit --workdir " + work +
                             " -- /bin/sh -c 'for i in $(seq 40); do sleep 1 & done; "
                             "wait; echo all started'"));
  WaitForLs(d, roots, "succeeded");
  EXPECT_EQ(d.Logs(roots), "all started\n");
  Cli(d, "cancel " + std::to_string(first));
  WaitForLs(d, first, "cancelled");
}

// scancel's filters: -n NAME, -u USER, -t STATE take every matching queued or running job (an
// array's tasks one by one); another user's jobs are not the caller's to cancel; with nothing to
// cancel named, a plain error; --force says SIGKILL, not SIGTERM.
TEST(Batch, CancelTakesScancelsFiltersAndSaysWhatItSent) {
  Daemon d("cancel-filters", TwoUsers(), "dgx-h100");
  const int64_t x1 = SubmittedId(Cli(d, "submit --name sweep --gpus 1 -- sleep 60"));
  const int64_t x2 = SubmittedId(Cli(d, "submit --name sweep --gpus 1 -- sleep 60"));
  const int64_t x3 = SubmittedId(Cli(d, "submit --name sweep --gpus 1 -- sleep 60"));
  const int64_t keep = SubmittedId(Cli(d, "submit --name keep --gpus 1 -- sleep 60"));
  const int64_t theirs = SubmittedId(
      As(d, "nobody", "submit --workdir /tmp --name sweep --gpu-share 10% -- sleep 60").out);
  ASSERT_GT(theirs, 0);
  // All four run before the filters are tried (a pass may start them one after another).
  for (int64_t id : {x1, x2, x3, keep}) WaitForLs(d, id, "running");
  auto none = tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                                     " cancel 2>&1");
  EXPECT_EQ(none.code, 2);
  EXPECT_THAT(none.out, HasSubstr("cancel what?"));
  // Queued ones only: the 8-GPU machine runs x1..x3 and keep; nothing of root's waits.
  auto queued = As(d, "root", "cancel -n sweep -t queued");
  EXPECT_EQ(queued.code, 0) << queued.out;
  EXPECT_THAT(queued.out, HasSubstr("no queued job of root named 'sweep'"));
  auto swept = As(d, "root", "cancel --name sweep");
  EXPECT_EQ(swept.code, 0) << swept.out;
  for (int64_t id : {x1, x2, x3}) {
    EXPECT_THAT(swept.out, HasSubstr(fmt::format("job {}: ", id)));
    WaitForLs(d, id, "cancelled");
  }
  EXPECT_THAT(swept.out, ::testing::Not(HasSubstr(fmt::format("job {}:", keep))));
  EXPECT_THAT(swept.out, ::testing::Not(HasSubstr(fmt::format("job {}:", theirs))))
      << "another user's";
  EXPECT_EQ(WaitForLs(d, keep, "running")["state"], "running");
  // Someone else's by -u: refused by the server as any cancel of another's job would be.
  auto stranger = As(d, "nobody", "cancel -u root");
  EXPECT_NE(stranger.code, 0) << stranger.out;
  EXPECT_THAT(stranger.out, HasSubstr("belongs to root"));
  EXPECT_EQ(WaitForLs(d, keep, "running")["state"], "running");
  auto forced = As(d, "root", fmt::format("cancel --force {}", keep));
  EXPECT_THAT(forced.out, HasSubstr("SIGKILL sent"));
  EXPECT_THAT(forced.out, ::testing::Not(HasSubstr("SIGTERM")));
  WaitForLs(d, keep, "cancelled");
  auto all = As(d, "nobody", "cancel -u nobody");
  EXPECT_THAT(all.out, HasSubstr(fmt::format("job {}: ", theirs)));
  WaitForLs(d, theirs, "cancelled");
}

}  // namespace

// `tessera submit job.sh`: the script's #SBATCH and #TESSERA lines are its options (sbatch's
// translated, the rest said and ignored); the command line wins; a script that is not executable
// runs with its #! interpreter; a wrong directive is refused naming its line, and nothing
// submitted.
TEST(Batch, AScriptsDirectivesAreItsOptionsAndTheCommandLineWins) {
  Daemon d("directives");
  const std::string script = d.dir() + "/job.sh";
  std::ofstream(script) << "#!/bin/sh\n"
                           "#SBATCH --job-name=nightly --gres=gpu:1 --time=10\n"
                           "#SBATCH --partition=gpu --cpus-per-task=1\n"
                           "#TESSERA --priority -3 --label team=nlp\n"
                           "echo ran from the script as $0\n";
  chmod(script.c_str(), 0644);  // as sbatch scripts usually are: not executable
  auto out = tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                                    " submit " + script + " 2>&1");
  ASSERT_EQ(out.code, 0) << out.out;
  EXPECT_THAT(out.out,
              HasSubstr("job.sh:3: #SBATCH --partition=gpu: not used by Tessera (ignored)"));
  const int64_t id = SubmittedId(out.out);
  ASSERT_GT(id, 0) << out.out;
  WaitForLs(d, id, "succeeded");
  json j = json::parse(Cli(d, fmt::format("show {} -o json", id)));
  EXPECT_EQ(j["name"], "nightly");
  EXPECT_EQ(j["priority"], -3);
  EXPECT_EQ(j["spec"]["resources"]["gpus"], 1);
  EXPECT_EQ(j["spec"]["resources"]["cpus"], 1);
  EXPECT_EQ(j["spec"]["max_runtime_s"], 600) << "Slurm's --time=10 is minutes";
  EXPECT_EQ(j["spec"]["labels"]["team"], "nlp");
  EXPECT_EQ(j["spec"]["command"], json({"/bin/sh", script}));
  EXPECT_EQ(Cli(d, fmt::format("logs {}", id)), "ran from the script as " + script + "\n");
  // The command line wins over the script.
  const int64_t other = SubmittedId(Cli(d, "submit --name manual --priority 2 " + script));
  json o = json::parse(Cli(d, fmt::format("show {} -o json", other)));
  EXPECT_EQ(o["name"], "manual");
  EXPECT_EQ(o["priority"], 2);
  EXPECT_EQ(o["spec"]["resources"]["gpus"], 1) << "what the command line did not say: the script's";
  // Slurm's spellings on the command line, with Slurm's meanings; each wins over the script's
  // spelling of the same thing.
  const int64_t slurm =
      SubmittedId(Cli(d, "submit -J spelled -t 2:30 --gres gpu:2 -c 2 " + script));
  json sl = json::parse(Cli(d, fmt::format("show {} -o json", slurm)));
  EXPECT_EQ(sl["name"], "spelled");
  EXPECT_EQ(sl["spec"]["max_runtime_s"], 150) << "MM:SS";
  EXPECT_EQ(sl["spec"]["resources"]["gpus"], 2) << "--gres over the script's --gres=gpu:1";
  EXPECT_EQ(sl["spec"]["resources"]["cpus"], 2);
  const int64_t minutes = SubmittedId(Cli(d, "submit --time 5 " + script));
  EXPECT_EQ(json::parse(Cli(d, fmt::format("show {} -o json", minutes)))["spec"]["max_runtime_s"],
            300)
      << "a bare --time is minutes";
  const int64_t seconds = SubmittedId(Cli(d, "submit --max-runtime 45 " + script));
  EXPECT_EQ(json::parse(Cli(d, fmt::format("show {} -o json", seconds)))["spec"]["max_runtime_s"],
            45)
      << "the command line's --max-runtime over the script's --time=10";
  auto both = tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                                     " submit --time 5 --max-runtime 45 " + script + " 2>&1");
  EXPECT_EQ(both.code, 2) << both.out;
  // An elastic range in a script, as sbatch's --gpus spelling.
  const std::string elastic = d.dir() + "/elastic.sh";
  std::ofstream(elastic)
      << "#!/bin/sh\n#SBATCH --gpus=1-2\n"
         "#TESSERA --resize signal --resize-grace 2m\necho $CUDA_VISIBLE_DEVICES\n";
  const int64_t ranged = SubmittedId(Cli(d, "submit --hold " + elastic));
  json r = json::parse(Cli(d, fmt::format("show {} -o json", ranged)));
  EXPECT_EQ(r["spec"]["resources"]["gpus"], 1) << r.dump();
  EXPECT_EQ(r["spec"]["resources"]["gpus_max"], 2) << r.dump();
  EXPECT_EQ(r["spec"]["resize"],
            (json{{"by", "signal"}, {"grace_s", 120}, {"unanswered", "restart"}}))
      << r.dump();
  EXPECT_THAT(Cli(d, fmt::format("show {}", ranged)), HasSubstr("1-2 GPU"));
  EXPECT_THAT(Cli(d, fmt::format("show {}", ranged)),
              HasSubstr("by signal (SIGUSR1, exit 75 within 120 s, else restart)"));
  auto unasked =
      tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                             " submit --gpus 1-2 --resize-unanswered keep " + script + " 2>&1");
  EXPECT_EQ(unasked.code, 2);
  EXPECT_THAT(unasked.out, HasSubstr("--resize-grace and --resize-unanswered go with --resize"));
  auto gres = tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                                     " submit --gres gpu:x " + script + " 2>&1");
  EXPECT_EQ(gres.code, 2);
  EXPECT_THAT(gres.out, HasSubstr("--gres=gpu:x: expected gpu[:type]:count"));
  // A wrong directive: refused with its line, nothing stored.
  const size_t before = JobCount(d);
  std::ofstream(script) << "#!/bin/sh\n#TESSERA --gpus lots\ntrue\n";
  auto bad = tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY +
                                    " submit " + script + " 2>&1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.out, HasSubstr("job.sh:2: #TESSERA --gpus lots:"));
  EXPECT_EQ(JobCount(d), before);
}
