// Cost of libtessera-cuda.so per hooked call against the fake driver, as a ratio to calling the
// driver directly, measured in one run: the program re-executes itself without and with LD_PRELOAD
// (and with a compute share on a GPU arbiter, where launches take the lease holder's fast path).
// Then the shared-region attach time with 1 and with 64 processes starting at once.
//   build/bench/bench/shim_bench
#include <dlfcn.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/shim/cuda_abi.h"
#include "tessera/shim/region.h"

extern char** environ;

namespace {

double Now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Child mode: time the calls through whatever dlsym gives (hooked when preloaded).
int Calls() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) return 3;
  auto init = reinterpret_cast<cuInit_fn>(dlsym(lib, "cuInit"));
  auto launch = reinterpret_cast<cuLaunchKernel_fn>(dlsym(lib, "cuLaunchKernel"));
  auto alloc = reinterpret_cast<cuMemAlloc_v2_fn>(dlsym(lib, "cuMemAlloc_v2"));
  auto release = reinterpret_cast<cuMemFree_v2_fn>(dlsym(lib, "cuMemFree_v2"));
  init(0);
  const int kLaunches = 20'000'000, kAllocs = 1'000'000;
  double best_launch = 1e9, best_alloc = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    double t0 = Now();
    for (int i = 0; i < kLaunches; ++i)
      launch(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
    best_launch = std::min(best_launch, (Now() - t0) / kLaunches * 1e9);
    t0 = Now();
    for (int i = 0; i < kAllocs; ++i) {
      CUdeviceptr p;
      alloc(&p, 4096);
      release(p);
    }
    best_alloc = std::min(best_alloc, (Now() - t0) / kAllocs * 1e9);
  }
  printf("%.2f %.2f\n", best_launch, best_alloc);
  return 0;
}

std::string RunSelf(const char* self, bool preload, const std::string& extra = "") {
  std::string cmd =
      std::string("LD_LIBRARY_PATH=") + TESSERA_FAKE_CUDA_DIR +
      (preload ? " LD_PRELOAD=" TESSERA_SHIM_LIBRARY " TESSERA_CUDA_MEM_LIMIT=64GiB" : "") + " " +
      extra + " " + self + " calls";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[256] = "";
  if (fgets(buf, sizeof buf, p) == nullptr) buf[0] = 0;
  pclose(p);
  return buf;
}

// n processes released at once attach to one new region; returns attach times in microseconds.
std::vector<double> Attach(int n) {
  std::string path = "/tmp/shim-bench-" + std::to_string(getpid()) + ".region";
  unlink(path.c_str());
  int go[2], back[2];
  if (pipe(go) != 0 || pipe(back) != 0) exit(1);
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      char c;
      if (read(go[0], &c, 1) != 1) _exit(1);
      uint64_t limits[1] = {1ull << 30};
      char err[128];
      double t0 = Now();
      tessera::shim::Region* r =
          tessera::shim::Region::Attach(path.c_str(), limits, 1, err, sizeof err);
      double us = (Now() - t0) * 1e6;
      if (r == nullptr) _exit(1);
      if (write(back[1], &us, sizeof us) != sizeof us) _exit(1);
      _exit(0);
    }
    kids.push_back(pid);
  }
  usleep(100'000);  // let every child block on the pipe
  std::string release(n, 'x');
  if (write(go[1], release.data(), n) != n) exit(1);
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    double us;
    if (read(back[0], &us, sizeof us) == sizeof us) out.push_back(us);
  }
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  unlink(path.c_str());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "calls") == 0) return Calls();
  double direct_launch, direct_alloc, hooked_launch, hooked_alloc;
  if (sscanf(RunSelf(argv[0], false).c_str(), "%lf %lf", &direct_launch, &direct_alloc) != 2 ||
      sscanf(RunSelf(argv[0], true).c_str(), "%lf %lf", &hooked_launch, &hooked_alloc) != 2) {
    fprintf(stderr, "shim_bench: a child run failed\n");
    return 1;
  }
  // Paced: the job has a compute share on an arbiter and holds the GPU (alone on it), so launches
  // take the arbiter's fast path.
  std::string arbiter = "/tmp/shim-bench-" + std::to_string(getpid()) + ".arbiter";
  double paced_launch, paced_alloc;
  if (sscanf(RunSelf(argv[0], true,
                     "TESSERA_CUDA_ARBITER=" + arbiter + " TESSERA_CUDA_COMPUTE_SHARE=50%")
                 .c_str(),
             "%lf %lf", &paced_launch, &paced_alloc) != 2) {
    fprintf(stderr, "shim_bench: the paced child run failed\n");
    return 1;
  }
  unlink(arbiter.c_str());
  printf("%-32s %10s %10s %10s %8s\n", "call", "direct ns", "hooked ns", "added ns", "ratio");
  printf("%-32s %10.2f %10.2f %10.2f %8.2f\n", "cuLaunchKernel", direct_launch, hooked_launch,
         hooked_launch - direct_launch, hooked_launch / direct_launch);
  printf("%-32s %10.2f %10.2f %10.2f %8.2f\n", "cuLaunchKernel, paced, holding", direct_launch,
         paced_launch, paced_launch - direct_launch, paced_launch / direct_launch);
  printf("%-32s %10.2f %10.2f %10.2f %8.2f\n", "cuMemAlloc_v2 + cuMemFree_v2", direct_alloc,
         hooked_alloc, hooked_alloc - direct_alloc, hooked_alloc / direct_alloc);
  for (int n : {1, 64}) {
    std::vector<double> us = Attach(n);
    if (us.empty()) return 1;
    printf("region attach, %2d processes at once: p50 %.1f us, p99 %.1f us, max %.1f us\n", n,
           us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)], us.back());
  }
  return 0;
}
