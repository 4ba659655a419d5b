// The store's reads of events and samples (Store::Events, ListPeriod, EventsOfPeriod,
// EventsAfter, LastEventSeq) and the dashboard's history samples (AddSample, Samples).
#include <sqlite3.h>

#include "fmt/format.h"
#include "tessera/server/store.h"
#include "tessera/server/store_sql.h"

namespace tessera::server {

using namespace sql;  // NOLINT: the store's own helpers

absl::StatusOr<std::vector<JobEvent>> Store::Events(int64_t id) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  Stmt s(db, "SELECT job_id, at, state, reason, id FROM events WHERE job_id = ? ORDER BY id");
  if (!s.ok()) return SqlError(db, "preparing a read");
  s.Bind(1, id);
  return ReadEvents(s, db);
}

absl::StatusOr<std::vector<JobRecord>> Store::ListPeriod(double since, double until) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  Stmt s(db,
         "SELECT j.id, j.owner_uid, j.owner, j.state, j.submitted_at, j.started_at, j.ended_at, "
         "j.placement, j.array_id, j.array_index, j.usage, j.name FROM jobs j WHERE (j.ended_at IS "
         "NULL OR "
         "j.ended_at >= ?) AND j.submitted_at <= ? ORDER BY j.id");
  if (!s.ok()) return SqlError(db, "preparing a list");
  s.Bind(1, since);
  s.Bind(2, until);
  std::vector<JobRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    JobRecord r;
    sqlite3_stmt* st = s.get();
    r.id = sqlite3_column_int64(st, 0);
    r.owner_uid = static_cast<uint32_t>(sqlite3_column_int64(st, 1));
    r.owner = Text(st, 2);
    r.state = ParseJobState(Text(st, 3)).value_or(JobState::kLost);
    r.submitted_at = sqlite3_column_double(st, 4);
    r.started_at = OptDouble(st, 5);
    r.ended_at = OptDouble(st, 6);
    r.placement_json = Text(st, 7);
    r.array_id = sqlite3_column_int64(st, 8);
    r.array_index = sqlite3_column_int(st, 9);
    r.usage_json = Text(st, 10);
    r.name = Text(st, 11);
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return SqlError(db, "listing jobs");
  return out;
}

absl::StatusOr<std::vector<JobEvent>> Store::EventsOfPeriod(double since, double until) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  Stmt s(db,
         "SELECT e.job_id, e.at, e.state, '', e.id FROM events e JOIN jobs j ON j.id = e.job_id "
         "WHERE (j.ended_at IS NULL OR j.ended_at >= ?) AND j.submitted_at <= ? ORDER BY "
         "e.job_id, e.id");
  if (!s.ok()) return SqlError(db, "preparing a read");
  s.Bind(1, since);
  s.Bind(2, until);
  return ReadEvents(s, db);
}

absl::StatusOr<std::vector<JobEvent>> Store::EventsAfter(int64_t seq, int limit) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  Stmt s(db, "SELECT job_id, at, state, reason, id FROM events WHERE id > ? ORDER BY id LIMIT ?");
  if (!s.ok()) return SqlError(db, "preparing a read");
  s.Bind(1, seq);
  s.Bind(2, int64_t{limit});
  return ReadEvents(s, db);
}

absl::StatusOr<int64_t> Store::LastEventSeq() {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  Stmt s(db, "SELECT coalesce(max(id), 0) FROM events");
  if (!s.ok() || s.Step() != SQLITE_ROW) return SqlError(db, "reading the last event");
  return sqlite3_column_int64(s.get(), 0);
}

absl::Status Store::AddSample(const Sample& sample, double drop_before) {
  std::lock_guard lock(mu_);
  if (absl::Status st = Exec("BEGIN"); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    (void)Exec("ROLLBACK");
    return st;
  };
  {
    Stmt s(db_, "INSERT OR REPLACE INTO samples (at, data) VALUES (?, ?)");
    if (!s.ok()) return fail(SqlError(db_, "preparing a sample"));
    s.Bind(1, sample.at);
    s.Bind(2, sample.data);
    if (s.Step() != SQLITE_DONE) return fail(SqlError(db_, "adding a sample"));
  }
  {
    Stmt s(db_, "DELETE FROM samples WHERE at < ?");
    if (!s.ok()) return fail(SqlError(db_, "preparing a sample"));
    s.Bind(1, drop_before);
    if (s.Step() != SQLITE_DONE) return fail(SqlError(db_, "dropping old samples"));
  }
  // Not a job's change: Exec's COMMIT, not Commit (which tells on_change_).
  if (absl::Status st = Exec("COMMIT"); !st.ok()) return fail(st);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Sample>> Store::Samples(double since) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  Stmt s(db, "SELECT at, data FROM samples WHERE at >= ? ORDER BY at");
  if (!s.ok()) return SqlError(db, "preparing a read");
  s.Bind(1, since);
  std::vector<Sample> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW)
    out.push_back({sqlite3_column_double(s.get(), 0), Text(s.get(), 1)});
  if (rc != SQLITE_DONE) return SqlError(db, "reading samples");
  return out;
}

}  // namespace tessera::server
