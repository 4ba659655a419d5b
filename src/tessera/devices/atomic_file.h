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

}  // namespace tessera::devices
