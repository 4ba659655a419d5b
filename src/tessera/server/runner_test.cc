// The runner with real processes: environment and devices, logs, exec failures, stopping a process
// group, and telling a live job from a reused pid.
#include "tessera/server/runner.h"

#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "fmt/format.h"
#include "tessera/server/signal_safe.h"
#include "tessera/shim/region.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

std::string Dir() {
  std::string d = ::testing::TempDir() + "runner-test-" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  return d;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int WaitExit(pid_t pid, double seconds = 10) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto code = Reap(pid)) return *code;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

LaunchSpec Shell(const std::string& script, const std::string& name) {
  LaunchSpec s;
  s.argv = {"sh", "-c", script};
  s.env = {{"HOME", "/tmp"}, {"GREETING", "hello"}};
  s.stdout_path = Dir() + "/" + name + ".out";
  s.stderr_path = Dir() + "/" + name + ".err";
  std::filesystem::remove(s.stdout_path);
  std::filesystem::remove(s.stderr_path);
  s.job_id = 7;
  return s;
}

// The numbers a child writes between fork and exec (exit codes, ranks, fd paths).
TEST(WriteDecimal, WritesEveryInt64WithoutATerminator) {
  auto text = [](int64_t v) {
    char buf[kDecimalMax + 1];
    buf[kDecimalMax] = '#';
    const size_t n = WriteDecimal(v, buf);
    EXPECT_EQ(buf[kDecimalMax], '#') << "within its room";
    return std::string(buf, n);
  };
  EXPECT_EQ(text(0), "0");
  EXPECT_EQ(text(7), "7");
  EXPECT_EQ(text(255), "255");
  EXPECT_EQ(text(-1), "-1");
  EXPECT_EQ(text(INT64_MAX), "9223372036854775807");
  EXPECT_EQ(text(INT64_MIN), "-9223372036854775808");
}

TEST(Runner, JobSeesItsEnvironmentDevicesAndLogs) {
  LaunchSpec s = Shell(
      "echo $GREETING $CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES $TESSERA_JOB_ID; "
      "echo oops >&2; exit 3",
      "env");
  s.gpu_uuids = {"GPU-aaaa", "GPU-bbbb"};
  auto l = Start(s);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(WaitExit(l->pid), 3);
  EXPECT_EQ(ReadAll(s.stdout_path), "hello GPU-aaaa,GPU-bbbb GPU-aaaa,GPU-bbbb 7\n");
  EXPECT_EQ(ReadAll(s.stderr_path), "oops\n");
}

TEST(Runner, NoDevicesMeansNoneVisible) {
  LaunchSpec s = Shell("echo \"[$CUDA_VISIBLE_DEVICES] $NVIDIA_VISIBLE_DEVICES\"", "none");
  auto l = Start(s);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(WaitExit(l->pid), 0);
  EXPECT_EQ(ReadAll(s.stdout_path), "[] void\n");
}

TEST(Runner, ShareAddsTheInterceptLibraryAndLimits) {
  LaunchSpec s;
  s.env = {{"LD_PRELOAD", "/opt/other.so"}};
  s.share = ShareLimits{"/usr/lib/libtessera-cuda.so", "/run/tessera/7.region", 10ull << 30};
  auto env = JobEnvironment(s);
  EXPECT_EQ(env["LD_PRELOAD"], "/usr/lib/libtessera-cuda.so:/opt/other.so");
  EXPECT_EQ(env["TESSERA_CUDA_REGION"], "/run/tessera/7.region");
  EXPECT_EQ(env["TESSERA_CUDA_MEM_LIMIT"], std::to_string(10ull << 30));
  EXPECT_EQ(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
  // The compute share in percent, which the library cannot misread: a whole GPU's 1000 milli
  // written as the fraction "1" would be 1%.
  s.share->arbiter = "/run/tessera/gpu.arbiter";
  for (auto [milli, text] : {std::pair{300, "30%"}, {1000, "100%"}, {125, "12.5%"}}) {
    s.share->share_milli = milli;
    EXPECT_EQ(JobEnvironment(s)["TESSERA_CUDA_COMPUTE_SHARE"], text) << milli;
  }
}

TEST(Runner, CommandThatCannotRunIsAClearErrorAndLeavesNothing) {
  LaunchSpec s = Shell("", "missing");
  s.argv = {"no-such-command-tessera"};
  auto l = Start(s);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(l.status().message()),
      HasSubstr("job 7: cannot execute 'no-such-command-tessera': No such file or directory"));
  EXPECT_EQ(ReadAll(s.stderr_path),
            "tessera: job 7: cannot execute 'no-such-command-tessera': No such file or directory\n")
      << "the reason is in the job's stderr log too, not only in its state";
  EXPECT_EQ(ExitCodeOf(l.status()), 127) << "not found, as a shell says it";
  LaunchSpec x = Shell("", "not-executable");
  x.argv = {"/etc/hostname"};
  EXPECT_EQ(ExitCodeOf(Start(x).status()), 126) << "found, not runnable";
  LaunchSpec d = Shell("true", "workdir");
  d.workdir = "/nonexistent/dir";
  auto w = Start(d);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("cannot enter the working directory"));
  LaunchSpec e;
  EXPECT_FALSE(Start(e).ok()) << "no command";
  // A cgroup it cannot join: not started at all (never unconfined by accident).
  const std::string marker = ::testing::TempDir() + "ran-unconfined";
  LaunchSpec c = Shell("touch " + marker, "cgroup");
  c.cgroup_procs = {"/nonexistent/cgroup/job-7/cgroup.procs"};
  auto g = Start(c);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()),
              HasSubstr("job 7: cannot enter its cgroup: No such file or directory"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(Runner, StopReachesTheWholeProcessGroup) {
  // The job ignores SIGTERM and has a child: SIGTERM changes nothing, SIGKILL of the group ends
  // both.
  std::string pidfile = Dir() + "/child.pid", termfile = Dir() + "/term";
  std::filesystem::remove(pidfile);
  std::filesystem::remove(termfile);
  // The child starts with SIGTERM ignored (and keeps it so); the shell then notes each SIGTERM it
  // gets and goes on waiting for its child. The child's pid is written once the shell's trap is
  // set: written before it, a SIGTERM in between was ignored (seen on a loaded machine).
  LaunchSpec s =
      Shell("trap '' TERM; sleep 30 & c=$!; trap 'echo term >> " + termfile + "' TERM; echo $c > " +
                pidfile + "; while kill -0 $c 2>/dev/null; do wait $c; done",
            "group");
  auto l = Start(s);
  ASSERT_TRUE(l.ok()) << l.status();
  // Deadlines, not waits: generous, for a loaded machine.
  for (int i = 0; i < 6000 && ReadAll(pidfile).find('\n') == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_NE(ReadAll(pidfile).find('\n'), std::string::npos) << "the shell never started its child";
  pid_t child = std::stoi(ReadAll(pidfile));
  EXPECT_TRUE(SignalGroup(l->pid, SIGTERM));
  // Handled (the shell's trap ran), and the group lives on: no fixed wait to decide either.
  for (int i = 0; i < 6000 && ReadAll(termfile).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(ReadAll(termfile), "term\n");
  EXPECT_FALSE(Reap(l->pid).has_value()) << "SIGTERM trapped: still running";
  EXPECT_TRUE(SignalGroup(l->pid, SIGKILL));
  EXPECT_EQ(WaitExit(l->pid), 128 + SIGKILL);
  // The grandchild was in the group too (reparented to init, so poll for it to go).
  bool gone = false;
  for (int i = 0; i < 6000 && !gone; ++i) {
    gone = kill(child, 0) != 0 || !SameProcess(child, shim::ProcessStartTime(child));
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(gone);
}

// Starts `s` from a thread whose signal state is the server's: SIGTERM and SIGINT blocked (taken by
// sigwait) and SIGPIPE ignored. Restores this thread's state afterwards.
absl::StatusOr<Launched> StartLikeTheServer(const LaunchSpec& s) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  struct sigaction ign = {}, old_pipe = {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old_pipe);
  auto l = Start(s);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return l;
}

// Polls (with a deadline) until `path` holds `text`.
bool WaitForText(const std::string& path, const std::string& text, double seconds = 10) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (ReadAll(path).find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(Runner, JobStartsWithNoSignalBlockedOrIgnoredWhateverTheServerHas) {
  for (bool shepherd : {false, true}) {
    SCOPED_TRACE(shepherd ? "under a shepherd" : "bare");
    LaunchSpec s = Shell("exec grep -E '^Sig(Blk|Ign)' /proc/self/status", "sigmask");
    if (shepherd) {
      s.exit_path = Dir() + "/sigmask.exit";
      std::filesystem::remove(s.exit_path);
    }
    auto l = StartLikeTheServer(s);
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_EQ(WaitExit(l->pid), 0);
    std::string out = ReadAll(s.stdout_path);
    EXPECT_THAT(out, HasSubstr("SigBlk:\t0000000000000000")) << out;
    EXPECT_THAT(out, HasSubstr("SigIgn:\t0000000000000000")) << out;
  }
}

TEST(Runner, AJobRunsAsItsUserWithThatUsersGroups) {
  ASSERT_EQ(geteuid(), 0u) << "the server switches users as root; so does this test";
  const passwd* pw = getpwnam("nobody");
  ASSERT_NE(pw, nullptr);
  LaunchSpec s = Shell("exec grep -E '^(Uid|Gid|Groups):' /proc/self/status", "groups");
  s.uid = pw->pw_uid;
  s.gid = pw->pw_gid;
  s.workdir = "/";
  auto l = Start(s);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(WaitExit(l->pid), 0);
  // Its account's groups (primary and supplementary), not none and not the server's.
  int n = 64;
  std::vector<gid_t> want(64);
  ASSERT_GE(getgrouplist(pw->pw_name, pw->pw_gid, want.data(), &n), 0);
  want.resize(static_cast<size_t>(n));
  std::sort(want.begin(), want.end());
  std::string groups;
  for (gid_t g : want) groups += std::to_string(g) + " ";
  const std::string out = ReadAll(s.stdout_path);
  EXPECT_THAT(out, HasSubstr(fmt::format("Uid:\t{0}\t{0}\t{0}\t{0}", pw->pw_uid))) << out;
  EXPECT_THAT(out, HasSubstr("Groups:\t" + groups)) << out;
}

// Never the server's group: a uid without a gid is refused, and an account gone since the launch
// was prepared runs in its primary group alone, with none of root's supplementary groups.
TEST(Runner, AUserJobNeverKeepsTheServersGroups) {
  ASSERT_EQ(geteuid(), 0u) << "the server switches users as root; so does this test";
  uid_t ghost = 4242;
  while (getpwuid(ghost) != nullptr) ++ghost;
  LaunchSpec s = Shell("exec grep -E '^(Uid|Gid|Groups):' /proc/self/status", "ghost");
  s.uid = ghost;
  s.workdir = "/";
  auto refused = Start(s);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr(fmt::format("no group for uid {}", ghost)));
  EXPECT_FALSE(std::filesystem::exists(s.stdout_path)) << "nothing started";
  s.gid = ghost;
  auto l = Start(s);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(WaitExit(l->pid), 0);
  const std::string out = ReadAll(s.stdout_path);
  EXPECT_THAT(out, HasSubstr(fmt::format("Gid:\t{0}\t{0}\t{0}\t{0}", ghost))) << out;
  EXPECT_THAT(out, HasSubstr(fmt::format("Groups:\t{} \n", ghost))) << out;
}

// The working directory is entered as the user: a root-only one is refused to a user's job (and
// says so), where entering it as root first let the job start there.
TEST(Runner, AUsersJobEntersItsWorkingDirectoryWithTheUsersRights) {
  ASSERT_EQ(geteuid(), 0u) << "the server switches users as root; so does this test";
  const passwd* pw = getpwnam("nobody");
  ASSERT_NE(pw, nullptr);
  const std::string private_dir = Dir() + "/root-only";
  std::filesystem::create_directories(private_dir);
  ASSERT_EQ(chmod(private_dir.c_str(), 0700), 0);
  LaunchSpec s = Shell("pwd", "workdir");
  s.uid = pw->pw_uid;
  s.gid = pw->pw_gid;
  s.workdir = private_dir;
  auto refused = Start(s);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("cannot enter the working directory '" + private_dir + "'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("Permission denied"));
  s.workdir = "/tmp";
  auto l = Start(s);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(WaitExit(l->pid), 0);
  EXPECT_EQ(ReadAll(s.stdout_path), "/tmp\n");
}

TEST(Runner, JobThatTrapsSigtermGetsItAndExitsCleanly) {
  // A training script saving a checkpoint on SIGTERM: the stop must reach it, not the shepherd's
  // ignore or the server's mask, and its own exit code is what is recorded.
  LaunchSpec s =
      Shell("trap 'echo checkpoint saved; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
            "trap");
  s.exit_path = Dir() + "/trap.exit";
  std::filesystem::remove(s.exit_path);
  auto l = StartLikeTheServer(s);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_TRUE(WaitForText(s.stdout_path, "ready"));
  EXPECT_TRUE(SignalGroup(l->pid, SIGTERM));
  EXPECT_EQ(WaitExit(l->pid), 0) << "the shepherd exits with the job's own code";
  EXPECT_THAT(ReadAll(s.stdout_path), HasSubstr("checkpoint saved"));
  EXPECT_EQ(ReadExitFile(s.exit_path), 0);
}

TEST(Runner, TasksRunAsOneJobAndOneThatFailsTakesTheOthersDownAfterTheirGrace) {
  LaunchSpec s = Shell(
      "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; trap '' TERM; echo up $RANK; "
      "exec sleep 30",
      "tasks");
  s.exit_path = Dir() + "/tasks.exit";
  std::filesystem::remove(s.exit_path);
  for (int r = 0; r < 3; ++r) {
    TaskLaunch t;
    t.env = {{"RANK", std::to_string(r)}};
    t.stdout_path = r == 0 ? s.stdout_path : fmt::format("{}/tasks.{}.out", Dir(), r);
    t.stderr_path = r == 0 ? s.stderr_path : fmt::format("{}/tasks.{}.err", Dir(), r);
    std::filesystem::remove(t.stdout_path);
    s.tasks.push_back(t);
  }
  s.task_grace_s = 1;
  auto l = Start(s);
  ASSERT_TRUE(l.ok()) << l.status();
  const auto t0 = std::chrono::steady_clock::now();
  // Tasks 0 and 2 ignore SIGTERM: SIGKILL after the grace second ends them; the job's code is the
  // failed task's.
  EXPECT_EQ(WaitExit(l->pid, 20), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  EXPECT_EQ(ReadExitFile(s.exit_path), 3);
  EXPECT_EQ(ReadAll(s.stdout_path), "up 0\n");
  EXPECT_EQ(ReadAll(Dir() + "/tasks.2.out"), "up 2\n") << "each task its own log";
  EXPECT_THAT(ReadAll(s.stderr_path),
              HasSubstr("tessera: job 7: task 1 ended with code 3; stopping the other tasks"));
  EXPECT_FALSE(SignalGroup(l->pid, 0)) << "nothing of the job is left";
}

// The log cap holds as the bytes are written, not a second later: two tasks writing 8 MiB each to
// stdout and stderr under a 1 MiB cap leave 1 MiB in their logs together and the cap said, and
// are not held up by it (what they write past it is read and dropped). `yes` wrote 268 MB past a
// 64 MiB cap before the once-a-second check stopped it.
TEST(Runner, TheLogCapHoldsAsTheBytesAreWritten) {
  LaunchSpec s =
      Shell("head -c 8388608 /dev/zero; head -c 8388608 /dev/zero >&2; echo done >&2", "capped");
  s.exit_path = Dir() + "/capped.exit";
  std::filesystem::remove(s.exit_path);
  std::vector<std::string> logs = {s.stdout_path, s.stderr_path};
  for (int r = 0; r < 2; ++r) {
    TaskLaunch t;
    t.stdout_path = r == 0 ? s.stdout_path : Dir() + "/capped.1.out";
    t.stderr_path = r == 0 ? s.stderr_path : Dir() + "/capped.1.err";
    if (r == 1) {
      std::filesystem::remove(t.stdout_path), std::filesystem::remove(t.stderr_path);
      logs.push_back(t.stdout_path), logs.push_back(t.stderr_path);
    }
    s.tasks.push_back(t);
  }
  s.max_log_bytes = 1 << 20;
  auto l = Start(s);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(WaitExit(l->pid, 30), 0) << "the tasks ran to their end";
  uint64_t total = 0;
  int said = 0;
  for (const std::string& log : logs) {
    const std::string text = ReadAll(log);
    total += text.size();
    said += text.find("tessera: job 7: its logs reached limits.max_log_bytes_per_job") !=
            std::string::npos;
    struct stat st;
    ASSERT_EQ(stat(log.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << log << ": private to the job's user";
  }
  EXPECT_LE(total, (1u << 20) + 200) << "1 MiB and the line that says so";
  EXPECT_GE(total, 1u << 20);
  EXPECT_EQ(said, 1);
  // Below the cap everything arrives, in order.
  LaunchSpec small = Shell("seq 1 20000; echo end >&2", "uncapped");
  small.exit_path = Dir() + "/uncapped.exit";
  std::filesystem::remove(small.exit_path);
  small.max_log_bytes = 1 << 20;
  auto l2 = Start(small);
  ASSERT_TRUE(l2.ok()) << l2.status();
  EXPECT_EQ(WaitExit(l2->pid, 30), 0);
  std::string expected;
  for (int i = 1; i <= 20000; ++i) expected += std::to_string(i) + "\n";
  EXPECT_EQ(ReadAll(small.stdout_path), expected);
  EXPECT_EQ(ReadAll(small.stderr_path), "end\n");
}

TEST(Runner, SameProcessTellsLiveFromEndedAndReused) {
  LaunchSpec s = Shell("sleep 30", "same");
  auto l = Start(s);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(SameProcess(l->pid, l->start_time));
  EXPECT_FALSE(SameProcess(l->pid, l->start_time + 1)) << "another start time: a reused pid";
  SignalGroup(l->pid, SIGKILL);
  // Ended but not reaped yet (a zombie) is not running.
  for (int i = 0; i < 200 && SameProcess(l->pid, l->start_time); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(SameProcess(l->pid, l->start_time));
  EXPECT_EQ(WaitExit(l->pid), 128 + SIGKILL);
}

TEST(ExitWatcher, SaysWhenAWatchedProcessEnds) {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  ExitWatcher w([&] {
    std::lock_guard lock(mu);
    ++calls;
    cv.notify_all();
  });
  auto ends = Start(Shell("exit 0", "watch-ends"));
  auto stays = Start(Shell("sleep 30", "watch-stays"));
  ASSERT_TRUE(ends.ok() && stays.ok());
  ASSERT_TRUE(w.Watch(1, ends->pid));
  ASSERT_TRUE(w.Watch(2, stays->pid));
  EXPECT_EQ(w.watched(), 2u);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return calls > 0; }))
        << "no word of the ended process";
  }
  EXPECT_EQ(WaitExit(ends->pid), 0) << "the watcher does not reap: its owner does";
  w.Unwatch(1);
  w.Unwatch(1);  // twice, or a key never watched: nothing happens
  w.Unwatch(99);
  EXPECT_EQ(w.watched(), 1u);
  EXPECT_TRUE(SameProcess(stays->pid, stays->start_time)) << "a live process raised nothing";
  SignalGroup(stays->pid, SIGKILL);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return calls > 1; }));
  }
  EXPECT_EQ(WaitExit(stays->pid), 128 + SIGKILL);
  EXPECT_FALSE(w.Watch(3, stays->pid)) << "a process that is gone cannot be watched";
  EXPECT_FALSE(w.Watch(4, 0));
}

}  // namespace
}  // namespace tessera::server
