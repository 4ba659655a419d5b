// libFuzzer target: a ResourceClaim as the DRA driver reads it from the API server, on arbitrary
// bytes: prepared (every device one the node publishes, then unprepared) or refused with one of the
// documented codes; never a crash or an exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "nlohmann/json.hpp"
#include "tessera/agent/dra_state.h"
#include "tessera/devices/inventory.h"

namespace {

std::string& Dir() {
  static std::string dir =
      std::filesystem::temp_directory_path() / ("dra-claim-fuzz-" + std::to_string(getpid()));
  return dir;
}

tessera::agent::DraState& State() {
  static tessera::agent::DraState* state = [] {
    const std::string dir = Dir();
    std::filesystem::create_directories(dir + "/cdi");
    std::atexit([] { std::filesystem::remove_all(Dir()); });
    std::ofstream(dir + "/shim.so") << "x";
    auto m = tessera::devices::LoadSimulatedMachine("dgx-h100");
    tessera::agent::PluginOptions p;
    p.shares_per_gpu = 4;
    p.state_dir = dir + "/state";
    p.shim_library = dir + "/shim.so";
    tessera::agent::DraOptions d;
    d.pool = "node-a";
    d.dir = dir + "/plugin";
    d.cdi_dir = dir + "/cdi";
    d.share_gpus = {6, 7};
    auto s = tessera::agent::DraState::Create(m->inventory, p, d);
    if (!s.ok()) __builtin_trap();
    return s->release();
  }();
  return *state;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  tessera::agent::DraState& s = State();
  std::string uid = "fuzz";
  if (j.is_object() && j.contains("metadata") && j["metadata"].is_object() &&
      j["metadata"].contains("uid") && j["metadata"]["uid"].is_string()) {
    uid = j["metadata"]["uid"].get<std::string>();
  }
  if (uid.empty() || uid.find('/') != std::string::npos || uid.size() > 64) return 0;
  auto got = s.Prepare("ns", "claim", uid, j);
  if (got.ok()) {
    for (const auto& d : *got) {
      if (!s.Find(d.device)) __builtin_trap();
    }
    if (!s.Unprepare(uid).ok()) __builtin_trap();
  } else {
    switch (got.status().code()) {
      case absl::StatusCode::kFailedPrecondition:
      case absl::StatusCode::kNotFound:
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kInvalidArgument:
        break;
      default:
        __builtin_trap();
    }
  }
  return 0;
}
