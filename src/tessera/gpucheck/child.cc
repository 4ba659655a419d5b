#include "tessera/gpucheck/child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "tessera/gpucheck/driver.h"

namespace tessera::gpucheck {

bool Child::Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  std::string* err) {
  int out[2], in[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) {
    *err = "pipe failed";
    return false;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int rc = posix_spawnp(&pid_, argv[0].c_str(), &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(in[0]);
  out_ = out[0];
  in_ = in[1];
  if (rc != 0) {
    *err = "cannot start " + argv[0] + ": " + std::strerror(rc);
    pid_ = -1;
    return false;
  }
  return true;
}

std::string Child::ReadLine(int timeout_ms) {
  const double deadline = NowMs() + timeout_ms;
  for (;;) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    pollfd p{out_, POLLIN, 0};
    const int left = static_cast<int>(deadline - NowMs());
    if (left <= 0 || poll(&p, 1, left) <= 0) {
      if (pid_ > 0) kill(pid_, SIGKILL);
      return "error=no answer within " + std::to_string(timeout_ms / 1000) + " s";
    }
    char chunk[4096];
    const ssize_t n = read(out_, chunk, sizeof chunk);
    if (n <= 0) {
      std::string rest;
      rest.swap(buffer_);
      return rest;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

void Child::Send(const std::string& line) {
  const std::string text = line + "\n";
  if (write(in_, text.data(), text.size()) < 0) return;
}

int Child::Wait() {
  if (in_ >= 0) close(in_), in_ = -1;
  if (out_ >= 0) close(out_), out_ = -1;
  int status = 0;
  if (pid_ > 0 && waitpid(pid_, &status, 0) == pid_) pid_ = -1, status_ = status;
  return status_;
}

}  // namespace tessera::gpucheck
