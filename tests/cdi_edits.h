#pragma once
// What a container runtime gives a process from CDI container edits, for tests that run the
// process without a container: its environment, each value naming a mounted path replaced by that
// mount's host path (where the mount would put it), and the host paths of the device nodes and of
// the mounts.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::test {

struct CdiProcess {
  std::map<std::string, std::string> env;
  std::vector<std::string> device_nodes, mounts;
};

// Adds one containerEdits object (a spec's or a device's) to `out`.
inline void ApplyCdiEdits(const nlohmann::json& edits, CdiProcess* out) {
  std::map<std::string, std::string> host_of;
  for (const nlohmann::json& m : edits.value("mounts", nlohmann::json::array())) {
    host_of[m["containerPath"]] = m["hostPath"];
    out->mounts.push_back(m["hostPath"]);
  }
  for (const nlohmann::json& n : edits.value("deviceNodes", nlohmann::json::array())) {
    out->device_nodes.push_back(n.value("hostPath", n.value("path", "")));
  }
  for (const nlohmann::json& e : edits.value("env", nlohmann::json::array())) {
    const std::string kv = e.get<std::string>();
    const std::string k = kv.substr(0, kv.find('=')), v = kv.substr(kv.find('=') + 1);
    out->env[k] = host_of.contains(v) ? host_of[v] : v;
  }
}

}  // namespace tessera::test
