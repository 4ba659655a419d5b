#pragma once
// The fake driver's kernel side as its user-space libraries (fake libcuda.so.1, fake
// libnvidia-ml.so.1) reach it: a unix socket named by FAKE_GPU_KERNEL, served by FakeGpuKernel
// (gpu_kernel.h). Header-only and free of C++ runtime state beyond a mutex, so that both fake
// libraries can carry a copy. See gpu_kernel.h for the protocol.
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <mutex>
#include <string>

namespace fake_gpu_kernel {

// A connection of this process (reopened in a forked child: the kernel tells processes apart by
// their connection's credentials). -1 without FAKE_GPU_KERNEL or when it cannot be reached.
inline int Connection(int& fd, pid_t& owner) {
  const char* path = getenv("FAKE_GPU_KERNEL");
  if (path == nullptr || *path == 0) return -1;
  if (fd >= 0 && owner == getpid()) return fd;
  if (fd >= 0) close(fd);  // the parent's, inherited through fork
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    fd = -1;
  }
  owner = getpid();
  return fd;
}

// Sends `line` and reads the answer up to and including a line "end" or "ok": what came before.
// False when the kernel cannot be reached.
inline bool Ask(const std::string& line, std::string* answer) {
  static std::mutex mu;
  static int fd = -1;
  static pid_t owner = 0;
  std::lock_guard lock(mu);
  const int c = Connection(fd, owner);
  if (c < 0) return false;
  if (write(c, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return false;
  std::string got;
  char buf[4096];
  while (true) {
    const size_t end = got.find("end\n");
    const size_t ok = got.find("ok\n");
    if (end != std::string::npos || ok != std::string::npos) {
      if (answer) *answer = got.substr(0, end != std::string::npos ? end : ok);
      return true;
    }
    const ssize_t n = read(c, buf, sizeof buf);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace fake_gpu_kernel
