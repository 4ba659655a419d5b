#pragma once
// JobHost: the machine the server's jobs run on, and everything done to a job's process and its
// surroundings there - its log files and shared region made for its user, its cgroup, its process
// or container, signals and reaping, its cgroup's accounting and removal at its end, and who may
// write the GPU arbiter file (an ACL entry per user with a compute-share job running). The
// dispatcher decides what a job gets (its launch spec, its limits); the host carries it out and
// touches the machine. LocalJobHost is the real one; tests drive the dispatcher with a
// FakeJobHost (fake_job_host.h), which records what it was asked and touches nothing.
// Implementations are called from the server's scheduling thread and its API threads; they must be
// thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/mutex.h"
#include "tessera/server/cgroup.h"
#include "tessera/server/container.h"
#include "tessera/server/launcher.h"
#include "tessera/server/runner.h"

namespace tessera::server {

class JobHost {
 public:
  virtual ~JobHost() = default;

  // Prepares and starts a job: its log files (created; owned by spec.uid/gid when set), its shared
  // region (spec.share: made with its memory limit per GPU, owned likewise), its cgroup when
  // `limits` is set (a job that cannot be confined is not started at all: kFailedPrecondition
  // "cannot confine the job: ..."), then its processes (spec.cgroup_procs set). On failure
  // nothing of it is left running and its cgroup is gone.
  virtual absl::StatusOr<Launched> Launch(LaunchSpec& spec,
                                          const std::optional<CgroupLimits>& limits) = 0;
  // Launcher's: signals, exit codes, liveness of re-adopted jobs, pidfd watching.
  virtual bool Signal(pid_t pgid, int sig) = 0;
  virtual std::optional<int> Reap(pid_t pid) = 0;
  virtual bool Alive(pid_t pid, uint64_t start_time) = 0;
  virtual bool WatchableByPidfd() const = 0;

  // Confinement: whether jobs get a cgroup, and what it limits (for the log and /v1/info).
  struct Confinement {
    std::string mode = "none";  // as Cgroups::mode()
    std::string reason;
    nlohmann::json where = nlohmann::json::object();  // Cgroups::Describe()
  };
  virtual bool confines() const = 0;
  virtual Confinement confinement() const = 0;
  // An ended job's cgroup: its accounting, then the cgroup removed with whatever is left in it;
  // false while it is still busy (asked again later).
  virtual CgroupUsage Usage(int64_t job) = 0;
  virtual bool Unconfine(int64_t job) = 0;
  // Removes the cgroups (and private /tmp and /dev/shm) of jobs not in `keep` (ended while the
  // server was down); how many.
  virtual size_t Sweep(const std::set<int64_t>& keep) = 0;
  // An ended job's private /tmp and /dev/shm (LaunchSpec::private_dirs) go, with what it left.
  virtual void RemovePrivateDirs(int64_t job) = 0;
  // The server stops: its cgroup subtree goes when no job is left in it.
  virtual void Close() = 0;

  // Jobs with an image run as podman's clients from now on (through the same Launch).
  virtual void UseContainers(const ContainerRuntime& runtime) = 0;
  // Removes job `job`'s container by name (its client was killed, or ended without it).
  virtual void RemoveContainer(int64_t job) = 0;

  // A share's files: what its region says it held at most (bytes, one GPU), the allocations it
  // refused for the limit (all GPUs) and the most the job would have held (bytes, one GPU) and,
  // with a compute share, the GPU time the arbiter charged it (microseconds, the mean over
  // `gpus`); then removal.
  struct ShareUse {
    uint64_t busy_us = 0;
    uint64_t held_us = 0;  // how long its launches waited for the GPU (shim::ArbiterJob::held_us)
    uint64_t peak_bytes = 0;
    uint64_t refused = 0;
    uint64_t wanted_bytes = 0;
  };
  virtual ShareUse ReadShare(int64_t job, const std::vector<int>& gpus, bool compute_share,
                             const std::string& region) = 0;
  virtual void RemoveRegion(const std::string& region) = 0;
  // The kernel launches a share's region counted (shim::ReadRegionLaunches); read at its end only
  // (the slots are about 150 KB).
  virtual uint64_t KernelLaunches(const std::string& region) = 0;

  // The GPU arbiter file every compute share paces by: counts a job of `uid` that uses it in (+1)
  // or out (-1); the users with one may write it, no one else. RepairArbiter replaces it when a
  // user damaged it. `arbiter_access` says how it is guarded.
  virtual void ArbiterUser(uint32_t uid, int delta) = 0;
  virtual void RepairArbiter() = 0;
  virtual std::string arbiter_access() const = 0;
  // Removes the arbiter file an upgrade kept (shim::RemoveStaleArbiterPrevious) once none of its
  // jobs may still use it or be unread - `running`, the jobs the server holds, keep it however long
  // idle (a container's processes cannot be seen from here); said. Asked at each sample.
  virtual void TidyArbiter(const std::vector<int64_t>& running) = 0;
};

// This machine: processes through a Launcher (runner.h; podman's clients for jobs with an image),
// cgroups (cgroup.h), files in the state folder, the arbiter file with an ACL per user.
class LocalJobHost final : public JobHost {
 public:
  // `launcher` must outlive the host. Makes the arbiter file at `arbiter` (in a folder of its own).
  // With `private_dirs` enabled, each job not in a container gets its own /tmp and /dev/shm, with
  // `keep` (the state folder) still visible in them.
  LocalJobHost(Launcher* launcher, std::unique_ptr<Cgroups> cgroups, std::string arbiter,
               std::unique_ptr<PrivateDirFolders> private_dirs = nullptr,
               std::vector<std::string> keep = {});

  absl::StatusOr<Launched> Launch(LaunchSpec& spec,
                                  const std::optional<CgroupLimits>& limits) override;
  bool Signal(pid_t pgid, int sig) override { return launcher_->Signal(pgid, sig); }
  std::optional<int> Reap(pid_t pid) override { return launcher_->Reap(pid); }
  bool Alive(pid_t pid, uint64_t start_time) override { return launcher_->Alive(pid, start_time); }
  bool WatchableByPidfd() const override { return launcher_->WatchableByPidfd(); }

  bool confines() const override { return cgroups_->active(); }
  Confinement confinement() const override;
  CgroupUsage Usage(int64_t job) override { return cgroups_->Usage(job); }
  bool Unconfine(int64_t job) override { return cgroups_->Remove(job); }
  size_t Sweep(const std::set<int64_t>& keep) override;
  void RemovePrivateDirs(int64_t job) override {
    if (private_dirs_) private_dirs_->Remove(job);
  }
  void Close() override { cgroups_->Close(); }

  void UseContainers(const ContainerRuntime& runtime) override;
  void RemoveContainer(int64_t job) override;

  ShareUse ReadShare(int64_t job, const std::vector<int>& gpus, bool compute_share,
                     const std::string& region) override;
  void RemoveRegion(const std::string& region) override;
  uint64_t KernelLaunches(const std::string& region) override;

  void ArbiterUser(uint32_t uid, int delta) override;
  void RepairArbiter() override;
  std::string arbiter_access() const override { return arbiter_access_; }
  void TidyArbiter(const std::vector<int64_t>& running) override;

 private:
  void MakeArbiter();
  std::set<uid_t> ArbiterUsersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(arbiter_mu_);

  Launcher* launcher_;  // the given one, or podman_launcher_ over it
  std::unique_ptr<PodmanLauncher> podman_launcher_;
  std::optional<ContainerRuntime> containers_;
  std::unique_ptr<Cgroups> cgroups_;
  const std::string arbiter_;
  std::unique_ptr<PrivateDirFolders> private_dirs_;  // null or disabled: jobs share the host's
  const std::vector<std::string> keep_;
  // Who may write the arbiter: the owners of running jobs with a compute share, each with how
  // many (its ACL names them). Also held while a share's count is read: a read of the old file
  // after a replacement's copy was taken could see more than the copy says.
  mutable core::Mutex arbiter_mu_;
  std::map<uint32_t, int> arbiter_users_ ABSL_GUARDED_BY(arbiter_mu_);
  bool arbiter_acl_ = false;    // set once, by the constructor
  std::string arbiter_access_;  // likewise
};

}  // namespace tessera::server
