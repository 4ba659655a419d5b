#include "tessera/shim/arbiter.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <iterator>
#include <new>

#include "tessera/shim/fault_guard.h"
#include "tessera/shim/glibc_compat.h"  // pins the symbol versions
#include "tessera/shim/host_clock.h"
#include "tessera/shim/region.h"

namespace tessera::shim {
namespace {

constexpr uint64_t kEndMask = (1ull << 48) - 1;
constexpr uint64_t kActiveUs = 2000;    // a waiter refreshes its wish every poll; stale after this
constexpr uint64_t kRecentUs = 100000;  // a job that used or wanted the GPU this lately is around
constexpr uint64_t kBoundedForUs = 1000000;  // a higher-priority job counts as around for this long
// Beside it, the most GPU work a lower job keeps queued: what the higher job may wait for when it
// comes back (at least one launch of the lower job's). Short kernels keep several in flight
// instead of draining before each one (a nearly idle high job cost a job of 20 us kernels 82% of
// its throughput that way; 2% now, and the high job keeps 97-98% of alone, on the fake driver).
constexpr uint64_t kBoundedQueueUs = 1000;
constexpr uint64_t kDeadAfterUs =
    10000000;  // a slot of a dead process unused this long is reclaimed

// The holder's slot, -1 for nobody - or for a word no arbiter wrote (the file is the users' to
// write: an index is bounded before it is used).
int Holder(uint64_t lease) {
  const int h = static_cast<int>(lease >> 48) - 1;
  return h < kArbiterJobs ? h : -1;
}
uint64_t End(uint64_t lease) { return lease & kEndMask; }
uint64_t Lease(int slot, uint64_t end) {
  return (static_cast<uint64_t>(slot + 1) << 48) | (end & kEndMask);
}

void SleepMicros(uint64_t us) {
  timespec t{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  nanosleep(&t, nullptr);
}

// What ProcessStateOf read of a process lately. Every waiter looks at the holder at each poll
// (every 100 us): eight waiters reading the holder's /proc/<pid>/stat each time made 13,000 reads a
// second and kept two cores busy in the kernel, the CPU the holder needed to launch its work. A
// state is read again after kStateFreshUs: a holder stopped or killed is seen that much later at
// most.
constexpr uint64_t kStateFreshUs = 1000;
struct StateSeen {
  int32_t pid = 0;
  char state = 0;
  uint64_t at_us = 0;
};
// Taken with test_and_set, never waited for: a thread that finds it taken (or a child forked while
// another thread held it) reads /proc itself.
std::atomic_flag seen_taken = ATOMIC_FLAG_INIT;
StateSeen seen[8];
unsigned seen_next = 0;

// A process's state letter ('R', 'S', 'D', 'T', 't', 'Z'...), 0 when gone (ReadProcessStat: no
// allocation, usable from the intercept library); at most kStateFreshUs old.
char ProcessStateOf(int32_t pid) {
  if (pid <= 0) return 0;
  const uint64_t now = HostMonotonicNs() / 1000;
  if (!seen_taken.test_and_set(std::memory_order_acquire)) {
    for (const StateSeen& s : seen) {
      if (s.pid == pid && now - s.at_us < kStateFreshUs) {
        const char state = s.state;
        seen_taken.clear(std::memory_order_release);
        return state;
      }
    }
    seen_taken.clear(std::memory_order_release);
  }
  char state = 0;
  uint64_t start = 0;
  if (!ReadProcessStat(pid, &state, &start)) state = 0;
  if (!seen_taken.test_and_set(std::memory_order_acquire)) {
    StateSeen* slot = &seen[seen_next++ % std::size(seen)];
    for (StateSeen& s : seen) {
      if (s.pid == pid) slot = &s;
    }
    *slot = StateSeen{pid, state, now};
    seen_taken.clear(std::memory_order_release);
  }
  return state;
}

}  // namespace

bool ProcessGone(int32_t pid) { return pid <= 0 || (kill(pid, 0) == -1 && errno == ESRCH); }

uint32_t PidNamespace() {
  char link[64] = {};
  ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1);
  if (n <= 0) return 0;
  const char* open = strchr(link, '[');
  return open ? static_cast<uint32_t>(strtoul(open + 1, nullptr, 10)) : 0;
}

// The host's monotonic clock: leases and charges are compared across processes, some of which may
// be in time namespaces of their own (host_clock.h).
uint64_t Arbiter::NowMicros() { return HostMonotonicNs() / 1000; }

bool ParseShare(const char* text, uint32_t* permille) {
  if (text == nullptr || *text < '0' || *text > '9') return false;
  char* end = nullptr;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text) return false;
  bool fraction = strchr(text, '.') != nullptr && *end != '%';
  if (*end == '%') ++end;
  if (*end != 0) return false;
  double p = fraction ? v * 1000 : v * 10;
  if (!(p >= 1 && p <= 1000)) return false;
  *permille = static_cast<uint32_t>(p + 0.5);
  return true;
}

Arbiter* Arbiter::Attach(const char* path, uint64_t job_key, const ArbiterConfig& config, char* err,
                         size_t err_len) {
  int fd = -1;
  void* m = MapSharedFile(path, "GPU arbiter file", sizeof(ArbiterData), kArbiterMagic,
                          kArbiterVersion, WriteArbiterSettings, &config, &fd, err, err_len);
  if (m == nullptr) return nullptr;
  struct stat st = {};
  fstat(fd, &st);
  close(fd);  // the mapping stays; nothing here takes the file lock
  ArbiterConfig c = config;
  // The file's settings rule (its maker's: the server's, the agent's): not this process's
  // environment. Bounded: a scribbled value does not stop pacing.
  const ArbiterSettings& fs = static_cast<ArbiterData*>(m)->settings;
  if (const uint64_t v = fs.slice_us.load(); v >= kMinSliceUs && v <= kMaxSettingUs) c.slice_us = v;
  if (const uint64_t v = fs.idle_us.load(); v >= kMinIdleUs && v <= kMaxSettingUs) c.idle_us = v;
  if (const uint64_t v = fs.queue_us.load(); v >= kMinQueueUs && v <= kMaxSettingUs) c.queue_us = v;
  if (c.queue_us == 0) c.queue_us = c.slice_us;
  if (c.share_permille < 1 || c.share_permille > 1000) c.share_permille = 1000;
  if (c.slice_us == 0) c.slice_us = 1;
  Arbiter* a = new (std::nothrow) Arbiter(static_cast<ArbiterData*>(m), job_key ? job_key : 1, c);
  if (a == nullptr) return nullptr;
  // A user with a job here may truncate the file under every process mapping it: the guard puts
  // zero pages in its place instead of the SIGBUS that would kill them (fault_guard.h).
  a->faults_ = GuardMapping(m, sizeof(ArbiterData));
  a->pidns_ = PidNamespace();
  snprintf(a->path_, sizeof a->path_, "%s", path);
  a->dev_ = st.st_dev;
  a->ino_ = st.st_ino;
  a->next_follow_us_.store(NowMicros() + c.follow_us);
  return a;
}

bool Arbiter::FollowIfReplaced(uint64_t now) {
  uint64_t due = next_follow_us_.load(std::memory_order_relaxed);
  if (now < due || !next_follow_us_.compare_exchange_strong(due, now + config_.follow_us,
                                                            std::memory_order_relaxed)) {
    return false;  // not yet, or another thread of the process looks
  }
  struct stat st;
  if (stat(path_, &st) != 0 || (st.st_dev == dev_ && st.st_ino == ino_)) return false;
  char err[256];
  uint64_t dev = 0, ino = 0;
  if (!RemapSharedFile(path_, "GPU arbiter file", sizeof(ArbiterData), kArbiterMagic,
                       kArbiterVersion, data_, &dev, &ino, err, sizeof err)) {
    return false;  // not an arbiter (yet): the old one stays, looked at again later
  }
  dev_ = dev;
  ino_ = ino;
  return true;
}

bool Arbiter::TryClaim(ArbiterGpu& g, int slot) {
  ArbiterJob& j = g.jobs[slot];
  uint64_t expected = 0;
  if (!j.key.compare_exchange_strong(expected, key_)) return expected == key_;
  j.priority.store(config_.priority);
  j.share.store(config_.share_permille);
  j.capped.store(config_.work_conserving ? 0 : 1);
  j.gang.store(config_.gang_mask);
  j.in_sync.store(0);
  for (auto& p : j.sync_procs) p.store(0);
  j.eligible_us.store(0);
  j.busy_us.store(0);
  j.waits.store(0);
  j.window_busy_us.store(0);
  j.last_window_permille.store(0);
  j.window_start_us.store(NowMicros());
  j.last_launch_us.store(0);
  j.want_us.store(0);
  j.lost_us.store(0);
  j.billed_until_us.store(0);
  j.granted_us.store(0);
  j.held_us.store(0);
  j.held_until_us.store(0);
  // A newcomer starts level with the least-served job there, not with credit for its absence.
  uint64_t least = UINT64_MAX;
  for (int i = 0; i < kArbiterJobs; ++i) {
    if (i != slot && g.jobs[i].key.load() != 0) least = std::min(least, g.jobs[i].vtime.load());
  }
  j.vtime.store(least == UINT64_MAX ? 0 : least);
  return true;
}

int Arbiter::Slot(int gpu) {
  if (gpu < 0 || gpu >= kArbiterGpus) return -1;
  int cached = slot_[gpu].load(std::memory_order_relaxed) - 1;
  ArbiterGpu& g = data_->gpus[gpu];
  if (cached >= 0 && g.jobs[cached].key.load(std::memory_order_relaxed) == key_) return cached;
  const int32_t me = static_cast<int32_t>(getpid());
  const bool launching = (launch_gpus_.load(std::memory_order_relaxed) >> gpu) & 1;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < kArbiterJobs; ++i) {  // the job's own slot first, then a free one
      ArbiterJob& j = g.jobs[i];
      if (j.key.load() == key_ && TryClaim(g, i)) {
        // A process of the job that came after one that is gone (a restart): what the gone one
        // left - a synchronize it never returned from - is not this one's.
        const int32_t before = j.pid.load();
        const bool gone = ProcessStateOf(before) == 0;
        if (before != me && j.pidns.load() == pidns_ && gone) {
          j.in_sync.store(0);
          for (auto& p : j.sync_procs) p.store(0);
        }
        // A gang member claiming a GPU it does not launch on leaves a live launcher's pid there.
        if (launching || gone || j.pidns.load() != pidns_) {
          j.pid.store(me);
          j.pidns.store(pidns_);
        }
        slot_[gpu].store(i + 1);
        return i;
      }
    }
    for (int i = 0; i < kArbiterJobs; ++i) {
      if (g.jobs[i].key.load() == 0 && TryClaim(g, i)) {
        g.jobs[i].pid.store(me);
        g.jobs[i].pidns.store(pidns_);
        slot_[gpu].store(i + 1);
        return i;
      }
    }
    // Full: give back the slots of jobs whose process is gone and that have not run for a while.
    const uint64_t now = NowMicros();
    for (int i = 0; i < kArbiterJobs; ++i) {
      ArbiterJob& j = g.jobs[i];
      uint64_t k = j.key.load();
      uint64_t last = std::max(j.want_us.load(), j.last_launch_us.load());
      if (k != 0 && now > last + kDeadAfterUs && ProcessGone(j.pid.load()))
        j.key.compare_exchange_strong(k, 0);
    }
  }
  return -1;
}

int Arbiter::WaitForSlot(int gpu) {
  if (gpu < 0 || gpu >= kArbiterGpus) return -1;
  slot_waits_.fetch_add(1, std::memory_order_relaxed);
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    fprintf(stderr,
            "tessera-cuda: all %d arbiter slots of GPU %d are taken by running jobs; this process "
            "waits for one (unpaced, it would take their time)\n",
            kArbiterJobs, gpu);
  }
  for (;;) {
    if (Truncated()) return -1;
    const uint64_t us = std::max<uint64_t>(config_.poll_us, 1000);
    timespec t{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000 * 1000)};
    nanosleep(&t, nullptr);
    const int s = Slot(gpu);  // which also reclaims the slots of jobs gone for a while
    if (s >= 0) return s;
  }
}

uint64_t Arbiter::ActiveUntil(const ArbiterJob& j, uint64_t now) const {
  if (j.in_sync.load(std::memory_order_relaxed) > 0) return now;
  return std::min(now, j.last_launch_us.load(std::memory_order_relaxed) + config_.idle_us);
}

bool Arbiter::ReapSyncs(ArbiterJob& j) const {
  if (pidns_ == 0 || j.pidns.load() != pidns_) return false;  // their pids mean nothing here
  bool reaped = false;
  for (auto& entry : j.sync_procs) {
    uint64_t e = entry.load(std::memory_order_relaxed);
    const int32_t pid = static_cast<int32_t>(e & 0xffffffffu);
    if (pid <= 0 || ProcessStateOf(pid) != 0) continue;
    if (entry.compare_exchange_strong(e, 0)) {  // one finder gives its count back
      const int32_t n = static_cast<int32_t>(e >> 32);
      int32_t cur = j.in_sync.load();
      while (cur > 0 && !j.in_sync.compare_exchange_weak(cur, std::max(0, cur - n))) {
      }
      reaped = true;
    }
  }
  return reaped;
}

char Arbiter::HolderState(const ArbiterJob& j) const {
  // A pid from another pid namespace (another container) means nothing here: running, as far as
  // this process can tell; the time limits still apply.
  if (pidns_ == 0 || j.pidns.load() != pidns_) return 'R';
  char s = ProcessStateOf(j.pid.load());
  if (s == 'Z' || s == 'X') return 0;
  return s == 't' ? 'T' : s;
}

void Arbiter::Charge(ArbiterJob& j, uint64_t until, uint64_t now) const {
  uint64_t start = j.lease_start_us.load();
  j.lease_start_us.store(now);
  if (until > start) AddUsed(j, until - start, now);
}

void Arbiter::AddUsed(ArbiterJob& j, uint64_t used, uint64_t now) const {
  const uint64_t busy = j.busy_us.fetch_add(used, std::memory_order_relaxed) + used;
  // Roll the utilization window when it has run its length (one process of the job wins).
  uint64_t window = j.window_start_us.load(std::memory_order_relaxed);
  if (now >= window + kUtilizationWindowUs &&
      j.window_start_us.compare_exchange_strong(window, now, std::memory_order_relaxed)) {
    const uint64_t before = j.window_busy_us.exchange(busy, std::memory_order_relaxed);
    j.last_window_permille.store(
        static_cast<uint32_t>(std::min<uint64_t>(1000, (busy - before) * 1000 / (now - window))),
        std::memory_order_relaxed);
  }
  uint32_t share = j.share.load();
  if (share == 0) share = 1000;
  j.vtime.fetch_add(used * 1000 / share, std::memory_order_relaxed);
  if (j.capped.load()) {
    uint64_t from = std::max(j.eligible_us.load(), now);
    j.eligible_us.store(from + used * (1000 - share) / share);
  }
}

void Arbiter::Granted(ArbiterGpu& g, int slot, uint64_t now) {
  ArbiterJob& j = g.jobs[slot];
  j.lease_start_us.store(now);
  j.granted_us.store(now);
  j.last_launch_us.store(now);
  g.handovers.fetch_add(1, std::memory_order_relaxed);
}

bool Arbiter::HoldsGangBelow(const ArbiterJob& j, int gpu) const {
  const uint64_t key = j.key.load(std::memory_order_relaxed);
  for (uint32_t m = j.gang.load(std::memory_order_relaxed) & ((1u << gpu) - 1); m; m &= m - 1) {
    const ArbiterGpu& o = data_->gpus[__builtin_ctz(m)];
    const int h = Holder(o.lease.load(std::memory_order_acquire));
    if (h < 0 || o.jobs[h].key.load(std::memory_order_relaxed) != key) return false;
  }
  return true;
}

// The job that should hold the GPU next: among `self`, `rival` (a holder still busy) and the jobs
// waiting now, the highest priority, then the lowest virtual time; capped jobs only once eligible.
// A gang job is a candidate on one of its GPUs only while it holds all its GPUs below that one
// (it takes them in ascending order), and then it goes before the others of its priority unless
// its virtual time there is ahead of theirs by more than four of its slices. -1: nobody may.
// Whether slot `j` could have been written by an arbiter: the file is its users' to write, and a
// slot of garbage (a priority or share no setting allows, times in the future) must not win the
// GPU for nobody, nor hold it.
bool Plausible(const ArbiterJob& j, uint64_t now) {
  constexpr uint64_t kFutureUs = 10'000'000;
  const int32_t p = j.priority.load(std::memory_order_relaxed);
  const uint32_t share = j.share.load(std::memory_order_relaxed);
  return p >= -1000000 && p <= 1000000 && share >= 1 && share <= 1000 &&
         j.want_us.load(std::memory_order_relaxed) <= now + kFutureUs &&
         j.last_launch_us.load(std::memory_order_relaxed) <= now + kFutureUs &&
         j.lease_start_us.load(std::memory_order_relaxed) <= now + kFutureUs;
}

int Arbiter::PickNext(int gpu, uint64_t now, int self, int rival) const {
  const ArbiterGpu& g = data_->gpus[gpu];
  int best = -1, first = -1;  // the fair choice; a gang job holding its GPUs below this one
  int32_t best_priority = 0, first_priority = 0;
  uint64_t best_vtime = 0, first_vtime = 0;
  const uint32_t below = (1u << gpu) - 1;
  for (int i = 0; i < kArbiterJobs; ++i) {
    const ArbiterJob& j = g.jobs[i];
    if (j.key.load(std::memory_order_relaxed) == 0) continue;
    if (i != self && !Plausible(j, now)) continue;
    if (i != self && i != rival && now > j.want_us.load(std::memory_order_relaxed) + kActiveUs)
      continue;
    if (j.capped.load(std::memory_order_relaxed) &&
        j.eligible_us.load(std::memory_order_relaxed) > now) {
      continue;
    }
    const bool upper = (j.gang.load(std::memory_order_relaxed) & below) != 0;
    if (upper && !HoldsGangBelow(j, gpu)) continue;
    int32_t p = j.priority.load(std::memory_order_relaxed);
    uint64_t v = j.vtime.load(std::memory_order_relaxed);
    if (best < 0 || p > best_priority || (p == best_priority && v < best_vtime)) {
      best = i, best_priority = p, best_vtime = v;
    }
    if (upper && (first < 0 || p > first_priority || (p == first_priority && v < first_vtime))) {
      first = i, first_priority = p, first_vtime = v;
    }
  }
  if (first < 0 || first == best || first_priority < best_priority) return best;
  uint32_t share = g.jobs[first].share.load(std::memory_order_relaxed);
  if (share == 0) share = 1000;
  const uint64_t lead = 4 * config_.slice_us * 1000 / share;
  return first_vtime <= best_vtime + lead ? first : best;
}

void Arbiter::Want(int gpu, int self, uint64_t now, bool& counted) {
  ArbiterGpu& g = data_->gpus[gpu];
  ArbiterJob& me = g.jobs[self];
  // A job back from idling banks no credit: it comes back level with the least-served job that
  // used or wanted the GPU lately. Nor does a job back from being away fall further behind them
  // than two of its slices (as CFS bounds a waking task's lag): a process stopped (SIGSTOP, a
  // cgroup freeze) while it held or waited for the GPU wanted nothing while stopped, and came back
  // owed the whole stop - it took the GPU for about as long as it had been stopped.
  const bool idle =
      !counted && now > std::max(me.want_us.load(), me.last_launch_us.load()) + kActiveUs;
  // Away: it has not waited for the GPU lately (stopped, frozen, or it held the GPU; a job that
  // held it was charged for it and is not behind). A waiter merely descheduled for a moment on a
  // busy machine is not away, and keeps what it is owed.
  const bool away = now > me.want_us.load() + kRecentUs;
  if (!idle && !away) {
    me.want_us.store(now);
    if (!counted) me.waits.fetch_add(1, std::memory_order_relaxed), counted = true;
    return;
  }
  uint64_t least = UINT64_MAX;
  for (int i = 0; i < kArbiterJobs; ++i) {
    const ArbiterJob& o = g.jobs[i];
    if (i == self || o.key.load(std::memory_order_relaxed) == 0) continue;
    if (now > std::max(o.want_us.load(), o.last_launch_us.load()) + kRecentUs) continue;
    least = std::min(least, o.vtime.load(std::memory_order_relaxed));
  }
  if (least != UINT64_MAX) {
    uint32_t share = me.share.load(std::memory_order_relaxed);
    if (share == 0) share = 1000;
    const uint64_t lag = idle ? 0 : 2 * config_.slice_us * 1000 / share;
    if (least > lag && me.vtime.load() < least - lag) me.vtime.store(least - lag);
  }
  me.want_us.store(now);
  if (!counted) me.waits.fetch_add(1, std::memory_order_relaxed), counted = true;
}

bool Arbiter::TryTake(int gpu, int self, uint64_t now, uint64_t lease, bool& counted) {
  ArbiterGpu& g = data_->gpus[gpu];
  Want(gpu, self, now, counted);
  const int holder = Holder(lease);
  // A holder past its slice is left alone while it waits for the work it queued in the slice (it
  // hands over at its next launch), unless it is gone for far longer (crashed inside the wait).
  bool take = holder < 0;
  int rival = -1;  // the holder, while it still counts as wanting the GPU
  if (!take) {
    ArbiterJob& h = g.jobs[holder];
    bool idle = h.in_sync.load() <= 0 && now > h.last_launch_us.load() + config_.idle_us;
    // A holder inside a synchronize is not idle - unless its process is gone (killed in there:
    // its count is given back) or stopped (SIGSTOP): then it loses the slice now. Another process
    // of the job killed in there gives its count back too (ReapSyncs), which may leave none.
    if (!idle && h.in_sync.load() > 0 && ReapSyncs(h)) {
      idle = h.in_sync.load() <= 0 && now > h.last_launch_us.load() + config_.idle_us;
    }
    if (!idle && h.in_sync.load() > 0) {
      const char state = HolderState(h);
      if (state == 0) {
        h.in_sync.store(0);
        idle = true;
      } else if (state == 'T') {
        idle = true;
      }
    }
    const bool stuck = now >= End(lease) + std::max<uint64_t>(100000, 4 * config_.slice_us);
    const ArbiterJob& me = g.jobs[self];
    const bool outranked = h.priority.load() < me.priority.load();
    take = idle || stuck || outranked || h.key.load() == 0 || !Plausible(h, now);
    if (!idle && !stuck) rival = holder;
    // A gang job holding its GPUs below this one does not wait out the slice of a holder of its
    // priority that is not a gang itself (its ranks there are waiting): when it goes first here
    // (PickNext: not when it is ahead here), the holder's slice ends now. At its next launch the
    // holder drains what it queued, is charged for it, and hands the GPU over.
    const uint32_t hg = h.gang.load(std::memory_order_relaxed);
    if (!take && now < End(lease) && (hg & (hg - 1)) == 0 &&
        (me.gang.load(std::memory_order_relaxed) & ((1u << gpu) - 1)) != 0 &&
        h.priority.load() == me.priority.load() && HoldsGangBelow(me, gpu) &&
        PickNext(gpu, now, self, holder) == self) {
      g.lease.compare_exchange_strong(lease, Lease(holder, now));
      return false;
    }
  }
  if (take && PickNext(gpu, now, self, rival) == self &&
      g.lease.compare_exchange_strong(lease, Lease(self, now + config_.slice_us))) {
    if (holder >= 0) Charge(g.jobs[holder], ActiveUntil(g.jobs[holder], now), now);
    if (holder >= 0 && holder != self) {
      g.jobs[holder].billed_until_us.store(now);
      g.jobs[holder].lost_us.store(now);
    }
    Granted(g, self, now);
    return true;
  }
  return false;
}

bool Arbiter::KeepOrHandOver(int gpu, int self, uint64_t now, uint64_t lease, DrainFn drain) {
  ArbiterGpu& g = data_->gpus[gpu];
  ArbiterJob& me = g.jobs[self];
  // Charged up to the end of this job's activity: a holder that went idle is not charged its idle
  // time (nor the time a process of it killed inside a synchronize would count as busy). Then it
  // keeps the GPU, hands it over or (capped, nobody eligible) lets it go.
  ReapSyncs(me);
  Charge(me, ActiveUntil(me, now), now);
  int next = PickNext(gpu, now, self, -1);
  if (next == self) {
    if (!g.lease.compare_exchange_strong(lease, Lease(self, now + config_.slice_us))) return false;
    me.last_launch_us.store(now);
    return true;
  }
  // What this job queued runs on its own slice. It waits for its own work meanwhile, as in a
  // synchronize: not idle, so nobody takes the GPU from it (and leaves the drain unbilled) while
  // its queue runs.
  DrainAsSync(gpu, drain);
  uint64_t t = NowMicros();
  uint64_t to = next < 0 ? 0 : Lease(next, t + config_.slice_us);
  // The loss is written first: a process of the job that sees the GPU gone reads when it went.
  me.lost_us.store(t);
  me.billed_until_us.store(t);
  if (g.lease.compare_exchange_strong(lease, to)) {
    Charge(me, t, t);
    if (next >= 0) Granted(g, next, t);
  }
  return false;
}

bool Arbiter::QueueFull() const {
  const uint64_t one = config_.launch_us != nullptr ? config_.launch_us() : 0;
  if (one == 0 || config_.queued_us == nullptr) return true;
  return config_.queued_us() + one > kBoundedQueueUs;
}

bool Arbiter::Bound(int gpu, int self, uint64_t now, DrainFn drain) {
  ArbiterGpu& g = data_->gpus[gpu];
  ArbiterJob& me = g.jobs[self];
  bool around = false;
  const int32_t mine = me.priority.load();
  for (int i = 0; i < kArbiterJobs && !around; ++i) {
    const ArbiterJob& j = g.jobs[i];
    if (i == self || j.key.load() == 0 || j.priority.load() <= mine) continue;
    around = now < std::max(j.want_us.load(), j.last_launch_us.load()) + kBoundedForUs;
  }
  bounded_[gpu].store(around, std::memory_order_relaxed);
  if (around && QueueFull()) DrainAsSync(gpu, drain);
  now = NowMicros();
  me.last_launch_us.store(now, std::memory_order_relaxed);
  if (!around) return true;
  // The higher-priority job may have taken the GPU while this one drained.
  const uint64_t lease = data_->gpus[gpu].lease.load(std::memory_order_acquire);
  return Holder(lease) == self && now < End(lease);
}

bool Arbiter::Recovered() {
  if (!said_truncated_.exchange(true)) {
    fprintf(stderr,
            "tessera-cuda: the GPU arbiter file %s was truncated under this process; its launches "
            "are not paced until the file is replaced\n",
            path_);
  }
  if (!FollowIfReplaced(NowMicros())) return false;
  ClearMappingFaults(data_);
  said_truncated_.store(false);
  for (auto& s : slot_) s.store(0, std::memory_order_relaxed);
  launch_gpus_.store(0, std::memory_order_relaxed);
  return true;
}

void Arbiter::BeforeLaunch(int gpu, DrainFn drain) {
  // The file shrank under the mapping (zero pages in its place now, private to this process):
  // nothing to arbitrate with until it is replaced by a whole one, which is then followed.
  if (Truncated() && !Recovered()) return;
  if (gpu >= 0 && gpu < kArbiterGpus &&
      (launch_gpus_.load(std::memory_order_relaxed) >> gpu & 1) == 0) {
    // The first launch here: the slot is claimed again so that it names this process.
    launch_gpus_.fetch_or(1u << gpu, std::memory_order_relaxed);
    slot_[gpu].store(0, std::memory_order_relaxed);
  }
  int self = Slot(gpu);
  if (self < 0) self = WaitForSlot(gpu);
  if (self < 0) return;  // a GPU out of range, or the file truncated: not arbitrated
  ArbiterGpu& g = data_->gpus[gpu];
  uint64_t now = NowMicros();
  uint64_t lease = g.lease.load(std::memory_order_acquire);
  if (Holder(lease) == self && now < End(lease)) {  // the fast path: holding the GPU
    if (!bounded_[gpu].load(std::memory_order_relaxed) || !QueueFull()) {
      g.jobs[self].last_launch_us.store(now, std::memory_order_relaxed);
      Launching(gpu, now);
      return;
    }
    // A job of higher priority is around and the queue is full: it drains first, and the GPU may
    // have been taken meanwhile (then this launch waits for it like any other).
    DrainAsSync(gpu, drain);
    now = NowMicros();
    lease = g.lease.load(std::memory_order_acquire);
    if (Holder(lease) == self && now < End(lease)) {
      g.jobs[self].last_launch_us.store(now, std::memory_order_relaxed);
      Launching(gpu, now);
      return;
    }
  }
  // The job lost the GPU while this process had work queued (another process of it handed over,
  // or it was taken): that work runs now, in the next holder's time. It drains before it waits,
  // and what ran past the loss is billed to the job (the drain's LeaveSync, when it waited; else
  // the work was done before this process looked: the queue bound's estimate of it).
  if (Holder(lease) != self && Dirty(gpu)) {
    const uint64_t queued = config_.queued_us != nullptr ? config_.queued_us() : 0;
    DrainAsSync(gpu, drain);
    const uint64_t lost = g.jobs[self].lost_us.load();
    if (queued > 0 && lost != 0) Settle(gpu, self, std::min(NowMicros(), lost + queued));
  }
  // Past a slice (at least every slice_us while launching): the file replaced, the copy is
  // followed (the same address, perhaps another slot).
  if (FollowIfReplaced(now) && (self = Slot(gpu)) < 0) return;
  if ((config_.gang_mask >> gpu & 1) && (config_.gang_mask & (config_.gang_mask - 1))) {
    BeforeLaunchGang(gpu, drain);
    Launching(gpu, NowMicros());
    return;
  }
  bool counted = false;
  for (;;) {
    if (Truncated()) return;
    // Its slot overwritten meanwhile (the file is its users' to write): a fresh one.
    if (g.jobs[self].key.load(std::memory_order_relaxed) != key_ && (self = Slot(gpu)) < 0) return;
    now = NowMicros();
    lease = g.lease.load(std::memory_order_acquire);
    if (Holder(lease) == self) {
      if ((now < End(lease) || KeepOrHandOver(gpu, self, now, lease, drain)) &&
          Bound(gpu, self, now, drain)) {
        break;
      }
      continue;
    }
    if (TryTake(gpu, self, now, lease, counted) && Bound(gpu, self, now, drain)) break;
    // Held back while it sleeps (from here: a drain above, Bound's, is its own work, not a wait).
    const uint64_t asleep = NowMicros();
    SleepMicros(config_.poll_us);
    Held(g.jobs[self], asleep, NowMicros());
  }
  Launching(gpu, NowMicros());
}

void Arbiter::Held(ArbiterJob& j, uint64_t from, uint64_t to) {
  uint64_t until = j.held_until_us.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t start = std::max(from, until);
    if (to <= start) return;
    if (j.held_until_us.compare_exchange_weak(until, to, std::memory_order_relaxed)) {
      j.held_us.fetch_add(to - start, std::memory_order_relaxed);
      return;
    }
  }
}

void Arbiter::BeforeLaunchGang(int gpu, DrainFn drain) {
  bool counted[kArbiterGpus] = {};
  int slots[kArbiterGpus];
  for (uint32_t m = config_.gang_mask; m; m &= m - 1) {
    const int b = __builtin_ctz(m);
    slots[b] = Slot(b);
    if (slots[b] < 0) return;  // no slot on one of its GPUs: not arbitrated
  }
  uint64_t now = 0;
  for (;;) {
    if (Truncated()) return;
    for (uint32_t m = config_.gang_mask; m; m &= m - 1) {  // slots overwritten meanwhile: fresh
      const int b = __builtin_ctz(m);
      if (data_->gpus[b].jobs[slots[b]].key.load(std::memory_order_relaxed) != key_ &&
          (slots[b] = Slot(b)) < 0) {
        return;
      }
    }
    now = NowMicros();
    // Its GPUs in ascending order: each held (its wait for the rest keeps it active there), kept
    // at the end of its slice, or taken; the first that cannot be is waited for, and the job says
    // it wants every GPU from there on. At the end of a slice it ran on all its GPUs, each is
    // decided again, also one whose lease ends a little later than the rest (aligned by two
    // processes at once): none is extended without its decision. While it gathers them, each one
    // it holds is decided at its own end.
    bool running = true;
    for (uint32_t m = config_.gang_mask; m && running; m &= m - 1) {
      const int b = __builtin_ctz(m);
      running = Holder(data_->gpus[b].lease.load(std::memory_order_acquire)) == slots[b];
    }
    const uint64_t decide_from = running ? now + config_.slice_us / 2 : now;
    bool all = true;
    for (uint32_t m = config_.gang_mask; m; m &= m - 1) {
      const int b = __builtin_ctz(m);
      ArbiterGpu& o = data_->gpus[b];
      const uint64_t lease = o.lease.load(std::memory_order_acquire);
      bool held = Holder(lease) == slots[b];
      if (held && decide_from >= End(lease))
        held = KeepOrHandOver(b, slots[b], now, lease, b == gpu ? drain : nullptr);
      else if (held)
        o.jobs[slots[b]].last_launch_us.store(now, std::memory_order_relaxed);
      else
        held = TryTake(b, slots[b], now, lease, counted[b]);
      if (held) continue;
      all = false;
      for (uint32_t rest = m & (m - 1); rest; rest &= rest - 1) {
        const int r = __builtin_ctz(rest);
        Want(r, slots[r], now, counted[r]);
      }
      break;
    }
    if (all) {
      // Every GPU held: the slices end together.
      const uint64_t end = now + config_.slice_us;
      bool aligned = true;
      for (uint32_t m = config_.gang_mask; m && aligned; m &= m - 1) {
        const int b = __builtin_ctz(m);
        uint64_t lease = data_->gpus[b].lease.load(std::memory_order_acquire);
        aligned = Holder(lease) == slots[b] &&
                  data_->gpus[b].lease.compare_exchange_strong(lease, Lease(slots[b], end));
      }
      if (aligned) break;
      continue;
    }
    const uint64_t asleep = NowMicros();
    SleepMicros(config_.poll_us);
    const uint64_t after = NowMicros();
    // Held back on the GPUs it waits for; on those it holds meanwhile it is charged (its cost).
    for (uint32_t m = config_.gang_mask; m; m &= m - 1) {
      const int b = __builtin_ctz(m);
      if (Holder(data_->gpus[b].lease.load(std::memory_order_acquire)) != slots[b])
        Held(data_->gpus[b].jobs[slots[b]], asleep, after);
    }
  }
  // A gang that lost this GPU while it drained launches anyway: it takes its GPUs together, and
  // waiting here for the one again would hold the others idle.
  Bound(gpu, slots[gpu], now, drain);
}

void Arbiter::DrainAsSync(int gpu, DrainFn drain) {
  if (drain == nullptr) return;
  EnterSync(gpu);
  drain();
  LeaveSync(gpu, true);
}

// A wait this long was for work still running: it ended when the work did.
constexpr uint64_t kWaitedUs = 50;

void Arbiter::Settle(int gpu, int self, uint64_t until) {
  ArbiterGpu& g = data_->gpus[gpu];
  ArbiterJob& me = g.jobs[self];
  const uint64_t lost = me.lost_us.load();
  // Nothing of this process ran past a loss it launched after (the job held the GPU again since).
  if (lost == 0 || lost < launched_us_[gpu].load(std::memory_order_relaxed)) return;
  const uint64_t lease = g.lease.load(std::memory_order_acquire);
  const int holder = Holder(lease);
  // Back at the GPU: from when it got it again the job is charged as its holder.
  if (holder == self) until = std::min(until, me.granted_us.load());
  uint64_t billed = me.billed_until_us.load();
  uint64_t from = 0;
  do {
    from = std::max(billed, lost);
    if (until <= from) return;
  } while (!me.billed_until_us.compare_exchange_weak(billed, until));
  AddUsed(me, until - from, until);
  if (holder < 0 || holder == self) return;
  // The holder's slice began at the loss and its GPU time only when this work ended: it starts
  // then, and ends as much later.
  ArbiterJob& h = g.jobs[holder];
  uint64_t start = h.lease_start_us.load();
  if (start < lost || start >= until || !h.lease_start_us.compare_exchange_strong(start, until))
    return;
  uint64_t now_lease = lease;
  if (Holder(now_lease) == holder)
    g.lease.compare_exchange_strong(now_lease, Lease(holder, End(now_lease) + (until - start)));
}

void Arbiter::EnterSync(int gpu) {
  int self = Slot(gpu);
  if (self < 0) return;
  ArbiterJob& j = data_->gpus[gpu].jobs[self];
  if (sync_depth_[gpu].fetch_add(1, std::memory_order_relaxed) == 0) {
    entered_launches_[gpu].store(launches_[gpu].load(std::memory_order_relaxed),
                                 std::memory_order_relaxed);
    entered_us_[gpu].store(NowMicros(), std::memory_order_relaxed);
  }
  j.in_sync.fetch_add(1, std::memory_order_relaxed);
  // This process's entry counts its threads in there, so that its death in there can be told.
  const uint64_t me = static_cast<uint32_t>(getpid());
  for (auto& entry : j.sync_procs) {
    uint64_t e = entry.load(std::memory_order_relaxed);
    while ((e & 0xffffffffu) == me) {
      if (entry.compare_exchange_weak(e, e + (uint64_t{1} << 32))) return;
    }
  }
  for (auto& entry : j.sync_procs) {
    uint64_t free = 0;
    if (entry.compare_exchange_strong(free, (uint64_t{1} << 32) | me)) return;
  }
}

void Arbiter::LeaveSync(int gpu, bool full) {
  int self = Slot(gpu);
  if (self < 0) return;
  ArbiterJob& j = data_->gpus[gpu].jobs[self];
  const uint64_t now = NowMicros();
  j.last_launch_us.store(now, std::memory_order_relaxed);
  const uint64_t me = static_cast<uint32_t>(getpid());
  for (auto& entry : j.sync_procs) {
    uint64_t e = entry.load(std::memory_order_relaxed);
    while ((e & 0xffffffffu) == me) {
      const uint64_t next = (e >> 32) <= 1 ? 0 : e - (uint64_t{1} << 32);
      if (entry.compare_exchange_weak(e, next)) break;
    }
  }
  int32_t cur = j.in_sync.load();
  while (cur > 0 && !j.in_sync.compare_exchange_weak(cur, cur - 1)) {
  }
  if (sync_depth_[gpu].fetch_sub(1, std::memory_order_relaxed) != 1) return;
  // The last of this process's threads in there: when it waited for work that ran past its job's
  // loss of the GPU (the loss came while it waited, or the wait was long), that work ended now.
  const uint64_t entered = entered_us_[gpu].load(std::memory_order_relaxed);
  const uint64_t lost = j.lost_us.load();
  if (Dirty(gpu) && lost != 0 && lost < now && (lost >= entered || now - entered >= kWaitedUs))
    Settle(gpu, self, now);
  if (full) {
    clean_launches_[gpu].store(entered_launches_[gpu].load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
  }
}

}  // namespace tessera::shim
