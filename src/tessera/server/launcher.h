#pragma once
// Launcher: the server's one seam to job processes - start, signal, reap, and tell a live process
// from an ended one. ProcessLauncher is the real thing (runner.h: process groups, shepherds,
// setuid); tests drive the server with a fake one that runs jobs on a fake clock. Implementations
// are called from the server's scheduling thread and its API threads; they must be thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "tessera/server/runner.h"

namespace tessera::server {

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Starts a job (see server::Start): kInvalidArgument naming the command when it cannot run, with
  // nothing left running.
  virtual absl::StatusOr<Launched> Start(const LaunchSpec& spec) = 0;
  // Signals the job's process group; false when it is gone.
  virtual bool Signal(pid_t pgid, int sig) = 0;
  // A child job's exit code (128 + signal when a signal ended it) once it has ended; nullopt while
  // it runs or when it is not a child.
  virtual std::optional<int> Reap(pid_t pid) = 0;
  // Whether `pid` is still the process started at `start_time` (jobs re-adopted after a restart).
  virtual bool Alive(pid_t pid, uint64_t start_time) = 0;
  // Whether the server may watch the launched pids with pidfds (ExitWatcher) to be woken when a job
  // ends; otherwise it polls Reap/Alive.
  virtual bool WatchableByPidfd() const = 0;
};

// Real processes, through runner.h.
class ProcessLauncher final : public Launcher {
 public:
  absl::StatusOr<Launched> Start(const LaunchSpec& spec) override { return server::Start(spec); }
  bool Signal(pid_t pgid, int sig) override { return SignalGroup(pgid, sig); }
  std::optional<int> Reap(pid_t pid) override { return server::Reap(pid); }
  bool Alive(pid_t pid, uint64_t start_time) override { return SameProcess(pid, start_time); }
  bool WatchableByPidfd() const override { return true; }
};

}  // namespace tessera::server
