#pragma once
// The simulated machine: an inventory file (YAML, documented in docs/inventory.md) parsed into the
// same NodeInventory a driver would give, plus scripted health events. Pure functions;
// thread-compatible.

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/device_source.h"

namespace tessera::devices {

// A health change a simulated machine goes through on its own, `after` its source started.
struct ScriptedHealthEvent {
  enum class Action {
    kEvent,    // deliver `event` to the health watch
    kLose,     // the GPU stops answering probes
    kRestore,  // the GPU answers probes again
  };
  std::chrono::milliseconds after{0};
  Action action = Action::kEvent;
  HealthEvent event;  // for kLose/kRestore only `gpu` is used
};

struct SimulatedMachine {
  core::NodeInventory inventory;                   // `simulated` is always true
  std::vector<ScriptedHealthEvent> health_events;  // sorted by `after`
};

// The most GPUs one inventory may hold, and the most NVLink links one GPU can have.
inline constexpr int kMaxGpusPerMachine = 64;
inline constexpr int kMaxNvlinksPerGpu = 18;

// Parses an inventory document. `filename` only labels errors. On bad input: kInvalidArgument with
// "<filename>:<line>: <what is wrong>" (unknown keys, wrong types, impossible topologies).
absl::StatusOr<SimulatedMachine> ParseInventory(std::string_view yaml, std::string_view filename);

// `spec` is a bundled preset name (see PresetNames) or a path to an inventory file.
// kInvalidArgument for a bad file or an unknown preset, kNotFound when a file cannot be read.
absl::StatusOr<SimulatedMachine> LoadSimulatedMachine(const std::string& spec);

// Bundled presets, sorted by name, and the YAML text of one (empty if there is no such preset).
std::vector<std::string> PresetNames();
std::string_view PresetYaml(std::string_view name);

}  // namespace tessera::devices
