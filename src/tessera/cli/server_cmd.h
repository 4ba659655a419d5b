#pragma once
// `tessera server` and the client verbs (submit, ls, show, logs, cancel, top).

#include <functional>
#include <memory>
#include <ostream>

namespace CLI {
class App;
}

namespace tessera::cli {

// Adds the commands to `app`; a parsed one sets `action`. The returned object holds the flags and
// must outlive parsing and the action.
std::shared_ptr<void> AddServerCommands(CLI::App& app, std::function<int()>& action,
                                        std::ostream& out, std::ostream& err);

}  // namespace tessera::cli
