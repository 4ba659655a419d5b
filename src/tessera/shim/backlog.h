#pragma once
// How much GPU work this process has queued and not yet run on each device, and a bound on it,
// so that a job's compute share holds when it queues deep (asynchronous training loops, CUDA graph
// replays): pacing decides when kernels are submitted, and without a bound a job could submit far
// more than its slice and sit in a synchronize while its queue runs on someone else's time.
//
// Method: now and then (every kSampleEveryUs of wall time or more) a launch is bracketed by two
// timing events, whose elapsed time is what that launch's work took on the GPU; their average
// (EWMA) is the estimated GPU time of one launch. The second event is also a completion mark:
// once it has completed (cuEventQuery, never a synchronize), every launch before it has run. The
// work queued ahead is estimated as (launches submitted - launches known done) x the estimate; a
// launch that would queue more than the bound waits (Wait) until enough has run - at most
// kMaxWaitBounds times what the queue should take, so that a kernel waiting on a later one (a
// consumer spinning on a producer's flag on another stream) cannot deadlock its process. While
// the queue is near the bound, completion marks come every eighth of the bound's worth of
// launches, so that a wait ends soon after enough has run.
//
// Never used on a stream being captured, and no mark is looked at while a capture is under way
// (the caller checks): events recorded into a capture would change the graph. Thread-safe: the
// fast path (Over, Before and Launched without a mark) is a few relaxed atomics; marks and waits
// take the device's mutex. Events are made on first use in the current context; a device whose
// events fail is left unbounded.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "tessera/shim/cuda_abi.h"

namespace tessera::shim {

// The driver calls the backlog makes, and its clock (a seam for tests).
struct BacklogOps {
  CUresult (*event_create)(CUevent*, unsigned int) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
  CUresult (*event_elapsed)(float*, CUevent, CUevent) = nullptr;
  uint64_t (*now_us)() = nullptr;  // a coarse clock will do (when to time a launch, wait limits)
  void (*sleep_us)(uint64_t) = nullptr;
};

inline constexpr int kBacklogDevices = 16;
inline constexpr int kBacklogMarks = 64;          // completion marks outstanding per device
inline constexpr uint64_t kSampleEveryUs = 500;   // a timed launch at most this often
inline constexpr uint64_t kSampleLookEvery = 16;  // launches between looks at the clock
inline constexpr uint64_t kFirstLaunches = 2;     // queued before the first estimate
inline constexpr uint64_t kMaxWaitBounds = 4;     // a wait is cut after 4x what it should take
inline constexpr CUresult kNotReady = 600;        // CUDA_ERROR_NOT_READY

class Backlog {
 public:
  // `bound_us`: the most GPU time one process may have queued ahead on a device (0: no bound).
  void Init(const BacklogOps& ops, uint64_t bound_us);
  bool enabled() const { return bound_ns_ != 0; }

  // Whether a launch on `dev` now would be beyond the bound (then Wait before it).
  bool Over(int dev) const;
  // Waits (polling the marks, sleeping between) until the work queued on `dev` is within the
  // bound, or kMaxWaitBounds times the longer of the bound and the queue's estimate have passed.
  void Wait(int dev);
  // What Before began for one launch, for Launched to finish.
  struct Token {
    CUevent end = nullptr;    // the launch's completion mark, made ready (null: none)
    CUevent start = nullptr;  // recorded just before it: the launch is timed
  };
  // Around a launch on `dev` and `stream`: Before may record the start of a timed launch;
  // Launched counts it (when `ok`) and may record its completion mark.
  // `may_poll`: whether looking at completed marks (cuEventQuery) is allowed now - not while a
  // capture is under way anywhere in the process.
  Token Before(int dev, CUstream stream, bool may_poll = true);
  void Launched(const Token& token, int dev, CUstream stream, bool ok);
  // The first `upto` launches on `dev` have run (a context synchronize returned that began after
  // them: `upto` is launched() read before it).
  void Drained(int dev, uint64_t upto);

  // The GPU time (us) of the launches on `dev` not known to have run: their count times the
  // estimate of one (0 while there is none).
  uint64_t QueuedUs(int dev) const {
    if (dev < 0 || dev >= kBacklogDevices || ops_.now_us == nullptr) return 0;
    const uint64_t known =
        Queued(d_[dev]) * d_[dev].estimate_ns.load(std::memory_order_relaxed) / 1000;
    const uint64_t blind = d_[dev].blind_until_us.load(std::memory_order_relaxed);
    const uint64_t now = ops_.now_us();
    return std::max(known, blind > now ? blind - now : 0);
  }
  // While no synchronize or event query is allowed in the process (a capture in the global mode
  // is open, or this thread's own capture): launches counted "blind". Each adds the estimate of one
  // launch (unknown yet: half the bound) to the time by which this process's blind work would be
  // done if the GPU ran it back to back; a launch waits (sleeping) while that lies more than the
  // bound ahead, and a drain waits until it has passed. Without it a tenant that kept a global
  // capture open queued without limit, and its co-tenants' kernels waited behind all of it.
  bool BlindOver(int dev) const;
  void BlindWait(int dev);
  void BlindLaunched(int dev);
  void BlindDrain(int dev);
  // What the backlog knows of `dev` (for tests and logs).
  uint64_t launched(int dev) const {
    return dev >= 0 && dev < kBacklogDevices ? d_[dev].launched.load() : 0;
  }
  uint64_t done(int dev) const { return d_[dev].done.load(); }
  uint64_t estimate_ns(int dev) const { return d_[dev].estimate_ns.load(); }
  bool broken(int dev) const { return d_[dev].broken.load(); }

 private:
  struct Mark {
    CUevent start = nullptr;  // null: a completion mark only
    CUevent end = nullptr;
    uint64_t launches = 0;  // launches submitted up to and with this one
  };
  struct Device {
    std::atomic<uint64_t> launched{0}, done{0};
    std::atomic<uint64_t> estimate_ns{0};  // GPU time per launch; 0: not known yet
    std::atomic<uint64_t> next_sample_us{0};
    std::atomic<uint64_t> last_mark{0};  // launches up to the newest completion mark
    std::atomic<bool> broken{false};
    std::atomic<uint64_t> blind_until_us{0};  // the blind launches' estimated end
    std::mutex mu;                            // the rest
    Mark marks[kBacklogMarks];
    int head = 0, count = 0;
    uint64_t samples = 0;  // timed launches seen
    CUevent free_events[2 * kBacklogMarks + 2] = {};
    int free_count = 0;
  };
  CUevent TakeEvent(Device& d);  // under d.mu; null when none can be made
  void GiveEvent(Device& d, CUevent e);
  // Looks at the oldest marks (under d.mu): what completed counts as done, timed ones feed the
  // estimate. Returns whether marks are still outstanding.
  bool PollLocked(Device& d);
  uint64_t Queued(const Device& d) const;
  uint64_t BlindEstimateUs(const Device& d) const;

  BacklogOps ops_;
  uint64_t bound_ns_ = 0;
  Device d_[kBacklogDevices];
};

}  // namespace tessera::shim
