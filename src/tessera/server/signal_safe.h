#pragma once
// Text made between fork and exec (the server is multi-threaded: the child may make only
// async-signal-safe calls and allocate nothing).

#include <cstddef>
#include <cstdint>

namespace tessera::server {

// Writes `v` in decimal at `out`, which has room for kDecimalMax characters, and returns how many
// it wrote (no terminating 0).
inline constexpr size_t kDecimalMax = 20;
inline size_t WriteDecimal(int64_t v, char* out) {
  uint64_t u = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  char rev[kDecimalMax];
  size_t k = 0;
  do {
    rev[k++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u > 0);
  size_t n = 0;
  if (v < 0) out[n++] = '-';
  while (k > 0) out[n++] = rev[--k];
  return n;
}

}  // namespace tessera::server
