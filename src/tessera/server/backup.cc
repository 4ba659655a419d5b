#include "tessera/server/backup.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "fmt/format.h"
#include "tessera/server/server_util.h"
#include "tessera/server/store.h"

namespace tessera::server {
namespace {

struct Db {
  sqlite3* db = nullptr;
  ~Db() { sqlite3_close(db); }
};

absl::Status SqlError(sqlite3* db, const std::string& what) {
  return absl::InternalError(
      fmt::format("{}: {}", what, db ? sqlite3_errmsg(db) : "out of memory"));
}

// The copy's schema version, job count and size, after SQLite's own check of every page.
absl::StatusOr<BackupInfo> Describe(const std::string& path) {
  Db d;
  if (sqlite3_open_v2(path.c_str(), &d.db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK)
    return SqlError(d.db, "opening " + path);
  auto one = [&](const char* sql, std::string* text, int64_t* n) -> absl::Status {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(d.db, sql, -1, &s, nullptr) != SQLITE_OK)
      return absl::InvalidArgumentError(
          fmt::format("{} is not a Tessera store: {}", path, sqlite3_errmsg(d.db)));
    const int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
      if (text) text->assign(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)));
      if (n) *n = sqlite3_column_int64(s, 0);
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW)
      return absl::InvalidArgumentError(
          fmt::format("{} is not a Tessera store: {}", path, sqlite3_errmsg(d.db)));
    return absl::OkStatus();
  };
  std::string check;
  if (absl::Status st = one("PRAGMA integrity_check", &check, nullptr); !st.ok()) return st;
  if (check != "ok")
    return absl::DataLossError(fmt::format("{} fails SQLite's integrity check: {}", path, check));
  BackupInfo info;
  int64_t version = 0;
  if (absl::Status st = one("PRAGMA user_version", nullptr, &version); !st.ok()) return st;
  info.schema_version = static_cast<int>(version);
  if (version <= 0)
    return absl::InvalidArgumentError(
        fmt::format("{} is not a Tessera store (no schema version)", path));
  if (version > Store::kSchemaVersion)
    return absl::InvalidArgumentError(
        fmt::format("{} has schema version {}, newer than this build's {}: restore it with the "
                    "release that made it",
                    path, version, Store::kSchemaVersion));
  if (absl::Status st = one("SELECT count(*) FROM jobs", nullptr, &info.jobs); !st.ok()) return st;
  struct stat sb {};
  if (stat(path.c_str(), &sb) == 0) info.bytes = static_cast<uint64_t>(sb.st_size);
  return info;
}

}  // namespace

absl::StatusOr<BackupInfo> BackupStore(const std::string& db, const std::string& dest) {
  if (access(db.c_str(), R_OK) != 0)
    return absl::NotFoundError(fmt::format("{}: {}", db, strerror(errno)));
  // Created here, 0600 and new: SQLite then opens the file as it is (and gives its journal the
  // same mode), so the copy of everyone's stored environments is never readable by others.
  const int fd = open(dest.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    if (errno == EEXIST)
      return absl::AlreadyExistsError(
          fmt::format("{} exists: a backup never writes over a file; name a new one", dest));
    return absl::PermissionDeniedError(fmt::format("{}: {}", dest, strerror(errno)));
  }
  const bool mode_ok = fchmod(fd, 0600) == 0;  // whatever the umask
  close(fd);
  auto fail = [&](absl::Status st) -> absl::Status {
    unlink(dest.c_str());
    unlink((dest + "-journal").c_str());
    return st;
  };
  if (!mode_ok) return fail(absl::PermissionDeniedError(fmt::format("{}: chmod 0600", dest)));
  Db src, out;
  if (sqlite3_open_v2(db.c_str(), &src.db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK)
    return fail(SqlError(src.db, "opening " + db));
  sqlite3_busy_timeout(src.db, 5000);
  if (sqlite3_open_v2(dest.c_str(), &out.db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK)
    return fail(SqlError(out.db, "opening " + dest));
  sqlite3_backup* b = sqlite3_backup_init(out.db, "main", src.db, "main");
  if (b == nullptr) return fail(SqlError(out.db, "backing up " + db));
  // All pages in one step: one read transaction, so one moment of the store (a step at a time
  // would restart whenever the server writes).
  int rc;
  while ((rc = sqlite3_backup_step(b, -1)) == SQLITE_BUSY || rc == SQLITE_LOCKED) sqlite3_sleep(20);
  sqlite3_backup_finish(b);
  if (rc != SQLITE_DONE) return fail(SqlError(out.db, "backing up " + db));
  // One self-contained file (the store's WAL mode came with its pages): no -wal to carry along.
  if (sqlite3_exec(out.db, "PRAGMA journal_mode=DELETE", nullptr, nullptr, nullptr) != SQLITE_OK)
    return fail(SqlError(out.db, "finishing " + dest));
  sqlite3_close(out.db);
  out.db = nullptr;
  auto info = Describe(dest);
  if (!info.ok()) return fail(info.status());
  return info;
}

absl::StatusOr<BackupInfo> RestoreStore(const std::string& from, const std::string& state_dir,
                                        std::string* aside) {
  auto info = Describe(from);
  if (!info.ok()) return info.status();
  const std::string lock_path = state_dir + "/server.lock";
  const int lock = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock < 0)
    return absl::FailedPreconditionError(fmt::format("{}: {}", lock_path, strerror(errno)));
  // Held until the new file is in place: a server starting meanwhile waits for it.
  struct Unlock {
    int fd;
    ~Unlock() { close(fd); }
  } unlock{lock};
  if (flock(lock, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = LockHolder(lock);
    return absl::FailedPreconditionError(
        fmt::format("a tessera server{} is using {}: stop it first (systemctl stop tessera)",
                    holder.empty() ? "" : " (pid " + holder + ")", state_dir));
  }
  const std::string db = state_dir + "/tessera.db";
  const std::string tmp = db + ".restoring";
  // Copied beside the store first (same file system), then renamed over it.
  {
    const int in = open(from.c_str(), O_RDONLY | O_CLOEXEC);
    const int out = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    bool ok = in >= 0 && out >= 0 && fchmod(out, 0600) == 0;
    char buf[1 << 16];
    ssize_t n = 0;
    while (ok && (n = read(in, buf, sizeof buf)) > 0) ok = write(out, buf, n) == n;
    ok = ok && n == 0 && fsync(out) == 0;
    const int e = errno;
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    if (!ok) {
      unlink(tmp.c_str());
      return absl::InternalError(fmt::format("copying {} to {}: {}", from, tmp, strerror(e)));
    }
  }
  aside->clear();
  if (access(db.c_str(), F_OK) == 0) {
    *aside = fmt::format("{}.before-restore-{}", db, time(nullptr));
    for (const char* suffix : {"", "-wal", "-shm"}) {
      const std::string f = db + suffix;
      if (access(f.c_str(), F_OK) == 0 && rename(f.c_str(), (*aside + suffix).c_str()) != 0) {
        unlink(tmp.c_str());
        return absl::InternalError(fmt::format("moving {} aside: {}", f, strerror(errno)));
      }
    }
  }
  if (rename(tmp.c_str(), db.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::InternalError(fmt::format("{}: {}", db, strerror(errno)));
  }
  return info;
}

}  // namespace tessera::server
