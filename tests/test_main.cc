// The main of every GoogleTest binary here: each test process gets a private temporary folder
// (TEST_TMPDIR, which ::testing::TempDir() returns) under $TMPDIR, removed when its tests end, so
// that no test leaves files behind whatever it forgets to clean up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  const char* base = getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/tessera-tests-XXXXXX";
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
