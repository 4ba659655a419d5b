#pragma once
// The `tessera` command line: every verb, parsed with CLI11. RunCli is main() minus the process, so
// tests can call it in-process. Exit codes: 0 success, 1 the operation failed (e.g. no driver),
// 2 bad usage or bad input (flags, files).

#include <signal.h>

#include <ostream>
#include <string>

namespace tessera::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// For the daemons (server, agent): blocks SIGTERM and SIGINT in this thread and the threads it
// starts, and ignores SIGPIPE; returns the set to sigwait on.
sigset_t BlockStopSignals();

// libtessera-cuda.so next to this binary (a build folder), else in ../lib/tessera (installed) or
// ../lib; "" when none exists.
std::string FindInterceptLibrary();

}  // namespace tessera::cli
