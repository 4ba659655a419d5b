// Cost of libtessera-cuda.so per hooked call against the fake driver, as a ratio to calling the
// driver directly, measured in one run: the program re-executes itself without and with LD_PRELOAD
// (and with a compute share on a GPU arbiter, where launches take the lease holder's fast path).
// Then the shared-region attach time: one process at a time (quiet baseline), 64 processes starting
// at once, and 64 again while two busy loops load the machine, with wall and CPU time each.
// Last, what reading a job's GPU time from the arbiter file costs (the server reads each running
// share every sample), alone and with an upgrade's previous file beside it (read too).
//   build/bench/bench/shim_bench          (all)
//   build/bench/bench/shim_bench use      (the arbiter reads alone)
#include <dlfcn.h>
#include <signal.h>
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

#include "tessera/shim/arbiter.h"
#include "tessera/shim/cuda_abi.h"
#include "tessera/shim/region.h"
#include "tessera/shim/version5_arbiter_file.h"

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
    // Kernels of no length (the fake's gridDimX is a kernel's us): the virtual GPU never falls
    // behind, so this is the host's cost alone. With 1 us kernels 20 M launches without a
    // synchronize would queue 20 s, and the library's queue bound rightly holds them to the GPU's
    // pace (as a real driver's full launch queue does).
    for (int i = 0; i < kLaunches; ++i)
      launch(nullptr, 0, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
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

// Child mode: cuMemGetInfo_v2 through dlsym (hooked when preloaded), timed one call at a time;
// prints its p50 and p99 in microseconds.
int Info() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) return 3;
  auto init = reinterpret_cast<cuInit_fn>(dlsym(lib, "cuInit"));
  auto info = reinterpret_cast<cuMemGetInfo_v2_fn>(dlsym(lib, "cuMemGetInfo_v2"));
  init(0);
  std::vector<double> us;
  for (int i = 0; i < 20'000; ++i) {
    size_t free_bytes = 0, total = 0;
    const double t0 = Now();
    info(&free_bytes, &total);
    us.push_back((Now() - t0) * 1e6);
  }
  std::sort(us.begin(), us.end());
  printf("%.2f %.2f\n", us[us.size() / 2], us[us.size() * 99 / 100]);
  return 0;
}

std::string RunSelf(const char* self, bool preload, const std::string& extra = "",
                    const std::string& mode = "calls") {
  std::string cmd =
      std::string("LD_LIBRARY_PATH=") + TESSERA_FAKE_CUDA_DIR +
      (preload ? " LD_PRELOAD=" TESSERA_SHIM_LIBRARY " TESSERA_CUDA_MEM_LIMIT=64GiB" : "") + " " +
      extra + " " + self + " " + mode;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[256] = "";
  if (fgets(buf, sizeof buf, p) == nullptr) buf[0] = 0;
  pclose(p);
  return buf;
}

double CpuNow() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct AttachTimes {
  std::vector<double> wall_us, cpu_us;  // sorted
};

// n processes released at once attach to one region (made first by this process when `existing`,
// else by whichever child comes first); each reports its wall and CPU time for Attach.
AttachTimes Attach(int n, bool existing) {
  std::string path = "/tmp/shim-bench-" + std::to_string(getpid()) + ".region";
  unlink(path.c_str());
  uint64_t limits[1] = {1ull << 30};
  char err[128];
  if (existing && !tessera::shim::CreateRegionFile(path.c_str(), limits, 1, err, sizeof err))
    exit(1);
  int go[2], back[2];
  if (pipe(go) != 0 || pipe(back) != 0) exit(1);
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      char c;
      if (read(go[0], &c, 1) != 1) _exit(1);
      double t0 = Now(), c0 = CpuNow();
      tessera::shim::Region* r =
          tessera::shim::Region::Attach(path.c_str(), limits, 1, err, sizeof err);
      double us[2] = {(Now() - t0) * 1e6, (CpuNow() - c0) * 1e6};
      if (r == nullptr) _exit(1);
      if (write(back[1], us, sizeof us) != sizeof us) _exit(1);
      _exit(0);
    }
    kids.push_back(pid);
  }
  usleep(100'000);  // let every child block on the pipe
  std::string release(n, 'x');
  if (write(go[1], release.data(), n) != n) exit(1);
  AttachTimes out;
  for (int i = 0; i < n; ++i) {
    double us[2];
    if (read(back[0], us, sizeof us) == sizeof us) {
      out.wall_us.push_back(us[0]);
      out.cpu_us.push_back(us[1]);
    }
  }
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  for (int fd : {go[0], go[1], back[0], back[1]}) close(fd);
  unlink(path.c_str());
  std::sort(out.wall_us.begin(), out.wall_us.end());
  std::sort(out.cpu_us.begin(), out.cpu_us.end());
  return out;
}

double Pct(const std::vector<double>& v, int p) {
  return v.empty() ? 0 : v[std::min(v.size() - 1, v.size() * p / 100)];
}

// The 1, 5 and 15 minute load averages.
std::string LoadAverage() {
  double a = 0, b = 0, c = 0;
  FILE* f = fopen("/proc/loadavg", "r");
  if (f != nullptr) {
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) != 3) a = b = c = 0;
    fclose(f);
  }
  char buf[64];
  snprintf(buf, sizeof buf, "%.2f %.2f %.2f", a, b, c);
  return buf;
}

// cuMemGetInfo through the library with its region alone and with 63 more processes attached
// (each holding a slot, alive, as a job's ranks and workers are), beside what one full reclaim
// of dead processes' memory costs with 64 attached: what every memory query paid before it was
// limited to one per 100 ms.
void MemoryQueries(const char* self) {
  const std::string path = "/tmp/shim-bench-" + std::to_string(getpid()) + "-info.region";
  unlink(path.c_str());
  uint64_t limits[1] = {64ull << 30};
  char err[128];
  if (!tessera::shim::CreateRegionFile(path.c_str(), limits, 1, err, sizeof err)) exit(1);
  const std::string env = "TESSERA_CUDA_REGION=" + path;
  double alone50 = 0, alone99 = 0, many50 = 0, many99 = 0;
  if (sscanf(RunSelf(self, true, env, "info").c_str(), "%lf %lf", &alone50, &alone99) != 2) exit(1);
  int hold[2];
  if (pipe(hold) != 0) exit(1);
  std::vector<pid_t> kids;
  for (int i = 0; i < 63; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      close(hold[1]);
      tessera::shim::Region* r =
          tessera::shim::Region::Attach(path.c_str(), limits, 1, err, sizeof err);
      if (r == nullptr || !r->Reserve(0, 1 << 20)) _exit(1);
      char c;
      (void)!read(hold[0], &c, 1);  // until the parent closes the pipe
      _exit(0);
    }
    kids.push_back(pid);
  }
  usleep(200'000);  // every child attached
  if (sscanf(RunSelf(self, true, env, "info").c_str(), "%lf %lf", &many50, &many99) != 2) exit(1);
  tessera::shim::Region* me =
      tessera::shim::Region::Attach(path.c_str(), limits, 1, err, sizeof err);
  std::vector<double> scan;
  for (int i = 0; me != nullptr && i < 200; ++i) {
    const double t0 = Now();
    me->ReclaimDead();
    scan.push_back((Now() - t0) * 1e6);
  }
  std::sort(scan.begin(), scan.end());
  close(hold[1]);
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  close(hold[0]);
  unlink(path.c_str());
  printf("%-40s p50 %7.2f us p99 %8.2f us\n", "cuMemGetInfo_v2, region alone", alone50, alone99);
  printf("%-40s p50 %7.2f us p99 %8.2f us  (%.2fx alone at p50)\n", "cuMemGetInfo_v2, 64 attached",
         many50, many99, many50 / alone50);
  printf("%-40s p50 %7.2f us p99 %8.2f us  (each query paid it before)\n",
         "full reclaim scan, 64 attached", Pct(scan, 50), Pct(scan, 99));
}

}  // namespace

// ArbiterJobUse of a job on 2 GPUs, ns per read: the newest file alone, then with a version 5
// file kept at its previous path (an upgrade's, the job's older processes in it), in one run.
void UseReads() {
  namespace shim = tessera::shim;
  const std::string arbiter = "/tmp/shim-bench-use-" + std::to_string(getpid()) + ".arbiter";
  char err[256] = "", previous[4200];
  shim::ArbiterPreviousPath(arbiter.c_str(), previous, sizeof previous);
  unlink(arbiter.c_str());
  if (!shim::CreateArbiterFile(arbiter.c_str(), err, sizeof err)) {
    fprintf(stderr, "shim_bench: %s\n", err);
    return;
  }
  const int gpus[] = {0, 3};
  const uint64_t key = shim::ArbiterJobKey("41");
  auto time_reads = [&] {
    constexpr int kReads = 20000;
    uint64_t sum = 0;
    const double t0 = Now();
    for (int i = 0; i < kReads; ++i)
      sum += shim::ArbiterJobUse(arbiter.c_str(), gpus, 2, key).busy_us;
    const double ns = (Now() - t0) * 1e9 / kReads;
    static volatile uint64_t sink;  // the reads are kept
    sink = sum;
    return ns;
  };
  const double alone = time_reads();
  double with_previous = 0;
  {
    shim::Version5ArbiterFile v5(previous, 0600);
    v5.Put(3, 5, key, 1000, shim::Arbiter::NowMicros(), getpid(), shim::PidNamespace());
    with_previous = time_reads();
  }
  printf("%-40s %10.0f ns\n", "a job's use read (2 GPUs)", alone);
  printf("%-40s %10.0f ns  ratio %.2f\n", "the same, a previous file beside it", with_previous,
         with_previous / alone);
  unlink(previous);
  unlink(arbiter.c_str());
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "calls") == 0) return Calls();
  if (argc > 1 && strcmp(argv[1], "info") == 0) return Info();
  if (argc > 1 && strcmp(argv[1], "use") == 0) return UseReads(), 0;
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
  // Attach: a quiet baseline (one process at a time, 20 rounds, the region made beforehand) and
  // 64 processes at once, then the same 64 while two busy loops load the machine's 2 cores - all in
  // this run, with the load average before each.
  AttachTimes quiet;
  std::string load = LoadAverage();
  for (int i = 0; i < 20; ++i) {
    AttachTimes one = Attach(1, true);
    quiet.wall_us.insert(quiet.wall_us.end(), one.wall_us.begin(), one.wall_us.end());
    quiet.cpu_us.insert(quiet.cpu_us.end(), one.cpu_us.begin(), one.cpu_us.end());
  }
  std::sort(quiet.wall_us.begin(), quiet.wall_us.end());
  std::sort(quiet.cpu_us.begin(), quiet.cpu_us.end());
  auto row = [](const char* what, const std::string& load, const AttachTimes& t) {
    printf("%-40s load %-14s wall p50 %7.1f us p99 %8.1f us | cpu p50 %6.1f us p99 %6.1f us\n",
           what, load.c_str(), Pct(t.wall_us, 50), Pct(t.wall_us, 99), Pct(t.cpu_us, 50),
           Pct(t.cpu_us, 99));
  };
  row("region attach, 1 process (quiet)", load, quiet);
  load = LoadAverage();
  row("region attach, 64 at once", load, Attach(64, true));
  load = LoadAverage();
  row("region attach, 64 at once, first creates", load, Attach(64, false));
  std::vector<pid_t> hogs;
  for (int i = 0; i < 2; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      for (uint64_t x = 0;; ++x) asm volatile("" : "+r"(x));  // a busy loop kept by the compiler
    }
    hogs.push_back(pid);
  }
  usleep(200'000);
  load = LoadAverage();
  AttachTimes loaded = Attach(64, true);
  for (pid_t h : hogs) kill(h, SIGKILL), waitpid(h, nullptr, 0);
  row("region attach, 64 at once, 2 busy loops", load, loaded);
  MemoryQueries(argv[0]);
  UseReads();
  return 0;
}
