#include "tessera/shim/region.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <new>

#include "tessera/shim/fault_guard.h"
#include "tessera/shim/glibc_compat.h"  // pins the symbol versions
#include "tessera/shim/raise_to.h"

namespace tessera::shim {
namespace {

void SetError(char* err, size_t len, const char* what, const char* path) {
  if (err == nullptr || len == 0) return;
  snprintf(err, len, "%s%s%s%s%s", path ? path : "", path ? ": " : "", what, errno ? ": " : "",
           errno ? strerror(errno) : "");
}

// The file (or anonymous mapping) starts zeroed: only the header is written, so creating a region
// touches one page, and the magic goes last.
void Init(RegionData* d, const uint64_t* limits, int count, bool publish) {
  d->device_count = static_cast<uint32_t>(count < 0             ? 0
                                          : count > kMaxDevices ? kMaxDevices
                                                                : count);
  for (uint32_t i = 0; i < d->device_count; ++i) d->limit[i] = limits[i];
  if (!publish) return;
  d->version = kRegionVersion;
  d->magic.store(kRegionMagic, std::memory_order_release);
}

void SleepMicros(long us) {
  timespec t{0, us * 1000};
  nanosleep(&t, nullptr);
}

bool Alive(const ProcSlot& s) {
  int32_t pid = s.pid.load();
  if (pid <= 0) return false;
  if (kill(pid, 0) == -1 && errno == ESRCH) return false;
  uint64_t recorded = s.start_time.load();
  if (recorded == 0) return true;  // being claimed right now
  uint64_t start = ProcessStartTime(pid);
  return start != 0 && start == recorded;
}

// A size: a number (decimals allowed with a unit), an optional space, then a unit: none or B
// (bytes); K, M, G, T, Ki, Mi, Gi, Ti or KiB, MiB, GiB, TiB (powers of 1024: Slurm's `--mem=16G`,
// Kubernetes' `16Gi`); KB, MB, GB, TB (powers of 1000, as written). `*end` is left at `s` when
// there is no number or it does not fit 64 bits; on success it points after the unit.
uint64_t ParseBytes(const char* s, const char** end) {
  *end = s;
  if (*s < '0' || *s > '9') return 0;  // strtod would take a sign, spaces, "inf" or hex
  const char* e = s;
  while ((*e >= '0' && *e <= '9') || *e == '.') ++e;
  const char* number_end = e;
  const bool decimal = memchr(s, '.', static_cast<size_t>(number_end - s)) != nullptr;
  if (*e == ' ') ++e;
  static constexpr struct {
    const char* name;
    uint64_t factor;
  } kUnits[] = {{"KiB", 1ull << 10},
                {"MiB", 1ull << 20},
                {"GiB", 1ull << 30},
                {"TiB", 1ull << 40},
                {"Ki", 1ull << 10},
                {"Mi", 1ull << 20},
                {"Gi", 1ull << 30},
                {"Ti", 1ull << 40},
                {"KB", 1000ull},
                {"MB", 1000000ull},
                {"GB", 1000000000ull},
                {"TB", 1000000000000ull},
                {"K", 1ull << 10},
                {"M", 1ull << 20},
                {"G", 1ull << 30},
                {"T", 1ull << 40},
                {"B", 1}};
  uint64_t factor = 0;
  for (const auto& u : kUnits) {
    const size_t n = strlen(u.name);
    if (strncmp(e, u.name, n) == 0) {
      factor = u.factor;
      e += n;
      break;
    }
  }
  if (factor == 0) {  // no unit: a whole number of bytes, nothing after it
    if (e != number_end || decimal) return 0;
    factor = 1;
  }
  uint64_t bytes = 0;
  errno = 0;
  if (decimal) {
    char* parsed_end = nullptr;
    const double v = strtod(s, &parsed_end) * static_cast<double>(factor);
    if (errno || parsed_end != number_end || !(v >= 0) || v >= 1.8e19) return 0;  // "1.2.3"
    bytes = static_cast<uint64_t>(v + 0.5);
    if (bytes == 0 && v > 0) return 0;  // "0.4B" is no size, and 0 would mean no limit
  } else {
    char* parsed_end = nullptr;
    const unsigned long long v = strtoull(s, &parsed_end, 10);
    if (errno || parsed_end != number_end || __builtin_mul_overflow(v, factor, &bytes)) return 0;
  }
  *end = e;
  return bytes;
}

}  // namespace

bool ReadProcessStat(int pid, char* state, uint64_t* start_time) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  // The command name is in parentheses and may hold spaces: count fields after the last ')'.
  char* p = strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return false;
  *state = p[2];  // field 3
  int field = 2;
  for (++p; *p && field < 22; ++p) {
    if (*p == ' ') ++field;
  }
  *start_time = strtoull(p, nullptr, 10);
  return true;
}

uint64_t ProcessStartTime(int pid) {
  char state;
  uint64_t start = 0;
  return ReadProcessStat(pid, &state, &start) ? start : 0;
}

bool ParseLimits(const char* text, uint64_t* limits, int* count) {
  *count = 0;
  if (text == nullptr || *text == 0) return false;
  const char* p = text;
  if (strchr(text, ':') == nullptr) {  // one limit for every device
    const char* end;
    uint64_t v = ParseBytes(p, &end);
    if (end == p || *end != 0) return false;
    for (int i = 0; i < kMaxDevices; ++i) limits[i] = v;
    *count = kMaxDevices;
    return true;
  }
  for (int i = 0; i < kMaxDevices; ++i) limits[i] = 0;
  bool seen[kMaxDevices] = {};
  while (*p) {
    char* e = nullptr;
    if (*p < '0' || *p > '9') return false;
    long dev = strtol(p, &e, 10);
    if (e == p || *e != ':' || dev < 0 || dev >= kMaxDevices) return false;
    p = e + 1;
    const char* end;
    uint64_t v = ParseBytes(p, &end);
    if (end == p || (*end != 0 && *end != ',')) return false;
    // A device named twice ("0:1GiB,0:80GiB") is no limit anyone meant: the last would win.
    if (seen[dev]) return false;
    seen[dev] = true;
    limits[dev] = v;
    if (dev + 1 > *count) *count = static_cast<int>(dev + 1);
    p = *end == ',' ? end + 1 : end;
  }
  return *count > 0;
}

namespace {
// Only a file this user or root (the server, the agent) made is trusted: another user's could say
// anything (a limit of 0: none), and one this user made but others may write, too. Why `fd` is
// not (a format with one %s for the kind of file), or null.
const char* Untrusted(int fd) {
  struct stat own;
  if (fstat(fd, &own) != 0 || !S_ISREG(own.st_mode)) return "the %s is not a regular file: refused";
  if (own.st_uid != 0 && own.st_uid != geteuid()) return "the %s belongs to another user: refused";
  if (own.st_uid != 0 && (own.st_mode & S_IWOTH) != 0)
    return "the %s is writable by every user: refused";
  return nullptr;
}

// Whether `fd` is a regular file of exactly `size` bytes whose head holds `magic` and `version`
// (read through pread: the file may shrink meanwhile); its stat in `st`.
bool HoldsSharedFile(int fd, size_t size, uint64_t magic, uint32_t version, struct stat* st,
                     std::span<const size_t> earlier_sizes = {}) {
  struct {
    uint64_t magic;
    uint32_t version;
  } head = {0, 0};  // every shared file's first 8 and next 4 bytes
  return fstat(fd, st) == 0 && S_ISREG(st->st_mode) &&
         (static_cast<size_t>(st->st_size) == size ||
          std::ranges::find(earlier_sizes, static_cast<size_t>(st->st_size)) !=
              earlier_sizes.end()) &&
         ReadSharedAt(fd, &head, sizeof(uint64_t) + sizeof(uint32_t), 0) && head.magic == magic &&
         head.version == version;
}
}  // namespace

void* MapSharedFile(const char* path, const char* kind, size_t size, uint64_t magic,
                    uint32_t version, void (*init)(void* mem, const void* arg), const void* arg,
                    int* fd_out, char* err, size_t err_len, std::span<const size_t> earlier_sizes,
                    size_t* size_out) {
  errno = 0;
  bool creator = true;
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EEXIST) {
    creator = false;
    fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  }
  if (fd < 0) {
    char msg[160];
    snprintf(msg, sizeof msg,
             errno == ELOOP ? "the %s is a symlink: refused" : "cannot open the %s", kind);
    if (errno == ELOOP) errno = 0;
    SetError(err, err_len, msg, path);
    return nullptr;
  }
  auto fail = [&](const char* what, bool with_errno) -> void* {
    if (!with_errno) errno = 0;
    char msg[160];
    snprintf(msg, sizeof msg, what, kind);
    SetError(err, err_len, msg, path);
    close(fd);
    return nullptr;
  };
  if (const char* why = Untrusted(fd)) return fail(why, false);
  if (creator) {
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) return fail("cannot size the %s", true);
  } else {
    // A creator may be between open and ftruncate: an empty file is waited for, briefly.
    struct stat st;
    for (int i = 0;; ++i) {
      if (fstat(fd, &st) != 0) return fail("cannot stat the %s", true);
      if (st.st_size != 0 || i == 2000) break;
      SleepMicros(100);
    }
    if (static_cast<size_t>(st.st_size) != size) {
      if (std::ranges::find(earlier_sizes, static_cast<size_t>(st.st_size)) == earlier_sizes.end())
        return fail("not a Tessera %s of this version (wrong size)", false);
      size = static_cast<size_t>(st.st_size);
    }
  }
  if (size_out != nullptr) *size_out = size;
  void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return fail("cannot map the %s", true);
  // Every shared file starts with its magic (written last by the creator) and its version.
  auto* head = static_cast<std::atomic<uint64_t>*>(m);
  auto* head_version = reinterpret_cast<uint32_t*>(static_cast<char*>(m) + sizeof(uint64_t));
  if (creator) {
    init(m, arg);
    *head_version = version;
    head->store(magic, std::memory_order_release);
  } else {
    for (int i = 0; head->load(std::memory_order_acquire) == 0 && i < 2000; ++i) SleepMicros(100);
    if (head->load(std::memory_order_acquire) != magic || *head_version != version) {
      munmap(m, size);
      return fail("not a Tessera %s of this version", false);
    }
  }
  *fd_out = fd;
  return m;
}

bool RemapSharedFile(const char* path, const char* kind, size_t size, uint64_t magic,
                     uint32_t version, void* at, uint64_t* dev, uint64_t* ino, char* err,
                     size_t err_len) {
  // Opened as it is (never created: the server or the agent made it), checked like a first
  // mapping, and its head read before the mapping is replaced: a file that is not one leaves the
  // old mapping in place.
  const int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "cannot open the %s", kind);
    SetError(err, err_len, msg, path);
    return false;
  }
  auto fail = [&](const char* what) {
    errno = 0;
    char msg[160];
    snprintf(msg, sizeof msg, what, kind);
    SetError(err, err_len, msg, path);
    close(fd);
    return false;
  };
  if (const char* why = Untrusted(fd)) return fail(why);
  struct stat st;
  if (!HoldsSharedFile(fd, size, magic, version, &st))
    return fail("not a Tessera %s of this version");
  if (mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
    return fail("cannot map the %s");
  close(fd);
  *dev = st.st_dev;
  *ino = st.st_ino;
  return true;
}

int OpenSharedFile(const char* path, size_t size, uint64_t magic, uint32_t version,
                   std::span<const size_t> earlier_sizes) {
  // O_NONBLOCK: a FIFO put in the file's place must not hang the reader (S_ISREG refuses it next).
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st;
  if (!HoldsSharedFile(fd, size, magic, version, &st, earlier_sizes)) {
    close(fd);
    return -1;
  }
  return fd;
}

bool ReadSharedAt(int fd, void* out, size_t len, size_t offset) {
  auto* p = static_cast<char*>(out);
  while (len > 0) {
    ssize_t n = pread(fd, p, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // an error, or the end of a file shrunk under us
    p += n;
    offset += static_cast<size_t>(n);
    len -= static_cast<size_t>(n);
  }
  return true;
}

std::unique_ptr<RegionData> ReadRegionHead(const char* path) {
  std::unique_ptr<RegionData> d(new (std::nothrow) RegionData());
  if (d == nullptr) return nullptr;
  const int fd =
      OpenSharedFile(path, sizeof(RegionData), kRegionMagic, kRegionVersion, kRegionEarlierSizes);
  if (fd < 0) return nullptr;
  constexpr size_t kRefusals = sizeof(RegionData) - kRegionSizeWithoutRefusals;
  struct stat st;
  bool ok = ReadSharedAt(fd, d.get(), offsetof(RegionData, procs), 0);
  // The refusals where the file has them (read whole: a file shrunk meanwhile fails the read).
  if (ok && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == sizeof(RegionData))
    ok = ReadSharedAt(fd, d->refused, kRefusals, kRegionSizeWithoutRefusals);
  close(fd);
  return ok ? std::move(d) : nullptr;
}

uint64_t ReadRegionLaunches(const char* path) {
  std::unique_ptr<ProcSlot[]> slots(new (std::nothrow) ProcSlot[kMaxProcs]);
  if (slots == nullptr) return 0;
  const int fd =
      OpenSharedFile(path, sizeof(RegionData), kRegionMagic, kRegionVersion, kRegionEarlierSizes);
  if (fd < 0) return 0;
  const bool ok =
      ReadSharedAt(fd, slots.get(), sizeof(ProcSlot) * kMaxProcs, offsetof(RegionData, procs));
  close(fd);
  uint64_t launches = 0;
  for (int i = 0; ok && i < kMaxProcs; ++i) {
    const uint64_t n = slots[i].kernel_launches.load(std::memory_order_relaxed);
    launches = n > UINT64_MAX - launches ? UINT64_MAX : launches + n;  // the job's word: bounded
  }
  return ok ? launches : 0;
}

bool ReadSharedFile(const char* path, size_t size, uint64_t magic, uint32_t version, void* out,
                    size_t len, size_t offset, std::span<const size_t> earlier_sizes) {
  const int fd = OpenSharedFile(path, size, magic, version, earlier_sizes);
  if (fd < 0) return false;
  const bool ok = ReadSharedAt(fd, out, len, offset);
  close(fd);
  return ok;
}

namespace {
// The region file at `path`, created for `limits` when missing.
void* MapRegionFile(const char* path, const uint64_t* limits, int count, int* fd, size_t* size,
                    char* err, size_t err_len) {
  struct Arg {
    const uint64_t* limits;
    int count;
  } arg{limits, count};
  return MapSharedFile(
      path, "shared region", sizeof(RegionData), kRegionMagic, kRegionVersion,
      [](void* mem, const void* a) {
        auto* p = static_cast<const Arg*>(a);
        Init(static_cast<RegionData*>(mem), p->limits, p->count, false);
      },
      &arg, fd, err, err_len, kRegionEarlierSizes, size);
}
}  // namespace

Region* Region::Attach(const char* path, const uint64_t* limits, int count, char* err,
                       size_t err_len) {
  int fd = -1;
  size_t size = 0;
  void* m = MapRegionFile(path, limits, count, &fd, &size, err, err_len);
  if (m == nullptr) return nullptr;
  auto* d = static_cast<RegionData*>(m);
  auto fail = [&](const char* what) {
    errno = 0;
    SetError(err, err_len, what, path);
    munmap(m, size);
    close(fd);
    return nullptr;
  };
  Region* r = new (std::nothrow) Region(d, fd, size);
  if (r == nullptr) return fail("out of memory");
  // The job's user may truncate the file under its processes: zero pages in its place then, not
  // SIGBUS (fault_guard.h), and Reserve refuses from then on.
  r->faults_ = GuardMapping(m, size);
  r->ReleaseFormerImage();
  // The process's own limits (its environment) hold too: a region file that says less (0: none)
  // does not lift them; the stricter of the two applies.
  for (int i = 0; i < count && i < kMaxDevices; ++i) r->own_limit_[i] = limits[i];
  if (!r->ClaimSlot()) {
    // Perhaps dead processes hold every slot.
    r->ReclaimDead();
    if (!r->ClaimSlot()) {
      errno = 0;
      SetError(err, err_len, "no free process slot in the shared region", path);
      return nullptr;
    }
  }
  d->attaches.fetch_add(1);
  return r;
}

bool CreateRegionFile(const char* path, const uint64_t* limits, int count, char* err,
                      size_t err_len) {
  int fd = -1;
  size_t size = 0;
  void* m = MapRegionFile(path, limits, count, &fd, &size, err, err_len);
  if (m == nullptr) return false;
  munmap(m, size);
  close(fd);
  return true;
}

Region* Region::Private(const uint64_t* limits, int count, char* err, size_t err_len) {
  void* m =
      mmap(nullptr, sizeof(RegionData), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    SetError(err, err_len, "cannot map a private region", nullptr);
    return nullptr;
  }
  auto* d = static_cast<RegionData*>(m);
  Init(d, limits, count, true);
  Region* r = new (std::nothrow) Region(d, -1, sizeof(RegionData));
  if (r == nullptr) {
    munmap(m, sizeof(RegionData));
    return nullptr;
  }
  r->ClaimSlot();
  return r;
}

uint64_t Region::SlotUsed(int device) const {
  if (slot_ == nullptr || device < 0 || device >= kMaxDevices) return 0;
  return slot_->used[device].load(std::memory_order_relaxed);
}

bool Region::HasProcess(int pid) const {
  if (pid <= 0) return false;
  for (const ProcSlot& s : data_->procs) {
    if (s.pid.load(std::memory_order_relaxed) == pid ||
        s.driver_pid.load(std::memory_order_relaxed) == pid)
      return true;
  }
  return false;
}

void Region::SetDriverPid(int pid) {
  if (slot_ != nullptr) slot_->driver_pid.store(pid);
}

void Region::ReleaseFormerImage() {
  // A slot of this very process (its pid and start time) is the image it had before an exec():
  // that image's GPU memory went with its CUDA context, so its charges are given back.
  const int32_t me = static_cast<int32_t>(getpid());
  const uint64_t start = ProcessStartTime(me);
  if (fd_ >= 0) flock(fd_, LOCK_EX);
  for (ProcSlot& s : data_->procs) {
    if (s.pid.load() == me && s.start_time.load() == start) FreeSlot(s);
  }
  if (fd_ >= 0) flock(fd_, LOCK_UN);
}

void Region::FreeSlot(ProcSlot& s) {
  for (int d = 0; d < kMaxDevices; ++d) {
    const uint64_t bytes = s.used[d].exchange(0);
    if (bytes == 0) continue;
    uint64_t cur = data_->used[d].load();
    while (!data_->used[d].compare_exchange_weak(cur, cur > bytes ? cur - bytes : 0)) {
    }
    data_->reclaimed_bytes.fetch_add(bytes);
  }
  s.start_time.store(0);
  s.driver_pid.store(0);
  s.pid.store(0);
}

bool Region::ClaimSlot() {
  int32_t me = static_cast<int32_t>(getpid());
  const uint64_t start = ProcessStartTime(me);
  for (ProcSlot& s : data_->procs) {
    int32_t expected = 0;
    if (s.pid.compare_exchange_strong(expected, me)) {
      s.start_time.store(start);
      s.driver_pid.store(0);
      for (auto& u : s.used) u.store(0);
      s.kernel_launches.store(0);
      slot_ = &s;
      return true;
    }
  }
  slot_ = nullptr;
  return false;
}

void Region::ReclaimDeadLocked() {
  for (ProcSlot& s : data_->procs) {
    if (s.pid.load() == 0 || Alive(s)) continue;
    // Shared memory it held passes to another holder first: freeing the slot would give it back.
    if (HasSharedTable()) {
      for (SharedAlloc& a : data_->shared) {
        if (a.id != 0) DropHolder(a, SlotIndex(&s));
      }
    }
    FreeSlot(s);
    ++reclaimed_slots_;
  }
}

namespace {
bool HolderBit(const SharedAlloc& a, int slot) { return (a.holders[slot / 64] >> (slot % 64)) & 1; }
void SetHolderBit(SharedAlloc& a, int slot, bool on) {
  const uint64_t bit = uint64_t{1} << (slot % 64);
  a.holders[slot / 64] = on ? a.holders[slot / 64] | bit : a.holders[slot / 64] & ~bit;
}
void AddRef(SharedAlloc& a, int pid, int fd) {
  if (fd < 0) return;
  for (int k = 0; k < kSharedRefs; ++k) {
    if (a.ref_pid[k] == 0) {
      a.ref_pid[k] = pid;
      a.ref_fd[k] = fd;
      return;
    }
  }
}
// Whether `fd` here and `ref_fd` in `ref_pid` are the same open file (kcmp; needs the right to
// look at the other process, which a job's own processes have unless a seccomp filter refuses it).
bool SameFile(int fd, int ref_pid, int ref_fd) {
  return syscall(SYS_kcmp, getpid(), ref_pid, 0 /* KCMP_FILE */, fd, ref_fd) == 0;
}
}  // namespace

void Region::DropHolder(SharedAlloc& a, int from) {
  if (!HolderBit(a, from)) return;
  // The job can write its region: an entry whose indices are out of bounds is dropped, not used.
  if (a.device < 0 || a.device >= kMaxDevices || a.payer < 0 || a.payer >= kMaxProcs) {
    a = SharedAlloc{};
    return;
  }
  SetHolderBit(a, from, false);
  const int32_t pid = data_->procs[from].pid.load();
  for (int k = 0; k < kSharedRefs; ++k) {
    if (a.ref_pid[k] == pid) a.ref_pid[k] = 0, a.ref_fd[k] = 0;
  }
  if (a.payer != from) return;
  int next = -1;
  for (int w = 0; w < kMaxProcs / 64 && next < 0; ++w) {
    if (a.holders[w] != 0) next = w * 64 + __builtin_ctzll(a.holders[w]);
  }
  const int d = a.device;
  auto take = [&](std::atomic<uint64_t>& u) {
    uint64_t cur = u.load();
    while (!u.compare_exchange_weak(cur, cur > a.bytes ? cur - a.bytes : 0)) {
    }
  };
  take(data_->procs[from].used[d]);
  if (next >= 0) {  // the charge moves; the job's total stays
    data_->procs[next].used[d].fetch_add(a.bytes);
    a.payer = next;
    return;
  }
  take(data_->used[d]);  // the last holder: the driver frees it now
  a = SharedAlloc{};
}

uint64_t Region::Share(int device, uint64_t bytes, int kept_fd, const uint8_t* fabric) {
  if (!HasSharedTable() || slot_ == nullptr || device < 0 || device >= kMaxDevices) return 0;
  if (fd_ >= 0) flock(fd_, LOCK_EX);
  uint64_t id = 0;
  for (SharedAlloc& a : data_->shared) {
    if (a.id != 0) continue;
    a = SharedAlloc{};
    a.id = id = ++data_->next_shared_id;
    a.bytes = bytes;
    a.device = device;
    a.payer = SlotIndex(slot_);
    SetHolderBit(a, a.payer, true);
    AddRef(a, slot_->pid.load(), kept_fd);
    if (fabric != nullptr) memcpy(a.fabric, fabric, sizeof a.fabric);
    break;
  }
  if (fd_ >= 0) flock(fd_, LOCK_UN);
  return id;
}

void Region::AddWitness(uint64_t id, int kept_fd) {
  if (!HasSharedTable() || slot_ == nullptr || id == 0) return;
  if (fd_ >= 0) flock(fd_, LOCK_EX);
  for (SharedAlloc& a : data_->shared) {
    if (a.id == id) AddRef(a, slot_->pid.load(), kept_fd);
  }
  if (fd_ >= 0) flock(fd_, LOCK_UN);
}

uint64_t Region::Join(int fd, const uint8_t* fabric, int kept_fd, int* device, uint64_t* bytes) {
  if (!HasSharedTable() || slot_ == nullptr) return 0;
  static const uint8_t kNone[64] = {};
  if (fd_ >= 0) flock(fd_, LOCK_EX);
  uint64_t id = 0;
  for (SharedAlloc& a : data_->shared) {
    if (a.id == 0 || a.device < 0 || a.device >= kMaxDevices) continue;
    bool same = fabric != nullptr && memcmp(fabric, kNone, sizeof kNone) != 0 &&
                memcmp(a.fabric, fabric, sizeof a.fabric) == 0;
    for (int k = 0; !same && fd >= 0 && k < kSharedRefs; ++k) {
      same = a.ref_pid[k] != 0 && SameFile(fd, a.ref_pid[k], a.ref_fd[k]);
    }
    if (!same) continue;
    SetHolderBit(a, SlotIndex(slot_), true);
    bool witness = false;
    for (int k = 0; k < kSharedRefs; ++k) witness = witness || a.ref_pid[k] == slot_->pid.load();
    if (!witness) AddRef(a, slot_->pid.load(), kept_fd);
    id = a.id;
    *device = a.device;
    *bytes = a.bytes;
    break;
  }
  if (fd_ >= 0) flock(fd_, LOCK_UN);
  return id;
}

void Region::Leave(uint64_t id) {
  if (!HasSharedTable() || slot_ == nullptr || id == 0) return;
  if (fd_ >= 0) flock(fd_, LOCK_EX);
  for (SharedAlloc& a : data_->shared) {
    if (a.id == id) DropHolder(a, SlotIndex(slot_));
  }
  if (fd_ >= 0) flock(fd_, LOCK_UN);
}

int Region::ReclaimDead() {
  if (fd_ >= 0) flock(fd_, LOCK_EX);
  int before = reclaimed_slots_;
  ReclaimDeadLocked();
  if (fd_ >= 0) flock(fd_, LOCK_UN);
  return reclaimed_slots_ - before;
}

int Region::ReclaimDeadIfDue(uint64_t interval_us) {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  const uint64_t now = static_cast<uint64_t>(t.tv_sec) * 1000000 + t.tv_nsec / 1000 + 1;
  uint64_t last = last_reclaim_us_.load(std::memory_order_relaxed);
  if (last != 0 && now - last < interval_us) return 0;
  if (!last_reclaim_us_.compare_exchange_strong(last, now)) return 0;  // another thread's turn
  if (fd_ >= 0 && flock(fd_, LOCK_EX | LOCK_NB) != 0) return 0;        // another process's turn
  const int before = reclaimed_slots_;
  ReclaimDeadLocked();
  if (fd_ >= 0) flock(fd_, LOCK_UN);
  return reclaimed_slots_ - before;
}

void Region::ReattachAfterFork() {
  // The parent's slot stays the parent's; the child starts with nothing allocated.
  if (fd_ >= 0) flock(fd_, LOCK_EX);
  ClaimSlot();
  if (fd_ >= 0) flock(fd_, LOCK_UN);
}

bool Region::Reserve(int device, uint64_t bytes, bool count_refusal) {
  if (TryReserve(device, bytes)) return true;
  // Before saying no, give back what dead processes still hold.
  if (ReclaimDead() > 0 && TryReserve(device, bytes)) return true;
  if (count_refusal) NoteRefused(device, bytes);
  return false;
}

void Region::NoteRefused(int device, uint64_t bytes) {
  if (device < 0 || device >= kMaxDevices || size_ < sizeof(RegionData) || Limit(device) == 0)
    return;
  if (faults_ != nullptr && faults_->load(std::memory_order_relaxed) != 0) return;
  data_->refused[device].fetch_add(1, std::memory_order_relaxed);
  const uint64_t used = data_->used[device].load(std::memory_order_relaxed);
  RaiseTo(data_->wanted_peak[device], bytes > UINT64_MAX - used ? UINT64_MAX : used + bytes);
}

bool Region::TryReserve(int device, uint64_t bytes) {
  if (device < 0 || device >= kMaxDevices) return false;
  const uint64_t limit = Limit(device);
  uint64_t cur = data_->used[device].load(std::memory_order_relaxed);
  // After the reads above: a file truncated under them has faulted by now (fault_guard.h).
  if (faults_ != nullptr && faults_->load(std::memory_order_relaxed) != 0) {
    // What the job holds is not known any more: nothing more is allowed (fail closed).
    if (!said_truncated_.exchange(true)) {
      fprintf(stderr,
              "tessera-cuda: the job's memory region file was truncated under this process; its "
              "allocations are refused from now on\n");
    }
    return false;
  }
  for (;;) {
    if (limit != 0 && (bytes > limit || cur > limit - bytes)) return false;
    if (data_->used[device].compare_exchange_weak(cur, cur + bytes, std::memory_order_acq_rel))
      break;
  }
  // The peak follows (monotonic).
  RaiseTo(data_->peak[device], cur + bytes);
  // Counted in the total first: a crash between the two steps can only over-count (never lets the
  // job exceed its limit); the slot is what a reclaim gives back.
  if (slot_ != nullptr) slot_->used[device].fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void Region::Release(int device, uint64_t bytes) {
  if (device < 0 || device >= kMaxDevices) return;
  auto sub = [bytes](std::atomic<uint64_t>& a) {
    uint64_t cur = a.load(std::memory_order_relaxed);
    while (
        !a.compare_exchange_weak(cur, cur > bytes ? cur - bytes : 0, std::memory_order_acq_rel)) {
    }
  };
  if (slot_ != nullptr) sub(slot_->used[device]);
  sub(data_->used[device]);
}

void Region::CountLaunch() {
  if (slot_ != nullptr) slot_->kernel_launches.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Region::Limit(int device) const {
  if (device < 0 || device >= kMaxDevices) return 0;
  const uint64_t shared = data_->limit[device], own = own_limit_[device];
  return shared == 0 ? own : own == 0 ? shared : std::min(shared, own);
}

uint64_t Region::Used(int device) const {
  return device >= 0 && device < kMaxDevices ? data_->used[device].load() : 0;
}

uint64_t Region::Peak(int device) const {
  return device >= 0 && device < kMaxDevices ? data_->peak[device].load() : 0;
}

}  // namespace tessera::shim
