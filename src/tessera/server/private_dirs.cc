#include "tessera/server/private_dirs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/server/signal_safe.h"

namespace tessera::server {

namespace fs = std::filesystem;

namespace {

std::string Resolved(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

bool Under(const std::string& path, const std::string& where) {
  return path.size() > where.size() && path.compare(0, where.size(), where) == 0 &&
         path[where.size()] == '/';
}

// mkdir -p of `path` (absolute), writing into the buffer it is given. Async-signal-safe.
bool MakeDirs(char* path) {
  for (char* p = path + 1;; ++p) {
    if (*p != '/' && *p != 0) continue;
    const char c = *p;
    *p = 0;
    const bool ok = mkdir(path, 0755) == 0 || errno == EEXIST;
    *p = c;
    if (!ok) return false;
    if (c == 0) return true;
  }
}

// "/proc/self/fd/<fd>" into `out` (32 bytes). Async-signal-safe.
void FdPath(int fd, char* out) {
  static constexpr char kHead[] = "/proc/self/fd/";
  size_t n = 0;
  for (const char* h = kHead; *h; ++h) out[n++] = *h;
  n += WriteDecimal(fd, out + n);
  out[n] = 0;
}

// 0 when a process can make a mount namespace whose mounts stay its own (what EnterPrivateDirs
// first does), else the errno of the step that failed; in a child, so this process is untouched.
int ProbeMountNamespace() {
  const pid_t pid = fork();
  if (pid < 0) return errno;
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0) _exit(errno & 0xff);
    if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) _exit(errno & 0xff);
    _exit(0);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : EPERM;
}

}  // namespace

PreparedMounts PrepareMounts(const PrivateDirs& dirs) {
  PreparedMounts m;
  size_t most = 0;
  for (const auto& [source, where] :
       {std::pair{dirs.tmp, "/tmp"}, std::pair{dirs.shm, "/dev/shm"}}) {
    if (source.empty()) continue;
    PreparedMounts::Target t{.source = source, .where = Resolved(where), .keep = {}};
    bool shared = false;
    for (const std::string& k : dirs.keep) {
      if (k.empty() || k[0] != '/') continue;
      std::error_code ec;
      std::string dir =
          fs::is_directory(k, ec) ? Resolved(k) : Resolved(fs::path(k).parent_path().string());
      if (dir == t.where) shared = true;
      if (Under(dir, t.where)) t.keep.push_back(dir);
    }
    if (shared) continue;  // the job needs the whole of it: left as the host's
    std::sort(t.keep.begin(), t.keep.end());
    std::vector<std::string> outer;
    for (const std::string& k : t.keep) {
      if (!outer.empty() && (k == outer.back() || Under(k, outer.back()))) continue;
      outer.push_back(k);
    }
    t.keep = std::move(outer);
    most = std::max(most, t.keep.size());
    m.targets.push_back(std::move(t));
  }
  m.fds.assign(most, -1);
  return m;
}

bool EnterPrivateDirs(PreparedMounts& m) {
  if (m.targets.empty()) return true;
  if (unshare(CLONE_NEWNS) != 0) return false;
  // Nothing mounted from here on reaches the host (a shared root would propagate the binds).
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) return false;
  char fd_path[32];
  for (PreparedMounts::Target& t : m.targets) {
    // The kept folders, found before the bind hides them.
    for (size_t i = 0; i < t.keep.size(); ++i)
      m.fds[i] = open(t.keep[i].c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    bool ok = mount(t.source.c_str(), t.where.c_str(), nullptr, MS_BIND | MS_REC, nullptr) == 0;
    for (size_t i = 0; i < t.keep.size(); ++i) {
      if (m.fds[i] < 0) continue;  // missing on the host too: the job finds it missing
      if (ok) {
        FdPath(m.fds[i], fd_path);
        ok = MakeDirs(t.keep[i].data()) &&
             mount(fd_path, t.keep[i].c_str(), nullptr, MS_BIND | MS_REC, nullptr) == 0;
      }
      const int e = errno;
      close(m.fds[i]);
      m.fds[i] = -1;
      errno = e;
    }
    if (!ok) return false;
  }
  return true;
}

PrivateDirFolders::PrivateDirFolders(bool on, std::string tmp_base, std::string shm_base,
                                     std::string instance)
    : tmp_base_(std::move(tmp_base)),
      shm_base_(std::move(shm_base)),
      instance_(std::move(instance)) {
  if (!on) {
    reason_ = "confinement.private_tmp is off";
  } else if (geteuid() != 0) {
    reason_ = "the server does not run as root (its jobs run as its own user)";
  } else if (const int e = ProbeMountNamespace(); e != 0) {
    // A chroot ("/" not a mount's root) or a seccomp profile without unshare: every job would
    // fail to start; said instead.
    reason_ = fmt::format("a job's mount namespace cannot be made here: {}", strerror(e));
  } else {
    std::string why;
    for (const std::string& base : {tmp_base_, shm_base_}) {
      if (reason_.empty() && !EnsureParent(base, &why)) reason_ = why;
    }
  }
}

PrivateDirFolders::~PrivateDirFolders() {
  if (!enabled()) return;
  for (const std::string& base : {tmp_base_, shm_base_}) {
    // rmdir: only an empty folder goes (ENOTEMPTY else, and nothing removed).
    const std::string parent = fmt::format("{}/.tessera-{}", base, instance_);
    if (rmdir(parent.c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
      spdlog::warn("private /tmp: removing {}: {}", parent, strerror(errno));
  }
}

std::string PrivateDirFolders::FolderOf(const std::string& base, int64_t job) const {
  return fmt::format("{}/.tessera-{}/job-{}", base, instance_, job);
}

bool PrivateDirFolders::EnsureParent(const std::string& base, std::string* why) {
  const std::string parent = fmt::format("{}/.tessera-{}", base, instance_);
  struct stat st;
  if (lstat(parent.c_str(), &st) == 0 &&
      (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 077) != 0)) {
    // Planted by someone (a symlink, another user's folder): out of the way, never used.
    const std::string aside = fmt::format("{}.untrusted.{}", parent, time(nullptr));
    spdlog::warn("private /tmp: {} is not root's own folder (uid {}, mode {:o}); moved to {}",
                 parent, st.st_uid, st.st_mode & 07777, aside);
    if (rename(parent.c_str(), aside.c_str()) != 0) {
      *why = fmt::format("{} is not root's own folder and cannot be moved aside: {}", parent,
                         strerror(errno));
      return false;
    }
  }
  if (mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = fmt::format("cannot create {}: {}", parent, strerror(errno));
    return false;
  }
  if (lstat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0) {
    *why = fmt::format("{} is not root's own folder", parent);
    return false;
  }
  chmod(parent.c_str(), 0700);
  return true;
}

absl::StatusOr<PrivateDirs> PrivateDirFolders::Make(int64_t job, uid_t uid, gid_t gid) {
  if (!enabled()) return absl::FailedPreconditionError(reason_);
  Remove(job);
  PrivateDirs d{.tmp = FolderOf(tmp_base_, job), .shm = FolderOf(shm_base_, job), .keep = {}};
  for (const auto& [base, dir] : {std::pair{tmp_base_, d.tmp}, std::pair{shm_base_, d.shm}}) {
    std::string why;
    // The parent again: a tmp cleaner (systemd-tmpfiles, tmpreaper) may have taken it.
    if (!EnsureParent(base, &why)) {
    } else if (mkdir(dir.c_str(), 0700) != 0) {
      why = fmt::format("cannot create {}: {}", dir, strerror(errno));
    } else if (chown(dir.c_str(), uid, gid) != 0) {
      why = fmt::format("chown {}: {}", dir, strerror(errno));
    }
    if (!why.empty()) {
      Remove(job);
      return absl::InternalError(why);
    }
  }
  return d;
}

void PrivateDirFolders::Remove(int64_t job) {
  if (!enabled()) return;
  for (const std::string& base : {tmp_base_, shm_base_}) {
    // In root's 0700 parent: nobody swaps a folder for a link under the removal.
    std::error_code ec;
    fs::remove_all(FolderOf(base, job), ec);
    if (ec) spdlog::warn("private /tmp: removing {}: {}", FolderOf(base, job), ec.message());
  }
}

size_t PrivateDirFolders::Sweep(const std::set<int64_t>& keep) {
  if (!enabled()) return 0;
  std::set<int64_t> found;
  for (const std::string& base : {tmp_base_, shm_base_}) {
    std::error_code ec;
    for (const auto& e :
         fs::directory_iterator(fmt::format("{}/.tessera-{}", base, instance_), ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("job-", 0) != 0) continue;
      char* end = nullptr;
      const long long id = strtoll(name.c_str() + 4, &end, 10);
      if (*end == 0 && id > 0 && !keep.contains(id)) found.insert(id);
    }
  }
  for (int64_t id : found) Remove(id);
  return found.size();
}

std::string InstanceName(const std::string& state_dir) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : Resolved(state_dir)) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:012x}", h & 0xffffffffffffull);
}

}  // namespace tessera::server
