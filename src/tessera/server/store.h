#pragma once
// The standalone server's durable state: jobs and the events of their lives, in SQLite (WAL mode,
// synchronous=FULL, so a job is on disk when Insert returns). Every state change is a transaction
// that checks the transition is allowed and records an event with its reason. Schema versioned and
// migrated on open. Thread-safe: one writing connection guarded by a mutex (the server's writes are
// few and small), and a few reading connections lent one per read (ReadLease).

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

struct sqlite3;

namespace tessera::server {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled, kPreempted, kLost };
std::string_view JobStateName(JobState s);
std::optional<JobState> ParseJobState(std::string_view name);
bool IsTerminal(JobState s);
// queued -> running | cancelled; running -> succeeded | failed | cancelled | preempted | lost;
// preempted -> queued (re-queued) | cancelled; lost -> queued (re-queued after a restart).
bool TransitionAllowed(JobState from, JobState to);

struct JobRecord {
  int64_t id = 0;
  std::string name;
  uint32_t owner_uid = 0;
  std::string owner;      // user name (or "uid:1234")
  std::string spec_json;  // the accepted request: command, env, resources... (validated upstream)
  int priority = 0;
  JobState state = JobState::kQueued;
  double submitted_at = 0;  // seconds since the epoch
  std::optional<double> started_at, ended_at;
  std::optional<int> exit_code;
  std::string placement_json;   // devices given, when running
  int64_t pid = 0;              // process group leader while running
  uint64_t pid_start_time = 0;  // to tell a reused pid after a restart
  std::string reason;           // of the last transition
  // What it used, as JSON ({"cpu_seconds", "peak_memory_bytes", "oom_kills"}); empty: not known.
  std::string usage_json;
  // The client's key for the submission (Insert answers a repeated key with the job it made).
  std::string idempotency_key;
  bool held = false;  // queued, not to be started until released
  // A task of an array: the array's id (its first task's) and this task's index. The array's spec
  // is stored once, in its first task's row; the others' spec_json is read from there.
  int64_t array_id = 0;
  int array_index = -1;
};

struct JobEvent {
  int64_t job_id = 0;
  double at = 0;
  JobState state = JobState::kQueued;
  std::string reason;
  int64_t seq = 0;  // its place among every job's events (the resume point of an event stream)
};

// One point of the machine's recent history (what the dashboard charts), as the caller's JSON.
struct Sample {
  double at = 0;
  std::string data;
};

// What a transition may set besides the state.
struct TransitionFields {
  std::optional<double> started_at, ended_at;
  std::optional<int> exit_code;
  std::optional<std::string> placement_json;
  std::optional<int64_t> pid;
  std::optional<uint64_t> pid_start_time;
  std::optional<std::string> usage_json;
  std::optional<std::string> spec_json;  // its spec anew (a job re-queued sized differently)
  // Then queued again, with this reason, in the same transaction (a job preempted and re-queued:
  // no crash between the two leaves it preempted for good).
  std::optional<std::string> requeue;
};

class Store {
 public:
  // Opens (creating if needed) the database at `path` (":memory:" for tests). kInvalidArgument for
  // a file that is not a Tessera store or is of a newer schema; kInternal for SQLite failures.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Stores a new queued job (ignoring record.id/state) and its first event; returns its id. Durable
  // when it returns. A record with an idempotency key its owner used before stores nothing: the
  // earlier job's id is returned and *existed says so. Inserts from several threads at once are
  // committed together (one transaction, one fsync, at most max_batch jobs).
  absl::StatusOr<int64_t> Insert(const JobRecord& record, double now, bool* existed = nullptr);
  // Stores the tasks of an array, one per index, in one transaction: ids consecutive, the first
  // task's id is the array's and its row alone holds the spec. Returns the array's id (with
  // *existed, the earlier array of a repeated idempotency key).
  absl::StatusOr<int64_t> InsertArray(const JobRecord& record, const std::vector<int>& indices,
                                      double now, bool* existed = nullptr);
  // 1: every insert its own transaction (for comparison in benchmarks).
  void set_max_batch(size_t n) { max_batch_ = n < 1 ? 1 : n; }
  // Moves a job to `to`, with the reason and fields; kNotFound, or kFailedPrecondition naming both
  // states when the transition is not allowed. Nothing changes on failure.
  absl::Status Transition(int64_t id, JobState to, std::string_view reason, double now,
                          const TransitionFields& fields = {});
  // The same transition for many jobs in one transaction, all or none.
  absl::Status TransitionMany(const std::vector<int64_t>& ids, JobState to, std::string_view reason,
                              double now);
  // Holds (or releases) queued jobs, with an event each, in one transaction; kFailedPrecondition
  // naming a job that is not queued (nothing changes then).
  absl::Status SetHeld(const std::vector<int64_t>& ids, bool held, std::string_view reason,
                       double now);
  // The task of array `array_id` with index `index`; kNotFound when there is none.
  // A queued job's new priority, with an event saying why; kFailedPrecondition when it is not
  // queued.
  absl::Status SetPriority(int64_t id, int priority, std::string_view reason, double now);
  absl::StatusOr<int64_t> TaskId(int64_t array_id, int index);
  // The tasks of an array: id, index and state, in index order (no specs read).
  struct TaskState {
    int64_t id = 0;
    int index = 0;
    JobState state = JobState::kQueued;
    bool held = false;
  };
  absl::StatusOr<std::vector<TaskState>> Tasks(int64_t array_id);
  // Records the process of a running job (started after its transition to running was stored, so a
  // crash in between leaves a running job without a process: lost, never started twice).
  absl::Status SetProcess(int64_t id, int64_t pid, uint64_t start_time);
  // A running job's new placement and process (an elastic job started again on its new size;
  // pid 0: not started yet, as a crash before SetProcess leaves it), with an event of its state
  // (running) saying why, in one transaction. kNotFound when not running.
  absl::Status SetPlacement(int64_t id, std::string_view placement_json, int64_t pid,
                            std::string_view reason, double now);
  // A job; with `events`, its events too, read with the row in one snapshot.
  absl::StatusOr<JobRecord> Get(int64_t id, std::vector<JobEvent>* events = nullptr);
  // Jobs in the given states (all when empty), oldest first, at most `limit` (0 = no limit).
  absl::StatusOr<std::vector<JobRecord>> List(const std::vector<JobState>& states = {},
                                              int limit = 0);
  // Jobs in the given states (all when empty), of `owner` (any when empty), with ids below
  // `before` (0: any), newest first, one at a time to `take` until it returns false: a reader
  // pages through any number of jobs without holding them all. `take` must not call the store.
  absl::Status ForEachNewest(const std::vector<JobState>& states, const std::string& owner,
                             int64_t before, const std::function<bool(JobRecord&&)>& take);
  absl::StatusOr<std::vector<JobEvent>> Events(int64_t id);
  // For accounting: the jobs not ended before `since` nor submitted after `until`, oldest first,
  // without their specs; and their events (state changes, reasons left out), in order.
  absl::StatusOr<std::vector<JobRecord>> ListPeriod(double since, double until);
  absl::StatusOr<std::vector<JobEvent>> EventsOfPeriod(double since, double until);

  // Every job's events after `seq`, in order, at most `limit`: what an event stream sends.
  absl::StatusOr<std::vector<JobEvent>> EventsAfter(int64_t seq, int limit);
  // The newest event's seq (0 when none).
  absl::StatusOr<int64_t> LastEventSeq();

  // The machine's history: a sample is added and those before `drop_before` go, in one
  // transaction (one commit per sample: every few seconds, not per request).
  absl::Status AddSample(const Sample& sample, double drop_before);
  absl::StatusOr<std::vector<Sample>> Samples(double since);

  // Retention (store_retention.cc). Ended jobs (not queued or running) that ended before
  // `jobs_before` go with their events, at most `max_jobs` in one transaction; an array's tasks
  // only all together, once every one has; never a job in `keep` (what waiting jobs depend on) nor
  // an array one of whose tasks is. Their ids are returned. 0: none go.
  absl::StatusOr<std::vector<int64_t>> PurgeEnded(double jobs_before, const std::set<int64_t>& keep,
                                                  size_t max_jobs);
  // The stored environment (spec.env: tokens and keys users' shells had) of at most `max_jobs` jobs
  // that ended before `before` is dropped (an array's once none of its tasks waits or runs).
  // Returns how many.
  absl::StatusOr<int64_t> PurgeEnvironments(double before, size_t max_jobs);
  // The jobs that ended after `after` (by end time, then id) and before `before`, in that order, at
  // most `limit`: pages of what retention removes the logs of, each page's last the next `after`.
  struct Ended {
    int64_t id = 0;
    double ended_at = 0;
  };
  absl::StatusOr<std::vector<Ended>> EndedAfter(Ended after, double before, size_t limit);

  // Called after each commit that changed jobs or their events (under the store's lock: it must
  // be quick and must not call the store).
  void set_on_change(std::function<void()> fn) { on_change_ = std::move(fn); }

  static constexpr int kSchemaVersion = 4;

 private:
  struct PendingInsert {
    const JobRecord* record;
    double now;
    absl::StatusOr<int64_t> result = int64_t{0};
    bool existed = false;
    bool done = false;
  };
  explicit Store(sqlite3* db) : db_(db) {}
  // Unavailable when the database file at path_ is no longer the one opened (removed, replaced):
  // writing on would acknowledge into a file nobody will read again. Checked as each write begins.
  absl::Status CheckFile() const;
  absl::Status Exec(const char* sql);
  absl::Status Commit();  // COMMIT of a change to jobs or events: tells on_change_
  void CommitInserts(const std::vector<PendingInsert*>& batch);  // one transaction
  absl::StatusOr<int64_t> InsertOne(const JobRecord& r, double now, bool* existed);  // under mu_
  // Inside a transaction, under mu_.
  absl::Status TransitionOne(int64_t id, JobState to, std::string_view reason, double now,
                             const TransitionFields& f);
  sqlite3* db_;
  std::string path_;  // empty: in memory
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  // The write-ahead log's (path_-wal), once it exists: removing it loses every write since the
  // last checkpoint at the next crash, while SQLite goes on writing to the unlinked file.
  mutable std::mutex wal_mu_;
  mutable dev_t wal_dev_ = 0;
  mutable ino_t wal_ino_ = 0;
  std::mutex mu_;  // the connection
  // Reads (Get, List, Events) on connections of their own, lent one per read (WAL: readers run
  // at once and never wait for a commit); none in memory (db_'s, under mu_). A listing (`bulk`)
  // leaves the last free one to short reads: a single job's read, and a submit's, never waits
  // behind greedy listings (8 readers of 270 MiB of jobs made submits wait 33 ms on one
  // connection).
  class ReadLease {
   public:
    explicit ReadLease(Store& s, bool bulk = false);
    ~ReadLease();
    ReadLease(const ReadLease&) = delete;
    ReadLease& operator=(const ReadLease&) = delete;
    sqlite3* db() const { return db_; }

   private:
    Store& s_;
    sqlite3* db_ = nullptr;
    std::unique_lock<std::mutex> writer_;  // in memory: the writer's connection
  };
  static constexpr size_t kReaders = 4;
  std::vector<sqlite3*> readers_;
  std::vector<sqlite3*> free_readers_;  // under pool_mu_
  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  // Group commit: inserts waiting, and whether a caller is committing a batch.
  std::mutex group_mu_;
  std::condition_variable group_cv_;
  std::deque<PendingInsert*> pending_;
  bool committing_ = false;
  size_t max_batch_ = 512;
  std::function<void()> on_change_;
};

}  // namespace tessera::server
