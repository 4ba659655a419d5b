#include "tessera/server/file_acl.h"

#include <stdio.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fmt/format.h"
#include "tessera/shim/arbiter.h"

namespace tessera::server {
namespace {

// linux/posix_acl_xattr.h and linux/posix_acl.h.
constexpr uint32_t kVersion = 2;
constexpr uint16_t kUserObj = 0x01, kUser = 0x02, kGroupObj = 0x04, kMask = 0x10, kOther = 0x20;
constexpr uint32_t kUndefinedId = ~uint32_t{0};
constexpr uint16_t kRead = 4, kWrite = 2;
constexpr char kAttr[] = "system.posix_acl_access";

struct Entry {
  uint16_t tag;
  uint16_t perm;
  uint32_t id;
};

}  // namespace

absl::Status SetUserAcl(const std::string& path, const std::set<uid_t>& users) {
  // Entries in the kernel's order: by tag, then by id.
  std::vector<Entry> e;
  e.push_back({kUserObj, kRead | kWrite, kUndefinedId});
  for (uid_t u : users) e.push_back({kUser, kRead | kWrite, static_cast<uint32_t>(u)});
  e.push_back({kGroupObj, 0, kUndefinedId});
  if (!users.empty()) e.push_back({kMask, kRead | kWrite, kUndefinedId});
  e.push_back({kOther, 0, kUndefinedId});
  std::vector<char> buf(sizeof(uint32_t) + e.size() * sizeof(Entry));
  std::memcpy(buf.data(), &kVersion, sizeof kVersion);
  std::memcpy(buf.data() + sizeof kVersion, e.data(), e.size() * sizeof(Entry));
  if (setxattr(path.c_str(), kAttr, buf.data(), buf.size(), 0) != 0) {
    if (errno == ENOTSUP || errno == EOPNOTSUPP) {
      return absl::FailedPreconditionError(
          fmt::format("{}: its file system has no POSIX ACLs", path));
    }
    return absl::InternalError(fmt::format("setting the ACL of {}: {}", path, strerror(errno)));
  }
  return absl::OkStatus();
}

std::set<uid_t> AclUsers(const std::string& path) {
  std::set<uid_t> out;
  std::vector<char> buf(4096);
  ssize_t n = getxattr(path.c_str(), kAttr, buf.data(), buf.size());
  if (n < static_cast<ssize_t>(sizeof(uint32_t))) return out;
  for (size_t at = sizeof(uint32_t); at + sizeof(Entry) <= static_cast<size_t>(n);
       at += sizeof(Entry)) {
    Entry x;
    std::memcpy(&x, buf.data() + at, sizeof x);
    if (x.tag == kUser) out.insert(static_cast<uid_t>(x.id));
  }
  return out;
}

absl::Status ReplaceArbiter(const std::string& path, const std::set<uid_t>& users,
                            bool open_to_all) {
  const std::string next = path + ".next";
  char err[256] = {};
  unlink(next.c_str());  // left by a replacement that died half-way
  absl::Status st = absl::OkStatus();
  if (!shim::CopyArbiterFile(path.c_str(), next.c_str(), err, sizeof err)) {
    st = absl::InternalError(err);
  } else if (open_to_all && chmod(next.c_str(), 0666) != 0) {
    st = absl::InternalError(fmt::format("chmod {}: {}", next, strerror(errno)));
  } else if (st = open_to_all ? absl::OkStatus() : SetUserAcl(next, users);
             st.ok() && rename(next.c_str(), path.c_str()) != 0) {
    st = absl::InternalError(fmt::format("rename {}: {}", next, strerror(errno)));
  }
  if (!st.ok()) unlink(next.c_str());
  return st;
}

}  // namespace tessera::server
