#include "tessera/sched/cluster_state.h"

#include <algorithm>
#include <cassert>
#include <numeric>

#include "fmt/format.h"

namespace tessera::sched {
namespace {

// A GPU's state in a class key: kind (16 bits), healthy (1), compute left (11), predicted
// utilization (8, capped at 255) and memory left (24 bits of MiB: up to 16 TiB).
uint64_t GpuWord(uint16_t kind, const GpuUse& use, const core::NodeGpu& gpu) {
  uint64_t milli_left = static_cast<uint64_t>(core::kMilliPerGpu - use.milli) & 0x7ff;
  uint64_t util = static_cast<uint64_t>(std::clamp(use.util_pct, 0, 255));
  uint64_t mem_left =
      static_cast<uint64_t>(std::clamp<int64_t>(gpu.memory_mib - use.memory_mib, 0, 0xffffffll));
  return (uint64_t{kind} << 48) | (uint64_t{use.healthy} << 47) | (milli_left << 32) |
         (util << 24) | mem_left;
}

ClassGpu DecodeGpu(uint64_t w) {
  return ClassGpu{static_cast<uint16_t>(w >> 48), ((w >> 47) & 1) != 0,
                  static_cast<int32_t>((w >> 32) & 0x7ff), static_cast<int64_t>(w & 0xffffffull),
                  static_cast<int32_t>((w >> 24) & 0xff)};
}

}  // namespace

uint64_t MpsUserKey(const std::string& owner) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: stable across runs, so keys are reproducible
  for (unsigned char c : owner) h = (h ^ c) * 0x100000001b3ull;
  return h | 1;
}

int AffinityTag(const core::Request& r) {
  if (r.fractional()) return 1;
  if (r.gpus <= 0) return 0;
  return 1 + std::min(r.gpus, kAffinityTags - 2);
}

size_t ClusterState::KeyHash::operator()(const std::vector<uint64_t>& k) const {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (uint64_t w : k) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return static_cast<size_t>(h ^ (h >> 29));
}

ShapeId ClusterState::InternShape(const core::NodeSpec& spec) {
  NodeShape s;
  s.cpu_milli = spec.cpu_milli;
  s.memory_mib = spec.memory_mib;
  s.topology = spec.topology;
  for (const core::NodeGpu& g : spec.gpus) {
    core::NodeGpu k = g;
    k.uuid.clear();
    s.gpus.push_back(k);
    auto it = std::find(s.kinds.begin(), s.kinds.end(), k);
    if (it == s.kinds.end()) {
      s.kinds.push_back(k);
      it = s.kinds.end() - 1;
    }
    s.gpu_kind.push_back(static_cast<uint16_t>(it - s.kinds.begin()));
    s.has_mps = s.has_mps || g.sharing == core::GpuSharing::kMps;
  }
  const int n = static_cast<int>(spec.gpus.size());
  s.positional = s.has_mps;
  for (int a = 0; a < n && !s.positional; ++a) {
    if (spec.gpus[a].numa_node != spec.gpus[0].numa_node) s.positional = true;
    for (int b = 0; b < s.topology.size() && !s.positional; ++b) {
      if (a != b && !(s.topology.link(a, b) == s.topology.link(0, 1))) s.positional = true;
    }
  }
  for (size_t i = 0; i < shapes_.size(); ++i) {
    const NodeShape& o = shapes_[i];
    if (o.cpu_milli == s.cpu_milli && o.memory_mib == s.memory_mib && o.gpus == s.gpus &&
        o.topology == s.topology) {
      return static_cast<ShapeId>(i);
    }
  }
  shapes_.push_back(std::move(s));
  return static_cast<ShapeId>(shapes_.size() - 1);
}

absl::StatusOr<NodeId> ClusterState::AddNode(core::NodeSpec spec) {
  if (spec.name.empty()) return absl::InvalidArgumentError("node: name must not be empty");
  if (by_name_.contains(spec.name)) {
    return absl::InvalidArgumentError(fmt::format("node {}: added twice", spec.name));
  }
  if (spec.cpu_milli < 0 || spec.memory_mib < 0) {
    return absl::InvalidArgumentError(fmt::format("node {}: negative capacity", spec.name));
  }
  if (spec.gpus.size() > 64) {
    return absl::InvalidArgumentError(fmt::format("node {}: more than 64 GPUs", spec.name));
  }
  if (spec.topology.size() != 0 && spec.topology.size() != static_cast<int>(spec.gpus.size())) {
    return absl::InvalidArgumentError(fmt::format("node {}: topology of {} GPUs for {} GPUs",
                                                  spec.name, spec.topology.size(),
                                                  spec.gpus.size()));
  }
  for (const core::NodeGpu& g : spec.gpus) {
    if (g.memory_mib < 0 || g.memory_mib > 0xffffff) {
      return absl::InvalidArgumentError(fmt::format(
          "node {}: GPU memory {} MiB is out of range (0 to 16 TiB)", spec.name, g.memory_mib));
    }
  }
  NodeId id = static_cast<NodeId>(nodes_.size());
  Node node;
  node.name = spec.name;
  node.shape = InternShape(spec);
  node.gpu_offset = static_cast<int32_t>(gpu_uses_.size());
  gpu_uses_.resize(gpu_uses_.size() + spec.gpus.size());
  node.spec = std::move(spec);
  by_name_[node.name] = id;
  nodes_.push_back(std::move(node));
  node_allocs_.emplace_back();
  Reclassify(id);
  return id;
}

absl::StatusOr<std::vector<Allocation>> ClusterState::RemoveNode(NodeId n) {
  if (n < 0 || n >= node_count() || !node_live(n)) {
    return absl::NotFoundError(fmt::format("no node {} in the model", n));
  }
  std::vector<Allocation> out;
  const std::vector<std::string> ids = node_allocs_[n];
  for (const std::string& id : ids) {
    if (auto a = Remove(id); a.ok()) out.push_back(*std::move(a));
  }
  Unclassify(n);
  Node& node = nodes_[n];
  by_name_.erase(node.name);
  // Its slot stays (ids are never reused: a caller's stale id finds a gone node, not another one),
  // holding no GPUs and no capacity.
  core::NodeSpec gone;
  gone.name = node.spec.name;
  node.spec = std::move(gone);
  node.cpu_used = node.memory_used = 0;
  ++removed_;
  return out;
}

NodeId ClusterState::FindNode(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

std::vector<uint64_t> ClusterState::KeyOf(NodeId n) const {
  const Node& node = nodes_[n];
  const NodeShape& shape = shapes_[node.shape];
  uint16_t tags = 0;
  for (int t = 0; t < kAffinityTags; ++t) tags |= node.tag_counts[t] ? (1u << t) : 0;
  std::vector<uint64_t> key;
  key.reserve(3 + shape.gpus.size() * (shape.has_mps ? 2 : 1));
  key.push_back((uint64_t(node.shape) << 16) | tags);
  key.push_back(static_cast<uint64_t>(node.spec.cpu_milli - node.cpu_used));
  key.push_back(static_cast<uint64_t>(node.spec.memory_mib - node.memory_used));
  for (size_t g = 0; g < shape.gpus.size(); ++g) {
    key.push_back(GpuWord(shape.gpu_kind[g], gpu_uses_[node.gpu_offset + g], shape.gpus[g]));
  }
  if (!shape.positional) std::sort(key.begin() + 3, key.end());
  // Whose MPS clients hold each GPU, in index order (a shape with MPS GPUs is positional).
  if (shape.has_mps) {
    for (size_t g = 0; g < shape.gpus.size(); ++g)
      key.push_back(gpu_uses_[node.gpu_offset + g].mps_user);
  }
  return key;
}

std::vector<int> ClusterState::GpuOrder(NodeId n) const {
  const Node& node = nodes_[n];
  const NodeShape& shape = shapes_[node.shape];
  std::vector<int> order(shape.gpus.size());
  std::iota(order.begin(), order.end(), 0);
  if (!shape.positional) {
    auto word = [&](int g) {
      return GpuWord(shape.gpu_kind[g], gpu_uses_[node.gpu_offset + g], shape.gpus[g]);
    };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return word(a) < word(b); });
  }
  return order;
}

std::vector<int> ClusterState::GpusForPositions(NodeId n, const std::vector<int>& positions) const {
  std::vector<int> order = GpuOrder(n);
  std::vector<int> out;
  out.reserve(positions.size());
  for (int p : positions) out.push_back(order[p]);
  std::sort(out.begin(), out.end());
  return out;
}

void ClusterState::Unclassify(NodeId n) {
  Node& node = nodes_[n];
  {
    Class& old = classes_[node.cls];
    // Swap-remove from the old class.
    NodeId last = old.members.back();
    old.members[node.pos_in_class] = last;
    nodes_[last].pos_in_class = node.pos_in_class;
    old.members.pop_back();
    --sizes_[node.cls];
    LogChange(node.cls);
    if (old.members.empty()) {
      ClassId dead = node.cls;
      ClassId moved = live_.back();
      live_[old.live_pos] = moved;
      classes_[moved].live_pos = old.live_pos;
      live_.pop_back();
      old.live_pos = -1;
      class_index_.erase(old.key);
      free_classes_.push_back(dead);
    }
  }
  node.cls = -1;
  node.pos_in_class = -1;
}

void ClusterState::Reclassify(NodeId n) {
  Node& node = nodes_[n];
  std::vector<uint64_t> key = KeyOf(n);
  if (node.cls >= 0) {
    if (classes_[node.cls].key == key) return;
    Unclassify(n);
  }
  ClassId c;
  auto it = class_index_.find(key);
  if (it != class_index_.end()) {
    c = it->second;
  } else {
    if (!free_classes_.empty()) {
      c = free_classes_.back();
      free_classes_.pop_back();
      ++generations_[c];
    } else {
      c = static_cast<ClassId>(classes_.size());
      classes_.emplace_back();
      sizes_.push_back(0);
      generations_.push_back(0);
    }
    Class& cls = classes_[c];
    cls.key = key;
    cls.shape = node.shape;
    cls.tags = static_cast<uint16_t>(key[0] & 0xffff);
    cls.cpu_left = static_cast<int64_t>(key[1]);
    cls.memory_left = static_cast<int64_t>(key[2]);
    cls.gpus.clear();
    const size_t gpu_count = shapes_[node.shape].gpus.size();
    for (size_t i = 0; i < gpu_count; ++i) cls.gpus.push_back(DecodeGpu(key[3 + i]));
    if (shapes_[node.shape].has_mps) {
      for (size_t i = 0; i < gpu_count; ++i) cls.gpus[i].mps_user = key[3 + gpu_count + i];
    }
    cls.members.clear();
    class_index_.emplace(std::move(key), c);
  }
  Class& cls = classes_[c];
  if (cls.members.empty()) {
    cls.live_pos = static_cast<int32_t>(live_.size());
    live_.push_back(c);
  }
  node.cls = c;
  node.pos_in_class = static_cast<int32_t>(cls.members.size());
  cls.members.push_back(n);
  ++sizes_[c];
  LogChange(c);
}

void ClusterState::LogChange(ClassId c) {
  if (changes_.size() >= 4096 + 4 * classes_.size()) {
    change_base_ += changes_.size();
    changes_.clear();
  }
  changes_.push_back(c);
}

absl::Status ClusterState::Apply(Allocation a) {
  if (a.node < 0 || a.node >= node_count() || !node_live(a.node)) {
    return absl::InvalidArgumentError(fmt::format("allocation {}: no node {}", a.id, a.node));
  }
  if (allocations_.contains(a.id)) {
    return absl::InvalidArgumentError(fmt::format("allocation {}: id already in use", a.id));
  }
  Node& node = nodes_[a.node];
  const core::Request& r = a.request;
  if (node.cpu_used + r.cpu_milli > node.spec.cpu_milli ||
      node.memory_used + r.memory_mib > node.spec.memory_mib) {
    return absl::InvalidArgumentError(
        fmt::format("allocation {}: does not fit node {} (cpu or memory)", a.id, node.name));
  }
  std::vector<int> seen;
  for (int g : a.gpus) {
    if (g < 0 || g >= gpu_count(a.node) || std::find(seen.begin(), seen.end(), g) != seen.end()) {
      return absl::InvalidArgumentError(fmt::format("allocation {}: bad GPU {}", a.id, g));
    }
    seen.push_back(g);
    const GpuUse& u = gpu_uses_[node.gpu_offset + g];
    if (u.milli + a.milli_per_gpu > core::kMilliPerGpu ||
        u.memory_mib + a.memory_mib_per_gpu > node.spec.gpus[g].memory_mib) {
      return absl::InvalidArgumentError(
          fmt::format("allocation {}: GPU {} of node {} is too full", a.id, g, node.name));
    }
    if (!MpsUserAllows(u.mps_user, r)) {
      return absl::InvalidArgumentError(fmt::format(
          "allocation {}: GPU {} of node {} runs another owner's MPS clients", a.id, g, node.name));
    }
  }
  node.cpu_used += r.cpu_milli;
  node.memory_used += r.memory_mib;
  for (int g : a.gpus) {
    GpuUse& u = gpu_uses_[node.gpu_offset + g];
    u.milli += a.milli_per_gpu;
    u.memory_mib += a.memory_mib_per_gpu;
    if (r.fractional()) u.util_pct += r.expected_util_pct;
    ++u.holders;
    if (r.mps()) {
      ++u.mps_holders;
      u.mps_user = MpsUserKey(r.owner);
    }
  }
  ++node.tag_counts[AffinityTag(r)];
  node_allocs_[a.node].push_back(a.id);
  NodeId n = a.node;
  if (a.request.preemptible) {
    ++preemptible_by_priority_[a.request.priority];
    if (a.borrowed) ++borrowed_preemptible_;
  }
  allocations_.emplace(a.id, std::move(a));
  Reclassify(n);
  return absl::OkStatus();
}

absl::StatusOr<Allocation> ClusterState::Remove(const std::string& id) {
  auto it = allocations_.find(id);
  if (it == allocations_.end()) {
    return absl::NotFoundError(fmt::format("allocation {}: not found", id));
  }
  Allocation a = std::move(it->second);
  allocations_.erase(it);
  if (a.request.preemptible) {
    auto p = preemptible_by_priority_.find(a.request.priority);
    if (--p->second == 0) preemptible_by_priority_.erase(p);
    if (a.borrowed) --borrowed_preemptible_;
  }
  Node& node = nodes_[a.node];
  node.cpu_used -= a.request.cpu_milli;
  node.memory_used -= a.request.memory_mib;
  for (int g : a.gpus) {
    GpuUse& u = gpu_uses_[node.gpu_offset + g];
    u.milli -= a.milli_per_gpu;
    u.memory_mib -= a.memory_mib_per_gpu;
    if (a.request.fractional()) u.util_pct -= a.request.expected_util_pct;
    --u.holders;
    if (a.request.mps() && --u.mps_holders == 0) u.mps_user = 0;
    assert(u.milli >= 0 && u.memory_mib >= 0 && u.holders >= 0 && u.mps_holders >= 0);
  }
  --node.tag_counts[AffinityTag(a.request)];
  auto& ids = node_allocs_[a.node];
  ids.erase(std::find(ids.begin(), ids.end(), id));
  Reclassify(a.node);
  return a;
}

const Allocation* ClusterState::Find(const std::string& id) const {
  auto it = allocations_.find(id);
  return it == allocations_.end() ? nullptr : &it->second;
}

std::vector<const Allocation*> ClusterState::AllocationsOn(NodeId n) const {
  std::vector<const Allocation*> out;
  for (const std::string& id : node_allocs_[n]) out.push_back(&allocations_.at(id));
  return out;
}

absl::Status ClusterState::SetGpuHealth(NodeId n, int gpu, bool healthy) {
  if (n < 0 || n >= node_count() || !node_live(n) || gpu < 0 || gpu >= gpu_count(n)) {
    return absl::InvalidArgumentError(fmt::format("no GPU {} on node {}", gpu, n));
  }
  gpu_uses_[nodes_[n].gpu_offset + gpu].healthy = healthy;
  Reclassify(n);
  return absl::OkStatus();
}

size_t ClusterState::ApproxBytesPerNode() const {
  if (nodes_.empty()) return 0;
  size_t bytes = sizeof(Node) * nodes_.size() + sizeof(GpuUse) * gpu_uses_.size() +
                 sizeof(std::vector<std::string>) * node_allocs_.size();
  for (const Class& c : classes_) {
    bytes += sizeof(Class) + c.key.capacity() * sizeof(uint64_t) +
             c.gpus.capacity() * sizeof(ClassGpu) + c.members.capacity() * sizeof(NodeId);
  }
  bytes += class_index_.size() * (sizeof(std::vector<uint64_t>) + sizeof(ClassId) + 16);
  return bytes / nodes_.size();
}

}  // namespace tessera::sched
