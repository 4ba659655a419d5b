#pragma once
// A job's own /tmp and /dev/shm (issue 51: 1 GiB a job wrote to /dev/shm stayed in RAM after it
// ended, outside every limit; what it left in /tmp stayed for good). As Slurm's job_container/tmpfs
// does: each of the job's tasks, before it drops to the job's user, enters a mount namespace of its
// own (nothing it mounts reaches the host), binds the job's folders over /tmp and /dev/shm, and
// binds back at their places the folders under those the job needs (its working directory, its
// output files' folders, its region, the server's state folder), so a job started in /tmp/exp
// still finds /tmp/exp. The tasks of one job bind the same folders: they share /tmp and /dev/shm
// as processes of one machine would (NCCL's shared memory between ranks keeps working). The host
// removes the folders when the job ends, so nothing it left there outlives it; what it writes to
// /dev/shm is memory of its own cgroup (tmpfs pages are charged to their writer) while it runs.
//
// The folders: <tmp>/.tessera-<instance>/job-<id> and <shm>/.tessera-<instance>/job-<id>, the
// parents root's own 0700 (no one else can reach a job's folder by its path, nor plant one before
// it exists), each job's folder 0700 of the job's user.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::server {

// What a job's tasks mount (LaunchSpec::private_dirs).
struct PrivateDirs {
  std::string tmp;  // bound over /tmp
  std::string shm;  // bound over /dev/shm
  // Paths kept visible at their places: those under /tmp or /dev/shm are bound back (the folder
  // itself for a folder, else the one holding it); others need nothing. One that is /tmp (or
  // /dev/shm) itself leaves that one shared.
  std::vector<std::string> keep;
};

// The mounts worked out before the fork (paths resolved, parents of kept paths found): the child
// then only makes system calls.
struct PreparedMounts {
  struct Target {
    std::string source;             // the job's folder
    std::string where;              // "/tmp" or "/dev/shm"
    std::vector<std::string> keep;  // folders under `where` bound back, none inside another
  };
  std::vector<Target> targets;  // empty: nothing to do
  std::vector<int> fds;         // one per kept folder, sized before the fork
};
PreparedMounts PrepareMounts(const PrivateDirs& dirs);

// In a task after the fork, before it drops its privileges: the namespace and the binds.
// Async-signal-safe (system calls only, nothing allocated). False with errno set when one fails.
bool EnterPrivateDirs(PreparedMounts& m);

// The host's side: the jobs' folders, made before a launch and removed at the end.
class PrivateDirFolders {
 public:
  // `instance` names this server's folders apart from another's on the host (two servers may
  // run jobs of the same id). Disabled, with the reason, when the server is not root (its jobs
  // then run as its own user) or `on` is false.
  PrivateDirFolders(bool on, std::string tmp_base, std::string shm_base, std::string instance);
  // The two parents removed when no job's folder is in them (the server stopped without jobs; a
  // job still running through a restart keeps its folder and so its parent). A host that runs
  // many servers in turn (each test's) is not left one pair of folders for each.
  ~PrivateDirFolders();
  PrivateDirFolders(const PrivateDirFolders&) = delete;
  PrivateDirFolders& operator=(const PrivateDirFolders&) = delete;

  bool enabled() const { return reason_.empty(); }
  // Why not enabled; empty when it is.
  const std::string& reason() const { return reason_; }

  // The job's two folders, made for user `uid`/`gid` (any left by an earlier job of the id
  // removed first). kInternal naming the folder that could not be made, nothing left behind.
  absl::StatusOr<PrivateDirs> Make(int64_t job, uid_t uid, gid_t gid);
  // Removes the job's folders with all they hold.
  void Remove(int64_t job);
  // Removes the folders of jobs not in `keep` (ended while the server was down); how many jobs.
  size_t Sweep(const std::set<int64_t>& keep);

  // The folder of `job` under `base` (tests).
  std::string FolderOf(const std::string& base, int64_t job) const;

 private:
  // The parent under `base`, made root's and 0700 (one that is not: moved aside first).
  bool EnsureParent(const std::string& base, std::string* why);
  std::string tmp_base_, shm_base_, instance_, reason_;
};

// A short name for a server's folders, stable across its restarts and upgrades: a hash of its
// state folder.
std::string InstanceName(const std::string& state_dir);

}  // namespace tessera::server
