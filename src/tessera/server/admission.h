#pragma once
// Admission: the server's waiting room. It holds the jobs queued on this server and decides which
// of them enter the scheduling cycle's queue (sched::Engine) at each pass, and says why each other
// one waits: held, a dependency not yet settled (parked apart until one is), its array's %
// throttle or window, its user at limits.max_running_jobs_per_user, a change being stored. It
// keeps what each user has waiting (jobs and bytes of specs, for the submit caps) and the indexes
// that make a pass cost what changed, not the queue.
//
// What it needs of the rest of the server - how a dependency stands, what runs, the cycle's queue
// - it asks through Admission::World. It does no I/O and takes no lock: it lives in DispatchState,
// called under its lock (admission_test.cc drives it alone against a World of its own).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tessera/server/job_spec.h"

namespace tessera::server {

struct JobRecord;

// A job waiting on this server.
struct QueuedJob {
  int64_t id = 0;
  int priority = 0;
  std::string owner;
  uint32_t uid = 0;
  std::shared_ptr<const JobSpec> spec;  // one for all the tasks of an array
  size_t spec_bytes = 0;                // of the spec as stored (counted once per `spec`)
  double submitted = 0;  // when it was submitted: its place in the queue, kept when re-queued
  double since = 0;      // submitted or re-queued at: the start of its scheduling latency
  bool held = false;     // changed only through Admission::SetHeld once admitted
  int64_t array_id = 0;  // a task of this array (0: none), with its index
  int array_index = -1;
  int throttle = 0;  // its array runs at most this many tasks at once (0: no limit)
  // In the cycle's queue: not held, its dependencies met, room in its array. Otherwise `waiting`
  // says why not. Kept by Admission.
  bool in_cycle = false;
  // The dependencies (their text, "ok:12") it is parked on until one of them is settled. Kept by
  // Admission.
  std::vector<std::string> parked;
  std::string waiting;
  uint64_t waiting_pass = 0;  // the pass that wrote `waiting` (0: none)
  // A cancel, hold, release or priority change to it is being stored: it stays out of the cycle
  // until that is done (Admission::BeginChange, EndChange).
  bool changing = false;

  // A queued job as its stored record says (`spec` parsed from it, shared by an array's tasks).
  static QueuedJob Of(const JobRecord& r, std::shared_ptr<const JobSpec> spec, double since);
};

// What a reader needs to say why a queued job waits without the dispatcher's lock (Views keeps
// them, refreshed as they change: Admission::TakeNoted).
struct WaitingFacts {
  uint32_t uid = 0;
  bool changing = false;  // a change to it is being stored
  bool in_cycle = false;
  bool cappable = false;  // neither held nor parked: its user's cap may be what it waits for
  uint64_t examined = 0;  // the last pass that looked at it (0: none)
  std::string waiting;    // its reason: in the cycle's queue, the cycle's own
};
// The users at limits.max_running_jobs_per_user in a pass, and what their jobs that pass did not
// examine say.
struct CappedUsers {
  uint64_t pass = 0;
  std::map<uint32_t, std::string> users;
  bool operator==(const CappedUsers&) const = default;
};
// Why a queued job waits, from its facts and the users capped in the last pass.
std::string WaitingText(const WaitingFacts& f, const CappedUsers& capped);

// How a dependency stands: not yet settled, met (the outcome it asks), or never to be met.
struct DependencyState {
  enum { kPending, kOk, kNotOk, kMissing } outcome = kPending;
  std::string what;  // "job 5 failed", "every task of array 7 succeeded"
};
// Why `d` can never be met given its state; empty when it is met or pending.
std::string Unmeetable(const Dependency& d, const DependencyState& state);

class Admission {
 public:
  // The rest of the server, as admission sees it.
  class World {
   public:
    virtual ~World() = default;
    // How a dependency stands (the store's record, and whether the job is still active here).
    virtual DependencyState Outcome(const Dependency& d) = 0;
    // Jobs started and not ended: per user (running or being started), per array (running).
    virtual void CountActive(std::map<uint32_t, size_t>& by_user,
                             std::map<int64_t, int>& by_array) = 0;
    // Into the cycle's queue (refused: the reason is the job's `waiting`), and out of it.
    virtual absl::Status EnterCycle(const QueuedJob& q) = 0;
    virtual void LeaveCycle(int64_t id) = 0;
    // Why a job in the cycle's queue waits, in the cycle's words; null when it has none.
    virtual const std::string* CycleWaiting(int64_t id) const = 0;
  };
  struct Limits {
    size_t max_running_per_user = SIZE_MAX;
    // At most this many of one array's tasks wait in the cycle's queue at once (a few passes'
    // starts): more would only take their user's room and the pass's time.
    size_t array_window = SIZE_MAX;
  };
  explicit Admission(Limits limits) : limits_(limits) {}

  // ---- the jobs ----
  // Queues `q` (out of the cycle until the next pass), replacing a job of its id.
  void Add(QueuedJob q);
  // Takes a job out for its start: it leaves with its record.
  QueuedJob Take(int64_t id);
  // A job that leaves for good (cancelled, ended).
  void Erase(int64_t id);
  bool Contains(int64_t id) const { return jobs_.contains(id); }
  // Its record; null when not queued. Change `priority` through it (`waiting` through
  // SetWaiting), never `held`, `in_cycle`, `parked` or what the counts below key on.
  QueuedJob* Find(int64_t id);
  const QueuedJob* Find(int64_t id) const;
  const std::map<int64_t, QueuedJob>& jobs() const { return jobs_; }
  size_t size() const { return jobs_.size(); }
  // What a user has waiting: jobs (each task of an array) and the bytes of their specs (an
  // array's once).
  size_t JobsOf(uint32_t uid) const;
  uint64_t BytesOf(uint32_t uid) const;
  // A job left the server's starting, running or finishing ones: a parked dependency may be
  // settled, and is looked at again at the next pass.
  void NoteLeft() { ++left_; }

  // ---- changes stored outside the dispatcher's lock ----
  // Whether a change to any of `ids` is under way.
  bool AnyChanging(const std::vector<int64_t>& ids) const;
  // Marks those of `ids` still queued as changing and takes them out of the cycle's queue;
  // returns them. None may be changing already (wait on AnyChanging first).
  std::vector<int64_t> BeginChange(const std::vector<int64_t>& ids, World& world);
  // Lets them back (at the next pass); ids no longer queued are skipped.
  void EndChange(const std::vector<int64_t>& ids);
  // Holds or releases a queued job, saying why it waits.
  void SetHeld(int64_t id, bool held, std::string waiting);
  // Says why a queued job (out of the cycle) waits.
  void SetWaiting(int64_t id, std::string waiting);

  // ---- the pass ----
  // Moves the jobs that may now run into the cycle's queue and says why the others wait. Returns
  // the jobs whose dependencies can never be met, with why: marked changing, for the caller to
  // end (EndChange when stored, or to try again).
  std::vector<std::pair<int64_t, std::string>> Admit(World& world);
  // Why a queued job waits (WaitingText of its facts, as now); empty when it is not queued. The
  // server's readers get the same from the views, as of the last publication.
  std::string Waiting(int64_t id, const World& world) const;

  // ---- for a read model (Views) ----
  // What Waiting() is made of for a queued job (nullopt: not queued), and the users capped.
  std::optional<WaitingFacts> FactsOf(int64_t id, const World& world) const;
  const CappedUsers& capped() const { return capped_; }
  // The jobs whose facts may have changed since the last call, each once (some may have left the
  // queue since): a job added, held or released, parked or woken, into or out of the cycle, a
  // change begun or ended, its reason changed, or examined by a pass that then met its user's cap.
  // The cycle's reasons are the cycle's to note (sched::Cycle::TakeNoted).
  std::vector<int64_t> TakeNoted();

 private:
  // Takes `q` out of the counts and indexes (before it leaves jobs_ or is moved from).
  void Forget(const QueuedJob& q);
  void Erase(std::map<int64_t, QueuedJob>::iterator it);
  // Counts `q` into (+1) or out of (-1) the indexes, by where it stands.
  void Index(const QueuedJob& q, int delta);
  void SetInCycle(QueuedJob& q, bool in);
  void Say(QueuedJob& q, std::string waiting);  // sets `waiting`, noting a change
  void Note(int64_t id) { noted_.insert(id); }
  void SetParked(QueuedJob& q, std::vector<std::pair<std::string, Dependency>> on);
  // Wakes the jobs parked on dependencies no longer pending: only when a job has left since the
  // last look, and one look per dependency. `outcomes` is the pass's memo.
  void WakeParked(World& world, std::map<std::string, DependencyState>& outcomes);

  Limits limits_;
  std::map<int64_t, QueuedJob> jobs_;
  std::map<uint32_t, size_t> jobs_by_uid_;
  std::map<uint32_t, uint64_t> bytes_by_uid_;
  std::map<const JobSpec*, size_t> specs_;  // how many queued jobs share each spec
  // Jobs outside the cycle by user (not held, not parked): what a pass looks at.
  std::map<uint32_t, std::set<int64_t>> outside_by_uid_;
  // Parked jobs by the dependency's text: the dependency and its jobs.
  std::map<std::string, std::pair<Dependency, std::set<int64_t>>> parked_;
  std::map<uint32_t, size_t> in_cycle_by_uid_;
  std::map<int64_t, size_t> in_cycle_by_array_;
  // Users at their limit in the last pass, and what their jobs not examined then say.
  CappedUsers capped_;
  std::set<int64_t> noted_;  // TakeNoted's
  uint64_t pass_ = 0;
  uint64_t left_ = 0;                       // jobs that left (here or elsewhere: NoteLeft)
  uint64_t parked_checked_ = ~uint64_t{0};  // left_ at the last WakeParked
};

}  // namespace tessera::server
