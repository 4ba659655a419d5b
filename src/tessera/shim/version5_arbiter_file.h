#pragma once
// For tests: an arbiter file as Tessera's version 5 wrote it, mapped as the older library's
// processes keep it across an upgrade. Version 5's layout is this version's without each job
// slot's last two counters (held_us, held_until_us): 16 bytes less per slot, everything else where
// it is now. Written here from that rule, not from the reader's (arbiter_file.cc) own table.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "tessera/shim/arbiter.h"

namespace tessera::shim {

class Version5ArbiterFile {
 public:
  static constexpr size_t kJob = sizeof(ArbiterJob) - 2 * sizeof(uint64_t);
  static constexpr size_t kGpu = sizeof(ArbiterGpu) - kArbiterJobs * 2 * sizeof(uint64_t);
  static constexpr size_t kSize = sizeof(ArbiterData) - kArbiterGpus * (sizeof(ArbiterGpu) - kGpu);

  // Writes an empty version 5 file at `path` (mode `mode`; replacing what is there) and maps it.
  explicit Version5ArbiterFile(const std::string& path, mode_t mode = 0644) {
    unlink(path.c_str());
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return;
    if (ftruncate(fd, kSize) == 0 && fchmod(fd, mode) == 0) {
      void* m = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) mem_ = static_cast<char*>(m);
    }
    close(fd);
    if (mem_ == nullptr) return;
    const uint64_t magic = kArbiterMagic;
    const uint32_t version = 5;
    memcpy(mem_, &magic, sizeof magic);
    memcpy(mem_ + sizeof magic, &version, sizeof version);
  }
  ~Version5ArbiterFile() {
    if (mem_ != nullptr) munmap(mem_, kSize);
  }
  Version5ArbiterFile(const Version5ArbiterFile&) = delete;
  Version5ArbiterFile& operator=(const Version5ArbiterFile&) = delete;
  bool ok() const { return mem_ != nullptr; }

  // Job slot `slot` of GPU `gpu` as version 5 laid it out (its fields up to granted_us only).
  ArbiterJob& Job(int gpu, int slot) {
    return *reinterpret_cast<ArbiterJob*>(mem_ + offsetof(ArbiterData, gpus) + kGpu * gpu +
                                          offsetof(ArbiterGpu, jobs) + kJob * slot);
  }
  // Slot `slot` of GPU `gpu`: job `key`, charged `busy_us`, used last at `last_us` (the host's
  // monotonic clock, Arbiter::NowMicros) by process `pid` of pid namespace `pidns`.
  void Put(int gpu, int slot, uint64_t key, uint64_t busy_us, uint64_t last_us, int32_t pid,
           uint32_t pidns) {
    ArbiterJob& j = Job(gpu, slot);
    j.key = key;
    j.busy_us = busy_us;
    j.last_launch_us = last_us;
    j.window_start_us = last_us;
    j.pid = pid;
    j.pidns = pidns;
  }

 private:
  char* mem_ = nullptr;
};

}  // namespace tessera::shim
