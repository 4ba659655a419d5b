#pragma once
// Two of the differential tests' executors of one job stream: the standalone server (its API, its
// store, its scheduling loop, on a fake clock with a fake launcher) and `sim replay`.

#include <unistd.h>

#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "stream.h"
#include "tessera/sched/scheduler.h"
#include "tessera/server/fake_launcher.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/server.h"
#include "tessera/sim/replay.h"

namespace tessera {

// The server: submissions through its API at their times (job i by uids[i % uids.size()]), its
// loop turned until idle at each event, jobs run by the fake launcher for their durations.
class ServerLeg {
 public:
  // `config`: socket and state_dir are set here, under `dir`.
  ServerLeg(server::ServerConfig config, const std::string& dir) {
    config.confinement = "off";  // jobs of the fake launcher are no processes
    config.socket = dir + "/s.sock";
    config.state_dir = dir + "/state";
    config.simulate = "dgx-h100";
    config.podman = "";
    config.allow_root_jobs = true;
    config.priority_ceiling = 1000;  // the stream's priorities, for every owner
    // Elastic jobs resized by signal checkpoint and go on from there on their new size, faster on
    // more GPUs by Amdahl's law (the replay's model, with its serial fraction).
    launcher_.AnswerResizes(kRestartOverhead, kSerialFraction, [this](int64_t id) {
      auto base = base_gpus_.find(id);
      return base == base_gpus_.end() ? 0 : base->second;
    });
    server::ServerDeps deps;
    deps.clock = &clock_;
    deps.launcher = &launcher_;
    auto created = server::Server::Create(config, std::move(deps));
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) srv_ = std::move(*created);
    if (srv_) {
      EXPECT_TRUE(srv_->Start({.listen = false, .loop = false, .health = false}).ok());
    }
  }
  bool ok() const { return srv_ != nullptr; }
  server::Server& srv() { return *srv_; }

  // Runs the stream to its end; the owner of each job as the server named it.
  void Run(const std::vector<StreamJob>& stream, const std::vector<uid_t>& uids) {
    auto now = [&] { return core::Seconds(clock_.Now()) - kEpoch; };
    // A job resized while it runs works its duration on its minimum (as the replay's do).
    for (size_t i = 0; i < stream.size(); ++i) {
      const json& spec = stream[i].spec;
      if (spec.contains("resize") && spec["resources"].contains("gpus_max"))
        base_gpus_[static_cast<int64_t>(i + 1)] = spec["resources"]["gpus"].get<int>();
    }
    size_t next = 0;
    while (next < stream.size() || launcher_.NextEnd() < std::numeric_limits<double>::infinity()) {
      double t =
          next < stream.size() ? stream[next].submit : std::numeric_limits<double>::infinity();
      t = std::min(t, launcher_.NextEnd() - kEpoch);
      ASSERT_LT(t, 1e6) << "the stream never drains";
      // Rounded up to the clock's nanosecond: an end between two ticks has come at the later.
      clock_.Advance(std::chrono::ceil<core::Duration>(std::chrono::duration<double>(t - now())));
      while (next < stream.size() && stream[next].submit <= now()) {
        net::HttpRequest r;
        r.method = "POST";
        r.path = r.target = "/v1/jobs";
        r.content_type = "application/json";
        r.body = stream[next].spec.dump();
        r.peer.unix_socket = true;
        r.peer.uid = uids[next % uids.size()];
        net::HttpResponse out = srv_->Handle(r);
        ASSERT_EQ(out.status, 201) << out.body;
        json j = json::parse(out.body);
        ASSERT_EQ(j["id"], static_cast<int64_t>(next + 1));
        owners.push_back(j["owner"]);
        ++next;
      }
      for (int i = 0; i < 1000 && srv_->RunOnce(); ++i) {
      }
    }
  }

  // Every start, in the order the launcher saw them (a resized job's start again on its new size
  // among them); GPUs by their index on the machine.
  std::vector<Start> Starts() const {
    std::vector<Start> out;
    std::map<std::string, int> index_of;
    for (size_t g = 0; g < srv_->inventory().gpus.size(); ++g)
      index_of[srv_->inventory().gpus[g].uuid] = static_cast<int>(g);
    for (const server::FakeLauncher::Started& s : launcher_.started()) {
      Start st{std::to_string(s.job_id), s.at - kEpoch, {}};
      for (const std::string& uuid : s.gpu_uuids) st.gpus.push_back(index_of.at(uuid));
      out.push_back(st);
    }
    return out;
  }

  // A job's record as the API tells it, for a failure's message.
  std::string Events(const std::string& id) {
    net::HttpRequest r;
    r.method = "GET";
    r.path = r.target = "/v1/jobs/" + id;
    r.peer.unix_socket = true;
    r.peer.uid = geteuid();
    json j = json::parse(srv_->Handle(r).body);
    std::string out = "\njob " + id + " (priority " + std::to_string(j["priority"].get<int>()) +
                      ", " + j["spec"]["resources"].dump() + "):";
    for (const json& e : j["events"]) {
      out += fmt::format("\n  {:.0f} {}", e["at"].get<double>() - kEpoch,
                         e["reason"].get<std::string>());
    }
    return out;
  }

  std::vector<std::string> owners;

 private:
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(static_cast<int64_t>(kEpoch)))};
  server::FakeLauncher launcher_{clock_, kStopLatency};
  std::map<int64_t, int> base_gpus_;  // job id -> its minimum, for those resized while they run
  std::unique_ptr<server::Server> srv_;
};

// The replay's jobs: the same requests as the server builds them, known to history as the job
// file says.
// `default_runtime_s`: what the server gives a job that asks none (limits.default_runtime).
inline std::vector<sim::SimJob> ReplayJobs(const std::vector<StreamJob>& stream,
                                           const std::vector<std::string>& owners,
                                           double default_runtime_s) {
  std::vector<sim::SimJob> jobs;
  for (size_t i = 0; i < stream.size(); ++i) {
    auto spec = server::JobSpecFromJson(stream[i].spec);
    EXPECT_TRUE(spec.ok()) << spec.status();
    if (!spec.ok()) return {};
    sim::SimJob j;
    j.request = server::RequestOf(*spec, static_cast<int64_t>(i + 1), owners[i]);
    j.submit = stream[i].submit;
    j.duration = stream[i].duration;
    j.name = spec->name;
    j.command = spec->command;
    j.tasks = spec->Tasks();
    j.max_runtime_s = spec->max_runtime_s > 0 ? spec->max_runtime_s : default_runtime_s;
    jobs.push_back(j);
  }
  return jobs;
}

// The replay configured as the server `config` is (node, policy, seed, stop latency, fair share,
// reservations, requeue), with predictions on as the server always has them.
inline sim::ReplayConfig ReplayConfigOf(const server::ServerConfig& config) {
  sim::ReplayConfig rc;
  rc.policies = *sched::ParsePolicies(config.policy);
  rc.seed = sched::SchedulerConfig{}.seed;
  rc.stop_latency_s = kStopLatency;
  rc.record_runs = true;
  rc.fair_share_half_life_s = config.fair_share_half_life_s;
  rc.reservations = config.backfill_reservations;
  rc.requeue_preempted = config.requeue_preempted;
  rc.predict = true;
  rc.predict_from_kind_only = true;  // as the server predicts
  // Elastic jobs: both sides' "sleep N" takes N seconds on its minimum and less on more GPUs, by
  // one Amdahl's law, and a restart on a new size costs both sides the same.
  rc.elastic_serial_fraction = kSerialFraction;
  rc.resize_overhead_s = kRestartOverhead;
  return rc;
}

// Every start, a resized job's start again on its new size among them.
inline std::vector<Start> ReplayStarts(const sim::ReplayResult& replay) {
  std::vector<Start> out;
  for (const sim::ReplayRun& r : replay.runs) out.push_back({r.id, r.start, r.gpus});
  return out;
}

}  // namespace tessera
