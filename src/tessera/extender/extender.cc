#include "tessera/extender/extender.h"

#include <time.h>

#include <algorithm>
#include <unordered_set>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"
#include "tessera/kube/object.h"

namespace tessera::extender {
namespace {

using kube::FieldAt;
using kube::StringAt;
using nlohmann::json;

constexpr char kNoAgent[] =
    "no Tessera GPUs: the node has no tessera.io/gpus annotation (is tessera agent running there?)";

std::string PodId(const json& pod) {
  std::string ns = StringAt(pod, {"metadata", "namespace"});
  return (ns.empty() ? "default" : ns) + "/" + StringAt(pod, {"metadata", "name"});
}

// RFC 3339 seconds ("2026-11-23T10:00:00Z"); 0 when absent or malformed.
// An RFC 3339 time in seconds (whole: what Kubernetes writes); `fallback` when absent or bad.
double TimeAt(const json& pod, std::initializer_list<const char*> path, double fallback) {
  std::string t = StringAt(pod, path);
  struct tm tm {};
  if (t.empty() || strptime(t.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return fallback;
  return static_cast<double>(timegm(&tm));
}

double CreationSeconds(const json& pod) {
  return TimeAt(pod, {"metadata", "creationTimestamp"}, 0);
}

bool Terminal(const json& pod) {
  std::string phase = StringAt(pod, {"status", "phase"});
  return phase == "Succeeded" || phase == "Failed";
}

// What of a node the scheduling model is built from, health left out (that changes in place).
std::string Fingerprint(const NodeGpusInfo& n) {
  std::string f = fmt::format("{}|{}|{}|{}", n.spec.cpu_milli, n.spec.memory_mib, n.shares_per_gpu,
                              n.spec.topology.size());
  for (const auto& g : n.spec.gpus) {
    f += fmt::format("|{},{},{}.{},{},{},{}", g.model, g.memory_mib, g.compute_capability.major,
                     g.compute_capability.minor, g.numa_node, g.uuid,
                     core::GpuSharingName(g.sharing));
  }
  for (int i = 0; i < n.spec.topology.size(); ++i) {
    for (int j = 0; j < n.spec.topology.size(); ++j) {
      f += "," + core::LinkLabel(n.spec.topology.link(i, j));
    }
  }
  return f;
}

std::string WaitKind(const std::string& why) {
  // A gang whose victims are stopping waits for preemption, not for its members.
  if (why.find("preempted job(s) to stop") != std::string::npos) return "preemption";
  if (why.rfind("gang", 0) == 0) return "gang";
  if (why.rfind("quota", 0) == 0) return "quota";
  if (why.find("preempt") != std::string::npos) return "preemption";
  return "no-fit";
}

}  // namespace

Extender::Extender(ExtenderOptions options, const core::Clock& clock)
    : options_(std::move(options)), clock_(clock) {
  // Evicted pods do not come back under their name (their controller makes new ones): no requeue.
  engine_ = std::make_unique<sched::Engine>(
      std::make_unique<sched::Scheduler>(options_.scheduler), executor_,
      sched::EngineOptions{
          .cycle = options_.cycle,
          .requeue_preempted = false,
          .requeue_unhealthy = false,
          // A pod is predicted from its own workload's runs, never another's of its shape.
          .predict_from_kind_only = true});
}

// ---- the model ----

sched::NodeId Extender::AddToModel(const std::string& name, const NodeRec& n) {
  auto id = engine_->scheduler().AddNode(n.info.spec);
  if (!id.ok()) {
    spdlog::error("extender: node {} left out of the model: {}", name,
                  std::string(id.status().message()));
    return -1;
  }
  for (size_t g = 0; g < n.info.healthy.size(); ++g) {
    if (!n.info.healthy[g])
      (void)engine_->scheduler().SetGpuHealth(*id, static_cast<int>(g), false);
  }
  return *id;
}

std::vector<sched::Allocation> Extender::RemoveFromModel(const std::string& name) {
  sched::NodeId id = engine_->scheduler().state().FindNode(name);
  if (id < 0) return {};
  auto released = engine_->RemoveNode(id);
  if (!released.ok()) return {};
  for (const sched::Allocation& a : *released) {
    auto it = pods_.find(a.id);
    if (it == pods_.end()) continue;
    it->second.allocated = false;
    it->second.reserved_at = -1;
    reserved_.erase(a.id);
    // A bound pod still runs there: it is accounted again when the node is back.
    if (it->second.node == name) unaccounted_[name].insert(a.id);
  }
  return *std::move(released);
}

int Extender::SharesPerGpu() const {
  for (const auto& [name, n] : nodes_) {
    if (n.info.shares_per_gpu > 0) return n.info.shares_per_gpu;
  }
  return 0;
}

void Extender::OnNode(kube::EventType type, const json& node) {
  if (type == kube::EventType::kBookmark) return;
  std::string name = StringAt(node, {"metadata", "name"});
  if (name.empty()) return;
  core::MutexLock lock(mu_);
  auto it = nodes_.find(name);
  std::optional<NodeGpusInfo> info;
  if (type != kube::EventType::kDeleted) {
    auto parsed = NodeOf(node);
    if (!parsed.ok()) {
      spdlog::warn("extender: node {} has no usable GPUs for Tessera: {}", name,
                   std::string(parsed.status().message()));
    } else if (parsed->has_agent && !parsed->spec.gpus.empty()) {
      info = std::move(*parsed);
    }
  }
  if (!info) {
    if (it != nodes_.end()) {
      spdlog::info("extender: node {} {}", name,
                   type == kube::EventType::kDeleted ? "deleted" : "no longer has Tessera GPUs");
      for (const sched::Allocation& a : RemoveFromModel(name)) {
        spdlog::warn("extender: pod {} lost its GPUs: node {} is gone", a.id, name);
      }
      nodes_.erase(it);
      ++nodes_version_;
      ++node_updates_;
    }
    return;
  }
  std::string fp = Fingerprint(*info);
  if (it == nodes_.end()) {
    ++nodes_version_;
    NodeRec& n = nodes_[name];
    n.info = std::move(*info);
    n.fingerprint = std::move(fp);
    if (AddToModel(name, n) < 0) {
      nodes_.erase(name);
      return;
    }
    ++node_updates_;
    spdlog::info("extender: node {} with {} GPUs", name, n.info.spec.gpus.size());
    AccountWaiting(name);
    return;
  }
  NodeRec& n = it->second;
  if (n.fingerprint != fp) {
    // Another machine behind the name (GPUs, capacity or links changed): the node is taken out and
    // added anew in place; its pods keep their GPUs where they still fit, the queue and everyone's
    // fair-share use stay.
    spdlog::info("extender: node {} changed its GPUs; updating the model", name);
    std::map<std::string, double> reserved_at;  // pods reserved there, not yet bound
    for (const std::string& id : reserved_) {
      auto p = pods_.find(id);
      if (p != pods_.end() && p->second.reserved_node == name)
        reserved_at[id] = p->second.reserved_at;
    }
    std::vector<sched::Allocation> held = RemoveFromModel(name);
    n.info = std::move(*info);
    n.fingerprint = std::move(fp);
    ++node_updates_;
    const sched::NodeId id = AddToModel(name, n);
    for (sched::Allocation& a : held) {
      a.node = id;
      absl::Status st =
          id < 0 ? absl::NotFoundError("the node is out of the model") : engine_->Restore(a);
      auto p = pods_.find(a.id);
      if (p == pods_.end()) continue;
      if (!st.ok()) {
        spdlog::warn("extender: pod {} lost its GPUs on the changed node {}: {}", a.id, name,
                     std::string(st.message()));
        continue;
      }
      p->second.allocated = true;
      if (p->second.node == name) Unwait(name, a.id);
      if (auto r = reserved_at.find(a.id); r != reserved_at.end()) {
        p->second.reserved_at = r->second;
        reserved_.insert(a.id);
      }
    }
    // Bound pods whose GPUs moved (by UUID) or did not fit where they were.
    AccountWaiting(name);
    return;
  }
  if (n.info.healthy != info->healthy) {
    sched::NodeId id = engine_->scheduler().state().FindNode(name);
    for (size_t g = 0; g < info->healthy.size() && id >= 0; ++g) {
      if (g < n.info.healthy.size() && n.info.healthy[g] == info->healthy[g]) continue;
      spdlog::info("extender: node {} GPU {} is now {}", name, g,
                   info->healthy[g] ? "healthy" : "unhealthy");
      (void)engine_->scheduler().SetGpuHealth(id, static_cast<int>(g), info->healthy[g]);
    }
    n.info.healthy = info->healthy;
  }
}

void Extender::OnPodGroup(kube::EventType type, const json& group) {
  if (type == kube::EventType::kBookmark) return;
  std::string key = PodId(group);
  core::MutexLock lock(mu_);
  if (type == kube::EventType::kDeleted) {
    pod_groups_.erase(key);
    placed_gangs_.erase(key);
    return;
  }
  const json* m = FieldAt(group, {"spec", "minMember"});
  int min = m && m->is_number_integer() ? m->get<int>() : 0;
  if (min < 1 || min > 10000) {
    spdlog::warn("extender: PodGroup {}: spec.minMember must be 1..10000; ignored", key);
    pod_groups_.erase(key);
    return;
  }
  pod_groups_[key] = min;
}

absl::StatusOr<PodDemand> Extender::DemandOf(const json& pod) {
  auto d = PodDemandOf(pod, SharesPerGpu());
  if (!d.ok()) return d.status();
  if (d->request.expected_util_pct > 0) {
    d->request.util_ceiling_pct = options_.utilization_ceiling_pct;
    d->request.util_ceiling_strict = options_.utilization_ceiling_strict;
  }
  std::string ns = StringAt(pod, {"metadata", "namespace"});
  if (ns.empty()) ns = "default";
  if (!d->pod_group.empty()) {
    std::string key = ns + "/" + d->pod_group;
    auto g = pod_groups_.find(key);
    if (g == pod_groups_.end()) {
      return absl::InvalidArgumentError(
          fmt::format("pod {}: label {} names pod group {}, but there is no PodGroup {} "
                      "(scheduling.x-k8s.io/v1alpha1)",
                      PodId(pod), kPodGroupLabel, d->pod_group, key));
    }
    d->request.gang = key;
    d->request.gang_size = g->second;
  }
  // A gang already started: later pods of its group (beyond minMember) are placed on their own.
  if (!d->request.gang.empty() && placed_gangs_.contains(d->request.gang)) {
    d->request.gang.clear();
    d->request.gang_size = 0;
  }
  SizeAuto(*d);
  return d;
}

void Extender::NoteTypical(const core::Request& r) {
  if (typical_fixed_ || options_.typical_refresh_pods <= 0) return;
  seen_requests_.push_back(r);
  if (seen_requests_.size() > 4096)
    seen_requests_.erase(seen_requests_.begin(), seen_requests_.begin() + 2048);
  ++seen_since_refresh_;
  // Refreshed at 1, 2, 4, ... pods seen, then every typical_refresh_pods.
  size_t due = std::min<size_t>(options_.typical_refresh_pods,
                                std::max<size_t>(1, seen_requests_.size() / 2));
  if (seen_since_refresh_ < due) return;
  seen_since_refresh_ = 0;
  typical_ = sched::TypicalRequests(seen_requests_);
  engine_->scheduler().SetTypicalRequests(typical_);
}

void Extender::SetTypicalRequests(std::vector<sched::TypicalRequest> typical) {
  core::MutexLock lock(mu_);
  typical_ = std::move(typical);
  typical_fixed_ = true;
  engine_->scheduler().SetTypicalRequests(typical_);
}

void Extender::Release(const std::string& id, PodRec& p, const char* why) {
  if (p.allocated) {
    if (const sched::Allocation* a = engine_->scheduler().state().Find(id)) {
      spdlog::info("extender: pod {} gives back GPUs {} of {}: {}", id, fmt::join(a->gpus, ","),
                   engine_->scheduler().state().node_name(a->node), why);
    }
    engine_->Ended(id);
  }
  p.allocated = false;
  p.binding = false;
  p.reserved_at = -1;
  p.reserved_node.clear();
  reserved_.erase(id);
}

void Extender::Forget(std::unordered_map<std::string, PodRec>::iterator it, const char* why) {
  if (!it->second.node.empty()) Unwait(it->second.node, it->first);
  const std::string node = it->second.allocated ? it->second.node : "";
  Release(it->first, it->second, why);
  engine_->Cancel(it->first);
  pods_.erase(it);
  // Room made where bound pods wait to be counted (over-committed by another scheduler).
  if (!node.empty() && unaccounted_.contains(node)) AccountWaiting(node);
}

std::unordered_map<std::string, Extender::PodRec>::iterator Extender::Track(const std::string& id,
                                                                            const json& pod,
                                                                            PodDemand demand) {
  PodRec p;
  p.uid = StringAt(pod, {"metadata", "uid"});
  p.demand = std::move(demand);
  p.created = CreationSeconds(pod);
  p.seq = ++seq_;
  auto it = pods_.emplace(id, std::move(p)).first;
  NoteTypical(it->second.demand.request);
  return it;
}

void Extender::OnPod(kube::EventType type, const json& pod) {
  if (type == kube::EventType::kBookmark) return;
  core::MutexLock lock(mu_);
  OnPodLocked(type, pod);
}

void Extender::OnPodLocked(kube::EventType type, const json& pod) {
  std::string id = PodId(pod);
  std::string uid = StringAt(pod, {"metadata", "uid"});
  std::string node = StringAt(pod, {"spec", "nodeName"});
  if (!node.empty()) {
    if (auto u = unread_.find(node); u != unread_.end()) {
      u->second.erase(id);  // read again below, or gone
      if (u->second.empty()) unread_.erase(u);
    }
  }
  auto it = pods_.find(id);
  const bool other =
      it != pods_.end() && !uid.empty() && !it->second.uid.empty() && uid != it->second.uid;
  if (type == kube::EventType::kDeleted) {
    learned_.erase(uid);
  } else if (Terminal(pod)) {
    LearnUse(pod);
  }
  if (type == kube::EventType::kDeleted || Terminal(pod)) {
    // (the end of an older pod of the same name is no news)
    if (it != pods_.end() && !other) {
      // A run that succeeded joins the history that predicts the next runs of its kind - unless
      // it was asked to stop (a checkpoint-and-exit cut short is no natural run time).
      if (StringAt(pod, {"status", "phase"}) == "Succeeded" && it->second.started >= 0 &&
          !FieldAt(pod, {"metadata", "deletionTimestamp"})) {
        engine_->history().Add(it->second.demand.kind, std::max(0.0, Now() - it->second.started));
      }
      Forget(it, type == kube::EventType::kDeleted ? "deleted" : "finished");
    }
    return;
  }
  if (other) {
    Forget(it, "replaced by a new pod of the same name");
    it = pods_.end();
  }
  if (it == pods_.end()) {
    auto d = DemandOf(pod);
    if (!d.ok() && !node.empty() && HasTesseraResources(pod)) {
      // Bound already: its gang started (a PodGroup not listed yet changes nothing), and its
      // GPUs must be counted whatever else is not known yet.
      d = PodDemandOf(pod, SharesPerGpu());
      if (!d.ok()) {
        spdlog::info(
            "extender: pod {} runs on {}; its demand is read when a node says how many "
            "shares a GPU has: {}",
            id, node, std::string(d.status().message()));
        unread_[node][id] = pod;
        return;
      }
    }
    if (!d.ok()) return;  // not a Tessera pod, or one filter will explain
    it = Track(id, pod, std::move(*d));
  }
  PodRec& p = it->second;
  if (p.uid.empty()) p.uid = uid;
  if (!node.empty()) {
    if (std::string a = StringAt(pod, {"metadata", "annotations", kube::kAssignmentAnnotation});
        !a.empty()) {
      p.assignment = std::move(a);
    }
  }
  if (!p.node.empty()) {
    p.started = TimeAt(pod, {"status", "startTime"}, p.started);  // the kubelet's, once it says
    if (!p.allocated) Account(id, p);                             // its node may be back
    return;
  }
  if (node.empty()) {
    // Pending: it joins the queue now, not at its first filter, so that a step taken for another
    // pod orders it by its priority and creation as every other executor of the engine does.
    if (!p.allocated && !engine_->cycle().Queued(id)) {
      if (absl::Status st = engine_->Submit(SubmissionOf(p)); !st.ok()) {
        spdlog::warn("extender: pod {} cannot be queued: {}", id, std::string(st.message()));
      } else if (p.pending_since < 0) {
        p.pending_since = Now();
      }
    }
    return;
  }
  // Bound: the reservation is confirmed, or the pod was bound without one.
  p.node = node;
  p.started = TimeAt(pod, {"status", "startTime"}, Now());
  engine_->Cancel(id);
  if (p.allocated) {
    const sched::Allocation* a = engine_->scheduler().state().Find(id);
    if (a && engine_->scheduler().state().node_name(a->node) == node) {
      p.reserved_at = -1;
      reserved_.erase(id);
      return;
    }
    Release(id, p, fmt::format("bound to {}, not to the node reserved", node).c_str());
  }
  Account(id, p);
}

// ---- quotas ----

absl::Status Extender::SetQuotas(const json* configmap) {
  std::map<std::string, sched::OwnerQuota> quotas;
  if (configmap) {
    const json* data = FieldAt(*configmap, {"data", "quotas.yaml"});
    if (!data || !data->is_string()) {
      absl::Status st = absl::InvalidArgumentError(
          fmt::format("ConfigMap {}: no data key quotas.yaml", PodId(*configmap)));
      core::MutexLock lock(mu_);
      quota_error_ = std::string(st.message());
      return st;
    }
    auto parsed = ParseQuotas(data->get<std::string>());
    if (!parsed.ok()) {
      absl::Status st = absl::InvalidArgumentError(fmt::format(
          "ConfigMap {}: {}", PodId(*configmap), std::string(parsed.status().message())));
      core::MutexLock lock(mu_);
      quota_error_ = std::string(st.message());
      return st;
    }
    quotas = std::move(*parsed);
  }
  core::MutexLock lock(mu_);
  quota_error_.clear();
  quotas_ = quotas;
  engine_->scheduler().quotas().Replace(std::move(quotas));
  spdlog::info("extender: {} namespace quota(s) in force", quotas_.size());
  return absl::OkStatus();
}

// ---- the verbs ----

void Extender::ExpireLocked(double now) {
  expired_at_ = now;
  std::vector<std::string> expired;
  for (const std::string& id : reserved_) {
    auto it = pods_.find(id);
    if (it == pods_.end()) {
      expired.push_back(id);
      continue;
    }
    const PodRec& p = it->second;
    if (p.reserved_at >= 0 && p.node.empty() &&
        now - p.reserved_at > options_.reservation_timeout_s) {
      expired.push_back(id);
    }
  }
  std::set<std::string> failed_gangs;
  for (const std::string& id : expired) {
    reserved_.erase(id);
    auto it = pods_.find(id);
    if (it == pods_.end()) continue;
    const std::string& gang = it->second.demand.request.gang;
    if (!gang.empty()) failed_gangs.insert(gang);
    Release(id, it->second, "reservation not bound in time");
    engine_->Cancel(id);
    it->second.queued_kind.clear();
  }
  // A gang runs whole or not at all: when a member's reservation lapsed, the members already bound
  // are stopped too, and the rest of the gang's reservations given back.
  for (const std::string& gang : failed_gangs) {
    placed_gangs_.erase(gang);
    for (auto& [id, p] : pods_) {
      if (p.demand.request.gang != gang || !p.allocated) continue;
      if (p.node.empty()) {
        Release(id, p, "its gang did not bind whole in time");
        continue;
      }
      size_t slash = id.find('/');
      std::string why = "gang " + gang + " did not bind whole in time";
      spdlog::warn("extender: stopping pod {}: {}", id, why);
      evictions_.push_back({id.substr(0, slash), id.substr(slash + 1), p.uid, p.node, why});
    }
  }
}

void Extender::Expire() {
  core::MutexLock lock(mu_);
  ExpireLocked(Now());
}

FilterResult Extender::Explain(const PodRec& p, const std::vector<std::string>& candidates,
                               bool all, const std::string& why) {
  FilterResult out;
  out.reason = why;
  out.wait_kind = WaitKind(why);
  std::unordered_map<std::string, std::string> verdicts;
  if (out.wait_kind == "no-fit") {
    for (auto& [node, v] : engine_->scheduler().Explain(p.demand.request))
      verdicts[node] = std::move(v);
  }
  std::map<std::string, std::vector<std::string>> offered;  // verdict -> offered nodes
  for (const std::string& c : candidates) {
    if (!nodes_.contains(c)) {
      out.unresolvable[c] = kNoAgent;
      continue;
    }
    auto v = verdicts.find(c);
    out.failed[c] = v == verdicts.end() || v->second.rfind("fits", 0) == 0 ? why : v->second;
    offered[out.failed[c]].push_back(c);
  }
  if (out.wait_kind == "no-fit" && !all && !offered.empty()) {
    // The cycle's reason counts the nodes kube-scheduler did not offer as closed ("unhealthy"):
    // said again from the offered nodes' own verdicts.
    std::vector<std::pair<std::string, std::vector<std::string>>> by_count(offered.begin(),
                                                                           offered.end());
    std::stable_sort(by_count.begin(), by_count.end(), [](const auto& a, const auto& b) {
      return a.second.size() > b.second.size();
    });
    std::string reason = fmt::format("of the {} node(s) kube-scheduler offered: ",
                                     candidates.size() - out.unresolvable.size());
    for (size_t i = 0; i < by_count.size() && i < 4; ++i) {
      const auto& [verdict, names] = by_count[i];
      if (i > 0) reason += "; ";
      reason += names.size() == 1
                    ? fmt::format("{}: {}", names[0], verdict)
                    : fmt::format("{} ({} nodes, e.g. {})", verdict, names.size(), names[0]);
    }
    if (by_count.size() > 4) reason += fmt::format("; and {} other reasons", by_count.size() - 4);
    out.reason = std::move(reason);
  }
  return out;
}

bool Extender::CoversAllNodes(const std::unordered_set<std::string>& names) const {
  if (names.size() < nodes_.size()) return false;
  for (const auto& [name, n] : nodes_) {
    if (!names.contains(name)) return false;
  }
  return true;
}

const std::unordered_set<std::string>& Extender::Allowed(const std::vector<std::string>& candidates,
                                                         bool* all) {
  // kube-scheduler offers the same list pod after pod: the set is built once.
  if (candidates != last_candidates_) {
    last_candidates_ = candidates;
    last_allowed_ = std::unordered_set<std::string>(candidates.begin(), candidates.end());
    last_all_version_ = ~uint64_t{0};
  }
  if (last_all_version_ != nodes_version_) {
    last_all_ = CoversAllNodes(last_allowed_);
    last_all_version_ = nodes_version_;
  }
  *all = last_all_;
  return last_allowed_;
}

Extender::Fence::Fence(Extender& ex, const std::unordered_set<std::string>& allowed, bool all)
    : ex_(ex) {
  if (all) return;
  sched::Scheduler& s = ex_.engine_->scheduler();
  for (const auto& [name, n] : ex_.nodes_) {
    if (allowed.contains(name)) continue;
    sched::NodeId nid = s.state().FindNode(name);
    if (nid < 0) continue;
    for (int g = 0; g < s.state().gpu_count(nid); ++g) {
      if (s.state().gpu_use(nid, g).healthy) {
        (void)s.SetGpuHealth(nid, g, false);
        fenced_.emplace_back(nid, g);
      }
    }
  }
}

Extender::Fence::~Fence() {
  for (auto [nid, g] : fenced_) (void)ex_.engine_->scheduler().SetGpuHealth(nid, g, true);
}

FilterResult Extender::Filter(const json& pod, const std::vector<std::string>& candidates) {
  core::MutexLock lock(mu_);
  const double now = Now();
  // Reservations lapse in seconds (reservation_timeout_s): a look over all of them once a
  // second is enough, not at every filter (thousands may be reserved at once).
  if (now - expired_at_ >= std::min(1.0, options_.reservation_timeout_s / 10)) ExpireLocked(now);
  FilterResult out;
  auto d = DemandOf(pod);
  if (!d.ok()) {
    out.error = std::string(d.status().message());
    out.reason = out.error;
    out.wait_kind = "invalid";
    return out;
  }
  const std::string id = d->request.id;
  auto it = pods_.find(id);
  std::string uid = StringAt(pod, {"metadata", "uid"});
  if (it != pods_.end() && !uid.empty() && !it->second.uid.empty() && it->second.uid != uid) {
    Forget(it, "replaced by a new pod of the same name");
    it = pods_.end();
  }
  if (it == pods_.end()) it = Track(id, pod, *d);
  PodRec& p = it->second;
  bool all = false;
  const std::unordered_set<std::string>& allowed = Allowed(candidates, &all);
  if (!p.node.empty()) {
    out.error = fmt::format("pod {} is already bound to {}", id, p.node);
    out.reason = out.error;
    out.wait_kind = "invalid";
    return out;
  }
  if (p.allocated) {
    if (allowed.contains(p.reserved_node)) {
      out.nodes = {p.reserved_node};
      out.reason = "reserved earlier";
      p.reserved_at = now;
      return out;
    }
    // A gang member keeps its node: placed elsewhere alone, it would split the gang that was
    // placed together (kube-scheduler offers a subset when it samples nodes). It waits for that
    // node to be offered; the reservation lapses as any other if it never is, and with it the
    // gang's.
    if (!p.demand.request.gang.empty()) {
      out.reason = fmt::format(
          "reserved with its gang on node {}, which kube-scheduler did not "
          "offer this time",
          p.reserved_node);
      for (const std::string& c : candidates) out.failed[c] = out.reason;
      out.wait_kind = "gang";
      return out;
    }
    Release(id, p, "kube-scheduler no longer offers the node reserved");
  }
  if (!engine_->cycle().Queued(id)) {
    p.demand = std::move(*d);
    if (absl::Status st = engine_->Submit(SubmissionOf(p)); !st.ok()) {
      out.error = std::string(st.message());
      out.reason = out.error;
      out.wait_kind = "invalid";
      return out;
    }
  }
  // Nodes kube-scheduler ruled out take nothing of this pod's (or its gang's): closed while the
  // cycle looks at it alone, the other pods of the step placed as their own filters allowed.
  std::optional<Fence> fence;
  sched::Cycle::Scope scope;
  scope.id = id;
  scope.gang = p.demand.request.gang;
  scope.enter = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { fence.emplace(*this, allowed, all); };
  scope.leave = [&] { fence.reset(); };
  executor_.asking = id;
  executor_.released = false;
  engine_->Step(now, all ? nullptr : &scope);
  // Room made at once (reservations given back, no pod to wait for): taken in the same filter.
  if (executor_.released) engine_->Step(now, all ? nullptr : &scope);
  if (p.allocated) {
    out.nodes = {p.reserved_node};
    out.reason = "placed";
    return out;
  }
  const std::string* why = engine_->cycle().Waiting(id);
  out = Explain(p, candidates, all, why ? *why : "not placed");
  p.queued_kind = out.wait_kind;
  if (p.queued_at < 0) p.queued_at = now;
  if (p.pending_since < 0) p.pending_since = now;
  return out;
}

std::vector<std::pair<std::string, int>> Extender::Prioritize(
    const json& pod, const std::vector<std::string>& candidates) {
  core::MutexLock lock(mu_);
  std::string chosen;
  if (auto it = pods_.find(PodId(pod)); it != pods_.end() && it->second.allocated) {
    chosen = it->second.reserved_node.empty() ? it->second.node : it->second.reserved_node;
  }
  std::vector<std::pair<std::string, int>> out;
  out.reserve(candidates.size());
  for (const std::string& c : candidates) out.emplace_back(c, c == chosen ? 10 : 0);
  return out;
}

absl::StatusOr<BindPlan> Extender::PrepareBind(const std::string& ns, const std::string& name,
                                               const std::string& uid, const std::string& node) {
  core::MutexLock lock(mu_);
  const std::string id = ns + "/" + name;
  auto it = pods_.find(id);
  if (it == pods_.end() || !it->second.allocated) {
    return absl::FailedPreconditionError(fmt::format(
        "pod {} has no GPUs reserved (the extender restarted or the reservation expired); "
        "kube-scheduler will schedule it again",
        id));
  }
  PodRec& p = it->second;
  if (!uid.empty() && !p.uid.empty() && uid != p.uid) {
    return absl::FailedPreconditionError(
        fmt::format("pod {}: UID {} is not the pod the GPUs were reserved for", id, uid));
  }
  const sched::Allocation* a = engine_->scheduler().state().Find(id);
  const std::string reserved = a ? engine_->scheduler().state().node_name(a->node) : "";
  if (reserved != node) {
    Release(id, p, "kube-scheduler binds it elsewhere");
    return absl::FailedPreconditionError(fmt::format(
        "pod {}: its GPUs were reserved on node {}, not {}; released", id, reserved, node));
  }
  const core::NodeSpec& spec = engine_->scheduler().state().node_spec(a->node);
  BindPlan plan;
  plan.pod_id = id;
  plan.assignment.node = node;
  plan.assignment.assigned_unix_ms =
      static_cast<int64_t>(core::Seconds(core::SystemClock::Get().Now()) * 1000);
  size_t next = 0;
  for (const ContainerDemand& c : p.demand.containers) {
    kube::ContainerAssignment ca;
    ca.container = c.container;
    ca.resource = c.resource;
    ca.count = c.count;
    if (c.resource == "tessera.io/gpu") {
      for (int i = 0; i < c.count && next < a->gpus.size(); ++i, ++next) {
        ca.gpus.push_back(spec.gpus[a->gpus[next]].uuid);
      }
    } else if (!a->gpus.empty()) {
      ca.gpus.push_back(spec.gpus[a->gpus[0]].uuid);
      if (a->memory_mib_per_gpu > 0) {
        ca.memory = static_cast<uint64_t>(a->memory_mib_per_gpu) << 20;
      }
    }
    plan.assignment.containers.push_back(std::move(ca));
  }
  // A gang member with a share: the GPUs of its gang's shares on this node, so that the node agent
  // makes the members one gang at the GPU arbiter (their time slices granted together).
  auto has_share = [](const PodDemand& d) {
    return std::any_of(d.containers.begin(), d.containers.end(), [](const ContainerDemand& c) {
      return c.resource == "tessera.io/gpu-share";
    });
  };
  if (const std::string& gang = p.demand.request.gang; !gang.empty() && has_share(p.demand)) {
    std::set<std::string> gpus;
    for (const auto& [qid, q] : pods_) {
      if (!q.allocated || q.demand.request.gang != gang || !has_share(q.demand)) continue;
      const sched::Allocation* qa = engine_->scheduler().state().Find(qid);
      if (qa == nullptr || qa->node != a->node) continue;
      for (int g : qa->gpus) gpus.insert(spec.gpus[g].uuid);
    }
    plan.assignment.gang = gang;
    plan.assignment.gang_gpus.assign(gpus.begin(), gpus.end());
  }
  // Its share's sizing at admission (already on the pod), then its memory's.
  plan.sizing = p.demand.admitted_sizing;
  if (!p.demand.sizing.empty()) plan.sizing += (plan.sizing.empty() ? "" : "; ") + p.demand.sizing;
  // A trial runs its time at most: the kubelet ends it at spec.activeDeadlineSeconds (unless the
  // pod has a shorter one of its own).
  if (const double t = p.demand.trial_s;
      t > 0 && (p.demand.kind.max_runtime_s <= 0 || p.demand.kind.max_runtime_s > t)) {
    plan.trial_s = t;
  }
  p.reserved_at = Now();  // the bind is under way: not expired meanwhile
  p.binding = true;
  return plan;
}

void Extender::BindFailed(const std::string& pod_id, const std::string& why) {
  core::MutexLock lock(mu_);
  auto it = pods_.find(pod_id);
  if (it == pods_.end() || !it->second.node.empty()) return;
  spdlog::warn("extender: bind of pod {} failed: {}", pod_id, why);
  Release(pod_id, it->second, "bind failed");
}

}  // namespace tessera::extender
