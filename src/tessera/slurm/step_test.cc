#include "tessera/slurm/step.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "nlohmann/json.hpp"
#include "tessera/devices/mps.h"
#include "tessera/server/file_acl.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"
#include "tessera/shim/version5_arbiter_file.h"
#include "tessera/slurm/runs_test.h"

namespace tessera::slurm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
constexpr uint64_t GiB = uint64_t{1} << 30;

PluginConfig Eight() {
  auto c = ParsePluginArgs(
      {"library=/usr/lib/tessera/libtessera-cuda.so", "shards_per_gpu=8", "gpu_memory=16GiB"});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(SlurmPluginArgs, ParseAndRefuseWithTheWordNamed) {
  auto c = ParsePluginArgs({"library=/l.so", "state_dir=/srv/t/", "shards_per_gpu=4",
                            "gpu_memory=80G", "context_overhead=300MiB"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->library, "/l.so");
  EXPECT_EQ(c->state_dir, "/srv/t");
  EXPECT_EQ(c->shards_per_gpu, 4);
  EXPECT_EQ(c->gpu_memory_bytes, 80 * GiB);
  EXPECT_EQ(c->context_overhead_bytes, uint64_t{300} << 20);
  EXPECT_EQ(c->auto_trial_s, 0) << "no automatic trial unless the admin asks";
  EXPECT_EQ(ParsePluginArgs({"library=/l.so", "auto_trial=2m"})->auto_trial_s, 120);
  EXPECT_EQ(ParsePluginArgs({"library=/l.so", "auto_trial=0"})->auto_trial_s, 0);
  EXPECT_TRUE(c->admin_comment) << "the job's use in its AdminComment unless the admin says no";
  EXPECT_FALSE(ParsePluginArgs({"library=/l.so", "admin_comment=no"})->admin_comment);
  for (const auto& [args, why] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{}, "library= is required"},
           {{"library=l.so"}, "'library=l.so': the library's path must be absolute"},
           {{"library=/l.so", "shards_per_gpu=0"}, "'shards_per_gpu=0': expected a count"},
           {{"library=/l.so", "shards_per_gpu=65"},
            "'shards_per_gpu=65': expected a count of shards from 1 to 64 (the jobs a GPU's "
            "arbiter paces)"},
           {{"library=/l.so", "gpu_memory=lots"}, "'gpu_memory=lots': expected a size"},
           {{"library=/l.so", "shards=8"}, "'shards=8': unknown key"},
           {{"library=/l.so", "state_dir"}, "'state_dir': expected key=value"},
           {{"library=/l.so", "auto_trial=soon"},
            "'auto_trial=soon': expected a length of at most a day such as 2m or 90s (0: none)"},
           {{"library=/l.so", "auto_trial=2d"}, "'auto_trial=2d': expected a length"},
           {{"library=/l.so", "admin_comment=maybe"},
            "'admin_comment=maybe': expected yes or no"}}) {
    auto bad = ParsePluginArgs(args);
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(why));
  }
}

// %n in state_dir= and history_dir= is the Slurm node's name (SLURMD_NODENAME), as in Slurm's
// own SlurmdSpoolDir: a host running a slurmd per node keeps each node's files apart.
TEST(SlurmPluginArgs, PercentNIsTheNodesName) {
  auto c = ParsePluginArgs(
      {"library=/l.so", "state_dir=/var/lib/tessera-slurm/%n/", "history_dir=/nfs/h/%n"}, "node-b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state_dir, "/var/lib/tessera-slurm/node-b");
  EXPECT_EQ(c->history_dir, "/nfs/h/node-b");
  EXPECT_EQ(c->node, "node-b");
  EXPECT_EQ(ParsePluginArgs({"library=/l.so", "state_dir=/srv/t"}, "node-b")->state_dir, "/srv/t");
  for (const auto& [node, why] : std::vector<std::pair<std::string, std::string>>{
           {"",
            "'state_dir=/srv/%n': %n is the Slurm node's name, which is not known here "
            "(SLURMD_NODENAME is not set)"},
           {"..", "'state_dir=/srv/%n': %n: the node's name '..' is no folder name"},
           {"a/b", "'state_dir=/srv/%n': %n: the node's name 'a/b' is no folder name"}}) {
    auto bad = ParsePluginArgs({"library=/l.so", "state_dir=/srv/%n"}, node);
    ASSERT_FALSE(bad.ok()) << node;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(why));
  }
}

TEST(SlurmPluginArgs, MpsGpusAreIndicesOrAll) {
  auto c = ParsePluginArgs({"library=/l.so", "mps_gpus=1,3", "mps_control=/opt/mps-control"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(IsMps(*c, 1));
  EXPECT_TRUE(IsMps(*c, 3));
  EXPECT_FALSE(IsMps(*c, 0));
  EXPECT_EQ(c->mps_control, "/opt/mps-control");
  auto all = ParsePluginArgs({"library=/l.so", "mps_gpus=all"});
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(IsMps(*all, 7));
  EXPECT_FALSE(IsMps(*ParsePluginArgs({"library=/l.so"}), 0));
  auto bad = ParsePluginArgs({"library=/l.so", "mps_gpus=1,x"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("'mps_gpus=1,x': expected all, or GPU indices"));
}

TEST(SlurmLimits, ShardsMeanTheirPartOfTheGpusTimeAndMemory) {
  auto l = DecideLimits(Eight(), {.gpus = "1", .shards = "3"});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->gpus, std::vector<int>{1});
  EXPECT_EQ(l->share_permille, 375u);
  EXPECT_EQ(l->memory_bytes, 6 * GiB);
  // The options ask less, never more.
  l = DecideLimits(Eight(),
                   {.gpus = "1", .shards = "3", .share_option = "20%", .mem_option = "4G"});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->share_permille, 200u);
  EXPECT_EQ(l->memory_bytes, 4 * GiB);
  auto more = DecideLimits(Eight(), {.gpus = "1", .shards = "3", .share_option = "50%"});
  ASSERT_FALSE(more.ok());
  EXPECT_THAT(std::string(more.status().message()),
              HasSubstr("--tessera-share=50% is more than the step's shards mean (37.5%)"));
  more = DecideLimits(Eight(), {.gpus = "1", .shards = "3", .mem_option = "7G"});
  ASSERT_FALSE(more.ok());
  EXPECT_THAT(std::string(more.status().message()),
              HasSubstr("--tessera-mem=7G is more than the step's shards mean (6 GiB)"));
  auto bad = DecideLimits(Eight(), {.gpus = "1", .shards = "3", .mem_option = "lots"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--tessera-mem=lots: expected a"));
}

TEST(SlurmLimits, WholeGpusAreLeftUnlimitedAndNoGpusUntouched) {
  auto l = DecideLimits(Eight(), {.gpus = "0,1"});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(l->share_permille, 0u);
  EXPECT_EQ(l->memory_bytes, 0u);
  l = DecideLimits(Eight(), {.gpus = "0", .share_option = "0.5"});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->share_permille, 500u) << "a user may ask a share of a whole GPU";
  l = DecideLimits(Eight(), {});
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->gpus.empty());
  auto opts = DecideLimits(Eight(), {.share_option = "30%"});
  ASSERT_FALSE(opts.ok());
  EXPECT_THAT(std::string(opts.status().message()), HasSubstr("need GPUs"));
  auto garbage = DecideLimits(Eight(), {.gpus = "0,x"});
  ASSERT_FALSE(garbage.ok());
  PluginConfig no_shards = Eight();
  no_shards.shards_per_gpu = 0;
  auto unset = DecideLimits(no_shards, {.gpus = "0", .shards = "2"});
  ASSERT_FALSE(unset.ok());
  EXPECT_THAT(std::string(unset.status().message()), HasSubstr("no shards_per_gpu="));
}

// "auto" and a trial are checked where srun and sbatch read them; at the step a trial runs on
// what its shards mean, and "auto" starts from there (SetUpStep sizes it).
TEST(SlurmLimits, AutoAndATrialAreCheckedAsReadAndStartFromWhatTheShardsMean) {
  EXPECT_TRUE(CheckStepOptions("auto", "auto", "2m").ok());
  for (const char* trial : {"2x", "0", "2d"}) {
    const absl::Status st = CheckStepOptions("", "", trial);
    ASSERT_FALSE(st.ok()) << trial;
    EXPECT_THAT(std::string(st.message()),
                HasSubstr(std::string("--tessera-trial=") + trial + ": expected a length"));
  }
  EXPECT_THAT(std::string(CheckStepOptions("", "automatic").message()),
              HasSubstr("--tessera-mem=automatic: expected a size such as 10G or 512MiB, or auto"));
  auto l = DecideLimits(Eight(), {.gpus = "1",
                                  .shards = "2",
                                  .share_option = "auto",
                                  .mem_option = "auto",
                                  .job_name = "train"});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->share_auto && l->memory_auto);
  EXPECT_EQ(l->share_permille, 250u);
  EXPECT_EQ(l->memory_bytes, 4 * GiB);
  EXPECT_EQ(l->name, "train");
  l = DecideLimits(Eight(),
                   {.gpus = "1", .shards = "2", .mem_option = "1G", .trial_option = "90s"});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->trial_s, 90);
  EXPECT_EQ(l->memory_bytes, 4 * GiB) << "a trial measures on what its shards mean";
  EXPECT_FALSE(DecideLimits(Eight(), {.trial_option = "2m"}).ok()) << "a trial without GPUs";
  auto margin = ParsePluginArgs({"library=/l.so", "auto_margin=30%", "history_dir=/shared/h/"});
  ASSERT_TRUE(margin.ok()) << margin.status();
  EXPECT_EQ(margin->auto_margin_pct, 30);
  EXPECT_EQ(HistoryDir(*margin), "/shared/h");
  EXPECT_EQ(HistoryDir(Eight()), "/var/lib/tessera-slurm/history");
  auto bad = ParsePluginArgs({"library=/l.so", "auto_margin=lots"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'auto_margin=lots'"));
}

// The history's records as "auto" reads them: its name's alone; one that is not a record, or has
// a field of another type, is skipped, never thrown through slurmstepd.
TEST(SlurmHistory, OnlyRecordsOfItsNameCountAndBadOnesAreSkipped) {
  const KindUse use = KindUseOf(
      {R"({"name":"train","gpus":[{"peak_memory_bytes":1048576000,"utilization_percent":10}]})",
       R"({"name":"train","gpus":[{"peak_memory_bytes":2097152000},{"peak_memory_bytes":5}]})",
       R"({"name":"train","memory_auto":true,"gpus":[{"peak_memory_bytes":1048576000,)"
       R"("refused":2,"wanted_peak_bytes":3145728000,"utilization_percent":250}]})",
       R"({"name":"infer","gpus":[{"peak_memory_bytes":9999999999}]})", R"({"name":5,"gpus":[]})",
       R"({"name":"train","gpus":"x"})",
       R"({"name":"train","gpus":[{"peak_memory_bytes":"lots"}]})",
       R"({"name":"train","gpus":[{"peak_memory_bytes":-5}]})", "not json", ""},
      "train");
  EXPECT_EQ(use.memory_runs, 3);
  EXPECT_EQ(use.peak_bytes, uint64_t{3000} << 20) << "the most the auto one asked";
  EXPECT_EQ(use.util_runs, 2);
  EXPECT_EQ(use.util_pct, 100) << "at most a whole GPU";
  // A share whose launches waited for the GPU counts what it would have used.
  const KindUse held =
      KindUseOf({R"({"name":"infer","gpus":[{"utilization_percent":25,"held_back_percent":70,)"
                 R"("demand_percent":83.3}]})"},
                "infer");
  EXPECT_EQ(held.util_runs, 1);
  EXPECT_DOUBLE_EQ(held.util_pct, 83.3);
}

class SlurmNodeFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("slurm-step-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    library_ = dir_ / "libtessera-cuda.so";
    std::ofstream(library_) << "";
    config_ = Eight();
    config_.library = library_;
    config_.state_dir = dir_ / "state";
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Job `id` of `uid` on GPU 0 with `request`'s options: it is set up at `start`, its processes
  // hold `peak` bytes at most (and ask `ask` more past that, refused at its limit), the arbiter
  // charges it `busy_s` of GPU time, and it ends `ran_s` later. Its environment.
  StepEnvironment Run(uint32_t id, uid_t uid, StepRequest request, uint64_t peak, time_t start,
                      time_t ran_s, uint64_t ask = 0, double busy_s = 0) {
    request.gpus = "0";
    if (request.shards.empty()) request.shards = "2";
    auto limits = DecideLimits(config_, request);
    EXPECT_TRUE(limits.ok()) << limits.status();
    auto env = SetUpStep(config_, id, uid, uid, *limits, "", start);
    EXPECT_TRUE(env.ok()) << env.status();
    if (!env.ok()) return {};
    const std::string region = env->set.at("TESSERA_CUDA_REGION");
    const std::string arbiter =
        env->set.contains("TESSERA_CUDA_ARBITER") ? env->set.at("TESSERA_CUDA_ARBITER") : "";
    EXPECT_EQ(
        AsUser(uid,
               [&] {
                 const uint64_t none[] = {0};
                 char err[256] = "";
                 std::unique_ptr<shim::Region> r(
                     shim::Region::Attach(region.c_str(), none, 1, err, sizeof err));
                 if (r == nullptr || !r->Reserve(0, peak)) return 3;
                 if (ask > 0 && r->Reserve(0, ask)) return 4;  // past its limit
                 r->Release(0, peak);
                 if (busy_s <= 0) return 0;
                 std::unique_ptr<shim::Arbiter> a(shim::Arbiter::Attach(
                     arbiter.c_str(), shim::ArbiterJobKey(("slurm-" + std::to_string(id)).c_str()),
                     shim::ArbiterConfig{}, err, sizeof err));
                 if (a == nullptr) return 5;
                 a->data()->gpus[0].jobs[a->Slot(0)].busy_us.store(
                     static_cast<uint64_t>(busy_s * 1e6));
                 return 0;
               }),
        0);
    EXPECT_TRUE(EndJob(config_, id, start + ran_s).ok());
    return *env;
  }
  // Runs `fn` in a child process as user `uid` (a job's process): its exit code.
  int AsUser(uid_t uid, const std::function<int()>& fn) {
    for (const fs::path& d : {fs::path(::testing::TempDir()), dir_}) chmod(d.c_str(), 0711);
    const pid_t kid = fork();
    if (kid == 0) {
      if (uid != getuid() && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(2);
      _exit(fn());
    }
    int status = 0;
    if (waitpid(kid, &status, 0) != kid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
  }
  nlohmann::json Acct(uint32_t id) {
    std::ifstream in(config_.state_dir + "/acct/" + std::to_string(id) + ".json");
    return nlohmann::json::parse(in, nullptr, false);
  }
  fs::path dir_, library_;
  PluginConfig config_;
};

constexpr uint64_t MiB = uint64_t{1} << 20;

// --tessera-mem=auto: the p95 of the peaks of the user's ended jobs of that name (another user's
// and another name's left out) + the margin, rounded up to 256 MiB, said to the user; the job's
// later steps get the same; a job held back by it is told what it asked and the next is sized
// past it; a name never run gets what its shards mean.
// state_dir=/var/lib/tessera-slurm/%n on a fresh node: the folders above it are made, passable by
// every user and listable by none but root (as the state folder itself); existing ones are left.
TEST_F(SlurmNodeFiles, TheFoldersAboveAStateDirOfItsNodeAreMadeAsItsOwn) {
  chmod(dir_.c_str(), 0750);
  auto c = ParsePluginArgs(
      {"library=" + library_.string(), "state_dir=" + (dir_ / "lib/tessera-slurm/%n").string()},
      "node-b");
  ASSERT_TRUE(c.ok()) << c.status();
  config_.state_dir = c->state_dir;
  StepRequest request;
  request.gpus = "0";
  request.shards = "2";
  auto limits = DecideLimits(config_, request);
  ASSERT_TRUE(limits.ok()) << limits.status();
  const uid_t u = getuid();
  ASSERT_TRUE(SetUpStep(config_, 3, u, u, *limits, "", 100).ok());
  EXPECT_TRUE(fs::exists(dir_ / "lib/tessera-slurm/node-b/jobs/3.json"));
  for (const fs::path& made : {dir_ / "lib", dir_ / "lib/tessera-slurm"}) {
    struct stat st;
    ASSERT_EQ(stat(made.c_str(), &st), 0) << made;
    EXPECT_EQ(st.st_mode & 07777, 0711u) << made;
  }
  struct stat above;
  ASSERT_EQ(stat(dir_.c_str(), &above), 0);
  EXPECT_EQ(above.st_mode & 07777, 0750u) << "an existing folder is left as it is";
  ASSERT_TRUE(EndJob(config_, 3, 101).ok());
}

TEST_F(SlurmNodeFiles, AnAutoJobIsSizedFromItsUsersEndedJobsOfItsNameAndOutgrowsItLoudly) {
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  const uid_t u = nobody->pw_uid;
  Run(1, u, {.job_name = "train"}, 1000 * MiB, 1000, 60);
  Run(2, u, {.job_name = "train"}, 3000 * MiB, 1100, 60);
  Run(3, u, {.job_name = "train"}, 1500 * MiB, 1200, 60);
  Run(4, u, {.job_name = "infer"}, 3900 * MiB, 1300, 60);
  Run(5, 0, {.job_name = "train"}, 3950 * MiB, 1400, 60);  // root's
  struct stat st;
  ASSERT_EQ(stat((config_.state_dir + "/history/" + std::to_string(u)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "root's alone";
  const KindUse use = HistoryOf(config_, u, "train");
  EXPECT_EQ(use.peak_bytes, 3000 * MiB);
  EXPECT_EQ(use.memory_runs, 3);

  auto auto_mem = [&](const char* name, const char* shards) {
    return *DecideLimits(config_,
                         {.gpus = "0", .shards = shards, .mem_option = "auto", .job_name = name});
  };
  auto env = SetUpStep(config_, 6, u, u, auto_mem("train", "2"), "", 2000);
  ASSERT_TRUE(env.ok()) << env.status();
  const std::string sized =
      "--tessera-mem=auto: 3840MiB (a peak of 3000MiB, p95 of 3 runs of your jobs named 'train', "
      "+ 20%)";
  EXPECT_EQ(env->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(3840 * MiB));
  EXPECT_EQ(env->say, "tessera: job 6: " + sized);
  EXPECT_EQ(env->set.at("TESSERA_CUDA_COMPUTE_SHARE"), "25%") << "its shards' share, not auto";
  // A later step of the job (srun in its script) gets what its first was given.
  auto again = SetUpStep(config_, 6, u, u, auto_mem("train", "2"), "", 2010);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(3840 * MiB));
  const std::string region = env->set.at("TESSERA_CUDA_REGION");
  EXPECT_EQ(AsUser(u,
                   [&] {
                     const uint64_t none[] = {0};
                     char err[256] = "";
                     std::unique_ptr<shim::Region> r(
                         shim::Region::Attach(region.c_str(), none, 1, err, sizeof err));
                     if (r == nullptr || !r->Reserve(0, 2000 * MiB)) return 3;
                     return r->Reserve(0, 3000 * MiB) ? 4 : 0;  // 5000 MiB: past its 3840
                   }),
            0);
  ASSERT_TRUE(EndJob(config_, 6, 2100).ok());
  const nlohmann::json acct = Acct(6);
  EXPECT_EQ(acct["sizing"], sized);
  EXPECT_EQ(acct["outgrew"],
            "its automatic GPU memory of 3840MiB refused 1 allocation (measured peak 2000MiB; it "
            "asked for 5000MiB at most): the next job named 'train' is sized past it (or ask "
            "--tessera-mem=6144M)");
  // The next is: the most it asked counts as its kind's need.
  env = SetUpStep(config_, 7, u, u, auto_mem("train", "4"), "", 2200);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(6144 * MiB));
  ASSERT_TRUE(EndJob(config_, 7, 2300).ok());
  // Past what its shards mean: all they mean, and said.
  env = SetUpStep(config_, 8, u, u, auto_mem("train", "2"), "", 2400);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(4 * GiB));
  EXPECT_THAT(env->say, HasSubstr("--tessera-mem=auto: 4 GiB (a peak of 5000MiB"));
  EXPECT_THAT(env->say, HasSubstr(": all it may have)"));
  ASSERT_TRUE(EndJob(config_, 8, 2500).ok());
  // A name never run.
  env = SetUpStep(config_, 9, u, u, auto_mem("new", "2"), "", 2600);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(4 * GiB));
  EXPECT_THAT(env->say, HasSubstr("no ended run of your jobs named 'new' yet"));
  ASSERT_TRUE(EndJob(config_, 9, 2700).ok());
  // A history anyone may write is not read: its records could be anyone's.
  const std::string mine = config_.state_dir + "/history/" + std::to_string(u);
  ASSERT_EQ(chmod(mine.c_str(), 0777), 0);
  env = SetUpStep(config_, 10, u, u, auto_mem("train", "2"), "", 2800);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(4 * GiB));
  EXPECT_THAT(env->say, HasSubstr("(" + mine + " is not a folder of the plugin's own user alone)"));
}

// A limit asked outright that refused an allocation is said too, whether the job failed or went on:
// what to ask next time (the history of its name is not changed by it).
TEST_F(SlurmNodeFiles, ALimitAskedOutrightThatRefusedAnAllocationSaysWhatToAsk) {
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  const uid_t u = nobody->pw_uid;
  auto limits =
      DecideLimits(config_, {.gpus = "0", .shards = "2", .mem_option = "1G", .job_name = "fixed"});
  ASSERT_TRUE(limits.ok()) << limits.status();
  auto env = SetUpStep(config_, 21, u, u, *limits, "", 3000);
  ASSERT_TRUE(env.ok()) << env.status();
  const std::string region = env->set.at("TESSERA_CUDA_REGION");
  EXPECT_EQ(AsUser(u,
                   [&] {
                     const uint64_t none[] = {0};
                     char err[256] = "";
                     std::unique_ptr<shim::Region> r(
                         shim::Region::Attach(region.c_str(), none, 1, err, sizeof err));
                     if (r == nullptr || !r->Reserve(0, 800 * MiB)) return 3;
                     return r->Reserve(0, 600 * MiB) ? 4 : 0;  // 1400 MiB: past its 1024
                   }),
            0);
  ASSERT_TRUE(EndJob(config_, 21, 3100).ok());
  EXPECT_EQ(Acct(21)["outgrew"],
            "its GPU memory limit of 1024MiB refused 1 allocation (measured peak 800MiB; it asked "
            "for 1400MiB at most): ask --tessera-mem=1792M next time");
  // Within its limit: nothing said.
  env = SetUpStep(config_, 22, u, u, *limits, "", 3200);
  ASSERT_TRUE(env.ok());
  ASSERT_TRUE(EndJob(config_, 22, 3300).ok());
  EXPECT_FALSE(Acct(22).contains("outgrew")) << Acct(22).dump();
}

// --tessera-trial: it runs on what its shards mean whatever else it asked, its steps are told
// when it stops, and its end says what it used and what to ask - which "auto" then gives.
TEST_F(SlurmNodeFiles, ATrialRunsOnItsShardsAndItsEndSaysWhatToAskWhichAutoGives) {
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  const uid_t u = nobody->pw_uid;
  // 12 s of GPU time in 120 s: 10% of the GPU busy; a peak of 1000 MiB.
  const StepEnvironment env =
      Run(1, u, {.shards = "4", .mem_option = "1G", .trial_option = "2m", .job_name = "bert"},
          1000 * MiB, 1000, 120, 0, 12);
  EXPECT_EQ(env.trial_deadline, 1120);
  {
    // A later step of a trial (srun in its script): stopped at the same moment; none past it.
    auto l = DecideLimits(config_, {.gpus = "0", .shards = "4", .trial_option = "2m"});
    ASSERT_TRUE(l.ok());
    auto first = SetUpStep(config_, 11, u, u, *l, "", 5000);
    ASSERT_TRUE(first.ok()) << first.status();
    auto later = SetUpStep(config_, 11, u, u, *l, "", 5100);
    ASSERT_TRUE(later.ok()) << later.status();
    EXPECT_EQ(later->trial_deadline, 5120) << "the job's trial, from its first step";
    auto past = SetUpStep(config_, 11, u, u, *l, "", 5130);
    ASSERT_FALSE(past.ok());
    EXPECT_EQ(past.status().message(), "its trial of 2m ended 10 s ago: the step is not run");
    ASSERT_TRUE(EndJob(config_, 11, 5140).ok());
  }
  EXPECT_EQ(env.set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(8 * GiB)) << "its shards'";
  EXPECT_THAT(env.say, HasSubstr("tessera: job 1 is a trial of 2m: its steps are stopped 120 s "
                                 "after its start"));
  const nlohmann::json acct = Acct(1);
  EXPECT_EQ(acct["trial_s"], 120.0);
  EXPECT_EQ(acct["name"], "bert");
  // 10% + 20% = 12%, 15% in 5% steps: 2 of 8 shards; 1000 MiB + 20% = 1280 MiB (1 shard).
  EXPECT_EQ(acct["advice"],
            "its trial of 2m ended after 120 s: its GPU 10% busy, peak GPU memory 1000MiB; "
            "recommended: --gres=shard:2 --tessera-mem=1280M (with 20% margin), or "
            "--tessera-mem=auto, which sizes from this trial");
  // Both auto: sized from the trial.
  auto limits = DecideLimits(config_, {.gpus = "0",
                                       .shards = "2",
                                       .share_option = "auto",
                                       .mem_option = "auto",
                                       .job_name = "bert"});
  ASSERT_TRUE(limits.ok());
  auto next = SetUpStep(config_, 2, u, u, *limits, "", 2000);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(1280 * MiB));
  EXPECT_EQ(next->set.at("TESSERA_CUDA_COMPUTE_SHARE"), "15%");
  EXPECT_EQ(next->trial_deadline, 0);
  ASSERT_TRUE(EndJob(config_, 2, 2100).ok());
  // A trial that needs more than a GPU's shards: whole GPUs.
  Run(3, u, {.shards = "8", .trial_option = "1m", .job_name = "big"}, 14000 * MiB, 3000, 60);
  EXPECT_THAT(Acct(3)["advice"].get<std::string>(),
              HasSubstr("recommended: --gres=gpu:1 (its use with 20% margin is a whole GPU's)"));
  // One that used no GPU memory is not told to ask none.
  Run(4, u, {.shards = "2", .trial_option = "1m", .job_name = "idle"}, 0, 4000, 60);
  EXPECT_THAT(Acct(4)["advice"].get<std::string>(),
              HasSubstr("peak GPU memory 0MiB; recommended: --gres=shard:1 (with 20% margin)"));
}

// auto_trial=: a batch job asking "auto" of a name never measured runs first as a trial on its
// shards and is requeued at its end (its steps not stopped by the plugin); its requeued run is
// sized from the trial and keeps the trial's record. Never a trial for an srun job, a requeued
// run, a kind measured already, or without auto_trial=.
TEST_F(SlurmNodeFiles, AnAutoBatchJobNeverMeasuredIsATrialThenRequeuedAndSizedFromIt) {
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  const uid_t u = nobody->pw_uid;
  config_.auto_trial_s = 120;
  const StepRequest asked{.gpus = "0",
                          .shards = "4",
                          .share_option = "auto",
                          .mem_option = "auto",
                          .job_name = "gpt",
                          .batch_step = true,
                          .not_requeueable = ""};
  auto limits = DecideLimits(config_, asked);
  ASSERT_TRUE(limits.ok()) << limits.status();
  // Neither an srun job's step nor a run already requeued once is a trial: they run on the shards.
  {
    StepRequest srun = asked;
    srun.batch_step = false;
    auto l = DecideLimits(config_, srun);
    auto env = SetUpStep(config_, 7, u, u, *l, "", 500);
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_EQ(env->trial_deadline, 0);
    EXPECT_THAT(env->say, HasSubstr("no ended run of your jobs named 'gpt' yet"));
    EXPECT_THAT(env->say, HasSubstr("; no trial first: not a batch job"));
    ASSERT_TRUE(EndJob(config_, 7, 501).ok());
    fs::remove_all(HistoryDir(config_));  // (it measured nothing: not history for what follows)
    // A batch job's step on another of its nodes (srun in its script): its trial is the batch
    // node's, this step runs measured beside it - said so, not "not a batch job".
    srun.batch_host = "node-a";
    l = DecideLimits(config_, srun);
    env = SetUpStep(config_, 7, u, u, *l, "", 500);
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_EQ(env->trial_deadline, 0);
    EXPECT_THAT(env->say, HasSubstr("; no trial first: a batch job's trial is decided on its batch "
                                    "node node-a (this step runs measured, and a requeue there "
                                    "ends it)"));
    ASSERT_TRUE(EndJob(config_, 7, 501).ok());
    fs::remove_all(HistoryDir(config_));
    // Of a job of several nodes, each says its part naming its node, and its history record is
    // named by it (several slurmd of one host share its name).
    {
      PluginConfig on_b = config_;
      on_b.node = "node-b";
      srun.nodes = 2;
      l = DecideLimits(on_b, srun);
      env = SetUpStep(on_b, 7, u, u, *l, "", 500);
      ASSERT_TRUE(env.ok()) << env.status();
      EXPECT_THAT(env->say,
                  ::testing::StartsWith("tessera: job 7 on node-b: --tessera-mem=auto: "));
      ASSERT_TRUE(EndJob(on_b, 7, 501).ok());
      std::vector<std::string> kept;
      for (const auto& e : fs::recursive_directory_iterator(HistoryDir(on_b)))
        if (e.is_regular_file()) kept.push_back(e.path().filename().string());
      ASSERT_EQ(kept.size(), 1u);
      EXPECT_THAT(kept[0], ::testing::EndsWith(".7.node-b.json"));
      srun.nodes = 1;
      fs::remove_all(HistoryDir(config_));
    }
    for (const auto& [restarts, not_requeueable, why] :
         std::vector<std::tuple<uint32_t, std::string, std::string>>{
             {1, "", "requeued already"},
             {0, "--no-requeue (or JobRequeue=0)", "--no-requeue (or JobRequeue=0)"}}) {
      StepRequest again = asked;
      again.restarts = restarts;
      again.not_requeueable = not_requeueable;
      l = DecideLimits(config_, again);
      env = SetUpStep(config_, 8, u, u, *l, "", 502);
      ASSERT_TRUE(env.ok()) << env.status();
      EXPECT_EQ(env->trial_deadline, 0) << why;
      EXPECT_THAT(env->say, HasSubstr("; no trial first: " + why));
      ASSERT_TRUE(EndJob(config_, 8, 503).ok());
      fs::remove_all(HistoryDir(config_));
    }
  }
  auto trial = SetUpStep(config_, 9, u, u, *limits, "", 1000);
  ASSERT_TRUE(trial.ok()) << trial.status();
  EXPECT_EQ(trial->trial_deadline, 1120);
  EXPECT_TRUE(trial->requeue_at_trial_end);
  EXPECT_EQ(trial->say,
            "tessera: job 9: auto: no ended run of your jobs named 'gpt' yet: this run is a trial "
            "of 2m on what its shards mean, then the job is requeued and sized from it");
  EXPECT_EQ(trial->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(8 * GiB)) << "its shards'";
  EXPECT_EQ(trial->set.at("TESSERA_CUDA_COMPUTE_SHARE"), "50%");
  // Its srun step in the script: the same deadline, and past it (the requeue refused) it runs on.
  StepRequest step = asked;
  step.batch_step = false;
  auto sl = DecideLimits(config_, step);
  auto later = SetUpStep(config_, 9, u, u, *sl, "", 1010);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->trial_deadline, 1120);
  EXPECT_TRUE(later->requeue_at_trial_end);
  ASSERT_TRUE(NoteTrialEnd(config_, 9, "then requeued: its next run is sized from it").ok());
  EXPECT_EQ(NoteTrialEnd(config_, 99, "x").code(), absl::StatusCode::kNotFound);
  auto past = SetUpStep(config_, 9, u, u, *sl, "", 1130);
  ASSERT_TRUE(past.ok()) << past.status();
  EXPECT_EQ(past->trial_deadline, 0);
  EXPECT_THAT(past->say, HasSubstr("; then requeued: its next run is sized from it"));
  // What it used: a peak of 3000 MiB and 24 s of GPU time in its 120 s (20% busy).
  EXPECT_EQ(AsUser(u,
                   [&] {
                     const uint64_t none[] = {0};
                     char err[256] = "";
                     std::unique_ptr<shim::Region> r(shim::Region::Attach(
                         trial->set.at("TESSERA_CUDA_REGION").c_str(), none, 1, err, sizeof err));
                     if (r == nullptr || !r->Reserve(0, 3000 * MiB)) return 3;
                     std::unique_ptr<shim::Arbiter> a(shim::Arbiter::Attach(
                         trial->set.at("TESSERA_CUDA_ARBITER").c_str(),
                         shim::ArbiterJobKey("slurm-9"), shim::ArbiterConfig{}, err, sizeof err));
                     if (a == nullptr) return 5;
                     a->data()->gpus[0].jobs[a->Slot(0)].busy_us.store(24'000'000);
                     return 0;
                   }),
            0);
  ASSERT_TRUE(EndJob(config_, 9, 1120).ok());
  const nlohmann::json first = Acct(9);
  EXPECT_EQ(first["auto_trial"], true);
  EXPECT_EQ(first["advice"],
            "its automatic trial of 2m ended after 120 s: its GPU 20% busy, peak GPU memory "
            "3000MiB; then requeued: its next run is sized from it");
  // Requeued (Slurm keeps the id): sized from the trial; its accounting keeps the trial's.
  StepRequest requeued = asked;
  requeued.restarts = 1;
  auto rl = DecideLimits(config_, requeued);
  auto sized = SetUpStep(config_, 9, u, u, *rl, "", 1300);
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ(sized->trial_deadline, 0);
  // 3000 MiB + 20% = 3600, 3840 in 256 MiB steps; 20% + 20% = 24%, 25% in 5% steps.
  EXPECT_EQ(sized->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(3840 * MiB));
  EXPECT_EQ(sized->set.at("TESSERA_CUDA_COMPUTE_SHARE"), "25%");
  ASSERT_TRUE(EndJob(config_, 9, 1400).ok());
  const nlohmann::json second = Acct(9);
  EXPECT_EQ(second["restarts"], 1);
  EXPECT_FALSE(second.contains("auto_trial"));
  ASSERT_EQ(second["earlier_runs"].size(), 1u) << second.dump();
  EXPECT_EQ(second["earlier_runs"][0]["started"], 1000);
  EXPECT_EQ(second["earlier_runs"][0]["advice"], first["advice"]);
  // A kind measured already is sized at once, even on a first run.
  auto measured = SetUpStep(config_, 10, u, u, *limits, "", 2000);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_EQ(measured->trial_deadline, 0);
  EXPECT_EQ(measured->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(3840 * MiB));
  ASSERT_TRUE(EndJob(config_, 10, 2100).ok());
}

TEST_F(SlurmNodeFiles, AShardStepGetsItsRegionTheArbiterAndTheEnvironment) {
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  auto limits = DecideLimits(config_, {.gpus = "1", .shards = "2"});
  ASSERT_TRUE(limits.ok());
  auto env = SetUpStep(config_, 42, nobody->pw_uid, nobody->pw_gid, *limits, "/other.so", 1000);
  ASSERT_TRUE(env.ok()) << env.status();
  const std::string region = config_.state_dir + "/regions/42.region",
                    arbiter = config_.state_dir + "/arbiter/gpu.arbiter";
  EXPECT_EQ(env->set.at("LD_PRELOAD"), library_.string() + ":/other.so");
  EXPECT_EQ(env->set.at("TESSERA_JOB_ID"), "slurm-42");
  EXPECT_EQ(env->set.at("TESSERA_CUDA_REGION"), region);
  EXPECT_EQ(env->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(4 * GiB));
  EXPECT_EQ(env->set.at("TESSERA_CUDA_COMPUTE_SHARE"), "25%");
  EXPECT_EQ(env->set.at("TESSERA_CUDA_ARBITER"), arbiter);
  EXPECT_EQ(env->set.at("TESSERA_CUDA_ARBITER_GPUS"), "1");
  struct stat st;
  ASSERT_EQ(stat(region.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, nobody->pw_uid) << "the job's own";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto head = shim::ReadRegionHead(region.c_str());
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->limit[0], 4 * GiB);
  ASSERT_EQ(stat(arbiter.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0707, 0600u) << "the group bits are the ACL's mask";
  EXPECT_EQ(server::AclUsers(arbiter), std::set<uid_t>{nobody->pw_uid});
  // A second step of the job (srun in its batch script) inherits the library first: not twice.
  auto again = SetUpStep(config_, 42, nobody->pw_uid, nobody->pw_gid, *limits,
                         env->set.at("LD_PRELOAD"), 1001);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->set.at("LD_PRELOAD"), env->set.at("LD_PRELOAD"));

  // Its use, by a process of the job (as nobody): 3 GiB at most, 30 s of GPU time over its 60 s.
  for (const fs::path& d : {fs::path(::testing::TempDir()), dir_}) chmod(d.c_str(), 0711);
  const pid_t kid = fork();
  if (kid == 0) {
    if (setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0) _exit(2);
    const uint64_t l[] = {4 * GiB};
    char err[256] = "";
    std::unique_ptr<shim::Region> r(shim::Region::Attach(region.c_str(), l, 1, err, sizeof err));
    if (r == nullptr || !r->Reserve(0, 3 * GiB)) _exit(3);
    r->Release(0, 3 * GiB);
    std::unique_ptr<shim::Arbiter> a(shim::Arbiter::Attach(
        arbiter.c_str(), shim::ArbiterJobKey("slurm-42"), shim::ArbiterConfig{}, err, sizeof err));
    if (a == nullptr) _exit(4);
    a->data()->gpus[1].jobs[a->Slot(1)].busy_us.store(30'000'000);
    // Its launches waited 20 s for the GPU (other jobs' slices).
    a->data()->gpus[1].jobs[a->Slot(1)].held_us.store(20'000'000);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(kid, &status, 0), kid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  struct stat before;
  ASSERT_EQ(stat(arbiter.c_str(), &before), 0);
  auto acct = EndJob(config_, 42, 1060);
  ASSERT_TRUE(acct.ok()) << acct.status();
  EXPECT_EQ(*acct, config_.state_dir + "/acct/42.json");
  std::ifstream in(*acct);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["uid"], nobody->pw_uid);
  EXPECT_EQ(j["share_percent"], 25.0);
  EXPECT_EQ(j["gpus"][0]["index"], 1);
  EXPECT_EQ(j["gpus"][0]["peak_memory_bytes"], 3 * GiB);
  EXPECT_EQ(j["gpus"][0]["gpu_time_s"], 30.0);
  EXPECT_EQ(j["gpus"][0]["utilization_percent"], 50.0);
  EXPECT_NEAR(j["gpus"][0]["held_back_percent"].get<double>(), 33.3, 0.1);
  EXPECT_EQ(j["gpus"][0]["demand_percent"], 75.0) << "30 s busy of the 40 s it ran as it wished";
  // Its files are gone; nobody's access too, kept descriptors included (the file replaced).
  EXPECT_FALSE(fs::exists(region));
  EXPECT_FALSE(fs::exists(config_.state_dir + "/jobs/42.json"));
  EXPECT_TRUE(server::AclUsers(arbiter).empty());
  struct stat after;
  ASSERT_EQ(stat(arbiter.c_str(), &after), 0);
  EXPECT_NE(after.st_ino, before.st_ino);
  auto nothing = EndJob(config_, 42, 1070);
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(*nothing, "") << "an epilog of a job with nothing here does nothing";
}

// The plugin upgraded under a running job: its processes keep the older Tessera's arbiter file
// (version 5) mapped and charged, the next step on the node (another job's) puts a fresh one in
// its place, and the running job's epilog still accounts the GPU time it was charged there (the
// old file kept at gpu.arbiter.previous, root's alone); without it the job ended with none.
TEST_F(SlurmNodeFiles, AJobRunningAcrossAnUpgradeIsAccountedFromTheOlderArbiterFile) {
  auto limits = DecideLimits(config_, {.gpus = "1", .shards = "2"});
  ASSERT_TRUE(limits.ok());
  ASSERT_TRUE(SetUpStep(config_, 42, 0, 0, *limits, "", 1000).ok());
  const std::string arbiter = config_.state_dir + "/arbiter/gpu.arbiter";
  const std::string older = arbiter + ".v5";
  shim::Version5ArbiterFile v5(older, 0600);
  ASSERT_TRUE(v5.ok());
  v5.Put(1, 0, shim::ArbiterJobKey("slurm-42"), 20'000'000, shim::Arbiter::NowMicros(), getpid(),
         shim::PidNamespace());
  ASSERT_EQ(rename(older.c_str(), arbiter.c_str()), 0);
  // Another job's step, by the upgraded plugin.
  ASSERT_TRUE(SetUpStep(config_, 43, 0, 0, *limits, "", 1010).ok());
  struct stat kept;
  ASSERT_EQ(stat((arbiter + ".previous").c_str(), &kept), 0);
  EXPECT_EQ(kept.st_mode & 07777, 0600u);
  v5.Job(1, 0).busy_us = 30'000'000;  // its processes charge on
  ASSERT_TRUE(EndJob(config_, 42, 1060).ok());
  const nlohmann::json j = Acct(42);
  EXPECT_EQ(j["gpus"][0]["gpu_time_s"], 30.0) << j.dump();
  EXPECT_EQ(j["gpus"][0]["utilization_percent"], 50.0) << j.dump();
  EXPECT_FALSE(j["gpus"][0].contains("held_back_percent")) << "version 5 did not count it";
  ASSERT_TRUE(EndJob(config_, 43, 1070).ok());
}

// A reused job id (slurmd crashed or the node rebooted before the epilog; Slurm then gave the id
// again): the earlier job's record and region, another user's, are set aside and said, never
// used - the new job gets a region it can open and is accounted as itself; an epilog of a job
// whose user is not the record's does not account the record as its own.
TEST_F(SlurmNodeFiles, AReusedJobIdNeverMeetsTheEarlierJobsFiles) {
  // (getpwnam's answer is one static buffer: copied before the next call.)
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  const uid_t n_uid = nobody->pw_uid;
  const gid_t n_gid = nobody->pw_gid;
  const passwd* daemon = getpwnam("daemon");
  ASSERT_NE(daemon, nullptr);
  const uid_t d_uid = daemon->pw_uid;
  const gid_t d_gid = daemon->pw_gid;
  ASSERT_NE(n_uid, d_uid);
  auto limits = DecideLimits(config_, {.gpus = "1", .shards = "2"});
  ASSERT_TRUE(limits.ok());
  ASSERT_TRUE(SetUpStep(config_, 42, d_uid, d_gid, *limits, "", 1000).ok());
  const std::string region = config_.state_dir + "/regions/42.region";
  auto env = SetUpStep(config_, 42, n_uid, n_gid, *limits, "", 5000);
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_EQ(env->notes.size(), 1u);
  EXPECT_THAT(env->notes[0], HasSubstr("earlier job 42 of uid " + std::to_string(d_uid)));
  EXPECT_THAT(env->notes[0], HasSubstr("set aside"));
  struct stat st;
  ASSERT_EQ(stat(region.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, n_uid) << "a region the new job's user can open";
  EXPECT_EQ(NodeJobs(config_.state_dir).at(42).uid, n_uid);
  EXPECT_EQ(NodeJobs(config_.state_dir).at(42).started, 5000);
  EXPECT_TRUE(fs::exists(config_.state_dir + "/stale/42.5000.json"));
  EXPECT_TRUE(fs::exists(config_.state_dir + "/stale/42.5000.region"));
  // A later step of the same job keeps its own files, saying nothing.
  auto later = SetUpStep(config_, 42, n_uid, n_gid, *limits, "", 5010);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->notes.empty());
  // Its epilog accounts it as itself.
  auto acct = EndJob(config_, 42, 5060, n_uid);
  ASSERT_TRUE(acct.ok()) << acct.status();
  std::ifstream in(*acct);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["uid"], n_uid);
  EXPECT_EQ(j["started"], 5000);
  // The epilog of daemon's job 43 finds nobody's record under 43 (left from before): set aside,
  // no accounting as daemon's job.
  ASSERT_TRUE(SetUpStep(config_, 43, n_uid, n_gid, *limits, "", 6000).ok());
  auto other = EndJob(config_, 43, 7000, d_uid);
  EXPECT_FALSE(other.ok());
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("set aside"));
  EXPECT_FALSE(fs::exists(config_.state_dir + "/acct/43.json"));
  EXPECT_FALSE(fs::exists(config_.state_dir + "/jobs/43.json"));
  EXPECT_TRUE(fs::exists(config_.state_dir + "/stale/43.7000.json"));
}

// Slurm may give a whole GPU (gres gpu) that shard jobs are on (gres shard): the whole-GPU step is
// paced with them at what they leave, its memory what they do not hold - not run unpaced over
// their shares. A whole GPU nobody shares stays unlimited.
TEST_F(SlurmNodeFiles, AWholeGpuStepBesideShardJobsGetsWhatTheyLeave) {
  auto shards = DecideLimits(config_, {.gpus = "1", .shards = "2"});  // 25%, 4 GiB
  ASSERT_TRUE(shards.ok());
  ASSERT_TRUE(SetUpStep(config_, 50, getuid(), getgid(), *shards, "", 1000).ok());
  auto whole = DecideLimits(config_, {.gpus = "1"});
  ASSERT_TRUE(whole.ok());
  ASSERT_EQ(whole->share_permille, 0u);
  auto env = SetUpStep(config_, 51, getuid(), getgid(), *whole, "", 1001);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->set.at("TESSERA_CUDA_COMPUTE_SHARE"), "75%");
  EXPECT_EQ(env->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(12 * GiB));
  ASSERT_EQ(env->notes.size(), 1u);
  EXPECT_THAT(env->notes[0], HasSubstr("shard jobs 50 are on: paced with them at the 75%"));
  auto alone = DecideLimits(config_, {.gpus = "2"});
  ASSERT_TRUE(alone.ok());
  auto free_env = SetUpStep(config_, 52, getuid(), getgid(), *alone, "", 1002);
  ASSERT_TRUE(free_env.ok());
  EXPECT_FALSE(free_env->set.contains("TESSERA_CUDA_COMPUTE_SHARE"));
  EXPECT_TRUE(free_env->notes.empty());
}

TEST_F(SlurmNodeFiles, ABatchStepsSettingsAreTakenOutOfAStepWithoutAShare) {
  auto whole = DecideLimits(config_, {.gpus = "0"});
  ASSERT_TRUE(whole.ok());
  auto env = SetUpStep(config_, 7, getuid(), getgid(), *whole, library_.string(), 1000);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->set.at("LD_PRELOAD"), library_.string());
  EXPECT_FALSE(env->set.contains("TESSERA_CUDA_MEM_LIMIT"));
  EXPECT_THAT(env->unset,
              ::testing::IsSupersetOf({"TESSERA_CUDA_ARBITER", "TESSERA_CUDA_COMPUTE_SHARE",
                                       "TESSERA_CUDA_MEM_LIMIT"}));
  EXPECT_TRUE(fs::exists(config_.state_dir + "/regions/7.region")) << "its peak is recorded";
}

TEST_F(SlurmNodeFiles, AStepOnAnMpsGpuIsAClientOfItsDaemonOneUserAtATime) {
  // GPU 1 in MPS mode; its daemon is tessera-slurm-mps@1.service's, started here as it would.
  config_.mps_gpus = {1};
  config_.mps_control = TESSERA_TEST_FAKES_DIR "/mps/nvidia-cuda-mps-control";
  devices::MpsDaemons daemon(config_.mps_control, config_.state_dir + "/mps", {{1, "1"}});
  struct Quit {
    devices::MpsDaemons& d;
    ~Quit() { (void)d.Stop(1); }
  } quit{daemon};
  auto shards = DecideLimits(config_, {.gpus = "1", .shards = "2"});  // 25%, 4 GiB
  ASSERT_TRUE(shards.ok());
  // No daemon answers: the step is refused (fail closed), saying how to start it.
  auto down = SetUpStep(config_, 60, getuid(), getgid(), *shards, "", 1000);
  ASSERT_FALSE(down.ok());
  EXPECT_THAT(std::string(down.status().message()), HasSubstr("its daemon does not answer"));
  EXPECT_THAT(std::string(down.status().message()),
              HasSubstr("systemctl start tessera-slurm-mps@1"));
  ASSERT_TRUE(daemon.Ensure(1).ok());
  auto env = SetUpStep(config_, 60, getuid(), getgid(), *shards, "", 1000);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->set.at("CUDA_MPS_PIPE_DIRECTORY"), daemon.PipeDir(1));
  EXPECT_EQ(env->set.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
  EXPECT_EQ(env->set.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=4096M");
  EXPECT_EQ(env->set.at("CUDA_VISIBLE_DEVICES"), "1") << "as its daemon sees it";
  // The library's accounting stays (its region, its limit); no time slices.
  EXPECT_EQ(env->set.at("TESSERA_CUDA_MEM_LIMIT"), std::to_string(4 * GiB));
  EXPECT_FALSE(env->set.contains("TESSERA_CUDA_ARBITER"));
  EXPECT_THAT(env->unset, ::testing::Contains("TESSERA_CUDA_ARBITER"));
  EXPECT_TRUE(fs::exists(config_.state_dir + "/regions/60.region"));
  // The same user's next job goes beside it; another user's is refused while it runs.
  ASSERT_TRUE(SetUpStep(config_, 61, getuid(), getgid(), *shards, "", 1001).ok());
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  auto other = SetUpStep(config_, 62, nobody->pw_uid, nobody->pw_gid, *shards, "", 1002);
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("MPS serves one user's clients at a time"));
  ASSERT_TRUE(EndJob(config_, 60, 1003).ok());
  ASSERT_TRUE(EndJob(config_, 61, 1004).ok());
  EXPECT_TRUE(SetUpStep(config_, 62, nobody->pw_uid, nobody->pw_gid, *shards, "", 1005).ok())
      << "once that user's jobs ended";
  // A step of two GPUs one of which is MPS's: refused (a process has one MPS server).
  auto two = DecideLimits(config_, {.gpus = "1,2"});
  ASSERT_TRUE(two.ok());
  auto refused = SetUpStep(config_, 63, getuid(), getgid(), *two, "", 1006);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("has one GPU"));
}

TEST_F(SlurmNodeFiles, AStepWhoseLibraryCannotBeReadIsRefused) {
  config_.library = (dir_ / "missing.so").string();
  auto limits = DecideLimits(config_, {.gpus = "0", .shards = "1"});
  ASSERT_TRUE(limits.ok());
  auto env = SetUpStep(config_, 9, getuid(), getgid(), *limits, "", 1000);
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()),
              HasSubstr("the intercept library " + config_.library + " cannot be read"));
}

TEST_F(SlurmNodeFiles, AStateFolderOfAnotherUserIsRefused) {
  fs::create_directories(config_.state_dir);
  const passwd* nobody = getpwnam("nobody");
  ASSERT_EQ(chown(config_.state_dir.c_str(), nobody->pw_uid, nobody->pw_gid), 0);
  auto limits = DecideLimits(config_, {.gpus = "0", .shards = "1"});
  auto env = SetUpStep(config_, 9, getuid(), getgid(), *limits, "", 1000);
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()),
              HasSubstr("is not a folder of the plugin's own user: refused"));
}

// The job's use on a node as its AdminComment says it: a share's busy time of what it held and
// the GPU time it left idle, its peak of its limit, refusals; several GPUs summed; a whole GPU's
// busy not measured. In lower case, as sacctmgr keeps it. Each node replaces its own part only.
TEST(SlurmAdminComment, SaysWhatTheJobUsedOnTheNodeAndKeepsOtherNodesParts) {
  const nlohmann::json& share = test::QuarterRun();
  EXPECT_EQ(AdminCommentPart(share, "Node-A"),
            "tessera@node-a: gpu 1 (25% share): 80% busy, 5s of gpu time idle, peak 3 gib of 4 "
            "gib (75%), 2 allocations refused at its limit");
  const nlohmann::json& two = test::HalvesRun();
  // 50 + 50 GPU-seconds held: 10 + 50 (70 is past its half, counted as the 50 it held) busy.
  EXPECT_EQ(AdminCommentPart(two, "n2"),
            "tessera@n2: gpus 0,1 (50% share each): 60% busy, 40s of gpu time idle, peak 6 gib of "
            "8 gib (75%)");
  const nlohmann::json& whole = test::WholeRun();
  EXPECT_EQ(AdminCommentPart(whole, "n3"),
            "tessera@n3: gpu 2 (whole): busy not measured (a whole gpu), peak 40 gib");
  nlohmann::json quick = share;
  quick["ended"] = 1000;
  EXPECT_THAT(AdminCommentPart(quick, "n4"), HasSubstr("(25% share): ran under a second, peak"));

  // A site's own note and another node's part stay; this node's earlier part is replaced.
  EXPECT_EQ(MergeAdminComment("", "n1", "tessera@n1: a"), "tessera@n1: a");
  EXPECT_EQ(MergeAdminComment("JS1:abc | tessera@n2: b | tessera@N1: old", "n1", "tessera@n1: new"),
            "JS1:abc | tessera@n2: b | tessera@n1: new");
  EXPECT_EQ(MergeAdminComment("tessera@n10: c", "n1", "tessera@n1: d"),
            "tessera@n10: c | tessera@n1: d")
      << "n10 is not n1";
}

// The job's AdminComment as slurmdbd keeps it, written by several epilogs at once: each write
// replaces the whole comment, so a node that read before another's write and writes after it
// drops the other's part - which that node then sees when it reads its own write back.
struct SharedComment {
  std::string text;
  int reads = 0, writes = 0;
  std::vector<std::chrono::milliseconds> waits;
  // Run before each read (another node's write landing in between).
  std::function<void()> before_read;
  std::function<std::optional<std::string>(std::string&)> Current() {
    return [this](std::string&) -> std::optional<std::string> {
      ++reads;
      if (before_read) before_read();
      return text;
    };
  }
  std::function<bool(const std::string&, std::string&)> Write() {
    return [this](const std::string& merged, std::string&) {
      ++writes;
      text = merged;
      return true;
    };
  }
  std::function<void(std::chrono::milliseconds)> Wait() {
    return [this](std::chrono::milliseconds d) { waits.push_back(d); };
  }
};

TEST(SlurmAdminComment, AOneNodeJobIsWrittenOnceWithoutReading) {
  SharedComment db{.text = "site note"};
  EXPECT_EQ(
      WriteAdminComment("n1", "tessera@n1: a", db.Current(), db.Write(), "site note", db.Wait()),
      "");
  EXPECT_EQ(db.text, "site note | tessera@n1: a");
  EXPECT_EQ(db.writes, 1);
  EXPECT_EQ(db.reads, 0);
  // Already there (the epilog run again): nothing written.
  EXPECT_EQ(WriteAdminComment("n1", "tessera@n1: a", db.Current(), db.Write(), db.text, db.Wait()),
            "");
  EXPECT_EQ(db.writes, 1);
}

TEST(SlurmAdminComment, AOneNodeWriteThatIsRefusedIsDoneAsForSeveralNodes) {
  // (slurmdbd did not have the job's row yet: refused once, then it has.)
  SharedComment db;
  int refusals = 1;
  auto write = [&](const std::string& merged, std::string& err) {
    if (refusals-- > 0) {
      err = "slurmdbd did not change it";
      return false;
    }
    return db.Write()(merged, err);
  };
  EXPECT_EQ(WriteAdminComment("n1", "tessera@n1: a", db.Current(), write, "", db.Wait()), "");
  EXPECT_EQ(db.text, "tessera@n1: a");
  EXPECT_EQ(db.reads, 2) << "read, written, read back";
  // A write refused in the loop too is said.
  SharedComment closed;
  auto refuse = [](const std::string&, std::string& err) {
    err = "slurmdbd did not change it";
    return false;
  };
  EXPECT_EQ(WriteAdminComment("n1", "tessera@n1: a", closed.Current(), refuse, "", closed.Wait()),
            "slurmdbd did not change it");
  // And a read that fails.
  auto unreadable = [](std::string& err) -> std::optional<std::string> {
    err = "slurmdbd did not list the job";
    return std::nullopt;
  };
  EXPECT_EQ(WriteAdminComment("n1", "tessera@n1: a", unreadable, closed.Write(), std::nullopt,
                              closed.Wait()),
            "slurmdbd did not list the job");
  EXPECT_EQ(closed.writes, 0);
}

TEST(SlurmAdminComment, APartAnotherNodeReplacedIsWrittenAgainAndBothStay) {
  // n2's epilog wrote a comment without n1's part just after n1 wrote (it had read before): n1
  // sees that when it reads its write back, waits, and writes again - merged with n2's part.
  SharedComment db{.text = "tessera@n2: b"};
  int n2_writes = 1;
  db.before_read = [&] {
    if (db.reads == 2 && n2_writes-- > 0) db.text = "tessera@n2: b";
  };
  EXPECT_EQ(
      WriteAdminComment("n1", "tessera@n1: a", db.Current(), db.Write(), std::nullopt, db.Wait()),
      "");
  EXPECT_EQ(db.text, "tessera@n2: b | tessera@n1: a");
  EXPECT_EQ(db.writes, 2);
  ASSERT_EQ(db.waits.size(), 1u);
  EXPECT_GE(db.waits[0], std::chrono::milliseconds(50));
  EXPECT_LT(db.waits[0], std::chrono::milliseconds(250));
  // Replaced on every read back: given up after five writes, and said so.
  SharedComment busy;
  busy.before_read = [&] {
    if (busy.reads % 2 == 0) busy.text = "tessera@n2: b";
  };
  EXPECT_EQ(WriteAdminComment("n1", "tessera@n1: a", busy.Current(), busy.Write(), std::nullopt,
                              busy.Wait()),
            "other nodes' writes kept replacing it");
  EXPECT_EQ(busy.writes, 5);
  EXPECT_EQ(busy.waits.size(), 5u);
}

}  // namespace
}  // namespace tessera::slurm
