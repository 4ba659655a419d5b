#include "tessera/devices/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace tessera::devices {
namespace {

class InstallFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (std::filesystem::temp_directory_path() / "tessera-install-XXXXXX").string();
    ASSERT_NE(mkdtemp(t.data()), nullptr);
    dir_ = t;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  static std::string Read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static ino_t Inode(const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0 ? st.st_ino : 0;
  }
  std::string dir_;
};

// A library mapped by a running process (as LD_PRELOAD maps it) keeps its bytes when a new build
// is installed over its path: the upgrade replaces the name, never the mapped file.
TEST_F(InstallFileTest, ANewBuildLeavesTheMappedFileAsItWas) {
  const std::string v1(64 * 1024, 'a'), v2(16 * 1024, 'b');
  const std::string lib = dir_ + "/libtessera-cuda.so";
  bool changed = false;
  ASSERT_TRUE(InstallFile(Write("v1.so", v1), lib, 0755, &changed).ok());
  EXPECT_TRUE(changed);
  int fd = open(lib.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = mmap(nullptr, v1.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  const ino_t before = Inode(lib);

  // Shorter bytes: written in place, the mapping's tail would be past the end (SIGBUS on touch)
  // and its head the new bytes.
  ASSERT_TRUE(InstallFile(Write("v2.so", v2), lib, 0755, &changed).ok());
  EXPECT_TRUE(changed);
  EXPECT_EQ(std::string(static_cast<const char*>(map), v1.size()), v1);
  EXPECT_EQ(Read(lib), v2);
  EXPECT_NE(Inode(lib), before);
  struct stat st {};
  ASSERT_EQ(stat(lib.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  munmap(map, v1.size());

  // The same bytes again: nothing written, the inode stays.
  const ino_t now = Inode(lib);
  ASSERT_TRUE(InstallFile(dir_ + "/v2.so", lib, 0755, &changed).ok());
  EXPECT_FALSE(changed);
  EXPECT_EQ(Inode(lib), now);
  // No temporary file left beside it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 3);
}

TEST_F(InstallFileTest, AMissingSourceOrFolderIsNamedAndChangesNothing) {
  const std::string lib = Write("libtessera-cuda.so", "old");
  absl::Status s = InstallFile(dir_ + "/absent.so", lib, 0755);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("absent.so"), std::string::npos) << s;
  EXPECT_EQ(Read(lib), "old");
  s = InstallFile(lib, dir_ + "/no-such-folder/lib.so", 0755);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no-such-folder"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera::devices
