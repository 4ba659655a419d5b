// Simulator: the Tessera CSV format, workload inflation and time-based replay on small hand-made
// clusters where the right numbers are obvious, determinism, and the reports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "nlohmann/json.hpp"
#include "tessera/sched/test_util.h"
#include "tessera/sim/inflation.h"
#include "tessera/sim/replay.h"
#include "tessera/sim/report.h"
#include "tessera/sim/trace.h"

namespace tessera::sim {
namespace {

using sched::testing::Node;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(TesseraCsv, NodesWithCountAndModelMemory) {
  auto nodes = ParseTesseraNodes(
      "name,cpu_milli,memory_mib,gpus,gpu_model,gpu_memory_mib,count\n"
      "big,96000,393216,8,A100,81920,3\n"
      "cpu,32000,65536,0,,,\n",
      "nodes.csv");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 4u);
  EXPECT_EQ((*nodes)[0].name, "big-0");
  EXPECT_EQ((*nodes)[2].name, "big-2");
  EXPECT_EQ((*nodes)[1].gpus.size(), 8u);
  EXPECT_EQ((*nodes)[1].gpus[0].memory_mib, 81920);
  EXPECT_EQ((*nodes)[3].name, "cpu");
  EXPECT_TRUE((*nodes)[3].gpus.empty());
}

TEST(TesseraCsv, JobsWithSharesModelsAndTimes) {
  auto jobs = ParseTesseraJobs(
      "name,cpu_milli,memory_mib,gpus,gpu_milli,gpu_memory_mib,share_gpus,gpu_models,priority,"
      "preemptible,submit_time,duration\n"
      "train,8000,32768,4,,,,A100|H100,5,0,10,3600\n"
      "notebook,2000,8192,,300,10240,,,0,1,20.5,\n"
      "ranks,2000,8192,,500,,2,,0,1,30,60\n",
      "jobs.csv");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ((*jobs)[2].request.shared_gpu_count(), 2) << "a share of each of two GPUs";
  EXPECT_EQ((*jobs)[1].request.shared_gpu_count(), 1);
  const SimJob& train = (*jobs)[0];
  EXPECT_EQ(train.request.gpus, 4);
  EXPECT_THAT(train.request.models, ::testing::ElementsAre("A100", "H100"));
  EXPECT_EQ(train.request.priority, 5);
  EXPECT_FALSE(train.request.preemptible);
  EXPECT_EQ(train.submit, 10);
  EXPECT_EQ(train.duration, 3600);
  const SimJob& nb = (*jobs)[1];
  EXPECT_TRUE(nb.request.fractional());
  EXPECT_EQ(nb.request.gpu_milli, 300);
  EXPECT_EQ(nb.request.gpu_memory_mib, 10240);
  EXPECT_DOUBLE_EQ(nb.submit, 20.5);
  EXPECT_LT(nb.duration, 0) << "no duration: runs to the end";
  EXPECT_LT(nb.predicted_duration, 0);
}

TEST(TesseraCsv, PredictedDurationsAndUsers) {
  auto jobs = ParseTesseraJobs(
      "name,cpu_milli,memory_mib,gpus,submit_time,duration,predicted_duration,user\n"
      "a,1000,1024,1,0,3600,4000,alice\n"
      "b,1000,1024,1,5,3600,,\n",  // a runtime without a prediction: history, else unknown
      "jobs.csv");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_DOUBLE_EQ((*jobs)[0].predicted_duration, 4000);
  EXPECT_EQ((*jobs)[0].request.owner, "alice");
  EXPECT_LT((*jobs)[1].predicted_duration, 0);
  EXPECT_EQ((*jobs)[1].request.owner, "");
}

TEST(TesseraCsv, UtilizationOfShares) {
  auto jobs = ParseTesseraJobs(
      "name,cpu_milli,memory_mib,gpu_milli,duration,utilization\n"
      "a,1000,1024,300,60,45\n"
      "b,1000,1024,300,60,\n",  // not measured
      "jobs.csv");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_DOUBLE_EQ((*jobs)[0].utilization, 45);
  EXPECT_LT((*jobs)[1].utilization, 0);
}

struct BadCase {
  const char* text;
  const char* error;
};

class BadTesseraCsv : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadTesseraCsv, NamesFileLineAndColumn) {
  auto jobs = ParseTesseraJobs(GetParam().text, "jobs.csv");
  ASSERT_FALSE(jobs.ok());
  EXPECT_THAT(std::string(jobs.status().message()), HasSubstr(GetParam().error));
}

INSTANTIATE_TEST_SUITE_P(
    Rows, BadTesseraCsv,
    ::testing::Values(
        BadCase{"name,cpu_milli\n", "jobs.csv:1: missing column 'memory_mib'"},
        BadCase{"name,cpu_milli,memory_mib,colour\n", "jobs.csv:1: unknown column 'colour'"},
        BadCase{"name,cpu_milli,memory_mib,gpus,gpu_milli\na,1,1,2,500\n",
                "jobs.csv:2: gpus: whole GPUs and a share"},
        BadCase{
            "name,cpu_milli,memory_mib,gpus,share_gpus\na,1,1,2,2\n",
            "jobs.csv:2: share_gpus: only a share (gpu_milli, gpu_memory_mib) is on several GPUs"},
        BadCase{"name,cpu_milli,memory_mib,gpu_milli,share_gpus\na,1,1,500,0\n",
                "jobs.csv:2: share_gpus"},
        BadCase{"name,cpu_milli,memory_mib\na,1,1\na,2,2\n",
                "jobs.csv:3: name: job 'a' listed twice"},
        BadCase{"name,cpu_milli,memory_mib,submit_time\na,1,1,yesterday\n",
                "jobs.csv:2: submit_time: expected seconds >= 0, got 'yesterday'"},
        BadCase{"name,cpu_milli,memory_mib,duration\na,1,1,-5\n", "jobs.csv:2: duration"},
        BadCase{"name,cpu_milli,memory_mib,duration\na,1,1,1e11\n",
                "jobs.csv:2: duration: 1e11 s is more than 315360000 s (ten years)"},
        BadCase{"name,cpu_milli,memory_mib,duration,predicted_duration\na,1,1,5,-1\n",
                "jobs.csv:2: predicted_duration: expected seconds >= 0, got '-1'"},
        BadCase{"name,cpu_milli,memory_mib,predicted_duration\na,1,1,nan\n",
                "jobs.csv:2: predicted_duration: expected seconds >= 0, got 'nan'"},
        BadCase{"name,cpu_milli,memory_mib,user\na,1,1,a b\n",
                "jobs.csv:2: user: not a user name: 'a b'"},
        BadCase{"name,cpu_milli,memory_mib,gpu_models\na,1,1,A100\n",
                "jobs.csv:2: gpu_models: a job without GPUs"},
        BadCase{"name,cpu_milli,memory_mib\na,1\n", "jobs.csv:2: expected 3 fields, got 2"},
        BadCase{"name,cpu_milli,memory_mib,gpu_milli,utilization\na,1,1,300,140\n",
                "jobs.csv:2: utilization: expected an integer 0..100, got '140'"},
        BadCase{"name,cpu_milli,memory_mib,gpu_milli,utilization\na,1,1,300,-3\n",
                "jobs.csv:2: utilization: expected an integer 0..100, got '-3'"},
        BadCase{"name,cpu_milli,memory_mib,gpus,utilization\na,1,1,1,50\n",
                "jobs.csv:2: utilization: only a share of a GPU"}));

TEST(TesseraCsv, BadNodesNameTheLine) {
  auto n = ParseTesseraNodes("name,cpu_milli,memory_mib,gpus\nx,1000,1000,2\n", "n.csv");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("n.csv:2: gpu_model: a node with GPUs"));
  auto dup =
      ParseTesseraNodes("name,cpu_milli,memory_mib,gpus,count\nx,1,1,0,2\nx-1,1,1,0,\n", "n.csv");
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(std::string(dup.status().message()),
              HasSubstr("n.csv:3: name: node 'x-1' listed twice"));
}

core::Request Gpus(const std::string& id, int n, int64_t cpu = 1000) {
  return sched::testing::Whole(id, n, cpu);
}

std::vector<core::NodeSpec> TwoNodes() { return {Node("a", 4), Node("b", 4)}; }

InflationConfig Config(const std::string& policy, uint64_t seed = 42) {
  InflationConfig c;
  c.label = policy;
  c.policies = *sched::ParsePolicies(policy);
  c.seed = seed;
  return c;
}

TEST(Inflation, OneGpuPodsFillTheClusterExactly) {
  // 8 GPUs, 1-GPU pods: arrivals stop at 130% (11 pods: 10.4 > 10.4 is false, so the 11th passes
  // it); every GPU gets used, and the rest fail.
  std::vector<core::Request> pods = {Gpus("p", 1)};
  InflationResult r =
      RunInflation(TwoNodes(), pods, sched::TypicalRequests(pods), Config("bestfit"));
  EXPECT_EQ(r.capacity_milli, 8000);
  EXPECT_EQ(r.final.pods_arrived, 11);
  EXPECT_DOUBLE_EQ(r.final.allocated, 1.0);
  EXPECT_DOUBLE_EQ(r.final.unallocated_gpus, 0);
  EXPECT_EQ(r.final.pods_failed, 3);
  EXPECT_EQ(r.failed_by_kind.at("1-gpu"), 3);
  // A curve point per 1% of arrived demand, up to 130%.
  ASSERT_EQ(r.curve.size(), 130u);
  EXPECT_NEAR(r.curve.back().arrived, 1.3, 1e-9);
  for (size_t i = 1; i < r.curve.size(); ++i) {
    EXPECT_GE(r.curve[i].allocated, r.curve[i - 1].allocated) << "pods never leave";
    EXPECT_LE(r.curve[i].allocated, 1.0);
  }
}

TEST(Inflation, FragmentationStrandsGpusUnderSpreadButNotBestFit) {
  // Pods of 3 GPUs on two 4-GPU nodes: any policy fits two; the leftover single GPUs are fragments
  // for a workload of 3-GPU pods.
  std::vector<core::Request> pods = {Gpus("p", 3)};
  InflationResult r =
      RunInflation(TwoNodes(), pods, sched::TypicalRequests(pods), Config("spread"));
  EXPECT_DOUBLE_EQ(r.final.allocated, 0.75);
  EXPECT_DOUBLE_EQ(r.final.unallocated_gpus, 2);
  EXPECT_DOUBLE_EQ(r.final.fragmented_gpus, 2) << "a 3-GPU pod fits neither leftover GPU";
  EXPECT_DOUBLE_EQ(r.final.fragmentation_ratio(), 1.0);
  EXPECT_THAT(InflationRunsCsv({r}), HasSubstr(",2.000,2.000,1.000000,"));
}

TEST(Inflation, SameSeedSameCsvOtherSeedOtherDraw) {
  std::vector<core::Request> pods = {Gpus("a", 1), Gpus("b", 2), sched::testing::Share("c", 300),
                                     Gpus("d", 0, 4000)};
  auto typical = sched::TypicalRequests(pods);
  std::vector<core::NodeSpec> nodes;
  for (int i = 0; i < 20; ++i) nodes.push_back(Node("n" + std::to_string(i), 1 + i % 8, 16000));
  auto once = [&](uint64_t seed) {
    std::vector<InflationResult> runs = {
        RunInflation(nodes, pods, typical, Config("fgd", seed)),
        RunInflation(nodes, pods, typical, Config("random", seed))};
    return InflationCurveCsv(runs) + InflationRunsCsv(runs) + InflationFailedCsv(runs);
  };
  EXPECT_EQ(once(7), once(7));
  EXPECT_NE(once(7), once(8));
}

TEST(Inflation, EveryPodArrivesOnceBeforeAnyIsDrawnAgain) {
  // As the paper's simulator tunes a list up: the list shuffled, then copies of random pods.
  ArrivalOrder a(50, 9), b(50, 9), other(50, 10);
  std::vector<size_t> first, again;
  for (int i = 0; i < 50; ++i) first.push_back(a.Next());
  std::vector<size_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
  bool shuffled = false;
  for (size_t i = 0; i < 50; ++i) shuffled = shuffled || first[i] != i;
  EXPECT_TRUE(shuffled);
  std::set<size_t> drawn;
  for (int i = 0; i < 200; ++i) {
    const size_t k = a.Next();
    EXPECT_LT(k, 50u);
    drawn.insert(k);
  }
  EXPECT_GT(drawn.size(), 30u) << "then drawn with replacement from the whole list";
  for (int i = 0; i < 250; ++i) again.push_back(b.Next());
  EXPECT_EQ(std::vector<size_t>(again.begin(), again.begin() + 50), first) << "same seed";
  std::vector<size_t> third;
  for (int i = 0; i < 50; ++i) third.push_back(other.Next());
  EXPECT_NE(third, first) << "another seed, another order";
}

TEST(Inflation, SummaryAveragesSeeds) {
  std::vector<core::Request> pods = {Gpus("p", 1), Gpus("q", 3)};
  std::vector<InflationResult> runs;
  for (uint64_t seed : {1, 2, 3}) {
    runs.push_back(
        RunInflation(TwoNodes(), pods, sched::TypicalRequests(pods), Config("bestfit", seed)));
  }
  auto s = SummarizeInflation(runs);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].runs, 3);
  double mean = (runs[0].final.allocated + runs[1].final.allocated + runs[2].final.allocated) / 3;
  EXPECT_NEAR(s[0].allocated, mean, 1e-12);
  EXPECT_EQ(s[0].curve.size(), runs[0].curve.size());
}

SimJob Job(const std::string& id, int gpus, double submit, double duration, int priority = 0,
           bool preemptible = true) {
  SimJob j;
  j.request = Gpus(id, gpus);
  j.request.priority = priority;
  j.request.preemptible = preemptible;
  j.submit = submit;
  j.duration = duration;
  return j;
}

ReplayConfig ReplayWith(bool preemption = true) {
  ReplayConfig c;
  c.label = "bestfit";
  c.policies = *sched::ParsePolicies("bestfit");
  c.preemption = preemption;
  c.samples = 11;
  return c;
}

TEST(Replay, ReservationsKeepAStreamOfSmallJobsFromStarvingALargeOne) {
  // Two GPUs; one-GPU jobs of 10 s every 5 s, staggered so that a GPU comes free every 5 s but
  // never both; a two-GPU job arrives at t=1. With predictions (the small jobs' earlier runs) and
  // one reservation it starts when the GPU it reserved comes free; without, it waits for the
  // stream to end.
  std::vector<core::NodeSpec> nodes = {Node("a", 2)};
  std::vector<SimJob> jobs;
  for (int i = 0; i < 40; ++i) jobs.push_back(Job("small" + std::to_string(i), 1, 5.0 * i, 10));
  jobs.push_back(Job("large", 2, 1, 10));
  ReplayConfig off = ReplayWith(false);
  off.record_runs = true;
  ReplayConfig on = off;
  on.reservations = 1;
  on.predict = true;
  auto large_start = [](const ReplayResult& r) {
    for (const ReplayRun& run : r.runs) {
      if (run.id == "large") return run.start;
    }
    return -1.0;
  };
  const double without = large_start(RunReplay(nodes, jobs, {}, off));
  const double with = large_start(RunReplay(nodes, jobs, {}, on));
  EXPECT_GE(without, 195) << "behind the whole stream";
  EXPECT_GT(with, 0);
  EXPECT_LE(with, 20) << "as soon as its reservation's GPUs are free";
}

TEST(Replay, InterferenceSlowsOversubscribedSharesAndTheCeilingKeepsThemApart) {
  // One node of two GPUs. Two runs of "infer" (a 40% share that keeps its GPU 60% busy) teach the
  // history; then two more arrive together. Packing puts them on one GPU (80% of its compute):
  // 120% busy, so each runs 100/120 as fast - 120 s instead of 100. With the 70% ceiling and
  // predictions from the earlier runs the second goes to the other GPU and both take 100 s.
  std::vector<core::NodeSpec> nodes = {Node("a", 2)};
  auto infer = [](const std::string& id, double submit) {
    SimJob j;
    j.request.id = id;
    j.request.gpu_milli = 400;
    j.request.owner = "alice";
    j.submit = submit;
    j.duration = 100;
    j.utilization = 60;
    return j;
  };
  std::vector<SimJob> jobs = {infer("teach1", 0), infer("teach2", 200), infer("x", 1000),
                              infer("y", 1000)};
  ReplayConfig c = ReplayWith(false);
  c.record_runs = true;
  c.predict = true;
  auto gpu_of = [](const ReplayResult& r, const std::string& id) {
    for (const ReplayRun& run : r.runs) {
      if (run.id == id) return run.gpus.at(0);
    }
    return -1;
  };
  ReplayResult plain = RunReplay(nodes, jobs, {}, c);
  EXPECT_EQ(gpu_of(plain, "x"), gpu_of(plain, "y")) << "packed";
  EXPECT_DOUBLE_EQ(plain.end_time, 1100) << "no interference modelled";
  c.interference = true;
  ReplayResult slowed = RunReplay(nodes, jobs, {}, c);
  EXPECT_EQ(gpu_of(slowed, "x"), gpu_of(slowed, "y"));
  EXPECT_NEAR(slowed.end_time, 1120, 1e-9);
  EXPECT_NEAR(slowed.share_slowdown_max, 1.2, 1e-9);
  EXPECT_NEAR(slowed.jct.max, 120, 1e-9);
  c.utilization_ceiling_pct = 70;  // soft: room within it exists, on the other GPU
  ReplayResult apart = RunReplay(nodes, jobs, {}, c);
  EXPECT_NE(gpu_of(apart, "x"), gpu_of(apart, "y"));
  EXPECT_NEAR(apart.end_time, 1100, 1e-9);
  EXPECT_NEAR(apart.share_slowdown_max, 1, 1e-9);
  // Without predictions the ceiling has nothing to go on: the trace's own utilization is never
  // read as one.
  c.predict = false;
  ReplayResult blind = RunReplay(nodes, jobs, {}, c);
  EXPECT_EQ(gpu_of(blind, "x"), gpu_of(blind, "y"));
  EXPECT_NEAR(blind.end_time, 1120, 1e-9);
}

TEST(Replay, AShareThatJoinsMovesTheEndOfTheOneAlreadyThere) {
  // "a" (80% busy, 100 s of work) runs alone for 50 s, then "b" (also 80%) joins on the same GPU:
  // 160%, each at 100/160. a's last 50 s of work take 80 s (ends at 130); b has done 50 s of work
  // by then (80 s at 0.625), and its remaining 50 s run alone: ends at 180.
  std::vector<core::NodeSpec> nodes = {Node("a", 1)};
  SimJob a;
  a.request.id = "a";
  a.request.gpu_milli = 400;
  a.duration = 100;
  a.utilization = 80;
  SimJob b = a;
  b.request.id = "b";
  b.submit = 50;
  ReplayConfig c = ReplayWith(false);
  c.interference = true;
  ReplayResult r = RunReplay(nodes, {a, b}, {}, c);
  EXPECT_EQ(r.finished, 2);
  EXPECT_NEAR(r.end_time, 180, 1e-9);
  EXPECT_NEAR(r.jct.max, 130, 1e-9);   // b: 50 -> 180
  EXPECT_NEAR(r.jct.mean, 130, 1e-9);  // a: 0 -> 130
}

TEST(Replay, UnderMpsSharesRunAtOnceUpToItsCapacityAndOneOwnerAtATime) {
  // One GPU. "a" and "b" (alice's, 80% busy each, 100 s of work) together: in time slices 160%,
  // each at 100/160 (160 s); under MPS of capacity 1.6 GPUs' worth, both at full speed (100 s).
  // Under a capacity of 1.25, each at 125/160 (128 s).
  std::vector<core::NodeSpec> nodes = {Node("a", 1)};
  SimJob a;
  a.request.id = "a";
  a.request.owner = "alice";
  a.request.gpu_milli = 300;  // three fit on the GPU
  a.duration = 100;
  a.utilization = 80;
  SimJob b = a;
  b.request.id = "b";
  ReplayConfig c = ReplayWith(false);
  c.interference = true;
  EXPECT_NEAR(RunReplay(nodes, {a, b}, {}, c).end_time, 160, 1e-9);
  c.mps = true;
  c.mps_capacity = 1.6;
  EXPECT_NEAR(RunReplay(nodes, {a, b}, {}, c).end_time, 100, 1e-9);
  c.mps_capacity = 1.25;
  EXPECT_NEAR(RunReplay(nodes, {a, b}, {}, c).end_time, 128, 1e-9);
  // Bob's share waits for alice's to end (MPS serves one user's clients at a time), though the
  // GPU has room; in time slices it goes beside them.
  SimJob bob = a;
  bob.request.id = "bob";
  bob.request.owner = "bob";
  bob.utilization = 10;
  c.mps_capacity = 1.6;
  c.record_runs = true;
  ReplayResult mps = RunReplay(nodes, {a, b, bob}, {}, c);
  double bob_start = -1;
  for (const ReplayRun& run : mps.runs) {
    if (run.id == "bob") bob_start = run.start;
  }
  EXPECT_NEAR(bob_start, 100, 1e-9) << "after alice's two";
  c.mps = false;
  ReplayResult sliced = RunReplay(nodes, {a, b, bob}, {}, c);
  for (const ReplayRun& run : sliced.runs) {
    if (run.id == "bob") {
      EXPECT_NEAR(run.start, 0, 1e-9);
    }
  }
}

TEST(Replay, MpsCapacityIsReadFromAGpuChecksReport) {
  nlohmann::json report = {{"gpu", "NVIDIA H200"},
                           {"checks",
                            {{{"name", "MPS: 4 tenants of small kernels"},
                              {"data", {{"time_slices_ratio", 0.9}, {"mps_ratio", 1.8}}}}}}};
  auto capacity = MpsCapacityOf(report);
  ASSERT_TRUE(capacity.ok()) << capacity.status();
  EXPECT_NEAR(*capacity, 2.0, 1e-12);
  report["checks"][0]["data"] = nlohmann::json::object();
  report["checks"][0]["measured"] = "error: no GPU";
  EXPECT_THAT(std::string(MpsCapacityOf(report).status().message()),
              ::testing::HasSubstr("it failed: error: no GPU"));
  report["checks"][0]["name"] = "Memory";
  EXPECT_THAT(std::string(MpsCapacityOf(report).status().message()),
              ::testing::HasSubstr("run tessera-gpu-check --only MPS"));
  EXPECT_FALSE(MpsCapacityOf(nlohmann::json::array()).ok());
}

TEST(Replay, TheArbiterServesAGpusSharesByPriority) {
  // Two shares on one GPU, each 80% busy with 100 s of work. Alike (no priorities): 160%, each at
  // 100/160, both end at 160. By priority: the high one runs at full speed and ends at 100; the
  // low one gets the 20% left (a quarter of its speed: 25 s of work by then) and does the other
  // 75 s alone: 175. With the arbiter's switching cost (0.9) the high one runs at 0.9 (ends at
  // 100/0.9) and the low one gets 100 - 72 = 28%: 0.35 of its speed until then.
  std::vector<core::NodeSpec> nodes = {Node("a", 1)};
  SimJob high;
  high.request.id = "high";
  high.request.gpu_milli = 500;
  high.request.priority = 1;
  high.duration = 100;
  high.utilization = 80;
  SimJob low = high;
  low.request.id = "low";
  low.request.priority = 0;
  ReplayConfig c = ReplayWith(false);
  c.interference = true;
  c.record_runs = true;
  ReplayResult alike = RunReplay(nodes, {high, low}, {}, c);
  ASSERT_EQ(alike.runs.size(), 2u) << "both started at once, on the one GPU";
  EXPECT_NEAR(alike.jct.max, 160, 1e-9);
  EXPECT_NEAR(alike.jct.mean, 160, 1e-9);
  c.interference_priorities = true;
  ReplayResult ordered = RunReplay(nodes, {high, low}, {}, c);
  EXPECT_NEAR(ordered.jct_by_priority.at(1).mean, 100, 1e-9);
  EXPECT_NEAR(ordered.jct_by_priority.at(0).mean, 175, 1e-9);
  EXPECT_NEAR(ordered.slowdown_by_priority.at(1).mean, 1, 1e-9);
  EXPECT_NEAR(ordered.slowdown_by_priority.at(0).mean, 1.75, 1e-9);
  c.priority_share_efficiency = 0.9;
  ReplayResult costly = RunReplay(nodes, {high, low}, {}, c);
  const double high_end = 100 / 0.9, low_done = high_end * 28.0 / 80;
  EXPECT_NEAR(costly.jct_by_priority.at(1).mean, high_end, 1e-9);
  EXPECT_NEAR(costly.jct_by_priority.at(0).mean, high_end + (100 - low_done), 1e-9);
  // A high share that keeps the GPU wholly busy holds the low one back entirely until it ends:
  // no departure for the low one meanwhile, then its 100 s alone.
  high.utilization = 100;
  c.priority_share_efficiency = 1;
  ReplayResult held = RunReplay(nodes, {high, low}, {}, c);
  EXPECT_NEAR(held.jct_by_priority.at(1).mean, 100, 1e-9);
  EXPECT_NEAR(held.jct_by_priority.at(0).mean, 200, 1e-9);
  EXPECT_EQ(held.finished, 2);
}

TEST(Replay, BusyIsEachGpusHoldersUtilizationUpToAWholeGpu) {
  // Two GPUs for 100 s: a whole-GPU job that keeps its GPU 60% busy, and on the other GPU two
  // shares of 70% each (140%: busy 100%, not more). Busy (60 + 100) / 200 = 80% while
  // allocation is 100%; a whole GPU without a figure counts 100%, a share without one its share.
  std::vector<core::NodeSpec> nodes = {Node("a", 2)};
  SimJob whole = Job("whole", 1, 0, 100);
  whole.utilization = 60;
  SimJob s1;
  s1.request.id = "s1";
  s1.request.gpu_milli = 500;
  s1.duration = 100;
  s1.utilization = 70;
  SimJob s2 = s1;
  s2.request.id = "s2";
  ReplayResult r = RunReplay(nodes, {whole, s1, s2}, {}, ReplayWith(false));
  EXPECT_TRUE(r.utilization_known);
  EXPECT_NEAR(r.busy_mean_allocated, 1.0, 1e-9);
  EXPECT_NEAR(MeanBusyOver(r, 0, 100), 0.8, 1e-9);
  EXPECT_NEAR(MeanBusyOver(r, 0, 200), 0.4, 1e-9) << "idle after 100 s";
  SimJob unknown_whole = Job("w2", 1, 0, 100), unknown_share = s1;
  unknown_share.utilization = -1;  // counts its 50% share
  ReplayResult blind = RunReplay(nodes, {unknown_whole, unknown_share}, {}, ReplayWith(false));
  EXPECT_FALSE(blind.utilization_known);
  EXPECT_NEAR(MeanBusyOver(blind, 0, 100), 0.75, 1e-9);
}

TEST(Replay, SecondJobWaitsForTheFirst) {
  std::vector<core::NodeSpec> nodes = {Node("a", 1)};
  std::vector<SimJob> jobs = {Job("x", 1, 0, 10), Job("y", 1, 0, 10)};
  ReplayResult r = RunReplay(nodes, jobs, {}, ReplayWith());
  EXPECT_EQ(r.finished, 2);
  EXPECT_EQ(r.wait.count, 2);
  EXPECT_DOUBLE_EQ(r.wait.max, 10);
  EXPECT_DOUBLE_EQ(r.wait.mean, 5);
  EXPECT_DOUBLE_EQ(r.jct.mean, 15);
  EXPECT_DOUBLE_EQ(r.end_time, 20);
  EXPECT_DOUBLE_EQ(r.mean_allocated, 1.0);
  EXPECT_DOUBLE_EQ(r.busy_end, 10);  // y's start
  EXPECT_DOUBLE_EQ(r.busy_mean_allocated, 1.0);
  EXPECT_DOUBLE_EQ(r.busy_mean_queued, 1.0);  // y waits the whole busy period
}

TEST(Replay, SeriesShowTheBusyPeriodNotTheLongTail) {
  // A job that runs for 100,000 s beside a short busy period (x runs, y waits for x's GPU): over
  // the whole replay the busy period is a sliver; its own series and means show it.
  std::vector<core::NodeSpec> nodes = {Node("a", 2)};
  std::vector<SimJob> jobs = {Job("long", 1, 0, 100000), Job("x", 1, 0, 10), Job("y", 1, 1, 10)};
  ReplayConfig c = ReplayWith();
  c.samples = 12;
  ReplayResult r = RunReplay(nodes, jobs, {}, c);
  EXPECT_DOUBLE_EQ(r.busy_start, 0);
  EXPECT_DOUBLE_EQ(r.busy_end, 10);
  EXPECT_DOUBLE_EQ(r.busy_mean_allocated, 1.0);  // both GPUs taken throughout
  EXPECT_NEAR(r.mean_allocated, 0.5, 0.001);     // the long tail on one GPU of two
  EXPECT_DOUBLE_EQ(r.peak_allocated, 1.0);
  EXPECT_DOUBLE_EQ(r.busy_mean_queued, 0.9);  // y waits from 1 to 10
  EXPECT_EQ(r.peak_queued, 1);
  // 12 points over the busy period and a tenth more: 0, 1, ..., 11 s.
  ASSERT_EQ(r.series.size(), 12u);
  EXPECT_DOUBLE_EQ(r.series[11].time, 11);
  EXPECT_EQ(r.series[0].queued, 0);
  EXPECT_EQ(r.series[5].queued, 1);   // y waits
  EXPECT_EQ(r.series[10].queued, 1);  // y waited until 10: the highest since 9
  EXPECT_EQ(r.series[11].queued, 0);  // y runs
  EXPECT_EQ(r.series[11].running, 2);
  EXPECT_DOUBLE_EQ(r.series[5].allocated, 1.0);
  // The whole replay: 12 points to its end, where only the long job was left.
  ASSERT_EQ(r.whole.size(), 12u);
  EXPECT_DOUBLE_EQ(r.whole.back().time, 100000);
  EXPECT_DOUBLE_EQ(r.whole[5].allocated, 0.5);
  // Waits, sorted, and by size.
  EXPECT_THAT(r.waits, ::testing::ElementsAre(0, 0, 9));
  ASSERT_TRUE(r.wait_by_gpus.contains("1"));
  EXPECT_DOUBLE_EQ(r.wait_by_gpus.at("1").max, 9);
}

TEST(Replay, ArrivalOrderIgnoresPriorities) {
  // One GPU busy until 10; "low" arrives first, "high" (priority 9) second: by priority high goes
  // first (and preempts nothing: "busy" is not preemptible); in arrival order low does.
  std::vector<core::NodeSpec> nodes = {Node("a", 1)};
  std::vector<SimJob> jobs = {Job("busy", 1, 0, 10, 0, false), Job("low", 1, 1, 10),
                              Job("high", 1, 2, 10, 9)};
  ReplayConfig c = ReplayWith();
  c.record_runs = true;
  auto first_after_busy = [&](const ReplayResult& r) {
    return r.runs.size() > 1 ? r.runs[1].id : std::string();
  };
  EXPECT_EQ(first_after_busy(RunReplay(nodes, jobs, {}, c)), "high");
  c.arrival_order = true;
  EXPECT_EQ(first_after_busy(RunReplay(nodes, jobs, {}, c)), "low");
}

TEST(Replay, TracePredictionsServeWhereThereIsNoHistory) {
  // Two GPUs: "long" holds one until 100; "big" (both GPUs) reserves them from then; "short" (10 s)
  // may take the free one only if it is expected to end before 100. Without any history the
  // trace's predicted durations are what tells; without them short waits behind big.
  std::vector<core::NodeSpec> nodes = {Node("a", 2)};
  std::vector<SimJob> jobs = {Job("long", 1, 0, 100), Job("big", 2, 1, 10), Job("short", 1, 2, 10)};
  ReplayConfig c = ReplayWith(false);
  c.reservations = 1;
  c.predict = true;  // no history yet: the trace's predictions are the fallback
  c.record_runs = true;
  auto start_of = [&](const ReplayResult& r, const std::string& id) {
    for (const ReplayRun& run : r.runs) {
      if (run.id == id) return run.start;
    }
    return -1.0;
  };
  ReplayResult unknown = RunReplay(nodes, jobs, {}, c);
  EXPECT_DOUBLE_EQ(start_of(unknown, "big"), 100);
  EXPECT_DOUBLE_EQ(start_of(unknown, "short"), 110);
  for (SimJob& j : jobs) j.predicted_duration = j.duration;
  ReplayResult predicted = RunReplay(nodes, jobs, {}, c);
  EXPECT_DOUBLE_EQ(start_of(predicted, "short"), 2) << "ends at 12, before big's reservation";
  EXPECT_DOUBLE_EQ(start_of(predicted, "big"), 100);
}

TEST(Replay, HigherPriorityGoesFirstAndBackfillUsesTheRest) {
  std::vector<core::NodeSpec> nodes = {Node("a", 2)};
  // t=0: "long" takes 1 GPU. t=1: "big" (2 GPUs, low priority) waits; "vip" (1 GPU, high) arrives
  // at t=2 and starts at once on the free GPU, ahead of "big".
  std::vector<SimJob> jobs = {Job("long", 1, 0, 100), Job("big", 2, 1, 10), Job("vip", 1, 2, 5, 9)};
  ReplayResult r = RunReplay(nodes, jobs, {}, ReplayWith(false));
  EXPECT_EQ(r.finished, 3);
  EXPECT_EQ(r.preemptions, 0);
  // big starts at 100 when long ends: waits 99; vip waits 0.
  EXPECT_DOUBLE_EQ(r.wait.max, 99);
  EXPECT_DOUBLE_EQ(r.wait.p50, 0);
}

TEST(Replay, PreemptionEvictsLowerPriorityWorkWhichStartsOver) {
  std::vector<core::NodeSpec> nodes = {Node("a", 1)};
  std::vector<SimJob> jobs = {Job("low", 1, 0, 10, 0, true), Job("high", 1, 5, 10, 5)};
  ReplayResult on = RunReplay(nodes, jobs, {}, ReplayWith(true));
  EXPECT_EQ(on.preemptions, 1);
  EXPECT_EQ(on.finished, 2);
  // high runs 5..15, low restarts at 15 and ends at 25.
  EXPECT_DOUBLE_EQ(on.end_time, 25);
  EXPECT_DOUBLE_EQ(on.jct.max, 25);
  ReplayResult off = RunReplay(nodes, jobs, {}, ReplayWith(false));
  EXPECT_EQ(off.preemptions, 0);
  EXPECT_DOUBLE_EQ(off.end_time, 20);
  // Non-preemptible work is never evicted.
  jobs[0].request.preemptible = false;
  EXPECT_EQ(RunReplay(nodes, jobs, {}, ReplayWith(true)).preemptions, 0);
}

// An elastic job grows onto the idle GPUs at its start, gives one back to a small job that
// arrives (a shrink by what it needs, not a preemption) and grows onto all again when it ends.
// Linear speedup (serial fraction 0), 50 s per resize, stops at once:
//   A (4 GPUs traced, 1000 s of work at 4): starts at 0 on 2 and grows at once to 4 (no cost).
//   B (1 GPU, 100 s) arrives at 10: A shrinks to 3 (990 s of work left) and resumes at 60 at 0.75.
//   B runs 10..110. At 110 A grows to 4: 990 - 50 * 0.75 = 952.5 s left from 160, ends at 1112.5.
// Fixed-size, B waits for all of A: 1000..1100.
TEST(Replay, AnElasticJobGrowsOntoIdleGpusAndShrinksForAnArrivalInsteadOfMakingItWait) {
  std::vector<core::NodeSpec> nodes = {Node("a", 4)};
  std::vector<SimJob> jobs = {Job("A", 4, 0, 1000), Job("B", 1, 10, 100)};
  ReplayConfig c = ReplayWith();
  c.elastic = 1;
  c.elastic_serial_fraction = 0;
  c.resize_overhead_s = 50;
  const ReplayResult elastic = RunReplay(nodes, jobs, {}, c);
  EXPECT_EQ(elastic.elastic_jobs, 1);
  EXPECT_EQ(elastic.finished, 2);
  EXPECT_EQ(elastic.preemptions, 0);
  EXPECT_EQ(elastic.grows, 2);
  EXPECT_EQ(elastic.shrinks, 1);
  EXPECT_DOUBLE_EQ(elastic.wait.max, 0);
  EXPECT_DOUBLE_EQ(elastic.jct.max, 1112.5);
  EXPECT_DOUBLE_EQ(elastic.jct.mean, (1112.5 + 100) / 2);
  EXPECT_DOUBLE_EQ(elastic.jct_by_gpus.at("3-4").max, 1112.5) << "by its traced size";
  // All four GPUs allocated from start to end but for the shrink's instant.
  EXPECT_DOUBLE_EQ(elastic.peak_allocated, 1);
  c.elastic = 0;
  const ReplayResult fixed = RunReplay(nodes, jobs, {}, c);
  EXPECT_EQ(fixed.elastic_jobs, 0);
  EXPECT_EQ(fixed.grows, 0);
  EXPECT_DOUBLE_EQ(fixed.wait.max, 990);
  EXPECT_DOUBLE_EQ(fixed.jct.mean, (1000 + 1090) / 2.0);
  // The same with stops that take 30 s: each resize takes effect when A has checkpointed, 30 s
  // after it is asked, as on the server. B waits for the shrink (10..40). A works on at 4 until
  // 40 (960 s left) and starts again on 3 (from 90, at 0.75); asked at 140 (B's end) to grow to 4,
  // it starts again at 170 with 960 - 80 * 0.75 = 900 s left from 220, and ends at 1120.
  c.elastic = 1;
  c.stop_latency_s = 30;
  c.record_runs = true;
  const ReplayResult slow = RunReplay(nodes, jobs, {}, c);
  EXPECT_DOUBLE_EQ(slow.wait.max, 30);
  EXPECT_EQ(slow.finished, 2);
  EXPECT_EQ(slow.grows, 2);
  EXPECT_EQ(slow.shrinks, 1);
  EXPECT_DOUBLE_EQ(slow.jct.max, 1120);
  std::vector<std::pair<double, size_t>> a_runs;  // A's starts: when, on how many GPUs
  for (const ReplayRun& run : slow.runs) {
    if (run.id == jobs[0].request.id) a_runs.emplace_back(run.start, run.gpus.size());
  }
  EXPECT_THAT(a_runs, ElementsAre(Pair(0, 4), Pair(40, 3), Pair(170, 4)));
}

// Without preemption nothing can take grown GPUs back, so nothing grows: an elastic job runs on
// its minimum.
TEST(Replay, WithoutPreemptionAnElasticJobKeepsItsMinimum) {
  std::vector<core::NodeSpec> nodes = {Node("a", 4)};
  std::vector<SimJob> jobs = {Job("A", 4, 0, 1000)};
  ReplayConfig c = ReplayWith(/*preemption=*/false);
  c.elastic = 1;
  c.elastic_serial_fraction = 0;
  const ReplayResult r = RunReplay(nodes, jobs, {}, c);
  EXPECT_EQ(r.grows, 0);
  EXPECT_DOUBLE_EQ(r.jct.max, 2000);  // half its GPUs, half its speed
}

TEST(Replay, JobLargerThanAnyNodeNeverStarts) {
  std::vector<core::NodeSpec> nodes = {Node("a", 2)};
  std::vector<SimJob> jobs = {Job("huge", 8, 0, 10), Job("ok", 1, 0, 10)};
  ReplayResult r = RunReplay(nodes, jobs, {}, ReplayWith());
  EXPECT_EQ(r.never_started, 1);
  EXPECT_EQ(r.finished, 1);
}

TEST(Replay, Deterministic) {
  std::vector<core::NodeSpec> nodes;
  for (int i = 0; i < 10; ++i) nodes.push_back(Node("n" + std::to_string(i), 4));
  std::vector<SimJob> jobs;
  for (int i = 0; i < 200; ++i) {
    jobs.push_back(Job("j" + std::to_string(i), 1 + i % 4, i * 0.5, 5 + i % 17, i % 3));
  }
  ReplayConfig c = ReplayWith();
  c.policies = *sched::ParsePolicies("random");
  auto a = RunReplay(nodes, jobs, {}, c), b = RunReplay(nodes, jobs, {}, c);
  EXPECT_EQ(ReplaySeriesCsv({a}) + ReplayRunsCsv({a}), ReplaySeriesCsv({b}) + ReplayRunsCsv({b}));
}

TEST(Report, PercentilesAreNearestRank) {
  Distribution d = Summarize({5, 1, 4, 2, 3, 6, 7, 8, 9, 10});
  EXPECT_EQ(d.count, 10);
  EXPECT_DOUBLE_EQ(d.mean, 5.5);
  EXPECT_DOUBLE_EQ(d.p50, 5);
  EXPECT_DOUBLE_EQ(d.p95, 10);
  EXPECT_DOUBLE_EQ(d.max, 10);
  EXPECT_EQ(Summarize({}).count, 0);
}

TEST(Report, HtmlIsSelfContainedWithPlotsAndEscapes) {
  std::vector<core::Request> pods = {Gpus("p", 1)};
  InflationConfig c = Config("bestfit");
  c.label = "<b>&";
  std::vector<InflationResult> runs = {
      RunInflation(TwoNodes(), pods, sched::TypicalRequests(pods), c)};
  std::string html = HtmlReport("t", "s", runs, {});
  EXPECT_THAT(html, HasSubstr("<svg"));
  EXPECT_THAT(html, HasSubstr("&lt;b&gt;&amp;"));
  EXPECT_THAT(html, ::testing::Not(HasSubstr("<script")));
  EXPECT_THAT(html, ::testing::Not(HasSubstr("http://cdn")));
}

TEST(Report, AxesHaveRoundTicksWithinWhatIsPossible) {
  AxisTicks t = RoundTicks(0, 79.449);
  EXPECT_DOUBLE_EQ(t.step, 20);
  EXPECT_DOUBLE_EQ(t.lo, 0);
  EXPECT_DOUBLE_EQ(t.hi, 80);
  t = RoundTicks(0.3, 1.7);
  EXPECT_DOUBLE_EQ(t.step, 0.5);
  EXPECT_DOUBLE_EQ(t.lo, 0);
  EXPECT_DOUBLE_EQ(t.hi, 2);
  t = RoundTicks(120, 133);
  EXPECT_DOUBLE_EQ(t.step, 5);
  EXPECT_DOUBLE_EQ(t.lo, 120);
  EXPECT_DOUBLE_EQ(t.hi, 135);
  // A percentage that the data's padding would take past 0..100: the axis stops at the bounds.
  std::vector<PlotSeries> s = {{"a", {0, 50, 100}, {-3.7, 50, 100.24}},
                               {"b", {0, 50, 100}, {0, 50, 100}}};
  std::string svg = SvgLineChart("t", "x", "y", s, {.y_min = 0, .y_max = 100});
  EXPECT_THAT(svg, HasSubstr(">100</text>"));
  EXPECT_THAT(svg, HasSubstr(">0</text>"));
  EXPECT_THAT(svg, ::testing::Not(HasSubstr(">120</text>")));
  EXPECT_THAT(svg, ::testing::Not(HasSubstr(">-20</text>")));
  EXPECT_THAT(svg, ::testing::Not(HasSubstr("79.449")));
  // Coinciding lines stay told apart: the second is dashed, in the plot and its legend.
  size_t dashed = 0;
  for (size_t at = svg.find("stroke-dasharray"); at != std::string::npos;
       at = svg.find("stroke-dasharray", at + 1)) {
    ++dashed;
  }
  EXPECT_EQ(dashed, 2u);
}

TEST(Report, ReplayReportShowsTheBusyPeriodAndWaits) {
  std::vector<core::NodeSpec> nodes = {Node("a", 2)};
  std::vector<SimJob> jobs = {Job("long", 1, 0, 100000), Job("x", 1, 0, 10), Job("y", 1, 1, 10)};
  std::vector<ReplayResult> runs = {RunReplay(nodes, jobs, {}, ReplayWith())};
  std::string html = HtmlReport("t", "s", {}, runs);
  EXPECT_THAT(html, HasSubstr("<td>100.00%</td><td>100.00%</td>"));  // busy mean, peak
  EXPECT_THAT(html, HasSubstr("Queue length in the busy period"));
  EXPECT_THAT(html, HasSubstr("seconds since the first arrival"));
  EXPECT_THAT(html, HasSubstr("Waits: share of started jobs"));
  EXPECT_THAT(html, HasSubstr("<td>3 s / 9 s / 9 s (3 jobs)</td>"));  // 1-GPU waits
  std::string csv = ReplayRunsCsv(runs);
  EXPECT_THAT(csv, HasSubstr(",0.000,10.000,1.000000,1.000000,"));
  std::string waits = ReplayWaitsCsv(runs);
  EXPECT_THAT(waits, HasSubstr("bestfit,42,1,3,3.0,0.0,9.0,9.0,9.0\n"));
}

}  // namespace
}  // namespace tessera::sim
