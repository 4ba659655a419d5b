#pragma once
// `tessera sim inflate` and `tessera sim replay`: the simulator's command line.

#include <functional>
#include <memory>
#include <ostream>

namespace CLI {
class App;
}

namespace tessera::cli {

// Adds `sim` and its subcommands to `app`; a parsed subcommand sets `action`. The returned object
// holds the flags and must outlive parsing and the action.
std::shared_ptr<void> AddSimCommands(CLI::App& app, std::function<int()>& action, std::ostream& out,
                                     std::ostream& err);

}  // namespace tessera::cli
