#pragma once
// CLOCK_MONOTONIC as the host reads it, whatever time namespace the caller is in. Times that
// processes compare with each other through shared memory (the arbiter's leases, a fake GPU's
// completion times) must not depend on a process's own clock: a tenant in a time namespace
// (`unshare --time --monotonic 5`, a container restored from a checkpoint) reads CLOCK_MONOTONIC
// shifted by its namespace's offset, and would hold the GPU, or be frozen, by that much. The
// offset is read from /proc/self/timens_offsets (Linux 5.6+; none before: 0) once, and again
// after a fork (a child may be in another namespace: unshare(CLONE_NEWTIME) moves children).
// No allocation, no exceptions: usable from the intercept library. Thread-safe.

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace tessera::shim {

// The monotonic clock's offset in /proc/self/timens_offsets' text ("monotonic <s> <ns>" lines),
// in ns; 0 when there is none.
inline int64_t ParseMonotonicOffsetNs(const char* text) {
  for (const char* line = text; line && *line;) {
    const char* p = line;
    while (*p == ' ') ++p;
    if (strncmp(p, "monotonic", 9) == 0 || (p[0] == '1' && p[1] == ' ')) {
      p += p[0] == '1' ? 1 : 9;
      char* end = nullptr;
      const long long s = strtoll(p, &end, 10);
      const long long ns = end ? strtoll(end, nullptr, 10) : 0;
      return static_cast<int64_t>(s) * 1000000000 + static_cast<int64_t>(ns);
    }
    line = strchr(line, '\n');
    if (line) ++line;
  }
  return 0;
}

inline std::atomic<int64_t>& MonotonicOffsetCache() {
  static std::atomic<int64_t> offset{INT64_MIN};  // INT64_MIN: not read yet
  return offset;
}

inline int64_t MonotonicOffsetNs() {
  int64_t v = MonotonicOffsetCache().load(std::memory_order_relaxed);
  if (v != INT64_MIN) return v;
  v = 0;
  const int fd = open("/proc/self/timens_offsets", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[256];
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0) {
      buf[n] = 0;
      v = ParseMonotonicOffsetNs(buf);
    }
  }
  MonotonicOffsetCache().store(v, std::memory_order_relaxed);
  return v;
}

// After a fork, in the child.
inline void ForgetMonotonicOffset() {
  MonotonicOffsetCache().store(INT64_MIN, std::memory_order_relaxed);
}

inline uint64_t HostMonotonicNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec -
                               MonotonicOffsetNs());
}

}  // namespace tessera::shim
