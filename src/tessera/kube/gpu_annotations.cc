#include "tessera/kube/gpu_annotations.h"

#include <charconv>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/core/numeric.h"

namespace tessera::kube {
namespace {

using nlohmann::json;

constexpr int kMaxContainers = 64;
constexpr int kMaxGpus = 64;
constexpr size_t kMaxText = 256 * 1024;  // the API server's limit for all annotations together

absl::Status Bad(std::string_view annotation, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("annotation {}: {}", annotation, what));
}

// Reads an optional member of the expected JSON type; a wrong type is an error naming `where`.
template <typename T>
absl::Status Member(const json& obj, const char* key, std::string_view annotation,
                    const std::string& where, std::optional<T>& out) {
  if (!obj.contains(key) || obj[key].is_null()) return absl::OkStatus();
  const json& v = obj[key];
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return Bad(annotation, where + key + ": expected a string");
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return Bad(annotation, where + key + ": expected true or false");
  } else if constexpr (std::is_unsigned_v<T>) {
    if (!v.is_number_unsigned()) {
      return Bad(annotation, where + key + ": expected a whole number >= 0");
    }
  } else {
    if (!v.is_number_integer()) return Bad(annotation, where + key + ": expected a whole number");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(std::numeric_limits<T>::max())
                               : v.get<int64_t>() < int64_t(std::numeric_limits<T>::min()) ||
                                     v.get<int64_t>() > int64_t(std::numeric_limits<T>::max())) {
      return Bad(annotation, where + key + ": out of range");
    }
  }
  out = v.get<T>();
  return absl::OkStatus();
}

absl::Status ValidUuid(std::string_view annotation, const std::string& where,
                       const std::string& uuid) {
  if (uuid.empty() || uuid.size() > 128) {
    return Bad(annotation, where + ": expected a GPU UUID of 1..128 characters");
  }
  for (char c : uuid) {
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e || c == ',') {
      return Bad(annotation, where + ": a GPU UUID has no spaces, commas or control characters");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseObject(std::string_view annotation, std::string_view text) {
  if (text.size() > kMaxText) return Bad(annotation, "longer than 256 KiB");
  try {
    json j = json::parse(text);
    if (!j.is_object()) return Bad(annotation, "expected a JSON object");
    return j;
  } catch (const json::exception& e) {
    return Bad(annotation, std::string("not JSON: ") + e.what());
  }
}

}  // namespace

std::string FormatAssignment(const Assignment& a) {
  json containers = json::array();
  for (const ContainerAssignment& c : a.containers) {
    json e = {
        {"container", c.container}, {"resource", c.resource}, {"gpus", c.gpus}, {"count", c.count}};
    if (c.memory) e["memory"] = *c.memory;
    if (c.priority) e["priority"] = *c.priority;
    containers.push_back(std::move(e));
  }
  json out = {{"node", a.node}, {"assignedAt", a.assigned_unix_ms}, {"containers", containers}};
  if (!a.gang.empty()) out["gang"] = {{"id", a.gang}, {"gpus", a.gang_gpus}};
  return out.dump();
}

absl::StatusOr<Assignment> ParseAssignment(std::string_view text) {
  constexpr std::string_view kA = kAssignmentAnnotation;
  auto j = ParseObject(kA, text);
  if (!j.ok()) return j.status();
  Assignment a;
  std::optional<std::string> node;
  std::optional<int64_t> at;
  if (auto s = Member(*j, "node", kA, "", node); !s.ok()) return s;
  if (auto s = Member(*j, "assignedAt", kA, "", at); !s.ok()) return s;
  a.node = node.value_or("");
  a.assigned_unix_ms = at.value_or(0);
  if (!j->contains("containers") || !(*j)["containers"].is_array()) {
    return Bad(kA, "containers: expected a list");
  }
  const json& list = (*j)["containers"];
  if (list.empty() || list.size() > kMaxContainers) {
    return Bad(kA, fmt::format("containers: expected 1..{} entries", kMaxContainers));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    std::string where = fmt::format("containers[{}].", i);
    if (!e.is_object()) return Bad(kA, fmt::format("containers[{}]: expected an object", i));
    ContainerAssignment c;
    std::optional<std::string> name, resource;
    std::optional<int> count, priority;
    std::optional<uint64_t> memory;
    if (auto s = Member(e, "container", kA, where, name); !s.ok()) return s;
    if (auto s = Member(e, "resource", kA, where, resource); !s.ok()) return s;
    if (auto s = Member(e, "count", kA, where, count); !s.ok()) return s;
    if (auto s = Member(e, "memory", kA, where, memory); !s.ok()) return s;
    if (auto s = Member(e, "priority", kA, where, priority); !s.ok()) return s;
    c.container = name.value_or("");
    c.resource = resource.value_or("");
    if (c.resource != "tessera.io/gpu" && c.resource != "tessera.io/gpu-share") {
      return Bad(kA, where + "resource: expected tessera.io/gpu or tessera.io/gpu-share, got \"" +
                         c.resource + "\"");
    }
    if (!e.contains("gpus") || !e["gpus"].is_array() || e["gpus"].empty() ||
        e["gpus"].size() > kMaxGpus) {
      return Bad(kA, where + fmt::format("gpus: expected a list of 1..{} UUIDs", kMaxGpus));
    }
    for (size_t g = 0; g < e["gpus"].size(); ++g) {
      const json& u = e["gpus"][g];
      std::string w = where + fmt::format("gpus[{}]", g);
      if (!u.is_string()) return Bad(kA, w + ": expected a string");
      if (auto s = ValidUuid(kA, w, u.get<std::string>()); !s.ok()) return s;
      c.gpus.push_back(u.get<std::string>());
    }
    c.count = count.value_or(static_cast<int>(c.gpus.size()));
    if (c.count < 1 || c.count > 10000) return Bad(kA, where + "count: expected 1..10000");
    if (c.resource == "tessera.io/gpu" && c.count != static_cast<int>(c.gpus.size())) {
      return Bad(kA, where +
                         "count: whole GPUs are one device each, so count must equal the "
                         "number of gpus");
    }
    if (memory && (*memory == 0 || *memory > (uint64_t{1} << 50))) {
      return Bad(kA, where + "memory: expected 1 byte .. 1 PiB");
    }
    if (priority && (*priority < -1000 || *priority > 1000)) {
      return Bad(kA, where + "priority: expected -1000..1000");
    }
    c.memory = memory;
    c.priority = priority;
    a.containers.push_back(std::move(c));
  }
  if (j->contains("gang")) {
    const json& g = (*j)["gang"];
    std::optional<std::string> id;
    if (!g.is_object()) return Bad(kA, "gang: expected an object");
    if (auto s = Member(g, "id", kA, "gang.", id); !s.ok()) return s;
    if (!id || id->empty() || id->size() > 507 || id->find('/') == std::string::npos) {
      return Bad(kA, "gang.id: expected namespace/name");
    }
    if (!g.contains("gpus") || !g["gpus"].is_array() || g["gpus"].empty() ||
        g["gpus"].size() > kMaxGpus) {
      return Bad(kA, fmt::format("gang.gpus: expected a list of 1..{} UUIDs", kMaxGpus));
    }
    for (size_t i = 0; i < g["gpus"].size(); ++i) {
      const json& u = g["gpus"][i];
      std::string w = fmt::format("gang.gpus[{}]", i);
      if (!u.is_string()) return Bad(kA, w + ": expected a string");
      if (auto s = ValidUuid(kA, w, u.get<std::string>()); !s.ok()) return s;
      a.gang_gpus.push_back(u.get<std::string>());
    }
    a.gang = *id;
  }
  return a;
}

std::string FormatAllocated(const std::set<int>& done) { return absl::StrJoin(done, ","); }

absl::StatusOr<std::set<int>> ParseAllocated(std::string_view text) {
  std::set<int> out;
  if (text.empty()) return out;
  if (text.size() > 1024) return Bad(kAllocatedAnnotation, "longer than 1 KiB");
  for (size_t start = 0; start <= text.size();) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view part = text.substr(start, comma - start);
    start = comma + 1;
    int i = -1;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), i);
    if (ec != std::errc() || end != part.data() + part.size() || part.empty() || i < 0 ||
        i >= kMaxContainers) {
      return Bad(kAllocatedAnnotation,
                 fmt::format("expected container indices 0..{} separated by commas, got \"{}\"",
                             kMaxContainers - 1, std::string(part)));
    }
    out.insert(i);
  }
  return out;
}

std::string FormatGpuUse(const GpuUse& u) {
  json j = {{"seconds", u.seconds}};
  auto put = [&](const char* key, const std::optional<int64_t>& v) {
    if (v) j[key] = *v;
  };
  put("busyPermille", u.busy_permille);
  put("peakMiB", u.peak_mib);
  put("limitMiB", u.limit_mib);
  put("refused", u.refused);
  put("wantedMiB", u.wanted_mib);
  put("kernelLaunches", u.kernel_launches);
  put("heldBackPermille", u.held_back_permille);
  return j.dump();
}

std::optional<int64_t> GpuUse::WantedPermille() const {
  if (!busy_permille || held_back_permille.value_or(0) <= 0 || *busy_permille <= 0)
    return busy_permille;
  return std::llround(10 * core::DemandPct(static_cast<double>(*busy_permille),
                                           static_cast<double>(*held_back_permille), 1000));
}

absl::StatusOr<GpuUse> ParseGpuUse(std::string_view text) {
  if (text.size() > 4096) return Bad(kGpuUseAnnotation, "longer than 4 KiB");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Bad(kGpuUseAnnotation, "expected a JSON object");
  GpuUse u;
  std::optional<int64_t> seconds;
  struct Part {
    const char* key;
    std::optional<int64_t>* out;
    int64_t max;
  };
  constexpr int64_t kMaxMib = int64_t{1} << 30;  // a PiB: more than any GPU holds
  for (const Part& p :
       {Part{"seconds", &seconds, int64_t{1} << 40}, Part{"busyPermille", &u.busy_permille, 1000},
        Part{"peakMiB", &u.peak_mib, kMaxMib}, Part{"limitMiB", &u.limit_mib, kMaxMib},
        Part{"refused", &u.refused, int64_t{1} << 50}, Part{"wantedMiB", &u.wanted_mib, kMaxMib},
        Part{"kernelLaunches", &u.kernel_launches, int64_t{1} << 60},
        Part{"heldBackPermille", &u.held_back_permille, 1000}}) {
    if (absl::Status s = Member(j, p.key, kGpuUseAnnotation, "", *p.out); !s.ok()) return s;
    if (*p.out && (**p.out < 0 || **p.out > p.max)) {
      return Bad(kGpuUseAnnotation,
                 fmt::format("{}: expected 0..{}, got {}", p.key, p.max, **p.out));
    }
  }
  if (!seconds) return Bad(kGpuUseAnnotation, "seconds: missing");
  u.seconds = *seconds;
  return u;
}

std::string FormatNodeGpus(const NodeGpus& n) {
  const core::NodeInventory& inv = n.inventory;
  json gpus = json::array();
  for (size_t i = 0; i < inv.gpus.size(); ++i) {
    const core::Gpu& g = inv.gpus[i];
    json e = {{"uuid", g.uuid}, {"model", g.model}};
    if (g.memory_bytes) e["memory"] = *g.memory_bytes;
    if (g.compute_capability) e["cc"] = core::FormatComputeCapability(*g.compute_capability);
    if (g.numa_node) e["numa"] = *g.numa_node;
    if (g.mig_enabled) e["mig"] = *g.mig_enabled;
    e["healthy"] = i < n.healthy.size() ? static_cast<bool>(n.healthy[i]) : true;
    // Only MPS is written: an older extender reads the rest as it always has.
    if (i < n.sharing.size() && n.sharing[i] == core::GpuSharing::kMps) {
      e["sharing"] = core::GpuSharingName(core::GpuSharing::kMps);
    }
    gpus.push_back(std::move(e));
  }
  json links = json::array();
  for (int a = 0; a < inv.topology.size(); ++a) {
    for (int b = a + 1; b < inv.topology.size(); ++b) {
      const core::GpuLink& l = inv.topology.link(a, b);
      json e = {{"a", a}, {"b", b}, {"pcie", core::PcieLevelCode(l.pcie)}};
      if (l.nvlinks > 0) e["nvlinks"] = l.nvlinks;
      if (l.via_nvswitch) e["nvswitch"] = true;
      links.push_back(std::move(e));
    }
  }
  json out = {{"v", 1}, {"shares", n.shares_per_gpu}, {"gpus", gpus}, {"links", links}};
  if (inv.simulated) out["simulated"] = true;
  if (!inv.driver_version.empty()) out["driver"] = inv.driver_version;
  if (!inv.cuda_driver_version.empty()) out["cuda"] = inv.cuda_driver_version;
  return out.dump();
}

absl::StatusOr<NodeGpus> ParseNodeGpus(std::string_view text) {
  constexpr std::string_view kN = kNodeGpusAnnotation;
  auto j = ParseObject(kN, text);
  if (!j.ok()) return j.status();
  std::optional<int> v, shares;
  std::optional<bool> simulated;
  std::optional<std::string> driver, cuda;
  for (auto s : {Member(*j, "v", kN, "", v), Member(*j, "shares", kN, "", shares),
                 Member(*j, "simulated", kN, "", simulated), Member(*j, "driver", kN, "", driver),
                 Member(*j, "cuda", kN, "", cuda)}) {
    if (!s.ok()) return s;
  }
  if (v.value_or(0) != 1) return Bad(kN, "v: expected 1 (a newer agent?)");
  NodeGpus n;
  n.shares_per_gpu = shares.value_or(0);
  if (n.shares_per_gpu < 0 || n.shares_per_gpu > 100) return Bad(kN, "shares: expected 0..100");
  n.inventory.simulated = simulated.value_or(false);
  n.inventory.driver_version = driver.value_or("");
  n.inventory.cuda_driver_version = cuda.value_or("");
  if (!j->contains("gpus") || !(*j)["gpus"].is_array() || (*j)["gpus"].size() > kMaxGpus) {
    return Bad(kN, fmt::format("gpus: expected a list of at most {}", kMaxGpus));
  }
  const json& gpus = (*j)["gpus"];
  std::set<std::string> seen;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const json& e = gpus[i];
    std::string where = fmt::format("gpus[{}].", i);
    if (!e.is_object()) return Bad(kN, fmt::format("gpus[{}]: expected an object", i));
    core::Gpu g;
    g.index = static_cast<int>(i);
    std::optional<std::string> uuid, model, cc, sharing;
    std::optional<uint64_t> memory;
    std::optional<int> numa;
    std::optional<bool> mig, healthy;
    for (auto s :
         {Member(e, "uuid", kN, where, uuid), Member(e, "model", kN, where, model),
          Member(e, "cc", kN, where, cc), Member(e, "memory", kN, where, memory),
          Member(e, "numa", kN, where, numa), Member(e, "mig", kN, where, mig),
          Member(e, "healthy", kN, where, healthy), Member(e, "sharing", kN, where, sharing)}) {
      if (!s.ok()) return s;
    }
    g.uuid = uuid.value_or("");
    if (auto s = ValidUuid(kN, where + "uuid", g.uuid); !s.ok()) return s;
    if (!seen.insert(g.uuid).second) return Bad(kN, where + "uuid: " + g.uuid + " twice");
    g.model = model.value_or("");
    g.memory_bytes = memory;
    if (cc) {
      g.compute_capability = core::ParseComputeCapability(*cc);
      if (!g.compute_capability) return Bad(kN, where + "cc: expected major.minor, got " + *cc);
    }
    if (numa && (*numa < 0 || *numa > 1023)) return Bad(kN, where + "numa: expected 0..1023");
    g.numa_node = numa;
    g.mig_enabled = mig;
    std::optional<core::GpuSharing> mode =
        sharing ? core::ParseGpuSharing(*sharing) : core::GpuSharing::kTimeSlice;
    if (!mode) return Bad(kN, where + "sharing: expected time-slice or mps, got " + *sharing);
    n.inventory.gpus.push_back(std::move(g));
    n.healthy.push_back(healthy.value_or(true));
    n.sharing.push_back(*mode);
  }
  const int count = static_cast<int>(n.inventory.gpus.size());
  n.inventory.topology = core::Topology(count);
  if (j->contains("links")) {
    const json& links = (*j)["links"];
    if (!links.is_array()) return Bad(kN, "links: expected a list");
    for (size_t i = 0; i < links.size(); ++i) {
      const json& e = links[i];
      std::string where = fmt::format("links[{}].", i);
      if (!e.is_object()) return Bad(kN, fmt::format("links[{}]: expected an object", i));
      std::optional<int> a, b, nvlinks;
      std::optional<std::string> pcie;
      std::optional<bool> nvswitch;
      for (auto s : {Member(e, "a", kN, where, a), Member(e, "b", kN, where, b),
                     Member(e, "nvlinks", kN, where, nvlinks), Member(e, "pcie", kN, where, pcie),
                     Member(e, "nvswitch", kN, where, nvswitch)}) {
        if (!s.ok()) return s;
      }
      if (!a || !b || *a < 0 || *b < 0 || *a >= count || *b >= count || *a == *b) {
        return Bad(kN, where + fmt::format("a, b: expected two different GPU indices < {}", count));
      }
      core::GpuLink l;
      l.nvlinks = nvlinks.value_or(0);
      if (l.nvlinks < 0 || l.nvlinks > 64) return Bad(kN, where + "nvlinks: expected 0..64");
      l.via_nvswitch = nvswitch.value_or(false);
      auto level = core::ParsePcieLevelCode(pcie.value_or("?"));
      if (!level || *level == core::PcieLevel::kSelf) {
        return Bad(kN, where + "pcie: expected a PCIe level code (PIX, PXB, PHB, NODE, SYS)");
      }
      l.pcie = *level;
      n.inventory.topology.SetLink(*a, *b, l);
    }
  }
  return n;
}

}  // namespace tessera::kube
