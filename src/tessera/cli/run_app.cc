// Parsing and running a tessera command line (the whole program's and the client's alone).
#include "tessera/cli/run_app.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "fmt/format.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"

namespace tessera::cli {
namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// What a parse error of the top level most likely means, said plainly: a misspelt command ("did
// you mean"), or a command's option written before the command. Empty when neither.
std::string TopLevelHint(const CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> commands;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    commands.push_back(s->get_name());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--log-level") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--log-level=", 0) == 0) continue;
    if (a.rfind("-", 0) == 0) {
      std::string command = "<command>";
      for (int j = i + 1; j < argc; ++j) {
        if (std::find(commands.begin(), commands.end(), argv[j]) != commands.end()) {
          command = argv[j];
          break;
        }
      }
      return fmt::format(
          "'{}' is not an option of tessera itself: options go after the command "
          "(tessera {} {} ...)",
          a, command, a);
    }
    if (std::find(commands.begin(), commands.end(), a) != commands.end()) return "";
    std::string best;
    size_t best_distance = 3;  // at most 2 edits away
    for (const std::string& c : commands) {
      if (const size_t d = EditDistance(a, c); d < best_distance) best = c, best_distance = d;
    }
    return best.empty() ? fmt::format("unknown command '{}'", a)
                        : fmt::format("unknown command '{}'; did you mean '{}'?", a, best);
  }
  return "";
}

void ConfigureLogging(const std::string& level, std::ostream& err) {
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(err, true);
  auto logger = std::make_shared<spdlog::logger>("tessera", sink);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

}  // namespace

int ParseAndRun(CLI::App& app, std::function<int()>& action, int argc, const char* const* argv,
                std::ostream& out, std::ostream& err) {
  app.require_subcommand(1);
  app.fallthrough();
  std::string log_level = "warn";
  bool log_level_set = false;
  if (const char* env = std::getenv("TESSERA_LOG"); env && *env)
    log_level = env, log_level_set = true;
  app.add_option("--log-level", log_level, "Log level: trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp& e) {
    out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // Help asked on a subcommand comes here too, as CallForHelp from that subcommand.
    if (e.get_exit_code() == 0) {
      // The innermost subcommand that was named (`tessera sim inflate --help`).
      const CLI::App* sub = &app;
      for (;;) {
        auto subs = sub->get_subcommands();
        if (subs.empty()) break;
        sub = subs.back();
      }
      out << sub->help();
      return kExitOk;
    }
    const std::string hint = TopLevelHint(app, argc, argv);
    err << "tessera: " << (hint.empty() ? std::string(e.what()) : hint)
        << "\nRun 'tessera --help' for usage.\n";
    return kExitBadInput;
  }
  // The daemons say what they do by default; the other commands only warn.
  if (!log_level_set && app.count("--log-level") == 0) {
    for (const CLI::App* sub : app.get_subcommands()) {
      const std::string& name = sub->get_name();
      const bool exporter = name == "slurm" && !sub->get_subcommands().empty() &&
                            sub->get_subcommands().front()->get_name() == "exporter";
      if (name == "server" || name == "agent" || name == "extender" || exporter) log_level = "info";
    }
  }
  ConfigureLogging(log_level, err);
  return action ? action() : kExitBadInput;
}

}  // namespace tessera::cli
