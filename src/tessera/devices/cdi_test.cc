// The CDI spec writer: what it finds of a driver (in a made-up root), the spec it builds, the file.
#include "tessera/devices/cdi.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/devices/inventory.h"

namespace tessera::devices {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::ElementsAre;

class CdiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("tessera-cdi-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "dev");
    fs::create_directories(root_ / "usr/lib/x86_64-linux-gnu");
    fs::create_directories(root_ / "usr/bin");
  }
  void TearDown() override { fs::remove_all(root_); }

  // A character device at `path` under the root: a link to /dev/null (tests cannot mknod).
  void CharDevice(const std::string& path) {
    fs::create_directories((root_ / fs::path(path).relative_path()).parent_path());
    fs::create_symlink("/dev/null", root_ / fs::path(path).relative_path());
  }
  void File(const std::string& path) {
    fs::create_directories((root_ / fs::path(path).relative_path()).parent_path());
    std::ofstream(root_ / fs::path(path).relative_path()) << "x";
  }

  static core::NodeInventory TwoGpus() {
    core::NodeInventory inv;
    inv.driver_version = "550.54.15";
    for (int i = 0; i < 2; ++i) {
      core::Gpu g;
      g.index = i;
      g.uuid = "GPU-" + std::to_string(i) + "aaa";
      g.minor = i + 4;
      inv.gpus.push_back(g);
    }
    return inv;
  }

  fs::path root_;
};

TEST_F(CdiTest, FindsOnlyTheDriverFilesThatExist) {
  CharDevice("/dev/nvidia4");
  File("/dev/nvidia5");  // not a character device: left out
  CharDevice("/dev/nvidiactl");
  CharDevice("/dev/nvidia-uvm");
  File("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
  fs::create_symlink("libcuda.so.550.54.15", root_ / "usr/lib/x86_64-linux-gnu/libcuda.so.1");
  File("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  File("/usr/lib/x86_64-linux-gnu/libnvidia-gpucomp.so.550.54.15");
  File("/usr/lib/x86_64-linux-gnu/libnvidia-gpucomp.so.535.1");  // another driver's: not ours
  fs::create_symlink("missing.so",
                     root_ / "usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1");  // dangling
  File("/usr/bin/nvidia-smi");
  DriverSearch s;
  s.root = root_.string();
  DriverFiles f = FindDriverFiles(TwoGpus(), s);
  EXPECT_THAT(f.gpu_nodes, ElementsAre("/dev/nvidia4", ""));
  EXPECT_THAT(f.control_nodes, ElementsAre("/dev/nvidiactl", "/dev/nvidia-uvm"));
  EXPECT_THAT(f.mounts, ElementsAre("/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                                    "/usr/lib/x86_64-linux-gnu/libnvidia-gpucomp.so.550.54.15",
                                    "/usr/bin/nvidia-smi"));
}

TEST_F(CdiTest, AContainerizedDriverRootIsSearchedAndNamedByItsHostPaths) {
  // The agent's container: the GPU operator's driver (/run/nvidia/driver on the host) mounted at
  // <root_>/driver-root, the host's /dev at <root_>/dev. GKE's library folder is searched too.
  const std::string lib = "/driver-root/usr/local/nvidia/lib64";
  File(lib + "/libnvidia-ml.so.1");
  File(lib + "/libcuda.so.1");
  File("/driver-root/usr/local/nvidia/bin/nvidia-smi");
  File("/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1");
  CharDevice("/dev/nvidia4");
  CharDevice("/dev/nvidiactl");
  CharDevice("/driver-root/dev/nvidia-uvm");  // not where device nodes are looked for
  DriverSearch s;
  s.root = (root_ / "driver-root").string();
  s.dev_root = root_.string();
  s.host_root = "/run/nvidia/driver";
  EXPECT_EQ(FindDriverLibrary(s, "libnvidia-ml.so.1"), root_.string() + lib + "/libnvidia-ml.so.1");
  EXPECT_EQ(FindDriverLibrary(s, "libnvidia-nvvm.so.4"), "");
  DriverFiles f = FindDriverFiles(TwoGpus(), s);
  EXPECT_THAT(f.gpu_nodes, ElementsAre("/dev/nvidia4", ""));
  EXPECT_THAT(f.control_nodes, ElementsAre("/dev/nvidiactl"));
  EXPECT_THAT(f.mounts, ElementsAre("/usr/local/nvidia/lib64/libcuda.so.1",
                                    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
                                    "/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1",
                                    "/usr/local/nvidia/bin/nvidia-smi"));
  json spec = json::parse(BuildCdiSpec(TwoGpus(), f));
  EXPECT_EQ(spec["containerEdits"]["mounts"][0],
            json::parse(R"({"hostPath": "/run/nvidia/driver/usr/local/nvidia/lib64/libcuda.so.1",
                            "containerPath": "/usr/local/nvidia/lib64/libcuda.so.1",
                            "options": ["ro", "nosuid", "nodev", "bind"]})"));
  EXPECT_EQ(spec["containerEdits"]["deviceNodes"], json::parse(R"([{"path": "/dev/nvidiactl"}])"));
  EXPECT_EQ(spec.dump().find(root_.string()), std::string::npos) << "a path of the agent's own";
}

// A host's library reached through an absolute symbolic link (/usr/lib/... -> /usr/local/nvidia/
// lib64/...): under the agent's --driver-root the link is followed as on the host, not into the
// container's own files.
TEST_F(CdiTest, AbsoluteLinksInTheDriverRootAreFollowedAsOnTheHost) {
  File("/host/usr/local/nvidia/lib64/libnvidia-ml.so.580.1");
  File("/host/usr/local/nvidia/lib64/libcuda.so.580.1");
  fs::create_directories(root_ / "host/usr/lib/x86_64-linux-gnu");
  fs::create_symlink("/usr/local/nvidia/lib64/libnvidia-ml.so.580.1",
                     root_ / "host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  // A relative link that climbs, and one that leads nowhere on the host.
  fs::create_symlink("../../local/nvidia/lib64/libcuda.so.580.1",
                     root_ / "host/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  fs::create_symlink("/no/such/libnvidia-cfg.so.1",
                     root_ / "host/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1");
  // A loop is not followed for ever.
  fs::create_symlink("/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4",
                     root_ / "host/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4");
  DriverSearch s;
  s.root = (root_ / "host").string();
  EXPECT_EQ(FindDriverLibrary(s, "libnvidia-ml.so.1"),
            (root_ / "host/usr/local/nvidia/lib64/libnvidia-ml.so.580.1").string());
  DriverFiles f = FindDriverFiles(TwoGpus(), s);
  EXPECT_THAT(f.mounts, ElementsAre("/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
      << "the host paths the links are at; the broken link and the loop left out";
}

TEST_F(CdiTest, SpecNamesEveryGpuByUuidAndIndexWithItsNode) {
  DriverFiles f;
  f.gpu_nodes = {"/dev/nvidia4", ""};
  f.control_nodes = {"/dev/nvidiactl"};
  f.mounts = {"/usr/lib/x86_64-linux-gnu/libcuda.so.1"};
  json spec = json::parse(BuildCdiSpec(TwoGpus(), f));
  EXPECT_EQ(spec["cdiVersion"], "0.3.0");
  EXPECT_EQ(spec["kind"], "tessera.io/gpu");
  std::vector<std::string> names;
  for (const json& d : spec["devices"]) names.push_back(d["name"]);
  EXPECT_THAT(names, ElementsAre("GPU-0aaa", "0", "GPU-1aaa", "1", "all"));
  const json& gpu0 = spec["devices"][0]["containerEdits"];
  EXPECT_EQ(gpu0["deviceNodes"], json::parse(R"([{"path": "/dev/nvidia4"}])"));
  EXPECT_EQ(gpu0["env"], json::parse(R"(["TESSERA_GPU_0_UUID=GPU-0aaa"])"));
  EXPECT_FALSE(spec["devices"][2]["containerEdits"].contains("deviceNodes")) << "GPU 1 has no node";
  EXPECT_EQ(spec["devices"][4]["containerEdits"]["env"].size(), 2u);
  EXPECT_EQ(spec["containerEdits"]["deviceNodes"], json::parse(R"([{"path": "/dev/nvidiactl"}])"));
  EXPECT_EQ(spec["containerEdits"]["mounts"][0],
            json::parse(R"({"hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                            "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                            "options": ["ro", "nosuid", "nodev", "bind"]})"));
  EXPECT_EQ(CdiDeviceName(TwoGpus().gpus[1].uuid), "tessera.io/gpu=GPU-1aaa");
}

TEST_F(CdiTest, SimulatedMachineGetsEnvironmentOnlyDevices) {
  auto m = LoadSimulatedMachine("t4x2");
  ASSERT_TRUE(m.ok());
  DriverSearch s;
  s.root = root_.string();  // no driver in it
  DriverFiles f = FindDriverFiles(m->inventory, s);
  json spec = json::parse(BuildCdiSpec(m->inventory, f));
  ASSERT_EQ(spec["devices"].size(), 5u);
  for (const json& d : spec["devices"]) {
    EXPECT_FALSE(d["containerEdits"].contains("deviceNodes")) << d.dump();
    EXPECT_FALSE(d["containerEdits"]["env"].empty())
        << "a device with no edits is refused by CDI loaders";
  }
}

TEST_F(CdiTest, WritesTheSpecAtomicallyReadableByAll) {
  const std::string dir = (root_ / "etc/cdi").string();
  auto path = WriteCdiSpec(dir, "{\"cdiVersion\": \"0.3.0\"}\n");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir + "/tessera.io-gpu.json");
  std::ifstream in(*path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "{\"cdiVersion\": \"0.3.0\"}\n");
  struct stat st;
  ASSERT_EQ(stat(path->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_FALSE(fs::exists(*path + ".tmp"));
  File("/blocker");
  auto bad = WriteCdiSpec((root_ / "blocker/cdi").string(), "{}");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("blocker/cdi"));
}

}  // namespace
}  // namespace tessera::devices
