#include "tessera/devices/program.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "fmt/format.h"

extern char** environ;

namespace tessera::devices {

namespace {

// A pipe read until its end: what it gave, the first `max` bytes kept; whether more came.
struct Sink {
  int fd;
  std::string* text;
  size_t max = size_t{1} << 20;
  bool cut = false;
};

// What each pipe gives until all have ended, `pid` killed when `timeout` has passed first; whether
// it was. (Read together: a program blocked writing one while the other is waited on never ends.)
bool ReadUntilEnd(std::vector<Sink>& sinks, pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<pollfd> polls;
  for (const Sink& s : sinks) polls.push_back({s.fd, POLLIN, 0});
  char buf[65536];
  for (size_t open = polls.size(); open > 0;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      return true;
    }
    const int r = poll(polls.data(), polls.size(), static_cast<int>(left.count()));
    if (r <= 0) continue;  // interrupted, or the deadline (checked above)
    for (size_t i = 0; i < polls.size(); ++i) {
      if (polls[i].fd < 0 || polls[i].revents == 0) continue;
      const ssize_t n = read(polls[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        polls[i].fd = -1;  // ended: poll leaves it out
        --open;
        continue;
      }
      Sink& s = sinks[i];
      const size_t keep = std::min(static_cast<size_t>(n), s.max - std::min(s.max, s.text->size()));
      s.text->append(buf, keep);
      if (keep < static_cast<size_t>(n)) s.cut = true;
    }
  }
  return false;
}

// `pid`'s wait status, once it has ended.
int Reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

absl::StatusOr<ProgramOutput> RunCapture(const std::vector<std::string>& args,
                                         const ProgramRun& run) {
  int out_fds[2], in_fds[2] = {-1, -1}, err_fds[2] = {-1, -1};
  if (pipe2(out_fds, O_CLOEXEC) != 0)
    return absl::InternalError(fmt::format("pipe: {}", strerror(errno)));
  if ((run.input && pipe2(in_fds, O_CLOEXEC) != 0) ||
      (run.stderr_apart && pipe2(err_fds, O_CLOEXEC) != 0)) {
    const std::string why = strerror(errno);
    for (int fd : {out_fds[0], out_fds[1], in_fds[0], in_fds[1]})
      if (fd >= 0) close(fd);
    return absl::InternalError(fmt::format("pipe: {}", why));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (run.input) {
    posix_spawn_file_actions_adddup2(&fa, in_fds[0], 0);
  } else {
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  }
  posix_spawn_file_actions_adddup2(&fa, out_fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, run.stderr_apart ? err_fds[1] : out_fds[1], 2);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  std::vector<char*> envp;
  if (run.env) {
    for (const auto& [k, v] : *run.env) env_text.push_back(k + "=" + v);
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
  posix_spawnattr_t attr;
  CleanSignals(&attr);
  pid_t pid = 0;
  const int rc =
      posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), run.env ? envp.data() : environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(out_fds[1]);
  if (run.input) close(in_fds[0]);
  if (run.stderr_apart) close(err_fds[1]);
  if (rc != 0) {
    close(out_fds[0]);
    if (run.input) close(in_fds[1]);
    if (run.stderr_apart) close(err_fds[0]);
    return absl::FailedPreconditionError(fmt::format("cannot run {}: {}", args[0], strerror(rc)));
  }
  if (run.input) {
    // Short commands: they fit the pipe's buffer. A program that exits without reading gets
    // EPIPE here, not SIGPIPE (MSG_NOSIGNAL has no write() form: the signal is blocked).
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    size_t done = 0;
    while (done < run.input->size()) {
      const ssize_t n = write(in_fds[1], run.input->data() + done, run.input->size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    close(in_fds[1]);
    // A SIGPIPE raised while blocked is taken back before the mask is restored.
    timespec zero{};
    siginfo_t info;
    while (sigtimedwait(&pipe_set, &info, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  ProgramOutput out;
  std::vector<Sink> sinks = {{.fd = out_fds[0], .text = &out.text, .max = run.max_output}};
  if (run.stderr_apart) sinks.push_back({.fd = err_fds[0], .text = &out.err});
  (void)ReadUntilEnd(sinks, pid, run.timeout);
  out.cut = sinks[0].cut;
  close(out_fds[0]);
  if (run.stderr_apart) close(err_fds[0]);
  const int status = Reap(pid);
  if (WIFEXITED(status)) out.status = WEXITSTATUS(status);
  return out;
}

absl::StatusOr<std::string> RunInChild(const std::function<std::string()>& fn,
                                       std::chrono::milliseconds timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return absl::InternalError(fmt::format("pipe: {}", strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(fmt::format("fork: {}", strerror(errno)));
  }
  if (pid == 0) {
    close(fds[0]);
    // A mark first: an answer that is empty is not a child that ended without one. (An
    // exception must not unwind into the parent's frames, copied here.)
    std::string answer;
    try {
      answer = "=" + fn();
    } catch (...) {
      _exit(1);
    }
    for (size_t done = 0; done < answer.size();) {
      const ssize_t n = write(fds[1], answer.data() + done, answer.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(0);  // no atexit handlers or buffers of the parent's
  }
  close(fds[1]);
  std::string text;
  std::vector<Sink> sinks = {{.fd = fds[0], .text = &text}};
  const bool killed = ReadUntilEnd(sinks, pid, timeout);
  close(fds[0]);
  const int status = Reap(pid);
  if (killed)
    return absl::DeadlineExceededError(fmt::format("no answer in {} ms", timeout.count()));
  if (text.empty() || text[0] != '=' || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(WIFSIGNALED(status)
                                   ? fmt::format("it ended on signal {} ({})", WTERMSIG(status),
                                                 strsignal(WTERMSIG(status)))
                                   : fmt::format("it ended without an answer (exit status {})",
                                                 WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  }
  return text.substr(1);
}

void CleanSignals(posix_spawnattr_t* attr) {
  posix_spawnattr_init(attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(attr, &none);
  posix_spawnattr_setsigdefault(attr, &all);
  posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

std::string FirstLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string LookUp(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = getenv("PATH");
  const std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t colon = dirs.find(':', start);
    const std::string dir =
        dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (!dir.empty()) {
      const std::string candidate = dir + "/" + name;
      struct stat st;
      if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          access(candidate.c_str(), X_OK) == 0) {
        return candidate;
      }
    }
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

}  // namespace tessera::devices
