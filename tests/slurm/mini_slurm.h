#pragma once
// A real Slurm on this machine for the tests (Debian's slurm-wlm: munged, slurmctld and slurmd),
// started and stopped by the tests themselves in a folder of their own: a generated slurm.conf
// (its own ports, state, logs and munge socket, no systemd, cgroups or accounting database), and
// two GPUs as character devices made with mknod (major 195, as NVIDIA's), each counted as
// `shards_per_gpu` shards in gres.conf. The plugin is loaded through plugstack.conf from slurmd's
// start (its epilog callback is read only then).
#include <sys/types.h>

#include <string>

namespace tessera::slurm_test {

class MiniSlurm {
 public:
  struct Options {
    std::string plugin;       // tessera-spank.so (empty: none, a plain Slurm)
    std::string plugin_args;  // its words in plugstack.conf (but state_dir=)
    int shards_per_gpu = 8;
  };
  // Why Slurm cannot run here (not installed, not root), or empty.
  static std::string Unavailable();
  explicit MiniSlurm(const Options& options);
  ~MiniSlurm();
  MiniSlurm(const MiniSlurm&) = delete;
  MiniSlurm& operator=(const MiniSlurm&) = delete;

  // Empty when the cluster is up (its node idle), else what went wrong (with the logs' tails).
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_; }
  // "SLURM_CONF=... " to put before srun/sbatch/squeue command lines.
  std::string Env() const { return "SLURM_CONF=" + dir_ + "/slurm.conf "; }
  // Rewrites plugstack.conf (read again by each step and by srun/sbatch): the plugin with `args`
  // and state_dir= the cluster's own folder for it.
  void SetPluginArgs(const std::string& args);
  std::string PluginStateDir() const { return dir_ + "/tessera"; }
  std::string Logs() const;

 private:
  void Stop();
  Options options_;
  std::string dir_, error_;
  pid_t munged_ = -1, slurmctld_ = -1, slurmd_ = -1;
};

}  // namespace tessera::slurm_test
