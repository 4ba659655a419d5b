// `tessera server`: the standalone server, run in the foreground until SIGTERM or SIGINT.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/cli/client_cmd.h"
#include "tessera/cli/remote.h"
#include "tessera/server/server.h"

namespace tessera::cli {
namespace {

using remote::State;

int RunServer(State& s, std::ostream& out, std::ostream& err) {
  (void)out;
  server::ServerConfig c = server::DefaultServerConfig();
  c.fallback_simulate = s.fallback_simulate;
  // Before the file: its token for root is checked against it.
  if (s.allow_root_jobs) c.allow_root_jobs = true;
  if (!s.config_path.empty()) {
    if (absl::Status st = server::LoadServerConfig(s.config_path, &c); !st.ok()) {
      err << "tessera: " << st.message() << "\n";
      return kExitBadInput;
    }
  }
  if (!s.socket.empty()) c.socket = s.socket;
  if (!s.state_dir.empty()) c.state_dir = s.state_dir;
  if (!s.simulate.empty()) c.simulate = s.simulate;
  if (!s.tcp.empty()) c.tcp_listen = s.tcp;
  if (s.allow_root_jobs) c.allow_root_jobs = true;
  if (!c.tcp_listen.empty() && c.tokens.empty()) {
    err << "tessera: a TCP listener needs tokens (tcp.tokens in the config file)\n";
    return kExitBadInput;
  }
  if (c.intercept_library.empty()) c.intercept_library = FindInterceptLibrary();
  // Stop on SIGTERM/SIGINT, taken synchronously; the server's threads never see them.
  sigset_t set = BlockStopSignals();
  auto srv = server::Server::Create(c);
  if (!srv.ok()) {
    err << "tessera: " << srv.status().message() << "\n";
    return srv.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  if (absl::Status st = (*srv)->Start(); !st.ok()) {
    err << "tessera: " << st.message() << "\n";
    return kExitFailure;
  }
  spdlog::info("tessera server ready: socket {}, state in {}", c.socket, c.state_dir);
  if (geteuid() == 0) {
    spdlog::info(
        c.allow_root_jobs
            ? "jobs of root run as root (allow_root_jobs)"
            : "jobs run as their submitting user; root's are refused (allow_root_jobs is off)");
  }
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info(
      "signal {}: stopping (running jobs keep running and are re-adopted at the next start)", sig);
  (*srv)->Stop();
  return kExitOk;
}

}  // namespace

std::shared_ptr<void> AddServeCommand(CLI::App& app, std::function<int()>& action,
                                      std::ostream& out, std::ostream& err) {
  auto s = std::make_shared<State>();
  State& st = *s;

  CLI::App* srv = app.add_subcommand(
      "server", "Run the standalone server: this machine's GPUs shared by many users");
  srv->add_option("-c,--config", st.config_path,
                  "YAML config file (docs/server.md); none needed for the defaults");
  srv->add_option("--socket", st.socket,
                  "Unix socket to listen on (default " + server::DefaultSocketPath() + ")");
  srv->add_option("--state-dir", st.state_dir, "Where the database, logs and shared regions live");
  srv->add_option("--simulate", st.simulate,
                  "Simulate this machine (a preset or inventory file) instead of the driver");
  srv->add_option(
      "--fallback-simulate", st.fallback_simulate,
      "Preset to simulate when no NVIDIA driver is found (default dgx-h100; empty: fail)");
  srv->add_option("--tcp", st.tcp,
                  "Also listen on TCP host:port (needs tokens in the config file)");
  srv->add_flag(
      "--allow-root-jobs", st.allow_root_jobs,
      "Let root (on the socket, or a token for root) run jobs as root (config: allow_root_jobs)");
  srv->callback([&, s] { action = [&, s] { return RunServer(*s, out, err); }; });

  return s;
}

}  // namespace tessera::cli
