#include "tessera/server/private_dirs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

namespace tessera::server {
namespace {

namespace fs = std::filesystem;

// The server's two parents (<tmp>/.tessera-<instance>, <shm>/...) go with it when no job's folder
// is in them, and stay, with the job's folder, when one is (a job running through a restart).
TEST(PrivateDirFolders, TheParentsGoWithTheServerUnlessAJobsFolderIsInThem) {
  if (geteuid() != 0) GTEST_SKIP() << "the folders are root's: the server makes them as root";
  const fs::path dir = fs::path(::testing::TempDir()) / "private-dirs";
  fs::remove_all(dir);
  fs::create_directories(dir / "tmp");
  fs::create_directories(dir / "shm");
  const std::unique_ptr<const fs::path, void (*)(const fs::path*)> gone(
      &dir, [](const fs::path* d) { fs::remove_all(*d); });
  const std::string tmp = (dir / "tmp").string(), shm = (dir / "shm").string();
  auto parents = [&] {
    return fs::exists(tmp + "/.tessera-a1") + fs::exists(shm + "/.tessera-a1");
  };
  {
    PrivateDirFolders folders(true, tmp, shm, "a1");
    if (!folders.enabled()) GTEST_SKIP() << folders.reason();
    EXPECT_EQ(parents(), 2) << "made as the server starts";
    auto made = folders.Make(7, 65534, 65534);
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_TRUE(fs::is_directory(made->tmp));
    folders.Remove(7);
    EXPECT_FALSE(fs::exists(made->tmp));
    EXPECT_EQ(parents(), 2) << "kept while the server runs: the next job's go there";
  }
  EXPECT_EQ(parents(), 0) << "none left on the host by a server that stopped without jobs";
  std::string kept;
  {
    PrivateDirFolders folders(true, tmp, shm, "a1");
    auto made = folders.Make(8, 65534, 65534);
    ASSERT_TRUE(made.ok()) << made.status();
    kept = made->shm;
  }
  EXPECT_EQ(parents(), 2) << "a job's folder in them: kept";
  EXPECT_TRUE(fs::is_directory(kept));
  {
    // The next start sweeps the ended job's folder; its stop then leaves nothing.
    PrivateDirFolders folders(true, tmp, shm, "a1");
    EXPECT_EQ(folders.Sweep({}), 1u);
  }
  EXPECT_EQ(parents(), 0);
}

}  // namespace
}  // namespace tessera::server
