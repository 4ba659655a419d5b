#include "tessera/extender/dra.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "fmt/format.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/object.h"
#include "tessera/kube/quantity.h"

namespace tessera::extender {

using nlohmann::json;

namespace {

int64_t IntAt(const json& o, std::initializer_list<const char*> path, int64_t fallback) {
  const json* v = kube::FieldAt(o, path);
  return v && v->is_number_integer() ? v->get<int64_t>() : fallback;
}

// The requests of a claim's spec (spec.devices) that ask for Tessera's classes, in order.
void AddRequests(const json& devices, DraDemand* out) {
  const json* requests = kube::FieldAt(devices, {"requests"});
  if (!requests || !requests->is_array()) return;
  std::set<std::string> same_gpu;  // requests a uuid constraint ties to one GPU
  bool all_same = false;
  if (const json* cs = kube::FieldAt(devices, {"constraints"}); cs && cs->is_array()) {
    for (const json& c : *cs) {
      if (kube::StringAt(c, {"matchAttribute"}) != std::string(kDraDriverName) + "/uuid") continue;
      const json* names = kube::FieldAt(c, {"requests"});
      if (!names || !names->is_array() || names->empty()) {
        all_same = true;
      } else {
        for (const json& n : *names) {
          if (n.is_string()) same_gpu.insert(n.get<std::string>());
        }
      }
    }
  }
  for (const json& r : *requests) {
    const json* exactly = kube::FieldAt(r, {"exactly"});
    if (!exactly || !exactly->is_object()) continue;  // a prioritized list: not read
    std::string cls = kube::StringAt(*exactly, {"deviceClassName"});
    if (cls != kDraGpuClass && cls != kDraShareClass) continue;
    std::string mode = kube::StringAt(*exactly, {"allocationMode"});
    if (!mode.empty() && mode != "ExactCount") continue;
    DraRequest d;
    d.share = cls == kDraShareClass;
    d.count = static_cast<int>(std::clamp<int64_t>(IntAt(*exactly, {"count"}, 1), 1, 1024));
    std::string name = kube::StringAt(r, {"name"});
    d.same_gpu = d.share && (all_same || same_gpu.contains(name));
    out->requests.push_back(d);
  }
}

}  // namespace

void DraAdvisor::OnSlice(const json& slice, bool deleted) {
  if (kube::StringAt(slice, {"spec", "driver"}) != kDraDriverName) return;
  const std::string pool = kube::StringAt(slice, {"spec", "pool", "name"});
  const std::string name = kube::StringAt(slice, {"metadata", "name"});
  const int64_t gen = IntAt(slice, {"spec", "pool", "generation"}, 0);
  if (pool.empty() || name.empty()) return;
  core::MutexLock lock(mu_);
  Pool& p = pools_[pool];
  if (deleted) {
    p.slices.erase(name);
    if (p.slices.empty()) pools_.erase(pool);
    return;
  }
  if (gen < p.generation) return;  // an older generation: the allocator ignores it too
  if (gen > p.generation) {
    p.slices.clear();
    p.generation = gen;
    p.consumable = false;
  }
  std::vector<Device> devs;
  if (const json* list = kube::FieldAt(slice, {"spec", "devices"}); list && list->is_array()) {
    for (const json& d : *list) {
      Device dev;
      dev.name = kube::StringAt(d, {"name"});
      dev.share = kube::StringAt(d, {"attributes", "type", "string"}) == "share";
      dev.gpu = static_cast<int>(IntAt(d, {"attributes", "index", "int"}, -1));
      std::string memory = kube::StringAt(d, {"capacity", "memory", "value"});
      dev.memory_mib = kube::ParseQuantity(memory, 1.0 / (1 << 20)).value_or(0);
      if (dev.name.empty() || dev.gpu < 0) continue;
      if (const json* m = kube::FieldAt(d, {"allowMultipleAllocations"}); m && m->is_boolean()) {
        p.consumable = p.consumable || m->get<bool>();
      }
      const int per_gpu = static_cast<int>(IntAt(d, {"attributes", "sharesPerGpu", "int"}, 1));
      core::NodeGpu& g = p.gpus[dev.gpu];
      g.model = kube::StringAt(d, {"attributes", "productName", "string"});
      g.memory_mib = dev.share ? dev.memory_mib * per_gpu : dev.memory_mib;
      if (dev.share) p.shares_per_gpu[dev.gpu] = std::max(1, per_gpu);
      devs.push_back(std::move(dev));
    }
  }
  p.slices[name] = std::move(devs);
}

void DraAdvisor::OnClaim(const json& claim, bool deleted) {
  const std::string key = kube::ObjectKey(claim);
  const std::string uid = kube::StringAt(claim, {"metadata", "uid"});
  core::MutexLock lock(mu_);
  if (auto it = claim_devices_.find(uid); it != claim_devices_.end()) {
    for (const std::string& d : it->second) allocated_.erase(d);
    claim_devices_.erase(it);
  }
  if (deleted) {
    claims_.erase(key);
    return;
  }
  claims_[key] = claim;
  const json* results = kube::FieldAt(claim, {"status", "allocation", "devices", "results"});
  if (!results || !results->is_array()) return;
  std::vector<std::string> mine;
  for (const json& r : *results) {
    if (kube::StringAt(r, {"driver"}) != kDraDriverName) continue;
    std::string d = kube::StringAt(r, {"pool"}) + "/" + kube::StringAt(r, {"device"});
    allocated_[d] = uid;
    mine.push_back(d);
  }
  claim_devices_[uid] = std::move(mine);
}

void DraAdvisor::OnTemplate(const json& tmpl, bool deleted) {
  core::MutexLock lock(mu_);
  if (deleted) {
    templates_.erase(kube::ObjectKey(tmpl));
  } else if (const json* spec = kube::FieldAt(tmpl, {"spec", "spec"})) {
    templates_[kube::ObjectKey(tmpl)] = *spec;
  }
}

DraDemand DraAdvisor::DemandOf(const json& pod) const {
  DraDemand out;
  const std::string ns = kube::StringAt(pod, {"metadata", "namespace"});
  const json* rcs = kube::FieldAt(pod, {"spec", "resourceClaims"});
  if (!rcs || !rcs->is_array()) return out;
  // The claims made from templates, by the pod's own name for them.
  std::map<std::string, std::string> generated;
  if (const json* st = kube::FieldAt(pod, {"status", "resourceClaimStatuses"});
      st && st->is_array()) {
    for (const json& s : *st) {
      generated[kube::StringAt(s, {"name"})] = kube::StringAt(s, {"resourceClaimName"});
    }
  }
  core::MutexLock lock(mu_);
  for (const json& rc : *rcs) {
    std::string claim = kube::StringAt(rc, {"resourceClaimName"});
    if (claim.empty()) claim = generated[kube::StringAt(rc, {"name"})];
    const json* spec = nullptr;
    if (auto it = claims_.find(ns + "/" + claim); !claim.empty() && it != claims_.end()) {
      const json& c = it->second;
      if (const json* results = kube::FieldAt(c, {"status", "allocation", "devices", "results"});
          results && results->is_array()) {
        for (const json& r : *results) {
          if (kube::StringAt(r, {"driver"}) == kDraDriverName) {
            out.pinned.insert(kube::StringAt(r, {"pool"}));
          }
        }
        continue;  // allocated: where it is, it stays
      }
      spec = kube::FieldAt(c, {"spec", "devices"});
    } else if (std::string t = kube::StringAt(rc, {"resourceClaimTemplateName"}); !t.empty()) {
      if (auto tt = templates_.find(ns + "/" + t); tt != templates_.end()) {
        spec = kube::FieldAt(tt->second, {"devices"});
      }
    }
    if (spec) AddRequests(*spec, &out);
  }
  return out;
}

namespace {

// Whether device `d` of `devices` can still be given, with `used` saying which devices are given
// (allocated, or taken by this placement): it is not, and (partitionable devices) neither is the
// whole GPU beside a share of it, nor a share of the GPU beside the whole.
bool Available(const DraAdvisor::Device& d, const std::vector<DraAdvisor::Device>& devices,
               const std::function<bool(const DraAdvisor::Device&)>& used) {
  if (used(d)) return false;
  for (const DraAdvisor::Device& o : devices) {
    if (o.gpu == d.gpu && o.share != d.share && used(o)) return false;
  }
  return true;
}

}  // namespace

std::vector<DraAdvisor::Device> DraAdvisor::DevicesLocked(const Pool& p) const {
  std::vector<Device> out;
  for (const auto& [name, devs] : p.slices) out.insert(out.end(), devs.begin(), devs.end());
  return out;
}

std::optional<std::vector<const DraAdvisor::Device*>> DraAdvisor::TakeLocked(
    const std::string& pool, const std::vector<Device>& devices, const DraDemand& demand) const {
  std::set<std::string> taken;
  auto used = [&](const Device& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return taken.contains(d.name) || allocated_.contains(pool + "/" + d.name);
  };
  auto free = [&](const Device& d) { return Available(d, devices, used); };
  std::vector<const Device*> out;
  for (const DraRequest& r : demand.requests) {
    std::vector<const Device*> got;
    if (r.same_gpu) {
      // The allocator backtracks to the first GPU with enough free shares.
      std::map<int, std::vector<const Device*>> by_gpu;
      std::vector<int> order;
      for (const Device& d : devices) {
        if (!d.share || !free(d)) continue;
        if (by_gpu[d.gpu].empty()) order.push_back(d.gpu);
        by_gpu[d.gpu].push_back(&d);
      }
      for (int g : order) {
        if (static_cast<int>(by_gpu[g].size()) >= r.count) {
          got.assign(by_gpu[g].begin(), by_gpu[g].begin() + r.count);
          break;
        }
      }
    } else {
      for (const Device& d : devices) {
        if (static_cast<int>(got.size()) == r.count) break;
        if (d.share == r.share && free(d)) got.push_back(&d);
      }
    }
    if (static_cast<int>(got.size()) < r.count) return std::nullopt;
    for (const Device* d : got) {
      taken.insert(d->name);
      out.push_back(d);
    }
  }
  return out;
}

std::vector<std::string> DraAdvisor::Filter(const DraDemand& demand,
                                            const std::vector<std::string>& nodes,
                                            std::map<std::string, std::string>* failed) const {
  std::vector<std::string> out;
  core::MutexLock lock(mu_);
  for (const std::string& n : nodes) {
    if (!demand.pinned.empty() && !demand.pinned.contains(n)) {
      (*failed)[n] = fmt::format("a claim of the pod is allocated on {}", *demand.pinned.begin());
      continue;
    }
    auto it = pools_.find(n);
    if (it == pools_.end() || demand.requests.empty() || it->second.consumable) {
      out.push_back(n);  // nothing known against it: kube-scheduler found it feasible
      continue;
    }
    std::vector<Device> devs = DevicesLocked(it->second);
    if (TakeLocked(n, devs, demand)) {
      out.push_back(n);
    } else {
      int whole = 0, shares = 0;
      auto used = [&](const Device& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return allocated_.contains(n + "/" + d.name);
      };
      for (const Device& d : devs) {
        if (Available(d, devs, used)) (d.share ? shares : whole)++;
      }
      (*failed)[n] =
          fmt::format("its free Tessera GPUs ({} whole, {} shares) cannot hold the pod's claims",
                      whole, shares);
    }
  }
  return out;
}

void DraAdvisor::CountDemandLocked(const DraDemand& d) {
  for (const DraRequest& r : d.requests) {
    int per_gpu = 10;
    for (const auto& [name, p] : pools_) {
      if (!p.shares_per_gpu.empty()) {
        per_gpu = p.shares_per_gpu.begin()->second;
        break;
      }
    }
    auto shape = r.share ? std::pair<int32_t, int>{std::min(1000, 1000 * r.count / per_gpu), 1}
                         : std::pair<int32_t, int>{1000, r.count};
    ++seen_[shape];
    ++seen_total_;
  }
  if (seen_total_ != seen_at_build_) {
    std::vector<sched::TypicalRequest> typical;
    for (const auto& [shape, n] : seen_) {
      typical.push_back({.milli_per_gpu = shape.first,
                         .gpus = shape.second,
                         .frequency = static_cast<double>(n) / seen_total_});
    }
    fragmentation_ = sched::Fragmentation(std::move(typical));
    seen_at_build_ = seen_total_;
  }
}

double DraAdvisor::FragmentationLocked(const std::string& pool, const std::vector<Device>& devices,
                                       const std::set<std::string>& taken) {
  const Pool& p = pools_.at(pool);
  // Free compute and memory per GPU the pool publishes: none when it is given whole, else what its
  // given shares leave.
  struct Use {
    bool whole_used = false;
    int shares_used = 0;
  };
  std::map<int, Use> use;
  for (const Device& d : devices) {
    Use& u = use[d.gpu];
    if (!allocated_.contains(pool + "/" + d.name) && !taken.contains(d.name)) continue;
    if (d.share) {
      ++u.shares_used;
    } else {
      u.whole_used = true;
    }
  }
  std::map<int, std::pair<int32_t, int64_t>> left;
  for (const auto& [g, u] : use) {
    auto per = p.shares_per_gpu.find(g);
    const int n = per == p.shares_per_gpu.end() ? 1 : per->second;
    const int32_t milli = u.whole_used ? 0 : std::max(0, 1000 - 1000 * u.shares_used / n);
    left[g] = {milli, p.gpus.at(g).memory_mib * milli / 1000};
  }
  // The node's shape: its GPUs' kinds (model and memory), in index order.
  std::string key;
  sched::NodeShape shape;
  shape.cpu_milli = int64_t{1} << 40;  // CPU is not Tessera's to judge here
  std::map<std::pair<std::string, int64_t>, uint16_t> kinds;
  for (const auto& [g, use] : left) {
    const core::NodeGpu& kind = p.gpus.at(g);
    auto [it, added] = kinds.try_emplace({kind.model, kind.memory_mib}, kinds.size());
    if (added) shape.kinds.push_back(kind);
    shape.gpus.push_back(kind);
    shape.gpu_kind.push_back(it->second);
    key += fmt::format("{}:{};", kind.model, kind.memory_mib);
  }
  auto [sid, added] = shape_ids_.try_emplace(key, static_cast<sched::ShapeId>(shapes_.size()));
  if (added) shapes_.push_back(shape);
  std::vector<sched::ClassGpu> gpus;
  size_t i = 0;
  for (const auto& [g, use] : left) {
    gpus.push_back({.kind = shape.gpu_kind[i++],
                    .healthy = true,
                    .milli_left = std::min<int32_t>(use.first, 1000),
                    .memory_left_mib = use.second});
  }
  return fragmentation_.Of(shapes_[sid->second], sid->second, shape.cpu_milli, gpus);
}

std::vector<std::pair<std::string, int64_t>> DraAdvisor::Prioritize(
    const DraDemand& demand, const std::vector<std::string>& nodes) {
  core::MutexLock lock(mu_);
  CountDemandLocked(demand);
  std::vector<std::pair<std::string, std::optional<double>>> growth;
  for (const std::string& n : nodes) {
    auto it = pools_.find(n);
    if (it == pools_.end() || demand.requests.empty() || it->second.consumable ||
        (!demand.pinned.empty() && !demand.pinned.contains(n))) {
      growth.emplace_back(n, std::nullopt);
      continue;
    }
    std::vector<Device> devs = DevicesLocked(it->second);
    auto take = TakeLocked(n, devs, demand);
    if (!take) {
      growth.emplace_back(n, std::nullopt);
      continue;
    }
    std::set<std::string> names;
    for (const Device* d : *take) names.insert(d->name);
    double before = FragmentationLocked(n, devs, {});
    double after = FragmentationLocked(n, devs, names);
    growth.emplace_back(n, after - before);
  }
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& [n, g] : growth) {
    if (g) {
      lo = std::min(lo, *g);
      hi = std::max(hi, *g);
    }
  }
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [n, g] : growth) {
    int64_t score = 0;
    if (g) score = hi - lo < 1e-9 ? 10 : std::llround(10 * (hi - *g) / (hi - lo));
    out.emplace_back(n, score);
  }
  return out;
}

std::map<std::string, DraAdvisor::NodeFree> DraAdvisor::Free() const {
  core::MutexLock lock(mu_);
  std::map<std::string, NodeFree> out;
  for (const auto& [pool_name, p] : pools_) {
    const std::string& name = pool_name;
    NodeFree& f = out[name];
    std::vector<Device> devs = DevicesLocked(p);
    auto used = [&](const Device& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return allocated_.contains(name + "/" + d.name);
    };
    for (const Device& d : devs) {
      if (Available(d, devs, used)) (d.share ? f.shares : f.whole)++;
    }
  }
  return out;
}

int DraAdvisor::SharesPerGpu() const {
  core::MutexLock lock(mu_);
  std::map<int, int> seen;  // shares per GPU -> GPUs
  for (const auto& [name, p] : pools_)
    for (const auto& [gpu, n] : p.shares_per_gpu) ++seen[n];
  int most = 0, gpus = 0;
  for (const auto& [n, count] : seen) {
    if (count >= gpus) most = n, gpus = count;
  }
  return most;
}

}  // namespace tessera::extender
