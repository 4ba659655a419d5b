#include "tessera/cli/app.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "fmt/format.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tessera/cli/admin_cmd.h"
#include "tessera/cli/agent_cmd.h"
#include "tessera/cli/extender_cmd.h"
#include "tessera/cli/inventory_view.h"
#include "tessera/cli/output.h"
#include "tessera/cli/server_cmd.h"
#include "tessera/cli/sim_cmd.h"
#include "tessera/cli/slurm_cmd.h"
#include "tessera/cli/version.h"
#include "tessera/devices/inventory.h"
#include "tessera/devices/open.h"

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

// A status code from a layer below -> the exit code scripts see.
int ExitCodeFor(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

struct DeviceFlags {
  std::string simulate;
  std::string fallback_simulate;
  std::string output = "table";

  void AddTo(CLI::App* cmd) {
    cmd->add_option("--simulate", simulate,
                    "Use a simulated machine instead of the driver: a preset name (see `tessera "
                    "presets`) or an inventory YAML file");
    cmd->add_option("--fallback-simulate", fallback_simulate,
                    "When no NVIDIA driver can be loaded, use this simulated machine (labelled as "
                    "such) instead of failing");
    cmd->add_option("-o,--output", output, "Output format: table, json or yaml")
        ->check(CLI::IsMember({"table", "json", "yaml"}));
  }
};

// Opens the device source and discovers; on failure writes the error and returns the exit code.
std::optional<int> Discover(const DeviceFlags& flags, std::ostream& err,
                            std::unique_ptr<devices::DeviceSource>& source,
                            core::NodeInventory& inv) {
  devices::OpenOptions opts;
  opts.simulate = flags.simulate;
  opts.fallback_simulate = flags.fallback_simulate;
  auto opened = devices::OpenDeviceSource(opts);
  if (!opened.ok()) {
    err << "tessera: " << opened.status().message() << "\n";
    if (opened.status().code() == absl::StatusCode::kNotFound && flags.simulate.empty() &&
        flags.fallback_simulate.empty()) {
      err << "tessera: to look at a simulated machine instead, add --simulate PRESET (presets: "
          << fmt::format("{}", fmt::join(devices::PresetNames(), ", ")) << ")\n"
          << "tessera: `tessera gpus` reads this machine's driver; the GPUs of the server you "
             "submit to (simulated or not) are in `tessera top --once`\n";
      return kExitFailure;
    }
    return ExitCodeFor(opened.status());
  }
  if (!opened->fallback_reason.empty()) {
    err << "tessera: " << opened->fallback_reason << "; showing the SIMULATED machine '"
        << flags.fallback_simulate << "'\n";
  }
  source = std::move(opened->source);
  auto discovered = source->Discover();
  if (!discovered.ok()) {
    err << "tessera: discovery failed: " << discovered.status().message() << "\n";
    return kExitFailure;
  }
  inv = std::move(*discovered);
  return std::nullopt;
}

int RunGpus(const DeviceFlags& flags, std::ostream& out, std::ostream& err) {
  std::unique_ptr<devices::DeviceSource> source;
  core::NodeInventory inv;
  if (auto code = Discover(flags, err, source, inv)) return *code;
  ProbeResults probes(inv.gpus.size());
  for (const core::Gpu& g : inv.gpus) {
    absl::Status st = source->Probe(g.index);
    if (!st.ok()) probes[g.index] = std::string(st.message());
  }
  Format format = *ParseFormat(flags.output);
  if (format == Format::kTable) {
    PrintGpuTable(inv, probes, out);
  } else {
    EmitStructured(InventoryToJson(inv, probes), format, out);
  }
  return kExitOk;
}

int RunTopo(const DeviceFlags& flags, std::ostream& out, std::ostream& err) {
  std::unique_ptr<devices::DeviceSource> source;
  core::NodeInventory inv;
  if (auto code = Discover(flags, err, source, inv)) return *code;
  Format format = *ParseFormat(flags.output);
  if (format == Format::kTable) {
    PrintTopologyMatrix(inv, out);
  } else {
    EmitStructured(TopologyToJson(inv), format, out);
  }
  return kExitOk;
}

int RunPresets(const std::string& output, bool show, const std::string& name, std::ostream& out,
               std::ostream& err) {
  if (show) {
    std::string_view yaml = devices::PresetYaml(name);
    if (yaml.empty()) {
      err << fmt::format("tessera: unknown preset '{}' (presets: {})\n", name,
                         fmt::join(devices::PresetNames(), ", "));
      return kExitBadInput;
    }
    out << yaml;
    return kExitOk;
  }
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  Table table({"NAME", "GPUS", "MODELS"});
  for (const std::string& preset : devices::PresetNames()) {
    auto m = devices::LoadSimulatedMachine(preset);
    if (!m.ok()) {
      err << "tessera: preset " << preset << ": " << m.status().message() << "\n";
      return kExitFailure;
    }
    std::vector<std::string> models;
    for (const core::Gpu& g : m->inventory.gpus) {
      if (std::find(models.begin(), models.end(), g.model) == models.end())
        models.push_back(g.model);
    }
    list.push_back({{"name", preset}, {"gpus", m->inventory.gpus.size()}, {"models", models}});
    table.AddRow({preset, std::to_string(m->inventory.gpus.size()),
                  fmt::format("{}", fmt::join(models, ", "))});
  }
  Format format = *ParseFormat(output);
  if (format == Format::kTable) {
    table.Print(out);
  } else {
    EmitStructured(list, format, out);
  }
  return kExitOk;
}

int RunVersion(const std::string& output, std::ostream& out) {
  Format format = *ParseFormat(output);
  nlohmann::ordered_json v = {{"version", kVersion},
                              {"commit", kGitCommit},
                              {"compiler", kCompiler},
                              {"build_type", kBuildType}};
  if (format == Format::kTable) {
    out << fmt::format("tessera {} (commit {}, {}, {})\n", kVersion, kGitCommit, kCompiler,
                       kBuildType);
  } else {
    EmitStructured(v, format, out);
  }
  return kExitOk;
}

void ConfigureLogging(const std::string& level, std::ostream& err) {
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(err, true);
  auto logger = std::make_shared<spdlog::logger>("tessera", sink);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

}  // namespace

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"Tessera: GPU scheduling and sharing for deep-learning work.", "tessera"};
  app.require_subcommand(1);
  app.fallthrough();
  std::string log_level = "warn";
  bool log_level_set = false;
  if (const char* env = std::getenv("TESSERA_LOG"); env && *env)
    log_level = env, log_level_set = true;
  app.add_option("--log-level", log_level, "Log level: trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));

  std::function<int()> action;

  DeviceFlags gpus_flags;
  CLI::App* gpus = app.add_subcommand("gpus", "List this machine's GPUs and their attributes");
  gpus_flags.AddTo(gpus);
  gpus->callback([&] { action = [&] { return RunGpus(gpus_flags, out, err); }; });

  DeviceFlags topo_flags;
  CLI::App* topo = app.add_subcommand("topo", "Show how the GPUs are linked (NVLink, PCIe, NUMA)");
  topo_flags.AddTo(topo);
  topo->callback([&] { action = [&] { return RunTopo(topo_flags, out, err); }; });

  std::string presets_output = "table";
  std::string preset_name;
  CLI::App* presets = app.add_subcommand("presets", "List the bundled simulated machines");
  presets->add_option("-o,--output", presets_output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  presets->add_option("--show", preset_name, "Print the inventory YAML of one preset");
  presets->callback([&] {
    action = [&] {
      return RunPresets(presets_output, !preset_name.empty(), preset_name, out, err);
    };
  });

  std::string version_output = "table";
  CLI::App* version = app.add_subcommand("version", "Print the version of this build");
  version->add_option("-o,--output", version_output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  version->callback([&] { action = [&] { return RunVersion(version_output, out); }; });

  std::shared_ptr<void> sim_state = AddSimCommands(app, action, out, err);
  std::shared_ptr<void> server_state = AddServerCommands(app, action, out, err);
  std::shared_ptr<void> agent_state = AddAgentCommand(app, action, out, err);
  std::shared_ptr<void> extender_state = AddExtenderCommand(app, action, out, err);
  std::shared_ptr<void> slurm_state = AddSlurmCommands(app, action, out, err);
  std::shared_ptr<void> admin_state = AddAdminCommands(app, action, out, err);

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
  if (!log_level_set &&
      (app.got_subcommand("server") || app.got_subcommand("agent") ||
       app.got_subcommand("extender") ||
       (app.got_subcommand("slurm") && app.get_subcommand("slurm")->got_subcommand("exporter"))) &&
      app.count("--log-level") == 0)
    log_level = "info";
  ConfigureLogging(log_level, err);
  return action ? action() : kExitBadInput;
}

sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return set;
}

std::string FindInterceptLibrary() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (const auto& p : {self.parent_path() / "libtessera-cuda.so",
                        self.parent_path().parent_path() / "lib/tessera/libtessera-cuda.so",
                        self.parent_path().parent_path() / "lib/libtessera-cuda.so"}) {
    if (std::filesystem::exists(p, ec)) return p.string();
  }
  return "";
}

}  // namespace tessera::cli
