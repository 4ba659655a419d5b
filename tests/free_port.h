#pragma once
// For the tests that start programs which take no port 0 (Slurm's slurm.conf, Prometheus'
// --web.listen-address): a TCP port on loopback that nothing listens on now - bound, read, closed.
// 0 when none could be had. Another process may take it before the caller does: callers that can,
// try again on a bind failure.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tessera::test {

inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

}  // namespace tessera::test
