// The device plugin's logic without gRPC: advertised devices, topology-aware preferred
// allocations, Allocate's answers and refusals, the checkpoint, releasing ended pods, metrics.
#include "tessera/agent/device_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "../../../tests/capture.h"
#include "tessera/agent/metrics.h"
#include "tessera/devices/inventory.h"

namespace tessera::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class DeviceStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "agent-state-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    shim_ = dir_ + "/libtessera-cuda.so";
    std::ofstream(shim_) << "not really a library";
    // 8x L40S, two per PCIe switch, four per NUMA node.
    auto m = devices::LoadSimulatedMachine("pcie-l40s-2socket");
    ASSERT_TRUE(m.ok()) << m.status();
    inventory_ = m->inventory;
    state_ = Make();
  }
  std::unique_ptr<DeviceState> Make(const core::Clock* clock = nullptr) {
    PluginOptions o;
    o.clock = clock;
    o.shares_per_gpu = 4;
    o.state_dir = dir_ + "/state";
    o.shim_library = shim_;
    auto s = DeviceState::Create(inventory_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string Uuid(int g) const { return inventory_.gpus[g].uuid; }
  std::string Share(int g, int k) const { return Uuid(g) + "::" + std::to_string(k); }
  static v1beta1::AllocateRequest Request(std::vector<std::vector<std::string>> containers) {
    v1beta1::AllocateRequest r;
    for (const auto& c : containers) {
      auto* cr = r.add_container_requests();
      for (const auto& id : c) cr->add_devices_ids(id);
    }
    return r;
  }
  std::vector<std::string> Preferred(Resource r, std::vector<std::string> avail,
                                     std::vector<std::string> must, int size,
                                     const PodHint* hint = nullptr) {
    v1beta1::PreferredAllocationRequest req;
    auto* c = req.add_container_requests();
    for (auto& id : avail) c->add_available_deviceids(id);
    for (auto& id : must) c->add_must_include_deviceids(id);
    c->set_allocation_size(size);
    auto resp = state_->Preferred(r, req, hint);
    EXPECT_TRUE(resp.ok()) << resp.status();
    if (!resp.ok()) return {};
    auto ids = resp->container_responses(0).deviceids();
    std::vector<std::string> out(ids.begin(), ids.end());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> Uuids(std::vector<int> gpus) const {
    std::vector<std::string> out;
    for (int g : gpus) out.push_back(Uuid(g));
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> AllGpus() const { return Uuids({0, 1, 2, 3, 4, 5, 6, 7}); }

  std::string dir_, shim_;
  core::NodeInventory inventory_;
  std::unique_ptr<DeviceState> state_;
};

TEST_F(DeviceStateTest, AdvertisesEveryGpuByUuidAndItsSharesWithNumaNodes) {
  auto gpus = state_->List(Resource::kGpu);
  ASSERT_EQ(gpus.devices_size(), 8);
  EXPECT_EQ(gpus.devices(0).id(), Uuid(0));
  EXPECT_EQ(gpus.devices(0).health(), "Healthy");
  EXPECT_EQ(gpus.devices(5).topology().nodes(0).id(), 1);
  auto shares = state_->List(Resource::kShare);
  ASSERT_EQ(shares.devices_size(), 32);
  EXPECT_EQ(shares.devices(5).id(), Share(1, 1));
  for (const auto& d : shares.devices()) EXPECT_LE(d.id().size(), 63u) << d.id();
  Resource kind;
  EXPECT_EQ(state_->GpuOf(Share(6, 3), &kind), 6);
  EXPECT_EQ(kind, Resource::kShare);
  EXPECT_FALSE(state_->GpuOf(Share(6, 4)).has_value());  // only 4 shares per GPU
  EXPECT_FALSE(state_->GpuOf(Uuid(6) + "::03").has_value());
}

TEST_F(DeviceStateTest, HealthChangeIsSeenByWatchersAndListedUnhealthy) {
  uint64_t g0 = state_->generation();
  EXPECT_TRUE(state_->SetHealth(3, false, "XID 79"));
  EXPECT_FALSE(state_->SetHealth(3, false, "XID 79"));  // no change, no new generation
  EXPECT_NE(state_->WaitForChange(g0, std::chrono::milliseconds(0)), g0);
  EXPECT_EQ(state_->List(Resource::kGpu).devices(3).health(), "Unhealthy");
  EXPECT_EQ(state_->List(Resource::kShare).devices(12).health(), "Unhealthy");
  EXPECT_TRUE(state_->SetHealth(3, true, ""));
  EXPECT_EQ(state_->List(Resource::kGpu).devices(3).health(), "Healthy");
}

TEST_F(DeviceStateTest, PreferredAllocationKeepsPcieSwitchPairsAndNumaNodesTogether) {
  // Two GPUs: a pair under one switch.
  auto two = Preferred(Resource::kGpu, AllGpus(), {}, 2);
  ASSERT_EQ(two.size(), 2u);
  int a = *state_->GpuOf(two[0]), b = *state_->GpuOf(two[1]);
  EXPECT_EQ(std::min(a, b) % 2, 0);
  EXPECT_EQ(std::abs(a - b), 1);
  // GPU 4 required: its switch partner.
  EXPECT_EQ(Preferred(Resource::kGpu, AllGpus(), {Uuid(4)}, 2), Uuids({4, 5}));
  // 0, 2, 3, 5 free: the intact pair 2-3, not 0 and 2 (different switches).
  EXPECT_EQ(Preferred(Resource::kGpu, Uuids({0, 2, 3, 5}), {}, 2), Uuids({2, 3}));
  // Four: one socket's four.
  auto four = Preferred(Resource::kGpu, AllGpus(), {}, 4);
  std::set<int> numa;
  for (const auto& id : four) numa.insert(*inventory_.gpus[*state_->GpuOf(id)].numa_node);
  EXPECT_EQ(numa.size(), 1u);
}

TEST_F(DeviceStateTest, PreferredSharesPackOntoTheFullestGpuThatHoldsThem) {
  // GPU 0 has shares 2 and 3 left, GPU 1 all four.
  std::vector<std::string> avail = {Share(0, 2), Share(0, 3), Share(1, 0),
                                    Share(1, 1), Share(1, 2), Share(1, 3)};
  EXPECT_EQ(Preferred(Resource::kShare, avail, {}, 2),
            (std::vector<std::string>{Share(0, 2), Share(0, 3)}));
  // Three do not fit on GPU 0: GPU 1 alone.
  auto three = Preferred(Resource::kShare, avail, {}, 3);
  for (const auto& id : three) EXPECT_EQ(*state_->GpuOf(id), 1) << id;
}

TEST_F(DeviceStateTest, PreferredRefusesIdsItDoesNotAdvertise) {
  v1beta1::PreferredAllocationRequest req;
  auto* c = req.add_container_requests();
  c->add_available_deviceids("GPU-nope");
  c->set_allocation_size(1);
  auto r = state_->Preferred(Resource::kGpu, req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("GPU-nope"));
}

TEST_F(DeviceStateTest, WholeGpusGetCdiNamesAndVisibleDevicesByUuid) {
  auto r = state_->Allocate(Resource::kGpu, Request({{Uuid(1), Uuid(0)}, {Uuid(6)}}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->container_responses_size(), 2);
  const auto& c0 = r->container_responses(0);
  EXPECT_EQ(c0.envs().at("NVIDIA_VISIBLE_DEVICES"), Uuid(0) + "," + Uuid(1));
  EXPECT_EQ(c0.envs().at("CUDA_VISIBLE_DEVICES"), Uuid(0) + "," + Uuid(1));
  ASSERT_EQ(c0.cdi_devices_size(), 2);
  EXPECT_EQ(c0.cdi_devices(0).name(), "tessera.io/gpu=" + Uuid(0));
  EXPECT_FALSE(c0.envs().contains("LD_PRELOAD"));
  EXPECT_EQ(r->container_responses(1).cdi_devices(0).name(), "tessera.io/gpu=" + Uuid(6));
  EXPECT_EQ(state_->Allocations().size(), 2u);
  // Checkpointed, owner-only.
  struct stat st;
  ASSERT_EQ(stat(state_->checkpoint_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
}

TEST_F(DeviceStateTest, SharesGetTheInterceptLibraryTheirLimitsAndARegion) {
  auto r = state_->Allocate(Resource::kShare, Request({{Share(2, 0), Share(2, 1)}}));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& c = r->container_responses(0);
  const auto& env = c.envs();
  EXPECT_EQ(env.at("LD_PRELOAD"), kContainerShim);
  uint64_t half = *inventory_.gpus[2].memory_bytes / 4 * 2;
  EXPECT_EQ(env.at("TESSERA_CUDA_MEM_LIMIT"), "0:" + std::to_string(half));
  EXPECT_EQ(env.at("TESSERA_CUDA_COMPUTE_SHARE"), "50%");
  EXPECT_EQ(env.at("TESSERA_CUDA_PRIORITY"), "0");
  EXPECT_EQ(env.at("TESSERA_CUDA_REGION"), kContainerRegion);
  // A pod's pids are not NVML's: its contexts are counted by the model's measured figure.
  EXPECT_EQ(env.at("TESSERA_CUDA_CONTEXT_OVERHEAD"),
            std::to_string(core::DefaultContextOverhead(inventory_.gpus[2].model)));
  EXPECT_EQ(env.at("NVIDIA_VISIBLE_DEVICES"), Uuid(2));
  std::map<std::string, std::pair<std::string, bool>> mounts;
  for (const auto& m : c.mounts()) mounts[m.container_path()] = {m.host_path(), m.read_only()};
  EXPECT_EQ(mounts.at(kContainerShim), std::make_pair(shim_, true));
  std::string region = mounts.at(kContainerRegion).first;
  EXPECT_FALSE(mounts.at(kContainerRegion).second);
  std::vector<uint64_t> used, limit;
  ASSERT_TRUE(ReadRegion(region, &used, &limit));
  EXPECT_THAT(limit, ElementsAre(half));
  EXPECT_THAT(used, ElementsAre(0u));
}

TEST_F(DeviceStateTest, SharesOnTwoGpusGetALimitOnEachAndOneGangAtTheArbiter) {
  // Without the extender the kubelet may take a container's share devices from two GPUs: the
  // container sees both, with a limit on each (in the order it sees them), and its slices on the
  // two are one gang at the arbiter (both in TESSERA_CUDA_ARBITER_GPUS).
  fs::create_directories(dir_ + "/state");
  std::ofstream(dir_ + "/state/gpu.arbiter") << "";
  auto r = state_->Allocate(Resource::kShare, Request({{Share(5, 0), Share(3, 1)}}));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& env = r->container_responses(0).envs();
  const uint64_t quarter = *inventory_.gpus[3].memory_bytes / 4;
  EXPECT_EQ(env.at("TESSERA_CUDA_MEM_LIMIT"),
            "0:" + std::to_string(quarter) + ",1:" + std::to_string(quarter));
  EXPECT_EQ(env.at("TESSERA_CUDA_COMPUTE_SHARE"), "25%") << "a quarter of each";
  const std::string visible = env.at("NVIDIA_VISIBLE_DEVICES");
  const std::string gpus = env.at("TESSERA_CUDA_ARBITER_GPUS");
  EXPECT_TRUE((visible == Uuid(3) + "," + Uuid(5) && gpus == "3,5") ||
              (visible == Uuid(5) + "," + Uuid(3) && gpus == "5,3"))
      << visible << " / " << gpus;
  std::string region;
  for (const auto& m : r->container_responses(0).mounts())
    if (m.container_path() == kContainerRegion) region = m.host_path();
  std::vector<uint64_t> used, limit;
  ASSERT_TRUE(ReadRegion(region, &used, &limit));
  EXPECT_THAT(limit, ElementsAre(quarter, quarter));
}

TEST_F(DeviceStateTest, AShareOfAnMpsGpuIsAClientOfItsDaemonWithItsLimitsAndNoTimeSlices) {
  // GPU 2 in MPS mode (the agent's --mps-gpus); the arbiter exists, for the time-sliced GPUs.
  fs::create_directories(dir_ + "/state");
  std::ofstream(dir_ + "/state/gpu.arbiter") << "";
  devices::MpsDaemons mps("nvidia-cuda-mps-control", dir_ + "/state/mps", {{2, Uuid(2)}});
  PluginOptions o = state_->options();
  o.mps = &mps;
  o.mps_shm_dir = dir_ + "/mps-shm";
  state_.reset();
  auto made = DeviceState::Create(inventory_, o);
  ASSERT_TRUE(made.ok()) << made.status();
  state_ = std::move(*made);
  PodHint hint;
  hint.pod_namespace = "serving";
  hint.pod_name = "small";
  hint.gpus = {Uuid(2)};
  hint.memory = uint64_t{3} << 30;
  hint.priority = -1;
  auto r = state_->Allocate(Resource::kShare, Request({{Share(2, 0)}}), &hint);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& c = r->container_responses(0);
  const auto& env = c.envs();
  EXPECT_EQ(env.at("CUDA_MPS_PIPE_DIRECTORY"), kContainerMpsPipe);
  EXPECT_EQ(env.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25") << "a quarter of the GPU's SMs";
  EXPECT_EQ(env.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=3072M") << "the pod's memory";
  EXPECT_EQ(env.at("CUDA_MPS_CLIENT_PRIORITY"), "1") << "a negative priority: below normal";
  // The library's memory accounting stays on; its kernels are not paced in time slices.
  EXPECT_EQ(env.at("LD_PRELOAD"), kContainerShim);
  EXPECT_EQ(env.at("TESSERA_CUDA_MEM_LIMIT"), "0:" + std::to_string(uint64_t{3} << 30));
  EXPECT_FALSE(env.contains("TESSERA_CUDA_ARBITER"));
  std::map<std::string, std::pair<std::string, bool>> mounts;
  for (const auto& m : c.mounts()) mounts[m.container_path()] = {m.host_path(), m.read_only()};
  EXPECT_EQ(mounts.at(kContainerMpsPipe), std::make_pair(mps.PipeDir(2), false));
  EXPECT_EQ(mounts.at("/dev/shm"), std::make_pair(dir_ + "/mps-shm", false));
  EXPECT_FALSE(mounts.contains(kContainerArbiter));

  // A time-sliced GPU's share is paced as before; a share of two GPUs one of which is MPS's is
  // refused (a process is the client of one MPS server), and nothing is kept of it.
  auto sliced = state_->Allocate(Resource::kShare, Request({{Share(3, 0)}}));
  ASSERT_TRUE(sliced.ok()) << sliced.status();
  EXPECT_FALSE(sliced->container_responses(0).envs().contains("CUDA_MPS_PIPE_DIRECTORY"));
  EXPECT_TRUE(sliced->container_responses(0).envs().contains("TESSERA_CUDA_ARBITER"));
  const size_t before = state_->Allocations().size();
  auto both = state_->Allocate(Resource::kShare, Request({{Share(2, 1), Share(4, 0)}}));
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(both.status().message(), HasSubstr("MPS"));
  EXPECT_EQ(state_->Allocations().size(), before);
}

TEST_F(DeviceStateTest, BadAllocateRequestsAreRefusedAndChangeNothing) {
  ASSERT_TRUE(state_->Allocate(Resource::kGpu, Request({{Uuid(0)}})).ok());
  std::string checkpoint = test::ReadFile(state_->checkpoint_path());
  ASSERT_TRUE(state_->SetHealth(5, false, "XID 48"));
  struct Case {
    Resource r;
    std::vector<std::vector<std::string>> ids;
    absl::StatusCode code;
    std::string says;
  } cases[] = {
      {Resource::kGpu, {{"GPU-unknown"}}, absl::StatusCode::kInvalidArgument, "GPU-unknown"},
      {Resource::kGpu, {{Uuid(1), Uuid(1)}}, absl::StatusCode::kInvalidArgument, "twice"},
      {Resource::kGpu, {{Uuid(1)}, {Uuid(1)}}, absl::StatusCode::kInvalidArgument, "two contain"},
      {Resource::kGpu, {{Share(1, 0)}}, absl::StatusCode::kInvalidArgument, "gpu-share device"},
      {Resource::kGpu, {{}}, absl::StatusCode::kInvalidArgument, "no device IDs"},
      {Resource::kGpu, {}, absl::StatusCode::kInvalidArgument, "no container requests"},
      {Resource::kGpu, {{Uuid(5)}}, absl::StatusCode::kUnavailable, "unhealthy"},
      {Resource::kShare, {{Share(5, 0)}}, absl::StatusCode::kUnavailable, "unhealthy"},
      {Resource::kShare, {{Share(0, 1)}}, absl::StatusCode::kFailedPrecondition, "whole GPU"},
      // A good container and a bad one: neither is allocated.
      {Resource::kGpu, {{Uuid(2)}, {"GPU-bad"}}, absl::StatusCode::kInvalidArgument, "GPU-bad"},
  };
  std::vector<std::string> too_many;
  for (int g = 0; g < 8; ++g) too_many.push_back(Uuid(g));
  too_many.push_back("GPU-ninth");
  auto r = state_->Allocate(Resource::kGpu, Request({too_many}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("9 tessera.io/gpu devices asked, this node has 8"));
  for (const Case& c : cases) {
    auto r = state_->Allocate(c.r, Request(c.ids));
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.says));
  }
  EXPECT_EQ(state_->Allocations().size(), 1u);
  EXPECT_EQ(test::ReadFile(state_->checkpoint_path()), checkpoint);
  EXPECT_EQ(fs::directory_iterator(dir_ + "/state/regions"), fs::directory_iterator());
}

TEST_F(DeviceStateTest, AnAllocationsAgeIsTheClocksAndTheReleaseGraceCountsOnIt) {
  core::FakeClock clock(core::TimePoint(std::chrono::seconds(1'800'000'000)));
  state_.reset();
  state_ = Make(&clock);
  ASSERT_TRUE(state_);
  ASSERT_TRUE(state_->Allocate(Resource::kGpu, Request({{Uuid(0)}})).ok());
  ASSERT_EQ(state_->Allocations().size(), 1u);
  EXPECT_EQ(state_->Allocations()[0].created_unix, 1'800'000'000);
  // Not listed by the kubelet: kept while younger than the grace, released after.
  EXPECT_EQ(state_->Release({}, 1'800'000'000 - 60), 0);
  clock.Advance(std::chrono::seconds(61));
  EXPECT_EQ(state_->Release({}, static_cast<int64_t>(core::Seconds(clock.Now())) - 60), 1);
}

TEST_F(DeviceStateTest, AGpuInUseWholeIsNotOfferedInSharesUntilItsPodEnds) {
  ASSERT_TRUE(state_->Allocate(Resource::kGpu, Request({{Uuid(0)}})).ok());
  auto shares = state_->List(Resource::kShare);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(shares.devices(k).health(), "Unhealthy");
  EXPECT_EQ(shares.devices(4).health(), "Healthy");
  // The pod still runs: nothing released.
  EXPECT_EQ(state_->Release({Uuid(0)}, INT64_MAX), 0);
  // Young allocations are kept even when the kubelet does not list them yet.
  EXPECT_EQ(state_->Release({}, 0), 0);
  EXPECT_EQ(state_->Release({}, INT64_MAX), 1);
  EXPECT_EQ(state_->List(Resource::kShare).devices(0).health(), "Healthy");
  EXPECT_TRUE(state_->Allocate(Resource::kShare, Request({{Share(0, 1)}})).ok());
  EXPECT_EQ(state_->List(Resource::kGpu).devices(0).health(), "Unhealthy");
}

TEST_F(DeviceStateTest, CheckpointKeepsAllocationsAndRegionsAcrossARestart) {
  auto first = state_->Allocate(Resource::kShare, Request({{Share(3, 0)}}));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(state_->Allocate(Resource::kGpu, Request({{Uuid(7)}})).ok());
  auto before = state_->Allocations();
  state_.reset();
  state_ = Make();
  ASSERT_NE(state_, nullptr);
  auto after = state_->Allocations();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].id, before[i].id);
    EXPECT_EQ(after[i].device_ids, before[i].device_ids);
    EXPECT_EQ(after[i].region, before[i].region);
  }
  // Still excluded from the other resource after the restart.
  EXPECT_EQ(state_->List(Resource::kShare).devices(28).health(), "Unhealthy");
  // The kubelet asking again for the same IDs gets the same allocation and region.
  auto again = state_->Allocate(Resource::kShare, Request({{Share(3, 0)}}));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->container_responses(0).annotations().at("tessera.io/allocation"),
            first->container_responses(0).annotations().at("tessera.io/allocation"));
  EXPECT_EQ(state_->Allocations().size(), 2u);
  // New IDs get a new number, never one in use.
  auto next = state_->Allocate(Resource::kGpu, Request({{Uuid(6)}}));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->container_responses(0).annotations().at("tessera.io/allocation"), "a3");
}

TEST_F(DeviceStateTest, ACorruptCheckpointIsSetAsideAndTheStateStartsEmpty) {
  ASSERT_TRUE(state_->Allocate(Resource::kGpu, Request({{Uuid(0)}})).ok());
  state_.reset();
  // Truncated, garbled, another version, a record it cannot use (an unknown resource; an arbiter
  // job that is no text): set aside, never a crash loop.
  const std::string wrong_job =
      "{\"version\": 1, \"next_id\": 2, \"allocations\": [{\"id\": \"a1\", \"resource\": "
      "\"tessera.io/gpu\", \"device_ids\": [\"" +
      Uuid(0) + "\"], \"gpus\": [\"" + Uuid(0) +
      "\"], \"region\": \"\", \"pod\": \"\", \"created_unix\": 1, \"arbiter_job\": 5}]}";
  for (const std::string& bad :
       {std::string("{\"version\": 1, \"allocations\": ["), std::string("not json at all"),
        std::string("{\"version\": 9}"),
        std::string("{\"version\": 1, \"next_id\": 2, \"allocations\": [{\"id\": \"a\", "
                    "\"resource\": \"x\"}]}"),
        wrong_job}) {
    std::ofstream(dir_ + "/state/checkpoint.json") << bad;
    PluginOptions o;
    o.state_dir = dir_ + "/state";
    auto s = DeviceState::Create(inventory_, o);
    ASSERT_TRUE(s.ok()) << bad << ": " << s.status();
    EXPECT_THAT((*s)->set_aside(), HasSubstr("checkpoint.json.corrupt-")) << bad;
    EXPECT_TRUE((*s)->Allocations().empty());
    std::ifstream in((*s)->set_aside());
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), bad);
    fs::remove((*s)->set_aside());
  }
}

TEST_F(DeviceStateTest, TheExtendersChoiceIsPreferredAndEnforced) {
  PodHint hint{"team-a", "train-0", {Uuid(2), Uuid(6)}, std::nullopt, std::nullopt};
  EXPECT_EQ(Preferred(Resource::kGpu, AllGpus(), {}, 2, &hint), Uuids({2, 6}));
  auto bad = state_->Allocate(Resource::kGpu, Request({{Uuid(2), Uuid(3)}}), &hint);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("team-a/train-0"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("the scheduler chose"));
  PodHint elsewhere{"team-a", "train-1", {"GPU-on-another-node"}, std::nullopt, std::nullopt};
  auto other = state_->Allocate(Resource::kGpu, Request({{Uuid(1)}}), &elsewhere);
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("not on this node"));
  EXPECT_TRUE(state_->Allocations().empty());
  auto ok = state_->Allocate(Resource::kGpu, Request({{Uuid(6), Uuid(2)}}), &hint);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(state_->Allocations()[0].pod, "team-a/train-0");
  // A share with the extender's memory and priority.
  PodHint share{"team-b", "nb", {Uuid(4)}, uint64_t{5} << 30, 7};
  auto s = state_->Allocate(Resource::kShare, Request({{Share(4, 0)}}), &share);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->container_responses(0).envs().at("TESSERA_CUDA_MEM_LIMIT"),
            "0:" + std::to_string(uint64_t{5} << 30));
  EXPECT_EQ(s->container_responses(0).envs().at("TESSERA_CUDA_PRIORITY"), "7");
}

// The pods of one gang with shares on this node: one job at the arbiter (one TESSERA_JOB_ID) whose
// slices on all the gang's GPUs here are granted together (TESSERA_CUDA_GANG_GPUS).
TEST_F(DeviceStateTest, AGangsSharesOnThisNodeAreOneJobAtTheArbiter) {
  PodHint w0{"ml", "w0", {Uuid(4)}, uint64_t{5} << 30, 0, "u0", 0, "ml/job", {Uuid(5), Uuid(4)}};
  PodHint w1{"ml", "w1", {Uuid(5)}, uint64_t{5} << 30, 0, "u1", 0, "ml/job", {Uuid(5), Uuid(4)}};
  auto a0 = state_->Allocate(Resource::kShare, Request({{Share(4, 0)}}), &w0);
  auto a1 = state_->Allocate(Resource::kShare, Request({{Share(5, 0)}}), &w1);
  ASSERT_TRUE(a0.ok() && a1.ok()) << a0.status() << a1.status();
  for (const auto* r : {&*a0, &*a1}) {
    const auto& env = r->container_responses(0).envs();
    EXPECT_EQ(env.at("TESSERA_JOB_ID"), "gang:ml/job");
    EXPECT_EQ(env.at("TESSERA_CUDA_GANG_GPUS"), "4,5");
  }
  // A gang that names a GPU of another node, or leaves out the pod's own: time-sliced alone.
  PodHint odd{"ml", "w2", {Uuid(6)}, std::nullopt, 0, "u2", 0, "ml/job2", {Uuid(4), Uuid(5)}};
  auto a2 = state_->Allocate(Resource::kShare, Request({{Share(6, 0)}}), &odd);
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_FALSE(a2->container_responses(0).envs().contains("TESSERA_CUDA_GANG_GPUS"));
  EXPECT_NE(a2->container_responses(0).envs().at("TESSERA_JOB_ID"), "gang:ml/job2");
  // A share in no gang keeps its own job.
  auto a3 = state_->Allocate(Resource::kShare, Request({{Share(7, 0)}}));
  ASSERT_TRUE(a3.ok());
  EXPECT_FALSE(a3->container_responses(0).envs().contains("TESSERA_CUDA_GANG_GPUS"));
  // Each allocation knows the job its time slices are charged to (its GPU time when it ends),
  // across a restart of the agent: the gang's, else its own (arbiter_job empty).
  for (int pass = 0; pass < 2; ++pass) {
    std::map<std::string, std::string> jobs;
    for (const Allocation& a : state_->Allocations()) jobs[a.gpus[0]] = a.arbiter_job;
    EXPECT_EQ(jobs.at(Uuid(4)), "gang:ml/job") << "pass " << pass;
    EXPECT_EQ(jobs.at(Uuid(5)), "gang:ml/job");
    EXPECT_EQ(jobs.at(Uuid(6)), "");
    EXPECT_EQ(jobs.at(Uuid(7)), "");
    state_.reset();
    state_ = Make();
    ASSERT_NE(state_, nullptr);
  }
}

TEST_F(DeviceStateTest, MetricsJoinPodsAndPassPromtool) {
  auto r = state_->Allocate(Resource::kShare, Request({{Share(1, 0)}}));
  ASSERT_TRUE(r.ok());
  std::vector<GpuSample> gpus(2);
  for (int i = 0; i < 2; ++i) {
    gpus[i].gpu = &inventory_.gpus[i];
    gpus[i].telemetry = devices::GpuTelemetry{
        0.5, 0.25, uint64_t{1} << 30, 41.0, 123.5, uint64_t{3} << 30, 1410.0, 1215.0, 0.125};
  }
  gpus[0].holders = {{"ns", "train", "main"}};
  gpus[1].telemetry->last_xid = 79;
  gpus[1].telemetry->energy_mj = 5000;
  gpus[1].telemetry->row_remap_pending = true;
  gpus[1].telemetry->nvlink_data_kib = 9000000007;
  gpus[1].health.healthy = false;
  gpus[1].health.xid_count = 2;
  ShareSample s;
  s.allocation = state_->Allocations()[0];
  s.holder = ContainerRef{"ns", "notebook \"x\"", "c"};
  ASSERT_TRUE(ReadRegion(s.allocation.region, &s.used, &s.limit));
  std::string text = RenderMetrics("node-1", gpus, {s}, AgentCountersSample{});
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"" + Uuid(0) +
                              "\",pci_bus_id=\"" + inventory_.gpus[0].pci_bus_id +
                              "\",device=\"nvidia0\",modelName=\"NVIDIA L40S\","
                              "Hostname=\"node-1\",container=\"main\",namespace=\"ns\","
                              "pod=\"train\"} 50"));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"0\""));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_SM_CLOCK{gpu=\"0\""));
  EXPECT_THAT(text, HasSubstr("\"} 1410\n")) << "the SM clock, in MHz";
  EXPECT_THAT(text, HasSubstr("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=\"1\""));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_FB_FREE{gpu=\"1\""));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_FB_USED{"));
  // dcgm-exporter's other fields where the driver gives them, typed as it declares them.
  EXPECT_THAT(text, HasSubstr("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_XID_ERRORS{gpu=\"1\""));
  EXPECT_THAT(text, HasSubstr("pod=\"\"} 79\n"));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_ROW_REMAP_PENDING{gpu=\"1\""));
  EXPECT_THAT(text, HasSubstr("# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter\n"));
  EXPECT_THAT(text, HasSubstr("pod=\"\"} 9000000007\n")) << "NVLink KiB, not in float notation";
  EXPECT_THAT(text, ::testing::Not(HasSubstr("DCGM_FI_DEV_XID_ERRORS{gpu=\"0\"")))
      << "no reading, no sample";
  EXPECT_THAT(text, ::testing::Not(HasSubstr("DCGM_FI_DEV_ENC_UTIL"))) << "nobody gave it";
  EXPECT_THAT(text, HasSubstr("pod=\"\"} 0\n"));  // GPU 1: nobody, unhealthy
  EXPECT_THAT(text, HasSubstr("pod=\"notebook \\\"x\\\"\"}"));
  EXPECT_THAT(text, HasSubstr("tessera_share_memory_limit_bytes{allocation=\"a1\""));
  // A GPU two pods share: once, with its first holder's labels, as dcgm-exporter by default
  // (NVIDIA's dashboard sums and counts per series: 990 W for 740 W when split); split per pod
  // with --kubernetes-virtual-gpus.
  gpus[0].holders.push_back({"ns", "infer", "srv"});
  auto series = [](const std::string& page, const std::string& prefix) {
    size_t n = 0;
    for (size_t at = page.find(prefix); at != std::string::npos; at = page.find(prefix, at + 1))
      ++n;
    return n;
  };
  const std::string shared = RenderMetrics("node-1", gpus, {s}, AgentCountersSample{});
  EXPECT_EQ(series(shared, "DCGM_FI_DEV_POWER_USAGE{gpu=\"0\""), 1u);
  EXPECT_EQ(series(shared, "DCGM_FI_DEV_POWER_USAGE{"), 2u) << "one per GPU";
  EXPECT_THAT(shared, ::testing::Not(HasSubstr("pod=\"infer\"")));
  EXPECT_EQ(series(shared, "tessera_gpu_healthy{gpu=\"0\""), 1u);
  const std::string split = RenderMetrics("node-1", gpus, {s}, AgentCountersSample{}, true);
  EXPECT_EQ(series(split, "DCGM_FI_DEV_POWER_USAGE{gpu=\"0\""), 2u);
  EXPECT_THAT(split, HasSubstr("pod=\"infer\"} 123.5"));
  // An MPS GPU's daemon: up or not, and its deaths.
  gpus[1].mps = devices::MpsDaemonState{.gpu = 1, .up = false, .deaths = 2};
  text = RenderMetrics("node-1", gpus, {s}, AgentCountersSample{});
  EXPECT_THAT(text, HasSubstr("tessera_gpu_mps_daemon_up{gpu=\"1\""));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("tessera_gpu_mps_daemon_up{gpu=\"0\"")))
      << "a time-sliced GPU has no daemon";
  EXPECT_EQ(series(text, "tessera_gpu_mps_daemon_deaths_total{"), 1u);
  std::string file = dir_ + "/metrics.txt";
  std::ofstream(file) << text;
  auto check = test::PromtoolCheck(file);
  EXPECT_EQ(check.code, 0) << check.out << "\n" << text;
}

}  // namespace
}  // namespace tessera::agent
