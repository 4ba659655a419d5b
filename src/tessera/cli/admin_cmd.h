#pragma once
// `tessera admin` (a server's upkeep: tokens, backup, restore) and what is made from the command
// line's own definitions: `tessera completion bash` and `tessera man`.

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

namespace tessera::cli {

std::shared_ptr<void> AddAdminCommands(CLI::App& app, std::function<int()>& action,
                                       std::ostream& out, std::ostream& err);

// From `app`'s subcommands and options as CLI11 holds them: a bash completion script and a man
// page (roff), so that neither can drift from the parser.
std::string BashCompletion(const CLI::App& app);
std::string ManPage(const CLI::App& app, const std::string& version);

}  // namespace tessera::cli
