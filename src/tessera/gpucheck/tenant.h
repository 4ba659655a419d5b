#pragma once
// What one tenant process of the GPU check does (`tessera-gpu-check --tenant KIND KEY=VALUE...`),
// with or without the intercept library preloaded: it reaches the driver by dlopen + dlsym, as
// frameworks do, and prints its results as one line of KEY=VALUE pairs for the parent.
//
//   calibrate                 how many iterations of `spin` run per microsecond alone
//   launch n=N                the host cost of launching an empty kernel, in ns
//   work kernel_us= batch= pause_us= run_ms= from_ms= to_ms= start_ms= iters_per_us= [graph=N]
//                             launches `batch` kernels of kernel_us (or replays a graph of N such
//                             kernels `batch` times), synchronizes, pauses, until run_ms after
//                             start_ms (CLOCK_MONOTONIC); each kernel's completion is timed on the
//                             GPU (an event after it), and the work that completed between from_ms
//                             and to_ms is summed: "window_us= total_us= units="
//   memory                    reads steps from stdin (alloc, modules, info, free, async, freeasync)
//   procaddr over= under=     allocates through each lookup route: `over` bytes must be refused,
//                             `under` accepted

namespace tessera::gpucheck {

// Runs the tenant named by argv[0] (argv: KIND KEY=VALUE...); returns the process's exit status.
// `libcuda` is the driver to load (null: libcuda.so.1).
int RunTenant(int argc, char** argv, const char* libcuda);

}  // namespace tessera::gpucheck
