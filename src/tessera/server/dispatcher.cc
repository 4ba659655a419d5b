#include "tessera/server/dispatcher.h"

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
#include "tessera/server/file_acl.h"
#include "tessera/server/openapi.h"
#include "tessera/server/runner.h"
#include "tessera/server/server_util.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"

namespace tessera::server {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A TCP port free on loopback now (the kernel's pick), for a job's MASTER_PORT; 29500 (torchrun's
// default) when none can be had.
int FreeLocalPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 29500;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace

// ---- the daemon ----

Dispatcher::Dispatcher(ServerConfig config, ServerDeps deps)
    : config_(std::move(config)),
      clock_(deps.clock ? deps.clock : &core::SystemClock::Get()),
      launcher_(deps.launcher ? deps.launcher : &process_launcher_),
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
  std::error_code ec;
  for (const char* sub : {"", "/logs", "/regions", "/exit"}) {
    fs::create_directories(c.state_dir + sub, ec);
    if (ec)
      return absl::FailedPreconditionError(
          fmt::format("cannot create {}{}: {}", c.state_dir, sub, ec.message()));
  }
  // One server per state folder, decided before anything in it is read or changed: recovery
  // re-adopts and ends jobs and the sweep removes cgroups, which a second server must never do to a
  // live one's. The lock goes with the process (flock), so a killed server leaves none behind.
  {
    const std::string lock_path = c.state_dir + "/server.lock";
    const int lock = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock < 0)
      return absl::FailedPreconditionError(
          fmt::format("cannot open {}: {}", lock_path, strerror(errno)));
    // A server killed while forking a job leaves the lock in that child for a moment (until the
    // child closes what it inherited): a few seconds are waited out, a live server's lock is not.
    bool locked = false;
    for (int i = 0; i < 30 && !(locked = flock(lock, LOCK_EX | LOCK_NB) == 0); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!locked) {
      char holder[32] = {};
      const ssize_t n = pread(lock, holder, sizeof holder - 1, 0);
      std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      close(lock);
      return absl::FailedPreconditionError(fmt::format(
          "another tessera server{} is using the state folder {}: one server per state folder "
          "(give this one its own state_dir)",
          pid.empty() ? "" : " (pid " + pid + ")", c.state_dir));
    }
    const std::string me = std::to_string(getpid()) + "\n";
    if (ftruncate(lock, 0) != 0 || pwrite(lock, me.data(), me.size(), 0) < 0)
      spdlog::warn("{}: cannot record this server's pid: {}", lock_path, strerror(errno));
    s->state_lock_ = lock;
  }
  if (!c.cgroup_name_set) s->config_.cgroup_name = StateCgroupName(c.state_dir);
  fs::create_directories(fs::path(c.socket).parent_path(), ec);
  if (!s->store_) {
    auto store = Store::Open(c.state_dir + "/tessera.db");
    if (!store.ok()) return store.status();
    s->store_ = std::move(*store);
  }
  s->cgroups_ = Cgroups::Open(CgroupOptions{.mode = c.confinement, .name = c.cgroup_name});
  if (!s->cgroups_->busy().empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "confinement: {}: give each server its own confinement.cgroup", s->cgroups_->busy()));
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
  s->scheduler_ = std::make_unique<sched::Scheduler>(sc);
  s->cycle_ = std::make_unique<sched::Cycle>(
      *s->scheduler_, sched::CycleOptions{.fair_share_half_life_s = c.fair_share_half_life_s,
                                          .reservations = c.backfill_reservations});
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  core::NodeSpec node = core::NodeFromInventory(s->inventory_, cpus * 1000,
                                                static_cast<int64_t>(pages) * page / (1 << 20));
  if (auto n = s->scheduler_->AddNode(node); !n.ok()) return n.status();
  for (const auto& [user, q] : c.quotas) s->scheduler_->quotas().Set(user, q);
  for (const auto& [group, q] : c.group_quotas) s->scheduler_->quotas().Set("group:" + group, q);
  s->SetUpSharing();
  s->SetUpContainers();
  const size_t n = s->inventory_.gpus.size();
  s->gpu_healthy_.assign(n, true);
  s->gpu_health_reason_.assign(n, "");
  s->gpu_xids_.assign(n, 0);
  return s;
}

void Dispatcher::SetUpSharing() {
  // The arbiter file is shared by the fractional jobs of every user: the server makes it, open to
  // all, rather than the first job (whose user may not write the state folder, and whose file would
  // be its own).
  const std::string arbiter = ArbiterFile();
  char err[256] = {};
  // In a folder of its own: a container gets the folder (a bind mount of the file itself would
  // pin the old file when it is replaced). Nobody but the server creates anything in it.
  const std::string folder = config_.state_dir + "/arbiter";
  if (mkdir(folder.c_str(), 0711) != 0 && errno != EEXIST)
    spdlog::warn("cannot create {}: {}", folder, strerror(errno));
  chmod(folder.c_str(), 0711);
  bool made = shim::CreateArbiterFile(arbiter.c_str(), err, sizeof err);
  if (!made && strstr(err, "of this version") != nullptr) {
    // Left by an older Tessera: replaced. Jobs it started keep the old file (their mapping) until
    // they end; new jobs are paced among themselves.
    spdlog::warn("GPU arbiter file {}: {}; replacing it", arbiter, err);
    if (unlink(arbiter.c_str()) == 0)
      made = shim::CreateArbiterFile(arbiter.c_str(), err, sizeof err);
  }
  if (!made) {
    spdlog::warn("GPU arbiter file {}: {}; compute shares will not be enforced", arbiter, err);
    arbiter_access_ = fmt::format("none: {}", err);
    return;
  }
  // The server's alone, and the users with a job using it (an ACL per user, kept as jobs start and
  // end): another local user cannot overwrite what every fractional job relies on.
  if (chmod(arbiter.c_str(), 0600) != 0) spdlog::warn("chmod {}: {}", arbiter, strerror(errno));
  if (geteuid() != 0) {
    arbiter_access_ = "the server's user only (0600): every job runs as that user";
    return;
  }
  absl::Status st = SetUserAcl(arbiter, {});
  if (st.ok()) {
    arbiter_acl_ = true;
    arbiter_access_ = "0600 plus an ACL entry per user with a running job that has a compute share";
    return;
  }
  // No ACLs where the state lives: open to all, said.
  if (chmod(arbiter.c_str(), 0666) != 0) spdlog::warn("chmod {}: {}", arbiter, strerror(errno));
  arbiter_access_ = fmt::format("0666, open to every local user: {}", std::string(st.message()));
  spdlog::warn("GPU arbiter file {} is {}", arbiter, arbiter_access_);
}

std::set<uid_t> Dispatcher::ArbiterUsersLocked() const {
  std::set<uid_t> users;
  for (const auto& [u, count] : arbiter_users_) users.insert(u);
  return users;
}

void Dispatcher::ArbiterUser(uint32_t uid, int delta) {
  if (!arbiter_acl_ || uid == 0) return;
  std::lock_guard lock(arbiter_mu_);
  int& n = arbiter_users_[uid];
  const bool was = n > 0;
  n = std::max(0, n + delta);
  if (n == 0) arbiter_users_.erase(uid);
  if (was == (n > 0)) return;
  const std::set<uid_t> users = ArbiterUsersLocked();
  const std::string arbiter = ArbiterFile();
  if (!was) {
    if (absl::Status st = SetUserAcl(arbiter, users); !st.ok())
      spdlog::warn("GPU arbiter file: {}", std::string(st.message()));
    return;
  }
  // A user's access removed: a descriptor she opened before would keep writing the file, so a
  // copy with the remaining users' entries is renamed over it (the jobs' processes follow it
  // within ArbiterConfig::follow_us).
  absl::Status st = ReplaceArbiter(arbiter, users);
  if (st.ok()) {
    spdlog::info("GPU arbiter file replaced: uid {} has no job with a compute share any more", uid);
    return;
  }
  spdlog::warn("GPU arbiter file: cannot replace it ({}); only the ACL entry of uid {} is removed",
               std::string(st.message()), uid);
  if (absl::Status acl = SetUserAcl(arbiter, users); !acl.ok())
    spdlog::warn("GPU arbiter file: {}", std::string(acl.message()));
}

void Dispatcher::RepairArbiterIfDamaged() {
  // Every user with a share job may write the arbiter: one may truncate it or fill its head with
  // garbage. The jobs' processes survive that (zero pages instead of SIGBUS) but run unpaced until
  // a whole file is at the path; a fresh copy renamed over it is followed by all of them.
  const std::string arbiter = ArbiterFile();
  struct stat st;
  if (lstat(arbiter.c_str(), &st) != 0) return;  // not made (yet): nothing to repair
  const int fd = shim::OpenSharedFile(arbiter.c_str(), sizeof(shim::ArbiterData),
                                      shim::kArbiterMagic, shim::kArbiterVersion);
  if (fd >= 0) {
    close(fd);
    return;
  }
  std::set<uid_t> users;
  {
    std::lock_guard lock(arbiter_mu_);
    users = ArbiterUsersLocked();
  }
  // Without ACLs where the state lives the file was open to all, and so is its copy.
  const absl::Status replaced = ReplaceArbiter(arbiter, users, /*open_to_all=*/!arbiter_acl_);
  if (replaced.ok()) {
    spdlog::warn(
        "GPU arbiter file {} was damaged (truncated, or not an arbiter any more): "
        "replaced by a fresh one, which the jobs' processes follow",
        arbiter);
  } else {
    spdlog::warn("GPU arbiter file {} is damaged and cannot be replaced: {}", arbiter,
                 std::string(replaced.message()));
  }
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
  // Jobs with an image start as podman's client, through the launcher every job goes through.
  podman_launcher_ = std::make_unique<PodmanLauncher>(launcher_, *rt);
  launcher_ = podman_launcher_.get();
  size_t nodes = files.control_nodes.size();
  for (const std::string& n : files.gpu_nodes) nodes += n.empty() ? 0 : 1;
  spdlog::info(
      "containers: {} at {}; CDI spec {} ({} GPUs as {}=<uuid>, {} device nodes, {} driver files)",
      rt->version, rt->podman, *path, inventory_.gpus.size(), devices::kCdiKind, nodes,
      files.mounts.size());
}

std::string Dispatcher::ArbiterFile() const { return config_.state_dir + "/arbiter/gpu.arbiter"; }

std::string Dispatcher::TaskLog(int64_t id, int task, const char* suffix) const {
  return JobFile("logs", id, fmt::format(".{}{}", task, suffix).c_str());
}

std::string Dispatcher::OutputFile(int64_t id, int64_t array_id, int array_index,
                                   const std::string& owner, const JobSpec& spec, int task,
                                   bool err) const {
  if (spec.stdout_file.empty() && spec.stderr_file.empty()) return "";
  OutputNames n;
  n.job_id = id;
  n.array_id = array_id;
  n.array_index = array_index;
  n.task = task;
  n.user = owner;
  n.name = !spec.name.empty() ? spec.name : fs::path(spec.command.at(0)).filename().string();
  n.host = hostname_;
  return OutputFileOf(spec, n, err);
}

std::string Dispatcher::JobFile(const char* dir, int64_t id, const char* suffix) const {
  return fmt::format("{}/{}/{}{}", config_.state_dir, dir, id, suffix);
}

Dispatcher::Running Dispatcher::NewRunning(int64_t id, const JobSpec& spec, std::vector<int> gpus,
                                           double started) const {
  Running run;
  run.id = id;
  run.gpus = std::move(gpus);
  run.started = started;
  run.max_runtime_s = spec.max_runtime_s;
  run.tasks = spec.Tasks();
  // A job's own grace, within the server's maximum (one stored under a larger maximum included).
  run.grace_period_s =
      std::min(spec.grace_period_s >= 0 ? spec.grace_period_s : config_.grace_period_s,
               config_.max_grace_period_s);
  run.memory_limit_mib = spec.gpu_memory_mib;
  run.gpu_milli = spec.gpu_milli;
  if (RequestOf(spec, id, "").fractional() && !run.gpus.empty())
    run.region = JobFile("regions", id, ".region");
  run.container = !spec.image.empty();
  run.memory_mib = spec.memory_mib;
  return run;
}

core::Request Dispatcher::RequestFor(const JobSpec& spec, int64_t id, const std::string& owner,
                                     uint32_t uid) {
  core::Request r = RequestOf(spec, id, owner);
  const sched::Prediction p = predictor_.Predict(RunKindOf(spec, owner));
  r.expected_duration_s = p.seconds;
  if (r.fractional() && p.util_samples > 0) {
    // A job that history shows slowed by sharing counts as that much busier: kept apart.
    r.expected_util_pct =
        std::clamp(static_cast<int>(std::lround(p.util_pct * p.sharing_slowdown)), 1, 100);
    r.util_ceiling_pct = config_.utilization_ceiling_pct;
    r.util_ceiling_strict = config_.utilization_ceiling_strict;
  }
  r.quota_groups = QuotaGroups(uid);
  r.preempts_others = MayPreemptOthers(owner, uid, IsAdmin(owner, uid));
  return r;
}

std::vector<std::string> Dispatcher::UserGroups(uint32_t uid) {
  std::lock_guard lock(groups_mu_);
  if (auto it = user_groups_.find(uid); it != user_groups_.end()) return it->second;
  std::vector<std::string> out;
  for (gid_t gid : AccountGroups(uid)) {
    group gr;
    group* g = nullptr;
    std::vector<char> gbuf(16384);
    if (getgrgid_r(gid, &gr, gbuf.data(), gbuf.size(), &g) == 0 && g) {
      std::string key = std::string("group:") + g->gr_name;
      if (std::find(out.begin(), out.end(), key) == out.end()) out.push_back(key);
    }
  }
  user_groups_[uid] = out;
  return out;
}

std::vector<std::string> Dispatcher::QuotaGroups(uint32_t uid) {
  if (config_.group_quotas.empty()) return {};
  std::vector<std::string> out;
  for (const std::string& g : UserGroups(uid)) {
    if (config_.group_quotas.contains(g.substr(std::string_view("group:").size())))
      out.push_back(g);
  }
  return out;
}

bool Dispatcher::IsAdmin(const std::string& user, uint32_t uid) const {
  if (uid == 0 || uid == geteuid() || config_.admins.contains(user)) return true;
  return std::any_of(config_.tokens.begin(), config_.tokens.end(),
                     [&](const ApiToken& t) { return t.admin && t.user == user; });
}

std::vector<std::string> Dispatcher::Principals(const std::string& user, uint32_t uid) {
  std::vector<std::string> out = UserGroups(uid);
  out.insert(out.begin(), user);
  return out;
}

int Dispatcher::PriorityCeiling(const std::string& user, uint32_t uid, bool admin) {
  if (admin) return 1000;
  int ceiling = config_.priority_ceiling;
  for (const std::string& who : Principals(user, uid)) {
    if (auto it = config_.priority_ceilings.find(who); it != config_.priority_ceilings.end()) {
      ceiling = std::max(ceiling, it->second);
    }
  }
  return ceiling;
}

bool Dispatcher::MayPreemptOthers(const std::string& user, uint32_t uid, bool admin) {
  if (admin) return true;
  const std::vector<std::string> who = Principals(user, uid);
  return std::any_of(who.begin(), who.end(),
                     [&](const std::string& p) { return config_.preempt_others.contains(p); });
}

void Dispatcher::LoadHistory() {
  auto done = store_->List({JobState::kSucceeded});
  if (!done.ok()) {
    spdlog::warn("history: cannot read the jobs that succeeded ({}); no predictions yet",
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
    predictor_.Add(RunKindOf(*spec, r.owner), *r.ended_at - *r.started_at, MeasuredUtilization(r),
                   SharedGpu(r));
    ++runs;
  }
  spdlog::info("history: {} runs of jobs that succeeded, {} keys", runs, predictor_.keys());
}

absl::Status Dispatcher::Recover() {
  const double now = Now();
  LoadHistory();
  auto jobs = store_->List({JobState::kQueued, JobState::kRunning, JobState::kPreempted});
  if (!jobs.ok()) return jobs.status();
  int adopted = 0, requeued = 0, ended = 0;
  std::lock_guard lock(mu_);
  // An array's tasks share one spec: parsed once.
  std::map<int64_t, std::shared_ptr<const JobSpec>> array_specs;
  for (const JobRecord& r : *jobs) {
    std::shared_ptr<const JobSpec> shared;
    if (auto it = array_specs.find(r.array_id); r.array_id != 0 && it != array_specs.end())
      shared = it->second;
    auto spec = shared ? absl::StatusOr<JobSpec>(*shared) : ParseJobSpec(r.spec_json);
    if (spec.ok() && !shared) {
      shared = std::make_shared<const JobSpec>(*spec);
      if (r.array_id != 0) array_specs[r.array_id] = shared;
    }
    if (!spec.ok()) {
      spdlog::error("job {}: stored spec unreadable ({}); left as is", r.id,
                    std::string(spec.status().message()));
      continue;
    }
    if (r.state == JobState::kPreempted) {
      if (!spec->requeue.value_or(config_.requeue_preempted)) continue;
      if (store_->Transition(r.id, JobState::kQueued, "re-queued after preemption", now).ok())
        ++requeued;
    }
    if (r.state == JobState::kQueued || r.state == JobState::kPreempted) {
      Queued q = QueuedOf(r, shared, r.submitted_at);
      q.held = r.state == JobState::kQueued && r.held;
      Enqueue(std::move(q));
      continue;
    }
    // Running when the last server stopped.
    const std::string exit_path = JobFile("exit", r.id);
    if (r.pid > 0 && launcher_->Alive(static_cast<pid_t>(r.pid), r.pid_start_time)) {
      json placement = json::parse(r.placement_json, nullptr, false);
      sched::Allocation a;
      a.id = std::to_string(r.id);
      a.node = 0;
      a.request = RequestFor(*spec, r.id, r.owner, r.owner_uid);
      if (placement.is_object()) {
        for (const auto& g : placement.value("gpus", json::array()))
          a.gpus.push_back(g.value("index", 0));
        a.milli_per_gpu = placement.value("milli_per_gpu", 0);
        a.memory_mib_per_gpu = placement.value("memory_mib_per_gpu", int64_t{0});
      }
      a.start_time = r.started_at.value_or(now);
      if (absl::Status st = scheduler_->Restore(a); !st.ok()) {
        spdlog::warn("job {}: cannot re-adopt its GPUs ({}); stopping it", r.id,
                     std::string(st.message()));
        launcher_->Signal(static_cast<pid_t>(r.pid), SIGKILL);
        (void)store_->Transition(r.id, JobState::kLost,
                                 fmt::format("cannot re-adopt: {}", std::string(st.message())),
                                 now);
        continue;
      }
      Running run = NewRunning(r.id, *spec, a.gpus, r.started_at.value_or(now));
      run.pid = static_cast<pid_t>(r.pid);
      run.start_time = r.pid_start_time;
      run.adopted = true;
      run.cgroup = !run.container && cgroups_->active();
      run.uid = r.owner_uid;
      run.array_id = r.array_id;
      run.spec = shared;
      run.owner = r.owner;
      if (!run.region.empty() && spec->gpu_milli > 0) {
        ArbiterUser(run.uid, +1);
        run.arbiter = true;
      }
      running_[r.id] = run;
      if (exits_) exits_->Watch(r.id, run.pid);
      ++adopted;
      spdlog::info("job {}: still running (pid {}), re-adopted", r.id, r.pid);
      continue;
    }
    ++ended;
    std::optional<int> code = r.pid > 0 ? ReadExitFile(exit_path) : std::nullopt;
    TransitionFields f;
    f.ended_at = now;
    if (code) {
      f.exit_code = *code;
      (void)store_->Transition(
          r.id, *code == 0 ? JobState::kSucceeded : JobState::kFailed,
          fmt::format("ended with exit code {} while the server was down", *code), now, f);
    } else {
      (void)store_->Transition(
          r.id, JobState::kLost,
          r.pid > 0 ? "its process ended while the server was down, exit status unknown"
                    : "the server stopped while starting it",
          now, f);
    }
    std::error_code ec;
    fs::remove(exit_path, ec);
    // Its container may have outlived the podman client (killed with the server's group, say).
    if (!spec->image.empty() && containers_) RemoveContainer(*containers_, r.id);
  }
  spdlog::info("recovered: {} queued, {} running re-adopted, {} re-queued, {} ended while down",
               queued_.size(), adopted, requeued, ended);
  return absl::OkStatus();
}

void Dispatcher::OnHealth(int gpu, bool healthy, const std::string& reason) {
  std::lock_guard lock(mu_);
  if (gpu < 0 || gpu >= static_cast<int>(gpu_healthy_.size())) return;
  gpu_healthy_[gpu] = healthy;
  gpu_health_reason_[gpu] = reason;
  feed_.Bump();
  (void)scheduler_->SetGpuHealth(0, gpu, healthy);
  if (healthy) {
    spdlog::info("GPU {} is healthy again", gpu);
  } else {
    spdlog::warn("GPU {} turned unhealthy: {}; it takes no new work", gpu, reason);
    const double now = Now();
    for (auto& [id, r] : running_) {
      if (std::find(r.gpus.begin(), r.gpus.end(), gpu) != r.gpus.end()) {
        RequestStop(r, "unhealthy", fmt::format("GPU {} turned unhealthy: {}", gpu, reason), now);
      }
    }
  }
  dirty_ = true;
  wake_.notify_all();
}

bool Dispatcher::Turn(std::unique_lock<std::mutex>& lock) {
  const double now = Now();
  CheckRunning(now, lock);
  if (!dirty_) return false;
  dirty_ = false;
  auto t0 = std::chrono::steady_clock::now();
  SchedulePass(now, lock);
  scheduling_.Pass(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return true;
}

bool Dispatcher::RunOnce() {
  std::unique_lock lock(mu_);
  return Turn(lock);
}

const core::NodeSpec& Dispatcher::node() const { return scheduler_->state().node_spec(0); }

void Dispatcher::Loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    Turn(lock);
    if (dirty_) continue;
    wake_.wait_for(lock, std::chrono::duration<double>(config_.poll_interval_s));
  }
}

void Dispatcher::RequestStop(Running& r, const std::string& why, const std::string& reason,
                             double now) {
  if (!r.stop.empty()) return;
  r.stop = why;
  r.stop_reason = reason;
  r.stop_at = now;
  spdlog::info("job {}: stopping ({}): SIGTERM, SIGKILL after {} s", r.id, reason,
               r.grace_period_s);
  if (!launcher_->Signal(r.pid, SIGTERM)) launcher_->Signal(r.pid, SIGKILL);
}

void Dispatcher::Kill(Running& r, const std::string& why) {
  if (r.killed) return;
  spdlog::info("job {}: {}: SIGKILL", r.id, why);
  launcher_->Signal(r.pid, SIGKILL);
  // Killing podman's client leaves the container to its monitor: remove it by name.
  if (r.container && containers_) RemoveContainer(*containers_, r.id);
  r.killed = true;
}

uint64_t Dispatcher::LogBytes(const Running& r) const {
  uint64_t bytes = 0;
  auto add = [&](const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_size);
  };
  add(JobFile("logs", r.id, ".out"));
  add(JobFile("logs", r.id, ".err"));
  for (int t = 1; t < r.tasks; ++t) {
    add(TaskLog(r.id, t, ".out"));
    add(TaskLog(r.id, t, ".err"));
  }
  return bytes;
}

void Dispatcher::CheckRunning(double now, std::unique_lock<std::mutex>& lock) {
  // Logs are measured about once a second (a stat per log of each running job), not every turn.
  const bool check_logs = config_.max_log_bytes_per_job > 0 && now - logs_checked_ >= 1;
  if (check_logs) logs_checked_ = now;
  if (now - arbiter_checked_ >= 1) {  // about once a second: an open and a 12-byte read
    arbiter_checked_ = now;
    RepairArbiterIfDamaged();
  }
  std::vector<std::pair<int64_t, std::optional<int>>> ended;
  for (auto& [id, r] : running_) {
    std::optional<int> code;
    bool gone = false;
    if (!r.adopted) {
      code = launcher_->Reap(r.pid);
      gone = code.has_value();
    } else if (!launcher_->Alive(r.pid, r.start_time)) {
      gone = true;
      code = ReadExitFile(JobFile("exit", id));
    }
    if (gone) {
      ended.emplace_back(id, code);
      continue;
    }
    if (r.max_runtime_s > 0 && now - r.started > r.max_runtime_s) {
      RequestStop(r, "timeout", fmt::format("ran past its max runtime of {:g} s", r.max_runtime_s),
                  now);
    }
    if (check_logs && r.stop.empty()) {
      if (const uint64_t bytes = LogBytes(r); bytes > config_.max_log_bytes_per_job) {
        RequestStop(r, "logs",
                    fmt::format("its logs reached {} MiB, over the limit of {} MiB "
                                "(limits.max_log_bytes_per_job)",
                                bytes >> 20, config_.max_log_bytes_per_job >> 20),
                    now);
      }
    }
    if (!r.stop.empty() && !r.killed && now - r.stop_at >= r.grace_period_s) {
      Kill(r, fmt::format("still running {} s after SIGTERM", r.grace_period_s));
    }
  }
  for (auto it = cgroups_left_.begin(); it != cgroups_left_.end();) {
    it = cgroups_->Remove(*it) ? cgroups_left_.erase(it) : std::next(it);
  }
  if (ended.empty()) return;
  // Their GPUs are free at once; what else an end takes (the cgroup's accounting, a container left
  // behind, the store's record with its fsync) is done without the lock, so that API reads do not
  // wait for it. Meanwhile the jobs are `finishing_`: a cancel is told they have ended.
  std::vector<Ending> endings;
  for (auto& [id, code] : ended) {
    if (exits_) exits_->Unwatch(id);
    auto it = running_.find(id);
    (void)scheduler_->Release(std::to_string(id));
    if (it->second.arbiter) ArbiterUser(it->second.uid, -1);
    endings.push_back(Ending{std::move(it->second), code.value_or(-1), code.has_value()});
    running_.erase(it);
    finishing_.insert(id);
  }
  dirty_ = true;
  lock.unlock();
  for (Ending& e : endings) Finish(e, now);
  lock.lock();
  for (Ending& e : endings) {
    finishing_.erase(e.run.id);
    if (e.cgroup_left) cgroups_left_.insert(e.run.id);
    if (e.requeue) Enqueue(std::move(*e.requeue));
  }
}

void Dispatcher::Finish(Ending& e, double now) {
  Running& r = e.run;
  const int exit_code = e.exit_code;
  const bool exit_known = e.exit_known;
  std::error_code ec;
  if (!r.region.empty()) {
    // Its last GPU use first: the arbiter's count and the region's peak.
    if (!r.gpus.empty()) AddShareReading(r, ReadShare(r.id, r.gpus, r.gpu_milli > 0, r.region));
    fs::remove(r.region, ec);
  }
  TransitionFields f;
  f.ended_at = now;
  if (exit_known) f.exit_code = exit_code;
  CgroupUsage usage;
  json u = json::object();
  if (r.cgroup) {
    usage = cgroups_->Usage(r.id);
    if (usage.cpu_seconds >= 0) u["cpu_seconds"] = usage.cpu_seconds;
    if (usage.peak_memory_bytes >= 0) u["peak_memory_bytes"] = usage.peak_memory_bytes;
    u["oom_kills"] = usage.oom_kills;
    // What the job left running goes with it; a cgroup still busy is removed on a later turn.
    e.cgroup_left = !cgroups_->Remove(r.id);
  }
  // Its GPU use, for the history that predicts the next runs: measured utilization (percent of
  // its GPUs' time) and the most GPU memory it held per GPU.
  // Rounded to a tenth of a point, as stored: the history a restart reads back is the same.
  std::optional<double> util = GpuUtilizationOf(r, now);
  if (util) {
    util = std::round(*util * 10) / 10;
    u["gpu_utilization_pct"] = *util;
  }
  if (r.gpu_peak_mib > 0) u["gpu_peak_memory_mib"] = r.gpu_peak_mib;
  if (!r.region.empty()) u["shared_gpu"] = r.shared_gpu;
  if (!u.empty()) f.usage_json = u.dump();
  JobState to;
  std::string reason;
  bool requeue = false;
  if (r.stop == "cancel") {
    to = JobState::kCancelled, reason = r.stop_reason;
  } else if (r.stop == "preempt") {
    to = JobState::kPreempted, reason = r.stop_reason;
    requeue = r.spec && r.spec->requeue ? *r.spec->requeue : config_.requeue_preempted;
  } else if (r.stop == "unhealthy") {
    requeue = r.spec && r.spec->requeue ? *r.spec->requeue : config_.unhealthy_action == "requeue";
    to = requeue ? JobState::kPreempted : JobState::kFailed, reason = r.stop_reason;
  } else if (r.stop == "timeout" || r.stop == "logs") {
    to = JobState::kFailed, reason = r.stop_reason;
  } else if (!exit_known) {
    to = JobState::kLost,
    reason = "its process ended while the server was not its parent; exit status unknown";
  } else if (exit_code == 0) {
    to = JobState::kSucceeded, reason = "exit code 0";
  } else if (r.container && exit_code >= 125 && exit_code <= 127) {
    // podman's own codes: it could not run the container, or the command in it.
    to = JobState::kFailed;
    reason = exit_code == 125   ? "podman could not run the container (exit code 125; its error is "
                                  "in the job's stderr log)"
             : exit_code == 126 ? "the command cannot be run in the container (exit code 126)"
                                : "the command was not found in the container (exit code 127)";
  } else {
    to = JobState::kFailed;
    reason = exit_code > 128
                 ? fmt::format("ended by signal {} (exit code {})", exit_code - 128, exit_code)
                 : fmt::format("exit code {}", exit_code);
    if (usage.oom_kills > 0) {
      reason = fmt::format(
          "over its memory limit of {} MiB: the kernel killed {} of its processes (OOM); {}",
          r.memory_mib, usage.oom_kills, reason);
    }
  }
  // A container left behind: its client was stopped, or ended while another server was its parent.
  // (One killed after the grace period was removed then.)
  if (r.container && containers_ && !r.killed && (!r.stop.empty() || !exit_known))
    RemoveContainer(*containers_, r.id);
  // Its run time joins the history that predicts the next ones - before its end is recorded, so
  // that whoever sees it ended (and submits the next run) finds it in the history.
  if (to == JobState::kSucceeded && r.spec) {
    predictor_.Add(RunKindOf(*r.spec, r.owner), now - r.started, util,
                   r.region.empty() ? std::nullopt : std::optional<bool>(r.shared_gpu));
  }
  if (absl::Status st = store_->Transition(r.id, to, reason, now, f); !st.ok()) {
    spdlog::error("job {}: recording its end: {}", r.id, std::string(st.message()));
    return;
  }
  // Recorded: a restart no longer needs the exit file to tell how it ended.
  fs::remove(JobFile("exit", r.id), ec);
  spdlog::info("job {}: {} ({})", r.id, JobStateName(to), reason);
  if (requeue) {
    auto rec = store_->Get(r.id);
    auto spec = rec.ok() ? ParseJobSpec(rec->spec_json) : absl::StatusOr<JobSpec>(rec.status());
    if (spec.ok() && store_->Transition(r.id, JobState::kQueued, "re-queued", now).ok()) {
      e.requeue = QueuedOf(*rec, std::make_shared<const JobSpec>(*std::move(spec)), now);
    }
  }
}

Dispatcher::ShareReading Dispatcher::ReadShare(int64_t id, const std::vector<int>& gpus,
                                               bool compute_share,
                                               const std::string& region) const {
  ShareReading s;
  if (compute_share && !gpus.empty()) {
    // On several GPUs: the mean per GPU (its utilization is of one GPU, as a share is).
    // Not while the file is being replaced: a read of the old file after the copy was taken
    // could see more than the copy says, and the copy's count would look like a restart.
    std::lock_guard lock(arbiter_mu_);
    s.busy_us =
        shim::ArbiterBusyMicros(ArbiterFile().c_str(), gpus.data(), static_cast<int>(gpus.size()),
                                shim::ArbiterJobKey(std::to_string(id).c_str())) /
        gpus.size();
  }
  s.peak_bytes = ReadRegionMemory(region).peak;
  return s;
}

void Dispatcher::AddShareReading(Running& r, const ShareReading& s) {
  // The arbiter's count starts again when a process of the job claims a fresh slot (one that died
  // and came back): what was counted before stays counted.
  r.arbiter_busy_us += s.busy_us >= r.arbiter_seen_us ? s.busy_us - r.arbiter_seen_us : s.busy_us;
  r.arbiter_seen_us = s.busy_us;
  r.gpu_peak_mib = std::max<int64_t>(r.gpu_peak_mib, s.peak_bytes >> 20);
}

std::optional<double> Dispatcher::GpuUtilizationOf(const Running& r, double now) {
  if (r.gpus.empty()) return std::nullopt;
  // A share with a compute share: the GPU time the arbiter charged it over its run time.
  if (!r.region.empty() && r.gpu_milli > 0) {
    const double ran_us = (now - r.started) * 1e6;
    if (ran_us <= 0 || r.arbiter_busy_us == 0) return std::nullopt;
    return std::min(100.0, 100.0 * static_cast<double>(r.arbiter_busy_us) / ran_us);
  }
  // Otherwise the GPUs' own utilization, from the samples in which it held them alone.
  if (r.util_samples == 0) return std::nullopt;
  return std::clamp(100.0 * r.util_sum / r.util_samples, 0.0, 100.0);
}

namespace {
// A field of a finished job's usage record; null when it has none.
json UsageField(const JobRecord& r, const char* key) {
  if (r.usage_json.empty()) return nullptr;
  const json u = json::parse(r.usage_json, nullptr, false);
  return u.is_object() && u.contains(key) ? u[key] : json(nullptr);
}
}  // namespace

std::optional<bool> Dispatcher::SharedGpu(const JobRecord& r) {
  const json v = UsageField(r, "shared_gpu");
  return v.is_boolean() ? std::optional<bool>(v.get<bool>()) : std::nullopt;
}

std::optional<double> Dispatcher::MeasuredUtilization(const JobRecord& r) {
  const json v = UsageField(r, "gpu_utilization_pct");
  return v.is_number() ? std::optional<double>(v.get<double>()) : std::nullopt;
}

void Dispatcher::MeasureRunning(const std::vector<devices::GpuTelemetry>& telemetry,
                                const std::map<int64_t, ShareReading>& shares) {
  const auto& state = scheduler_->state();
  for (auto& [id, r] : running_) {
    if (r.gpus.empty()) continue;
    if (auto s = shares.find(id); s != shares.end()) AddShareReading(r, s->second);
    // The GPUs' readings count for it only where it holds them alone.
    bool alone = true, known = true;
    double util = 0;
    int64_t peak = 0;
    for (int g : r.gpus) {
      if (static_cast<size_t>(g) >= telemetry.size() || state.gpu_use(0, g).holders != 1) {
        alone = false;
        break;
      }
      const devices::GpuTelemetry& t = telemetry[g];
      if (t.utilization) {
        util += *t.utilization;
      } else {
        known = false;
      }
      if (t.memory_used_bytes) peak = std::max<int64_t>(peak, *t.memory_used_bytes >> 20);
    }
    if (!alone) continue;
    if (known) {
      r.util_sum += util / static_cast<double>(r.gpus.size());
      ++r.util_samples;
    }
    if (r.region.empty()) r.gpu_peak_mib = std::max(r.gpu_peak_mib, peak);
  }
}

Dispatcher::Launch Dispatcher::PrepareLaunch(Queued q, const sched::Allocation& a,
                                             double now) const {
  Launch l;
  json placement;
  placement["gpus"] = json::array();
  std::vector<std::string> uuids;
  for (int g : a.gpus) {
    const core::Gpu& gpu = inventory_.gpus[g];
    placement["gpus"].push_back({{"index", g}, {"uuid", gpu.uuid}, {"model", gpu.model}});
    uuids.push_back(gpu.uuid);
  }
  placement["milli_per_gpu"] = a.milli_per_gpu;
  placement["memory_mib_per_gpu"] = a.memory_mib_per_gpu;
  l.placement_json = placement.dump();
  l.where = a.gpus.empty() ? "no GPU" : fmt::format("GPU {}", fmt::join(a.gpus, ","));
  LaunchSpec& ls = l.spec;
  ls.job_id = q.id;
  ls.argv = q.spec->command;
  ls.env = q.spec->env;
  ls.workdir = q.spec->workdir;
  if (q.array_id != 0) {
    // Slurm's SLURM_ARRAY_* under Tessera's names.
    ls.env["TESSERA_ARRAY_JOB_ID"] = std::to_string(q.array_id);
    ls.env["TESSERA_ARRAY_TASK_ID"] = std::to_string(q.array_index);
  }
  ls.stdout_path = JobFile("logs", q.id, ".out");
  ls.stderr_path = JobFile("logs", q.id, ".err");
  ls.user_stdout = OutputFile(q.id, q.array_id, q.array_index, q.owner, *q.spec, 0, false);
  ls.user_stderr = OutputFile(q.id, q.array_id, q.array_index, q.owner, *q.spec, 0, true);
  ls.gpu_uuids = uuids;
  ls.exit_path = JobFile("exit", q.id);
  if (const int n = q.spec->Tasks(); n > 1) {
    // One process per task, with what torchrun, NCCL and MPI programs read; all the job's GPUs
    // visible to each (LOCAL_RANK picks one), TESSERA_TASK_GPU the one a task would take in turn.
    const std::string port = std::to_string(FreeLocalPort());
    for (int r = 0; r < n; ++r) {
      TaskLaunch t;
      t.env = {{"RANK", std::to_string(r)},
               {"LOCAL_RANK", std::to_string(r)},
               {"WORLD_SIZE", std::to_string(n)},
               {"LOCAL_WORLD_SIZE", std::to_string(n)},
               {"GROUP_RANK", "0"},
               {"NODE_RANK", "0"},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port},
               {"TESSERA_TASK_ID", std::to_string(r)},
               {"TESSERA_NTASKS", std::to_string(n)}};
      if (!a.gpus.empty())
        t.env["TESSERA_TASK_GPU"] = std::to_string(r * static_cast<int>(a.gpus.size()) / n);
      // Task 0 writes the job's own logs; the others theirs (tessera logs --task N).
      t.stdout_path = r == 0 ? ls.stdout_path : TaskLog(q.id, r, ".out");
      t.stderr_path = r == 0 ? ls.stderr_path : TaskLog(q.id, r, ".err");
      t.user_stdout = OutputFile(q.id, q.array_id, q.array_index, q.owner, *q.spec, r, false);
      t.user_stderr = OutputFile(q.id, q.array_id, q.array_index, q.owner, *q.spec, r, true);
      ls.tasks.push_back(std::move(t));
    }
    ls.kill_on_task_failure = q.spec->task_failure == "kill";
    ls.task_grace_s = static_cast<int>(std::ceil(
        std::min(q.spec->grace_period_s >= 0 ? q.spec->grace_period_s : config_.grace_period_s,
                 config_.max_grace_period_s)));
  }
  l.run = NewRunning(q.id, *q.spec, a.gpus, now);
  l.run.uid = q.uid;
  l.run.array_id = q.array_id;
  l.run.spec = q.spec;
  l.run.owner = q.owner;
  if (!l.run.region.empty()) {
    ShareLimits share;
    share.library = config_.intercept_library;
    share.region = l.run.region;
    share.memory_bytes = static_cast<uint64_t>(q.spec->gpu_memory_mib) << 20;
    share.arbiter = ArbiterFile();
    share.share_milli = q.spec->gpu_milli;
    share.priority = q.priority;
    share.physical_gpus = a.gpus;
    share.context_overhead_bytes = config_.context_overhead_bytes;
    // In a container the library cannot measure the context (its pids are not NVML's): the
    // measured figure for the GPU's model, unless the config names one.
    if (share.context_overhead_bytes == 0 && l.run.container && !a.gpus.empty() &&
        a.gpus[0] < static_cast<int>(node().gpus.size())) {
      share.context_overhead_bytes = core::DefaultContextOverhead(node().gpus[a.gpus[0]].model);
    }
    ls.share = share;
  }
  // A user's job runs with that user's own uid, gid and groups, or not at all: an account that
  // cannot be looked up now (no passwd entry, deleted since submitting, an NSS outage) has no
  // group to run in, and the server's would be root's.
  std::optional<std::string> no_account;
  if (geteuid() == 0 && q.uid != 0) {
    ls.uid = q.uid;
    passwd pw;
    passwd* found = nullptr;
    std::vector<char> buf(16384);
    const int e = getpwuid_r(q.uid, &pw, buf.data(), buf.size(), &found);
    if (e == 0 && found) {
      ls.gid = pw.pw_gid;
    } else {
      no_account = fmt::format(
          "the account of uid {} cannot be looked up ({}): a job runs only with its user's own "
          "uid, gid and groups",
          q.uid, e != 0 ? strerror(e) : "no such user");
    }
  }
  if (!l.run.container && cgroups_->active()) {
    // Its cgroup: the nodes every process needs, the driver's control nodes, its own GPUs.
    CgroupLimits limits;
    limits.devices = BaseDeviceRules();
    for (const char* control : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}) {
      if (auto r = RuleFor(config_.device_dir + "/" + control)) limits.devices.push_back(*r);
    }
    for (int g : a.gpus) {
      const std::optional<int>& minor = inventory_.gpus[g].minor;
      if (!minor) continue;
      if (auto r = RuleFor(fmt::format("{}/nvidia{}", config_.device_dir, *minor)))
        limits.devices.push_back(*r);
    }
    limits.memory_bytes = q.spec->memory_mib << 20;
    limits.cpu_milli = q.spec->cpu_milli;
    limits.pids_max = config_.pids_max;
    l.limits = std::move(limits);
  }
  if (l.run.container && !containers_) {
    // Accepted by a server that had podman (kept across a restart); this one has none.
    l.refused = absl::FailedPreconditionError(
        fmt::format("this server cannot run containers: {}", containers_off_));
  } else if (RunsAsRoot(q.uid) && !config_.allow_root_jobs) {
    // Accepted under a config that allowed it (kept across a restart); this one does not.
    l.refused = absl::PermissionDeniedError(
        "jobs do not run as root on this server (allow_root_jobs is off)");
  } else if (no_account) {
    l.refused = absl::FailedPreconditionError(*no_account);
  }
  l.queued = std::move(q);
  return l;
}

void Dispatcher::ExecuteLaunch(Launch& l, double now) {
  const Queued& q = l.queued;
  LaunchSpec& ls = l.spec;
  TransitionFields f;
  f.started_at = now;
  f.placement_json = l.placement_json;
  l.recorded = store_->Transition(q.id, JobState::kRunning, "placed on " + l.where, now, f);
  if (!l.recorded.ok()) return;
  if (ls.uid && ls.gid) {
    std::vector<std::string> logs = {ls.stdout_path, ls.stderr_path};
    for (const TaskLaunch& t : ls.tasks) {
      if (t.stdout_path != ls.stdout_path) logs.push_back(t.stdout_path);
      if (t.stderr_path != ls.stderr_path) logs.push_back(t.stderr_path);
    }
    for (const std::string& p : logs) {
      int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
      if (fd >= 0) {
        if (fchown(fd, *ls.uid, *ls.gid) != 0)
          spdlog::warn("job {}: chown {}: {}", q.id, p, strerror(errno));
        close(fd);
      }
    }
  }
  if (ls.share) {
    // The server makes the job's region (owned by the job's user), so that the job needs no right
    // to create files in the state folder, and a container has a file to bind.
    std::error_code ec;
    fs::remove(ls.share->region, ec);
    char err[256] = {};
    // A limit per GPU of the job, in the order of its CUDA ordinals.
    const std::vector<uint64_t> limits(std::max<size_t>(ls.share->physical_gpus.size(), 1),
                                       ls.share->memory_bytes);
    if (!shim::CreateRegionFile(ls.share->region.c_str(), limits.data(),
                                static_cast<int>(limits.size()), err, sizeof err)) {
      spdlog::warn("job {}: shared region {}: {}", q.id, ls.share->region, err);
    } else if (ls.uid && ls.gid && chown(ls.share->region.c_str(), *ls.uid, *ls.gid) != 0) {
      spdlog::warn("job {}: chown {}: {}", q.id, ls.share->region, strerror(errno));
    }
  }
  // Its owner may write the arbiter while it runs (a job with a compute share uses it).
  if (l.refused.ok() && ls.share && ls.share->share_milli > 0) {
    ArbiterUser(q.uid, +1);
    l.run.arbiter = true;
  }
  if (!l.refused.ok()) {
    l.launched = l.refused;
  } else if (l.limits) {
    // Confined, or not started at all: never a job that escapes its devices by accident.
    auto procs = cgroups_->Create(q.id, *l.limits);
    if (!procs.ok()) {
      l.launched = absl::FailedPreconditionError(
          fmt::format("cannot confine the job: {}", std::string(procs.status().message())));
    } else {
      ls.cgroup_procs = *procs;
      l.run.cgroup = true;
      l.launched = launcher_->Start(ls);
      if (!l.launched.ok()) cgroups_->Remove(q.id);
    }
  } else {
    if (l.run.container) {
      ls.container = LaunchSpec::Container{.image = q.spec->image,
                                           .own_path = q.spec->env.contains("PATH"),
                                           .memory_bytes = q.spec->memory_mib << 20,
                                           .cpu_milli = q.spec->cpu_milli,
                                           .pids_max = config_.pids_max};
    }
    l.launched = launcher_->Start(ls);
  }
  if (!l.launched.ok()) {
    if (l.run.arbiter) ArbiterUser(q.uid, -1);
    TransitionFields ff;
    ff.ended_at = now;
    (void)store_->Transition(q.id, JobState::kFailed, std::string(l.launched.status().message()),
                             now, ff);
    return;
  }
  l.run.pid = l.launched->pid;
  l.run.start_time = l.launched->start_time;
  if (absl::Status st = store_->SetProcess(q.id, l.run.pid, l.run.start_time); !st.ok()) {
    spdlog::error("job {}: recording its process: {}", q.id, std::string(st.message()));
  }
}

void Dispatcher::CommitLaunch(Launch& l, double now) {
  const int64_t id = l.queued.id;
  std::string cancelled_by = std::move(starting_[id].cancelled_by);
  starting_.erase(id);
  if (!l.recorded.ok()) {
    // Not started (the store refused the transition): back in the queue for the next pass.
    spdlog::error("job {}: {}", id, std::string(l.recorded.message()));
    (void)scheduler_->Release(std::to_string(id));
    Enqueue(std::move(l.queued));
    dirty_ = true;
    return;
  }
  if (!l.launched.ok()) {
    (void)scheduler_->Release(std::to_string(id));
    spdlog::info("job {}: failed to start: {}", id, std::string(l.launched.status().message()));
    dirty_ = true;
    return;
  }
  Running& run = running_[id] = std::move(l.run);
  // Shares beside one another on a GPU: each's history says it ran shared.
  if (!run.region.empty() && !run.gpus.empty()) {
    for (auto& [other_id, other] : running_) {
      if (other_id == id || other.region.empty() || other.gpus != run.gpus) continue;
      other.shared_gpu = run.shared_gpu = true;
    }
  }
  if (exits_) exits_->Watch(id, run.pid);
  spdlog::info("job {}: running on {} (pid {})", id, l.where, run.pid);
  scheduling_.Started(std::max(0.0, now - l.queued.since));
  if (!cancelled_by.empty()) RequestStop(run, "cancel", cancelled_by, now);
}

Dispatcher::Queued Dispatcher::QueuedOf(const JobRecord& r, std::shared_ptr<const JobSpec> spec,
                                        double since) {
  Queued q;
  q.id = r.id;
  q.priority = r.priority;
  q.owner = r.owner;
  q.uid = r.owner_uid;
  q.throttle = ArrayThrottle(spec->array);
  q.spec = std::move(spec);
  q.submitted = r.submitted_at;
  q.since = since;
  q.array_id = r.array_id;
  q.array_index = r.array_index;
  return q;
}

void Dispatcher::Enqueue(Queued q) {
  q.in_cycle = false;
  q.waiting = q.held ? fmt::format("held (tessera release {})", q.array_id ? q.array_id : q.id)
                     : "not yet considered";
  if (auto old = queued_.find(q.id); old != queued_.end()) EraseQueued(old);
  ++queued_by_uid_[q.uid];
  queued_[q.id] = std::move(q);
  dirty_ = true;
}

void Dispatcher::EraseQueued(std::map<int64_t, Queued>::iterator it) {
  if (auto n = queued_by_uid_.find(it->second.uid); n != queued_by_uid_.end() && --n->second == 0)
    queued_by_uid_.erase(n);
  queued_.erase(it);
}

void Dispatcher::EraseQueued(int64_t id) {
  if (auto it = queued_.find(id); it != queued_.end()) EraseQueued(it);
}

std::string Dispatcher::WaitingReason(int64_t id) const {
  auto q = queued_.find(id);
  if (q == queued_.end()) return "";
  if (q->second.changing) return "a change to it (cancel, hold, release, priority) is being stored";
  if (!q->second.in_cycle) return q->second.waiting;
  const std::string* why = cycle_->Waiting(std::to_string(id));
  return why ? *why : "";
}

Dispatcher::DependencyState Dispatcher::Outcome(const Dependency& d) const {
  using S = DependencyState;
  // Queued, starting or running here: not settled. Preempted and lost jobs that are not queued
  // again are over.
  auto active = [&](int64_t id) {
    return queued_.contains(id) || running_.contains(id) || starting_.contains(id) ||
           finishing_.contains(id);
  };
  auto ended = [&](int64_t id, JobState state) {
    return !active(id) && state != JobState::kQueued && state != JobState::kRunning;
  };
  int64_t id = d.job;
  if (d.task >= 0) {
    auto t = store_->TaskId(d.job, d.task);
    if (!t.ok()) return {S::kMissing, fmt::format("job {}_{} does not exist", d.job, d.task)};
    id = *t;
  } else if (active(id)) {
    return {S::kPending, ""};  // an array whose first task has not ended has not either
  }
  auto r = store_->Get(id);
  if (!r.ok()) return {S::kMissing, fmt::format("job {} does not exist", id)};
  const std::string name =
      d.task >= 0 ? fmt::format("job {}_{}", d.job, d.task) : fmt::format("job {}", d.job);
  if (d.task < 0 && r->array_id == r->id) {
    auto tasks = store_->Tasks(id);
    if (!tasks.ok()) return {S::kPending, ""};  // read again at the next pass
    size_t failed = 0;
    for (const Store::TaskState& t : *tasks) {
      if (!ended(t.id, t.state)) return {S::kPending, ""};
      if (t.state != JobState::kSucceeded) ++failed;
    }
    if (failed == 0) return {S::kOk, fmt::format("every task of array {} succeeded", d.job)};
    return {S::kNotOk, fmt::format("{} of the {} tasks of array {} did not succeed", failed,
                                   tasks->size(), d.job)};
  }
  if (!ended(id, r->state)) return {S::kPending, ""};
  if (r->state == JobState::kSucceeded) return {S::kOk, name + " succeeded"};
  return {S::kNotOk, fmt::format("{} {}", name, JobStateName(r->state))};
}

std::string Dispatcher::Unmeetable(const Dependency& d, const DependencyState& st) {
  using S = DependencyState;
  const bool never = st.outcome == S::kMissing ||
                     (d.kind == Dependency::Kind::kOk && st.outcome == S::kNotOk) ||
                     (d.kind == Dependency::Kind::kNotOk && st.outcome == S::kOk);
  return never ? fmt::format("{}: after {} can never be met", st.what, DependencyText(d)) : "";
}

void Dispatcher::Admit(double now) {
  // What each array has running or in the cycle's queue (its % limit counts both), and each user
  // (limits.max_running_jobs_per_user counts both, and the jobs being started).
  std::map<int64_t, int> active;
  std::map<uint32_t, size_t> user_active;
  // An array's tasks waiting in the cycle: they all have one shape, and at most
  // max_starts_per_pass start in a pass, so more than a few passes' worth of them there would only
  // take the user's room (her small job stuck behind her own 10,000-task sweep) and the pass's
  // time.
  std::map<int64_t, size_t> array_in_cycle;
  const size_t array_window = 4 * config_.max_starts_per_pass;
  for (const auto& [id, r] : running_) {
    if (r.array_id != 0) ++active[r.array_id];
    ++user_active[r.uid];
  }
  for (const auto& [id, q] : queued_) {
    if (q.in_cycle && q.array_id != 0) ++active[q.array_id], ++array_in_cycle[q.array_id];
    if (q.in_cycle) ++user_active[q.uid];
  }
  for (const auto& [id, s] : starting_) ++user_active[s.uid];
  // An array's tasks share their dependencies: each is looked up once per pass.
  std::map<std::string, DependencyState> outcomes;
  std::vector<std::pair<int64_t, std::string>> never;
  for (auto& [id, q] : queued_) {
    if (q.in_cycle || q.held || q.changing) continue;
    std::string pending, broken;
    for (const Dependency& d : q.spec->after) {
      const std::string key = DependencyText(d);
      auto it = outcomes.find(key);
      if (it == outcomes.end()) it = outcomes.emplace(key, Outcome(d)).first;
      if (std::string why = Unmeetable(d, it->second); !why.empty()) {
        broken = why;
        break;
      }
      if (it->second.outcome == DependencyState::kPending && pending.empty()) {
        pending = fmt::format(
            "waiting for {} to end (after {})",
            d.task >= 0 ? fmt::format("job {}_{}", d.job, d.task) : fmt::format("job {}", d.job),
            key);
      }
    }
    if (!broken.empty()) {
      never.emplace_back(id, broken);
      continue;
    }
    if (!pending.empty()) {
      q.waiting = pending;
      continue;
    }
    if (q.array_id != 0 && q.throttle > 0 && active[q.array_id] >= q.throttle) {
      q.waiting = fmt::format("array {} runs at most {} tasks at once (%{})", q.array_id,
                              q.throttle, q.throttle);
      continue;
    }
    if (q.array_id != 0 && array_in_cycle[q.array_id] >= array_window) {
      q.waiting = fmt::format("behind the first {} waiting tasks of array {}",
                              array_in_cycle[q.array_id], q.array_id);
      continue;
    }
    if (user_active[q.uid] >= config_.max_running_jobs_per_user) {
      q.waiting = fmt::format(
          "{} has {} jobs running or starting, the most per user "
          "(limits.max_running_jobs_per_user)",
          q.owner, user_active[q.uid]);
      continue;
    }
    sched::QueueEntry e{RequestFor(*q.spec, q.id, q.owner, q.uid), q.submitted,
                        static_cast<uint64_t>(q.id)};
    e.request.priority = q.priority;  // the stored one: it may have changed since submission
    if (absl::Status st = cycle_->Enqueue(std::move(e)); !st.ok()) {
      spdlog::error("job {}: cannot queue it: {}", id, std::string(st.message()));
      q.waiting = std::string(st.message());
      continue;
    }
    q.in_cycle = true;
    if (q.array_id != 0) ++active[q.array_id], ++array_in_cycle[q.array_id];
    ++user_active[q.uid];
  }
  // Jobs whose dependencies can never be met end (cancelled, with the reason), so that nobody waits
  // for them forever; their own dependents are settled at the next pass. Stored by SchedulePass
  // without mu_ (EndNeverMet); changing meanwhile.
  for (const auto& [id, why] : never) {
    queued_.at(id).changing = true;
    never_met_.emplace_back(id, why);
  }
}

void Dispatcher::EndNeverMet(double now, std::unique_lock<std::mutex>& lock) {
  if (never_met_.empty()) return;
  // An array's tasks share their reason: one transaction for them all.
  std::map<std::string, std::vector<int64_t>> by_reason;
  for (const auto& [id, why] : never_met_) by_reason[why].push_back(id);
  never_met_.clear();
  lock.unlock();
  std::map<std::string, absl::Status> stored;
  for (const auto& [why, ids] : by_reason)
    stored[why] = store_->TransitionMany(ids, JobState::kCancelled, why, now);
  lock.lock();
  for (const auto& [why, ids] : by_reason) {
    if (const absl::Status& st = stored[why]; !st.ok()) {
      spdlog::error("job {}: {}", ids.front(), std::string(st.message()));
    } else {
      spdlog::info("{}: cancelled: {}",
                   ids.size() == 1
                       ? fmt::format("job {}", ids[0])
                       : fmt::format("{} jobs ({}..{})", ids.size(), ids.front(), ids.back()),
                   why);
      for (int64_t id : ids) EraseQueued(id);
    }
    EndChange(ids);  // those not stored are tried again at the next pass
  }
}

void Dispatcher::SchedulePass(double now, std::unique_lock<std::mutex>& lock) {
  Admit(now);
  std::vector<Launch> launches;
  std::vector<sched::CycleDecision> decisions = cycle_->Step(now);
  // At most max_starts_per_pass processes started in one pass, so that the pass (and the lock's
  // next holder) does not wait for thousands of forks: jobs with GPUs first (a GPU left idle costs
  // most), then the rest in the cycle's order; those left over go back to the queue, placed again
  // at the next pass, which follows at once.
  std::stable_partition(decisions.begin(), decisions.end(), [](const sched::CycleDecision& d) {
    return d.kind == sched::CycleDecision::Kind::kPreempt || !d.allocation.gpus.empty();
  });
  size_t starts = 0;
  for (sched::CycleDecision& d : decisions) {
    const int64_t id = std::stoll(d.id);
    auto q = queued_.find(id);
    if (q == queued_.end()) continue;  // the cycle only holds what queued_ holds
    if (d.kind == sched::CycleDecision::Kind::kPreempt) {
      for (const std::string& victim : d.victims) {
        auto it = running_.find(std::stoll(victim));
        if (it == running_.end()) continue;
        RequestStop(it->second, "preempt",
                    fmt::format("preempted for job {} (priority {})", id, q->second.priority), now);
      }
      continue;
    }
    if (starts == config_.max_starts_per_pass) {
      (void)scheduler_->Release(d.id);
      q->second.in_cycle = false;  // Admit puts it back into the cycle
      q->second.waiting =
          "starting: more jobs were started in this pass than limits.max_starts_"
          "per_pass allows";
      dirty_ = true;
      continue;
    }
    ++starts;
    Starting starting{"", q->second.spec, q->second.owner, q->second.uid};  // a cancel meanwhile
    launches.push_back(PrepareLaunch(std::move(q->second), d.allocation, now));
    EraseQueued(q);
    starting_[id] = std::move(starting);
  }
  EndNeverMet(now, lock);
  if (launches.empty()) return;
  // The store's writes (fsync) and the forks and execs go on without the lock: API reads,
  // submissions and cancels do not wait for them.
  lock.unlock();
  for (Launch& l : launches) ExecuteLaunch(l, now);
  lock.lock();
  for (Launch& l : launches) CommitLaunch(l, now);
}

// ---- API ----

std::vector<int64_t> Dispatcher::BeginChange(std::unique_lock<std::mutex>& lock,
                                             const std::vector<int64_t>& ids) {
  changed_.wait(lock, [&] {
    for (int64_t t : ids) {
      auto q = queued_.find(t);
      if (q != queued_.end() && q->second.changing) return false;
    }
    return true;
  });
  std::vector<int64_t> out;
  for (int64_t t : ids) {
    auto q = queued_.find(t);
    if (q == queued_.end()) continue;
    q->second.changing = true;
    if (q->second.in_cycle) cycle_->Remove(std::to_string(t));
    q->second.in_cycle = false;
    out.push_back(t);
  }
  return out;
}

void Dispatcher::EndChange(const std::vector<int64_t>& ids) {
  for (int64_t t : ids) {
    if (auto q = queued_.find(t); q != queued_.end()) q->second.changing = false;
  }
  dirty_ = true;  // back into the cycle's queue (Admit) at the next pass
  changed_.notify_all();
}

namespace {
constexpr double kTelemetryMaxAgeS = 1.0;

}  // namespace

std::vector<devices::GpuTelemetry> Dispatcher::Telemetry() {
  std::lock_guard lock(telemetry_mu_);
  const double now = Now();
  if (telemetry_at_ >= 0 && now - telemetry_at_ < kTelemetryMaxAgeS) return telemetry_;
  telemetry_.assign(inventory_.gpus.size(), devices::GpuTelemetry{});
  for (size_t g = 0; g < telemetry_.size(); ++g) {
    auto t = source_->ReadTelemetry(static_cast<int>(g));
    if (t.ok()) {
      telemetry_[g] = *t;
    } else {
      spdlog::debug("gpu {}: no telemetry: {}", g, std::string(t.status().message()));
    }
  }
  telemetry_at_ = now;
  return telemetry_;
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
  if (launcher_->WatchableByPidfd()) {
    exits_ = std::make_unique<ExitWatcher>([this] {
      std::lock_guard lock(mu_);
      wake_.notify_all();
    });
  }
  if (absl::Status st = Recover(); !st.ok()) return st;
  if (cgroups_->mode() != "none") {
    const json where = cgroups_->Describe();
    spdlog::info("confinement: {}: devices by {}; memory {}, cpu {}, pids {}{}", cgroups_->mode(),
                 where["devices"].get<std::string>(), where["memory"].get<std::string>(),
                 where["cpu"].get<std::string>(), where["pids"].get<std::string>(),
                 cgroups_->reason().empty() ? "" : " (" + cgroups_->reason() + ")");
  } else {
    spdlog::warn("jobs are NOT confined to their GPUs: {}", cgroups_->reason());
  }
  {
    std::set<int64_t> keep;
    for (const auto& [id, r] : running_) keep.insert(id);
    if (size_t n = cgroups_->Sweep(keep); n > 0)
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
  if (sampler_.joinable()) sampler_.join();
  wake_.notify_all();
  if (loop_.joinable()) loop_.join();
  exits_.reset();  // not under mu_: its thread may be waiting for it
  if (health_) health_->Stop();
  if (cgroups_) cgroups_->Close();  // the subtree goes when no job is left in it
  // Jobs keep running: a restarted server re-adopts them.
}

absl::StatusOr<Dispatcher::Submitted> Dispatcher::Submit(JobSpec spec_in, const Caller& caller,
                                                         const std::string& idempotency_key) {
  const std::string& user = caller.user;
  const uint32_t uid = caller.uid;
  const bool admin = caller.admin;
  std::optional<JobSpec> spec(std::move(spec_in));
  if (int ceiling = PriorityCeiling(user, uid, admin); spec->priority > ceiling) {
    return HttpError(403,
                     fmt::format("priority {} is above {}'s ceiling of {} (priority_ceiling and "
                                 "priority_ceilings in the server's config)",
                                 spec->priority, user, ceiling));
  }
  // Room for the store to record every end: no new work once the state folder's disk is nearly
  // full.
  if (struct statvfs fs;
      config_.min_free_disk_bytes > 0 && statvfs(config_.state_dir.c_str(), &fs) == 0 &&
      static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize < config_.min_free_disk_bytes) {
    return HttpError(
        507,
        fmt::format("the server's disk ({}) has {} MiB free, under its reserve of {} MiB "
                    "(limits.min_free_disk): no new work until room is made",
                    config_.state_dir, (static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize) >> 20,
                    config_.min_free_disk_bytes >> 20));
  }
  if (spec->grace_period_s > config_.max_grace_period_s) {
    return HttpError(400,
                     fmt::format("grace_period_s: {:g} s is over this server's maximum of {:g} s "
                                 "(preemption.max_grace_period_s in its config)",
                                 spec->grace_period_s, config_.max_grace_period_s));
  }
  if (!spec->image.empty() && !containers_) {
    return HttpError(400,
                     fmt::format("image: this server cannot run containers: {}", containers_off_));
  }
  if (geteuid() != 0 && uid != geteuid()) {
    return HttpError(403, fmt::format("this server runs as {} and cannot start jobs as {}",
                                      UserName(geteuid()), user));
  }
  // A part of a model's name ("H100") stands for the machine's models that have it; what is stored
  // and scheduled is exact.
  std::vector<std::string> machine_models;
  for (const core::Gpu& g : inventory_.gpus) machine_models.push_back(g.model);
  if (absl::Status st = ResolveModels(&*spec, machine_models); !st.ok())
    return HttpError(400, std::string(st.message()));
  if (RunsAsRoot(uid) && !config_.allow_root_jobs) {
    return HttpError(403,
                     "jobs do not run as root on this server: submit as an ordinary user, or set "
                     "allow_root_jobs: true in the server's config");
  }
  // Refuse what can never fit (more GPUs than the machine has, a model it lacks) now, not in the
  // queue: by the scheduler's own test of a GPU against the request.
  core::Request r = RequestFor(*spec, 1, user, uid);
  int matching = 0;
  int64_t machine_cpu_milli = 0, machine_memory_mib = 0;
  std::string over_quota;
  {
    std::lock_guard lock(mu_);
    const core::NodeSpec& node = scheduler_->state().node_spec(0);
    std::vector<int64_t> memory;  // of the GPUs that could take it, smallest first
    for (const core::NodeGpu& g : node.gpus) {
      if (core::GpuAccepted(g, r) && g.memory_mib >= r.gpu_memory_mib) {
        ++matching;
        memory.push_back(g.memory_mib);
      }
    }
    machine_cpu_milli = node.cpu_milli, machine_memory_mib = node.memory_mib;
    // The least it would count against its quotas (whole GPUs: the smallest that could take it).
    sched::GpuAmount least;
    least.gpus = r.gpus;
    least.gpu_milli = r.gpu_milli_total();
    if (r.fractional()) {
      least.gpu_memory_mib = r.gpu_memory_mib * r.shared_gpu_count();
    } else {
      std::sort(memory.begin(), memory.end());
      for (int i = 0; i < r.gpus && i < static_cast<int>(memory.size()); ++i)
        least.gpu_memory_mib += memory[static_cast<size_t>(i)];
    }
    const sched::QuotaManager& quotas = scheduler_->quotas();
    if (!quotas.NeverAllows(r.owner, least, &over_quota)) {
      for (const std::string& group : r.quota_groups)
        if (quotas.NeverAllows(group, least, &over_quota)) break;
    }
  }
  if (!over_quota.empty()) {
    return HttpError(400, fmt::format("resources: {}: the job could never start", over_quota));
  }
  if (r.cpu_milli > machine_cpu_milli) {
    return HttpError(400, fmt::format("resources.cpus: {:g} CPUs asked, this machine has {:g}; the "
                                      "job could never start",
                                      r.cpu_milli / 1000.0, machine_cpu_milli / 1000.0));
  }
  if (r.memory_mib > machine_memory_mib) {
    return HttpError(400,
                     fmt::format("resources.memory: {} MiB asked, this machine has {} MiB; the "
                                 "job could never start",
                                 r.memory_mib, machine_memory_mib));
  }
  if (matching < r.gpu_count()) {
    return HttpError(
        400, fmt::format(
                 "resources: this machine has {} matching GPU(s) of {}; the job could never start",
                 matching, inventory_.gpus.size()));
  }
  // An array: its indices, within the server's maximum.
  std::optional<ArrayRange> range;
  if (!spec->array.empty()) {
    auto a = ParseArray(spec->array, config_.max_array_tasks);
    if (!a.ok()) return HttpError(400, fmt::format("array: {}", std::string(a.status().message())));
    range = *std::move(a);
  }
  // The user's cap on jobs waiting: an array counts each task.
  {
    const size_t adding = range ? range->indices.size() : 1;
    std::lock_guard lock(mu_);
    const auto mine = queued_by_uid_.find(uid);
    const size_t waiting = mine == queued_by_uid_.end() ? 0 : mine->second;
    if (waiting + adding > config_.max_queued_jobs_per_user) {
      return HttpError(
          429, fmt::format("{} has {} jobs waiting and this would add {}: at most {} per user "
                           "(limits.max_queued_jobs_per_user in the server's config)",
                           user, waiting, adding, config_.max_queued_jobs_per_user));
    }
  }
  // Dependencies: on jobs that exist (submitted before this one, so no cycle can form), that the
  // caller may see through, and that can still turn out as asked.
  {
    std::lock_guard lock(mu_);
    for (const Dependency& d : spec->after) {
      auto dep = store_->Get(d.job);
      if (!dep.ok() && dep.status().code() != absl::StatusCode::kNotFound)
        return HttpError(500, std::string(dep.status().message()));
      const std::string ref =
          d.task >= 0 ? fmt::format("{}_{}", d.job, d.task) : std::to_string(d.job);
      if (!dep.ok() || (d.task >= 0 && !store_->TaskId(d.job, d.task).ok())) {
        return HttpError(400,
                         fmt::format("after {}: job {} does not exist (a dependency names a job "
                                     "submitted before, so dependencies never form a cycle)",
                                     DependencyText(d), ref));
      }
      if (dep->owner != user && !admin) {
        return HttpError(403,
                         fmt::format("after {}: job {} belongs to {}; a dependency may name only "
                                     "your own jobs (admins: anyone's)",
                                     DependencyText(d), ref, dep->owner));
      }
      if (std::string why = Unmeetable(d, Outcome(d)); !why.empty())
        return HttpError(422, fmt::format("after {}: {}", DependencyText(d), why));
    }
  }
  const bool held = spec->hold;
  spec->hold = false;  // a state of the job (held, released), not of its spec
  JobRecord rec;
  rec.name = spec->name;
  rec.owner_uid = uid;
  rec.owner = user;
  rec.spec_json = JobSpecToJson(*spec).dump();
  rec.priority = spec->priority;
  rec.held = held;
  rec.idempotency_key = idempotency_key;
  if (rec.idempotency_key.size() > 128 ||
      std::any_of(rec.idempotency_key.begin(), rec.idempotency_key.end(),
                  [](unsigned char c) { return c < 0x21 || c > 0x7e; })) {
    return HttpError(400,
                     "Idempotency-Key: expected at most 128 printable characters without spaces");
  }
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
    std::lock_guard lock(mu_);
    auto shared = std::make_shared<const JobSpec>(*std::move(spec));
    for (size_t i = 0; i < n; ++i) {
      Queued q;
      q.id = *id + static_cast<int64_t>(i);
      q.priority = shared->priority;
      q.owner = user;
      q.uid = uid;
      q.spec = shared;
      q.submitted = q.since = now;
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
                 held ? " held" : "", fmt::join(shared->command, " "));
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
  std::unique_lock lock(mu_);
  // Queued ones in one transaction (an array's thousands of tasks among them), stored without mu_
  // while they are kept out of the cycle; running ones are stopped; the rest (ended, or preempted
  // and not queued again) one by one.
  const std::vector<int64_t> queued = BeginChange(lock, ids);
  std::vector<int64_t> others;
  for (int64_t t : ids) {
    if (queued_.contains(t)) continue;
    if (auto it = running_.find(t); it != running_.end()) {
      RequestStop(it->second, "cancel", reason, now);
      if (force) Kill(it->second, "cancelled with --force");
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
    lock.unlock();
    absl::Status st = store_->TransitionMany(queued, JobState::kCancelled, reason, now);
    lock.lock();
    if (st.ok()) {
      for (int64_t t : queued) EraseQueued(t);
    }
    EndChange(queued);
    if (!st.ok()) return HttpError(500, std::string(st.message()));
  }
  lock.unlock();
  wake_.notify_all();
  return absl::OkStatus();
}

absl::Status Dispatcher::Hold(const std::vector<int64_t>& ids, const std::string& ref,
                              const JobRecord& first, bool hold, const std::string& user) {
  const int64_t id = ids.front();
  const double now = Now();
  std::unique_lock lock(mu_);
  // Kept out of the cycle while the change is stored without mu_: those whose state changes.
  const std::vector<int64_t> taken = BeginChange(lock, ids);
  if (ids.size() == 1 && taken.empty()) {  // not queued (any more: BeginChange may have waited)
    auto now_r = store_->Get(id);
    return HttpError(409, fmt::format("job {} is {}: only a queued job can be {}", ref,
                                      JobStateName(now_r.ok() ? now_r->state : first.state),
                                      hold ? "held" : "released"));
  }
  std::vector<int64_t> change;
  for (int64_t t : taken) {
    if (queued_.at(t).held != hold) change.push_back(t);
  }
  absl::Status st;
  if (!change.empty()) {
    const std::string reason = fmt::format("{} by {}", hold ? "held" : "released", user);
    lock.unlock();
    st = store_->SetHeld(change, hold, reason, now);
    lock.lock();
    for (int64_t t : change) {
      auto q = queued_.find(t);  // still queued: nothing takes a job that is changing
      if (!st.ok() || q == queued_.end()) continue;
      q->second.held = hold;
      q->second.waiting = hold ? fmt::format("held by {} (tessera release {})", user, ref)
                               : "released; not yet considered";
    }
    // Released: it keeps its place (its submission time), so goes where it would have been.
    if (st.ok()) spdlog::info("job {}: {} ({} job(s))", ref, reason, change.size());
  }
  EndChange(taken);
  if (!st.ok()) return HttpError(500, std::string(st.message()));
  lock.unlock();
  wake_.notify_all();
  return absl::OkStatus();
}

absl::Status HttpError(int http, const std::string& message) {
  absl::Status st(http == 404   ? absl::StatusCode::kNotFound
                  : http == 400 ? absl::StatusCode::kInvalidArgument
                  : http == 403 ? absl::StatusCode::kPermissionDenied
                  : http == 409 ? absl::StatusCode::kFailedPrecondition
                  : http >= 500 ? absl::StatusCode::kInternal
                                : absl::StatusCode::kInvalidArgument,
                  message);
  st.SetPayload("tessera.io/http-status", absl::Cord(std::to_string(http)));
  return st;
}

int HttpStatusOf(const absl::Status& st) {
  if (auto p = st.GetPayload("tessera.io/http-status")) return std::atoi(std::string(*p).c_str());
  if (st.code() == absl::StatusCode::kNotFound) return 404;
  if (st.code() == absl::StatusCode::kInvalidArgument) return 400;
  if (st.code() == absl::StatusCode::kUnavailable) return 503;
  return 500;
}

Dispatcher::Live Dispatcher::LiveOf(int64_t id) const {
  Live l;
  const double now = Now();
  std::lock_guard lock(mu_);
  std::shared_ptr<const JobSpec> spec;
  std::string owner;
  if (auto q = queued_.find(id); q != queued_.end()) {
    l.queued = true;
    l.waiting = WaitingReason(id);
    spec = q->second.spec, owner = q->second.owner;
    const std::optional<double> start = cycle_->ExpectedStart(std::to_string(id));
    // None: no reservation; infinite: one whose start is unknown (reserved all the same).
    if (start && std::isfinite(*start)) l.expected_start = std::max(*start, now);
    l.reserved = start.has_value();
  } else if (auto r = running_.find(id); r != running_.end()) {
    spec = r->second.spec, owner = r->second.owner;
    l.pid = r->second.pid;
    if (!r->second.stop.empty()) l.stopping = r->second.stop_reason;
  } else if (auto s = starting_.find(id); s != starting_.end()) {
    // Being started (its state already says running).
    spec = s->second.spec, owner = s->second.owner;
    // Cancelled meanwhile: it is stopped as soon as the process exists.
    if (!s->second.cancelled_by.empty()) l.stopping = s->second.cancelled_by;
  }
  if (!spec) return l;
  l.known = true;
  l.prediction = predictor_.Predict(RunKindOf(*spec, owner));
  if (auto r = running_.find(id); r != running_.end() && l.prediction.seconds > 0)
    l.expected_end = r->second.started + l.prediction.seconds;
  return l;
}

absl::Status Dispatcher::SetPriority(int64_t id, const std::string& ref, const JobRecord& first,
                                     int priority, const Caller& caller) {
  if (int ceiling = PriorityCeiling(caller.user, caller.uid, caller.admin); priority > ceiling) {
    return HttpError(403, fmt::format("priority {} is above {}'s ceiling of {} (priority_ceiling "
                                      "and priority_ceilings in the server's config)",
                                      priority, caller.user, ceiling));
  }
  const double now = Now();
  std::unique_lock lock(mu_);
  // Out of the cycle while the change is stored without mu_; back at its new place after.
  const std::vector<int64_t> change = BeginChange(lock, {id});
  if (change.empty()) {  // not queued (any more: BeginChange may have waited)
    auto now_r = store_->Get(id);
    return HttpError(409, fmt::format("job {} is {}: only a queued job's priority can change", ref,
                                      JobStateName(now_r.ok() ? now_r->state : first.state)));
  }
  const std::string reason =
      fmt::format("priority {} -> {} by {}", queued_.at(id).priority, priority, caller.user);
  lock.unlock();
  absl::Status st = store_->SetPriority(id, priority, reason, now);
  lock.lock();
  if (auto q = queued_.find(id); st.ok() && q != queued_.end()) {  // nothing takes it meanwhile
    q->second.priority = priority;
    q->second.waiting = "priority changed; not yet considered";
    spdlog::info("job {}: {}", id, reason);
  }
  EndChange(change);
  lock.unlock();
  if (!st.ok()) return HttpError(500, std::string(st.message()));
  wake_.notify_all();
  return absl::OkStatus();
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
  std::vector<GpuState> out(inventory_.gpus.size());
  std::lock_guard lock(mu_);
  const auto& state = scheduler_->state();
  for (size_t g = 0; g < out.size(); ++g) {
    GpuState& s = out[g];
    for (const auto& [id, r] : running_) {
      if (std::find(r.gpus.begin(), r.gpus.end(), static_cast<int>(g)) != r.gpus.end())
        s.jobs.push_back(id);
    }
    const auto& use = state.gpu_use(0, static_cast<int>(g));
    s.healthy = gpu_healthy_[g];
    s.reason = gpu_health_reason_[g];
    s.milli = use.milli;
    s.memory_mib = use.memory_mib;
    if (g < telemetry.size()) s.telemetry = telemetry[g];
  }
  return out;
}

std::vector<Dispatcher::QuotaState> Dispatcher::Quotas() const {
  std::vector<QuotaState> out;
  std::lock_guard lock(mu_);
  const sched::QuotaManager& qm = scheduler_->quotas();
  auto add = [&](const std::string& kind, const std::string& name, const std::string& owner) {
    const sched::OwnerQuota* q = qm.Get(owner);
    if (q != nullptr) out.push_back({kind, name, *q, qm.Used(owner)});
  };
  for (const auto& [user, q] : config_.quotas) add("user", user, user);
  for (const auto& [group, q] : config_.group_quotas) add("group", group, "group:" + group);
  return out;
}

Dispatcher::Facts Dispatcher::Describe() const {
  Facts f;
  f.hostname = hostname_;
  f.arbiter_file = ArbiterFile();
  f.arbiter_access = arbiter_access_;
  f.containers = containers_;
  f.containers_off = containers_off_;
  f.cdi_spec = cdi_spec_path_;
  f.confinement = cgroups_->Describe();
  std::lock_guard lock(mu_);
  f.queued = queued_.size();
  f.running = running_.size();
  return f;
}

ServerMetricsSnapshot Dispatcher::MetricsSnapshot() {
  // Taken under the lock (copies); the telemetry and the shared regions are read outside it.
  ServerMetricsSnapshot snap;
  snap.hostname = hostname_;
  snap.simulated = inventory_.simulated;
  snap.gpus = inventory_.gpus;
  snap.telemetry = Telemetry();
  if (health_) {
    for (const devices::GpuHealth& h : health_->Snapshot()) snap.xids.push_back(h.xid_count);
  }
  std::lock_guard lock(mu_);
  snap.healthy = gpu_healthy_;
  const auto& state = scheduler_->state();
  for (size_t g = 0; g < snap.gpus.size(); ++g) {
    const auto& use = state.gpu_use(0, static_cast<int>(g));
    snap.allocated_share.push_back(use.milli / 1000.0);
    snap.allocated_memory_bytes.push_back(use.memory_mib * (int64_t{1} << 20));
  }
  for (const auto& [id, r] : running_) {
    for (size_t i = 0; i < r.gpus.size(); ++i) {
      snap.jobs.push_back({.id = id,
                           .user = r.owner,
                           .gpu = r.gpus[i],
                           .ordinal = static_cast<int>(i),
                           .share = r.region.empty() ? 1.0 : r.gpu_milli / 1000.0,
                           .limit_bytes = r.memory_limit_mib * (int64_t{1} << 20),
                           .region = r.region});
    }
  }
  snap.queued = queued_.size();
  snap.running = running_.size();
  snap.scheduling = scheduling_;
  return snap;
}

void Dispatcher::GpuHealth(std::vector<bool>* healthy, std::vector<std::string>* reasons) const {
  std::lock_guard lock(mu_);
  if (healthy) *healthy = gpu_healthy_;
  if (reasons) *reasons = gpu_health_reason_;
}

std::pair<double, uint64_t> Dispatcher::Samples() const {
  std::lock_guard lock(history_mu_);
  return {last_sample_at_, samples_taken_};
}

void Dispatcher::Feed::Bump() {
  {
    std::lock_guard lock(mu_);
    ++version_;
  }
  cv_.notify_all();
}

bool Dispatcher::Feed::Wait(uint64_t* seen, double timeout_s) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
               [&] { return closed_ || version_ != *seen; });
  *seen = version_;
  return !closed_;
}

bool Dispatcher::Feed::SleepUntil(std::chrono::steady_clock::time_point t) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, t, [&] { return closed_; });
  return !closed_;
}

void Dispatcher::Feed::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void Dispatcher::StartHistory(bool thread) {
  store_->set_on_change([this] { feed_.Bump(); });
  if (!thread) return;
  sampler_ = std::thread([this] {
    auto next = std::chrono::steady_clock::now();
    do {
      TakeSample();
      next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(config_.history_interval_s));
    } while (feed_.SleepUntil(next));  // the interval, or until the server stops
  });
}

std::string Dispatcher::TakeSample() {
  const double now = Now();
  const std::vector<devices::GpuTelemetry> telemetry = Telemetry();
  // The fractional jobs' own files (the arbiter's GPU time, their regions' peaks), read without
  // the lock: for their history.
  // id, GPUs, compute, region
  std::vector<std::tuple<int64_t, std::vector<int>, bool, std::string>> share_jobs;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, r] : running_) {
      if (!r.region.empty() && !r.gpus.empty())
        share_jobs.emplace_back(id, r.gpus, r.gpu_milli > 0, r.region);
    }
  }
  std::map<int64_t, ShareReading> shares;
  for (const auto& [id, gpus, compute, region] : share_jobs)
    shares[id] = ReadShare(id, gpus, compute, region);
  json util = json::array(), mem = json::array(), alloc = json::array(), alloc_mem = json::array();
  int busy = 0, healthy = 0;
  double allocated = 0;
  size_t queued = 0, running = 0;
  {
    std::lock_guard lock(mu_);
    MeasureRunning(telemetry, shares);
    const auto& state = scheduler_->state();
    for (size_t g = 0; g < inventory_.gpus.size(); ++g) {
      const auto& use = state.gpu_use(0, static_cast<int>(g));
      alloc.push_back(static_cast<double>(use.milli) / core::kMilliPerGpu);
      alloc_mem.push_back(static_cast<uint64_t>(use.memory_mib) << 20);
      busy += use.milli > 0 || use.memory_mib > 0;
      allocated += static_cast<double>(use.milli) / core::kMilliPerGpu;
      healthy += gpu_healthy_[g] ? 1 : 0;
    }
    queued = queued_.size();
    running = running_.size();
  }
  for (const devices::GpuTelemetry& t : telemetry) {
    util.push_back(OrNull(t.utilization));
    mem.push_back(OrNull(t.memory_used_bytes));
  }
  const json j = {
      {"at", now},          {"queued", queued},       {"running", running}, {"busy", busy},
      {"healthy", healthy}, {"allocated", allocated}, {"util", util},       {"mem", mem},
      {"alloc", alloc},     {"alloc_mem", alloc_mem}};
  std::string data = j.dump();
  if (absl::Status st = store_->AddSample({now, data}, now - config_.history_window_s); !st.ok()) {
    spdlog::warn("history: sample not stored: {}", std::string(st.message()));
  }
  {
    std::lock_guard lock(history_mu_);
    last_sample_at_ = now;
    ++samples_taken_;
  }
  feed_.Bump();
  return data;
}

}  // namespace tessera::server
