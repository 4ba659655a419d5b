// Launch plans alone (launch_plan.h): what a job is given, from its spec, its allocation and a
// server's setup on a simulated machine of two T4s.
#include "tessera/server/launch_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "nlohmann/json.hpp"
#include "tessera/devices/inventory.h"
#include "tessera/devices/simulated_source.h"

namespace tessera::server {
namespace {

using nlohmann::json;

class LaunchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto machine = devices::LoadSimulatedMachine("t4x2");
    ASSERT_TRUE(machine.ok()) << machine.status();
    inventory_ = machine->inventory;
    node_ = core::NodeFromInventory(inventory_, 8000, 32768);
    config_.state_dir = "/var/lib/tessera-test";
    config_.intercept_library = "/usr/lib/tessera/libtessera-cuda.so";
    setup_ = {.config = &config_,
              .inventory = &inventory_,
              .node = &node_,
              .hostname = "node7",
              .arbiter_file = "/var/lib/tessera-test/arbiter/gpu.arbiter",
              .confines = false,
              .containers = false,
              .containers_off = "podman: not found"};
  }
  QueuedJob Job(int64_t id, JobSpec spec) {
    QueuedJob q;
    q.id = id;
    q.owner = "alice";
    q.uid = getuid() == 0 ? 1 : getuid();  // daemon's uid when tests run as root: it exists
    q.priority = 3;
    q.spec = std::make_shared<const JobSpec>(std::move(spec));
    return q;
  }
  sched::Allocation On(std::vector<int> gpus, int32_t milli = 1000, int64_t mib = 0) {
    sched::Allocation a;
    a.gpus = std::move(gpus);
    a.milli_per_gpu = milli;
    a.memory_mib_per_gpu = mib;
    return a;
  }

  core::NodeInventory inventory_;
  core::NodeSpec node_;
  ServerConfig config_;
  LaunchSetup setup_;
};

TEST_F(LaunchPlanTest, AWholeGpuJobGetsItsGpusItsLogsAndTheNamesASlurmScriptReads) {
  JobSpec spec;
  spec.command = {"python", "train.py"};
  spec.name = "train";
  spec.workdir = "/home/alice/run";
  spec.env = {{"SEED", "1"}};
  spec.gpus = 1;
  QueuedJob q = Job(42, spec);
  q.array_id = 40;
  q.array_index = 2;
  const LaunchPlan p = PlanLaunch(setup_, q, On({1}), 100);
  EXPECT_TRUE(p.refused.ok()) << p.refused;
  EXPECT_EQ(p.where, "GPU 1");
  const json placement = json::parse(p.placement_json);
  ASSERT_EQ(placement["gpus"].size(), 1u);
  EXPECT_EQ(placement["gpus"][0]["index"], 1);
  EXPECT_EQ(placement["gpus"][0]["uuid"], inventory_.gpus[1].uuid);
  EXPECT_EQ(placement["milli_per_gpu"], 1000);
  EXPECT_EQ(p.spec.gpu_uuids, std::vector<std::string>{inventory_.gpus[1].uuid});
  EXPECT_EQ(p.spec.argv, spec.command);
  EXPECT_EQ(p.spec.env.at("SEED"), "1");
  EXPECT_EQ(p.spec.env.at("SLURM_JOB_ID"), "42");
  EXPECT_EQ(p.spec.env.at("SLURM_JOB_NAME"), "train");
  EXPECT_EQ(p.spec.env.at("SLURM_SUBMIT_DIR"), "/home/alice/run");
  EXPECT_EQ(p.spec.env.at("SLURM_ARRAY_JOB_ID"), "40");
  EXPECT_EQ(p.spec.env.at("TESSERA_ARRAY_TASK_ID"), "2");
  EXPECT_FALSE(p.spec.env.contains("SLURM_NTASKS"));  // MPI launchers would take it for Slurm's
  EXPECT_EQ(p.spec.stdout_path, "/var/lib/tessera-test/logs/42.out");
  EXPECT_EQ(p.spec.exit_path, "/var/lib/tessera-test/exit/42");
  EXPECT_TRUE(p.spec.user_stdout.empty());
  EXPECT_FALSE(p.spec.share.has_value());
  EXPECT_FALSE(p.limits.has_value());  // not confined on this setup
  EXPECT_TRUE(p.run.region.empty());
  EXPECT_EQ(p.run.gpus, std::vector<int>{1});
  EXPECT_EQ(p.run.started, 100);
}

TEST_F(LaunchPlanTest, AShareGetsItsRegionTheArbiterAndItsLimits) {
  JobSpec spec;
  spec.command = {"serve"};
  spec.gpu_milli = 300;
  spec.gpu_memory_mib = 4096;
  const LaunchPlan p = PlanLaunch(setup_, Job(7, spec), On({0}, 300, 4096), 100);
  ASSERT_TRUE(p.spec.share.has_value());
  const ShareLimits& s = *p.spec.share;
  EXPECT_EQ(s.region, "/var/lib/tessera-test/regions/7.region");
  EXPECT_EQ(p.run.region, s.region);
  EXPECT_EQ(s.arbiter, "/var/lib/tessera-test/arbiter/gpu.arbiter");
  EXPECT_EQ(s.library, config_.intercept_library);
  EXPECT_EQ(s.memory_bytes, uint64_t{4096} << 20);
  EXPECT_EQ(s.share_milli, 300);
  EXPECT_EQ(s.priority, 3);
  EXPECT_EQ(s.physical_gpus, std::vector<int>{0});
  EXPECT_EQ(json::parse(p.placement_json)["memory_mib_per_gpu"], 4096);
}

TEST_F(LaunchPlanTest, AJobOfSeveralTasksGetsRanksAndEachTaskItsOwnLogs) {
  JobSpec spec;
  spec.command = {"torchrun-free"};
  spec.gpus = 2;
  spec.ntasks = 4;
  const LaunchPlan p = PlanLaunch(setup_, Job(9, spec), On({0, 1}), 100);
  ASSERT_EQ(p.spec.tasks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const TaskLaunch& t = p.spec.tasks[r];
    EXPECT_EQ(t.env.at("RANK"), std::to_string(r));
    EXPECT_EQ(t.env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(t.env.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(t.env.at("MASTER_PORT"), p.spec.tasks[0].env.at("MASTER_PORT"));
    EXPECT_EQ(t.env.at("TESSERA_TASK_GPU"), std::to_string(r / 2));  // two tasks per GPU
  }
  EXPECT_EQ(p.spec.tasks[0].stdout_path, "/var/lib/tessera-test/logs/9.out");
  EXPECT_EQ(p.spec.tasks[2].stderr_path, "/var/lib/tessera-test/logs/9.2.err");
  EXPECT_EQ(p.run.tasks, 4);
}

TEST_F(LaunchPlanTest, AnMpsJobsProcessesAreClientsOfTheirGpusDaemonsWithTheirShareAsLimits) {
  devices::MpsDaemons mps("nvidia-cuda-mps-control", "/var/lib/tessera-test/mps",
                          {{0, inventory_.gpus[0].uuid}, {1, inventory_.gpus[1].uuid}});
  setup_.mps = &mps;
  JobSpec spec;
  spec.command = {"serve"};
  spec.gpus = 2;
  spec.gpu_milli = 250;
  spec.gpu_memory_mib = 2048;
  spec.tasks_per_gpu = 1;
  spec.sharing = "mps";
  sched::Allocation a = On({0, 1}, 250, 2048);
  a.request = RequestOf(spec, 5, "alice");
  QueuedJob q = Job(5, spec);
  q.priority = -2;
  const LaunchPlan p = PlanLaunch(setup_, q, a, 100);
  ASSERT_TRUE(p.refused.ok()) << p.refused;
  ASSERT_TRUE(p.spec.share.has_value());
  EXPECT_TRUE(p.spec.share->arbiter.empty()) << "its kernels run beside the others', not in turns";
  EXPECT_EQ(p.spec.share->memory_bytes, uint64_t{2048} << 20) << "the library's limit stays";
  EXPECT_TRUE(p.spec.host_shm) << "its server's segments are in the host's /dev/shm";
  ASSERT_EQ(p.spec.tasks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const auto& env = p.spec.tasks[r].env;
    EXPECT_EQ(env.at("CUDA_MPS_PIPE_DIRECTORY"),
              "/var/lib/tessera-test/mps/gpu" + std::to_string(r) + "/pipe");
    EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), inventory_.gpus[r].uuid) << "its own GPU alone";
    EXPECT_EQ(env.at("TESSERA_TASK_GPU"), "0");
    EXPECT_EQ(env.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
    EXPECT_EQ(env.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=2048M");
    EXPECT_EQ(env.at("CUDA_MPS_CLIENT_PRIORITY"), "1");
  }
  // A whole GPU asked in MPS mode: all of its SMs, no pinned limit, no library.
  JobSpec whole;
  whole.command = {"mpirun-free"};
  whole.gpus = 1;
  whole.sharing = "mps";
  sched::Allocation w = On({1});
  w.request = RequestOf(whole, 6, "alice");
  const LaunchPlan wp = PlanLaunch(setup_, Job(6, whole), w, 100);
  ASSERT_TRUE(wp.refused.ok()) << wp.refused;
  EXPECT_EQ(wp.spec.env.at("CUDA_MPS_PIPE_DIRECTORY"), "/var/lib/tessera-test/mps/gpu1/pipe");
  EXPECT_EQ(wp.spec.env.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "100");
  EXPECT_FALSE(wp.spec.env.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
  EXPECT_FALSE(wp.spec.share.has_value());
  // A job that asked MPS on a GPU no longer in MPS mode (the config changed under it) is refused,
  // not run outside MPS.
  devices::MpsDaemons only0("nvidia-cuda-mps-control", "/var/lib/tessera-test/mps",
                            {{0, inventory_.gpus[0].uuid}});
  setup_.mps = &only0;
  const LaunchPlan refused = PlanLaunch(setup_, Job(6, whole), w, 100);
  EXPECT_EQ(refused.refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.refused.message().find("GPU 1 is not in MPS mode"), std::string::npos)
      << refused.refused;
  // A job that asked no mode gets no MPS variable, even on an MPS GPU.
  JobSpec plain = whole;
  plain.sharing.clear();
  const LaunchPlan pp = PlanLaunch(setup_, Job(7, plain), w, 100);
  EXPECT_FALSE(pp.spec.env.contains("CUDA_MPS_PIPE_DIRECTORY"));
  EXPECT_FALSE(pp.spec.host_shm);
}

TEST_F(LaunchPlanTest, OutputFilesOfTheUsersAreExpandedPerTask) {
  JobSpec spec;
  spec.command = {"/opt/bin/solve"};
  spec.stdout_file = "out-%j-%t-%u-%x.txt";
  const LaunchPlan p = PlanLaunch(setup_, Job(11, spec), On({}), 100);
  EXPECT_EQ(p.where, "no GPU");
  EXPECT_NE(p.spec.user_stdout.find("out-11-0-alice-solve"), std::string::npos)
      << p.spec.user_stdout;
}

TEST_F(LaunchPlanTest, AConfinedJobsCgroupHasItsLimits) {
  setup_.confines = true;
  config_.pids_max = 512;
  JobSpec spec;
  spec.command = {"x"};
  spec.memory_mib = 2048;
  spec.cpu_milli = 1500;
  const QueuedJob q = Job(5, spec);
  const LaunchPlan p = PlanLaunch(setup_, q, On({0}), 100);
  ASSERT_TRUE(p.limits.has_value());
  EXPECT_EQ(p.limits->memory_bytes, int64_t{2048} << 20);
  EXPECT_EQ(p.limits->cpu_milli, 1500);
  EXPECT_EQ(p.limits->pids_max, 512);
  EXPECT_EQ(p.limits->uid, q.uid);
  EXPECT_FALSE(p.limits->devices.empty());  // at least what every process needs
}

TEST_F(LaunchPlanTest, WhatMustNotRunIsRefusedSayingWhy) {
  JobSpec image;
  image.command = {"x"};
  image.image = "busybox";
  LaunchPlan p = PlanLaunch(setup_, Job(1, image), On({0}), 100);
  EXPECT_EQ(p.refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.refused.message(), "this server cannot run containers: podman: not found");
  if (geteuid() == 0) {  // what a server that runs as root decides
    JobSpec spec;
    spec.command = {"x"};
    QueuedJob root = Job(2, spec);
    root.uid = 0;
    p = PlanLaunch(setup_, root, On({0}), 100);
    EXPECT_EQ(p.refused.code(), absl::StatusCode::kPermissionDenied);
    QueuedJob gone = Job(3, spec);
    gone.uid = 3999999;  // no such account
    p = PlanLaunch(setup_, gone, On({0}), 100);
    EXPECT_EQ(p.refused.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(p.refused.message().find("the account of uid 3999999 cannot be looked up"),
              std::string::npos)
        << p.refused;
  }
}

}  // namespace
}  // namespace tessera::server
