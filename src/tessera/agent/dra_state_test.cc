// The DRA driver's logic without gRPC or an API server: which claims' allocations it prepares and
// how, its checkpoint, and the ResourceSlices it publishes (split at the API's 128 devices,
// compared by value as the API server stores them).
#include "tessera/agent/dra_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "../../../tests/capture.h"
#include "fake_apiserver.h"
#include "tessera/agent/dra_slices.h"
#include "tessera/core/clock.h"
#include "tessera/devices/inventory.h"
#include "tessera/kube/quantity.h"

namespace tessera::agent {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class DraStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "dra-state-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/cdi");
    shim_ = dir_ + "/libtessera-cuda.so";
    std::ofstream(shim_) << "not really a library";
    auto m = devices::LoadSimulatedMachine("pcie-l40s-2socket");  // 8x L40S
    ASSERT_TRUE(m.ok()) << m.status();
    inventory_ = m->inventory;
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The node's options: GPUs `shares` published as `per_gpu` shares each, the rest whole.
  struct Options {
    PluginOptions plugin;
    DraOptions dra;
  };
  Options OptionsFor(std::set<int> shares = {7}, int per_gpu = 4) const {
    Options o;
    o.plugin.shares_per_gpu = per_gpu;
    o.plugin.state_dir = dir_ + "/state";
    o.plugin.shim_library = shim_;
    o.dra.pool = "node-a";
    o.dra.dir = dir_ + "/plugin";
    o.dra.cdi_dir = dir_ + "/cdi";
    o.dra.share_gpus = std::move(shares);
    return o;
  }
  absl::StatusOr<std::unique_ptr<DraState>> Make(std::set<int> shares = {7}, int per_gpu = 4) {
    const Options o = OptionsFor(std::move(shares), per_gpu);
    return DraState::Create(inventory_, o.plugin, o.dra);
  }
  static json Claim(const std::string& uid, json results, json config = json::array()) {
    return {
        {"metadata", {{"uid", uid}}},
        {"status", {{"allocation", {{"devices", {{"results", results}, {"config", config}}}}}}}};
  }
  static json Result(const std::string& request, const std::string& device,
                     const std::string& driver = kDraDriver) {
    return {{"request", request}, {"driver", driver}, {"pool", "node-a"}, {"device", device}};
  }

  std::string dir_, shim_;
  core::NodeInventory inventory_;
};

TEST_F(DraStateTest, OnlyItsOwnDriversResultsCountAndSubrequestsFoldIntoTheirRequest) {
  auto s = Make();
  ASSERT_TRUE(s.ok()) << s.status();
  auto got = (*s)->Prepare(
      "a", "c", "u1",
      Claim("u1", {Result("gpus/l40s", "gpu-2"), Result("nic", "eth0", "net.example.com"),
                   Result("gpus/l40s", "gpu-3")}));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].requests, std::vector<std::string>{"gpus"});
  EXPECT_EQ((*got)[1].device, "gpu-3");
  // A claim with no device of this driver: nothing to do, and no spec written.
  auto none =
      (*s)->Prepare("a", "n", "u2", Claim("u2", {Result("nic", "eth0", "net.example.com")}));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_FALSE(fs::exists((*s)->CdiSpecPath("u2")));
}

TEST_F(DraStateTest, AdminAccessSharesADeviceWithItsClaimAndGetsNoShareSetUp) {
  auto s = Make();
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->Prepare("a", "job", "u1", Claim("u1", {Result("g", "gpu-7-share-0")})).ok());
  json admin = Result("monitor", "gpu-7-share-0");
  admin["adminAccess"] = true;
  auto got = (*s)->Prepare("ops", "watch", "u2", Claim("u2", {admin}));
  ASSERT_TRUE(got.ok()) << got.status();
  json spec = json::parse(test::ReadFile((*s)->CdiSpecPath("u2")));
  EXPECT_THAT(spec["devices"][0]["containerEdits"]["env"].dump(),
              ::testing::Not(HasSubstr("LD_PRELOAD")));
  // The jobs the prepared shares are paced as (what keeps an upgrade's arbiter file): u1's share,
  // as its containers are told, and nothing of the admin's claim.
  std::string job;
  const json shared = json::parse(test::ReadFile((*s)->CdiSpecPath("u1")));
  for (const auto& e : shared["devices"][0]["containerEdits"]["env"]) {
    const std::string v = e.get<std::string>();
    if (v.rfind("TESSERA_JOB_ID=", 0) == 0) job = v.substr(15);
  }
  ASSERT_FALSE(job.empty()) << shared.dump();
  EXPECT_EQ((*s)->ArbiterJobs(), std::vector<std::string>{job});
  // Without adminAccess the same device is refused.
  auto refused = (*s)->Prepare("b", "other", "u3", Claim("u3", {Result("g", "gpu-7-share-0")}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(DraStateTest, TheClassConfigIsOverriddenByTheClaimsAndUnknownFieldsAreRefused) {
  auto s = Make();
  ASSERT_TRUE(s.ok());
  auto cfg = [](const char* source, json params, json requests = json::array()) {
    params["kind"] = "ShareConfig";
    return json{{"source", source},
                {"requests", requests},
                {"opaque", {{"driver", kDraDriver}, {"parameters", params}}}};
  };
  json config = {cfg("FromClass", {{"memory", "4Gi"}, {"priority", 1}}),
                 cfg("FromClaim", {{"memory", "2Gi"}}, {"s"})};
  auto got = (*s)->Prepare("a", "c", "u1", Claim("u1", {Result("s", "gpu-7-share-1")}, config));
  ASSERT_TRUE(got.ok()) << got.status();
  std::string env =
      json::parse(test::ReadFile((*s)->CdiSpecPath("u1")))["devices"][0]["containerEdits"]["env"]
          .dump();
  EXPECT_THAT(env, HasSubstr("TESSERA_CUDA_MEM_LIMIT=0:2147483648"));  // the claim's
  EXPECT_THAT(env, HasSubstr("TESSERA_CUDA_PRIORITY=1"));              // the class's
  EXPECT_THAT(env, HasSubstr("TESSERA_CUDA_COMPUTE_SHARE=25%"));
  auto bad = (*s)->Prepare(
      "a", "d", "u2",
      Claim("u2", {Result("s", "gpu-7-share-2")}, {cfg("FromClaim", {{"memroy", "1Gi"}})}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("unknown field 'memroy'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("status.allocation.devices.config[0]"));
}

TEST_F(DraStateTest, AnMpsGpusClaimsAreClientsOfItsDaemonOneNamespaceAtATime) {
  // GPU 7 in shares and in MPS mode; GPU 2 whole and time-sliced.
  devices::MpsDaemons mps("nvidia-cuda-mps-control", dir_ + "/state/mps", {{7, "GPU-7"}});
  Options o = OptionsFor({7});
  o.plugin.mps = &mps;
  o.plugin.mps_shm_dir = dir_ + "/shm";
  auto s = DraState::Create(inventory_, o.plugin, o.dra);
  ASSERT_TRUE(s.ok()) << s.status();
  // The devices say their GPU's mode, for a DeviceClass or a request to select on.
  std::map<std::string, std::string> mode;
  for (const json& sl : BuildResourceSlices(**s, {.generation = 1, .sysfs_root = ""})) {
    for (const json& d : sl["spec"]["devices"])
      mode[d["name"]] = d["attributes"]["sharing"]["string"];
  }
  EXPECT_EQ(mode.at("gpu-7-share-0"), "mps");
  EXPECT_EQ(mode.at("gpu-2"), "time-slice");

  auto cfg = [](json params) {
    params["kind"] = "ShareConfig";
    return json::array(
        {{{"source", "FromClaim"}, {"opaque", {{"driver", kDraDriver}, {"parameters", params}}}}});
  };
  auto env_of = [&](const std::string& uid) {
    return json::parse(test::ReadFile((*s)->CdiSpecPath(uid)))["devices"][0]["containerEdits"];
  };
  auto got = (*s)->Prepare(
      "serving", "a", "u1",
      Claim("u1", {Result("s", "gpu-7-share-0")}, cfg({{"sharing", "mps"}, {"memory", "2Gi"}})));
  ASSERT_TRUE(got.ok()) << got.status();
  json edits = env_of("u1");
  EXPECT_THAT(edits["env"].dump(), HasSubstr("CUDA_MPS_PIPE_DIRECTORY=/var/run/tessera/mps"));
  EXPECT_THAT(edits["env"].dump(), HasSubstr("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"));
  EXPECT_THAT(edits["env"].dump(), HasSubstr("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M"));
  EXPECT_THAT(edits["env"].dump(), ::testing::Not(HasSubstr("TESSERA_CUDA_ARBITER")));
  EXPECT_THAT(edits["mounts"].dump(), HasSubstr(mps.PipeDir(7)));
  EXPECT_THAT(edits["mounts"].dump(), HasSubstr(dir_ + "/shm"));
  // Another namespace's claim on the same GPU waits (the kubelet tries again): MPS serves one
  // user's clients at a time. The same namespace's is served beside the first.
  auto other = (*s)->Prepare("batch", "b", "u2", Claim("u2", {Result("s", "gpu-7-share-1")}));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("namespace serving"));
  EXPECT_FALSE(fs::exists((*s)->CdiSpecPath("u2")));
  ASSERT_TRUE(
      (*s)->Prepare("serving", "c", "u3", Claim("u3", {Result("s", "gpu-7-share-2")})).ok());
  ASSERT_TRUE((*s)->Unprepare("u1").ok());
  EXPECT_FALSE((*s)->Prepare("batch", "b", "u2", Claim("u2", {Result("s", "gpu-7-share-1")})).ok());
  ASSERT_TRUE((*s)->Unprepare("u3").ok());
  EXPECT_TRUE((*s)->Prepare("batch", "b", "u2", Claim("u2", {Result("s", "gpu-7-share-1")})).ok())
      << "once the other namespace's claims are gone";

  // A request asking a mode its GPU is not in, or a mode that does not exist, is refused.
  auto wrong =
      (*s)->Prepare("a", "w", "u4", Claim("u4", {Result("g", "gpu-2")}, cfg({{"sharing", "mps"}})));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("asks sharing mps and its GPU 2 is in time-slice"));
  auto bad = (*s)->Prepare("a", "x", "u5",
                           Claim("u5", {Result("g", "gpu-2")}, cfg({{"sharing", "spatial"}})));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("sharing: expected time-slice or mps"));
}

TEST_F(DraStateTest, AnUnhealthyGpuIsRefusedAndItsHealthIsAChange) {
  auto s = Make();
  ASSERT_TRUE(s.ok());
  const uint64_t g = (*s)->generation();
  EXPECT_TRUE((*s)->SetHealth(1, false, "XID 79"));
  EXPECT_FALSE((*s)->SetHealth(1, false, "XID 79"));
  EXPECT_GT((*s)->generation(), g);
  auto got = (*s)->Prepare("a", "c", "u1", Claim("u1", {Result("g", "gpu-1")}));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("XID 79"));
}

TEST_F(DraStateTest, ACorruptCheckpointIsSetAsideAndBadOptionsAreRefused) {
  fs::create_directories(dir_ + "/plugin");
  // Truncated (a full disk), garbled, another version, a record that does not read: each is moved
  // aside, kept for a person to look at, and the state starts empty - never a crash loop.
  const std::string path = dir_ + "/plugin/checkpoint.json";
  for (const std::string bad :
       {"{\"version\": 1, \"claims\": [", "\x01\x02garbage", "{\"version\": 7, \"claims\": {}}",
        "{\"version\": 1, \"claims\": {\"u\": {\"namespace\": 3}}}"}) {
    std::ofstream(path) << bad;
    auto s = Make();
    ASSERT_TRUE(s.ok()) << bad << ": " << s.status();
    const std::string aside = (*s)->set_aside();
    EXPECT_THAT(aside, HasSubstr(path + ".corrupt-")) << bad;
    EXPECT_FALSE(fs::exists(path)) << bad;
    std::ifstream in(aside);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), bad);
    EXPECT_TRUE((*s)->PreparedClaims().empty());
    fs::remove(aside);
  }
  EXPECT_EQ(Make({8}).status().code(), absl::StatusCode::kInvalidArgument);  // no GPU 8
  shim_.clear();
  EXPECT_THAT(Make({1}).status().message(), HasSubstr("need --shim-library"));
}

// An unprepared claim's share request says what its GPU time is weighed against: its GPUs (the
// arbiter's indices), its share, the key the arbiter charged it under and how long it was
// prepared - across a restart of the agent (the checkpoint keeps when, and the pods it was
// reserved for); a claim in the checkpoint of an earlier agent, which did not, is not timed.
TEST_F(DraStateTest, AnUnpreparedShareSaysWhatItsGpuTimeIsWeighedAgainst) {
  core::FakeClock clock;
  Options o = OptionsFor();
  o.plugin.clock = &clock;
  std::vector<std::tuple<std::string, std::vector<int>, double, std::string, double, bool>> told;
  std::vector<std::vector<std::string>> pods;
  std::vector<bool> auto_memory;
  auto make = [&] {
    auto s = DraState::Create(inventory_, o.plugin, o.dra);
    EXPECT_TRUE(s.ok()) << s.status();
    (*s)->OnUnprepare([&](const std::vector<DraState::ShareUse>& used) {
      for (const auto& u : used) {
        told.emplace_back(u.request, u.indices, u.share, u.arbiter_job, u.held_s, u.sliced);
        pods.push_back(u.pods);
        auto_memory.push_back(u.auto_memory);
      }
    });
    return std::move(*s);
  };
  auto s = make();
  json reserved = Claim("u1", {Result("s", "gpu-7-share-0"), Result("s", "gpu-7-share-1")});
  // Its consumers: pods only (a reservation for another kind of consumer is not a pod to tell).
  reserved["status"]["reservedFor"] = {
      {{"resource", "pods"}, {"name", "train-0"}, {"uid", "p0"}},
      {{"apiGroup", "example.com"}, {"resource", "pods"}, {"name", "other"}, {"uid", "x"}},
      {{"resource", "pods"}, {"name", "train-1"}, {"uid", "p1"}}};
  reserved["metadata"]["annotations"] = {{"tessera.io/gpu-memory", "auto"}};
  ASSERT_TRUE(s->Prepare("a", "c", "u1", reserved).ok());
  ASSERT_TRUE(s->Prepare("a", "d", "u2", Claim("u2", {Result("s", "gpu-7-share-2")})).ok());
  clock.Advance(std::chrono::seconds(90));
  s.reset();
  s = make();  // the agent restarted
  clock.Advance(std::chrono::seconds(30));
  ASSERT_TRUE(s->Unprepare("u1").ok());
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0], std::make_tuple(std::string("s"), std::vector<int>{7}, 0.5,
                                     std::string("claim-u1-s"), 120.0, true));
  EXPECT_EQ(pods[0], (std::vector<std::string>{"train-0", "train-1"}));
  EXPECT_TRUE(auto_memory[0]) << "its memory sized auto, kept across the restart";
  // u2 as an earlier agent's checkpoint has it: no time it was prepared.
  s.reset();
  const std::string path = dir_ + "/plugin/checkpoint.json";
  json checkpoint = json::parse(std::ifstream(path));
  ASSERT_TRUE(checkpoint["claims"]["u2"].contains("prepared_unix"));
  checkpoint["claims"]["u2"].erase("prepared_unix");
  checkpoint["claims"]["u2"].erase("region_shares");
  std::ofstream(path) << checkpoint.dump();
  s = make();
  ASSERT_TRUE(s->Unprepare("u2").ok());
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(std::get<4>(told[1]), -1) << "not timed";
  EXPECT_FALSE(std::get<5>(told[1])) << "its share not known";
  EXPECT_TRUE(pods[1].empty()) << "not reserved for any pod when prepared";
  EXPECT_FALSE(auto_memory[1]) << "not annotated auto";
}

TEST_F(DraStateTest, SlicesHoldAtMost128DevicesAndLeaveOutUnhealthyGpus) {
  auto s = Make({0, 1, 2}, 50);  // 150 shares + 5 whole GPUs
  ASSERT_TRUE(s.ok()) << s.status();
  auto slices = BuildResourceSlices(**s, {.node_uid = "n-uid", .generation = 3, .sysfs_root = ""});
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0]["spec"]["devices"].size(), 128u);
  EXPECT_EQ(slices[1]["spec"]["devices"].size(), 27u);
  std::set<std::string> names;
  for (const json& sl : slices) {
    EXPECT_EQ(sl["spec"]["pool"]["resourceSliceCount"], 2);
    EXPECT_EQ(sl["spec"]["pool"]["generation"], 3);
    EXPECT_EQ(sl["metadata"]["ownerReferences"][0]["kind"], "Node");
    for (const json& d : sl["spec"]["devices"]) EXPECT_TRUE(names.insert(d["name"]).second);
  }
  EXPECT_EQ(slices[0]["metadata"]["name"], "node-a-gpu.tessera.io-0");
  EXPECT_EQ(slices[1]["metadata"]["name"], "node-a-gpu.tessera.io-1");
  (*s)->SetHealth(0, false, "XID 48");
  (*s)->SetHealth(5, false, "XID 48");
  slices = BuildResourceSlices(**s, {.generation = 4, .sysfs_root = ""});
  ASSERT_EQ(slices.size(), 1u);  // 100 shares + 4 whole GPUs
  EXPECT_EQ(slices[0]["spec"]["devices"].size(), 104u);
  EXPECT_FALSE(slices[0]["metadata"].contains("ownerReferences"));
}

TEST_F(DraStateTest, PartitionableGpusArePublishedBothWaysWithCountersAndGivenOneWay) {
  Options o = OptionsFor({}, 10);
  o.dra.partitionable = true;
  auto s = DraState::Create(inventory_, o.plugin, o.dra);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->devices().size(), 88u);  // 8 GPUs, each whole and in 10 shares
  auto slices = BuildResourceSlices(**s, {.generation = 1, .sysfs_root = ""});
  // 88 devices consuming counters: 64 + 24; 8 counter sets in a slice of their own.
  ASSERT_EQ(slices.size(), 3u);
  EXPECT_EQ(slices[0]["spec"]["devices"].size(), 64u);
  EXPECT_EQ(slices[1]["spec"]["devices"].size(), 24u);
  EXPECT_FALSE(slices[2]["spec"].contains("devices"));
  ASSERT_EQ(slices[2]["spec"]["sharedCounters"].size(), 8u);
  const json& set = slices[2]["spec"]["sharedCounters"][0];
  EXPECT_EQ(set["name"], "gpu-0");
  EXPECT_EQ(set["counters"]["shares"]["value"], "10");
  EXPECT_EQ(set["counters"]["memory"]["value"], "46068Mi");  // an L40S's 46,068 MiB
  const json& whole = slices[0]["spec"]["devices"][0];
  EXPECT_EQ(whole["name"], "gpu-0");
  EXPECT_EQ(whole["consumesCounters"][0]["counterSet"], "gpu-0");
  EXPECT_EQ(whole["consumesCounters"][0]["counters"]["shares"]["value"], "10");
  const json& share = slices[0]["spec"]["devices"][1];
  EXPECT_EQ(share["name"], "gpu-0-share-0");
  EXPECT_EQ(share["consumesCounters"][0]["counters"]["shares"]["value"], "1");
  for (const json& sl : slices) EXPECT_EQ(sl["spec"]["pool"]["resourceSliceCount"], 3);
  // A GPU given whole is not given in shares beside it, nor the other way round.
  ASSERT_TRUE((*s)->Prepare("a", "w", "u1", Claim("u1", {Result("g", "gpu-0")})).ok());
  auto both = (*s)->Prepare("a", "s", "u2", Claim("u2", {Result("s", "gpu-0-share-3")}));
  EXPECT_EQ(both.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(both.status().message(), HasSubstr("which holds gpu-0 of the same GPU"));
  ASSERT_TRUE((*s)->Prepare("a", "s", "u3", Claim("u3", {Result("s", "gpu-1-share-3")})).ok());
  EXPECT_FALSE((*s)->Prepare("a", "w2", "u4", Claim("u4", {Result("g", "gpu-1")})).ok());
  o.dra.share_gpus = {1};
  EXPECT_THAT(DraState::Create(inventory_, o.plugin, o.dra).status().message(),
              HasSubstr("no --dra-share-gpus"));
}

TEST_F(DraStateTest, ConsumableGpusAreSharedByTheAmountsClaimsTakeWithinTheirCapacity) {
  Options o = OptionsFor({}, PluginOptions{}.shares_per_gpu);
  o.dra.consumable = true;
  auto s = DraState::Create(inventory_, o.plugin, o.dra);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->devices().size(), 8u);  // one per GPU, shared by amounts
  auto slices = BuildResourceSlices(**s, {.generation = 1, .sysfs_root = ""});
  const json& dev = slices[0]["spec"]["devices"][0];
  EXPECT_EQ(dev["allowMultipleAllocations"], true);
  EXPECT_EQ(dev["capacity"]["compute"]["value"], "100");
  EXPECT_EQ(dev["capacity"]["memory"]["requestPolicy"]["default"], "46068Mi");
  auto taking = [](const std::string& uid, const char* memory, const char* compute,
                   const std::string& share) {
    json r = Result("g", "gpu-0");
    r["consumedCapacity"] = {{"memory", memory}, {"compute", compute}};
    r["shareID"] = share;
    return Claim(uid, {r});
  };
  auto a = (*s)->Prepare("a", "x", "u1", taking("u1", "10Gi", "30", "s-1"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)[0].share_id, "s-1");
  std::string env =
      json::parse(test::ReadFile((*s)->CdiSpecPath("u1")))["devices"][0]["containerEdits"]["env"]
          .dump();
  EXPECT_THAT(env, HasSubstr("TESSERA_CUDA_MEM_LIMIT=0:10737418240"));
  EXPECT_THAT(env, HasSubstr("TESSERA_CUDA_COMPUTE_SHARE=30%"));
  ASSERT_TRUE((*s)->Prepare("a", "y", "u2", taking("u2", "20Gi", "60", "s-2")).ok());
  // 30% + 60% + 20% of its compute: over the GPU.
  auto over = (*s)->Prepare("a", "z", "u3", taking("u3", "1Gi", "20", "s-3"));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(over.status().message(), HasSubstr("110% of its compute"));
  // Kept across a restart: the amounts too.
  s->reset();
  auto again = DraState::Create(inventory_, o.plugin, o.dra);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->Prepared("u1")->at(0).share_id, "s-1");
  EXPECT_FALSE((*again)->Prepare("a", "z", "u3", taking("u3", "1Gi", "20", "s-3")).ok());
  // A claim naming no amount takes the whole GPU: no share set up.
  ASSERT_TRUE((*again)->Prepare("a", "w", "u4", Claim("u4", {Result("g", "gpu-1")})).ok());
  std::string whole = json::parse(test::ReadFile(
      (*again)->CdiSpecPath("u4")))["devices"][0]["containerEdits"]["env"]
                          .dump();
  EXPECT_THAT(whole, ::testing::Not(HasSubstr("LD_PRELOAD")));
}

TEST_F(DraStateTest, ThePublisherRepublishesOnADriverUpgradeAndLeavesItsSlicesOnStop) {
  fakes::FakeApiServer api;
  api.Put("/api/v1/nodes", {{"metadata", {{"name", "node-a"}}}});
  kube::ClusterConfig c;
  c.server = api.url();
  c.token = "test-token";
  auto client = kube::Client::Create(c);
  ASSERT_TRUE(client.ok());
  auto s = Make();
  ASSERT_TRUE(s.ok()) << s.status();
  std::atomic<int> upgraded{0};
  SlicePublisher pub(
      **client, **s,
      {.node_name = "node-a",
       .resync = std::chrono::milliseconds(20),
       .sysfs_root = "",
       .driver_version = [&]() -> std::string { return upgraded ? "580.95.05" : "550.54.15"; }});
  pub.Start();
  const std::string slices = kResourceSlices;
  auto driver = [&] {
    auto l = api.List(slices);
    return l.size() == 1
               ? l[0]["spec"]["devices"][0]["attributes"]["driverVersion"].value("version", "")
               : "";
  };
  ASSERT_TRUE(fakes::FakeApiServer::WaitFor([&] { return driver() == "550.54.15"; }));
  const int64_t gen = api.List(slices)[0]["spec"]["pool"]["generation"];
  upgraded = 1;
  ASSERT_TRUE(fakes::FakeApiServer::WaitFor([&] { return driver() == "580.95.5"; }));
  EXPECT_GT(api.List(slices)[0]["spec"]["pool"]["generation"].get<int64_t>(), gen);
  // Stopped (an upgrade, a drain): the slices stay, as upstream's plugin helper leaves them; the
  // kubelet removes them if the driver does not come back.
  pub.Stop();
  EXPECT_EQ(api.List(slices).size(), 1u);
}

TEST(DraSlices, ASliceIsTheSameWhenTheApiServerRewroteItsQuantities) {
  json a = {
      {"spec",
       {{"pool", {{"resourceSliceCount", 1}}},
        {"devices", {{{"name", "gpu-0"}, {"capacity", {{"memory", {{"value", "1024Mi"}}}}}}}}}}};
  json b = a;
  b["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Gi";
  EXPECT_TRUE(SameDevices(a, b));
  b["spec"]["devices"][0]["capacity"]["memory"]["value"] = "2Gi";
  EXPECT_FALSE(SameDevices(a, b));
  EXPECT_EQ(kube::FormatBinaryQuantity(uint64_t{1} << 30), "1Gi");
  EXPECT_EQ(kube::FormatBinaryQuantity(1536ull << 20), "1536Mi");
  EXPECT_EQ(kube::FormatBinaryQuantity(1000), "1000");
}

TEST(DraSlices, VersionsBecomeSemanticVersions) {
  EXPECT_EQ(SemanticVersion("550.54.15"), "550.54.15");
  EXPECT_EQ(SemanticVersion("535.104.05"), "535.104.5");
  EXPECT_EQ(SemanticVersion("12.4"), "12.4.0");
  EXPECT_EQ(SemanticVersion("580"), "580.0.0");
  EXPECT_EQ(SemanticVersion(""), "");
  EXPECT_EQ(SemanticVersion("12.4.1.2"), "");
  EXPECT_EQ(SemanticVersion("12.x"), "");
}

}  // namespace
}  // namespace tessera::agent
