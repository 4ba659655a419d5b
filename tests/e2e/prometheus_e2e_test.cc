// A real Prometheus (Debian's) scrapes the server over TCP with a metrics-only token, as an
// admin's existing monitoring would. The queries of NVIDIA's published dcgm-exporter dashboard -
// its metric names, label names and groupings, written out here - return data for the server's
// GPUs on the fake NVML, with every label they group or filter by on the series; no Tessera series
// arrives with an exported_* label (Prometheus renames a target's label that collides with its
// own); a job on 2 GPUs has 2 per-GPU series. Skipped only where there is no prometheus binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../capture.h"
#include "daemon.h"
#include "prometheus.h"

namespace {

using nlohmann::json;
using tessera::test::Daemon;
using tessera::test::Prometheus;
using tessera::test::Shell;

constexpr char kScrapeToken[] = "scrape-0123456789abcdef";

TEST(Prometheus, NvidiasDashboardQueriesReadTheServersGpusAndNoLabelIsRenamed) {
  if (!tessera::test::HavePrometheus())
    GTEST_SKIP() << "no prometheus binary here (Debian's package 'prometheus')";
  const std::string scenario =
      ::testing::TempDir() + "prometheus-" + std::to_string(getpid()) + ".json";
  json h100 = {{"name", "NVIDIA H100 80GB HBM3"},
               {"memory_total", 85899345920ull},
               {"cc", {9, 0}},
               {"utilization", 64},
               {"memory_used", 4000000000ull},
               {"temperature", 51},
               {"power_mw", 420000},
               {"sm_clock_mhz", 1980},
               {"tensor_util", 40}};
  json devices = {h100, h100};
  devices[0]["uuid"] = "GPU-11111111-aaaa";
  devices[0]["pci_bus_id"] = "00000000:18:00.0";
  devices[1]["uuid"] = "GPU-22222222-bbbb";
  devices[1]["pci_bus_id"] = "00000000:2A:00.0";
  std::ofstream(scenario) << json{{"devices", devices}}.dump();
  setenv("FAKE_NVML_SCENARIO", scenario.c_str(), 1);
  Daemon d("prometheus",
           std::string("nvml_library: ") + TESSERA_TEST_FAKES_DIR +
               "/nvml-full/libnvidia-ml.so.1\nfallback_simulate: \"\"\n"
               "tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: " +
               kScrapeToken + ", metrics_only: true}\n",
           "");
  unsetenv("FAKE_NVML_SCENARIO");
  const std::string log = d.Log();
  const size_t at = log.find("tcp port ");
  ASSERT_NE(at, std::string::npos) << log;
  const int server_port = std::stoi(log.substr(at + 9));
  const int64_t job = d.Submit(Shell("sleep 60", {{"gpus", 2}}));
  d.WaitFor(job, "running");

  Prometheus prom(d.dir(), {{"tessera", "127.0.0.1:" + std::to_string(server_port), kScrapeToken}});
  ASSERT_TRUE(prom.up()) << prom.Log();
  json up = prom.Await("up{job=\"tessera\"} == 1");
  ASSERT_EQ(up.size(), 1u) << "the server was never scraped: " << prom.Log();

  for (const std::string& problem : tessera::test::NvidiaDashboardProblems(prom, 2))
    ADD_FAILURE() << problem;
  // The readings are the driver's, in dcgm-exporter's units.
  json tensor = prom.Query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=\"0\"}");
  ASSERT_EQ(tensor.size(), 1u);
  EXPECT_EQ(tensor[0]["value"][1], "0.4") << "40% as a ratio";
  EXPECT_EQ(tensor[0]["metric"]["modelName"], "NVIDIA H100 80GB HBM3");
  json clock = prom.Query("DCGM_FI_DEV_SM_CLOCK{UUID=\"GPU-22222222-bbbb\"}");
  ASSERT_EQ(clock.size(), 1u);
  EXPECT_EQ(clock[0]["value"][1], "1980");
  EXPECT_EQ(clock[0]["metric"]["pci_bus_id"], "00000000:2A:00.0");

  // Every series as stored: no label renamed on ingestion.
  size_t series = 0;
  for (const std::string& renamed :
       tessera::test::RenamedLabels(prom, "{job=\"tessera\"}", &series))
    ADD_FAILURE() << renamed;
  EXPECT_GT(series, 20u);
  // The 2-GPU job: one series per GPU it holds, by its job_id.
  json per_gpu =
      prom.Await("tessera_job_gpu_share_ratio{job_id=\"" + std::to_string(job) + "\"}", 2);
  EXPECT_EQ(per_gpu.size(), 2u) << per_gpu.dump();
  d.Call("POST", "/v1/jobs/" + std::to_string(job) + "/cancel");
}

}  // namespace
