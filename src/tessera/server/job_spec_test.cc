#include "tessera/server/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

// Units as users write them (issue 34): a share as 30%, 30 or 0.3; memory as Slurm's 16G or
// Kubernetes' 16Gi; times as 90, 90s, 15m, 1h, HH:MM:SS or D-HH:MM:SS.
TEST(JobSpec, UnitsAsUsersWriteThem) {
  for (const char* share : {R"("30%")", "30", R"("30")", "0.3", R"("0.3")"}) {
    auto s = ParseJobSpec(std::string(R"({"command": ["ls"], "resources": {"gpu_share": )") +
                          share + "}}");
    ASSERT_TRUE(s.ok()) << share << ": " << s.status();
    EXPECT_EQ(s->gpu_milli, 300) << share;
  }
  EXPECT_EQ(ParseJobSpec(R"({"command": ["ls"], "resources": {"gpu_share": "1.6%"}})")->gpu_milli,
            16);
  // Below 1/64 of a GPU: more such jobs than the GPU's arbiter paces would fit on it.
  auto tiny = ParseJobSpec(R"({"command": ["ls"], "resources": {"gpu_share": "0.5%"}})");
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("between 1.6% (1/64: a GPU paces 64 jobs)"),
            std::string::npos)
      << tiny.status();
  for (const char* mem : {"16G", "16Gi", "16GiB", "16384"}) {
    auto s = ParseJobSpec(std::string(R"({"command": ["ls"], "resources": {"memory": ")") + mem +
                          R"("}})");
    ASSERT_TRUE(s.ok()) << mem << ": " << s.status();
    EXPECT_EQ(s->memory_mib, 16384) << mem;
  }
  const std::pair<const char*, double> times[] = {
      {"5400", 5400},          {R"("90m")", 5400},        {R"("1h30m")", 5400},
      {R"("01:30:00")", 5400}, {R"("0-01:30:00")", 5400}, {R"("1.5h")", 5400}};
  for (const auto& [t, seconds] : times) {
    auto s = ParseJobSpec(std::string(R"({"command": ["ls"], "max_runtime_s": )") + t +
                          R"(, "grace_period_s": "2m"})");
    ASSERT_TRUE(s.ok()) << t << ": " << s.status();
    EXPECT_EQ(s->max_runtime_s, seconds) << t;
    EXPECT_EQ(s->grace_period_s, 120) << t;
  }
  EXPECT_EQ(ParseJobSpec(R"({"command": ["ls"], "grace_period_s": "0"})")->grace_period_s, 0);
}

TEST(JobSpec, ParsesAFullSpec) {
  auto s =
      ParseJobSpec(R"({"command": ["python", "train.py"], "env": {"A": "1"}, "workdir": "/data",
      "name": "t", "labels": {"team": "nlp"}, "priority": 5, "preemptible": false,
      "max_runtime_s": 60, "grace_period_s": 120,
      "resources": {"gpu_memory": "10GiB", "gpu_share": "30%", "model": "H100"}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->command, (std::vector<std::string>{"python", "train.py"}));
  EXPECT_EQ(s->gpu_memory_mib, 10240);
  EXPECT_EQ(s->gpu_milli, 300);
  EXPECT_EQ(s->models, std::vector<std::string>{"H100"});
  EXPECT_EQ(s->priority, 5);
  EXPECT_FALSE(s->preemptible);
  EXPECT_EQ(s->grace_period_s, 120);
  EXPECT_LT(ParseJobSpec(R"({"command": ["ls"]})")->grace_period_s, 0)
      << "unset: the server's default";
  // Round trip through the stored form.
  auto again = JobSpecFromJson(JobSpecToJson(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*s));
  core::Request r = RequestOf(*s, 7, "alice");
  EXPECT_EQ(r.id, "7");
  EXPECT_TRUE(r.fractional());
  EXPECT_EQ(r.owner, "alice");
}

TEST(JobSpec, HostCpusAndMemoryAreScheduledAndRoundTrip) {
  auto s = ParseJobSpec(R"({"command": ["ls"], "resources": {"cpus": 2.5, "memory": "16GiB"}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->cpu_milli, 2500);
  EXPECT_EQ(s->memory_mib, 16384);
  core::Request r = RequestOf(*s, 1, "bob");
  EXPECT_EQ(r.cpu_milli, 2500);
  EXPECT_EQ(r.memory_mib, 16384);
  auto again = JobSpecFromJson(JobSpecToJson(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->cpu_milli, 2500);
  EXPECT_EQ(again->memory_mib, 16384);
}

TEST(JobSpec, AnElasticJobAsksForAGpuRangeAndRoundTrips) {
  auto s = ParseJobSpec(R"({"command": ["ls"], "resources": {"gpus": 2, "gpus_max": 8}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->gpus, 2);
  EXPECT_EQ(s->gpus_max, 8);
  core::Request r = RequestOf(*s, 1, "bob");
  EXPECT_EQ(r.gpus, 2);
  EXPECT_EQ(r.gpus_max, 8);
  EXPECT_TRUE(r.elastic());
  auto again = JobSpecFromJson(JobSpecToJson(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->gpus_max, 8);
  EXPECT_FALSE(RequestOf(*ParseJobSpec(R"({"command": ["ls"], "resources": {"gpus": 2}})"), 1, "")
                   .elastic());
  for (const auto& [json, why] : std::vector<std::pair<std::string, std::string>>{
           {R"({"command": ["ls"], "resources": {"gpus": 4, "gpus_max": 2}})",
            "resources.gpus_max: 2 is below resources.gpus (4)"},
           {R"({"command": ["ls"], "resources": {"gpus": 2, "gpus_max": 65}})",
            "resources.gpus_max: expected 1..64"},
           {R"({"command": ["ls"], "resources": {"gpus_max": 4}})",
            "an elastic request asks for whole GPUs (gpus 1 or more)"},
           {R"({"command": ["ls"], "resources": {"gpus": 1, "gpus_max": 4, "gpu_share": "30%"}})",
            "resources.gpus_max: an elastic job asks for whole GPUs, not a share of them"},
           {R"({"command": ["ls"], "tasks_per_gpu": 1, "resources": {"gpus": 1, "gpus_max": 4}})",
            "resources.gpus_max: an elastic job runs its own processes"}}) {
    auto bad = ParseJobSpec(json);
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(why), std::string::npos) << bad.status();
  }
}

TEST(JobSpec, AnElasticJobResizedWhileItRunsSaysHowAndRoundTrips) {
  auto s = ParseJobSpec(
      R"({"command": ["train"], "resources": {"gpus": 1, "gpus_max": 4},
          "resize": {"by": "signal", "grace_s": "2m", "unanswered": "keep"}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->resize_by, "signal");
  EXPECT_EQ(s->resize_grace_s, 120);
  EXPECT_EQ(s->resize_unanswered, "keep");
  EXPECT_TRUE(s->Resizable());
  EXPECT_TRUE(RequestOf(*s, 1, "").resizable);
  auto again = JobSpecFromJson(JobSpecToJson(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->resize_by, "signal");
  EXPECT_EQ(again->resize_grace_s, 120);
  EXPECT_EQ(again->resize_unanswered, "keep");
  // The defaults: a grace of 60 s, restarted when unanswered; without `resize`, never resized.
  auto plain = ParseJobSpec(R"({"command": ["train"], "resources": {"gpus": 1, "gpus_max": 4},
                                 "resize": {"by": "restart"}})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->resize_grace_s, 60);
  EXPECT_EQ(plain->resize_unanswered, "restart");
  EXPECT_FALSE(
      RequestOf(*ParseJobSpec(R"({"command": ["ls"], "resources": {"gpus": 1, "gpus_max": 4}})"), 1,
                "")
          .resizable);
  const std::string elastic = R"("command": ["ls"], "resources": {"gpus": 1, "gpus_max": 4})";
  for (const auto& [json, why] : std::vector<std::pair<std::string, std::string>>{
           {"{" + elastic + R"(, "resize": "signal"})", "resize: expected an object, got string"},
           {"{" + elastic + R"(, "resize": {}})", "resize.by: required: signal or restart"},
           {"{" + elastic + R"(, "resize": {"by": "sigusr1"}})",
            "resize.by: expected signal or restart, got 'sigusr1'"},
           {"{" + elastic + R"(, "resize": {"by": "signal", "unanswered": "wait"}})",
            "resize.unanswered: expected restart or keep, got 'wait'"},
           {"{" + elastic + R"(, "resize": {"by": "signal", "grace_s": -1}})", "resize.grace_s"},
           {"{" + elastic + R"(, "resize": {"by": "signal", "every": 1}})",
            "resize: unknown field 'every'"},
           {R"({"command": ["ls"], "resources": {"gpus": 2}, "resize": {"by": "signal"}})",
            "resize: only an elastic job is resized"},
           {"{" + elastic + R"(, "ntasks": 2, "resize": {"by": "signal"}})",
            "resize: a job resized while it runs is one process group"},
           {"{" + elastic + R"(, "image": "pytorch", "resize": {"by": "signal"}})",
            "resize.by: a job in a container does not see the resize file"}}) {
    auto bad = ParseJobSpec(json);
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(why), std::string::npos) << bad.status();
  }
}

TEST(JobSpec, RefusesBadInputNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "malformed JSON"},
      {"{", "malformed JSON"},
      {"[]", "expected a JSON object"},
      {"{}", "command: required"},
      {R"({"command": []})", "command: expected a non-empty array"},
      {R"({"command": "ls"})", "command: expected a non-empty array"},
      {R"({"command": [1]})", "command[0]: expected a string, got number"},
      {R"({"command": ["ls"], "gpus": 1})", "unknown field 'gpus'"},
      {R"({"command": ["ls"], "stdout_file": ""})", "stdout_file: empty"},
      {R"({"command": ["ls"], "stdout_file": "/o/out-%q"})",
       "stdout_file: unknown escape '%q' at 8 (Tessera has %j job"},
      {R"({"command": ["ls"], "stderr_file": "/x%"})", "stderr_file: '%' at the end"},
      {R"({"command": ["ls"], "stdout_file": "out.txt"})",
       "stdout_file: 'out.txt' is relative: give an absolute path or a workdir"},
      {R"({"command": ["ls"], "requeue": "yes"})", "requeue: expected true or false"},
      {R"({"command": ["ls"], "resources": {"gpu": 1}})", "resources: unknown field 'gpu'"},
      {R"({"command": ["ls"], "resources": {"gpus": "2"}})",
       "resources.gpus: expected a whole number, got string"},
      {R"({"command": ["ls"], "resources": {"gpus": 65}})", "resources.gpus: expected 0..64"},
      {R"({"command": ["ls"], "resources": {"gpu_share": 150}})", "resources.gpu_share"},
      {R"({"command": ["ls"], "resources": {"gpu_memory": "lots"}})", "resources.gpu_memory"},
      {R"({"command": ["ls"], "resources": {"gpus": 2, "gpu_share": 30, "topology": "require"}})",
       "2 or more whole GPUs"},
      {R"({"command": ["ls"], "resources": {"gpus": 1, "topology": "require"}})",
       "2 or more whole GPUs"},
      {R"({"command": ["ls"], "priority": 1.5})", "priority: expected a whole number"},
      {R"({"command": ["ls"], "priority": 5000})", "priority: expected -1000..1000"},
      {R"({"command": ["ls"], "env": {"A": 1}})", "env.A: expected a string"},
      {R"({"command": ["ls"], "env": {"A=B": "1"}})", "env: bad name"},
      {R"({"command": ["ls"], "env": {"A\nB": "1"}})", "env: bad name \"A\\nB\": a variable name"},
      {R"({"command": ["ls"], "env": {"1A": "1"}})", "env: bad name \"1A\""},
      {R"({"command": ["ls"], "env": {"A B": "1"}})", "env: bad name \"A B\""},
      {R"({"command": ["ls"], "env": {"A-B": "1"}})", "env: bad name \"A-B\""},
      {R"({"command": ["ls"], "workdir": "rel"})", "workdir: expected an absolute path"},
      {R"({"command": ["ls"], "max_runtime_s": -1})", "max_runtime_s"},
      {R"({"command": ["ls"], "grace_period_s": -1})",
       "grace_period_s: expected seconds in 0..3600"},
      {R"({"command": ["ls"], "grace_period_s": 4000})",
       "grace_period_s: expected seconds in 0..3600"},
      {R"({"command": ["ls"], "grace_period_s": "30 sec"})", "grace_period_s"},
      {R"({"command": ["ls"], "max_runtime_s": "1h30"})", "max_runtime_s: expected seconds in"},
      {R"({"command": ["ls"], "max_runtime_s": "0s"})", "max_runtime_s"},
      {R"({"command": ["ls"], "resources": {"gpu_share": 1}})",
       "resources.gpu_share: 1 is ambiguous"},
      {R"({"command": ["ls"], "resources": {"gpu_share": "1.0"}})",
       "resources.gpu_share: 1.0 is ambiguous"},
      {R"({"command": ["ls"], "resources": {"gpu_share": "100%"}})", "resources.gpu_share"},
      {R"({"command": ["ls"], "preemptible": "yes"})", "preemptible: expected true or false"},
      {R"({"command": ["ls"], "resources": {"cpus": 0}})",
       "resources.cpus: expected a number of CPUs between 0.01 and 4096, got 0"},
      {R"({"command": ["ls"], "resources": {"cpus": "2"}})", "resources.cpus"},
      {R"({"command": ["ls"], "resources": {"memory": "lots"}})", "resources.memory"},
  };
  for (const auto& [text, want] : cases) {
    auto s = ParseJobSpec(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(want)) << text;
  }
}

TEST(JobSpec, ArrayRangesListsStepsAndLimits) {
  auto a = ParseArray("0-4,7,10-20:5%3", 100);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->indices, (std::vector<int>{0, 1, 2, 3, 4, 7, 10, 15, 20}));
  EXPECT_EQ(a->throttle, 3);
  EXPECT_EQ(ArrayThrottle("0-4,7,10-20:5%3"), 3);
  EXPECT_EQ(ArrayThrottle("0-4"), 0);
  EXPECT_EQ(ParseArray("3,1,3", 100)->indices, (std::vector<int>{1, 3})) << "sorted, once each";
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& b : std::initializer_list<Bad>{{"", "no index"},
                                                 {"%4", "no index"},
                                                 {"5-2", "runs backwards (write 2-5)"},
                                                 {"0-99%0", "after %"},
                                                 {"0-10:0", "step"},
                                                 {"a-b", "not an index"},
                                                 {"1,,2", "not an index"},
                                                 {"1,", "not an index"},
                                                 {"-3", "not an index"},
                                                 {"0-100", "more than 100 tasks"},
                                                 {"99999999", "not an index"}}) {
    auto r = ParseArray(b.text, 100);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(b.says)) << b.text;
  }
}

TEST(JobSpec, AShareOnSeveralGpusIsOneRankPerGpu) {
  // gpus with gpu_share/gpu_memory: that share of each of so many GPUs, one process per GPU.
  auto s = ParseJobSpec(R"({"command": ["python", "train.py"], "tasks_per_gpu": 1,
      "resources": {"gpus": 2, "gpu_share": "50%", "gpu_memory": "10GiB"}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->Tasks(), 2);
  const core::Request r = RequestOf(*s, 7, "ada");
  EXPECT_EQ(r.gpus, 0) << "no whole GPU";
  EXPECT_EQ(r.share_gpus, 2);
  EXPECT_EQ(r.gpu_milli, 500);
  EXPECT_EQ(r.gpu_memory_mib, 10240);
  EXPECT_EQ(r.gpu_milli_total(), 1000);
  auto again = JobSpecFromJson(JobSpecToJson(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*s));
  EXPECT_EQ(HistoryShape(*s), "50% 10240MiB on 2 GPUs x2");
  // One GPU's share, several processes on it.
  auto one =
      ParseJobSpec(R"({"command": ["ls"], "ntasks": 2, "resources": {"gpu_memory": "1GiB"}})");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(RequestOf(*one, 8, "ada").shared_gpu_count(), 1);
}

TEST(JobSpec, ASharingModeIsAskedCheckedAndRoundTrips) {
  auto s = ParseJobSpec(R"({"command": ["serve"], "tasks_per_gpu": 1,
      "resources": {"gpus": 2, "gpu_share": "25%", "sharing": "mps"}})");
  ASSERT_TRUE(s.ok()) << s.status();
  const core::Request r = RequestOf(*s, 3, "ada");
  ASSERT_TRUE(r.sharing.has_value());
  EXPECT_TRUE(r.mps());
  EXPECT_EQ(r.owner, "ada");
  auto again = JobSpecFromJson(JobSpecToJson(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->sharing, "mps");
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*s));
  // None asked: none in the request (a share goes in time slices, whole GPUs anywhere).
  auto plain = ParseJobSpec(R"({"command": ["ls"], "resources": {"gpu_share": "25%"}})");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(RequestOf(*plain, 4, "ada").sharing.has_value());
  EXPECT_FALSE(JobSpecToJson(*plain)["resources"].contains("sharing"));
  const std::pair<const char*, const char*> bad[] = {
      {R"({"command": ["ls"], "resources": {"sharing": "spatial"}})",
       "resources.sharing: expected time-slice or mps, got 'spatial'"},
      {R"({"command": ["ls"], "resources": {"sharing": 1}})", "resources.sharing"},
      {R"({"command": ["ls"], "resources": {"gpus": 2, "gpu_share": "25%", "sharing": "mps"}})",
       "an MPS job on 2 GPUs needs a process per GPU"},
      {R"({"command": ["ls"], "image": "x", "resources": {"gpus": 2, "sharing": "mps"}})",
       "an MPS job on 2 GPUs needs a process per GPU"},
  };
  for (const auto& [text, want] : bad) {
    auto r = ParseJobSpec(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(want)) << text;
  }
  // A container on one MPS GPU is a client like any job (container.cc hands it the pipes).
  EXPECT_TRUE(
      ParseJobSpec(
          R"({"command": ["ls"], "image": "x", "resources": {"gpus": 1, "sharing": "mps"}})")
          .ok());
}

TEST(JobSpec, DependenciesAndTasksParseAndRoundTrip) {
  auto s = ParseJobSpec(R"({"command": ["ls"], "array": "0-9%2", "after": ["ok:5", "notok:7_3",
      "any:9", "ok:5"], "hold": true, "tasks_per_gpu": 2, "task_failure": "wait",
      "resources": {"gpus": 2}})");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->after.size(), 3u) << "the repeat once";
  EXPECT_EQ(s->after[1], (Dependency{Dependency::Kind::kNotOk, 7, 3}));
  EXPECT_EQ(DependencyText(s->after[2]), "any:9");
  EXPECT_EQ(s->Tasks(), 4);
  EXPECT_TRUE(s->hold);
  auto again = JobSpecFromJson(JobSpecToJson(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*s));
  struct Bad {
    const char* json;
    const char* says;
  };
  for (const Bad& b : std::initializer_list<Bad>{
           {R"({"command":["ls"],"after":["maybe:5"]})", "after[0]: 'maybe:5': expected ok:ID"},
           {R"({"command":["ls"],"after":["ok:0"]})", "is not a job id"},
           {R"({"command":["ls"],"after":["ok:5_x"]})", "is not a job id"},
           {R"({"command":["ls"],"after":"ok:5"})", "expected an array"},
           {R"({"command":["ls"],"array":""})", "array: empty"},
           {R"({"command":["ls"],"ntasks":0})", "ntasks: expected 1..1024"},
           {R"({"command":["ls"],"ntasks":2,"tasks_per_gpu":2,"resources":{"gpus":1}})",
            "not both"},
           {R"({"command":["ls"],"tasks_per_gpu":2})", "asks for no GPU"},
           {R"({"command":["ls"],"ntasks":2,"task_failure":"retry"})", "expected kill or wait"},
       }) {
    auto r = ParseJobSpec(b.json);
    ASSERT_FALSE(r.ok()) << b.json;
    EXPECT_THAT(r.status().message(), HasSubstr(b.says)) << b.json;
  }
}

}  // namespace
}  // namespace tessera::server

namespace tessera::server {
namespace {

// Slurm's --output/--error patterns: every escape, widths, %%, relative names in the workdir.
TEST(JobSpec, OutputFilesExpandSlurmsPatterns) {
  auto s = ParseJobSpec(
      R"({"command": ["python", "train.py"], "workdir": "/home/ada/run", "array": "0-3",
          "stdout_file": "logs/%x-%A_%a.%t.out", "stderr_file": "/tmp/%u/%5j-%N-100%%.err",
          "requeue": false})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->requeue, std::optional<bool>(false));
  OutputNames task{.job_id = 42,
                   .array_id = 40,
                   .array_index = 2,
                   .task = 1,
                   .user = "ada",
                   .name = "train",
                   .host = "gpu1"};
  EXPECT_EQ(OutputFileOf(*s, task, false), "/home/ada/run/logs/train-40_2.1.out");
  EXPECT_EQ(OutputFileOf(*s, task, true), "/tmp/ada/00042-gpu1-100%.err");
  // Not a task: %A is the job, %a Slurm's NO_VAL.
  EXPECT_EQ(*ExpandOutputPattern("%A-%a", {.job_id = 7}), "7-4294967294");
  // Only stdout named: stderr goes with it; none named: the server's logs.
  JobSpec only = *s;
  only.stderr_file.clear();
  EXPECT_EQ(OutputFileOf(only, task, true), "/home/ada/run/logs/train-40_2.1.out");
  only.stdout_file.clear();
  EXPECT_EQ(OutputFileOf(only, task, false), "");
  auto again = JobSpecFromJson(JobSpecToJson(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*s));
}

TEST(JobSpecModels, PartsOfANameResolveToTheMachinesExactModels) {
  const std::vector<std::string> machine = {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB",
                                            "NVIDIA A100-SXM4-80GB", "Tesla T4",
                                            "NVIDIA H100 80GB HBM3"};
  auto resolve = [&](std::vector<std::string> asked) {
    JobSpec s;
    s.models = std::move(asked);
    absl::Status st = ResolveModels(&s, machine);
    return st.ok() ? s.models : std::vector<std::string>{"error: " + std::string(st.message())};
  };
  EXPECT_THAT(resolve({"NVIDIA H100 80GB HBM3"}), ::testing::ElementsAre("NVIDIA H100 80GB HBM3"));
  EXPECT_THAT(resolve({"H100"}), ::testing::ElementsAre("NVIDIA H100 80GB HBM3"));
  EXPECT_THAT(resolve({"h100 80gb"}), ::testing::ElementsAre("NVIDIA H100 80GB HBM3"));
  EXPECT_THAT(resolve({"A100"}),
              ::testing::ElementsAre("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB"));
  EXPECT_THAT(resolve({"A100-SXM4-80GB", "T4"}),
              ::testing::ElementsAre("NVIDIA A100-SXM4-80GB", "Tesla T4"));
  EXPECT_THAT(resolve({"H100", "NVIDIA H100 80GB HBM3"}),
              ::testing::ElementsAre("NVIDIA H100 80GB HBM3"));
  EXPECT_THAT(resolve({}), ::testing::IsEmpty());
  // Whole words only: "100" is in every A100 and H100, and means none of them.
  EXPECT_THAT(resolve({"100"})[0],
              ::testing::HasSubstr("'100' is none of this machine's GPU models"));
  EXPECT_THAT(
      resolve({"V100"})[0],
      ::testing::HasSubstr(
          "(NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-40GB, NVIDIA A100-SXM4-80GB, Tesla T4)"));
  EXPECT_THAT(resolve({"T4", "L4"})[0], ::testing::HasSubstr("resources.model: 'L4'"));
}

}  // namespace
}  // namespace tessera::server
