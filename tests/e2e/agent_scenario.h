#pragma once
// The node the agent's e2e tests run on, as the fake NVML's scenario: four A100s (40 GB) on two
// PCIe switches, one per socket, GPU i with UUID Uuid(i); with `xid`, GPU 2 reports XID 79 (fallen
// off the bus) 1.5 s after the agent's nvmlInit.
#include <nlohmann/json.hpp>
#include <string>

namespace tessera::test {

inline std::string Uuid(int i) {
  return "GPU-00000000-0000-0000-0000-00000000000" + std::to_string(i);
}

inline nlohmann::json FourA100s(const std::string& driver_version, bool xid) {
  nlohmann::json scenario = {{"driver_version", driver_version}, {"cuda_driver_version", 12040}};
  for (int i = 0; i < 4; ++i) {
    scenario["devices"].push_back({{"uuid", Uuid(i)},
                                   {"name", "NVIDIA A100-SXM4-40GB"},
                                   {"memory_total", 42949672960},
                                   {"pci_bus_id", "00000000:1" + std::to_string(i) + ":00.0"},
                                   {"numa", i / 2},
                                   {"minor", i},
                                   {"utilization", 10 * (i + 1)},
                                   {"nvswitch_links", 0}});
  }
  scenario["topology"] = {{0, 10, 50, 50}, {10, 0, 50, 50}, {50, 50, 0, 10}, {50, 50, 10, 0}};
  if (xid) scenario["events"] = {{{"at_ms", 1500}, {"device", 2}, {"type", 8}, {"data", 79}}};
  return scenario;
}

}  // namespace tessera::test
