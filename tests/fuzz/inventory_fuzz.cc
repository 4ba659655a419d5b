// libFuzzer target: the inventory parser must turn any bytes into a machine or a clean error, never
// crash, hang or leak. Built with clang by scripts/fuzz; the corpus is replayed by ctest in every
// build.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/devices/inventory.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto machine = tessera::devices::ParseInventory(text, "fuzz.yaml");
  if (machine.ok()) {
    // A parsed machine must be self-consistent.
    const auto& inv = machine->inventory;
    if (inv.topology.size() != static_cast<int>(inv.gpus.size())) __builtin_trap();
    for (size_t i = 0; i < inv.gpus.size(); ++i) {
      if (inv.gpus[i].index != static_cast<int>(i)) __builtin_trap();
    }
  } else if (machine.status().message().substr(0, 10) != "fuzz.yaml:") {
    __builtin_trap();  // every error names the file and line
  }
  return 0;
}
