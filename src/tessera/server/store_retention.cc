// Retention of ended jobs in the store (Store::PurgeEnded, PurgeEnvironments, EndedBetween): what
// the dispatcher's retention settings remove, in bounded transactions.
#include <sqlite3.h>

#include "fmt/format.h"
#include "tessera/server/store.h"
#include "tessera/server/store_sql.h"

namespace tessera::server {
namespace {

// Not waiting, not running: how it ended is recorded for good.
constexpr const char* kEnded = "state NOT IN ('queued', 'running')";
constexpr const char* kLive = "state IN ('queued', 'running')";

}  // namespace

absl::StatusOr<std::vector<int64_t>> Store::PurgeEnded(double jobs_before,
                                                       const std::set<int64_t>& keep,
                                                       size_t max_jobs) {
  std::vector<int64_t> gone;
  if (jobs_before <= 0 || max_jobs == 0) return gone;
  std::lock_guard lock(mu_);
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  auto rollback = [&](absl::Status st) {
    (void)Exec("ROLLBACK");
    return st;
  };
  // A lone job, or an array whose every task ended before the cutoff; in id order, so an array's
  // tasks (consecutive ids) come together and the limit cuts between arrays, never inside one.
  const std::string pick = fmt::format(
      "SELECT id, array_id FROM jobs j WHERE {0} AND ended_at < ?1 AND (array_id = 0 OR NOT "
      "EXISTS (SELECT 1 FROM jobs t WHERE t.array_id = j.array_id AND (t.{1} OR "
      "t.ended_at IS NULL OR t.ended_at >= ?1))) ORDER BY id",
      kEnded, kLive);
  {
    sql::Stmt q(db_, pick);
    if (!q.ok()) return rollback(sql::SqlError(db_, "choosing ended jobs"));
    sqlite3_bind_double(q.get(), 1, jobs_before);
    int64_t array = -1;
    std::vector<int64_t> group;
    auto flush = [&] {
      if (group.empty()) return;
      if (!keep.contains(array == 0 ? group[0] : array)) {
        bool kept = false;
        for (int64_t id : group) kept = kept || keep.contains(id);
        if (!kept) gone.insert(gone.end(), group.begin(), group.end());
      }
      group.clear();
    };
    int rc;
    while ((rc = sqlite3_step(q.get())) == SQLITE_ROW) {
      const int64_t id = sqlite3_column_int64(q.get(), 0), a = sqlite3_column_int64(q.get(), 1);
      if (a == 0 || a != array) {
        flush();
        if (gone.size() >= max_jobs) break;
      }
      array = a;
      group.push_back(id);
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
      return rollback(sql::SqlError(db_, "choosing ended jobs"));
    if (gone.size() < max_jobs) flush();
  }
  for (const char* sql :
       {"DELETE FROM events WHERE job_id = ?1", "DELETE FROM jobs WHERE id = ?1"}) {
    sql::Stmt del(db_, sql);
    if (!del.ok()) return rollback(sql::SqlError(db_, "removing ended jobs"));
    for (int64_t id : gone) {
      sqlite3_bind_int64(del.get(), 1, id);
      if (sqlite3_step(del.get()) != SQLITE_DONE)
        return rollback(sql::SqlError(db_, "removing ended jobs"));
      sqlite3_reset(del.get());
    }
  }
  if (absl::Status st = Commit(); !st.ok()) return rollback(st);
  return gone;
}

absl::StatusOr<int64_t> Store::PurgeEnvironments(double before, size_t max_jobs) {
  if (before <= 0 || max_jobs == 0) return 0;
  std::lock_guard lock(mu_);
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  // Tasks of an array other than the first have no spec of their own ('').
  sql::Stmt q(db_,
              fmt::format("UPDATE jobs SET spec = json_remove(spec, '$.env') WHERE id IN (SELECT "
                          "id FROM jobs j WHERE j.{0} AND j.ended_at < ?1 AND (CASE WHEN "
                          "json_valid(j.spec) THEN json_type(j.spec, '$.env') END) IS NOT NULL "
                          "AND (j.array_id = 0 OR NOT EXISTS (SELECT 1 FROM jobs t WHERE "
                          "t.array_id = j.array_id AND t.{1})) LIMIT ?2)",
                          kEnded, kLive));
  if (!q.ok() || (sqlite3_bind_double(q.get(), 1, before),
                  sqlite3_bind_int64(q.get(), 2, static_cast<int64_t>(max_jobs)),
                  sqlite3_step(q.get())) != SQLITE_DONE) {
    const absl::Status st = sql::SqlError(db_, "dropping stored environments");
    (void)Exec("ROLLBACK");
    return st;
  }
  const int64_t n = sqlite3_changes(db_);
  if (absl::Status st = Commit(); !st.ok()) {
    (void)Exec("ROLLBACK");
    return st;
  }
  return n;
}

absl::StatusOr<std::vector<Store::Ended>> Store::EndedAfter(Ended after, double before,
                                                            size_t limit) {
  ReadLease lease(*this);
  sqlite3* db = lease.db();
  sql::Stmt q(db,
              fmt::format("SELECT id, ended_at FROM jobs WHERE {} AND (ended_at, id) > (?1, ?2) "
                          "AND ended_at < ?3 ORDER BY ended_at, id LIMIT ?4",
                          kEnded));
  if (!q.ok()) return sql::SqlError(db, "listing ended jobs");
  sqlite3_bind_double(q.get(), 1, after.ended_at);
  sqlite3_bind_int64(q.get(), 2, after.id);
  sqlite3_bind_double(q.get(), 3, before);
  sqlite3_bind_int64(q.get(), 4, static_cast<int64_t>(limit));
  std::vector<Ended> out;
  int rc;
  while ((rc = sqlite3_step(q.get())) == SQLITE_ROW)
    out.push_back({sqlite3_column_int64(q.get(), 0), sqlite3_column_double(q.get(), 1)});
  if (rc != SQLITE_DONE) return sql::SqlError(db, "listing ended jobs");
  return out;
}

}  // namespace tessera::server
