#pragma once
// POSIX access ACLs on a file, written as the kernel reads them (the system.posix_acl_access
// extended attribute), without libacl: the owner keeps read/write, and exactly the given users get
// read/write too; the group and others get nothing. Used for the GPU arbiter file, which the
// fractional jobs of several users share: only users with such a job running may write it.

#include <sys/types.h>

#include <set>
#include <string>

#include "absl/status/status.h"

namespace tessera::server {

// Sets `path`'s ACL to: owner rw, each of `users` rw, nobody else anything. kFailedPrecondition
// when the file system has no ACLs (ENOTSUP), kInternal naming the file otherwise.
absl::Status SetUserAcl(const std::string& path, const std::set<uid_t>& users);

// The users a file's ACL names (empty when it has none, or only the owner/group/other entries).
std::set<uid_t> AclUsers(const std::string& path);

// Revokes the access of whoever is not in `users` any more to the GPU arbiter at `path`: a copy
// (shim::CopyArbiterFile) with exactly `users`' ACL entries renamed over it. Taking an ACL entry
// off is not enough: a descriptor opened before keeps writing the file; the jobs' processes follow
// the copy (shim::Arbiter::FollowIfReplaced) and such a descriptor reaches only the old one. The
// file is left as it was on failure. `open_to_all`: no ACLs where the file lives; the copy is 0666
// as the file was, and `users` is not used.
absl::Status ReplaceArbiter(const std::string& path, const std::set<uid_t>& users,
                            bool open_to_all = false);

}  // namespace tessera::server
