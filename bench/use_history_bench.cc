// What sizing pods from measured use (issue 58) costs the scheduler extender, whose one lock every
// filter and bind takes: learning an ended pod's tessera.io/gpu-use (parsed, into the history),
// a filter of a pod asking tessera.io/gpu-memory "auto" against one with a size of its own (the
// ratio is the sizing's cost), and, with the history full (2,000 records of commands as long as a
// training job's), writing it out (TakeUseHistory, under the lock every --history-write-interval)
// and reading it back at a restart (LoadUseHistory); the admission webhook's answer for a pod
// asking tessera.io/gpu-share "auto", and for a DRA claim asking "auto".
//   use_history_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <string>

#include "spdlog/spdlog.h"
#include "tessera/core/clock.h"
#include "tessera/extender/extender.h"
#include "tessera/extender/test_objects.h"

namespace {

using namespace tessera;
using extender::testing::GpuNode;
using extender::testing::GpuPod;
using nlohmann::json;
using Ev = kube::EventType;

json OfJob(const std::string& name, const std::string& memory) {
  json pod = GpuPod("ml", name, {.shares = 1, .annotations = {{"tessera.io/gpu-memory", memory}}});
  pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "infer";
  pod["spec"]["containers"][0]["command"] = {"python", "serve.py", "--model", "llama-3-8b"};
  return pod;
}

json Ended(json pod, int i) {
  pod["metadata"]["uid"] = "u" + std::to_string(i);
  pod["spec"]["nodeName"] = "a";
  pod["status"]["phase"] = "Succeeded";
  pod["metadata"]["annotations"][kube::kGpuUseAnnotation] =
      kube::FormatGpuUse({.seconds = 600, .busy_permille = 180, .peak_mib = 3000 + i % 500});
  return pod;
}

// The records of a full history: 2,000, each command 300 bytes long.
json FullHistory() {
  json records = json::array();
  for (size_t i = 0; i < extender::Extender::kUseRecordsKept; ++i) {
    records.push_back({{"uid", "u" + std::to_string(i)},
                       {"user", "ml"},
                       {"name", "Job/infer-" + std::to_string(i % 50)},
                       {"command", {"python", std::string(300, 'a')}},
                       {"shape", "25% auto"},
                       {"busyPercent", 18},
                       {"peakMiB", 3000 + static_cast<int>(i)}});
  }
  return records;
}

void LearnEndedPod(benchmark::State& state) {
  core::FakeClock clock;
  extender::Extender ex({}, clock);
  ex.OnNode(Ev::kAdded, GpuNode("a", "dgx-h100", {}, 8));
  const json base = OfJob("infer", "6Gi");
  int i = 0;
  for (auto _ : state) ex.OnPod(Ev::kModified, Ended(base, i++));
  state.SetItemsProcessed(state.iterations());
}

// A filter (reserving its share) and the pod's end, so the GPUs never fill.
void FilterOnce(benchmark::State& state, const std::string& memory) {
  core::FakeClock clock;
  extender::Extender ex({}, clock);
  ex.OnNode(Ev::kAdded, GpuNode("a", "dgx-h100", {}, 8));
  for (int i = 0; i < 200; ++i) ex.OnPod(Ev::kModified, Ended(OfJob("infer", "6Gi"), -1 - i));
  int i = 0;
  for (auto _ : state) {
    json pod = OfJob("p" + std::to_string(i++), memory);
    auto f = ex.Filter(pod, {"a"});
    benchmark::DoNotOptimize(f);
    state.PauseTiming();
    json gone = pod;
    ex.OnPod(Ev::kDeleted, gone);
    state.ResumeTiming();
  }
}

void TakeFullHistory(benchmark::State& state) {
  core::FakeClock clock;
  extender::Extender ex({}, clock);
  ex.OnNode(Ev::kAdded, GpuNode("a", "dgx-h100", {}, 8));
  ex.LoadUseHistory(FullHistory());
  json base = OfJob("infer", "6Gi");  // records as long as the history's: 300-byte commands
  base["spec"]["containers"][0]["command"] = json::array({"python", std::string(300, 'a')});
  int i = 0;
  size_t bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    ex.OnPod(Ev::kModified, Ended(base, 100000 + i++));  // changed: to be written
    state.ResumeTiming();
    auto h = ex.TakeUseHistory();
    state.PauseTiming();
    bytes = h ? h->size() : 0;
    state.ResumeTiming();
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}

void LoadFullHistory(benchmark::State& state) {
  const json records = FullHistory();
  for (auto _ : state) {
    state.PauseTiming();
    core::FakeClock clock;
    auto ex = std::make_unique<extender::Extender>(extender::ExtenderOptions{}, clock);
    state.ResumeTiming();
    benchmark::DoNotOptimize(ex->LoadUseHistory(records));
    state.PauseTiming();
    ex.reset();
    state.ResumeTiming();
  }
}

// The admission webhook's answer for a pod creation (AdmitPod with the extender's SizeShare, 200
// runs of its kind in the history): a pod asking tessera.io/gpu-share "auto" against one that does
// not (which the webhook configuration's matchConditions never send; here the floor: parsing the
// review). The API server waits for it as it creates the pod.
void Admit(benchmark::State& state, bool automatic) {
  core::FakeClock clock;
  extender::Extender ex({}, clock);
  ex.OnNode(Ev::kAdded, GpuNode("a", "dgx-h100", {}, 8));
  for (int i = 0; i < 200; ++i) ex.OnPod(Ev::kModified, Ended(OfJob("infer", "6Gi"), -1 - i));
  json pod = OfJob("", "6Gi");
  pod["metadata"].erase("name");
  pod["metadata"]["generateName"] = "infer-";
  if (automatic) pod["metadata"]["annotations"]["tessera.io/gpu-share"] = "auto";
  const std::string review =
      json({{"apiVersion", "admission.k8s.io/v1"},
            {"kind", "AdmissionReview"},
            {"request",
             {{"uid", "u"},
              {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
              {"namespace", "ml"},
              {"operation", "CREATE"},
              {"object", pod}}}})
          .dump();
  for (auto _ : state) {
    auto a = extender::AdmitPod(
        review, [&](const json& p, size_t c, int asked) { return ex.SizeShare(p, c, asked); });
    if (automatic && !a.body["response"].contains("patch")) state.SkipWithError("not sized");
    benchmark::DoNotOptimize(a);
  }
}

// The same for a DRA claim (AdmitClaim with SizeClaim; 200 ended DRA pods of its pod's kind, 8
// shares per GPU): a claim asking count and memory "auto", as the resourceclaim controller
// creates it. The service also reads its pod (from its watch; asked of the API server only when
// not seen yet), not counted here.
void AdmitDraClaim(benchmark::State& state) {
  core::FakeClock clock;
  extender::Extender ex({}, clock);
  auto dra_pod = [](const std::string& name) {
    json pod = OfJob(name, "6Gi");
    pod["spec"]["containers"][0]["resources"] = json::object();
    pod["spec"]["resourceClaims"] = {{{"name", "gpu"}, {"resourceClaimTemplateName", "share"}}};
    return pod;
  };
  for (int i = 0; i < 200; ++i) ex.OnPod(Ev::kModified, Ended(dra_pod("infer"), -1 - i));
  const json pod = dra_pod("infer-next");
  const json claim = {
      {"metadata",
       {{"generateName", "infer-next-gpu-"},
        {"annotations", {{"tessera.io/gpu-share", "auto"}, {"tessera.io/gpu-memory", "auto"}}},
        {"ownerReferences",
         {{{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", "infer-next"}, {"controller", true}}}}}},
      {"spec",
       {{"devices",
         {{"requests",
           {{{"name", "s"},
             {"exactly", {{"deviceClassName", "gpu-share.tessera.io"}, {"count", 4}}}}}}}}}}};
  const std::string review =
      json({{"apiVersion", "admission.k8s.io/v1"},
            {"kind", "AdmissionReview"},
            {"request",
             {{"uid", "u"},
              {"resource",
               {{"group", "resource.k8s.io"}, {"version", "v1"}, {"resource", "resourceclaims"}}},
              {"namespace", "ml"},
              {"operation", "CREATE"},
              {"object", claim}}}})
          .dump();
  for (auto _ : state) {
    auto a = extender::AdmitClaim(review, [&](const std::string&, const extender::ClaimAsk& ask) {
      return ex.SizeClaim(pod, ask, 8);
    });
    if (!a.body["response"].contains("patch")) state.SkipWithError("not sized");
    benchmark::DoNotOptimize(a);
  }
}

}  // namespace

BENCHMARK(AdmitDraClaim)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Admit, auto_share, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Admit, not_auto, false)->Unit(benchmark::kMicrosecond);
BENCHMARK(LearnEndedPod)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(FilterOnce, sized_6Gi, std::string("6Gi"))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(FilterOnce, auto, std::string("auto")) -> Unit(benchmark::kMicrosecond);
BENCHMARK(TakeFullHistory)->Unit(benchmark::kMillisecond);
BENCHMARK(LoadFullHistory)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::err);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
