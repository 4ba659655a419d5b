// The differential test of issue 12: one job stream (arrivals, durations, priorities, shapes, whole
// GPUs and shares, preemption with a stop latency) run through the standalone server - its API, its
// store, its scheduling loop, on a fake clock with a fake launcher - and through `sim replay`. Both
// drive sched::Cycle; every start must agree: which job, when, on which GPUs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "tessera/sched/scheduler.h"
#include "tessera/server/fake_launcher.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/server.h"
#include "tessera/sim/replay.h"

namespace tessera {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr double kEpoch = 1'800'000'000;  // the fake clock's start, seconds
constexpr double kStopLatency = 2;

struct StreamJob {
  double submit;  // seconds after kEpoch, whole
  json spec;      // the job as POSTed
  double duration;
};

// A seeded stream: whole-second arrivals and durations (exact in both clocks), priorities 0..2,
// shapes from one GPU to all eight and fractions of one.
std::vector<StreamJob> Stream(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<StreamJob> jobs;
  double t = 0;
  for (int i = 0; i < n; ++i) {
    t += pick(0, 6);
    StreamJob j;
    j.submit = t;
    j.duration = pick(5, 60);
    j.spec = {{"command", {"sleep", std::to_string(static_cast<int>(j.duration))}},
              {"priority", pick(0, 2)}};
    int shape = pick(0, 9);
    if (shape < 6) {
      static constexpr int kGpus[] = {1, 1, 2, 2, 4, 8};
      j.spec["resources"] = {{"gpus", kGpus[shape]}};
    } else {
      j.spec["resources"] = {{"gpu_share", std::to_string(pick(1, 6) * 10) + "%"},
                             {"gpu_memory", "8GiB"}};
    }
    if (pick(0, 9) == 0) j.spec["preemptible"] = false;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

struct Start {
  std::string id;
  double at;
  std::vector<int> gpus;
  bool operator==(const Start&) const = default;
};
std::ostream& operator<<(std::ostream& o, const Start& s) {
  o << "job " << s.id << " at " << s.at << " on [";
  for (int g : s.gpus) o << g << ' ';
  return o << ']';
}

std::string Events(server::Server& srv, const std::string& id) {
  net::HttpRequest r;
  r.method = "GET";
  r.path = r.target = "/v1/jobs/" + id;
  r.peer.unix_socket = true;
  r.peer.uid = geteuid();
  json j = json::parse(srv.Handle(r).body);
  std::string out = "\njob " + id + " (priority " + std::to_string(j["priority"].get<int>()) +
                    ", " + j["spec"]["resources"].dump() + "):";
  for (const json& e : j["events"]) {
    out += fmt::format("\n  {:.0f} {}", e["at"].get<double>() - kEpoch,
                       e["reason"].get<std::string>());
  }
  return out;
}

// A seed, whether fair share between owners is on (the same half-life on both sides), and the
// backfill reservations (0, or the server's default 8 with run-time predictions on both sides: the
// one predictor, sched::DurationPredictor, each side feeding its own with the jobs it saw end).
class Differential : public ::testing::TestWithParam<std::tuple<uint64_t, bool, int>> {
 protected:
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_ = ::testing::TempDir() + "tessera-differential-" + std::to_string(getpid());
};

TEST_P(Differential, ServerAndReplayStartTheSameJobsAtTheSameTimesOnTheSameGpus) {
  const auto [seed, fair_share, reservations] = GetParam();
  const std::vector<StreamJob> stream = Stream(seed, 80);
  // Several owners when the test may act as other users (root, as in CI): root, daemon and nobody
  // in turn; otherwise this user alone.
  const std::vector<uid_t> uids =
      geteuid() == 0 ? std::vector<uid_t>{0, 1, 65534} : std::vector<uid_t>{geteuid()};

  // The server: submissions through its API at their times, its loop turned until idle at each
  // event, jobs run by the fake launcher for their durations.
  fs::remove_all(dir_);
  server::ServerConfig config;
  config.confinement = "off";  // jobs of the fake launcher are no processes
  config.socket = dir_ + "/s.sock";
  config.state_dir = dir_ + "/state";
  config.simulate = "dgx-h100";
  config.podman = "";
  config.allow_root_jobs = true;
  config.priority_ceiling = 1000;                // the stream's priorities, for every owner
  config.preempt_others = {"daemon", "nobody"};  // as in the replay, anyone may preempt
  config.fair_share_half_life_s = fair_share ? 600 : 0;
  config.backfill_reservations = reservations;
  core::FakeClock clock{core::TimePoint(std::chrono::seconds(static_cast<int64_t>(kEpoch)))};
  server::FakeLauncher launcher(clock, kStopLatency);
  server::ServerDeps deps;
  deps.clock = &clock;
  deps.launcher = &launcher;
  auto created = server::Server::Create(config, std::move(deps));
  ASSERT_TRUE(created.ok()) << created.status();
  server::Server& srv = **created;
  ASSERT_TRUE(srv.Start({.listen = false, .loop = false, .health = false}).ok());
  auto now = [&] { return core::Seconds(clock.Now()) - kEpoch; };
  auto settle = [&] {
    for (int i = 0; i < 1000 && srv.RunOnce(); ++i) {
    }
  };
  std::vector<std::string> owners;
  size_t next = 0;
  while (next < stream.size() || launcher.NextEnd() < std::numeric_limits<double>::infinity()) {
    double t = next < stream.size() ? stream[next].submit : std::numeric_limits<double>::infinity();
    t = std::min(t, launcher.NextEnd() - kEpoch);
    ASSERT_LT(t, 1e6) << "the stream never drains";
    clock.Advance(
        std::chrono::duration_cast<core::Duration>(std::chrono::duration<double>(t - now())));
    while (next < stream.size() && stream[next].submit <= now()) {
      net::HttpRequest r;
      r.method = "POST";
      r.path = r.target = "/v1/jobs";
      r.content_type = "application/json";
      r.body = stream[next].spec.dump();
      r.peer.unix_socket = true;
      r.peer.uid = uids[next % uids.size()];
      net::HttpResponse out = srv.Handle(r);
      ASSERT_EQ(out.status, 201) << out.body;
      json j = json::parse(out.body);
      ASSERT_EQ(j["id"], static_cast<int64_t>(next + 1));
      owners.push_back(j["owner"]);
      ++next;
    }
    settle();
  }
  std::vector<Start> server_starts;
  std::map<std::string, int> index_of;
  for (size_t g = 0; g < srv.inventory().gpus.size(); ++g)
    index_of[srv.inventory().gpus[g].uuid] = static_cast<int>(g);
  for (const server::FakeLauncher::Started& s : launcher.started()) {
    Start st{std::to_string(s.job_id), s.at - kEpoch, {}};
    for (const std::string& uuid : s.gpu_uuids) st.gpus.push_back(index_of.at(uuid));
    server_starts.push_back(st);
  }

  // The replay: the same requests (as the server builds them), node, policy and seed.
  std::vector<sim::SimJob> jobs;
  for (size_t i = 0; i < stream.size(); ++i) {
    auto spec = server::JobSpecFromJson(stream[i].spec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    sim::SimJob j;
    j.request = server::RequestOf(*spec, static_cast<int64_t>(i + 1), owners[i]);
    j.submit = stream[i].submit;
    j.duration = stream[i].duration;
    // What history knows it by, as the job file says.
    j.name = spec->name;
    j.command = spec->command;
    j.tasks = spec->Tasks();
    j.max_runtime_s = spec->max_runtime_s;
    jobs.push_back(j);
  }
  sim::ReplayConfig rc;
  rc.policies = *sched::ParsePolicies(config.policy);
  rc.seed = sched::SchedulerConfig{}.seed;
  rc.stop_latency_s = kStopLatency;
  rc.record_runs = true;
  rc.fair_share_half_life_s = config.fair_share_half_life_s;
  rc.reservations = config.backfill_reservations;
  rc.predict = true;  // as the server always does
  sim::ReplayResult replay = sim::RunReplay({srv.node()}, jobs, {}, rc);
  std::vector<Start> sim_starts;
  for (const sim::ReplayRun& r : replay.runs) {
    std::vector<int> gpus = r.gpus;
    sim_starts.push_back({r.id, r.start, gpus});
  }

  // Whole and fractional jobs, waits and preemptions all took place, or the test proves little.
  EXPECT_GT(replay.preemptions, 0);
  EXPECT_GT(replay.wait.max, 0);
  EXPECT_EQ(replay.finished, static_cast<int64_t>(stream.size()));
  // The first start where they part is the one worth reading.
  for (size_t i = 0; i < std::min(server_starts.size(), sim_starts.size()); ++i) {
    ASSERT_EQ(server_starts[i], sim_starts[i])
        << "start #" << i << " (server, then replay)" << Events(srv, server_starts[i].id)
        << Events(srv, sim_starts[i].id);
  }
  EXPECT_EQ(server_starts.size(), sim_starts.size());
  if (reservations > 0) {
    // The reservations changed something, or this case proves no more than the one without.
    sim::ReplayConfig plain = rc;
    plain.reservations = 0;
    sim::ReplayResult without = sim::RunReplay({srv.node()}, jobs, {}, plain);
    bool differ = without.runs.size() != replay.runs.size();
    for (size_t i = 0; !differ && i < replay.runs.size(); ++i)
      differ =
          without.runs[i].id != replay.runs[i].id || without.runs[i].start != replay.runs[i].start;
    EXPECT_TRUE(differ) << "the same starts with and without reservations";
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, Differential,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Bool(),
                                            ::testing::Values(0, 8)));

}  // namespace
}  // namespace tessera
