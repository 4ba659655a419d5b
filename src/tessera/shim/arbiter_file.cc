// The arbiter's file as a file: made (or replaced when an older Tessera left one), copied for a
// server's upgrade, and read by others than its users (a job's GPU time and utilization) - never
// through a mapping, as its users may truncate it. The pacing itself is arbiter.cc.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <new>

#include "tessera/shim/arbiter.h"
#include "tessera/shim/glibc_compat.h"  // pins the symbol versions
#include "tessera/shim/host_clock.h"
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
// An arbiter file's head: the magic, then the version.
struct Head {
  uint64_t magic = 0;
  uint32_t version = 0;
};
bool ReadHead(int fd, Head* head) {
  return ReadSharedAt(fd, head, sizeof(uint64_t) + sizeof(uint32_t), 0) &&
         head->magic == kArbiterMagic;
}

// Whether `path` is an arbiter file of another version: a file that is no arbiter at all is never
// replaced. Its version, 0 when it is none such.
uint32_t OlderArbiterFile(const char* path) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return 0;
  Head head;
  const bool arbiter = ReadHead(fd, &head);
  close(fd);
  return arbiter && head.version != kArbiterVersion ? head.version : 0;
}

// The layouts of arbiter files a job's use can be read from: this version's, and the one before
// it (an upgrade's previous file). Version 5's job slot is this one without the held-back
// counters at its end; everything else is where it is now.
struct Layout {
  uint32_t version;
  size_t job_bytes;  // one ArbiterJob
  bool held;         // counts held_us
  constexpr size_t gpu_bytes() const {
    return offsetof(ArbiterGpu, jobs) + job_bytes * kArbiterJobs;
  }
  constexpr size_t file_bytes() const {
    return offsetof(ArbiterData, gpus) + gpu_bytes() * kArbiterGpus + sizeof(ArbiterSettings);
  }
  // Copies GPU `gpu`'s row (gpu_bytes) of the file open as `fd` into `row`.
  bool ReadRow(int fd, int gpu, char* row) const {
    return ReadSharedAt(fd, row, gpu_bytes(),
                        offsetof(ArbiterData, gpus) + gpu_bytes() * static_cast<size_t>(gpu));
  }
};
static_assert(offsetof(ArbiterJob, held_until_us) + sizeof(uint64_t) == sizeof(ArbiterJob),
              "version 5's slot is version 6's without its last two counters");
constexpr Layout kLayouts[] = {{kArbiterVersion, sizeof(ArbiterJob), true},
                               {5, offsetof(ArbiterJob, held_us), false}};
static_assert(kLayouts[0].file_bytes() == sizeof(ArbiterData));
const Layout* LayoutOf(uint32_t version) {
  for (const Layout& l : kLayouts) {
    if (l.version == version) return &l;
  }
  return nullptr;
}

// A field (`T`, at `field` in ArbiterJob) of slot `slot` in a GPU's row read as bytes in `layout`.
template <typename T = uint64_t>
T Field(const char* row, const Layout& layout, int slot, size_t field) {
  T v = 0;
  memcpy(&v,
         row + offsetof(ArbiterGpu, jobs) + layout.job_bytes * static_cast<size_t>(slot) + field,
         sizeof v);
  return v;
}

// Opens the arbiter file at `path` for reading its rows: a regular file (no symlink) of a layout
// above and its size, owned by `owner` (any when -1). -1 when it is none such.
int OpenArbiterOf(const char* path, uid_t owner, const Layout** layout) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st;
  Head head;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      (owner == static_cast<uid_t>(-1) || st.st_uid == owner) && ReadHead(fd, &head) &&
      (*layout = LayoutOf(head.version)) != nullptr &&
      static_cast<size_t>(st.st_size) == (*layout)->file_bytes()) {
    return fd;
  }
  close(fd);
  return -1;
}

// Adds job `key`'s use on `gpus` in the arbiter file open as `fd` (of `layout`) to `sum`. One
// slot per job and GPU; a second (claimed again by a race) counts its most.
void AddUse(int fd, const Layout& layout, const int* gpus, int count, uint64_t key,
            ArbiterUse& sum) {
  auto* row = new (std::nothrow) char[layout.gpu_bytes()];
  for (int i = 0; row != nullptr && i < count; ++i) {
    if (gpus[i] < 0 || gpus[i] >= kArbiterGpus) continue;
    if (!layout.ReadRow(fd, gpus[i], row)) break;
    uint64_t busy = 0, held = 0;
    for (int slot = 0; slot < kArbiterJobs; ++slot) {
      if (Field(row, layout, slot, offsetof(ArbiterJob, key)) != key) continue;
      busy = std::max(busy, Field(row, layout, slot, offsetof(ArbiterJob, busy_us)));
      if (layout.held)
        held = std::max(held, Field(row, layout, slot, offsetof(ArbiterJob, held_us)));
    }
    sum.busy_us += busy;
    sum.held_us += held;
  }
  delete[] row;
}

// Keeps the arbiter file at `path`, of `version`, about to be replaced by an upgrade, readable at
// its previous path for its maker alone (0600 also masks the ACL entries of its users: they keep
// what they mapped, and need not open it again), when its layout can be read; else none.
void KeepPrevious(const char* path, uint32_t version) {
  char previous[4200];
  ArbiterPreviousPath(path, previous, sizeof previous);
  unlink(previous);  // one upgrade back is read; a file from before that is not
  if (LayoutOf(version) == nullptr || link(path, previous) != 0) return;
  if (chmod(previous, 0600) != 0) unlink(previous);
}
}  // namespace

void ArbiterPreviousPath(const char* path, char* out, size_t out_len) {
  snprintf(out, out_len, "%s.previous", path);
}

bool ArbiterPreviousKept(const char* path, char* out, size_t out_len) {
  ArbiterPreviousPath(path, out, out_len);
  return access(out, F_OK) == 0;
}

bool ArbiterPreviousIsStale(const char* previous, uint64_t now_us, const uint64_t* held,
                            size_t n_held) {
  if (access(previous, F_OK) != 0) return false;
  const Layout* layout = nullptr;
  const int fd = OpenArbiterOf(previous, static_cast<uid_t>(-1), &layout);
  if (fd < 0) return true;  // no arbiter of a layout known here: nothing in it is read
  const uint32_t pidns = PidNamespace();
  bool stale = true;
  auto* row = new (std::nothrow) char[layout->gpu_bytes()];
  for (int g = 0; stale && g < kArbiterGpus; ++g) {
    if (row == nullptr || !layout->ReadRow(fd, g, row)) {
      stale = false;  // not read: kept
      break;
    }
    for (int slot = 0; stale && slot < kArbiterJobs; ++slot) {
      const uint64_t key = Field(row, *layout, slot, offsetof(ArbiterJob, key));
      if (key == 0) continue;
      if (held != nullptr && std::find(held, held + n_held, key) != held + n_held) {
        stale = false;  // its maker still runs the job
        break;
      }
      uint64_t last = 0;
      for (size_t f : {offsetof(ArbiterJob, last_launch_us), offsetof(ArbiterJob, lease_start_us),
                       offsetof(ArbiterJob, granted_us), offsetof(ArbiterJob, want_us),
                       offsetof(ArbiterJob, window_start_us)}) {
        last = std::max(last, Field(row, *layout, slot, f));
      }
      if (last > now_us) continue;  // used before this boot: nobody of then runs
      const int32_t pid = Field<int32_t>(row, *layout, slot, offsetof(ArbiterJob, pid));
      const bool here =
          pidns != 0 && Field<uint32_t>(row, *layout, slot, offsetof(ArbiterJob, pidns)) == pidns;
      if (now_us - last < kArbiterPreviousKeepUs || (here && !ProcessGone(pid))) stale = false;
    }
  }
  delete[] row;
  close(fd);
  return stale;
}

bool RemoveStaleArbiterPrevious(const char* path, const uint64_t* held, size_t n_held) {
  char previous[4200];
  ArbiterPreviousPath(path, previous, sizeof previous);
  return ArbiterPreviousIsStale(previous, HostMonotonicNs() / 1000, held, n_held) &&
         unlink(previous) == 0;
}

bool CreateArbiterFile(const char* path, char* err, size_t err_len, const ArbiterConfig& c) {
  int fd = -1;
  void* m = MapSharedFile(path, "GPU arbiter file", sizeof(ArbiterData), kArbiterMagic,
                          kArbiterVersion, WriteArbiterSettings, &c, &fd, err, err_len);
  if (m != nullptr) {
    RemoveStaleArbiterPrevious(path);  // nothing in it used or unread any more
  } else if (const uint32_t older = OlderArbiterFile(path); older != 0) {
    // Left by an older Tessera (an upgrade): a fresh one renamed over it. Processes that mapped
    // the old one keep it until they end; new ones are paced in this one.
    char fresh[4200];
    snprintf(fresh, sizeof fresh, "%s.new.%d", path, static_cast<int>(getpid()));
    unlink(fresh);
    m = MapSharedFile(fresh, "GPU arbiter file", sizeof(ArbiterData), kArbiterMagic,
                      kArbiterVersion, WriteArbiterSettings, &c, &fd, err, err_len);
    if (m != nullptr) KeepPrevious(path, older);
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
  // (A file of the version before, not replaced yet, is read as it is.)
  const Layout* layout = nullptr;
  const int fd = OpenArbiterOf(path, static_cast<uid_t>(-1), &layout);
  if (fd < 0) return sum;
  struct stat st;
  const bool newest = layout->version == kArbiterVersion && fstat(fd, &st) == 0;
  AddUse(fd, *layout, gpus, count, key, sum);
  close(fd);
  // The job's processes started before an upgrade charge the file they mapped then.
  char previous[4200];
  ArbiterPreviousPath(path, previous, sizeof previous);
  if (const int before = newest ? OpenArbiterOf(previous, st.st_uid, &layout) : -1; before >= 0) {
    if (layout->version != kArbiterVersion) AddUse(before, *layout, gpus, count, key, sum);
    close(before);
  }
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
