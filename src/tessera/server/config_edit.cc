// Edits of the server's config file made by tools (scripts/run, `tessera server token`): through
// the YAML library, never text substitution, and only when something must change.
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "fmt/format.h"
#include "tessera/server/server.h"

namespace tessera::server {
namespace {

absl::StatusOr<std::string> NewToken() {
  unsigned char raw[24];
  if (getrandom(raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw))
    return absl::InternalError(fmt::format("getrandom: {}", strerror(errno)));
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string t;
  for (unsigned char c : raw) t += kAlphabet[c % 62];  // 24 characters, about 143 bits
  return t;
}

// Writes `text` to `path` by rename from a 0600 file beside it: a reader sees the old file or the
// new, never a part.
absl::Status Replace(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".new";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return absl::InternalError(fmt::format("{}: {}", tmp, strerror(errno)));
  bool ok = fchmod(fd, 0600) == 0 &&
            write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            fsync(fd) == 0;
  const int saved = errno;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : saved;
    unlink(tmp.c_str());
    return absl::InternalError(fmt::format("{}: {}", path, strerror(e)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> EnsureToken(const std::string& path, const std::string& user,
                                        bool admin, bool* added) {
  *added = false;
  YAML::Node root;
  struct stat st {};
  const bool exists = stat(path.c_str(), &st) == 0;
  if (exists) {
    // Only a file the config loader takes: an edit never turns a bad file into another.
    ServerConfig check;
    check.allow_root_jobs = true;  // a root token is the server's to refuse or take at start
    if (absl::Status s = LoadServerConfig(path, &check); !s.ok()) return s;
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(fmt::format("{}: {}", path, e.what()));
    }
    if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (root["tcp"] && root["tcp"]["tokens"]) {
      for (const YAML::Node& t : root["tcp"]["tokens"]) {
        if (!t["user"] || t["user"].as<std::string>() != user) continue;
        if (admin && !(t["admin"] && t["admin"].as<bool>())) continue;
        return t["token"].as<std::string>();
      }
    }
  } else if (errno != ENOENT) {
    return absl::InternalError(fmt::format("{}: {}", path, strerror(errno)));
  } else {
    root = YAML::Node(YAML::NodeType::Map);
  }
  auto token = NewToken();
  if (!token.ok()) return token.status();
  YAML::Node entry(YAML::NodeType::Map);
  entry.SetStyle(YAML::EmitterStyle::Flow);
  entry["token"] = *token;
  entry["user"] = user;
  entry["admin"] = admin;
  root["tcp"]["tokens"].push_back(entry);
  YAML::Emitter out;
  out << root;
  std::string text = out.c_str();
  text += "\n";
  if (exists) {
    // The library keeps every key and value but not comments: the file as it was stays beside it.
    std::ifstream in(path);
    std::stringstream was;
    was << in.rdbuf();
    if (absl::Status s = Replace(path + ".bak", was.str()); !s.ok()) return s;
  }
  if (absl::Status s = Replace(path, text); !s.ok()) return s;
  *added = true;
  return *token;
}

}  // namespace tessera::server
