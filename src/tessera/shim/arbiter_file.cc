// The arbiter's file as a file: made (or replaced when an older Tessera left one), copied for a
// server's upgrade, and read by others than its users (a job's GPU time and utilization) - never
// through a mapping, as its users may truncate it. The pacing itself is arbiter.cc.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <new>

#include "tessera/shim/arbiter.h"
#include "tessera/shim/glibc_compat.h"  // pins the symbol versions
#include "tessera/shim/region.h"

namespace tessera::shim {

void WriteArbiterSettings(void* mem, const void* arg) {
  const auto* c = static_cast<const ArbiterConfig*>(arg);
  const ArbiterConfig defaults;
  ArbiterSettings& s = static_cast<ArbiterData*>(mem)->settings;
  s.slice_us.store(c->slice_us ? c->slice_us : defaults.slice_us);
  s.queue_us.store(c->queue_us ? c->queue_us : s.slice_us.load());
  s.idle_us.store(c->idle_us ? c->idle_us : defaults.idle_us);
}

namespace {
// Whether `path` is an arbiter file of another version (its head: the magic, then the version): a
// file that is no arbiter at all is never replaced.
bool OlderArbiterFile(const char* path) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  struct {
    uint64_t magic;
    uint32_t version;
  } head = {0, 0};
  const bool read_all = ReadSharedAt(fd, &head, sizeof(uint64_t) + sizeof(uint32_t), 0);
  close(fd);
  return read_all && head.magic == kArbiterMagic && head.version != kArbiterVersion;
}
}  // namespace

bool CreateArbiterFile(const char* path, char* err, size_t err_len, const ArbiterConfig& c) {
  int fd = -1;
  void* m = MapSharedFile(path, "GPU arbiter file", sizeof(ArbiterData), kArbiterMagic,
                          kArbiterVersion, WriteArbiterSettings, &c, &fd, err, err_len);
  if (m == nullptr && OlderArbiterFile(path)) {
    // Left by an older Tessera (an upgrade): a fresh one renamed over it. Processes that mapped
    // the old one keep it until they end; new ones are paced in this one.
    char fresh[4200];
    snprintf(fresh, sizeof fresh, "%s.new.%d", path, static_cast<int>(getpid()));
    unlink(fresh);
    m = MapSharedFile(fresh, "GPU arbiter file", sizeof(ArbiterData), kArbiterMagic,
                      kArbiterVersion, WriteArbiterSettings, &c, &fd, err, err_len);
    if (m != nullptr && rename(fresh, path) != 0) {
      snprintf(err, err_len, "%s: cannot replace the arbiter file of an older version: %s", path,
               strerror(errno));
      munmap(m, sizeof(ArbiterData));
      close(fd);
      unlink(fresh);
      return false;
    }
  }
  if (m == nullptr) return false;
  munmap(m, sizeof(ArbiterData));
  close(fd);
  return true;
}

bool CopyArbiterFile(const char* from, const char* to, char* err, size_t err_len) {
  auto* d = new (std::nothrow) ArbiterData;
  if (d == nullptr) {
    snprintf(err, err_len, "out of memory");
    return false;
  }
  if (!ReadSharedFile(from, sizeof(ArbiterData), kArbiterMagic, kArbiterVersion, d,
                      sizeof(ArbiterData))) {
    memset(static_cast<void*>(d), 0, sizeof(ArbiterData));  // not (any more) one: a fresh arbiter
  }
  for (ArbiterGpu& g : d->gpus) {
    for (ArbiterJob& j : g.jobs) {
      j.in_sync.store(0, std::memory_order_relaxed);
      for (auto& p : j.sync_procs) p.store(0, std::memory_order_relaxed);
    }
  }
  d->version = kArbiterVersion;
  d->magic.store(kArbiterMagic, std::memory_order_relaxed);
  bool ok = false;
  const int fd = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    snprintf(err, err_len, "cannot create %s: %s", to, strerror(errno));
  } else {
    const char* p = reinterpret_cast<const char*>(d);
    size_t done = 0;
    while (done < sizeof(ArbiterData)) {
      const ssize_t n = pwrite(fd, p + done, sizeof(ArbiterData) - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ok = done == sizeof(ArbiterData);
    if (!ok) snprintf(err, err_len, "cannot write %s: %s", to, strerror(errno));
    close(fd);
    if (!ok) unlink(to);
  }
  delete d;
  return ok;
}

uint64_t ArbiterJobKey(const char* job_id) {
  uint64_t h = 1469598103934665603ull;
  for (; *job_id; ++job_id) h = (h ^ static_cast<unsigned char>(*job_id)) * 1099511628211ull;
  return h ? h : 1;
}

uint64_t ArbiterBusyMicros(const char* path, int gpu, uint64_t key) {
  return ArbiterBusyMicros(path, &gpu, 1, key);
}

uint64_t ArbiterBusyMicros(const char* path, const int* gpus, int count, uint64_t key) {
  return ArbiterJobUse(path, gpus, count, key).busy_us;
}

ArbiterUse ArbiterJobUse(const char* path, const int* gpus, int count, uint64_t key) {
  ArbiterUse sum;
  if (key == 0 || count <= 0) return sum;
  // Every user with a share job may write the file: read a copy of each GPU's row, never a
  // mapping (truncation under a mapping faults its reader).
  const int fd = OpenSharedFile(path, sizeof(ArbiterData), kArbiterMagic, kArbiterVersion);
  if (fd < 0) return sum;
  auto* row = new (std::nothrow) ArbiterGpu;
  for (int i = 0; row != nullptr && i < count; ++i) {
    if (gpus[i] < 0 || gpus[i] >= kArbiterGpus) continue;
    const size_t at =
        offsetof(ArbiterData, gpus) + sizeof(ArbiterGpu) * static_cast<size_t>(gpus[i]);
    if (!ReadSharedAt(fd, row, sizeof(ArbiterGpu), at)) break;
    // One slot per job and GPU; a second (claimed again by a race) counts its most.
    uint64_t busy = 0, held = 0;
    for (const ArbiterJob& j : row->jobs) {
      if (j.key.load() != key) continue;
      busy = std::max(busy, j.busy_us.load());
      held = std::max(held, j.held_us.load());
    }
    sum.busy_us += busy;
    sum.held_us += held;
  }
  delete row;
  close(fd);
  return sum;
}

int JobUtilizationPermille(const ArbiterData* d, int gpu, uint64_t key, uint64_t now_us) {
  if (d == nullptr || gpu < 0 || gpu >= kArbiterGpus || key == 0) return -1;
  for (const ArbiterJob& j : d->gpus[gpu].jobs) {
    if (j.key.load() != key) continue;
    const uint64_t start = j.window_start_us.load();
    const uint64_t total = j.busy_us.load();
    const uint64_t busy = total - std::min(total, j.window_busy_us.load());
    const uint64_t open = now_us > start ? now_us - start : 0;
    // An idle job rolls no window: the one left open long is its utilization since.
    if (open >= kUtilizationWindowUs)
      return static_cast<int>(std::min<uint64_t>(1000, busy * 1000 / open));
    // Otherwise one window's length: the open part and the end of the last window.
    const uint64_t last = j.last_window_permille.load();
    return static_cast<int>(std::min<uint64_t>(
        1000, (busy * 1000 + last * (kUtilizationWindowUs - open)) / kUtilizationWindowUs));
  }
  return -1;
}

}  // namespace tessera::shim
