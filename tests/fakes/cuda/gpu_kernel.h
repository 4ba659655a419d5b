#pragma once
// The kernel side of the fake GPU driver: one table of which process holds how much device memory
// on which GPU, for every process on the machine, as the real driver keeps it. Like the real one
// it knows processes by their pid in the host's (its own) pid namespace, whatever namespace they
// run in: a process in a container is listed under a pid it cannot see as its own, which is what
// makes a container's footprint hard to measure from inside (the NVIDIA driver does not translate
// pids). Fake libcuda.so.1 and libnvidia-ml.so.1 reach it when FAKE_GPU_KERNEL names its socket.
//
// Protocol, lines over a unix stream socket; a process's pid is its connection's credentials
// (SO_PEERCRED, translated by the Linux kernel into this process's namespace):
//   "used D BYTES\n"  this process now holds BYTES on GPU D         -> "ok\n"
//   "list D\n"        the processes holding memory on GPU D        -> "PID BYTES\n"... "end\n"
// A process's memory is gone when its connection closes (it ended), as the driver frees it.
#include <sys/types.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace tessera::test {

class FakeGpuKernel {
 public:
  // Serves on a new socket under `dir`; path() names it (FAKE_GPU_KERNEL).
  explicit FakeGpuKernel(const std::string& dir);
  ~FakeGpuKernel();
  FakeGpuKernel(const FakeGpuKernel&) = delete;
  FakeGpuKernel& operator=(const FakeGpuKernel&) = delete;

  const std::string& path() const { return path_; }
  // What `pid` holds on GPU `gpu` now (0: nothing, or no such process).
  unsigned long long Held(pid_t pid, int gpu);

 private:
  void Serve();
  struct Client {
    pid_t pid = 0;
    std::string pending;
    std::map<int, unsigned long long> used;  // GPU -> bytes
  };
  std::string Answer(Client& c, const std::string& line);

  std::string path_;
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  std::mutex mu_;
  std::map<int, Client> clients_;  // by descriptor; under mu_
  std::thread thread_;
};

}  // namespace tessera::test
