// `tessera slurm eff`'s reading of sacct: the nodes' AdminComment parts read back as the epilog
// wrote them, sacct's lines in its own formats, and the job's figures from both.
#include "tessera/slurm/eff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "tessera/slurm/runs_test.h"
#include "tessera/slurm/step.h"

namespace tessera::slurm {
namespace {

using ::testing::HasSubstr;
constexpr uint64_t GiB = uint64_t{1} << 30;

const nlohmann::json& kShare = test::QuarterRun();
const nlohmann::json& kHalves = test::HalvesRun();
const nlohmann::json& kWhole = test::WholeRun();

TEST(SlurmEff, TheNodesPartsReadBackAsTheEpilogWroteThem) {
  nlohmann::json quick = kShare;
  quick["ended"] = 1000;
  std::string comment = "site: checked by the helpdesk";
  for (const auto& [record, node] : std::vector<std::pair<nlohmann::json, std::string>>{
           {kShare, "Node-A"}, {kHalves, "n2"}, {kWhole, "n3"}, {quick, "n4"}}) {
    comment = MergeAdminComment(comment, node, AdminCommentPart(record, node));
  }
  auto parts = ParseAdminComment(comment);
  ASSERT_TRUE(parts.ok()) << parts.status() << "\n" << comment;
  ASSERT_EQ(parts->size(), 4u) << "the site's note is not a node's part";
  const NodePart& a = (*parts)[0];
  EXPECT_EQ(a.node, "node-a");
  EXPECT_EQ(a.gpus, std::vector<int>{1});
  EXPECT_EQ(a.share_percent, 25);
  EXPECT_EQ(a.busy_percent, 80);
  EXPECT_EQ(a.idle_s, 5);
  EXPECT_EQ(a.peak_bytes, 3 * GiB);
  EXPECT_EQ(a.limit_bytes, 4 * GiB);
  EXPECT_EQ(a.refused, 2u);
  const NodePart& b = (*parts)[1];
  EXPECT_EQ(b.gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(b.share_percent, 50);
  EXPECT_EQ(b.busy_percent, 60);
  EXPECT_EQ(b.idle_s, 40);
  EXPECT_EQ(b.peak_bytes, 6 * GiB);
  EXPECT_EQ(b.refused, 0u);
  const NodePart& c = (*parts)[2];
  EXPECT_EQ(c.share_percent, 0) << "whole";
  EXPECT_FALSE(c.busy_percent) << "a whole GPU's busy time is not measured";
  EXPECT_EQ(c.peak_bytes, 40 * GiB);
  EXPECT_FALSE(c.limit_bytes);
  const NodePart& d = (*parts)[3];
  EXPECT_TRUE(d.under_a_second);
  EXPECT_FALSE(d.busy_percent);

  // As slurm_update_job keeps it (the case written) and as sacctmgr does (lower case): alike.
  auto upper = ParseAdminComment(absl::StrReplaceAll(comment, {{"gib", "GiB"}, {"gpu", "GPU"}}));
  ASSERT_TRUE(upper.ok()) << upper.status();
  EXPECT_EQ((*upper)[0].peak_bytes, 3 * GiB);
  // Nothing of ours; an empty comment.
  EXPECT_TRUE(ParseAdminComment("a site's note | another").value().empty());
  EXPECT_TRUE(ParseAdminComment("").value().empty());
  // Long runs: idle time in hours and days.
  nlohmann::json day = kShare;
  day["ended"] = 1000 + 4 * 86400;
  day["gpus"][0]["gpu_time_s"] = 3600.0;
  auto long_run = ParseAdminComment(AdminCommentPart(day, "n5"));
  ASSERT_TRUE(long_run.ok()) << long_run.status();
  EXPECT_EQ((*long_run)[0].idle_s, 86400 - 3600);
}

TEST(SlurmEff, APartThatDoesNotReadIsNamed) {
  for (const auto& [comment, says] : std::vector<std::pair<std::string, std::string>>{
           {"tessera@n1 gpu 0", "no node name"},
           {"tessera@: gpu 0 (whole): x", "no node name"},
           {"tessera@n1: cpu 0 (whole): x", "expected 'gpu N'"},
           {"tessera@n1: gpu 0 whole: x", "expected '(25% share)'"},
           {"tessera@n1: gpu x (whole): x", "GPU 'x' is not an index"},
           {"tessera@n1: gpu 0 (half): x", "'half' is neither"},
           {"tessera@n1: gpu 0 (250% share): x", "share '250%'"},
           {"tessera@n1: gpu 0 (25% share): 180% busy", "'180% busy'"},
           {"tessera@n1: gpu 0 (25% share): soon of gpu time idle", "'soon of gpu time idle'"},
           {"tessera@n1: gpu 0 (25% share): peak lots", "'peak lots'"},
           {"tessera@n1: gpu 0 (25% share): peak 1 gib of 2 bushels (50%)", "'peak 1 gib of 2"},
           {"tessera@n1: gpu 0 (25% share): -1 allocations refused at its limit", "'-1 alloc"},
       }) {
    auto parts = ParseAdminComment("note | " + comment);
    ASSERT_FALSE(parts.ok()) << comment;
    EXPECT_THAT(parts.status().message(), HasSubstr(says)) << comment;
    EXPECT_THAT(parts.status().message(), HasSubstr(comment.substr(0, 12))) << "names the part";
  }
  // What a newer plugin adds to a part is passed over.
  auto newer = ParseAdminComment("tessera@n1: gpu 0 (25% share): 50% busy, 9 kernels a second");
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_EQ((*newer)[0].busy_percent, 50);
}

// sacct's lines as `sacct -j 42 -P -n --noconvert -o kEffFields` prints them (Slurm 22.05: sizes
// in their own unit, K for RSS and M for memory asked; TotalCPU as MM:SS.mmm under an hour).
std::string Lines(const std::vector<std::vector<std::string>>& rows) {
  std::string out;
  for (const auto& r : rows) out += absl::StrJoin(r, kEffDelimiter) + "\n";
  return out;
}

TEST(SlurmEff, SlurmsFiguresAndTheGpusPartsMakeTheJobsEfficiency) {
  std::string comment;
  comment = MergeAdminComment(comment, "node-a", AdminCommentPart(kShare, "node-a"));
  comment = MergeAdminComment(comment, "n2", AdminCommentPart(kHalves, "n2"));
  const std::string text =
      Lines({{"42", "train", "alice", "COMPLETED", "0:0", "2", "8", "100", "06:40.000", "8000M", "",
              comment, "billing=8,cpu=8,gres/gpu:a100=1,gres/gpu=1,gres/shard=8,mem=8000M,node=2"},
             {"42.batch", "batch", "", "COMPLETED", "0:0", "1", "4", "100", "03:20.500", "",
              "1048576K", "", "cpu=4,gres/gpu=1,mem=4000M,node=1"},
             {"42.extern", "extern", "", "COMPLETED", "0:0", "2", "8", "100", "00:00:00", "", "0",
              "", "billing=8,cpu=8,gres/gpu=1,mem=8000M,node=2"},
             {"42.0", "python", "", "COMPLETED", "0:0", "2", "8", "95", "03:19.500", "", "2097152K",
              "", "cpu=8,gres/gpu=1,mem=8000M,node=2"}});
  auto job = ParseSacctEff(text, "42");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id, "42");
  EXPECT_EQ(job->name, "train");
  EXPECT_EQ(job->user, "alice");
  EXPECT_EQ(job->nodes, 2);
  EXPECT_EQ(job->cpus, 8);
  EXPECT_EQ(job->elapsed_s, 100);
  EXPECT_DOUBLE_EQ(job->total_cpu_s, 400);
  EXPECT_EQ(job->req_mem_bytes, uint64_t{8000} << 20);
  EXPECT_EQ(job->max_rss_bytes, 2 * GiB) << "the largest task of any step";
  // Its own line's, untyped (a type's count is within it).
  EXPECT_EQ(job->gpus_allocated, 1);
  EXPECT_EQ(job->shards_allocated, 8);
  auto parts = ParseAdminComment(job->admin_comment);
  ASSERT_TRUE(parts.ok()) << parts.status();
  const nlohmann::ordered_json e = EffOf(*job, *parts);
  // 25 GPU-seconds held at 80% and 100 at 60%: 80 of 125 busy; 5 + 40 idle.
  EXPECT_DOUBLE_EQ(e["gpu_held_seconds"].get<double>(), 125);
  EXPECT_DOUBLE_EQ(e["gpu_busy_seconds"].get<double>(), 80);
  EXPECT_DOUBLE_EQ(e["gpu_busy_pct"].get<double>(), 64);
  EXPECT_DOUBLE_EQ(e["gpu_idle_seconds"].get<double>(), 45);
  EXPECT_EQ(e["gpus_allocated"], 1);
  EXPECT_EQ(e["shards_allocated"], 8);
  EXPECT_EQ(e["gpus"], 3);
  EXPECT_EQ(e["gpu_memory_peak_bytes"], 6 * GiB);
  EXPECT_EQ(e["gpu_memory_limit_bytes"], 8 * GiB);
  EXPECT_DOUBLE_EQ(e["gpu_memory_pct"].get<double>(), 75);
  EXPECT_EQ(e["gpu_memory_refused"], 2);
  ASSERT_EQ(e["gpu_nodes"].size(), 2u);
  EXPECT_EQ(e["gpu_nodes"][1]["node"], "n2");
  EXPECT_DOUBLE_EQ(e["gpu_nodes"][1]["held_gpu_seconds"].get<double>(), 100);
  // As seff: 400 CPU-seconds of 8 CPUs x 100 s; 2 GiB of the 4000 MiB each node asked.
  EXPECT_DOUBLE_EQ(e["cpu_pct"].get<double>(), 50);
  EXPECT_EQ(e["memory_asked_per_node_bytes"], uint64_t{4000} << 20);
  EXPECT_DOUBLE_EQ(e["memory_pct"].get<double>(), 100.0 * 2048 / 4000);

  // A whole GPU only: held, nothing measured; no parts at all: none of the GPU figures.
  const nlohmann::ordered_json whole =
      EffOf(*job, *ParseAdminComment(AdminCommentPart(kWhole, "n3")));
  EXPECT_FALSE(whole.contains("gpu_busy_pct"));
  EXPECT_EQ(whole["gpus"], 1);
  const nlohmann::ordered_json none = EffOf(*job, {});
  EXPECT_EQ(none["gpus"], 0);
  EXPECT_FALSE(none.contains("gpu_memory_peak_bytes"));

  // Slurm's "unlimited" memory asked, as sacct 22.05 printed it for a job of the real Slurm's
  // tests: unknown, not an error.
  auto unlimited = ParseSacctEff(Lines({{"9", "n", "u", "COMPLETED", "0:0", "1", "1", "2",
                                         "00:00:00", "18446744073709551616.00M", "", "", ""}}),
                                 "9");
  ASSERT_TRUE(unlimited.ok()) << unlimited.status();
  EXPECT_FALSE(unlimited->req_mem_bytes);
  EXPECT_FALSE(EffOf(*unlimited, {}).contains("memory_asked_per_node_bytes"));
  EXPECT_FALSE(unlimited->from_first_step) << "a name of its own: a whole record";
  EXPECT_FALSE(EffOf(*unlimited, {}).contains("recorded_from_first_step"));
  // The record slurmdbd makes from a job's first step, before slurmctld's of the job: named
  // "allocation", its memory asked unknown. A job its user named so has its memory asked.
  auto first = ParseSacctEff(Lines({{"9", "allocation", "u", "COMPLETED", "0:0", "1", "1", "2",
                                     "00:00:00", "18446744073709551616.00M", "", "", ""}}),
                             "9");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->from_first_step);
  EXPECT_EQ(EffOf(*first, {})["recorded_from_first_step"], true);
  auto named = ParseSacctEff(Lines({{"9", "allocation", "u", "COMPLETED", "0:0", "1", "1", "2",
                                     "00:00:00", "300M", "", "", ""}}),
                             "9");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_FALSE(named->from_first_step);

  // Times past an hour and a day, as sacct writes them.
  for (const auto& [cpu, seconds] : std::vector<std::pair<std::string, double>>{
           {"02:03:04", 7384}, {"1-00:00:01", 86401}, {"00:05:06", 306}, {"", 0}}) {
    auto t = ParseSacctEff(
        Lines({{"7", "n", "u", "RUNNING", "0:0", "1", "1", "1", cpu, "1G", "", "", ""}}), "7");
    ASSERT_TRUE(t.ok()) << cpu << ": " << t.status();
    EXPECT_DOUBLE_EQ(t->total_cpu_s, seconds) << cpu;
  }
}

TEST(SlurmEff, SacctLinesThatDoNotReadAreNamed) {
  auto row = [](std::string elapsed, std::string cpu, std::string mem, std::string rss,
                std::string tres = "cpu=4,gres/gpu=1,node=1") {
    return Lines(
        {{"42", "n", "u", "COMPLETED", "0:0", "1", "4", elapsed, cpu, mem, "", "", tres},
         {"42.0", "n", "", "COMPLETED", "0:0", "1", "4", "1", "00:01.000", "", rss, "", ""}});
  };
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"42|n|u\n", "sacct line 1: 1 fields, expected 13"},
           {row("ten", "00:01.000", "1G", "1K"), "ElapsedRaw 'ten'"},
           {row("10", "1:2:3:4", "1G", "1K"), "TotalCPU '1:2:3:4'"},
           {row("10", "00:61", "1G", "1K"), "TotalCPU '00:61'"},
           {row("10", "00:01.000", "lots", "1K"), "ReqMem 'lots'"},
           {row("10", "00:01.000", "1G", "-5K"), "step 42.0: MaxRSS '-5K'"},
           {row("10", "00:01.000", "1G", "1K", "cpu=4,gres/gpu=two"),
            "AllocTRES 'cpu=4,gres/gpu=two': not a count"},
       }) {
    auto job = ParseSacctEff(text, "42");
    ASSERT_FALSE(job.ok()) << text;
    EXPECT_THAT(job.status().message(), HasSubstr(says));
  }
  EXPECT_THAT(ParseSacctEff("", "42").status().message(), HasSubstr("sacct lists no job 42"));
  // An array: its tasks are jobs of their own, named 42_N; one asked by its own id is found.
  const std::string array =
      Lines({{"42_1", "a", "u", "COMPLETED", "0:0", "1", "1", "5", "00:01.000", "1G", "", "", ""},
             {"42_2", "a", "u", "COMPLETED", "0:0", "1", "1", "5", "00:01.000", "1G", "", "", ""}});
  EXPECT_THAT(ParseSacctEff(array, "42").status().message(),
              HasSubstr("sacct lists 2 jobs for 42 (42_1, ...: an array's tasks"));
  EXPECT_EQ(ParseSacctEff(array, "42_2")->job_id, "42_2");
  auto task = ParseSacctEff(
      Lines({{"42_3", "a", "u", "COMPLETED", "0:0", "1", "1", "5", "00:01.000", "1G", "", "", ""}}),
      "45");
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->job_id, "42_3");
}

}  // namespace
}  // namespace tessera::slurm
