#include "tessera/server/container.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "fmt/format.h"
#include "tessera/devices/cdi.h"
#include "tessera/devices/program.h"

extern char** environ;

namespace tessera::server {

namespace fs = std::filesystem;

absl::StatusOr<ContainerRuntime> FindPodman(const std::string& podman,
                                            const std::string& cdi_spec_dir,
                                            std::vector<std::string> extra_args) {
  ContainerRuntime rt;
  rt.podman = devices::LookUp(podman);
  if (rt.podman.empty()) {
    return absl::NotFoundError(podman.find('/') != std::string::npos
                                   ? fmt::format("{} is not an executable file", podman)
                                   : fmt::format("'{}' is not in PATH", podman));
  }
  auto version = devices::RunCapture({rt.podman, "--version"});
  if (!version.ok()) return version.status();
  if (version->status != 0) {
    return absl::FailedPreconditionError(fmt::format("{} --version failed (exit {}): {}", rt.podman,
                                                     version->status,
                                                     devices::FirstLine(version->text)));
  }
  rt.version = devices::FirstLine(version->text);
  auto help = devices::RunCapture({rt.podman, "--help"});
  rt.pass_cdi_spec_dir = help.ok() && help->text.find("--cdi-spec-dir") != std::string::npos;
  rt.cdi_spec_dir = cdi_spec_dir;
  fs::path normal = fs::path(cdi_spec_dir).lexically_normal();
  if (normal.has_parent_path() && normal.filename().empty())
    normal = normal.parent_path();  // "a/b/" -> "a/b"
  const std::string canonical = normal.string();
  if (!rt.pass_cdi_spec_dir && canonical != "/etc/cdi" && canonical != "/var/run/cdi" &&
      canonical != "/run/cdi") {
    return absl::FailedPreconditionError(
        fmt::format("{} ({}) reads CDI specs only from /etc/cdi and /var/run/cdi (it has no "
                    "--cdi-spec-dir), and "
                    "containers.cdi_spec_dir is {}",
                    rt.podman, rt.version, cdi_spec_dir));
  }
  rt.extra_args = std::move(extra_args);
  return rt;
}

std::string ContainerName(int64_t job_id) { return fmt::format("tessera-job-{}", job_id); }

std::vector<std::string> PodmanRunArgv(const ContainerRuntime& rt, const ContainerJob& job) {
  std::vector<std::string> a = {rt.podman};
  if (rt.pass_cdi_spec_dir) a.insert(a.end(), {"--cdi-spec-dir", rt.cdi_spec_dir});
  a.insert(a.end(), {"run", "--rm", "--name", ContainerName(job.job_id), "--label",
                     fmt::format("io.tessera.job={}", job.job_id)});
  if (!job.user.empty()) a.insert(a.end(), {"--user", job.user});
  if (job.memory_bytes > 0) a.insert(a.end(), {"--memory", std::to_string(job.memory_bytes)});
  if (job.cpu_milli > 0)
    a.insert(a.end(), {"--cpus", fmt::format("{:g}", static_cast<double>(job.cpu_milli) / 1000)});
  if (job.pids_max > 0) a.insert(a.end(), {"--pids-limit", std::to_string(job.pids_max)});
  if (job.host_ipc) a.push_back("--ipc=host");
  if (!job.workdir.empty()) a.insert(a.end(), {"--workdir", job.workdir});
  for (const std::string& d : job.cdi_devices) a.insert(a.end(), {"--device", d});
  for (const std::string& f : job.read_only_files)
    a.insert(a.end(), {"--volume", f + ":" + f + ":ro"});
  for (const std::string& f : job.writable_files)
    a.insert(a.end(), {"--volume", f + ":" + f + ":rw"});
  for (const auto& [k, v] : job.env) a.insert(a.end(), {"--env", k + "=" + v});
  a.insert(a.end(), rt.extra_args.begin(), rt.extra_args.end());
  a.push_back(job.image);
  a.insert(a.end(), job.command.begin(), job.command.end());
  return a;
}

std::map<std::string, std::string> PodmanProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    std::string k(kv.substr(0, eq));
    if (k == "PATH" || k == "HOME" || k == "USER" || k == "LOGNAME" || k == "TMPDIR" ||
        k.rfind("XDG_", 0) == 0 || k.rfind("CONTAINERS_", 0) == 0) {
      env[k] = std::string(kv.substr(eq + 1));
    }
  }
  if (!env.contains("PATH"))
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  return env;
}

void RemoveContainer(const ContainerRuntime& rt, int64_t job_id) {
  // Everything is prepared before fork: the server has threads, so the child makes no allocation.
  std::vector<std::string> args = {rt.podman};
  if (rt.pass_cdi_spec_dir) args.insert(args.end(), {"--cdi-spec-dir", rt.cdi_spec_dir});
  args.insert(args.end(), {"rm", "--force", "--ignore", "--time", "0", ContainerName(job_id)});
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  // Twice forked: the server does not wait for it, and init reaps it.
  pid_t pid = fork();
  if (pid < 0) return;
  if (pid == 0) {
    if (fork() != 0) _exit(0);
    setsid();
    close_range(3, ~0U, 0);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
      dup2(null, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

LaunchSpec PodmanClientLaunch(const ContainerRuntime& runtime, const LaunchSpec& job) {
  LaunchSpec ls = job;
  ContainerJob c;
  c.job_id = job.job_id;
  c.image = job.container->image;
  c.command = job.argv;
  c.env = JobEnvironment(job);
  if (!job.container->own_path) c.env.erase("PATH");  // the image's own PATH, unless one was asked
  c.workdir = job.workdir;
  for (const std::string& uuid : job.gpu_uuids)
    c.cdi_devices.push_back(devices::CdiDeviceName(uuid));
  if (job.share) {
    c.read_only_files.push_back(job.share->library);
    c.writable_files.push_back(job.share->region);
    // The arbiter's folder, not the file: the server replaces the file (to revoke a user's access)
    // and a bind mount of the file would keep the container on the old one.
    if (c.env.contains("TESSERA_CUDA_ARBITER"))
      c.writable_files.push_back(std::filesystem::path(job.share->arbiter).parent_path().string());
  }
  // An MPS job's process is a client of its GPU's daemon: the daemon's pipe folder at its own
  // path (CUDA_MPS_PIPE_DIRECTORY names it), and the host's /dev/shm, where the server is met.
  if (auto pipe = c.env.find("CUDA_MPS_PIPE_DIRECTORY"); pipe != c.env.end())
    c.writable_files.push_back(pipe->second);
  c.host_ipc = job.host_shm;
  if (job.uid) c.user = fmt::format("{}:{}", *job.uid, job.gid.value_or(*job.uid));
  // podman confines the container itself (its own cgroup, only the CDI devices): the same limits.
  c.memory_bytes = job.container->memory_bytes;
  c.cpu_milli = job.container->cpu_milli;
  c.pids_max = job.container->pids_max;
  ls.argv = PodmanRunArgv(runtime, c);
  ls.env = PodmanProcessEnvironment();
  ls.env_as_is = true;
  ls.workdir.clear();
  ls.uid.reset();
  ls.gid.reset();
  ls.container.reset();
  return ls;
}

absl::StatusOr<Launched> PodmanLauncher::Start(const LaunchSpec& spec) {
  if (!spec.container) return inner_->Start(spec);
  return inner_->Start(PodmanClientLaunch(runtime_, spec));
}

}  // namespace tessera::server
