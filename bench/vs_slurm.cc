// What a user feels, side by side with Slurm on this machine, in one run: a one-node Slurm
// (Debian's slurm-wlm, started here as the Slurm tests start it, with no plugin) beside a tessera
// server (a simulated DGX H100), each command run as a user runs it (a new process each time,
// output to /dev/null), timed from fork to exit:
//   tessera run -- true            vs  srun true                  (p50, p99 of N)
//   tessera ls                     vs  squeue                     (p50, p99 of N)
//   tessera show ID                vs  scontrol show job ID       (p50, p99 of N)
//   8 shell loops of submits       vs  the same of sbatch         (wall time of all, submits/s)
//     (tessera submit --hold -- true / sbatch --hold --wrap true)
// Usage (root: Slurm's daemons and mknod): vs_slurm [--runs N] [--submits-per-loop M]
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../tests/capture.h"
#include "../tests/slurm/mini_slurm.h"
#include "fmt/format.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Runs `sh -c command` with `env` added, output to /dev/null; its wall time in ms (-1: failed).
double TimeOnce(const std::string& command) {
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? ms : -1;
}

struct Stats {
  double p50 = 0, p99 = 0;
  int failed = 0;
};

Stats TimeMany(const std::string& command, int runs) {
  std::vector<double> ms;
  Stats s;
  for (int i = 0; i < runs; ++i) {
    const double t = TimeOnce(command);
    if (t < 0) {
      ++s.failed;
    } else {
      ms.push_back(t);
    }
  }
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.p50 = ms[ms.size() / 2];
  s.p99 = ms[std::min(ms.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(ms.size())))];
  return s;
}

// `loops` shell loops at once, each `per_loop` times `command`: the wall time of all, in s.
double Loops(const std::string& command, int loops, int per_loop) {
  const std::string loop = fmt::format(
      "i=0; while [ $i -lt {} ]; do {} >/dev/null || exit 1; i=$((i+1)); done", per_loop, command);
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (int l = 0; l < loops; ++l) {
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", loop.c_str(), nullptr);
      _exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return ok ? s : -1;
}

void Row(const char* what, const Stats& t, const Stats& s) {
  fmt::print(
      "| {} | {:.1f} / {:.1f} ms | {:.1f} / {:.1f} ms | {:.2f}x |{}\n", what, t.p50, t.p99, s.p50,
      s.p99, s.p50 > 0 ? t.p50 / s.p50 : 0,
      t.failed + s.failed ? fmt::format(" ({} tessera, {} Slurm failed)", t.failed, s.failed) : "");
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 30, per_loop = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--runs") {
      runs = std::atoi(argv[i + 1]);
    } else if (a == "--submits-per-loop") {
      per_loop = std::atoi(argv[i + 1]);
    } else {
      fmt::print(stderr, "usage: vs_slurm [--runs N] [--submits-per-loop M]\n");
      return 2;
    }
  }
  if (const std::string why = tessera::slurm_test::MiniSlurm::Unavailable(); !why.empty()) {
    fmt::print(stderr, "vs_slurm: {}\n", why);
    return 1;
  }
  std::string tmpl = (fs::temp_directory_path() / "vs-slurm-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return 1;
  const std::string dir = tmpl;
  setenv("TEST_TMPDIR", dir.c_str(), 1);  // the Slurm's folder goes under it
  fmt::print(stderr, "starting a one-node Slurm and a tessera server under {}\n", dir);
  int code = 0;
  {
    tessera::slurm_test::MiniSlurm slurm({});
    if (!slurm.error().empty()) {
      fmt::print(stderr, "vs_slurm: Slurm did not start: {}\n", slurm.error());
      fs::remove_all(dir);
      return 1;
    }
    const std::string sock = dir + "/tessera.sock";
    std::ofstream(dir + "/server.yaml") << "allow_root_jobs: true\n";
    const pid_t server = fork();
    if (server == 0) {
      const int log = open((dir + "/server.log").c_str(), O_WRONLY | O_CREAT, 0600);
      dup2(log, 1);
      dup2(log, 2);
      execl(TESSERA_BINARY, "tessera", "server", "--socket", sock.c_str(), "--state-dir",
            (dir + "/state").c_str(), "--simulate", "dgx-h100", "-c",
            (dir + "/server.yaml").c_str(), nullptr);
      _exit(127);
    }
    const std::string t = fmt::format("TESSERA_SOCKET={} {} ", sock, TESSERA_BINARY);
    const std::string s = slurm.Env();
    for (int i = 0; i < 200 && TimeOnce(t + "ls") < 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // One job each to show.
    const std::string tid =
        tessera::test::Capture(t + "submit --hold -- true | grep -o '[0-9]*'").out;
    const std::string sid = tessera::test::Capture(s + "sbatch --parsable --hold --wrap true").out;
    fmt::print(stderr, "timing {} runs of each, tessera then Slurm\n", runs);
    fmt::print("| what a user types | Tessera p50 / p99 | Slurm p50 / p99 | ratio (p50) |\n");
    fmt::print("| --- | --- | --- | --- |\n");
    Row("`tessera run -- true` / `srun true`", TimeMany(t + "run -- true", runs),
        TimeMany(s + "srun true", runs));
    Row("`tessera ls` / `squeue`", TimeMany(t + "ls", runs), TimeMany(s + "squeue", runs));
    Row("`tessera show ID` / `scontrol show job ID`",
        TimeMany(t + "show " + tid.substr(0, tid.find('\n')), runs),
        TimeMany(s + "scontrol show job " + sid.substr(0, sid.find('\n')), runs));
    const int loops = 8, n = loops * per_loop;
    const double ts = Loops(t + "submit --hold -- true", loops, per_loop);
    const double ss = Loops(s + "sbatch --hold --wrap true", loops, per_loop);
    fmt::print(
        "| {} submits from {} shell loops (`submit --hold -- true` / `sbatch --hold --wrap "
        "true`) | {:.2f} s ({:.0f}/s) | {:.2f} s ({:.0f}/s) | {:.2f}x |\n",
        n, loops, ts, n / ts, ss, n / ss, ss > 0 ? ts / ss : 0);
    if (ts < 0 || ss < 0) code = 1;
    (void)TimeOnce(s + "scancel --user root");
    kill(server, SIGTERM);
    waitpid(server, nullptr, 0);
  }
  fs::remove_all(dir);
  return code;
}
