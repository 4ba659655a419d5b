#include "tessera/server/store.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmt/format.h"
#include "tessera/server/store_sql.h"

namespace tessera::server {
namespace {

using namespace sql;  // NOLINT: the store's own helpers

constexpr const char* kStateNames[] = {"queued",    "running",   "succeeded", "failed",
                                       "cancelled", "preempted", "lost"};

}  // namespace

std::string_view JobStateName(JobState s) { return kStateNames[static_cast<int>(s)]; }

std::optional<JobState> ParseJobState(std::string_view name) {
  for (int i = 0; i < 7; ++i) {
    if (name == kStateNames[i]) return static_cast<JobState>(i);
  }
  return std::nullopt;
}

bool IsTerminal(JobState s) {
  return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled;
}

bool TransitionAllowed(JobState from, JobState to) {
  using S = JobState;
  switch (from) {
    case S::kQueued:
      return to == S::kRunning || to == S::kCancelled;
    case S::kRunning:
      return to == S::kSucceeded || to == S::kFailed || to == S::kCancelled ||
             to == S::kPreempted || to == S::kLost;
    case S::kPreempted:
    case S::kLost:
      return to == S::kQueued || to == S::kCancelled;
    default:
      return false;
  }
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  // Jobs carry their users' environments (tokens, keys): the database is the server's alone. SQLite
  // gives its -wal and -shm files the database's mode, so creating it 0600 covers all three; files
  // of an older server are tightened.
  // ":memory:" is SQLite's in-memory database, not a file to create in the working directory.
  const bool in_memory = path == ":memory:";
  if (int fd = in_memory ? -1 : open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600); fd >= 0) {
    if (fchmod(fd, 0600) != 0) {
      int e = errno;
      close(fd);
      return absl::PermissionDeniedError(
          fmt::format("store: cannot make {} private: {}", path, strerror(e)));
    }
    close(fd);
  }
  for (const char* suffix : {"-wal", "-shm"}) {
    if (!in_memory) chmod((path + suffix).c_str(), 0600);
  }
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InternalError(fmt::format("store: cannot open {}: {}", path, msg));
  }
  std::unique_ptr<Store> store(new Store(db));
  sqlite3_busy_timeout(db, 5000);
  if (struct stat st; !in_memory && stat(path.c_str(), &st) == 0) {
    store->path_ = path;
    store->dev_ = st.st_dev;
    store->ino_ = st.st_ino;
  }
  // A file that is not a database fails here, on its first read.
  if (absl::Status st = store->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; "
                                    "PRAGMA foreign_keys=ON;");
      !st.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("store: {} is not a usable database: {}", path, std::string(st.message())));
  }
  int version = 0;
  {
    Stmt s(db, "PRAGMA user_version");
    if (!s.ok() || s.Step() != SQLITE_ROW) return SqlError(db, "reading the schema version");
    version = sqlite3_column_int(s.get(), 0);
  }
  if (version > kSchemaVersion) {
    return absl::InvalidArgumentError(
        fmt::format("store: {} has schema version {}, newer than this build's {}", path, version,
                    kSchemaVersion));
  }
  if (version == 0) {
    // A new file, or one that is not ours: refuse a database with other tables.
    Stmt s(db, "SELECT count(*) FROM sqlite_master WHERE type='table'");
    if (!s.ok() || s.Step() != SQLITE_ROW) return SqlError(db, "reading the schema");
    if (sqlite3_column_int(s.get(), 0) != 0) {
      return absl::InvalidArgumentError(
          fmt::format("store: {} is a database of something else (it has tables but no Tessera "
                      "schema version)",
                      path));
    }
  }
  // Each step takes the schema one version up, in its own transaction.
  static constexpr const char* kSteps[kSchemaVersion] = {
      // 1: jobs and the events of their lives.
      "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, "
      "  owner_uid INTEGER NOT NULL, owner TEXT NOT NULL, spec TEXT NOT NULL, "
      "  priority INTEGER NOT NULL, state TEXT NOT NULL, submitted_at REAL NOT NULL, "
      "  started_at REAL, ended_at REAL, exit_code INTEGER, placement TEXT NOT NULL DEFAULT '', "
      "  pid INTEGER NOT NULL DEFAULT 0, pid_start_time INTEGER NOT NULL DEFAULT 0, "
      "  reason TEXT NOT NULL DEFAULT '');"
      "CREATE INDEX jobs_state ON jobs(state, id);"
      "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, "
      "  job_id INTEGER NOT NULL REFERENCES jobs(id), at REAL NOT NULL, state TEXT NOT NULL, "
      "  reason TEXT NOT NULL);"
      "CREATE INDEX events_job ON events(job_id, id);",
      // 2: what a job used (its cgroup's accounting), and the key that makes a submission
      // idempotent (one job per owner and key).
      "ALTER TABLE jobs ADD COLUMN usage TEXT NOT NULL DEFAULT '';"
      "ALTER TABLE jobs ADD COLUMN idempotency_key TEXT;"
      "CREATE UNIQUE INDEX jobs_idempotency ON jobs(owner, idempotency_key) "
      "  WHERE idempotency_key IS NOT NULL;",
      // 3: held jobs, and arrays (tasks point at their array's first row, which alone has the
      // spec).
      "ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;"
      "ALTER TABLE jobs ADD COLUMN array_id INTEGER NOT NULL DEFAULT 0;"
      "ALTER TABLE jobs ADD COLUMN array_index INTEGER NOT NULL DEFAULT -1;"
      "CREATE INDEX jobs_array ON jobs(array_id, array_index) WHERE array_id != 0;",
      // 4: the machine's recent history (the dashboard's charts), kept across restarts.
      "CREATE TABLE samples (at REAL PRIMARY KEY, data TEXT NOT NULL) WITHOUT ROWID;",
  };
  for (; version < kSchemaVersion; ++version) {
    const std::string sql =
        fmt::format("BEGIN; {} PRAGMA user_version={}; COMMIT;", kSteps[version], version + 1);
    if (absl::Status st = store->Exec(sql.c_str()); !st.ok()) {
      (void)store->Exec("ROLLBACK");
      return st;
    }
  }
  if (!in_memory) {
    // Reads on connections of their own: in WAL mode they see every committed job and do not
    // wait for a commit's fsync (an in-memory database is one connection's alone).
    for (size_t i = 0; i < kReaders; ++i) {
      sqlite3* reader = nullptr;
      if (sqlite3_open_v2(path.c_str(), &reader, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX,
                          nullptr) != SQLITE_OK) {
        std::string msg = reader ? sqlite3_errmsg(reader) : "out of memory";
        sqlite3_close(reader);
        return absl::InternalError(fmt::format("store: cannot open {} to read: {}", path, msg));
      }
      sqlite3_busy_timeout(reader, 5000);
      store->readers_.push_back(reader);
    }
    store->free_readers_ = store->readers_;
  }
  return store;
}

Store::~Store() {
  for (sqlite3* r : readers_) sqlite3_close(r);
  sqlite3_close(db_);
}

Store::ReadLease::ReadLease(Store& s, bool bulk) : s_(s) {
  if (s.readers_.empty()) {
    writer_ = std::unique_lock(s.mu_);
    db_ = s.db_;
    return;
  }
  std::unique_lock lock(s.pool_mu_);
  s.pool_cv_.wait(lock, [&] { return s.free_readers_.size() > (bulk ? 1u : 0u); });
  db_ = s.free_readers_.back();
  s.free_readers_.pop_back();
}

Store::ReadLease::~ReadLease() {
  if (writer_.owns_lock()) return;
  {
    std::lock_guard lock(s_.pool_mu_);
    s_.free_readers_.push_back(db_);
  }
  s_.pool_cv_.notify_all();
}

absl::Status Store::CheckFile() const {
  if (path_.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(path_.c_str(), &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) {
    return absl::UnavailableError(fmt::format(
        "store: the database file {} was removed or replaced while the server ran: nothing more is "
        "accepted (restart the server; it starts from what the file there holds)",
        path_));
  }
  const std::string wal = path_ + "-wal";
  std::lock_guard lock(wal_mu_);
  const bool there = stat(wal.c_str(), &st) == 0;
  if (wal_ino_ == 0) {
    if (there) wal_dev_ = st.st_dev, wal_ino_ = st.st_ino;
  } else if (!there || st.st_dev != wal_dev_ || st.st_ino != wal_ino_) {
    return absl::UnavailableError(fmt::format(
        "store: the database's write-ahead log {} was removed or replaced while the server ran: "
        "what was written since the last checkpoint would be lost at a crash; nothing more is "
        "accepted (restart the server)",
        wal));
  }
  return absl::OkStatus();
}

absl::Status Store::Exec(const char* sql) {
  if (strncmp(sql, "BEGIN", 5) == 0) {
    if (absl::Status st = CheckFile(); !st.ok()) return st;
  }
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return absl::InternalError(fmt::format("store: {}", msg));
  }
  return absl::OkStatus();
}

absl::Status Store::Commit() {
  if (absl::Status st = Exec("COMMIT"); !st.ok()) return st;
  if (on_change_) on_change_();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Store::Insert(const JobRecord& r, double now, bool* existed) {
  // Group commit: the caller that finds no commit under way takes every insert waiting (its own
  // among them) into one transaction, one fsync; the others wait for theirs to be done. Nothing
  // returns before its job is durable.
  PendingInsert me{&r, now};
  std::unique_lock g(group_mu_);
  pending_.push_back(&me);
  while (!me.done) {
    if (committing_) {
      group_cv_.wait(g);
      continue;
    }
    committing_ = true;
    std::vector<PendingInsert*> batch;
    while (!pending_.empty() && batch.size() < max_batch_) {
      batch.push_back(pending_.front());
      pending_.pop_front();
    }
    g.unlock();
    CommitInserts(batch);
    g.lock();
    committing_ = false;
    for (PendingInsert* p : batch) p->done = true;
    group_cv_.notify_all();
  }
  if (existed) *existed = me.existed;
  return me.result;
}

void Store::CommitInserts(const std::vector<PendingInsert*>& batch) {
  std::lock_guard lock(mu_);
  auto fail_all = [&](const absl::Status& st) {
    for (PendingInsert* p : batch) p->result = st;
  };
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return fail_all(st);
  for (PendingInsert* p : batch) {
    const JobRecord& r = *p->record;
    p->result = InsertOne(r, p->now, &p->existed);
    if (!p->result.ok()) {
      // This one alone is undone (its savepoint); the others in the transaction stand.
      (void)Exec("ROLLBACK TO one; RELEASE one");
    } else {
      (void)Exec("RELEASE one");
    }
  }
  if (absl::Status st = Commit(); !st.ok()) {
    (void)Exec("ROLLBACK");
    return fail_all(st);
  }
  // Existing jobs' ids were only read: nothing to undo for them.
}

absl::StatusOr<int64_t> Store::InsertOne(const JobRecord& r, double now, bool* existed) {
  *existed = false;
  if (absl::Status st = Exec("SAVEPOINT one"); !st.ok()) return st;
  int64_t id = 0;
  if (!r.idempotency_key.empty()) {
    Stmt s(db_, "SELECT id FROM jobs WHERE owner = ? AND idempotency_key = ?");
    if (!s.ok()) return SqlError(db_, "preparing a read");
    s.Bind(1, r.owner);
    s.Bind(2, r.idempotency_key);
    if (s.Step() == SQLITE_ROW) {
      *existed = true;
      return static_cast<int64_t>(sqlite3_column_int64(s.get(), 0));
    }
  }
  {
    Stmt s(db_,
           "INSERT INTO jobs (name, owner_uid, owner, spec, priority, state, submitted_at, reason, "
           "idempotency_key, held) VALUES (?, ?, ?, ?, ?, 'queued', ?, 'submitted', ?, ?)");
    if (!s.ok()) return SqlError(db_, "preparing insert");
    s.Bind(1, r.name);
    s.Bind(2, static_cast<int64_t>(r.owner_uid));
    s.Bind(3, r.owner);
    s.Bind(4, r.spec_json);
    s.Bind(5, static_cast<int64_t>(r.priority));
    s.Bind(6, now);
    s.Bind(7, r.idempotency_key.empty() ? std::nullopt : std::optional(r.idempotency_key));
    s.Bind(8, int64_t{r.held});
    if (s.Step() != SQLITE_DONE) return SqlError(db_, "inserting a job");
    id = sqlite3_last_insert_rowid(db_);
  }
  {
    Stmt s(db_,
           "INSERT INTO events (job_id, at, state, reason) VALUES (?, ?, 'queued', 'submitted')");
    if (!s.ok()) return SqlError(db_, "preparing an event");
    s.Bind(1, id);
    s.Bind(2, now);
    if (s.Step() != SQLITE_DONE) return SqlError(db_, "recording an event");
  }
  return id;
}

absl::Status Store::Transition(int64_t id, JobState to, std::string_view reason, double now,
                               const TransitionFields& f) {
  std::lock_guard lock(mu_);
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  absl::Status st = TransitionOne(id, to, reason, now, f);
  if (st.ok() && f.requeue) st = TransitionOne(id, JobState::kQueued, *f.requeue, now, {});
  if (st.ok()) st = Commit();
  if (!st.ok()) (void)Exec("ROLLBACK");
  return st;
}

absl::Status Store::TransitionMany(const std::vector<int64_t>& ids, JobState to,
                                   std::string_view reason, double now) {
  std::lock_guard lock(mu_);
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  for (int64_t id : ids) {
    if (absl::Status st = TransitionOne(id, to, reason, now, {}); !st.ok()) {
      (void)Exec("ROLLBACK");
      return st;
    }
  }
  if (absl::Status st = Commit(); !st.ok()) {
    (void)Exec("ROLLBACK");
    return st;
  }
  return absl::OkStatus();
}

absl::Status Store::TransitionOne(int64_t id, JobState to, std::string_view reason, double now,
                                  const TransitionFields& f) {
  // The caller rolls back on failure.
  JobState from;
  {
    Stmt s(db_, "SELECT state FROM jobs WHERE id = ?");
    s.Bind(1, id);
    if (!s.ok()) return SqlError(db_, "preparing a read");
    if (s.Step() != SQLITE_ROW) return absl::NotFoundError(fmt::format("job {}: not found", id));
    from = ParseJobState(Text(s.get(), 0)).value_or(JobState::kLost);
  }
  if (!TransitionAllowed(from, to)) {
    return absl::FailedPreconditionError(
        fmt::format("job {}: cannot go from {} to {}", id, JobStateName(from), JobStateName(to)));
  }
  {
    Stmt s(db_,
           "UPDATE jobs SET state = ?, reason = ?, started_at = coalesce(?, started_at), "
           "ended_at = coalesce(?, ended_at), exit_code = coalesce(?, exit_code), "
           "placement = coalesce(?, placement), pid = coalesce(?, pid), "
           "pid_start_time = coalesce(?, pid_start_time), usage = coalesce(?, usage), "
           "spec = coalesce(?, spec) WHERE id = ?");
    if (!s.ok()) return SqlError(db_, "preparing an update");
    s.Bind(1, JobStateName(to));
    s.Bind(2, reason);
    s.Bind(3, f.started_at);
    // Every end has its time, also one that never ran (a queued job cancelled): accounting counts
    // jobs by when they ended.
    s.Bind(4, f.ended_at ? f.ended_at : IsTerminal(to) ? std::optional<double>(now) : std::nullopt);
    s.Bind(5, f.exit_code ? std::optional<int64_t>(*f.exit_code) : std::nullopt);
    s.Bind(6, f.placement_json);
    s.Bind(7, f.pid);
    s.Bind(8, f.pid_start_time ? std::optional<int64_t>(static_cast<int64_t>(*f.pid_start_time))
                               : std::nullopt);
    s.Bind(9, f.usage_json);
    s.Bind(10, f.spec_json);
    s.Bind(11, id);
    if (s.Step() != SQLITE_DONE) return SqlError(db_, "updating a job");
  }
  {
    Stmt s(db_, "INSERT INTO events (job_id, at, state, reason) VALUES (?, ?, ?, ?)");
    if (!s.ok()) return SqlError(db_, "preparing an event");
    s.Bind(1, id);
    s.Bind(2, now);
    s.Bind(3, JobStateName(to));
    s.Bind(4, reason);
    if (s.Step() != SQLITE_DONE) return SqlError(db_, "recording an event");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Store::InsertArray(const JobRecord& r, const std::vector<int>& indices,
                                           double now, bool* existed) {
  if (indices.empty()) return absl::InvalidArgumentError("an array needs at least one task");
  std::lock_guard lock(mu_);
  bool repeat = false;
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  auto fail = [&](absl::Status st) -> absl::StatusOr<int64_t> {
    (void)Exec("ROLLBACK");
    return st;
  };
  absl::StatusOr<int64_t> first = InsertOne(r, now, &repeat);
  if (!first.ok()) return fail(first.status());
  (void)Exec("RELEASE one");
  if (repeat) {
    (void)Exec("ROLLBACK");
    if (existed) *existed = true;
    return first;
  }
  {
    Stmt s(db_, "UPDATE jobs SET array_id = ?, array_index = ? WHERE id = ?");
    if (!s.ok()) return fail(SqlError(db_, "preparing an update"));
    s.Bind(1, *first);
    s.Bind(2, int64_t{indices[0]});
    s.Bind(3, *first);
    if (s.Step() != SQLITE_DONE) return fail(SqlError(db_, "marking an array"));
  }
  // The other tasks: a row each without the spec, and their first event.
  Stmt task(db_,
            "INSERT INTO jobs (id, name, owner_uid, owner, spec, priority, state, submitted_at, "
            "reason, held, array_id, array_index) VALUES (?, ?, ?, ?, '', ?, 'queued', ?, "
            "'submitted', ?, ?, ?)");
  Stmt event(db_,
             "INSERT INTO events (job_id, at, state, reason) VALUES (?, ?, 'queued', 'submitted')");
  if (!task.ok() || !event.ok()) return fail(SqlError(db_, "preparing inserts"));
  for (size_t i = 1; i < indices.size(); ++i) {
    const int64_t id = *first + static_cast<int64_t>(i);
    sqlite3_reset(task.get());
    task.Bind(1, id);
    task.Bind(2, r.name);
    task.Bind(3, static_cast<int64_t>(r.owner_uid));
    task.Bind(4, r.owner);
    task.Bind(5, static_cast<int64_t>(r.priority));
    task.Bind(6, now);
    task.Bind(7, int64_t{r.held});
    task.Bind(8, *first);
    task.Bind(9, int64_t{indices[i]});
    if (task.Step() != SQLITE_DONE) return fail(SqlError(db_, "inserting an array's task"));
    sqlite3_reset(event.get());
    event.Bind(1, id);
    event.Bind(2, now);
    if (event.Step() != SQLITE_DONE) return fail(SqlError(db_, "recording an event"));
  }
  if (absl::Status st = Commit(); !st.ok()) return fail(st);
  if (existed) *existed = false;
  return first;
}

absl::Status Store::SetHeld(const std::vector<int64_t>& ids, bool held, std::string_view reason,
                            double now) {
  std::lock_guard lock(mu_);
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    (void)Exec("ROLLBACK");
    return st;
  };
  Stmt update(db_, "UPDATE jobs SET held = ? WHERE id = ? AND state = 'queued'");
  Stmt event(db_, "INSERT INTO events (job_id, at, state, reason) VALUES (?, ?, 'queued', ?)");
  if (!update.ok() || !event.ok()) return fail(SqlError(db_, "preparing a hold"));
  for (int64_t id : ids) {
    sqlite3_reset(update.get());
    update.Bind(1, int64_t{held});
    update.Bind(2, id);
    if (update.Step() != SQLITE_DONE) return fail(SqlError(db_, "holding a job"));
    if (sqlite3_changes(db_) != 1) {
      return fail(absl::FailedPreconditionError(fmt::format(
          "job {}: not queued; only a queued job can be {}", id, held ? "held" : "released")));
    }
    sqlite3_reset(event.get());
    event.Bind(1, id);
    event.Bind(2, now);
    event.Bind(3, reason);
    if (event.Step() != SQLITE_DONE) return fail(SqlError(db_, "recording an event"));
  }
  if (absl::Status st = Commit(); !st.ok()) return fail(st);
  return absl::OkStatus();
}

absl::Status Store::SetPriority(int64_t id, int priority, std::string_view reason, double now) {
  std::lock_guard lock(mu_);
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    (void)Exec("ROLLBACK");
    return st;
  };
  {
    Stmt update(db_, "UPDATE jobs SET priority = ? WHERE id = ? AND state = 'queued'");
    if (!update.ok()) return fail(SqlError(db_, "preparing a priority change"));
    update.Bind(1, int64_t{priority});
    update.Bind(2, id);
    if (update.Step() != SQLITE_DONE) return fail(SqlError(db_, "changing a priority"));
    if (sqlite3_changes(db_) != 1) {
      return fail(absl::FailedPreconditionError(
          fmt::format("job {}: not queued; only a queued job's priority can change", id)));
    }
  }
  {
    Stmt event(db_, "INSERT INTO events (job_id, at, state, reason) VALUES (?, ?, 'queued', ?)");
    if (!event.ok()) return fail(SqlError(db_, "preparing an event"));
    event.Bind(1, id);
    event.Bind(2, now);
    event.Bind(3, reason);
    if (event.Step() != SQLITE_DONE) return fail(SqlError(db_, "recording an event"));
  }
  if (absl::Status st = Commit(); !st.ok()) return fail(st);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Store::TaskId(int64_t array_id, int index) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  Stmt s(db, "SELECT id FROM jobs WHERE array_id = ? AND array_index = ?");
  if (!s.ok()) return SqlError(db, "preparing a read");
  s.Bind(1, array_id);
  s.Bind(2, int64_t{index});
  int rc = s.Step();
  if (rc == SQLITE_DONE)
    return absl::NotFoundError(fmt::format("job {}_{}: no such array task", array_id, index));
  if (rc != SQLITE_ROW) return SqlError(db, "reading a task");
  return static_cast<int64_t>(sqlite3_column_int64(s.get(), 0));
}

absl::StatusOr<std::vector<Store::TaskState>> Store::Tasks(int64_t array_id) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  Stmt s(db,
         "SELECT id, array_index, state, held FROM jobs WHERE array_id = ? ORDER BY array_index");
  if (!s.ok()) return SqlError(db, "preparing a read");
  s.Bind(1, array_id);
  std::vector<TaskState> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    out.push_back({sqlite3_column_int64(s.get(), 0), sqlite3_column_int(s.get(), 1),
                   ParseJobState(Text(s.get(), 2)).value_or(JobState::kLost),
                   sqlite3_column_int(s.get(), 3) != 0});
  }
  if (rc != SQLITE_DONE) return SqlError(db, "reading tasks");
  return out;
}

absl::Status Store::SetProcess(int64_t id, int64_t pid, uint64_t start_time) {
  std::lock_guard lock(mu_);
  Stmt s(db_, "UPDATE jobs SET pid = ?, pid_start_time = ? WHERE id = ? AND state = 'running'");
  if (!s.ok()) return SqlError(db_, "preparing an update");
  s.Bind(1, pid);
  s.Bind(2, static_cast<int64_t>(start_time));
  s.Bind(3, id);
  if (s.Step() != SQLITE_DONE) return SqlError(db_, "updating a job's process");
  if (sqlite3_changes(db_) != 1) return absl::NotFoundError(fmt::format("job {}: not running", id));
  return absl::OkStatus();
}

absl::Status Store::SetPlacement(int64_t id, std::string_view placement_json, int64_t pid,
                                 std::string_view reason, double now) {
  std::lock_guard lock(mu_);
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    (void)Exec("ROLLBACK");
    return st;
  };
  {
    Stmt s(db_,
           "UPDATE jobs SET placement = ?, pid = ?, pid_start_time = 0, reason = ? WHERE id = ? "
           "AND state = 'running'");
    if (!s.ok()) return fail(SqlError(db_, "preparing an update"));
    s.Bind(1, placement_json);
    s.Bind(2, pid);
    s.Bind(3, reason);
    s.Bind(4, id);
    if (s.Step() != SQLITE_DONE) return fail(SqlError(db_, "updating a job's placement"));
    if (sqlite3_changes(db_) != 1)
      return fail(absl::NotFoundError(fmt::format("job {}: not running", id)));
  }
  {
    Stmt s(db_, "INSERT INTO events (job_id, at, state, reason) VALUES (?, ?, 'running', ?)");
    if (!s.ok()) return fail(SqlError(db_, "preparing an event"));
    s.Bind(1, id);
    s.Bind(2, now);
    s.Bind(3, reason);
    if (s.Step() != SQLITE_DONE) return fail(SqlError(db_, "recording an event"));
  }
  return Exec("COMMIT");
}

absl::StatusOr<JobRecord> Store::Get(int64_t id, std::vector<JobEvent>* events) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  // With its events: one read transaction, so the row and its events are of one moment (a
  // transition between two reads would show a state its events have left).
  struct Snapshot {
    sqlite3* db = nullptr;
    ~Snapshot() {
      if (db) sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    }
  } snapshot;
  if (events) {
    if (sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK)
      return SqlError(db, "starting a read");
    snapshot.db = db;
  }
  Stmt s(db, fmt::format("SELECT {} FROM jobs j WHERE j.id = ?", kJobColumns).c_str());
  if (!s.ok()) return SqlError(db, "preparing a read");
  s.Bind(1, id);
  int rc = s.Step();
  if (rc == SQLITE_DONE) return absl::NotFoundError(fmt::format("job {}: not found", id));
  if (rc != SQLITE_ROW) return SqlError(db, "reading a job");
  JobRecord r = ReadJob(s.get());
  if (events) {
    Stmt e(db, "SELECT job_id, at, state, reason, id FROM events WHERE job_id = ? ORDER BY id");
    if (!e.ok()) return SqlError(db, "preparing a read");
    e.Bind(1, id);
    auto read = ReadEvents(e, db);
    if (!read.ok()) return read.status();
    *events = *std::move(read);
  }
  return r;
}

absl::StatusOr<std::vector<JobRecord>> Store::List(const std::vector<JobState>& states, int limit) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  std::string sql = fmt::format("SELECT {} FROM jobs j", kJobColumns);
  if (!states.empty()) {
    sql += " WHERE j.state IN (";
    for (size_t i = 0; i < states.size(); ++i) sql += i ? ",?" : "?";
    sql += ")";
  }
  sql += " ORDER BY j.id";
  if (limit > 0) sql += fmt::format(" LIMIT {}", limit);
  Stmt s(db, sql.c_str());
  if (!s.ok()) return SqlError(db, "preparing a list");
  for (size_t i = 0; i < states.size(); ++i)
    s.Bind(static_cast<int>(i + 1), JobStateName(states[i]));
  std::vector<JobRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back(ReadJob(s.get()));
  if (rc != SQLITE_DONE) return SqlError(db, "listing jobs");
  return out;
}

absl::Status Store::ForEachNewest(const std::vector<JobState>& states, const std::string& owner,
                                  int64_t before, const std::function<bool(JobRecord&&)>& take) {
  ReadLease lease(*this, /*bulk=*/true);
  sqlite3* db = lease.db();
  std::string sql = fmt::format("SELECT {} FROM jobs j WHERE 1", kJobColumns);
  if (!states.empty()) {
    sql += " AND j.state IN (";
    for (size_t i = 0; i < states.size(); ++i) sql += i ? ",?" : "?";
    sql += ")";
  }
  if (!owner.empty()) sql += " AND j.owner = ?";
  if (before > 0) sql += " AND j.id < ?";
  sql += " ORDER BY j.id DESC";
  Stmt s(db, sql.c_str());
  if (!s.ok()) return SqlError(db, "preparing a list");
  int at = 1;
  for (JobState st : states) s.Bind(at++, JobStateName(st));
  if (!owner.empty()) s.Bind(at++, owner);
  if (before > 0) s.Bind(at++, before);
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    if (!take(ReadJob(s.get()))) return absl::OkStatus();
  }
  if (rc != SQLITE_DONE) return SqlError(db, "listing jobs");
  return absl::OkStatus();
}

}  // namespace tessera::server
