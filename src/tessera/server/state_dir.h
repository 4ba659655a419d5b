#pragma once
// The server's state folder (ServerConfig::state_dir) as a server takes it at start: its
// sub-folders made, the folder locked for this server's life (one server per state folder), and
// the intercept library installed in it under a name of its own.

#include <string>

#include "absl/status/statusor.h"

namespace tessera::server {

// Makes `dir` and its logs/, regions/ and exit/ folders, then takes <dir>/server.lock (flock, so a
// killed server leaves none behind) and writes this process's pid into it; returns its open fd,
// held until the server exits. A lock still held after `wait_s` (a server killed while forking a
// job leaves it in that child for a moment) is refused naming the holder's pid:
// FailedPrecondition, as is a folder that cannot be made.
absl::StatusOr<int> TakeStateDir(const std::string& dir, double wait_s = 3);

// Installs `library` (the intercept library jobs preload) as <state_dir>/lib/libtessera-cuda.so by
// rename, so that a rebuild writing the build's file in place never changes what running jobs have
// mapped, and a new server's install leaves them the inode they mapped. Returns the path jobs are
// to preload: the copy, or `library` itself (with a warning) when it cannot be installed.
std::string InstallInterceptLibrary(const std::string& library, const std::string& state_dir);

}  // namespace tessera::server
