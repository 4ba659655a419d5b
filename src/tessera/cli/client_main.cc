// `tessera`: the one command users type. The client verbs (submit, run, ls, show, logs, cancel...,
// and slurm eff) run here, in a small program that loads a few libraries and starts in a few
// milliseconds (the whole program loads 88: gRPC, protobuf, SQLite...); every other command
// (server, agent, sim, admin, --help...) is the whole program's, tessera-full, exec'd in this
// process's place with the same arguments: beside this one (a build folder) or in ../lib/tessera
// (installed).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/cli/app.h"
#include "tessera/cli/client_cmd.h"
#include "tessera/cli/run_app.h"
#include "tessera/cli/slurm_eff_cmd.h"

namespace {

namespace fs = std::filesystem;

// The command words: the first `n` arguments that are not tessera's own option (--log-level V).
std::vector<std::string_view> CommandWords(int argc, char** argv, size_t n) {
  std::vector<std::string_view> words;
  for (int i = 1; i < argc && words.size() < n; ++i) {
    const std::string_view a = argv[i];
    if (a == "--log-level") {
      ++i;
      continue;
    }
    if (a.rfind("--log-level=", 0) == 0) continue;
    words.push_back(a);
  }
  words.resize(n);
  return words;
}

bool IsClientCommand(std::string_view c) {
  for (std::string_view k : {"submit", "run", "ls", "show", "eff", "logs", "cancel", "hold",
                             "release", "priority", "acct", "top"}) {
    if (c == k) return true;
  }
  return false;
}

// This program's own path: /proc/self/exe, else (no /proc: a chroot, a container without it) how
// it was called - a path, or a name found on $PATH as the shell found it.
fs::path Self(const char* argv0) {
  std::error_code ec;
  if (fs::path self = fs::read_symlink("/proc/self/exe", ec); !ec) return self;
  const std::string_view called = argv0 ? argv0 : "";
  if (called.find('/') != std::string_view::npos) return fs::weakly_canonical(called, ec);
  const char* path = getenv("PATH");
  for (std::string_view rest = path ? path : ""; !rest.empty();) {
    const size_t colon = rest.find(':');
    const fs::path candidate = fs::path(rest.substr(0, colon)) / called;
    if (access(candidate.c_str(), X_OK) == 0) return fs::weakly_canonical(candidate, ec);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return {};
}

std::string FullProgram(const char* argv0) {
  std::error_code ec;
  const fs::path self = Self(argv0);
  for (const fs::path& p : {self.parent_path() / "tessera-full",
                            self.parent_path().parent_path() / "lib/tessera/tessera-full"}) {
    if (fs::exists(p, ec)) return p.string();
  }
  return (self.parent_path().parent_path() / "lib/tessera/tessera-full").string();
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words = CommandWords(argc, argv, 2);
  const bool client = IsClientCommand(words[0]);
  if (client || (words[0] == "slurm" && words[1] == "eff")) {
    CLI::App app{tessera::cli::kAbout, "tessera"};
    std::function<int()> action;
    std::shared_ptr<void> state;
    if (client) {
      state = tessera::cli::AddClientCommands(app, action, std::cout, std::cerr);
    } else {
      CLI::App* slurm =
          app.add_subcommand("slurm", "What the Slurm plugin records (docs/slurm.md)");
      slurm->require_subcommand(1);
      state = tessera::cli::AddSlurmEff(*slurm, action, std::cout, std::cerr);
    }
    return tessera::cli::ParseAndRun(app, action, argc, argv, std::cout, std::cerr);
  }
  const std::string full = FullProgram(argv[0]);
  execv(full.c_str(), argv);
  std::cerr << "tessera: cannot run " << full
            << " (the rest of tessera, installed with it): " << std::strerror(errno) << "\n";
  return 127;
}
