// An upgrade under running share processes (issue 49): processes that preloaded the installed
// intercept library keep running, with their limits, while `tessera install-library` puts a new
// build's bytes (and then the old ones again) in its place - as the agent's init container does on
// every node when its DaemonSet rolls. Written in place (`cp`), the same library killed them with
// SIGSEGV, even with identical bytes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "client_util.h"

namespace tessera::shim_test {
namespace {

namespace fs = std::filesystem;

TEST(LibraryUpgrade, RunningShareProcessesKeepTheirLibraryAndLimitsThroughAnInstall) {
  const std::string dir = TempPath("upgrade");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string install = std::string(TESSERA_BINARY) + " install-library --to " + dir;
  ASSERT_EQ(tessera::test::Capture(install + " --from " TESSERA_SHIM_LIBRARY).code, 0);
  const std::string lib = dir + "/libtessera-cuda.so";
  // A new build's bytes: another file, still a library the loader takes.
  const std::string next = dir + "/next-build.so";
  fs::copy_file(TESSERA_SHIM_LIBRARY, next);
  std::ofstream(next, std::ios::app) << "tessera next build";

  // Three tenants at 1 GiB each, 800 MiB taken before the upgrade.
  Env env{.limit = "1GiB", .preload = false, .extra = "LD_PRELOAD=" + lib};
  const std::string go = dir + "/go";
  std::vector<Running> tenants;
  for (int i = 0; i < 3; ++i) {
    tenants.push_back(
        Start(env, "link", "alloc:800 waitfile:" + go + " alloc:300 launch:5 alloc:100"));
    ASSERT_EQ(tenants.back().first_line, "ok\n");
  }
  auto r = tessera::test::Capture(install + " --from " + next);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("installed"), std::string::npos) << r.out;
  ASSERT_EQ(tessera::test::Capture(install + " --from " TESSERA_SHIM_LIBRARY).code, 0);
  // The same bytes again: nothing written.
  r = tessera::test::Capture(install + " --from " TESSERA_SHIM_LIBRARY);
  EXPECT_NE(r.out.find("already current"), std::string::npos) << r.out;
  std::ofstream(go) << "go";
  for (Running& t : tenants) {
    const pid_t pid = t.pid;
    std::string out = t.Output();
    // Alive and still limited: 300 more MiB over 1 GiB refused, the rest fine.
    EXPECT_EQ(out, "oom\nok\nok\n") << "tenant " << pid;
  }
  // A process started after the upgrade runs on the new file.
  EXPECT_EQ(RunClient(env, "link", "alloc:800 alloc:300"), "ok\noom\n");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::shim_test
