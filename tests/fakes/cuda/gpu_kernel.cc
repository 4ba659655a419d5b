#include "gpu_kernel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tessera::test {

FakeGpuKernel::FakeGpuKernel(const std::string& dir) : path_(dir + "/gpu-kernel.sock") {
  unlink(path_.c_str());
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listen_fd_, 64) != 0 || pipe2(stop_, O_CLOEXEC) != 0) {
    perror("fake GPU kernel");
    abort();
  }
  thread_ = std::thread([this] { Serve(); });
}

FakeGpuKernel::~FakeGpuKernel() {
  (void)!write(stop_[1], "x", 1);
  thread_.join();
  for (auto& [fd, c] : clients_) close(fd);
  close(listen_fd_);
  close(stop_[0]);
  close(stop_[1]);
  unlink(path_.c_str());
}

unsigned long long FakeGpuKernel::Held(pid_t pid, int gpu) {
  std::lock_guard lock(mu_);
  unsigned long long sum = 0;
  for (auto& [fd, c] : clients_) {
    if (auto it = c.used.find(gpu); c.pid == pid && it != c.used.end()) sum += it->second;
  }
  return sum;
}

std::string FakeGpuKernel::Answer(Client& c, const std::string& line) {
  int gpu = -1;
  unsigned long long bytes = 0;
  if (sscanf(line.c_str(), "used %d %llu", &gpu, &bytes) == 2) {
    c.used[gpu] = bytes;
    return "ok\n";
  }
  if (sscanf(line.c_str(), "list %d", &gpu) == 1) {
    std::map<pid_t, unsigned long long> by_pid;  // a process may hold two connections (a fork)
    for (auto& [fd, other] : clients_) {
      if (auto it = other.used.find(gpu); it != other.used.end() && it->second > 0)
        by_pid[other.pid] += it->second;
    }
    std::string out;
    for (auto& [pid, b] : by_pid) out += std::to_string(pid) + " " + std::to_string(b) + "\n";
    return out + "end\n";
  }
  return "end\n";  // not understood: an empty answer
}

void FakeGpuKernel::Serve() {
  while (true) {
    std::vector<pollfd> fds{{stop_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    {
      std::lock_guard lock(mu_);
      for (auto& [fd, c] : clients_) fds.push_back({fd, POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      ucred cred{};
      socklen_t len = sizeof cred;
      if (fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        std::lock_guard lock(mu_);
        clients_[fd].pid = cred.pid;
      } else if (fd >= 0) {
        close(fd);
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      std::lock_guard lock(mu_);
      if (n <= 0) {  // the process ended: its memory with it
        close(fds[i].fd);
        clients_.erase(fds[i].fd);
        continue;
      }
      Client& c = clients_[fds[i].fd];
      c.pending.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = c.pending.find('\n')) != std::string::npos) {
        const std::string reply = Answer(c, c.pending.substr(0, nl));
        c.pending.erase(0, nl + 1);
        (void)!write(fds[i].fd, reply.data(), reply.size());
      }
    }
  }
}

}  // namespace tessera::test
