// The quota ConfigMap's quotas.yaml (docs/kubernetes.md) read strictly: each namespace's
// guarantees, limits and cohort, errors naming the key and field.
#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "tessera/extender/extender.h"
#include "yaml-cpp/yaml.h"

namespace tessera::extender {

absl::StatusOr<std::map<std::string, sched::OwnerQuota>> ParseQuotas(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("quotas.yaml: not YAML: {}", e.what()));
  }
  std::map<std::string, sched::OwnerQuota> out;
  if (root.IsNull()) return out;
  if (!root.IsMap()) return absl::InvalidArgumentError("quotas.yaml: expected a mapping");
  for (const auto& top : root) {
    std::string key = top.first.as<std::string>("");
    if (key != "namespaces") {
      return absl::InvalidArgumentError(
          fmt::format("quotas.yaml: unknown key '{}' (expected namespaces)", key));
    }
  }
  YAML::Node nss = root["namespaces"];
  if (!nss || nss.IsNull()) return out;
  if (!nss.IsMap())
    return absl::InvalidArgumentError("quotas.yaml: namespaces: expected a mapping");
  for (const auto& entry : nss) {
    std::string ns = entry.first.as<std::string>("");
    std::string where = "quotas.yaml: namespaces." + ns;
    if (ns.empty()) return absl::InvalidArgumentError("quotas.yaml: an empty namespace name");
    const YAML::Node& q = entry.second;
    if (!q.IsMap()) return absl::InvalidArgumentError(where + ": expected a mapping");
    auto amount = [&](const char* field) -> absl::StatusOr<std::optional<sched::GpuAmount>> {
      YAML::Node a = q[field];
      if (!a) return std::optional<sched::GpuAmount>();
      std::string w = where + "." + field;
      if (!a.IsMap()) return absl::InvalidArgumentError(w + ": expected a mapping");
      sched::GpuAmount out{-1, -1, -1};
      for (const auto& kv : a) {
        std::string k = kv.first.as<std::string>("");
        std::string v = kv.second.IsScalar() ? kv.second.Scalar() : "";
        std::optional<int64_t> n;
        if (k == "gpus") {
          n = ParseQuantity(v, 1.0);
          if (n && std::to_string(*n) != v) n.reset();  // whole GPUs: an integer
          if (n) out.gpus = *n;
        } else if (k == "gpuCompute") {
          n = ParseQuantity(v, core::kMilliPerGpu);
          if (n) out.gpu_milli = *n;
        } else if (k == "gpuMemory") {
          n = ParseQuantity(v, 1.0 / (1 << 20));
          if (n) out.gpu_memory_mib = *n;
        } else {
          return absl::InvalidArgumentError(
              fmt::format("{}: unknown key '{}' (expected gpus, gpuCompute, gpuMemory)", w, k));
        }
        if (!n) {
          return absl::InvalidArgumentError(
              fmt::format("{}.{}: expected a non-negative {}, got '{}'", w, k,
                          k == "gpus" ? "whole number" : "quantity", v));
        }
      }
      return std::optional<sched::GpuAmount>(out);
    };
    for (const auto& kv : q) {
      std::string k = kv.first.as<std::string>("");
      if (k != "guaranteed" && k != "limit" && k != "cohort") {
        return absl::InvalidArgumentError(
            fmt::format("{}: unknown key '{}' (expected guaranteed, limit, cohort)", where, k));
      }
    }
    auto guaranteed = amount("guaranteed");
    if (!guaranteed.ok()) return guaranteed.status();
    auto limit = amount("limit");
    if (!limit.ok()) return limit.status();
    if (!*guaranteed && !*limit) {
      return absl::InvalidArgumentError(where + ": needs guaranteed, limit or both");
    }
    sched::OwnerQuota oq;
    oq.limit = guaranteed->value_or(**limit);
    if (*limit) {
      const sched::GpuAmount& l = **limit;
      const sched::GpuAmount& g = oq.limit;
      auto below = [](int64_t lim, int64_t guar) { return lim >= 0 && (guar < 0 || lim < guar); };
      if (below(l.gpus, g.gpus) || below(l.gpu_milli, g.gpu_milli) ||
          below(l.gpu_memory_mib, g.gpu_memory_mib)) {
        return absl::InvalidArgumentError(where + ": limit is below guaranteed");
      }
      oq.borrow = !(l == g);
      oq.borrow_limit = l;
    }
    if (YAML::Node c = q["cohort"]) {
      if (!c.IsScalar()) return absl::InvalidArgumentError(where + ".cohort: expected a name");
      oq.cohort = c.Scalar();
    }
    out[ns] = oq;
  }
  return out;
}

}  // namespace tessera::extender
