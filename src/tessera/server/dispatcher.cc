// The dispatcher: its setup (the state folder, the machine, the rooms in the order they need one
// another, containers, the arbiter), what recovery asks of it after a restart, and the health
// watch's changes. Its start and stop and the views' answers are in dispatcher_api.cc.
#include "tessera/server/dispatcher.h"

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
#include "tessera/server/recovery.h"
#include "tessera/server/runner.h"
#include "tessera/server/server_util.h"
#include "tessera/server/state_dir.h"

namespace tessera::server {

using nlohmann::json;
namespace fs = std::filesystem;

// ---- the daemon ----

Dispatcher::Dispatcher(ServerConfig config, ServerDeps deps)
    : config_(std::move(config)),
      clock_(deps.clock ? deps.clock : &core::SystemClock::Get()),
      launcher_(deps.launcher ? deps.launcher : &process_launcher_),
      host_(deps.host),
      store_(std::move(deps.store)),
      source_(std::move(deps.source)) {}

Dispatcher::~Dispatcher() {
  Stop();
  if (state_lock_ >= 0) close(state_lock_);
}

absl::StatusOr<std::unique_ptr<Dispatcher>> Dispatcher::Create(ServerConfig config,
                                                               ServerDeps deps) {
  std::unique_ptr<Dispatcher> s(new Dispatcher(std::move(config), std::move(deps)));
  const ServerConfig& c = s->config_;
  // One server per state folder, its lock taken before anything in it is read or changed
  // (state_dir.h).
  auto lock = TakeStateDir(c.state_dir);
  if (!lock.ok()) return lock.status();
  s->state_lock_ = *lock;
  if (!c.cgroup_name_set) s->config_.cgroup_name = StateCgroupName(c.state_dir);
  // Jobs preload the server's own copy of the intercept library, installed by rename (issue 49):
  // a rebuild or reinstall writes the build's file in place (the linker does), which would kill
  // every running job that has it mapped; a server restarted on a new build replaces this name and
  // its running jobs keep the inode they mapped.
  if (!c.intercept_library.empty())
    s->config_.intercept_library = InstallInterceptLibrary(c.intercept_library, c.state_dir);
  std::error_code ec;
  fs::create_directories(fs::path(c.socket).parent_path(), ec);
  if (!s->store_) {
    auto store = Store::Open(c.state_dir + "/tessera.db");
    if (!store.ok()) return store.status();
    s->store_ = std::move(*store);
  }
  if (!s->host_) {
    auto cgroups = Cgroups::Open(CgroupOptions{.mode = c.confinement, .name = c.cgroup_name});
    if (!cgroups->busy().empty()) {
      return absl::FailedPreconditionError(fmt::format(
          "confinement: {}: give each server its own confinement.cgroup", cgroups->busy()));
    }
    auto private_dirs = std::make_unique<PrivateDirFolders>(c.private_tmp, "/tmp", "/dev/shm",
                                                            InstanceName(c.state_dir));
    if (!private_dirs->enabled())
      spdlog::info("private /tmp: jobs share the host's /tmp and /dev/shm: {}",
                   private_dirs->reason());
    s->own_host_ = std::make_unique<LocalJobHost>(s->launcher_, std::move(cgroups),
                                                  s->ArbiterFile(), std::move(private_dirs),
                                                  std::vector<std::string>{c.state_dir});
    s->host_ = s->own_host_.get();
  }

  if (!s->source_) {
    devices::OpenOptions open;
    open.simulate = c.simulate;
    open.fallback_simulate = c.fallback_simulate;
    open.nvml_library = c.nvml_library;
    auto opened = devices::OpenDeviceSource(open);
    if (!opened.ok()) return opened.status();
    s->source_ = std::move(opened->source);
    s->fallback_reason_ = opened->fallback_reason;
  }
  auto inv = s->source_->Discover();
  if (!inv.ok()) return inv.status();
  s->inventory_ = *inv;
  s->hostname_ = s->inventory_.hostname.empty() ? Hostname() : s->inventory_.hostname;

  sched::SchedulerConfig sc;
  auto policies = sched::ParsePolicies(c.policy);
  if (!policies.ok())
    return absl::InvalidArgumentError(
        fmt::format("policy: {}", std::string(policies.status().message())));
  sc.policies = *policies;
  auto scheduler = std::make_unique<sched::Scheduler>(sc);
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  core::NodeSpec node = core::NodeFromInventory(s->inventory_, cpus * 1000,
                                                static_cast<int64_t>(pages) * page / (1 << 20));
  // GPUs in MPS mode (mps.gpus), each with its control daemon.
  {
    auto mps = devices::MpsGpusOf(c.mps_gpus, s->inventory_);
    if (!mps.ok()) return mps.status();
    for (const devices::MpsGpu& g : *mps) node.gpus[g.index].sharing = core::GpuSharing::kMps;
    s->mps_ = std::make_unique<devices::MpsDaemons>(c.mps_control, c.state_dir + "/mps", *mps);
  }
  if (auto n = scheduler->AddNode(node); !n.ok()) return n.status();
  for (const auto& [user, q] : c.quotas) scheduler->quotas().Set(user, q);
  for (const auto& [group, q] : c.group_quotas) scheduler->quotas().Set("group:" + group, q);
  // The rooms (dispatcher.h), in the order they need one another.
  s->state_ = std::make_unique<DispatchState>(s->config_, s->rights_, *s->store_,
                                              s->inventory_.gpus.size());
  DispatchState& state = *s->state_;
  s->loop_ = std::make_unique<SchedulingLoop>(state, *s->host_, s->launch_setup_, *s->clock_);
  // A job stopped for preemption or a failed GPU goes back through the store and Admit (holds,
  // dependencies, per-user limits): the engine says so, the loop does it.
  {
    // Set up before any thread runs; under the lock all the same, as every later use is.
    core::MutexLock lock(state.mu);
    state.engine = std::make_unique<sched::Engine>(
        std::move(scheduler), s->loop_->executor(),
        sched::EngineOptions{.cycle = {.fair_share_half_life_s = c.fair_share_half_life_s,
                                       .reservations = c.backfill_reservations,
                                       .note_changes = true},  // for the views
                             .requeue_preempted = c.requeue_preempted,
                             .requeue_unhealthy = c.unhealthy_action == "requeue",
                             .requeue_through_driver = true,
                             .predict_from_kind_only = true,
                             .max_starts_per_step = c.max_starts_per_pass,
                             .max_starts_setting = "limits.max_starts_per_pass",
                             .utilization_ceiling_pct = c.utilization_ceiling_pct,
                             .utilization_ceiling_strict = c.utilization_ceiling_strict});
    state.history = &state.engine->history();
    auto age = [](double s) { return s > 0 ? std::optional<double>(s) : std::nullopt; };
    state.retention = std::make_unique<Retention>(
        *s->store_, c.state_dir,
        PurgeAges{age(c.retention_jobs_s), age(c.retention_logs_s), age(c.retention_env_s)});
    state.runs = std::make_unique<RunningJobs>(
        *s->host_, RunningJobs::Options{.state_dir = c.state_dir,
                                        .max_log_bytes_per_job = c.max_log_bytes_per_job});
    state.Publish();
  }
  s->sampler_ = std::make_unique<Sampler>(
      *s->store_, *s->source_, s->inventory_.gpus.size(), *s->host_, state.views, *s->clock_,
      s->feed_,
      Sampler::Options{.interval_s = c.history_interval_s, .window_s = c.history_window_s},
      [d = s.get()](const std::vector<devices::GpuTelemetry>& telemetry,
                    const std::map<int64_t, JobHost::ShareUse>& shares) {
        d->loop_->Measure(telemetry, shares);
      });
  s->SetUpContainers();
  state.ends =
      std::make_unique<JobEnds>(*s->host_, *s->store_, *state.history,
                                JobEnds::Options{.state_dir = c.state_dir,
                                                 .containers = s->containers_.has_value(),
                                                 .sizing = SizingPolicyOf(c, nullptr, {})});
  // Room kept to record how jobs end when the disk fills up (given up then: job_ends.h).
  if (!state.ends->MakeReserve()) {
    spdlog::warn(
        "{}/reserve: cannot keep {} MiB for recording job ends ({}); submits are refused "
        "until there is room",
        c.state_dir, JobEnds::kReserveBytes >> 20, strerror(errno));
    state.ends->set_disk_full();
  }
  s->launch_setup_ = {.config = &s->config_,
                      .inventory = &s->inventory_,
                      .node = &s->node(),
                      .hostname = s->hostname_,
                      .arbiter_file = s->ArbiterFile(),
                      .confines = s->host_->confines(),
                      .containers = s->containers_.has_value(),
                      .containers_off = s->containers_off_,
                      .mps = s->mps_.get()};
  s->ops_ = std::make_unique<JobOperations>(state, s->launch_setup_, *s->clock_);
  return s;
}

void Dispatcher::SetUpContainers() {
  if (config_.podman.empty()) {
    containers_off_ = "containers are turned off in the config (containers.podman is empty)";
    return;
  }
  const std::string dir = !config_.cdi_spec_dir.empty() ? config_.cdi_spec_dir
                          : geteuid() == 0              ? std::string("/var/run/cdi")
                                                        : config_.state_dir + "/cdi";
  auto rt = FindPodman(config_.podman, dir, config_.podman_run_args);
  if (!rt.ok()) {
    containers_off_ = fmt::format("podman: {}", std::string(rt.status().message()));
    if (rt.status().code() == absl::StatusCode::kNotFound) {
      spdlog::info("containers: {}; jobs with an image are refused", containers_off_);
    } else {
      spdlog::warn("containers: {}; jobs with an image are refused", containers_off_);
    }
    return;
  }
  // A simulated machine has no driver to hand over: its devices carry only their environment.
  const devices::DriverFiles files =
      inventory_.simulated ? devices::DriverFiles{} : devices::FindDriverFiles(inventory_);
  auto path = devices::WriteCdiSpec(dir, devices::BuildCdiSpec(inventory_, files));
  if (!path.ok()) {
    containers_off_ = std::string(path.status().message());
    spdlog::warn("containers: {}; jobs with an image are refused", containers_off_);
    return;
  }
  cdi_spec_path_ = *path;
  containers_ = *rt;
  {
    core::MutexLock lock(state_->mu);
    state_->runs->set_containers(true);  // a killed job's container is removed by name
  }
  // Jobs with an image start as podman's client, through the host every job goes through.
  host_->UseContainers(*rt);
  size_t nodes = files.control_nodes.size();
  for (const std::string& n : files.gpu_nodes) nodes += n.empty() ? 0 : 1;
  spdlog::info(
      "containers: {} at {}; CDI spec {} ({} GPUs as {}=<uuid>, {} device nodes, {} driver files)",
      rt->version, rt->podman, *path, inventory_.gpus.size(), devices::kCdiKind, nodes,
      files.mounts.size());
}

std::string Dispatcher::ArbiterFile() const { return config_.state_dir + "/arbiter/gpu.arbiter"; }

std::string Dispatcher::TaskLog(int64_t id, int task, const char* suffix) const {
  return TaskLogPath(config_.state_dir, id, task, suffix);
}

std::string Dispatcher::OutputFile(int64_t id, int64_t array_id, int array_index,
                                   const std::string& owner, const JobSpec& spec, int task,
                                   bool err) const {
  return OutputFilePath(launch_setup_, id, array_id, array_index, owner, spec, task, err);
}

std::string Dispatcher::JobFile(const char* dir, int64_t id, const char* suffix) const {
  return JobFilePath(config_.state_dir, dir, id, suffix);
}

void Dispatcher::LoadHistory() {
  // What the ends in the store teach, by the rule of an end as it happens (LearnFromEnd): the
  // successes, trials, and failures that outgrew their automatic memory.
  auto done = store_->List({JobState::kSucceeded, JobState::kFailed});
  if (!done.ok()) {
    spdlog::warn("history: cannot read the jobs that ended ({}); no predictions yet",
                 std::string(done.status().message()));
    return;
  }
  std::map<int64_t, std::shared_ptr<const JobSpec>> array_specs;
  const size_t from = done->size() > kHistoryJobs ? done->size() - kHistoryJobs : 0;
  size_t runs = 0;
  for (size_t i = from; i < done->size(); ++i) {
    const JobRecord& r = (*done)[i];
    if (!r.started_at || !r.ended_at) continue;
    std::shared_ptr<const JobSpec>& spec = array_specs[r.array_id != 0 ? r.array_id : -r.id];
    if (!spec) {
      auto parsed = ParseJobSpec(r.spec_json);
      if (!parsed.ok()) continue;
      spec = std::make_shared<const JobSpec>(*std::move(parsed));
    }
    const RecordedUse use = UsageOf(r);
    int64_t outgrown_mib = 0;
    MemoryOutgrownAtEnd(*spec, r.state == JobState::kFailed, use.trial, use.memory, {},
                        &outgrown_mib);
    LearnFromEnd(*state_->history, *spec, r.owner,
                 {.to = r.state,
                  .trial = use.trial,
                  .run_s = *r.ended_at - *r.started_at,
                  .util = use.util,
                  .shared_gpu = use.shared_gpu,
                  .peak_mib = use.memory.peak_mib,
                  .outgrown_mib = outgrown_mib});
    runs += r.state == JobState::kSucceeded || outgrown_mib > 0;
  }
  // A job the server tried first, re-queued sized from its trial (JobEnds), has not ended: its
  // trial, recorded with it, teaches as well (else a restart before its run ends forgot it, and
  // the next job of its kind was tried again).
  size_t trials = 0;
  auto waiting = store_->List({JobState::kQueued, JobState::kRunning, JobState::kPreempted});
  for (const JobRecord& r : waiting.ok() ? *waiting : std::vector<JobRecord>{}) {
    if (r.usage_json.empty()) continue;
    const RecordedUse use = UsageOf(r);
    if (!use.trial) continue;
    auto spec = ParseJobSpec(r.spec_json);
    if (!spec.ok()) continue;
    LearnFromEnd(*state_->history, *spec, r.owner,
                 {.to = JobState::kPreempted,
                  .trial = true,
                  .util = use.util,
                  .shared_gpu = use.shared_gpu,
                  .peak_mib = use.memory.peak_mib});
    ++trials;
  }
  spdlog::info("history: {} runs of jobs that ended, {} trials of jobs re-queued, {} keys", runs,
               trials, state_->history->keys());
}

// What recovery (recovery.h) asks of the dispatcher, under the lock.
struct Dispatcher::RecoveryWorld final : Recovery::World {
  explicit RecoveryWorld(Dispatcher& d) : d(d) {}
  void Enqueue(QueuedJob q) override {
    d.state_->mu.AssertHeld();
    d.state_->Enqueue(std::move(q));
  }
  absl::Status Adopt(const JobRecord& r, std::shared_ptr<const JobSpec> spec,
                     std::optional<StopAsked> stop) override {
    d.state_->mu.AssertHeld();
    const double now = d.Now();
    json placement = json::parse(r.placement_json, nullptr, false);
    sched::Allocation a;
    a.id = std::to_string(r.id);
    a.node = 0;
    sched::Submission sub =
        d.state_->SubmissionFor(*spec, r.id, r.owner, r.owner_uid, r.submitted_at);
    a.request = sub.entry.request;
    d.state_->engine->Expect(a.request, *sub.kind);
    if (placement.is_object()) {
      for (const auto& g : placement.value("gpus", json::array()))
        a.gpus.push_back(g.value("index", 0));
      a.milli_per_gpu = placement.value("milli_per_gpu", 0);
      a.memory_mib_per_gpu = placement.value("memory_mib_per_gpu", int64_t{0});
    }
    a.start_time = r.started_at.value_or(now);
    if (absl::Status st = d.state_->engine->Restore(a, std::move(sub)); !st.ok()) return st;
    RunningJob run = NewRunningJob(d.config_, r.id, *spec, a.gpus, r.started_at.value_or(now));
    run.pid = static_cast<pid_t>(r.pid);
    run.start_time = r.pid_start_time;
    run.adopted = true;
    if (stop) {  // still stopping: SIGKILL once its grace from the stop has passed
      run.stop = stop->why;
      run.stop_reason = stop->reason;
      run.stop_at = stop->at;
    }
    if (spec->Resizable() && placement.is_object()) {
      // Resized before: its sizes so far. Asked to resize (stopping for it, or told by signal):
      // started again, when it ends so, on what it holds now.
      for (const json& z : placement.value("sizes", json::array())) {
        if (z.is_object()) run.sizes.emplace_back(z.value("at", 0.0), z.value("gpus", 0));
      }
      run.restarts = placement.value("restarts", 0);
      const std::optional<double> asked = ReadResizeFile(d.config_.state_dir, r.id);
      if (asked || (stop && stop->why == "resize")) {
        run.resize_to = d.state_->engine->Holding(a.id)->gpus;
        run.resize_at = asked.value_or(stop ? stop->at : now);
      }
    }
    run.priority = r.priority;
    run.array_index = r.array_index;
    run.cgroup = !run.container && d.host_->confines();
    run.uid = r.owner_uid;
    run.array_id = r.array_id;
    run.owner = r.owner;
    if (!run.region.empty() && spec->gpu_milli > 0) {
      d.host_->ArbiterUser(run.uid, +1);
      run.arbiter = true;
    }
    run.spec = std::move(spec);
    if (d.state_->exits) d.state_->exits->Watch(r.id, run.pid);
    d.state_->runs->Add(std::move(run));
    return absl::OkStatus();
  }
  Dispatcher& d;
};

absl::Status Dispatcher::Recover() {
  LoadHistory();
  DispatchState::ChangeLock lock(*state_);
  Recovery recovery(*store_, *host_,
                    {.state_dir = config_.state_dir,
                     .requeue_preempted = config_.requeue_preempted,
                     .requeue_unhealthy = config_.unhealthy_action == "requeue",
                     .containers = containers_.has_value()});
  RecoveryWorld world(*this);
  const double now = Now();
  if (absl::Status st = recovery.Run(world, now).status(); !st.ok()) return st;
  // Whether each re-adopted share ran beside another is not stored: told again from the jobs of
  // its run (what its history learns of its run time at its end).
  if (const std::optional<double> since = state_->runs->EarliestAdoptedShare()) {
    auto period = store_->ListPeriod(*since, now);
    if (!period.ok()) return period.status();
    state_->runs->NoteSharingSince(*period);
  }
  return absl::OkStatus();
}

void Dispatcher::OnHealth(int gpu, bool healthy, const std::string& reason) {
  DispatchState& state = *state_;
  DispatchState::ChangeLock lock(state);
  if (gpu < 0 || gpu >= static_cast<int>(state.gpu_healthy.size())) return;
  state.gpu_device_healthy[gpu] = healthy;
  state.gpu_device_reason[gpu] = reason;
  ApplyHealth(state, gpu, false);
}

void Dispatcher::OnMps(int gpu, bool up, const std::string& reason) {
  DispatchState& state = *state_;
  DispatchState::ChangeLock lock(state);
  if (gpu < 0 || gpu >= static_cast<int>(state.gpu_healthy.size())) return;
  state.gpu_mps_down[gpu] = up ? "" : reason.empty() ? "its MPS control daemon is down" : reason;
  ApplyHealth(state, gpu, true);
}

void Dispatcher::ApplyHealth(DispatchState& state, int gpu, bool mps_only) {
  const bool healthy = state.gpu_device_healthy[gpu] && state.gpu_mps_down[gpu].empty();
  const std::string reason =
      !state.gpu_device_healthy[gpu] ? state.gpu_device_reason[gpu] : state.gpu_mps_down[gpu];
  const bool was = state.gpu_healthy[gpu];
  const bool said = !was && state.gpu_health_reason[gpu] == reason;
  state.gpu_healthy[gpu] = healthy;
  state.gpu_health_reason[gpu] = healthy ? "" : reason;
  (void)state.engine->scheduler().SetGpuHealth(0, gpu, healthy);
  state.Publish();  // before the event streams look
  feed_.Bump();
  if (healthy) {
    if (!was) spdlog::info("GPU {} is healthy again", gpu);
  } else {
    if (!said) spdlog::warn("GPU {} turned unhealthy: {}; it takes no new work", gpu, reason);
    // A device that failed takes every job on it; a dead MPS daemon its clients only (a whole-GPU
    // job that is no MPS client does not use it).
    state.runs->StopOn(gpu, "unhealthy", fmt::format("GPU {} turned unhealthy: {}", gpu, reason),
                       Now(), mps_only && state.gpu_device_healthy[gpu]);
  }
  state.dirty = true;
  state.wake.notify_all();
}

bool Dispatcher::RunOnce() { return loop_->RunOnce(); }

// Without the lock: the node's spec is fixed when the engine is made (health is kept apart).
const core::NodeSpec& Dispatcher::node() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return state_->engine->scheduler().state().node_spec(0);
}

}  // namespace tessera::server
