#include "tessera/devices/program.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace tessera::devices {
namespace {

using ::testing::HasSubstr;

TEST(RunInChild, GivesTheChildsAnswerAndKeepsItsChangesToItself) {
  int changed = 0;
  auto answer = RunInChild(
      [&] {
        changed = 1;
        return std::string("pid ") + std::to_string(getpid());
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_THAT(*answer, ::testing::StartsWith("pid "));
  EXPECT_NE(*answer, "pid " + std::to_string(getpid())) << "it ran in another process";
  EXPECT_EQ(changed, 0);
  // An empty answer is one; one larger than a pipe holds comes whole.
  auto empty = RunInChild([] { return std::string(); }, std::chrono::seconds(30));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");
  auto large = RunInChild([] { return std::string(300000, 'x'); }, std::chrono::seconds(30));
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(*large, std::string(300000, 'x'));
}

TEST(RunInChild, AChildThatDoesNotAnswerInTimeIsKilled) {
  // (pause(): a call that waits for what never comes, as a library waits on a silent server.)
  auto answer = RunInChild(
      [] {
        pause();
        return std::string("never");
      },
      std::chrono::milliseconds(200));
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kDeadlineExceeded) << answer.status();
  EXPECT_THAT(answer.status().message(), HasSubstr("no answer in 200 ms"));
}

TEST(RunInChild, AChildThatCrashesIsNamedWithItsSignal) {
  auto crashed = RunInChild(
      []() -> std::string {
        signal(SIGABRT, SIG_DFL);
        abort();
      },
      std::chrono::seconds(30));
  ASSERT_FALSE(crashed.ok());
  EXPECT_EQ(crashed.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(crashed.status().message(), HasSubstr("signal 6"));
  auto exited = RunInChild([]() -> std::string { _exit(3); }, std::chrono::seconds(30));
  ASSERT_FALSE(exited.ok());
  EXPECT_THAT(exited.status().message(), HasSubstr("without an answer (exit status 3)"));
  // An exception ends the child: it does not go on as a copy of the caller.
  int after = 0;
  auto threw =
      RunInChild([]() -> std::string { throw std::runtime_error("no"); }, std::chrono::seconds(30));
  ++after;
  ASSERT_FALSE(threw.ok());
  EXPECT_THAT(threw.status().message(), HasSubstr("without an answer (exit status 1)"));
  EXPECT_EQ(after, 1);
}

// A program's output: both streams together by default, the first MiB kept; with stderr_apart,
// its stderr alone in `err` (a large stdout, buffered in a pipe, is not broken by its warnings,
// and a program that fills both pipes is read to its end); max_output kept and the cut said.
TEST(RunCapture, KeepsWhatItIsToldOfEachStream) {
  const std::string sh = "/bin/sh";
  auto both = RunCapture({sh, "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->status, 3);
  EXPECT_THAT(both->text, HasSubstr("out\n"));
  EXPECT_THAT(both->text, HasSubstr("err\n"));
  EXPECT_EQ(both->err, "");
  EXPECT_FALSE(both->cut);
  // 3 MiB on stdout between two warnings, and 200 KB on stderr after: more than a pipe holds on
  // each, so the two must be read together.
  const std::string big =
      "echo first >&2; head -c 3145728 /dev/zero | tr '\\0' x; echo; echo second >&2; "
      "head -c 200000 /dev/zero | tr '\\0' e >&2";
  auto apart = RunCapture({sh, "-c", big}, {.max_output = size_t{8} << 20, .stderr_apart = true});
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_EQ(apart->status, 0);
  EXPECT_EQ(apart->text, std::string(3 << 20, 'x') + "\n");
  EXPECT_FALSE(apart->cut);
  EXPECT_THAT(apart->err, ::testing::StartsWith("first\nsecond\neee"));
  EXPECT_EQ(apart->err.size(), 13u + 200000u);
  // The first MiB by default; what passed max_output dropped and said.
  auto cut = RunCapture({sh, "-c", big}, {.stderr_apart = true});
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->status, 0) << "read to its end, not stopped at the limit";
  EXPECT_EQ(cut->text, std::string(1 << 20, 'x'));
  EXPECT_TRUE(cut->cut);
}

}  // namespace
}  // namespace tessera::devices
