#include "tessera/devices/inventory.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "fmt/format.h"
#include "tessera/devices/presets.h"

namespace tessera::devices {
namespace {

// Thrown inside the parser only, caught at its edge and turned into a Status.
struct ParseError {
  int line;  // 1-based; 0 when unknown
  std::string message;
};

int LineOf(const YAML::Node& node) { return node.Mark().line >= 0 ? node.Mark().line + 1 : 0; }

[[noreturn]] void Fail(const YAML::Node& node, std::string message) {
  throw ParseError{LineOf(node), std::move(message)};
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Null:
      return "nothing";
    default:
      return "an undefined value";
  }
}

// Checks that `node` is a mapping whose keys are all in `allowed`, each once.
void CheckMap(const YAML::Node& node, std::string_view what,
              std::initializer_list<std::string_view> allowed) {
  if (!node.IsMap())
    Fail(node, fmt::format("{}: expected a mapping, got {}", what, Describe(node)));
  std::set<std::string> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) Fail(kv.first, fmt::format("{}: keys must be plain words", what));
    const std::string& key = kv.first.Scalar();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      Fail(kv.first, fmt::format("unknown key '{}' in {} (expected one of: {})", key, what, list));
    }
    if (!seen.insert(key).second)
      Fail(kv.first, fmt::format("{}: key '{}' given twice", what, key));
  }
}

std::string GetString(const YAML::Node& node, std::string_view what) {
  if (!node.IsScalar()) Fail(node, fmt::format("{}: expected text, got {}", what, Describe(node)));
  return node.Scalar();
}

int64_t GetInt(const YAML::Node& node, std::string_view what, int64_t lo, int64_t hi) {
  if (!node.IsScalar()) {
    Fail(node, fmt::format("{}: expected an integer {}..{}, got {}", what, lo, hi, Describe(node)));
  }
  const std::string& s = node.Scalar();
  int64_t v = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), v);
  if (res.ec != std::errc() || res.ptr != s.data() + s.size() || v < lo || v > hi) {
    Fail(node, fmt::format("{}: expected an integer {}..{}, got '{}'", what, lo, hi, s));
  }
  return v;
}

bool GetBool(const YAML::Node& node, std::string_view what) {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
  }
  Fail(node, fmt::format("{}: expected true or false, got {}", what, Describe(node)));
}

// "2s", "500ms", "1m", "0" -> milliseconds.
std::chrono::milliseconds GetDuration(const YAML::Node& node, std::string_view what) {
  std::string s = GetString(node, what);
  int64_t v = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), v);
  std::string_view unit(res.ptr, s.data() + s.size() - res.ptr);
  int64_t factor = 0;
  if (unit == "ms") factor = 1;
  if (unit == "s") factor = 1000;
  if (unit == "m") factor = 60000;
  if (unit.empty() && v == 0) factor = 1;
  if (res.ec != std::errc() || res.ptr == s.data() || v < 0 || factor == 0 || v > 86400000) {
    Fail(node, fmt::format("{}: expected a duration like 500ms, 2s or 1m, got '{}'", what, s));
  }
  return std::chrono::milliseconds(v * factor);
}

YAML::Node Require(const YAML::Node& map, const char* key, std::string_view what) {
  YAML::Node value = map[key];
  if (!value.IsDefined() || value.IsNull()) {
    Fail(map, fmt::format("{}: '{}' is required", what, key));
  }
  return value;
}

// 128 bits derived from `text` (FNV-1a, then the splitmix64 finaliser so that similar names give
// unrelated ids), formatted as an NVIDIA-style UUID; stable across runs and builds.
std::string SimulatedUuid(std::string_view text) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  uint64_t hi = mix(h), lo = mix(h ^ 0x9e3779b97f4a7c15ull);
  return fmt::format("GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", hi >> 32, (hi >> 16) & 0xffff,
                     hi & 0xffff, lo >> 48, lo & 0xffffffffffffull);
}

// Where a GPU sits on the PCIe tree.
struct Placement {
  int line = 0;  // where it was placed, for "already placed" errors
  int socket = -1;
  int numa_node = -1;
  int host_bridge = -1;
  std::vector<int> switches;  // root to leaf
  int board = -1;
};

class Parser {
 public:
  explicit Parser(std::string name) : name_(std::move(name)) {}

  SimulatedMachine Parse(const YAML::Node& root) {
    CheckMap(root, "inventory",
             {"name", "hostname", "driver_version", "cuda_driver_version", "gpus", "pcie", "boards",
              "nvlink", "health_events"});
    SimulatedMachine m;
    core::NodeInventory& inv = m.inventory;
    std::string name = GetString(Require(root, "name", "inventory"), "name");
    if (name.empty()) Fail(root["name"], "name: must not be empty");
    inv.simulated = true;
    inv.source = "simulated:" + name_;
    inv.hostname = root["hostname"] ? GetString(root["hostname"], "hostname") : "sim-" + name;
    if (root["driver_version"])
      inv.driver_version = GetString(root["driver_version"], "driver_version");
    if (root["cuda_driver_version"]) {
      inv.cuda_driver_version = GetString(root["cuda_driver_version"], "cuda_driver_version");
    }
    ParseGpus(Require(root, "gpus", "inventory"), name, inv.gpus);
    n_ = static_cast<int>(inv.gpus.size());
    placements_.assign(n_, Placement{});
    if (root["pcie"]) {
      ParsePcie(root["pcie"]);
    } else {
      for (Placement& p : placements_) p = Placement{.socket = 0, .numa_node = 0, .host_bridge = 0};
    }
    if (root["boards"]) ParseBoards(root["boards"]);
    inv.topology = core::Topology(n_);
    for (int a = 0; a < n_; ++a) {
      inv.gpus[a].numa_node = placements_[a].numa_node;
      for (int b = a + 1; b < n_; ++b) {
        inv.topology.SetLink(a, b, core::GpuLink{.pcie = Level(placements_[a], placements_[b])});
      }
    }
    if (root["nvlink"]) ParseNvlink(root["nvlink"], inv.topology);
    if (root["health_events"]) ParseEvents(root["health_events"], m.health_events);
    return m;
  }

 private:
  void ParseGpus(const YAML::Node& node, const std::string& machine, std::vector<core::Gpu>& gpus) {
    if (!node.IsSequence() || node.size() == 0) {
      Fail(node, fmt::format("gpus: expected a list of GPU groups, got {}", Describe(node)));
    }
    for (const YAML::Node& g : node) {
      CheckMap(g, "gpu group", {"model", "count", "memory", "compute_capability", "ecc", "mig"});
      std::string model = GetString(Require(g, "model", "gpu group"), "model");
      int64_t count = GetInt(Require(g, "count", "gpu group"), "count", 1, kMaxGpusPerMachine);
      const YAML::Node& mem_node = Require(g, "memory", "gpu group");
      std::optional<uint64_t> memory = core::ParseBytes(GetString(mem_node, "memory"));
      if (!memory || *memory < (256ull << 20) || *memory > (4ull << 40)) {
        Fail(mem_node,
             fmt::format("memory: expected a size between 256MiB and 4TiB like 80GiB, got {}",
                         Describe(mem_node)));
      }
      const YAML::Node& cc_node = Require(g, "compute_capability", "gpu group");
      auto cc = core::ParseComputeCapability(GetString(cc_node, "compute_capability"));
      if (!cc || cc->major < 1) {
        Fail(cc_node, fmt::format("compute_capability: expected MAJOR.MINOR like \"9.0\", got {}",
                                  Describe(cc_node)));
      }
      bool ecc = g["ecc"] ? GetBool(g["ecc"], "ecc") : true;
      bool mig = g["mig"] ? GetBool(g["mig"], "mig") : false;
      if (static_cast<int64_t>(gpus.size()) + count > kMaxGpusPerMachine) {
        Fail(g["count"], fmt::format("gpus: more than {} GPUs in one machine", kMaxGpusPerMachine));
      }
      for (int64_t i = 0; i < count; ++i) {
        core::Gpu gpu;
        gpu.index = static_cast<int>(gpus.size());
        gpu.uuid = SimulatedUuid(fmt::format("{}/{}", machine, gpu.index));
        gpu.model = model;
        gpu.memory_bytes = memory;
        gpu.compute_capability = cc;
        gpu.pci_bus_id = fmt::format("00000000:{:02X}:00.0", 0x10 + 3 * gpu.index);
        gpu.minor = gpu.index;
        gpu.ecc_enabled = ecc;
        gpu.mig_enabled = mig;
        gpus.push_back(std::move(gpu));
      }
    }
  }

  int GpuIndex(const YAML::Node& node, std::string_view what) {
    return static_cast<int>(GetInt(node, what, 0, n_ - 1));
  }

  void Place(const YAML::Node& gpus_node, const Placement& where) {
    if (!gpus_node.IsSequence()) {
      Fail(gpus_node,
           fmt::format("gpus: expected a list of GPU indices, got {}", Describe(gpus_node)));
    }
    for (const YAML::Node& g : gpus_node) {
      int idx = GpuIndex(g, "gpus");
      if (placements_[idx].socket >= 0) {
        Fail(g,
             fmt::format("gpu {} is placed twice (first at line {})", idx, placements_[idx].line));
      }
      placements_[idx] = where;
      placements_[idx].line = LineOf(g);
    }
  }

  void ParseSwitch(const YAML::Node& node, Placement where) {
    CheckMap(node, "PCIe switch", {"gpus", "switches"});
    if (!node["gpus"] && !node["switches"])
      Fail(node, "PCIe switch: has neither gpus nor switches");
    where.switches.push_back(next_switch_++);
    if (node["gpus"]) Place(node["gpus"], where);
    if (node["switches"]) ParseSwitches(node["switches"], where);
  }

  void ParseSwitches(const YAML::Node& node, const Placement& where) {
    if (!node.IsSequence())
      Fail(node, fmt::format("switches: expected a list, got {}", Describe(node)));
    for (const YAML::Node& s : node) ParseSwitch(s, where);
  }

  void ParsePcie(const YAML::Node& node) {
    if (!node.IsSequence() || node.size() == 0) {
      Fail(node, fmt::format("pcie: expected a list of sockets, got {}", Describe(node)));
    }
    std::map<int, int> numa_line;
    std::set<int> sockets;
    for (const YAML::Node& s : node) {
      CheckMap(s, "socket", {"socket", "numa_node", "host_bridges"});
      Placement where;
      where.socket = static_cast<int>(GetInt(Require(s, "socket", "socket"), "socket", 0, 63));
      if (!sockets.insert(where.socket).second) {
        Fail(s["socket"], fmt::format("socket {} is listed twice", where.socket));
      }
      where.numa_node = s["numa_node"]
                            ? static_cast<int>(GetInt(s["numa_node"], "numa_node", 0, 1023))
                            : where.socket;
      if (auto [it, fresh] = numa_line.emplace(where.numa_node, LineOf(s)); !fresh) {
        Fail(s, fmt::format("NUMA node {} already belongs to the socket at line {}",
                            where.numa_node, it->second));
      }
      const YAML::Node& hbs = Require(s, "host_bridges", "socket");
      if (!hbs.IsSequence() || hbs.size() == 0) {
        Fail(hbs, fmt::format("host_bridges: expected a list, got {}", Describe(hbs)));
      }
      for (const YAML::Node& hb : hbs) {
        CheckMap(hb, "host bridge", {"gpus", "switches"});
        if (!hb["gpus"] && !hb["switches"]) Fail(hb, "host bridge: has neither gpus nor switches");
        Placement at = where;
        at.host_bridge = next_host_bridge_++;
        if (hb["gpus"]) Place(hb["gpus"], at);
        if (hb["switches"]) ParseSwitches(hb["switches"], at);
      }
    }
    for (int i = 0; i < n_; ++i) {
      if (placements_[i].socket < 0) {
        Fail(node, fmt::format("pcie: gpu {} is not placed under any socket", i));
      }
    }
  }

  void ParseBoards(const YAML::Node& node) {
    if (!node.IsSequence())
      Fail(node, fmt::format("boards: expected a list, got {}", Describe(node)));
    int board = 0;
    for (const YAML::Node& b : node) {
      if (!b.IsSequence() || b.size() < 2) {
        Fail(b, "boards: each board is a list of two or more GPU indices");
      }
      for (const YAML::Node& g : b) {
        int idx = GpuIndex(g, "boards");
        if (placements_[idx].board >= 0) Fail(g, fmt::format("gpu {} is on two boards", idx));
        placements_[idx].board = board;
      }
      // GPUs of one board share its PCIe switch, so they must sit together in the tree.
      int first = GpuIndex(b[0], "boards");
      for (const YAML::Node& g : b) {
        int idx = GpuIndex(g, "boards");
        const Placement &p = placements_[idx], &q = placements_[first];
        if (p.socket != q.socket || p.host_bridge != q.host_bridge || p.switches != q.switches) {
          Fail(g, fmt::format("boards: gpu {} and gpu {} share a board but not a PCIe parent", idx,
                              first));
        }
      }
      ++board;
    }
  }

  static core::PcieLevel Level(const Placement& a, const Placement& b) {
    if (a.board >= 0 && a.board == b.board) return core::PcieLevel::kBoard;
    if (a.socket != b.socket) return core::PcieLevel::kSystem;
    if (a.host_bridge != b.host_bridge) return core::PcieLevel::kNumaNode;
    if (a.switches.empty() || b.switches.empty() || a.switches[0] != b.switches[0]) {
      return core::PcieLevel::kHostBridge;
    }
    return a.switches == b.switches ? core::PcieLevel::kSingleSwitch
                                    : core::PcieLevel::kMultipleSwitches;
  }

  void ParseNvlink(const YAML::Node& node, core::Topology& topo) {
    CheckMap(node, "nvlink", {"nvswitch", "links"});
    std::vector<int> used(n_, 0);
    std::vector<int> fabric(n_, 0);
    if (node["nvswitch"]) {
      const YAML::Node& sw = node["nvswitch"];
      CheckMap(sw, "nvswitch", {"links", "gpus"});
      int links = static_cast<int>(
          GetInt(Require(sw, "links", "nvswitch"), "nvswitch.links", 1, kMaxNvlinksPerGpu));
      std::vector<int> members;
      if (sw["gpus"]) {
        if (!sw["gpus"].IsSequence())
          Fail(sw["gpus"], "nvswitch.gpus: expected a list of GPU indices");
        for (const YAML::Node& g : sw["gpus"]) {
          int idx = GpuIndex(g, "nvswitch.gpus");
          if (fabric[idx]) Fail(g, fmt::format("nvswitch.gpus: gpu {} listed twice", idx));
          fabric[idx] = links;
          members.push_back(idx);
        }
      } else {
        for (int i = 0; i < n_; ++i) {
          fabric[i] = links;
          members.push_back(i);
        }
      }
      for (int i : members) used[i] += links;
      for (size_t x = 0; x < members.size(); ++x) {
        for (size_t y = x + 1; y < members.size(); ++y) {
          core::GpuLink l = topo.link(members[x], members[y]);
          l.nvlinks = links;
          l.via_nvswitch = true;
          topo.SetLink(members[x], members[y], l);
        }
      }
    }
    if (node["links"]) {
      const YAML::Node& links = node["links"];
      if (!links.IsSequence()) Fail(links, "nvlink.links: expected a list of [gpu, gpu, count]");
      for (const YAML::Node& l : links) {
        if (!l.IsSequence() || l.size() != 3) {
          Fail(l, fmt::format("nvlink.links: expected [gpu, gpu, count], got {}", Describe(l)));
        }
        int a = GpuIndex(l[0], "nvlink.links"), b = GpuIndex(l[1], "nvlink.links");
        int count = static_cast<int>(GetInt(l[2], "nvlink.links count", 1, kMaxNvlinksPerGpu));
        if (a == b) Fail(l, fmt::format("nvlink.links: gpu {} cannot link to itself", a));
        if (topo.link(a, b).via_nvswitch) {
          Fail(l, fmt::format("nvlink.links: gpu {} and gpu {} already meet through the NVSwitch",
                              a, b));
        }
        if (topo.link(a, b).nvlinks > 0) {
          Fail(l, fmt::format("nvlink.links: gpu {} and gpu {} are linked twice", a, b));
        }
        used[a] += count;
        used[b] += count;
        for (int g : {a, b}) {
          if (used[g] > kMaxNvlinksPerGpu) {
            Fail(l,
                 fmt::format("nvlink: gpu {} would have {} NVLink links; no GPU has more than {}",
                             g, used[g], kMaxNvlinksPerGpu));
          }
        }
        core::GpuLink link = topo.link(a, b);
        link.nvlinks = count;
        topo.SetLink(a, b, link);
      }
    }
  }

  void ParseEvents(const YAML::Node& node, std::vector<ScriptedHealthEvent>& out) {
    if (!node.IsSequence()) Fail(node, "health_events: expected a list");
    for (const YAML::Node& e : node) {
      CheckMap(e, "health event", {"after", "gpu", "xid", "ecc", "lost"});
      ScriptedHealthEvent ev;
      ev.after = GetDuration(Require(e, "after", "health event"), "after");
      ev.event.gpu = GpuIndex(Require(e, "gpu", "health event"), "gpu");
      int kinds = (e["xid"] ? 1 : 0) + (e["ecc"] ? 1 : 0) + (e["lost"] ? 1 : 0);
      if (kinds != 1) Fail(e, "health event: give exactly one of xid, ecc, lost");
      if (e["xid"]) {
        ev.event.kind = HealthEvent::Kind::kXid;
        ev.event.xid = static_cast<uint64_t>(GetInt(e["xid"], "xid", 1, 65535));
        ev.event.detail = fmt::format("XID {}", ev.event.xid);
      } else if (e["ecc"]) {
        std::string kind = GetString(e["ecc"], "ecc");
        if (kind == "double_bit") {
          ev.event.kind = HealthEvent::Kind::kEccDoubleBit;
          ev.event.detail = "double-bit ECC error";
        } else if (kind == "single_bit") {
          ev.event.kind = HealthEvent::Kind::kEccSingleBit;
          ev.event.detail = "single-bit ECC error";
        } else {
          Fail(e["ecc"], fmt::format("ecc: expected double_bit or single_bit, got '{}'", kind));
        }
      } else {
        ev.action = GetBool(e["lost"], "lost") ? ScriptedHealthEvent::Action::kLose
                                               : ScriptedHealthEvent::Action::kRestore;
      }
      out.push_back(ev);
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.after < b.after; });
  }

  std::string name_;
  int n_ = 0;
  std::vector<Placement> placements_;
  int next_host_bridge_ = 0;
  int next_switch_ = 0;
};

}  // namespace

absl::StatusOr<SimulatedMachine> ParseInventory(std::string_view yaml, std::string_view filename) {
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    if (!root.IsDefined() || root.IsNull()) {
      return absl::InvalidArgumentError(fmt::format("{}:1: the inventory is empty", filename));
    }
    return Parser(std::string(filename)).Parse(root);
  } catch (const ParseError& e) {
    return absl::InvalidArgumentError(fmt::format("{}:{}: {}", filename, e.line, e.message));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("{}:{}: not valid YAML: {}", filename, e.mark.line + 1, e.msg));
  }
}

absl::StatusOr<SimulatedMachine> LoadSimulatedMachine(const std::string& spec) {
  if (std::string_view text = PresetYaml(spec); !text.empty()) {
    auto m = ParseInventory(text, spec);
    if (m.ok()) m->inventory.source = "simulated:preset " + spec;
    return m;
  }
  std::error_code ec;
  if (!std::filesystem::exists(spec, ec)) {
    std::string names;
    for (const auto& n : PresetNames()) names += (names.empty() ? "" : ", ") + n;
    if (spec.find('/') == std::string::npos && spec.find('.') == std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("unknown preset '{}' (presets: {}; or give an inventory file)", spec, names));
    }
    return absl::NotFoundError(fmt::format("{}: no such file (presets: {})", spec, names));
  }
  std::ifstream in(spec, std::ios::binary);
  if (!in) return absl::NotFoundError(fmt::format("{}: cannot open for reading", spec));
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(fmt::format("{}: read error", spec));
  auto m = ParseInventory(buf.str(), spec);
  if (m.ok()) m->inventory.source = "simulated:file " + spec;
  return m;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : BundledPresets()) names.emplace_back(p.name);
  std::sort(names.begin(), names.end());
  return names;
}

std::string_view PresetYaml(std::string_view name) {
  for (const Preset& p : BundledPresets()) {
    if (p.name == name) return p.yaml;
  }
  return {};
}

}  // namespace tessera::devices
