#pragma once
// A version number whose changes wake those waiting on it: what a ListAndWatch (device plugin) or
// NodeWatchResources (DRA) stream waits on for something new to send. Thread-safe; its lock may be
// taken while holding the owner's (never the other way round).

#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "tessera/core/mutex.h"

namespace tessera::agent {

class ChangeFeed {
 public:
  uint64_t generation() const {
    core::MutexLock lock(mu_);
    return generation_;
  }
  void Bump() {
    core::MutexLock lock(mu_);
    ++generation_;
    changed_.notify_all();
  }
  // Waits until the generation differs from `seen`, `timeout` passes or Shutdown; returns it.
  uint64_t WaitForChange(uint64_t seen, std::chrono::milliseconds timeout) const {
    core::MutexLock lock(mu_);
    lock.WaitFor(changed_, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return generation_ != seen || shutdown_;
    });
    return generation_;
  }
  void Shutdown() {
    core::MutexLock lock(mu_);
    shutdown_ = true;
    changed_.notify_all();
  }

 private:
  mutable core::Mutex mu_;
  mutable core::CondVar changed_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera::agent
