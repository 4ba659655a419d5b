#pragma once
// Replacing a file so that a crash leaves the old one or the new one, never half of one.

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace tessera::devices {

// Writes `text` to `path` through `path`.tmp (mode `mode`, whatever the umask), fsynced, then
// renamed over `path`. kFailedPrecondition "<file>: <why>" when it cannot; the temporary file is
// removed then.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text, mode_t mode);

// Installs the file `from` as `to` (mode `mode`) without ever writing a file that processes may
// have mapped: the bytes go to a new file beside `to`, which is then renamed over it, so a
// library LD_PRELOADed by running processes keeps its old inode for them and new processes get
// the new one. Nothing is written when `to` already holds the same bytes and mode. Sets
// `*changed` (when given) to whether `to` was replaced.
absl::Status InstallFile(const std::string& from, const std::string& to, mode_t mode,
                         bool* changed = nullptr);

}  // namespace tessera::devices
