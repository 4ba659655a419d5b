// The job store: durable inserts, allowed and refused transitions with events, reopening, bad
// files.
#include "tessera/server/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "fmt/format.h"
#include "tessera/server/acct.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

std::string TempDb(const std::string& name) {
  std::string dir = ::testing::TempDir() + "store-test-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  return path;
}

JobRecord Job(const std::string& name, int priority = 0) {
  JobRecord r;
  r.name = name;
  r.owner_uid = 1000;
  r.owner = "alice";
  r.spec_json = R"({"command":["sleep","1"]})";
  r.priority = priority;
  return r;
}

TEST(Store, DatabaseAndItsWalAreTheServersAlone) {
  std::string path = TempDb("private.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Insert(Job("secret-env"), 1).ok());  // the WAL exists now
  for (const std::string& f : {path, path + "-wal"}) {
    ASSERT_TRUE(std::filesystem::exists(f)) << f;
    auto mode = std::filesystem::status(f).permissions() & std::filesystem::perms::all;
    EXPECT_EQ(mode, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write) << f;
  }
  // A database an older server left readable by all is tightened at open.
  store->reset();
  std::filesystem::permissions(path, std::filesystem::perms(0644));
  ASSERT_TRUE(Store::Open(path).ok());
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

// A database file removed (or replaced) under a running server: writes are refused as unavailable,
// naming the file, instead of acknowledged into a file nobody will read again.
TEST(Store, AWriteToADatabaseFileThatVanishedIsRefused) {
  const std::string path = TempDb("vanishing.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto first = (*store)->Insert(Job("before"), 1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(std::rename(path.c_str(), (path + ".moved").c_str()), 0);
  auto lost = (*store)->Insert(Job("after"), 2);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(lost.status().message()),
              HasSubstr("the database file " + path + " was removed or replaced"));
  EXPECT_FALSE((*store)->Transition(*first, JobState::kRunning, "x", 3, {}).ok());
  // A new file in its place is not the one opened either.
  ASSERT_TRUE(std::filesystem::copy_file(path + ".moved", path));
  EXPECT_FALSE((*store)->Insert(Job("after"), 4).ok());
}

// The same for its write-ahead log (issue 51: removing tessera.db-wal went unnoticed; submits got
// 201 and a kill -9 then lost them all).
TEST(Store, AWriteAfterTheWriteAheadLogVanishedIsRefused) {
  const std::string path = TempDb("vanishing-wal.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Insert(Job("before"), 1).ok());
  ASSERT_TRUE((*store)->Insert(Job("seen"), 2).ok()) << "the log is known by now";
  ASSERT_TRUE(std::filesystem::exists(path + "-wal"));
  ASSERT_TRUE(std::filesystem::remove(path + "-wal"));
  auto lost = (*store)->Insert(Job("after"), 3);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(lost.status().message()),
              HasSubstr("write-ahead log " + path + "-wal was removed or replaced"));
}

// A job cancelled while queued ends then: accounting counts ends by their time (it counted 0
// cancelled jobs while 3 were).
TEST(Store, AJobCancelledWhileQueuedHasAnEndTime) {
  auto store = Store::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  auto one = (*store)->Insert(Job("a"), 10), two = (*store)->Insert(Job("b"), 10);
  ASSERT_TRUE(one.ok() && two.ok());
  ASSERT_TRUE((*store)->Transition(*one, JobState::kCancelled, "cancelled by alice", 20).ok());
  ASSERT_TRUE(
      (*store)->TransitionMany({*two}, JobState::kCancelled, "cancelled by alice", 30).ok());
  EXPECT_EQ((*store)->Get(*one)->ended_at, 20);
  EXPECT_EQ((*store)->Get(*two)->ended_at, 30);
}

TEST(Store, InsertedJobsSurviveReopening) {
  std::string path = TempDb("jobs.db");
  int64_t id;
  {
    auto store = Store::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto inserted = (*store)->Insert(Job("train", 5), 100.0);
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    id = *inserted;
    ASSERT_TRUE((*store)
                    ->Transition(id, JobState::kRunning, "placed on GPU 0", 101.0,
                                 {.started_at = 101.0,
                                  .placement_json = R"({"gpus":[0]})",
                                  .pid = 4242,
                                  .pid_start_time = 777})
                    .ok());
  }
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto job = (*store)->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name, "train");
  EXPECT_EQ(job->owner, "alice");
  EXPECT_EQ(job->priority, 5);
  EXPECT_EQ(job->state, JobState::kRunning);
  EXPECT_EQ(job->started_at, 101.0);
  EXPECT_EQ(job->pid, 4242);
  EXPECT_EQ(job->pid_start_time, 777u);
  EXPECT_EQ(job->placement_json, R"({"gpus":[0]})");
  EXPECT_EQ(job->reason, "placed on GPU 0");
  auto events = (*store)->Events(id);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].state, JobState::kQueued);
  EXPECT_EQ((*events)[1].state, JobState::kRunning);
  EXPECT_EQ((*events)[1].at, 101.0);
}

TEST(Store, AVersionOneDatabaseIsMigratedKeepingItsJobs) {
  std::string path = TempDb("v1.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    // The schema as version 1 made it.
    ASSERT_EQ(sqlite3_exec(
                  db,
                  "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, "
                  "owner_uid INTEGER NOT NULL, owner TEXT NOT NULL, spec TEXT NOT NULL, "
                  "priority INTEGER NOT NULL, state TEXT NOT NULL, submitted_at REAL NOT NULL, "
                  "started_at REAL, ended_at REAL, exit_code INTEGER, placement TEXT NOT NULL "
                  "DEFAULT '', pid INTEGER NOT NULL DEFAULT 0, pid_start_time INTEGER NOT NULL "
                  "DEFAULT 0, reason TEXT NOT NULL DEFAULT '');"
                  "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT "
                  "NULL REFERENCES jobs(id), at REAL NOT NULL, state TEXT NOT NULL, reason TEXT "
                  "NOT NULL);"
                  "INSERT INTO jobs (name, owner_uid, owner, spec, priority, state, submitted_at) "
                  "VALUES ('old', 1000, 'alice', '{}', 0, 'queued', 5);"
                  "PRAGMA user_version=1;",
                  nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto old = (*store)->Get(1);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->name, "old");
  EXPECT_EQ(old->usage_json, "");
  ASSERT_TRUE((*store)
                  ->Transition(1, JobState::kRunning, "placed", 6,
                               {.usage_json = std::string(R"({"cpu_seconds":1.5})")})
                  .ok());
  EXPECT_EQ((*store)->Get(1)->usage_json, R"({"cpu_seconds":1.5})");
  EXPECT_FALSE((*store)->Get(1)->held);
  EXPECT_EQ((*store)->Get(1)->array_id, 0) << "not an array's task";
}

TEST(Store, ARepeatedIdempotencyKeyGivesTheSameJob) {
  auto store = Store::Open(TempDb("idem.db"));
  ASSERT_TRUE(store.ok()) << store.status();
  JobRecord r = Job("train");
  r.idempotency_key = "k-1";
  bool existed = true;
  auto first = (*store)->Insert(r, 1.0, &existed);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(existed);
  auto again = (*store)->Insert(r, 2.0, &existed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(existed);
  EXPECT_EQ(*again, *first);
  EXPECT_EQ((*store)->List()->size(), 1u) << "stored once";
  // Keys are per owner, and no key is no deduplication.
  r.owner = "bob";
  EXPECT_NE(*(*store)->Insert(r, 3.0, &existed), *first);
  EXPECT_FALSE(existed);
  r.idempotency_key.clear();
  EXPECT_NE(*(*store)->Insert(r, 4.0), *(*store)->Insert(r, 5.0));
  EXPECT_EQ((*store)->Get(*first)->idempotency_key, "k-1");
}

TEST(Store, InsertsFromManyThreadsAreEachStoredOnceWithTheirEvent) {
  auto store = Store::Open(TempDb("many.db"));
  ASSERT_TRUE(store.ok()) << store.status();
  constexpr int kThreads = 8, kEach = 50;
  std::vector<std::vector<int64_t>> ids(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        JobRecord r = Job(fmt::format("t{}-{}", t, i));
        // Every thread also repeats one key that all threads share: one job for it in all.
        if (i == 0) r.idempotency_key = "shared";
        auto id = (*store)->Insert(r, t * 1000 + i);
        ASSERT_TRUE(id.ok()) << id.status();
        ids[t].push_back(*id);
      }
    });
  }
  for (auto& t : ts) t.join();
  std::set<int64_t> distinct;
  std::set<int64_t> shared;
  for (int t = 0; t < kThreads; ++t) {
    shared.insert(ids[t][0]);
    for (int i = 1; i < kEach; ++i) distinct.insert(ids[t][i]);
  }
  EXPECT_EQ(distinct.size(), size_t{kThreads * (kEach - 1)}) << "no id given twice";
  EXPECT_EQ(shared.size(), 1u) << "the shared key made one job";
  auto all = (*store)->List();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), distinct.size() + 1);
  for (const JobRecord& r : *all) {
    auto events = (*store)->Events(r.id);
    ASSERT_TRUE(events.ok());
    EXPECT_EQ(events->size(), 1u) << "job " << r.id << " has its submitted event";
  }
}

TEST(Store, RefusedTransitionChangesNothing) {
  auto store = Store::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  int64_t id = *(*store)->Insert(Job("a"), 1);
  absl::Status st = (*store)->Transition(id, JobState::kSucceeded, "done?", 2, {.exit_code = 0});
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("cannot go from queued to succeeded"));
  auto job = (*store)->Get(id);
  EXPECT_EQ(job->state, JobState::kQueued);
  EXPECT_FALSE(job->exit_code.has_value());
  EXPECT_EQ((*store)->Events(id)->size(), 1u);
  EXPECT_EQ((*store)->Transition(999, JobState::kRunning, "", 2).code(),
            absl::StatusCode::kNotFound);
}

TEST(Store, LifecycleWithPreemptionAndRequeue) {
  auto store = Store::Open(":memory:");
  ASSERT_TRUE(store.ok());
  int64_t id = *(*store)->Insert(Job("a"), 1);
  Store& s = **store;
  ASSERT_TRUE(s.Transition(id, JobState::kRunning, "started", 2).ok());
  ASSERT_TRUE(s.Transition(id, JobState::kPreempted, "preempted by job 7", 3).ok());
  ASSERT_TRUE(s.Transition(id, JobState::kQueued, "re-queued", 3).ok());
  ASSERT_TRUE(s.Transition(id, JobState::kRunning, "started", 4).ok());
  ASSERT_TRUE(
      s.Transition(id, JobState::kSucceeded, "exit 0", 9, {.ended_at = 9.0, .exit_code = 0}).ok());
  EXPECT_FALSE(s.Transition(id, JobState::kCancelled, "too late", 10).ok()) << "terminal";
  auto job = s.Get(id);
  EXPECT_EQ(job->exit_code, 0);
  EXPECT_EQ(job->ended_at, 9.0);
  EXPECT_EQ(s.Events(id)->size(), 6u);
}

// A job read with its events is one moment of it: while a writer preempts and re-queues it over
// and over (two events in one transaction), every read's state is its last event's (reading the
// row and then the events apart, as GET /v1/jobs/ID did, showed "running" with "preempted",
// "queued" after it about once in 25 reads here).
TEST(Store, AJobReadWithItsEventsIsOneMomentOfIt) {
  const std::string path = TempDb("snapshot.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  const int64_t id = *s.Insert(Job("a"), 1);
  std::atomic<bool> done = false;
  std::thread writer([&] {
    for (int i = 0; i < 300; ++i) {
      const double at = 2 + i;
      if (!s.Transition(id, JobState::kRunning, "started", at).ok()) break;
      if (!s.Transition(id, JobState::kPreempted, "preempted", at, {.requeue = "re-queued"}).ok())
        break;
    }
    done = true;
  });
  int reads = 0, mismatched = 0;
  std::string first_mismatch;
  while (!done || reads == 0) {
    std::vector<JobEvent> events;
    auto job = s.Get(id, &events);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_FALSE(events.empty());
    ++reads;
    if (events.back().state != job->state) {
      if (mismatched++ == 0)
        first_mismatch = fmt::format("{} with {} events, the last {}", JobStateName(job->state),
                                     events.size(), JobStateName(events.back().state));
    }
  }
  writer.join();
  EXPECT_EQ(mismatched, 0) << "of " << reads << " reads; the first: " << first_mismatch;
  std::vector<JobEvent> events;
  ASSERT_TRUE(s.Get(id, &events).ok());
  EXPECT_EQ(events.size(), 1u + 3 * 300) << "every transition's event";
  EXPECT_EQ(s.Get(999, &events).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

// A preemption and its re-queue are one transaction: no crash between them leaves a job that was
// to run again preempted for good. All or none: a re-queue not allowed undoes the first step too.
TEST(Store, APreemptionAndItsRequeueAreOneTransaction) {
  auto store = Store::Open(":memory:");
  ASSERT_TRUE(store.ok());
  Store& s = **store;
  int64_t id = *s.Insert(Job("a"), 1);
  ASSERT_TRUE(s.Transition(id, JobState::kRunning, "started", 2).ok());
  ASSERT_TRUE(
      s.Transition(
           id, JobState::kPreempted, "its trial is over", 3,
           {.ended_at = 3.0, .spec_json = R"({"command": ["sized"]})", .requeue = "re-queued"})
          .ok());
  auto job = s.Get(id);
  EXPECT_EQ(job->state, JobState::kQueued);
  EXPECT_EQ(job->spec_json, R"({"command": ["sized"]})");
  auto events = *s.Events(id);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].state, JobState::kPreempted);
  EXPECT_EQ(events[2].reason, "its trial is over");
  EXPECT_EQ(events[3].state, JobState::kQueued);
  EXPECT_EQ(events[3].reason, "re-queued");
  ASSERT_TRUE(s.Transition(id, JobState::kRunning, "started", 4).ok());
  absl::Status st =
      s.Transition(id, JobState::kSucceeded, "exit 0", 5, {.exit_code = 0, .requeue = "again?"});
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  job = s.Get(id);
  EXPECT_EQ(job->state, JobState::kRunning) << "the first step was undone with the second";
  EXPECT_FALSE(job->exit_code.has_value());
  EXPECT_EQ(s.Events(id)->size(), 5u);
}

TEST(Store, ARunningJobsNewPlacementIsStoredWithItsEvent) {
  auto store = Store::Open(":memory:");
  ASSERT_TRUE(store.ok());
  Store& s = **store;
  int64_t id = *s.Insert(Job("a"), 1);
  // Queued: no placement to change, nothing recorded.
  absl::Status st = s.SetPlacement(id, R"({"gpus":[]})", 0, "placed on GPU 0,1", 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_EQ(s.Events(id)->size(), 1u);
  ASSERT_TRUE(
      s.Transition(id, JobState::kRunning, "placed on GPU 0", 2,
                   {.started_at = 2.0, .placement_json = R"({"gpus":[{"index":0}]})", .pid = 42})
          .ok());
  ASSERT_TRUE(s.SetPlacement(id, R"({"gpus":[{"index":0},{"index":1}]})", 0,
                             "placed on GPU 0,1 (resized from 1 to 2 GPUs, restart 1)", 3)
                  .ok());
  auto job = s.Get(id);
  EXPECT_EQ(job->state, JobState::kRunning);
  EXPECT_EQ(job->placement_json, R"({"gpus":[{"index":0},{"index":1}]})");
  EXPECT_EQ(job->pid, 0) << "its new process is not known yet";
  EXPECT_EQ(job->started_at, 2) << "the same run";
  auto events = *s.Events(id);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2].state, JobState::kRunning);
  EXPECT_EQ(events[2].reason, "placed on GPU 0,1 (resized from 1 to 2 GPUs, restart 1)");
  EXPECT_EQ(events[2].at, 3);
  // Accounting reads it as the same run, not a second start.
  auto acct = AcctJobs(s, 0, 100);
  ASSERT_TRUE(acct.ok()) << acct.status();
  ASSERT_EQ(acct->size(), 1u);
  ASSERT_EQ((*acct)[0].runs.size(), 1u);
  EXPECT_EQ((*acct)[0].runs[0].start, 2);
}

TEST(Store, ListsByStateOldestFirst) {
  auto store = Store::Open(":memory:");
  ASSERT_TRUE(store.ok());
  Store& s = **store;
  int64_t a = *s.Insert(Job("a"), 1), b = *s.Insert(Job("b"), 2), c = *s.Insert(Job("c"), 3);
  ASSERT_TRUE(s.Transition(b, JobState::kRunning, "", 4).ok());
  auto queued = s.List({JobState::kQueued});
  ASSERT_TRUE(queued.ok());
  ASSERT_EQ(queued->size(), 2u);
  EXPECT_EQ((*queued)[0].id, a);
  EXPECT_EQ((*queued)[1].id, c);
  EXPECT_EQ(s.List()->size(), 3u);
  EXPECT_EQ(s.List({}, 1)->size(), 1u);
}

TEST(Store, RefusesFilesThatAreNotItsOwn) {
  std::string junk = TempDb("junk.db");
  std::ofstream(junk) << "this is not a database, just text that is long enough to be a header....";
  auto bad = Store::Open(junk);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("not a usable database"));

  // Someone else's database: tables but no Tessera schema version.
  std::string foreign = TempDb("foreign.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto f = Store::Open(foreign);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("database of something else"));
}

TEST(Store, RefusesANewerSchema) {
  std::string path = TempDb("newer.db");
  {
    auto s = Store::Open(path);
    ASSERT_TRUE(s.ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto s = Store::Open(path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("schema version 99, newer"));
}

TEST(Store, KilledWriterLosesNothingItAcknowledged) {
  // A child inserts and transitions jobs as fast as it can and reports each id once Insert
  // returned; it is killed with SIGKILL mid-stream. Every reported job must be there after
  // reopening.
  std::string path = TempDb("kill.db");
  { ASSERT_TRUE(Store::Open(path).ok()); }
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    auto store = Store::Open(path);
    if (!store.ok()) _exit(1);
    for (int i = 0;; ++i) {
      auto id = (*store)->Insert(Job("j" + std::to_string(i)), i);
      if (!id.ok()) _exit(2);
      (void)(*store)->Transition(*id, JobState::kRunning, "started", i);
      if (write(fds[1], &*id, sizeof(int64_t)) != sizeof(int64_t)) _exit(3);
    }
  }
  close(fds[1]);
  std::vector<int64_t> acknowledged;
  int64_t id;
  while (acknowledged.size() < 40 && read(fds[0], &id, sizeof id) == sizeof id)
    acknowledged.push_back(id);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  while (read(fds[0], &id, sizeof id) == sizeof id) acknowledged.push_back(id);
  close(fds[0]);
  ASSERT_GE(acknowledged.size(), 40u);
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int64_t a : acknowledged) {
    auto job = (*store)->Get(a);
    ASSERT_TRUE(job.ok()) << "job " << a << " was acknowledged but is gone";
  }
  auto all = (*store)->List();
  ASSERT_TRUE(all.ok());
  EXPECT_GE(all->size(), acknowledged.size());
}

TEST(Store, AnArrayIsOneSpecAndARowPerTaskInOneTransaction) {
  std::string path = TempDb("array.db");
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Insert(Job("before"), 1).ok());
  JobRecord a = Job("sweep");
  a.held = true;
  auto first = (*store)->InsertArray(a, {0, 5, 10}, 2);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 2);
  for (int i = 0; i < 3; ++i) {
    auto t = (*store)->Get(*first + i);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->array_id, *first);
    EXPECT_EQ(t->array_index, i * 5);
    EXPECT_EQ(t->spec_json, a.spec_json) << "read from the array's first row";
    EXPECT_TRUE(t->held);
    EXPECT_EQ((*store)->Events(*first + i)->size(), 1u) << "its submission";
  }
  EXPECT_EQ(*(*store)->TaskId(*first, 10), *first + 2);
  EXPECT_EQ((*store)->TaskId(*first, 3).status().code(), absl::StatusCode::kNotFound);
  auto tasks = (*store)->Tasks(*first);
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 3u);
  EXPECT_EQ((*tasks)[2].index, 10);
  // Stored once: the other tasks' rows have no spec of their own.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT count(*) FROM jobs WHERE spec != ''", -1, &s, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(s, 0), 2) << "the plain job's and the array's first task's";
  sqlite3_finalize(s);
  sqlite3_close(db);
  // A later job follows the array's ids.
  EXPECT_EQ(*(*store)->Insert(Job("after"), 3), *first + 3);
}

TEST(Store, HoldAndManyTransitionsAreAllOrNothing) {
  auto store = Store::Open(":memory:");
  ASSERT_TRUE(store.ok());
  const int64_t a = *(*store)->Insert(Job("a"), 1);
  const int64_t b = *(*store)->Insert(Job("b"), 1);
  ASSERT_TRUE((*store)->Transition(b, JobState::kRunning, "placed", 2).ok());
  absl::Status st = (*store)->SetHeld({a, b}, true, "held by alice", 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr(fmt::format("job {}: not queued", b)));
  EXPECT_FALSE((*store)->Get(a)->held) << "nothing changed";
  ASSERT_TRUE((*store)->SetHeld({a}, true, "held by alice", 3).ok());
  EXPECT_TRUE((*store)->Get(a)->held);
  EXPECT_EQ((*store)->Events(a)->back().reason, "held by alice");
  st = (*store)->TransitionMany({a, b}, JobState::kQueued, "back", 4);
  EXPECT_FALSE(st.ok()) << "a is queued already";
  EXPECT_EQ((*store)->Get(b)->state, JobState::kRunning) << "nothing changed";
  ASSERT_TRUE((*store)->TransitionMany({a}, JobState::kCancelled, "cancelled by alice", 5).ok());
  EXPECT_EQ((*store)->Get(a)->state, JobState::kCancelled);
}

TEST(Store, AcctReadsEveryJobOfThePeriodWithItsEvents) {
  auto store = Store::Open(":memory:");
  ASSERT_TRUE(store.ok());
  const int64_t old = *(*store)->Insert(Job("old"), 1);
  ASSERT_TRUE((*store)->Transition(old, JobState::kCancelled, "x", 2, {.ended_at = 2.0}).ok());
  const int64_t ran = *(*store)->Insert(Job("ran"), 10);
  ASSERT_TRUE((*store)->Transition(ran, JobState::kRunning, "placed", 11).ok());
  const int64_t later = *(*store)->Insert(Job("later"), 100);
  auto jobs = (*store)->ListPeriod(5, 50);
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u) << "ended before, or submitted after, the period: left out";
  EXPECT_EQ((*jobs)[0].id, ran);
  auto events = (*store)->EventsOfPeriod(5, 50);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].state, JobState::kRunning);
  EXPECT_EQ((*events)[1].at, 11);
  (void)later;
}

TEST(Store, StateNamesRoundTrip) {
  for (JobState st :
       {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed,
        JobState::kCancelled, JobState::kPreempted, JobState::kLost}) {
    EXPECT_EQ(ParseJobState(JobStateName(st)), st);
  }
  EXPECT_FALSE(ParseJobState("paused").has_value());
}

}  // namespace
}  // namespace tessera::server

namespace tessera::server {
namespace {

// What the dashboard's event stream reads: every job's events in order after a point, each with
// its number; the history's samples, pruned to their window; a queued job's priority change.
TEST(Store, EventsAfterASeqAndTheHistorysWindow) {
  auto store = Store::Open(TempDb("stream.db"));
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  int changes = 0;
  s.set_on_change([&] { ++changes; });
  EXPECT_EQ(*s.LastEventSeq(), 0);
  auto a = s.Insert(Job("a"), 10);
  auto b = s.Insert(Job("b"), 11);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(s.Transition(*a, JobState::kRunning, "placed", 12).ok());
  EXPECT_EQ(changes, 3);  // each insert and the transition committed
  auto all = s.EventsAfter(0, 10);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].job_id, *a);
  EXPECT_EQ((*all)[1].job_id, *b);
  EXPECT_EQ((*all)[2].state, JobState::kRunning);
  EXPECT_EQ((*all)[2].reason, "placed");
  EXPECT_LT((*all)[0].seq, (*all)[1].seq);
  EXPECT_EQ(*s.LastEventSeq(), (*all)[2].seq);
  auto rest = s.EventsAfter((*all)[0].seq, 1);  // at most one, from after the first
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ(rest->size(), 1u);
  EXPECT_EQ((*rest)[0].seq, (*all)[1].seq);

  // A priority change: only while queued, with its event.
  ASSERT_TRUE(s.SetPriority(*b, 7, "priority 0 -> 7 by alice", 13).ok());
  EXPECT_EQ(s.Get(*b)->priority, 7);
  EXPECT_EQ(s.Events(*b)->back().reason, "priority 0 -> 7 by alice");
  absl::Status running = s.SetPriority(*a, 7, "x", 14);
  EXPECT_EQ(running.code(), absl::StatusCode::kFailedPrecondition) << running;
  EXPECT_EQ(s.Get(*a)->priority, 0);

  // Samples: kept from their window on, oldest first; adding one is no job's change.
  const int before = changes;
  ASSERT_TRUE(s.AddSample({100, R"({"n":1})"}, 0).ok());
  ASSERT_TRUE(s.AddSample({130, R"({"n":2})"}, 70).ok());
  ASSERT_TRUE(s.AddSample({170, R"({"n":3})"}, 110).ok());  // drops the one at 100
  EXPECT_EQ(changes, before);
  auto samples = s.Samples(0);
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_EQ((*samples)[0].at, 130);
  EXPECT_EQ((*samples)[1].data, R"({"n":3})");
  EXPECT_EQ(s.Samples(150)->size(), 1u);
}

// Retention works in pages: every ended job is met once across pages of 2, ties of end time
// included, queued and running ones never; environments go at most a page at a time.
TEST(Store, RetentionPagesMeetEachEndedJobOnceAndStopAtTheirLimit) {
  auto store = Store::Open(TempDb("retention-pages.db"));
  ASSERT_TRUE(store.ok()) << store.status();
  Store& s = **store;
  std::set<int64_t> ended;
  for (int i = 0; i < 7; ++i) {
    JobRecord r = Job("j");
    r.spec_json = R"({"command":["true"],"env":{"K":"v"}})";
    auto id = s.Insert(r, 1);
    ASSERT_TRUE(id.ok());
    if (i == 6) continue;  // stays queued
    ASSERT_TRUE(s.Transition(*id, JobState::kRunning, "", 2, {.started_at = 2.0}).ok());
    if (i == 5) continue;                       // stays running
    const double at = i < 3 ? 10.0 : 20.0 + i;  // three end at the same moment
    ASSERT_TRUE(s.Transition(*id, JobState::kSucceeded, "", at, {.ended_at = at}).ok());
    ended.insert(*id);
  }
  std::multiset<int64_t> seen;
  Store::Ended after;
  for (int page = 0; page < 10; ++page) {
    auto got = s.EndedAfter(after, 1000, 2);
    ASSERT_TRUE(got.ok()) << got.status();
    for (const Store::Ended& e : *got) seen.insert(e.id);
    if (got->empty()) break;
    after = got->back();
  }
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()), ended);
  EXPECT_EQ(seen.size(), ended.size()) << "none twice";
  auto some = s.PurgeEnvironments(1000, 3);
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(*some, 3);
  auto rest = s.PurgeEnvironments(1000, 3);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(*rest, 2) << "the ended ones left, not the running or queued";
  EXPECT_EQ(*s.PurgeEnvironments(1000, 3), 0);
}

}  // namespace
}  // namespace tessera::server
