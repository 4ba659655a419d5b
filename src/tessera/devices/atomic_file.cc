#include "tessera/devices/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fmt/format.h"

namespace tessera::devices {

absl::Status WriteFileAtomically(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& file, int e) {
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(fmt::format("{}: {}", file, strerror(e)));
  };
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::FailedPreconditionError(fmt::format("{}: {}", tmp, strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      close(fd);
      return fail(tmp, e);
    }
    done += static_cast<size_t>(n);
  }
  if (fchmod(fd, mode) != 0 || fsync(fd) != 0) {
    int e = errno;
    close(fd);
    return fail(tmp, e);
  }
  if (close(fd) != 0) return fail(tmp, errno);
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail(path, errno);
  return absl::OkStatus();
}

}  // namespace tessera::devices
