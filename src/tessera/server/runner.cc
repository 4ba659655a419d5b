#include "tessera/server/runner.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "fmt/format.h"
#include "tessera/server/signal_safe.h"
#include "tessera/shim/region.h"

namespace tessera::server {
namespace {

std::string Join(const std::vector<std::string>& v, char sep) {
  std::string out;
  for (const std::string& s : v) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

// What the child reports through the exec pipe when it cannot start the job.
struct ChildError {
  int step;  // 0 chdir, 1 open stdout, 2 open stderr, 3 setgid, 4 setuid, 5 exec, 6 cgroup,
             // 7 open the user's stdout file, 8 its stderr file, 9 private /tmp and /dev/shm
  int err;
};

// Every catchable signal back to its default action and an empty signal mask. Async-signal-safe
// (system calls only), for use between fork and exec.
void ResetSignals() {
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    if (sigaction(sig, &dfl, nullptr) == 0) continue;
    // glibc refuses the signals it keeps for itself (32 and 33, for thread cancellation and
    // set*id), yet an ignored disposition of those survives exec too: ask the kernel directly. Its
    // struct starts with the handler; all else zero (no flags, no restorer, empty mask).
    unsigned long kernel_action[4] = {reinterpret_cast<unsigned long>(SIG_DFL), 0, 0, 0};
    syscall(SYS_rt_sigaction, sig, kernel_action, nullptr, sizeof(unsigned long));
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

constexpr const char* kSteps[] = {"cannot enter the working directory",
                                  "cannot open the stdout log",
                                  "cannot open the stderr log",
                                  "cannot switch group",
                                  "cannot switch user",
                                  "cannot execute",
                                  "cannot enter its cgroup",
                                  "cannot open its stdout file",
                                  "cannot open its stderr file",
                                  "cannot make its private /tmp and /dev/shm"};

}  // namespace

std::map<std::string, std::string> JobEnvironment(const LaunchSpec& spec) {
  std::map<std::string, std::string> env = spec.env;
  if (!env.contains("PATH")) env["PATH"] = "/usr/local/bin:/usr/bin:/bin";
  std::string devices = spec.gpu_uuids.empty() ? "" : Join(spec.gpu_uuids, ',');
  // Empty means "no GPU" to CUDA; NVIDIA's container tooling wants "void" for that.
  env["CUDA_VISIBLE_DEVICES"] = devices;
  env["NVIDIA_VISIBLE_DEVICES"] = devices.empty() ? "void" : devices;
  env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  env["TESSERA_JOB_ID"] = std::to_string(spec.job_id);
  if (spec.share) {
    std::string preload = spec.share->library;
    if (auto it = env.find("LD_PRELOAD"); it != env.end() && !it->second.empty()) {
      preload += ":" + it->second;
    }
    env["LD_PRELOAD"] = preload;
    env["TESSERA_CUDA_REGION"] = spec.share->region;
    if (spec.share->memory_bytes > 0)
      env["TESSERA_CUDA_MEM_LIMIT"] = std::to_string(spec.share->memory_bytes);
    if (spec.share->context_overhead_bytes > 0) {
      env["TESSERA_CUDA_CONTEXT_OVERHEAD"] = std::to_string(spec.share->context_overhead_bytes);
    }
    if (!spec.share->arbiter.empty() && spec.share->share_milli > 0) {
      env["TESSERA_CUDA_ARBITER"] = spec.share->arbiter;
      // One per CUDA ordinal of the job; two or more make its slices on them one gang.
      env["TESSERA_CUDA_ARBITER_GPUS"] =
          fmt::format("{}", fmt::join(spec.share->physical_gpus, ","));
      env["TESSERA_CUDA_PRIORITY"] = std::to_string(spec.share->priority);
      // In percent: a bare "1" (1000 milli as a fraction) would read as 1%.
      env["TESSERA_CUDA_COMPUTE_SHARE"] = fmt::format("{:g}%", spec.share->share_milli / 10.0);
    }
  }
  return env;
}

std::vector<gid_t> AccountGroups(uid_t uid, std::optional<gid_t> primary) {
  std::vector<gid_t> groups;
  passwd pw;
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return groups;
  const gid_t gid = primary.value_or(pw.pw_gid);
  int n = 64;
  groups.resize(static_cast<size_t>(n));
  if (getgrouplist(pw.pw_name, gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n));
    getgrouplist(pw.pw_name, gid, groups.data(), &n);
  }
  groups.resize(static_cast<size_t>(std::max(n, 0)));
  return groups;
}

namespace {

// Set by SIGALRM in a shepherd whose tasks' grace period is over.
volatile sig_atomic_t grace_over = 0;
void OnGraceOver(int) { grace_over = 1; }

// Writes "tessera: job <id>: task <rank> ended with code <code>..." to the log `log` (task 0's
// stderr, where the user looks first; else fd 2), with system calls only.
void SayTaskFailed(const char* log, const char* prefix, int rank, int code, const char* suffix) {
  char buf[256];
  size_t n = 0;
  auto put = [&](const char* t) {
    while (*t && n < sizeof buf) buf[n++] = *t++;
  };
  auto num = [&](int v) {
    if (n + kDecimalMax <= sizeof buf) n += WriteDecimal(v, buf + n);
  };
  put(prefix);
  put(": task ");
  num(rank);
  put(" ended with code ");
  num(code);
  put(suffix);
  int fd = *log ? open(log, O_WRONLY | O_APPEND | O_CLOEXEC) : -1;
  ssize_t w = write(fd >= 0 ? fd : 2, buf, n);
  (void)w;
  if (fd >= 0) close(fd);
}

// Everything a launch's child needs, made before the fork: after it, the child makes only
// async-signal-safe calls (the server is multi-threaded), so it reads this and allocates nothing.
struct Prepared {
  size_t ntasks = 1;
  // Per task: its environment (strings and the envp pointing at them), its logs and the user's
  // own output files (one task: the job's).
  std::vector<std::vector<std::string>> env;
  std::vector<std::vector<char*>> envp;
  std::vector<const char*> out, err, user_out, user_err;
  std::vector<std::string> args;  // argv's strings
  std::vector<char*> argv;
  std::vector<std::string> candidates;  // where the program may be, in the job's PATH's order
  std::vector<gid_t> groups;            // the user's supplementary groups
  std::vector<const char*> cgroup_files;
  std::string exit_tmp;
  char prefix[64] = {};          // "tessera: job N", for the shepherd's messages
  std::vector<pid_t> task_pids;  // the shepherd's tasks (sized before the fork)
  // Logs through the shepherd (LaunchSpec::max_log_bytes): per task, the pipes' ends for stdout
  // and stderr (-1: none, the task opens its log itself), and the shepherd's log descriptors.
  uint64_t log_cap = 0;
  std::vector<int> out_r, out_w, err_r, err_w;
  std::vector<pollfd> polls;  // sized before the fork: 2 per task
  std::vector<int> log_fds;   // the log each poll entry copies to
  PreparedMounts mounts;      // its private /tmp and /dev/shm (LaunchSpec::private_dirs)
};

// Fills `p` for `spec` (p is filled in place: its pointers point into itself).
void Prepare(const LaunchSpec& spec, Prepared& p) {
  std::map<std::string, std::string> env = spec.env_as_is ? spec.env : JobEnvironment(spec);
  p.ntasks = std::max<size_t>(spec.tasks.size(), 1);
  p.env.resize(p.ntasks);
  p.envp.resize(p.ntasks);
  p.out.resize(p.ntasks), p.err.resize(p.ntasks);
  p.user_out.resize(p.ntasks), p.user_err.resize(p.ntasks);
  for (size_t t = 0; t < p.ntasks; ++t) {
    std::map<std::string, std::string> e = env;
    const bool own = t < spec.tasks.size();
    if (own) {
      for (const auto& [k, v] : spec.tasks[t].env) e[k] = v;
    }
    for (const auto& [k, v] : e) p.env[t].push_back(k + "=" + v);
    for (std::string& s : p.env[t]) p.envp[t].push_back(s.data());
    p.envp[t].push_back(nullptr);
    p.out[t] = own ? spec.tasks[t].stdout_path.c_str() : spec.stdout_path.c_str();
    p.err[t] = own ? spec.tasks[t].stderr_path.c_str() : spec.stderr_path.c_str();
    p.user_out[t] = own ? spec.tasks[t].user_stdout.c_str() : spec.user_stdout.c_str();
    p.user_err[t] = own ? spec.tasks[t].user_stderr.c_str() : spec.user_stderr.c_str();
  }
  snprintf(p.prefix, sizeof p.prefix, "tessera: job %lld", static_cast<long long>(spec.job_id));
  p.args = spec.argv;
  for (std::string& s : p.args) p.argv.push_back(s.data());
  p.argv.push_back(nullptr);
  // execvpe searches the PATH of the calling process; search the job's PATH ourselves.
  const std::string& program = spec.argv[0];
  if (program.find('/') != std::string::npos) {
    p.candidates.push_back(program);
  } else {
    const std::string& path = env["PATH"];
    size_t start = 0;
    while (start <= path.size()) {
      size_t colon = path.find(':', start);
      std::string dir = path.substr(start, colon == std::string::npos ? colon : colon - start);
      p.candidates.push_back((dir.empty() ? "." : dir) + "/" + program);
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  // The user's supplementary groups (their data may be readable through one), looked up before the
  // fork; only the primary group when the account can no longer be looked up (never the server's).
  if (spec.uid && spec.gid) {
    p.groups = AccountGroups(*spec.uid, *spec.gid);
    if (p.groups.empty()) p.groups.push_back(*spec.gid);
  }
  for (const std::string& f : spec.cgroup_procs) p.cgroup_files.push_back(f.c_str());
  p.exit_tmp = spec.exit_path.empty() ? "" : spec.exit_path + ".tmp";
  p.log_cap = spec.exit_path.empty() ? 0 : spec.max_log_bytes;
  p.out_r.assign(p.ntasks, -1), p.out_w.assign(p.ntasks, -1);
  p.err_r.assign(p.ntasks, -1), p.err_w.assign(p.ntasks, -1);
  p.polls.assign(2 * p.ntasks, pollfd{-1, 0, 0});
  p.log_fds.assign(2 * p.ntasks, -1);
  if (spec.private_dirs) {
    // What the job names under /tmp or /dev/shm stays where it is in its own.
    PrivateDirs dirs = *spec.private_dirs;
    dirs.keep.push_back(spec.workdir.empty() ? std::string(".") : spec.workdir);
    auto at_workdir = [&](const std::string& f) {
      return f.empty() || f[0] == '/' || spec.workdir.empty() ? f : spec.workdir + "/" + f;
    };
    for (size_t t = 0; t < p.ntasks; ++t) {
      for (const char* f : {p.user_out[t], p.user_err[t]})
        if (*f) dirs.keep.push_back(at_workdir(f));
    }
    if (spec.share)
      dirs.keep.insert(dirs.keep.end(),
                       {spec.share->library, spec.share->region, spec.share->arbiter});
    if (auto f = spec.env.find("TESSERA_RESIZE_FILE"); f != spec.env.end())
      dirs.keep.push_back(f->second);
    for (std::string& k : dirs.keep) {
      if (!k.empty() && k[0] != '/') k = std::filesystem::absolute(k).string();
    }
    p.mounts = PrepareMounts(dirs);
  }
}

// In the shepherd, before its tasks are forked: a pipe for each log a task writes (they are
// O_CLOEXEC: a task keeps only its own write ends, as its stdout and stderr).
bool MakeLogPipes(Prepared& p) {
  for (size_t t = 0; t < p.ntasks; ++t) {
    int fds[2];
    if (*p.out[t]) {
      if (pipe2(fds, O_CLOEXEC) != 0) return false;
      p.out_r[t] = fds[0], p.out_w[t] = fds[1];
    }
    if (*p.err[t]) {
      if (pipe2(fds, O_CLOEXEC) != 0) return false;
      p.err_r[t] = fds[0], p.err_w[t] = fds[1];
    }
  }
  return true;
}

// The shepherd's copy of its tasks' output into their logs, at most p.log_cap bytes in all (the
// logs' sizes when it began count). Async-signal-safe calls only.
class LogCopy {
 public:
  explicit LogCopy(Prepared& p) : p_(p) {
    for (size_t t = 0; t < p.ntasks; ++t) {
      Add(p.out_r[t], p.out[t]);
      Add(p.err_r[t], p.err[t]);
      if (p.out_w[t] >= 0) close(p.out_w[t]);
      if (p.err_w[t] >= 0) close(p.err_w[t]);
    }
  }
  bool active() const { return open_ > 0; }
  // Copies what is there, waiting at most `ms` for some.
  void Pump(int ms) {
    if (open_ == 0) return;
    if (poll(p_.polls.data(), n_, ms) <= 0) return;
    for (size_t i = 0; i < n_; ++i) {
      pollfd& f = p_.polls[i];
      if (f.fd < 0 || f.revents == 0) continue;
      const ssize_t got = read(f.fd, buf_, sizeof buf_);
      if (got > 0) {
        Write(i, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(f.fd);
        f.fd = -1;
        --open_;
      }
    }
  }
  // After the tasks ended: what is left in the pipes, for at most about a second (a process the
  // job left behind may keep a pipe open; the job's cgroup ends it).
  void Finish() {
    for (int i = 0; i < 20 && open_ > 0; ++i) Pump(50);
  }

 private:
  void Add(int fd, const char* path) {
    if (fd < 0) return;
    const int log = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600);
    struct stat st;
    if (log >= 0 && fstat(log, &st) == 0) {
      bool seen = false;  // tasks sharing a log count its size once
      for (size_t i = 0; i < n_; ++i) {
        struct stat o;
        if (p_.log_fds[i] >= 0 && fstat(p_.log_fds[i], &o) == 0 && o.st_ino == st.st_ino &&
            o.st_dev == st.st_dev)
          seen = true;
      }
      if (!seen) written_ += static_cast<uint64_t>(st.st_size);
    }
    p_.polls[n_] = pollfd{fd, POLLIN, 0};
    p_.log_fds[n_] = log;
    ++n_, ++open_;
  }
  void Write(size_t i, size_t len) {
    const int log = p_.log_fds[i];
    if (log < 0 || said_) return;
    size_t keep = len;
    if (written_ + len > p_.log_cap) keep = written_ < p_.log_cap ? p_.log_cap - written_ : 0;
    for (size_t off = 0; off < keep;) {
      const ssize_t w = write(log, buf_ + off, keep - off);
      if (w <= 0) break;  // a full disk: dropped, the job goes on
      off += static_cast<size_t>(w);
    }
    written_ += keep;
    if (keep == len) return;
    said_ = true;  // the cap: said once, at the end of the log that crossed it
    char line[160];
    size_t n = 0;
    auto put = [&](const char* t) {
      while (*t && n < sizeof line) line[n++] = *t++;
    };
    put("\n");
    put(p_.prefix);
    put(": its logs reached limits.max_log_bytes_per_job; what it wrote past it is dropped\n");
    ssize_t w = write(log, line, n);
    (void)w;
  }
  Prepared& p_;
  size_t n_ = 0, open_ = 0;
  uint64_t written_ = 0;
  bool said_ = false;
  char buf_[65536];
};

// In the child: tells the parent which step failed (and errno) through the exec-error pipe.
[[noreturn]] void Fail(int pipe_fd, int step) {
  ChildError ce{step, errno};
  ssize_t w = write(pipe_fd, &ce, sizeof ce);
  (void)w;
  _exit(127);
}

// In the shepherd (the group leader, the tasks' parent): waits for every task, stops the others
// when one fails (kill_on_task_failure; SIGKILL after task_grace_s), and records the job's exit
// code in exit_path (atomically) before exiting with it. Async-signal-safe calls only.
[[noreturn]] void Shepherd(const LaunchSpec& spec, Prepared& p, std::vector<pid_t>& pids,
                           int pipe_fd) {
  close(pipe_fd);  // the shepherd needs not even the exec-error pipe: only its log pipes
  LogCopy logs(p);
  int code = 0;
  bool failed = false;
  size_t left = p.ntasks;
  struct sigaction alarm_action = {};
  alarm_action.sa_handler = OnGraceOver;  // no SA_RESTART: waitpid returns EINTR
  sigemptyset(&alarm_action.sa_mask);
  sigaction(SIGALRM, &alarm_action, nullptr);
  while (left > 0) {
    int status = 0;
    // Copying the tasks' output meanwhile (a blocking wait when there is none to copy).
    pid_t ended = waitpid(-1, &status, logs.active() ? WNOHANG : 0);
    if (ended == 0) {
      logs.Pump(50);
      if (grace_over) {
        grace_over = 0;
        for (size_t k = 0; k < p.ntasks; ++k) {
          if (pids[k] > 0) kill(pids[k], SIGKILL);
        }
      }
      continue;
    }
    if (ended < 0) {
      if (errno != EINTR) break;
      if (grace_over) {
        for (size_t k = 0; k < p.ntasks; ++k) {
          if (pids[k] > 0) kill(pids[k], SIGKILL);
        }
      }
      continue;
    }
    size_t rank = p.ntasks;
    for (size_t k = 0; k < p.ntasks; ++k) {
      if (pids[k] == ended) rank = k;
    }
    if (rank == p.ntasks) continue;  // not a task (an orphan adopted as subreaper: none)
    pids[rank] = 0;
    --left;
    int c = WIFEXITED(status)     ? WEXITSTATUS(status)
            : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                  : 255;
    if (c != 0 && !failed) {
      failed = true;
      code = c;
      if (p.ntasks > 1 && spec.kill_on_task_failure && left > 0) {
        SayTaskFailed(p.err[0], p.prefix, static_cast<int>(rank), c,
                      "; stopping the other tasks\n");
        // The whole group (what the tasks started too); the shepherd ignores SIGTERM.
        kill(0, SIGTERM);
        alarm(static_cast<unsigned>(std::max(spec.task_grace_s, 1)));
      } else if (p.ntasks > 1) {
        SayTaskFailed(p.err[0], p.prefix, static_cast<int>(rank), c, "\n");
      }
    }
  }
  logs.Finish();
  char digits[kDecimalMax + 1];
  size_t n = WriteDecimal(code, digits);
  digits[n++] = '\n';
  int fd = open(p.exit_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ssize_t w = write(fd, digits, n);
    (void)w;
    fsync(fd);
    close(fd);
    rename(p.exit_tmp.c_str(), spec.exit_path.c_str());
  }
  _exit(code);
}

// In a task's process: its stdio, the user's groups, gid and uid, the working directory (as the
// user), the user's own output files (as the user), then exec. A failed step goes to `pipe_fd`.
[[noreturn]] void ExecTask(const LaunchSpec& spec, Prepared& p, size_t me, int pipe_fd) {
  int in = open("/dev/null", O_RDONLY);
  if (in >= 0) dup2(in, 0);
  if (p.out_w[me] >= 0) {
    if (dup2(p.out_w[me], 1) < 0) Fail(pipe_fd, 1);
  } else if (*p.out[me]) {
    int fd = open(p.out[me], O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0) Fail(pipe_fd, 1);
    dup2(fd, 1);
  }
  if (p.err_w[me] >= 0) {
    if (dup2(p.err_w[me], 2) < 0) Fail(pipe_fd, 2);
  } else if (*p.err[me]) {
    int fd = open(p.err[me], O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0) Fail(pipe_fd, 2);
    dup2(fd, 2);
  }
  // Its own /tmp and /dev/shm, while it may still mount: after its logs are open (they may be
  // under /tmp), before it becomes its user.
  if (!EnterPrivateDirs(p.mounts)) Fail(pipe_fd, 9);
  if (spec.gid && (setgroups(p.groups.size(), p.groups.data()) != 0 || setgid(*spec.gid) != 0))
    Fail(pipe_fd, 3);
  if (spec.uid && setuid(*spec.uid) != 0) Fail(pipe_fd, 4);
  // As the user: the working directory is entered with the user's rights, not root's (entering it
  // as root told a user which root-only paths exist, and let a job start in one).
  if (!spec.workdir.empty() && chdir(spec.workdir.c_str()) != 0) Fail(pipe_fd, 0);
  // The user's own output files, as the user (never a file the user could not open): a name a
  // job chose must not reach what only the server may write.
  if (*p.user_out[me]) {
    int fd = open(p.user_out[me], O_WRONLY | O_CREAT | O_APPEND | O_NOCTTY, 0644);
    if (fd < 0) Fail(pipe_fd, 7);
    dup2(fd, 1);
    if (fd != 1) close(fd);
  }
  if (*p.user_err[me]) {
    int fd = open(p.user_err[me], O_WRONLY | O_CREAT | O_APPEND | O_NOCTTY, 0644);
    if (fd < 0) Fail(pipe_fd, 8);
    dup2(fd, 2);
    if (fd != 2) close(fd);
  }
  int last_errno = ENOENT;
  for (const std::string& c : p.candidates) {
    execve(c.c_str(), p.argv.data(), p.envp[me].data());
    if (errno != ENOENT) last_errno = errno;
  }
  errno = last_errno;
  Fail(pipe_fd, 5);
}

// In the forked child: the job's process group and cgroups, clean signals, then the shepherd and
// its tasks (with an exit path) or the one task itself.
[[noreturn]] void Child(const LaunchSpec& spec, Prepared& p, int pipe_fd) {
  // Nothing of the server's (its listening sockets, the database) stays open in the child past
  // this line, not only from its exec on: a server killed while this child is still starting
  // (cgroup writes, forks: long on a loaded machine) must be able to start again at once, and a
  // socket held here made the next server find one "already listening".
  if (pipe_fd > 3) close_range(3, static_cast<unsigned>(pipe_fd) - 1, 0);
  close_range(static_cast<unsigned>(pipe_fd) + 1, ~0U, 0);
  setpgid(0, 0);
  // Into the job's cgroups first, so that the shepherd and everything the job starts are
  // confined and counted. "0" is the writer itself, in cgroup2 and in cgroup1 alike.
  for (const char* file : p.cgroup_files) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) Fail(pipe_fd, 6);
    if (write(fd, "0", 1) != 1) Fail(pipe_fd, 6);
    close(fd);
  }
  // The server blocks SIGTERM/SIGINT (it takes them with sigwait) and ignores SIGPIPE; both a
  // mask and ignored dispositions survive exec, so a job would never see the SIGTERM that asks it
  // to stop. Start from a clean slate: every signal default, none blocked.
  ResetSignals();
  if (spec.exit_path.empty()) ExecTask(spec, p, 0, pipe_fd);
  // The shepherd: the group leader, waiting for the job (its child) to record how it ended. Stops
  // and resizes are for the job; SIGKILL still ends the shepherd. Ignored before the fork, so a
  // stop sent to the group the moment the job exists cannot end the shepherd first.
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGUSR1, SIG_IGN);  // an elastic job's resize (RunningJobs::AskResize)
  // The tasks' pids, in storage sized before the fork (nothing is allocated in the child).
  std::vector<pid_t>& pids = p.task_pids;
  if (p.log_cap > 0 && !MakeLogPipes(p)) Fail(pipe_fd, 1);
  for (size_t t = 0; t < p.ntasks; ++t) {
    pid_t job = fork();
    if (job < 0) {
      // Those started go with the group; the server sees the shepherd fail.
      for (size_t k = 0; k < t; ++k) kill(pids[k], SIGKILL);
      _exit(127);
    }
    if (job == 0) {
      ResetSignals();
      ExecTask(spec, p, t, pipe_fd);
    }
    pids[t] = job;
  }
  Shepherd(spec, p, pids, pipe_fd);
}

// In the parent, after the child said which step failed: the error, also written to the job's
// stderr log (where the user looks first) when that can be opened.
absl::Status ChildFailed(const LaunchSpec& spec, const Prepared& p, const ChildError& ce) {
  const std::string& file = ce.step == 7 ? std::string(p.user_out[0]) : std::string(p.user_err[0]);
  std::string what = ce.step == 5   ? fmt::format("{} '{}'", kSteps[5], spec.argv[0])
                     : ce.step == 0 ? fmt::format("{} '{}'", kSteps[0], spec.workdir)
                     : ce.step == 7 || ce.step == 8 ? fmt::format("{} '{}'", kSteps[ce.step], file)
                                                    : kSteps[ce.step];
  std::string message = fmt::format("job {}: {}: {}", spec.job_id, what, strerror(ce.err));
  if (!spec.stderr_path.empty() && ce.step != 2) {
    int fd = open(spec.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      std::string line = "tessera: " + message + "\n";
      ssize_t w = write(fd, line.data(), line.size());
      (void)w;
      close(fd);
    }
  }
  absl::Status st = absl::InvalidArgumentError(message);
  // As a shell says it: 127 not found, 126 found but not runnable.
  if (ce.step == 5) st.SetPayload(kExitCodePayload, absl::Cord(ce.err == ENOENT ? "127" : "126"));
  return st;
}

}  // namespace

std::optional<int> ExitCodeOf(const absl::Status& st) {
  const auto code = st.GetPayload(kExitCodePayload);
  if (!code) return std::nullopt;
  int v = 0;
  if (!absl::SimpleAtoi(std::string(*code), &v)) return std::nullopt;
  return v;
}

absl::StatusOr<Launched> Start(const LaunchSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return absl::InvalidArgumentError(fmt::format("job {}: no command", spec.job_id));
  }
  // A user's job never keeps the server's group: setuid alone would leave it gid 0 and root's
  // supplementary groups.
  if (spec.uid && !spec.gid) {
    return absl::FailedPreconditionError(fmt::format(
        "job {}: no group for uid {}: a job runs only with its user's own uid, gid and groups",
        spec.job_id, *spec.uid));
  }
  if (spec.tasks.size() > 1 && spec.exit_path.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("job {}: several tasks need a shepherd (exit_path)", spec.job_id));
  }
  Prepared p;
  Prepare(spec, p);
  p.task_pids.assign(p.ntasks, 0);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(fmt::format("job {}: pipe: {}", spec.job_id, strerror(errno)));
  }
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return absl::InternalError(fmt::format("job {}: fork: {}", spec.job_id, strerror(e)));
  }
  if (pid == 0) Child(spec, p, pipe_fds[1]);
  close(pipe_fds[1]);
  // Also set the group from the parent: either side may run first.
  setpgid(pid, pid);
  ChildError ce;
  ssize_t n;
  do {
    n = read(pipe_fds[0], &ce, sizeof ce);
  } while (n < 0 && errno == EINTR);
  close(pipe_fds[0]);
  if (n == sizeof ce) {
    // The other tasks of a job with several go too.
    if (p.ntasks > 1) kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return ChildFailed(spec, p, ce);
  }
  Launched l;
  l.pid = pid;
  l.start_time = shim::ProcessStartTime(pid);
  return l;
}

std::optional<int> ReadExitFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[32] = {};
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return std::nullopt;
  char* end = nullptr;
  long v = strtol(buf, &end, 10);
  if (end == buf || v < 0 || v > 255 + 128) return std::nullopt;
  return static_cast<int>(v);
}

bool SignalGroup(pid_t pgid, int sig) { return pgid > 0 && kill(-pgid, sig) == 0; }

std::optional<int> Reap(pid_t pid) {
  int status = 0;
  pid_t r = waitpid(pid, &status, WNOHANG);
  if (r != pid) return std::nullopt;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return std::nullopt;
}

bool SameProcess(pid_t pid, uint64_t start_time) {
  char state;
  uint64_t now = 0;
  // A zombie (ended, not yet reaped) is not running.
  return pid > 0 && shim::ReadProcessStat(pid, &state, &now) && now != 0 && now == start_time &&
         state != 'Z';
}

ExitWatcher::ExitWatcher(std::function<void()> on_exit) : on_exit_(std::move(on_exit)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || stop_fd_ < 0) return;  // Watch then says no: callers poll
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = ~uint64_t{0};
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, stop_fd_, &ev);
  thread_ = std::thread([this] { Run(); });
}

ExitWatcher::~ExitWatcher() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    ssize_t w = write(stop_fd_, &one, sizeof one);
    (void)w;
    thread_.join();
  }
  std::lock_guard lock(mu_);
  for (const auto& [key, fd] : fds_) close(fd);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

bool ExitWatcher::Watch(int64_t key, pid_t pid) {
  if (!thread_.joinable() || pid <= 0) return false;
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return false;
  fcntl(fd, F_SETFD, FD_CLOEXEC);  // pidfds are close-on-exec already; jobs must never inherit one
  std::lock_guard lock(mu_);
  if (auto it = fds_.find(key); it != fds_.end()) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second, nullptr);
    close(it->second);
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;  // once: the owner reaps it and unwatches
  ev.data.u64 = static_cast<uint64_t>(key);
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    close(fd);
    fds_.erase(key);
    return false;
  }
  fds_[key] = fd;
  return true;
}

void ExitWatcher::Unwatch(int64_t key) {
  std::lock_guard lock(mu_);
  auto it = fds_.find(key);
  if (it == fds_.end()) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second, nullptr);
  close(it->second);
  fds_.erase(it);
}

size_t ExitWatcher::watched() const {
  std::lock_guard lock(mu_);
  return fds_.size();
}

void ExitWatcher::Run() {
  epoll_event events[16];
  for (;;) {
    int n = epoll_wait(epoll_fd_, events, 16, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    bool exited = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == ~uint64_t{0}) return;
      exited = true;
    }
    if (exited) on_exit_();
  }
}

}  // namespace tessera::server
