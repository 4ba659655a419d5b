#pragma once
// What the agent writes on its Node: labels a user can select on (product, memory, count,
// compute capability, driver and CUDA versions, MIG mode, NVLink; docs/kubernetes.md) and the
// `tessera.io/gpus` annotation the extender places pods with. Pure functions: the desired state
// from the inventory and health, and the JSON merge patch that brings a Node there, removing the
// labels the agent set before and no longer sets (remembered in `tessera.io/agent-labels`), and
// never touching a label it does not own.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tessera/core/gpu.h"
#include "tessera/core/request.h"

namespace tessera::agent {

inline constexpr char kLabelPrefix[] = "tessera.io/";
// The annotation listing the labels the agent owns on the node, comma-separated.
inline constexpr char kOwnedLabelsAnnotation[] = "tessera.io/agent-labels";

// A label value as Kubernetes accepts it: at most 63 characters of [A-Za-z0-9._-], beginning and
// ending with a letter or digit; anything else becomes '-'. Empty stays empty.
std::string LabelValue(std::string_view text);

struct NodeFacts {
  const core::NodeInventory* inventory = nullptr;
  std::vector<bool> healthy;
  int shares_per_gpu = 0;                 // 0: shares not served
  std::vector<core::GpuSharing> sharing;  // per GPU; empty: all time-sliced
};

std::map<std::string, std::string> DesiredLabels(const NodeFacts& facts);
std::map<std::string, std::string> DesiredAnnotations(const NodeFacts& facts);

// The merge patch that takes `node` (as the API server has it) to the desired labels and
// annotations; nullopt when it is already there.
std::optional<nlohmann::json> NodePatch(const nlohmann::json& node,
                                        const std::map<std::string, std::string>& labels,
                                        const std::map<std::string, std::string>& annotations);

}  // namespace tessera::agent
