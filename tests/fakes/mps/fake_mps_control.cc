// A fake `nvidia-cuda-mps-control` for the tests: the control daemon's life and the commands
// Tessera uses, with MPS's one-user-at-a-time rule, over a unix socket in the pipe folder.
//
//   nvidia-cuda-mps-control -d   a daemon in the background (returns once it listens)
//   nvidia-cuda-mps-control -f   the same in the foreground
//   nvidia-cuda-mps-control      a client: each line of stdin is a command for the daemon, whose
//                                answer is printed; exit 1 when no daemon answers
//
// As the real one: CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) holds its socket (`control`)
// and nvidia-cuda-mps-control.pid; CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps) its
// control.log. Commands: get_server_list (the running server's id, if any), get_client_list ID
// (its clients' pids), quit (the daemon ends; its clients lose their server). The fake driver
// (cuda/fake_cuda.cc) connects as a client with "client PID UID PERCENT LIMITS" and keeps the
// connection for its life; it is answered "ok SERVER" at once when no server runs or the running
// one is its user's, and otherwise only when the other user's clients have all ended (MPS runs
// one user's server at a time). A client that says "fault" (a fatal GPU fault) ends its server:
// every client of it is cut off, and the next client gets a new server. Each client and what it
// asked is written to control.log.
// FAKE_MPS_FAIL_START=1: -d fails (a daemon that cannot start).

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string Env(const char* name, const char* fallback) {
  const char* v = getenv(name);
  return v && *v ? v : fallback;
}
std::string PipeDir() { return Env("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"); }
std::string LogDir() { return Env("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"); }
std::string SocketPath() { return PipeDir() + "/control"; }

int Connect() {
  const std::string path = SocketPath();
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return -1;
  std::strcpy(a.sun_path, path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

int Client() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    const int fd = Connect();
    if (fd < 0) {
      std::fprintf(stderr, "Cannot find MPS control daemon process\n");
      return 1;
    }
    WriteAll(fd, line + "\n");
    shutdown(fd, SHUT_WR);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) std::fwrite(buf, 1, static_cast<size_t>(n), stdout);
    close(fd);
  }
  return 0;
}

struct Conn {
  int fd = -1;
  std::string in;
  bool client = false;    // a CUDA process (held open)
  bool answered = false;  // told its server
  bool told_to_wait = false;
  long pid = 0, uid = 0;
  std::string percent, limits;
};

class Daemon {
 public:
  int Run(int ready_fd) {
    signal(SIGPIPE, SIG_IGN);
    log_.open(LogDir() + "/control.log", std::ios::app);
    const std::string path = SocketPath();
    unlink(path.c_str());
    listen_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    if (listen_ < 0 || bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listen_, 64) != 0) {
      Log("cannot listen on " + path + ": " + strerror(errno));
      return 1;
    }
    chmod(path.c_str(), 0777);  // clients of every user, as the real daemon allows
    std::ofstream(PipeDir() + "/nvidia-cuda-mps-control.pid") << getpid() << "\n";
    Log("started, pid " + std::to_string(getpid()) + ", devices " +
        Env("CUDA_VISIBLE_DEVICES", "all"));
    if (ready_fd >= 0) {
      (void)!write(ready_fd, "ok", 2);  // a pipe: send() is for sockets
      close(ready_fd);
    }
    while (!quit_) {
      std::vector<pollfd> fds = {{listen_, POLLIN, 0}};
      for (const Conn& c : conns_) fds.push_back({c.fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].revents & POLLIN) {
        const int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) conns_.push_back({.fd = fd});
      }
      std::vector<int> gone;
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Conn* c = Find(fds[i].fd);
        char buf[1024];
        const ssize_t n = read(c->fd, buf, sizeof buf);
        if (n <= 0) {
          gone.push_back(c->fd);
          continue;
        }
        c->in.append(buf, static_cast<size_t>(n));
        size_t nl;
        while ((nl = c->in.find('\n')) != std::string::npos) {
          const std::string line = c->in.substr(0, nl);
          c->in.erase(0, nl + 1);
          if (!Handle(*c, line)) {
            gone.push_back(c->fd);
            break;
          }
        }
      }
      for (int fd : gone) Drop(fd);
      Admit();
    }
    for (const Conn& c : conns_) close(c.fd);
    unlink(path.c_str());
    unlink((PipeDir() + "/nvidia-cuda-mps-control.pid").c_str());
    Log("quit");
    return 0;
  }

 private:
  Conn* Find(int fd) {
    for (Conn& c : conns_) {
      if (c.fd == fd) return &c;
    }
    return nullptr;
  }
  void Drop(int fd) {
    for (size_t i = 0; i < conns_.size(); ++i) {
      if (conns_[i].fd != fd) continue;
      if (conns_[i].client) Log("client " + std::to_string(conns_[i].pid) + " ended");
      close(fd);
      conns_.erase(conns_.begin() + static_cast<long>(i));
      break;
    }
    // The server ends with its last client.
    bool any = false;
    for (const Conn& c : conns_) any = any || (c.client && c.answered);
    if (!any && server_ != 0) {
      Log("server " + std::to_string(server_) + " of uid " + std::to_string(server_uid_) +
          " ended");
      server_ = 0;
    }
  }
  // Waiting clients get a server: their user's, when none of another user's runs.
  void Admit() {
    for (Conn& c : conns_) {
      if (!c.client || c.answered) continue;
      if (server_ == 0) {
        server_ = next_server_++;
        server_uid_ = c.uid;
        Log("server " + std::to_string(server_) + " started for uid " + std::to_string(c.uid));
      }
      if (c.uid != server_uid_) {  // waits for the other user's clients to end
        if (!c.told_to_wait) {
          Log("client " + std::to_string(c.pid) + " uid " + std::to_string(c.uid) +
              " waits: server " + std::to_string(server_) + " runs for uid " +
              std::to_string(server_uid_));
          c.told_to_wait = true;
        }
        continue;
      }
      c.answered = true;
      Log("client " + std::to_string(c.pid) + " uid " + std::to_string(c.uid) + " on server " +
          std::to_string(server_) + " active_thread_percentage " + c.percent +
          " pinned_mem_limit " + c.limits);
      WriteAll(c.fd, "ok " + std::to_string(server_) + "\n");
    }
  }
  // False: the connection is done.
  bool Handle(Conn& c, const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "client") {
      c.client = true;
      in >> c.pid >> c.uid >> c.percent >> c.limits;
      if (c.percent.empty()) c.percent = "-";
      if (c.limits.empty()) c.limits = "-";
      return true;
    }
    if (cmd == "fault" && c.client && c.answered) {
      // A fatal fault in a client ends its server, and with it every client of that server; the
      // next client gets a new server.
      int others = 0;
      for (Conn& k : conns_) {
        if (!k.client || !k.answered) continue;
        others += k.fd != c.fd;
        shutdown(k.fd, SHUT_RDWR);
        k.answered = false;
        k.client = false;
      }
      Log("client " + std::to_string(c.pid) + " hit a fatal fault: server " +
          std::to_string(server_) + " ends with its " + std::to_string(others) + " other clients");
      server_ = 0;
      return true;
    }
    std::string reply;
    if (cmd == "get_server_list") {
      if (server_ != 0) reply = std::to_string(server_) + "\n";
    } else if (cmd == "get_client_list") {
      long id = 0;
      in >> id;
      for (const Conn& k : conns_) {
        if (k.client && k.answered && id == server_) reply += std::to_string(k.pid) + "\n";
      }
    } else if (cmd == "quit") {
      quit_ = true;
    } else {
      reply = "Unrecognized command: " + cmd + "\n";
    }
    WriteAll(c.fd, reply);
    return false;
  }
  void Log(const std::string& what) { log_ << "[fake mps] " << what << std::endl; }

  int listen_ = -1;
  std::vector<Conn> conns_;
  std::ofstream log_;
  bool quit_ = false;
  long server_ = 0, server_uid_ = -1, next_server_ = 100001;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode.empty()) return Client();
  if (mode == "-f") return Daemon().Run(-1);
  if (mode != "-d") {
    std::fprintf(stderr, "usage: nvidia-cuda-mps-control [-d | -f]\n");
    return 1;
  }
  if (getenv("FAKE_MPS_FAIL_START") != nullptr) {
    std::fprintf(stderr, "An instance of this daemon cannot be started (FAKE_MPS_FAIL_START)\n");
    return 1;
  }
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) return 1;
  const pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    close(ready[0]);
    setsid();
    const int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
      dup2(null, 2);
    }
    _exit(Daemon().Run(ready[1]));
  }
  close(ready[1]);
  char ok[2];
  const bool up = read(ready[0], ok, sizeof ok) == 2;
  return up ? 0 : 1;
}
