// What the API asks of the dispatcher: submissions, cancels, holds, priorities, purges,
// simulated health, the views (jobs, GPUs, quotas, facts, metrics: from the read models, views.h,
// which Publish keeps), the event feed and the history samples; and the start and stop of its
// threads.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tessera/core/clock.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/cdi.h"
#include "tessera/devices/health.h"
#include "tessera/devices/open.h"
#include "tessera/devices/simulated_source.h"
#include "tessera/sched/cycle.h"
#include "tessera/sched/policy.h"
#include "tessera/sched/scheduler.h"
#include "tessera/server/acct.h"
#include "tessera/server/api_response.h"
#include "tessera/server/dispatcher.h"
#include "tessera/server/openapi.h"
#include "tessera/server/runner.h"
#include "tessera/server/server_util.h"
#include "tessera/server/submit_checks.h"

namespace tessera::server {

using nlohmann::json;
namespace fs = std::filesystem;

// ---- API ----

std::vector<int64_t> Dispatcher::BeginChange(const std::vector<int64_t>& ids) {
  changed_.wait(mu_,
                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !admission_.AnyChanging(ids); });
  return admission_.BeginChange(ids, admission_world_);
}

void Dispatcher::EndChange(const std::vector<int64_t>& ids) {
  admission_.EndChange(ids);
  dirty_ = true;  // back into the cycle's queue at the next pass
  changed_.notify_all();
}

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
    exits_ = std::make_unique<ExitWatcher>([this] {
      core::MutexLock lock(mu_);
      wake_.notify_all();
    });
  }
  if (absl::Status st = Recover(); !st.ok()) return st;
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
      core::MutexLock lock(mu_);
      for (const auto& [id, r] : runs_->jobs()) keep.insert(id);
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
  if (loop) loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Dispatcher::Stop() {
  if (stop_.exchange(true)) return;
  feed_.Close();  // event streams end, the sampler stops
  if (sampler_) sampler_->Stop();
  wake_.notify_all();
  if (loop_.joinable()) loop_.join();
  exits_.reset();  // not under mu_: its thread may be waiting for it
  if (health_) health_->Stop();
  if (host_) host_->Close();  // the cgroup subtree goes when no job is left in it
  // Jobs keep running: a restarted server re-adopts them.
}

absl::StatusOr<Dispatcher::Submitted> Dispatcher::Submit(JobSpec spec_in, const Caller& caller,
                                                         const std::string& idempotency_key) {
  // Who may submit what, and depend on whose jobs, was asked of Rights by the API, before this.
  const std::string& user = caller.user;
  const uint32_t uid = caller.uid;
  std::optional<JobSpec> spec(std::move(spec_in));
  // Room for the store to record every end: no new work once the state folder's disk is nearly
  // full.
  if (absl::Status st = CheckDiskRoom(config_, ends_->disk_full()); !st.ok()) return st;
  if (absl::Status st = CheckSubmitLimits(*spec, {.config = &config_,
                                                  .inventory = &inventory_,
                                                  .containers = containers_.has_value(),
                                                  .containers_off = containers_off_});
      !st.ok()) {
    return st;
  }
  // Refuse what can never fit (more GPUs than the machine has, a model it lacks) now, not in the
  // queue: by the scheduler's own test of a GPU against the request.
  const core::Request r = SubmissionFor(*spec, 1, user, uid).entry.request;
  {
    core::MutexLock lock(mu_);
    if (absl::Status st = CheckFits(*spec, r, engine_->scheduler().state().node_spec(0),
                                    engine_->scheduler().quotas(), inventory_.gpus.size());
        !st.ok()) {
      return st;
    }
  }
  // An array: its indices, within the server's maximum.
  std::optional<ArrayRange> range;
  if (!spec->array.empty()) {
    auto a = ParseArray(spec->array, config_.max_array_tasks);
    if (!a.ok()) return HttpError(400, fmt::format("array: {}", std::string(a.status().message())));
    range = *std::move(a);
  }
  const bool held = spec->hold;
  spec->hold = false;  // a state of the job (held, released), not of its spec
  JobRecord rec;
  rec.name = spec->name;
  rec.owner_uid = uid;
  rec.owner = user;
  rec.spec_json = JobSpecToJson(*spec).dump();
  // The user's caps on what waits: an array counts each task, its spec once.
  {
    core::MutexLock lock(mu_);
    if (absl::Status st =
            CheckQueueRoom(config_, user, admission_.JobsOf(uid), range ? range->indices.size() : 1,
                           admission_.BytesOf(uid), rec.spec_json.size());
        !st.ok()) {
      return st;
    }
  }
  // Dependencies: on jobs that exist (submitted before this one, so no cycle can form) and that
  // can still turn out as asked (whose they may be was asked of Rights by the API).
  {
    core::MutexLock lock(mu_);
    const DependencyLookup look{
        .exists = [&](int64_t job, int task) -> absl::Status {
          if (task < 0) return store_->Get(job).status();
          return store_->TaskId(job, task).ok() ? absl::OkStatus() : absl::NotFoundError("");
        },
        .outcome = [&](const Dependency& d)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS { return Outcome(d); }};  // mu_ held above
    if (absl::Status st = CheckDependencies(spec->after, look); !st.ok()) return st;
  }
  rec.priority = spec->priority;
  rec.held = held;
  rec.idempotency_key = idempotency_key;
  if (absl::Status st = CheckIdempotencyKey(idempotency_key); !st.ok()) return st;
  const double now = Now();
  bool existed = false;
  // Durable before the answer; an array's tasks all at once.
  auto id = range ? store_->InsertArray(rec, range->indices, now, &existed)
                  : store_->Insert(rec, now, &existed);
  if (!id.ok()) return HttpError(500, std::string(id.status().message()));
  if (existed) {
    // A repeat (the client did not hear the first answer): the job it already made, once.
    auto first = store_->Get(*id);
    if (!first.ok()) return HttpError(500, std::string(first.status().message()));
    if (first->spec_json != rec.spec_json) {
      return HttpError(422, fmt::format("Idempotency-Key '{}' was used for another submission "
                                        "(job {})",
                                        rec.idempotency_key, *id));
    }
    spdlog::info("job {}: submitted again by {} (same Idempotency-Key): not stored twice", *id,
                 user);
    return Submitted{*std::move(first), true, 0};
  }
  const size_t n = range ? range->indices.size() : 1;
  {
    ChangeLock lock(*this);
    auto shared = std::make_shared<const JobSpec>(*std::move(spec));
    for (size_t i = 0; i < n; ++i) {
      Queued q;
      q.id = *id + static_cast<int64_t>(i);
      q.priority = shared->priority;
      q.owner = user;
      q.uid = uid;
      q.spec = shared;
      q.submitted = q.since = now;
      q.spec_bytes = rec.spec_json.size();
      q.held = held;
      if (range) {
        q.array_id = *id;
        q.array_index = range->indices[i];
        q.throttle = range->throttle;
      }
      Enqueue(std::move(q));
    }
    spdlog::info("job {}: submitted by {}{}{}: {}", *id, user,
                 range ? fmt::format(" (array of {} tasks, {})", n, shared->array) : "",
                 held ? " held" : "", LogText(fmt::format("{}", fmt::join(shared->command, " "))));
  }
  wake_.notify_all();
  auto stored = store_->Get(*id);
  if (!stored.ok()) return HttpError(500, std::string(stored.status().message()));
  return Submitted{*std::move(stored), false, range ? n : 0};
}

absl::Status Dispatcher::Cancel(const std::vector<int64_t>& ids, const std::string& ref,
                                const JobRecord& first, const std::string& user, bool force) {
  const int64_t id = ids.front();
  const double now = Now();
  const std::string reason = "cancelled by " + user + (force ? " (forced: SIGKILL)" : "");
  ChangeLock lock(*this);
  // Queued ones in one transaction (an array's thousands of tasks among them), stored without mu_
  // while they are kept out of the cycle; running ones are stopped; the rest (ended, or preempted
  // and not queued again) one by one.
  const std::vector<int64_t> queued = BeginChange(ids);
  std::vector<int64_t> others;
  for (int64_t t : ids) {
    if (admission_.Contains(t)) continue;
    if (Running* r = runs_->Find(t)) {
      runs_->RequestStop(*r, "cancel", reason, now);
      if (force) runs_->Kill(*r, "cancelled with --force");
    } else if (auto s = starting_.find(t); s != starting_.end()) {
      s->second.cancelled_by = reason;  // stopped as soon as its process exists
    } else if (finishing_.contains(t)) {
      if (ids.size() == 1) {
        EndChange(queued);
        return HttpError(409,
                         fmt::format("job {} has already ended (its end is being recorded)", ref));
      }
    } else {
      others.push_back(t);
    }
  }
  for (int64_t t : others) {
    auto o = t == id ? absl::StatusOr<JobRecord>(first) : store_->Get(t);
    if (!o.ok() || IsTerminal(o->state)) {
      if (ids.size() == 1) {
        return HttpError(
            409, fmt::format("job {} has already ended ({})", ref, JobStateName(first.state)));
      }
      continue;
    }
    if (absl::Status st = store_->Transition(t, JobState::kCancelled, reason, now); !st.ok()) {
      EndChange(queued);
      return HttpError(500, std::string(st.message()));
    }
  }
  if (!queued.empty()) {
    Publish();  // the running ones' stops
    mu_.unlock();
    absl::Status st = store_->TransitionMany(queued, JobState::kCancelled, reason, now);
    mu_.lock();
    if (st.ok()) {
      for (int64_t t : queued) {
        admission_.Erase(t);
        queue_changes_.emplace_back(t, false);
      }
    }
    EndChange(queued);
    if (!st.ok()) return HttpError(500, std::string(st.message()));
  }
  wake_.notify_all();
  return absl::OkStatus();
}

absl::Status Dispatcher::Hold(const std::vector<int64_t>& ids, const std::string& ref,
                              const JobRecord& first, bool hold, const std::string& user) {
  const int64_t id = ids.front();
  const double now = Now();
  core::MutexLock lock(mu_);  // what the views show does not change
  // Kept out of the cycle while the change is stored without mu_: those whose state changes.
  const std::vector<int64_t> taken = BeginChange(ids);
  if (ids.size() == 1 && taken.empty()) {  // not queued (any more: BeginChange may have waited)
    auto now_r = store_->Get(id);
    return HttpError(409, fmt::format("job {} is {}: only a queued job can be {}", ref,
                                      JobStateName(now_r.ok() ? now_r->state : first.state),
                                      hold ? "held" : "released"));
  }
  std::vector<int64_t> change;
  for (int64_t t : taken) {
    if (admission_.Find(t)->held != hold) change.push_back(t);
  }
  absl::Status st;
  if (!change.empty()) {
    const std::string reason = fmt::format("{} by {}", hold ? "held" : "released", user);
    mu_.unlock();
    st = store_->SetHeld(change, hold, reason, now);
    mu_.lock();
    for (int64_t t : change) {
      if (!st.ok()) break;  // still queued: nothing takes a job that is changing
      admission_.SetHeld(t, hold,
                         hold ? fmt::format("held by {} (tessera release {})", user, ref)
                              : "released; not yet considered");
    }
    // Released: it keeps its place (its submission time), so goes where it would have been.
    if (st.ok()) spdlog::info("job {}: {} ({} job(s))", ref, reason, change.size());
  }
  EndChange(taken);
  if (!st.ok()) return HttpError(500, std::string(st.message()));
  wake_.notify_all();
  return absl::OkStatus();
}

Dispatcher::Live Dispatcher::LiveOf(int64_t id) const {
  Live l;
  const double now = Now();
  Views::Lookup f = views_.Find(id);
  if (f.queued) {
    core::MutexLock lock(mu_);
    if (const Queued* q = admission_.Find(id)) {
      l.queued = l.known = true;
      l.waiting = WaitingReason(id);
      const std::optional<double> start = engine_->cycle().ExpectedStart(std::to_string(id));
      // None: no reservation; infinite: one whose start is unknown (reserved all the same).
      if (start && std::isfinite(*start)) l.expected_start = std::max(*start, now);
      l.reserved = start.has_value();
      l.prediction = history_->Predict(RunKindOf(*q->spec, q->owner));
      return l;
    }
    f = views_.Find(id);  // started (or ended) meanwhile: the view under mu_ says so
  }
  if (f.active == nullptr) return l;
  const ActiveJob& a = *f.active;
  l.known = true;
  l.stopping = a.stopping;
  l.prediction = history_->Predict(RunKindOf(*a.spec, a.owner));
  if (!a.starting) {
    l.pid = a.pid;
    if (l.prediction.seconds > 0) l.expected_end = a.started + l.prediction.seconds;
  }
  return l;
}

absl::Status Dispatcher::SetPriority(int64_t id, const std::string& ref, const JobRecord& first,
                                     int priority, const Caller& caller) {
  // The caller's right to this priority was asked of Rights by the API, before this.
  const double now = Now();
  core::MutexLock lock(mu_);  // what the views show does not change
  // Out of the cycle while the change is stored without mu_; back at its new place after.
  const std::vector<int64_t> change = BeginChange({id});
  if (change.empty()) {  // not queued (any more: BeginChange may have waited)
    auto now_r = store_->Get(id);
    return HttpError(409, fmt::format("job {} is {}: only a queued job's priority can change", ref,
                                      JobStateName(now_r.ok() ? now_r->state : first.state)));
  }
  const std::string reason =
      fmt::format("priority {} -> {} by {}", admission_.Find(id)->priority, priority, caller.user);
  mu_.unlock();
  absl::Status st = store_->SetPriority(id, priority, reason, now);
  mu_.lock();
  if (Queued* q = admission_.Find(id); st.ok() && q) {  // nothing takes it meanwhile
    q->priority = priority;
    q->waiting = "priority changed; not yet considered";
    spdlog::info("job {}: {}", id, reason);
  }
  EndChange(change);
  if (!st.ok()) return HttpError(500, std::string(st.message()));
  wake_.notify_all();
  return absl::OkStatus();
}

std::set<int64_t> Dispatcher::DependedOn() const {
  std::set<int64_t> keep;
  for (const auto& [id, q] : admission_.jobs()) {
    for (const Dependency& d : q.spec->after) keep.insert(d.job);
  }
  return keep;
}

absl::StatusOr<Dispatcher::Purged> Dispatcher::Purge(const PurgeAges& ages, double now) {
  Purged all;
  Store::Ended logs_from;  // the oldest end: every page of logs up to the cutoff
  for (;;) {
    absl::StatusOr<Purged> page;
    {
      core::MutexLock lock(mu_);
      page = retention_->PurgePage(ages, now, DependedOn(), &logs_from, "purge");
    }
    if (!page.ok()) return page.status();
    all.jobs += page->jobs;
    all.logs += page->logs;
    all.environments += page->environments;
    if (!page->more) return all;
  }
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

void Dispatcher::Publish() {
  MachineView v;
  const auto& state = engine_->scheduler().state();
  v.gpus.resize(inventory_.gpus.size());
  for (size_t g = 0; g < v.gpus.size(); ++g) {
    const auto& use = state.gpu_use(0, static_cast<int>(g));
    v.gpus[g] = {.healthy = gpu_healthy_[g],
                 .reason = gpu_health_reason_[g],
                 .milli = use.milli,
                 .memory_mib = use.memory_mib};
  }
  auto list = [&](int64_t id, const std::vector<int>& gpus) {
    for (int g : gpus) {
      if (g >= 0 && static_cast<size_t>(g) < v.gpus.size()) v.gpus[g].jobs.push_back(id);
    }
  };
  for (const auto& [id, r] : runs_->jobs()) {
    v.active.emplace(id, ActiveJob{.spec = r.spec,
                                   .owner = r.owner,
                                   .gpus = r.gpus,
                                   .pid = r.pid,
                                   .started = r.started,
                                   .stopping = r.stop.empty() ? "" : r.stop_reason,
                                   .gpu_milli = r.gpu_milli,
                                   .memory_limit_mib = r.memory_limit_mib,
                                   .region = r.region});
    list(id, r.gpus);
  }
  // Being started: recorded as running, its process not yet known here.
  for (const auto& [id, st] : starting_) {
    v.active.emplace(id, ActiveJob{.starting = true,
                                   .spec = st.spec,
                                   .owner = st.owner,
                                   .gpus = st.gpus,
                                   .stopping = st.cancelled_by});
    list(id, st.gpus);
  }
  for (GpuView& g : v.gpus) std::ranges::sort(g.jobs);
  const sched::QuotaManager& qm = engine_->scheduler().quotas();
  auto add = [&](const std::string& kind, const std::string& name, const std::string& owner) {
    const sched::OwnerQuota* q = qm.Get(owner);
    if (q != nullptr) v.quotas.push_back({kind, name, *q, qm.Used(owner)});
  };
  for (const auto& [user, q] : config_.quotas) add("user", user, user);
  for (const auto& [group, q] : config_.group_quotas) add("group", group, "group:" + group);
  v.queued = admission_.size();
  v.running = runs_->size();
  v.scheduling = scheduling_;
  views_.Publish(std::move(v), queue_changes_);
  queue_changes_.clear();
}

std::vector<Dispatcher::GpuState> Dispatcher::Gpus() {
  const std::vector<devices::GpuTelemetry> telemetry = Telemetry();
  const std::shared_ptr<const MachineView> v = views_.machine();
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
  return out;
}

std::vector<Dispatcher::QuotaState> Dispatcher::Quotas() const { return views_.machine()->quotas; }

Dispatcher::Facts Dispatcher::Describe() const {
  Facts f;
  f.hostname = hostname_;
  f.arbiter_file = ArbiterFile();
  f.arbiter_access = host_->arbiter_access();
  f.containers = containers_;
  f.containers_off = containers_off_;
  f.cdi_spec = cdi_spec_path_;
  f.confinement = host_->confinement().where;
  const std::shared_ptr<const MachineView> v = views_.machine();
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
  const std::shared_ptr<const MachineView> v = views_.machine();
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
  const std::shared_ptr<const MachineView> v = views_.machine();
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
