// The tessera binary as users run it: a separate process, real exit codes, real dlopen of the fake
// NVML.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../capture.h"

namespace {

using Result = tessera::test::Captured;

// Runs `args` through the shell with the tessera binary; captures stdout (stderr with 2>&1 in
// args).
Result Tessera(const std::string& args, const std::string& env = "") {
  return tessera::test::Capture(env + " " + TESSERA_BINARY + " " + args);
}

TEST(TesseraBinary, GpusJsonOnSimulatedDgx) {
  Result r = Tessera("gpus -o json --simulate dgx-h100");
  ASSERT_EQ(r.code, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["gpus"].size(), 8u);
  for (const auto& l : j["links"]) EXPECT_EQ(l["label"], "NV18");
}

TEST(TesseraBinary, NoDriverIsExitOneWithOneLineReason) {
  Result r = Tessera("gpus 2>&1", "TESSERA_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("no NVIDIA driver"));
}

TEST(TesseraBinary, FakeDriverThroughDlopen) {
  std::string scenario = "/tmp/tessera-e2e-" + std::to_string(getpid()) + ".json";
  FILE* f = fopen(scenario.c_str(), "w");
  fputs(R"({"devices": [{"name": "NVIDIA A10", "nvswitch_links": 0}, {"name": "NVIDIA A10"}]})", f);
  fclose(f);
  Result r = Tessera("topo -o json", "FAKE_NVML_SCENARIO=" + scenario +
                                         " TESSERA_NVML_LIBRARY=" TESSERA_TEST_FAKES_DIR
                                         "/nvml-full/libnvidia-ml.so.1");
  remove(scenario.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["simulated"], false);
  EXPECT_EQ(j["matrix"][0][1], "SYS");
}

TEST(TesseraBinary, BadFlagIsExitTwo) {
  EXPECT_EQ(Tessera("gpus --no-such-flag 2>/dev/null").code, 2);
}

// ---- tessera sim ----

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string dir = ::testing::TempDir() + "tessera-e2e-sim";
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kNodes =
    "name,cpu_milli,memory_mib,gpus,gpu_model,count\n"
    "g8,96000,393216,8,A100,6\n"
    "g2,32000,131072,2,T4,10\n";
const char* kJobs =
    "name,cpu_milli,memory_mib,gpus,gpu_milli,gpu_models,priority,submit_time,duration\n"
    "a,8000,16384,1,,,0,0,100\n"
    "b,4000,8192,,500,,0,5,50\n"
    "c,16000,65536,4,,A100,2,10,300\n"
    "d,2000,4096,,250,T4,1,12,20\n"
    "e,1000,2048,,,,0,15,10\n";

TEST(TesseraSim, InflateWritesIdenticalCsvForTheSameSeeds) {
  std::string nodes = WriteTemp("nodes.csv", kNodes), jobs = WriteTemp("jobs.csv", kJobs);
  std::string out1 = nodes + ".out1", out2 = nodes + ".out2";
  std::string args = "sim inflate --nodes " + nodes + " --pods " + jobs +
                     " --policies fgd,bestfit,tessera --seeds 3 -o json --out ";
  Result a = Tessera(args + out1);
  ASSERT_EQ(a.code, 0) << a.out;
  auto j = nlohmann::json::parse(a.out);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["policy"], "fgd");
  EXPECT_EQ(j[0]["runs"], 3);
  EXPECT_GT(j[0]["allocatedRatio"].get<double>(), 0.5);
  EXPECT_LE(j[0]["allocatedRatio"].get<double>(), 1.0);
  ASSERT_EQ(Tessera(args + out2).code, 0);
  for (const char* f : {"inflation_curve.csv", "inflation_runs.csv", "inflation_failed.csv"}) {
    std::string first = tessera::test::ReadFile(out1 + "/" + f);
    EXPECT_FALSE(first.empty()) << f;
    EXPECT_EQ(first, tessera::test::ReadFile(out2 + "/" + f)) << f << " differs between equal runs";
  }
  std::string html = tessera::test::ReadFile(out1 + "/report.html");
  EXPECT_THAT(html, ::testing::HasSubstr("<svg"));
  EXPECT_THAT(html, ::testing::HasSubstr("tessera"));
}

TEST(TesseraSim, InflateTableAndYaml) {
  std::string nodes = WriteTemp("nodes.csv", kNodes), jobs = WriteTemp("jobs.csv", kJobs);
  Result t =
      Tessera("sim inflate --nodes " + nodes + " --pods " + jobs + " --policies random --seeds 2");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_THAT(t.out, ::testing::HasSubstr("GPU ALLOC"));
  EXPECT_THAT(t.out, ::testing::HasSubstr("random"));
  Result y =
      Tessera("sim inflate --nodes " + nodes + " --pods " + jobs + " --policies random -o yaml");
  ASSERT_EQ(y.code, 0);
  EXPECT_THAT(y.out, ::testing::HasSubstr("- policy: \"random\"\n  runs: 10\n"));
}

// --mps-figures: a GPU check's report gives the MPS capacity (said on stderr); a file that cannot
// be read, is not JSON, or is not such a report is a bad input (exit 2) that says which.
TEST(TesseraSim, ReplayReadsMpsCapacityFromAGpuCheckReportAndSaysWhatIsWrongWithOne) {
  std::string nodes = WriteTemp("nodes.csv", kNodes), jobs = WriteTemp("jobs.csv", kJobs);
  const std::string base = "sim replay --nodes " + nodes + " --pods " + jobs + " --mps";
  const std::string report =
      WriteTemp("report.json",
                R"({"gpu": "NVIDIA H200", "checks": [{"name": "MPS: 4 tenants of small kernels",
          "data": {"time_slices_ratio": 0.9, "mps_ratio": 1.8}}]})");
  Result r = Tessera(base + " --mps-figures " + report + " -o json 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out,
              ::testing::HasSubstr("MPS capacity 2.00 GPUs' worth of time-sliced work, from " +
                                   report + " (NVIDIA H200)"));
  r = Tessera(base + " --mps-figures " + report + ".missing 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, ::testing::HasSubstr(".missing: cannot read it: No such file or directory"));
  r = Tessera(base + " --mps-figures " + WriteTemp("junk.json", "{not json") + " 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, ::testing::HasSubstr("junk.json: not JSON"));
  r = Tessera(base + " --mps-figures " + WriteTemp("other.json", R"({"checks": []})") + " 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, ::testing::HasSubstr("other.json: "));
}

TEST(TesseraSim, ReplayReportsWaitsAndSeries) {
  std::string nodes = WriteTemp("nodes.csv", kNodes), jobs = WriteTemp("jobs.csv", kJobs);
  std::string out = nodes + ".replay";
  Result r = Tessera("sim replay --nodes " + nodes + " --pods " + jobs +
                     " --policies fgd,spread -o json --samples 5 --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["jobs"], 5);
  EXPECT_EQ(j[0]["finished"], 5);
  EXPECT_EQ(j[0]["waitSeconds"]["count"], 5);
  std::string series = tessera::test::ReadFile(out + "/replay_series.csv");
  EXPECT_THAT(series, ::testing::StartsWith("policy,seed,window,time,allocated_ratio"));
  // header + 5 per policy and window (busy period, whole replay)
  EXPECT_EQ(std::count(series.begin(), series.end(), '\n'), 21);
  EXPECT_THAT(tessera::test::ReadFile(out + "/replay_waits.csv"),
              ::testing::StartsWith("policy,seed,size,jobs,wait_mean_s"));
  EXPECT_TRUE(j[0].contains("busyMeanAllocatedRatio"));
  EXPECT_TRUE(j[0]["waitSecondsBySize"].is_object());
  EXPECT_EQ(j[0]["busyEnd"], j[1]["busyEnd"]) << "runs side by side share one busy period";
  Result t = Tessera("sim replay --nodes " + nodes + " --pods " + jobs +
                     " --policies fgd --arrival-order --reservations 2 --predict");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_THAT(t.out, ::testing::HasSubstr("ALLOC (BUSY)"));
}

// --right-size: each policy again on right-sized requests, the GPUs' busy figure beside their
// allocation, the use model's draws said on stderr; a bad model is exit 2 naming the field.
// --elastic: each policy again with the multi-GPU jobs elastic (job c asks 4 GPUs: 2 to 4); on a
// cluster with room it starts on all 4 at once, so it finishes as fixed-size.
TEST(TesseraSim, ReplayElasticJobsBesideTheSameJobsFixedSize) {
  std::string nodes = WriteTemp("nodes.csv", kNodes), jobs = WriteTemp("jobs.csv", kJobs);
  Result r = Tessera("sim replay --nodes " + nodes + " --pods " + jobs +
                     " --policies fgd --elastic 1 -o json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["policy"], "fgd");
  EXPECT_EQ(j[0]["elasticJobs"], 0);
  EXPECT_EQ(j[1]["policy"], "fgd elastic");
  EXPECT_EQ(j[1]["elasticJobs"], 1);
  EXPECT_EQ(j[1]["grows"], 1);
  EXPECT_EQ(j[1]["shrinks"], 0);
  EXPECT_EQ(j[1]["finished"], 5);
  EXPECT_EQ(j[1]["jctSecondsBySize"]["3-4"]["mean"], j[0]["jctSecondsBySize"]["3-4"]["mean"]);
  Result t = Tessera("sim replay --nodes " + nodes + " --pods " + jobs +
                     " --policies fgd --elastic 0.5 2>&1");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_THAT(t.out, ::testing::HasSubstr("ELASTIC"));
  EXPECT_THAT(t.out, ::testing::HasSubstr("fgd elastic"));
  for (const char* flag : {"--elastic 2", "--elastic 1 --elastic-serial-fraction 1.5",
                           "--elastic 1 --resize-overhead -1"}) {
    Result f = Tessera("sim replay --nodes " + nodes + " --pods " + jobs + " " + flag + " 2>&1");
    EXPECT_EQ(f.code, 2) << flag << ": " << f.out;
    EXPECT_THAT(f.out,
                ::testing::HasSubstr(std::string(flag).substr(std::string(flag).rfind("--"), 8)))
        << flag;
  }
}

TEST(TesseraSim, ReplayRightSizedRequestsBesideThoseAsAsked) {
  std::string nodes = WriteTemp("nodes.csv", kNodes), jobs = WriteTemp("jobs.csv", kJobs);
  Result r = Tessera("sim replay --nodes " + nodes + " --pods " + jobs +
                     " --policies fgd --right-size --use-mean 0.2 -o json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["policy"], "fgd");
  EXPECT_EQ(j[1]["policy"], "fgd right-sized");
  EXPECT_EQ(j[1]["finished"], 5);
  ASSERT_TRUE(j[0]["busyMeanGpuBusyRatio"].is_number()) << j[0].dump();
  EXPECT_LT(j[1]["busyMeanAllocatedRatio"].get<double>(),
            j[0]["busyMeanAllocatedRatio"].get<double>())
      << "jobs that use a fifth of what they ask hold less right-sized";
  EXPECT_NEAR(j[1]["busyMeanGpuBusyRatio"].get<double>(),
              j[0]["busyMeanGpuBusyRatio"].get<double>(), 1e-9)
      << "the same work";
  Result t = Tessera("sim replay --nodes " + nodes + " --pods " + jobs +
                     " --policies fgd --right-size 2>&1");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_THAT(t.out, ::testing::HasSubstr("right-sizing: the use of 4 jobs drawn from the model"));
  EXPECT_THAT(t.out, ::testing::HasSubstr("GPU BUSY (BUSY)"));
  EXPECT_THAT(t.out, ::testing::HasSubstr("fgd right-sized"));
  for (const char* flag :
       {"--use-mean 1", "--use-concentration 0", "--margin -1", "--granularity 0"}) {
    Result f = Tessera("sim replay --nodes " + nodes + " --pods " + jobs + " --right-size " + flag +
                       " 2>&1");
    EXPECT_EQ(f.code, 2) << flag << ": " << f.out;
  }
}

TEST(TesseraSim, BadInputIsExitTwoNamingTheLine) {
  std::string nodes = WriteTemp("nodes.csv", kNodes);
  std::string bad = WriteTemp("bad.csv", "name,cpu_milli,memory_mib,gpus\nx,1,1,-3\n");
  Result r = Tessera("sim inflate --nodes " + nodes + " --pods " + bad + " 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, ::testing::HasSubstr("bad.csv:2: gpus: expected an integer 0..64, got '-3'"));
  Result p =
      Tessera("sim inflate --nodes " + nodes + " --pods " + bad + " --policies fgd,nope 2>&1");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.out, ::testing::HasSubstr("unknown policy 'nope'"));
  Result missing = Tessera("sim inflate --nodes /nonexistent.csv --pods " + bad + " 2>&1");
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.out, ::testing::HasSubstr("/nonexistent.csv: cannot open"));
  for (const char* flag : {"--ratio 0", "--seeds 0", "--step 2", "--format csv", "-o xml"}) {
    Result f = Tessera("sim inflate --nodes " + nodes + " --pods " + nodes + " " + flag + " 2>&1");
    EXPECT_EQ(f.code, 2) << flag;
    EXPECT_THAT(f.out,
                ::testing::HasSubstr(std::string(flag).substr(0, std::string(flag).find(' '))))
        << flag;
  }
  std::string jobs = WriteTemp("jobs.csv", kJobs);
  for (const char* flag : {"--utilization-ceiling 150", "--utilization-ceiling -1"}) {
    Result f = Tessera("sim replay --nodes " + nodes + " --pods " + jobs + " " + flag + " 2>&1");
    EXPECT_EQ(f.code, 2) << flag;
    EXPECT_THAT(f.out, ::testing::HasSubstr("--utilization-ceiling")) << flag;
  }
  std::string untimed = WriteTemp("untimed.csv", "name,cpu_milli,memory_mib,gpus\nx,1,1,1\n");
  Result replay = Tessera("sim replay --nodes " + nodes + " --pods " + untimed + " 2>&1");
  EXPECT_EQ(replay.code, 2);
  EXPECT_THAT(replay.out, ::testing::HasSubstr("no job in the pod list has a duration"));
}

// The README's simulator example works from any clone: the default traces are the copy the
// repository carries (traces/openb), and a TESSERA_TRACES naming no traces is said, with the path.
TEST(TesseraSim, DefaultsToTheTracesTheRepositoryCarries) {
  Result r = Tessera("sim inflate --policies fgd --seeds 1 2>&1", "env -u TESSERA_TRACES");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("PAPER")) << "the paper's column: the default pod list";
  EXPECT_THAT(r.out, ::testing::HasSubstr("fgd"));
  Result missing = Tessera("sim inflate --policies fgd --seeds 1 2>&1",
                           "TESSERA_TRACES=" + ::testing::TempDir() + "no-traces-here");
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.out, ::testing::HasSubstr("no-traces-here/openb_node_list_gpu_node.csv"));
}

TEST(TesseraSim, HelpForEachSubcommand) {
  for (const char* cmd : {"sim --help", "sim inflate --help", "sim replay --help"}) {
    Result r = Tessera(cmd);
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_THAT(r.out, ::testing::HasSubstr("--")) << cmd;
  }
  EXPECT_THAT(Tessera("sim inflate --help").out, ::testing::HasSubstr("--ratio"));
  EXPECT_THAT(Tessera("sim replay --help").out, ::testing::HasSubstr("--compress"));
}

}  // namespace
