// The MPS control daemons (mps.h) against the fake nvidia-cuda-mps-control (tests/fakes/mps),
// and the fake driver as their client: limits as MPS's environment gives them, one user's
// clients at a time, a killed client.
#include "tessera/devices/mps.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tessera/core/mutex.h"

extern char** environ;

namespace tessera::devices {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

const char* kControl = TESSERA_TEST_FAKES_DIR "/mps/nvidia-cuda-mps-control";

class MpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short (a unix socket's path, the pipe folder's `control`, has at most 107 bytes) and
    // reachable by another user's client (the test's TempDir is its user's alone); removed at the
    // end.
    static int n = 0;
    root_ = "/tmp/tessera-mps-" + std::to_string(getpid()) + "-" + std::to_string(++n);
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    // No daemon outlives its test.
    for (int gpu = 0; gpu < 4; ++gpu) {
      MpsDaemons any(kControl, root_, {{gpu, ""}});
      (void)any.Stop(gpu);
    }
    fs::remove_all(root_);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  pid_t DaemonPid(const MpsDaemons& d, int gpu) {
    std::ifstream in(d.PipeDir(gpu) + "/nvidia-cuda-mps-control.pid");
    pid_t pid = 0;
    in >> pid;
    return pid;
  }
  // Polls `done` until true or 10 s passed.
  template <class F>
  static bool Eventually(F done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  std::string root_;
};

TEST_F(MpsTest, ADaemonIsStartedWithItsOwnFoldersAndGpuAnswersAndQuits) {
  MpsDaemons d(kControl, root_, {{1, "GPU-one"}});
  EXPECT_FALSE(d.Has(0));
  EXPECT_TRUE(d.Has(1));
  EXPECT_FALSE(d.Check(1).ok()) << "none runs yet";
  ASSERT_TRUE(d.Ensure(1).ok());
  EXPECT_TRUE(d.Check(1).ok());
  EXPECT_EQ(d.PipeDir(1), root_ + "/gpu1/pipe");
  EXPECT_TRUE(fs::exists(d.PipeDir(1) + "/control"));
  EXPECT_GT(DaemonPid(d, 1), 0);
  EXPECT_THAT(Read(d.LogDir(1) + "/control.log"), HasSubstr("devices GPU-one"))
      << "it sees only its GPU";
  EXPECT_EQ(fs::status(d.PipeDir(1)).permissions() & fs::perms::others_exec, fs::perms::others_exec)
      << "clients of every user reach its pipes";
  // Ensure again: the running one is kept, not a second started.
  const pid_t pid = DaemonPid(d, 1);
  ASSERT_TRUE(d.Ensure(1).ok());
  EXPECT_EQ(DaemonPid(d, 1), pid);
  ASSERT_TRUE(d.Stop(1).ok());
  EXPECT_TRUE(Eventually([&] { return !d.Check(1).ok(); }));
  EXPECT_TRUE(d.Stop(1).ok()) << "none running is fine";
  EXPECT_EQ(d.Check(0).code(), absl::StatusCode::kNotFound);
}

TEST_F(MpsTest, ADaemonStartedFromAThreadThatBlocksSigtermStillStopsOnIt) {
  // As the server's threads do (it takes SIGTERM by signalfd).
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  MpsDaemons d(kControl, root_, {{0, "GPU-zero"}});
  const absl::Status st = d.Ensure(0);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(kill(DaemonPid(d, 0), SIGTERM), 0);
  EXPECT_TRUE(Eventually([&] { return !d.Check(0).ok(); })) << "SIGTERM stopped it";
}

TEST_F(MpsTest, TheWatchStartsEachDaemonAndRestartsOneThatDiedSayingSo) {
  MpsDaemons d(kControl, root_, {{0, "GPU-zero"}, {2, "GPU-two"}});
  core::Mutex mu;
  std::vector<std::tuple<int, bool, std::string>> seen;
  d.Start(std::chrono::milliseconds(20), [&](int gpu, bool up, const std::string& why) {
    core::MutexLock lock(mu);
    seen.emplace_back(gpu, up, why);
  });
  auto count = [&](int gpu, bool up) {
    core::MutexLock lock(mu);
    return std::count_if(seen.begin(), seen.end(), [&](const auto& e) {
      return std::get<0>(e) == gpu && std::get<1>(e) == up;
    });
  };
  // Both up before Start returned: the first round is not left to the thread. Each was said down
  // first (none was running: clients recovered with their jobs would have lost their server).
  EXPECT_EQ(count(0, true), 1);
  EXPECT_EQ(count(2, true), 1);
  EXPECT_EQ(count(0, false), 1);
  EXPECT_EQ(count(2, false), 1);
  const pid_t first = DaemonPid(d, 2);
  ASSERT_GT(first, 0);
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(Eventually([&] { return count(2, true) == 2; })) << "started again";
  EXPECT_EQ(count(2, false), 2);
  {
    core::MutexLock lock(mu);
    std::vector<std::string> said;
    for (const auto& [gpu, up, why] : seen) {
      if (gpu == 2 && !up) said.push_back(why);
    }
    ASSERT_EQ(said.size(), 2u);
    EXPECT_THAT(said[0], HasSubstr("the MPS control daemon was not running"));
    EXPECT_THAT(said[1], HasSubstr("the MPS control daemon stopped"));
  }
  EXPECT_EQ(count(0, false), 1) << "the other GPU's daemon was not touched";
  EXPECT_NE(DaemonPid(d, 2), first);
  for (const MpsDaemonState& s : d.States()) {
    EXPECT_TRUE(s.up) << s.gpu;
    EXPECT_EQ(s.deaths, s.gpu == 2 ? 1 : 0) << s.gpu;
    EXPECT_EQ(s.starts, s.gpu == 2 ? 2 : 1) << s.gpu;
  }
  // The watch stopped, the daemons keep running (their clients are jobs a restarted server keeps).
  d.StopWatch(false);
  EXPECT_TRUE(d.Check(0).ok());
  EXPECT_TRUE(d.Check(2).ok());
}

TEST_F(MpsTest, ADaemonThatCannotStartIsReportedDownOnceWithWhy) {
  const std::string broken = root_ + "/broken-control";
  std::ofstream(broken) << "#!/bin/sh\necho 'no MPS on this driver' >&2\nexit 3\n";
  chmod(broken.c_str(), 0755);
  MpsDaemons d(broken, root_ + "/mps", {{0, "GPU-zero"}});
  core::Mutex mu;
  std::vector<std::pair<bool, std::string>> seen;
  d.Start(std::chrono::milliseconds(10), [&](int, bool up, const std::string& why) {
    core::MutexLock lock(mu);
    seen.emplace_back(up, why);
  });
  // A few rounds later: said once, not at every round.
  ASSERT_TRUE(Eventually([&] {
    for (const MpsDaemonState& s : d.States())
      if (s.starts >= 3) return true;
    return false;
  }));
  d.StopWatch(false);
  core::MutexLock lock(mu);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(seen[0].first);
  EXPECT_THAT(seen[0].second, HasSubstr("cannot be started"));
  EXPECT_THAT(seen[0].second, HasSubstr("exit 3"));
  MpsDaemons missing(root_ + "/nothing-here", root_ + "/mps", {{0, ""}});
  EXPECT_THAT(std::string(missing.Ensure(0).message()), HasSubstr("is not found"));
}

TEST_F(MpsTest, APipeFolderTooLongForAUnixSocketIsRefusedSayingSo) {
  MpsDaemons d(kControl, root_ + "/" + std::string(120, 'x'), {{0, "GPU-zero"}});
  const absl::Status st = d.Ensure(0);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("too long for a unix socket"));
}

TEST_F(MpsTest, ADaemonOfAGpuNoLongerInMpsModeIsToldToQuit) {
  MpsDaemons before(kControl, root_, {{1, "GPU-one"}});
  ASSERT_TRUE(before.Ensure(1).ok());
  MpsDaemons after(kControl, root_, {{0, "GPU-zero"}});
  EXPECT_EQ(after.QuitLeftBehind(), std::vector<int>{1});
  EXPECT_TRUE(Eventually([&] { return !before.Check(1).ok(); }));
  EXPECT_FALSE(fs::exists(root_ + "/gpu1"));
  EXPECT_TRUE(after.QuitLeftBehind().empty());
}

TEST(MpsClientEnv, LimitsComeFromTheShare) {
  auto e = MpsClientEnv("/run/p", 300, 4096, 1);
  EXPECT_EQ(e["CUDA_MPS_PIPE_DIRECTORY"], "/run/p");
  EXPECT_EQ(e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
  EXPECT_EQ(e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=4096M");
  EXPECT_EQ(e["CUDA_MPS_CLIENT_PRIORITY"], "0");
  EXPECT_EQ(MpsClientEnv("/p", 300, 0, 1, -5)["CUDA_MPS_CLIENT_PRIORITY"], "1") << "below normal";
  EXPECT_EQ(MpsClientEnv("/p", 300, 0, 1, 10)["CUDA_MPS_CLIENT_PRIORITY"], "0");
  EXPECT_EQ(MpsClientEnv("/p", 333, 0, 1)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "34")
      << "rounded up: never less than asked";
  EXPECT_EQ(MpsClientEnv("/p", 1, 0, 1)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "1");
  auto whole = MpsClientEnv("/p", 0, 0, 2);
  EXPECT_EQ(whole["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "100");
  EXPECT_FALSE(whole.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
  EXPECT_EQ(MpsClientEnv("/p", 500, 100, 2)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=100M,1=100M");
}

TEST(MpsGpusOf, NamesIndicesUuidsOrAll) {
  core::NodeInventory inv;
  for (int i = 0; i < 3; ++i) inv.gpus.push_back({.index = i, .uuid = "GPU-" + std::to_string(i)});
  auto some = MpsGpusOf({"2", "GPU-0"}, inv);
  ASSERT_TRUE(some.ok());
  ASSERT_EQ(some->size(), 2u);
  EXPECT_EQ((*some)[0].index, 0);
  EXPECT_EQ((*some)[1].uuid, "GPU-2");
  EXPECT_EQ(MpsGpusOf({"all"}, inv)->size(), 3u);
  EXPECT_TRUE(MpsGpusOf({}, inv)->empty());
  auto bad = MpsGpusOf({"3"}, inv);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("no GPU '3'"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("0..2"));
}

// A CUDA program (cuda_client, on the fake driver) started with `env` (added to ours), optionally
// as another uid; its output to `out`.
// The client and the fake driver are run from `bin` when given: copies another uid can reach
// (the build folder may be its user's alone).
pid_t Spawn(const std::vector<std::string>& args, std::map<std::string, std::string> env,
            const std::string& out, std::optional<uid_t> uid = std::nullopt,
            const std::string& bin = "") {
  std::vector<std::string> argv;
  if (uid) {
    argv = {"/usr/bin/setpriv", "--reuid=" + std::to_string(*uid),
            "--regid=" + std::to_string(*uid), "--clear-groups"};
  }
  argv.push_back(bin.empty() ? std::string(TESSERA_CUDA_CLIENT) : bin + "/cuda_client");
  if (!bin.empty()) env["LD_LIBRARY_PATH"] = bin;
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> a, e;
  for (std::string& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  for (std::string& s : envs) e.push_back(s.data());
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(MpsTest, TheFakeDriverIsAClientWithItsLimitsAndAnotherUsersClientWaitsItsTurn) {
  MpsDaemons d(kControl, root_, {{0, "GPU-zero"}});
  ASSERT_TRUE(d.Ensure(0).ok());
  fs::permissions(root_, fs::perms::others_exec, fs::perm_options::add);
  const std::string go = root_ + "/go";
  auto env = MpsClientEnv(d.PipeDir(0), 250, 1024, 1);
  // The pinned limit holds in the driver itself (no intercept library here).
  const pid_t first =
      Spawn({"link", "alloc:900", "alloc:200", "kernel", "waitfile:" + go}, env, root_ + "/first");
  const std::string log = d.LogDir(0) + "/control.log";
  ASSERT_TRUE(Eventually([&] { return Read(log).find("on server") != std::string::npos; }));
  EXPECT_THAT(Read(log), HasSubstr("uid " + std::to_string(getuid()) +
                                   " on server 100001 "
                                   "active_thread_percentage 25 pinned_mem_limit 0=1024M"));
  if (getuid() != 0) {
    // Another uid needs root; the rest is this user's (the one-user rule is the scheduler's
    // test too: Scheduler.AnMpsGpuServesOneUsersClientsAtATime).
    std::ofstream(go).close();
    EXPECT_EQ(Wait(first), 0);
    EXPECT_EQ(Read(root_ + "/first"), "ok\noom\nok\n");
    return;
  }
  // Another user's client waits for the first user's server to end, in cuInit, as MPS makes it.
  const std::string bin = root_ + "/bin";
  fs::create_directories(bin);
  fs::copy_file(TESSERA_CUDA_CLIENT, bin + "/cuda_client");
  fs::copy_file(TESSERA_TEST_FAKES_DIR "/cuda/libcuda.so.1", bin + "/libcuda.so.1");
  const std::string other_out = root_ + "/other";
  const pid_t other = Spawn({"link", "alloc:100", "kernel"}, MpsClientEnv(d.PipeDir(0), 0, 0, 1),
                            other_out, 65534, bin);
  // The first is killed mid-run (a crash): its server ends with it, and the waiting client is
  // served by a new server of its user.
  ASSERT_TRUE(Eventually([&] { return Read(root_ + "/first").find("ok\noom\nok\n") == 0; }));
  ASSERT_TRUE(Eventually([&] {
    return Read(log).find("uid 65534 waits: server 100001 runs for uid 0") != std::string::npos;
  }));
  EXPECT_EQ(Read(other_out), "") << "it waits while the other user's client lives";
  EXPECT_THAT(Read(log), Not(HasSubstr("uid 65534 on server")));
  kill(first, SIGKILL);
  Wait(first);
  EXPECT_EQ(Wait(other), 0);
  EXPECT_EQ(Read(other_out), "ok\nok\n");
  EXPECT_THAT(Read(log), HasSubstr("server 100001 of uid 0 ended"));
  EXPECT_THAT(Read(log), HasSubstr("uid 65534 on server 100002 active_thread_percentage 100"));
}

TEST_F(MpsTest, AClientWhoseDaemonDiedFailsItsNextLaunch) {
  MpsDaemons d(kControl, root_, {{0, "GPU-zero"}});
  ASSERT_TRUE(d.Ensure(0).ok());
  const std::string go = root_ + "/go";
  const pid_t client = Spawn({"link", "kernel", "waitfile:" + go, "kernel"},
                             MpsClientEnv(d.PipeDir(0), 500, 0, 1), root_ + "/out");
  ASSERT_TRUE(Eventually([&] { return Read(root_ + "/out") == "ok\n"; }));
  ASSERT_EQ(kill(DaemonPid(d, 0), SIGKILL), 0);
  ASSERT_TRUE(Eventually([&] { return !d.Check(0).ok(); }));
  std::ofstream(go).close();
  EXPECT_EQ(Wait(client), 0);
  EXPECT_EQ(Read(root_ + "/out"), "ok\nerr 805\n") << "CUDA_ERROR_MPS_CONNECTION_FAILED";
}

TEST_F(MpsTest, AClientsFatalFaultEndsItsServersOtherClientsAndIsCounted) {
  MpsDaemons d(kControl, root_, {{0, "GPU-zero"}});
  d.Start(std::chrono::milliseconds(10), nullptr);
  const auto env = MpsClientEnv(d.PipeDir(0), 500, 0, 1);
  const std::string hold = root_ + "/hold", go = root_ + "/go";
  // Two clients of one server; the bystander is held until after the fault.
  const pid_t bystander =
      Spawn({"link", "kernel", "waitfile:" + hold, "kernel"}, env, root_ + "/bystander");
  const pid_t faulty = Spawn({"link", "kernel", "waitfile:" + go, "fault"}, env, root_ + "/faulty");
  auto state = [&] { return d.States().at(0); };
  ASSERT_TRUE(Eventually([&] { return state().clients == 2; })) << "both on one server";
  EXPECT_EQ(state().server_faults, 0);
  // The fault: its kernel fails, its server ends under the bystander (counted), and the
  // bystander's next launch fails.
  std::ofstream(go).close();
  EXPECT_EQ(Wait(faulty), 0);
  EXPECT_EQ(Read(root_ + "/faulty"), "ok\nerr 700\n") << "CUDA_ERROR_ILLEGAL_ADDRESS";
  ASSERT_TRUE(Eventually([&] { return state().server_faults == 1; }))
      << "the bystander still runs: its server ended under it";
  std::ofstream(hold).close();
  EXPECT_EQ(Wait(bystander), 0);
  EXPECT_EQ(Read(root_ + "/bystander"), "ok\nerr 805\n") << "CUDA_ERROR_MPS_CONNECTION_FAILED";
  // A new client gets a new server; clients that end on their own end it with them: no fault.
  const pid_t calm = Spawn({"link", "kernel", "waitfile:" + go + "2"}, env, root_ + "/calm");
  ASSERT_TRUE(Eventually([&] { return state().clients == 1; }));
  std::ofstream(go + "2").close();
  EXPECT_EQ(Wait(calm), 0);
  EXPECT_EQ(Read(root_ + "/calm"), "ok\n");
  ASSERT_TRUE(Eventually([&] { return state().clients == 0; }));
  EXPECT_EQ(state().server_faults, 1);
  d.StopWatch(false);
}

}  // namespace
}  // namespace tessera::devices
