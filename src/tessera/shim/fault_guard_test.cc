#include "tessera/shim/fault_guard.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

namespace tessera::shim {
namespace {

// A shared file of `pages` pages mapped from a temporary file (removed at once: the mapping keeps
// it), its descriptor for truncating it.
struct Mapped {
  int fd = -1;
  char* mem = nullptr;
  size_t size = 0;
  explicit Mapped(size_t pages) {
    size = pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::string path = ::testing::TempDir() + "guard-XXXXXX";
    fd = mkstemp(path.data());
    unlink(path.c_str());
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) return;
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    mem = m == MAP_FAILED ? nullptr : static_cast<char*>(m);
  }
  ~Mapped() {
    if (mem != nullptr) munmap(mem, size);
    if (fd >= 0) close(fd);
  }
};

// What a process does when the file under a mapping is truncated and then read: how it ended.
template <typename Fn>
int ChildStatus(Fn fn) {
  const pid_t pid = fork();
  if (pid == 0) _exit(fn());
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(FaultGuard, ATruncatedGuardedMappingReadsAsZerosAndCountsTheFault) {
  const int status = ChildStatus([] {
    Mapped m(4);
    if (m.mem == nullptr) return 10;
    const std::atomic<uint64_t>* faults = GuardMapping(m.mem, m.size);
    if (faults == nullptr) return 11;
    m.mem[m.size - 1] = 7;
    if (ftruncate(m.fd, 0) != 0) return 12;
    // Past the file's end now: SIGBUS without the guard; zero pages with it, writable too.
    const char seen = *static_cast<volatile char*>(&m.mem[m.size - 1]);
    m.mem[0] = 1;
    if (seen != 0 || faults->load() != 1 || MappingFaults(m.mem) != 1) return 13;
    ClearMappingFaults(m.mem);
    if (MappingFaults(m.mem) != 0) return 14;
    UnguardMapping(m.mem);
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(FaultGuard, ASigbusElsewhereStillKillsTheProcess) {
  // Only the guarded mappings are the guard's business: another mapping's fault takes the default
  // action, as it would have without the library.
  const int status = ChildStatus([] {
    Mapped guarded(1), other(2);
    if (GuardMapping(guarded.mem, guarded.size) == nullptr) return 11;
    if (ftruncate(other.fd, 0) != 0) return 12;
    return static_cast<int>(*static_cast<volatile char*>(&other.mem[other.size - 1]));
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGBUS);
}

TEST(FaultGuard, AHandlerInstalledBeforeStillGetsItsSignals) {
  const int status = ChildStatus([] {
    struct sigaction before = {};
    before.sa_handler = [](int) {
      _exit(42);  // as a program's own handler may: its choice, not the guard's
    };
    sigaction(SIGBUS, &before, nullptr);
    Mapped guarded(1), other(1);
    if (GuardMapping(guarded.mem, guarded.size) == nullptr) return 11;
    if (ftruncate(other.fd, 0) != 0) return 12;
    return static_cast<int>(*static_cast<volatile char*>(&other.mem[0]));
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 42);
}

}  // namespace
}  // namespace tessera::shim
