#pragma once
// The shared accounting region: a small file mapped by every process of a job (and read by the
// server or agent). It holds the job's GPU memory limit per device, the bytes in use per device,
// and one slot per attached process (pid, its start time, its bytes per device, its kernel
// launches) so a crashed process's memory can be given back. Attaching and accounting are lock-free
// (the creator publishes the region by writing its magic last; slots are claimed by
// compare-and-swap); only the reclaiming of dead processes' slots takes an flock on the file, and
// it runs when an allocation would not fit or memory is asked about, not on every start. Layout is
// versioned; a file of another version is refused. No exceptions, no allocation after Attach:
// usable from the intercept library.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace tessera::shim {

inline constexpr uint64_t kRegionMagic = 0x4e4f494745525354ull;  // "TSREGION"
inline constexpr uint32_t kRegionVersion = 2;
inline constexpr int kMaxDevices = 16;
inline constexpr int kMaxProcs = 1024;

struct ProcSlot {
  std::atomic<int32_t> pid;
  // The process's pid as the driver lists it when that is not `pid` (a pid namespace: the host's,
  // found by the process itself); 0 otherwise. Lets a job see its own processes in NVML's lists.
  std::atomic<int32_t> driver_pid;
  std::atomic<uint64_t> start_time;  // /proc/<pid>/stat field 22, to tell a reused pid
  std::atomic<uint64_t> used[kMaxDevices];
  std::atomic<uint64_t> kernel_launches;
};

// VMM memory a job's processes share: exported by one (cuMemExportToShareableHandle), imported by
// others (cuMemImportFromShareableHandle). The driver frees it when the last handle and the last
// mapping of it are gone, in whichever process; so it is charged once for the job, to one of the
// processes holding it (`payer`, whose slot's `used` carries it), and passed on to another holder
// when that one lets go or dies. An importer finds the entry by the exported file itself: kcmp
// tells whether its descriptor is the same open file as a holder's kept copy (`ref_pid`/`ref_fd`);
// a fabric handle by its bytes. Changed only under the region file's lock.
inline constexpr int kMaxShared = 256;
inline constexpr int kSharedRefs = 4;
struct SharedAlloc {
  uint64_t id;  // 0: a free entry
  uint64_t bytes;
  int32_t device;
  int32_t payer;                     // index of the slot charged
  uint64_t holders[kMaxProcs / 64];  // slots holding it (a handle or a mapping), as bits
  int32_t ref_pid[kSharedRefs];      // 0: none
  int32_t ref_fd[kSharedRefs];
  uint8_t fabric[64];  // a fabric handle's bytes; zero for descriptors
};

struct RegionData {
  std::atomic<uint64_t> magic;  // written last by the creator: the region is ready once it is set
  uint32_t version;
  uint32_t device_count;
  uint64_t limit[kMaxDevices];  // bytes; 0 = no limit on that device
  std::atomic<uint64_t> used[kMaxDevices];
  std::atomic<uint64_t> peak[kMaxDevices];  // the most `used` has been (the job's history)
  std::atomic<uint64_t> attaches;
  std::atomic<uint64_t> reclaimed_bytes;  // given back from dead processes, in all
  ProcSlot procs[kMaxProcs];
  // Added later in version 2: a file without it (kRegionSizeWithoutShared bytes, made by an
  // earlier build) is still accepted, its processes then charging each import themselves.
  uint64_t next_shared_id;
  SharedAlloc shared[kMaxShared];
  // Added later still (a file without them, kRegionSizeWithoutRefusals bytes, is accepted): the
  // allocations refused for the limit per device, and the most the job would have held - what it
  // held at a refusal plus what it asked then. What a job that outgrew its size needed (at least).
  std::atomic<uint64_t> refused[kMaxDevices];
  std::atomic<uint64_t> wanted_peak[kMaxDevices];
};
inline constexpr size_t kRegionSizeWithoutShared = offsetof(RegionData, next_shared_id);
inline constexpr size_t kRegionSizeWithoutRefusals = offsetof(RegionData, refused);
// The sizes a region file of an earlier build has (its layout grew at its end since).
inline constexpr size_t kRegionEarlierSizes[] = {kRegionSizeWithoutRefusals,
                                                 kRegionSizeWithoutShared};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);

class Region {
 public:
  // Maps the region file at `path`, creating and initialising it with `limits` (bytes per device,
  // `count` of them) when it does not exist or is empty, and claims a slot for this process after
  // giving back the memory of dead processes. Returns nullptr and writes why into `err` on failure.
  static Region* Attach(const char* path, const uint64_t* limits, int count, char* err,
                        size_t err_len);
  // A region private to this process (no file), for a job without one.
  static Region* Private(const uint64_t* limits, int count, char* err, size_t err_len);

  // Takes `bytes` on `device` if the total stays within the limit (after giving back dead
  // processes' memory when it would not); false (nothing taken) otherwise. Safe under concurrent
  // calls from any number of processes. A refusal for the limit is counted (NoteRefused) unless
  // `count_refusal` is false (the caller will try again after making room).
  bool Reserve(int device, uint64_t bytes, bool count_refusal = true);
  // Gives `bytes` back; never takes the counters below zero.
  void Release(int device, uint64_t bytes);
  void CountLaunch();
  // What this process's slot holds on `device`.
  uint64_t SlotUsed(int device) const;
  // Whether `pid` holds a slot: is one of the job's processes (by its pid or its driver pid).
  bool HasProcess(int pid) const;
  // Records this process's pid as the driver lists it (ProcSlot::driver_pid).
  void SetDriverPid(int pid);

  // Shared VMM memory (SharedAlloc). Each takes the file lock.
  // Makes `bytes` on `device`, charged to this process, shared memory of the job, findable by
  // `kept_fd` (this process's copy of an exported descriptor; -1: none) or `fabric` (64 bytes;
  // null: none). Its id, or 0 when it cannot be (no table in this file, the table full): the charge
  // stays this process's alone.
  uint64_t Share(int device, uint64_t bytes, int kept_fd, const uint8_t* fabric);
  // Another exported descriptor of shared memory `id` this process holds, as a witness.
  void AddWitness(uint64_t id, int kept_fd);
  // The id of the shared memory `fd` (an imported descriptor; -1: none) or `fabric` is, now held
  // by this process too (its `kept_fd` a witness; -1: none), or 0 when it is no shared memory of
  // the job (exported by another job, or kcmp refused): then the importer charges it itself. The
  // entry's device and size in `device` and `bytes`.
  uint64_t Join(int fd, const uint8_t* fabric, int kept_fd, int* device, uint64_t* bytes);
  // This process no longer holds shared memory `id`: its charge passes to another holder, or is
  // given back with the last.
  void Leave(uint64_t id);
  bool HasSharedTable() const { return size_ >= kRegionSizeWithoutRefusals; }

  // The limit on `device`: the stricter of the region's and this process's own (Attach's `limits`);
  // 0 = none.
  uint64_t Limit(int device) const;
  uint64_t Used(int device) const;
  uint64_t Peak(int device) const;
  // Gives back the memory of slots whose process is gone; returns how many slots. Takes the file
  // lock. Runs by itself when a reservation would not fit. Costs a kill(0) and a /proc read per
  // attached process.
  int ReclaimDead();
  // ReclaimDead at most once per `interval_us` in this process, and never waiting for another
  // process's (the file lock is only tried): what memory queries run, so that their cost does not
  // grow with the number of attached processes. The first call in a process always reclaims.
  int ReclaimDeadIfDue(uint64_t interval_us);
  // After fork(): the child is a new process and needs a slot of its own.
  void ReattachAfterFork();
  RegionData* data() { return data_; }

 private:
  Region(RegionData* data, int fd, size_t size) : data_(data), fd_(fd), size_(size) {}
  bool ClaimSlot();
  void ReleaseFormerImage();
  // Gives back what slot `s` holds (never taking the totals below zero) and frees it; under the
  // file lock.
  void FreeSlot(ProcSlot& s);
  bool TryReserve(int device, uint64_t bytes);
  // Counts a reservation of `bytes` on `device` refused for the limit (RegionData::refused,
  // wanted_peak); nothing in a file without them or on a device without a limit.
  void NoteRefused(int device, uint64_t bytes);
  void ReclaimDeadLocked();
  // Passes slot `from`'s part in shared memory to another holder (or drops it with the last);
  // under the file lock, before the slot is freed or as the process leaves.
  void DropHolder(SharedAlloc& a, int from);
  int SlotIndex(const ProcSlot* s) const { return static_cast<int>(s - data_->procs); }
  RegionData* data_;
  int fd_;
  size_t size_;  // the mapping's: sizeof(RegionData), or one of kRegionEarlierSizes
  ProcSlot* slot_ = nullptr;
  int reclaimed_slots_ = 0;
  std::atomic<uint64_t> last_reclaim_us_{0};  // CLOCK_MONOTONIC; 0: never
  uint64_t own_limit_[kMaxDevices] = {};      // the process's own (environment's) limits; 0: none
  const std::atomic<uint64_t>* faults_ = nullptr;  // the mapping's faults (fault_guard.h)
  std::atomic<bool> said_truncated_{false};
};

// Creates (when missing) the region file at `path` with `limits`, as Attach would, but claims no
// slot: for a server that prepares the file before the job starts (so that the job needs no right
// to create files there). False with why in `err` when it cannot, or when a file there is not a
// region.
bool CreateRegionFile(const char* path, const uint64_t* limits, int count, char* err,
                      size_t err_len);

// Maps the shared file at `path` (`kind` names it in errors) of `size` bytes, creating it when it
// does not exist: the creator sizes it, runs `init` on the zeroed memory, then writes `version` and
// last `magic` (the file's first 8 and next 4 bytes); others wait briefly for that and refuse
// another magic, version or size. Returns the mapping and its descriptor in `fd_out`, or nullptr
// with why in `err`.
// `earlier_sizes` are accepted too (a layout that grew since at its end), and `size_out` says
// which was mapped.
void* MapSharedFile(const char* path, const char* kind, size_t size, uint64_t magic,
                    uint32_t version, void (*init)(void* mem, const void* arg), const void* arg,
                    int* fd_out, char* err, size_t err_len,
                    std::span<const size_t> earlier_sizes = {}, size_t* size_out = nullptr);

// Maps the shared file now at `path` over the mapping at `at` (MAP_FIXED, `size` bytes: every
// thread using the old mapping sees the new file from then on, at the same address), after the same
// checks as MapSharedFile; never creates it. Its device and inode go to `dev` and `ino`. False with
// why in `err`, the old mapping untouched. How a process follows a file that was replaced
// (renamed over) to revoke the access of whoever still holds the old one.
bool RemapSharedFile(const char* path, const char* kind, size_t size, uint64_t magic,
                     uint32_t version, void* at, uint64_t* dev, uint64_t* ino, char* err,
                     size_t err_len);

// Reading a shared file without joining it (no slot, nothing created or waited for, nothing
// mapped): what the server and the agent read of jobs' usage. A job can write these files, so it
// can truncate them or fill them with garbage at any moment; a mapping would then fault the reader
// (SIGBUS), while these reads copy through pread and only fail. What they return is the job's word:
// bound every index read from it.
//
// Opens `path` for ReadSharedAt: a regular file (not a symlink, FIFO or device) of exactly `size`
// bytes (or one of `earlier_sizes`) whose head holds `magic` and `version`. Returns the
// descriptor (the caller closes it), or -1 when the file is missing or is not such a file.
int OpenSharedFile(const char* path, size_t size, uint64_t magic, uint32_t version,
                   std::span<const size_t> earlier_sizes = {});
// Copies `len` bytes at `offset` of the file open as `fd` into `out`; false when the file no longer
// holds them (truncated meanwhile) or cannot be read.
bool ReadSharedAt(int fd, void* out, size_t len, size_t offset);
// OpenSharedFile, one ReadSharedAt of `len` bytes at `offset`, close: false when either fails.
bool ReadSharedFile(const char* path, size_t size, uint64_t magic, uint32_t version, void* out,
                    size_t len, size_t offset = 0, std::span<const size_t> earlier_sizes = {});
// The head of the region file at `path` (its limits, totals and peaks: all but the process slots,
// which stay zero) and its refusals (zero in a file without them), read like ReadSharedFile; null
// when it is not a region of this version (any more). What the server and the agent read of a job's
// or pod's usage.
std::unique_ptr<RegionData> ReadRegionHead(const char* path);
// The kernel launches the process slots of the region file at `path` counted, read like
// ReadRegionHead (all the slots: about 150 KB): a freed slot keeps its count until another process
// claims it, so this is exact for a job whose processes did not come and go, and at least what its
// live and last processes launched otherwise. 0 when it is not a region of this version.
uint64_t ReadRegionLaunches(const char* path);

// /proc/<pid>/stat's state letter (field 3: R, S, Z, ...) and start time (field 22, clock ticks
// since boot); false if there is no such process.
bool ReadProcessStat(int pid, char* state, uint64_t* start_time);
// Start time of `pid` (clock ticks since boot), 0 if it does not exist.
uint64_t ProcessStartTime(int pid);

// "1073741824", "1GiB", "10G", "10GB", "1.5 GiB", "0:1GiB,1:2GiB" -> bytes per device. A size is a
// number, an optional space and a unit: none or B (bytes; a bare number must be whole); K/Ki/KiB,
// M/Mi/MiB, G/Gi/GiB, T/Ti/TiB (powers of 1024: Slurm's and Kubernetes' habits); KB, MB, GB, TB
// (powers of 1000). False on
// anything else (the caller must then refuse, never run without the limit).
bool ParseLimits(const char* text, uint64_t* limits, int* count);

}  // namespace tessera::shim
