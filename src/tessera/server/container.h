#pragma once
// Jobs in containers: a job submitted with an image runs under `podman run`, its GPUs handed over
// as CDI devices (the spec Tessera writes, devices/cdi.h), its environment and sharing limits
// passed in, the files the intercept library needs bound at their own paths. Podman's client is the
// job's process (in the job's process group, under the shepherd); it forwards signals to the
// container, and a container that outlives its client is removed by name. See docs/server.md
// ("Containers").

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/server/launcher.h"
#include "tessera/server/runner.h"

namespace tessera::server {

struct ContainerRuntime {
  std::string podman;        // absolute path
  std::string version;       // as `podman --version` says it
  std::string cdi_spec_dir;  // where the spec is written
  bool pass_cdi_spec_dir =
      false;  // podman takes --cdi-spec-dir (newer versions); else it reads only
              // /etc/cdi and /var/run/cdi, and the spec must be in one of them
  std::vector<std::string> extra_args;  // added to every `podman run` (config: containers.run_args)
};

// Finds podman (`podman` is a path, or a name looked up in PATH), asks its version and whether it
// takes --cdi-spec-dir. kNotFound when it is not installed; kFailedPrecondition when it does not
// run, or when `cdi_spec_dir` is not a folder this podman reads.
absl::StatusOr<ContainerRuntime> FindPodman(const std::string& podman,
                                            const std::string& cdi_spec_dir,
                                            std::vector<std::string> extra_args);

struct ContainerJob {
  int64_t job_id = 0;
  std::string image;
  std::vector<std::string> command;          // run in the image; empty: the image's own command
  std::map<std::string, std::string> env;    // everything the job gets (its own and Tessera's)
  std::string workdir;                       // inside the container; empty: the image's
  std::vector<std::string> cdi_devices;      // fully qualified CDI names
  std::vector<std::string> read_only_files;  // bound at the same path (the intercept library)
  std::vector<std::string> writable_files;   // bound at the same path (its region, the arbiter)
  std::string user;          // "uid:gid"; empty: the image's (rootless: the server's)
  int64_t memory_bytes = 0;  // --memory; 0: none
  int64_t cpu_milli = 0;     // --cpus; 0: none
  int64_t pids_max = 0;      // --pids-limit; 0: podman's default
  // --ipc=host: the host's IPC namespace and /dev/shm, where an MPS client meets its GPU's server
  // (the MPS server keeps its segments there).
  bool host_ipc = false;
};

// The container's name: tessera-job-<id>.
std::string ContainerName(int64_t job_id);

// podman's command line for `job`: `podman [--cdi-spec-dir D] run --rm --name N --label ...
// [--user]
// [-w] --device ... -v ... -e ... <extra args> IMAGE COMMAND...`.
std::vector<std::string> PodmanRunArgv(const ContainerRuntime& runtime, const ContainerJob& job);

// The launch of a job with an image turned into that of podman's client: the client is the job's
// process (so the shepherd, the process group, signals and exit codes work as for any job); what
// the job itself gets - its command, environment, workdir, user, GPUs as CDI devices, the intercept
// library's files, its limits - goes in through podman. Root's podman starts the container as the
// job's user (--user); the client itself stays the server's user.
LaunchSpec PodmanClientLaunch(const ContainerRuntime& runtime, const LaunchSpec& job);

// A Launcher for jobs with an image (LaunchSpec::container): they start as podman's client
// (PodmanClientLaunch) through `inner`; every other job, and signals, reaping and liveness, go to
// `inner` as they are.
class PodmanLauncher final : public Launcher {
 public:
  PodmanLauncher(Launcher* inner, ContainerRuntime runtime)
      : inner_(inner), runtime_(std::move(runtime)) {}
  absl::StatusOr<Launched> Start(const LaunchSpec& spec) override;
  bool Signal(pid_t pgid, int sig) override { return inner_->Signal(pgid, sig); }
  std::optional<int> Reap(pid_t pid) override { return inner_->Reap(pid); }
  bool Alive(pid_t pid, uint64_t start_time) override { return inner_->Alive(pid, start_time); }
  bool WatchableByPidfd() const override { return inner_->WatchableByPidfd(); }
  const ContainerRuntime& runtime() const { return runtime_; }

 private:
  Launcher* inner_;
  ContainerRuntime runtime_;
};

// The environment podman itself runs with: the server's own PATH, HOME, XDG and CONTAINERS_*
// settings and nothing else (the job's environment goes in with -e).
std::map<std::string, std::string> PodmanProcessEnvironment();

// Removes the job's container if it is still there (`podman rm -f -i -t 0 NAME`), in the
// background: for a container whose client was killed or whose job was lost.
void RemoveContainer(const ContainerRuntime& runtime, int64_t job_id);

}  // namespace tessera::server
