// Kubernetes scheduling end to end, without a cluster, on the real wires: the fake API server, two
// GPU nodes each with its own fake NVML, fake kubelet and `tessera agent` process, one
// `tessera extender` process, and this test playing kube-scheduler (filter, prioritize, bind, in
// its order and JSON, with NodeNames) and each node's kubelet (GetPreferredAllocation, Allocate).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "../capture.h"
#include "absl/strings/escaping.h"
#include "daemon.h"
#include "fake_apiserver.h"
#include "fake_kubelet.h"
#include "nlohmann/json.hpp"
#include "prometheus.h"
#include "tessera/net/http.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"
#include "tessera/slurm/node.h"
#include "tessera/slurm/step.h"
#include "yaml-cpp/yaml.h"

extern char** environ;

namespace {

using nlohmann::json;
using tessera::fakes::FakeApiServer;
using tessera::test::FakeKubelet;
using ::testing::HasSubstr;
namespace fs = std::filesystem;
using Plugins = std::map<std::string, FakeKubelet::Plugin>;

constexpr char kGpu[] = "tessera.io/gpu";
constexpr char kShare[] = "tessera.io/gpu-share";
constexpr char kPods[] = "/api/v1/namespaces/";

std::string Uuid(char node, int i) {
  return std::string("GPU-0000000") + node + "-0000-0000-0000-00000000000" + std::to_string(i);
}

// `cmd` runs the binaries under `setpriv --pdeathsig TERM`: should this test process die before its
// TearDown, they are stopped too instead of living on.
pid_t Spawn(const std::string& cmd) {
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) {
    return -1;
  }
  return pid;
}

void Stop(pid_t& pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

bool Until(const std::function<bool()>& pred,
           std::chrono::seconds timeout = std::chrono::seconds(20)) {
  return FakeApiServer::WaitFor(pred, timeout);
}

class ExtenderE2e : public ::testing::Test {
 protected:
  struct Node {
    std::string name;
    char letter = 'a';
    std::string dir;
    std::unique_ptr<FakeKubelet> kubelet;
    pid_t agent = -1;
  };

  void SetUp() override {
    static int n = 0;
    root_ = ::testing::TempDir() + "ex" + std::to_string(++n);
    fs::remove_all(root_);
    fs::create_directories(root_);
    kubeconfig_ = api_.WriteKubeconfig(root_ + "/kubeconfig");
    for (char c : {'a', 'b'}) {
      Node& node = nodes_[c - 'a'];
      node.name = std::string("node-") + c;
      node.letter = c;
      node.dir = root_ + "/" + c;  // short: unix socket paths have at most 107 bytes
      for (const char* sub : {"/dp", "/pr", "/state", "/cdi"})
        fs::create_directories(node.dir + sub);
      // The API server knows the nodes (kubelets registered them); the agents annotate them.
      api_.Put("/api/v1/nodes",
               {{"metadata", {{"name", node.name}}},
                {"status", {{"allocatable", {{"cpu", "32"}, {"memory", "128Gi"}}}}}});
    }
  }
  void TearDown() override {
    Stop(extender_);
    for (Node& n : nodes_) {
      Stop(n.agent);
      n.kubelet.reset();
    }
  }

  // Two A100-40GB per node; `xid_gpu` >= 0: that GPU of node-b reports XID 79 soon after start.
  // `model`: the GPUs' name; `metrics`: each agent's /metrics also on a TCP port (metrics_port).
  void StartNodes(int xid_gpu = -1, const std::string& model = "NVIDIA A100-SXM4-40GB",
                  bool metrics = false) {
    for (Node& node : nodes_) {
      json scenario = {{"driver_version", "550.54.15"}, {"cuda_driver_version", 12040}};
      for (int i = 0; i < 2; ++i) {
        scenario["devices"].push_back({{"uuid", Uuid(node.letter, i)},
                                       {"name", model},
                                       {"utilization", 30 + 10 * i},
                                       {"tensor_util", 25},
                                       {"memory_total", 42949672960},
                                       {"pci_bus_id", "00000000:1" + std::to_string(i) + ":00.0"},
                                       {"numa", 0},
                                       {"minor", i},
                                       {"nvswitch_links", 0}});
      }
      scenario["topology"] = {{0, 10}, {10, 0}};
      if (node.letter == 'b' && xid_gpu >= 0) {
        scenario["events"] = {{{"at_ms", 300}, {"device", xid_gpu}, {"type", 8}, {"data", 79}}};
      }
      std::ofstream(node.dir + "/scenario.json") << scenario.dump();
      node.kubelet = std::make_unique<FakeKubelet>(node.dir + "/dp", node.dir + "/pr/kubelet.sock");
      node.kubelet->Start();
      node.agent =
          Spawn(std::string("unset KUBECONFIG KUBERNETES_SERVICE_HOST; FAKE_NVML_SCENARIO=") +
                node.dir + "/scenario.json exec setpriv --pdeathsig TERM " + TESSERA_BINARY +
                " agent --nvml-library " +
                TESSERA_TEST_FAKES_DIR "/nvml-full/libnvidia-ml.so.1 --node-name " + node.name +
                " --kubeconfig " + kubeconfig_ + " --device-plugin-dir " + node.dir +
                "/dp --pod-resources-socket " + node.dir + "/pr/kubelet.sock --state-dir " +
                node.dir + "/state --cdi-dir " + node.dir + "/cdi --metrics-address " +
                (metrics ? "127.0.0.1:0" : "''") + " --shares-per-gpu 4 " +
                "--health-recovery 0 --health-probe 0.1 " + agent_flags_ + " >>" + node.dir +
                "/agent.log 2>&1");
      ASSERT_GT(node.agent, 0);
    }
    for (Node& node : nodes_) {
      ASSERT_TRUE(node.kubelet->WaitFor(
          [](const Plugins& p) {
            return p.contains(kGpu) && p.contains(kShare) && p.at(kGpu).lists > 0;
          },
          std::chrono::seconds(20)))
          << Log(node.dir + "/agent.log");
    }
  }

  // The TCP port of a node's agent's /metrics (StartNodes with metrics), from its log.
  int MetricsPort(const Node& node) {
    std::regex port_re(R"(metrics on \S+ \(port ([0-9]+)\))");
    int port = 0;
    EXPECT_TRUE(Until([&] {
      std::smatch m;
      std::string log = Log(node.dir + "/agent.log");
      if (!std::regex_search(log, m, port_re)) return false;
      port = std::stoi(m[1]);
      return true;
    })) << Log(node.dir + "/agent.log");
    return port;
  }

  void StartExtender() {
    extender_ = Spawn(
        std::string("unset KUBECONFIG KUBERNETES_SERVICE_HOST; exec setpriv --pdeathsig TERM ") +
        TESSERA_BINARY + " extender --kubeconfig " + kubeconfig_ +
        // As deploy/ runs it: HTTPS to the client certificate it issues kube-scheduler (kept in
        // its Secret), /metrics on a plain port of its own.
        " --listen 127.0.0.1:0 --tls-secret tessera-system/tessera-extender-tls --tls-dns "
        "localhost --metrics-listen 127.0.0.1:0 --quota-configmap tessera-system/tessera-quotas" +
        " --reservation-timeout 30 >>" + root_ + "/extender.log 2>&1");
    ASSERT_GT(extender_, 0);
    std::regex port_re("port ([0-9]+), HTTPS, client certificates of its CA only");
    std::regex metrics_re("/healthz on 127.0.0.1:0 .port ([0-9]+), HTTP");
    ASSERT_TRUE(Until([&] {
      std::smatch m, n;
      std::string log = Log(root_ + "/extender.log");
      if (!std::regex_search(log, m, port_re) || !std::regex_search(log, n, metrics_re))
        return false;
      port_ = std::stoi(m[1]);
      metrics_port_ = std::stoi(n[1]);
      return true;
    })) << Log(root_ + "/extender.log");
    // kube-scheduler's side: what its Secret volume holds (tlsConfig caFile, certFile, keyFile).
    auto secret = api_.Get("/api/v1/namespaces/tessera-system/secrets", "tessera-extender-tls");
    ASSERT_TRUE(secret.has_value());
    for (const char* key : {"ca.crt", "client.crt", "client.key"}) {
      std::string text;
      ASSERT_TRUE(absl::Base64Unescape((*secret)["data"][key].get<std::string>(), &text));
      std::ofstream(root_ + "/" + key) << text;
    }
    http_ = std::make_unique<tessera::net::HttpClient>("https://localhost:" + std::to_string(port_),
                                                       "", root_ + "/ca.crt", root_ + "/client.crt",
                                                       root_ + "/client.key");
    metrics_ = std::make_unique<tessera::net::HttpClient>("tcp://127.0.0.1:" +
                                                          std::to_string(metrics_port_));
    // Both nodes' GPUs known to the extender (the agents' annotations arrived).
    ASSERT_TRUE(Until([&] {
      return Metrics().find("tessera_extender_gpus{health=\"healthy\"} 4") != std::string::npos ||
             Metrics().find("tessera_extender_gpus{health=\"unhealthy\"} 1") != std::string::npos;
    })) << Metrics()
        << Log(root_ + "/extender.log");
  }

  static std::string Log(const std::string& path) { return tessera::test::ReadFile(path); }
  std::string Metrics() {
    auto r = metrics_->Send("GET", "/metrics");
    return r.ok() ? r->body : "";
  }
  json Post(const std::string& verb, const json& body) {
    auto r = http_->Send("POST", "/" + verb, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r.ok() ? r->status : 0, 200) << (r.ok() ? r->body : "");
    return r.ok() ? json::parse(r->body, nullptr, false) : json();
  }

  json PodSpec(const std::string& ns, const std::string& name, const char* resource, int count,
               json annotations = json::object(), json labels = json::object(), int priority = 0) {
    return {
        {"metadata",
         {{"name", name}, {"namespace", ns}, {"annotations", annotations}, {"labels", labels}}},
        {"spec",
         {{"schedulerName", "tessera"},
          {"priority", priority},
          {"containers",
           {{{"name", "main"},
             {"image", "train:1"},
             {"resources",
              {{"limits", {{resource, std::to_string(count)}}}, {"requests", {{"cpu", "1"}}}}}}}}}},
        {"status", {{"phase", "Pending"}}}};
  }

  // kube-scheduler's scheduling cycle for one pod: filter (NodeNames: both nodes), prioritize,
  // bind. The node, or "" when filter placed it nowhere (`why` then holds the answer).
  std::string Schedule(const json& pod, json* why = nullptr) {
    json names = {"node-a", "node-b"};
    json f = Post("filter", {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", names}});
    if (why) *why = f;
    if (!f["NodeNames"].is_array() || f["NodeNames"].size() != 1) return "";
    std::string node = f["NodeNames"][0];
    json scores = Post("prioritize", {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", names}});
    EXPECT_EQ(scores.size(), 2u);
    json b = Post("bind", {{"PodName", pod["metadata"]["name"]},
                           {"PodNamespace", pod["metadata"]["namespace"]},
                           {"PodUID", pod["metadata"]["uid"]},
                           {"Node", node}});
    EXPECT_EQ(b.value("Error", "x"), "") << b.dump();
    return node;
  }

  // The pod's assignment (written at bind) as its GPUs' UUIDs.
  std::set<std::string> Assigned(const std::string& ns, const std::string& name) {
    auto pod = api_.Get(kPods + ns + "/pods", name);
    if (!pod) return {};
    json a = json::parse((*pod)["metadata"]["annotations"].value("tessera.io/assignment", "{}"));
    std::set<std::string> out;
    for (const auto& c : a.value("containers", json::array())) {
      for (const auto& g : c["gpus"]) out.insert(g.get<std::string>());
    }
    return out;
  }

  // The node's kubelet admits the pod: GetPreferredAllocation over what its device list offers as
  // healthy, then Allocate with what the agent preferred.
  v1beta1::AllocateResponse Admit(const std::string& node_name, const char* resource, int count,
                                  grpc::Status* status) {
    Node& node = nodes_[node_name == "node-a" ? 0 : 1];
    std::vector<std::string> available;
    const Plugins plugins = node.kubelet->plugins();
    for (const auto& d : plugins.at(resource).devices) {
      if (d.health() == "Healthy") available.push_back(d.id());
    }
    std::vector<std::string> preferred;
    EXPECT_TRUE(node.kubelet->Preferred(resource, available, {}, count, &preferred).ok());
    v1beta1::AllocateResponse out;
    *status = node.kubelet->Allocate(resource, {preferred}, &out);
    return out;
  }

  FakeApiServer api_;
  std::string root_, kubeconfig_;
  std::string agent_flags_;  // more flags for the agents StartNodes starts
  Node nodes_[2];
  pid_t extender_ = -1;
  int port_ = 0, metrics_port_ = 0;
  std::unique_ptr<tessera::net::HttpClient> metrics_;
  std::unique_ptr<tessera::net::HttpClient> http_;
};

std::set<std::string> Split(const std::string& s) {
  std::set<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.insert(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

TEST_F(ExtenderE2e, WholeFractionalAndGangPodsRunOnTheGpusTheExtenderChose) {
  StartNodes();
  StartExtender();

  // Whole GPUs: the kubelet's Allocate gets exactly the GPUs the extender recorded.
  json train = api_.Put(std::string(kPods) + "ml/pods", PodSpec("ml", "train", kGpu, 2));
  std::string node = Schedule(train);
  ASSERT_FALSE(node.empty());
  std::set<std::string> chosen = Assigned("ml", "train");
  ASSERT_EQ(chosen.size(), 2u);
  grpc::Status s;
  auto whole = Admit(node, kGpu, 2, &s);
  ASSERT_TRUE(s.ok()) << s.error_message() << Log(root_ + "/" + node.back() + "/agent.log");
  EXPECT_EQ(Split(whole.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES")), chosen);

  // A share on the other node's GPUs (best fit: the first node is full), with the intercept
  // library.
  json small = api_.Put(std::string(kPods) + "ml/pods",
                        PodSpec("ml", "small", kShare, 1, {{"tessera.io/gpu-memory", "5Gi"}}));
  std::string share_node = Schedule(small);
  ASSERT_FALSE(share_node.empty());
  EXPECT_NE(share_node, node);
  std::set<std::string> share_gpu = Assigned("ml", "small");
  ASSERT_EQ(share_gpu.size(), 1u);
  auto share = Admit(share_node, kShare, 1, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const auto& envs = share.container_responses(0).envs();
  EXPECT_THAT(envs.at("LD_PRELOAD"), HasSubstr("libtessera-cuda.so"));
  int index = share_gpu.begin()->back() - '0';
  EXPECT_EQ(envs.at("TESSERA_CUDA_ARBITER_GPUS"), std::to_string(index));
  EXPECT_EQ(envs.at("NVIDIA_VISIBLE_DEVICES"), *share_gpu.begin());

  // A gang of two one-share pods (PodGroup, minMember 2): the first waits holding nothing; the
  // second completes it; both then get their reserved node.
  api_.Put("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups",
           {{"metadata", {{"name", "job"}, {"namespace", "ml"}}}, {"spec", {{"minMember", 2}}}});
  json labels = {{"scheduling.x-k8s.io/pod-group", "job"}};
  json w0 = api_.Put(std::string(kPods) + "ml/pods", PodSpec("ml", "w0", kShare, 1, {}, labels));
  json why;
  ASSERT_TRUE(Until([&] {
    Schedule(w0, &why);
    return why.dump().find("1 of 2 members") != std::string::npos;
  })) << why.dump();
  // The second member is queued as soon as the extender sees it (not at its first filter).
  json w1 = api_.Put(std::string(kPods) + "ml/pods", PodSpec("ml", "w1", kShare, 1, {}, labels));
  std::string n1 = Schedule(w1);
  ASSERT_FALSE(n1.empty());
  std::string n0 = Schedule(w0);
  ASSERT_FALSE(n0.empty());
  // Only the share's node has room (the other is full with `train`).
  EXPECT_EQ(n0, share_node);
  EXPECT_EQ(n1, share_node);
  ASSERT_EQ(Assigned("ml", "w0").size(), 1u);
  auto g0 = Admit(n0, kShare, 1, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(g0.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"),
            *Assigned("ml", "w0").begin());
  // The agents marked what they allocated.
  ASSERT_TRUE(Until([&] {
    auto pod = api_.Get(std::string(kPods) + "ml/pods", "train");
    return pod && (*pod)["metadata"]["annotations"].value("tessera.io/allocated", "") == "0";
  }));
  EXPECT_THAT(Log(root_ + "/extender.log"), HasSubstr("bound ml/train to " + node));
}

// Issue 58 across the processes: a share pod asking tessera.io/gpu-memory "auto" ends; its node's
// agent writes what its processes used on it (their peak, from the share's region), the extender
// learns it, and the next pod of its Job is sized from it - which reaches the kubelet's Allocate as
// the intercept library's limit.
TEST_F(ExtenderE2e, AnAutoPodIsSizedFromWhatTheLastOfItsKindUsed) {
  agent_flags_ = "--reconcile-interval 0.1 --release-grace 0";
  StartNodes();
  StartExtender();
  auto of_job = [&](const std::string& name) {
    json pod = PodSpec("ml", name, kShare, 1, {{"tessera.io/gpu-memory", "auto"}},
                       {{"batch.kubernetes.io/job-name", "infer"}});
    pod["spec"]["containers"][0]["command"] = {"python", "serve.py"};
    return api_.Put(std::string(kPods) + "ml/pods", pod);
  };
  json first = of_job("infer-1");
  const std::string node = Schedule(first);
  ASSERT_FALSE(node.empty());
  auto stored = api_.Get(std::string(kPods) + "ml/pods", "infer-1");
  EXPECT_THAT((*stored)["metadata"]["annotations"].value("tessera.io/sizing", ""),
              HasSubstr("no measured runs of its kind yet"));
  Node& n = nodes_[node == "node-a" ? 0 : 1];
  grpc::Status s;
  auto allocated = Admit(node, kShare, 1, &s);
  ASSERT_TRUE(s.ok()) << s.error_message() << Log(n.dir + "/agent.log");
  const std::string device = allocated.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES");
  std::string id;
  for (const auto& [k, v] : allocated.container_responses(0).annotations())
    if (k == "tessera.io/allocation") id = v;
  ASSERT_FALSE(id.empty());
  // Its processes held 3 GiB at their peak.
  char err[256] = "";
  tessera::shim::Region* r = tessera::shim::Region::Attach(
      (n.dir + "/state/regions/" + id + ".region").c_str(), nullptr, 0, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  ASSERT_TRUE(r->Reserve(0, 3ull << 30));
  r->Release(0, 3ull << 30);
  // The pod ran (PodResources lists it), then succeeded: the kubelet frees its device.
  const auto share_ids = n.kubelet->plugins().at(kShare).devices;
  std::string held;
  for (const auto& d : share_ids)
    if (d.id().rfind(device, 0) == 0) held = d.id();
  n.kubelet->SetPods({{"ml", "infer-1", "main", kShare, {held}}});
  ASSERT_TRUE(Until([&] {
    return Log(n.dir + "/agent.log").find("ml/infer-1") != std::string::npos;
  })) << Log(n.dir + "/agent.log");
  (*stored)["status"]["phase"] = "Succeeded";
  api_.Put(std::string(kPods) + "ml/pods", *stored);
  n.kubelet->SetPods({});
  ASSERT_TRUE(Until([&] {
    return Log(root_ + "/extender.log").find("pod ml/infer-1 ended; its kind") != std::string::npos;
  })) << Log(n.dir + "/agent.log")
      << Log(root_ + "/extender.log");
  auto ended = api_.Get(std::string(kPods) + "ml/pods", "infer-1");
  EXPECT_THAT((*ended)["metadata"]["annotations"].value("tessera.io/gpu-use", ""),
              HasSubstr("\"peakMiB\":3072"));
  // The next pod of the Job: 3072 MiB + 20%, rounded up to 256 MiB, is 3840 MiB - its limit.
  json second = of_job("infer-2");
  const std::string node2 = Schedule(second);
  ASSERT_FALSE(node2.empty());
  stored = api_.Get(std::string(kPods) + "ml/pods", "infer-2");
  EXPECT_THAT((*stored)["metadata"]["annotations"].value("tessera.io/sizing", ""),
              HasSubstr("gpu-memory 3840Mi: a peak of 3072MiB (p95 of ml's runs of 'infer'"));
  allocated = Admit(node2, kShare, 1, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(allocated.container_responses(0).envs().at("TESSERA_CUDA_MEM_LIMIT"),
              HasSubstr(std::to_string(3840ull << 20)));
}

TEST_F(ExtenderE2e, AQuotaBorrowerIsPreemptedWhenTheLenderReturns) {
  api_.Put("/api/v1/namespaces/tessera-system/configmaps",
           {{"metadata", {{"name", "tessera-quotas"}, {"namespace", "tessera-system"}}},
            {"data",
             {{"quotas.yaml",
               "namespaces:\n"
               "  team-a: {cohort: lab, guaranteed: {gpus: 2}, limit: {gpus: 4}}\n"
               "  team-b: {cohort: lab, guaranteed: {gpus: 2}}\n"}}}});
  StartNodes();
  StartExtender();
  // team-b is away: team-a fills all four GPUs, two of them borrowed.
  for (int i = 0; i < 4; ++i) {
    std::string name = "a" + std::to_string(i);
    json pod = api_.Put(std::string(kPods) + "team-a/pods", PodSpec("team-a", name, kGpu, 1));
    ASSERT_FALSE(Schedule(pod).empty()) << name;
  }
  // team-b comes back within its guarantee: a borrowed pod is evicted through the API server...
  json b0 = api_.Put(std::string(kPods) + "team-b/pods", PodSpec("team-b", "b0", kGpu, 1));
  json why;
  EXPECT_TRUE(Schedule(b0, &why).empty());
  ASSERT_TRUE(Until([&] { return api_.List(std::string(kPods) + "team-a/pods").size() == 3; }))
      << Log(root_ + "/extender.log");
  EXPECT_TRUE(Until([&] {
    return Log(root_ + "/extender.log").find("evicted team-a/") != std::string::npos;
  })) << Log(root_ + "/extender.log");
  // ...and once the extender has seen it go, team-b's pod takes its GPU.
  std::string node;
  ASSERT_TRUE(Until([&] { return !(node = Schedule(b0)).empty(); }))
      << Log(root_ + "/extender.log");
  grpc::Status s;
  auto out = Admit(node, kGpu, 1, &s);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr("tessera_extender_evictions_total{result=\"evicted\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("tessera_extender_quota_used_gpus{namespace=\"team-b\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("\ntessera_extender_api_server_up 1\n"));
  EXPECT_THAT(metrics, HasSubstr("tessera_build_info{component=\"extender\""));
  // The page is what Prometheus accepts, lint included.
  std::ofstream(root_ + "/metrics.txt") << metrics;
  auto check = tessera::test::Capture("promtool check metrics < " + root_ + "/metrics.txt 2>&1");
  EXPECT_EQ(check.code, 0) << check.out;
  // The API server answers nothing but 503 (its watches broken): said as such, not as an empty
  // cluster.
  api_.SetFailStatus(503);
  api_.CloseWatches();
  EXPECT_TRUE(Until([&] {
    return Metrics().find("\ntessera_extender_api_server_up 0\n") != std::string::npos;
  })) << Log(root_ + "/extender.log");
  api_.SetFailStatus(0);
  // Back: its next list or watch event says so (the real server sends a bookmark on every watch
  // about once a minute; here, as soon as the watches are open again).
  EXPECT_TRUE(Until([&] {
    api_.SendBookmarks();
    return Metrics().find("\ntessera_extender_api_server_up 1\n") != std::string::npos;
  })) << Log(root_ + "/extender.log");
}

// A gang of higher priority that fits nowhere has room made for all of its members at once: every
// low-priority pod in its way is evicted through the API server, nothing of the gang is placed
// until all are gone, then each member gets its own node's GPUs.
TEST_F(ExtenderE2e, AGangOfHigherPriorityPreemptsAsAWholeOnTheWire) {
  StartNodes();
  StartExtender();
  for (int i = 0; i < 4; ++i) {
    std::string name = "low" + std::to_string(i);
    json pod = api_.Put(std::string(kPods) + "batch/pods",
                        PodSpec("batch", name, kGpu, 1, {}, {}, /*priority=*/1));
    ASSERT_FALSE(Schedule(pod).empty()) << name;
  }
  api_.Put("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups",
           {{"metadata", {{"name", "big"}, {"namespace", "ml"}}}, {"spec", {{"minMember", 2}}}});
  json labels = {{"scheduling.x-k8s.io/pod-group", "big"}};
  json w0 = api_.Put(std::string(kPods) + "ml/pods",
                     PodSpec("ml", "w0", kGpu, 2, {}, labels, /*priority=*/100));
  json why;
  ASSERT_TRUE(Until([&] {
    Schedule(w0, &why);
    return why.dump().find("1 of 2 members") != std::string::npos;
  })) << why.dump();
  json w1 = api_.Put(std::string(kPods) + "ml/pods",
                     PodSpec("ml", "w1", kGpu, 2, {}, labels, /*priority=*/100));
  // Complete, it fits nowhere: the four low pods are evicted, and nothing is placed meanwhile.
  EXPECT_TRUE(Schedule(w1, &why).empty()) << why.dump();
  ASSERT_TRUE(Until([&] { return api_.List(std::string(kPods) + "batch/pods").empty(); }))
      << Log(root_ + "/extender.log");
  // Once the extender has seen them go, both members are placed, one per node.
  std::string n1, n0;
  ASSERT_TRUE(Until([&] { return !(n1 = Schedule(w1)).empty(); })) << Log(root_ + "/extender.log");
  n0 = Schedule(w0);
  ASSERT_FALSE(n0.empty());
  EXPECT_NE(n0, n1);
  grpc::Status s;
  for (const auto& [node, name] : {std::pair{n0, "w0"}, std::pair{n1, "w1"}}) {
    std::set<std::string> chosen = Assigned("ml", name);
    ASSERT_EQ(chosen.size(), 2u) << name;
    auto out = Admit(node, kGpu, 2, &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(Split(out.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES")), chosen);
  }
  EXPECT_THAT(Metrics(), HasSubstr("tessera_extender_evictions_total{result=\"evicted\"} 4"));
}

TEST_F(ExtenderE2e, AnUnhealthyGpuTakesNoNewPods) {
  StartNodes(/*xid_gpu=*/0);  // node-b's GPU 0 falls off the bus
  StartExtender();
  ASSERT_TRUE(Until([&] {
    return Metrics().find("tessera_extender_gpus{health=\"unhealthy\"} 1") != std::string::npos;
  })) << Metrics();
  std::set<std::string> used;
  for (int i = 0; i < 3; ++i) {
    std::string name = "p" + std::to_string(i);
    json pod = api_.Put(std::string(kPods) + "ml/pods", PodSpec("ml", name, kGpu, 1));
    ASSERT_FALSE(Schedule(pod).empty()) << name;
    for (const auto& g : Assigned("ml", name)) used.insert(g);
  }
  EXPECT_FALSE(used.contains(Uuid('b', 0)));
  EXPECT_EQ(used.size(), 3u);
  json last = api_.Put(std::string(kPods) + "ml/pods", PodSpec("ml", "p3", kGpu, 1));
  json why;
  EXPECT_TRUE(Schedule(last, &why).empty());
  EXPECT_THAT(why["FailedNodes"].dump(), HasSubstr("unhealthy")) << why.dump();
}

// Bad flags are exit 2 with the flag or the value named; nothing is served.
TEST_F(ExtenderE2e, BadFlagsAreExitTwoNamingWhatIsWrong) {
  const std::string run = std::string("unset KUBECONFIG KUBERNETES_SERVICE_HOST; ") +
                          TESSERA_BINARY + " extender --listen 127.0.0.1:0 ";
  struct Case {
    std::string flags;
    std::string says;
  };
  for (const Case& c : {
           Case{"--kubeconfig " + kubeconfig_ + " --policies nosuch", "--policies"},
           Case{"--kubeconfig " + kubeconfig_ + " --quota-configmap no-slash",
                "quota ConfigMap 'no-slash': expected namespace/name"},
           Case{"--kubeconfig " + kubeconfig_ + " --tls-cert " + root_ + "/x.crt",
                "TLS needs both a certificate and its key"},
           Case{"--kubeconfig " + kubeconfig_ + " --tls-cert " + root_ + "/x.crt --tls-key " +
                    root_ + "/x.key",
                root_ + "/x.crt"},
           Case{"--kubeconfig " + kubeconfig_ + " --reservation-timeout 0",
                "--reservation-timeout"},
           Case{"--kubeconfig " + root_ + "/missing", root_ + "/missing"},
           Case{"--kubeconfig " + kubeconfig_ + " --tls-secret no-slash",
                "--tls-secret takes namespace/name"},
           Case{"--kubeconfig " + kubeconfig_ + " --tls-secret ns/x --tls-cert " + root_ + "/x.crt",
                "replaces --tls-cert, --tls-key and --client-ca"},
           Case{"--kubeconfig " + kubeconfig_ + " --webhook-configuration tessera-auto-share",
                "--webhook-configuration sets the CA of --tls-secret"},
           Case{"--kubeconfig " + kubeconfig_ + " --webhook-listen 127.0.0.1:0",
                "--webhook-listen: the API server calls admission webhooks over HTTPS only"},
       }) {
    auto r = tessera::test::Capture(run + c.flags + " 2>&1");
    EXPECT_EQ(r.code, 2) << c.flags << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.says)) << c.flags;
  }
}

// The Grafana dashboards in deploy/grafana, against a real Prometheus scraping what they read: two
// agents (H100s on the fake NVML, pods holding GPUs and a share), the extender (after scheduling,
// with quotas) and a standalone server (a running and an ended job). Every panel's expression and
// every variable's query runs, names only metrics some target exports, and groups or matches only
// by labels those series have (a panel grouped by a label nobody has draws one unlabeled line).
TEST_F(ExtenderE2e, GrafanaDashboardsReadOnlyMetricsAndLabelsThatExist) {
  if (!tessera::test::HavePrometheus()) GTEST_SKIP() << "no prometheus binary here";
  api_.Put("/api/v1/namespaces/tessera-system/configmaps",
           {{"metadata", {{"name", "tessera-quotas"}, {"namespace", "tessera-system"}}},
            {"data", {{"quotas.yaml", "namespaces:\n  ml: {guaranteed: {gpus: 2}}\n"}}}});
  agent_flags_ = "--reconcile-interval 0.1 --release-grace 0";  // an ended pod released at once
  StartNodes(-1, "NVIDIA H100 80GB HBM3", /*metrics=*/true);
  StartExtender();
  json train = api_.Put(std::string(kPods) + "ml/pods", PodSpec("ml", "train", kGpu, 1));
  const std::string node = Schedule(train);
  ASSERT_FALSE(node.empty());
  // Its kubelet admits it and lists it in PodResources; a notebook takes a share beside it.
  Node& n = nodes_[node == "node-a" ? 0 : 1];
  v1beta1::AllocateResponse out;
  ASSERT_TRUE(n.kubelet->Allocate(kGpu, {{Uuid(n.letter, 0)}}, &out).ok());
  ASSERT_TRUE(n.kubelet->Allocate(kShare, {{Uuid(n.letter, 1) + "::1"}}, &out).ok());
  // And a short one ends beside them: the efficiency counters of ended pods.
  ASSERT_TRUE(n.kubelet->Allocate(kShare, {{Uuid(n.letter, 1) + "::2"}}, &out).ok());
  n.kubelet->SetPods({{"ml", "train", "main", kGpu, {Uuid(n.letter, 0)}},
                      {"lab", "notebook", "nb", kShare, {Uuid(n.letter, 1) + "::1"}},
                      {"lab", "short", "job", kShare, {Uuid(n.letter, 1) + "::2"}}});
  tessera::net::HttpClient agent_metrics("tcp://127.0.0.1:" + std::to_string(MetricsPort(n)));
  ASSERT_TRUE(Until([&] {
    auto m = agent_metrics.Send("GET", "/metrics");
    return m.ok() && m->body.find("pod=\"short\"") != std::string::npos;
  })) << Log(n.dir + "/agent.log");
  n.kubelet->SetPods({{"ml", "train", "main", kGpu, {Uuid(n.letter, 0)}},
                      {"lab", "notebook", "nb", kShare, {Uuid(n.letter, 1) + "::1"}}});
  // The standalone server, on the fake NVML too, with a job that ended and one that runs.
  const std::string scenario = root_ + "/server-nvml.json";
  std::ofstream(scenario) << json{{"devices",
                                   {{{"uuid", "GPU-5e4e4000-0000"},
                                     {"name", "NVIDIA H100 80GB HBM3"},
                                     {"utilization", 50}},
                                    {{"uuid", "GPU-5e4e4000-0001"},
                                     {"name", "NVIDIA H100 80GB HBM3"}}}}}
                                 .dump();
  setenv("FAKE_NVML_SCENARIO", scenario.c_str(), 1);
  tessera::test::Daemon server(
      "dashboards",
      std::string("nvml_library: ") + TESSERA_TEST_FAKES_DIR +
          "/nvml-full/libnvidia-ml.so.1\nfallback_simulate: \"\"\n"
          "tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n    - {token: scrape-0123456789abcdef, "
          "metrics_only: true}\n",
      "");
  unsetenv("FAKE_NVML_SCENARIO");
  server.WaitFor(server.Submit(tessera::test::Shell("true", {{"gpus", 1}})), "succeeded");
  const int64_t running = server.Submit(tessera::test::Shell("sleep 60", {{"gpus", 1}}));
  server.WaitFor(running, "running");
  const int64_t share = server.Submit(
      tessera::test::Shell("sleep 60", {{"gpu_share", "30%"}, {"gpu_memory", "1GiB"}}));
  server.WaitFor(share, "running");
  const std::string log = server.Log();
  const size_t at = log.find("tcp port ");
  ASSERT_NE(at, std::string::npos) << log;
  // A Slurm node's exporter (tessera slurm exporter, the real command) with a job of 1 of 4
  // shards on its GPU 1 and a whole-GPU job on GPU 0, as the SPANK plugin records them.
  const std::string slurm_state = root_ + "/slurm-state";
  std::ofstream(root_ + "/lib.so") << "";
  auto plugin = tessera::slurm::ParsePluginArgs({"library=" + root_ + "/lib.so", "shards_per_gpu=4",
                                                 "gpu_memory=8GiB", "state_dir=" + slurm_state});
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  auto shard = tessera::slurm::DecideLimits(*plugin, {.gpus = "1", .shards = "1"});
  auto whole = tessera::slurm::DecideLimits(*plugin, {.gpus = "0"});
  ASSERT_TRUE(shard.ok() && whole.ok());
  ASSERT_TRUE(
      tessera::slurm::SetUpStep(*plugin, 31, getuid(), getgid(), *shard, "", time(nullptr)).ok());
  ASSERT_TRUE(
      tessera::slurm::SetUpStep(*plugin, 32, getuid(), getgid(), *whole, "", time(nullptr)).ok());
  // Shard jobs that ended on GPU 1 after 100 s, 6 s of it busy (of the 25 GPU-seconds a quarter
  // held): one before Prometheus starts, one while it scrapes (the per-user counters' increase);
  // the second's memory limit refused an allocation.
  auto ended_shard = [&](uint32_t id, bool refuse) {
    const time_t now = time(nullptr);
    ASSERT_TRUE(
        tessera::slurm::SetUpStep(*plugin, id, getuid(), getgid(), *shard, "", now - 100).ok());
    char err[256] = "";
    const uint64_t limit[] = {shard->memory_bytes};
    std::unique_ptr<tessera::shim::Region> region(tessera::shim::Region::Attach(
        fmt::format("{}/regions/{}.region", slurm_state, id).c_str(), limit, 1, err, sizeof err));
    ASSERT_NE(region, nullptr) << err;
    if (refuse) {
      ASSERT_FALSE(region->Reserve(0, shard->memory_bytes + 1));
    }
    std::unique_ptr<tessera::shim::Arbiter> arbiter(tessera::shim::Arbiter::Attach(
        (slurm_state + "/arbiter/gpu.arbiter").c_str(),
        tessera::shim::ArbiterJobKey(fmt::format("slurm-{}", id).c_str()), {}, err, sizeof err));
    ASSERT_NE(arbiter, nullptr) << err;
    arbiter->data()->gpus[1].jobs[arbiter->Slot(1)].busy_us.store(6'000'000);
    ASSERT_TRUE(tessera::slurm::EndJob(*plugin, id, now).ok());
  };
  ended_shard(33, false);
  const std::string exporter_log = root_ + "/slurm-exporter.log";
  pid_t exporter = 0;
  {
    const std::string cmd = std::string("exec ") + TESSERA_BINARY +
                            " slurm exporter --listen 127.0.0.1:0 --state-dir " + slurm_state +
                            " 2> " + exporter_log;
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    ASSERT_EQ(
        posix_spawn(&exporter, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  }
  int exporter_port = 0;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       exporter_port == 0 && std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
    const std::string text = tessera::test::ReadFile(exporter_log);
    if (const size_t p = text.find("on port "); p != std::string::npos)
      exporter_port = std::atoi(text.c_str() + p + 8);
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  } reap{exporter};
  ASSERT_GT(exporter_port, 0) << tessera::test::ReadFile(exporter_log);

  // The agents and the extender scraped as deploy/components/monitoring/servicemonitor.yaml asks
  // the Operator to (honorLabels per endpoint: the agents' and the extender's "metrics" ports).
  const YAML::Node monitor = YAML::LoadFile(std::string(TESSERA_SOURCE_DIR) +
                                            "/deploy/components/monitoring/servicemonitor.yaml");
  std::map<std::string, bool> honor;
  for (const YAML::Node& e : monitor["spec"]["endpoints"])
    honor[e["port"].as<std::string>()] = e["honorLabels"].as<bool>(false);
  ASSERT_EQ(honor.size(), 1u) << "one plain metrics port, named alike on both Services";
  tessera::test::Prometheus prom(
      root_,
      {{"tessera-agent", "127.0.0.1:" + std::to_string(MetricsPort(nodes_[0])), "",
        honor["metrics"]},
       {"tessera-agent", "127.0.0.1:" + std::to_string(MetricsPort(nodes_[1])), "",
        honor["metrics"]},
       {"tessera-extender", "127.0.0.1:" + std::to_string(metrics_port_), "", honor["metrics"]},
       {"tessera-server", "127.0.0.1:" + std::to_string(std::stoi(log.substr(at + 9))),
        "scrape-0123456789abcdef"},
       {"tessera-slurm", "127.0.0.1:" + std::to_string(exporter_port), ""}});
  ASSERT_TRUE(prom.up()) << prom.Log();
  ASSERT_EQ(prom.Await("up == 1", 5).size(), 5u) << prom.Query("up").dump() << prom.Log();
  ASSERT_FALSE(prom.Await("tessera_job_gpu_share_ratio{job_id=\"slurm-31\"}").empty());
  // What the panels read, present: a pod's namespace on the agent's series, the share's memory,
  // tensor activity (GPM needs two readings), the server's job series.
  ASSERT_FALSE(prom.Await("tessera_gpu_healthy{namespace=\"ml\"}").empty());
  ASSERT_FALSE(prom.Await("tessera_share_memory_used_bytes{namespace=\"lab\"}").empty());
  ASSERT_FALSE(prom.Await("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 4).empty());
  ASSERT_FALSE(prom.Await("tessera_job_gpu_share_ratio").empty());
  ASSERT_FALSE(prom.Await("tessera_job_usage_readable").empty());
  ASSERT_FALSE(prom.Await("tessera_extender_quota_used_gpus{namespace=\"ml\"}").empty());
  ASSERT_FALSE(prom.Await("tessera_pod_gpu_given_seconds_total{namespace=\"lab\"}").empty());

  // The agents' and the server's GPUs answer NVIDIA's own dashboard (4 GPUs on 2 nodes, 2 on the
  // server), and nothing arrives renamed (the agents' pod, namespace and container labels,
  // honored as the ServiceMonitor does).
  for (const std::string& problem : tessera::test::NvidiaDashboardProblems(prom, 6))
    ADD_FAILURE() << "agents and server: " << problem;
  for (const std::string& renamed : tessera::test::RenamedLabels(prom, "{job=~\"tessera-.*\"}"))
    ADD_FAILURE() << renamed;
  for (const char* file : {"tessera.json", "tessera-server.json", "tessera-slurm.json"}) {
    const bool slurm_board = std::string(file) == "tessera-slurm.json";
    std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/deploy/grafana/" + file);
    json board = json::parse(in, nullptr, false);
    ASSERT_TRUE(board.is_object()) << file;
    std::vector<std::pair<std::string, std::string>> exprs;  // (where, expression)
    for (const json& p : board["panels"]) {
      for (const json& t : p["targets"]) exprs.push_back({p["title"], t["expr"]});
    }
    for (const json& v : board["templating"]["list"]) {
      if (v.value("type", "") != "query") continue;
      // label_values(selector, label): the selector's series must carry the label.
      std::smatch m;
      const std::string q = v["query"]["query"];
      ASSERT_TRUE(std::regex_match(q, m, std::regex(R"(label_values\((.*), *(\w+)\))")))
          << file << ": variable " << v["name"] << ": " << q;
      exprs.push_back({"variable $" + v["name"].get<std::string>(),
                       "count by (" + m[2].str() + ") (" + m[1].str() + ")"});
    }
    ASSERT_GT(exprs.size(), 10u) << file;
    for (const auto& [where, expr] : exprs) {
      for (const std::string& problem : tessera::test::DashboardProblems(prom, expr)) {
        ADD_FAILURE() << file << ": " << where << ": " << expr << ": " << problem;
      }
      // A GPU is a host's: grouping by gpu without the host merges GPU 0 of every host.
      const std::regex by(R"(\bby\s*\(([^)]*)\))");
      for (auto it = std::sregex_iterator(expr.begin(), expr.end(), by);
           it != std::sregex_iterator(); ++it) {
        const std::string list = (*it)[1];
        if (where.rfind("variable", 0) != 0 && std::regex_search(list, std::regex(R"(\bgpu\b)")) &&
            !std::regex_search(list, std::regex(R"(\b[Hh]ostname\b)")))
          ADD_FAILURE() << file << ": " << where << ": groups by gpu without the host: " << expr;
      }
      // Slurm's board reads Slurm's jobs only: the server's job series carry no slurm_job_id.
      if (slurm_board && where.rfind("variable", 0) != 0) {
        const std::regex job_series(R"(\btessera_job_\w+(\{[^}]*\})?)");
        for (auto it = std::sregex_iterator(expr.begin(), expr.end(), job_series);
             it != std::sregex_iterator(); ++it) {
          if ((*it)[1].str().find("slurm_job_id!=\"\"") == std::string::npos)
            ADD_FAILURE() << file << ": " << where << ": not only Slurm's jobs: " << it->str();
        }
      }
      // Each source selectable: a panel on Tessera's own series keeps those of $component.
      if (!slurm_board && where.rfind("variable", 0) != 0 &&
          std::regex_search(expr, std::regex(R"(\btessera_(gpu|share|job|jobs|queue)_)")) &&
          expr.find("tessera_build_info{component=~\"$component\"}") == std::string::npos)
        ADD_FAILURE() << file << ": " << where << ": no $component filter: " << expr;
    }
  }

  // What the Slurm board draws, with the server's jobs of the same user beside them: its running
  // jobs hold 1.25 GPUs (a shard and a whole GPU; the server's 1.3 not counted), and as jobs end
  // the per-user panels rise by their figures (a shard's 6 of 25 GPU-seconds busy, 19 idle, a
  // refusal; a whole GPU's 100 GPU-seconds, held but not measured).
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/deploy/grafana/tessera-slurm.json");
  const json slurm_board = json::parse(in, nullptr, false);
  ASSERT_TRUE(slurm_board.is_object());
  const passwd* pw = getpwuid(getuid());
  const std::string me = pw != nullptr ? pw->pw_name : "uid:" + std::to_string(getuid());
  // Panel `title`'s target `k`, as Grafana asks it with every variable at All: each series' value.
  auto draws = [&](const std::string& title, size_t k = 0) {
    std::map<std::string, double> out;
    for (const json& p : slurm_board["panels"]) {
      if (p["title"] != title) continue;
      for (const json& s :
           prom.Query(tessera::test::WithVariables(p["targets"].at(k)["expr"].get<std::string>())))
        out[s["metric"].value("user", "") + " " + s["metric"].value("kind", "")] =
            std::stod(s["value"][1].get<std::string>());
      return out;
    }
    ADD_FAILURE() << "no panel " << title;
    return out;
  };
  EXPECT_EQ(draws("GPUs held by running jobs, by user"),
            (std::map<std::string, double>{{me + " ", 1.25}}));
  ASSERT_FALSE(prom.Await("tessera_slurm_acct_jobs_ended_total == 1").empty());
  ended_shard(34, true);
  // And a whole GPU's 100 s beside it: held, not measured (the busy panel reads measured time).
  ASSERT_TRUE(
      tessera::slurm::SetUpStep(*plugin, 35, getuid(), getgid(), *whole, "", time(nullptr) - 100)
          .ok());
  ASSERT_TRUE(tessera::slurm::EndJob(*plugin, 35, time(nullptr)).ok());
  const std::string busy = "Held GPU time used, by user (last day)";
  std::map<std::string, double> used = draws(busy);
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !(used[me + " "] > 0) && std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
    used = draws(busy);
  }
  // increase() scales both counters of one scrape alike: the ratios are the jobs' own.
  EXPECT_NEAR(used[me + " "], 6.0 / 25, 0.005)
      << prom.Query("tessera_slurm_acct_busy_gpu_seconds_total").dump();
  const double held =
      draws("GPU-hours ended jobs held, by user and kind (last day)")[me + " fractional"];
  EXPECT_GT(held, 0);
  EXPECT_NEAR(draws("GPU-hours held idle, by user (last day)")[me + " "] / held, 19.0 / 25, 0.005);
  EXPECT_GT(draws("Jobs ended, and refused at their GPU memory limit (last day)", 1)[me + " "], 0);

  for (int64_t id : {running, share})
    server.Call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
}

}  // namespace
