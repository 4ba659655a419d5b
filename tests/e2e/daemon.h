#pragma once
// The real `tessera server` binary as a test daemon: a temporary socket and state folder, a
// simulated machine, jobs confined in a cgroup subtree of the daemon's own; its API, its log and
// the CLI pointed at it. Shared by the end-to-end tests of the server and of its batch habits.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../capture.h"
#include "tessera/net/http.h"

extern char** environ;

namespace tessera::test {

using nlohmann::json;
using tessera::net::HttpClient;
namespace fs = std::filesystem;

// Removes the cgroup subtrees named `name` (a daemon's, see Daemon::Confinement: <name>/user-<uid>/
// job-<id> in each hierarchy, one per controller on cgroup v1) with whatever still runs in them:
// jobs outlive their server by design, not the test that started them. Every process of the
// subtree is killed first, then each folder is removed after its children, once its killed
// processes are gone (a cgroup with processes or children cannot be removed).
inline void RemoveCgroups(const std::string& name) {
  std::vector<fs::path> found;
  std::error_code ec;
  fs::recursive_directory_iterator it("/sys/fs/cgroup",
                                      fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    if (it->path().filename() == name) {
      found.push_back(it->path());
      it.disable_recursion_pending();
    } else if (it.depth() >= 3) {
      it.disable_recursion_pending();
    }
  }
  std::vector<fs::path> subtree;  // parents before their children
  for (const fs::path& base : found) {
    subtree.push_back(base);
    for (auto d = fs::recursive_directory_iterator(base, ec);
         !ec && d != fs::recursive_directory_iterator(); d.increment(ec)) {
      if (d->is_directory(ec)) subtree.push_back(d->path());
    }
  }
  for (const fs::path& dir : subtree) {
    std::ifstream procs(dir / "cgroup.procs");
    for (pid_t pid; procs >> pid;) kill(pid, SIGKILL);
  }
  for (auto d = subtree.rbegin(); d != subtree.rend(); ++d) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (rmdir(d->c_str()) != 0 && errno == EBUSY && std::chrono::steady_clock::now() < until) {
      std::ifstream procs(*d / "cgroup.procs");
      for (pid_t pid; procs >> pid;) kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

class Daemon {
 public:
  explicit Daemon(const std::string& name, const std::string& config_yaml = "",
                  const std::string& simulate = "t4x2") {
    dir_ = ::testing::TempDir() + "tessera-e2e-" + std::to_string(getpid()) + "-" + name;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    socket_ = dir_ + "/s.sock";
    config_ = dir_ + "/server.yaml";
    // The default poll interval: ended jobs are noticed through their pidfds, not by polling.
    // Tests run as root in CI: their jobs are root's unless a test says otherwise.
    std::ofstream(config_)
        << "preemption: {grace_period_s: 1}\n"
        << (config_yaml.find("allow_root_jobs") == std::string::npos ? "allow_root_jobs: true\n"
                                                                     : "")
        << config_yaml
        // Not the machine's podman (nor its /var/run/cdi) unless a test names one.
        << (config_yaml.find("containers:") == std::string::npos ? "containers: {podman: \"\"}\n"
                                                                 : "")
        << (config_yaml.find("confinement:") == std::string::npos ? Confinement() : "");
    simulate_ = simulate;
    Start();
  }
  ~Daemon() {
    Kill(SIGTERM);
    RemoveCgroups(fs::path(dir_).filename().string());
  }
  // Jobs confined as in production, in a subtree of this daemon's own (tests run in parallel).
  std::string Confinement() const {
    return "confinement: {cgroup: " + fs::path(dir_).filename().string() + "}\n";
  }

  void Start() {
    std::string log = dir_ + "/server.log";
    // No machine to simulate: the driver (the config names which NVML library).
    std::string cmd = std::string("exec setpriv --pdeathsig TERM ") + TESSERA_BINARY +
                      " server --socket " + socket_ + " --state-dir " + dir_ + "/state" +
                      (simulate_.empty() ? "" : " --simulate " + simulate_) + " -c " + config_ +
                      " >>" + log + " 2>&1";
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    ASSERT_EQ(posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ),
              0);
    for (int i = 0; i < 200; ++i) {
      HttpClient c(socket_);
      auto r = c.Send("GET", "/v1/health");
      if (r.ok() && r->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    FAIL() << "server did not come up; log:\n" << Log();
  }
  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string Log() const { return tessera::test::ReadFile(dir_ + "/server.log"); }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }

  json Call(const std::string& method, const std::string& target, const std::string& body = "",
            int* status = nullptr) {
    HttpClient c(socket_);
    auto r = c.Send(method, target, body);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return json();
    if (status) *status = r->status;
    return json::parse(r->body, nullptr, false);
  }
  int64_t Submit(const json& spec) {
    int status = 0;
    json j = Call("POST", "/v1/jobs", spec.dump(), &status);
    EXPECT_EQ(status, 201) << j.dump();
    return j.value("id", int64_t{0});
  }
  // Polls until the job is in `state`; its JSON.
  json WaitFor(int64_t id, const std::string& state, double seconds = 15) {
    json j;
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      j = Call("GET", "/v1/jobs/" + std::to_string(id));
      if (j.value("state", "") == state) return j;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    ADD_FAILURE() << "job " << id << " never became " << state << ": " << j.dump() << "\nlog:\n"
                  << Log();
    return j;
  }
  // Polls until the job's process exists (its pid is recorded): "running" is said just before
  // launch.
  void WaitForProcess(int64_t id) {
    json j = WaitFor(id, "running");
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (j["pid"].is_null() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      j = Call("GET", "/v1/jobs/" + std::to_string(id));
    }
    EXPECT_FALSE(j["pid"].is_null()) << j.dump();
  }
  std::string Logs(int64_t id, const std::string& stream = "stdout") {
    return Call("GET", "/v1/jobs/" + std::to_string(id) + "/logs?stream=" + stream)
        .value("data", "");
  }

 private:
  std::string dir_, socket_, config_, simulate_;
  pid_t pid_ = -1;
};

// A test server (more_config added to its config) whose GPU 0 is shared by MPS through the fake
// control daemon (tests/fakes/mps), checked every 50 ms. The daemon outlives the server by design
// (its clients are jobs a restart keeps), not the test: the server is stopped first (or its watch
// would start the daemon again), then the daemon told to quit.
class MpsServer {
 public:
  explicit MpsServer(const std::string& name, const std::string& more_config = "")
      : d(name,
          "mps: {gpus: [0], control: " + Control() + ", check_interval_s: 0.05}\n" + more_config),
        pipe(d.dir() + "/state/mps/gpu0/pipe"),
        log(d.dir() + "/state/mps/gpu0/log/control.log") {}
  ~MpsServer() {
    d.Kill(SIGTERM);
    tessera::test::Capture("echo quit | CUDA_MPS_PIPE_DIRECTORY=" + pipe + " " + Control());
  }
  static std::string Control() { return TESSERA_TEST_FAKES_DIR "/mps/nvidia-cuda-mps-control"; }
  pid_t DaemonPid() const {
    pid_t pid = 0;
    std::ifstream(pipe + "/nvidia-cuda-mps-control.pid") >> pid;
    return pid;
  }
  // Polls until a client is on a server of the daemon (the fake driver logs it there).
  void WaitForAClient() const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (tessera::test::ReadFile(log).find("on server") == std::string::npos &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  Daemon d;
  const std::string pipe, log;
};

inline json Shell(const std::string& script, json resources = json::object()) {
  return json{{"command", {"/bin/sh", "-c", script}}, {"resources", resources}};
}

inline std::string Cli(const Daemon& d, const std::string& args) {
  return tessera::test::Capture("TESSERA_SOCKET=" + d.socket() + " " + TESSERA_BINARY + " " + args +
                                " 2>&1")
      .out;
}

}  // namespace tessera::test
