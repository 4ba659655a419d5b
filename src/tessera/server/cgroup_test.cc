// Cgroups against fake hierarchies (plain folders named by a fake mountinfo): what is found, what
// is said when nothing can be used, and that a failed Create leaves nothing behind. The real
// kernel paths (devices refused, OOM, limits, leftovers killed) are tested on the binary in
// tests/e2e/server_e2e_test.cc.

#include "tessera/server/cgroup.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tessera::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadFileForTest(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class FakeHierarchies : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "cgroup-test-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    options_.mountinfo = dir_ + "/mountinfo";
    options_.self_cgroup = dir_ + "/self";
    options_.name = "tessera";
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A v1 mount of `controllers` at dir_/<name>, our cgroup in it at `own`.
  void V1(const std::string& name, const std::string& controllers, const std::string& own = "/") {
    fs::create_directories(dir_ + "/" + name + own);
    mountinfo_ += "35 30 0:32 / " + dir_ + "/" + name + " rw,relatime - cgroup cgroup rw," +
                  controllers + "\n";
    self_ += std::to_string(++n_) + ":" + controllers + ":" + own + "\n";
  }
  std::unique_ptr<Cgroups> Open(const std::string& mode) {
    std::ofstream(options_.mountinfo) << mountinfo_;
    std::ofstream(options_.self_cgroup) << self_;
    options_.mode = mode;
    return Cgroups::Open(options_);
  }
  std::string dir_, mountinfo_, self_;
  int n_ = 0;
  CgroupOptions options_;
};

TEST_F(FakeHierarchies, NothingMountedIsSaidAndNothingIsConfined) {
  auto auto_mode = Open("auto");
  EXPECT_EQ(auto_mode->mode(), "none");
  EXPECT_THAT(auto_mode->reason(), HasSubstr("no cgroup2 hierarchy is mounted"));
  EXPECT_THAT(auto_mode->reason(), HasSubstr("memory: no controller"));
  EXPECT_FALSE(auto_mode->active());
  EXPECT_EQ(auto_mode->Describe()["devices"], "none");
  EXPECT_EQ(Open("cgroup1")->reason().substr(0, 42), "no cgroup v1 devices controller is mounted");
  EXPECT_EQ(Open("off")->reason(), "confinement is off in the config");
}

TEST_F(FakeHierarchies, V1ControllersAreFoundBelowOurOwnCgroup) {
  V1("devices", "devices");
  V1("memory", "memory", "/process_api/abc");
  V1("cpu", "cpu,cpuacct");
  V1("pids", "pids");
  auto c = Open("auto");
  EXPECT_EQ(c->mode(), "cgroup1");
  EXPECT_EQ(c->reason(), "");
  nlohmann::json d = c->Describe();
  EXPECT_EQ(d["devices"], "cgroup1 devices controller " + dir_ + "/devices/tessera");
  EXPECT_EQ(d["memory"], "cgroup1 memory " + dir_ + "/memory/process_api/abc/tessera");
  EXPECT_EQ(d["cpu"], "cgroup1 cpu " + dir_ + "/cpu/tessera");
  EXPECT_TRUE(fs::is_directory(dir_ + "/memory/process_api/abc/tessera"));
  c->Close();
  EXPECT_FALSE(fs::exists(dir_ + "/memory/process_api/abc/tessera")) << "the empty subtree goes";
}

TEST_F(FakeHierarchies, ACreateThatFailsNamesTheFileAndLeavesNothing) {
  V1("devices", "devices");
  V1("memory", "memory");
  auto c = Open("cgroup1");
  ASSERT_EQ(c->mode(), "cgroup1");
  // Plain folders have no devices.deny: the write fails as a kernel refusal would.
  CgroupLimits l;
  l.devices = BaseDeviceRules();
  l.memory_bytes = 1 << 30;
  l.uid = 1000;
  auto made = c->Create(7, l);
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(std::string(made.status().message()),
              HasSubstr(dir_ + "/devices/tessera/user-1000/job-7/devices.deny"));
  EXPECT_FALSE(fs::exists(dir_ + "/devices/tessera/user-1000/job-7"));
  EXPECT_FALSE(fs::exists(dir_ + "/memory/tessera/user-1000/job-7"));
  EXPECT_FALSE(fs::exists(dir_ + "/memory/tessera/user-1000")) << "their only job's";
}

// A job's cgroup is below its user's, which bounds the tasks of all their jobs; a job of an
// earlier server (directly below the subtree) is still found, swept and removed.
TEST_F(FakeHierarchies, JobsAreBelowTheirUsersCgroupAndOlderOnesAreStillFound) {
  V1("memory", "memory");
  V1("pids", "pids");
  auto c = Open("auto");
  // Plain folders: the files the kernel would have, made beforehand.
  for (const char* f : {"/pids/tessera/user-1000", "/pids/tessera/user-1000/job-5"})
    fs::create_directories(dir_ + f);
  std::ofstream(dir_ + "/pids/tessera/user-1000/pids.max") << "max";
  std::ofstream(dir_ + "/pids/tessera/user-1000/job-5/pids.max") << "max";
  CgroupLimits l;
  l.uid = 1000;
  l.pids_max = 300;
  l.user_pids_max = 500;
  // (A leftover job-5 is removed first, as after a crash: rmdir of a folder with a file fails,
  // so this one is kept by the fake, and the writes land in it.)
  auto made = c->Create(5, l);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(ReadFileForTest(dir_ + "/pids/tessera/user-1000/pids.max"), "500");
  EXPECT_EQ(ReadFileForTest(dir_ + "/pids/tessera/user-1000/job-5/pids.max"), "300");
  EXPECT_THAT(*made, ::testing::Contains(dir_ + "/memory/tessera/user-1000/job-5/cgroup.procs"));
  // An older server's job-9, directly below the subtree: swept when not running, and a re-adopted
  // one found where it is.
  fs::create_directories(dir_ + "/memory/tessera/job-9");
  fs::create_directories(dir_ + "/memory/tessera/job-8");
  EXPECT_EQ(c->Sweep({5, 8}), 1u);
  EXPECT_FALSE(fs::exists(dir_ + "/memory/tessera/job-9"));
  EXPECT_TRUE(fs::exists(dir_ + "/memory/tessera/job-8"));
  EXPECT_TRUE(fs::exists(dir_ + "/memory/tessera/user-1000/job-5"));
  EXPECT_TRUE(c->Remove(8));
  EXPECT_FALSE(fs::exists(dir_ + "/memory/tessera/job-8"));
  c->Remove(5);  // (the fake's pids files keep its pids folders: not removable here)
  EXPECT_FALSE(fs::exists(dir_ + "/memory/tessera/user-1000/job-5"));
  EXPECT_FALSE(fs::exists(dir_ + "/memory/tessera/user-1000")) << "their last job went";
}

TEST(UserPidsMax, IsAQuarterOfWhatTheHostCanHaveUnlessConfigured) {
  const std::string d = ::testing::TempDir() + "user-pids-" + std::to_string(getpid());
  fs::create_directories(d);
  std::ofstream(d + "/pid_max") << "32768\n";
  std::ofstream(d + "/threads-max") << "192729\n";
  EXPECT_EQ(UserPidsMax(-1, d), 8192) << "two jobs at 16384 exhausted pid_max 32768";
  std::ofstream(d + "/pid_max") << "4194304\n";
  EXPECT_EQ(UserPidsMax(-1, d), 48182) << "threads-max is the lesser";
  EXPECT_EQ(UserPidsMax(0, d), 0);
  EXPECT_EQ(UserPidsMax(777, d), 777);
  fs::remove_all(d);
  EXPECT_EQ(UserPidsMax(-1, d), 0) << "unknown: no limit rather than a guess";
}

TEST_F(FakeHierarchies, SweepRemovesTheCgroupsOfJobsNotRunning) {
  V1("memory", "memory");
  auto c = Open("auto");
  for (int id : {3, 4, 9})
    fs::create_directories(dir_ + "/memory/tessera/job-" + std::to_string(id));
  fs::create_directories(dir_ + "/memory/tessera/not-a-job");
  EXPECT_EQ(c->Sweep({4}), 2u);
  EXPECT_FALSE(fs::exists(dir_ + "/memory/tessera/job-3"));
  EXPECT_TRUE(fs::exists(dir_ + "/memory/tessera/job-4")) << "a re-adopted job keeps its cgroup";
  EXPECT_FALSE(fs::exists(dir_ + "/memory/tessera/job-9"));
  EXPECT_TRUE(fs::exists(dir_ + "/memory/tessera/not-a-job"));
}

// Two servers whose subtrees would be the same folder: the second is told the first holds it, and
// neither its Sweep nor its Close (which the server then never runs) could touch the first's jobs.
TEST_F(FakeHierarchies, ASubtreeHeldByAnotherServerIsBusy) {
  V1("memory", "memory");
  auto first = Open("auto");
  ASSERT_EQ(first->busy(), "");
  fs::create_directories(dir_ + "/memory/tessera/job-3");
  auto second = Open("auto");
  EXPECT_EQ(second->busy(), dir_ + "/memory/tessera is in use by another tessera server");
  second->Close();
  EXPECT_TRUE(fs::exists(dir_ + "/memory/tessera/job-3"));
  second.reset();
  first.reset();  // the lock goes with the holder
  EXPECT_EQ(Open("auto")->busy(), "");
}

TEST(DeviceRules, AreWrittenAsTheDevicesControllerReadsThem) {
  EXPECT_EQ((DeviceRule{'c', 195, 0, "rwm"}.ToString()), "c 195:0 rwm");
  EXPECT_EQ((DeviceRule{'c', 136, -1, "rwm"}.ToString()), "c 136:* rwm");
  EXPECT_EQ((DeviceRule{'b', -1, -1, "m"}.ToString()), "b *:* m");
  auto null = RuleFor("/dev/null");
  ASSERT_TRUE(null.has_value());
  EXPECT_EQ(null->ToString(), "c 1:3 rwm");
  EXPECT_FALSE(RuleFor("/etc/passwd").has_value()) << "not a device";
  EXPECT_FALSE(RuleFor("/nonexistent").has_value());
}

// Runs a device program as the kernel does for an access (__cgroup_bpf_check_dev_permission in
// kernel/bpf/cgroup.c: ctx.access_type = (access << 16) | dev_type, then major, minor): the few
// instructions DeviceProgram emits, with the BPF semantics of each (64-bit registers, immediates
// sign-extended). Anything else fails the test.
int RunDeviceProgram(const std::vector<bpf_insn>& p, int type, uint32_t major, uint32_t minor,
                     int access) {
  const uint32_t ctx[3] = {(static_cast<uint32_t>(access) << 16) | static_cast<uint16_t>(type),
                           major, minor};
  uint64_t r[MAX_BPF_REG] = {};
  for (size_t pc = 0; pc < p.size(); ++pc) {
    const bpf_insn& i = p[pc];
    const auto imm = static_cast<uint64_t>(static_cast<int64_t>(i.imm));
    switch (i.code) {
      case BPF_LDX | BPF_W | BPF_MEM:
        if (i.src_reg != BPF_REG_1 || i.off < 0 || i.off > 8 || i.off % 4 != 0) {
          ADD_FAILURE() << "a load outside the context at " << pc;
          return -1;
        }
        r[i.dst_reg] = ctx[i.off / 4];
        break;
      case BPF_ALU64 | BPF_MOV | BPF_X:
        r[i.dst_reg] = r[i.src_reg];
        break;
      case BPF_ALU64 | BPF_MOV | BPF_K:
        r[i.dst_reg] = imm;
        break;
      case BPF_ALU64 | BPF_AND | BPF_K:
        r[i.dst_reg] &= imm;
        break;
      case BPF_ALU64 | BPF_RSH | BPF_K:
        r[i.dst_reg] >>= i.imm;
        break;
      case BPF_JMP | BPF_JNE | BPF_K:
        if (r[i.dst_reg] != imm) pc += static_cast<size_t>(i.off);
        break;
      case BPF_JMP | BPF_EXIT:
        return static_cast<int>(r[BPF_REG_0]);
      default:
        ADD_FAILURE() << "instruction " << int{i.code} << " at " << pc;
        return -1;
    }
  }
  ADD_FAILURE() << "ran off the end";
  return -1;
}

TEST(DeviceRules, TheCgroup2ProgramAllowsWhatTheRulesAllowAsTheKernelAsks) {
  std::vector<DeviceRule> rules = BaseDeviceRules();
  rules.push_back({'c', 195, 255, "rwm"});  // nvidiactl
  rules.push_back({'c', 195, 0, "rwm"});    // the job's GPU
  rules.push_back({'c', 508, 0, "rwm"});    // nvidia-uvm (a dynamic major)
  const std::vector<bpf_insn> p = DeviceProgram(rules);
  constexpr int kChar = BPF_DEVCG_DEV_CHAR, kBlock = BPF_DEVCG_DEV_BLOCK;
  constexpr int kR = BPF_DEVCG_ACC_READ, kW = BPF_DEVCG_ACC_WRITE, kM = BPF_DEVCG_ACC_MKNOD;
  // What CUDA opens (read-write), and /dev/null every way.
  EXPECT_EQ(RunDeviceProgram(p, kChar, 195, 255, kR | kW), 1);
  EXPECT_EQ(RunDeviceProgram(p, kChar, 195, 0, kR | kW), 1);
  EXPECT_EQ(RunDeviceProgram(p, kChar, 508, 0, kR | kW), 1);
  EXPECT_EQ(RunDeviceProgram(p, kChar, 1, 3, kR | kW), 1);
  EXPECT_EQ(RunDeviceProgram(p, kChar, 1, 3, kW), 1);
  EXPECT_EQ(RunDeviceProgram(p, kChar, 1, 3, kR), 1);
  EXPECT_EQ(RunDeviceProgram(p, kChar, 136, 7, kR | kW), 1) << "a pseudo-terminal";
  // Another GPU, a device of no rule, a block device: refused; creating any node is allowed.
  EXPECT_EQ(RunDeviceProgram(p, kChar, 195, 1, kR | kW), 0);
  EXPECT_EQ(RunDeviceProgram(p, kChar, 195, 1, kR), 0);
  EXPECT_EQ(RunDeviceProgram(p, kChar, 4, 1, kR), 0);
  EXPECT_EQ(RunDeviceProgram(p, kBlock, 8, 0, kR), 0);
  EXPECT_EQ(RunDeviceProgram(p, kBlock, 195, 0, kR | kW), 0) << "a block device of a char's number";
  EXPECT_EQ(RunDeviceProgram(p, kChar, 195, 1, kM), 1);
  EXPECT_EQ(RunDeviceProgram(p, kBlock, 8, 0, kM), 1);
  // A rule without write: reading passes, writing does not.
  const std::vector<bpf_insn> ro = DeviceProgram({{'c', 10, 200, "r"}});
  EXPECT_EQ(RunDeviceProgram(ro, kChar, 10, 200, kR), 1);
  EXPECT_EQ(RunDeviceProgram(ro, kChar, 10, 200, kR | kW), 0);
  EXPECT_EQ(RunDeviceProgram(ro, kChar, 10, 200, kM), 0);
}

}  // namespace
}  // namespace tessera::server
