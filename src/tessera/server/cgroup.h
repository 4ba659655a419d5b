#pragma once
// Confinement of job processes by cgroups: each job gets its own cgroup that lets it open only the
// device nodes it was given (and the few every process needs), with host memory, CPU and pids
// limits when asked, and accounting (CPU seconds, peak memory, OOM kills) read back at its end.
//
// Both hierarchies a Linux machine may have are handled, chosen at run time:
// - cgroup2: devices by a BPF_PROG_TYPE_CGROUP_DEVICE program attached to the job's cgroup (raw
//   bpf(2)); memory.max, cpu.max, pids.max where the unified hierarchy has those controllers.
// - cgroup1: the `devices` controller (devices.deny "a", then devices.allow per rule); memory, cpu,
//   cpuacct and pids from their own mounts.
// On a hybrid machine (v1 controllers plus a cgroup2 mount without them) each resource goes where
// its controller is; devices go to v1 in `auto` mode. Job cgroups live in a subtree of the
// server's own cgroup (<its cgroup>/<name>/job-<id>): a delegated subtree, so that the server
// needs no systemd API and a unit with Delegate=yes works as is (docs/server.md). Jobs sit in a
// cgroup of their user (<name>/user-<uid>/job-<id>) that bounds the tasks of all of that user's
// jobs together; job-<id> directly below <name> (a server before that) is still found.

#include <linux/bpf.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "tessera/core/mutex.h"

namespace tessera::server {

// One allowed device access, as the v1 devices controller writes it: "c 195:0 rwm".
struct DeviceRule {
  char type = 'c';     // 'c' character, 'b' block, 'a' all
  int64_t major = -1;  // -1: any
  int64_t minor = -1;  // -1: any
  std::string access = "rwm";
  std::string ToString() const;
};

// The rules every job gets whatever its GPUs: mknod of anything (opening still needs a rule), the
// null/zero/full/random/urandom nodes, tty, ptmx and pseudo-terminals.
std::vector<DeviceRule> BaseDeviceRules();
// A rule for the character device at `path` (its major:minor); nullopt when it is not one.
std::optional<DeviceRule> RuleFor(const std::string& path);
// The cgroup2 form of `rules`: a BPF_PROG_TYPE_CGROUP_DEVICE program that returns 1 (allow) for an
// access one of them covers and 0 (refuse) otherwise. Its context (struct bpf_cgroup_dev_ctx) is
// access_type, major, minor, where the kernel packs access_type as (access << 16) | type: the
// BPF_DEVCG_DEV_* type in the low 16 bits, the BPF_DEVCG_ACC_* access in the high
// (__cgroup_bpf_check_dev_permission, kernel/bpf/cgroup.c).
std::vector<bpf_insn> DeviceProgram(const std::vector<DeviceRule>& rules);

struct CgroupLimits {
  std::vector<DeviceRule> devices;  // what the job may open; every other device is refused
  int64_t memory_bytes = 0;         // host memory; 0: no limit
  int64_t cpu_milli = 0;            // CPU time per second of wall time, thousandths; 0: no limit
  int64_t pids_max = 0;             // processes and threads; 0: no limit
  uint32_t uid = 0;                 // the job's user: its cgroup is below theirs
  int64_t user_pids_max = 0;        // tasks of all the user's jobs together; 0: no limit
};

// The per-user task limit `configured` means: itself when >= 0 (0: none), else (-1) a quarter of
// what the host can have, the lesser of kernel.pid_max and kernel.threads-max (read from
// `proc_sys`, /proc/sys/kernel), at least 1024.
int64_t UserPidsMax(int64_t configured, const std::string& proc_sys = "/proc/sys/kernel");

struct CgroupUsage {
  double cpu_seconds = -1;         // -1: not known
  int64_t peak_memory_bytes = -1;  // -1: not known
  int64_t oom_kills = 0;           // processes the kernel killed at the memory limit
};

struct CgroupOptions {
  std::string mode = "auto";     // auto | cgroup2 | cgroup1 | off
  std::string name = "tessera";  // the subtree under the server's own cgroup
  // Where the machine's cgroup mounts and our process's cgroups are read from (tests: fakes).
  std::string mountinfo = "/proc/self/mountinfo";
  std::string self_cgroup = "/proc/self/cgroup";
};

class Cgroups {
 public:
  // Finds what the machine offers, makes the subtree and locks it (flock on each base folder) for
  // this server's life. Never fails: when nothing can be used it is in mode "none" and reason()
  // says why; when another server holds the subtree, busy() says so and it must not be used (its
  // Sweep and Close would remove the other server's jobs' cgroups).
  static std::unique_ptr<Cgroups> Open(const CgroupOptions& options);
  ~Cgroups();
  Cgroups(const Cgroups&) = delete;
  Cgroups& operator=(const Cgroups&) = delete;

  // "cgroup2" (devices by BPF), "cgroup1" (devices controller) or "none" (devices not confined).
  const std::string& mode() const { return mode_; }
  // Why the mode is "none", or what was left out ("memory: no controller"); empty when all is well.
  const std::string& reason() const { return reason_; }
  // Non-empty when another process (a server) holds the subtree: which folder.
  const std::string& busy() const { return busy_; }
  // {"mode", "reason", "devices", "memory", "cpu", "pids": where each is enforced or "none"}.
  nlohmann::json Describe() const;
  // Whether a limit of that kind can be enforced.
  bool limits_memory() const { return memory_ >= 0; }
  bool limits_cpu() const { return cpu_ >= 0; }
  // Whether jobs get cgroups at all (some hierarchy is usable).
  bool active() const { return !Used().empty(); }

  // Makes the job's cgroups with `limits`; the cgroup.procs files its first process joins (before
  // it execs, see LaunchSpec::cgroup_procs). kInternal naming the file that could not be written,
  // with nothing left behind.
  absl::StatusOr<std::vector<std::string>> Create(int64_t job, const CgroupLimits& limits);
  // What the job used so far (read before Remove).
  CgroupUsage Usage(int64_t job) const;
  // Kills what is left of the job (daemons it left behind) and removes its cgroups. False while
  // some cannot be removed yet (processes still exiting): call again later.
  bool Remove(int64_t job);
  // Removes the cgroups of jobs not in `keep` (after a restart), then returns how many were.
  size_t Sweep(const std::set<int64_t>& keep);
  // Removes the (empty) subtree; on server stop.
  void Close();

 private:
  struct Hierarchy {
    std::string base;  // <mount><server's cgroup>/<name>
    bool v2 = false;
  };
  Cgroups() = default;
  std::string JobDir(int h, int64_t job) const;
  std::string JobDirLocked(int h, int64_t job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(dirs_mu_);
  // "user-<uid>/" for a job below its user's cgroup, "" for one directly below the base (made by
  // an older server) or not found.
  std::string UserPartLocked(int64_t job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(dirs_mu_);
  std::vector<int> Used() const;  // hierarchies that jobs get a cgroup in
  // Removes the job's cgroups (Remove's work), under dirs_mu_.
  bool RemoveLocked(int64_t job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dirs_mu_);

  std::string mode_ = "none";
  std::string reason_;
  std::string busy_;
  std::vector<int> locks_;  // an open, flock'ed descriptor of each base folder
  std::vector<Hierarchy> hierarchies_;
  // Index into hierarchies_ of where each resource is, -1: nowhere.
  int devices_ = -1, memory_ = -1, cpu_ = -1, cpuacct_ = -1, pids_ = -1, v2_ = -1;
  std::string v2_enable_;  // the controllers a cgroup2 folder passes on ("+memory +cpu +pids")
  // Users' folders are made and removed under it (a job's start and another's end of one user).
  mutable core::Mutex dirs_mu_;
  mutable std::map<int64_t, uint32_t> user_of_ ABSL_GUARDED_BY(dirs_mu_);  // job -> uid
};

}  // namespace tessera::server
