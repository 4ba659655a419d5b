#include "tessera/agent/dra_slices.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>

#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/kube/quantity.h"

namespace tessera::agent {

using nlohmann::json;

namespace {

// The architecture NVIDIA names for a compute capability's major (and minor) version.
std::string Architecture(const core::ComputeCapability& cc) {
  switch (cc.major) {
    case 6:
      return "Pascal";
    case 7:
      return cc.minor >= 5 ? "Turing" : "Volta";
    case 8:
      return cc.minor == 9 ? "Ada Lovelace" : "Ampere";
    case 9:
      return "Hopper";
    case 10:
    case 12:
      return "Blackwell";
    default:
      return "";
  }
}

// NVML's "00000000:18:00.0" as sysfs names it, "0000:18:00.0".
std::string SysfsBusId(const std::string& bus_id) {
  std::string id = bus_id;
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4) id = id.substr(colon - 4);
  return id;
}

// "pci0000:17": the root complex above the GPU, from the device's place in sysfs; "" when unknown.
std::string PcieRoot(const std::string& sysfs_root, const std::string& bus_id) {
  if (sysfs_root.empty() || bus_id.empty()) return "";
  std::error_code ec;
  std::filesystem::path real = std::filesystem::canonical(
      std::filesystem::path(sysfs_root) / "bus/pci/devices" / SysfsBusId(bus_id), ec);
  if (ec) return "";
  for (const auto& part : real) {
    std::string p = part.string();
    if (p.starts_with("pci") && p.find(':') != std::string::npos) return p;
  }
  return "";
}

// GPU index -> its NVLink domain (the lowest index of the GPUs it reaches over NVLink), for GPUs
// with any NVLink.
std::map<int, int> NvlinkDomains(const core::NodeInventory& inv) {
  const int n = static_cast<int>(inv.gpus.size());
  std::map<int, int> domain;
  if (inv.topology.size() != n) return domain;
  for (int g = 0; g < n; ++g) {
    if (domain.contains(g)) continue;
    std::vector<int> stack = {g};
    std::vector<int> members;
    std::vector<bool> seen(n);
    seen[g] = true;
    while (!stack.empty()) {
      int a = stack.back();
      stack.pop_back();
      members.push_back(a);
      for (int b = 0; b < n; ++b) {
        if (!seen[b] && a != b && inv.topology.link(a, b).has_nvlink()) {
          seen[b] = true;
          stack.push_back(b);
        }
      }
    }
    if (members.size() < 2) continue;
    int lowest = *std::min_element(members.begin(), members.end());
    for (int m : members) domain[m] = lowest;
  }
  return domain;
}

json Attr(const std::string& kind, json value) { return json{{kind, std::move(value)}}; }

// A device with its capacities as values: what two publications are compared by.
void ValuesOf(json& quantities) {
  if (!quantities.is_object()) return;
  for (auto& [name, c] : quantities.items()) {
    if (c.is_object() && c.contains("value") && c["value"].is_string()) {
      auto v = kube::ParseQuantity(c["value"].get<std::string>());
      if (v) c["value"] = *v;
    }
  }
}

// A device (or a counter set) with its quantities as values: what two publications are compared
// by.
json Normalised(json device) {
  if (device.contains("capacity")) ValuesOf(device["capacity"]);
  if (device.contains("counters")) ValuesOf(device["counters"]);
  if (device.contains("consumesCounters") && device["consumesCounters"].is_array()) {
    for (json& c : device["consumesCounters"]) {
      if (c.is_object() && c.contains("counters")) ValuesOf(c["counters"]);
    }
  }
  return device;
}

}  // namespace

std::string SemanticVersion(const std::string& version) {
  std::vector<std::string> parts = absl::StrSplit(version, '.');
  if (parts.empty() || parts.size() > 3) return "";
  std::vector<std::string> out;
  for (const std::string& p : parts) {
    if (p.empty() || p.size() > 9 || !std::all_of(p.begin(), p.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        })) {
      return "";
    }
    out.push_back(std::to_string(std::stoul(p)));  // semver forbids leading zeros
  }
  while (out.size() < 3) out.push_back("0");
  return fmt::format("{}.{}.{}", out[0], out[1], out[2]);
}

namespace {

// What every device of a pass shares: the node's facts read once.
struct NodeFacts {
  const core::NodeInventory& inv;
  const DraOptions& o;
  int shares;
  std::map<int, int> nvlink;
  std::string driver_version, cuda_version;
  std::map<int, std::string> roots;  // PCIe roots by GPU, read from sysfs once
  const PluginOptions& plugin;
};

json DeviceAttributes(const DraDevice& d, NodeFacts& n, const SliceContext& ctx) {
  const core::Gpu& g = n.inv.gpus[d.gpu];
  json attrs;
  attrs["type"] = Attr("string", d.share ? "share" : "gpu");
  attrs["uuid"] = Attr("string", g.uuid);
  attrs["index"] = Attr("int", g.index);
  if (!g.model.empty()) attrs["productName"] = Attr("string", g.model);
  if (g.compute_capability) {
    attrs["cudaComputeCapability"] =
        Attr("version",
             fmt::format("{}.{}.0", g.compute_capability->major, g.compute_capability->minor));
    if (std::string arch = Architecture(*g.compute_capability); !arch.empty()) {
      attrs["architecture"] = Attr("string", arch);
    }
  }
  if (!n.driver_version.empty()) attrs["driverVersion"] = Attr("version", n.driver_version);
  if (!n.cuda_version.empty()) attrs["cudaDriverVersion"] = Attr("version", n.cuda_version);
  if (g.numa_node && *g.numa_node >= 0) attrs["numaNode"] = Attr("int", *g.numa_node);
  if (!g.pci_bus_id.empty()) attrs["pciBusID"] = Attr("string", g.pci_bus_id);
  if (!n.roots.contains(d.gpu)) n.roots[d.gpu] = PcieRoot(ctx.sysfs_root, g.pci_bus_id);
  if (!n.roots[d.gpu].empty())
    attrs["resource.kubernetes.io/pcieRoot"] = Attr("string", n.roots[d.gpu]);
  if (auto it = n.nvlink.find(d.gpu); it != n.nvlink.end()) {
    attrs["nvlinkDomain"] = Attr("int", it->second);
  }
  if (d.share) attrs["sharesPerGpu"] = Attr("int", n.shares);
  // A GPU's mode (MPS or time slices), which a DeviceClass or request selects on and a
  // ShareConfig's `sharing` is checked against.
  attrs["sharing"] = Attr("string", std::string(core::GpuSharingName(SharingOf(n.plugin, d.gpu))));
  return attrs;
}

// A device with its capacity, and as the sharing mode has it: consumable amounts, or what it
// takes of its GPU's counter set.
json Device(const DraDevice& d, NodeFacts& n, const SliceContext& ctx) {
  const core::Gpu& g = n.inv.gpus[d.gpu];
  json dev = {{"name", d.name}, {"attributes", DeviceAttributes(d, n, ctx)}};
  if (g.memory_bytes) {
    uint64_t memory = d.share ? *g.memory_bytes / n.shares : *g.memory_bytes;
    dev["capacity"]["memory"] = {{"value", kube::FormatBinaryQuantity(memory)}};
  }
  if (n.o.consumable) {
    // Claims take amounts of it; one that names none takes it all (the defaults).
    dev["allowMultipleAllocations"] = true;
    dev["attributes"]["consumable"] = Attr("bool", true);
    if (g.memory_bytes) {
      const std::string all = kube::FormatBinaryQuantity(*g.memory_bytes);
      dev["capacity"]["memory"]["requestPolicy"] = {
          {"default", all}, {"validRange", {{"min", "256Mi"}, {"step", "256Mi"}}}};
    }
    dev["capacity"]["compute"] = {
        {"value", "100"},
        {"requestPolicy",
         {{"default", "100"}, {"validRange", {{"min", "1"}, {"max", "100"}, {"step", "1"}}}}}};
  }
  if (n.o.partitionable) {
    // What the device takes of its GPU's counter set: all of it whole, 1/shares as a share.
    json counters = {{"shares", {{"value", std::to_string(d.share ? 1 : n.shares)}}}};
    if (g.memory_bytes) {
      counters["memory"] = {{"value", kube::FormatBinaryQuantity(
                                          d.share ? *g.memory_bytes / n.shares : *g.memory_bytes)}};
    }
    dev["consumesCounters"] =
        json::array({{{"counterSet", fmt::format("gpu-{}", d.gpu)}, {"counters", counters}}});
  }
  return dev;
}

// Counter sets (partitionable devices): one per healthy GPU.
std::vector<json> CounterSets(const DraState& state, const NodeFacts& n) {
  std::vector<json> sets;
  if (!n.o.partitionable) return sets;
  for (const core::Gpu& g : n.inv.gpus) {
    if (!state.healthy(g.index)) continue;
    json counters = {{"shares", {{"value", std::to_string(n.shares)}}}};
    if (g.memory_bytes) {
      counters["memory"] = {{"value", kube::FormatBinaryQuantity(*g.memory_bytes)}};
    }
    sets.push_back({{"name", fmt::format("gpu-{}", g.index)}, {"counters", counters}});
  }
  return sets;
}

// Elements [from, to) of `items` (clamped) as a JSON array.
json Chunk(const std::vector<json>& items, size_t from, size_t to) {
  json out = json::array();
  for (size_t k = from; k < std::min(items.size(), to); ++k) out.push_back(items[k]);
  return out;
}

}  // namespace

std::vector<json> BuildResourceSlices(const DraState& state, const SliceContext& ctx) {
  const core::NodeInventory& inv = state.inventory();
  const DraOptions& o = state.options();
  NodeFacts facts{
      inv,
      o,
      state.plugin_options().shares_per_gpu,
      NvlinkDomains(inv),
      SemanticVersion(ctx.driver_version.empty() ? inv.driver_version : ctx.driver_version),
      SemanticVersion(inv.cuda_driver_version),
      {},
      state.plugin_options()};
  std::vector<json> devices;
  for (const DraDevice& d : state.devices()) {
    if (state.healthy(d.gpu)) devices.push_back(Device(d, facts, ctx));
  }
  const std::vector<json> counter_sets = CounterSets(state, facts);
  // Devices in slices of their own, then the counter sets: only one of the two in a slice.
  const size_t per_slice = o.partitionable ? kMaxDevicesPerSliceWithCounters : kMaxDevicesPerSlice;
  const size_t device_slices = std::max<size_t>(1, (devices.size() + per_slice - 1) / per_slice);
  const size_t counter_slices =
      (counter_sets.size() + kMaxCounterSetsPerSlice - 1) / kMaxCounterSetsPerSlice;
  const size_t count = device_slices + counter_slices;
  std::vector<json> slices;
  for (size_t i = 0; i < count; ++i) {
    json s;
    s["apiVersion"] = "resource.k8s.io/v1";
    s["kind"] = "ResourceSlice";
    s["metadata"]["name"] = fmt::format("{}-{}-{}", o.pool, o.driver, i);
    if (!ctx.node_uid.empty()) {
      s["metadata"]["ownerReferences"] = json::array({{{"apiVersion", "v1"},
                                                       {"kind", "Node"},
                                                       {"name", o.pool},
                                                       {"uid", ctx.node_uid},
                                                       {"controller", true}}});
    }
    s["spec"]["driver"] = o.driver;
    s["spec"]["nodeName"] = o.pool;
    s["spec"]["pool"] = {{"name", o.pool},
                         {"generation", ctx.generation},
                         {"resourceSliceCount", static_cast<int64_t>(count)}};
    if (i < device_slices) {
      s["spec"]["devices"] = Chunk(devices, i * per_slice, (i + 1) * per_slice);
    } else {
      const size_t j = i - device_slices;
      s["spec"]["sharedCounters"] =
          Chunk(counter_sets, j * kMaxCounterSetsPerSlice, (j + 1) * kMaxCounterSetsPerSlice);
    }
    slices.push_back(std::move(s));
  }
  return slices;
}

bool SameDevices(const json& a, const json& b) {
  auto devs = [](const json& s) {
    json out = json::array();
    for (const char* list : {"devices", "sharedCounters"}) {
      if (s.contains("spec") && s["spec"].contains(list) && s["spec"][list].is_array()) {
        for (const json& d : s["spec"][list]) out.push_back(Normalised(d));
      }
      out.push_back(nullptr);  // keeps the two lists apart
    }
    return out;
  };
  auto count = [](const json& s) {
    return s.contains("spec") ? s["spec"]["pool"].value("resourceSliceCount", int64_t{0}) : 0;
  };
  auto owner = [](const json& s) {
    return s.contains("metadata") ? s["metadata"].value("ownerReferences", json::array())
                                  : json::array();
  };
  return devs(a) == devs(b) && count(a) == count(b) && owner(a) == owner(b);
}

SlicePublisher::SlicePublisher(kube::Client& client, const DraState& state,
                               SlicePublisherOptions options)
    : client_(client), state_(state), options_(std::move(options)) {}

SlicePublisher::~SlicePublisher() { Stop(); }

void SlicePublisher::Start() {
  // This node's slices watched: one deleted or changed by someone else (the kubelet wipes a
  // node's slices when it starts) is put back at once, not at the next resync.
  watch_ = std::make_unique<kube::Informer>(
      client_,
      kube::InformerOptions{
          .path = kResourceSlices,
          .field_selector = fmt::format("spec.nodeName={},spec.driver={}", options_.node_name,
                                        state_.options().driver)},
      [this](kube::EventType t, const json&) {
        if (t == kube::EventType::kDeleted || t == kube::EventType::kModified) Poke();
      });
  thread_ = std::thread([this] {
    for (;;) {
      absl::Status st = Sync();
      if (!st.ok()) {
        ++counters_.errors;
        spdlog::warn("ResourceSlices: {}", std::string(st.message()));
      }
      // Again after resync, at once when poked; after an error, within a few seconds.
      const auto wait =
          st.ok() ? options_.resync
                  : std::min<std::chrono::milliseconds>(options_.resync, std::chrono::seconds(5));
      core::MutexLock lock(mu_);
      lock.WaitFor(cv_, wait, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || poked_; });
      if (stop_) return;
      poked_ = false;
    }
  });
}

void SlicePublisher::Poke() {
  core::MutexLock lock(mu_);
  poked_ = true;
  cv_.notify_all();
}

void SlicePublisher::Stop() {
  {
    core::MutexLock lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (watch_) watch_->Stop();
  if (thread_.joinable()) thread_.join();
}

absl::Status SlicePublisher::Sync() {
  const DraOptions& o = state_.options();
  if (node_uid_.empty()) {
    auto node = client_.Get("/api/v1/nodes/" + options_.node_name);
    if (node.ok()) {
      node_uid_ = (*node)["metadata"].value("uid", "");
    } else {
      spdlog::warn("node {}: {}; ResourceSlices published without an owner for now",
                   options_.node_name, std::string(node.status().message()));
    }
  }
  kube::ListOptions lo;
  lo.field_selector = fmt::format("spec.nodeName={},spec.driver={}", options_.node_name, o.driver);
  auto existing = client_.List(kResourceSlices, lo);
  if (!existing.ok()) return existing.status();
  std::map<std::string, json> have;
  int64_t generation = 0;
  for (const json& s : existing->items) {
    have[s["metadata"].value("name", "")] = s;
    generation = std::max(generation, s["spec"]["pool"].value("generation", int64_t{0}));
  }
  SliceContext ctx{
      .node_uid = node_uid_, .generation = generation, .sysfs_root = options_.sysfs_root};
  if (options_.driver_version) ctx.driver_version = options_.driver_version();
  std::vector<json> want = BuildResourceSlices(state_, ctx);
  bool same = want.size() == have.size();
  for (const json& w : want) {
    auto it = have.find(w["metadata"]["name"].get<std::string>());
    same = same && it != have.end() && SameDevices(w, it->second) &&
           it->second["spec"]["pool"].value("generation", int64_t{-1}) == generation;
  }
  if (same) return absl::OkStatus();
  // A new generation: kube-scheduler uses only the slices of a pool's newest generation, and
  // only once it has all resourceSliceCount of them.
  for (json& w : want) w["spec"]["pool"]["generation"] = generation + 1;
  for (json& w : want) {
    const std::string name = w["metadata"]["name"].get<std::string>();
    auto it = have.find(name);
    absl::StatusOr<json> done = json();
    if (it == have.end()) {
      done = client_.Create(kResourceSlices, w);
    } else {
      // Replaced at the version read: a concurrent writer makes this a 409, and the next pass
      // reads again.
      w["metadata"]["resourceVersion"] = it->second["metadata"].value("resourceVersion", "");
      done = client_.Replace(std::string(kResourceSlices) + "/" + name, w);
      have.erase(it);
    }
    if (!done.ok()) return done.status();
    ++counters_.publishes;
  }
  for (const auto& [name, s] : have) {
    if (absl::Status st = client_.Delete(std::string(kResourceSlices) + "/" + name); !st.ok()) {
      return st;
    }
  }
  spdlog::info("ResourceSlices of node {}: {} slice(s), pool generation {}", options_.node_name,
               want.size(), generation + 1);
  return absl::OkStatus();
}

}  // namespace tessera::agent
