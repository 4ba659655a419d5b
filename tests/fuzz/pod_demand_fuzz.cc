// libFuzzer target: Pod and Node objects as the extender reads them from the API server or from
// kube-scheduler's requests, on arbitrary bytes: a demand, a node, or an invalid-argument error;
// never a crash, and an accepted pod is a valid scheduling request.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "nlohmann/json.hpp"
#include "tessera/extender/objects.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  auto d = tessera::extender::PodDemandOf(j, 10);
  if (d.ok() && !tessera::core::ValidateRequest(d->request).empty()) __builtin_trap();
  if (!d.ok() && d.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
  auto n = tessera::extender::NodeOf(j);
  if (!n.ok() && n.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
  if (n.ok() && n->has_agent && n->healthy.size() != n->spec.gpus.size()) __builtin_trap();
  tessera::extender::ParseQuantity(text);
  return 0;
}
