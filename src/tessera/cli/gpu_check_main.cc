// tessera-gpu-check: the intercept library's checks on a real GPU (docs/testing.md). Needs only
// the NVIDIA driver; exits 77 where there is none.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "tessera/gpucheck/checks.h"
#include "tessera/gpucheck/tenant.h"

int main(int argc, char** argv) {
  namespace gc = tessera::gpucheck;
  char self[PATH_MAX] = "";
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) self[n] = '\0';
  // A tenant process: `tessera-gpu-check [--libcuda=PATH] --tenant KIND KEY=VALUE...`.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tenant") == 0) {
      const char* libcuda = nullptr;
      if (i == 2 && std::strncmp(argv[1], "--libcuda=", 10) == 0) libcuda = argv[1] + 10;
      return gc::RunTenant(argc - i - 1, argv + i + 1, libcuda);
    }
  }
  gc::Options options;
  options.self = self;
  options.library = (std::filesystem::path(self).parent_path() / "libtessera-cuda.so").string();
  CLI::App app{
      "Checks libtessera-cuda.so on a real GPU: compute shares under deep kernel queues, CUDA "
      "graphs and a stopped tenant, priorities, memory limits against NVML's per-process figures, "
      "launch cost and the driver's lookup routes. Needs only the NVIDIA driver (kernels are PTX "
      "the driver compiles). Prints one table; exit 0 all passed, 1 a check failed, 77 no driver "
      "or GPU here.",
      "tessera-gpu-check"};
  app.add_option("--library", options.library, "the intercept library to check")
      ->capture_default_str();
  app.add_option("--libcuda", options.libcuda, "the CUDA driver library (default libcuda.so.1)");
  app.add_option(
      "--baseline", options.baseline,
      "another build of the library whose launch cost is measured beside (before/after)");
  app.add_option("--json", options.json, "also write the results to this file as JSON");
  app.add_option("--device", options.device, "the CUDA device ordinal")->capture_default_str();
  app.add_option("--torch", options.torch,
                 "also run PyTorch tenants: the path of tests/gpu/torch_tenant.py");
  app.add_option("--python", options.python, "the Python with PyTorch for --torch")
      ->capture_default_str();
  app.add_option("--set", options.settings,
                 "a library setting for every tenant, KEY=VALUE (TESSERA_CUDA_QUEUE_US=2000); "
                 "repeatable");
  app.add_option("--mps-control", options.mps_control,
                 "the MPS checks' control program (they start a daemon of their own for the "
                 "device; info where it will not start)")
      ->capture_default_str();
  std::string names;
  for (const std::string& name : gc::CheckNames()) names += (names.empty() ? "" : ", ") + name;
  app.add_option("--only", options.only, "run only these checks (names or prefixes: " + names + ")")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  for (const std::string& only : options.only) {
    bool known = false;
    for (const std::string& name : gc::CheckNames()) known = known || name.rfind(only, 0) == 0;
    if (!known) {
      std::cerr << "tessera-gpu-check: --only '" << only << "' names no check (they are: " << names
                << ")\n";
      return 2;
    }
  }
  return gc::RunChecks(options, std::cout);
}
