// podman's command line for a job, the environment its client gets, and finding podman (the fake
// podman of tests/fakes, as a new and as an old version).
#include "tessera/server/container.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace tessera::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A podman wrapper script around the fake, as the server would be configured with it.
std::string FakePodman(const std::string& name, bool old) {
  const std::string dir = ::testing::TempDir() + "tessera-podman-" + std::to_string(getpid());
  fs::create_directories(dir + "/state");
  const std::string path = dir + "/" + name;
  std::ofstream(path) << "#!/bin/sh\nexec " TESSERA_TEST_FAKES_DIR
                         "/podman/fake_podman --fake-state "
                      << dir << "/state" << (old ? " --old" : "") << " \"$@\"\n";
  chmod(path.c_str(), 0755);
  return path;
}

// Records what it is asked to start.
class RecordingLauncher final : public Launcher {
 public:
  absl::StatusOr<Launched> Start(const LaunchSpec& spec) override {
    started.push_back(spec);
    return Launched{.pid = 1000 + static_cast<pid_t>(started.size())};
  }
  bool Signal(pid_t, int) override { return true; }
  std::optional<int> Reap(pid_t) override { return std::nullopt; }
  bool Alive(pid_t, uint64_t) override { return true; }
  bool WatchableByPidfd() const override { return false; }
  std::vector<LaunchSpec> started;
};

TEST(Container, PodmanLauncherStartsJobsWithAnImageAsPodmansClientOthersUnchanged) {
  RecordingLauncher inner;
  ContainerRuntime rt;
  rt.podman = "/usr/bin/podman";
  rt.cdi_spec_dir = "/srv/cdi";
  PodmanLauncher podman(&inner, rt);
  LaunchSpec bare;
  bare.job_id = 6;
  bare.argv = {"python", "train.py"};
  bare.env = {{"PATH", "/usr/bin"}, {"SEED", "1"}};
  bare.workdir = "/home/alice";
  bare.uid = 1000;
  bare.gid = 100;
  bare.gpu_uuids = {"GPU-a"};
  ASSERT_TRUE(podman.Start(bare).ok());
  LaunchSpec boxed = bare;
  boxed.job_id = 7;
  boxed.container =
      LaunchSpec::Container{.image = "pytorch:24", .memory_bytes = 1 << 30, .cpu_milli = 2000};
  ASSERT_TRUE(podman.Start(boxed).ok());
  ASSERT_EQ(inner.started.size(), 2u);
  // Without an image: as it was.
  EXPECT_EQ(inner.started[0].argv, bare.argv);
  EXPECT_EQ(inner.started[0].uid, 1000u);
  // With one: podman's client, run as the server's user with podman's own environment; the job's
  // user, workdir, GPUs, limits and environment (its PATH left to the image) go in through podman.
  const LaunchSpec& c = inner.started[1];
  EXPECT_FALSE(c.uid.has_value());
  EXPECT_TRUE(c.env_as_is);
  EXPECT_FALSE(c.env.contains("SEED"));
  EXPECT_TRUE(c.workdir.empty());
  EXPECT_FALSE(c.container.has_value());
  const std::string argv = ::testing::PrintToString(c.argv);
  EXPECT_THAT(argv, HasSubstr("\"--name\", \"tessera-job-7\""));
  EXPECT_THAT(argv, HasSubstr("\"--user\", \"1000:100\""));
  EXPECT_THAT(argv, HasSubstr("\"--workdir\", \"/home/alice\""));
  EXPECT_THAT(argv, HasSubstr("\"--device\", \"tessera.io/gpu=GPU-a\""));
  EXPECT_THAT(argv, HasSubstr("\"--env\", \"SEED=1\""));
  EXPECT_THAT(argv, ::testing::Not(HasSubstr("PATH=/usr/bin")));
  EXPECT_THAT(argv, HasSubstr("\"pytorch:24\", \"python\", \"train.py\""));
  EXPECT_THAT(argv, ::testing::Not(HasSubstr("--ipc")));
  // An MPS job: its daemon's pipe folder bound at its path, and the host's /dev/shm (--ipc=host),
  // where MPS's server keeps its segments (one word, as the config's run_args are).
  LaunchSpec mps = boxed;
  mps.job_id = 8;
  mps.env["CUDA_MPS_PIPE_DIRECTORY"] = "/var/lib/tessera/mps/gpu1/pipe";
  mps.host_shm = true;
  ASSERT_TRUE(podman.Start(mps).ok());
  const std::string mps_argv = ::testing::PrintToString(inner.started.back().argv);
  EXPECT_THAT(mps_argv, HasSubstr("\"--ipc=host\""));
  EXPECT_THAT(
      mps_argv,
      HasSubstr(
          "\"--volume\", \"/var/lib/tessera/mps/gpu1/pipe:/var/lib/tessera/mps/gpu1/pipe:rw\""));
  EXPECT_THAT(mps_argv,
              HasSubstr("\"--env\", \"CUDA_MPS_PIPE_DIRECTORY=/var/lib/tessera/mps/gpu1/pipe\""));
  // Signals, reaping and liveness are the inner launcher's.
  EXPECT_FALSE(podman.WatchableByPidfd());
  EXPECT_TRUE(podman.Alive(1002, 0));
}

TEST(Container, RunArgvHandsOverDevicesFilesAndEnvironment) {
  ContainerRuntime rt;
  rt.podman = "/usr/bin/podman";
  rt.cdi_spec_dir = "/srv/cdi";
  rt.pass_cdi_spec_dir = true;
  rt.extra_args = {"--pull=never"};
  ContainerJob j;
  j.job_id = 42;
  j.image = "nvcr.io/nvidia/pytorch:24.05-py3";
  j.command = {"python", "train.py", "--lr", "0.1"};
  j.env = {{"CUDA_VISIBLE_DEVICES", "GPU-a"}, {"LD_PRELOAD", "/opt/tessera/libtessera-cuda.so"}};
  j.workdir = "/workspace";
  j.cdi_devices = {"tessera.io/gpu=GPU-a"};
  j.read_only_files = {"/opt/tessera/libtessera-cuda.so"};
  j.writable_files = {"/var/lib/tessera/regions/42.region"};
  j.user = "1000:1000";
  EXPECT_THAT(
      PodmanRunArgv(rt, j),
      ElementsAre("/usr/bin/podman", "--cdi-spec-dir", "/srv/cdi", "run", "--rm", "--name",
                  "tessera-job-42", "--label", "io.tessera.job=42", "--user", "1000:1000",
                  "--workdir", "/workspace", "--device", "tessera.io/gpu=GPU-a", "--volume",
                  "/opt/tessera/libtessera-cuda.so:/opt/tessera/libtessera-cuda.so:ro", "--volume",
                  "/var/lib/tessera/regions/42.region:/var/lib/tessera/regions/42.region:rw",
                  "--env", "CUDA_VISIBLE_DEVICES=GPU-a", "--env",
                  "LD_PRELOAD=/opt/tessera/libtessera-cuda.so", "--pull=never",
                  "nvcr.io/nvidia/pytorch:24.05-py3", "python", "train.py", "--lr", "0.1"));
  rt.pass_cdi_spec_dir = false;
  j.user.clear();
  j.workdir.clear();
  auto argv = PodmanRunArgv(rt, j);
  EXPECT_EQ(argv[1], "run") << "an old podman is not given --cdi-spec-dir";
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "--user"), 0);
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "--workdir"), 0);
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "--memory"), 0) << "no limit asked, none given";
  // The job's host limits are podman's to enforce on the container.
  j.memory_bytes = int64_t{2} << 30;
  j.cpu_milli = 1500;
  j.pids_max = 4096;
  argv = PodmanRunArgv(rt, j);
  auto after = [&](const std::string& flag) {
    auto it = std::find(argv.begin(), argv.end(), flag);
    return it == argv.end() || it + 1 == argv.end() ? std::string("<missing>") : *(it + 1);
  };
  EXPECT_EQ(after("--memory"), "2147483648");
  EXPECT_EQ(after("--cpus"), "1.5");
  EXPECT_EQ(after("--pids-limit"), "4096");
}

TEST(Container, PodmanGetsTheServersSettingsNotTheJobs) {
  setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
  setenv("CONTAINERS_CONF", "/etc/x.conf", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "shh", 1);
  auto env = PodmanProcessEnvironment();
  EXPECT_EQ(env["XDG_RUNTIME_DIR"], "/run/user/1000");
  EXPECT_EQ(env["CONTAINERS_CONF"], "/etc/x.conf");
  EXPECT_FALSE(env.contains("AWS_SECRET_ACCESS_KEY"));
  EXPECT_FALSE(env["PATH"].empty());
  unsetenv("AWS_SECRET_ACCESS_KEY");
  unsetenv("CONTAINERS_CONF");
}

TEST(Container, FindsPodmanAndWhetherItTakesASpecFolder) {
  auto rt = FindPodman(FakePodman("podman", false), "/srv/cdi", {"--pull=never"});
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_EQ(rt->version, "podman version 5.2.0-fake");
  EXPECT_TRUE(rt->pass_cdi_spec_dir);
  EXPECT_THAT(rt->extra_args, ElementsAre("--pull=never"));

  // An old podman reads only /etc/cdi and /var/run/cdi: another folder cannot work, and is said.
  const std::string old = FakePodman("podman-old", true);
  auto bad = FindPodman(old, "/srv/cdi", {});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("only from /etc/cdi and /var/run/cdi"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("4.3.1-fake"));
  auto ok = FindPodman(old, "/var/run/cdi/", {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->pass_cdi_spec_dir);
}

TEST(Container, MissingOrBrokenPodmanIsSaid) {
  auto none = FindPodman("/nonexistent/podman", "/etc/cdi", {});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("/nonexistent/podman is not an executable file"));
  auto unnamed = FindPodman("tessera-no-such-podman", "/etc/cdi", {});
  EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unnamed.status().message()), HasSubstr("not in PATH"));
  const std::string broken = ::testing::TempDir() + "broken-podman-" + std::to_string(getpid());
  std::ofstream(broken) << "#!/bin/sh\necho 'cannot open storage' >&2\nexit 3\n";
  chmod(broken.c_str(), 0755);
  auto b = FindPodman(broken, "/etc/cdi", {});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr("--version failed (exit 3): cannot open storage"));
  EXPECT_EQ(ContainerName(7), "tessera-job-7");
}

}  // namespace
}  // namespace tessera::server
