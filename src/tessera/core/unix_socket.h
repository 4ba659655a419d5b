#pragma once
// A unix stream socket between two processes, and a descriptor passed over it (SCM_RIGHTS) with a
// fixed block of data beside it: what gpu-check's tenants and the shim tests' client use to hand an
// exported CUDA memory descriptor to another process. Header-only, no allocation.
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>

namespace tessera::core {

// A socket listening at `path` (whatever was there removed first); -1 on failure.
inline int ListenUnix(const char* path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
  unlink(addr.sun_path);
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && listen(s, 1) == 0)
    return s;
  if (s >= 0) close(s);
  return -1;
}

// A socket connected to `path`, trying every millisecond for up to `wait_ms` while nobody listens
// there yet; -1 when nobody did.
inline int ConnectUnix(const char* path, int wait_ms) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
  for (int i = 0; i < wait_ms; ++i, usleep(1000)) {
    const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s >= 0 && connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return s;
    if (s >= 0) close(s);
  }
  return -1;
}

// Sends `len` bytes of `data` and, when `fd` >= 0, descriptor `fd`; false unless all went.
inline bool SendWithFd(int s, const void* data, size_t len, int fd) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (fd >= 0) {
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  }
  return sendmsg(s, &m, 0) == static_cast<ssize_t>(len);
}

// Receives `len` bytes into `data` and the descriptor sent beside them into `*fd` (-1 when none
// came); false unless all `len` bytes came.
inline bool ReceiveWithFd(int s, void* data, size_t len, int* fd) {
  iovec iov{data, len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  *fd = -1;
  if (recvmsg(s, &m, MSG_WAITALL) != static_cast<ssize_t>(len)) return false;
  if (cmsghdr* cm = CMSG_FIRSTHDR(&m); cm != nullptr && cm->cmsg_type == SCM_RIGHTS)
    memcpy(fd, CMSG_DATA(cm), sizeof *fd);
  return true;
}

}  // namespace tessera::core
