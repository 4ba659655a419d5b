#include "tessera/sim/slurm_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;

// As `scontrol show node -o` prints them (22.05), a Reason with spaces included.
constexpr char kNodes[] =
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.10 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8(S:0-1),shard:64 "
    "NodeAddr=gpu01 NodeHostName=gpu01 Version=22.05.8 OS=Linux RealMemory=515000 AllocMem=0 "
    "FreeMem=500000 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 "
    "Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2026-11-01T00:00:00 "
    "CfgTRES=cpu=64,mem=515000M,billing=64,gres/gpu=8 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n"
    "NodeName=gpu02 CPUTot=32 RealMemory=256000 Gres=gpu:4 State=DOWN Reason=fan broken "
    "[root@2026-11-20T10:00:00]\n"
    "NodeName=cpu01 CPUTot=128 RealMemory=1T Gres=(null) State=IDLE\n";

TEST(SlurmTrace, NodesFromScontrol) {
  auto nodes = ParseScontrolNodes(kNodes, "nodes.txt", 40960);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 3u);
  const core::NodeSpec& a = (*nodes)[0];
  EXPECT_EQ(a.name, "gpu01");
  EXPECT_EQ(a.cpu_milli, 64000);
  EXPECT_EQ(a.memory_mib, 515000);
  ASSERT_EQ(a.gpus.size(), 8u);
  EXPECT_EQ(a.gpus[0].model, "a100");
  EXPECT_EQ(a.gpus[0].memory_mib, 40960);
  EXPECT_EQ((*nodes)[1].gpus.size(), 4u);
  EXPECT_EQ((*nodes)[1].gpus[0].model, "gpu") << "no gres type: a generic model";
  EXPECT_EQ((*nodes)[2].memory_mib, 1 << 20);
  EXPECT_TRUE((*nodes)[2].gpus.empty());
  EXPECT_EQ(ShardsPerGpu(*nodes), 8);
}

TEST(SlurmTrace, MalformedNodesAreRefusedWithFileLineAndField) {
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"CPUTot=4 RealMemory=10\n", "nodes.txt:1: not a line of `scontrol show node -o`"},
           {"NodeName=a CPUTot=x RealMemory=10\n", "nodes.txt:1: CPUTot: expected a count"},
           {"NodeName=a CPUTot=4 RealMemory=lots\n", "nodes.txt:1: RealMemory: expected MiB"},
           {"NodeName=a CPUTot=4 RealMemory=1 Gres=gpu:a100:x\n", "Gres: cannot read 'gpu:a100:x'"},
           {"NodeName=a CPUTot=4 RealMemory=1\n\nNodeName=a CPUTot=4 RealMemory=1\n",
            "nodes.txt:3: NodeName: node 'a' listed twice"}}) {
    auto n = ParseScontrolNodes(text, "nodes.txt");
    ASSERT_FALSE(n.ok()) << text;
    EXPECT_THAT(std::string(n.status().message()), HasSubstr(why));
  }
}

constexpr char kJobs[] =
    "JobID|User|Submit|Start|End|State|AllocTRES|Timelimit\n"
    "101|ana|2026-11-01T10:00:00|2026-11-01T10:00:05|2026-11-01T11:00:05|COMPLETED|"
    "billing=8,cpu=8,gres/gpu=2,mem=64G,node=1|02:00:00\n"
    "101.batch|ana|2026-11-01T10:00:00|2026-11-01T10:00:05|2026-11-01T11:00:05|COMPLETED|"
    "cpu=8,gres/gpu=2,mem=64G,node=1|\n"
    "102|bo|2026-11-01T09:59:00|2026-11-01T10:30:00|2026-11-01T10:40:00|FAILED|"
    "billing=2,cpu=2,gres/shard=3,mem=8000M,node=1|1-00:00:00\n"
    "103|bo|2026-11-01T10:01:00|Unknown|Unknown|CANCELLED by 1002||UNLIMITED\n"
    "104_7|cy|2026-11-01T10:02:00|2026-11-01T10:02:30|Unknown|RUNNING|"
    "cpu=32,gres/gpu=16,mem=200G,node=2|Partition_Limit\n";

TEST(SlurmTrace, JobsFromSacct) {
  auto jobs = ParseSacctJobs(kJobs, "jobs.txt", 8, 40960);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  // By submission: 102 first; the step and the job that never started are left out; the job on
  // two nodes is two parts.
  ASSERT_EQ(jobs->size(), 4u);
  const SimJob& shard = (*jobs)[0];
  EXPECT_EQ(shard.request.id, "102");
  EXPECT_EQ(shard.request.owner, "bo");
  EXPECT_EQ(shard.submit, 0);
  EXPECT_EQ(shard.duration, 600);
  EXPECT_EQ(shard.predicted_duration, 86400);
  EXPECT_EQ(shard.request.gpu_milli, 375) << "3 of 8 shards";
  EXPECT_EQ(shard.request.gpu_memory_mib, 15360) << "3/8 of 40 GiB";
  EXPECT_EQ(shard.request.gpus, 0);
  EXPECT_EQ(shard.request.memory_mib, 8000);
  const SimJob& whole = (*jobs)[1];
  EXPECT_EQ(whole.request.id, "101");
  EXPECT_EQ(whole.submit, 60);
  EXPECT_EQ(whole.duration, 3600);
  EXPECT_EQ(whole.predicted_duration, 7200);
  EXPECT_EQ(whole.request.gpus, 2);
  EXPECT_EQ(whole.request.cpu_milli, 8000);
  EXPECT_EQ(whole.request.memory_mib, 65536);
  EXPECT_EQ((*jobs)[2].request.id, "104_7/0");
  EXPECT_EQ((*jobs)[3].request.id, "104_7/1");
  EXPECT_EQ((*jobs)[2].request.gpus, 8) << "16 GPUs on 2 nodes";
  EXPECT_EQ((*jobs)[2].request.cpu_milli, 16000);
  EXPECT_LT((*jobs)[2].duration, 0) << "still running: to the end of the replay";
  EXPECT_LT((*jobs)[2].predicted_duration, 0);
}

TEST(SlurmTrace, MalformedJobsAreRefusedWithFileLineAndField) {
  const std::string head = "JobID|Submit|Start|End|State|AllocTRES\n";
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"", "jobs.txt:1: the file is empty"},
           {"JobID|Submit|Start|End|State\n", "jobs.txt:1: no AllocTRES"},
           {"JobID|Start|End|State|AllocTRES\n", "jobs.txt:1: no Submit field"},
           {"JobID|Submit|Start|End|State|Start|AllocTRES\n1|a|b|c|d|e|f\n",
            "jobs.txt:1: field 'Start' appears twice"},
           {head + "1|2026-11-01T10:00:00|2026-11-01T10:00:00|x|COMPLETED\n",
            "jobs.txt:2: 5 fields, the header has 6"},
           {head + "1|yesterday|2026-11-01T10:00:00|Unknown|RUNNING|cpu=1\n",
            "jobs.txt:2: Submit: expected a time"},
           {head +
                "1|2026-11-01T10:00:00|2026-11-01T10:00:09|2026-11-01T10:00:01|COMPLETED|cpu=1\n",
            "jobs.txt:2: End 2026-11-01T10:00:01 is before Start"},
           {head + "1|2026-11-01T10:00:00|2026-11-01T10:00:00|Unknown|RUNNING|mem=lots\n",
            "jobs.txt:2: AllocTRES: mem=lots"},
           {head + "1|2026-11-01T10:00:00|2026-11-01T10:00:00|Unknown|RUNNING|gres/gpu=3,node=2\n",
            "gres/gpu=3 over node=2"},
           {head + "1|2026-11-01T10:00:00|2026-11-01T10:00:00|Unknown|RUNNING|gres/gpu=70\n",
            "jobs.txt:2: gres/gpu=70 over node=1: more than 64 GPUs on a node"},
           {head + "1|2026-11-01T10:00:00|2026-11-01T10:00:00|Unknown|RUNNING|cpu=1\n"
                   "1|2026-11-01T10:00:00|2026-11-01T10:00:00|Unknown|RUNNING|cpu=1\n",
            "jobs.txt:3: JobID: job '1' listed twice"}}) {
    auto j = ParseSacctJobs(text, "jobs.txt", 8);
    ASSERT_FALSE(j.ok()) << text;
    EXPECT_THAT(std::string(j.status().message()), HasSubstr(why));
  }
  auto no_shards = ParseSacctJobs(
      head + "1|2026-11-01T10:00:00|2026-11-01T10:00:00|Unknown|RUNNING|gres/shard=2\n", "jobs.txt",
      0);
  ASSERT_FALSE(no_shards.ok());
  EXPECT_THAT(std::string(no_shards.status().message()),
              HasSubstr("no node of the cluster with shards"));
}

}  // namespace
}  // namespace tessera::sim
