#include "tessera/devices/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
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

namespace {

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fmt::format("{}: {}", path, strerror(errno)));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::DataLossError(fmt::format("{}: read failed", path));
  return s.str();
}

}  // namespace

absl::Status InstallFile(const std::string& from, const std::string& to, mode_t mode,
                         bool* changed) {
  if (changed) *changed = false;
  auto bytes = ReadAll(from);
  if (!bytes.ok()) return bytes.status();
  struct stat st {};
  if (stat(to.c_str(), &st) == 0 && (st.st_mode & 07777) == mode) {
    auto old = ReadAll(to);
    if (old.ok() && *old == *bytes) return absl::OkStatus();
  }
  // A name of its own per writer: two installs at once (two agent pods during a roll) each
  // rename a whole file.
  const std::string tmp = fmt::format("{}.new.{}", to, getpid());
  absl::Status s = WriteFileAtomically(tmp, *bytes, mode);
  if (!s.ok()) return s;
  if (rename(tmp.c_str(), to.c_str()) != 0) {
    int e = errno;
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(fmt::format("{}: {}", to, strerror(e)));
  }
  // The rename itself made durable: a crash now leaves the new file, not a missing one.
  std::string dir = to.substr(0, to.rfind('/') == std::string::npos ? 0 : to.rfind('/'));
  if (dir.empty()) dir = ".";
  if (int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  if (changed) *changed = true;
  return absl::OkStatus();
}

}  // namespace tessera::devices
