#pragma once
// Starts and stops job processes for the standalone server. Each job runs in its own process group
// (so a stop reaches everything it started), with the environment it was submitted with plus the
// devices it was given (CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES by UUID, CUDA_DEVICE_ORDER)
// and, for a share of a GPU, the intercept library and its limits; stdout and stderr go to log
// files. When the server runs as root the job runs as its owner. Thread-compatible; the caller
// reaps its children.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/server/private_dirs.h"

namespace tessera::server {

struct ShareLimits {
  std::string library;        // path of libtessera-cuda.so
  std::string region;         // the job's shared region file
  uint64_t memory_bytes = 0;  // 0: no memory limit
  std::string arbiter;        // the machine's GPU arbiter file; empty: launches not paced
  int share_milli = 0;        // compute share, thousandths of the GPU; 0: none asked
  int priority = 0;
  std::vector<int> physical_gpus;  // the arbiter's indices of the job's GPUs (a share of each)
  uint64_t context_overhead_bytes = 0;
};

// One of several processes of a job (ntasks / tasks_per_gpu): what it gets besides the job's
// environment, and its own logs.
struct TaskLaunch {
  std::map<std::string, std::string> env;  // RANK, LOCAL_RANK, WORLD_SIZE...: added to the job's
  std::string stdout_path, stderr_path;
  std::string user_stdout, user_stderr;  // as LaunchSpec's
};

struct LaunchSpec {
  std::vector<std::string> argv;           // argv[0] is looked up in the job's PATH
  std::map<std::string, std::string> env;  // the job's environment, as submitted
  bool env_as_is = false;  // true: `env` is the whole environment (no Tessera variables
                           // added: a podman client whose job gets them with --env)
  std::string workdir;     // empty: the server's
  std::string stdout_path, stderr_path;  // created (appended to) before the job starts
  // The user's own output files (JobSpec::stdout_file): opened (created, appended to) by the job as
  // its user once in its working directory, in place of the logs above; one that cannot be opened
  // fails the start, saying so in the stderr log. Empty: the logs.
  std::string user_stdout, user_stderr;
  std::vector<std::string> gpu_uuids;  // given devices; empty = none visible
  std::optional<ShareLimits> share;    // a fraction of one GPU
  std::optional<uid_t> uid;            // run as this user (needs root)
  std::optional<gid_t> gid;
  int64_t job_id = 0;
  // The cgroup.procs files of the job's cgroups (Cgroups::Create): the job's first process joins
  // them before anything else, so all it starts is confined.
  std::vector<std::string> cgroup_procs;
  // When set, the job runs under a shepherd (the group leader) that waits for it and writes its
  // exit code here (written to a temporary name, then renamed), so a server restarted while the job
  // ran can still learn how it ended. The shepherd exits with the job's code.
  std::string exit_path;
  // More than one: the shepherd (exit_path must be set) starts a process per task, all in the
  // job's process group and cgroups, each with its logs (stdout_path/stderr_path unused), and waits
  // for all. With kill_on_task_failure, the first to fail has the others stopped (SIGTERM to the
  // job's process group, SIGKILL to the tasks still running after task_grace_s; what they leave
  // behind goes with the job's cgroup). The job's exit code: the first failure's, else 0.
  std::vector<TaskLaunch> tasks;
  // With a shepherd (exit_path) and more than 0: the tasks' stdout and stderr reach their logs
  // through pipes the shepherd copies, which stops writing once the job's logs together hold this
  // many bytes (and says so at the end of the log that crossed it; the rest is read and dropped),
  // so the cap holds as the bytes are written, whatever the disk. Not the user's own output files.
  uint64_t max_log_bytes = 0;
  bool kill_on_task_failure = true;
  int task_grace_s = 10;
  // Set: the job runs in a container of this image, `argv` (empty: the image's command) inside it
  // (PodmanLauncher, container.h). The job's own environment is `env`; whether it asked for a PATH.
  struct Container {
    std::string image;
    bool own_path = false;  // the job set PATH; else the image's own is kept
    int64_t memory_bytes = 0, cpu_milli = 0, pids_max = 0;  // the container's limits; 0: none
  };
  std::optional<Container> container;
  // Set: each task gets these as its /tmp and /dev/shm (private_dirs.h), with the job's working
  // directory, its output files' folders and its share's files kept visible besides `keep`.
  std::optional<PrivateDirs> private_dirs;
  // Keeps the host's /dev/shm (a private /tmp still): an MPS client's server has its segments
  // there (cuda.shm.*), shared by the control daemon and its clients.
  bool host_shm = false;
};

// The exit code a shepherd wrote at `path`, nullopt when there is none (yet).
std::optional<int> ReadExitFile(const std::string& path);

struct Launched {
  pid_t pid = 0;            // also the process group id
  uint64_t start_time = 0;  // /proc/<pid>/stat start time, to re-adopt the right process later
};

// The environment a job gets: its own plus Tessera's variables (which win).
std::map<std::string, std::string> JobEnvironment(const LaunchSpec& spec);

// The groups of account `uid` (primary - `primary`, else its own - and supplementary), as
// getgrouplist gives them; none when it has no account.
std::vector<gid_t> AccountGroups(uid_t uid, std::optional<gid_t> primary = std::nullopt);

// Starts the job. kInvalidArgument naming the command when it cannot be executed (not found, not
// executable, bad workdir), with nothing left running; kInternal for fork/pipe failures.
absl::StatusOr<Launched> Start(const LaunchSpec& spec);
// A start that failed because the command could not be executed carries the exit code a shell
// gives for it (127: not found, 126: not runnable) under this payload; ExitCodeOf reads it.
inline constexpr char kExitCodePayload[] = "tessera.io/exit-code";
std::optional<int> ExitCodeOf(const absl::Status& st);

// Signals the job's whole process group (SIGTERM to ask, SIGKILL to end). False if it is gone.
bool SignalGroup(pid_t pgid, int sig);

// Reaps the job if it has ended: its exit code, or 128 + the signal that ended it; nullopt while it
// runs (or if it is not our child).
std::optional<int> Reap(pid_t pid);

// Whether `pid` is still the process that was started at `start_time` (not a reused pid).
bool SameProcess(pid_t pid, uint64_t start_time);

// Calls `on_exit` (from its own thread) soon after a watched process ends, so that jobs are reaped
// when they end rather than at the next poll. Works for children and for processes adopted from an
// earlier server alike (a pidfd per process, in one epoll set). Thread-safe.
class ExitWatcher {
 public:
  explicit ExitWatcher(std::function<void()> on_exit);
  ~ExitWatcher();
  ExitWatcher(const ExitWatcher&) = delete;
  ExitWatcher& operator=(const ExitWatcher&) = delete;

  // False when the process cannot be watched (gone already, or a kernel without pidfds): poll it.
  bool Watch(int64_t key, pid_t pid);
  void Unwatch(int64_t key);
  size_t watched() const;

 private:
  void Run();
  std::function<void()> on_exit_;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd that ends the thread
  mutable std::mutex mu_;
  std::map<int64_t, int> fds_;  // key -> pidfd
  std::thread thread_;
};

}  // namespace tessera::server
