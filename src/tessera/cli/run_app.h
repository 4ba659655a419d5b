#pragma once
// Parsing and running a tessera command line: the whole program's (RunCli) and the client's alone
// (client_main.cc) parse, answer help, say parse errors plainly and set up logging the same way.

#include <functional>
#include <ostream>

namespace CLI {
class App;
}

namespace tessera::cli {

inline constexpr char kAbout[] = "Tessera: GPU scheduling and sharing for deep-learning work.";

// Adds --log-level to `app` (whose subcommands set `action` when parsed), parses argv, prints help
// to `out` when asked, a parse error with a hint ("did you mean") to `err`, configures logging
// (warn, info for the daemons, or --log-level / $TESSERA_LOG) and runs the action. Returns the exit
// code.
int ParseAndRun(CLI::App& app, std::function<int()>& action, int argc, const char* const* argv,
                std::ostream& out, std::ostream& err);

}  // namespace tessera::cli
