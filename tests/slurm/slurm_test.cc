// The SPANK plugin (tessera-spank.so) in a real Slurm: munged, slurmctld and slurmd started by
// the tests (MiniSlurm), jobs submitted with srun and sbatch as users do, the fake CUDA client run
// in them under the intercept library the plugin preloads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../capture.h"
#include "fmt/format.h"
#include "mini_slurm.h"
#include "tessera/net/http.h"
#include "tessera/slurm/step.h"

namespace {

namespace fs = std::filesystem;
using tessera::slurm_test::MiniSlurm;
using tessera::test::Capture;
using ::testing::HasSubstr;

constexpr const char* kClient = TESSERA_CUDA_CLIENT;
const std::string kLibrary = TESSERA_SHIM_LIBRARY;
const std::string kArgs = "library=" + kLibrary + " shards_per_gpu=8 gpu_memory=16GiB";

// A command left running, its stdout read line by line; killed when dropped.
class Running {
 public:
  explicit Running(const std::string& line) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      execl("/bin/sh", "sh", "-c", line.c_str(), nullptr);
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~Running() {
    if (pid_ > 0) kill(-pid_, SIGTERM), waitpid(pid_, nullptr, 0);
    if (out_) fclose(out_);
  }
  // Its next line, without the newline; empty at its end.
  std::string Line() {
    char buf[512] = "";
    if (!out_ || !fgets(buf, sizeof buf, out_)) return "";
    std::string s = buf;
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// What `sacct <args>` says once `done` holds of it (slurmctld sends jobs and their ends to
// slurmdbd on its own time), or when `within` has passed: its last answer.
std::string SacctUntil(const std::string& env, const std::string& args,
                       const std::function<bool(const std::string&)>& done,
                       std::chrono::seconds within = std::chrono::seconds(60)) {
  const auto until = std::chrono::steady_clock::now() + within;
  std::string out;
  do {
    out = Capture(env + "sacct " + args).out;
    if (done(out)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (std::chrono::steady_clock::now() < until);
  return out;
}

// The job's AdminComment in slurmdbd (sacct; `env` the cluster's) once it matches `re` - each
// node's epilog writes its part after the job's end - or as it is 30 s on.
std::string SacctAdminComment(const std::string& env, const std::string& job,
                              const std::string& re) {
  return SacctUntil(
      env, "-X -n -P -o AdminComment -j " + job + " 2>&1",
      [&](const std::string& out) { return std::regex_search(out, std::regex(re)); },
      std::chrono::seconds(30));
}

class Slurm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (const std::string why = MiniSlurm::Unavailable(); !why.empty()) {
      skip_ = why;
      return;
    }
    slurm_ = new MiniSlurm({.plugin = TESSERA_SPANK_PLUGIN, .plugin_args = kArgs});
  }
  static void TearDownTestSuite() {
    delete slurm_;
    slurm_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << "no Slurm here: " << skip_;
    ASSERT_TRUE(slurm_->error().empty()) << slurm_->error();
    slurm_->SetPluginArgs(kArgs);
  }
  // A command line with the cluster's config and the fake driver (the client's libcuda.so.1)
  // in the environment srun and sbatch pass on to the job.
  static std::string Cmd(const std::string& line) {
    return slurm_->Env() + "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR " " + line;
  }
  // Waits until the job's epilog has run on the node (its record gone).
  static bool WaitForEpilog(const std::string& job) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    const std::string record = slurm_->PluginStateDir() + "/jobs/" + job + ".json";
    while (fs::exists(record) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return !fs::exists(record);
  }
  // Submits with sbatch and waits for the job's end (polling its state: `sbatch --wait` polls
  // every few seconds). The job's id, empty when sbatch refused it (its words in `said`).
  static std::string Batch(const std::string& args, std::string* said = nullptr) {
    auto submit = Capture(Cmd("sbatch --parsable " + args + " 2>&1"));
    if (said) *said = submit.out;
    if (submit.code != 0) return "";
    const std::string job = submit.out.substr(0, submit.out.find_first_of(";\n"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      auto state = Capture(slurm_->Env() + "scontrol show job -o " + job + " 2>&1");
      if (state.out.find("JobState=COMPLETED") != std::string::npos ||
          state.out.find("JobState=FAILED") != std::string::npos ||
          state.out.find("JobState=CANCELLED") != std::string::npos)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return job;
  }
  static inline MiniSlurm* slurm_ = nullptr;
  static inline std::string skip_;
};

TEST_F(Slurm, AnSrunShardStepGetsTheLimitsItsShardsMean) {
  // 3 of a 16 GiB GPU's 8 shards: 6 GiB and 37.5% of its time.
  auto env =
      Capture(Cmd("srun -Q --gres=shard:3 printenv TESSERA_CUDA_COMPUTE_SHARE "
                  "TESSERA_CUDA_MEM_LIMIT LD_PRELOAD 2>&1"));
  EXPECT_EQ(env.code, 0) << env.out;
  EXPECT_EQ(env.out, "37.5%\n6442450944\n" + kLibrary + "\n");
  auto run = Capture(Cmd(std::string("srun -Q --gres=shard:3 ") + kClient +
                         " link alloc:6000 alloc:200 alloc:100 2>&1"));
  EXPECT_EQ(run.code, 0) << run.out;
  EXPECT_EQ(run.out, "ok\noom\nok\n") << "6000 + 200 MiB is past 6 GiB, 6000 + 100 is not";
}

TEST_F(Slurm, AnSbatchShardJobAndItsStepsGetTheirLimits) {
  // 5 shards: 10 GiB. The batch script's own process and an srun step inside it.
  const std::string out = slurm_->dir() + "/batch.out";
  std::string said;
  ASSERT_NE(
      Batch("--gres=shard:5 -o " + out + " --wrap '" + kClient +
                " link alloc:10000 alloc:300; srun -Q " + kClient + " link alloc:10200 alloc:100'",
            &said),
      "")
      << said;
  EXPECT_EQ(tessera::test::ReadFile(out), "ok\noom\nok\noom\n");
}

TEST_F(Slurm, TheUsersOptionsAskLessAndAreRefusedPastTheShards) {
  auto less =
      Capture(Cmd("srun -Q --gres=shard:4 --tessera-share=20% --tessera-mem=2G printenv "
                  "TESSERA_CUDA_COMPUTE_SHARE TESSERA_CUDA_MEM_LIMIT 2>&1"));
  EXPECT_EQ(less.code, 0) << less.out;
  EXPECT_EQ(less.out, "20%\n2147483648\n");
  // As an #SBATCH line too.
  const std::string out = slurm_->dir() + "/opt.out";
  std::string said;
  ASSERT_NE(Batch("-o " + out +
                      " <<'EOF'\n#!/bin/sh\n#SBATCH --gres=shard:2\n#SBATCH "
                      "--tessera-mem=1G\nprintenv TESSERA_CUDA_MEM_LIMIT\nEOF\n",
                  &said),
            "")
      << said;
  EXPECT_EQ(tessera::test::ReadFile(out), "1073741824\n");
  auto more = Capture(Cmd("srun -Q --gres=shard:2 --tessera-share=50% echo ran 2>&1"));
  EXPECT_NE(more.code, 0);
  EXPECT_THAT(more.out, HasSubstr("--tessera-share=50% is more than the step's shards mean (25%)"));
  EXPECT_THAT(more.out, ::testing::Not(HasSubstr("ran")));
  // Mistyped: refused by srun and sbatch themselves, before Slurm allocates anything (no job id
  // is used up between two held jobs submitted around them).
  auto held = [&] {
    auto r = Capture(slurm_->Env() + "sbatch --hold --parsable -o /dev/null --wrap true");
    EXPECT_EQ(r.code, 0) << r.out;
    return std::atol(r.out.c_str());
  };
  const long first = held();
  auto typo = Capture(Cmd("srun -Q --gres=shard:2 --tessera-share=lots echo ran 2>&1"));
  EXPECT_NE(typo.code, 0);
  EXPECT_THAT(typo.out,
              HasSubstr("--tessera-share=lots: expected a share of a GPU such as 30% or 0.3"));
  EXPECT_THAT(typo.out, ::testing::Not(HasSubstr("ran")));
  auto batch = Capture(slurm_->Env() +
                       "sbatch -o /dev/null --gres=shard:2 --tessera-mem=plenty --wrap true 2>&1");
  EXPECT_NE(batch.code, 0);
  EXPECT_THAT(batch.out, HasSubstr("--tessera-mem=plenty: expected a size such as 10G or 512MiB"));
  EXPECT_THAT(batch.out, ::testing::Not(HasSubstr("Submitted batch job")));
  const long second = held();
  EXPECT_EQ(second, first + 1) << "a refused submission used no job id";
  Capture(slurm_->Env() + "scancel " + std::to_string(first) + " " + std::to_string(second));
}

TEST_F(Slurm, AJobWithoutGpusIsLeftAlone) {
  auto env = Capture(Cmd("srun -Q env 2>&1"));
  EXPECT_EQ(env.code, 0) << env.out;
  EXPECT_THAT(env.out, ::testing::Not(HasSubstr("TESSERA_")));
  EXPECT_THAT(env.out, ::testing::Not(HasSubstr(kLibrary)));
}

TEST_F(Slurm, AStepWhoseLibraryCannotBeSetUpFailsWithThePluginsMessage) {
  slurm_->SetPluginArgs(
      "library=/nonexistent/libtessera-cuda.so shards_per_gpu=8 "
      "gpu_memory=16GiB");
  auto run = Capture(Cmd("srun -Q --gres=shard:1 echo ran 2>&1"));
  EXPECT_NE(run.code, 0);
  EXPECT_THAT(run.out, HasSubstr("its GPU limits cannot be set up: the intercept library "
                                 "/nonexistent/libtessera-cuda.so cannot be read"));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("ran")));
  slurm_->SetPluginArgs("library=" + kLibrary + " shards_per_gpu=8");  // no gpu_memory=
  run = Capture(Cmd("srun -Q --gres=shard:1 echo ran 2>&1"));
  EXPECT_NE(run.code, 0);
  EXPECT_THAT(run.out, HasSubstr("plugstack.conf gives no gpu_memory="));
  // A typo in plugstack.conf (gpu_mem= for gpu_memory=): GPU steps refused naming it; a step
  // without a GPU runs (it refused every step on the node before).
  slurm_->SetPluginArgs("library=" + kLibrary + " shards_per_gpu=8 gpu_mem=16GiB");
  run = Capture(Cmd("srun -Q --gres=shard:1 echo ran 2>&1"));
  EXPECT_NE(run.code, 0);
  EXPECT_THAT(run.out, HasSubstr("plugstack.conf"));
  EXPECT_THAT(run.out, HasSubstr("gpu_mem"));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("ran")));
  auto cpu = Capture(Cmd("srun -Q echo cpu-ran 2>&1"));
  EXPECT_EQ(cpu.code, 0) << cpu.out;
  EXPECT_THAT(cpu.out, HasSubstr("cpu-ran"));
}

// While a job runs, `tessera slurm exporter` shows its use with its Slurm job id; at its end
// (its epilog) its use is in acct/<job>.json, which `tessera slurm acct` prints, and its files
// are gone.
TEST_F(Slurm, AJobsUseIsExportedWhileItRunsAndRecordedAtItsEnd) {
  auto exporter = std::make_unique<Running>(std::string(TESSERA_BINARY) +
                                            " slurm exporter --listen 127.0.0.1:0 --state-dir " +
                                            slurm_->PluginStateDir() + " 2>&1");
  const std::string ready = exporter->Line();
  const size_t at = ready.find("on port ");
  ASSERT_NE(at, std::string::npos) << ready;
  tessera::net::HttpClient metrics("tcp://127.0.0.1:" +
                                   std::to_string(std::stoi(ready.substr(at + 8))));
  auto job = std::make_unique<Running>(
      Cmd(std::string("srun -Q --gres=shard:2 sh -c 'echo $SLURM_JOB_ID; exec ") + kClient +
          " link alloc:1500 hold'"));
  const std::string id = job->Line();
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(job->Line(), "ok");  // the allocation
  EXPECT_EQ(job->Line(), "holding");
  auto page = metrics.Send("GET", "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  // Its user (root here: the test's jobs are root's) labels it as the server's jobs are labelled.
  const std::string labels =
      "{job_id=\"slurm-" + id + "\",slurm_job_id=\"" + id + "\",user=\"root\",gpu=\"";
  EXPECT_THAT(page->body, HasSubstr("tessera_job_gpu_share_ratio" + labels));
  EXPECT_THAT(page->body,
              ::testing::ContainsRegex("tessera_job_gpu_memory_used_bytes\\{job_id=\"slurm-" + id +
                                       "\"[^}]*\\} 1572864000\n"));
  ASSERT_EQ(Capture(slurm_->Env() + "scancel " + id).code, 0);
  job.reset();
  ASSERT_TRUE(WaitForEpilog(id)) << slurm_->Logs();
  EXPECT_FALSE(fs::exists(slurm_->PluginStateDir() + "/regions/" + id + ".region"));
  page = metrics.Send("GET", "/metrics");
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(page->body, ::testing::Not(HasSubstr("slurm-" + id))) << "ended: no series";
  // Counted in its user's totals on the node (the other tests' jobs too: at least this one).
  EXPECT_THAT(page->body, ::testing::ContainsRegex(
                              "\ntessera_slurm_acct_jobs_ended_total\\{user=\"root\",hostname="
                              "\"[^\"]+\"\\} [1-9][0-9]*\n"));
  EXPECT_THAT(page->body, ::testing::ContainsRegex(
                              "\ntessera_slurm_acct_measured_gpu_seconds_total\\{user=\"root\","
                              "hostname=\"[^\"]+\"\\} [0-9.e+]+\n"));
  EXPECT_THAT(page->body, HasSubstr("tessera_slurm_acct_totals_readable{hostname="));
  const std::string acct = slurm_->PluginStateDir() + "/acct/" + id + ".json";
  auto j = nlohmann::json::parse(tessera::test::ReadFile(acct), nullptr, false);
  ASSERT_TRUE(j.is_object()) << acct;
  EXPECT_EQ(j["share_percent"], 25.0);
  ASSERT_EQ(j["gpus"].size(), 1u);
  EXPECT_EQ(j["gpus"][0]["peak_memory_bytes"], uint64_t{1500} << 20);
  EXPECT_EQ(j["gpus"][0]["memory_limit_bytes"], uint64_t{4} << 30);
  EXPECT_TRUE(j["gpus"][0].contains("gpu_time_s"));
  auto table = Capture(std::string(TESSERA_BINARY) + " slurm acct " + id + " --state-dir " +
                       slurm_->PluginStateDir() + " 2>&1");
  EXPECT_EQ(table.code, 0) << table.out;
  EXPECT_THAT(table.out,
              ::testing::ContainsRegex("\n" + id +
                                       " +root +[-0-9T:]+ +[0-9:]+ +[01] +25% +"
                                       "[0-9:]+ +[0-9]+% +1.5 GiB +4 GiB +[0-9]+% +[0-9:]+ +"
                                       "37%\n"));
  // Root's jobs on the node, those that left the most GPU time idle first: this one among them.
  table = Capture(std::string(TESSERA_BINARY) + " slurm acct --user root --since 1h --sort idle" +
                  " --state-dir " + slurm_->PluginStateDir() + " 2>&1");
  EXPECT_EQ(table.code, 0) << table.out;
  EXPECT_THAT(table.out, HasSubstr("\n" + id + " ")) << table.out;
}

// --tessera-trial in a real Slurm: slurmstepd stops the batch script and its srun step at the
// trial's end (they would hold forever; `timeout` bounds a watch that failed), the epilog says
// what to ask, and the user's next job of that name asking --tessera-mem=auto gets it (said on its
// stderr); one that outgrows it is told what to ask next.
TEST_F(Slurm, ATrialIsStoppedAtItsLengthAndSizesTheNextAutoJobOfItsName) {
  const std::string out = slurm_->dir() + "/trial.out";
  std::string said;
  const std::string job = Batch("-J bert --gres=shard:2 --tessera-trial=2s -o " + out +
                                    " --wrap 'echo started; srun -Q " + kClient +
                                    " link alloc:1000 hold; echo not stopped'",
                                &said);
  ASSERT_NE(job, "") << said;
  ASSERT_TRUE(WaitForEpilog(job)) << slurm_->Logs();
  const std::string text = tessera::test::ReadFile(out);
  EXPECT_THAT(text, HasSubstr("tessera: job " + job + " is a trial of 2s: its steps are stopped"));
  EXPECT_THAT(text, HasSubstr("holding"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("not stopped"))) << "the script was stopped too";
  auto acct = nlohmann::json::parse(
      tessera::test::ReadFile(slurm_->PluginStateDir() + "/acct/" + job + ".json"), nullptr, false);
  ASSERT_TRUE(acct.is_object());
  EXPECT_EQ(acct["trial_s"], 2.0);
  EXPECT_THAT(acct["advice"].get<std::string>(),
              HasSubstr("peak GPU memory 1000MiB; recommended: --gres=shard:1 "
                        "--tessera-mem=1280M (with 20% margin)"));
  auto table = Capture(std::string(TESSERA_BINARY) + " slurm acct " + job + " --state-dir " +
                       slurm_->PluginStateDir() + " 2>&1");
  EXPECT_THAT(table.out, HasSubstr("\njob " + job + ": its trial of 2s ended after "));

  auto sized = Capture(Cmd("timeout 60 srun -J bert --gres=shard:2 --tessera-mem=auto " +
                           std::string(kClient) + " link alloc:1200 alloc:200 2>&1"));
  EXPECT_EQ(sized.code, 0) << sized.out;
  EXPECT_THAT(sized.out, HasSubstr(": --tessera-mem=auto: 1280MiB (a peak of 1000MiB, p95 of 1 "
                                   "run of your jobs named 'bert', + 20%)"));
  EXPECT_THAT(sized.out, HasSubstr("ok\noom\n")) << "1200 + 200 MiB is past its 1280";
  const std::string id = sized.out.substr(sized.out.find("tessera: job ") + 13);
  const std::string outgrown = id.substr(0, id.find(':'));
  ASSERT_TRUE(WaitForEpilog(outgrown)) << slurm_->Logs();
  acct = nlohmann::json::parse(
      tessera::test::ReadFile(slurm_->PluginStateDir() + "/acct/" + outgrown + ".json"), nullptr,
      false);
  ASSERT_TRUE(acct.is_object());
  EXPECT_THAT(acct.value("outgrew", ""),
              HasSubstr("(measured peak 1200MiB; it asked for 1400MiB at most): the next job "
                        "named 'bert' is sized past it (or ask --tessera-mem=1792M)"));
}

// auto_trial= in a real Slurm (its requeue delay 5 s): a batch job asking --tessera-mem=auto of a
// name never measured runs as a trial, is requeued by slurmstepd at its end (slurm_requeue, the
// script would hold forever), runs again sized from it and keeps the trial's record; one Slurm
// may not requeue (--no-requeue) runs on past its trial, and its accounting says why.
class SlurmRequeue : public Slurm {
 protected:
  static void SetUpTestSuite() {
    if (const std::string why = MiniSlurm::Unavailable(); !why.empty()) {
      skip_ = why;
      return;
    }
    slurm_ =
        new MiniSlurm({.plugin = TESSERA_SPANK_PLUGIN, .plugin_args = kArgs, .cred_expire_s = 5});
  }
};

TEST_F(SlurmRequeue, AnAutoJobNeverMeasuredIsATrialRequeuedAndSizedFromIt) {
  slurm_->SetPluginArgs(kArgs + " auto_trial=2s");
  const std::string out = slurm_->dir() + "/auto.out",
                    acct_dir = slurm_->PluginStateDir() + "/acct/";
  std::string said;
  const std::string job = Batch(
      "-J gpt --gres=shard:2 --tessera-mem=auto --open-mode=append -o " + out +
          " --wrap 'echo run ${SLURM_RESTART_COUNT:-0}; if [ -z \"$SLURM_RESTART_COUNT\" ]; then "
          "srun -Q " +
          kClient + " link alloc:1000 hold; echo not requeued; else srun -Q " + kClient +
          " link alloc:1000; fi'",
      &said);
  ASSERT_NE(job, "") << said;
  ASSERT_TRUE(WaitForEpilog(job)) << slurm_->Logs();
  auto show = Capture(slurm_->Env() + "scontrol show job -o " + job + " 2>&1");
  EXPECT_THAT(show.out, HasSubstr("JobState=COMPLETED")) << show.out << slurm_->Logs();
  EXPECT_THAT(show.out, HasSubstr("Restarts=1")) << show.out;
  const std::string text = tessera::test::ReadFile(out);
  EXPECT_THAT(text, HasSubstr("run 0\n"));
  EXPECT_THAT(text, HasSubstr("tessera: job " + job +
                              ": auto: no ended run of your jobs named 'gpt' yet: this run is a "
                              "trial of 2s on what its shards mean, then the job is requeued"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("not requeued"))) << "Slurm stopped it, requeued";
  EXPECT_THAT(text, HasSubstr("run 1\n"));
  EXPECT_THAT(text, HasSubstr("tessera: job " + job +
                              ": --tessera-mem=auto: 1280MiB (a peak of 1000MiB, p95 of 1 run of "
                              "your jobs named 'gpt', + 20%)"))
      << text;
  auto acct =
      nlohmann::json::parse(tessera::test::ReadFile(acct_dir + job + ".json"), nullptr, false);
  ASSERT_TRUE(acct.is_object());
  EXPECT_EQ(acct["restarts"], 1);
  EXPECT_EQ(acct["memory_limit_bytes"], uint64_t{1280} << 20);
  ASSERT_EQ(acct["earlier_runs"].size(), 1u) << acct.dump();
  EXPECT_EQ(acct["earlier_runs"][0]["auto_trial"], true);
  EXPECT_THAT(acct["earlier_runs"][0].value("advice", ""),
              HasSubstr("peak GPU memory 1000MiB; then requeued: its next run is sized from it"));
  auto table = Capture(std::string(TESSERA_BINARY) + " slurm acct " + job + " --state-dir " +
                       slurm_->PluginStateDir() + " 2>&1");
  EXPECT_THAT(table.out, HasSubstr("\njob " + job + ": its automatic trial of 2s ended after "));
  EXPECT_THAT(table.out, HasSubstr("\njob " + job + ": --tessera-mem=auto: 1280MiB")) << table.out;

  // --no-requeue: no trial, it runs on its shards, said.
  const std::string plain = slurm_->dir() + "/plain.out";
  const std::string once = Batch("-J gpt-c --no-requeue --gres=shard:2 --tessera-mem=auto -o " +
                                     plain + " --wrap 'srun -Q " + kClient + " link alloc:500'",
                                 &said);
  ASSERT_NE(once, "") << said;
  ASSERT_TRUE(WaitForEpilog(once)) << slurm_->Logs();
  EXPECT_THAT(tessera::test::ReadFile(plain),
              HasSubstr("--tessera-mem=auto: 4 GiB (no ended run of your jobs named 'gpt-c' yet: "
                        "measured for the next); no trial first: --no-requeue (or JobRequeue=0)"));
  // Made not requeueable while it runs: its trial's end leaves it running (the script ends it
  // 4 s in), and its accounting says why.
  const std::string kept = slurm_->dir() + "/kept.out";
  const std::string no = Batch("-J gpt-b --gres=shard:2 --tessera-mem=auto -o " + kept +
                                   " --wrap 'scontrol update JobId=$SLURM_JOB_ID Requeue=0; "
                                   "timeout 4 srun -Q " +
                                   kClient + " link alloc:500 hold; echo ran on'",
                               &said);
  ASSERT_NE(no, "") << said;
  ASSERT_TRUE(WaitForEpilog(no)) << slurm_->Logs();
  EXPECT_THAT(tessera::test::ReadFile(kept), HasSubstr("ran on"));
  show = Capture(slurm_->Env() + "scontrol show job -o " + no + " 2>&1");
  EXPECT_THAT(show.out, HasSubstr("Restarts=0")) << show.out;
  acct = nlohmann::json::parse(tessera::test::ReadFile(acct_dir + no + ".json"), nullptr, false);
  ASSERT_TRUE(acct.is_object());
  EXPECT_THAT(acct.value("advice", ""), HasSubstr("; Slurm did not requeue it ("));
  EXPECT_THAT(acct.value("advice", ""), HasSubstr("): it ran on, on what its shards mean"));
}

// A job of two nodes (two slurmd on this host, as a site running several per host has them, each
// with its own plugin state_dir=, %n) asking --tessera-mem=auto of a name never measured, with
// auto_trial= and one history_dir= for the cluster: its trial is decided on its batch node
// (node-a), which says so; node-b's step says its trial is node-a's and runs measured; node-a's
// trial end requeues the whole job, each node's epilog records its part (named by node, not by the
// host both share: one would overwrite the other), and the requeued run is sized on both nodes
// from both parts - node-b's rank, which used more, fits.
class SlurmTwoNodes : public Slurm {
 protected:
  static void SetUpTestSuite() {
    if (const std::string why = MiniSlurm::Unavailable(); !why.empty()) {
      skip_ = why;
      return;
    }
    // With slurmdbd: each node's epilog writes its part of the job's AdminComment there.
    if (const std::string why = MiniSlurm::Unavailable(true); !why.empty()) {
      skip_ = why;
      return;
    }
    slurm_ = new MiniSlurm({.plugin = TESSERA_SPANK_PLUGIN,
                            .plugin_args = kArgs,
                            .accounting = true,
                            .cred_expire_s = 5,
                            .nodes = 2});
  }
  // Until the job's epilog has run on every node.
  static bool WaitForEpilogs(const std::string& job) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (const std::string& node : slurm_->nodes()) {
      const std::string record = slurm_->PluginStateDir(node) + "/jobs/" + job + ".json";
      while (fs::exists(record) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (fs::exists(record)) return false;
    }
    return true;
  }
};

TEST_F(SlurmTwoNodes, AnAutoJobIsTriedOnItsBatchNodeAndSizedOnEachFromBothNodesParts) {
  ASSERT_EQ(slurm_->nodes(), (std::vector<std::string>{"node-a", "node-b"}));
  const std::string history = slurm_->dir() + "/history", out = slurm_->dir() + "/two.out",
                    script = slurm_->dir() + "/two.sh";
  slurm_->SetPluginArgs(kArgs + " auto_trial=2s history_dir=" + history);
  // Rank 0 (node-a) uses 400 MiB, rank 1 (node-b) 900; the trial holds until it is ended.
  std::ofstream(script) << "#!/bin/sh\n"
                        << "echo run ${SLURM_RESTART_COUNT:-0}\n"
                        << "hold=; [ -z \"$SLURM_RESTART_COUNT\" ] && hold=hold\n"
                        << "srun -Q -l sh -c '" << kClient
                        << " link alloc:$((SLURM_NODEID == 0 ? 400 : 900)) '$hold\n"
                        << "[ -n \"$hold\" ] && echo not requeued\n"
                        << "exit 0\n";
  std::string said;
  const std::string job = Batch(
      "-J bert -N2 --ntasks-per-node=1 --gres=shard:2 --tessera-mem=auto "
      "--open-mode=append -o " +
          out + " " + script,
      &said);
  ASSERT_NE(job, "") << said;
  ASSERT_TRUE(WaitForEpilogs(job)) << slurm_->Logs();
  auto show = Capture(slurm_->Env() + "scontrol show job -o " + job + " 2>&1");
  EXPECT_THAT(show.out, HasSubstr("JobState=COMPLETED")) << show.out << slurm_->Logs();
  EXPECT_THAT(show.out, HasSubstr("Restarts=1")) << show.out;
  EXPECT_THAT(show.out, HasSubstr("BatchHost=node-a")) << show.out;
  const std::string text = tessera::test::ReadFile(out);
  const size_t rerun = text.find("run 1\n");
  ASSERT_NE(rerun, std::string::npos) << text;
  const std::string first = text.substr(0, rerun), second = text.substr(rerun);
  EXPECT_THAT(first, HasSubstr("tessera: job " + job +
                               " on node-a: auto: no ended run of your jobs named 'bert' yet: this "
                               "run is a trial of 2s on what its shards mean"))
      << text;
  EXPECT_THAT(first, HasSubstr("1: tessera: job " + job +
                               " on node-b: --tessera-mem=auto: 4 GiB (no ended run of your jobs "
                               "named 'bert' yet: measured for the next); no trial first: a batch "
                               "job's trial is decided on its batch node node-a (this step runs "
                               "measured, and a requeue there ends it)"))
      << text;
  EXPECT_THAT(first, ::testing::Not(HasSubstr("not requeued"))) << "Slurm stopped it, requeued";
  // Each node's part is in the cluster's history, under its own node's name.
  std::vector<std::string> parts;
  for (const auto& e : fs::recursive_directory_iterator(history))
    if (e.is_regular_file()) parts.push_back(e.path().filename().string());
  std::sort(parts.begin(), parts.end());
  ASSERT_EQ(parts.size(), 4u) << ::testing::PrintToString(parts);
  for (const std::string& node : slurm_->nodes()) {
    EXPECT_EQ(std::count_if(parts.begin(), parts.end(),
                            [&](const std::string& p) {
                              return p.find("." + job) != std::string::npos &&
                                     p.ends_with("." + node + ".json");
                            }),
              2)
        << node << ": its trial's part and its requeued run's: " << ::testing::PrintToString(parts);
  }
  // The requeued run, on each node: sized from both parts (p95 of node-a's 400 MiB and node-b's
  // 900), and node-b's rank fits.
  for (const std::string& node : slurm_->nodes()) {
    EXPECT_THAT(second, HasSubstr("tessera: job " + job + " on " + node + ": --tessera-mem=auto: "))
        << text;
  }
  EXPECT_THAT(second, HasSubstr(", p95 of 2 runs of your jobs named 'bert', + 20%)")) << text;
  EXPECT_THAT(second, HasSubstr("0: ok")) << text;
  EXPECT_THAT(second, HasSubstr("1: ok")) << text;
  EXPECT_THAT(second, ::testing::Not(HasSubstr("oom"))) << text;
  std::map<std::string, nlohmann::json> acct;
  for (const std::string& node : slurm_->nodes()) {
    acct[node] = nlohmann::json::parse(
        tessera::test::ReadFile(slurm_->PluginStateDir(node) + "/acct/" + job + ".json"), nullptr,
        false);
    ASSERT_TRUE(acct[node].is_object()) << node;
    EXPECT_EQ(acct[node]["restarts"], 1) << node;
    EXPECT_GE(acct[node].value("memory_limit_bytes", uint64_t{0}), uint64_t{900} << 20) << node;
    ASSERT_EQ(acct[node]["earlier_runs"].size(), 1u) << node << ": " << acct[node].dump();
  }
  EXPECT_EQ(acct["node-a"]["memory_limit_bytes"], acct["node-b"]["memory_limit_bytes"]);
  // The trial was node-a's; node-b's part of that run is an ordinary measured run.
  EXPECT_EQ(acct["node-a"]["earlier_runs"][0].value("auto_trial", false), true);
  EXPECT_EQ(acct["node-b"]["earlier_runs"][0].value("auto_trial", false), false);
  // `tessera slurm acct` on each node shows its part of both runs and what it was told.
  for (const auto& [node, first_run] : std::map<std::string, std::string>{
           {"node-a", ": its automatic trial of 2s ended after "},
           {"node-b",
            ": --tessera-mem=auto: 4 GiB (no ended run of your jobs named 'bert' yet: "
            "measured for the next); no trial first: a batch job's trial is decided on "
            "its batch node node-a"}}) {
    auto table = Capture(std::string(TESSERA_BINARY) + " slurm acct " + job + " --state-dir " +
                         slurm_->PluginStateDir(node) + " 2>&1");
    EXPECT_EQ(table.code, 0) << table.out;
    EXPECT_THAT(table.out, HasSubstr("\njob " + job + first_run)) << node << ":\n" << table.out;
    EXPECT_THAT(table.out, HasSubstr("\njob " + job + ": --tessera-mem=auto: ")) << node << ":\n"
                                                                                 << table.out;
  }
  // Both nodes' parts of its requeued run in its AdminComment in slurmdbd (their epilogs wrote
  // at once, each reading its write back), each in place of its trial's (4 GiB, no size yet).
  const std::string both =
      "^tessera@node-[ab]: gpu [01] \\(25% share\\): [^|]*, peak [49]00 mib of 1\\.[0-9] gib "
      "\\([0-9]+%\\) \\| tessera@node-[ab]: gpu [01] \\(25% share\\): [^|]*, peak [49]00 mib of "
      "1\\.[0-9] gib \\([0-9]+%\\)\n$";
  const std::string comment = SacctAdminComment(slurm_->Env(), job, both);
  EXPECT_THAT(comment, ::testing::ContainsRegex(both)) << slurm_->Logs();
  EXPECT_THAT(comment, HasSubstr("tessera@node-a: ")) << comment;
  EXPECT_THAT(comment, HasSubstr("tessera@node-b: ")) << comment;
  const nlohmann::json& measured = acct["node-b"]["earlier_runs"][0]["gpus"];
  ASSERT_EQ(measured.size(), 1u) << acct["node-b"].dump();
  EXPECT_EQ(measured[0].value("peak_memory_bytes", uint64_t{0}) >> 20, 900u)
      << acct["node-b"].dump();
}

// The cluster's own nodes (`scontrol show node -o` of this Slurm) and a sacct export replayed by
// `tessera sim replay`: a small one of jobs like the tests', and a synthetic one of 3,000 jobs;
// a malformed row is refused naming its file and line.
TEST_F(Slurm, ItsNodesAndASacctExportReplayInTheSimulator) {
  const std::string nodes = slurm_->dir() + "/nodes.txt", jobs = slurm_->dir() + "/jobs.txt",
                    big = slurm_->dir() + "/big.txt", bad = slurm_->dir() + "/bad.txt";
  ASSERT_EQ(Capture(slurm_->Env() + "scontrol show node -o > " + nodes).code, 0);
  const std::string head = "JobID|User|Submit|Start|End|State|AllocTRES|Timelimit\n";
  // The small export from this cluster's own jobs: what scontrol says of them, as sacct -P would
  // (this Slurm has no accounting database for sacct itself).
  std::string small_export = head;
  for (const char* gres : {"shard:3", "gpu:1"}) {
    auto run = Capture(Cmd(std::string("srun -Q -t 10 --gres=") + gres + " printenv SLURM_JOB_ID"));
    ASSERT_EQ(run.code, 0) << run.out;
    const std::string id = run.out.substr(0, run.out.find('\n'));
    auto show = Capture(slurm_->Env() + "scontrol show job -o " + id);
    std::map<std::string, std::string> f;
    for (const std::string& word : Words(show.out)) {
      const size_t eq = word.find('=');
      if (eq != std::string::npos) f.emplace(word.substr(0, eq), word.substr(eq + 1));
    }
    std::string tres = f["TRES"], per_node = f["TresPerNode"];  // gres:shard:3
    if (per_node.rfind("gres:", 0) == 0) {
      per_node = per_node.substr(5);
      tres += ",gres/" + per_node.substr(0, per_node.find(':')) + "=" +
              per_node.substr(per_node.find(':') + 1);
    }
    small_export += id + "|root|" + f["SubmitTime"] + "|" + f["StartTime"] + "|" + f["EndTime"] +
                    "|" + f["JobState"] + "|" + tres + "|" + f["TimeLimit"] + "\n";
  }
  EXPECT_THAT(small_export, HasSubstr(",gres/shard=3|")) << small_export;
  EXPECT_THAT(small_export, HasSubstr(",gres/gpu=1|")) << small_export;
  std::ofstream(jobs) << small_export;
  {
    std::ofstream out(big);
    out << head;
    for (int i = 0; i < 3000; ++i) {
      const int submit = i * 7, run = 60 + (i * 37) % 900;
      auto at = [](int s) {
        return fmt::format("2026-11-{:02}T{:02}:{:02}:{:02}", 1 + s / 86400, s / 3600 % 24,
                           s / 60 % 60, s % 60);
      };
      out << i + 1000 << "|u" << i % 7 << "|" << at(submit) << "|" << at(submit + 5) << "|"
          << at(submit + 5 + run) << "|COMPLETED|cpu=1,mem=100M,node=1,"
          << (i % 3 == 0 ? "gres/gpu=1" : fmt::format("gres/shard={}", 1 + i % 7)) << "|02:00:00\n";
    }
  }
  std::ofstream(bad) << head
                     << "3|root|2026-11-25T10:00:00|2026-11-25T10:00:01|Unknown|RUNNING|"
                        "cpu=1,mem=lots|UNLIMITED\n";
  const std::string sim = std::string(TESSERA_BINARY) +
                          " sim replay --no-progress --gpu-memory 16GiB -o json --nodes " + nodes;
  auto small = Capture(sim + " --pods " + jobs + " 2>&1");
  ASSERT_EQ(small.code, 0) << small.out;
  auto runs = nlohmann::json::parse(small.out, nullptr, false);
  ASSERT_TRUE(runs.is_array() && !runs.empty()) << small.out;
  for (const auto& r : runs) EXPECT_EQ(r["finished"], 2) << r.dump() << small_export;
  auto large = Capture(sim + " --pods " + big + " 2>&1");
  ASSERT_EQ(large.code, 0) << large.out;
  runs = nlohmann::json::parse(large.out, nullptr, false);
  ASSERT_TRUE(runs.is_array() && !runs.empty()) << large.out;
  for (const auto& r : runs) EXPECT_EQ(r["finished"], 3000) << r.dump();
  // Right-sized (issue 58), the same export: each job of a GPU or less (gres/gpu=1, shards) asks
  // for what the use model says it used; the same jobs finish, the same work keeps the GPUs as
  // busy, and they hold less of them. (Waits do not move here: 2 CPUs and a CPU each are this
  // cluster's bottleneck, which right-sizing GPUs leaves alone.)
  auto sized = Capture(sim + " --pods " + big + " --policies tessera --right-size 2>/dev/null");
  ASSERT_EQ(sized.code, 0) << sized.out;
  runs = nlohmann::json::parse(sized.out, nullptr, false);
  ASSERT_TRUE(runs.is_array() && runs.size() == 2) << sized.out;
  EXPECT_EQ(runs[0]["policy"], "tessera");
  EXPECT_EQ(runs[1]["policy"], "tessera right-sized");
  for (const auto& r : runs) EXPECT_EQ(r["finished"], 3000) << r.dump();
  EXPECT_LT(runs[1]["busyMeanAllocatedRatio"].get<double>() + 0.1,
            runs[0]["busyMeanAllocatedRatio"].get<double>())
      << sized.out;
  EXPECT_NEAR(runs[1]["busyMeanGpuBusyRatio"].get<double>(),
              runs[0]["busyMeanGpuBusyRatio"].get<double>(), 1e-9)
      << "the same work";
  auto refused = Capture(sim + " --pods " + bad + " 2>&1");
  EXPECT_EQ(refused.code, 2);
  EXPECT_THAT(refused.out, HasSubstr(bad + ":2: AllocTRES: mem=lots"));
}

// Two jobs sharing one GPU by shards (6 and 2 of 8) with the fake driver's virtual GPU, whose
// clock they share: over the same 2 s window each gets the GPU time its shards mean.
TEST_F(Slurm, TwoShardJobsOnOneGpuHoldTheirComputeShares) {
  const std::string clock = slurm_->dir() + "/gpu.clock";
  const auto start = std::chrono::steady_clock::now() + std::chrono::milliseconds(800);
  const std::string start_ms =
      std::to_string(std::chrono::duration<double, std::milli>(start.time_since_epoch()).count());
  auto job = [&](int shards) {
    return popen(Cmd("FAKE_CUDA_CLOCK=" + clock + " WORK_START_MS=" + start_ms +
                     " srun -Q --gres=shard:" + std::to_string(shards) +
                     " sh -c 'echo $SLURM_STEP_GPUS; exec " + kClient +
                     " link work:2600:500:4:0:300:2300' 2>&1")
                     .c_str(),
                 "r");
  };
  FILE* big = job(6);
  FILE* small = job(2);
  auto read = [](FILE* p) {
    std::string all;
    char buf[512];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) all.append(buf, n);
    pclose(p);
    return all;
  };
  const std::string a = read(big), b = read(small);
  int gpu_a = -1, gpu_b = -1;
  double us_a = 0, us_b = 0;
  ASSERT_EQ(sscanf(a.c_str(), "%d gpu_us %lf", &gpu_a, &us_a), 2) << a;
  ASSERT_EQ(sscanf(b.c_str(), "%d gpu_us %lf", &gpu_b, &us_b), 2) << b;
  ASSERT_EQ(gpu_a, gpu_b) << "Slurm put the two jobs on one GPU";
  EXPECT_GT(us_a + us_b, 0.6 * 2e6) << "the GPU stays busy";
  EXPECT_NEAR(100 * us_a / (us_a + us_b), 75, 5) << us_a << " vs " << us_b;
}

// sacct as a site's cluster answers it - slurmctld recording into slurmdbd, slurmdbd into MariaDB,
// all started here - exported as docs/slurm.md says, and replayed by tessera sim: what the
// hand-built exports of the other test stand for, checked against the real thing once.
TEST(SlurmAccounting, ASacctExportFromSlurmdbdReplaysInTheSimulator) {
  if (const std::string why = MiniSlurm::Unavailable(true); !why.empty())
    GTEST_SKIP() << "no Slurm with accounting here: " << why;
  MiniSlurm slurm({.plugin = TESSERA_SPANK_PLUGIN, .plugin_args = kArgs, .accounting = true});
  ASSERT_TRUE(slurm.error().empty()) << slurm.error();
  const std::string env = slurm.Env() + "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR " ";
  std::vector<std::string> ids;
  // The shard job holds 600 MiB of its 6 GiB and keeps its GPU busy for 1.5 s.
  for (const std::string gres : {"shard:3", "gpu:1"}) {
    auto run =
        Capture(env + "srun -Q -t 10 --mem=300M --gres=" + gres + " sh -c 'printenv SLURM_JOB_ID" +
                (gres == "shard:3"
                     ? std::string("; exec ") + kClient + " link alloc:600 work:1500:1000:1:0:0:0"
                     : std::string()) +
                "'");
    ASSERT_EQ(run.code, 0) << run.out << slurm.Logs();
    ids.push_back(run.out.substr(0, run.out.find('\n')));
  }
  // Recorded once slurmctld has sent the ends to slurmdbd (it does so on its own time).
  const std::string list = ids[0] + "," + ids[1];
  const std::string states =
      SacctUntil(slurm.Env(), "-a -X -P -n -j " + list + " --format=State 2>&1",
                 [](const std::string& out) { return out == "COMPLETED\nCOMPLETED\n"; });
  ASSERT_EQ(states, "COMPLETED\nCOMPLETED\n") << slurm.Logs();
  // Each job's use on its node in its AdminComment, written by its epilog into its accounting
  // record (slurmctld refuses to change a finished job): seff's question for GPUs, cluster-wide,
  // from sacct. The whole GPU's busy time is not measured.
  for (const auto& [id, re] : std::vector<std::pair<std::string, std::string>>{
           {ids[0],
            "^tessera@[^:]+: gpu [01] \\(37.5% share\\): [0-9]+% busy, [0-9a-z]+ of gpu time "
            "idle, peak 600 mib of 6 gib \\(10%\\)\n$"},
           {ids[1],
            "^tessera@[^:]+: gpu [01] \\(whole\\): (busy not measured \\(a whole "
            "gpu\\)|ran under a second)\n$"}}) {
    EXPECT_THAT(SacctAdminComment(slurm.Env(), id, re), ::testing::ContainsRegex(re))
        << id << "\n"
        << slurm.Logs();
  }
  // Each epilog said where it wrote it (the job had ended: its record, through slurmdbd) and how
  // long that held it.
  const std::string slurmd_log = tessera::test::ReadFile(slurm.dir() + "/log/slurmd.log");
  for (const std::string& id : ids)
    EXPECT_THAT(slurmd_log,
                ::testing::ContainsRegex("tessera: job " + id +
                                         ": AdminComment \\(slurmdbd, written in [0-9]+ ms\\)"))
        << slurmd_log;
  // `tessera slurm eff`, as on a login node: sacct's figures and the parts, read back. The shard
  // job's figures are its node's record's (tessera slurm acct, on the node).
  const std::string eff = std::string(TESSERA_BINARY) + " slurm eff ";
  auto node = Capture(std::string(TESSERA_BINARY) + " slurm acct " + ids[0] + " -o json" +
                      " --state-dir " + slurm.PluginStateDir() + " 2>&1");
  ASSERT_EQ(node.code, 0) << node.out;
  const nlohmann::json record = nlohmann::json::parse(node.out, nullptr, false)[0];
  ASSERT_TRUE(record.is_object()) << node.out;
  auto shard = Capture(slurm.Env() + eff + ids[0] + " -o json 2>&1");
  ASSERT_EQ(shard.code, 0) << shard.out;
  const nlohmann::json e = nlohmann::json::parse(shard.out, nullptr, false);
  ASSERT_TRUE(e.is_object()) << shard.out;
  EXPECT_EQ(e["job_id"], ids[0]);
  EXPECT_EQ(e["user"], "root");
  EXPECT_EQ(e["state"], "COMPLETED");
  EXPECT_EQ(e["nodes"], 1);
  EXPECT_GE(e["cpus"].get<int>(), 1);
  ASSERT_EQ(e["gpu_nodes"].size(), 1u) << shard.out;
  EXPECT_EQ(e["gpu_nodes"][0]["gpus"], nlohmann::json::array({record["gpus"][0]["index"]}));
  EXPECT_EQ(e["gpu_nodes"][0]["share_percent"], 37.5);
  EXPECT_EQ(e["shards_allocated"], 3) << "AllocTRES, as AccountingStorageTRES names them";
  EXPECT_EQ(e["gpus_allocated"], 0);
  EXPECT_EQ(e["gpu_memory_peak_bytes"], record["gpus"][0]["peak_memory_bytes"]);
  EXPECT_EQ(e["gpu_memory_limit_bytes"], record["gpus"][0]["memory_limit_bytes"]);
  const auto used = tessera::slurm::HeldOf(record, record["gpus"][0]);
  ASSERT_TRUE(used.busy_s) << node.out;
  // The part says a whole percentage; sacct's elapsed is whole seconds.
  EXPECT_NEAR(e["gpu_busy_pct"].get<double>(), 100 * *used.busy_s / used.held_s, 0.5) << shard.out;
  EXPECT_NEAR(e["gpu_idle_seconds"].get<double>(), used.held_s - *used.busy_s, 0.5) << shard.out;
  // Slurm's own record of the job: slurmdbd makes one from the job's first step when that reaches
  // it first (named "allocation", no memory asked: seen here for every such srun, which ends in
  // under 5 s); slurmctld's pass over jobs without a record (every 5 s) completes it. Until then
  // eff says so; after, the memory asked is read.
  if (e.contains("recorded_from_first_step")) {
    EXPECT_EQ(e["name"], "allocation") << shard.out;
    EXPECT_FALSE(e.contains("memory_asked_per_node_bytes")) << shard.out;
    EXPECT_THAT(Capture(slurm.Env() + eff + ids[0] + " 2>&1").out,
                HasSubstr("record             from its first step only so far"));
  }
  const std::string whole_record =
      SacctUntil(slurm.Env(), "-a -X -P -n -j " + list + " --format=JobName,ReqMem",
                 [](const std::string& out) { return out == "sh|300M\nsh|300M\n"; });
  ASSERT_EQ(whole_record, "sh|300M\nsh|300M\n") << slurm.Logs();
  shard = Capture(slurm.Env() + eff + ids[0] + " -o json 2>&1");
  const nlohmann::json completed = nlohmann::json::parse(shard.out, nullptr, false);
  ASSERT_TRUE(completed.is_object()) << shard.out;
  EXPECT_FALSE(completed.contains("recorded_from_first_step")) << shard.out;
  EXPECT_EQ(completed["name"], "sh");
  EXPECT_EQ(completed["memory_asked_per_node_bytes"], 300 << 20) << shard.out;
  EXPECT_EQ(completed["gpu_busy_pct"], e["gpu_busy_pct"]) << "the part, read as before";
  auto table = Capture(slurm.Env() + eff + ids[0] + " 2>&1");
  EXPECT_EQ(table.code, 0) << table.out;
  EXPECT_THAT(table.out, ::testing::ContainsRegex(
                             "GPU efficiency +[0-9.]+% of what its compute shares held was busy "
                             "\\(1 GPU on 1 node\\)"))
      << table.out;
  EXPECT_THAT(table.out, HasSubstr("GPU memory         peak 600 MiB of 6 GiB per GPU (9.8%)"))
      << table.out;
  EXPECT_THAT(table.out,
              ::testing::ContainsRegex("CPU efficiency +[0-9.]+% of [0-9]+ CPUs? over its run"))
      << table.out;
  auto whole = Capture(slurm.Env() + eff + ids[1] + " 2>&1");
  EXPECT_EQ(whole.code, 0) << whole.out;
  EXPECT_THAT(whole.out, HasSubstr("GPU efficiency     not measured (1 GPU on 1 node: whole GPUs"))
      << whole.out;
  auto whole_json = Capture(slurm.Env() + eff + ids[1] + " -o json 2>&1");
  EXPECT_EQ(nlohmann::json::parse(whole_json.out, nullptr, false)["gpus_allocated"], 1)
      << whole_json.out;
  // A job sacct does not know; an id that is not one.
  auto unknown = Capture(slurm.Env() + eff + "999999 2>&1");
  EXPECT_EQ(unknown.code, 1) << unknown.out;
  EXPECT_THAT(unknown.out, HasSubstr("sacct lists no job 999999")) << unknown.out;
  auto bad = Capture(slurm.Env() + eff + "42.batch 2>&1");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("expected a job id such as 42, 42_3 or 42+1")) << bad.out;
  // The export, as docs/slurm.md has a site run it: the jobs that ended in the period, selected
  // by their states. (Without -s, sacct selects jobs by their eligible time, which Slurm 22.05
  // does not always record for a job started at its submission, which would then be missed.)
  const std::string jobs = slurm.dir() + "/jobs.txt", nodes = slurm.dir() + "/nodes.txt";
  ASSERT_EQ(Capture(slurm.Env() +
                    "sacct -a -X -P -S now-1hours -E now -s CD,F,CA,TO,OOM,NF,PR,DL "
                    "--format=JobID,User,Submit,Start,End,State,AllocTRES,Timelimit > " +
                    jobs)
                .code,
            0);
  // (Jobs whose epilog wrote their AdminComment into slurmdbd have an eligible time there since:
  // a plain selection would find these two; a job without GPUs, which the plugin leaves alone,
  // may have none - checked at the end: the export keeps -s.)
  ASSERT_EQ(Capture(slurm.Env() + "scontrol show node -o > " + nodes).code, 0);
  const std::string exported = tessera::test::ReadFile(jobs);
  EXPECT_THAT(exported, HasSubstr("JobID|User|Submit|Start|End|State|AllocTRES|Timelimit\n"));
  EXPECT_THAT(exported, ::testing::ContainsRegex(ids[0] + "\\|root\\|[^\n]*gres/shard=3"))
      << exported;
  EXPECT_THAT(exported, ::testing::ContainsRegex(ids[1] + "\\|root\\|[^\n]*gres/gpu=1"))
      << exported;
  auto replay = Capture(std::string(TESSERA_BINARY) +
                        " sim replay --no-progress --gpu-memory 16GiB -o json --nodes " + nodes +
                        " --pods " + jobs + " 2>&1");
  ASSERT_EQ(replay.code, 0) << replay.out << exported;
  auto runs = nlohmann::json::parse(replay.out, nullptr, false);
  ASSERT_TRUE(runs.is_array() && !runs.empty()) << replay.out;
  for (const auto& r : runs) EXPECT_EQ(r["finished"], 2) << r.dump() << exported;
  // And right-sized: both jobs (a GPU, and 3 shards) are sized from the use model and finish.
  auto sized = Capture(std::string(TESSERA_BINARY) +
                       " sim replay --no-progress --gpu-memory 16GiB -o json --policies tessera "
                       "--right-size --nodes " +
                       nodes + " --pods " + jobs + " 2>/dev/null");
  ASSERT_EQ(sized.code, 0) << sized.out << exported;
  runs = nlohmann::json::parse(sized.out, nullptr, false);
  ASSERT_TRUE(runs.is_array() && runs.size() == 2) << sized.out;
  EXPECT_EQ(runs[1]["policy"], "tessera right-sized");
  for (const auto& r : runs) EXPECT_EQ(r["finished"], 2) << r.dump() << exported;
  // A job without GPUs, started at its submission: recorded with -s, whether Slurm gave it an
  // eligible time or not (seen both ways here: a plain selection finds it only when it has one).
  auto cpu = Capture(env + "srun -Q -t 10 printenv SLURM_JOB_ID");
  ASSERT_EQ(cpu.code, 0) << cpu.out;
  const std::string plain = cpu.out.substr(0, cpu.out.find('\n'));
  (void)SacctUntil(slurm.Env(), "-a -X -P -n -s CD -j " + plain + " --format=State",
                   [](const std::string& out) { return out == "COMPLETED\n"; });
  EXPECT_THAT(Capture(slurm.Env() + "sacct -a -X -P -n -S now-1hours -E now -s CD,F,CA,TO,OOM,NF,"
                                    "PR,DL --format=JobID")
                  .out,
              HasSubstr(plain + "\n"));
  // Slurm's own figures in `tessera slurm eff`, as seff reads them (jobacct_gather/linux): a batch
  // job that keeps its CPU busy and 256 MiB of the 512 MiB it asked resident until 1.5
  // CPU-seconds have gone and Slurm's sampling has seen the memory (sstat on its own step).
  const std::string hog = slurm.dir() + "/hog.py";
  std::ofstream(hog) << R"(#!/usr/bin/python3
import os, subprocess, sys, time
held = bytearray(256 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
step = os.environ["SLURM_JOB_ID"] + ".batch"
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
rss, deadline = "", time.monotonic() + 30
while time.monotonic() < deadline:
    x = 0
    for i in range(300000):
        x += i
    if time.process_time() < 1.5:
        continue
    rss = subprocess.run(["sstat", "-n", "-P", "-j", step, "--format=MaxRSS"],
                         capture_output=True, text=True).stdout.strip()
    if rss and rss[-1] in units and float(rss[:-1]) * units[rss[-1]] >= len(held):
        sys.exit(0)
sys.exit("sstat never saw 256 MiB resident: '" + rss + "'")
)";
  auto submit = Capture(env + "sbatch --parsable -J hog -t 5 --mem=512M -o " + slurm.dir() +
                        "/hog.out " + hog + " 2>&1");
  ASSERT_EQ(submit.code, 0) << submit.out << slurm.Logs();
  const std::string hog_id = submit.out.substr(0, submit.out.find_first_of(";\n"));
  // Its batch step's record too (MaxRSS is a step's figure), and its own whole (slurmctld's, not
  // the one slurmdbd may have made from the batch step: above).
  const std::string steps =
      SacctUntil(slurm.Env(), "-P -n -j " + hog_id + " --format=JobID,JobName,State",
                 [&](const std::string& out) {
                   return out.find(hog_id + ".batch|batch|COMPLETED\n") != std::string::npos &&
                          out.find(hog_id + "|hog|COMPLETED\n") != std::string::npos;
                 });
  ASSERT_THAT(steps, HasSubstr(hog_id + ".batch|batch|COMPLETED\n"))
      << tessera::test::ReadFile(slurm.dir() + "/hog.out") << slurm.Logs();
  auto hog_eff = Capture(slurm.Env() + eff + hog_id + " -o json 2>&1");
  ASSERT_EQ(hog_eff.code, 0) << hog_eff.out;
  const nlohmann::json h = nlohmann::json::parse(hog_eff.out, nullptr, false);
  ASSERT_TRUE(h.is_object()) << hog_eff.out;
  for (const char* key : {"memory_peak_bytes", "memory_asked_per_node_bytes", "memory_pct",
                          "cpu_seconds", "cpu_pct", "elapsed_s", "cpus"})
    ASSERT_TRUE(h.contains(key)) << key << "\n" << hog_eff.out << "\n" << steps;
  const double peak = h["memory_peak_bytes"].get<double>(), asked = 512 << 20;
  EXPECT_GE(peak, 256 << 20) << hog_eff.out;
  EXPECT_LT(peak, asked) << hog_eff.out;  // the interpreter is not 256 MiB
  EXPECT_EQ(h["memory_asked_per_node_bytes"], 512 << 20) << hog_eff.out;
  EXPECT_NEAR(h["memory_pct"].get<double>(), 100 * peak / asked, 1e-9) << hog_eff.out;
  EXPECT_GE(h["cpu_seconds"].get<double>(), 1.5) << hog_eff.out;
  EXPECT_NEAR(h["cpu_pct"].get<double>(),
              100 * h["cpu_seconds"].get<double>() /
                  (h["elapsed_s"].get<double>() * h["cpus"].get<double>()),
              1e-9)
      << hog_eff.out;
  EXPECT_EQ(h["gpu_nodes"].size(), 0u) << hog_eff.out;
  EXPECT_EQ(h["gpus_allocated"], 0) << hog_eff.out;
  auto hog_table = Capture(slurm.Env() + eff + hog_id + " 2>&1");
  EXPECT_EQ(hog_table.code, 0) << hog_table.out;
  EXPECT_THAT(hog_table.out,
              ::testing::ContainsRegex("\nmemory +peak [0-9.]+ MiB \\(its largest task\\) of "
                                       "512 MiB per node asked \\([0-9.]+%\\)\n"))
      << hog_table.out;
  EXPECT_THAT(hog_table.out, HasSubstr("GPU efficiency     none: Slurm gave it no GPUs"))
      << hog_table.out;
  // Every job that ended in the last hour, as sacct selects them (root: all users): the four, each
  // with the figures `eff JOB` gives; summed per user.
  auto period =
      Capture(slurm.Env() + std::string(TESSERA_BINARY) + " slurm eff --since 1h -o json 2>&1");
  ASSERT_EQ(period.code, 0) << period.out;
  const nlohmann::json listed = nlohmann::json::parse(period.out, nullptr, false);
  ASSERT_TRUE(listed.is_object()) << period.out;
  std::map<std::string, nlohmann::json> by_id;
  for (const auto& j : listed["jobs"]) by_id[j["job_id"].get<std::string>()] = j;
  for (const std::string& id : {ids[0], ids[1], plain, hog_id})
    EXPECT_TRUE(by_id.count(id)) << id << "\n" << period.out;
  EXPECT_EQ(by_id[ids[0]], nlohmann::json(completed)) << "as `tessera slurm eff " << ids[0] << "`";
  EXPECT_EQ(by_id[hog_id]["memory_peak_bytes"], h["memory_peak_bytes"]) << period.out;
  auto users = Capture(slurm.Env() + std::string(TESSERA_BINARY) +
                       " slurm eff --since 1h --by user -o json 2>&1");
  ASSERT_EQ(users.code, 0) << users.out;
  const nlohmann::json summed = nlohmann::json::parse(users.out, nullptr, false);
  ASSERT_TRUE(summed.is_object()) << users.out;
  ASSERT_EQ(summed["users"].size(), 1u) << users.out;
  EXPECT_EQ(summed["users"][0]["user"], "root");
  EXPECT_EQ(summed["users"][0]["jobs"], listed["jobs"].size());
  EXPECT_EQ(summed["users"][0]["gpu_jobs"], 2) << "the shard job and the whole GPU's";
  EXPECT_EQ(summed["users"][0]["gpu_held_seconds"], completed["gpu_held_seconds"])
      << "only the share's GPU time is measured";
  // An array's own id: sacct lists its tasks, each a line of `eff`.
  auto array =
      Capture(env + "sbatch --parsable --array=1-2 -J sweep -t 5 -o /dev/null --wrap true 2>&1");
  ASSERT_EQ(array.code, 0) << array.out << slurm.Logs();
  const std::string array_id = array.out.substr(0, array.out.find_first_of(";\n"));
  (void)SacctUntil(slurm.Env(), "-X -P -n -j " + array_id + " --format=JobID,JobName,State",
                   [&](const std::string& out) {
                     return out ==
                            array_id + "_1|sweep|COMPLETED\n" + array_id + "_2|sweep|COMPLETED\n";
                   });
  auto tasks = Capture(slurm.Env() + eff + array_id + " -o json 2>&1");
  ASSERT_EQ(tasks.code, 0) << tasks.out;
  const nlohmann::json listed_tasks = nlohmann::json::parse(tasks.out, nullptr, false);
  ASSERT_TRUE(listed_tasks.is_object()) << tasks.out;
  EXPECT_EQ(listed_tasks["job"], array_id);
  ASSERT_EQ(listed_tasks["jobs"].size(), 2u) << tasks.out;
  EXPECT_EQ(listed_tasks["jobs"][0]["job_id"], array_id + "_1") << tasks.out;
  EXPECT_EQ(listed_tasks["jobs"][1]["job_id"], array_id + "_2") << tasks.out;
  EXPECT_EQ(listed_tasks["jobs"][1]["state"], "COMPLETED") << tasks.out;
}

// A slurmdbd that stops answering (SIGSTOP: a database host gone quiet) holds no job's end past
// the plugin's limit on the write: the epilog gives up, says why in slurmd's log, and the node's
// GPUs are free for the next job; once slurmdbd answers again, the next job's part is written.
TEST(SlurmAccounting, AnEpilogIsNotHeldByASlurmdbdThatDoesNotAnswer) {
  if (const std::string why = MiniSlurm::Unavailable(true); !why.empty())
    GTEST_SKIP() << "no Slurm with accounting here: " << why;
  MiniSlurm slurm({.plugin = TESSERA_SPANK_PLUGIN, .plugin_args = kArgs, .accounting = true});
  ASSERT_TRUE(slurm.error().empty()) << slurm.error();
  ASSERT_GT(slurm.slurmdbd(), 0);
  const std::string env = slurm.Env() + "LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR " ";
  auto job = [&] {
    auto run = Capture(env + "srun -Q -t 5 --gres=gpu:2 printenv SLURM_JOB_ID 2>&1");
    EXPECT_EQ(run.code, 0) << run.out << slurm.Logs();
    return run.out.substr(0, run.out.find('\n'));
  };
  // Until its epilog is done: squeue lists a job while it completes.
  auto ended = [&](const std::string& id) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!Capture(slurm.Env() + "squeue -h -j " + id + " -o %i 2>/dev/null").out.empty() &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return Capture(slurm.Env() + "squeue -h -j " + id + " -o %i 2>/dev/null").out.empty();
  };
  ASSERT_EQ(kill(slurm.slurmdbd(), SIGSTOP), 0);
  struct Continue {
    pid_t pid;
    ~Continue() { kill(pid, SIGCONT); }
  } resume{slurm.slurmdbd()};
  const std::string quiet = job();
  ASSERT_FALSE(quiet.empty());
  ASSERT_TRUE(ended(quiet)) << slurm.Logs();
  const std::string log = tessera::test::ReadFile(slurm.dir() + "/log/slurmd.log");
  EXPECT_THAT(log, ::testing::ContainsRegex(
                       "tessera: job " + quiet +
                       ": its AdminComment was not written in [0-9]+ ms \\(the job has ended; in "
                       "its accounting record: slurmdbd: no answer in 10000 ms;"))
      << log;
  // Its node's own record has the job either way.
  EXPECT_TRUE(std::filesystem::exists(slurm.PluginStateDir() + "/acct/" + quiet + ".json"));
  ASSERT_EQ(kill(slurm.slurmdbd(), SIGCONT), 0);
  const std::string next = job();
  const std::string re = "^tessera@[^:]+: gpus 0,1 \\(whole gpus\\): ";
  EXPECT_THAT(SacctAdminComment(slurm.Env(), next, re), ::testing::ContainsRegex(re))
      << slurm.Logs();
}

}  // namespace
