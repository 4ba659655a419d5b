#pragma once
// Raising a shared counter to at least a value, lock-free (a peak, a mark): a lost race only
// retries while the value is still lower, so the counter never goes down.

#include <atomic>
#include <cstdint>

namespace tessera::shim {

inline void RaiseTo(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace tessera::shim
