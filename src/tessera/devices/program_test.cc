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

}  // namespace
}  // namespace tessera::devices
