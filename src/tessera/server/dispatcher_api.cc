// What the API asks of the dispatcher beside the operations on jobs (job_operations.h): simulated
// health, the views (GPUs, quotas, facts, metrics: from the read models, views.h, which
// DispatchState::Publish keeps), the event feed and the history samples; and the start and stop of
// its threads.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tessera/core/clock.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/cdi.h"
#include "tessera/devices/health.h"
#include "tessera/devices/open.h"
#include "tessera/devices/simulated_source.h"
#include "tessera/sched/policy.h"
#include "tessera/sched/scheduler.h"
#include "tessera/server/dispatcher.h"
#include "tessera/server/runner.h"
#include "tessera/server/server_util.h"
#include "tessera/server/submit_checks.h"

namespace tessera::server {

using nlohmann::json;
namespace fs = std::filesystem;

// ---- API ----

absl::Status Dispatcher::Start(bool loop, bool health) {
  if (!inventory_.simulated) {
    spdlog::info("GPUs from {} (driver {}): {}", inventory_.source, inventory_.driver_version,
                 inventory_.gpus.size());
  } else if (!fallback_reason_.empty()) {
    spdlog::warn("SIMULATED machine ({}) because {}: jobs get no real GPU", inventory_.source,
                 fallback_reason_);
  } else {
    spdlog::warn("SIMULATED machine ({}): jobs get no real GPU", inventory_.source);
  }
  if (host_->WatchableByPidfd()) {
    state_->exits = std::make_unique<ExitWatcher>([this] {
      core::MutexLock lock(state_->mu);
      state_->wake.notify_all();
    });
  }
  // A GPU in MPS mode takes no work until its daemon answers (an MPS job placed on it before
  // would run without MPS: a CUDA client that finds no daemon goes on without one).
  for (const devices::MpsGpu& g : mps_->gpus())
    OnMps(g.index, false, "its MPS control daemon is not started yet");
  if (absl::Status st = Recover(); !st.ok()) return st;
  mps_->QuitLeftBehind();
  if (!mps_->gpus().empty()) {
    // Each daemon started (or found running, with the clients of the jobs recovered) before the
    // first pass, then watched.
    mps_->Start(
        std::chrono::milliseconds(static_cast<int64_t>(config_.mps_check_interval_s * 1000)),
        [this](int gpu, bool up, const std::string& reason) { OnMps(gpu, up, reason); });
  }
  if (const JobHost::Confinement c = host_->confinement(); c.mode != "none") {
    const json& where = c.where;
    spdlog::info("confinement: {}: devices by {}; memory {}, cpu {}, pids {}{}", c.mode,
                 where.value("devices", "?"), where.value("memory", "?"), where.value("cpu", "?"),
                 where.value("pids", "?"), c.reason.empty() ? "" : " (" + c.reason + ")");
  } else {
    spdlog::warn("jobs are NOT confined to their GPUs: {}", c.reason);
  }
  {
    std::set<int64_t> keep;
    {
      core::MutexLock lock(state_->mu);
      for (const auto& [id, r] : state_->runs->jobs()) keep.insert(id);
    }
    if (size_t n = host_->Sweep(keep); n > 0)
      spdlog::info("confinement: removed the cgroups of {} jobs that ended while down", n);
  }
  if (health) {
    devices::HealthPolicy hp;
    health_ = std::make_unique<devices::HealthWatch>(
        *source_, static_cast<int>(inventory_.gpus.size()), hp, core::SteadyClock::Get(),
        [this](int gpu, const devices::GpuHealth& h) { OnHealth(gpu, h.healthy, h.reason); });
    health_->Start();
  }
  StartHistory(loop);
  if (loop) loop_->Start();
  return absl::OkStatus();
}

void Dispatcher::Stop() {
  if (stop_.exchange(true)) return;
  feed_.Close();  // event streams end, the sampler stops
  if (sampler_) sampler_->Stop();
  if (loop_) loop_->Stop();
  if (state_) state_->exits.reset();  // not under the lock: its thread may be waiting for it
  if (health_) health_->Stop();
  // The daemons keep running, as the jobs do: their clients are MPS jobs a restarted server
  // re-adopts.
  if (mps_) mps_->StopWatch(false);
  if (host_) host_->Close();  // the cgroup subtree goes when no job is left in it
  // Jobs keep running: a restarted server re-adopts them.
}

absl::Status Dispatcher::SimulateHealth(int gpu, std::optional<uint64_t> xid,
                                        std::optional<bool> lost) {
  auto* sim = dynamic_cast<devices::SimulatedSource*>(source_.get());
  if (!inventory_.simulated || sim == nullptr) {
    return HttpError(409,
                     "this machine's GPUs are real: only a simulated machine's can be made sick");
  }
  if (gpu < 0 || static_cast<size_t>(gpu) >= inventory_.gpus.size()) {
    return HttpError(404,
                     fmt::format("gpu {}: no such GPU (0..{})", gpu, inventory_.gpus.size() - 1));
  }
  absl::Status st;
  if (xid) {
    devices::HealthEvent e;
    e.gpu = gpu;
    e.kind = devices::HealthEvent::Kind::kXid;
    e.xid = *xid;
    e.detail = "injected through the API";
    st = sim->Inject(e);
  } else if (lost) {
    st = sim->SetLost(gpu, *lost);
  }
  if (!st.ok()) return HttpError(400, std::string(st.message()));
  return absl::OkStatus();
}

std::vector<Dispatcher::GpuState> Dispatcher::Gpus() {
  const std::vector<devices::GpuTelemetry> telemetry = Telemetry();
  const std::shared_ptr<const MachineView> v = state_->views.machine();
  std::vector<GpuState> out(v->gpus.size());
  for (size_t g = 0; g < out.size(); ++g) {
    const GpuView& gv = v->gpus[g];
    GpuState& s = out[g];
    s.jobs = gv.jobs;
    s.healthy = gv.healthy;
    s.reason = gv.reason;
    s.milli = gv.milli;
    s.memory_mib = gv.memory_mib;
    if (g < telemetry.size()) s.telemetry = telemetry[g];
  }
  for (const devices::MpsDaemonState& m : mps_->States()) {
    if (m.gpu < 0 || static_cast<size_t>(m.gpu) >= out.size()) continue;
    out[m.gpu].sharing = core::GpuSharing::kMps;
    out[m.gpu].mps = m;
  }
  return out;
}

std::vector<Dispatcher::QuotaState> Dispatcher::Quotas() const {
  return state_->views.machine()->quotas;
}

Dispatcher::Facts Dispatcher::Describe() const {
  Facts f;
  f.hostname = hostname_;
  f.arbiter_file = ArbiterFile();
  f.arbiter_access = host_->arbiter_access();
  f.containers = containers_;
  f.containers_off = containers_off_;
  f.cdi_spec = cdi_spec_path_;
  f.confinement = host_->confinement().where;
  const std::shared_ptr<const MachineView> v = state_->views.machine();
  f.queued = v->queued;
  f.running = v->running;
  return f;
}

ServerMetricsSnapshot Dispatcher::MetricsSnapshot() {
  // From the views, the telemetry and the health watch: no lock of the scheduler's.
  ServerMetricsSnapshot snap;
  snap.hostname = hostname_;
  snap.simulated = inventory_.simulated;
  snap.gpus = inventory_.gpus;
  snap.telemetry = Telemetry();
  if (health_) {
    for (const devices::GpuHealth& h : health_->Snapshot()) {
      // dcgm-exporter's XID_ERRORS: the last XID, where the driver gives readings at all.
      if (snap.xids.size() < snap.telemetry.size()) {
        devices::GpuTelemetry& t = snap.telemetry[snap.xids.size()];
        if (t.utilization || t.memory_used_bytes) t.last_xid = h.last_xid;
      }
      snap.xids.push_back(h.xid_count);
    }
  }
  for (const devices::MpsDaemonState& m : mps_->States())
    snap.mps.push_back({m.gpu, m.up, m.deaths, m.server_faults});
  const std::shared_ptr<const MachineView> v = state_->views.machine();
  for (const GpuView& g : v->gpus) {
    snap.healthy.push_back(g.healthy);
    snap.allocated_share.push_back(g.milli / 1000.0);
    snap.allocated_memory_bytes.push_back(g.memory_mib * (int64_t{1} << 20));
  }
  for (const auto& [id, a] : v->active) {
    if (a.starting) continue;
    for (size_t i = 0; i < a.gpus.size(); ++i) {
      snap.jobs.push_back({.id = id,
                           .user = a.owner,
                           .gpu = a.gpus[i],
                           .ordinal = static_cast<int>(i),
                           .share = a.region.empty() ? 1.0 : a.gpu_milli / 1000.0,
                           .limit_bytes = a.memory_limit_mib * (int64_t{1} << 20),
                           .region = a.region});
    }
  }
  snap.queued = v->queued;
  snap.running = v->running;
  snap.scheduling = v->scheduling;
  return snap;
}

void Dispatcher::GpuHealth(std::vector<bool>* healthy, std::vector<std::string>* reasons) const {
  const std::shared_ptr<const MachineView> v = state_->views.machine();
  if (healthy) healthy->clear();
  if (reasons) reasons->clear();
  for (const GpuView& g : v->gpus) {
    if (healthy) healthy->push_back(g.healthy);
    if (reasons) reasons->push_back(g.reason);
  }
}

std::pair<double, uint64_t> Dispatcher::Samples() const { return sampler_->Samples(); }

void Dispatcher::StartHistory(bool thread) {
  store_->set_on_change([this] { feed_.Bump(); });
  if (thread) sampler_->Start();
}

std::string Dispatcher::TakeSample() { return sampler_->TakeSample(); }

}  // namespace tessera::server
