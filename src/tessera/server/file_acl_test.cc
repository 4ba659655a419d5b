// ACLs written as the kernel reads them: the users named may open the file to write, others may
// not, and clearing the list takes the access back. Run as root (CI is), as the server is.
#include "tessera/server/file_acl.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

namespace tessera::server {
namespace {

// Whether `uid` may open `path` to write (tried in a child that becomes that user).
bool Writable(const std::string& path, uid_t uid) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgid(uid) != 0 || setuid(uid) != 0) _exit(2);
    int fd = open(path.c_str(), O_WRONLY);
    _exit(fd >= 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(FileAcl, NamedUsersMayWriteAndOthersMayNot) {
  ASSERT_EQ(geteuid(), 0u) << "the server sets ACLs as root; so does this test";
  const std::string dir = ::testing::TempDir();
  chmod(dir.c_str(), 0711);
  const std::string path = dir + "acl-test-" + std::to_string(getpid());
  std::ofstream(path) << "x";
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  const uid_t nobody = getpwnam("nobody")->pw_uid, daemon = getpwnam("daemon")->pw_uid;
  EXPECT_FALSE(Writable(path, nobody));
  ASSERT_TRUE(SetUserAcl(path, {nobody}).ok());
  EXPECT_EQ(AclUsers(path), std::set<uid_t>{nobody});
  EXPECT_TRUE(Writable(path, nobody));
  EXPECT_FALSE(Writable(path, daemon));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0007, 0u) << "others get nothing";
  ASSERT_TRUE(SetUserAcl(path, {}).ok());
  EXPECT_TRUE(AclUsers(path).empty());
  EXPECT_FALSE(Writable(path, nobody));
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto missing = SetUserAcl(path + ".missing", {nobody});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.message()).find(path + ".missing"), std::string::npos);
  unlink(path.c_str());
}

}  // namespace
}  // namespace tessera::server
