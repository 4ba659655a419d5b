#include "tessera/server/socket_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "fmt/format.h"

namespace tessera::server {

std::string DefaultSocketPath() {
  if (geteuid() == 0) return kSystemSocket;
  const char* xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg) return std::string(xdg) + "/tessera.sock";
  return fmt::format("/tmp/tessera-{}.sock", geteuid());
}

std::string ClientSocketPath(const std::string& own,
                             const std::function<bool(const std::string&)>& listening) {
  if (own == kSystemSocket || listening(own)) return own;
  return kSystemSocket;
}

std::string ClientSocketPath() {
  return ClientSocketPath(DefaultSocketPath(), [](const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
  });
}

}  // namespace tessera::server
