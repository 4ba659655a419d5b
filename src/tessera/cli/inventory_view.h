#pragma once
// How a machine's GPU inventory and topology are shown: JSON (also the source of YAML) and tables.

#include <nlohmann/json_fwd.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "tessera/core/gpu.h"

namespace tessera::cli {

// Per-GPU probe result shown beside the inventory: empty string = answers, else why not.
using ProbeResults = std::vector<std::string>;

nlohmann::ordered_json InventoryToJson(const core::NodeInventory& inv, const ProbeResults& probes);
nlohmann::ordered_json TopologyToJson(const core::NodeInventory& inv);

void PrintGpuTable(const core::NodeInventory& inv, const ProbeResults& probes, std::ostream& out);
// A link matrix like `nvidia-smi topo -m`, a NUMA column, the socket split and a legend.
void PrintTopologyMatrix(const core::NodeInventory& inv, std::ostream& out);

// The line that opens every human-readable view: where the GPUs come from, loud when simulated.
std::string SourceBanner(const core::NodeInventory& inv);

}  // namespace tessera::cli
