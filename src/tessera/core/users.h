#pragma once
// Who a uid is on this machine.

#include <pwd.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace tessera::core {

// `uid`'s login name (getpwuid_r); nullopt where this machine has no such user. Callers choose
// what stands for one without a name: the server and the Slurm exporter "uid:1234", as owners and
// labels; `tessera slurm acct` the bare number, as sacct.
inline std::optional<std::string> LoginName(uid_t uid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr)
    return std::string(found->pw_name);
  return std::nullopt;
}

}  // namespace tessera::core
