// tessera admin backup and restore (backup.h): online, 0600, checked; restore only with no server.
#include "tessera/server/backup.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tessera/server/store.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

JobRecord Job(const std::string& name) {
  JobRecord r;
  r.name = name;
  r.owner_uid = 1000;
  r.owner = "alice";
  r.spec_json = R"({"command":["sleep","1"],"env":{"API_KEY":"s3cret"}})";
  return r;
}

class BackupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "backup-" + std::to_string(getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/state");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// Taken while the server writes: one consistent moment (every job whole, none half-inserted),
// 0600 whatever the umask, never over an existing file.
TEST_F(BackupTest, AnOnlineBackupIsConsistentPrivateAndNeverOverwrites) {
  auto store = Store::Open(dir_ + "/state/tessera.db");
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE((*store)->Insert(Job("j"), 1.0 * i).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> inserted{100};
  std::thread writer([&] {
    while (!stop) {
      if ((*store)->Insert(Job("more"), 1000).ok()) ++inserted;
    }
  });
  const mode_t old_mask = umask(0);  // as careless as a shell can be
  auto info = BackupStore(dir_ + "/state/tessera.db", dir_ + "/backup.db");
  umask(old_mask);
  const int after = inserted.load();
  stop = true;
  writer.join();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(info->jobs, 100);
  EXPECT_LE(info->jobs, after);
  EXPECT_EQ(info->schema_version, Store::kSchemaVersion);
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/backup.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "it holds users' stored environments";
  EXPECT_FALSE(fs::exists(dir_ + "/backup.db-wal")) << "one self-contained file";
  // The copy opens as a store with those jobs.
  auto copy = Store::Open(dir_ + "/backup.db");
  ASSERT_TRUE(copy.ok()) << copy.status();
  auto jobs = (*copy)->List();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(static_cast<int64_t>(jobs->size()), info->jobs);
  copy->reset();
  // Never over a file.
  std::ofstream(dir_ + "/taken") << "mine";
  auto again = BackupStore(dir_ + "/state/tessera.db", dir_ + "/taken");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  std::ifstream taken(dir_ + "/taken");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(taken)), {}), "mine");
}

// Restore: refused while a server holds the state folder and for anything that is not a good
// store of this build's schema or older; else the store is replaced and the old one kept aside.
TEST_F(BackupTest, RestoreNeedsTheServerStoppedAndAGoodStore) {
  const std::string db = dir_ + "/state/tessera.db";
  {
    auto store = Store::Open(db);
    ASSERT_TRUE(store.ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*store)->Insert(Job("old"), i).ok());
    ASSERT_TRUE(BackupStore(db, dir_ + "/three.db").ok());
    ASSERT_TRUE((*store)->Insert(Job("after the backup"), 10).ok());
  }
  std::string aside;
  // A server (its lock) on the folder.
  const int lock = open((dir_ + "/state/server.lock").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_EQ(flock(lock, LOCK_EX), 0);
  ASSERT_EQ(pwrite(lock, "4242\n", 5, 0), 5);
  auto busy = RestoreStore(dir_ + "/three.db", dir_ + "/state", &aside);
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(busy.status().message()), HasSubstr("(pid 4242)"));
  close(lock);
  // Not a store; a newer schema; a damaged file.
  std::ofstream(dir_ + "/notes.txt") << "not a database at all, just some text\n";
  EXPECT_FALSE(RestoreStore(dir_ + "/notes.txt", dir_ + "/state", &aside).ok());
  fs::copy_file(dir_ + "/three.db", dir_ + "/newer.db");
  {
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/newer.db").c_str(), &h), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h, "PRAGMA user_version=99", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(h);
  }
  auto newer = RestoreStore(dir_ + "/newer.db", dir_ + "/state", &aside);
  EXPECT_THAT(std::string(newer.status().message()), HasSubstr("schema version 99, newer"));
  fs::copy_file(dir_ + "/three.db", dir_ + "/damaged.db");
  {
    // Every page after the first: its b-tree page type byte made one SQLite has none of.
    const auto size = fs::file_size(dir_ + "/damaged.db");
    std::fstream f(dir_ + "/damaged.db", std::ios::in | std::ios::out | std::ios::binary);
    for (uintmax_t page = 4096; page < size; page += 4096) {
      f.seekp(static_cast<std::streamoff>(page));
      f.put('\x07');
    }
  }
  EXPECT_FALSE(RestoreStore(dir_ + "/damaged.db", dir_ + "/state", &aside).ok());
  {
    auto still = Store::Open(db);
    ASSERT_TRUE(still.ok());
    EXPECT_EQ((*still)->List()->size(), 4u) << "nothing refused touched the store";
  }
  // The good one: in place, the replaced store kept.
  auto done = RestoreStore(dir_ + "/three.db", dir_ + "/state", &aside);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->jobs, 3);
  ASSERT_FALSE(aside.empty());
  EXPECT_TRUE(fs::exists(aside));
  struct stat st {};
  ASSERT_EQ(stat(db.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto restored = Store::Open(db);
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ((*restored)->List()->size(), 3u);
  auto before = Store::Open(aside);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ((*before)->List()->size(), 4u) << "what it replaced, whole";
}

}  // namespace
}  // namespace tessera::server
