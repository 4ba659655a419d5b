// The real `tessera agent --dra` binary as its own process, with the fake libnvidia-ml.so.1 below
// and, above, the kubelet's side of DRA (fake_dra_kubelet: plugin watcher, registration, the dra v1
// and dra-health v1 services over real gRPC on unix sockets) and a fake API server holding the
// ResourceClaims kube-scheduler allocated: registration, claims prepared with CDI IDs, the same
// answer after an agent restart (from the checkpoint, with the claim gone from the API server),
// bad claims, a share's limits inside a process run as the claim's CDI spec says, ResourceSlices
// published (valid resource.k8s.io/v1), updated on an XID, republished when deleted, left on
// stop. Day two (issue 49): a reboot (the CDI folder emptied), a kubelet restart (slices wiped, the
// health stream in the version that kubelet calls), a truncated checkpoint, a hung API server.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "../capture.h"
#include "../cdi_edits.h"
#include "agent_scenario.h"
#include "fake_apiserver.h"
#include "fake_dra_kubelet.h"
#include "fmt/format.h"
#include "tessera/kube/client.h"
#include "tessera/kube/gpu_annotations.h"
#include "tessera/shim/arbiter.h"
#include "yaml-cpp/yaml.h"
#include "yaml_object.h"

extern char** environ;

namespace {

using nlohmann::json;
using tessera::fakes::FakeApiServer;
using tessera::test::FakeDraKubelet;
using ::testing::HasSubstr;
namespace fs = std::filesystem;
namespace dra = tessera::test::dra;

constexpr char kFakeNvml[] = TESSERA_TEST_FAKES_DIR "/nvml-full/libnvidia-ml.so.1";
constexpr char kDriver[] = "gpu.tessera.io";
constexpr char kClaims[] = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims";
constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices";

using tessera::test::Uuid;

// A claim as kube-scheduler leaves it: allocated devices of `pool`, by request.
json Claim(const std::string& name, const std::vector<std::pair<std::string, std::string>>& results,
           const std::string& pool = "node-a", json config = json::array()) {
  json r = json::array();
  for (const auto& [request, device] : results) {
    r.push_back({{"request", request}, {"driver", kDriver}, {"pool", pool}, {"device", device}});
  }
  json c = {{"apiVersion", "resource.k8s.io/v1"},
            {"kind", "ResourceClaim"},
            {"metadata", {{"name", name}, {"namespace", "team-a"}}},
            {"spec", {{"devices", {{"requests", json::array()}}}}}};
  if (!results.empty()) {
    c["status"]["allocation"]["devices"] = {{"results", r}, {"config", config}};
  }
  return c;
}

class AgentDraE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    static int n = 0;
    dir_ = ::testing::TempDir() + "dra" + std::to_string(++n);
    fs::remove_all(dir_);
    for (const char* sub : {"/kubelet", "/state", "/cdi"}) fs::create_directories(dir_ + sub);
    json scenario = tessera::test::FourA100s("535.104.05", xid_);
    std::ofstream(dir_ + "/scenario.json") << scenario.dump();
    node_ = api_.Put("/api/v1/nodes", {{"metadata", {{"name", "node-a"}}}});
    // sysfs as a host has it: GPU 0 (bus 10) behind a bridge of root complex pci0000:0f.
    const std::string dev = dir_ + "/sys/devices/pci0000:0f/0000:0f:01.0/0000:10:00.0";
    fs::create_directories(dev);
    fs::create_directories(dir_ + "/sys/bus/pci/devices");
    fs::create_symlink("../../../devices/pci0000:0f/0000:0f:01.0/0000:10:00.0",
                       dir_ + "/sys/bus/pci/devices/0000:10:00.0");
  }
  void TearDown() override { StopAgent(); }

  void StartAgent() {
    std::string cmd =
        std::string(
            "unset KUBECONFIG KUBERNETES_SERVICE_HOST TESSERA_NVML_LIBRARY; FAKE_NVML_SCENARIO=") +
        dir_ + "/scenario.json exec setpriv --pdeathsig TERM " + TESSERA_BINARY +
        " agent --dra --nvml-library " + kFakeNvml + " --node-name node-a --kubelet-dir " + dir_ +
        "/kubelet --state-dir " + dir_ + "/state --cdi-dir " + dir_ +
        "/cdi --metrics-address '' --shares-per-gpu 4 " + dra_flags_ +
        " --health-recovery 0.5 "
        "--health-probe 0.1 --label-resync " +
        resync_ + " --pod-resources-socket '' --sysfs-root " + dir_ + "/sys --kubeconfig " +
        (kubeconfig_.empty() ? api_.WriteKubeconfig(dir_ + "/kubeconfig") : kubeconfig_) + " >>" +
        dir_ + "/agent.log 2>&1";
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    ASSERT_EQ(posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ),
              0);
  }
  void StopAgent() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string Log() const { return tessera::test::ReadFile(dir_ + "/agent.log"); }
  std::string ClaimUid(const std::string& name) {
    return (*api_.Get(kClaims, name))["metadata"]["uid"].get<std::string>();
  }
  FakeDraKubelet::ClaimRef Ref(const std::string& name) { return {"team-a", name, ClaimUid(name)}; }
  std::vector<json> Slices() const { return api_.List(kSlices); }

  bool xid_ = false;
  std::string dra_flags_ = "--dra-share-gpus 3";
  std::string resync_ = "1";  // seconds between the slice publisher's own looks
  std::string kubeconfig_;    // another API server's ("": the fake's)
  std::string dir_;
  FakeApiServer api_;
  json node_;
  pid_t pid_ = -1;
};

std::vector<std::vector<std::string>> CdiIds(const dra::NodePrepareResourceResponse& r) {
  std::vector<std::vector<std::string>> out;
  for (const auto& d : r.devices()) {
    out.emplace_back(d.cdi_device_ids().begin(), d.cdi_device_ids().end());
  }
  return out;
}

TEST_F(AgentDraE2e, RegistersPreparesAndAfterARestartAnswersTheSameCdiIds) {
  api_.Put(kClaims, Claim("train", {{"gpus", "gpu-0"}, {"gpus", "gpu-1"}}));
  api_.Put(kClaims, Claim("infer", {{"s", "gpu-3-share-1"}}));
  const std::string uid = ClaimUid("train");
  const std::string share_uid = ClaimUid("infer");
  StartAgent();
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why() << Log();
  EXPECT_EQ(kubelet.info().endpoint(), dir_ + "/kubelet/plugins/gpu.tessera.io/dra.sock");

  dra::NodePrepareResourcesResponse first;
  grpc::Status s = kubelet.Prepare({Ref("train")}, &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(first.claims().contains(uid));
  const auto& entry = first.claims().at(uid);
  ASSERT_EQ(entry.error(), "") << Log();
  ASSERT_EQ(entry.devices_size(), 2);
  EXPECT_EQ(entry.devices(0).pool_name(), "node-a");
  EXPECT_EQ(entry.devices(0).device_name(), "gpu-0");
  EXPECT_THAT(entry.devices(0).request_names(), ::testing::ElementsAre("gpus"));
  EXPECT_THAT(CdiIds(entry),
              ::testing::ElementsAre(::testing::ElementsAre("tessera.io/gpu=" + Uuid(0),
                                                            "tessera.io/claim=" + uid + "-gpus"),
                                     ::testing::ElementsAre("tessera.io/gpu=" + Uuid(1))));
  // The claim's CDI spec: the request's own device.
  json spec = json::parse(tessera::test::ReadFile(dir_ + "/cdi/tessera.io-claim_" + uid + ".json"));
  EXPECT_EQ(spec["kind"], "tessera.io/claim");
  EXPECT_EQ(spec["devices"][0]["name"], uid + "-gpus");
  // Whole GPUs: their device nodes only (no runtime hook's own, no CUDA_VISIBLE_DEVICES that
  // a second claim of the container would override).
  const std::string env = spec["devices"][0]["containerEdits"]["env"].dump();
  EXPECT_THAT(env, HasSubstr("NVIDIA_VISIBLE_DEVICES=void"));
  EXPECT_THAT(env, ::testing::Not(HasSubstr("CUDA_VISIBLE_DEVICES")));

  // Preparing again (a kubelet retrying) answers the same; a share beside it.
  dra::NodePrepareResourcesResponse again;
  ASSERT_TRUE(kubelet.Prepare({Ref("train"), Ref("infer")}, &again).ok());
  EXPECT_EQ(CdiIds(again.claims().at(uid)), CdiIds(entry));
  const auto share_ids = CdiIds(again.claims().at(share_uid));
  EXPECT_THAT(share_ids, ::testing::ElementsAre(::testing::ElementsAre(
                             "tessera.io/gpu=" + Uuid(3), "tessera.io/claim=" + share_uid + "-s")));
  const std::string region = dir_ + "/state/regions/claim-" + share_uid + "-s.region";
  EXPECT_TRUE(fs::exists(region));

  // Stop: both sockets go (the kubelet's deregistration); the node's slices stay, as upstream's
  // plugin helper leaves them (the kubelet wipes them if the driver does not come back).
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !Slices().empty(); })) << Log();
  StopAgent();
  EXPECT_FALSE(fs::exists(dir_ + "/kubelet/plugins_registry/gpu.tessera.io-reg.sock"));
  EXPECT_FALSE(fs::exists(dir_ + "/kubelet/plugins/gpu.tessera.io/dra.sock"));
  EXPECT_FALSE(Slices().empty());
  // The claim objects are gone too now: the restarted agent answers from its checkpoint.
  api_.Delete(kClaims, "train");
  api_.Delete(kClaims, "infer");
  StartAgent();
  FakeDraKubelet restarted(dir_ + "/kubelet");
  ASSERT_TRUE(restarted.Register(kDriver)) << restarted.why() << Log();
  dra::NodePrepareResourcesResponse after;
  ASSERT_TRUE(
      restarted.Prepare({{"team-a", "train", uid}, {"team-a", "infer", share_uid}}, &after).ok());
  ASSERT_EQ(after.claims().at(uid).error(), "");
  EXPECT_EQ(CdiIds(after.claims().at(uid)), CdiIds(entry));
  EXPECT_EQ(CdiIds(after.claims().at(share_uid)), share_ids);
  EXPECT_TRUE(fs::exists(region));  // the share's region survived the restart

  // Unprepare removes its spec; again, and for a claim never prepared, is fine too.
  dra::NodeUnprepareResourcesResponse un;
  ASSERT_TRUE(restarted
                  .Unprepare({{"team-a", "train", uid},
                              {"team-a", "infer", share_uid},
                              {"team-a", "never", "uid-x"}},
                             &un)
                  .ok());
  EXPECT_EQ(un.claims().at(uid).error(), "");
  EXPECT_EQ(un.claims().at(share_uid).error(), "");
  EXPECT_FALSE(fs::exists(region));
  EXPECT_EQ(un.claims().at("uid-x").error(), "");
  EXPECT_FALSE(fs::exists(dir_ + "/cdi/tessera.io-claim_" + uid + ".json"));
  ASSERT_TRUE(restarted.Unprepare({{"team-a", "train", uid}}, &un).ok());
  EXPECT_EQ(un.claims().at(uid).error(), "");
}

TEST_F(AgentDraE2e, BadClaimsGetErrorsAndTheOthersInTheCallArePrepared) {
  api_.Put(kClaims, Claim("good", {{"gpu", "gpu-0"}}));
  api_.Put(kClaims, Claim("pending", {}));  // not allocated
  api_.Put(kClaims, Claim("elsewhere", {{"gpu", "gpu-1"}}, "node-b"));
  api_.Put(kClaims, Claim("unknown", {{"gpu", "gpu-9"}}));
  api_.Put(kClaims, Claim("taken", {{"gpu", "gpu-0"}}));  // the device "good" has
  api_.Put(kClaims, Claim("mixed", {{"gpu", "gpu-1"}, {"gpu", "gpu-3-share-0"}}));
  api_.Put(
      kClaims,
      Claim("badconfig", {{"s", "gpu-3-share-1"}}, "node-a",
            json::array({{{"source", "FromClaim"},
                          {"opaque",
                           {{"driver", kDriver},
                            {"parameters", {{"kind", "ShareConfig"}, {"memory", "lots"}}}}}}})));
  StartAgent();
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why() << Log();

  // Malformed calls are gRPC errors: the kubelet discards the whole answer.
  dra::NodePrepareResourcesResponse out;
  grpc::Status s = kubelet.Prepare({{"team-a", "good", ""}}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("uid are required"));
  s = kubelet.Prepare({Ref("good"), Ref("good")}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("asked twice"));

  // One call, one entry per claim: the good one prepared, each other with its reason.
  out.Clear();
  s = kubelet.Prepare({Ref("good"),
                       Ref("pending"),
                       Ref("elsewhere"),
                       Ref("unknown"),
                       Ref("taken"),
                       Ref("mixed"),
                       Ref("badconfig"),
                       {"team-a", "good", "uid-stale"},
                       {"team-a", "missing", "uid-m"}},
                      &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(out.claims_size(), 9);
  auto err = [&](const std::string& uid) { return out.claims().at(uid).error(); };
  EXPECT_EQ(err(ClaimUid("good")), "");
  EXPECT_THAT(err(ClaimUid("pending")), HasSubstr("not allocated"));
  EXPECT_THAT(err(ClaimUid("elsewhere")), HasSubstr("pool 'node-b' is not this node's"));
  EXPECT_THAT(err(ClaimUid("unknown")), HasSubstr("device 'gpu-9' is not one this node publishes"));
  EXPECT_THAT(err(ClaimUid("taken")), HasSubstr("gpu-0 is prepared for claim team-a/good"));
  EXPECT_THAT(err(ClaimUid("mixed")), HasSubstr("mixes whole GPUs and shares"));
  EXPECT_THAT(err(ClaimUid("badconfig")), HasSubstr("memory: expected a quantity"));
  EXPECT_THAT(err("uid-stale"), HasSubstr("the kubelet asked for uid-stale"));
  EXPECT_THAT(err("uid-m"), HasSubstr("team-a/missing"));
  for (const auto& [uid, e] : out.claims()) {
    if (!e.error().empty()) {
      EXPECT_EQ(e.devices_size(), 0) << uid;
    }
  }
  // Nothing of the refused ones was kept: one spec, one claim in the checkpoint.
  int specs = 0;
  for (const auto& f : fs::directory_iterator(dir_ + "/cdi")) {
    specs += f.path().filename().string().starts_with("tessera.io-claim_");
  }
  EXPECT_EQ(specs, 1);
  json checkpoint = json::parse(
      tessera::test::ReadFile(dir_ + "/kubelet/plugins/gpu.tessera.io/checkpoint.json"));
  EXPECT_EQ(checkpoint["claims"].size(), 1u);
  EXPECT_TRUE(checkpoint["claims"].contains(ClaimUid("good")));
}

TEST_F(AgentDraE2e, AShareGetsItsMemoryLimitAndComputeShareInTheContainer) {
  // Two of GPU 3's four shares (half its compute), 1 GiB of its memory by the claim's config;
  // reserved for two pods (one ends, one is still running when the claim is unprepared).
  json claim = Claim("infer", {{"s", "gpu-3-share-0"}, {"s", "gpu-3-share-2"}}, "node-a",
                     json::array({{{"source", "FromClaim"},
                                   {"requests", {"s"}},
                                   {"opaque",
                                    {{"driver", kDriver},
                                     {"parameters",
                                      {{"apiVersion", "gpu.tessera.io/v1alpha1"},
                                       {"kind", "ShareConfig"},
                                       {"memory", "1Gi"},
                                       {"priority", 2}}}}}}}));
  claim["status"]["reservedFor"] = {{{"resource", "pods"}, {"name", "infer-0"}, {"uid", "p0"}},
                                    {{"resource", "pods"}, {"name", "infer-1"}, {"uid", "p1"}}};
  // Its memory sized "auto" by the extender's webhook (the ShareConfig above is what it appends).
  claim["metadata"]["annotations"] = {{"tessera.io/gpu-memory", "auto"},
                                      {"tessera.io/sizing", "memory 1024Mi: a peak of 800MiB"}};
  api_.Put(kClaims, claim);
  for (const char* pod : {"infer-0", "infer-1"})
    api_.Put("/api/v1/namespaces/team-a/pods",
             {{"metadata", {{"name", pod}, {"namespace", "team-a"}}},
              {"status", {{"phase", std::string(pod) == "infer-0" ? "Succeeded" : "Running"}}}});
  const std::string uid = ClaimUid("infer");
  StartAgent();
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why() << Log();
  dra::NodePrepareResourcesResponse out;
  const auto unix_now = [] {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const int64_t prepared = unix_now();
  ASSERT_TRUE(kubelet.Prepare({Ref("infer")}, &out).ok());
  const auto& entry = out.claims().at(uid);
  ASSERT_EQ(entry.error(), "") << Log();
  // GPU 3's device once, the request's own edits once.
  EXPECT_THAT(CdiIds(entry),
              ::testing::ElementsAre(::testing::ElementsAre("tessera.io/gpu=" + Uuid(3),
                                                            "tessera.io/claim=" + uid + "-s"),
                                     ::testing::IsEmpty()));

  // What a runtime does with the claim's CDI device: its environment, with each mounted path
  // where the mount puts it (here, the host path itself).
  json spec = json::parse(tessera::test::ReadFile(dir_ + "/cdi/tessera.io-claim_" + uid + ".json"));
  tessera::test::CdiProcess process;
  tessera::test::ApplyCdiEdits(spec["devices"][0]["containerEdits"], &process);
  ASSERT_FALSE(process.mounts.empty());
  for (const std::string& m : process.mounts) ASSERT_TRUE(fs::exists(m)) << m;
  std::map<std::string, std::string>& env = process.env;
  EXPECT_EQ(env["TESSERA_CUDA_MEM_LIMIT"], "0:1073741824");
  EXPECT_EQ(env["TESSERA_CUDA_COMPUTE_SHARE"], "50%");
  EXPECT_EQ(env["TESSERA_CUDA_PRIORITY"], "2");
  EXPECT_EQ(env["TESSERA_CUDA_ARBITER_GPUS"], "3");
  EXPECT_THAT(env["LD_PRELOAD"], HasSubstr("libtessera-cuda.so"));
  std::string cmd = "env -i";
  for (const auto& [k, v] : env) cmd += " '" + k + "=" + v + "'";
  cmd += std::string(" ") + TESSERA_CUDA_CLIENT + " link alloc:800 alloc:300 2>&1";
  auto got = tessera::test::Capture(cmd);
  EXPECT_EQ(got.out, "ok\noom\n") << cmd;
  // The region the library keeps its accounting in is the claim's.
  EXPECT_THAT(env["TESSERA_CUDA_REGION"], HasSubstr("claim-" + uid + "-s.region"));
  // Its kernels kept GPU 3 busy 0.4 s, as the arbiter charged them under the request's key (its
  // TESSERA_JOB_ID); the pod lived at least two whole seconds.
  EXPECT_EQ(env["TESSERA_JOB_ID"], "claim-" + uid + "-s");
  char err[256] = "";
  std::unique_ptr<tessera::shim::Arbiter> arbiter(tessera::shim::Arbiter::Attach(
      (dir_ + "/state/gpu.arbiter").c_str(),
      tessera::shim::ArbiterJobKey(env["TESSERA_JOB_ID"].c_str()), {}, err, sizeof err));
  ASSERT_NE(arbiter, nullptr) << err;
  ASSERT_GE(arbiter->Slot(3), 0);
  arbiter->data()->gpus[3].jobs[arbiter->Slot(3)].busy_us.store(400'000);
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return unix_now() >= prepared + 2; }));
  // Its pod ended: the kubelet unprepares the claim, which is told what its share used (a
  // Warning: its limit refused the second allocation) of its memory and of its GPU time.
  dra::NodeUnprepareResourcesResponse un;
  ASSERT_TRUE(kubelet.Unprepare({Ref("infer")}, &un).ok());
  auto note = [&]() -> std::string {
    for (const json& e : api_.List("/apis/events.k8s.io/v1/namespaces/team-a/events")) {
      if (e["regarding"]["kind"] == "ResourceClaim" && e["regarding"]["name"] == "infer" &&
          e["reason"] == "GPUShareUse")
        return e["type"].get<std::string>() + ": " + e["note"].get<std::string>();
    }
    return "";
  };
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !note().empty(); })) << Log();
  const std::string told = note();
  EXPECT_THAT(told, HasSubstr("Warning: request s: its GPU share used a peak of 800 MiB of the "
                              "1024 MiB given on " +
                              Uuid(3) +
                              " (78%), and 1 allocation refused at that limit (it asked for 1100 "
                              "MiB at most); 0.4 s of GPU time in its "));
  std::smatch held;
  ASSERT_TRUE(std::regex_search(told, held, std::regex("; 0.4 s of GPU time in its ([0-9]+) s")))
      << told;
  const int lived = std::stoi(held[1]);
  EXPECT_GE(lived, 2) << told;
  EXPECT_THAT(told, ::testing::EndsWith(
                        fmt::format(" s ({:.0f}% of its 50% share)", 100 * 0.4 / (lived * 0.5))));
  // The pod that ended carries it in tessera.io/gpu-use (what the extender sizes "auto" from);
  // the one still running is not told (a newer pod of that name would be told another's use).
  std::string use_text;
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    auto p = api_.Get("/api/v1/namespaces/team-a/pods", "infer-0");
    use_text =
        p ? (*p)["metadata"].value("annotations", json::object()).value("tessera.io/gpu-use", "")
          : "";
    return !use_text.empty();
  })) << Log();
  auto use = tessera::kube::ParseGpuUse(use_text);
  ASSERT_TRUE(use.ok()) << use.status() << use_text;
  EXPECT_EQ(use->peak_mib, 800);
  EXPECT_EQ(use->limit_mib, 1024);
  EXPECT_EQ(use->refused, 1);
  EXPECT_EQ(use->wanted_mib, 1100);
  EXPECT_NEAR(use->seconds, lived, 1);
  // 0.4 s of GPU time in at least 2 s: at most 200 permille of the GPU.
  ASSERT_TRUE(use->busy_permille.has_value()) << use_text;
  EXPECT_GT(*use->busy_permille, 0);
  EXPECT_LE(*use->busy_permille, 200);
  // Its automatic memory outgrown: a Warning says so and what to set, never silently.
  std::string outgrew;
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    for (const json& e : api_.List("/apis/events.k8s.io/v1/namespaces/team-a/events")) {
      if (e["regarding"]["name"] == "infer" && e["reason"] == "OutgrewGPUMemory")
        outgrew = e["type"].get<std::string>() + ": " + e["note"].get<std::string>();
    }
    return !outgrew.empty();
  })) << Log();
  EXPECT_EQ(outgrew,
            "Warning: request s: its automatic GPU memory of 1024Mi refused 1 allocation (measured "
            "peak 800MiB; it asked for 1100MiB at most): the next claim of its kind is sized past "
            "it (or set a ShareConfig memory of at least 1100Mi)");
  auto running = api_.Get("/api/v1/namespaces/team-a/pods", "infer-1");
  ASSERT_TRUE(running.has_value());
  EXPECT_FALSE(
      (*running)["metadata"].value("annotations", json::object()).contains("tessera.io/gpu-use"));
}

// Issue 58's DRA chain across the processes: a `tessera extender` (its admission webhook as
// deploy/components/auto-share configures it, called by the API server over HTTPS) and this node's
// `tessera agent --dra`, with this test as kube-controller-manager (a claim made from its pod's
// template), kube-scheduler (the claim allocated from the agent's slices, its config copied) and
// the kubelet. A claim asking tessera.io/gpu-memory "auto" of a kind never measured is created as
// asked; its pod's processes held 800 MiB at their peak; the pod ends, the agent writes that on
// it, the extender learns it from its watch; the next pod's claim is sized 1024Mi as the API
// server creates it (800 MiB + 20%, in 256 MiB steps), and that limit is what the agent gives its
// container - where a process asking past it is refused.
TEST_F(AgentDraE2e, AnAutoClaimIsSizedFromWhatTheAgentMeasuredOfItsKindsLastPod) {
  dra_flags_ = "--dra-share-gpus 3";
  StartAgent();
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why() << Log();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !Slices().empty(); })) << Log();
  // The extender with its webhook, as deploy/components/auto-share runs it.
  const json hooks = tessera::fakes::JsonOfYaml(
      YAML::LoadFile(TESSERA_SOURCE_DIR "/deploy/components/auto-share/webhook.yaml"));
  api_.Put("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", hooks);
  const std::string extender_log = dir_ + "/extender.log";
  const std::string cmd =
      std::string("unset KUBECONFIG KUBERNETES_SERVICE_HOST; exec setpriv --pdeathsig TERM ") +
      TESSERA_BINARY + " extender --kubeconfig " + api_.WriteKubeconfig(dir_ + "/ext-kubeconfig") +
      " --dra --listen 127.0.0.1:0 --tls-secret tessera-system/tessera-extender-tls --tls-dns "
      "localhost --metrics-listen '' --webhook-listen 127.0.0.1:0 --webhook-configuration " +
      hooks["metadata"]["name"].get<std::string>() + " >>" + extender_log + " 2>&1";
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t extender = -1;
  ASSERT_EQ(posix_spawn(&extender, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ),
            0);
  struct Stopped {
    pid_t& pid;
    ~Stopped() { kill(pid, SIGTERM), waitpid(pid, nullptr, 0); }
  } stop_extender{extender};
  std::smatch port;
  const std::regex webhook_re("/mutate-resourceclaims\\) on 127.0.0.1:0 \\(port ([0-9]+), HTTPS");
  std::string said;
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    said = tessera::test::ReadFile(extender_log);
    return std::regex_search(said, port, webhook_re);
  })) << said;
  const json& service = hooks["webhooks"][1]["clientConfig"]["service"];
  api_.SetServiceAddress(service["namespace"], service["name"], service.value("port", 443),
                         "localhost:" + port[1].str());
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    auto c = api_.Get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                      hooks["metadata"]["name"]);
    return c && !(*c)["webhooks"][1]["clientConfig"].value("caBundle", "").empty();
  })) << tessera::test::ReadFile(extender_log);

  tessera::kube::ClusterConfig cluster;
  cluster.server = api_.url();
  cluster.token = "test-token";
  auto client = tessera::kube::Client::Create(cluster);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string pods = "/api/v1/namespaces/team-a/pods";
  // A pod of Job "infer" and the claim kube-controller-manager makes from its template (the
  // template's annotations; the pod its controller owner).
  auto pod_and_claim = [&](const std::string& name, json* claim) {
    json pod = {{"metadata",
                 {{"name", name},
                  {"namespace", "team-a"},
                  {"labels", {{"batch.kubernetes.io/job-name", "infer"}}}}},
                {"spec",
                 {{"containers", {{{"name", "main"}, {"command", {"python", "serve.py"}}}}},
                  {"resourceClaims", {{{"name", "gpu"}, {"resourceClaimTemplateName", "share"}}}}}},
                {"status", {{"phase", "Pending"}}}};
    auto made = (*client)->Create(pods, pod);
    ASSERT_TRUE(made.ok()) << made.status();
    pod = *made;
    json c = {
        {"apiVersion", "resource.k8s.io/v1"},
        {"kind", "ResourceClaim"},
        {"metadata",
         {{"name", name + "-gpu"},
          {"namespace", "team-a"},
          {"annotations", {{"tessera.io/gpu-memory", "auto"}}},
          {"ownerReferences",
           {{{"apiVersion", "v1"},
             {"kind", "Pod"},
             {"name", name},
             {"uid", pod["metadata"]["uid"]},
             {"controller", true},
             {"blockOwnerDeletion", true}}}}}},
        {"spec",
         {{"devices",
           {{"requests",
             {{{"name", "s"},
               {"exactly", {{"deviceClassName", "gpu-share.tessera.io"}, {"count", 2}}}}}}}}}}};
    auto created = (*client)->Create(kClaims, c);
    ASSERT_TRUE(created.ok()) << created.status() << tessera::test::ReadFile(extender_log);
    *claim = *created;
    // kube-scheduler: two shares of GPU 3 from the agent's slice, the claim's config copied (as
    // FromClaim), reserved for its pod.
    json& alloc = (*claim)["status"]["allocation"]["devices"];
    alloc["results"] = json::array();
    for (const char* device : {"gpu-3-share-0", "gpu-3-share-1"})
      alloc["results"].push_back(
          {{"request", "s"}, {"driver", kDriver}, {"pool", "node-a"}, {"device", device}});
    alloc["config"] = json::array();
    for (json config : (*claim)["spec"]["devices"].value("config", json::array())) {
      config["source"] = "FromClaim";
      alloc["config"].push_back(config);
    }
    (*claim)["status"]["reservedFor"] = {
        {{"resource", "pods"}, {"name", name}, {"uid", pod["metadata"]["uid"]}}};
    *claim = api_.Put(kClaims, *claim);
    pod["status"]["phase"] = "Running";
    api_.Put(pods, pod);
  };
  // What the container gets: the CDI edits of its claim's request, applied.
  auto container_env = [&](const std::string& claim_name) {
    dra::NodePrepareResourcesResponse out;
    EXPECT_TRUE(kubelet.Prepare({Ref(claim_name)}, &out).ok());
    const std::string uid = ClaimUid(claim_name);
    EXPECT_EQ(out.claims().at(uid).error(), "") << Log();
    json spec =
        json::parse(tessera::test::ReadFile(dir_ + "/cdi/tessera.io-claim_" + uid + ".json"));
    tessera::test::CdiProcess process;
    tessera::test::ApplyCdiEdits(spec["devices"][0]["containerEdits"], &process);
    std::string env = "env -i";
    for (const auto& [k, v] : process.env) env += " '" + k + "=" + v + "'";
    return std::make_pair(process.env, env);
  };

  json first;
  ASSERT_NO_FATAL_FAILURE(pod_and_claim("infer-1", &first));
  EXPECT_THAT(first["metadata"]["annotations"].value("tessera.io/sizing", ""),
              HasSubstr("no measured runs of its kind yet"))
      << first.dump();
  EXPECT_FALSE(first["spec"]["devices"].contains("config")) << "as asked: " << first.dump();
  auto [env1, run1] = container_env("infer-1-gpu");
  auto got = tessera::test::Capture(run1 + " " + TESSERA_CUDA_CLIENT + " link alloc:800 2>&1");
  EXPECT_EQ(got.out, "ok\n");
  // Its pod ends; the kubelet unprepares its claim; the agent writes what it used on the pod.
  auto ended = api_.Get(pods, "infer-1");
  (*ended)["status"]["phase"] = "Succeeded";
  api_.Put(pods, *ended);
  dra::NodeUnprepareResourcesResponse un;
  ASSERT_TRUE(kubelet.Unprepare({Ref("infer-1-gpu")}, &un).ok());
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return tessera::test::ReadFile(extender_log)
               .find("pod team-a/infer-1 ended; its kind's DRA claims") != std::string::npos;
  })) << Log()
      << tessera::test::ReadFile(extender_log);
  auto use =
      tessera::kube::ParseGpuUse((*api_.Get(pods, "infer-1"))["metadata"]["annotations"].value(
          tessera::kube::kGpuUseAnnotation, ""));
  ASSERT_TRUE(use.ok()) << use.status();
  EXPECT_EQ(use->peak_mib, 800);

  // The next pod of its Job: its claim is sized as it is created, and its container gets that.
  json second;
  ASSERT_NO_FATAL_FAILURE(pod_and_claim("infer-2", &second));
  EXPECT_THAT(second["metadata"]["annotations"].value("tessera.io/sizing", ""),
              HasSubstr("memory 1024Mi: a peak of 800MiB (p95 of team-a's runs of 'infer'"))
      << second.dump();
  ASSERT_EQ(second["status"]["allocation"]["devices"]["config"].size(), 1u) << second.dump();
  EXPECT_EQ(
      second["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["memory"],
      "1024Mi");
  auto [env2, run2] = container_env("infer-2-gpu");
  EXPECT_EQ(env2["TESSERA_CUDA_MEM_LIMIT"], "0:1073741824");
  got = tessera::test::Capture(run2 + " " + TESSERA_CUDA_CLIENT + " link alloc:800 alloc:300 2>&1");
  EXPECT_EQ(got.out, "ok\noom\n") << "800 MiB fits its 1024 MiB; 300 MiB more does not";
}

class AgentDraSlicesE2e : public AgentDraE2e {
 protected:
  void SetUp() override {
    xid_ = true;
    AgentDraE2e::SetUp();
  }
};

TEST_F(AgentDraSlicesE2e, PublishesValidSlicesUpdatesThemOnAnXidRepublishesAndLeavesThem) {
  StartAgent();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Slices().size() == 1; })) << Log();
  // The kubelet's health stream, opened before the XID (1.5 s after the driver's start) as a
  // node's is: what it is told is kept, and the slices the agent writes are in the API server's
  // requests, so the XID's 0.5 s of unhealth is seen however slowly the checks below run.
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why();
  kubelet.WatchHealth();
  json slice = Slices()[0];
  EXPECT_EQ(slice["metadata"]["name"], "node-a-gpu.tessera.io-0");
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], node_["metadata"]["uid"]);
  EXPECT_EQ(slice["spec"]["driver"], kDriver);
  EXPECT_EQ(slice["spec"]["nodeName"], "node-a");
  EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 1);
  const int64_t gen = slice["spec"]["pool"]["generation"];
  // GPUs 0-2 whole, GPU 3 in four shares; what a CEL selector reads.
  ASSERT_EQ(slice["spec"]["devices"].size(), 7u) << slice.dump(2);
  const json& g0 = slice["spec"]["devices"][0];
  EXPECT_EQ(g0["name"], "gpu-0");
  EXPECT_EQ(g0["attributes"]["type"]["string"], "gpu");
  EXPECT_EQ(g0["attributes"]["uuid"]["string"], Uuid(0));
  EXPECT_EQ(g0["attributes"]["productName"]["string"], "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(g0["attributes"]["architecture"]["string"], "Ampere");
  EXPECT_EQ(g0["attributes"]["cudaComputeCapability"]["version"], "8.0.0");
  EXPECT_EQ(g0["attributes"]["driverVersion"]["version"], "535.104.5");  // semver: no leading 0
  EXPECT_EQ(g0["attributes"]["cudaDriverVersion"]["version"], "12.4.0");
  EXPECT_EQ(g0["attributes"]["numaNode"]["int"], 0);
  EXPECT_EQ(g0["attributes"]["resource.kubernetes.io/pcieRoot"]["string"], "pci0000:0f");
  EXPECT_FALSE(
      slice["spec"]["devices"][1]["attributes"].contains("resource.kubernetes.io/pcieRoot"));
  EXPECT_EQ(g0["capacity"]["memory"]["value"], "40Gi");
  const json& s3 = slice["spec"]["devices"][3];
  EXPECT_EQ(s3["name"], "gpu-3-share-0");
  EXPECT_EQ(s3["attributes"]["type"]["string"], "share");
  EXPECT_EQ(s3["capacity"]["memory"]["value"], "10Gi");
  // Validated against resource.k8s.io/v1's schema (npm kubernetes-models, pinned).
  {
    std::ofstream(dir_ + "/slice.json") << slice.dump();
    auto v = tessera::test::Capture("cd " TESSERA_SOURCE_DIR "/tests/deploy && node validate.js <" +
                                    dir_ + "/slice.json 2>&1");
    EXPECT_EQ(v.code, 0) << v.out;
    EXPECT_THAT(v.out, HasSubstr("1 objects, 0 invalid"));
  }

  // The XID: GPU 2 left the pool, in a new generation (a slice the agent wrote), and the health
  // stream said so.
  auto names = [&] {
    std::vector<std::string> out;
    auto s = Slices();
    if (s.size() != 1) return out;
    for (const json& d : s[0]["spec"]["devices"]) out.push_back(d["name"]);
    return out;
  };
  json without;  // the slice written without GPU 2
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    for (const auto& r : api_.Requests()) {
      if (r.resource != "resourceslices.resource.k8s.io" || r.status >= 300 ||
          (r.verb != "update" && r.verb != "create"))
        continue;
      const json written = json::parse(r.body, nullptr, false);
      if (!written.is_object() || !written.contains("spec")) continue;
      std::vector<std::string> n;
      for (const json& d : written["spec"].value("devices", json::array())) n.push_back(d["name"]);
      if (!n.empty() && std::find(n.begin(), n.end(), "gpu-2") == n.end()) {
        without = written;
        return true;
      }
    }
    return false;
  })) << Log();
  EXPECT_GT(without["spec"]["pool"]["generation"].get<int64_t>(), gen);
  EXPECT_TRUE(kubelet.WaitHealthSeen([](const v1::NodeWatchResourcesResponse& r) {
    for (const auto& d : r.devices()) {
      if (d.device().device_name() == "gpu-2")
        return d.health() == v1::UNHEALTHY && !d.message().empty();
    }
    return false;
  }));
  // Recovery brings it back.
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    auto n = names();
    return std::find(n.begin(), n.end(), "gpu-2") != n.end();
  })) << Log();

  // The kubelet deletes a node's slices when it starts: the agent publishes them again.
  api_.Delete(kSlices, "node-a-gpu.tessera.io-0");
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Slices().size() == 1; })) << Log();
  EXPECT_GT(Slices()[0]["spec"]["pool"]["generation"].get<int64_t>(), 0);
  // The API server stored "40Gi" capacities its own way; a value compare sees no change, so
  // the publisher writes nothing more while nothing changes.
  const size_t mark = api_.Requests().size();
  auto since = [&] {
    auto all = api_.Requests();
    return std::vector<tessera::fakes::ApiRequest>(all.begin() + mark, all.end());
  };
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    int lists = 0;
    for (const auto& r : since()) {
      lists += r.verb == "list" && r.resource == "resourceslices.resource.k8s.io";
    }
    return lists >= 3;
  })) << Log();
  for (const auto& r : since()) {
    if (r.resource == "resourceslices.resource.k8s.io") {
      EXPECT_EQ(r.verb, "list") << r.path;
    }
  }

  // A claim prepared too, so that every call the driver makes has been made.
  api_.Put(kClaims, Claim("train", {{"gpus", "gpu-0"}}));
  dra::NodePrepareResourcesResponse out;
  ASSERT_TRUE(kubelet.Prepare({Ref("train")}, &out).ok());
  ASSERT_EQ(out.claims().at(ClaimUid("train")).error(), "");

  StopAgent();
  EXPECT_EQ(Slices().size(), 1u);  // left for the kubelet, as upstream's plugin helper does
  // A start after the checkpoint was truncated lists the claims to prepare them again.
  fs::resize_file(dir_ + "/kubelet/plugins/gpu.tessera.io/checkpoint.json", 10);
  StartAgent();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return Log().find("DRA state rebuilt from the API server") != std::string::npos;
  })) << Log();
  StopAgent();

  // deploy/components/dra grants the agent exactly the resource.k8s.io verbs it used.
  std::set<std::string> used, granted;
  for (const auto& r : api_.Requests()) {
    if (r.resource.ends_with(".resource.k8s.io")) used.insert(r.verb + " " + r.resource);
  }
  YAML::Node rbac = YAML::LoadAllFromFile(TESSERA_SOURCE_DIR "/deploy/components/dra/rbac.yaml")[0];
  ASSERT_EQ(rbac["kind"].as<std::string>(), "ClusterRole");
  for (const auto& rule : rbac["rules"]) {
    for (const auto& group : rule["apiGroups"]) {
      for (const auto& res : rule["resources"]) {
        for (const auto& verb : rule["verbs"]) {
          granted.insert(verb.as<std::string>() + " " + res.as<std::string>() + "." +
                         group.as<std::string>());
        }
      }
    }
  }
  // Deleting a slice is granted for a pool that shrinks to fewer slices, which this node's four
  // GPUs never do (one slice).
  used.insert("delete resourceslices.resource.k8s.io");
  EXPECT_EQ(used, granted);
}

TEST_F(AgentDraE2e, PartitionableDevicesArePublishedWithTheirCountersAndValidate) {
  dra_flags_ = "--dra-partitionable";
  StartAgent();
  // Four GPUs, each whole and in four shares (20 devices); their counter sets in a slice apart.
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Slices().size() == 2; })) << Log();
  json all = json::array();
  for (const json& s : Slices()) {
    EXPECT_EQ(s["spec"]["pool"]["resourceSliceCount"], 2);
    all.push_back(s);
  }
  const json& devices = all[0]["spec"].contains("devices") ? all[0] : all[1];
  const json& counters = all[0]["spec"].contains("devices") ? all[1] : all[0];
  EXPECT_EQ(devices["spec"]["devices"].size(), 20u);
  EXPECT_EQ(counters["spec"]["sharedCounters"].size(), 4u);
  EXPECT_EQ(counters["spec"]["sharedCounters"][0]["counters"]["memory"]["value"], "40Gi");
  std::ofstream out(dir_ + "/slices.yaml");
  for (const json& s : all) out << "---\n" << s.dump() << "\n";
  out.close();
  auto v = tessera::test::Capture("cd " TESSERA_SOURCE_DIR "/tests/deploy && node validate.js <" +
                                  dir_ + "/slices.yaml 2>&1");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_THAT(v.out, HasSubstr("2 objects, 0 invalid"));
  // kube-scheduler gave GPU 1 whole; a share of it is then refused.
  api_.Put(kClaims, Claim("whole", {{"g", "gpu-1"}}));
  api_.Put(kClaims, Claim("share", {{"s", "gpu-1-share-0"}}));
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why();
  dra::NodePrepareResourcesResponse resp;
  ASSERT_TRUE(kubelet.Prepare({Ref("whole"), Ref("share")}, &resp).ok());
  EXPECT_EQ(resp.claims().at(ClaimUid("whole")).error(), "");
  EXPECT_THAT(resp.claims().at(ClaimUid("share")).error(), HasSubstr("which holds gpu-1"));
}

TEST_F(AgentDraE2e, ConsumableDevicesValidateAndAShareOfOneComesBackWithItsShareId) {
  dra_flags_ = "--dra-consumable";
  StartAgent();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Slices().size() == 1; })) << Log();
  json slice = Slices()[0];
  ASSERT_EQ(slice["spec"]["devices"].size(), 4u);
  EXPECT_EQ(slice["spec"]["devices"][0]["allowMultipleAllocations"], true);
  std::ofstream(dir_ + "/slice.json") << slice.dump();
  auto v = tessera::test::Capture("cd " TESSERA_SOURCE_DIR "/tests/deploy && node validate.js <" +
                                  dir_ + "/slice.json 2>&1");
  EXPECT_EQ(v.code, 0) << v.out;
  // kube-scheduler gave 8 GiB and 25% of GPU 2 to one claim, as share "s-7".
  json c = Claim("part", {{"r", "gpu-2"}});
  auto& result = c["status"]["allocation"]["devices"]["results"][0];
  result["consumedCapacity"] = {{"memory", "8Gi"}, {"compute", "25"}};
  result["shareID"] = "s-7";
  api_.Put(kClaims, c);
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why();
  dra::NodePrepareResourcesResponse resp;
  ASSERT_TRUE(kubelet.Prepare({Ref("part")}, &resp).ok());
  const auto& entry = resp.claims().at(ClaimUid("part"));
  ASSERT_EQ(entry.error(), "") << Log();
  ASSERT_EQ(entry.devices_size(), 1);
  EXPECT_EQ(entry.devices(0).share_id(), "s-7");
  json spec = json::parse(
      tessera::test::ReadFile(dir_ + "/cdi/tessera.io-claim_" + ClaimUid("part") + ".json"));
  EXPECT_THAT(spec["devices"][0]["containerEdits"]["env"].dump(),
              HasSubstr("TESSERA_CUDA_MEM_LIMIT=0:8589934592"));
  EXPECT_THAT(spec["devices"][0]["containerEdits"]["env"].dump(),
              HasSubstr("TESSERA_CUDA_COMPUTE_SHARE=25%"));
}

TEST_F(AgentDraE2e, BadDraFlagsAreExitCodesWithReasons) {
  const std::string agent = std::string("unset KUBECONFIG KUBERNETES_SERVICE_HOST; ") +
                            TESSERA_BINARY + " agent --simulate t4x2 --no-api-server --state-dir " +
                            dir_ + "/state --kubelet-dir " + dir_ +
                            "/kubelet --metrics-address '' ";
  struct Bad {
    std::string flags, says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"--dra-share-gpus 1", "need --dra"},
           {"--dra-partitionable", "need --dra"},
           {"--dra --cdi-dir ''", "--cdi-dir must not be empty"},
           {"--dra --cdi-dir " + dir_ + "/cdi --dra-share-gpus 7", "GPU 7 is not on this node"},
           {"--dra --cdi-dir " + dir_ + "/cdi --dra-partitionable --dra-consumable",
            "--dra-consumable shares every GPU by amounts"},
           {"--dra --cdi-dir " + dir_ + "/cdi --dra-share-gpus x", "--dra-share-gpus"}}) {
    auto r = tessera::test::Capture(agent + b.flags + " 2>&1");
    EXPECT_EQ(r.code, 2) << b.flags << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(b.says)) << b.flags;
  }
  // Nothing was served.
  EXPECT_FALSE(fs::exists(dir_ + "/kubelet/plugins_registry/gpu.tessera.io-reg.sock"));
  auto help = tessera::test::Capture(std::string(TESSERA_BINARY) + " agent --help");
  for (const char* flag : {"--dra", "--dra-driver", "--kubelet-dir", "--dra-share-gpus",
                           "--dra-partitionable", "--dra-consumable", "--sysfs-root"}) {
    EXPECT_THAT(help.out, HasSubstr(flag));
  }
}

// A node rebooted: /var/run/cdi is tmpfs and comes back empty. Every prepared claim's spec is
// written again at start, before the kubelet asks, and again whenever a repeated prepare finds it
// gone; the share keeps its limits.
TEST_F(AgentDraE2e, AfterARebootEveryPreparedClaimResolvesAgain) {
  api_.Put(kClaims, Claim("train", {{"gpus", "gpu-0"}, {"gpus", "gpu-1"}}));
  api_.Put(kClaims, Claim("infer", {{"s", "gpu-3-share-1"}}));
  const std::string uid = ClaimUid("train"), share_uid = ClaimUid("infer");
  StartAgent();
  dra::NodePrepareResourcesResponse first;
  {
    FakeDraKubelet kubelet(dir_ + "/kubelet");
    ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why() << Log();
    ASSERT_TRUE(kubelet.Prepare({Ref("train"), Ref("infer")}, &first).ok());
  }
  ASSERT_EQ(first.claims().at(share_uid).error(), "") << Log();
  const std::string spec = dir_ + "/cdi/tessera.io-claim_" + uid + ".json";
  const std::string share_spec = dir_ + "/cdi/tessera.io-claim_" + share_uid + ".json";
  const std::string before = tessera::test::ReadFile(share_spec);
  const std::string region = dir_ + "/state/regions/claim-" + share_uid + "-s.region";
  StopAgent();

  // The reboot: the CDI folder empty, the region gone too (a state folder on tmpfs).
  for (const auto& e : fs::directory_iterator(dir_ + "/cdi")) fs::remove(e.path());
  fs::remove(region);
  StartAgent();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return fs::exists(dir_ + "/kubelet/plugins_registry/gpu.tessera.io-reg.sock");
  })) << Log();
  // Before any prepare: every claim's spec is back, byte for byte, and the node's GPU spec.
  EXPECT_TRUE(fs::exists(spec)) << Log();
  EXPECT_EQ(tessera::test::ReadFile(share_spec), before);
  EXPECT_TRUE(fs::exists(region));
  bool gpu_spec = false;
  for (const auto& e : fs::directory_iterator(dir_ + "/cdi")) {
    gpu_spec = gpu_spec ||
               tessera::test::ReadFile(e.path()).find("\"tessera.io/gpu\"") != std::string::npos;
  }
  EXPECT_TRUE(gpu_spec);
  // Every CDI ID the kubelet holds resolves in the folder (what a runtime does).
  auto resolves = [&](const std::string& id) {
    const std::string kind = id.substr(0, id.find('=')), name = id.substr(id.find('=') + 1);
    for (const auto& e : fs::directory_iterator(dir_ + "/cdi")) {
      json j = json::parse(tessera::test::ReadFile(e.path()), nullptr, false);
      if (j.is_discarded() || j.value("kind", "") != kind) continue;
      for (const json& d : j["devices"]) {
        if (d.value("name", "") == name) return true;
      }
    }
    return false;
  };
  for (const auto& [claim, entry] : first.claims()) {
    for (const auto& d : entry.devices()) {
      for (const auto& id : d.cdi_device_ids()) EXPECT_TRUE(resolves(id)) << id;
    }
  }

  // Wiped while running: the kubelet's repeated prepare finds it gone and gets it written.
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why() << Log();
  fs::remove(share_spec);
  dra::NodePrepareResourcesResponse again;
  ASSERT_TRUE(kubelet.Prepare({Ref("train"), Ref("infer")}, &again).ok());
  EXPECT_EQ(CdiIds(again.claims().at(share_uid)), CdiIds(first.claims().at(share_uid)));
  EXPECT_EQ(tessera::test::ReadFile(share_spec), before);
  EXPECT_THAT(before, HasSubstr("TESSERA_CUDA_MEM_LIMIT"));
}

// The kubelet restarted: it wipes the node's slices and registers the driver again. The slices are
// back at once (the resync here is 10 minutes, so only the watch and the registration can bring
// them), and the health stream works in the version that kubelet calls.
TEST_F(AgentDraE2e, AKubeletRestartGetsTheSlicesBackAtOnceAndHealthInItsVersion) {
  resync_ = "600";
  StartAgent();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Slices().size() == 1; })) << Log();
  {
    FakeDraKubelet old(dir_ + "/kubelet", 34);
    ASSERT_TRUE(old.Register(kDriver)) << old.why();
    old.WatchHealth();
    EXPECT_EQ(old.health_service(), "v1alpha1.DRAResourceHealth");
    EXPECT_TRUE(old.WaitHealth([](const v1::NodeWatchResourcesResponse& r) {
      return r.devices_size() == 7 && r.devices(0).health() == v1::HEALTHY;
    })) << old.health_error();
    EXPECT_EQ(old.health_error(), "");
  }
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const json& s : Slices()) api_.Delete(kSlices, s["metadata"]["name"]);
    FakeDraKubelet kubelet(dir_ + "/kubelet", 37);
    ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why();
    ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Slices().size() == 1; })) << Log();
    std::printf(
        "round %d: slices back %.0f ms after the wipe\n", round,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    kubelet.WatchHealth();
    EXPECT_EQ(kubelet.health_service(), "v1.DRAResourceHealth");
    EXPECT_TRUE(kubelet.WaitHealth(
        [](const v1::NodeWatchResourcesResponse& r) { return r.devices_size() == 7; }));
  }
  // A wipe with no registration after it (the kubelet's delayed wipe): the watch alone.
  api_.Delete(kSlices, Slices()[0]["metadata"]["name"]);
  EXPECT_TRUE(FakeApiServer::WaitFor([&] { return Slices().size() == 1; })) << Log();
}

// A truncated checkpoint (a full disk, a crash): set aside, the claims in use on this node
// prepared again from the API server, an Event on the node naming the file - no crash loop.
TEST_F(AgentDraE2e, ATruncatedCheckpointIsSetAsideAndTheClaimsInUseRebuilt) {
  json in_use = Claim("train", {{"gpus", "gpu-0"}});
  in_use["status"]["reservedFor"] = {{{"resource", "pods"}, {"name", "p"}, {"uid", "pod-uid"}}};
  api_.Put(kClaims, in_use);
  api_.Put(kClaims, Claim("done", {{"gpus", "gpu-1"}}));  // allocated, no pod uses it now
  const std::string uid = ClaimUid("train");
  StartAgent();
  {
    FakeDraKubelet kubelet(dir_ + "/kubelet");
    ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why() << Log();
    dra::NodePrepareResourcesResponse out;
    ASSERT_TRUE(kubelet.Prepare({Ref("train")}, &out).ok());
    ASSERT_EQ(out.claims().at(uid).error(), "") << Log();
  }
  StopAgent();
  const std::string checkpoint = dir_ + "/kubelet/plugins/gpu.tessera.io/checkpoint.json";
  fs::resize_file(checkpoint, fs::file_size(checkpoint) / 2);
  for (const auto& e : fs::directory_iterator(dir_ + "/cdi")) fs::remove(e.path());
  StartAgent();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return fs::exists(dir_ + "/kubelet/plugins_registry/gpu.tessera.io-reg.sock");
  })) << Log();
  EXPECT_TRUE(fs::exists(dir_ + "/cdi/tessera.io-claim_" + uid + ".json")) << Log();
  EXPECT_FALSE(fs::exists(dir_ + "/cdi/tessera.io-claim_" + ClaimUid("done") + ".json"));
  int aside = 0;
  for (const auto& e : fs::directory_iterator(dir_ + "/kubelet/plugins/gpu.tessera.io")) {
    aside += e.path().filename().string().starts_with("checkpoint.json.corrupt-");
  }
  EXPECT_EQ(aside, 1);
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    for (const json& e : api_.List("/apis/events.k8s.io/v1/namespaces/default/events")) {
      if (e.value("reason", "") == "CheckpointSetAside" &&
          e.value("note", "").find("checkpoint.json.corrupt-") != std::string::npos) {
        return true;
      }
    }
    return false;
  })) << Log();
  // The kubelet's prepare answers as before, and the agent keeps serving.
  FakeDraKubelet kubelet(dir_ + "/kubelet");
  ASSERT_TRUE(kubelet.Register(kDriver)) << kubelet.why() << Log();
  dra::NodePrepareResourcesResponse out;
  ASSERT_TRUE(kubelet.Prepare({Ref("train")}, &out).ok());
  EXPECT_EQ(out.claims().at(uid).error(), "");
}

// SIGTERM while the API server accepts connections and never answers: the agent is gone within
// seconds (its calls in flight cut), not after the client's 30 s timeouts one after another.
TEST_F(AgentDraE2e, SigtermIsBoundedWhileTheApiServerHangs) {
  int hung = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(hung, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(hung, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(hung, 128), 0);  // connections complete in the kernel; nothing is read
  ASSERT_EQ(getsockname(hung, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  kubeconfig_ = dir_ + "/hung-kubeconfig";
  std::ofstream(kubeconfig_) << "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
                                "    server: http://127.0.0.1:"
                             << ntohs(addr.sin_port)
                             << "\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n"
                                "  context:\n    cluster: c\n    user: u\ncurrent-context: x\n";
  StartAgent();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return fs::exists(dir_ + "/kubelet/plugins_registry/gpu.tessera.io-reg.sock");
  })) << Log();
  const auto t0 = std::chrono::steady_clock::now();
  kill(pid_, SIGTERM);
  int status = 0;
  const bool gone = FakeApiServer::WaitFor([&] { return waitpid(pid_, &status, WNOHANG) == pid_; },
                                           std::chrono::seconds(15));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(hung);
  ASSERT_TRUE(gone) << "still running " << s << " s after SIGTERM\n" << Log();
  pid_ = -1;
  std::printf("stopped %.2f s after SIGTERM with the API server hung\n", s);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Log();
}

}  // namespace
