#include "tessera/cli/inventory_view.h"

#include <map>
#include <nlohmann/json.hpp>

#include "fmt/format.h"
#include "tessera/cli/output.h"

namespace tessera::cli {
namespace {

template <typename T>
nlohmann::ordered_json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

std::string OnOff(const std::optional<bool>& v) {
  if (!v) return "?";
  return *v ? "on" : "off";
}

nlohmann::ordered_json LinkJson(const core::GpuLink& l, int a, int b) {
  return {{"a", a},
          {"b", b},
          {"label", core::LinkLabel(l)},
          {"nvlinks", l.nvlinks},
          {"via_nvswitch", l.via_nvswitch},
          {"pcie", std::string(core::PcieLevelCode(l.pcie))}};
}

}  // namespace

std::string SourceBanner(const core::NodeInventory& inv) {
  if (inv.simulated) {
    return fmt::format("SIMULATED machine ({}): not real hardware", inv.source);
  }
  return fmt::format("NVIDIA driver {} (CUDA {}) on {}", OrDash(inv.driver_version),
                     OrDash(inv.cuda_driver_version), inv.hostname);
}

nlohmann::ordered_json InventoryToJson(const core::NodeInventory& inv, const ProbeResults& probes) {
  nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
  for (const core::Gpu& g : inv.gpus) {
    nlohmann::ordered_json j;
    j["index"] = g.index;
    j["uuid"] = g.uuid;
    j["model"] =
        g.model.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(g.model);
    j["memory_bytes"] = OrNull(g.memory_bytes);
    j["memory_mib"] = g.memory_bytes ? nlohmann::ordered_json(*g.memory_bytes >> 20)
                                     : nlohmann::ordered_json(nullptr);
    j["compute_capability"] =
        g.compute_capability
            ? nlohmann::ordered_json(core::FormatComputeCapability(*g.compute_capability))
            : nlohmann::ordered_json(nullptr);
    j["pci_bus_id"] = g.pci_bus_id.empty() ? nlohmann::ordered_json(nullptr)
                                           : nlohmann::ordered_json(g.pci_bus_id);
    j["numa_node"] = OrNull(g.numa_node);
    j["minor"] = OrNull(g.minor);
    j["device_node"] = g.minor ? nlohmann::ordered_json(fmt::format("/dev/nvidia{}", *g.minor))
                               : nlohmann::ordered_json(nullptr);
    j["ecc_enabled"] = OrNull(g.ecc_enabled);
    j["mig_enabled"] = OrNull(g.mig_enabled);
    if (static_cast<size_t>(g.index) < probes.size()) {
      j["answers"] = probes[g.index].empty();
      if (!probes[g.index].empty()) j["probe_error"] = probes[g.index];
    }
    gpus.push_back(std::move(j));
  }
  nlohmann::ordered_json out;
  out["hostname"] = inv.hostname;
  out["simulated"] = inv.simulated;
  out["source"] = inv.source;
  out["driver_version"] = inv.driver_version.empty() ? nlohmann::ordered_json(nullptr)
                                                     : nlohmann::ordered_json(inv.driver_version);
  out["cuda_driver_version"] = inv.cuda_driver_version.empty()
                                   ? nlohmann::ordered_json(nullptr)
                                   : nlohmann::ordered_json(inv.cuda_driver_version);
  out["gpu_count"] = inv.gpus.size();
  out["gpus"] = std::move(gpus);
  out["links"] = TopologyToJson(inv)["links"];
  return out;
}

nlohmann::ordered_json TopologyToJson(const core::NodeInventory& inv) {
  const core::Topology& t = inv.topology;
  nlohmann::ordered_json matrix = nlohmann::ordered_json::array();
  nlohmann::ordered_json links = nlohmann::ordered_json::array();
  for (int a = 0; a < t.size(); ++a) {
    nlohmann::ordered_json row = nlohmann::ordered_json::array();
    for (int b = 0; b < t.size(); ++b) {
      row.push_back(core::LinkLabel(t.link(a, b)));
      if (b > a) links.push_back(LinkJson(t.link(a, b), a, b));
    }
    matrix.push_back(std::move(row));
  }
  nlohmann::ordered_json numa = nlohmann::ordered_json::array();
  for (const core::Gpu& g : inv.gpus) numa.push_back(OrNull(g.numa_node));
  return {{"simulated", inv.simulated}, {"source", inv.source}, {"gpu_count", inv.gpus.size()},
          {"numa_nodes", numa},         {"matrix", matrix},     {"links", links}};
}

void PrintGpuTable(const core::NodeInventory& inv, const ProbeResults& probes, std::ostream& out) {
  out << SourceBanner(inv) << "\n";
  out << fmt::format("host {}  driver {}  CUDA {}  {} GPU{}\n\n", OrDash(inv.hostname),
                     OrDash(inv.driver_version), OrDash(inv.cuda_driver_version), inv.gpus.size(),
                     inv.gpus.size() == 1 ? "" : "s");
  Table table(
      {"IDX", "MODEL", "MEMORY", "CC", "NUMA", "PCI BUS ID", "DEV", "ECC", "MIG", "STATE", "UUID"});
  for (const core::Gpu& g : inv.gpus) {
    std::string state = "ok";
    if (static_cast<size_t>(g.index) < probes.size() && !probes[g.index].empty()) {
      state = "NOT ANSWERING";
    }
    table.AddRow({std::to_string(g.index), g.model.empty() ? "?" : g.model,
                  g.memory_bytes ? core::FormatBytes(*g.memory_bytes) : "?",
                  g.compute_capability ? core::FormatComputeCapability(*g.compute_capability) : "?",
                  g.numa_node ? std::to_string(*g.numa_node) : "?", OrDash(g.pci_bus_id),
                  g.minor ? fmt::format("/dev/nvidia{}", *g.minor) : "?", OnOff(g.ecc_enabled),
                  OnOff(g.mig_enabled), state, g.uuid});
  }
  table.Print(out);
  for (size_t i = 0; i < probes.size(); ++i) {
    if (!probes[i].empty()) out << fmt::format("gpu {}: {}\n", i, probes[i]);
  }
}

void PrintTopologyMatrix(const core::NodeInventory& inv, std::ostream& out) {
  const core::Topology& t = inv.topology;
  out << SourceBanner(inv) << "\n\n";
  std::vector<std::string> header = {""};
  for (int b = 0; b < t.size(); ++b) header.push_back(fmt::format("GPU{}", b));
  header.push_back("NUMA");
  Table table(header);
  bool any_nvswitch = false;
  std::map<int, std::vector<int>> by_numa;
  for (int a = 0; a < t.size(); ++a) {
    std::vector<std::string> row = {fmt::format("GPU{}", a)};
    for (int b = 0; b < t.size(); ++b) {
      row.push_back(core::LinkLabel(t.link(a, b)));
      any_nvswitch |= t.link(a, b).via_nvswitch;
    }
    const auto& numa = inv.gpus[a].numa_node;
    row.push_back(numa ? std::to_string(*numa) : "?");
    by_numa[numa.value_or(-1)].push_back(a);
    table.AddRow(std::move(row));
  }
  table.Print(out);
  out << "\n";
  for (const auto& [node, gpus] : by_numa) {
    std::string list;
    for (int g : gpus) list += fmt::format("{}GPU{}", list.empty() ? "" : " ", g);
    if (node < 0) {
      out << fmt::format("NUMA node unknown: {}\n", list);
    } else {
      out << fmt::format("NUMA node {}: {}\n", node, list);
    }
  }
  out << "\nLegend:\n"
         "  X    = self\n"
         "  NV#  = NVLink with # links"
      << (any_nvswitch ? " (here through the NVSwitch fabric)" : "") << "\n";
  for (core::PcieLevel level :
       {core::PcieLevel::kBoard, core::PcieLevel::kSingleSwitch, core::PcieLevel::kMultipleSwitches,
        core::PcieLevel::kHostBridge, core::PcieLevel::kNumaNode, core::PcieLevel::kSystem}) {
    out << fmt::format("  {:<4} = through {}\n", core::PcieLevelCode(level),
                       core::PcieLevelDescription(level));
  }
  out << "  Nearer is faster: NV# > BRD > PIX > PXB > PHB > NODE > SYS.\n";
}

}  // namespace tessera::cli
