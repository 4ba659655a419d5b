// The scheduler extender over HTTP, as kube-scheduler drives it, against the openb cluster (1,213
// GPU nodes, annotated as the agent would) kept in the extender's state from the fake API server:
// for each pod drawn from the openb default trace (its GPU pods, seeded as `sim inflate` draws),
// POST /filter with every node name (nodeCacheCapable) and POST /prioritize with the nodes that
// passed, one pod after another as kube-scheduler's scheduling cycle does; then POST /bind on one
// of `binders` connections and threads (kube-scheduler's binding cycles run asynchronously, several
// in flight), which creates the Binding in the API server; p50/p99 of each call and of filter
// through bind, and the sustained rate, until the drawn GPU demand reaches --fill of the cluster's
// GPUs. Prints a table; no Google Benchmark (these are latencies of a whole path).
//   extender_bench [FILL] [BINDERS] [mtls]   (0.8, 4; mtls: HTTPS with kube-scheduler's client
//   certificate, as deploy/ runs it)
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fake_apiserver.h"
#include "spdlog/spdlog.h"
#include "tessera/extender/service.h"
#include "tessera/extender/test_objects.h"
#include "tessera/net/certs.h"
#include "tessera/net/http.h"
#include "tessera/sim/openb.h"

namespace {

using namespace tessera;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void Report(const char* what, std::vector<double> v) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  std::printf("%-40s n=%5zu  p50 %7.3f ms  p99 %7.3f ms  max %7.3f ms\n", what, v.size(), at(0.5),
              at(0.99), v.back());
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::err);
  double fill = argc > 1 ? std::atof(argv[1]) : 0.8;
  const int binders = argc > 2 ? std::max(1, std::atoi(argv[2])) : 4;
  // "mtls": as deploy/ runs it - HTTPS, and only a client certificate of its CA is served.
  const bool mtls = argc > 3 && std::string(argv[3]) == "mtls";
  const char* env = std::getenv("TESSERA_TRACES");
  std::string dir = env && *env ? env : TESSERA_SOURCE_DIR "/traces/openb";
  auto nodes = sim::LoadOpenbNodes(dir + "/openb_node_list_gpu_node.csv");
  auto trace = sim::LoadOpenbPods(dir + "/openb_pod_list_default.csv");
  if (!nodes.ok() || !trace.ok()) {
    std::fprintf(stderr, "no openb traces in %s (set TESSERA_TRACES)\n", dir.c_str());
    return 1;
  }
  std::vector<core::Request> pods;
  for (const auto& p : *trace) {
    if (p.request.wants_gpu()) pods.push_back(p.request);
  }
  fakes::FakeApiServer api;
  json names = json::array();
  int64_t capacity = 0;
  for (const core::NodeSpec& n : *nodes) {
    api.Put("/api/v1/nodes", extender::testing::OpenbNode(n));
    names.push_back(n.name);
    capacity += static_cast<int64_t>(n.gpus.size()) * core::kMilliPerGpu;
  }
  kube::ClusterConfig c;
  c.server = api.url();
  c.token = "test-token";
  auto client = kube::Client::Create(c);
  extender::ServiceOptions o;
  o.listen = "127.0.0.1:0";
  o.pod_groups = false;
  std::string ca_file, client_cert, client_key;
  const std::string tls_dir =
      std::filesystem::temp_directory_path() / ("extender-bench-tls-" + std::to_string(getpid()));
  if (mtls) {
    std::filesystem::create_directories(tls_dir);
    auto ca = net::MakeCertificateAuthority("bench-ca");
    auto server = net::IssueCertificate(
        *ca, {.common_name = "tessera-extender", .dns_names = {"localhost"}, .server = true});
    auto client = net::IssueCertificate(*ca, {.common_name = "tessera-scheduler", .client = true});
    if (!ca.ok() || !server.ok() || !client.ok()) {
      std::fprintf(stderr, "certificates: OpenSSL failed\n");
      return 1;
    }
    auto write = [&](const std::string& name, const std::string& text) {
      std::ofstream(tls_dir + "/" + name) << text;
      return tls_dir + "/" + name;
    };
    o.tls_cert_file = write("tls.crt", server->cert);
    o.tls_key_file = write("tls.key", server->key);
    o.client_ca_file = ca_file = write("ca.crt", ca->cert);
    o.client_names = {"tessera-scheduler"};
    client_cert = write("client.crt", client->cert);
    client_key = write("client.key", client->key);
  }
  auto service = extender::Service::Start(**client, o, core::SteadyClock::Get());
  if (!service.ok() || !(*service)->WaitForSync(std::chrono::seconds(60))) {
    std::fprintf(stderr, "extender did not start\n");
    return 1;
  }
  while ((*service)->extender().stats().nodes < static_cast<int>(nodes->size())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // The pods, created in the API server first (as they would be before kube-scheduler sees them).
  std::mt19937_64 draw(42);
  std::uniform_int_distribution<size_t> pick(0, pods.size() - 1);
  std::vector<json> objects;
  int64_t demand = 0;
  while (static_cast<double>(demand) < fill * static_cast<double>(capacity)) {
    core::Request r = pods[pick(draw)];
    std::string name = "p" + std::to_string(objects.size());
    demand += r.gpu_milli_total();
    objects.push_back(
        api.Put("/api/v1/namespaces/openb/pods", extender::testing::OpenbPod(r, name)));
  }
  // kube-scheduler runs binding cycles asynchronously: binds go to their own connection and thread
  // while the next pod is filtered.
  const std::string address =
      (mtls ? "https://localhost:" : "tcp://127.0.0.1:") + std::to_string((*service)->port());
  net::HttpClient http(address, "", ca_file, client_cert, client_key);
  std::vector<double> filter_ms, prioritize_ms, bind_ms, both_ms;
  int placed = 0, unplaced = 0, bind_errors = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<json, Clock::time_point>> binds;
  bool done = false;
  auto bind_loop = [&] {
    net::HttpClient bind_http(address, "", ca_file, client_cert, client_key);
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return done || !binds.empty(); });
      if (binds.empty()) return;
      auto [bind, t0] = std::move(binds.front());
      binds.pop_front();
      lock.unlock();
      auto t1 = Clock::now();
      auto b = bind_http.Send("POST", "/bind", bind.dump());
      auto t2 = Clock::now();
      json bound = b.ok() ? json::parse(b->body, nullptr, false) : json();
      lock.lock();
      bind_ms.push_back(Ms(t2 - t1));
      if (!bound.is_object() || bound.value("Error", "x") != "") {
        ++bind_errors;
      } else {
        ++placed;
        both_ms.push_back(Ms(t2 - t0));
      }
    }
  };
  std::vector<std::thread> binder_threads;
  for (int i = 0; i < binders; ++i) binder_threads.emplace_back(bind_loop);
  const std::string names_json = names.dump();
  auto start = Clock::now();
  for (const json& pod : objects) {
    auto t0 = Clock::now();
    std::string body =
        "{\"Pod\":" + pod.dump() + ",\"Nodes\":null,\"NodeNames\":" + names_json + "}";
    auto f = http.Send("POST", "/filter", body);
    auto t1 = Clock::now();
    filter_ms.push_back(Ms(t1 - t0));
    json answer = f.ok() ? json::parse(f->body, nullptr, false) : json();
    if (!answer.is_object() || !answer["NodeNames"].is_array() || answer["NodeNames"].empty()) {
      ++unplaced;
      continue;
    }
    // Prioritize with the nodes that passed (here the one the extender chose).
    auto p0 = Clock::now();
    auto pr = http.Send("POST", "/prioritize",
                        "{\"Pod\":" + pod.dump() +
                            ",\"Nodes\":null,\"NodeNames\":" + answer["NodeNames"].dump() + "}");
    prioritize_ms.push_back(Ms(Clock::now() - p0));
    if (!pr.ok() || pr->status != 200) {
      ++unplaced;
      continue;
    }
    json bind = {{"PodName", pod["metadata"]["name"]},
                 {"PodNamespace", "openb"},
                 {"PodUID", pod["metadata"]["uid"]},
                 {"Node", answer["NodeNames"][0]}};
    std::lock_guard lock(mu);
    binds.emplace_back(std::move(bind), t0);
    cv.notify_all();
  }
  {
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  }
  for (std::thread& t : binder_threads) t.join();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("openb: %zu GPU nodes, %.0f GPUs; %zu pods drawn to %.0f%% of the GPUs\n",
              nodes->size(), capacity / 1000.0, objects.size(), fill * 100);
  std::printf("NodeNames per filter request: %zu (%zu bytes of JSON)\n", names.size(),
              names.dump().size());
  Report("filter (HTTP, decision included)", filter_ms);
  Report("prioritize", prioritize_ms);
  Report("bind (to the Binding created)", bind_ms);
  Report("filter through bind", both_ms);
  std::printf("binds in flight at most: %d\n", binders);
  std::printf("placed %d, unplaced %d, bind errors %d in %.2f s: %.0f pods/s sustained\n", placed,
              unplaced, bind_errors, seconds, (placed + unplaced) / seconds);
  std::printf("transport: %s\n", mtls ? "HTTPS, client certificate checked" : "HTTP");
  (*service)->Stop();
  (*client)->Shutdown();
  if (mtls) std::filesystem::remove_all(tls_dir);
  return bind_errors == 0 ? 0 : 1;
}
