#pragma once
// The real-GPU validation kit of the intercept library (docs/testing.md, `scripts/gpu-check`):
// runs tenant processes (tenant.h) with and without libtessera-cuda.so on one real GPU and checks
// what the fake driver cannot show - compute shares under deep kernel queues, graphs and a stopped
// tenant, priorities, memory limits against NVML's own per-process figures, launch cost, the
// driver's lookup routes. Prints one table and can write it as JSON.

#include <iosfwd>
#include <string>
#include <vector>

namespace tessera::gpucheck {

// The exit status when no driver or no GPU is there (what ctest takes as "skipped").
inline constexpr int kNoDriver = 77;

struct Options {
  std::string self;      // this program, started again as the tenants
  std::string library;   // libtessera-cuda.so
  std::string baseline;  // another build of it, whose launch cost is measured beside (before/after)
  std::string libcuda;   // the driver; empty: libcuda.so.1
  std::string json;      // where the results go as JSON; empty: nowhere
  std::vector<std::string> only;  // names (or prefixes) of the checks to run; empty: all
  std::string torch;  // tests/gpu/torch_tenant.py: also check PyTorch tenants; empty: not
  std::string python = "python3";
  std::vector<std::string> settings;  // KEY=VALUE given to every tenant (the library's settings)
  std::string mps_control = "nvidia-cuda-mps-control";  // the MPS checks' control program
  int device = 0;
};

// Runs the checks, writing the table (and progress) to `out`. Returns 0 when every check passed,
// 1 when one failed, kNoDriver without a driver or GPU, 2 for a bad option.
int RunChecks(const Options& options, std::ostream& out);

// The names of the checks, in the order they run.
std::vector<std::string> CheckNames();

}  // namespace tessera::gpucheck
