// libFuzzer target: kubeconfig files on arbitrary bytes: a config or an error naming the file,
// never a crash. File references point into a folder that does not exist, so nothing is read.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/kube/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = tessera::kube::ParseKubeconfig(text, "/nonexistent-fuzz-dir/config");
  if (!c.ok()) {
    if (std::string(c.status().message()).find("/nonexistent-fuzz-dir/config") ==
        std::string::npos) {
      __builtin_trap();
    }
    return 0;
  }
  if (c->server.rfind("http", 0) != 0) __builtin_trap();
  return 0;
}
