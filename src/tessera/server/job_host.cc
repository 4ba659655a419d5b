#include "tessera/server/job_host.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/server/file_acl.h"
#include "tessera/server/server_metrics.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"

namespace tessera::server {

namespace fs = std::filesystem;

LocalJobHost::LocalJobHost(Launcher* launcher, std::unique_ptr<Cgroups> cgroups,
                           std::string arbiter, std::unique_ptr<PrivateDirFolders> private_dirs,
                           std::vector<std::string> keep)
    : launcher_(launcher),
      cgroups_(std::move(cgroups)),
      arbiter_(std::move(arbiter)),
      private_dirs_(std::move(private_dirs)),
      keep_(std::move(keep)) {
  MakeArbiter();
}

size_t LocalJobHost::Sweep(const std::set<int64_t>& keep) {
  const size_t n = cgroups_->Sweep(keep);
  if (private_dirs_) {
    if (size_t dirs = private_dirs_->Sweep(keep); dirs > 0)
      spdlog::info("private /tmp: removed the folders of {} jobs that ended while down", dirs);
  }
  return n;
}

absl::StatusOr<Launched> LocalJobHost::Launch(LaunchSpec& ls,
                                              const std::optional<CgroupLimits>& limits) {
  if (ls.uid && ls.gid) {
    // Its logs, made for its user: the job needs no right to create files in the state folder.
    std::vector<std::string> logs = {ls.stdout_path, ls.stderr_path};
    for (const TaskLaunch& t : ls.tasks) {
      if (t.stdout_path != ls.stdout_path) logs.push_back(t.stdout_path);
      if (t.stderr_path != ls.stderr_path) logs.push_back(t.stderr_path);
    }
    for (const std::string& p : logs) {
      // Private to the job's user (and the server): a job's output may hold its secrets, and
      // the API shows it to no one else either; its group is not let in (a shared `users`).
      int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (fd >= 0) {
        if (fchmod(fd, 0600) != 0)
          spdlog::warn("job {}: chmod {}: {}", ls.job_id, p, strerror(errno));
        if (fchown(fd, *ls.uid, *ls.gid) != 0)
          spdlog::warn("job {}: chown {}: {}", ls.job_id, p, strerror(errno));
        close(fd);
      }
    }
  }
  if (ls.share) {
    // The job's region (owned by the job's user), so that a container has a file to bind.
    std::error_code ec;
    fs::remove(ls.share->region, ec);
    char err[256] = {};
    // A limit per GPU of the job, in the order of its CUDA ordinals.
    const std::vector<uint64_t> per_gpu(std::max<size_t>(ls.share->physical_gpus.size(), 1),
                                        ls.share->memory_bytes);
    if (!shim::CreateRegionFile(ls.share->region.c_str(), per_gpu.data(),
                                static_cast<int>(per_gpu.size()), err, sizeof err)) {
      spdlog::warn("job {}: shared region {}: {}", ls.job_id, ls.share->region, err);
    } else if (ls.uid && ls.gid && chown(ls.share->region.c_str(), *ls.uid, *ls.gid) != 0) {
      spdlog::warn("job {}: chown {}: {}", ls.job_id, ls.share->region, strerror(errno));
    }
  }
  // Its own /tmp and /dev/shm (a container has its own already), or not started at all.
  if (private_dirs_ && private_dirs_->enabled() && ls.uid && ls.gid && !ls.container) {
    auto dirs = private_dirs_->Make(ls.job_id, *ls.uid, *ls.gid);
    if (!dirs.ok()) {
      return absl::FailedPreconditionError(fmt::format("cannot make the job's private /tmp: {}",
                                                       std::string(dirs.status().message())));
    }
    dirs->keep = keep_;
    if (ls.host_shm) dirs->keep.push_back("/dev/shm");  // kept, the host's is shared
    ls.private_dirs = *dirs;
  }
  auto start = [&] {
    auto launched = launcher_->Start(ls);
    if (!launched.ok() && ls.private_dirs) private_dirs_->Remove(ls.job_id);
    return launched;
  };
  if (!limits) return start();
  // Confined, or not started at all: never a job that escapes its devices by accident.
  auto procs = cgroups_->Create(ls.job_id, *limits);
  if (!procs.ok()) {
    if (ls.private_dirs) private_dirs_->Remove(ls.job_id);
    return absl::FailedPreconditionError(
        fmt::format("cannot confine the job: {}", std::string(procs.status().message())));
  }
  ls.cgroup_procs = *procs;
  auto launched = start();
  if (!launched.ok()) cgroups_->Remove(ls.job_id);
  return launched;
}

JobHost::Confinement LocalJobHost::confinement() const {
  Confinement c{cgroups_->mode(), cgroups_->reason(), cgroups_->Describe()};
  c.where["tmp"] = !private_dirs_ ? "shared"
                   : private_dirs_->enabled()
                       ? "private: each job's own /tmp and /dev/shm, removed at its end"
                       : "shared: " + private_dirs_->reason();
  return c;
}

void LocalJobHost::UseContainers(const ContainerRuntime& runtime) {
  containers_ = runtime;
  podman_launcher_ = std::make_unique<PodmanLauncher>(launcher_, runtime);
  launcher_ = podman_launcher_.get();
}

void LocalJobHost::RemoveContainer(int64_t job) {
  if (containers_) server::RemoveContainer(*containers_, job);
}

JobHost::ShareUse LocalJobHost::ReadShare(int64_t job, const std::vector<int>& gpus,
                                          bool compute_share, const std::string& region) {
  ShareUse s;
  if (compute_share && !gpus.empty()) {
    // On several GPUs: the mean per GPU (its utilization is of one GPU, as a share is).
    core::MutexLock lock(arbiter_mu_);
    const shim::ArbiterUse use =
        shim::ArbiterJobUse(arbiter_.c_str(), gpus.data(), static_cast<int>(gpus.size()),
                            shim::ArbiterJobKey(std::to_string(job).c_str()));
    s.busy_us = use.busy_us / gpus.size();
    s.held_us = use.held_us / gpus.size();
  }
  const RegionMemory m = ReadRegionMemory(region);
  s.peak_bytes = m.peak;
  s.refused = m.refused;
  s.wanted_bytes = m.wanted;
  return s;
}

uint64_t LocalJobHost::KernelLaunches(const std::string& region) {
  return shim::ReadRegionLaunches(region.c_str());
}

void LocalJobHost::RemoveRegion(const std::string& region) {
  std::error_code ec;
  fs::remove(region, ec);
}

void LocalJobHost::MakeArbiter() {
  // The arbiter file is shared by the fractional jobs of every user: the server makes it rather
  // than the first job (whose user may not write the state folder, and whose file would be its
  // own). In a folder of its own: a container gets the folder (a bind mount of the file itself
  // would pin the old file when it is replaced). Nobody but the server creates anything in it.
  char err[256] = {};
  const std::string folder = fs::path(arbiter_).parent_path().string();
  if (mkdir(folder.c_str(), 0711) != 0 && errno != EEXIST)
    spdlog::warn("cannot create {}: {}", folder, strerror(errno));
  chmod(folder.c_str(), 0711);
  bool made = shim::CreateArbiterFile(arbiter_.c_str(), err, sizeof err);
  if (!made && strstr(err, "of this version") != nullptr) {
    // Left by an older Tessera: replaced. Jobs it started keep the old file (their mapping) until
    // they end; new jobs are paced among themselves.
    spdlog::warn("GPU arbiter file {}: {}; replacing it", arbiter_, err);
    if (unlink(arbiter_.c_str()) == 0)
      made = shim::CreateArbiterFile(arbiter_.c_str(), err, sizeof err);
  }
  if (!made) {
    spdlog::warn("GPU arbiter file {}: {}; compute shares will not be enforced", arbiter_, err);
    arbiter_access_ = fmt::format("none: {}", err);
    return;
  }
  if (char previous[4200]; shim::ArbiterPreviousKept(arbiter_.c_str(), previous, sizeof previous))
    spdlog::info(
        "GPU arbiter file {}: the one of before an upgrade is kept at {} (the server's "
        "alone) while jobs that mapped it may run: their GPU time is read from both",
        arbiter_, previous);
  // The server's alone, and the users with a job using it (an ACL per user, kept as jobs start and
  // end): another local user cannot overwrite what every fractional job relies on.
  if (chmod(arbiter_.c_str(), 0600) != 0) spdlog::warn("chmod {}: {}", arbiter_, strerror(errno));
  if (geteuid() != 0) {
    arbiter_access_ = "the server's user only (0600): every job runs as that user";
    return;
  }
  absl::Status st = SetUserAcl(arbiter_, {});
  if (st.ok()) {
    arbiter_acl_ = true;
    arbiter_access_ = "0600 plus an ACL entry per user with a running job that has a compute share";
    return;
  }
  // No ACLs where the state lives: open to all, said.
  if (chmod(arbiter_.c_str(), 0666) != 0) spdlog::warn("chmod {}: {}", arbiter_, strerror(errno));
  arbiter_access_ = fmt::format("0666, open to every local user: {}", std::string(st.message()));
  spdlog::warn("GPU arbiter file {} is {}", arbiter_, arbiter_access_);
}

void LocalJobHost::TidyArbiter(const std::vector<int64_t>& running) {
  std::vector<uint64_t> held;
  held.reserve(running.size());
  for (const int64_t job : running)
    held.push_back(shim::ArbiterJobKey(std::to_string(job).c_str()));
  if (shim::RemoveStaleArbiterPrevious(arbiter_.c_str(), held.data(), held.size()))
    spdlog::info(
        "GPU arbiter file {}: the one of before an upgrade is removed: none of the jobs "
        "that mapped it has used it for an hour, and none of their processes is left",
        arbiter_);
}

std::set<uid_t> LocalJobHost::ArbiterUsersLocked() const {
  std::set<uid_t> users;
  for (const auto& [u, count] : arbiter_users_) users.insert(u);
  return users;
}

void LocalJobHost::ArbiterUser(uint32_t uid, int delta) {
  if (!arbiter_acl_ || uid == 0) return;
  core::MutexLock lock(arbiter_mu_);
  int& n = arbiter_users_[uid];
  const bool was = n > 0;
  n = std::max(0, n + delta);
  if (n == 0) arbiter_users_.erase(uid);
  if (was == (n > 0)) return;
  const std::set<uid_t> users = ArbiterUsersLocked();
  if (!was) {
    if (absl::Status st = SetUserAcl(arbiter_, users); !st.ok())
      spdlog::warn("GPU arbiter file: {}", std::string(st.message()));
    return;
  }
  // A user's access removed: a descriptor she opened before would keep writing the file, so a
  // copy with the remaining users' entries is renamed over it (the jobs' processes follow it
  // within ArbiterConfig::follow_us).
  absl::Status st = ReplaceArbiter(arbiter_, users);
  if (st.ok()) {
    spdlog::info("GPU arbiter file replaced: uid {} has no job with a compute share any more", uid);
    return;
  }
  spdlog::warn("GPU arbiter file: cannot replace it ({}); only the ACL entry of uid {} is removed",
               std::string(st.message()), uid);
  if (absl::Status acl = SetUserAcl(arbiter_, users); !acl.ok())
    spdlog::warn("GPU arbiter file: {}", std::string(acl.message()));
}

void LocalJobHost::RepairArbiter() {
  // Every user with a share job may write the arbiter: one may truncate it or fill its head with
  // garbage. The jobs' processes survive that (zero pages instead of SIGBUS) but run unpaced until
  // a whole file is at the path; a fresh copy renamed over it is followed by all of them.
  struct stat st;
  if (lstat(arbiter_.c_str(), &st) != 0) return;  // not made (yet): nothing to repair
  const int fd = shim::OpenSharedFile(arbiter_.c_str(), sizeof(shim::ArbiterData),
                                      shim::kArbiterMagic, shim::kArbiterVersion);
  if (fd >= 0) {
    close(fd);
    return;
  }
  std::set<uid_t> users;
  {
    core::MutexLock lock(arbiter_mu_);
    users = ArbiterUsersLocked();
  }
  // Without ACLs where the state lives the file was open to all, and so is its copy.
  const absl::Status replaced = ReplaceArbiter(arbiter_, users, /*open_to_all=*/!arbiter_acl_);
  if (replaced.ok()) {
    spdlog::warn(
        "GPU arbiter file {} was damaged (truncated, or not an arbiter any more): "
        "replaced by a fresh one, which the jobs' processes follow",
        arbiter_);
  } else {
    spdlog::warn("GPU arbiter file {} is damaged and cannot be replaced: {}", arbiter_,
                 std::string(replaced.message()));
  }
}

}  // namespace tessera::server
