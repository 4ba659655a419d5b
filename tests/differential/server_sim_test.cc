// The differential test of issue 12: one job stream (arrivals, durations, priorities, shapes, whole
// GPUs and shares, preemption with a stop latency and requeue) run through the standalone server -
// its API, its store, its scheduling loop, on a fake clock with a fake launcher - and through
// `sim replay`. Both are executors of sched::Engine; every start must agree: which job, when, on
// which GPUs. (three_way_test.cc adds the extender, without requeue.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "legs.h"

namespace tessera {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

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
  fs::remove_all(dir_);
  // Elastic jobs among them: both drivers start one on the most GPUs that fit while nothing queued
  // wants one; those resized by signal grow onto GPUs no queued job can use and shrink for one
  // that needs them (they checkpoint and start again, under their id), the others keep their
  // size.
  const std::vector<StreamJob> stream = Stream(seed, 80, /*elastic=*/true);
  // Several owners when the test may act as other users (root, as in CI): root, daemon and nobody
  // in turn; otherwise this user alone.
  const std::vector<uid_t> uids =
      geteuid() == 0 ? std::vector<uid_t>{0, 1, 65534} : std::vector<uid_t>{geteuid()};

  server::ServerConfig config;
  config.preempt_others = {"daemon", "nobody"};  // as in the replay, anyone may preempt
  config.fair_share_half_life_s = fair_share ? 600 : 0;
  config.backfill_reservations = reservations;
  ServerLeg leg(config, dir_);
  ASSERT_TRUE(leg.ok());
  leg.Run(stream, uids);
  if (HasFatalFailure()) return;
  const std::vector<Start> server_starts = leg.Starts();

  // The replay: the same requests (as the server builds them), node, policy and seed.
  const std::vector<sim::SimJob> jobs = ReplayJobs(stream, leg.owners, config.default_runtime_s);
  ASSERT_EQ(jobs.size(), stream.size());
  const sim::ReplayConfig rc = ReplayConfigOf(config);
  sim::ReplayResult replay = sim::RunReplay({leg.srv().node()}, jobs, {}, rc);
  const std::vector<Start> sim_starts = ReplayStarts(replay);

  // Whole and fractional jobs, waits and preemptions all took place, or the test proves little.
  EXPECT_GT(replay.preemptions, 0);
  EXPECT_GT(replay.wait.max, 0);
  EXPECT_EQ(replay.finished, static_cast<int64_t>(stream.size()));
  // Elastic jobs started larger than their minimum on both sides, or they prove nothing here.
  int larger = 0;
  for (size_t i = 0; i < sim_starts.size(); ++i) {
    const json& res = stream[std::stoi(sim_starts[i].id) - 1].spec["resources"];
    larger += res.contains("gpus_max") &&
              static_cast<int>(sim_starts[i].gpus.size()) > res["gpus"].get<int>();
  }
  EXPECT_GT(larger, 0) << "no elastic job started larger than its minimum" << leg.Events("21")
                       << leg.Events("41") << leg.Events("61");
  // Running jobs grew and shrank: started again on more GPUs than their run before, and on fewer.
  int grew = 0, shrank = 0;
  std::map<std::string, size_t> gpus_of;
  for (const sim::ReplayRun& r : replay.runs) {
    if (r.resized) {
      grew += r.gpus.size() > gpus_of[r.id];
      shrank += r.gpus.size() < gpus_of[r.id];
    }
    gpus_of[r.id] = r.gpus.size();
  }
  EXPECT_GT(grew, 0) << "no running job started again on more GPUs";
  EXPECT_GT(shrank, 0) << "no running job started again on fewer GPUs";
  // The first start where they part is the one worth reading.
  for (size_t i = 0; i < std::min(server_starts.size(), sim_starts.size()); ++i) {
    ASSERT_EQ(server_starts[i], sim_starts[i])
        << "start #" << i << " (server, then replay)" << leg.Events(server_starts[i].id)
        << leg.Events(sim_starts[i].id);
  }
  EXPECT_EQ(server_starts.size(), sim_starts.size());
  if (reservations > 0) {
    // The reservations changed something, or this case proves no more than the one without.
    sim::ReplayConfig plain = rc;
    plain.reservations = 0;
    sim::ReplayResult without = sim::RunReplay({leg.srv().node()}, jobs, {}, plain);
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
