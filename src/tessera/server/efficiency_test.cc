// A job's efficiency from its record: what it used of what it held, for whole GPUs and shares,
// with the host's CPU and memory, and nothing made up where nothing was measured.
#include "tessera/server/efficiency.h"

#include <gtest/gtest.h>

namespace tessera::server {
namespace {

using nlohmann::json;

json Job(json placement, json resources, json usage, double started = 1000, json ended = 4600) {
  return {{"started_at", started},
          {"ended_at", ended},
          {"placement", placement},
          {"spec", {{"command", {"train"}}, {"resources", resources}}},
          {"usage", usage}};
}

TEST(Efficiency, WholeGpusAgainstWhatTheyHeld) {
  json placement = {{"gpus", {{{"index", 0}}, {{"index", 1}}}},
                    {"milli_per_gpu", 1000},
                    {"memory_mib_per_gpu", 81559}};
  json usage = {{"gpu_utilization_pct", 43.0},
                {"gpu_peak_memory_mib", 20390},
                {"cpu_seconds", 7200.0},
                {"peak_memory_bytes", int64_t{4} << 30}};
  json e = EfficiencyOf(Job(placement, {{"gpus", 2}, {"cpus", 4}, {"memory", "16GiB"}}, usage), 0);
  EXPECT_EQ(e["running"], false);
  EXPECT_DOUBLE_EQ(e["elapsed_s"].get<double>(), 3600);
  EXPECT_DOUBLE_EQ(e["gpus"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(e["gpu_hours"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(e["gpu_busy_pct"].get<double>(), 43);
  EXPECT_EQ(e["gpu_memory_given_mib"], 81559);
  EXPECT_DOUBLE_EQ(e["gpu_memory_pct"].get<double>(), 25);
  EXPECT_DOUBLE_EQ(e["cpu_pct"].get<double>(), 50) << "7,200 CPU-s of 4 CPUs x 1 h";
  EXPECT_EQ(e["memory_limit_bytes"], int64_t{16} << 30);
  EXPECT_DOUBLE_EQ(e["memory_pct"].get<double>(), 25);
}

TEST(Efficiency, AShareIsMeasuredAgainstItsShare) {
  // 30% of a GPU and 10 GiB; the arbiter charged it 15% of the GPU's time: half of its share.
  json placement = {
      {"gpus", {{{"index", 3}}}}, {"milli_per_gpu", 300}, {"memory_mib_per_gpu", 10240}};
  json usage = {{"gpu_utilization_pct", 15.0}, {"gpu_peak_memory_mib", 9216}};
  json resources = {{"gpu_share", "30%"}, {"gpu_memory", "10240MiB"}};
  json e = EfficiencyOf(Job(placement, resources, usage), 0);
  EXPECT_DOUBLE_EQ(e["gpus"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(e["gpu_hours"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(e["gpu_busy_pct"].get<double>(), 50);
  EXPECT_DOUBLE_EQ(e["gpu_memory_pct"].get<double>(), 90);
  EXPECT_FALSE(e.contains("gpu_used_pct")) << "within its share";
  EXPECT_FALSE(e.contains("cpu_pct")) << "nothing measured, nothing said";
  // Alone on its GPU, work-conserving sharing lent it the idle time: busy is all of what it held,
  // and how far past its share it went is said.
  usage["gpu_utilization_pct"] = 57.0;
  e = EfficiencyOf(Job(placement, resources, usage), 0);
  EXPECT_DOUBLE_EQ(e["gpu_busy_pct"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(e["gpu_used_pct"].get<double>(), 57);
  EXPECT_FALSE(e.contains("memory_pct"));
}

// A share of GPU memory only (no compute part asked): it holds its memory's part of the GPU, as
// accounting weighs it - not nothing - and its memory is measured against what it was given.
TEST(Efficiency, AMemoryOnlyShareHoldsItsMemorysPartOfTheGpu) {
  json placement = {{"gpus", {{{"index", 1}}}}, {"milli_per_gpu", 0}, {"memory_mib_per_gpu", 2048}};
  json usage = {{"gpu_peak_memory_mib", 1500}};
  auto memory = [](int gpu) -> int64_t { return gpu == 1 ? 81920 : 0; };
  json e = EfficiencyOf(Job(placement, {{"gpu_memory", "2GiB"}}, usage), 0, memory);
  EXPECT_DOUBLE_EQ(e["gpus"].get<double>(), 0.025) << "2 GiB of 80 GiB";
  EXPECT_DOUBLE_EQ(e["gpu_hours"].get<double>(), 0.025);
  EXPECT_EQ(e["share"], true);
  EXPECT_EQ(e["gpu_memory_given_mib"], 2048);
  EXPECT_DOUBLE_EQ(e["gpu_memory_pct"].get<double>(), 73.2);
  EXPECT_FALSE(e.contains("gpu_busy_pct")) << "no compute part: nothing to be busy of";
  // Where the GPU's memory is not known, the GPU counts whole, as accounting counts it.
  e = EfficiencyOf(Job(placement, {{"gpu_memory", "2GiB"}}, usage), 0);
  EXPECT_DOUBLE_EQ(e["gpus"].get<double>(), 1);
}

TEST(Efficiency, HeldOfGpuIsTheLargerOfComputeAndMemory) {
  EXPECT_DOUBLE_EQ(HeldOfGpu(1000, 81920, 81920), 1);
  EXPECT_DOUBLE_EQ(HeldOfGpu(300, 8192, 81920), 0.3) << "compute the larger";
  EXPECT_DOUBLE_EQ(HeldOfGpu(100, 40960, 81920), 0.5) << "memory the larger";
  EXPECT_DOUBLE_EQ(HeldOfGpu(100, 40960, 0), 0.1) << "memory not known: compute alone";
  EXPECT_DOUBLE_EQ(HeldOfGpu(0, 8192, 81920), 0.1);
  EXPECT_DOUBLE_EQ(HeldOfGpu(0, 8192, 0), 1);
  EXPECT_DOUBLE_EQ(HeldOfGpu(500, 1 << 20, 81920), 1) << "never more than the GPU";
}

// A share that used all its share and waited for the GPU most of the rest: said with what it would
// have used; one never held back says nothing of it.
TEST(Efficiency, AShareHeldBackSaysWhatItWouldHaveUsed) {
  json placement = {{"gpus", {{{"index", 0}}}}, {"milli_per_gpu", 250}};
  json usage = {
      {"gpu_utilization_pct", 25.0}, {"gpu_held_back_pct", 70.0}, {"gpu_demand_pct", 83.3}};
  json e = EfficiencyOf(Job(placement, {{"gpu_share", "25%"}}, usage), 0);
  EXPECT_DOUBLE_EQ(e["gpu_busy_pct"].get<double>(), 100) << "all of its share";
  EXPECT_DOUBLE_EQ(e["gpu_held_back_pct"].get<double>(), 70);
  EXPECT_DOUBLE_EQ(e["gpu_demand_pct"].get<double>(), 83.3);
  usage.erase("gpu_held_back_pct");
  e = EfficiencyOf(Job(placement, {{"gpu_share", "25%"}}, usage), 0);
  EXPECT_FALSE(e.contains("gpu_demand_pct")) << "only both together";
}

TEST(Efficiency, RunningJobsSoFarAndJobsThatNeverStarted) {
  json placement = {{"gpus", {{{"index", 0}}}}, {"milli_per_gpu", 1000}};
  json e = EfficiencyOf(Job(placement, json::object(), nullptr, 1000, nullptr), 1900);
  EXPECT_EQ(e["running"], true);
  EXPECT_DOUBLE_EQ(e["elapsed_s"].get<double>(), 900);
  EXPECT_DOUBLE_EQ(e["gpu_hours"].get<double>(), 0.25);
  EXPECT_FALSE(e.contains("gpu_busy_pct")) << "measured at its end";
  json queued = Job(nullptr, json::object(), nullptr, 0, nullptr);
  queued["started_at"] = nullptr;
  EXPECT_TRUE(EfficiencyOf(queued, 0).is_null());
  // A job that needs no GPU: none held.
  e = EfficiencyOf(Job(nullptr, {{"cpus", 2}}, {{"cpu_seconds", 900.0}}), 0);
  EXPECT_DOUBLE_EQ(e["gpus"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(e["cpu_pct"].get<double>(), 12.5);
}

}  // namespace
}  // namespace tessera::server
