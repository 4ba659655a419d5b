// The agent's DRA driver over real gRPC on unix sockets, the kubelet's side played by
// fake_dra_kubelet (registration, then NodePrepareResources / NodeUnprepareResources as the
// kubelet calls them), the claims read from the fake API server over HTTP on loopback:
//  - NodePrepareResources of a new claim with 1..8 whole GPUs (read the claim, write its CDI spec,
//    fsync the checkpoint), and of 1..4 shares of one GPU (its shared region created too);
//  - the same claim prepared again (a kubelet retry or restart: from the checkpoint);
//  - NodeUnprepareResources.
// Prints a table; no Google Benchmark (latencies of a whole path, not loops).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "fake_apiserver.h"
#include "fake_dra_kubelet.h"
#include "spdlog/spdlog.h"
#include "tessera/agent/dra_plugin.h"
#include "tessera/agent/dra_state.h"
#include "tessera/devices/inventory.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"

namespace {

using namespace tessera;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace dra = test::dra;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void Report(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  std::printf("%-52s n=%5zu  p50 %7.3f ms  p99 %7.3f ms  max %7.3f ms\n", what, v.size(), at(0.5),
              at(0.99), v.back());
}

constexpr char kClaims[] = "/apis/resource.k8s.io/v1/namespaces/bench/resourceclaims";

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::err);
  const int n = argc > 1 ? std::atoi(argv[1]) : 1000;
  const std::string dir =
      std::filesystem::temp_directory_path() / ("dra-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir + "/cdi");
  const std::string shim = dir + "/libtessera-cuda.so";
  std::ofstream(shim) << "not a library";
  auto machine = devices::LoadSimulatedMachine("dgx-h100");
  if (!machine.ok()) return 1;

  fakes::FakeApiServer api;
  auto config = kube::LoadKubeconfig(api.WriteKubeconfig(dir + "/kubeconfig"), "");
  auto client = kube::Client::Create(*config);
  if (!client.ok()) return 1;

  std::vector<double> whole, shares, again, unprepare;
  // One node's driver: GPUs in `share_gpus` published as 10 shares each, the others whole.
  auto phase = [&](const std::string& sub, std::set<int> share_gpus, bool share) {
    agent::PluginOptions p;
    p.shares_per_gpu = 10;
    p.state_dir = dir + "/" + sub + "/state";
    p.shim_library = shim;
    agent::DraOptions d;
    d.pool = "node-a";
    d.dir = dir + "/" + sub + "/kubelet/plugins/gpu.tessera.io";
    d.cdi_dir = dir + "/cdi";
    d.share_gpus = std::move(share_gpus);
    auto state = agent::DraState::Create(machine->inventory, p, d);
    if (!state.ok()) {
      std::fprintf(stderr, "%s\n", std::string(state.status().message()).c_str());
      std::exit(1);
    }
    agent::DraPlugin plugin(**state, client->get(), {.kubelet_dir = dir + "/" + sub + "/kubelet"});
    if (!plugin.Start().ok()) std::exit(1);
    test::FakeDraKubelet kubelet(dir + "/" + sub + "/kubelet");
    if (!kubelet.Register("gpu.tessera.io")) {
      std::fprintf(stderr, "%s\n", kubelet.why().c_str());
      std::exit(1);
    }
    for (int i = 0; i < n; ++i) {
      json results = json::array();
      const int count = share ? 1 + i % 4 : 1 + i % 8;
      for (int k = 0; k < count; ++k) {
        results.push_back(
            {{"request", "r"},
             {"driver", "gpu.tessera.io"},
             {"pool", "node-a"},
             {"device", share ? "gpu-7-share-" + std::to_string(k) : "gpu-" + std::to_string(k)}});
      }
      const std::string name = sub + std::to_string(i);
      json stored =
          api.Put(kClaims, {{"metadata", {{"name", name}, {"namespace", "bench"}}},
                            {"status", {{"allocation", {{"devices", {{"results", results}}}}}}}});
      test::FakeDraKubelet::ClaimRef ref{"bench", name, stored["metadata"]["uid"]};
      dra::NodePrepareResourcesResponse out;
      auto t0 = Clock::now();
      grpc::Status s = kubelet.Prepare({ref}, &out);
      auto t1 = Clock::now();
      if (!s.ok() || !out.claims().at(ref.uid).error().empty()) {
        std::fprintf(stderr, "prepare %s: %s %s\n", name.c_str(), s.error_message().c_str(),
                     out.claims().at(ref.uid).error().c_str());
        std::exit(1);
      }
      (share ? shares : whole).push_back(Ms(t1 - t0));
      t0 = Clock::now();
      kubelet.Prepare({ref}, &out);
      again.push_back(Ms(Clock::now() - t0));
      // The claim's devices are free again before the next claim of them.
      dra::NodeUnprepareResourcesResponse un;
      t0 = Clock::now();
      kubelet.Unprepare({ref}, &un);
      unprepare.push_back(Ms(Clock::now() - t0));
    }
    plugin.Stop();
  };
  phase("w", {}, false);
  phase("s", {7}, true);
  Report("NodePrepareResources, new claim, 1-8 whole GPUs", whole);
  Report("NodePrepareResources, new claim, 1-4 shares of a GPU", shares);
  Report("NodePrepareResources, claim already prepared", again);
  Report("NodeUnprepareResources", unprepare);
  std::filesystem::remove_all(dir);
  return 0;
}
