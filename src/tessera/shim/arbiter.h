#pragma once
// The GPU time-slice arbiter: how the intercept library paces kernel launches so that jobs sharing
// a GPU get GPU time in proportion to their compute shares, and higher-priority jobs go first. One
// file per machine (TESSERA_CUDA_ARBITER), shared by every job's processes, with one section per
// physical GPU.
//
// Control method (docs/sharing.md has the why): a job launches only while it holds the GPU's lease,
// a time slice. Whoever holds it launches freely; everyone else waits in the launch call. When a
// lease runs out its holder picks the next holder among the jobs waiting: the highest priority
// first, then the lowest virtual time (GPU time charged / share, i.e. weighted fair queueing), and
// before handing over it drains its own queued work (cuCtxSynchronize), so the slice it is charged
// for is the GPU time it really used. A waiting job of higher priority takes the lease at once; a
// waiter also takes it when the holder has gone idle (no launch and no synchronize for a while) or
// did not hand over in time. While a job of higher priority is around, a lower one keeps at most
// one launch in flight, so taking the GPU from it costs at most one of its kernels. Not
// work-conserving (a hard cap): after a slice a job may not launch again before its share of the
// time has passed, even when the GPU is idle. A job on several GPUs (ArbiterConfig::gang_mask)
// gets its slices on all of them at once: it takes its GPUs in ascending order (no deadlock between
// two such jobs), holding the ones it has while it waits for the next (charged: the wait is the
// gang's cost), and once it holds the lower ones it goes first on the next GPU, ending the slice
// of a holder there that is no gang (which hands over at its next launch, after draining its own
// work) - unless it is already ahead there by more than a few of its slices, so the other tenants
// of that GPU keep their shares. Then all its leases end together. No exceptions,
// no allocation after Attach: usable from the intercept library.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tessera::shim {

inline constexpr uint64_t kArbiterMagic = 0x5242524153534554ull;  // "TESSARBR"
inline constexpr uint32_t kArbiterVersion = 6;  // 3: sync_pids; 4: settings; 5: handovers; 6: held
                                                // back
inline constexpr int kArbiterGpus = 16;         // physical GPUs of a machine
inline constexpr int kArbiterJobs = 64;         // jobs per GPU
inline constexpr int kSyncPids = 32;            // processes of a job tracked inside a synchronize

struct ArbiterJob {
  std::atomic<uint64_t> key;  // the job (0: a free slot)
  std::atomic<int32_t> pid;   // a process of the job, to tell a dead slot
  std::atomic<int32_t> priority;
  std::atomic<uint32_t> share;           // permille of GPU time, 1..1000
  std::atomic<uint32_t> capped;          // 1: not work-conserving
  std::atomic<int32_t> in_sync;          // the job's threads inside a synchronize call
  std::atomic<uint32_t> pidns;           // the pid namespace (inode) `pid` is in; 0: not known
  std::atomic<uint64_t> want_us;         // last time the job waited for the GPU
  std::atomic<uint64_t> last_launch_us;  // last launch or synchronize return
  std::atomic<uint64_t> lease_start_us;
  std::atomic<uint64_t> eligible_us;  // capped jobs: may not launch before
  std::atomic<uint64_t> vtime;        // charged GPU time in us * 1000 / share
  std::atomic<uint64_t> busy_us;      // GPU time charged, in all (usage counter for the server)
  std::atomic<uint64_t> waits;        // launches that had to wait (usage counter)
  // The job's recent utilization, for NVML inside it (JobUtilizationPermille): the window now open
  // (its start, and busy_us then; rolled by Charge every kUtilizationWindowUs) and the last one's.
  std::atomic<uint64_t> window_start_us;
  std::atomic<uint64_t> window_busy_us;
  std::atomic<uint32_t> last_window_permille;
  // A job on several GPUs whose slices are granted together (gang time-slicing): the GPUs, one bit
  // each; 0: this GPU alone. (Zero in files written before gangs: the layout is unchanged.)
  std::atomic<uint32_t> gang;
  // Processes of the job (in the pid namespace `pidns`) inside a synchronize: the pid in the low 32
  // bits, how many of its threads are in there (counted in in_sync too) in the high 32; 0: a free
  // entry. A process killed in there leaves its entry: whoever finds it gone gives its count back
  // (beyond kSyncPids processes at once they are counted only, and only the time limits end a
  // stale count).
  std::atomic<uint64_t> sync_procs[kSyncPids];
  // The job's last loss of the GPU (its lease handed over or taken), and how far past it the work
  // its processes had queued then is billed to it so far: at a handover only the process that
  // hands over has drained, and what the others queued runs after it, in the next holder's time.
  // Each of them bills what ran past the loss once it sees it done (Arbiter::Settle); the next
  // holder's slice starts when that work ends.
  std::atomic<uint64_t> lost_us;
  std::atomic<uint64_t> billed_until_us;
  std::atomic<uint64_t> granted_us;  // when the job last got the GPU (lease_start_us moves on at
                                     // every slice it keeps)
  // How long the job was held back: wall time in which a launch of it waited for the GPU (another
  // job's slice, or - capped - its own share's pause), its processes' waits counted once (each
  // adds what of its wait lies past held_until_us). With its run time it tells what the job would
  // have used had it not waited (core::DemandPct): a share held to its slices is measured
  // at most at what it was given, but its waits say how much more it wanted.
  std::atomic<uint64_t> held_us;
  std::atomic<uint64_t> held_until_us;
};

struct ArbiterGpu {
  std::atomic<uint64_t>
      lease;  // holder slot + 1 in the top 16 bits (0: nobody), end time (us) below
  std::atomic<uint64_t> handovers;
  ArbiterJob jobs[kArbiterJobs];
};

// The pacing settings every job on the machine uses, written by whoever made the file (the
// server, the node agent, Slurm's step; else the first process, from its environment): a tenant's
// own environment does not change them (a TESSERA_CUDA_QUEUE_US=0 or a TIMESLICE_US of a second
// would let its queued work run in others' slices). 0: not set (a file copied from one that was
// not an arbiter), then the process's own.
// What the settings may be, in the environment of the process that makes the file and in the file
// (a value outside is malformed there, and not believed here).
inline constexpr uint64_t kMinSliceUs = 100, kMinIdleUs = 50, kMinQueueUs = 100;
inline constexpr uint64_t kMaxSettingUs = 10'000'000;
struct ArbiterSettings {
  std::atomic<uint64_t> slice_us;
  std::atomic<uint64_t> queue_us;  // the most GPU work a process may have queued
  std::atomic<uint64_t> idle_us;
};

struct ArbiterData {
  std::atomic<uint64_t> magic;  // written last by the creator
  uint32_t version;
  uint32_t reserved;
  ArbiterGpu gpus[kArbiterGpus];
  ArbiterSettings settings;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct ArbiterConfig {
  uint32_t share_permille = 1000;  // 1..1000
  int32_t priority = 0;            // higher first
  bool work_conserving = true;     // may use idle GPU time beyond the share
  uint64_t slice_us = 5000;        // lease length
  uint64_t idle_us = 1000;         // a holder this long without launching or synchronizing is idle
  uint64_t poll_us = 100;          // how often a waiting launch looks again
  // The job's GPUs, one bit per physical GPU, when its slices on them are granted together (gang
  // time-slicing: the ranks of a job on several GPUs run at the same time). 0 or one bit: each GPU
  // is arbitrated on its own.
  uint32_t gang_mask = 0;
  // How often a launch looks whether the file at the arbiter's path was replaced (the server
  // renames a fresh copy over it to revoke a user's access); then the process maps the new one in
  // the old one's place. 0: at every launch that waits.
  uint64_t follow_us = 100000;
  // The queue bound (ArbiterSettings::queue_us) written when this process makes the file; 0: the
  // slice.
  uint64_t queue_us = 0;
  // The GPU time (us) this process has queued and not seen run on the current device (the queue
  // bound's estimate); null: not known. Bounds what a process that noticed its job's loss of the
  // GPU late (its work long done) is billed for the time past the loss.
  uint64_t (*queued_us)() = nullptr;
  // The estimated GPU time (us) of one launch on the current device; 0 or null: not known. With
  // queued_us, how deep a job may queue beside one of higher priority (kBoundedQueueUs).
  uint64_t (*launch_us)() = nullptr;
};

// Called to wait for this process's queued GPU work (a real cuCtxSynchronize).
using DrainFn = void (*)();

class Arbiter {
 public:
  // Maps (creating when needed) the arbiter file for job `job_key` (not 0). nullptr + `err` on
  // failure.
  static Arbiter* Attach(const char* path, uint64_t job_key, const ArbiterConfig& config, char* err,
                         size_t err_len);

  // Before a kernel launch on physical GPU `gpu`: returns at once while this job holds the GPU's
  // lease, otherwise waits until it does. `drain` waits for this process's queued work. With every
  // slot of the GPU taken by live jobs it waits for one (said once): unpaced, it would take their
  // time.
  void BeforeLaunch(int gpu, DrainFn drain);
  // Around a synchronize call: a job waiting for its own work is not idle. `full`: the call
  // waited for all of this process's work on the GPU (a context synchronize). Leaving one that
  // waited past its job's loss of the GPU bills the job for the time past the loss (Settle).
  void EnterSync(int gpu);
  void LeaveSync(int gpu, bool full = false);

  // The caller's slot on `gpu` (claimed on first use), -1 when every slot is taken. A slot tells
  // a dead or stopped holder by one process of the job: one that launches there, rather than a
  // gang member that only claimed it for the gang while that one lives.
  int Slot(int gpu);
  ArbiterData* data() { return data_; }
  // Whether the arbiter's path names another file than the one mapped, and if so maps that one in
  // its place (RemapSharedFile; a file that is not an arbiter is not followed). At most every
  // ArbiterConfig::follow_us; called before a launch that waits. True when it followed.
  bool FollowIfReplaced(uint64_t now);
  uint64_t key() const { return key_; }
  // The settings in force (the file's; the process's own where the file has none).
  uint64_t slice_us() const { return config_.slice_us; }
  uint64_t idle_us() const { return config_.idle_us; }
  uint64_t queue_us() const { return config_.queue_us; }
  // Launches that found every slot of their GPU taken and waited for one.
  uint64_t slot_waits() const { return slot_waits_.load(std::memory_order_relaxed); }
  static uint64_t NowMicros();

 private:
  Arbiter(ArbiterData* d, uint64_t key, const ArbiterConfig& c) : data_(d), key_(key), config_(c) {}
  bool TryClaim(ArbiterGpu& g, int slot);
  int PickNext(int gpu, uint64_t now, int self, int rival) const;
  // Whether gang job `j` (a slot of GPU `gpu`) holds the leases of all its GPUs below `gpu`.
  bool HoldsGangBelow(const ArbiterJob& j, int gpu) const;
  // This job waits for `gpu` now: its wish is refreshed (the first time after a while, it comes
  // back level with the least-served job around, banking no credit).
  void Want(int gpu, int self, uint64_t now, bool& counted);
  // Tries to take `gpu` (lease word `lease`, not this job's) for this job: when nobody holds it, or
  // its holder went idle, died, is stopped, stuck or outranked, and this job is next.
  bool TryTake(int gpu, int self, uint64_t now, uint64_t lease, bool& counted);
  // This job's slice on `gpu` is over: charges it and keeps the GPU (true) or hands it to the
  // next job, after `drain` (may be null).
  bool KeepOrHandOver(int gpu, int self, uint64_t now, uint64_t lease, DrainFn drain);
  void BeforeLaunchGang(int gpu, DrainFn drain);
  // Every slot of `gpu` taken: waits until one is free or reclaimed; -1 when the file was
  // truncated meanwhile (then nothing is arbitrated).
  int WaitForSlot(int gpu);
  // Whether the mapping faulted since it was mapped (the file truncated under it): zero pages now.
  bool Truncated() const {
    return faults_ != nullptr && faults_->load(std::memory_order_relaxed) != 0;
  }
  // After the mapping faulted (the file truncated): whether the file at the path was replaced and
  // is followed now (then the arbiter is whole again). Says the fault once.
  bool Recovered();
  // Runs `drain` counted as inside a synchronize on `gpu` (not idle while it waits).
  void DrainAsSync(int gpu, DrainFn drain);
  // Holding the GPU: whether a job of higher priority is around (then its queued work stays
  // within kBoundedQueueUs: it drains first when it would not). False when the GPU was taken from
  // it meanwhile: the launch waits.
  bool Bound(int gpu, int self, uint64_t now, DrainFn drain);
  // Beside a job of higher priority: whether this launch would queue more than kBoundedQueueUs
  // (at least one launch in flight; the whole queue when the launch's length is not known).
  bool QueueFull() const;
  // Charges the GPU time from the lease's start until `until` (the end of the job's activity: idle
  // time is never charged); the next charge starts at `now`.
  void Charge(ArbiterJob& j, uint64_t until, uint64_t now) const;
  // When `j` last used the GPU: now while it is in a synchronize, else its last launch or
  // synchronize return plus the idle allowance.
  uint64_t ActiveUntil(const ArbiterJob& j, uint64_t now) const;
  // The slot's process seen from here: 'R' running (or unknown: another pid namespace), 'T'
  // stopped, 0 gone.
  char HolderState(const ArbiterJob& j) const;
  // Adds `used` us of GPU time to job `j` (busy, utilization window, virtual time, a capped job's
  // eligibility), at `now`.
  void AddUsed(ArbiterJob& j, uint64_t used, uint64_t now) const;
  // This process's work queued before its job (slot `self`) lost `gpu` ran until `until`: what of
  // it ran past the loss and is not billed yet is charged to the job, and the slice of the job
  // that holds the GPU now, if it began at the loss, starts when that work ended (so its holder is
  // not charged for it).
  void Settle(int gpu, int self, uint64_t until);
  // Whether this process launched on `gpu` since its last full drain there began.
  bool Dirty(int gpu) const {
    return launches_[gpu].load(std::memory_order_relaxed) >
           clean_launches_[gpu].load(std::memory_order_relaxed);
  }
  void Launching(int gpu, uint64_t now) {
    launches_[gpu].fetch_add(1, std::memory_order_relaxed);
    if (launched_us_[gpu].load(std::memory_order_relaxed) != now)
      launched_us_[gpu].store(now, std::memory_order_relaxed);
  }
  // Gives back the in_sync count of the job's processes that died inside a synchronize (listed in
  // sync_pids, of this process's pid namespace). Returns whether any was.
  bool ReapSyncs(ArbiterJob& j) const;
  void Granted(ArbiterGpu& g, int slot, uint64_t now);
  // A launch of job `j` waited for the GPU from `from` to `to`: what of it is not counted yet (by
  // another process of the job waiting at the same time) is added to its held_us.
  static void Held(ArbiterJob& j, uint64_t from, uint64_t to);
  ArbiterData* data_;
  uint64_t key_;
  ArbiterConfig config_;
  char path_[4096] = {};
  uint64_t dev_ = 0, ino_ = 0;  // the file mapped now
  std::atomic<uint64_t> next_follow_us_{0};
  uint32_t pidns_ = 0;                             // this process's pid namespace
  const std::atomic<uint64_t>* faults_ = nullptr;  // the mapping's faults (fault_guard.h)
  std::atomic<bool> said_truncated_{false};
  std::atomic<int> slot_[kArbiterGpus] = {};  // slot + 1; 0: none yet
  std::atomic<bool> bounded_[kArbiterGpus] =
      {};                                 // a higher-priority job is around: one launch in flight
  std::atomic<uint32_t> launch_gpus_{0};  // the GPUs this process has launched on, one bit each
  std::atomic<uint64_t> slot_waits_{0};
  // This process, per GPU: its launches and the last one's time, how many of them its last full
  // drain covered (those before it began), its threads inside a synchronize, when the first of
  // them went in and the launches then.
  std::atomic<uint64_t> launches_[kArbiterGpus] = {};
  std::atomic<uint64_t> launched_us_[kArbiterGpus] = {};
  std::atomic<uint64_t> clean_launches_[kArbiterGpus] = {};
  std::atomic<int> sync_depth_[kArbiterGpus] = {};
  std::atomic<uint64_t> entered_us_[kArbiterGpus] = {};
  std::atomic<uint64_t> entered_launches_[kArbiterGpus] = {};
};

// A new arbiter file's settings (MapSharedFile's initialiser), from `config`, an ArbiterConfig
// of whoever makes it (arbiter_file.cc).
void WriteArbiterSettings(void* mem, const void* config);

// Creates (when missing) the arbiter file at `path` without joining it, so that a server can
// prepare it for jobs of several users, with the pacing settings of `c` (slice, idle, queue bound;
// the defaults when not given). One of an older version (an upgrade) is replaced by rename: its
// processes keep the one they mapped, and it stays readable at ArbiterPreviousPath (0600: for
// its maker, not its tenants) when its layout is known (version 5 on), so that what those jobs
// use is still measured (ArbiterJobUse). That file is removed by a later call once none of its
// jobs can still be running or unread (ArbiterPreviousIsStale). False with why in `err`.
bool CreateArbiterFile(const char* path, char* err, size_t err_len,
                       const ArbiterConfig& c = ArbiterConfig());

// Writes a new arbiter file at `to` (created, 0600; it must not exist) holding what the arbiter
// at `from` holds now (read through pread: `from` may be truncated meanwhile; a fresh arbiter when
// it is not one), except who is inside a synchronize (their processes leave it in the file they
// entered it in). Renamed over `from`, it revokes every descriptor of the old file: the processes
// of the jobs follow it (Arbiter::FollowIfReplaced), a descriptor kept by someone whose access was
// removed reaches only the old one. False with why in `err`.
bool CopyArbiterFile(const char* from, const char* to, char* err, size_t err_len);

// The arbiter's key for a job: what the intercept library derives from TESSERA_JOB_ID (FNV-1a of
// the text; never 0).
uint64_t ArbiterJobKey(const char* job_id);

// The GPU time charged so far to job `key` on GPU `gpu` in the arbiter file at `path` (busy_us),
// read without joining; 0 when the file, the GPU or the job is not there. For the server's
// history of what a job used.
uint64_t ArbiterBusyMicros(const char* path, int gpu, uint64_t key);
// The same summed over `count` GPUs (a job on several), the file mapped once.
uint64_t ArbiterBusyMicros(const char* path, const int* gpus, int count, uint64_t key);

// A job's GPU time and how long it was held back (ArbiterJob::held_us), summed over its GPUs.
// After an upgrade replaced a file of an older version (CreateArbiterFile), what the job's
// processes of before charged there (they keep it mapped) is added: read at
// ArbiterPreviousPath when that file has the owner of the one at `path` (its held time where
// its version counted it; version 5 did not).
struct ArbiterUse {
  uint64_t busy_us = 0;
  uint64_t held_us = 0;
};
ArbiterUse ArbiterJobUse(const char* path, const int* gpus, int count, uint64_t key);

// Where an arbiter file replaced by an upgrade is kept while its jobs may run: `path`.previous.
void ArbiterPreviousPath(const char* path, char* out, size_t out_len);
// ArbiterPreviousPath, and whether a file is there (an upgrade's, kept: said by its maker).
bool ArbiterPreviousKept(const char* path, char* out, size_t out_len);
// How long after its last use a slot of the previous file keeps it (its job may have ended only
// then, and whoever reads a job's use at its end - the server, an epilog - not have read it yet).
inline constexpr uint64_t kArbiterPreviousKeepUs = 3600ull * 1000 * 1000;
// Whether the previous arbiter file at `path` (ArbiterPreviousPath's) holds no job that may still
// use it or be unread, at `now_us` (Arbiter::NowMicros): each slot's job last used it more than
// kArbiterPreviousKeepUs ago (or before this boot: a time past now) and its process is gone from
// this pid namespace (one in another namespace cannot be told: the time alone decides). True for a
// file that is no readable arbiter. False when it cannot be read (missing included). A slot of a
// job in `held` (ArbiterJobKey of the jobs its maker still runs: n_held of them) keeps it however
// long idle - a container's process, in another pid namespace, cannot be seen to run.
bool ArbiterPreviousIsStale(const char* path, uint64_t now_us, const uint64_t* held = nullptr,
                            size_t n_held = 0);
// Removes the previous arbiter file of the arbiter at `path` when it is stale now (the host's
// monotonic clock); true when it did. CreateArbiterFile calls it; so do makers that run on (the
// server at each sample, the agent at each reconcile, each with the jobs it holds), so that it
// goes once its jobs are done.
bool RemoveStaleArbiterPrevious(const char* path, const uint64_t* held = nullptr,
                                size_t n_held = 0);

// Whether process `pid` is gone (kill(pid, 0): ESRCH). A pid of another pid namespace means
// nothing here.
bool ProcessGone(int32_t pid);
// The inode of this process's pid namespace (/proc/self/ns/pid -> "pid:[4026531836]"); 0 unknown.
uint32_t PidNamespace();

// How long a utilization window of a job is (NVML's sample period is 1/6 s to 1 s).
inline constexpr uint64_t kUtilizationWindowUs = 1'000'000;

// What share of the last window's length (the window now open and the end of the one before it)
// job `key` held GPU `gpu` busy, in permille; what nvmlDeviceGetUtilizationRates says inside the
// job. -1 when the job has no slot there.
int JobUtilizationPermille(const ArbiterData* d, int gpu, uint64_t key, uint64_t now_us);

// "30%", "30", "0.3" -> permille (300). False when malformed or outside (0, 100%].
bool ParseShare(const char* text, uint32_t* permille);

}  // namespace tessera::shim
