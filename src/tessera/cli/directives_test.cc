#include "tessera/cli/directives.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Args = std::vector<std::string>;

Args Sbatch(const std::string& line, std::vector<std::string>* ignored = nullptr) {
  std::vector<std::string> dropped;
  auto a = TranslateSbatch(SplitWords(line), ignored ? ignored : &dropped);
  EXPECT_TRUE(a.ok()) << line << ": " << a.status();
  return a.ok() ? *a : Args{};
}

TEST(Directives, SbatchOptionsBecomeTesserasWhereTheyMeanTheSame) {
  EXPECT_THAT(Sbatch("--job-name=train"), ElementsAre("--name", "train"));
  EXPECT_THAT(Sbatch("-J train"), ElementsAre("--name", "train"));
  EXPECT_THAT(Sbatch("--gres=gpu:2"), ElementsAre("--gpus", "2"));
  EXPECT_THAT(Sbatch("--gres=gpu:a100:4"), ElementsAre("--gpus", "4", "--model", "a100"));
  EXPECT_THAT(Sbatch("--gres=mps:25"), ElementsAre("--sharing", "mps", "--gpu-share", "25%"));
  EXPECT_THAT(Sbatch("--gpus=h100:2"), ElementsAre("--gpus", "2", "--model", "h100"));
  EXPECT_THAT(Sbatch("-G 1"), ElementsAre("--gpus", "1"));
  EXPECT_THAT(Sbatch("--gpus=h100:2-4"), ElementsAre("--gpus", "2-4", "--model", "h100"));
  EXPECT_THAT(Sbatch("-c 8 --mem=64G"), ElementsAre("--cpus", "8", "--mem", "64G"));
  EXPECT_THAT(Sbatch("--time=90"), ElementsAre("--max-runtime", "90m")) << "Slurm's minutes";
  EXPECT_THAT(Sbatch("-t 1-00:00:00"), ElementsAre("--max-runtime", "1-00:00:00"));
  EXPECT_THAT(Sbatch("--array=0-99%8"), ElementsAre("--array", "0-99%8"));
  EXPECT_THAT(Sbatch("--dependency=afterok:12:13,afterany:14"),
              ElementsAre("--after", "ok:12:13", "--after", "any:14"));
  EXPECT_THAT(Sbatch("-H"), ElementsAre("--hold"));
  EXPECT_THAT(Sbatch("--ntasks=4"), ElementsAre("--ntasks", "4"));
  EXPECT_THAT(Sbatch("--output=train-%A_%a.out -e err-%j.txt"),
              ElementsAre("--stdout", "train-%A_%a.out", "--stderr", "err-%j.txt"));
  EXPECT_THAT(Sbatch("-o out.%j --requeue"), ElementsAre("--stdout", "out.%j", "--requeue"));
  EXPECT_THAT(Sbatch("--no-requeue"), ElementsAre("--no-requeue"));
  std::vector<std::string> ignored;
  EXPECT_THAT(Sbatch("--partition=gpu -A lab --gres=gpu:1 --qos high", &ignored),
              ElementsAre("--gpus", "1"));
  EXPECT_THAT(ignored, ElementsAre("--partition=gpu", "-A", "--qos"));
  for (const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
           {"--gres=gpu:x", "--gres=gpu:x: expected gpu[:type]:count"},
           {"--gres=mps:100", "--gres=mps:100: expected mps:count, 1..99 percent of a GPU"},
           {"--gres=mps:half", "--gres=mps:half: expected mps:count"},
           {"--dependency=after:3", "Tessera has afterok, afternotok and afterany"},
           {"--gpus=4-2", "--gpus=4-2: expected [type:]count or [type:]MIN-MAX"},
           {"-J", "-J needs a value"}}) {
    std::vector<std::string> dropped;
    auto a = TranslateSbatch(SplitWords(bad), &dropped);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(why));
  }
}

TEST(Directives, AGpuCountOrAnElasticRange) {
  EXPECT_EQ(*ParseGpuRange("0"), (std::pair{0, 0}));
  EXPECT_EQ(*ParseGpuRange("8"), (std::pair{8, 0}));
  EXPECT_EQ(*ParseGpuRange("2-8"), (std::pair{2, 8}));
  EXPECT_EQ(*ParseGpuRange("4-4"), (std::pair{4, 4}));
  for (const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
           {"", "'': not a GPU count"},
           {"two", "'two': not a GPU count"},
           {"2-", "'2-': not a GPU count"},
           {"-2", "'-2': not a GPU count"},
           {"2-4-6", "'2-4-6': not a GPU count"},
           {"65", "'65': more than 64 GPUs"},
           {"999999999999", "not a GPU count"},
           {"0-4", "an elastic job starts on 1 GPU or more"},
           {"8-2", "its most (2) is below its fewest (8)"},
           {"2-65", "more than 64 GPUs"}}) {
    auto r = ParseGpuRange(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(why)) << bad;
  }
}

TEST(Directives, OnlyTheLeadingCommentBlockCounts) {
  auto d = ParseDirectives(
      "#!/bin/bash -l\n"
      "# a comment\n"
      "#SBATCH --job-name='my run' --partition=gpu\n"
      "\n"
      "  #TESSERA --gpu-share 30% --priority 5\n"
      "#SBATCHED --nothing\n"
      "python train.py\n"
      "#SBATCH --gres=gpu:8\n",
      "job.sh");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interpreter, "/bin/bash");
  ASSERT_EQ(d->directives.size(), 2u);
  EXPECT_EQ(d->directives[0].line, 3);
  EXPECT_THAT(d->directives[0].args, ElementsAre("--name", "my run"));
  EXPECT_EQ(d->directives[1].line, 5);
  EXPECT_THAT(d->directives[1].args, ElementsAre("--gpu-share", "30%", "--priority", "5"));
  EXPECT_THAT(d->warnings,
              ElementsAre("job.sh:3: #SBATCH --partition=gpu: not used by Tessera (ignored)"));
  auto bad = ParseDirectives("#!/bin/sh\n#SBATCH --gres=gpu:lots\n", "job.sh");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("job.sh:2: #SBATCH --gres=gpu:lots:"));
}

}  // namespace
}  // namespace tessera::cli
