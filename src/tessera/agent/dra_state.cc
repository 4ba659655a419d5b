#include "tessera/agent/dra_state.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/agent/checkpoint.h"
#include "tessera/agent/share_edits.h"
#include "tessera/core/gpu.h"
#include "tessera/core/request.h"
#include "tessera/devices/atomic_file.h"
#include "tessera/devices/cdi.h"
#include "tessera/kube/object.h"
#include "tessera/kube/quantity.h"

namespace tessera::agent {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr int kCheckpointVersion = 1;

// The key the arbiter paces (and charges) a claim's share request under: its TESSERA_JOB_ID.
std::string ShareJobId(const std::string& uid, const std::string& request) {
  return fmt::format("claim-{}-{}", uid, request);
}

// "gpu/first" -> "gpu": the kubelet matches a container's claim request by its main request.
std::string MainRequest(const std::string& request) { return request.substr(0, request.find('/')); }

json DeviceJson(const PreparedDevice& d) {
  json j = {{"requests", d.requests}, {"pool", d.pool}, {"device", d.device}, {"cdi", d.cdi_ids}};
  if (!d.share_id.empty()) j["share_id"] = d.share_id;
  return j;
}

PreparedDevice DeviceFromJson(const json& j) {
  return {j.at("requests").get<std::vector<std::string>>(), j.at("pool").get<std::string>(),
          j.at("device").get<std::string>(), j.at("cdi").get<std::vector<std::string>>(),
          j.value("share_id", "")};
}

}  // namespace

// What one request of a claim's opaque configuration for this driver sets (ShareConfig).
struct DraState::RequestConfig {
  std::optional<uint64_t> memory;  // bytes per GPU
  std::optional<int> priority;
  std::optional<core::GpuSharing> sharing;  // the mode its GPUs must be in
};

// What a consumable device's allocation takes of it (its consumedCapacity), and its shareID.
struct DraState::Consumed {
  uint64_t memory = 0;
  int compute = 100;
  std::string share_id;
};

struct DraState::ClaimAllocation {
  // Request (main name) -> its devices of this driver, in the allocation's order.
  std::map<std::string, std::vector<DraDevice>> by_request;
  std::set<std::string> admin;  // devices given with adminAccess: no exclusivity, no share setup
  std::map<std::pair<std::string, std::string>, Consumed> consumed;  // (request, device)
  std::map<std::string, RequestConfig> config;                       // by request
  std::vector<std::string> pods;  // the pods it is reserved for (status.reservedFor), by name
  bool auto_memory = false;       // annotated tessera.io/gpu-memory: auto (the extender sized it)
};

struct DraState::Claim {
  std::string ns, name;
  std::vector<PreparedDevice> devices;
  std::vector<std::string> regions;  // host paths
  // The claim's CDI spec as written (empty: none, or a checkpoint of an older agent), and each
  // region's limits: what a reboot (the CDI folder is tmpfs) or a wiped file takes is written
  // again from these.
  std::string spec;
  std::map<std::string, std::vector<uint64_t>> region_limits;
  // Each region's compute share (0..1), and when the claim was prepared (unix seconds; 0 in the
  // checkpoint of an earlier agent): its requests' GPU time is told at its unprepare.
  std::map<std::string, double> region_shares;
  int64_t prepared_unix = 0;
  // What it takes of consumable devices (--dra-consumable): device, memory bytes, compute percent.
  struct Use {
    std::string device;
    uint64_t memory = 0;
    int compute = 0;
  };
  std::vector<Use> uses;
  // The pods it was reserved for when prepared (its namespace's): told what its shares used.
  std::vector<std::string> pods;
  bool auto_memory = false;  // its memory sized "auto": outgrowing it is said
};

DraState::DraState(core::NodeInventory inventory, PluginOptions plugin, DraOptions options)
    : inventory_(std::move(inventory)), plugin_(std::move(plugin)), options_(std::move(options)) {
  for (const core::Gpu& g : inventory_.gpus) {
    const bool shares = options_.partitionable || options_.share_gpus.contains(g.index);
    const bool whole = options_.partitionable || !shares;
    if (whole) devices_.push_back({fmt::format("gpu-{}", g.index), g.index, false});
    if (shares && !plugin_.shim_library.empty()) {
      for (int k = 0; k < plugin_.shares_per_gpu; ++k) {
        devices_.push_back({fmt::format("gpu-{}-share-{}", g.index, k), g.index, true});
      }
    }
  }
  for (size_t i = 0; i < devices_.size(); ++i) by_name_[devices_[i].name] = static_cast<int>(i);
  healthy_.assign(inventory_.gpus.size(), true);
  reasons_.assign(inventory_.gpus.size(), "");
}

DraState::~DraState() = default;

absl::StatusOr<std::unique_ptr<DraState>> DraState::Create(core::NodeInventory inventory,
                                                           PluginOptions plugin,
                                                           DraOptions options) {
  if (options.pool.empty()) return absl::InvalidArgumentError("DRA: no pool (node) name");
  if (options.dir.empty()) return absl::InvalidArgumentError("DRA: no plugin folder");
  if (options.cdi_dir.empty()) {
    return absl::InvalidArgumentError("DRA: claims are answered with CDI IDs; --cdi-dir is empty");
  }
  for (int g : options.share_gpus) {
    if (g < 0 || g >= static_cast<int>(inventory.gpus.size())) {
      return absl::InvalidArgumentError(fmt::format(
          "--dra-share-gpus: GPU {} is not on this node ({} GPU(s))", g, inventory.gpus.size()));
    }
  }
  if (options.consumable && (options.partitionable || !options.share_gpus.empty())) {
    return absl::InvalidArgumentError(
        "--dra-consumable shares every GPU by amounts: no --dra-share-gpus or --dra-partitionable");
  }
  if (options.partitionable && !options.share_gpus.empty()) {
    return absl::InvalidArgumentError(
        "--dra-partitionable publishes every GPU both whole and in shares: no --dra-share-gpus");
  }
  if ((!options.share_gpus.empty() || options.partitionable || options.consumable) &&
      plugin.shim_library.empty()) {
    return absl::InvalidArgumentError(
        "shares (--dra-share-gpus, --dra-partitionable, --dra-consumable) need --shim-library: "
        "they are enforced by "
        "the intercept library");
  }
  if (plugin.shares_per_gpu < 1 || plugin.shares_per_gpu > 100) {
    return absl::InvalidArgumentError("--shares-per-gpu must be 1..100");
  }
  std::unique_ptr<DraState> s(
      new DraState(std::move(inventory), std::move(plugin), std::move(options)));
  std::error_code ec;
  std::filesystem::create_directories(s->options_.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        fmt::format("DRA plugin folder {}: {}", s->options_.dir, ec.message()));
  }
  chmod(s->options_.dir.c_str(), 0700);
  if (!s->plugin_.state_dir.empty()) {
    std::filesystem::create_directories(s->plugin_.state_dir + "/regions", ec);
  }
  if (absl::Status st = s->Load(); !st.ok()) return st;
  return s;
}

std::optional<DraDevice> DraState::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return devices_[it->second];
}

std::string DraState::RegionPath(const std::string& uid, const std::string& request) const {
  return fmt::format("{}/regions/{}.region", plugin_.state_dir, ShareJobId(uid, request));
}

std::string DraState::CdiSpecPath(const std::string& uid) const {
  return options_.cdi_dir + "/tessera.io-claim_" + uid + ".json";
}

std::optional<std::vector<PreparedDevice>> DraState::Prepared(const std::string& uid) const {
  core::MutexLock lock(mu_);
  auto it = claims_.find(uid);
  if (it == claims_.end()) return std::nullopt;
  return it->second->devices;
}

std::vector<std::string> DraState::PreparedClaims() const {
  core::MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [uid, c] : claims_) out.push_back(uid);
  return out;
}

std::vector<std::string> DraState::ArbiterJobs() const {
  core::MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [uid, c] : claims_) {
    for (const PreparedDevice& d : c->devices) {
      for (const std::string& request : d.requests) {
        if (std::ranges::find(c->regions, RegionPath(uid, request)) != c->regions.end())
          out.push_back(ShareJobId(uid, request));
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::StatusOr<DraState::ClaimAllocation> DraState::ReadAllocation(const std::string& who,
                                                                   const json& claim) const {
  const json* results = kube::FieldAt(claim, {"status", "allocation", "devices", "results"});
  if (results == nullptr || !results->is_array()) {
    return absl::FailedPreconditionError(
        fmt::format("{}: not allocated (no status.allocation)", who));
  }
  ClaimAllocation a;
  a.auto_memory =
      kube::StringAt(claim, {"metadata", "annotations", "tessera.io/gpu-memory"}) == "auto";
  // Its consumers, told its use when it is unprepared: the pods of its reservedFor.
  if (const json* reserved = kube::FieldAt(claim, {"status", "reservedFor"});
      reserved && reserved->is_array()) {
    for (const json& r : *reserved) {
      if (r.is_object() && r.value("resource", "") == "pods" && r.value("apiGroup", "") == "" &&
          r.contains("name") && r["name"].is_string())
        a.pods.push_back(r["name"].get<std::string>());
    }
  }
  auto& by_request = a.by_request;
  auto& admin = a.admin;
  auto& consumed = a.consumed;
  for (size_t i = 0; i < results->size(); ++i) {
    const json& r = (*results)[i];
    if (kube::StringAt(r, {"driver"}) != options_.driver) continue;
    const std::string where = fmt::format("{}: status.allocation.devices.results[{}]", who, i);
    std::string pool = kube::StringAt(r, {"pool"});
    std::string device = kube::StringAt(r, {"device"});
    std::string request = MainRequest(kube::StringAt(r, {"request"}));
    if (pool != options_.pool) {
      return absl::FailedPreconditionError(
          fmt::format("{}: pool '{}' is not this node's ('{}')", where, pool, options_.pool));
    }
    std::optional<DraDevice> d = Find(device);
    if (!d) {
      return absl::NotFoundError(
          fmt::format("{}: device '{}' is not one this node publishes", where, device));
    }
    if (request.empty()) return absl::InvalidArgumentError(where + ": no request name");
    if (const json* a = kube::FieldAt(r, {"adminAccess"}); a && a->is_boolean() && a->get<bool>()) {
      admin.insert(device);
    }
    if (options_.consumable) {
      // Unset amounts are the whole capacity (the request policy's default).
      Consumed c{.memory = inventory_.gpus[d->gpu].memory_bytes.value_or(0)};
      if (const json* cc = kube::FieldAt(r, {"consumedCapacity"}); cc && cc->is_object()) {
        for (const auto& [k, v] : cc->items()) {
          std::optional<int64_t> q =
              v.is_string() ? kube::ParseQuantity(v.get<std::string>()) : std::nullopt;
          if (!q || *q < 0) {
            return absl::InvalidArgumentError(
                fmt::format("{}: consumedCapacity.{}: not a quantity: {}", where, k, v.dump()));
          }
          if (k == "memory") c.memory = static_cast<uint64_t>(*q);
          if (k == "compute") c.compute = static_cast<int>(std::min<int64_t>(*q, 100));
        }
      }
      c.share_id = kube::StringAt(r, {"shareID"});
      consumed[{request, device}] = c;
    }
    by_request[request].push_back(*d);
  }
  // Opaque configuration for this driver: ShareConfig {memory, priority}; later entries (the
  // claim's after the class's) win.
  auto& config = a.config;
  if (const json* cfg = kube::FieldAt(claim, {"status", "allocation", "devices", "config"});
      cfg && cfg->is_array()) {
    for (size_t i = 0; i < cfg->size(); ++i) {
      const json& c = (*cfg)[i];
      const std::string where = fmt::format("{}: status.allocation.devices.config[{}]", who, i);
      if (kube::StringAt(c, {"opaque", "driver"}) != options_.driver) continue;
      const json* p = kube::FieldAt(c, {"opaque", "parameters"});
      if (p == nullptr || !p->is_object())
        return absl::InvalidArgumentError(where + ": no parameters");
      if (std::string kind = kube::StringAt(*p, {"kind"}); kind != "ShareConfig") {
        return absl::InvalidArgumentError(fmt::format(
            "{}: parameters of kind '{}'; this driver reads kind ShareConfig", where, kind));
      }
      RequestConfig rc;
      for (const auto& [k, v] : p->items()) {
        if (k == "apiVersion" || k == "kind") continue;
        if (k == "memory") {
          std::optional<int64_t> bytes =
              v.is_string() ? kube::ParseQuantity(v.get<std::string>()) : std::nullopt;
          if (!bytes || *bytes <= 0) {
            return absl::InvalidArgumentError(fmt::format(
                "{}: memory: expected a quantity such as 10Gi, got {}", where, v.dump()));
          }
          rc.memory = static_cast<uint64_t>(*bytes);
        } else if (k == "priority") {
          if (!v.is_number_integer()) {
            return absl::InvalidArgumentError(
                fmt::format("{}: priority: expected a whole number", where));
          }
          rc.priority = v.get<int>();
        } else if (k == "sharing") {
          rc.sharing = v.is_string() ? core::ParseGpuSharing(v.get<std::string>()) : std::nullopt;
          if (!rc.sharing) {
            return absl::InvalidArgumentError(
                fmt::format("{}: sharing: expected time-slice or mps, got {}", where, v.dump()));
          }
        } else {
          return absl::InvalidArgumentError(fmt::format(
              "{}: unknown field '{}' (ShareConfig has memory, priority and sharing)", where, k));
        }
      }
      std::vector<std::string> requests;
      if (const json* rq = kube::FieldAt(c, {"requests"}); rq && rq->is_array()) {
        for (const json& n : *rq) {
          if (n.is_string()) requests.push_back(MainRequest(n.get<std::string>()));
        }
      }
      if (requests.empty()) {
        for (const auto& [r, d] : by_request) requests.push_back(r);
      }
      for (const std::string& r : requests) {
        RequestConfig& into = config[r];
        if (rc.memory) into.memory = rc.memory;
        if (rc.priority) into.priority = rc.priority;
        if (rc.sharing) into.sharing = rc.sharing;
      }
    }
  }

  return a;
}

absl::Status DraState::CheckLocked(const std::string& who, const ClaimAllocation& a) const {
  const auto& by_request = a.by_request;
  const auto& admin = a.admin;
  const auto& consumed = a.consumed;
  // Every device checked before anything is written.
  for (const auto& [request, devs] : by_request) {
    bool share = devs.front().share;
    for (const DraDevice& d : devs) {
      if (d.share != share) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: request '{}' mixes whole GPUs and shares; ask for them in two requests", who,
            request));
      }
      if (!healthy_[d.gpu]) {
        return absl::UnavailableError(fmt::format("{}: device {}: GPU {} ({}) is unhealthy: {}",
                                                  who, d.name, d.gpu, inventory_.gpus[d.gpu].uuid,
                                                  reasons_[d.gpu]));
      }
      if (admin.contains(d.name)) continue;
      if (options_.consumable) {
        // Shared by amounts: what the claims prepared take, and this one, within the GPU.
        const Consumed& mine = consumed.at({request, d.name});
        uint64_t memory = mine.memory;
        int compute = mine.compute;
        for (const auto& [other_uid, other] : claims_) {
          for (const Claim::Use& u : other->uses) {
            if (u.device != d.name) continue;
            memory += u.memory;
            compute += u.compute;
          }
        }
        const uint64_t total = inventory_.gpus[d.gpu].memory_bytes.value_or(0);
        if ((total > 0 && memory > total) || compute > 100) {
          return absl::FailedPreconditionError(fmt::format(
              "{}: device {}: the claims prepared on it and this one take {} of its memory and "
              "{}% of its compute, over the GPU's {} and 100%",
              who, d.name, core::FormatBytes(memory), compute, core::FormatBytes(total)));
        }
        continue;
      }
      for (const auto& [other_uid, other] : claims_) {
        for (const PreparedDevice& p : other->devices) {
          std::optional<DraDevice> o = Find(p.device);
          // The same device, or (partitionable devices) the GPU whole beside a share of it.
          if (p.device == d.name || (o && o->gpu == d.gpu && o->share != d.share)) {
            return absl::FailedPreconditionError(fmt::format(
                "{}: device {} is prepared for claim {}/{} (UID {}){}", who, d.name, other->ns,
                other->name, other_uid,
                p.device == d.name ? ""
                                   : fmt::format(", which holds {} of the same GPU", p.device)));
          }
        }
      }
    }
  }

  return absl::OkStatus();
}

std::string DraState::MpsNamespaceLocked(int gpu, const std::string& except_uid) const {
  for (const auto& [uid, c] : claims_) {
    if (uid == except_uid) continue;
    for (const PreparedDevice& p : c->devices) {
      auto d = by_name_.find(p.device);
      if (d != by_name_.end() && devices_[d->second].gpu == gpu) return c->ns;
    }
  }
  return "";
}

// Long (issue 32 asks for a reason): the regions, then the CDI spec, each request's edits built in
// one loop over the requests; the undo of the regions written is one list. Split, the loop's
// state (the spec being built, the claim's devices, the undo list) would be passed around.
absl::StatusOr<std::vector<PreparedDevice>> DraState::WriteLocked(const std::string& ns,
                                                                  const std::string& name,
                                                                  const std::string& uid,
                                                                  const ClaimAllocation& a) {
  const std::string who = fmt::format("claim {}/{}", ns, name);
  const auto& by_request = a.by_request;
  const auto& admin = a.admin;
  const auto& consumed = a.consumed;
  std::map<std::string, RequestConfig> config = a.config;
  auto made = std::make_unique<Claim>();
  made->ns = ns;
  made->pods = a.pods;
  made->auto_memory = a.auto_memory;
  made->prepared_unix = UnixSeconds(plugin_.clock);
  made->name = name;
  auto undo = [&] {
    for (const std::string& r : made->regions) unlink(r.c_str());
  };
  ordered_json spec;
  spec["cdiVersion"] = "0.3.0";
  spec["kind"] = kCdiClaimKind;
  spec["devices"] = ordered_json::array();
  for (const auto& [request, devs] : by_request) {
    std::vector<int> gpus;  // container ordinal order: the allocation's
    std::map<int, int> per_gpu;
    for (const DraDevice& d : devs) {
      if (per_gpu[d.gpu]++ == 0) gpus.push_back(d.gpu);
    }
    std::vector<std::string> uuids;
    for (int g : gpus) uuids.push_back(inventory_.gpus[g].uuid);
    ContainerEdits edits;
    // The GPUs come as CDI devices (their device nodes): the NVIDIA runtime's legacy hook, where
    // it is the default, must inject none of its own (an image's NVIDIA_VISIBLE_DEVICES=all would
    // give every GPU). CUDA then sees exactly the device nodes, whatever other claims the
    // container has; only a share names its GPUs, in the order its limits are for.
    edits.env["NVIDIA_VISIBLE_DEVICES"] = "void";
    // A request that names a sharing mode is given GPUs in that mode only; an MPS GPU serves one
    // namespace's claims at a time (MPS runs one user's clients per server: the kubelet tries
    // again, and the claim is prepared once the other namespace's claims on it are gone).
    const RequestConfig& rc = config[request];
    for (int g : gpus) {
      const core::GpuSharing mode = SharingOf(plugin_, g);
      if (rc.sharing && *rc.sharing != mode) {
        undo();
        return absl::FailedPreconditionError(fmt::format(
            "{}: request {} asks sharing {} and its GPU {} is in {} mode (select on the device "
            "attribute sharing)",
            who, request, core::GpuSharingName(*rc.sharing), g, core::GpuSharingName(mode)));
      }
      if (mode != core::GpuSharing::kMps) continue;
      if (std::string other = MpsNamespaceLocked(g, uid); !other.empty() && other != ns) {
        undo();
        return absl::FailedPreconditionError(fmt::format(
            "{}: GPU {} is shared by MPS and its server runs namespace {}'s pods; MPS serves one "
            "user's clients at a time, so this claim waits until those end",
            who, g, other));
      }
    }
    // A consumable device taken in part is a share of it: its amounts are the limits.
    bool partial = false;
    for (const DraDevice& d : devs) {
      if (auto c = consumed.find({request, d.name}); c != consumed.end()) {
        const uint64_t total = inventory_.gpus[d.gpu].memory_bytes.value_or(0);
        partial = partial || c->second.compute < 100 || (total > 0 && c->second.memory < total);
      }
    }
    if ((devs.front().share || partial) && !admin.contains(devs.front().name)) {
      edits.env["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(uuids, ",");
      ShareRequest share;
      share.gpus = gpus;
      for (int g : gpus) {
        uint64_t total = inventory_.gpus[g].memory_bytes.value_or(0);
        if (partial) {
          const Consumed& c = consumed.at({request, fmt::format("gpu-{}", g)});
          share.share = std::min(share.share, c.compute / 100.0);
          share.limits.push_back(rc.memory ? std::min(*rc.memory, c.memory) : c.memory);
          continue;
        }
        share.share =
            std::min(share.share, static_cast<double>(per_gpu[g]) / plugin_.shares_per_gpu);
        share.limits.push_back(rc.memory ? *rc.memory
                                         : total / plugin_.shares_per_gpu * per_gpu[g]);
      }
      share.priority = rc.priority.value_or(plugin_.default_priority);
      share.job_id = ShareJobId(uid, request);
      share.region = RegionPath(uid, request);
      if (absl::Status st = ShareEdits(share, inventory_, plugin_, &edits); !st.ok()) {
        undo();
        return absl::Status(st.code() == absl::StatusCode::kFailedPrecondition
                                ? st.code()
                                : absl::StatusCode::kInternal,
                            fmt::format("{}: {}", who, std::string(st.message())));
      }
      made->regions.push_back(share.region);
      made->region_limits[share.region] = share.limits;
      made->region_shares[share.region] = share.share;
    } else if (rc.sharing == core::GpuSharing::kMps && !admin.contains(devs.front().name)) {
      // A whole GPU asked as MPS: its processes are clients of its daemon, all its SMs theirs.
      if (gpus.size() > 1) {
        undo();
        return absl::FailedPreconditionError(fmt::format(
            "{}: request {} asks sharing mps on {} GPUs: a process is the client of one GPU's MPS "
            "server (one request per GPU)",
            who, request, gpus.size()));
      }
      MpsEdits(gpus[0], 1.0, 0, rc.priority.value_or(plugin_.default_priority), plugin_, &edits);
    }
    const std::string cdi_name = fmt::format("{}-{}", uid, request);
    ordered_json cdev;
    cdev["name"] = cdi_name;
    ordered_json env = ordered_json::array();
    for (const auto& [k, v] : edits.env) env.push_back(k + "=" + v);
    cdev["containerEdits"]["env"] = env;
    if (!edits.mounts.empty()) {
      ordered_json mounts = ordered_json::array();
      for (const ContainerMount& m : edits.mounts) {
        ordered_json opts = m.read_only ? ordered_json{"ro", "nosuid", "nodev", "bind"}
                                        : ordered_json{"rw", "nosuid", "nodev", "bind"};
        mounts.push_back(
            {{"hostPath", m.host_path}, {"containerPath", m.container_path}, {"options", opts}});
      }
      cdev["containerEdits"]["mounts"] = mounts;
    }
    spec["devices"].push_back(cdev);
    // The request's own environment rides on its first device only, and each GPU's device (its
    // node, from the node's spec) on the first of its shares: the runtime applies every CDI
    // device it is given, and one copy is enough.
    std::set<int> named;
    for (const DraDevice& d : devs) {
      PreparedDevice p;
      p.requests = {request};
      p.pool = options_.pool;
      p.device = d.name;
      if (named.insert(d.gpu).second) {
        p.cdi_ids.push_back(devices::CdiDeviceName(inventory_.gpus[d.gpu].uuid));
      }
      if (auto c = consumed.find({request, d.name}); c != consumed.end()) {
        p.share_id = c->second.share_id;
        if (!admin.contains(d.name))
          made->uses.push_back({d.name, c->second.memory, c->second.compute});
      }
      if (&d == &devs.front()) p.cdi_ids.push_back(fmt::format("{}={}", kCdiClaimKind, cdi_name));
      made->devices.push_back(std::move(p));
    }
  }
  std::string spec_path = CdiSpecPath(uid);
  if (!by_request.empty()) {
    made->spec = spec.dump(2) + "\n";
    if (absl::Status st = devices::WriteFileAtomically(spec_path, made->spec, 0644); !st.ok()) {
      undo();
      return absl::InternalError(fmt::format("{}: CDI spec: {}", who, std::string(st.message())));
    }
  }
  std::vector<PreparedDevice> answer = made->devices;
  claims_[uid] = std::move(made);
  if (absl::Status st = SaveLocked(); !st.ok()) {
    for (const std::string& r : claims_[uid]->regions) unlink(r.c_str());
    claims_.erase(uid);
    unlink(spec_path.c_str());
    return absl::InternalError(
        fmt::format("{}: checkpoint not written: {}", who, std::string(st.message())));
  }
  spdlog::info("prepared {} (UID {}): {} device(s)", who, uid, answer.size());
  return answer;
}

// Reads the claim's allocation (results, then configuration), checks every device against what is
// prepared, then writes (regions, CDI spec, checkpoint).
absl::StatusOr<std::vector<PreparedDevice>> DraState::Prepare(const std::string& ns,
                                                              const std::string& name,
                                                              const std::string& uid,
                                                              const json& claim) {
  const std::string who = fmt::format("claim {}/{}", ns, name);
  if (std::string got = kube::StringAt(claim, {"metadata", "uid"}); got != uid) {
    return absl::FailedPreconditionError(fmt::format(
        "{}: the API server has UID {}, the kubelet asked for {} (deleted and made again?)", who,
        got.empty() ? "(none)" : got, uid));
  }
  auto a = ReadAllocation(who, claim);
  if (!a.ok()) return a.status();
  core::MutexLock lock(mu_);
  if (auto it = claims_.find(uid); it != claims_.end()) {
    if (!it->second->spec.empty()) {
      if (absl::Status st = RestoreFilesLocked(uid, *it->second); !st.ok()) return st;
      return it->second->devices;
    }
    // Prepared by an agent that kept no spec: prepared again from the claim when its spec is
    // gone (a reboot), so that the kubelet's CDI IDs resolve.
    if (access(CdiSpecPath(uid).c_str(), F_OK) == 0) return it->second->devices;
    std::unique_ptr<Claim> old = std::move(it->second);
    claims_.erase(it);
    absl::Status st = CheckLocked(who, *a);
    auto made =
        st.ok() ? WriteLocked(ns, name, uid, *a) : absl::StatusOr<std::vector<PreparedDevice>>(st);
    if (!made.ok()) claims_[uid] = std::move(old);
    return made;
  }
  if (absl::Status st = CheckLocked(who, *a); !st.ok()) return st;
  return WriteLocked(ns, name, uid, *a);
}

std::optional<std::vector<PreparedDevice>> DraState::PreparedAndPresent(const std::string& uid) {
  core::MutexLock lock(mu_);
  auto it = claims_.find(uid);
  if (it == claims_.end()) return std::nullopt;
  if (it->second->spec.empty()) {
    if (access(CdiSpecPath(uid).c_str(), F_OK) != 0) return std::nullopt;  // read it again
    return it->second->devices;
  }
  if (absl::Status st = RestoreFilesLocked(uid, *it->second); !st.ok()) {
    spdlog::error("claim {}/{}: {}", it->second->ns, it->second->name, std::string(st.message()));
    return std::nullopt;
  }
  return it->second->devices;
}

absl::Status DraState::RestoreFilesLocked(const std::string& uid, const Claim& c) {
  const std::string path = CdiSpecPath(uid);
  std::ifstream in(path);
  std::string now((std::istreambuf_iterator<char>(in)), {});
  if (!in || now != c.spec) {
    if (absl::Status st = devices::WriteFileAtomically(path, c.spec, 0644); !st.ok()) {
      return absl::InternalError(fmt::format("claim {}/{}: CDI spec not written again: {}", c.ns,
                                             c.name, std::string(st.message())));
    }
    spdlog::info("claim {}/{}: CDI spec {} written again (it was {})", c.ns, c.name, path,
                 in ? "changed" : "missing");
  }
  for (const auto& [region, limits] : c.region_limits) {
    if (access(region.c_str(), F_OK) == 0) continue;
    if (absl::Status st = MakeShareRegion(region, limits); !st.ok()) {
      return absl::InternalError(
          fmt::format("claim {}/{}: {}", c.ns, c.name, std::string(st.message())));
    }
    spdlog::info("claim {}/{}: shared region {} made again", c.ns, c.name, region);
  }
  return absl::OkStatus();
}

std::string DraState::arbiter_path() const { return DeviceState::ArbiterPath(plugin_); }

void DraState::OnUnprepare(std::function<void(const std::vector<ShareUse>&)> hook) {
  on_unprepare_ = std::move(hook);
}

absl::Status DraState::Unprepare(const std::string& uid) {
  std::vector<ShareUse> used;
  {
    core::MutexLock lock(mu_);
    auto it = claims_.find(uid);
    if (it == claims_.end()) return absl::OkStatus();
    std::unique_ptr<Claim> gone = std::move(it->second);
    claims_.erase(it);
    if (absl::Status st = SaveLocked(); !st.ok()) {
      claims_[uid] = std::move(gone);
      return absl::InternalError(
          fmt::format("checkpoint not written: {}", std::string(st.message())));
    }
    std::string spec = CdiSpecPath(uid);
    if (unlink(spec.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("claim {}: CDI spec {} not removed: {}", uid, spec, strerror(errno));
    }
    // What each share request used, read before its region goes: a request whose region the
    // claim made, with its devices' GPUs in their order.
    const int64_t now = UnixSeconds(plugin_.clock);
    for (const PreparedDevice& d : gone->devices) {
      auto dev = by_name_.find(d.device);
      for (const std::string& request : d.requests) {
        const std::string region = RegionPath(uid, request);
        if (std::ranges::find(gone->regions, region) == gone->regions.end()) continue;
        auto u = std::ranges::find(used, request, &ShareUse::request);
        if (u == used.end()) {
          used.push_back({.ns = gone->ns,
                          .name = gone->name,
                          .request = request,
                          .pods = gone->pods,
                          .auto_memory = gone->auto_memory});
          used.back().head = shim::ReadRegionHead(region.c_str());
          u = used.end() - 1;
          u->arbiter_job = ShareJobId(uid, request);
          auto share = gone->region_shares.find(region);
          u->share = share == gone->region_shares.end() ? 0 : share->second;
          u->sliced = u->share > 0;
          if (gone->prepared_unix > 0)
            u->held_s = static_cast<double>(std::max<int64_t>(0, now - gone->prepared_unix));
        }
        if (dev == by_name_.end()) continue;
        const int gpu = devices_[dev->second].gpu;
        const std::string& uuid = inventory_.gpus[gpu].uuid;
        if (std::ranges::find(u->gpus, uuid) == u->gpus.end()) {
          u->gpus.push_back(uuid);
          u->indices.push_back(gpu);
          u->sliced = u->sliced && !IsMps(plugin_, gpu);
        }
      }
    }
    for (const std::string& r : gone->regions) unlink(r.c_str());
    spdlog::info("unprepared claim {}/{} (UID {})", gone->ns, gone->name, uid);
  }
  if (on_unprepare_ && !used.empty()) on_unprepare_(used);
  return absl::OkStatus();
}

bool DraState::SetHealth(int gpu, bool healthy, const std::string& reason) {
  core::MutexLock lock(mu_);
  if (gpu < 0 || gpu >= static_cast<int>(healthy_.size())) return false;
  if (healthy_[gpu] == healthy && reasons_[gpu] == reason) return false;
  healthy_[gpu] = healthy;
  reasons_[gpu] = healthy ? "" : reason;
  feed_.Bump();
  return true;
}

bool DraState::healthy(int gpu) const {
  core::MutexLock lock(mu_);
  return gpu >= 0 && gpu < static_cast<int>(healthy_.size()) && healthy_[gpu];
}

std::string DraState::health_reason(int gpu) const {
  core::MutexLock lock(mu_);
  return gpu >= 0 && gpu < static_cast<int>(reasons_.size()) ? reasons_[gpu] : "";
}

uint64_t DraState::generation() const { return feed_.generation(); }

uint64_t DraState::WaitForChange(uint64_t seen, std::chrono::milliseconds timeout) const {
  return feed_.WaitForChange(seen, timeout);
}

void DraState::Shutdown() { feed_.Shutdown(); }

absl::Status DraState::SaveLocked() const {
  json j;
  j["version"] = kCheckpointVersion;
  j["driver"] = options_.driver;
  j["claims"] = json::object();
  for (const auto& [uid, c] : claims_) {
    json devs = json::array();
    for (const PreparedDevice& d : c->devices) devs.push_back(DeviceJson(d));
    json uses = json::array();
    for (const Claim::Use& u : c->uses) {
      uses.push_back({{"device", u.device}, {"memory", u.memory}, {"compute", u.compute}});
    }
    j["claims"][uid] = {{"namespace", c->ns},
                        {"name", c->name},
                        {"devices", devs},
                        {"regions", c->regions},
                        {"region_limits", c->region_limits},
                        {"region_shares", c->region_shares},
                        {"prepared_unix", c->prepared_unix},
                        {"spec", c->spec},
                        {"uses", uses},
                        {"pods", c->pods},
                        {"auto_memory", c->auto_memory}};
  }
  return devices::WriteFileAtomically(checkpoint_path(), j.dump(2) + "\n", 0600);
}

absl::Status DraState::Load() {
  const std::string path = checkpoint_path();
  // Truncated or garbled (a full disk, a crash of an older agent): set aside, and the claims
  // prepared again as the kubelet and the API server ask (Agent: RebuildDra).
  std::string aside;
  auto read = ReadCheckpointOrSetAside(path, kCheckpointVersion, "claims", &aside);
  if (!read.ok()) return read.status();
  if (!aside.empty()) {
    core::MutexLock lock(mu_);
    set_aside_ = aside;
    return absl::OkStatus();
  }
  const json& j = *read;
  if (j.is_null()) return absl::OkStatus();
  try {
    core::MutexLock lock(mu_);
    for (const auto& [uid, e] : j.at("claims").items()) {
      auto c = std::make_unique<Claim>();
      c->ns = e.at("namespace").get<std::string>();
      c->name = e.at("name").get<std::string>();
      c->regions = e.at("regions").get<std::vector<std::string>>();
      for (const json& d : e.at("devices")) c->devices.push_back(DeviceFromJson(d));
      c->spec = e.value("spec", "");
      if (const json* l = e.contains("region_limits") ? &e["region_limits"] : nullptr) {
        c->region_limits = l->get<std::map<std::string, std::vector<uint64_t>>>();
      }
      if (const json* r = e.contains("region_shares") ? &e["region_shares"] : nullptr)
        c->region_shares = r->get<std::map<std::string, double>>();
      c->prepared_unix = e.value("prepared_unix", int64_t{0});
      c->pods = e.value("pods", std::vector<std::string>{});  // none in an earlier agent's
      c->auto_memory = e.value("auto_memory", false);
      for (const json& u : e.value("uses", json::array())) {
        c->uses.push_back({u.at("device").get<std::string>(), u.at("memory").get<uint64_t>(),
                           u.at("compute").get<int>()});
      }
      bool here = std::all_of(c->devices.begin(), c->devices.end(),
                              [&](const PreparedDevice& d) { return by_name_.contains(d.device); });
      if (!here) {
        // Kept anyway: the kubelet will unprepare it, and its files are to be removed then.
        spdlog::warn("DRA checkpoint: claim {}/{} names devices this node no longer publishes",
                     c->ns, c->name);
      }
      claims_[uid] = std::move(c);
    }
    spdlog::info("DRA checkpoint {}: {} prepared claim(s)", path, claims_.size());
    // After a reboot the CDI folder (tmpfs) is empty: every prepared claim's spec is written
    // again now, before the kubelet starts the pods that name it.
    for (const auto& [uid, c] : claims_) {
      if (c->spec.empty()) continue;
      if (absl::Status st = RestoreFilesLocked(uid, *c); !st.ok()) {
        spdlog::error("{}", std::string(st.message()));
      }
    }
  } catch (const json::exception& e) {
    auto aside = SetCheckpointAside(path, e.what());
    if (!aside.ok()) return aside.status();
    core::MutexLock lock(mu_);
    claims_.clear();
    set_aside_ = *aside;
  }
  return absl::OkStatus();
}

std::string DraState::set_aside() const {
  core::MutexLock lock(mu_);
  return set_aside_;
}

}  // namespace tessera::agent
