#include "tessera/shim/fault_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "tessera/shim/glibc_compat.h"  // pins the symbol versions

namespace tessera::shim {

namespace {

struct Guarded {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};
  std::atomic<uint64_t> faults{0};
};
Guarded guarded[kGuardedMappings];
struct sigaction previous;  // the SIGBUS action before ours
std::atomic<bool> installed{false};
std::mutex install_mu;

void OnBus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info != nullptr ? info->si_addr : nullptr);
  for (Guarded& g : guarded) {
    const uintptr_t base = g.base.load(std::memory_order_acquire);
    const size_t size = g.size.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr >= base + size) continue;
    // The file under the mapping shrank: zero pages in its place, and the access runs again.
    const long m = syscall(SYS_mmap, base, size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (m != static_cast<long>(base)) break;  // cannot: the fault is what it would have been
    g.faults.fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  // Not ours: whatever handled SIGBUS before, or the default action (which the fault, happening
  // again on return, then takes).
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) previous.sa_sigaction(sig, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
    return;
  }
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGBUS, &dfl, nullptr);
}

bool Install() {
  if (installed.load(std::memory_order_acquire)) return true;
  std::lock_guard lock(install_mu);
  if (installed.load()) return true;
  struct sigaction action = {};
  action.sa_sigaction = OnBus;
  action.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGBUS, &action, &previous) != 0) return false;
  installed.store(true, std::memory_order_release);
  return true;
}

}  // namespace

const std::atomic<uint64_t>* GuardMapping(void* base, size_t size) {
  if (base == nullptr || size == 0 || !Install()) return nullptr;
  const auto b = reinterpret_cast<uintptr_t>(base);
  std::lock_guard lock(install_mu);  // the table changes only under it (the handler only reads)
  for (Guarded& g : guarded) {
    if (g.base.load() == b) return &g.faults;
  }
  for (Guarded& g : guarded) {
    if (g.base.load() != 0) continue;
    g.faults.store(0);
    g.size.store(size, std::memory_order_release);
    g.base.store(b, std::memory_order_release);  // last: the handler looks at base first
    return &g.faults;
  }
  return nullptr;
}

void UnguardMapping(void* base) {
  std::lock_guard lock(install_mu);
  for (Guarded& g : guarded) {
    if (g.base.load() == reinterpret_cast<uintptr_t>(base)) g.base.store(0);
  }
}

void ClearMappingFaults(const void* base) {
  for (Guarded& g : guarded) {
    if (g.base.load(std::memory_order_acquire) == reinterpret_cast<uintptr_t>(base))
      g.faults.store(0, std::memory_order_release);
  }
}

uint64_t MappingFaults(const void* base) {
  for (const Guarded& g : guarded) {
    if (g.base.load(std::memory_order_acquire) == reinterpret_cast<uintptr_t>(base))
      return g.faults.load(std::memory_order_acquire);
  }
  return 0;
}

}  // namespace tessera::shim
