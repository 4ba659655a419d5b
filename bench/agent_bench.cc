// The node agent's device plugin, over real gRPC on unix sockets with the fake kubelet as client:
//  - Allocate latency on an 8-GPU node (whole GPUs, 1..8 per call; shares, 1..4 per call), each
//    call a new allocation (checkpoint fsynced before the answer), p50/p99;
//  - health: from a critical XID handed to the health watch by the device source to the Unhealthy
//    list arriving at the kubelet client, p50/p99 (NVML's own event delivery not included);
//  - Allocate with an API server (the fake one, over HTTP on loopback, 100 running pods on the
//    node): following the extender's choice for a pending pod, and for a pod the extender did not
//    place (its own pod watch tells; a fresh list of the node's pods when it has not shown it yet).
// Prints a table; no Google Benchmark (these are latencies of a whole path, not loops).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "fake_apiserver.h"
#include "fake_kubelet.h"
#include "spdlog/spdlog.h"
#include "tessera/agent/device_state.h"
#include "tessera/agent/node_sync.h"
#include "tessera/agent/plugin_server.h"
#include "tessera/core/clock.h"
#include "tessera/devices/health.h"
#include "tessera/devices/inventory.h"
#include "tessera/kube/gpu_annotations.h"

namespace {

using namespace tessera;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void Report(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  std::printf("%-46s n=%5zu  p50 %7.3f ms  p99 %7.3f ms  max %7.3f ms\n", what, v.size(), at(0.5),
              at(0.99), v.back());
}

// A device source whose health events are handed over by the benchmark.
class SignalSource : public devices::DeviceSource {
 public:
  absl::StatusOr<core::NodeInventory> Discover() override { return core::NodeInventory{}; }
  absl::StatusOr<std::vector<devices::HealthEvent>> WaitHealthEvents(
      std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    std::vector<devices::HealthEvent> out;
    out.swap(events_);
    return out;
  }
  absl::Status Probe(int) override { return absl::OkStatus(); }
  absl::StatusOr<devices::GpuTelemetry> ReadTelemetry(int) override {
    return devices::GpuTelemetry{};
  }
  void Push(devices::HealthEvent e) {
    std::lock_guard lock(mu_);
    events_.push_back(e);
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<devices::HealthEvent> events_;
};

}  // namespace

int main() {
  spdlog::set_level(spdlog::level::err);
  namespace fs = std::filesystem;
  std::string dir = fs::temp_directory_path() / ("tessera-agent-bench-" + std::to_string(getpid()));
  fs::create_directories(dir + "/dp");
  // Removed on every way out, early failures included.
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() { std::filesystem::remove_all(dir); }
  } remove_dir{dir};
  auto machine = devices::LoadSimulatedMachine("dgx-h100");
  if (!machine.ok()) return 1;
  const core::NodeInventory& inv = machine->inventory;
  std::ofstream(dir + "/shim.so") << "x";
  agent::PluginOptions o;
  o.state_dir = dir + "/state";
  o.shim_library = dir + "/shim.so";
  o.shares_per_gpu = 10;
  auto state = agent::DeviceState::Create(inv, o);
  if (!state.ok()) return 1;
  agent::PluginServerOptions so;
  so.plugin_dir = dir + "/dp";
  test::FakeKubelet kubelet(dir + "/dp", "");
  kubelet.Start();
  // The API-server phase sets `sync`; before it no hint is looked up.
  std::atomic<agent::NodeSync*> sync{nullptr};
  agent::PluginServer plugin(
      **state, so,
      [&](agent::Resource r, int count) -> std::optional<agent::PodHint> {
        agent::NodeSync* s = sync.load();
        return s ? s->Hint(r, count) : std::nullopt;
      },
      nullptr,
      [&](const agent::PodHint& h) {
        if (agent::NodeSync* s = sync.load()) s->Allocated(h);
      });
  if (!plugin.Start().ok()) return 1;
  kubelet.WaitFor([](const auto& p) {
    return p.contains("tessera.io/gpu") && p.at("tessera.io/gpu").lists > 0 &&
           p.contains("tessera.io/gpu-share") && p.at("tessera.io/gpu-share").lists > 0;
  });
  std::printf("agent_bench: %zu GPUs (%s), %d shares per GPU, state on %s\n", inv.gpus.size(),
              inv.source.c_str(), o.shares_per_gpu, dir.c_str());

  // Allocate: whole GPUs. Each call takes k GPUs starting at a rotating offset, so every call is a
  // new allocation (it replaces the older ones that held any of its IDs).
  std::vector<double> whole, shares;
  for (int i = 0; i < 2000; ++i) {
    int k = 1 + i % 8, start = (i * 3) % 8;
    std::vector<std::string> ids;
    for (int j = 0; j < k; ++j) ids.push_back(inv.gpus[(start + j) % 8].uuid);
    v1beta1::AllocateResponse out;
    auto t0 = Clock::now();
    grpc::Status s = kubelet.Allocate("tessera.io/gpu", {ids}, &out);
    whole.push_back(Ms(Clock::now() - t0));
    if (!s.ok()) {
      std::fprintf(stderr, "Allocate: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  Report("Allocate tessera.io/gpu (1-8 GPUs)", whole);
  // Shares need GPUs not held whole.
  (*state)->Release({}, INT64_MAX);
  for (int i = 0; i < 2000; ++i) {
    int k = 1 + i % 4, g = i % 8, first = (i / 8) % 6;
    std::vector<std::string> ids;
    for (int j = 0; j < k; ++j) ids.push_back(inv.gpus[g].uuid + "::" + std::to_string(first + j));
    v1beta1::AllocateResponse out;
    auto t0 = Clock::now();
    grpc::Status s = kubelet.Allocate("tessera.io/gpu-share", {ids}, &out);
    shares.push_back(Ms(Clock::now() - t0));
    if (!s.ok()) {
      std::fprintf(stderr, "Allocate shares: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  Report("Allocate tessera.io/gpu-share (1-4 shares)", shares);
  (*state)->Release({}, INT64_MAX);

  // Health: XID 79 on each GPU in turn, 25 rounds of 8; a fresh watch per round (its tracker keeps
  // a GPU sick until the quiet period passes), the devices put back to Healthy by hand.
  SignalSource source;
  core::SystemClock clock;
  std::vector<double> health;
  for (int round = 0; round < 25; ++round) {
    devices::HealthWatch watch(source, static_cast<int>(inv.gpus.size()), devices::HealthPolicy{},
                               clock, [&](int gpu, const devices::GpuHealth& h) {
                                 (*state)->SetHealth(gpu, h.healthy, h.reason);
                               });
    watch.Start();
    for (int g = 0; g < 8; ++g) {
      std::string uuid = inv.gpus[g].uuid;
      auto health_of = [&](const std::string& want) {
        return [&, want](const auto& p) {
          for (const auto& d : p.at("tessera.io/gpu").devices) {
            if (d.id() == uuid) return d.health() == want;
          }
          return false;
        };
      };
      auto t0 = Clock::now();
      source.Push({g, devices::HealthEvent::Kind::kXid, 79, "fell off the bus"});
      bool seen = kubelet.WaitFor(health_of("Unhealthy"));
      health.push_back(Ms(Clock::now() - t0));
      if (!seen) {
        std::fprintf(stderr, "Unhealthy never seen\n");
        return 1;
      }
      (*state)->SetHealth(g, true, "");
      kubelet.WaitFor(health_of("Healthy"));
    }
    watch.Stop();
  }
  Report("XID -> Unhealthy at the kubelet client", health);

  // The health rounds' watches are gone: every GPU healthy again for what follows.
  for (int g = 0; g < static_cast<int>(inv.gpus.size()); ++g) (*state)->SetHealth(g, true, "");

  // With an API server: 100 running pods on the node, then one pending pod at a time that the
  // extender placed on two GPUs.
  fakes::FakeApiServer api;
  const std::string node = "bench-node";
  api.Put("/api/v1/nodes", {{"metadata", {{"name", node}}}});
  for (int i = 0; i < 100; ++i) {
    api.Put("/api/v1/namespaces/bench/pods",
            {{"metadata", {{"name", "running-" + std::to_string(i)}}},
             {"spec", {{"nodeName", node}}},
             {"status", {{"phase", "Running"}}}});
  }
  kube::ClusterConfig kc;
  kc.server = api.url();
  kc.token = "test-token";
  auto client = kube::Client::Create(kc);
  if (!client.ok()) return 1;
  agent::NodeSyncOptions nso;
  nso.node_name = node;
  agent::NodeSync node_sync(**client, **state, nso);
  sync = &node_sync;
  std::vector<double> hinted, unhinted;
  for (int i = 0; i < 300; ++i) {
    int a = (i * 2) % 8, b = (i * 2 + 1) % 8;
    kube::Assignment asg;
    asg.node = node;
    asg.assigned_unix_ms = i + 1;
    asg.containers.push_back(
        {"main", "tessera.io/gpu", {inv.gpus[a].uuid, inv.gpus[b].uuid}, 2, {}, {}});
    std::string name = "pending-" + std::to_string(i);
    api.Put("/api/v1/namespaces/bench/pods",
            {{"metadata",
              {{"name", name},
               {"annotations", {{kube::kAssignmentAnnotation, kube::FormatAssignment(asg)}}}}},
             {"spec", {{"nodeName", node}}},
             {"status", {{"phase", "Pending"}}}});
    v1beta1::AllocateResponse out;
    auto t0 = Clock::now();
    grpc::Status s =
        kubelet.Allocate("tessera.io/gpu", {{inv.gpus[b].uuid, inv.gpus[a].uuid}}, &out);
    hinted.push_back(Ms(Clock::now() - t0));
    if (!s.ok()) {
      std::fprintf(stderr, "Allocate with a hint: %s\n", s.error_message().c_str());
      return 1;
    }
    api.Delete("/api/v1/namespaces/bench/pods", name);
  }
  Report("Allocate 2 GPUs, the extender's choice (API)", hinted);
  for (int i = 0; i < 300; ++i) {
    std::string name = "plain-" + std::to_string(i);
    api.Put("/api/v1/namespaces/bench/pods",
            {{"metadata", {{"name", name}}},
             {"spec",
              {{"nodeName", node},
               {"containers",
                {{{"name", "main"}, {"resources", {{"limits", {{"tessera.io/gpu", "1"}}}}}}}}}},
             {"status", {{"phase", "Pending"}}}});
    v1beta1::AllocateResponse out;
    auto t0 = Clock::now();
    grpc::Status s = kubelet.Allocate("tessera.io/gpu", {{inv.gpus[i % 8].uuid}}, &out);
    unhinted.push_back(Ms(Clock::now() - t0));
    if (!s.ok()) {
      std::fprintf(stderr, "Allocate without a hint: %s\n", s.error_message().c_str());
      return 1;
    }
    api.Delete("/api/v1/namespaces/bench/pods", name);
  }
  Report("Allocate 1 GPU, a pod not placed by it (API)", unhinted);
  sync = nullptr;
  plugin.Stop();
  node_sync.Stop();
  kubelet.Stop();
  return 0;
}
