#include "tessera/shim/backlog.h"

#include <algorithm>

#include "tessera/shim/raise_to.h"

namespace tessera::shim {

void Backlog::Init(const BacklogOps& ops, uint64_t bound_us) {
  ops_ = ops;
  const bool complete = ops.event_create && ops.event_record && ops.event_query &&
                        ops.event_elapsed && ops.now_us && ops.sleep_us;
  bound_ns_ = complete ? bound_us * 1000 : 0;
}

uint64_t Backlog::Queued(const Device& d) const {
  const uint64_t launched = d.launched.load(std::memory_order_relaxed);
  const uint64_t done = d.done.load(std::memory_order_relaxed);
  return launched > done ? launched - done : 0;
}

bool Backlog::Over(int dev) const {
  if (bound_ns_ == 0 || dev < 0 || dev >= kBacklogDevices) return false;
  const Device& d = d_[dev];
  if (d.broken.load(std::memory_order_relaxed)) return false;
  const uint64_t queued = Queued(d), estimate = d.estimate_ns.load(std::memory_order_relaxed);
  if (estimate == 0) return queued >= kFirstLaunches;
  return queued > bound_ns_ / estimate;
}

CUevent Backlog::TakeEvent(Device& d) {
  if (d.free_count > 0) return d.free_events[--d.free_count];
  CUevent e = nullptr;
  if (ops_.event_create(&e, 0) != CUDA_SUCCESS) return nullptr;
  return e;
}

void Backlog::GiveEvent(Device& d, CUevent e) {
  if (e != nullptr && d.free_count < static_cast<int>(std::size(d.free_events)))
    d.free_events[d.free_count++] = e;
}

bool Backlog::PollLocked(Device& d) {
  while (d.count > 0) {
    Mark& m = d.marks[d.head];
    const CUresult rc = ops_.event_query(m.end);
    if (rc == kNotReady) return true;
    if (rc == CUDA_SUCCESS && m.start != nullptr) {
      float ms = 0;
      if (ops_.event_elapsed(&ms, m.start, m.end) == CUDA_SUCCESS && ms >= 0) {
        uint64_t sample = std::max<uint64_t>(1, static_cast<uint64_t>(ms * 1e6));
        const uint64_t old = d.estimate_ns.load(std::memory_order_relaxed);
        if (d.samples++ == 0) {
          // A process's first timed launch carries one-time work (the kernel's lazy loading, the
          // driver's first submission): not an estimate. The next launch is timed at once.
          d.next_sample_us.store(0, std::memory_order_relaxed);
        } else {
          // A kernel's first launch loads it (lazy loading): one sample may be far off, so a
          // sample moves the estimate up by at most 4x.
          if (old != 0) sample = std::min(sample, 4 * old);
          d.estimate_ns.store(old == 0 ? sample : (3 * old + sample) / 4,
                              std::memory_order_relaxed);
        }
      }
    }
    // Completed - or an event the driver no longer knows (its context is gone): nothing of it
    // is left to wait for either.
    RaiseTo(d.done, m.launches);
    GiveEvent(d, m.start);
    GiveEvent(d, m.end);
    m = Mark{};
    d.head = (d.head + 1) % kBacklogMarks;
    --d.count;
  }
  return false;
}

void Backlog::Wait(int dev) {
  if (!Over(dev)) return;
  Device& d = d_[dev];
  // A kernel waiting on one not launched yet never ends: the wait is cut after kMaxWaitBounds
  // times what the queue should take (the bound, or the estimate of what is queued if longer).
  const uint64_t expected_ns =
      std::max(bound_ns_, Queued(d) * d.estimate_ns.load(std::memory_order_relaxed));
  const uint64_t deadline = ops_.now_us() + kMaxWaitBounds * expected_ns / 1000;
  for (;;) {
    bool outstanding;
    {
      std::lock_guard lock(d.mu);
      outstanding = PollLocked(d);
    }
    // Nothing outstanding to learn from (launches since the newest mark were not near the bound
    // when they went): this one goes, and the next ones get marks.
    if (!Over(dev) || !outstanding || ops_.now_us() >= deadline) return;
    ops_.sleep_us(50);
  }
}

uint64_t Backlog::BlindEstimateUs(const Device& d) const {
  const uint64_t e = d.estimate_ns.load(std::memory_order_relaxed);
  return std::max<uint64_t>(1, (e != 0 ? e : bound_ns_ / kFirstLaunches) / 1000);
}

bool Backlog::BlindOver(int dev) const {
  if (bound_ns_ == 0 || dev < 0 || dev >= kBacklogDevices) return false;
  return d_[dev].blind_until_us.load(std::memory_order_relaxed) > ops_.now_us() + bound_ns_ / 1000;
}

void Backlog::BlindWait(int dev) {
  if (!BlindOver(dev)) return;
  const uint64_t until = d_[dev].blind_until_us.load(std::memory_order_relaxed) - bound_ns_ / 1000;
  for (uint64_t now = ops_.now_us(); now < until; now = ops_.now_us())
    ops_.sleep_us(std::min<uint64_t>(until - now, 1000));
}

void Backlog::BlindLaunched(int dev) {
  if (bound_ns_ == 0 || dev < 0 || dev >= kBacklogDevices) return;
  Device& d = d_[dev];
  d.launched.fetch_add(1, std::memory_order_relaxed);  // a later completion mark covers it
  const uint64_t now = ops_.now_us(), each = BlindEstimateUs(d);
  uint64_t cur = d.blind_until_us.load(std::memory_order_relaxed);
  while (!d.blind_until_us.compare_exchange_weak(cur, std::max(cur, now) + each,
                                                 std::memory_order_relaxed)) {
  }
}

void Backlog::BlindDrain(int dev) {
  if (bound_ns_ == 0 || dev < 0 || dev >= kBacklogDevices) return;
  const uint64_t until = d_[dev].blind_until_us.load(std::memory_order_relaxed);
  for (uint64_t now = ops_.now_us(); now < until; now = ops_.now_us())
    ops_.sleep_us(std::min<uint64_t>(until - now, 1000));
}

Backlog::Token Backlog::Before(int dev, CUstream stream, bool may_poll) {
  Token token;
  if (bound_ns_ == 0 || dev < 0 || dev >= kBacklogDevices) return token;
  Device& d = d_[dev];
  if (d.broken.load(std::memory_order_relaxed)) return token;
  const uint64_t estimate = d.estimate_ns.load(std::memory_order_relaxed);
  const uint64_t launched = d.launched.load(std::memory_order_relaxed);
  // The clock is read at every kSampleLookEvery-th launch only (and until a first estimate): a
  // clock read costs as much as the rest of this path.
  const bool look = estimate == 0 || launched % kSampleLookEvery == 0;
  const uint64_t now = look ? ops_.now_us() : 0;
  const bool sample = look && now >= d.next_sample_us.load(std::memory_order_relaxed);
  // Near the bound (half of it queued, as far as is known): a completion mark every eighth of the
  // bound's worth of launches, so that a wait ends soon after enough has run (a mark costs about
  // as much as a launch: not every launch of short kernels gets one).
  const bool near =
      estimate != 0 && (Queued(d) + 1) > bound_ns_ / 2 / estimate &&
      (launched - d.last_mark.load(std::memory_order_relaxed) + 1) * estimate >= bound_ns_ / 8;
  if (!sample && !near) return token;
  std::lock_guard lock(d.mu);
  if (may_poll) PollLocked(d);  // what ran since: the estimate and the count done kept fresh
  if (d.count >= kBacklogMarks) return token;
  // Both events are made now: nothing but the launch lies between their records (an idle GPU
  // completes an event at once, so time spent between them would count as the launch's).
  token.end = TakeEvent(d);
  CUevent start = sample && token.end != nullptr ? TakeEvent(d) : nullptr;
  if (token.end == nullptr || (sample && start == nullptr)) {
    GiveEvent(d, token.end);
    d.broken.store(true);
    return Token{};
  }
  if (!sample) return token;
  d.next_sample_us.store(now + kSampleEveryUs, std::memory_order_relaxed);
  if (ops_.event_record(start, stream) != CUDA_SUCCESS) {
    GiveEvent(d, start);
    GiveEvent(d, token.end);
    d.broken.store(true);
    return Token{};
  }
  token.start = start;
  return token;
}

void Backlog::Launched(const Token& p, int dev, CUstream stream, bool ok) {
  if (bound_ns_ == 0 || dev < 0 || dev >= kBacklogDevices) return;
  Device& d = d_[dev];
  const uint64_t launches = ok ? d.launched.fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  if (p.end == nullptr) return;
  const bool recorded = ok && ops_.event_record(p.end, stream) == CUDA_SUCCESS;
  std::lock_guard lock(d.mu);
  if (!recorded || d.count >= kBacklogMarks) {
    if (ok && !recorded) d.broken.store(true);
    GiveEvent(d, p.end);
    GiveEvent(d, p.start);
    return;
  }
  d.marks[(d.head + d.count) % kBacklogMarks] = Mark{p.start, p.end, launches};
  ++d.count;
  d.last_mark.store(launches, std::memory_order_relaxed);
}

void Backlog::Drained(int dev, uint64_t upto) {
  if (bound_ns_ == 0 || dev < 0 || dev >= kBacklogDevices) return;
  RaiseTo(d_[dev].done, upto);
}

}  // namespace tessera::shim
