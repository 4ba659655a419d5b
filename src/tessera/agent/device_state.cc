#include "tessera/agent/device_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/agent/checkpoint.h"
#include "tessera/agent/share_edits.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/atomic_file.h"
#include "tessera/sched/policy.h"
#include "tessera/shim/region.h"

namespace tessera::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kShareSep = "::";
constexpr int kCheckpointVersion = 1;

std::string ShareId(const std::string& uuid, int k) { return fmt::format("{}::{}", uuid, k); }

}  // namespace

int64_t UnixSeconds(const core::Clock* clock) {
  return static_cast<int64_t>(core::Seconds((clock ? *clock : core::SystemClock::Get()).Now()));
}

std::string_view ResourceName(Resource r) {
  return r == Resource::kGpu ? kGpuResource : kShareResource;
}

DeviceState::DeviceState(core::NodeInventory inventory, PluginOptions options)
    : inventory_(std::move(inventory)), options_(std::move(options)) {
  for (const core::Gpu& g : inventory_.gpus) by_uuid_[g.uuid] = g.index;
  healthy_.assign(inventory_.gpus.size(), true);
}

absl::StatusOr<std::unique_ptr<DeviceState>> DeviceState::Create(core::NodeInventory inventory,
                                                                 PluginOptions options) {
  if (options.shares_per_gpu < 1 || options.shares_per_gpu > 100) {
    return absl::InvalidArgumentError(
        fmt::format("shares per GPU must be 1..100, not {}", options.shares_per_gpu));
  }
  if (options.state_dir.empty()) return absl::InvalidArgumentError("no state folder");
  for (size_t i = 0; i < inventory.gpus.size(); ++i) {
    if (inventory.gpus[i].index != static_cast<int>(i) || inventory.gpus[i].uuid.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("GPU {} has no UUID or is out of order", inventory.gpus[i].index));
    }
  }
  std::error_code ec;
  fs::create_directories(options.state_dir + "/regions", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        fmt::format("state folder {}: {}", options.state_dir, ec.message()));
  }
  // Others may reach a region file they know the name of (a container's user is any uid), but
  // may not list the folder.
  chmod(options.state_dir.c_str(), 0711);
  chmod((options.state_dir + "/regions").c_str(), 0711);
  std::unique_ptr<DeviceState> s(new DeviceState(std::move(inventory), std::move(options)));
  if (absl::Status st = s->Load(); !st.ok()) return st;
  return s;
}

std::vector<std::pair<int, int>> DeviceState::SharesOnGpus(const Allocation& a) const {
  std::vector<std::pair<int, int>> out;
  for (const std::string& uuid : a.gpus) {
    const int g = by_uuid_.at(uuid);
    int n = 0;
    for (const std::string& id : a.device_ids) n += GpuOf(id) == g;
    out.emplace_back(g, n);
  }
  return out;
}

std::optional<int> DeviceState::GpuOf(const std::string& device_id, Resource* resource) const {
  size_t sep = device_id.find(kShareSep);
  std::string uuid = sep == std::string::npos ? device_id : device_id.substr(0, sep);
  auto it = by_uuid_.find(uuid);
  if (it == by_uuid_.end()) return std::nullopt;
  if (sep != std::string::npos) {
    int k = -1;
    std::string_view rest = std::string_view(device_id).substr(sep + kShareSep.size());
    if (!absl::SimpleAtoi(absl::string_view(rest.data(), rest.size()), &k) || k < 0 ||
        k >= options_.shares_per_gpu || ShareId(uuid, k) != device_id) {
      return std::nullopt;
    }
  }
  if (resource) *resource = sep == std::string::npos ? Resource::kGpu : Resource::kShare;
  return it->second;
}

bool DeviceState::HeldByOtherLocked(int g, Resource r) const {
  const std::string& uuid = inventory_.gpus[g].uuid;
  for (const Allocation& a : allocations_) {
    if (a.resource == r) continue;
    if (std::find(a.gpus.begin(), a.gpus.end(), uuid) != a.gpus.end()) return true;
  }
  return false;
}

v1beta1::ListAndWatchResponse DeviceState::List(Resource r) const {
  core::MutexLock lock(mu_);
  v1beta1::ListAndWatchResponse out;
  for (const core::Gpu& g : inventory_.gpus) {
    bool ok = healthy_[g.index] && !HeldByOtherLocked(g.index, r);
    int n = r == Resource::kGpu ? 1 : options_.shares_per_gpu;
    for (int k = 0; k < n; ++k) {
      v1beta1::Device* d = out.add_devices();
      d->set_id(r == Resource::kGpu ? g.uuid : ShareId(g.uuid, k));
      d->set_health(ok ? "Healthy" : "Unhealthy");
      if (g.numa_node && *g.numa_node >= 0)
        d->mutable_topology()->add_nodes()->set_id(*g.numa_node);
    }
  }
  return out;
}

uint64_t DeviceState::generation() const { return feed_.generation(); }

uint64_t DeviceState::WaitForChange(uint64_t seen, std::chrono::milliseconds timeout) const {
  return feed_.WaitForChange(seen, timeout);
}

void DeviceState::Shutdown() { feed_.Shutdown(); }

bool DeviceState::SetHealth(int gpu, bool healthy, const std::string& reason) {
  core::MutexLock lock(mu_);
  if (gpu < 0 || gpu >= static_cast<int>(healthy_.size()) || healthy_[gpu] == healthy) return false;
  healthy_[gpu] = healthy;
  feed_.Bump();
  return true;
}

bool DeviceState::healthy(int gpu) const {
  core::MutexLock lock(mu_);
  return gpu >= 0 && gpu < static_cast<int>(healthy_.size()) && healthy_[gpu];
}

absl::StatusOr<v1beta1::PreferredAllocationResponse> DeviceState::Preferred(
    Resource r, const v1beta1::PreferredAllocationRequest& request, const PodHint* hint) const {
  v1beta1::PreferredAllocationResponse out;
  for (const auto& c : request.container_requests()) {
    const int size = c.allocation_size();
    if (size <= 0 || size > c.available_deviceids_size()) {
      return absl::InvalidArgumentError(fmt::format("allocation size {} with {} devices available",
                                                    size, c.available_deviceids_size()));
    }
    // GPU index -> the available IDs on it (sorted by share number), and the required ones.
    std::map<int, std::vector<std::string>> avail;
    std::set<std::string> must(c.must_include_deviceids().begin(),
                               c.must_include_deviceids().end());
    for (const std::string& id : c.available_deviceids()) {
      Resource kind;
      std::optional<int> g = GpuOf(id, &kind);
      if (!g || kind != r) {
        return absl::InvalidArgumentError(fmt::format(
            "available device '{}' is not a {} device of this node", id, ResourceName(r)));
      }
      avail[*g].push_back(id);
    }
    for (const std::string& id : must) {
      if (!GpuOf(id)) {
        return absl::InvalidArgumentError(fmt::format("required device '{}' is unknown", id));
      }
    }
    if (static_cast<int>(must.size()) > size) {
      return absl::InvalidArgumentError(
          fmt::format("{} required devices for an allocation of {}", must.size(), size));
    }
    std::vector<int> hinted;
    if (hint) {
      for (const std::string& u : hint->gpus) {
        if (auto it = by_uuid_.find(u); it != by_uuid_.end()) hinted.push_back(it->second);
      }
    }
    auto* resp = out.add_container_responses();
    if (r == Resource::kGpu) {
      std::vector<int> free, need;
      for (const auto& [g, ids] : avail) free.push_back(g);
      for (const std::string& id : must) need.push_back(*GpuOf(id));
      std::vector<int> chosen;
      // The extender's choice, when it fits what the kubelet offers.
      if (static_cast<int>(hinted.size()) == size &&
          std::all_of(hinted.begin(), hinted.end(), [&](int g) { return avail.contains(g); }) &&
          std::all_of(need.begin(), need.end(), [&](int g) {
            return std::find(hinted.begin(), hinted.end(), g) != hinted.end();
          })) {
        chosen = hinted;
      } else {
        chosen = sched::PreferredGpuSet(inventory_.topology, free, need, size);
      }
      for (int g : chosen) resp->add_deviceids(inventory_.gpus[g].uuid);
      continue;
    }
    // Shares: the required ones, then the extender's GPU, then as the scheduler packs shares
    // (sched::ShareGpuOrder: best fit, leaving whole GPUs free for whole-GPU pods).
    std::vector<std::string> picked(must.begin(), must.end());
    int left = size - static_cast<int>(picked.size());
    std::vector<int> first;
    for (const std::string& id : must) first.push_back(*GpuOf(id));
    first.insert(first.end(), hinted.begin(), hinted.end());
    std::map<int, int> free;
    for (const auto& [g, ids] : avail) free[g] = static_cast<int>(ids.size());
    for (int g : sched::ShareGpuOrder(free, left, first)) {
      if (left == 0) break;
      auto it = avail.find(g);
      if (it == avail.end()) continue;
      for (const std::string& id : it->second) {
        if (left == 0) break;
        if (std::find(picked.begin(), picked.end(), id) != picked.end()) continue;
        picked.push_back(id);
        --left;
      }
    }
    for (const std::string& id : picked) resp->add_deviceids(id);
  }
  return out;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> DeviceState::AllocateOneLocked(
    Resource r, const std::vector<std::string>& request_ids, const PodHint* hint,
    std::vector<Allocation>& made) {
  std::vector<std::string> ids = request_ids;
  std::sort(ids.begin(), ids.end());
  const int have = static_cast<int>(inventory_.gpus.size()) *
                   (r == Resource::kGpu ? 1 : options_.shares_per_gpu);
  if (ids.empty()) return absl::InvalidArgumentError("a container request with no device IDs");
  if (static_cast<int>(ids.size()) > have) {
    return absl::InvalidArgumentError(
        fmt::format("{} {} devices asked, this node has {}", ids.size(), ResourceName(r), have));
  }
  if (auto d = std::adjacent_find(ids.begin(), ids.end()); d != ids.end()) {
    return absl::InvalidArgumentError(fmt::format("device ID '{}' asked twice", *d));
  }
  std::map<int, int> per_gpu;  // GPU index -> devices of it
  for (const std::string& id : ids) {
    Resource kind;
    std::optional<int> g = GpuOf(id, &kind);
    if (!g) {
      return absl::InvalidArgumentError(
          fmt::format("unknown device ID '{}': not one this node advertises", id));
    }
    if (kind != r) {
      return absl::InvalidArgumentError(fmt::format("device ID '{}' is a {} device, not {}", id,
                                                    ResourceName(kind), ResourceName(r)));
    }
    if (!healthy_[*g]) {
      return absl::UnavailableError(fmt::format("device ID '{}': GPU {} ({}) is unhealthy", id, *g,
                                                inventory_.gpus[*g].uuid));
    }
    if (HeldByOtherLocked(*g, r)) {
      return absl::FailedPreconditionError(
          fmt::format("device ID '{}': GPU {} ({}) is in use as {}", id, *g,
                      inventory_.gpus[*g].uuid, r == Resource::kGpu ? "shares" : "a whole GPU"));
    }
    ++per_gpu[*g];
  }
  std::vector<std::string> gpus;
  for (const auto& [g, n] : per_gpu) gpus.push_back(inventory_.gpus[g].uuid);
  std::string pod;
  if (hint) {
    pod = hint->pod_namespace + "/" + hint->pod_name;
    for (const std::string& u : hint->gpus) {
      if (!by_uuid_.contains(u)) {
        return absl::FailedPreconditionError(
            fmt::format("pod {}: the scheduler chose GPU '{}', which is not on this node", pod, u));
      }
    }
    std::vector<std::string> want = hint->gpus;
    std::sort(want.begin(), want.end());
    std::vector<std::string> got = gpus;
    std::sort(got.begin(), got.end());
    if (!want.empty() && want != got) {
      return absl::FailedPreconditionError(
          fmt::format("pod {}: the kubelet gave GPUs [{}] but the scheduler chose [{}]", pod,
                      absl::StrJoin(got, ","), absl::StrJoin(want, ",")));
    }
  }

  // The same IDs again (a kubelet retrying): the same allocation, region and all.
  Allocation a;
  bool reused = false;
  for (const Allocation& old : allocations_) {
    if (old.resource == r && old.device_ids == ids) {
      a = old;
      reused = true;
    }
  }
  if (!reused) {
    a.id = fmt::format("a{}", next_id_ + made.size());
    a.resource = r;
    a.device_ids = ids;
    a.gpus = gpus;
    a.pod = pod;
    a.created_unix = UnixSeconds(options_.clock);
  }

  v1beta1::ContainerAllocateResponse resp;
  std::string visible = absl::StrJoin(a.gpus, ",");
  (*resp.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = visible;
  (*resp.mutable_envs())["CUDA_VISIBLE_DEVICES"] = visible;
  const devices::DriverFiles& files = options_.driver_files;
  for (const std::string& u : a.gpus) {
    resp.add_cdi_devices()->set_name(devices::CdiDeviceName(u));
    int g = by_uuid_.at(u);
    if (g < static_cast<int>(files.gpu_nodes.size()) && !files.gpu_nodes[g].empty()) {
      auto* d = resp.add_devices();
      d->set_container_path(files.gpu_nodes[g]);
      d->set_host_path(files.gpu_nodes[g]);
      d->set_permissions("rw");
    }
  }
  for (const std::string& node : files.control_nodes) {
    auto* d = resp.add_devices();
    d->set_container_path(node);
    d->set_host_path(node);
    d->set_permissions("rw");
  }
  if (r == Resource::kShare) {
    ShareRequest share;
    share.share = 1;
    for (const auto& [g, n] : SharesOnGpus(a)) {
      share.share = std::min(share.share, static_cast<double>(n) / options_.shares_per_gpu);
      uint64_t total = inventory_.gpus[g].memory_bytes.value_or(0);
      share.limits.push_back(hint && hint->memory ? *hint->memory
                                                  : total / options_.shares_per_gpu * n);
      share.gpus.push_back(g);
    }
    if (a.region.empty()) a.region = options_.state_dir + "/regions/" + a.id + ".region";
    share.region = a.region;
    share.priority = hint && hint->priority ? *hint->priority : options_.default_priority;
    share.job_id = a.id;
    if (hint && !hint->gang.empty()) {
      bool known = true;
      for (const std::string& u : hint->gang_gpus) {
        auto it = by_uuid_.find(u);
        known = known && it != by_uuid_.end();
        if (known) share.gang_gpus.push_back(it->second);
      }
      if (known) {
        share.gang = hint->gang;
      } else {
        spdlog::warn("pod {}/{}: its gang {} names GPUs {} that are not this node's",
                     hint->pod_namespace, hint->pod_name, hint->gang,
                     absl::StrJoin(hint->gang_gpus, ","));
      }
    }
    ContainerEdits edits;
    if (absl::Status st = ShareEdits(share, inventory_, options_, &edits); !st.ok()) return st;
    if (auto job = edits.env.find("TESSERA_JOB_ID"); job != edits.env.end() && job->second != a.id)
      a.arbiter_job = job->second;
    for (const auto& [k, v] : edits.env) (*resp.mutable_envs())[k] = v;
    for (const ContainerMount& m : edits.mounts) {
      auto* mount = resp.add_mounts();
      mount->set_host_path(m.host_path);
      mount->set_container_path(m.container_path);
      mount->set_read_only(m.read_only);
    }
  }
  (*resp.mutable_annotations())["tessera.io/allocation"] = a.id;
  if (!reused) made.push_back(a);
  return resp;
}

absl::StatusOr<v1beta1::AllocateResponse> DeviceState::Allocate(
    Resource r, const v1beta1::AllocateRequest& request, const PodHint* hint) {
  core::MutexLock lock(mu_);
  if (request.container_requests_size() == 0) {
    return absl::InvalidArgumentError("an Allocate request with no container requests");
  }
  v1beta1::AllocateResponse out;
  std::vector<Allocation> made;
  std::set<std::string> asked;
  for (const auto& c : request.container_requests()) {
    std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
    for (const std::string& id : std::set<std::string>(ids.begin(), ids.end())) {
      if (!asked.insert(id).second) {
        return absl::InvalidArgumentError(
            fmt::format("device ID '{}' asked for two containers", id));
      }
    }
    auto resp = AllocateOneLocked(r, ids, hint, made);
    if (!resp.ok()) {
      for (const Allocation& a : made) {
        if (!a.region.empty()) unlink(a.region.c_str());
      }
      return resp.status();
    }
    *out.add_container_responses() = std::move(*resp);
  }
  if (!made.empty()) {
    std::vector<Allocation> before = allocations_;
    // The kubelet hands out only IDs it considers free: an older allocation holding any of them
    // belongs to a pod that has ended.
    for (const Allocation& a : made) {
      std::erase_if(allocations_, [&](const Allocation& old) {
        if (old.resource != a.resource) return false;
        for (const std::string& id : old.device_ids) {
          if (std::binary_search(a.device_ids.begin(), a.device_ids.end(), id)) {
            if (!old.region.empty()) unlink(old.region.c_str());
            return true;
          }
        }
        return false;
      });
    }
    allocations_.insert(allocations_.end(), made.begin(), made.end());
    next_id_ += made.size();
    if (absl::Status st = SaveLocked(); !st.ok()) {
      allocations_ = std::move(before);
      next_id_ -= made.size();
      return absl::InternalError(
          fmt::format("checkpoint not written: {}", std::string(st.message())));
    }
    feed_.Bump();
  }
  return out;
}

int DeviceState::Release(const std::set<std::string>& in_use, int64_t made_before_unix) {
  struct Ended {
    Allocation a;
    std::unique_ptr<shim::RegionData> head;
    uint64_t launches = 0;
  };
  std::vector<Ended> ended;
  {
    core::MutexLock lock(mu_);
    std::erase_if(allocations_, [&](const Allocation& a) {
      if (a.created_unix >= made_before_unix) return false;
      for (const std::string& id : a.device_ids) {
        if (in_use.contains(id)) return false;
      }
      spdlog::info("allocation {} ({} {}) ended: releasing {}", a.id, ResourceName(a.resource),
                   absl::StrJoin(a.device_ids, ","), a.pod.empty() ? "its devices" : a.pod);
      // What the share used, read before its region goes (copied, never mapped: the pod's file).
      Ended e{a, a.region.empty() ? nullptr : shim::ReadRegionHead(a.region.c_str())};
      if (e.head) e.launches = shim::ReadRegionLaunches(a.region.c_str());
      ended.push_back(std::move(e));
      if (!a.region.empty()) unlink(a.region.c_str());
      return true;
    });
    if (!ended.empty()) {
      if (absl::Status st = SaveLocked(); !st.ok()) spdlog::error("{}", std::string(st.message()));
      feed_.Bump();
    }
  }
  if (on_release_) {
    for (const Ended& e : ended) on_release_(e.a, e.head.get(), e.launches);
  }
  return static_cast<int>(ended.size());
}

std::vector<Allocation> DeviceState::Allocations() const {
  core::MutexLock lock(mu_);
  return allocations_;
}

absl::Status DeviceState::SaveLocked() const {
  json j;
  j["version"] = kCheckpointVersion;
  j["next_id"] = next_id_;
  j["allocations"] = json::array();
  for (const Allocation& a : allocations_) {
    j["allocations"].push_back({{"id", a.id},
                                {"resource", ResourceName(a.resource)},
                                {"device_ids", a.device_ids},
                                {"gpus", a.gpus},
                                {"region", a.region},
                                {"pod", a.pod},
                                {"created_unix", a.created_unix}});
    // Only when set: a checkpoint an earlier agent reads back is the same.
    if (!a.arbiter_job.empty()) j["allocations"].back()["arbiter_job"] = a.arbiter_job;
  }
  return devices::WriteFileAtomically(checkpoint_path(), j.dump(1) + "\n", 0600);
}

absl::Status DeviceState::Load() {
  const std::string path = checkpoint_path();
  // Truncated or garbled: set aside. The kubelet keeps which device IDs each pod holds, so no
  // GPU is given twice; the regions of running shares stay where they are.
  std::string aside;
  auto read = ReadCheckpointOrSetAside(path, kCheckpointVersion, "allocations", &aside);
  if (!read.ok()) return read.status();
  if (!aside.empty()) {
    core::MutexLock lock(mu_);
    set_aside_ = aside;
    return absl::OkStatus();
  }
  const json& j = *read;
  if (j.is_null()) return absl::OkStatus();  // a first start
  try {
    core::MutexLock lock(mu_);
    next_id_ = j.at("next_id").get<uint64_t>();
    for (const json& e : j.at("allocations")) {
      Allocation a;
      a.id = e.at("id").get<std::string>();
      std::string res = e.at("resource").get<std::string>();
      if (res == kGpuResource) {
        a.resource = Resource::kGpu;
      } else if (res == kShareResource) {
        a.resource = Resource::kShare;
      } else {
        throw std::runtime_error(fmt::format("allocation {}: unknown resource '{}'", a.id, res));
      }
      a.device_ids = e.at("device_ids").get<std::vector<std::string>>();
      a.gpus = e.at("gpus").get<std::vector<std::string>>();
      a.region = e.at("region").get<std::string>();
      a.pod = e.at("pod").get<std::string>();
      a.created_unix = e.at("created_unix").get<int64_t>();
      a.arbiter_job = e.value("arbiter_job", "");
      bool here = std::all_of(a.device_ids.begin(), a.device_ids.end(),
                              [&](const std::string& id) { return GpuOf(id).has_value(); });
      if (!here) {
        spdlog::warn("checkpoint: allocation {} names devices this node no longer has; dropped",
                     a.id);
        continue;
      }
      allocations_.push_back(std::move(a));
    }
    spdlog::info("checkpoint {}: {} allocation(s) kept", path, allocations_.size());
  } catch (const std::exception& e) {  // json::exception, or a record it cannot use
    auto aside = SetCheckpointAside(path, e.what());
    if (!aside.ok()) return aside.status();
    core::MutexLock lock(mu_);
    allocations_.clear();
    set_aside_ = *aside;
  }
  return absl::OkStatus();
}

std::string DeviceState::set_aside() const {
  core::MutexLock lock(mu_);
  return set_aside_;
}

}  // namespace tessera::agent
