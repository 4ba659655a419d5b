// tessera-gpu-check as a program. Against the fake driver - whose virtual GPU runs queued work
// after its submission, in order, one process's at a time, and goes on running it while the process
// is stopped - its scenarios are the property tests of compute shares: 20/30/50 with short queues,
// a 30% job queueing 200 x 1 ms and 400 x 5 ms per synchronize and replaying 50 ms graphs beside a
// 70% one (each within 5 points of its share over 2 s, and charged within 5 points of the GPU time
// its work took), 200 ms kernels at 30%, a 30% job of 2/4/8 processes, a tenant stopped 1.5 s;
// the memory limit's steps (VMM handles released after mapping among them). The
// same program runs them on a real GPU (the ctest GPU_Check, label gpu). These tests measure time:
// they run alone (RUN_SERIAL).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../capture.h"
#include "gpu_kernel.h"

namespace {

std::string Dir() {
  std::string dir = ::testing::TempDir() + "tessera-gpu-check-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Check(const std::string& args) {
  return std::string("TMPDIR=") + Dir() +
         " " TESSERA_GPU_CHECK " --library " TESSERA_SHIM_LIBRARY " " + args + " 2>&1";
}

// The environment in which the fake NVML reports what the fake driver's processes hold (its
// kernel side), as a real NVML reads the driver's.
std::string NvmlOfTheFakeDriver(const std::string& dir, const tessera::test::FakeGpuKernel& k) {
  std::ofstream(dir + "/nvml.json")
      << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000",
                          "self_memory": "cuda"}]})";
  return "LD_LIBRARY_PATH=" TESSERA_FAKE_NVML_DIR " FAKE_NVML_SCENARIO=" + dir +
         "/nvml.json FAKE_GPU_KERNEL=" + k.path();
}

TEST(GpuCheck, WithoutADriverItSaysSoAndExits77) {
  const auto r = tessera::test::Capture(Check("--libcuda " + Dir() + "/no-libcuda.so.1"));
  EXPECT_EQ(r.code, 77) << r.out;
  EXPECT_NE(r.out.find("no NVIDIA driver here"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nothing was checked"), std::string::npos) << r.out;
}

TEST(GpuCheck, AnUnknownCheckIsRefusedNamingTheKnownOnes) {
  const auto r = tessera::test::Capture(Check("--only 'deep queue,no such check'"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--only 'no such check' names no check (they are: calibrate, launch cost"),
            std::string::npos)
      << r.out;
}

TEST(GpuCheck, SharesHoldUnderDeepQueuesGraphsAndAStoppedTenantOnTheFakeDriver) {
  const std::string dir = Dir();
  const std::string json = dir + "/checks.json";
  const auto r = tessera::test::Capture(
      "FAKE_CUDA_CLOCK=" + dir + "/clock FAKE_CUDA_GRAPH_US=50000 " +
      Check(
          "--libcuda " TESSERA_FAKE_CUDA_DIR "/libcuda.so.1 --json " + json +
          " --only 'shares,deep queue,graph,long kernels,job of processes,SIGSTOP,lookup,memory'"));
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  ASSERT_TRUE(in) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::set<std::string> passed, memory;
  for (const auto& c : doc.at("checks")) {
    const std::string name = c.at("name").get<std::string>();
    if (c.at("result") == "pass") passed.insert(name);
    // Without NVML the memory figures are "info"; what the library decides (how much VMM memory
    // it lets a job map after releasing the handles) still fails them.
    if (name.rfind("memory limit 1 GiB", 0) == 0) {
      memory.insert(name);
      EXPECT_NE(c.at("result"), "FAIL") << name << "\n" << r.out;
    }
  }
  EXPECT_TRUE(memory.contains("memory limit 1 GiB: VMM released after mapping")) << r.out;
  for (const char* name :
       {"shares 20/30/50", "deep queue 200x1ms", "deep queue 400x5ms", "graph replays 4x50ms",
        "long kernels 200ms", "job of 2 processes", "job of 4 processes", "job of 8 processes",
        "SIGSTOP 1.5 s, then 2 s", "lookup routes"}) {
    EXPECT_TRUE(passed.contains(name)) << name << "\n" << r.out;
  }
  std::filesystem::remove_all(dir);
}

// The container case: the tenant in a pid namespace of its own, the driver (the fake's kernel
// side) listing it under its host pid, gpu-check reading NVML from outside as on a real machine.
// Its modules (100 MiB each here) were not counted under a configured overhead: they filled the
// 16 GiB GPU under a 1 GiB limit.
TEST(GpuCheck, AContainersModulesStayWithinItsLimitOnTheFakeDriver) {
  const std::string dir = Dir();
  tessera::test::FakeGpuKernel kernel(dir);
  const std::string json = dir + "/checks.json";
  const auto r = tessera::test::Capture(
      NvmlOfTheFakeDriver(dir, kernel) + " FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_MODULE_MIB=100 " +
      Check("--libcuda " TESSERA_FAKE_CUDA_DIR "/libcuda.so.1 --json " + json +
            " --only 'container memory'"));
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  ASSERT_TRUE(in) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::set<std::string> passed;
  for (const auto& c : doc.at("checks")) {
    if (c.at("result") == "pass") passed.insert(c.at("name").get<std::string>());
  }
  EXPECT_TRUE(passed.contains("container memory limit 1 GiB: modules")) << r.out;
  EXPECT_TRUE(passed.contains("container memory limit 1 GiB: alloc")) << r.out;
  std::filesystem::remove_all(dir);
}

// The MPS checks against the fake control daemon (tests/fakes/mps) and the fake driver as its
// client: they start and stop a daemon of their own, measure 4 tenants in time slices and under
// MPS (the fake runs one process's kernels at a time: no overlap to show, but every client works),
// hold the pinned memory limit against NVML (the fake driver honours it only as a client of a
// daemon: without one, the tenant would fill the 16 GiB GPU), and see co-tenants go on after one
// client is killed.
TEST(GpuCheck, TheMpsChecksRunAgainstTheFakeControlDaemonAndDriver) {
  const std::string dir = Dir();
  tessera::test::FakeGpuKernel kernel(dir);
  const std::string json = dir + "/checks.json";
  const auto r = tessera::test::Capture(
      NvmlOfTheFakeDriver(dir, kernel) + " FAKE_CUDA_CLOCK=" + dir + "/clock " +
      Check("--libcuda " TESSERA_FAKE_CUDA_DIR "/libcuda.so.1 --json " + json +
            " --only MPS --mps-control " TESSERA_FAKE_MPS_CONTROL));
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  ASSERT_TRUE(in) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::map<std::string, nlohmann::json> checks;
  for (const auto& c : doc.at("checks")) checks[c.at("name").get<std::string>()] = c;
  ASSERT_TRUE(checks.contains("MPS: 4 tenants of small kernels")) << r.out;
  const nlohmann::json& small = checks["MPS: 4 tenants of small kernels"]["data"];
  ASSERT_EQ(small.at("mps_us").size(), 4u) << r.out;
  for (const auto& us : small.at("mps_us")) EXPECT_GT(us.get<double>(), 0) << r.out;
  EXPECT_GT(small.at("mps_ratio").get<double>(), 0.5) << r.out;
  EXPECT_GT(small.at("time_slices_ratio").get<double>(), 0.5) << r.out;
  EXPECT_EQ(checks["MPS: pinned memory limit 1 GiB"].value("result", ""), "pass") << r.out;
  EXPECT_EQ(checks["MPS: a client killed mid-kernel"]["data"].value("co_tenants_running", -1), 3)
      << r.out;
  // Without a daemon the checks say so and fail nothing.
  const auto none = tessera::test::Capture(Check("--libcuda " TESSERA_FAKE_CUDA_DIR
                                                 "/libcuda.so.1 --only MPS --mps-control " +
                                                 dir + "/no-such-control"));
  EXPECT_EQ(none.code, 0) << none.out;
  EXPECT_NE(none.out.find("no MPS here"), std::string::npos) << none.out;
  std::filesystem::remove_all(dir);
}

// VMM memory shared between two tenants of one job on the fake driver: once while both hold it,
// on while the importer maps it after the exporter let go, nothing after both.
TEST(GpuCheck, SharedVmmMemoryIsChargedOnceForItsWholeLifeOnTheFakeDriver) {
  const std::string dir = Dir();
  const std::string json = dir + "/checks.json";
  const auto r = tessera::test::Capture(Check(
      "--libcuda " TESSERA_FAKE_CUDA_DIR "/libcuda.so.1 --json " + json + " --only 'shared VMM'"));
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  ASSERT_TRUE(in) << r.out;
  std::set<std::string> passed;
  const nlohmann::json doc = nlohmann::json::parse(in);
  for (const auto& c : doc.at("checks")) {
    if (c.at("result") == "pass") passed.insert(c.at("name").get<std::string>());
  }
  for (const char* name :
       {"shared VMM 512 MiB: both hold it", "shared VMM 512 MiB: the exporter let go",
        "shared VMM 512 MiB: both let go"}) {
    EXPECT_TRUE(passed.contains(name)) << name << "\n" << r.out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
