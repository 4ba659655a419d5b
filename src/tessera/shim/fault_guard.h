#pragma once
// Shared files a job's user may write (the arbiter, a job's region) can be truncated under the
// processes that map them; an access past the file's new end raises SIGBUS, which kills the process
// - every tenant of the machine, for the arbiter. The guard catches SIGBUS at an address inside a
// registered mapping, puts anonymous zero pages in the whole mapping's place (MAP_FIXED: the same
// address, private to this process from then on), counts the fault, and returns, so the faulting
// access runs again on the zero pages. The owner of the mapping sees the count (Faults) and stops
// trusting it: the region refuses allocations, the arbiter leaves this process unpaced until the
// file at its path is replaced. Any other SIGBUS goes to the handler that was there before (or to
// the default action: the process dies of it as it would have).
//
// Async-signal-safe where it matters: the handler reads a fixed table of atomics and calls mmap
// through syscall(2). Guard and Unguard may be called from any thread.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tessera::shim {

inline constexpr int kGuardedMappings = 256;  // a process maps a few; tests many

// Guards the mapping [base, base + size); installs the handler on first use. Returns its fault
// count (how many times it was replaced by zero pages: one relaxed load tells the owner), or null
// when the table is full or the handler cannot be installed (then a truncation still kills).
const std::atomic<uint64_t>* GuardMapping(void* base, size_t size);
// Stops guarding the mapping at `base` (before it is unmapped).
void UnguardMapping(void* base);
// How many times the mapping at `base` faulted and was replaced by zero pages (0: never, or not
// guarded).
uint64_t MappingFaults(const void* base);
// Starts its count again: the owner mapped a whole file at `base` again (MAP_FIXED).
void ClearMappingFaults(const void* base);

}  // namespace tessera::shim
