#pragma once
// The client verbs (submit, run, ls, show, logs, cancel, hold, release, priority, acct, top):
// what tessera's small front program (client_main.cc) runs itself.

#include <functional>
#include <memory>
#include <ostream>
#include <string_view>

namespace CLI {
class App;
}

namespace tessera::cli {

// Adds the commands to `app`; a parsed one sets `action`. The returned object holds the flags and
// must outlive parsing and the action.
// With `only`, just that verb (the small program knows which was typed).
std::shared_ptr<void> AddClientCommands(CLI::App& app, std::function<int()>& action,
                                        std::ostream& out, std::ostream& err,
                                        std::string_view only = {});

// `tessera server` (serve_cmd.cc).
std::shared_ptr<void> AddServeCommand(CLI::App& app, std::function<int()>& action,
                                      std::ostream& out, std::ostream& err);

}  // namespace tessera::cli
