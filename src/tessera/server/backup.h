#pragma once
// The store's backup and restore (`tessera admin backup|restore`): a consistent copy taken while
// the server runs, readable by its owner alone, and put back only while no server uses the state
// folder.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::server {

struct BackupInfo {
  int schema_version = 0;
  int64_t jobs = 0;
  uint64_t bytes = 0;
};

// Copies the store `db` (a server's <state_dir>/tessera.db, in use or not) to `dest`, a new file
// created 0600 (never an existing one: kAlreadyExists), with SQLite's online backup: a snapshot of
// one moment, whatever the server writes meanwhile. The copy is checked (integrity_check) and
// described; a failed copy is removed.
absl::StatusOr<BackupInfo> BackupStore(const std::string& db, const std::string& dest);

// Puts the backup `from` in place of <state_dir>/tessera.db. Refused while a server holds the
// state folder's lock (kFailedPrecondition naming its pid), for a file that is not a Tessera store
// or is of a newer schema than this build's, or fails its integrity check. The store replaced (with
// its -wal) is kept as `aside` (tessera.db.before-restore-<unix time>); the restored file is 0600.
absl::StatusOr<BackupInfo> RestoreStore(const std::string& from, const std::string& state_dir,
                                        std::string* aside);

}  // namespace tessera::server
