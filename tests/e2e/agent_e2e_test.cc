// The real `tessera agent` binary as its own process, with the fake libnvidia-ml.so.1 underneath
// and a fake kubelet (real gRPC over unix sockets) above: registration, the device lists, an XID
// seen as Unhealthy and recovery, Allocate with CDI and the intercept library, a kubelet restart,
// an agent restart that keeps allocations, ended pods released, metrics joined to pods, bad input;
// and with a fake API server: node labels applied, kept current and cleaned, the extender's GPU
// choice (a pod annotation) preferred, enforced and marked, an unusable API server survived.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "../capture.h"
#include "agent_scenario.h"
#include "fake_apiserver.h"
#include "fake_kubelet.h"
#include "fmt/format.h"
#include "tessera/devices/mps.h"
#include "tessera/kube/gpu_annotations.h"
#include "tessera/net/http.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"
#include "tessera/shim/version5_arbiter_file.h"
#include "yaml-cpp/yaml.h"

extern char** environ;

namespace {

using tessera::fakes::FakeApiServer;
using tessera::test::FakeKubelet;
using ::testing::HasSubstr;
namespace fs = std::filesystem;
using Plugins = std::map<std::string, FakeKubelet::Plugin>;

constexpr char kGpu[] = "tessera.io/gpu";
constexpr char kShare[] = "tessera.io/gpu-share";

constexpr char kFakeNvml[] = TESSERA_TEST_FAKES_DIR "/nvml-full/libnvidia-ml.so.1";

using tessera::test::Uuid;

class AgentE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short: a unix socket's path has at most 107 bytes.
    static int n = 0;
    dir_ = ::testing::TempDir() + "ag" + std::to_string(++n);
    fs::remove_all(dir_);
    for (const char* sub : {"/dp", "/pr", "/state", "/cdi"}) fs::create_directories(dir_ + sub);
    // Four A100s; GPU 2 reports XID 79 (fallen off the bus) 1.5 s after the agent's nvmlInit.
    nlohmann::json scenario = tessera::test::FourA100s("550.54.15", /*xid=*/true);
    std::ofstream(dir_ + "/scenario.json") << scenario.dump();
  }
  void TearDown() override {
    StopAgent(SIGTERM);
    kubelet_.reset();
  }

  void StartKubelet() {
    if (!kubelet_)
      kubelet_ = std::make_unique<FakeKubelet>(dir_ + "/dp", dir_ + "/pr/kubelet.sock");
    kubelet_->Start();
  }
  // `nvml`: the library named with --nvml-library; empty: none named (the driver root's).
  void StartAgent(const std::string& extra = "", const std::string& nvml = kFakeNvml) {
    // Hermetic: no API server unless a test names one with --kubeconfig.
    std::string cmd = std::string(
                          "unset KUBECONFIG KUBERNETES_SERVICE_HOST TESSERA_NVML_LIBRARY; "
                          "FAKE_NVML_SCENARIO=") +
                      dir_ + "/scenario.json exec setpriv --pdeathsig TERM " + TESSERA_BINARY +
                      " agent " + (nvml.empty() ? "" : "--nvml-library " + nvml) +
                      " --node-name node-a --device-plugin-dir " + dir_ +
                      "/dp --pod-resources-socket " + dir_ + "/pr/kubelet.sock --state-dir " +
                      dir_ + "/state --cdi-dir " + dir_ + "/cdi --metrics-address '' " +
                      "--shares-per-gpu 4 --health-recovery 0.5 --health-probe 0.1 " + extra +
                      " >>" + dir_ + "/agent.log 2>&1";
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    ASSERT_EQ(posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ),
              0);
  }
  void StopAgent(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string Log() const { return tessera::test::ReadFile(dir_ + "/agent.log"); }
  // Waits for `registrations` in all and a device list from both resources since the last.
  bool WaitRegistered(int registrations) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (kubelet_->registrations() < registrations && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return kubelet_->registrations() >= registrations &&
           kubelet_->WaitFor(
               [&](const Plugins& p) {
                 return p.contains(kGpu) && p.contains(kShare) && p.at(kGpu).lists > 0 &&
                        p.at(kShare).lists > 0;
               },
               std::chrono::seconds(15));
  }
  // The kubelet and an agent that releases an ended pod's devices at its next reconcile (every
  // 0.1 s), with `api` as its API server (node-a there).
  void StartReleasingAgent(FakeApiServer& api) {
    api.Put("/api/v1/nodes", {{"metadata", {{"name", "node-a"}}}});
    StartKubelet();
    StartAgent("--reconcile-interval 0.1 --release-grace 0 --kubeconfig " +
               api.WriteKubeconfig(dir_ + "/kubeconfig"));
    ASSERT_TRUE(WaitRegistered(2)) << Log();
  }
  // Wall time in whole seconds, as the agent counts allocations' ages.
  static int64_t UnixNow() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  std::string Metrics() {
    tessera::net::HttpClient c(dir_ + "/state/agent.sock");
    auto r = c.Send("GET", "/metrics");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->body : "";
  }

  std::string dir_;
  pid_t pid_ = -1;
  std::unique_ptr<FakeKubelet> kubelet_;
};

TEST_F(AgentE2e, RegistersListsDevicesAndReportsAnXidAsUnhealthyUntilRecovery) {
  StartKubelet();
  StartAgent();
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  Plugins p = kubelet_->plugins();
  EXPECT_EQ(p.at(kGpu).request.version(), "v1beta1");
  EXPECT_EQ(p.at(kGpu).request.endpoint(), "tessera-gpu.sock");
  EXPECT_TRUE(p.at(kGpu).options.get_preferred_allocation_available());
  ASSERT_EQ(p.at(kGpu).devices.size(), 4u);
  EXPECT_EQ(p.at(kGpu).devices[3].id(), Uuid(3));
  EXPECT_EQ(p.at(kGpu).devices[3].topology().nodes(0).id(), 1);
  EXPECT_EQ(p.at(kShare).devices.size(), 16u);
  EXPECT_TRUE(kubelet_->register_errors().empty());
  // The XID: GPU 2 Unhealthy in both resources, then Healthy again after the quiet period.
  ASSERT_TRUE(kubelet_->WaitFor([](const Plugins& p) {
    return p.at(kGpu).ever_unhealthy.contains(Uuid(2)) &&
           p.at(kShare).ever_unhealthy.contains(Uuid(2) + "::0");
  })) << Log();
  EXPECT_EQ(kubelet_->plugins().at(kGpu).ever_unhealthy.size(), 1u);
  ASSERT_TRUE(kubelet_->WaitFor([](const Plugins& p) {
    return p.at(kGpu).devices.size() == 4 && p.at(kGpu).devices[2].health() == "Healthy";
  })) << Log();
  std::string log = Log();
  EXPECT_THAT(log, HasSubstr("unhealthy: XID 79"));
  EXPECT_THAT(log, HasSubstr("healthy again"));
  // The node's CDI spec names every GPU.
  std::string cdi = tessera::test::ReadFile(dir_ + "/cdi/tessera.io-gpu.json");
  EXPECT_THAT(cdi, HasSubstr(Uuid(3)));
}

TEST_F(AgentE2e, AllocatesWholeGpusWithCdiAndSharesWithTheInterceptLibrary) {
  StartKubelet();
  StartAgent();
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  std::vector<std::string> preferred;
  ASSERT_TRUE(
      kubelet_->Preferred(kGpu, {Uuid(0), Uuid(1), Uuid(2), Uuid(3)}, {Uuid(3)}, 2, &preferred)
          .ok());
  EXPECT_THAT(preferred, ::testing::UnorderedElementsAre(Uuid(2), Uuid(3)));  // same NUMA node
  v1beta1::AllocateResponse whole;
  grpc::Status s = kubelet_->Allocate(kGpu, {{Uuid(0), Uuid(1)}}, &whole);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const auto& c = whole.container_responses(0);
  EXPECT_EQ(c.cdi_devices(0).name(), "tessera.io/gpu=" + Uuid(0));
  EXPECT_EQ(c.envs().at("NVIDIA_VISIBLE_DEVICES"), Uuid(0) + "," + Uuid(1));
  v1beta1::AllocateResponse share;
  s = kubelet_->Allocate(kShare, {{Uuid(3) + "::0"}}, &share);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const auto& sc = share.container_responses(0);
  EXPECT_EQ(sc.envs().at("LD_PRELOAD"), "/usr/local/lib/tessera/libtessera-cuda.so");
  EXPECT_EQ(sc.envs().at("TESSERA_CUDA_MEM_LIMIT"), "0:10737418240");  // a quarter of 40 GiB
  EXPECT_EQ(sc.envs().at("TESSERA_CUDA_COMPUTE_SHARE"), "25%");
  EXPECT_EQ(sc.envs().at("TESSERA_CUDA_ARBITER_GPUS"), "3");
  std::map<std::string, std::string> mounts;
  for (const auto& m : sc.mounts()) mounts[m.container_path()] = m.host_path();
  // Every host path handed to the runtime exists: the library, the region, the arbiter.
  for (const auto& [in, host] : mounts) EXPECT_TRUE(fs::exists(host)) << in << " <- " << host;
  EXPECT_THAT(mounts.at("/usr/local/lib/tessera/libtessera-cuda.so"),
              HasSubstr("libtessera-cuda.so"));
  // GPUs 0 and 1 are no longer offered as shares; GPU 3 no longer whole.
  ASSERT_TRUE(kubelet_->WaitFor([](const Plugins& p) {
    const auto& shares = p.at(kShare).devices;
    const auto& gpus = p.at(kGpu).devices;
    return shares.size() == 16 && shares[0].health() == "Unhealthy" &&
           shares[4].health() == "Unhealthy" && gpus[3].health() == "Unhealthy";
  })) << Log();
}

TEST_F(AgentE2e, BadAllocateRequestsGetAClearErrorAndTheAgentKeepsServing) {
  StartKubelet();
  StartAgent();
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  v1beta1::AllocateResponse out;
  grpc::Status s = kubelet_->Allocate(kGpu, {{"GPU-not-here"}}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown device ID 'GPU-not-here'"));
  s = kubelet_->Allocate(kGpu, {{Uuid(0), Uuid(1), Uuid(2), Uuid(3), "GPU-5"}}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = kubelet_->Allocate(kShare, {{Uuid(1)}}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not tessera.io/gpu-share"));
  EXPECT_THAT(Log(), HasSubstr("refused: unknown device ID 'GPU-not-here'"));
  // A 100 KB device ID (it killed the client's streams when echoed): refused, not echoed or logged.
  const std::string huge(100 * 1024, 'G');
  s = kubelet_->Allocate(kGpu, {{huge}}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "a device ID of 102400 bytes, over 256");
  EXPECT_EQ(Log().find(huge.substr(0, 1000)), std::string::npos) << "not in the log";
  // Still serving, and nothing was allocated by the refusals.
  s = kubelet_->Allocate(kGpu, {{Uuid(1)}}, &out);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::string checkpoint = tessera::test::ReadFile(dir_ + "/state/checkpoint.json");
  EXPECT_EQ(nlohmann::json::parse(checkpoint)["allocations"].size(), 1u);
}

TEST_F(AgentE2e, KubeletRestartDeletesTheSocketsAndTheAgentRegistersAgain) {
  StartKubelet();
  StartAgent();
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  kubelet_->Restart();
  ASSERT_TRUE(WaitRegistered(4)) << Log();
  EXPECT_EQ(kubelet_->registrations(), 4) << Log();
  EXPECT_TRUE(fs::exists(dir_ + "/dp/tessera-gpu.sock"));
  v1beta1::AllocateResponse out;
  EXPECT_TRUE(kubelet_->Allocate(kGpu, {{Uuid(0)}}, &out).ok());
}

TEST_F(AgentE2e, AKubeletThatIsNotUpYetIsWaitedFor) {
  StartAgent();
  // The agent serves before anyone registers it, and says it will try again. The kubelet starts
  // only once the agent has failed to register (before, it could come up between the agent's
  // sockets and its first try, and nothing would have been waited for).
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (Log().find("retrying") == std::string::npos && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_THAT(Log(), HasSubstr("retrying"));
  EXPECT_TRUE(fs::exists(dir_ + "/dp/tessera-gpu.sock")) << Log();
  StartKubelet();
  ASSERT_TRUE(WaitRegistered(2)) << Log();
}

// A host's driver as the agent's container sees it: mounted at <dir>/root (the DaemonSet's
// --driver-root), the GPU operator's containerized driver (/run/nvidia/driver on the host).
TEST_F(AgentE2e, TheDriverRootGivesNvmlAndTheCdiSpecNamesItsHostPaths) {
  const std::string root = dir_ + "/root", lib = root + "/usr/lib/x86_64-linux-gnu";
  fs::create_directories(lib);
  fs::create_directories(root + "/usr/bin");
  fs::copy_file(kFakeNvml, lib + "/libnvidia-ml.so.1");
  std::ofstream(lib + "/libcuda.so.1") << "x";
  std::ofstream(root + "/usr/bin/nvidia-smi") << "x";
  StartKubelet();
  StartAgent("--driver-root " + root + " --host-driver-root /run/nvidia/driver", /*nvml=*/"");
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  EXPECT_THAT(Log(), HasSubstr("NVML from the driver root: " + lib + "/libnvidia-ml.so.1"));
  const std::string text = tessera::test::ReadFile(dir_ + "/cdi/tessera.io-gpu.json");
  std::map<std::string, std::string> mounts;  // container path -> host path
  const nlohmann::json spec = nlohmann::json::parse(text);
  for (const auto& m : spec["containerEdits"]["mounts"])
    mounts[m["containerPath"].get<std::string>()] = m["hostPath"].get<std::string>();
  for (const char* p : {"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                        "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/bin/nvidia-smi"}) {
    EXPECT_EQ(mounts[p], std::string("/run/nvidia/driver") + p) << text;
  }
  EXPECT_EQ(mounts.size(), 3u) << text;
  EXPECT_EQ(text.find(dir_), std::string::npos) << "a path of the agent's container: " << text;
}

TEST_F(AgentE2e, WithoutADriverItSaysSoTriesAgainAndStartsWhenItComes) {
  const std::string root = dir_ + "/root", lib = root + "/usr/lib/x86_64-linux-gnu";
  fs::create_directories(lib);
  auto wait_log = [&](const std::string& what) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (Log().find(what) == std::string::npos && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return Log().find(what) != std::string::npos;
  };
  // A stop while it waits for the driver ends it at once, cleanly.
  StartAgent("--driver-root " + root, /*nvml=*/"");
  ASSERT_TRUE(wait_log("trying again in 1 s")) << Log();
  EXPECT_THAT(Log(), HasSubstr("no NVIDIA driver"));
  EXPECT_THAT(Log(), HasSubstr("nor in the driver root " + root));
  kill(pid_, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid_, &status, 0), pid_);
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_THAT(Log(), HasSubstr("stopping before the driver was found"));
  // Again; the driver comes (the GPU operator installed it) while the agent waits.
  fs::remove(dir_ + "/agent.log");
  StartKubelet();
  StartAgent("--driver-root " + root, /*nvml=*/"");
  ASSERT_TRUE(wait_log("trying again in 1 s")) << Log();
  EXPECT_EQ(kubelet_->registrations(), 0);
  fs::copy_file(kFakeNvml, lib + "/libnvidia-ml.so.1");
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  EXPECT_THAT(Log(), HasSubstr("NVML from the driver root"));
}

TEST_F(AgentE2e, AnAgentRestartKeepsEveryAllocationAndRegion) {
  StartKubelet();
  StartAgent();
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  v1beta1::AllocateResponse first;
  ASSERT_TRUE(kubelet_->Allocate(kShare, {{Uuid(1) + "::2", Uuid(1) + "::3"}}, &first).ok());
  std::string id = first.container_responses(0).annotations().at("tessera.io/allocation");
  StopAgent(SIGKILL);
  StartAgent();
  // The new process serves fresh sockets and registers both resources again; GPU 1, held in
  // shares before the restart, is still not offered whole.
  ASSERT_TRUE(WaitRegistered(4)) << Log();
  EXPECT_EQ(kubelet_->plugins().at(kGpu).devices[1].health(), "Unhealthy");
  EXPECT_THAT(Log(), HasSubstr("1 allocation(s) kept"));
  v1beta1::AllocateResponse again;
  ASSERT_TRUE(kubelet_->Allocate(kShare, {{Uuid(1) + "::3", Uuid(1) + "::2"}}, &again).ok());
  EXPECT_EQ(again.container_responses(0).annotations().at("tessera.io/allocation"), id);
}

TEST_F(AgentE2e, AnMpsGpusDaemonIsRunWatchedAndOutlivesTheAgentAndItsSharesAreItsClients) {
  const std::string control = TESSERA_TEST_FAKES_DIR "/mps/nvidia-cuda-mps-control";
  tessera::devices::MpsDaemons daemon(control, dir_ + "/state/mps", {{1, ""}});
  struct Quit {
    tessera::devices::MpsDaemons& d;
    ~Quit() { (void)d.Stop(1); }
  } quit{daemon};
  fs::create_directories(dir_ + "/shm");
  const std::string mps = "--mps-gpus 1 --mps-control " + control +
                          " --mps-check-interval 0.1 --mps-shm-dir " + dir_ + "/shm";
  StartKubelet();
  StartAgent(mps);
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  // GPU 1 is offered once its daemon, with its own folders, answers.
  ASSERT_TRUE(kubelet_->WaitFor([](const Plugins& p) {
    return p.at(kShare).devices.size() == 16 && p.at(kShare).devices[4].health() == "Healthy";
  })) << Log();
  EXPECT_TRUE(daemon.Check(1).ok()) << Log();
  // A share of GPU 1 is a client of its daemon; a share of GPU 3 is time-sliced.
  v1beta1::AllocateResponse share;
  grpc::Status s = kubelet_->Allocate(kShare, {{Uuid(1) + "::0"}}, &share);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const auto& sc = share.container_responses(0);
  EXPECT_EQ(sc.envs().at("CUDA_MPS_PIPE_DIRECTORY"), "/var/run/tessera/mps");
  EXPECT_EQ(sc.envs().at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
  EXPECT_EQ(sc.envs().at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=10240M");
  EXPECT_FALSE(sc.envs().contains("TESSERA_CUDA_ARBITER"));
  std::map<std::string, std::string> mounts;
  for (const auto& m : sc.mounts()) mounts[m.container_path()] = m.host_path();
  EXPECT_EQ(mounts.at("/var/run/tessera/mps"), daemon.PipeDir(1));
  EXPECT_TRUE(fs::exists(daemon.PipeDir(1) + "/control")) << "the daemon's socket";
  EXPECT_EQ(mounts.at("/dev/shm"), dir_ + "/shm");
  v1beta1::AllocateResponse sliced;
  ASSERT_TRUE(kubelet_->Allocate(kShare, {{Uuid(3) + "::0"}}, &sliced).ok());
  EXPECT_EQ(sliced.container_responses(0).envs().at("TESSERA_CUDA_ARBITER_GPUS"), "3");
  EXPECT_THAT(Metrics(), HasSubstr("tessera_gpu_mps_daemon_up{gpu=\"1\""));

  // The daemon dies: seen within the check interval, GPU 1 offered Unhealthy (for as long as the
  // new daemon takes to answer: here, milliseconds) and the death counted.
  pid_t pid = 0;
  std::ifstream(daemon.PipeDir(1) + "/nvidia-cuda-mps-control.pid") >> pid;
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const std::regex died("tessera_gpu_mps_daemon_deaths_total\\{gpu=\"1\"[^}]*\\} 1\n");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!std::regex_search(Metrics(), died) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(std::regex_search(Metrics(), died)) << Metrics() << Log();
  EXPECT_THAT(Log(), HasSubstr("its MPS daemon is down (the MPS control daemon stopped"));
  ASSERT_TRUE(kubelet_->WaitFor([](const Plugins& p) {
    return p.at(kShare).devices.size() == 16 && p.at(kShare).devices[5].health() == "Healthy";
  })) << Log();
  EXPECT_TRUE(daemon.Check(1).ok()) << "started again";

  // The agent stops (an upgrade): the daemon stays, for the pods that are its clients. An agent
  // started without GPU 1 in MPS mode tells it to quit.
  StopAgent(SIGTERM);
  EXPECT_TRUE(daemon.Check(1).ok()) << "outlives the agent";
  StartAgent("--mps-control " + control);
  ASSERT_TRUE(WaitRegistered(4)) << Log();
  EXPECT_FALSE(daemon.Check(1).ok()) << Log();
  EXPECT_THAT(Log(), HasSubstr("GPU 1 is no longer in MPS mode"));
}

TEST_F(AgentE2e, EndedPodsAreReleasedAndMetricsAreJoinedToPods) {
  StartKubelet();
  StartAgent("--reconcile-interval 0.1 --release-grace 0");
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  v1beta1::AllocateResponse out;
  ASSERT_TRUE(kubelet_->Allocate(kGpu, {{Uuid(0)}}, &out).ok());
  ASSERT_TRUE(kubelet_->Allocate(kShare, {{Uuid(3) + "::1"}}, &out).ok());
  ASSERT_TRUE(kubelet_->Allocate(kGpu, {{Uuid(1)}}, &out).ok());
  ASSERT_TRUE(kubelet_->WaitFor([](const Plugins& p) {
    const auto& s = p.at(kShare).devices;
    return s.size() == 16 && s[4].health() == "Unhealthy";
  })) << Log();
  kubelet_->SetPods({{"team-a", "train-0", "main", kGpu, {Uuid(0)}},
                     {"team-b", "notebook", "nb", kShare, {Uuid(3) + "::1"}}});
  // GPU 1's pod is not listed: once the grace is over it is released and offered in shares again.
  ASSERT_TRUE(kubelet_->WaitFor(
      [](const Plugins& p) {
        const auto& s = p.at(kShare).devices;
        return s.size() == 16 && s[4].health() == "Healthy" && s[0].health() == "Unhealthy";
      },
      std::chrono::seconds(10)))
      << Log();
  EXPECT_THAT(Log(), HasSubstr("ended: releasing"));
  std::string m = Metrics();
  EXPECT_THAT(m,
              HasSubstr("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"" + Uuid(0) + "\",pci_bus_id=\""));
  EXPECT_THAT(m, HasSubstr("\",device=\"nvidia0\",modelName=\""));
  EXPECT_THAT(m, HasSubstr("Hostname=\"node-a\",container=\"main\",namespace=\"team-a\","
                           "pod=\"train-0\"} 10"));  // GPU 0's utilization, 10%
  EXPECT_THAT(m, HasSubstr("tessera_gpu_healthy{gpu=\"0\",uuid=\"" + Uuid(0) + "\",model=\""));
  EXPECT_THAT(m, HasSubstr("\",hostname=\"node-a\",device=\"nvidia0\",container=\""));
  EXPECT_THAT(m, HasSubstr("DCGM_FI_DEV_GPU_TEMP{"));
  EXPECT_THAT(m, HasSubstr("container=\"nb\",namespace=\"team-b\",pod=\"notebook\"} 40"));
  EXPECT_THAT(m, HasSubstr("tessera_share_memory_limit_bytes{allocation=\"a2\",uuid=\"" + Uuid(3) +
                           "\",hostname=\"node-a\",container=\"nb\""));
  EXPECT_THAT(m, HasSubstr("tessera_agent_allocate_requests_total{result=\"ok\"} 3"));
  std::ofstream(dir_ + "/metrics.txt") << m;
  auto check = tessera::test::PromtoolCheck(dir_ + "/metrics.txt");
  EXPECT_EQ(check.code, 0) << check.out;
}

// An upgrade's kept arbiter file (<state>/gpu.arbiter.previous) stays while a share the agent still
// holds is in it - its container's processes run in a pid namespace of their own, where an idle
// one cannot be told from a gone one - and goes at a reconcile once that share is released.
TEST_F(AgentE2e, TheArbiterFileKeptByAnUpgradeStaysWhileItsSharesAreHeld) {
  StartKubelet();
  StartAgent("--reconcile-interval 0.1 --release-grace 0");
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  v1beta1::AllocateResponse out;
  ASSERT_TRUE(kubelet_->Allocate(kShare, {{Uuid(3) + "::1"}}, &out).ok());
  const std::string job = out.container_responses(0).envs().at("TESSERA_JOB_ID");
  // Its slot there: last used before this boot (a time past now), its process in another pid
  // namespace - by the times alone, nothing in it is live.
  const std::string previous = dir_ + "/state/gpu.arbiter.previous";
  {
    tessera::shim::Version5ArbiterFile v5(previous, 0600);
    ASSERT_TRUE(v5.ok());
    v5.Put(3, 0, tessera::shim::ArbiterJobKey(job.c_str()), 1'000'000,
           tessera::shim::Arbiter::NowMicros() + 3'600'000'000ull, 1,
           tessera::shim::PidNamespace() + 1);
  }
  // A whole GPU whose pod is gone is released at a reconcile - which tidied the file first.
  ASSERT_TRUE(kubelet_->Allocate(kGpu, {{Uuid(1)}}, &out).ok());
  kubelet_->SetPods({{"team-b", "notebook", "nb", kShare, {Uuid(3) + "::1"}}});
  const auto released_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Log().find("ended: releasing") == std::string::npos &&
         std::chrono::steady_clock::now() < released_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_THAT(Log(), HasSubstr("ended: releasing"));
  EXPECT_TRUE(fs::exists(previous)) << "kept while its share is held\n" << Log();
  // The share's pod ends: released, then the file goes.
  kubelet_->SetPods({});
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (fs::exists(previous) && std::chrono::steady_clock::now() < gone_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(fs::exists(previous)) << Log();
  EXPECT_THAT(Log(), HasSubstr("the one of before an upgrade is removed"));
}

// An ended share's use of the GPU memory it was given (its region's peak) and of its GPU time (the
// arbiter's charge against its share over its life) is told on its pod as a Normal Event, which
// outlives the pod in the API server, in the agent's log, and in its namespace's counters.
TEST_F(AgentE2e, AnEndedSharesPeakGpuMemoryIsToldOnItsPod) {
  FakeApiServer api;
  StartReleasingAgent(api);
  if (HasFatalFailure()) return;
  v1beta1::AllocateResponse out;
  const int64_t allocated = UnixNow();
  ASSERT_TRUE(kubelet_->Allocate(kShare, {{Uuid(3) + "::1"}}, &out).ok());
  kubelet_->SetPods({{"team-b", "notebook", "nb", kShare, {Uuid(3) + "::1"}}});
  // The pod's processes took 3 GiB at their peak, then gave it back.
  const std::string region = dir_ + "/state/regions/a1.region";
  char err[256] = "";
  tessera::shim::Region* r =
      tessera::shim::Region::Attach(region.c_str(), nullptr, 0, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  const uint64_t limit = r->Limit(0);
  ASSERT_GT(limit, 3ull << 30);
  ASSERT_TRUE(r->Reserve(0, 3ull << 30));
  r->Release(0, 3ull << 30);
  for (int i = 0; i < 300; ++i) r->CountLaunch();  // its kernel mix: 300 launches
  // Its processes' kernels kept GPU 3 busy 0.6 s in all, as the arbiter charged them (its key is
  // the allocation's id, TESSERA_JOB_ID).
  std::unique_ptr<tessera::shim::Arbiter> arbiter(
      tessera::shim::Arbiter::Attach((dir_ + "/state/gpu.arbiter").c_str(),
                                     tessera::shim::ArbiterJobKey("a1"), {}, err, sizeof err));
  ASSERT_NE(arbiter, nullptr) << err;
  const int slot = arbiter->Slot(3);
  ASSERT_GE(slot, 0);
  arbiter->data()->gpus[3].jobs[slot].busy_us.store(600'000);
  // And its launches waited 1 s for the GPU (other pods' slices): it wanted more than it got.
  arbiter->data()->gpus[3].jobs[slot].held_us.store(1'000'000);
  // The holder is seen (metrics), then the pod ends - once it has lived a whole second, so that
  // its GPU time is weighed against its life (the agent counts allocations' ages in seconds).
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return Metrics().find("pod=\"notebook\"") != std::string::npos && UnixNow() >= allocated + 2;
  })) << Log();
  // It ended (its pod object stays, Succeeded, as a Job's does).
  api.Put("/api/v1/namespaces/team-b/pods",
          {{"metadata", {{"name", "notebook"}, {"namespace", "team-b"}}},
           {"status", {{"phase", "Succeeded"}}}});
  kubelet_->SetPods({});
  // The note of the GPUShareUse Event of `type` on `pod`; empty while there is none.
  auto said = [&](const std::string& pod, const std::string& type) -> std::string {
    for (const nlohmann::json& e : api.List("/apis/events.k8s.io/v1/namespaces/team-b/events")) {
      if (e["regarding"]["name"] == pod && e["reason"] == "GPUShareUse" && e["type"] == type)
        return e["note"].get<std::string>();
    }
    return "";
  };
  auto note = [&] { return said("notebook", "Normal"); };
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !note().empty(); })) << Log();
  const std::string want = "its GPU share used a peak of 3072 MiB of the " +
                           std::to_string(limit >> 20) + " MiB given on " + Uuid(3);
  EXPECT_THAT(note(), HasSubstr(want));
  EXPECT_THAT(Log(), HasSubstr("allocation a1 (team-b/notebook): " + want));
  // Its GPU time against its life, and against its share of GPU 3 (1 of 4 devices: 25%).
  std::smatch held;
  const std::string told = note();
  ASSERT_TRUE(std::regex_search(told, held, std::regex("; 0.6 s of GPU time in its ([0-9]+) s")))
      << told;
  ASSERT_GE(std::stoi(held[1]), 1) << told;
  EXPECT_THAT(told, HasSubstr(fmt::format(" s ({:.0f}% of its 25% share)",
                                          100 * 0.6 / (std::stoi(held[1]) * 0.25))));
  EXPECT_THAT(told, HasSubstr(fmt::format("; its launches waited for the GPU {:.0f}% of the time",
                                          100 * 1.0 / std::stoi(held[1]))));
  // Its namespace's counters: GPU-seconds given and busy (their ratio, the namespace's efficiency).
  const std::string m = Metrics();
  EXPECT_THAT(m, HasSubstr("tessera_pod_gpu_busy_seconds_total{namespace=\"team-b\",resource="
                           "\"tessera.io/gpu-share\",hostname=\"node-a\"} 0.6"));
  EXPECT_THAT(m,
              HasSubstr(fmt::format("tessera_pod_gpu_given_seconds_total{{namespace=\"team-b\","
                                    "resource=\"tessera.io/gpu-share\",hostname=\"node-a\"}} {:g}",
                                    std::stoi(held[1]) * 0.25)));
  // And on the ended pod, for the extender's history (pods sized "auto"): what it measured.
  auto use_of = [&](const std::string& pod) -> std::string {
    auto p = api.Get("/api/v1/namespaces/team-b/pods", pod);
    if (!p) return "";
    return (*p)["metadata"]
        .value("annotations", nlohmann::json::object())
        .value("tessera.io/gpu-use", "");
  };
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !use_of("notebook").empty(); })) << Log();
  auto use = tessera::kube::ParseGpuUse(use_of("notebook"));
  ASSERT_TRUE(use.ok()) << use.status();
  EXPECT_EQ(use->seconds, std::stoi(held[1]));
  EXPECT_EQ(use->peak_mib, 3072);
  EXPECT_EQ(use->limit_mib, static_cast<int64_t>(limit >> 20));
  EXPECT_EQ(use->busy_permille, std::lround(1000 * 0.6 / std::stoi(held[1])));
  EXPECT_EQ(use->held_back_permille, std::lround(1000 * 1.0 / std::stoi(held[1])));
  EXPECT_GT(use->WantedPermille().value_or(0), *use->busy_permille)
      << "what it would have used, for its kind's history";
  EXPECT_FALSE(use->refused);
  EXPECT_EQ(use->kernel_launches, 300);
  EXPECT_THAT(Metrics(), HasSubstr("tessera_agent_pod_gpu_use_writes_total{result=\"ok\"} 1"));

  // A share whose limit refused an allocation: a Warning, with the most it asked. (On GPU 1: the
  // scenario's XID makes GPU 2 unhealthy a second or so after the agent starts.)
  {
    auto st = kubelet_->Allocate(kShare, {{Uuid(1) + "::1"}}, &out);
    ASSERT_TRUE(st.ok()) << st.error_message() << Log();
  }
  kubelet_->SetPods({{"team-b", "trainer", "tr", kShare, {Uuid(1) + "::1"}}});
  tessera::shim::Region* r2 = tessera::shim::Region::Attach(
      (dir_ + "/state/regions/a2.region").c_str(), nullptr, 0, err, sizeof err);
  ASSERT_NE(r2, nullptr) << err;
  ASSERT_TRUE(r2->Reserve(0, 1ull << 30));
  EXPECT_FALSE(r2->Reserve(0, r2->Limit(0)));
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return Metrics().find("pod=\"trainer\"") != std::string::npos;
  })) << Log();
  // A newer pod of its name runs already (a StatefulSet's): the ended one's use is not its own.
  api.Put("/api/v1/namespaces/team-b/pods",
          {{"metadata", {{"name", "trainer"}, {"namespace", "team-b"}}},
           {"status", {{"phase", "Running"}}}});
  kubelet_->SetPods({});
  auto warning = [&] { return said("trainer", "Warning"); };
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !warning().empty(); })) << Log();
  EXPECT_THAT(warning(), HasSubstr(fmt::format(
                             "1024 MiB of the {} MiB given on {} ({:.0f}%), and 1 allocation "
                             "refused at that limit (it asked for {} MiB at most)",
                             r2->Limit(0) >> 20, Uuid(1), 100.0 * 1024 / (r2->Limit(0) >> 20),
                             (r2->Limit(0) >> 20) + 1024)));
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return Log().find("pod team-b/trainer is Running: a newer pod of that name") !=
           std::string::npos;
  })) << Log();
  EXPECT_EQ(use_of("trainer"), "");
}

// An ended pod's whole GPU: how busy it was, its utilization sampled at every reconcile over the
// pod's life (the fake driver says 10% for GPU 0), told on the pod as a Normal Event and added to
// its namespace's counters.
TEST_F(AgentE2e, AnEndedWholeGpuPodsBusyShareIsToldOnItsPod) {
  FakeApiServer api;
  StartReleasingAgent(api);
  if (HasFatalFailure()) return;
  v1beta1::AllocateResponse out;
  const int64_t allocated = UnixNow();
  ASSERT_TRUE(kubelet_->Allocate(kGpu, {{Uuid(0)}}, &out).ok());
  kubelet_->SetPods({{"team-a", "train-0", "main", kGpu, {Uuid(0)}}});
  // It lives two seconds or more (sampled every 0.1 s), then ends.
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return UnixNow() >= allocated + 2; }));
  api.Put("/api/v1/namespaces/team-a/pods",
          {{"metadata", {{"name", "train-0"}, {"namespace", "team-a"}}},
           {"status", {{"phase", "Failed"}}}});
  kubelet_->SetPods({});
  auto note = [&]() -> std::string {
    for (const nlohmann::json& e : api.List("/apis/events.k8s.io/v1/namespaces/team-a/events")) {
      if (e["regarding"]["name"] == "train-0" && e["reason"] == "GPUUse" && e["type"] == "Normal")
        return e["note"].get<std::string>();
    }
    return "";
  };
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !note().empty(); })) << Log();
  const std::string told = note();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      told, m,
      std::regex("^its GPU was busy 10% of the time sampled \\(([0-9]+) s of its ([0-9]+) s, "
                 "every 0.1 s\\)$")))
      << told;
  const int held = std::stoi(m[2]);
  EXPECT_GE(held, 1);
  EXPECT_LE(std::stoi(m[1]), held + 1) << "sampled no longer than it lived";
  EXPECT_THAT(Log(), HasSubstr("allocation a1 (team-a/train-0): " + told));
  // Its namespace's counters: its GPU-seconds, and a tenth of them busy.
  const std::string metrics = Metrics();
  auto counter = [&](const std::string& name) {
    std::smatch v;
    const std::regex re(name +
                        "\\{namespace=\"team-a\",resource=\"tessera.io/gpu\","
                        "hostname=\"node-a\"\\} ([0-9.e+-]+)");
    return std::regex_search(metrics, v, re) ? std::stod(v[1]) : -1.0;
  };
  EXPECT_DOUBLE_EQ(counter("tessera_pod_gpu_given_seconds_total"), held) << metrics;
  EXPECT_NEAR(counter("tessera_pod_gpu_busy_seconds_total"), held * 0.1, 1e-9) << metrics;
  std::ofstream(dir_ + "/metrics.txt") << metrics;
  auto check = tessera::test::PromtoolCheck(dir_ + "/metrics.txt");
  EXPECT_EQ(check.code, 0) << check.out;
  // On the ended pod: its life and its busy share, for the extender's history.
  auto use = [&]() -> std::string {
    auto p = api.Get("/api/v1/namespaces/team-a/pods", "train-0");
    return p ? (*p)["metadata"]
                   .value("annotations", nlohmann::json::object())
                   .value("tessera.io/gpu-use", "")
             : "";
  };
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !use().empty(); })) << Log();
  EXPECT_EQ(use(), fmt::format(R"({{"busyPermille":100,"seconds":{}}})", held));
}

// A share's series have one identity for the allocation's life: none before a pod is seen
// holding it, its pod's labels from then on - also once the pod has left PodResources while the
// allocation waits out the release grace (it used to fall back to empty pod labels, a third
// series for one allocation).
TEST_F(AgentE2e, AShareKeepsItsPodsLabelsForItsWholeLife) {
  StartKubelet();
  StartAgent("--reconcile-interval 0.1 --release-grace 600");
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  v1beta1::AllocateResponse out;
  ASSERT_TRUE(kubelet_->Allocate(kShare, {{Uuid(1) + "::2"}}, &out).ok());
  EXPECT_THAT(Metrics(), Not(HasSubstr("tessera_share_memory_limit_bytes{")))
      << "no pod holds it yet";
  kubelet_->SetPods({{"team-c", "infer", "srv", kShare, {Uuid(1) + "::2"}}});
  const std::string held = "tessera_share_memory_limit_bytes{allocation=\"a1\",uuid=\"" + Uuid(1) +
                           "\",hostname=\"node-a\",container=\"srv\"," +
                           "namespace=\"team-c\",pod=\"infer\"}";
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Metrics().find(held) == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_THAT(Metrics(), HasSubstr(held));
  kubelet_->SetPods({});  // the pod ended; the allocation stays for the grace
  const std::string m = Metrics();
  EXPECT_THAT(m, HasSubstr(held));
  EXPECT_THAT(m, Not(HasSubstr("tessera_share_memory_limit_bytes{allocation=\"a1\",uuid=\"" +
                               Uuid(1) + "\",hostname=\"node-a\",container=\"\"")));
}

nlohmann::json PendingPod(const std::string& name, const std::vector<std::string>& gpus) {
  nlohmann::json assignment = {
      {"node", "node-a"},
      {"assignedAt", 1},
      {"containers",
       {{{"container", "main"}, {"resource", kGpu}, {"gpus", gpus}, {"count", gpus.size()}}}}};
  return {{"metadata",
           {{"name", name}, {"annotations", {{"tessera.io/assignment", assignment.dump()}}}}},
          {"spec", {{"nodeName", "node-a"}}},
          {"status", {{"phase", "Pending"}}}};
}

std::string Label(FakeApiServer& api, const std::string& key) {
  auto node = api.Get("/api/v1/nodes", "node-a");
  if (!node) return "";
  const auto& labels = (*node)["metadata"].value("labels", nlohmann::json::object());
  return labels.contains(key) ? labels[key].get<std::string>() : "";
}

TEST_F(AgentE2e, LabelsTheNodeAndAllocatesTheExtendersChoice) {
  FakeApiServer api;
  api.Put("/api/v1/nodes",
          {{"metadata",
            {{"name", "node-a"},
             {"labels", {{"tessera.io/gpu.stale", "1"}, {"team", "vision"}}},
             {"annotations", {{"tessera.io/agent-labels", "tessera.io/gpu.stale"}}}}}});
  StartKubelet();
  StartAgent("--kubeconfig " + api.WriteKubeconfig(dir_ + "/kubeconfig"));
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Label(api, "tessera.io/gpu.count") == "4"; }))
      << Log();
  EXPECT_EQ(Label(api, "tessera.io/gpu.product"), "NVIDIA-A100-SXM4-40GB");
  EXPECT_EQ(Label(api, "tessera.io/gpu.memory"), "40960");
  EXPECT_EQ(Label(api, "tessera.io/driver.version"), "550.54.15");
  EXPECT_EQ(Label(api, "tessera.io/cuda.version"), "12.4");
  EXPECT_EQ(Label(api, "tessera.io/gpu.nvlink"), "false");
  EXPECT_EQ(Label(api, "tessera.io/gpu.stale"), "");  // ours before, not now: removed
  EXPECT_EQ(Label(api, "team"), "vision");            // not ours: kept
  // The scenario's XID on GPU 2 shows in the healthy count, and recovery too.
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Label(api, "tessera.io/gpu.healthy") == "3"; }))
      << Log();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Label(api, "tessera.io/gpu.healthy") == "4"; }))
      << Log();

  // The extender chose GPUs 1 and 3 (on different switches; the topology alone would not).
  api.Put("/api/v1/namespaces/team-a/pods", PendingPod("train", {Uuid(1), Uuid(3)}));
  std::vector<std::string> preferred;
  ASSERT_TRUE(
      kubelet_->Preferred(kGpu, {Uuid(0), Uuid(1), Uuid(2), Uuid(3)}, {}, 2, &preferred).ok());
  EXPECT_THAT(preferred, ::testing::UnorderedElementsAre(Uuid(1), Uuid(3)));
  v1beta1::AllocateResponse out;
  grpc::Status s = kubelet_->Allocate(kGpu, {{Uuid(0), Uuid(1)}}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("team-a/train"));
  EXPECT_THAT(s.error_message(), HasSubstr("the scheduler chose"));
  s = kubelet_->Allocate(kGpu, {{Uuid(3), Uuid(1)}}, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    auto pod = api.Get("/api/v1/namespaces/team-a/pods", "train");
    return pod && (*pod)["metadata"]["annotations"].value("tessera.io/allocated", "") == "0";
  })) << Log();
  EXPECT_THAT(Log(), HasSubstr("for pod team-a/train"));

  // A choice naming a GPU this node does not have: refused, said, and nothing changes.
  api.Put("/api/v1/namespaces/team-a/pods", PendingPod("lost", {"GPU-elsewhere"}));
  s = kubelet_->Allocate(kGpu, {{Uuid(0)}}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("'GPU-elsewhere', which is not on this node"));
  std::string checkpoint = tessera::test::ReadFile(dir_ + "/state/checkpoint.json");
  EXPECT_EQ(nlohmann::json::parse(checkpoint)["allocations"].size(), 1u);
  std::string m = Metrics();
  EXPECT_THAT(m, HasSubstr("tessera_agent_api_server_configured 1"));
  EXPECT_THAT(m, HasSubstr("tessera_agent_pod_hints_total{result=\"found\"}"));
  // Each refusal is a Warning Event on the pod the extender's choice named.
  auto event_on = [&](const std::string& pod) -> std::string {
    for (const nlohmann::json& e : api.List("/apis/events.k8s.io/v1/namespaces/team-a/events")) {
      if (e["regarding"]["name"] == pod && e["reason"] == "AllocateRefused" &&
          e["type"] == "Warning" && e["reportingController"] == "tessera.io/agent")
        return e["note"].get<std::string>();
    }
    return "";
  };
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return !event_on("lost").empty(); })) << Log();
  EXPECT_THAT(event_on("lost"), HasSubstr("which is not on this node"));
  EXPECT_THAT(event_on("train"), HasSubstr("the scheduler chose"));

  // deploy/'s RBAC for the agent grants exactly the (verb, resource) pairs it used here.
  std::set<std::string> used, granted;
  for (const auto& r : api.Requests()) {
    if (r.user == "tester" && !r.verb.empty()) used.insert(r.verb + " " + r.resource);
  }
  // NodeSync::SyncLabels gets the node when its node watch has not listed yet: whether this run's
  // first sync came before the watch's list is timing, so the fallback counts as used either way.
  used.insert("get nodes");
  for (const YAML::Node& doc :
       YAML::LoadAllFromFile(TESSERA_SOURCE_DIR "/deploy/base/rbac-agent.yaml")) {
    if (doc["kind"].as<std::string>() != "ClusterRole") continue;
    for (const YAML::Node& rule : doc["rules"]) {
      for (const YAML::Node& group : rule["apiGroups"]) {
        for (const YAML::Node& res : rule["resources"]) {
          // The fake names a resource of a named API group resource.group, as RBAC means it.
          const std::string g = group.as<std::string>();
          const std::string r = res.as<std::string>() + (g.empty() ? "" : "." + g);
          for (const YAML::Node& verb : rule["verbs"])
            granted.insert(verb.as<std::string>() + " " + r);
        }
      }
    }
  }
  EXPECT_EQ(used, granted);
}

TEST_F(AgentE2e, AnUnusableApiServerIsLoggedAndTheKubeletIsStillServed) {
  // An unreadable kubeconfig: said once, and the device plugin works without labels or hints.
  StartKubelet();
  StartAgent("--kubeconfig " + dir_ + "/no-such-kubeconfig");
  ASSERT_TRUE(WaitRegistered(2)) << Log();
  EXPECT_THAT(Log(), HasSubstr(dir_ + "/no-such-kubeconfig"));
  v1beta1::AllocateResponse out;
  EXPECT_TRUE(kubelet_->Allocate(kGpu, {{Uuid(0)}}, &out).ok());
  EXPECT_THAT(Metrics(), HasSubstr("tessera_agent_api_server_configured 0"));
  EXPECT_THAT(Metrics(), Not(HasSubstr("tessera_agent_node_labels_current")))
      << "no API server: no labels to be current, and no 0 that reads as a failure";
  StopAgent(SIGTERM);

  // An API server that answers garbage: errors counted and logged, Allocate still answers.
  FakeApiServer api;
  api.SetGarbage(true);
  StartAgent("--kubeconfig " + api.WriteKubeconfig(dir_ + "/kubeconfig"));
  ASSERT_TRUE(WaitRegistered(4)) << Log();
  ASSERT_TRUE(FakeApiServer::WaitFor([&] {
    return Metrics().find("tessera_agent_node_label_errors_total 0") == std::string::npos;
  })) << Log();
  EXPECT_TRUE(kubelet_->Allocate(kGpu, {{Uuid(1)}}, &out).ok());
  EXPECT_THAT(Log(), HasSubstr("not JSON"));
  EXPECT_THAT(Metrics(), HasSubstr("tessera_agent_node_labels_current 0"));
  // Once it answers properly the node is labelled without a restart.
  api.Put("/api/v1/nodes", {{"metadata", {{"name", "node-a"}}}});
  api.SetGarbage(false);
  ASSERT_TRUE(FakeApiServer::WaitFor([&] { return Label(api, "tessera.io/gpu.count") == "4"; },
                                     std::chrono::seconds(60)))
      << Log();
}

TEST_F(AgentE2e, BadFlagsAndAMissingPluginFolderAreExitCodesWithReasons) {
  auto r = tessera::test::Capture(std::string(TESSERA_BINARY) +
                                  " agent --simulate t4x2 --shares-per-gpu 0 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--shares-per-gpu"));
  // More share pods on a GPU than the arbiter paces (64) would run the rest unpaced.
  r = tessera::test::Capture(std::string(TESSERA_BINARY) +
                             " agent --simulate t4x2 --shares-per-gpu 65 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--shares-per-gpu: Value 65 not in range 1 to 64"));
  r = tessera::test::Capture(std::string(TESSERA_BINARY) +
                             " agent --simulate t4x2 --label-resync 0 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--label-resync"));
  // An MPS GPU the machine does not have: refused before anything is written, started or served.
  r = tessera::test::Capture(std::string(TESSERA_BINARY) +
                             " agent --simulate t4x2 --mps-gpus 0,7 --state-dir " + dir_ +
                             "/mps-state --cdi-dir " + dir_ + "/cdi 2>&1");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--mps-gpus: mps.gpus: no GPU '7' on this machine (it has 2 GPUs"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/cdi/tessera.io-gpu.json")) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/mps-state/mps")) << "no daemon started";
  r = tessera::test::Capture(std::string(TESSERA_BINARY) + " agent --simulate t4x2 --state-dir " +
                             dir_ + "/state --cdi-dir '' --metrics-address '' " +
                             "--device-plugin-dir " + dir_ + "/nope 2>&1");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr(dir_ + "/nope"));
  r = tessera::test::Capture(std::string(TESSERA_BINARY) + " agent --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--device-plugin-dir", "--pod-resources-socket", "--shares-per-gpu",
                           "--shim-library", "--health-recovery", "--metrics-address",
                           "--kubeconfig", "--no-api-server", "--label-resync"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
}

}  // namespace
