#include "tessera/sim/openb.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;

// The traces the checkout carries (traces/openb); TESSERA_TRACES overrides.
std::string TraceDir() {
  const char* env = std::getenv("TESSERA_TRACES");
  return env && *env ? env : TESSERA_SOURCE_DIR "/traces/openb";
}
const std::string kTraces = TraceDir();

TEST(Openb, LoadsTheRealNodeList) {
  ASSERT_TRUE(std::filesystem::exists(kTraces))
      << "no traces at " << kTraces << " (set TESSERA_TRACES)";
  auto nodes = LoadOpenbNodes(kTraces + "/openb_node_list_gpu_node.csv");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->size(), 1213u);
  size_t gpus = 0;
  for (const auto& n : *nodes) gpus += n.gpus.size();
  EXPECT_EQ(gpus, 6212u);
  auto all = LoadOpenbNodes(kTraces + "/openb_node_list_all_node.csv");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 1523u);
}

TEST(Openb, LoadsEveryPodList) {
  ASSERT_TRUE(std::filesystem::exists(kTraces))
      << "no traces at " << kTraces << " (set TESSERA_TRACES)";
  for (const char* f : {"default", "gpushare40", "multigpu20", "gpuspec20"}) {
    auto pods = LoadOpenbPods(kTraces + "/openb_pod_list_" + f + ".csv");
    ASSERT_TRUE(pods.ok()) << pods.status();
    EXPECT_GT(pods->size(), 8000u) << f;
  }
  auto pods = LoadOpenbPods(kTraces + "/openb_pod_list_default.csv");
  ASSERT_TRUE(pods.ok());
  EXPECT_EQ(pods->size(), 8152u);
  const TracePod& p1 = (*pods)[1];  // openb-pod-0001,6000,12288,1,460,,LS,Running,427061,...
  EXPECT_EQ(p1.request.id, "openb-pod-0001");
  EXPECT_EQ(p1.request.gpu_milli, 460);
  EXPECT_EQ(p1.request.gpus, 0);
  EXPECT_EQ(p1.qos, "LS");
  EXPECT_EQ(p1.creation_time, 427061);
}

TEST(Openb, ParsesModelsAndShares) {
  auto pods = ParseOpenbPods(
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
      "a,1000,100,1,250,\n"
      "b,1000,100,2,1000,V100M16|V100M32\n"
      "c,1000,100,0,0,\n",
      "p.csv");
  ASSERT_TRUE(pods.ok()) << pods.status();
  EXPECT_EQ((*pods)[0].request.gpu_milli, 250);
  EXPECT_EQ((*pods)[1].request.gpus, 2);
  EXPECT_THAT((*pods)[1].request.models, ::testing::ElementsAre("V100M16", "V100M32"));
  EXPECT_FALSE((*pods)[2].request.wants_gpu());
}

struct Bad {
  const char* csv;
  const char* error;
};

class BadPods : public ::testing::TestWithParam<Bad> {};

TEST_P(BadPods, NamesFileLineAndColumn) {
  auto pods = ParseOpenbPods(GetParam().csv, "pods.csv");
  ASSERT_FALSE(pods.ok());
  EXPECT_EQ(pods.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(pods.status().message()), HasSubstr(GetParam().error));
}

INSTANTIATE_TEST_SUITE_P(
    Rows, BadPods,
    ::testing::Values(
        Bad{"", "pods.csv:1: the file is empty"},
        Bad{"name,cpu_milli\n", "pods.csv:1: missing column 'memory_mib'"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli,colour\n",
            "pods.csv:1: unknown column 'colour'"},
        Bad{"name,name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "column 'name' appears twice"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,12,1000\n",
            "pods.csv:2: num_gpu: expected an integer 0..8, got '12'"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,x,1,1,1000\n",
            "pods.csv:2: cpu_milli: expected an integer"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1\n",
            "pods.csv:2: expected 5 fields, got 4"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,2,500\n",
            "pods.csv:2: gpu_milli: expected 1000 with num_gpu 2, got 500"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,0,300\n",
            "gpu_milli: expected 0 with num_gpu 0"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,0\n",
            "expected 1..1000 with num_gpu 1"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,1000\na,1,1,1,1000\n",
            "pods.csv:3: name: pod 'a' listed twice"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n,1,1,1,1000\n",
            "pods.csv:2: name: not a pod name"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\na,1,1,1,1000,T4|\n",
            "gpu_spec: empty model"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos\na,1,1,1,1000,Urgent\n",
            "qos: expected LS"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\na,1,1,1,1000,"
            "50,10\n",
            "deletion_time: 10 is before creation_time 50"},
        Bad{"name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,-5,1,1,1000\n",
            "cpu_milli: expected an integer 0.."}));

TEST(Openb, BadNodeRows) {
  auto n = ParseOpenbNodes("sn,cpu_milli,memory_mib,gpu,model\nx,1000,100,2,\n", "nodes.csv");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()),
              HasSubstr("nodes.csv:2: model: a node with GPUs needs a model"));
  auto dup =
      ParseOpenbNodes("sn,cpu_milli,memory_mib,gpu,model\nx,1,1,0,\nx,1,1,0,\n", "nodes.csv");
  EXPECT_THAT(std::string(dup.status().message()),
              HasSubstr("nodes.csv:3: sn: node 'x' listed twice"));
  auto big = ParseOpenbNodes("sn,cpu_milli,memory_mib,gpu,model\nx,1,1,99,T4\n", "nodes.csv");
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("gpu: expected an integer 0..64"));
  EXPECT_EQ(LoadOpenbNodes("/no/such.csv").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera::sim
