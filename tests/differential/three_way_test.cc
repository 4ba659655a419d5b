// The differential test through all three executors of sched::Engine: one job stream run through
// the standalone server, `sim replay` and the Kubernetes scheduler extender - the extender over its
// real wire (kube-scheduler's filter, preempt and bind JSON over HTTP, the cluster from a fake API
// server over real HTTP with watches, evictions through the Eviction API), the test playing
// kube-scheduler, the Job's pods and the kubelet on a fake clock. Every start must agree: which
// job, when, on which GPUs - with preemption (a victim holds its GPUs while it terminates, as a
// pod bound to a node does: the fake keeps it until its kubelet, the test, removes it
// kStopLatency later) and backfill reservations from run-time predictions (each executor's engine
// learns from the runs it saw succeed).
//
// What the three share by construction is the engine; what they are configured to share is said
// here: one owner (a namespace is an owner on Kubernetes, a user on the server); a preempted job
// ends (a Kubernetes controller replaces an evicted pod with a new one; the server and the replay
// requeue by default, which server_sim_test.cc covers); FGD's typical workload is not learned
// from pods (the server has none either).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "fake_apiserver.h"
#include "legs.h"
#include "tessera/extender/objects.h"
#include "tessera/extender/service.h"
#include "tessera/kube/client.h"
#include "tessera/kube/gpu_annotations.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using fakes::FakeApiServer;

constexpr char kNodes[] = "/api/v1/nodes";
constexpr char kPods[] = "/api/v1/namespaces/team/pods";
constexpr char kNode[] = "gpu-node";

std::string Rfc3339(double seconds) {
  const time_t t = static_cast<time_t>(seconds);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The extender on a fake API server holding one node as the agent annotates it: the server's
// machine, with its CPU and memory as allocatable.
class ExtenderLeg {
 public:
  ExtenderLeg(const server::ServerConfig& config, const server::Server& srv)
      : api_(fakes::FakeApiServerOptions{.graceful_pod_deletion = true}) {
    kube::NodeGpus gpus{srv.inventory(), std::vector<bool>(srv.inventory().gpus.size(), true), 100};
    api_.Put(
        kNodes,
        {{"metadata",
          {{"name", kNode}, {"annotations", {{kube::kNodeGpusAnnotation, FormatNodeGpus(gpus)}}}}},
         {"status",
          {{"allocatable",
            {{"cpu", std::to_string(srv.node().cpu_milli) + "m"},
             {"memory", std::to_string(srv.node().memory_mib) + "Mi"}}}}}});
    kube::ClusterConfig c;
    c.server = api_.url();
    c.token = "test-token";
    client_ = std::move(*kube::Client::Create(c));
    extender::ServiceOptions o;
    o.listen = "127.0.0.1:0";
    o.sweep_interval_s = 0.01;
    o.pod_groups = false;
    o.extender.scheduler.policies = *sched::ParsePolicies(config.policy);
    o.extender.cycle = {.fair_share_half_life_s = config.fair_share_half_life_s,
                        .reservations = config.backfill_reservations};
    o.extender.typical_refresh_pods = 0;
    auto s = extender::Service::Start(*client_, o, clock_);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return;
    service_ = std::move(*s);
    EXPECT_TRUE(service_->WaitForSync(std::chrono::seconds(10)));
    http_ =
        std::make_unique<net::HttpClient>("tcp://127.0.0.1:" + std::to_string(service_->port()));
  }
  ~ExtenderLeg() {
    if (service_) service_->Stop();
    if (client_) client_->Shutdown();
  }
  bool ok() const { return service_ != nullptr; }

  void Run(const std::vector<StreamJob>& stream) {
    ASSERT_TRUE(WaitFor([&] { return service_->extender().stats().nodes == 1; }));
    struct PodState {
      double started = -1, end = 0, evicted = -1;
      bool gone = false;
    };
    std::vector<PodState> pods(stream.size());
    std::map<std::string, size_t> by_uid;  // the API server's UIDs
    size_t next = 0;
    int alive = 0;
    auto stop_at = [&](const PodState& p) {
      if (p.started < 0 || p.gone) return std::numeric_limits<double>::infinity();
      return p.evicted >= 0 ? std::min(p.end, p.evicted + kStopLatency) : p.end;
    };
    while (true) {
      double t =
          next < stream.size() ? stream[next].submit : std::numeric_limits<double>::infinity();
      for (const PodState& p : pods) t = std::min(t, stop_at(p));
      if (t == std::numeric_limits<double>::infinity()) break;
      ASSERT_LT(t, 1e6) << "the stream never drains";
      clock_.Advance(std::chrono::duration_cast<core::Duration>(
          std::chrono::duration<double>(t + kEpoch - core::Seconds(clock_.Now()))));
      // The kubelet: pods that ended (succeeded, or stopped after their eviction) go away.
      for (size_t i = 0; i < pods.size(); ++i) {
        if (stop_at(pods[i]) > t) continue;
        if (pods[i].evicted < 0) {
          json done = *api_.Get(kPods, Name(i));
          done["status"]["phase"] = "Succeeded";
          api_.Put(kPods, done);
        }
        ASSERT_TRUE(api_.Delete(kPods, Name(i)));
        pods[i].gone = true;
        --alive;
        ASSERT_TRUE(WaitFor([&] { return !service_->extender().AllocationOf(Id(i)); }))
            << Id(i) << " still holds GPUs after it ended";
      }
      // The Job controller: the pods that arrive now.
      for (; next < stream.size() && stream[next].submit <= t; ++next, ++alive)
        by_uid[api_.Put(kPods, PodOf(next, stream[next]))["metadata"]["uid"]] = next;
      ASSERT_TRUE(WaitFor([&] { return service_->extender().stats().pods == alive; }));
      // kube-scheduler: its queue (priority, then creation) through filter and bind, and through
      // preempt for a pod that fits nowhere, until nothing more happens.
      for (bool progress = true; progress;) {
        progress = false;
        std::vector<size_t> pending;
        for (size_t i = 0; i < next; ++i)
          if (pods[i].started < 0 && !pods[i].gone) pending.push_back(i);
        std::stable_sort(pending.begin(), pending.end(), [&](size_t a, size_t b) {
          return stream[a].spec.value("priority", 0) > stream[b].spec.value("priority", 0);
        });
        for (size_t i : pending) {
          const std::optional<json> stored = api_.Get(kPods, Name(i));
          ASSERT_TRUE(stored) << Id(i) << " is gone before it started, at " << t;
          const json& pod = *stored;
          json f = Post("filter", {{"Pod", pod}, {"NodeNames", {kNode}}});
          if (f.value("NodeNames", json::array()).empty()) continue;
          json b = Post("bind", {{"PodName", Name(i)},
                                 {"PodNamespace", "team"},
                                 {"PodUID", pod["metadata"]["uid"]},
                                 {"Node", kNode}});
          ASSERT_EQ(b.value("Error", ""), "") << Id(i);
          auto a = service_->extender().AllocationOf(Id(i));
          ASSERT_TRUE(a) << Id(i);
          starts.push_back({std::to_string(i + 1), t, a->gpus});
          pods[i].started = t;
          pods[i].end = t + stream[i].duration;
          progress = true;
        }
      }
      // Every binding seen by the extender (so it counts the run from now). Then kube-scheduler's
      // preemption for the pods still pending: the extender answers the victims its engine asked
      // to stop for each (whichever filter's step asked), evicted by its worker through the API:
      // from now they terminate, holding their GPUs until the kubelet removes them.
      ASSERT_TRUE(WaitFor([&] { return service_->extender().stats().reserved == 0; }));
      for (size_t i = 0; i < next; ++i) {
        if (pods[i].started >= 0 || pods[i].gone) continue;
        for (const std::string& victim : Preempt(*api_.Get(kPods, Name(i)))) {
          auto v = by_uid.find(victim);
          ASSERT_NE(v, by_uid.end()) << "an unknown victim " << victim;
          if (pods[v->second].evicted >= 0) continue;
          pods[v->second].evicted = t;
          ASSERT_TRUE(WaitFor([&] {
            auto p = api_.Get(kPods, Name(v->second));
            return p && (*p)["metadata"].contains("deletionTimestamp");
          })) << Id(v->second)
              << " was never evicted";
        }
      }
    }
  }

  std::vector<Start> starts;

 private:
  static std::string Name(size_t i) { return "job-" + std::to_string(i + 1); }
  static std::string Id(size_t i) { return "team/" + Name(i); }
  static bool WaitFor(const std::function<bool()>& pred) { return FakeApiServer::WaitFor(pred); }

  // The job as a pod asks for it: the same request the server builds from its spec.
  json PodOf(size_t i, const StreamJob& j) {
    auto spec = server::JobSpecFromJson(j.spec);
    EXPECT_TRUE(spec.ok()) << spec.status();
    const core::Request r = server::RequestOf(*spec, 0, "");
    json limits = json::object(), annotations = json::object();
    if (r.fractional()) {
      limits["tessera.io/gpu-share"] = std::to_string(r.gpu_milli / 10);  // 100 shares per GPU
      annotations[extender::kGpuMemoryAnnotation] = std::to_string(r.gpu_memory_mib) + "Mi";
    } else {
      limits["tessera.io/gpu"] = std::to_string(r.gpus);
    }
    if (!r.preemptible) annotations[extender::kPreemptibleAnnotation] = "false";
    return {{"metadata",
             {{"name", Name(i)},
              {"namespace", "team"},
              {"creationTimestamp", Rfc3339(kEpoch + j.submit)},
              {"annotations", annotations}}},
            {"spec",
             {{"schedulerName", "tessera"},
              {"priority", r.priority},
              {"containers",
               {{{"name", "main"},
                 {"image", "sleep:1"},
                 {"command", spec->command},
                 {"resources",
                  {{"limits", limits},
                   {"requests",
                    {{"cpu", std::to_string(r.cpu_milli) + "m"},
                     {"memory", std::to_string(r.memory_mib) + "Mi"}}}}}}}}}},
            {"status", {{"phase", "Pending"}}}};
  }

  json Post(const std::string& verb, const json& body) {
    auto r = http_->Send("POST", "/scheduler/" + verb, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return json::object();
    EXPECT_EQ(r->status, 200) << verb << ": " << r->body;
    return json::parse(r->body, nullptr, false);
  }

  // As kube-scheduler's preemption asks the extender: every pod on the node a candidate victim;
  // the UIDs the extender keeps.
  std::vector<std::string> Preempt(const json& pod) {
    json victims = json::array();
    for (const json& p : api_.List(kPods)) {
      if (p["spec"].value("nodeName", "") == kNode)
        victims.push_back({{"UID", p["metadata"]["uid"]}});
    }
    json answer =
        Post("preempt", {{"Pod", pod}, {"NodeNameToMetaVictims", {{kNode, {{"Pods", victims}}}}}});
    std::vector<std::string> out;
    for (const json& v :
         answer["NodeNameToMetaVictims"].value(kNode, json::object()).value("Pods", json::array()))
      out.push_back(v.value("UID", ""));
    return out;
  }

  FakeApiServer api_;
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(static_cast<int64_t>(kEpoch)))};
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<extender::Service> service_;
  std::unique_ptr<net::HttpClient> http_;
};

// A seed and the backfill reservations (0, or the server's default 8 with predictions).
class ThreeWay : public ::testing::TestWithParam<std::tuple<uint64_t, int>> {
 protected:
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_ = ::testing::TempDir() + "tessera-three-way-" + std::to_string(getpid());
};

TEST_P(ThreeWay, ServerReplayAndExtenderStartTheSameJobsAtTheSameTimesOnTheSameGpus) {
  const auto [seed, reservations] = GetParam();
  fs::remove_all(dir_);
  const std::vector<StreamJob> stream = Stream(seed, 60);
  server::ServerConfig config;
  config.backfill_reservations = reservations;
  config.requeue_preempted = false;
  // Pods run until they end (no default runtime), and the extender is given no fair share here.
  config.default_runtime_s = 0;
  config.fair_share_half_life_s = 0;
  ServerLeg server(config, dir_);
  ASSERT_TRUE(server.ok());
  server.Run(stream, {geteuid()});
  if (HasFatalFailure()) return;
  const std::vector<Start> server_starts = server.Starts();

  const std::vector<sim::SimJob> jobs = ReplayJobs(stream, server.owners, config.default_runtime_s);
  ASSERT_EQ(jobs.size(), stream.size());
  sim::ReplayResult replay =
      sim::RunReplay({server.srv().node()}, jobs, {}, ReplayConfigOf(config));
  const std::vector<Start> replay_starts = ReplayStarts(replay);

  ExtenderLeg extender(config, server.srv());
  ASSERT_TRUE(extender.ok());
  extender.Run(stream);
  if (HasFatalFailure()) return;

  // Preemption took place and jobs waited, or the test proves little.
  EXPECT_GT(replay.preemptions, 0);
  EXPECT_GT(replay.wait.max, 0);
  for (size_t i = 0; i < std::min(server_starts.size(), replay_starts.size()); ++i) {
    ASSERT_EQ(server_starts[i], replay_starts[i])
        << "start #" << i << " (server, then replay)" << server.Events(server_starts[i].id);
  }
  EXPECT_EQ(server_starts.size(), replay_starts.size());
  for (size_t i = 0; i < std::min(server_starts.size(), extender.starts.size()); ++i) {
    ASSERT_EQ(server_starts[i], extender.starts[i])
        << "start #" << i << " (server, then extender)" << server.Events(server_starts[i].id);
  }
  EXPECT_EQ(server_starts.size(), extender.starts.size());
  if (reservations > 0) {
    // The reservations (from each engine's predictions) changed something, or this case proves no
    // more than the one without.
    sim::ReplayConfig plain = ReplayConfigOf(config);
    plain.reservations = 0;
    EXPECT_NE(ReplayStarts(sim::RunReplay({server.srv().node()}, jobs, {}, plain)), replay_starts)
        << "the same starts with and without reservations";
  }
}

// Seeds whose streams preempt and make jobs wait (the test checks they do); seed 2 stopped
// preempting when predictions became per workload (issue 52).
INSTANTIATE_TEST_SUITE_P(Seeds, ThreeWay,
                         ::testing::Combine(::testing::Values(1, 3, 4), ::testing::Values(0, 8)));

}  // namespace
}  // namespace tessera
