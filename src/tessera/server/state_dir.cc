#include "tessera/server/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/devices/atomic_file.h"
#include "tessera/server/server_util.h"

namespace tessera::server {

absl::StatusOr<int> TakeStateDir(const std::string& dir, double wait_s) {
  std::error_code ec;
  for (const char* sub : {"", "/logs", "/regions", "/exit", "/stop", "/resize"}) {
    std::filesystem::create_directories(dir + sub, ec);
    if (ec)
      return absl::FailedPreconditionError(
          fmt::format("cannot create {}{}: {}", dir, sub, ec.message()));
  }
  // One server per state folder, decided before anything in it is read or changed: recovery
  // re-adopts and ends jobs and the sweep removes cgroups, which a second server must never do to a
  // live one's.
  const std::string lock_path = dir + "/server.lock";
  const int lock = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock < 0)
    return absl::FailedPreconditionError(
        fmt::format("cannot open {}: {}", lock_path, strerror(errno)));
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  bool locked = false;
  while (!(locked = flock(lock, LOCK_EX | LOCK_NB) == 0) &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (!locked) {
    const std::string pid = LockHolder(lock);
    close(lock);
    return absl::FailedPreconditionError(fmt::format(
        "another tessera server{} is using the state folder {}: one server per state folder "
        "(give this one its own state_dir)",
        pid.empty() ? "" : " (pid " + pid + ")", dir));
  }
  const std::string me = std::to_string(getpid()) + "\n";
  if (ftruncate(lock, 0) != 0 || pwrite(lock, me.data(), me.size(), 0) < 0)
    spdlog::warn("{}: cannot record this server's pid: {}", lock_path, strerror(errno));
  return lock;
}

std::string InstallInterceptLibrary(const std::string& library, const std::string& state_dir) {
  const std::string lib_dir = state_dir + "/lib";
  std::error_code ec;
  std::filesystem::create_directories(lib_dir, ec);
  chmod(lib_dir.c_str(), 0755);  // jobs run as their users
  const std::string copy = lib_dir + "/libtessera-cuda.so";
  bool changed = false;
  if (absl::Status st = devices::InstallFile(library, copy, 0755, &changed); !st.ok()) {
    spdlog::warn(
        "intercept library: {}; jobs preload {} itself (a rebuild under running jobs "
        "would stop them)",
        std::string(st.message()), library);
    return library;
  }
  if (changed) spdlog::info("intercept library {} installed as {}", library, copy);
  return copy;
}

}  // namespace tessera::server
