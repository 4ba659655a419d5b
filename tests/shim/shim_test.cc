// libtessera-cuda.so against the fake libcuda.so.1, through LD_PRELOAD as in production: a CUDA
// driver-API program (cuda_client) reaches the driver by linking, dlsym and cuGetProcAddress(_v2).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "gpu_kernel.h"
#include "tessera/shim/arbiter.h"

namespace {

using namespace tessera::shim_test;

const char* kRoutes[] = {"link", "dlsym", "procaddr", "procaddr2"};

TEST(Shim, WithoutTheLibraryTheFakeDriverAllowsEverything) {
  Env env{.limit = "1GiB", .preload = false};
  EXPECT_EQ(RunClient(env, "link", "alloc:600 alloc:500"), "ok\nok\n");
}

TEST(Shim, LimitHoldsOnEveryRouteToTheDriver) {
  for (const char* route : kRoutes) {
    Env env{.limit = "1GiB"};
    EXPECT_EQ(RunClient(env, route, "alloc:600 alloc:500 freeall alloc:500"), "ok\noom\nok\nok\n")
        << route;
  }
}

TEST(Shim, EveryRouteToEveryHookedCallGivesTheHook) {
  // 44 calls (10 with a per-thread variant) by dlsym and by both cuGetProcAddress versions with
  // each flag: 44 * 7 + 10 = 318 lookups, none answered with the driver's own function.
  EXPECT_EQ(RunClient(Env{}, "link", "routes"), "routes 318 checked\n");
  // The check itself: without the library every answer is the driver's.
  std::string bare = RunClient(Env{.preload = false}, "link", "routes");
  EXPECT_THAT(bare,
              ::testing::HasSubstr("unhooked cuMemAllocAsync via cuGetProcAddress_v2 flags 2"));
  EXPECT_THAT(bare, ::testing::HasSubstr("unhooked cuLaunchKernel via dlsym ptsz"));
  // A driver whose per-thread variants answer with the legacy entry point's address: the hook is
  // chosen by the name, version and flag asked, so the per-thread hook still comes back (mapping
  // the answer by address gave the legacy hook, with the legacy stream's semantics).
  EXPECT_EQ(RunClient(Env{.extra = "FAKE_CUDA_SHARED_PTSZ=1"}, "link", "routes"),
            "routes 318 checked\n");
}

TEST(Shim, PerThreadDefaultStreamEntryPointsHoldTheLimit) {
  // Asked for with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, the driver hands out the _ptsz
  // variants: two 600 MiB cuMemAllocAsync under a 1 GiB limit both succeeded that way before.
  Env env{.limit = "1GiB"};
  EXPECT_EQ(RunClient(env, "ptsz", "async:600 async:600 freeall async:600"), "ok\noom\nok\nok\n");
}

TEST(Shim, EveryAllocationPathIsCounted) {
  // Each path takes about 60 MiB of a 100 MiB limit; a further 60 MiB must then fail.
  const char* paths[] = {
      "alloc:60",  "pitch:1000:61440", "managed:60",           "async:60",          "pool:60",
      "create:60", "array:4096:3840",  "array3d:1024:1024:15", "mipmap:4096:3072:4"};
  for (const char* route : {"link", "procaddr2"}) {
    for (const char* path : paths) {
      Env env{.limit = "100MiB"};
      EXPECT_EQ(RunClient(env, route, std::string(path) + " alloc:60 freeall alloc:60"),
                "ok\noom\nok\nok\n")
          << route << " " << path;
    }
  }
}

TEST(Shim, MemoryInfoReportsTheLimit) {
  Env env{.limit = "1GiB"};
  EXPECT_EQ(RunClient(env, "procaddr", "info alloc:300 info total"),
            "1024 1024\nok\n724 1024\n1024\n");
  // Without a limit the driver's own figures pass through (the fake has 16 GiB).
  EXPECT_EQ(RunClient(Env{}, "link", "info"), "16384 16384\n");
}

TEST(Shim, LimitsPerDevice) {
  Env env{.limit = "0:100MiB,1:1GiB", .extra = "FAKE_CUDA_DEVICES=2"};
  EXPECT_EQ(RunClient(env, "link", "alloc:200 device:1 alloc:200 info"), "oom\nok\nok\n824 1024\n");
}

TEST(Shim, CuMemCreateCountsOnTheDeviceItsPropertiesName) {
  // Current device 0; the allocations name device 1 or the host: device 1's limit holds, device 0
  // keeps its room, host memory is not counted.
  Env env{.limit = "0:1GiB,1:1GiB", .extra = "FAKE_CUDA_DEVICES=2"};
  EXPECT_EQ(RunClient(env, "link", "create:600:1 create:600:1 create:600:host alloc:900"),
            "ok\noom\nok\nok\n");
}

TEST(Shim, PoolMemoryStaysCountedUntilTheDriverGivesItBack) {
  // A pool keeps what its allocations free. Released at the next synchronize by default
  // (threshold 0)... A pool grows by 32 MiB chunks: 600 MiB asked is 608 MiB held, and charged.
  Env env{.limit = "1GiB"};
  EXPECT_EQ(RunClient(env, "link", "async:600 freeasync info driverused:0 sync info driverused:0"),
            "ok\nok\n416 1024\n608\nok\n1024 1024\n0\n");
  // ...kept past it with a high threshold (PyTorch's cudaMallocAsync backend) until trimmed (to
  // keep 100 MiB here).
  EXPECT_EQ(
      RunClient(env, "procaddr2", "threshold:max async:600 freeasync sync info trim:100 info"),
      "ok\nok\nok\nok\n416 1024\nok\n924 1024\n");
  // Reused from the pool, it is not counted twice.
  EXPECT_EQ(RunClient(env, "link", "threshold:max async:600 freeasync async:600 info"),
            "ok\nok\nok\nok\n416 1024\n");
}

TEST(Shim, APoolsChunksStayWithinTheLimit) {
  // 3 MiB at a time under 100 MiB: counted as asked, 33 would be allowed (99 MiB) and the pool
  // would hold 4 chunks, 128 MiB (what happened on an H100: 1,032 MiB by NVML under 1 GiB).
  // Charged by whole chunks, 32 are (96 MiB), and the driver holds 96 MiB.
  std::string program;
  for (int i = 0; i < 40; ++i) program += "async:3 ";
  std::string want;
  for (int i = 0; i < 40; ++i) want += i < 32 ? "ok\n" : "oom\n";
  EXPECT_EQ(RunClient(Env{.limit = "100MiB"}, "link", program + "driverused:0"), want + "96\n");
}

TEST(Shim, APoolsIdleMemoryIsTrimmedBeforeAnAllocationIsRefused) {
  // The process's own pool holds 600 MiB it does not use: an allocation that needs it gets it,
  // and the driver never holds more than the limit.
  Env env{.limit = "1GiB"};
  EXPECT_EQ(RunClient(env, "link", "threshold:max async:600 freeasync alloc:600 driverused:0"),
            "ok\nok\nok\nok\n600\n");
}

TEST(Shim, GraphMemoryNodesCountAgainstTheLimit) {
  // Under 1 GiB with 600 MiB allocated: a graph whose memory node allocates 300 MiB instantiates
  // (it fits) and runs; the graph memory pool keeps the 300 MiB after it, counted. 200 MiB more
  // does not fit beside it: the library trims the idle graph memory first, then allocates. Now the
  // graph's next launch would need its 300 MiB again beside 800: refused before it runs, and a
  // graph allocating 500 MiB is refused at instantiation. Every route to the entry points.
  const std::string cmds =
      "alloc:600 graph:300 graphlaunch graphpool alloc:200 graphpool graphlaunch graph:500";
  for (const char* route : {"link", "dlsym", "procaddr", "procaddr2"}) {
    EXPECT_EQ(RunClient(Env{.limit = "1GiB"}, route, cmds), "ok\nok\nok\n300\nok\n0\noom\noom\n")
        << route;
  }
  // Without the library the driver lets all of it through (1.1 GiB and more of a 1 GiB share).
  EXPECT_EQ(RunClient(Env{.limit = "1GiB", .preload = false}, "link", cmds),
            "ok\nok\nok\n300\nok\n300\nok\nok\n");
  // What the job sees free (cuMemGetInfo: free, total MiB) counts the pool's memory until an
  // explicit trim gives it back.
  EXPECT_EQ(RunClient(Env{.limit = "1GiB"}, "link",
                      "alloc:600 graph:300 graphlaunch info graphtrim info graphpool"),
            "ok\nok\nok\n124 1024\nok\n424 1024\n0\n");
}

TEST(Shim, AnotherProcesssPoolCountsAgainstTheSharedLimit) {
  // A co-tenant's pool holds 600 MiB of a shared 1 GiB after freeing it: the job has that memory
  // still, so a second 600 MiB is refused (both succeeded before: 1.2 GiB on the GPU).
  std::string region = TempPath("pool.region");
  std::filesystem::remove(region);
  Env env{.limit = "1GiB", .region = region};
  Running holder = Start(env, "link", "threshold:max async:600 freeasync hold");
  EXPECT_EQ(holder.first_line, "ok\n");
  // The first line is the threshold's: the pool is allocated and freed once it says "holding"
  // (the next client raced the holder's allocation before, and failed once under load).
  std::string said;
  char line[64];
  while (said != "holding\n" && fgets(line, sizeof line, holder.out)) said = line;
  ASSERT_EQ(said, "holding\n");
  EXPECT_EQ(RunClient(env, "link", "alloc:600 alloc:400"), "oom\nok\n");
  holder.Stop();
  EXPECT_EQ(RunClient(env, "link", "alloc:600"), "ok\n") << "a dead process's pool is reclaimed";
}

TEST(Shim, ACreatedPoolCountsOnItsDeviceUntilDestroyed) {
  // Device 0 is current; the pool is device 1's: its allocations count there.
  Env env{.limit = "0:1GiB,1:1GiB", .extra = "FAKE_CUDA_DEVICES=2"};
  EXPECT_EQ(RunClient(env, "link",
                      "newpool:1 frompool:600 frompool:600 alloc:900 device:1 info freeasync "
                      "info pooldestroy info"),
            "ok\nok\noom\nok\nok\n424 1024\nok\n424 1024\nok\n1024 1024\n");
  // Destroyed with an allocation outstanding: the idle part goes at once, the rest when freed.
  EXPECT_EQ(RunClient(env, "procaddr",
                      "newpool:1 frompool:300 frompool:300 device:1 freeall frompool:300 "
                      "pooldestroy info freeall info"),
            "ok\nok\nok\nok\nok\nok\nok\n724 1024\nok\n1024 1024\n");
}

TEST(Shim, ConcurrentProcessesNeverExceedTheSharedLimit) {
  std::string region = TempPath("concurrent.region");
  std::filesystem::remove(region);
  Env env{.limit = "1000MiB", .region = region};
  std::vector<Running> procs;
  for (int i = 0; i < 8; ++i)
    procs.push_back(Start(env, i % 2 ? "link" : "procaddr2", "fill:10 hold"));
  int chunks = 0;
  for (Running& r : procs) chunks += atoi(r.first_line.c_str());
  for (Running& r : procs) r.Stop();
  // 100 chunks of 10 MiB fit exactly; the eight processes raced for them.
  EXPECT_EQ(chunks, 100);
}

TEST(Shim, CrashedProcessMemoryIsGivenBack) {
  std::string region = TempPath("crash.region");
  std::filesystem::remove(region);
  Env env{.limit = "1000MiB", .region = region};
  Running holder = Start(env, "link", "alloc:800 hold");
  EXPECT_EQ(holder.first_line, "ok\n");
  EXPECT_EQ(RunClient(env, "link", "alloc:800"), "oom\n") << "the live holder's memory counts";
  holder.Stop();  // SIGKILL: no chance to free anything
  EXPECT_EQ(RunClient(env, "link", "alloc:800"), "ok\n") << "a dead process's memory is reclaimed";
  RunClient(env, "link", "alloc:900 crash");
  EXPECT_EQ(RunClient(env, "link", "alloc:900"), "ok\n");
}

TEST(Shim, NoLeakAfterTenThousandCycles) {
  Env env{.limit = "1GiB"};
  EXPECT_EQ(RunClient(env, "link", "cycle:10000:1 info"), "0\n1024 1024\n");
}

TEST(Shim, ABadRegionFileIsSaidAndCudaIsRefused) {
  // The job's limit is for all its processes: one that cannot join the region (not one, every
  // process slot taken) would keep it for itself alone - a private region with a full limit per
  // process. Refused instead (fail closed).
  std::string region = TempPath("bad.region");
  std::ofstream(region) << "not a region";
  Env env{.limit = "100MiB", .region = region};
  std::string out = RunClient(env, "link", "alloc:60 ctx:0 2>&1");
  EXPECT_THAT(out, ::testing::HasSubstr("not a Tessera shared region"));
  EXPECT_THAT(out, ::testing::HasSubstr("CUDA is refused in this process"));
  EXPECT_THAT(out, ::testing::EndsWith("err 3\nerr 3\n"));
}

std::string NvmlScenario() {
  std::string path = TempPath("nvml.json");
  std::ofstream(path) << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000"},
                                          {"uuid": "GPU-bbbb0000-0000-0000-0000-000000000000"}]})";
  return "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR ":" TESSERA_FAKE_NVML_DIR " FAKE_NVML_SCENARIO=" +
         path;
}

TEST(Shim, NvmlMemoryInfoReportsTheLimit) {
  // Without a limit NVML's own figures (the fake: 16 GiB, 1% used, 0.5% reserved in v2) pass
  // through.
  Env plain{.extra = NvmlScenario()};
  EXPECT_EQ(RunClient(plain, "link", "nvml:0"), "16384 16220 163 | 16384 16138 163\n");
  Env env{.limit = "1GiB", .extra = NvmlScenario()};
  EXPECT_EQ(RunClient(env, "link", "alloc:300 nvml:0"), "ok\n1024 724 300 | 1024 724 300\n");
}

TEST(Shim, NvmlDevicesMapToCudaOrdinalsThroughVisibleDevices) {
  // CUDA sees only NVML device 1, as its device 0: the limit of ordinal 0 applies to NVML index 1.
  Env env{
      .limit = "0:1GiB",
      .extra = NvmlScenario() + " CUDA_VISIBLE_DEVICES=GPU-bbbb0000-0000-0000-0000-000000000000"};
  EXPECT_EQ(RunClient(env, "link", "nvml:1 nvml:0"),
            "1024 1024 0 | 1024 1024 0\n16384 16220 163 | 16384 16138 163\n");
}

TEST(Shim, AMigDeviceIsMatchedByItsUuid) {
  // The job was given a MIG instance of NVML device 1 (CUDA_VISIBLE_DEVICES=MIG-...): NVML's
  // figures for that instance's own handle carry the job's limit; the whole GPU's and the other
  // instance's do not. (MIG handles are not GPU handles: matched by UUID, they never matched
  // before.)
  std::string path = TempPath("nvml-mig.json");
  std::ofstream(path) << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000"},
      {"uuid": "GPU-bbbb0000-0000-0000-0000-000000000000", "mig": 1, "mig_devices": [
        {"uuid": "MIG-cccc0000-0000-0000-0000-000000000000", "memory_total": 10737418240,
         "memory_used": 0},
        {"uuid": "MIG-dddd0000-0000-0000-0000-000000000000", "memory_total": 10737418240,
         "memory_used": 0}]}]})";
  Env env{.limit = "0:1GiB",
          .extra = "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR ":" TESSERA_FAKE_NVML_DIR
                   " FAKE_NVML_SCENARIO=" +
                   path + " CUDA_VISIBLE_DEVICES=MIG-cccc0000-0000-0000-0000-000000000000"};
  EXPECT_EQ(RunClient(env, "link", "nvml:1:0 nvml:1:1"),
            "1024 1024 0 | 1024 1024 0\n10240 10240 0 | 10240 10188 0\n");
  EXPECT_EQ(RunClient(env, "link", "nvml:1"), "16384 16220 163 | 16384 16138 163\n");
}

// A MIG instance's contexts and modules are measured in the instance's own process list (NVML keeps
// one per instance; the GPU's handle does not match a MIG UUID, so nothing was measured before).
TEST(Shim, AMigInstancesContextsAndModulesAreMeasured) {
  std::string path = TempPath("nvml-mig-self.json");
  std::ofstream(path) << R"({"devices": [{"uuid": "GPU-bbbb0000-0000-0000-0000-000000000000",
      "mig": 1, "self_memory": "cuda", "mig_devices": [
        {"uuid": "MIG-cccc0000-0000-0000-0000-000000000000", "memory_total": 10737418240}]}]})";
  Env env{.limit = "1GiB",
          .extra = "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR ":" TESSERA_FAKE_NVML_DIR
                   " FAKE_NVML_SCENARIO=" +
                   path +
                   " CUDA_VISIBLE_DEVICES=MIG-cccc0000-0000-0000-0000-000000000000"
                   " FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_MODULE_MIB=400"};
  EXPECT_EQ(RunClient(env, "link", "ctx:0 info module info module"),
            "ok\n724 1024\nok\n324 1024\noom\n");
}

// The server revokes a user's access to the arbiter by renaming a copy over it: a process of a job
// that goes on launching maps the copy where the old file was, and its GPU time goes on counting
// there (the library's own stat, glibc_compat.cc, is what tells the file was replaced).
// Polls `done` until it holds or 15 s have passed; its last answer.
template <typename Done>
bool WaitUntil(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return done();
}

TEST(Shim, AJobsProcessFollowsAnArbiterRenamedOverTheOldOne) {
  const std::string arbiter = TempPath("follow.arbiter"), next = arbiter + ".next",
                    clock = TempPath("follow.clock");
  for (const std::string& p : {arbiter, next, clock}) unlink(p.c_str());
  Running job = Spawn("exec " + Command(Env{.extra = "FAKE_CUDA_CLOCK=" + clock +
                                                     " TESSERA_CUDA_ARBITER=" + arbiter +
                                                     " TESSERA_CUDA_COMPUTE_SHARE=50% "
                                                     "TESSERA_JOB_ID=follower"},
                                        "link", "work:20000:500:4:0:0:20000"));
  const uint64_t key = tessera::shim::ArbiterJobKey("follower");
  auto busy = [&](const std::string& path) {
    return tessera::shim::ArbiterBusyMicros(path.c_str(), 0, key);
  };
  ASSERT_TRUE(WaitUntil([&] { return busy(arbiter) > 0; })) << "the job runs, paced";
  char err[256] = "";
  ASSERT_TRUE(tessera::shim::CopyArbiterFile(arbiter.c_str(), next.c_str(), err, sizeof err))
      << err;
  const uint64_t copied = busy(next);
  ASSERT_EQ(rename(next.c_str(), arbiter.c_str()), 0);
  EXPECT_TRUE(WaitUntil([&] { return busy(arbiter) > copied; }))
      << "its GPU time counts in the new file";
  job.Stop();
  for (const std::string& p : {arbiter, clock}) unlink(p.c_str());
}

// The arbiter is writable by every user with a share job on the machine: one may truncate it, or
// fill it with garbage, under the other tenants. Nobody dies of it (SIGBUS on the truncated
// mapping before), the truncation is said, and when the file is replaced by a whole one (what the
// server does) the jobs' processes follow it and are paced again.
TEST(Shim, ATruncatedOrScribbledArbiterKillsNoTenant) {
  const std::string arbiter = TempPath("damaged.arbiter"), next = arbiter + ".next",
                    clock = TempPath("damaged.clock");
  for (const std::string& p : {arbiter, next, clock}) unlink(p.c_str());
  auto tenant = [&](const char* job, const char* share) {
    return Spawn(
        "exec " +
        Command(Env{.extra = "FAKE_CUDA_CLOCK=" + clock + " TESSERA_CUDA_ARBITER=" + arbiter +
                             " TESSERA_CUDA_COMPUTE_SHARE=" + share + " TESSERA_JOB_ID=" + job},
                "link", "work:3000:500:4:0:0:3000 2>&1"));
  };
  Running a = tenant("a", "30%"), b = tenant("b", "70%");
  auto busy = [&](const char* job) {
    return tessera::shim::ArbiterBusyMicros(arbiter.c_str(), 0, tessera::shim::ArbiterJobKey(job));
  };
  ASSERT_TRUE(WaitUntil([&] { return busy("a") > 0 && busy("b") > 0; })) << "both run, paced";
  {
    // Garbage first (a lease naming slot 40,000, counts and pids of nothing), then nothing at all.
    std::ofstream scribble(arbiter, std::ios::in | std::ios::out | std::ios::binary);
    scribble.seekp(16);
    for (int i = 0; i < 4096; ++i) scribble.put(static_cast<char>(0x9c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(truncate(arbiter.c_str(), 0), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // The server's remedy: a whole arbiter renamed over the damaged one.
  char err[256] = "";
  ASSERT_TRUE(tessera::shim::CopyArbiterFile(arbiter.c_str(), next.c_str(), err, sizeof err))
      << err;
  ASSERT_EQ(rename(next.c_str(), arbiter.c_str()), 0);
  EXPECT_TRUE(WaitUntil([&] { return busy("a") > 0 && busy("b") > 0; }))
      << "both follow the new file and are paced again";
  const std::string out_a = a.Output(), out_b = b.Output();
  for (const std::string& out : {out_a, out_b}) {
    EXPECT_THAT(out, ::testing::HasSubstr("gpu_us ")) << "ran to its end";
    EXPECT_THAT(out, ::testing::HasSubstr("GPU arbiter file " + arbiter + " was truncated"));
  }
  for (const std::string& p : {arbiter, clock}) unlink(p.c_str());
}

// A job's region may be truncated by the job's own user: its processes do not die of it, and
// since what the job holds is no longer known, they are allowed nothing more (fail closed).
TEST(Shim, ATruncatedRegionRefusesAllocationsAndKillsNobody) {
  const std::string region = TempPath("truncated.region"), go = TempPath("truncated.go");
  for (const std::string& p : {region, go}) unlink(p.c_str());
  Running job = Start(Env{.limit = "1GiB", .region = region}, "link",
                      "alloc:64 waitfile:" + go + " alloc:64 info 2>&1");
  ASSERT_EQ(job.first_line, "ok\n");
  ASSERT_EQ(truncate(region.c_str(), 0), 0);
  std::ofstream(go).put('\n');
  const std::string rest = job.Output();
  EXPECT_THAT(rest, ::testing::HasSubstr("memory region file was truncated"));
  EXPECT_THAT(rest, ::testing::HasSubstr("oom\n"));
  EXPECT_THAT(rest, ::testing::Not(::testing::HasSubstr("\nok\n"))) << rest;
  for (const std::string& p : {region, go}) unlink(p.c_str());
}

// A copy of the driver's file opened by another path is another object, with its own state, that
// the hooks would not see (5,100 MiB allocated under a 1 GiB limit before): its entry points are
// refused, and said.
// VMM memory (cuMemCreate + cuMemMap) is the driver's until its last mapping goes, released or
// not: NVIDIA's memmap sample releases each handle right after mapping it. Charged that long, on
// every route; the fake driver keeps the memory as the real one does (checked without the library).
TEST(Shim, VmmMemoryIsChargedUntilItsLastMappingGoes) {
  for (const char* route : {"link", "dlsym", "procaddr2"}) {
    Env env{.limit = "1GiB"};
    EXPECT_EQ(RunClient(env, route, "vmm:256 vmm:256 vmm:256 vmm:256 vmm:256 info 2>&1"),
              "ok\nok\nok\nok\noom\n0 1024\n")
        << route << ": four of 256 MiB fill 1 GiB, their handles released or not";
    // Unmapped, the memory goes back, and room with it.
    EXPECT_EQ(RunClient(env, route, "vmm:512 vmm:512 vmmunmap:1 info vmm:256 vmm:256 vmm:256 2>&1"),
              "ok\nok\nok\n512 1024\nok\nok\noom\n")
        << route;
  }
  // The driver itself: the released handles' memory stays in use while mapped (16 GiB device).
  Env bare{.preload = false};
  EXPECT_EQ(RunClient(bare, "link", "vmm:1024 vmm:1024 info vmmunmap info"),
            "ok\nok\n14336 16384\nok\n16384 16384\n");
}

// The next line a running client writes ("" at its end).
std::string Line(Running& r) {
  char line[256] = "";
  return fgets(line, sizeof line, r.out) ? std::string(line) : std::string();
}

// VMM memory one process exports and another of the job imports (an inference server handing its
// workers a weights buffer, by descriptor over a unix socket or as a fabric handle) is one
// allocation: charged once while both hold it, and on after the exporter lets go while the importer
// still maps it - the driver frees it only then. Before, the exporter's unmap gave the charge back
// while the memory lived on in the importer: 600 MiB more fitted beside it under 1 GiB.
TEST(Shim, VmmMemorySharedBetweenProcessesIsChargedOnceForItsWholeLife) {
  for (const std::string kind : {"", ":fabric"}) {
    SCOPED_TRACE(kind.empty() ? "descriptor" : "fabric");
    const std::string region = TempPath("vmm-share" + kind.substr(kind.empty() ? 0 : 1));
    std::filesystem::remove(region);
    const std::string sock = TempPath("vmm.sock"), go1 = TempPath("vmm-go1"),
                      go2 = TempPath("vmm-go2");
    std::filesystem::remove(go1), std::filesystem::remove(go2);
    const Env env{.limit = "1GiB", .region = region};
    Running a = Spawn("exec " + Command(env, "link",
                                        "vmmexport:512:" + sock + kind + " info waitfile:" + go1 +
                                            " freeall vmmunmap info"));
    Running b = Spawn("exec " + Command(env, "link",
                                        "vmmimport:" + sock + kind + " info waitfile:" + go2 +
                                            " alloc:600 freeall vmmunmap info alloc:600 freeall"));
    EXPECT_EQ(Line(a), "ok\n");
    EXPECT_EQ(Line(b), "ok\n");
    EXPECT_EQ(Line(b), "512 1024\n") << "counted once while both hold it";
    EXPECT_EQ(Line(a), "512 1024\n");
    std::ofstream(go1).put('x');
    // The exporter released and unmapped it; the importer maps it still: still the job's.
    EXPECT_EQ(a.Output(), "ok\nok\n512 1024\n");
    std::ofstream(go2).put('x');
    EXPECT_EQ(b.Output(), "oom\nok\nok\n1024 1024\nok\nok\n")
        << "the importer's mapping keeps the charge until it goes";
  }
}

// The exporter killed while the importer maps the memory: the charge passes to the importer (the
// dead process's slot gives back only the rest), never lost.
TEST(Shim, SharedVmmMemoryOutlivesItsKilledExporterAndStaysCharged) {
  const std::string region = TempPath("vmm-killed");
  std::filesystem::remove(region);
  const std::string sock = TempPath("vmm-killed.sock"), go = TempPath("vmm-killed-go");
  std::filesystem::remove(go);
  const Env env{.limit = "1GiB", .region = region};
  Running a = Spawn("exec " + Command(env, "link", "alloc:100 vmmexport:512:" + sock + " hold"));
  Running b = Spawn("exec " + Command(env, "link",
                                      "vmmimport:" + sock + " info waitfile:" + go +
                                          " alloc:500 info freeall vmmunmap info"));
  EXPECT_EQ(Line(a), "ok\n");
  EXPECT_EQ(Line(a), "ok\n");
  EXPECT_EQ(Line(a), "holding\n");
  EXPECT_EQ(Line(b), "ok\n");
  EXPECT_EQ(Line(b), "412 1024\n");
  a.Stop();  // SIGKILL: its 100 MiB go back, the shared 512 MiB do not
  std::ofstream(go).put('x');
  EXPECT_EQ(b.Output(), "ok\n12 1024\nok\nok\n1024 1024\n");
}

// Memory imported from another job's export is this job's to count: charged as the importer's
// own from its first mapping while it holds the handle or a mapping (both keep it alive).
TEST(Shim, VmmMemoryImportedFromAnotherJobIsChargedToTheImporter) {
  const std::string ra = TempPath("vmm-job-a"), rb = TempPath("vmm-job-b");
  std::filesystem::remove(ra), std::filesystem::remove(rb);
  const std::string sock = TempPath("vmm-jobs.sock");
  Running a = Spawn("exec " + Command(Env{.limit = "1GiB", .region = ra}, "link",
                                      "vmmexport:512:" + sock + " info hold"));
  EXPECT_EQ(RunClient(Env{.limit = "600MiB", .region = rb}, "link",
                      "vmmimport:" + sock + " info alloc:100 freeall vmmunmap info alloc:100"),
            "ok\n88 600\noom\nok\nok\n600 600\nok\n");
  EXPECT_EQ(Line(a), "ok\n");
  EXPECT_EQ(Line(a), "512 1024\n");
  a.Stop();
}

TEST(Shim, AnotherCopyOfTheDriverIsRefused) {
  const std::string dir = TempPath("copy");
  std::filesystem::create_directories(dir);
  const std::string copy = dir + "/libcuda.so.1";
  std::filesystem::copy_file(TESSERA_FAKE_CUDA_DIR "/libcuda.so.1", copy,
                             std::filesystem::copy_options::overwrite_existing);
  Env env{.limit = "100MiB", .extra = "CUDA_CLIENT_LIBCUDA=" + copy};
  EXPECT_EQ(RunClient(Env{.preload = false, .extra = env.extra}, "dlsym", "alloc:200 2>&1"), "ok\n")
      << "the copy is a driver that works";
  const std::string out = RunClient(env, "dlsym", "alloc:200 2>&1");
  EXPECT_THAT(out, ::testing::HasSubstr(copy + " is another copy of the CUDA driver"));
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("ok\n")));
  EXPECT_EQ(RunClient(env, "procaddr", "alloc:200 2>&1").find("ok\n"), std::string::npos)
      << "nor through its cuGetProcAddress";
  // Recognised by what it is, not its name: the same driver renamed.
  const std::string renamed = dir + "/libnvgpu-runtime-private.so";
  std::filesystem::copy_file(TESSERA_FAKE_CUDA_DIR "/libcuda.so.1", renamed,
                             std::filesystem::copy_options::overwrite_existing);
  Env other{.limit = "100MiB", .extra = "CUDA_CLIENT_LIBCUDA=" + renamed};
  const std::string out2 = RunClient(other, "dlsym", "alloc:200 2>&1");
  EXPECT_THAT(out2, ::testing::HasSubstr(renamed + " is another copy of the CUDA driver"));
  EXPECT_THAT(out2, ::testing::Not(::testing::HasSubstr("ok\n")));
  // Another library preloaded beside the library (a tracer) is no driver: nothing is refused.
  EXPECT_EQ(RunClient(Env{.limit = "100MiB",
                          .preload = false,
                          .extra = "LD_PRELOAD=" TESSERA_SHIM_LIBRARY ":" TESSERA_TEST_INTERPOSER},
                      "dlsym", "alloc:60 alloc:60 2>/dev/null"),
            "ok\noom\n");
  std::filesystem::remove_all(dir);
}

TEST(Shim, NvmlUtilizationInsideAJobWithAComputeShareIsItsOwn) {
  // The GPU's own figure (the fake's) is 3% busy, one the job's cannot be after it kept the GPU
  // busy (at least 10%, below): the job's figure passed through would fail. Memory bandwidth 40%.
  std::string path = TempPath("nvml-util.json");
  std::ofstream(path) << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000",
      "utilization": 3, "memory_utilization": 40}]})";
  const std::string nvml = "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR ":" TESSERA_FAKE_NVML_DIR
                           " FAKE_NVML_SCENARIO=" +
                           path;
  const std::string arbiter = TempPath("util.arbiter");
  unlink(arbiter.c_str());
  const std::string job = nvml + " TESSERA_CUDA_ARBITER=" + arbiter +
                          " TESSERA_CUDA_COMPUTE_SHARE=50% TESSERA_JOB_ID=util-job";
  // Outside a job with a share: the GPU's own figures.
  EXPECT_EQ(RunClient(Env{.extra = nvml}, "link", "nvmlutil:0"), "util 3 mem 40\n");
  // In the job, before it has run anything on the GPU: its own 0%, not the GPU's 3%.
  EXPECT_EQ(RunClient(Env{.extra = job}, "link", "nvmlutil:0"), "util 0 mem 40\n");
  // After it kept the GPU busy alone for 1.2 s (work-conserving, so all of it): a process of the
  // job asking afterwards (as nvidia-smi would) sees the job's recent utilization, well above 0,
  // computed from the arbiter's count (it was 93% once on a loaded machine: any figure of a busy
  // job may be, so the GPU's own is one no busy job can have).
  EXPECT_THAT(RunClient(Env{.extra = job}, "link", "work:1200:1000:4:0:0:1200"),
              ::testing::HasSubstr("batches"));
  const std::string out = RunClient(Env{.extra = job}, "link", "nvmlutil:0");
  unsigned util = 0, mem = 0;
  ASSERT_EQ(sscanf(out.c_str(), "util %u mem %u", &util, &mem), 2) << out;
  EXPECT_GE(util, 10u) << out;
  EXPECT_LE(util, 100u) << out;
  EXPECT_EQ(mem, 40u) << "memory bandwidth is the GPU's";
  unlink(arbiter.c_str());
}

TEST(Shim, NvmlListsOnlyTheJobsOwnProcesses) {
  // Two other tenants' processes and this one on GPU 0: inside the job, every call and version
  // (reached by dlsym, as pynvml and nvidia-smi do) lists this process alone.
  std::string path = TempPath("nvml-procs.json");
  std::ofstream(path) << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000",
      "processes": [{"pid": 1, "used_memory": 2147483648}, {"pid": 999999, "used_memory": 1048576}],
      "self_memory": 314572800}]})";
  const std::string extra = "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR ":" TESSERA_FAKE_NVML_DIR
                            " FAKE_NVML_SCENARIO=" +
                            path;
  EXPECT_EQ(RunClient(Env{.preload = false, .extra = extra}, "link", "procs:0:compute:3"),
            "3: 1/2048 999999/1 self/300\n");
  for (const char* call : {"compute", "graphics"}) {
    for (const char* version : {"1", "2", "3"}) {
      std::string cmd = std::string("procs:0:") + call + ":" + version;
      EXPECT_EQ(RunClient(Env{.limit = "1GiB", .extra = extra}, "link", cmd), "1: self/300\n")
          << cmd;
    }
  }
}

TEST(Shim, ContextOverheadCountsForEveryContextWhileItLives) {
  Env env{.limit = "1GiB", .extra = "TESSERA_CUDA_CONTEXT_OVERHEAD=300MiB"};
  // Each context has its own memory on the device: two cost the overhead twice, each giving its
  // part back when it goes; a fourth does not fit (before, five cost it once: 2,200 MiB were used
  // under a 1 GiB limit in a container).
  EXPECT_EQ(RunClient(env, "link", "ctx:0 ctx:0 info ctxdestroy info ctxdestroy info"),
            "ok\nok\n424 1024\nok\n724 1024\nok\n1024 1024\n");
  EXPECT_EQ(RunClient(env, "link", "ctx:0 ctx:0 ctx:0 ctx:0"), "ok\nok\nok\noom\n");
  // The primary context is one context however often it is retained: once.
  EXPECT_EQ(RunClient(env, "link",
                      "primary:0 primary:0 alloc:800 primaryrelease:0 primaryrelease:0 "
                      "alloc:200"),
            "ok\nok\noom\nok\nok\nok\n");
  // Every cuCtxCreate version counts the same (CUDA 11.4+ and 12.5+ callers use _v3 and _v4).
  EXPECT_EQ(RunClient(env, "link", "ctx3:0 info ctx4:0 info ctxdestroy ctxdestroy info"),
            "ok\n724 1024\nok\n424 1024\nok\nok\n1024 1024\n");
  // A primary context beside a created one: both counted.
  EXPECT_EQ(RunClient(env, "link", "primary:0 ctx:0 info primaryrelease:0 info"),
            "ok\nok\n424 1024\nok\n724 1024\n");
  // A context that would not fit is refused like an allocation.
  Env small{.limit = "200MiB", .extra = "TESSERA_CUDA_CONTEXT_OVERHEAD=300MiB"};
  EXPECT_EQ(RunClient(small, "link", "ctx:0"), "oom\n");
}

TEST(Shim, ContextAndModuleMemoryIsMeasuredAndCounted) {
  // No overhead configured: what the driver says this process holds beyond its allocations (a
  // context's 300 MiB, a module's 100 MiB; NVML's process list) is charged, and given back when
  // they go. The limit never saw either before.
  std::string path = TempPath("nvml-self.json");
  std::ofstream(path) << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000",
                                          "self_memory": "cuda"}]})";
  const std::string extra = "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR ":" TESSERA_FAKE_NVML_DIR
                            " FAKE_NVML_SCENARIO=" +
                            path + " FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_MODULE_MIB=100";
  Env env{.limit = "1GiB", .extra = extra};
  EXPECT_EQ(RunClient(env, "link",
                      "ctx:0 info alloc:200 info module info moduleunload info ctxdestroy info"),
            "ok\n724 1024\nok\n524 1024\nok\n424 1024\nok\n524 1024\nok\n824 1024\n");
  EXPECT_EQ(RunClient(env, "procaddr2", "primary:0 moduleex info primaryrelease:0 info"),
            "ok\nok\n624 1024\nok\n924 1024\n");
  // A module from a file or a fat binary, and CUDA 12's libraries (what the CUDA 12 runtime loads
  // a program's kernels with), on every route: measured alike. Before, none was seen.
  for (const char* route : {"link", "dlsym", "procaddr", "procaddr2"}) {
    EXPECT_EQ(RunClient(env, route,
                        "ctx:0 modulefile fatbinary info library libraryfile info libraryunload "
                        "moduleunload info"),
              "ok\nok\nok\n524 1024\nok\nok\n324 1024\nok\nok\n524 1024\n")
        << route;
  }
  // A context or a module that does not fit is refused, and leaves nothing behind.
  Env small{.limit = "350MiB", .extra = extra};
  EXPECT_EQ(RunClient(small, "link", "ctx:0 module info driverused:0"), "ok\noom\n50 350\n300\n");
  EXPECT_EQ(RunClient(small, "link", "ctx:0 library libraryfile info driverused:0"),
            "ok\noom\noom\n50 350\n300\n");
  Env tiny{.limit = "200MiB", .extra = extra};
  EXPECT_EQ(RunClient(tiny, "link", "ctx:0 driverused:0 alloc:200"), "oom\n0\nok\n");
  // A driver that cannot say (NVML_VALUE_NOT_AVAILABLE): nothing measured, nothing refused.
  std::string na = TempPath("nvml-na.json");
  std::ofstream(na) << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000",
                                        "self_memory": 18446744073709551615}]})";
  Env unknown{.limit = "1GiB",
              .extra = "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR ":" TESSERA_FAKE_NVML_DIR
                       " FAKE_NVML_SCENARIO=" +
                       na + " FAKE_CUDA_CONTEXT_MIB=300"};
  EXPECT_EQ(RunClient(unknown, "link", "ctx:0 info"), "ok\n1024 1024\n");
}

// A container: the tenant runs in a pid namespace of its own (with its own /proc, as a container
// runtime gives it), and the driver lists it under its host pid, which it cannot see (the fake's
// kernel side, gpu_kernel.h, as the NVIDIA driver does). The launcher's configured overhead
// (TESSERA_CUDA_CONTEXT_OVERHEAD, set by the node agent for every pod) counted each context, but
// no module: 5 modules of 400 MiB took 3,000 MiB under a 1 GiB limit. Now the library finds its
// host pid by a probe and measures: each module is counted, the third refused.
TEST(Shim, AContainersContextsAndModulesAreMeasuredUnderItsHostPid) {
  tessera::test::FakeGpuKernel kernel(::testing::TempDir());
  std::string path = TempPath("nvml-kernel.json");
  std::ofstream(path) << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000",
                                          "self_memory": "cuda"}]})";
  const std::string extra = "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR ":" TESSERA_FAKE_NVML_DIR
                            " FAKE_NVML_SCENARIO=" +
                            path + " FAKE_GPU_KERNEL=" + kernel.path() +
                            " FAKE_CUDA_CONTEXT_MIB=300 FAKE_CUDA_MODULE_MIB=400"
                            " TESSERA_CUDA_CONTEXT_OVERHEAD=300MiB";
  const std::string container = "unshare --user --map-root-user --pid --fork --mount-proc ";
  const std::string program = "ctx:0 info module info module info moduleunload info";
  // The fake is as unkind as the driver: inside the namespace the process is not listed under the
  // pid it has there (1), and without the probe only the configured overhead would count.
  const std::string listed =
      tessera::test::Capture(container + Command(Env{.preload = false, .extra = extra}, "link",
                                                 "ctx:0 procs:0:compute:3"))
          .out;
  EXPECT_THAT(listed, ::testing::StartsWith("ok\n1: "));
  EXPECT_THAT(listed, ::testing::Not(::testing::HasSubstr("self"))) << "listed under its own pid";
  // A tenant's NVML shows its own processes, by the pid the driver knows them by.
  EXPECT_EQ(tessera::test::Capture(container + Command(Env{.limit = "1GiB", .extra = extra}, "link",
                                                       "ctx:0 procs:0:compute:3"))
                .out.substr(0, 6),
            "ok\n1: ");
  // Four containers at once, each probing beside the others' contexts, modules and probes.
  std::vector<Running> tenants;
  for (int i = 0; i < 4; ++i) {
    tenants.push_back(
        Spawn(container + Command(Env{.limit = "1GiB", .extra = extra}, "link", program)));
  }
  for (Running& t : tenants) {
    EXPECT_EQ(t.Output(), "ok\n724 1024\nok\n324 1024\noom\n324 1024\nok\n724 1024\n");
  }
  // Where nothing can be found (a driver that cannot say), the configured overhead still counts
  // each context, and modules are not seen (the old behaviour, documented).
  std::string na = TempPath("nvml-kernel-na.json");
  std::ofstream(na) << R"({"devices": [{"uuid": "GPU-aaaa0000-0000-0000-0000-000000000000",
                                        "self_memory": 0}]})";
  std::string blind = extra;
  blind.replace(blind.find(path), path.size(), na);
  EXPECT_EQ(tessera::test::Capture(container + Command(Env{.limit = "1GiB", .extra = blind}, "link",
                                                       "ctx:0 info module info"))
                .out,
            "ok\n724 1024\nok\n724 1024\n");
}

// Sizes as users write them (Slurm's `16G`, SI's `GB`, decimals, a space) are the limits the docs
// say: 1G and 1GiB are 1024 MiB, 1GB is 10^9 bytes (953.7 MiB), 1.5GiB is 1536 MiB. An allocation
// over 2 MiB counts as the whole 2 MiB pages the driver gives it.
TEST(Shim, SizesAsUsersWriteThemAreTheDocumentedLimits) {
  const struct {
    const char* limit;
    const char* program;
    const char* want;
  } cases[] = {
      {"1G", "alloc:1024 alloc:1", "ok\noom\n"},
      {"1GiB", "alloc:1024 alloc:1", "ok\noom\n"},
      {"1 GiB", "alloc:1024 alloc:1", "ok\noom\n"},
      {"1024M", "alloc:1024 alloc:1", "ok\noom\n"},
      {"1073741824", "alloc:1024 alloc:1", "ok\noom\n"},
      {"1GB", "alloc:954", "oom\n"},
      {"1GB", "alloc:952", "ok\n"},
      // 953 MiB would fit 1 GB (953.7 MiB), but the driver gives whole 2 MiB pages: 954 MiB.
      {"1GB", "alloc:953", "oom\n"},
      {"1GiB", "alloc:1020 alloc:3 alloc:1", "ok\nok\noom\n"},
      {"1.5GiB", "alloc:1536 alloc:1", "ok\noom\n"},
      {"0:1G,1:2GB", "alloc:1024 alloc:1", "ok\noom\n"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(RunClient(Env{.limit = c.limit}, "link", c.program), c.want) << c.limit;
  }
}

// A malformed limit, overhead or share never means "no limit": the library says what is wrong and
// refuses every call it hooks, on every route to the driver (dlsym too: the hook, which refuses,
// not the driver's own entry point).
TEST(Shim, MalformedSettingsRefuseCudaInsteadOfLiftingTheLimit) {
  // "0.4B" rounds to 0 bytes (which would mean no limit); a device named twice would take its last
  // value.
  for (const char* bad : {"lots", "10XB", "10Gb", "1 0GiB", "1.5", "-1", "1e9", "99999999999T",
                          "0.4B", "0:1GiB,0:80GiB", "0:1GiB,1:1GiB,0:2GiB"}) {
    std::string out = RunClient(Env{.limit = bad}, "link", "alloc:1 2>&1");
    EXPECT_THAT(out, ::testing::HasSubstr(std::string("TESSERA_CUDA_MEM_LIMIT='") + bad +
                                          "' is not a size"))
        << bad;
    EXPECT_THAT(out, ::testing::HasSubstr("CUDA is refused in this process")) << bad;
    EXPECT_THAT(out, ::testing::EndsWith("err 3\n")) << bad;
  }
  // Linked and looked up by dlsym: the hooks, which refuse. Through cuGetProcAddress: nothing is
  // handed out at all (the lookup itself is refused), so the program cannot start its CUDA work.
  for (const char* route : {"link", "dlsym"}) {
    EXPECT_EQ(RunClient(Env{.limit = "lots"}, route, "alloc:1 async:1 ctx:0 2>/dev/null"),
              "err 3\nerr 3\nerr 3\n")
        << route;
  }
  for (const char* route : {"procaddr", "procaddr2"}) {
    EXPECT_THAT(RunClient(Env{.limit = "lots"}, route, "alloc:1 2>&1"),
                ::testing::HasSubstr("cuda_client: cannot resolve cuMemAlloc_v2"))
        << route;
  }
  // An overhead of 0 would stop counting contexts and modules: refused like a malformed one.
  for (const char* bad : {"-5", "0", "0GiB"}) {
    std::string out = RunClient(
        Env{.limit = "1GiB", .extra = std::string("TESSERA_CUDA_CONTEXT_OVERHEAD=") + bad}, "link",
        "ctx:0 alloc:1 2>&1");
    EXPECT_THAT(out, ::testing::HasSubstr(std::string("TESSERA_CUDA_CONTEXT_OVERHEAD='") + bad +
                                          "' is not a size above 0"));
    EXPECT_THAT(out, ::testing::EndsWith("err 3\nerr 3\n")) << bad;
  }
  // What still parses: an explicit 0 (no limit), a size of a fraction that is whole bytes.
  EXPECT_EQ(RunClient(Env{.limit = "0.5KiB"}, "link", "alloc:1 2>&1"), "oom\n");
  EXPECT_EQ(RunClient(Env{.limit = "0:1GiB,1:2GiB"}, "link", "alloc:600 alloc:500 2>&1"),
            "ok\noom\n");
}

// Another interposer preloaded before or after the library (a profiler, a tracer) finds the next
// definition with dlsym(RTLD_NEXT) as without the library: libc's puts for its wrapper (it aborts
// if handed its own), and the limit still holds.
TEST(Shim, AnotherInterposerResolvesRtldNextAsWithoutTheLibrary) {
  const std::string shim = TESSERA_SHIM_LIBRARY, tracer = TESSERA_TEST_INTERPOSER;
  for (const std::string& order : {shim + ":" + tracer, tracer + ":" + shim}) {
    Env env{.limit = "1GiB", .preload = false, .extra = "LD_PRELOAD=" + order};
    EXPECT_EQ(RunClient(env, "link", "alloc:600 alloc:500 2>/dev/null"), "ok\noom\n") << order;
    const std::string err = RunClient(env, "dlsym", "alloc:600 alloc:500 2>&1 >/dev/null");
    EXPECT_THAT(err, ::testing::HasSubstr("interposer: 2 puts")) << order;
    EXPECT_THAT(err, ::testing::Not(::testing::HasSubstr("own puts"))) << order;
  }
}

// The library loads in the images jobs bring: it asks glibc for no symbol version newer than 2.17
// (CentOS 7; Ubuntu 20.04 has 2.31, UBI 8 2.28), and names libdl and libpthread, where the base
// versions of dlopen and pthread_once live before glibc 2.34. Read from the built library.
TEST(Shim, NeedsNoGlibcNewerThan2_17) {
  FILE* p = popen("objdump -T " TESSERA_SHIM_LIBRARY " 2>&1", "r");
  ASSERT_NE(p, nullptr);
  std::string symbols;
  char line[512];
  while (fgets(line, sizeof line, p) != nullptr) symbols += line;
  ASSERT_EQ(pclose(p), 0) << symbols;
  std::string newer;
  int versions = 0;
  for (size_t at = symbols.find("GLIBC_2."); at != std::string::npos;
       at = symbols.find("GLIBC_2.", at + 1)) {
    ++versions;
    const int minor = std::atoi(symbols.c_str() + at + 8);
    if (minor > 17) {
      const size_t bol = symbols.rfind('\n', at) + 1;
      newer += symbols.substr(bol, symbols.find('\n', at) - bol) + "\n";
    }
  }
  EXPECT_GT(versions, 10) << "objdump listed no versioned symbol:\n" << symbols;
  EXPECT_EQ(newer, "") << "symbols of glibc newer than 2.17";
  FILE* d = popen("readelf -d " TESSERA_SHIM_LIBRARY " 2>&1", "r");
  ASSERT_NE(d, nullptr);
  std::string dynamic;
  while (fgets(line, sizeof line, d) != nullptr) dynamic += line;
  pclose(d);
  EXPECT_THAT(dynamic, ::testing::HasSubstr("[libdl.so.2]"));
  EXPECT_THAT(dynamic, ::testing::HasSubstr("[libpthread.so.0]"));
}

TEST(Shim, KernelLaunchesPassThrough) {
  Env env{.limit = "1GiB"};
  EXPECT_EQ(RunClient(env, "procaddr2", "launch:100 alloc:1"), "ok\nok\n");
}

}  // namespace
