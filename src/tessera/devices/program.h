#pragma once
// Running a helper program and reading what it says: podman's version, the MPS control
// program's answers. No shell; a deadline on each run.

#include <spawn.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::devices {

struct ProgramOutput {
  int status = -1;   // exit code, -1 when it did not end normally (killed at the deadline)
  std::string text;  // stdout and stderr together (stdout alone with stderr_apart), max_output
  std::string err;   // with stderr_apart: stderr, the first MiB
  bool cut = false;  // text is the first max_output bytes of more
};

struct ProgramRun {
  // Written to its stdin, which is then closed; nullopt: stdin from /dev/null.
  std::optional<std::string> input;
  // Its whole environment; nullopt: the server's.
  std::optional<std::map<std::string, std::string>> env;
  std::chrono::milliseconds timeout{20000};  // killed after
  size_t max_output = size_t{1} << 20;       // kept of its output; the rest read and dropped
  // stderr in `err` instead of with stdout: a program whose stdout is large and buffered (a pipe)
  // writes its warnings into the middle of its lines otherwise.
  bool stderr_apart = false;
};

// Runs argv (argv[0] a path) and collects its stdout and stderr; an error when it cannot be
// started. It starts with no signal blocked and every signal's default action (the server blocks
// SIGTERM in its threads; a helper or a daemon it starts must not inherit that).
absl::StatusOr<ProgramOutput> RunCapture(const std::vector<std::string>& args,
                                         const ProgramRun& run = {});

// `fn`'s answer (its first MiB), computed in a child process (fork) that is killed when it has not
// answered in `timeout`: a library call that may block far longer than its caller can wait, or
// crash, cannot hold or take down the caller. DeadlineExceeded when killed; Internal when the child
// ended without an answer (a crash: its signal named; an exception: exit status 1).
absl::StatusOr<std::string> RunInChild(const std::function<std::string()>& fn,
                                       std::chrono::milliseconds timeout);

// Attributes for posix_spawn that give the child no blocked signal and every signal's default
// action; posix_spawnattr_destroy it after.
void CleanSignals(posix_spawnattr_t* attr);

// The first line of `text`, without trailing blanks.
std::string FirstLine(const std::string& text);

// `name` as the server's PATH finds it (an executable regular file), or as given when it holds a
// slash and is executable; empty when none.
std::string LookUp(const std::string& name);

}  // namespace tessera::devices
