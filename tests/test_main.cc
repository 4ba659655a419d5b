// The main of every GoogleTest binary here: each test process gets a private temporary folder
// (TEST_TMPDIR, which ::testing::TempDir() returns) under $TMPDIR, removed when its tests end, so
// that no test leaves files behind whatever it forgets to clean up. A process that dies before it
// can remove its folder (a crash, SIGKILL at a ctest timeout) leaves it named with its pid; the
// next test process sweeps such folders of processes that are gone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <string>

namespace {

constexpr char kPrefix[] = "tessera-tests-";

// Removes `base`/tessera-tests-<pid>-* of pids that no longer exist.
void SweepStale(const std::string& base) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const char* first = name.data() + sizeof(kPrefix) - 1;
    const char* last = name.data() + name.size();
    pid_t pid = 0;
    auto [end, err] = std::from_chars(first, last, pid);
    if (err != std::errc() || end == last || *end != '-' || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code rm;
    std::filesystem::remove_all(entry.path(), rm);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = getenv("TMPDIR");
  const std::string base = env && *env ? env : "/tmp";
  SweepStale(base);
  std::string pattern = base + "/" + kPrefix + std::to_string(getpid()) + "-XXXXXX";
  std::string dir;
  if (mkdtemp(pattern.data()) != nullptr) {
    dir = pattern;
    setenv("TEST_TMPDIR", dir.c_str(), 1);
  }
  testing::InitGoogleMock(&argc, argv);
  int rc = RUN_ALL_TESTS();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return rc;
}
