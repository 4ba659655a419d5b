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
#include "tessera/cli/client_cmd.h"
#include "tessera/cli/extender_cmd.h"
#include "tessera/cli/inventory_view.h"
#include "tessera/cli/output.h"
#include "tessera/cli/run_app.h"
#include "tessera/cli/sim_cmd.h"
#include "tessera/cli/slurm_cmd.h"
#include "tessera/cli/version.h"
#include "tessera/devices/inventory.h"
#include "tessera/devices/open.h"

namespace tessera::cli {
namespace {

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

}  // namespace

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{kAbout, "tessera"};
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
  std::shared_ptr<void> server_state = AddServeCommand(app, action, out, err);
  std::shared_ptr<void> client_state = AddClientCommands(app, action, out, err);
  std::shared_ptr<void> agent_state = AddAgentCommand(app, action, out, err);
  std::shared_ptr<void> extender_state = AddExtenderCommand(app, action, out, err);
  std::shared_ptr<void> slurm_state = AddSlurmCommands(app, action, out, err);
  std::shared_ptr<void> admin_state = AddAdminCommands(app, action, out, err);

  return ParseAndRun(app, action, argc, argv, out, err);
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
