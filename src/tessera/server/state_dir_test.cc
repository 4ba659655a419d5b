// The state folder alone (state_dir.h): one server per folder, and the intercept library installed
// by rename.
#include "tessera/server/state_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace tessera::server {
namespace {

namespace fs = std::filesystem;

class StateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-statedir-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string Read(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::string dir_;
};

// The folders are made and the lock taken with this pid in it; a second server on the same folder
// is refused naming the first's pid (flock: two opens in one process conflict as two servers do),
// and gets it once the first has gone.
TEST_F(StateDirTest, OneServerPerStateFolder) {
  const std::string state = dir_ + "/state";
  auto first = TakeStateDir(state, 0.2);
  ASSERT_TRUE(first.ok()) << first.status();
  for (const char* sub : {"/logs", "/regions", "/exit"}) EXPECT_TRUE(fs::is_directory(state + sub));
  EXPECT_EQ(Read(state + "/server.lock"), std::to_string(getpid()) + "\n");
  auto second = TakeStateDir(state, 0.2);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(),
            "another tessera server (pid " + std::to_string(getpid()) +
                ") is using the state folder " + state +
                ": one server per state folder (give this one its own state_dir)");
  close(*first);
  auto third = TakeStateDir(state, 0.2);
  ASSERT_TRUE(third.ok()) << third.status();
  close(*third);
  std::ofstream(dir_ + "/file") << "x";
  auto bad = TakeStateDir(dir_ + "/file/state", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot create " + dir_ + "/file/state"), std::string::npos)
      << bad.status();
}

// A new build installed under a running job: the job keeps the file it opened (the old inode),
// the next jobs get the new one; a library that cannot be installed is preloaded from where it is.
TEST_F(StateDirTest, TheInterceptLibraryIsInstalledByRename) {
  const std::string build = dir_ + "/libtessera-cuda.so", state = dir_ + "/state";
  std::ofstream(build) << "build 1";
  const std::string copy = InstallInterceptLibrary(build, state);
  EXPECT_EQ(copy, state + "/lib/libtessera-cuda.so");
  EXPECT_EQ(Read(copy), "build 1");
  struct stat st;
  ASSERT_EQ(stat(copy.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  std::ifstream mapped(copy);  // a running job's hold on it
  std::ofstream(build) << "build 2";
  EXPECT_EQ(InstallInterceptLibrary(build, state), copy);
  EXPECT_EQ(Read(copy), "build 2");
  std::stringstream held;
  held << mapped.rdbuf();
  EXPECT_EQ(held.str(), "build 1") << "the running job's file is not written in place";
  EXPECT_EQ(InstallInterceptLibrary(dir_ + "/missing.so", state), dir_ + "/missing.so");
}

}  // namespace
}  // namespace tessera::server
