#pragma once
// Clock: the one seam for "now". Production code takes a Clock& so tests can drive time by hand.
// SteadyClock is thread-safe; FakeClock is thread-safe too (an atomic), so a test thread may
// advance it while the code under test reads it.

#include <atomic>
#include <chrono>

namespace tessera::core {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  // The process-wide instance.
  static SteadyClock& Get() {
    static SteadyClock clock;
    return clock;
  }
};

// Wall time: a TimePoint counted from the Unix epoch (what is stored and shown as a date), for code
// that records when things happened. Thread-safe.
class SystemClock final : public Clock {
 public:
  TimePoint Now() const override {
    return TimePoint(
        std::chrono::duration_cast<Duration>(std::chrono::system_clock::now().time_since_epoch()));
  }
  static SystemClock& Get() {
    static SystemClock clock;
    return clock;
  }
};

// Seconds of a TimePoint since its clock's epoch.
inline double Seconds(TimePoint t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

class FakeClock final : public Clock {
 public:
  explicit FakeClock(TimePoint start = TimePoint(std::chrono::hours(1)))
      : now_(start.time_since_epoch().count()) {}
  TimePoint Now() const override { return TimePoint(Duration(now_.load())); }
  void Advance(Duration d) { now_ += d.count(); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace tessera::core
