#pragma once
// Kubernetes resource quantities ("500m", "2", "1.5Gi", "16G", "1e3"), as the API server and its
// users write them.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::kube {

// A quantity scaled by `scale` and rounded up: ParseQuantity("500m", 1000) = 500 (milli),
// ParseQuantity("1Gi", 1.0 / (1 << 20)) = 1024 (MiB). nullopt when malformed, negative or out of
// range. The API server rewrites quantities in canonical form ("1024Mi" comes back "1Gi"): compare
// their values, never their strings.
std::optional<int64_t> ParseQuantity(std::string_view text, double scale = 1.0);

// Bytes as the API server writes them in canonical form: "80Gi", "1536Mi", "1000Ki", "999".
std::string FormatBinaryQuantity(uint64_t bytes);

}  // namespace tessera::kube
