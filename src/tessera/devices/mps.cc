#include "tessera/devices/mps.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"
#include "tessera/devices/program.h"

namespace tessera::devices {
namespace {

namespace fs = std::filesystem;

// Runs the control program to start a daemon (`-d`: it forks one into the background and
// returns), its output appended to `log`; waits for it to return, up to `wait`.
absl::Status StartDaemon(const std::string& control, const std::map<std::string, std::string>& env,
                         const std::string& log, std::chrono::milliseconds wait) {
  std::vector<std::string> env_text;
  std::vector<char*> envp;
  for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
  for (std::string& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = {control, "-d"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  // The server blocks SIGTERM in its threads: the daemon must not keep that (an admin's or
  // systemd's SIGTERM would not stop it).
  posix_spawnattr_t attr;
  CleanSignals(&attr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::FailedPreconditionError(fmt::format("cannot run {}: {}", control, strerror(rc)));
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  int status = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) return absl::InternalError(strerror(errno));
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return absl::DeadlineExceededError(
          fmt::format("{} -d did not return in {} ms", control, wait.count()));
    }
    usleep(5000);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(
        fmt::format("{} -d failed ({}); see {}", control,
                    WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                                      : fmt::format("signal {}", WTERMSIG(status)),
                    log));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<MpsGpu>> MpsGpusOf(const std::vector<std::string>& names,
                                              const core::NodeInventory& inventory) {
  std::vector<bool> in(inventory.gpus.size(), false);
  for (const std::string& name : names) {
    if (name == "all") {
      std::fill(in.begin(), in.end(), true);
      continue;
    }
    bool found = false;
    for (size_t i = 0; i < inventory.gpus.size(); ++i) {
      if (name == std::to_string(i) || name == inventory.gpus[i].uuid) {
        in[i] = found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(fmt::format(
          "mps.gpus: no GPU '{}' on this machine (it has {} GPU{}: give indices 0..{} or their "
          "UUIDs, as `tessera gpus` shows them)",
          name, inventory.gpus.size(), inventory.gpus.size() == 1 ? "" : "s",
          static_cast<int>(inventory.gpus.size()) - 1));
    }
  }
  std::vector<MpsGpu> out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i]) out.push_back({static_cast<int>(i), inventory.gpus[i].uuid});
  }
  return out;
}

MpsDaemons::MpsDaemons(std::string control, std::string root, std::vector<MpsGpu> gpus)
    : control_(std::move(control)), root_(std::move(root)), gpus_(std::move(gpus)) {
  core::MutexLock lock(mu_);
  for (const MpsGpu& g : gpus_) states_[g.index].gpu = g.index;
}

MpsDaemons::~MpsDaemons() { StopWatch(false); }

const MpsGpu* MpsDaemons::Find(int gpu) const {
  for (const MpsGpu& g : gpus_) {
    if (g.index == gpu) return &g;
  }
  return nullptr;
}

bool MpsDaemons::Has(int gpu) const { return Find(gpu) != nullptr; }

std::string MpsDaemons::PipeDir(int gpu) const { return fmt::format("{}/gpu{}/pipe", root_, gpu); }
std::string MpsDaemons::LogDir(int gpu) const { return fmt::format("{}/gpu{}/log", root_, gpu); }

std::map<std::string, std::string> MpsDaemons::Env(int gpu) const {
  std::map<std::string, std::string> env;
  const char* path = getenv("PATH");
  env["PATH"] = path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  env["CUDA_MPS_PIPE_DIRECTORY"] = PipeDir(gpu);
  env["CUDA_MPS_LOG_DIRECTORY"] = LogDir(gpu);
  if (const MpsGpu* g = Find(gpu)) env["CUDA_VISIBLE_DEVICES"] = g->uuid;
  // The fake driver of the tests reads its devices from here; the real one ignores it.
  if (const char* fake = getenv("FAKE_NVML_CONFIG")) env["FAKE_NVML_CONFIG"] = fake;
  return env;
}

absl::StatusOr<ProgramOutput> MpsDaemons::Ask(int gpu, const std::string& command,
                                              std::chrono::milliseconds timeout) const {
  const std::string control = LookUp(control_);
  if (control.empty()) {
    return absl::FailedPreconditionError(
        fmt::format("the MPS control program '{}' is not found", control_));
  }
  ProgramRun run;
  run.input = command + "\n";
  run.env = Env(gpu);
  run.timeout = timeout;
  return RunCapture({control}, run);
}

absl::StatusOr<std::string> MpsDaemons::ServerList(int gpu) const {
  if (!Has(gpu)) return absl::NotFoundError(fmt::format("GPU {} is not in MPS mode", gpu));
  auto out = Ask(gpu, "get_server_list", std::chrono::seconds(5));
  if (!out.ok()) return out.status();
  if (out->status != 0) {
    return absl::UnavailableError(
        fmt::format("its control daemon does not answer (exit {}: {})", out->status,
                    FirstLine(out->text).empty() ? "no output" : FirstLine(out->text)));
  }
  return out->text;
}

absl::Status MpsDaemons::Check(int gpu) const { return ServerList(gpu).status(); }

absl::Status MpsDaemons::Ensure(int gpu, std::chrono::milliseconds wait) {
  if (!Has(gpu)) return absl::NotFoundError(fmt::format("GPU {} is not in MPS mode", gpu));
  if (Check(gpu).ok()) return absl::OkStatus();
  const std::string control = LookUp(control_);
  if (control.empty()) {
    return absl::FailedPreconditionError(
        fmt::format("the MPS control program '{}' is not found", control_));
  }
  // Its clients reach it through a unix socket in the pipe folder (sun_path: 108 bytes with the
  // terminating zero); a longer path would fail in every client, not here.
  if (const size_t len = (PipeDir(gpu) + "/control").size(); len > 107) {
    return absl::FailedPreconditionError(
        fmt::format("its pipe folder {} is too long for a unix socket ({} bytes with /control, "
                    "107 at most): give the server a shorter state_dir",
                    PipeDir(gpu), len));
  }
  std::error_code ec;
  for (const std::string& dir : {PipeDir(gpu), LogDir(gpu)}) {
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(fmt::format("cannot make {}: {}", dir, ec.message()));
    }
    // Clients of every user connect through the pipe folder; the log is the admin's to read.
    chmod(dir.c_str(), 0755);
  }
  // ...and reach it through every folder above it.
  for (fs::path p = fs::path(PipeDir(gpu)).parent_path(); p.has_relative_path();
       p = p.parent_path()) {
    struct stat st;
    if (stat(p.c_str(), &st) == 0 && (st.st_mode & S_IXOTH) == 0) {
      spdlog::warn(
          "MPS: {} (mode {:o}) is closed to other users: their MPS jobs cannot reach GPU {}'s "
          "daemon (give the state folder mode 0711 or 0755)",
          p.string(), st.st_mode & 07777, gpu);
      break;
    }
  }
  {
    core::MutexLock lock(mu_);
    ++states_[gpu].starts;
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  if (absl::Status st = StartDaemon(control, Env(gpu), LogDir(gpu) + "/tessera-start.log", wait);
      !st.ok())
    return st;
  absl::Status last;
  while (!(last = Check(gpu)).ok()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          fmt::format("started, but {} ms later {}", wait.count(), std::string(last.message())));
    }
    usleep(10000);
  }
  spdlog::info("MPS: GPU {}'s control daemon runs (pipes in {})", gpu, PipeDir(gpu));
  return absl::OkStatus();
}

absl::Status MpsDaemons::Stop(int gpu) {
  if (!Has(gpu)) return absl::NotFoundError(fmt::format("GPU {} is not in MPS mode", gpu));
  if (!Check(gpu).ok()) return absl::OkStatus();
  auto out = Ask(gpu, "quit", std::chrono::seconds(10));
  if (!out.ok()) return out.status();
  if (out->status != 0) {
    return absl::InternalError(
        fmt::format("quit failed (exit {}: {})", out->status, FirstLine(out->text)));
  }
  spdlog::info("MPS: GPU {}'s control daemon told to quit", gpu);
  return absl::OkStatus();
}

void MpsDaemons::WatchServers(int gpu, const std::string& server_list) {
  std::map<long, std::vector<long>> now;
  std::istringstream servers(server_list);
  for (long id = 0; servers >> id;) {
    auto clients = Ask(gpu, "get_client_list " + std::to_string(id), std::chrono::seconds(5));
    std::vector<long>& pids = now[id];
    if (!clients.ok() || clients->status != 0) continue;
    std::istringstream in(clients->text);
    for (long pid = 0; in >> pid;) pids.push_back(pid);
  }
  // A live process, not one that has exited and waits to be reaped.
  auto running = [](long pid) {
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z' &&
           text[close + 2] != 'X';
  };
  core::MutexLock lock(mu_);
  std::map<long, std::vector<long>>& before = servers_[gpu];
  for (const auto& [id, pids] : before) {
    if (now.contains(id)) continue;
    std::vector<long> alive;
    for (long pid : pids) {
      if (running(pid)) alive.push_back(pid);
    }
    if (alive.empty()) continue;  // ended with its last client
    ++states_[gpu].server_faults;
    spdlog::warn(
        "MPS: GPU {}: server {} ended while its clients {} still ran: a fatal fault in one client "
        "ends its server and the other clients on it",
        gpu, id, fmt::join(alive, ","));
  }
  states_[gpu].clients = 0;
  for (const auto& [id, pids] : now) states_[gpu].clients += static_cast<int>(pids.size());
  before = std::move(now);
}

void MpsDaemons::Round() {
  for (const MpsGpu& g : gpus_) {
    const absl::StatusOr<std::string> servers = ServerList(g.index);
    absl::Status st = servers.status();
    bool was_up, reported;
    {
      core::MutexLock lock(mu_);
      was_up = states_[g.index].up;
      reported = states_[g.index].reported;
    }
    if (st.ok() && was_up) {
      WatchServers(g.index, *servers);
      continue;
    }
    // Down (to be) said: it died since the last round, or it was not running when the watch
    // began (a server started after a reboot, or after the daemon died while it was down: clients
    // recovered with their jobs lost their server). Said once, with what starting it again gave.
    std::string down;
    if (!st.ok()) {
      const std::string gone(st.message());
      st = Ensure(g.index);
      if (was_up) {
        down = "the MPS control daemon stopped: " + gone;
        spdlog::warn("MPS: GPU {}: {}; {}", g.index, down,
                     st.ok() ? "started again" : "it cannot be started again");
      } else if (!reported) {
        down = st.ok() ? "the MPS control daemon was not running: " + gone
                       : "the MPS control daemon cannot be started: " + std::string(st.message());
      }
    }
    {
      core::MutexLock lock(mu_);
      MpsDaemonState& s = states_[g.index];
      servers_.erase(g.index);  // a new daemon: the old one's servers went with it
      if (was_up) ++s.deaths;
      s.up = st.ok();
      const std::string why =
          st.ok() ? "" : "the MPS control daemon cannot be started: " + std::string(st.message());
      if (!st.ok() && s.reason != why) spdlog::error("MPS: GPU {}: {}", g.index, why);
      s.reason = why;
      s.reported = true;
    }
    if (!changed_) continue;
    if (!down.empty()) changed_(g.index, false, down);
    if (st.ok()) changed_(g.index, true, "");
  }
}

std::vector<int> MpsDaemons::QuitLeftBehind() {
  std::vector<int> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    int gpu = -1;
    if (name.rfind("gpu", 0) != 0) continue;
    const char* first = name.data() + 3;
    const auto [end, err] = std::from_chars(first, name.data() + name.size(), gpu);
    if (err != std::errc() || end != name.data() + name.size() || gpu < 0 || Has(gpu)) continue;
    if (LookUp(control_).empty()) break;
    // Its pipe and log folders; no GPU named (none is in MPS mode now).
    auto quit = Ask(gpu, "quit", std::chrono::seconds(10));
    if (quit.ok() && quit->status == 0) {
      spdlog::info("MPS: GPU {} is no longer in MPS mode: its control daemon was told to quit",
                   gpu);
      out.push_back(gpu);
    }
    fs::remove_all(e.path(), ec);
  }
  return out;
}

void MpsDaemons::Start(std::chrono::milliseconds interval, Changed changed) {
  interval_ = interval;
  changed_ = std::move(changed);
  Round();
  watch_ = std::thread([this] {
    for (;;) {
      {
        core::MutexLock lock(mu_);
        if (lock.WaitFor(wake_, interval_,
                         [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; }))
          return;
      }
      Round();
    }
  });
}

void MpsDaemons::StopWatch(bool quit) {
  {
    core::MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watch_.joinable()) watch_.join();
  if (!quit) return;
  for (const MpsGpu& g : gpus_) {
    if (absl::Status st = Stop(g.index); !st.ok())
      spdlog::warn("MPS: GPU {}'s control daemon: {}", g.index, std::string(st.message()));
  }
}

std::vector<MpsDaemonState> MpsDaemons::States() const {
  core::MutexLock lock(mu_);
  std::vector<MpsDaemonState> out;
  for (const auto& [gpu, s] : states_) out.push_back(s);
  return out;
}

std::map<std::string, std::string> MpsClientEnv(const std::string& pipe_dir, int share_milli,
                                                int64_t memory_mib, int ordinals, int priority) {
  std::map<std::string, std::string> env;
  env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir;
  env["CUDA_MPS_CLIENT_PRIORITY"] = priority < 0 ? "1" : "0";
  // Whole percent, rounded up so that a share is never given less than it asked (1..100).
  const int pct = share_milli > 0 ? std::clamp((share_milli + 9) / 10, 1, 100) : 100;
  env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = std::to_string(pct);
  if (memory_mib > 0) {
    std::string limits;
    for (int o = 0; o < ordinals; ++o)
      limits += fmt::format("{}{}={}M", o == 0 ? "" : ",", o, memory_mib);
    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = limits;
  }
  return env;
}

}  // namespace tessera::devices
