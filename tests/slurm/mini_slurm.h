#pragma once
// A real Slurm on this machine for the tests (Debian's slurm-wlm: munged, slurmctld and slurmd),
// started and stopped by the tests themselves in a folder of their own: a generated slurm.conf
// (its own ports, state, logs and munge socket, no systemd, cgroups or accounting database), and
// two GPUs as character devices made with mknod (major 195, as NVIDIA's), each counted as
// `shards_per_gpu` shards in gres.conf. The plugin is loaded through plugstack.conf from slurmd's
// start (its epilog callback is read only then).
#include <sys/types.h>

#include <string>
#include <vector>

namespace tessera::slurm_test {

class MiniSlurm {
 public:
  struct Options {
    std::string plugin;       // tessera-spank.so (empty: none, a plain Slurm)
    std::string plugin_args;  // its words in plugstack.conf (but state_dir=)
    int shards_per_gpu = 8;
    // With Slurm's accounting database: a MariaDB (Debian's mariadb-server) and slurmdbd started
    // here too, the cluster added with sacctmgr, so that sacct answers as on a site's cluster;
    // and jobacct_gather/linux, so that it has each step's CPU time and largest task's memory.
    bool accounting = false;
    // AuthInfo's cred_expire= (0: Slurm's 120 s), which is also how long a requeued job waits
    // before it may start again (at least 5).
    int cred_expire_s = 0;
    // Nodes: 1, this host by its name; more, as a site with several slurmd per host runs them
    // (node-a, node-b...: a slurmd each, -N, with its own port, spool and log, %n; the plugin's
    // state_dir= <dir>/tessera/%n, each node's own as on a cluster's local disks).
    int nodes = 1;
  };
  // Why Slurm cannot run here (not installed, not root), or empty; with `accounting`, also
  // slurmdbd and MariaDB.
  static std::string Unavailable(bool accounting = false);
  explicit MiniSlurm(const Options& options);
  ~MiniSlurm();
  MiniSlurm(const MiniSlurm&) = delete;
  MiniSlurm& operator=(const MiniSlurm&) = delete;

  // Empty when the cluster is up (its node idle), else what went wrong (with the logs' tails).
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_; }
  // "SLURM_CONF=... " to put before srun/sbatch/squeue command lines.
  std::string Env() const { return "SLURM_CONF=" + dir_ + "/slurm.conf "; }
  // Rewrites plugstack.conf (read again by each step and by srun/sbatch): the plugin (or another
  // build of it, `plugin`: a benchmark's baseline) with `args` and state_dir= the cluster's own
  // folder for it.
  void SetPluginArgs(const std::string& args, const std::string& plugin = "");
  std::string PluginStateDir() const { return dir_ + "/tessera"; }
  // A node's own state_dir= (of a cluster of several nodes).
  std::string PluginStateDir(const std::string& node) const {
    return options_.nodes > 1 ? dir_ + "/tessera/" + node : PluginStateDir();
  }
  // The nodes' Slurm names, the first the batch node of a job of them all.
  const std::vector<std::string>& nodes() const { return nodes_; }
  std::string Logs() const;
  // slurmdbd's process (with accounting; -1 without), for a test to stop and continue it.
  pid_t slurmdbd() const { return slurmdbd_; }

 private:
  void Stop();
  Options options_;
  std::string dir_, error_;
  pid_t munged_ = -1, slurmctld_ = -1, mariadbd_ = -1, slurmdbd_ = -1;
  std::vector<pid_t> slurmd_;
  std::vector<std::string> nodes_;
  // MariaDB and slurmdbd up, the cluster added; false with error_ set.
  bool StartAccounting(const std::string& host);
  int dbd_port_ = 0;
};

}  // namespace tessera::slurm_test
