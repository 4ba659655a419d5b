#pragma once
// The store's SQLite helpers, shared by its files (store.cc, store_read.cc, store_retention.cc):
// a prepared statement finalized on scope exit, a column read as text or an optional number, a
// job row (kJobColumns, ReadJob) and event rows (ReadEvents). Private to src/tessera/server.

#include <sqlite3.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fmt/format.h"
#include "tessera/server/store.h"

namespace tessera::server::sql {

inline absl::Status SqlError(sqlite3* db, std::string_view what) {
  return absl::InternalError(fmt::format("store: {}: {}", what, sqlite3_errmsg(db)));
}

// A prepared statement, finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr);
  }
  Stmt(sqlite3* db, const std::string& sql) : Stmt(db, sql.c_str()) {}
  ~Stmt() { sqlite3_finalize(s_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return s_; }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(s_, i, v); }
  void Bind(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  template <typename T>
  void Bind(int i, const std::optional<T>& v) {
    if (v)
      Bind(i, *v);
    else
      sqlite3_bind_null(s_, i);
  }
  int Step() { return sqlite3_step(s_); }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

inline std::string Text(sqlite3_stmt* s, int col) {
  const unsigned char* t = sqlite3_column_text(s, col);
  return t ? reinterpret_cast<const char*>(t) : "";
}

inline std::optional<double> OptDouble(sqlite3_stmt* s, int col) {
  if (sqlite3_column_type(s, col) == SQLITE_NULL) return std::nullopt;
  return sqlite3_column_double(s, col);
}

// Read FROM jobs j. An array's tasks read their spec from the array's first row.
inline constexpr const char* kJobColumns =
    "j.id, j.name, j.owner_uid, j.owner, "
    "CASE WHEN j.spec = '' AND j.array_id != 0 THEN (SELECT a.spec FROM jobs a WHERE a.id = "
    "j.array_id) ELSE j.spec END, "
    "j.priority, j.state, j.submitted_at, j.started_at, j.ended_at, j.exit_code, j.placement, "
    "j.pid, j.pid_start_time, j.reason, j.usage, j.idempotency_key, j.held, j.array_id, "
    "j.array_index";

inline JobRecord ReadJob(sqlite3_stmt* s) {
  JobRecord r;
  r.id = sqlite3_column_int64(s, 0);
  r.name = Text(s, 1);
  r.owner_uid = static_cast<uint32_t>(sqlite3_column_int64(s, 2));
  r.owner = Text(s, 3);
  r.spec_json = Text(s, 4);
  r.priority = sqlite3_column_int(s, 5);
  r.state = ParseJobState(Text(s, 6)).value_or(JobState::kLost);
  r.submitted_at = sqlite3_column_double(s, 7);
  r.started_at = OptDouble(s, 8);
  r.ended_at = OptDouble(s, 9);
  if (sqlite3_column_type(s, 10) != SQLITE_NULL) r.exit_code = sqlite3_column_int(s, 10);
  r.placement_json = Text(s, 11);
  r.pid = sqlite3_column_int64(s, 12);
  r.pid_start_time = static_cast<uint64_t>(sqlite3_column_int64(s, 13));
  r.reason = Text(s, 14);
  r.usage_json = Text(s, 15);
  r.idempotency_key = Text(s, 16);
  r.held = sqlite3_column_int(s, 17) != 0;
  r.array_id = sqlite3_column_int64(s, 18);
  r.array_index = sqlite3_column_int(s, 19);
  return r;
}

// The rows of a query that selects an event's job_id, at, state, reason and id, in that order.
inline absl::StatusOr<std::vector<JobEvent>> ReadEvents(Stmt& s, sqlite3* db) {
  std::vector<JobEvent> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    out.push_back({sqlite3_column_int64(s.get(), 0), sqlite3_column_double(s.get(), 1),
                   ParseJobState(Text(s.get(), 2)).value_or(JobState::kLost), Text(s.get(), 3),
                   sqlite3_column_int64(s.get(), 4)});
  }
  if (rc != SQLITE_DONE) return SqlError(db, "reading events");
  return out;
}

}  // namespace tessera::server::sql
