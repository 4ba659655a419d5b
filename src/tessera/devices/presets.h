#pragma once
// The simulated machines bundled into the binary. Their text comes from presets/*.yaml, embedded at
// build time (cmake/EmbedPresets.cmake), so the files in the tree are the documentation of each
// preset.

#include <span>
#include <string_view>

namespace tessera::devices {

struct Preset {
  std::string_view name;  // the file name without .yaml
  std::string_view yaml;
};

std::span<const Preset> BundledPresets();

}  // namespace tessera::devices
