#pragma once
// A mutex that Clang's thread-safety analysis checks (-Wthread-safety; the ctest
// ThreadSafety.ClangAnalysis compiles every file that uses it that way): std::mutex underneath,
// annotated as a capability, with a scoped lock whose waits on a condition variable keep it held as
// far as the analysis is concerned. What a mutex guards says so on the member
// (ABSL_GUARDED_BY(mu_)), and a function that needs it held says
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_); GCC ignores the attributes, Clang checks every access.
//
// A wait's condition is a lambda, which the analysis looks at alone: annotate it
// `[&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ... }` (it runs with the lock held).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"

namespace tessera::core {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    m_.lock();
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  void unlock() ABSL_UNLOCK_FUNCTION() {
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    m_.unlock();
  }
  bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    if (!m_.try_lock()) return false;
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return true;
  }
  // For code the analysis cannot follow (a callback run under the lock): aborts unless this thread
  // holds it, and tells the analysis it does.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
    if (owner_.load(std::memory_order_relaxed) != std::this_thread::get_id()) std::abort();
  }

 private:
  std::mutex m_;
  std::atomic<std::thread::id> owner_{};
};

using CondVar = std::condition_variable_any;

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& m) ABSL_EXCLUSIVE_LOCK_FUNCTION(m) : m_(m) { m_.lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { m_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Releases the lock while waiting on `cv` and holds it again on return: until `done()` (called
  // with the lock held) is true, or the timeout passed (then done()'s last answer).
  template <class Done>
  void Wait(CondVar& cv, Done done) {
    cv.wait(m_, done);
  }
  template <class Rep, class Period, class Done>
  bool WaitFor(CondVar& cv, std::chrono::duration<Rep, Period> timeout, Done done) {
    return cv.wait_for(m_, timeout, done);
  }
  // One wake-up or the timeout, whichever first (the caller looks again).
  template <class Rep, class Period>
  void WaitFor(CondVar& cv, std::chrono::duration<Rep, Period> timeout) {
    cv.wait_for(m_, timeout);
  }

 private:
  Mutex& m_;
};

}  // namespace tessera::core
