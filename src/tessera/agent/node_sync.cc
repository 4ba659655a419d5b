#include "tessera/agent/node_sync.h"

#include <algorithm>
#include <tuple>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/agent/node_labels.h"
#include "tessera/kube/gpu_annotations.h"
#include "tessera/kube/object.h"

namespace tessera::agent {
namespace {

using kube::FieldAt;
using kube::StringAt;
using nlohmann::json;

uint64_t VersionOf(const json& obj) {
  std::string rv = StringAt(obj, {"metadata", "resourceVersion"});
  return rv.empty() ? 0 : std::strtoull(rv.c_str(), nullptr, 10);
}

}  // namespace

std::optional<PodHint> ChooseHint(const std::vector<json>& pods, const std::string& node_name,
                                  Resource r, int count,
                                  const std::map<std::string, std::set<int>>& done,
                                  std::vector<std::string>* problems) {
  const std::string resource(ResourceName(r));
  std::optional<PodHint> best;
  std::tuple<int64_t, std::string, std::string> best_key;
  for (const json& pod : pods) {
    std::string text = StringAt(pod, {"metadata", "annotations", kube::kAssignmentAnnotation});
    if (text.empty()) continue;
    std::string ns = StringAt(pod, {"metadata", "namespace"});
    std::string name = StringAt(pod, {"metadata", "name"});
    std::string uid = StringAt(pod, {"metadata", "uid"});
    std::string phase = StringAt(pod, {"status", "phase"});
    if (!phase.empty() && phase != "Pending") continue;
    if (FieldAt(pod, {"metadata", "deletionTimestamp"})) continue;
    if (StringAt(pod, {"spec", "nodeName"}) != node_name) continue;
    auto a = kube::ParseAssignment(text);
    if (!a.ok()) {
      if (problems)
        problems->push_back(
            fmt::format("pod {}/{}: {}", ns, name, std::string(a.status().message())));
      continue;
    }
    if (!a->node.empty() && a->node != node_name) {
      if (problems) {
        problems->push_back(fmt::format("pod {}/{}: assigned to node {}, but it runs on {}", ns,
                                        name, a->node, node_name));
      }
      continue;
    }
    auto allocated = kube::ParseAllocated(
        StringAt(pod, {"metadata", "annotations", kube::kAllocatedAnnotation}));
    std::set<int> finished = allocated.ok() ? *allocated : std::set<int>{};
    if (auto it = done.find(uid); it != done.end())
      finished.insert(it->second.begin(), it->second.end());
    // The kubelet allocates containers in order: the first one of this resource not yet done.
    for (size_t i = 0; i < a->containers.size(); ++i) {
      const kube::ContainerAssignment& c = a->containers[i];
      if (c.resource != resource || finished.contains(static_cast<int>(i))) continue;
      if (c.count == count) {
        auto key = std::make_tuple(
            a->assigned_unix_ms, StringAt(pod, {"metadata", "creationTimestamp"}), ns + "/" + name);
        if (!best || key < best_key) {
          best_key = key;
          best =
              PodHint{ns,      name,        c.gpus, c.memory, c.priority, uid, static_cast<int>(i),
                      a->gang, a->gang_gpus};
        }
      }
      break;
    }
  }
  return best;
}

bool UnplacedCandidate(const std::vector<json>& pods, const std::string& node_name, Resource r,
                       int count) {
  const std::string resource(ResourceName(r));
  for (const json& pod : pods) {
    if (!StringAt(pod, {"metadata", "annotations", kube::kAssignmentAnnotation}).empty()) continue;
    std::string phase = StringAt(pod, {"status", "phase"});
    if ((!phase.empty() && phase != "Pending") ||
        StringAt(pod, {"spec", "nodeName"}) != node_name) {
      continue;
    }
    if (!pod.contains("spec") || !pod["spec"].is_object()) continue;
    for (const char* list : {"initContainers", "containers"}) {
      if (!pod["spec"].contains(list) || !pod["spec"][list].is_array()) continue;
      for (const json& c : pod["spec"][list]) {
        // Extended resources have limits equal to requests; either names the count.
        for (const char* kind : {"limits", "requests"}) {
          std::string n = c.is_object() ? StringAt(c, {"resources", kind, resource.c_str()}) : "";
          if (!n.empty() && n == std::to_string(count)) return true;
        }
      }
    }
  }
  return false;
}

NodeSync::NodeSync(kube::Client& client, DeviceState& state, NodeSyncOptions options)
    : client_(client), state_(state), options_(std::move(options)) {
  kube::InformerOptions node;
  node.path = "/api/v1/nodes";
  node.field_selector = "metadata.name=" + options_.node_name;
  node_informer_ = std::make_unique<kube::Informer>(
      client_, node, [this](kube::EventType, const json&) { Poke(); });
  kube::InformerOptions pods;
  pods.path = "/api/v1/pods";
  pods.field_selector = "spec.nodeName=" + options_.node_name;
  pod_informer_ =
      std::make_unique<kube::Informer>(client_, pods, [this](kube::EventType t, const json& pod) {
        if (t != kube::EventType::kDeleted) return;
        std::lock_guard lock(mu_);
        done_.erase(StringAt(pod, {"metadata", "uid"}));
      });
  thread_ = std::thread([this] { Run(); });
}

NodeSync::~NodeSync() { Stop(); }

void NodeSync::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (pod_informer_) pod_informer_->Stop();
  if (node_informer_) node_informer_->Stop();
}

void NodeSync::Poke() {
  {
    std::lock_guard lock(mu_);
    dirty_ = true;
  }
  cv_.notify_all();
}

std::optional<PodHint> NodeSync::Hint(Resource r, int count) {
  std::map<std::string, std::set<int>> done;
  {
    std::lock_guard lock(mu_);
    done = done_;
  }
  std::vector<std::string> problems;
  std::optional<PodHint> hint;
  bool unplaced = false;
  if (pod_informer_->synced()) {
    std::vector<json> pods = pod_informer_->Snapshot();
    hint = ChooseHint(pods, options_.node_name, r, count, done, &problems);
    unplaced = !hint && UnplacedCandidate(pods, options_.node_name, r, count);
  }
  if (!hint && !unplaced) {
    // The kubelet may have seen the pod before our watch did: ask the API server itself, briefly.
    kube::ListOptions lo;
    lo.field_selector = "spec.nodeName=" + options_.node_name;
    lo.timeout = options_.hint_list_timeout;
    auto fresh = client_.List("/api/v1/pods", lo);
    if (fresh.ok()) {
      problems.clear();
      hint = ChooseHint(fresh->items, options_.node_name, r, count, done, &problems);
    } else {
      ++counters_.hint_errors;
      spdlog::warn("looking up the extender's choice for an Allocate of {}: {}", ResourceName(r),
                   std::string(fresh.status().message()));
    }
  }
  {
    std::lock_guard lock(mu_);
    for (const std::string& p : problems) {
      if (reported_.insert(p).second) {
        ++counters_.hint_errors;
        spdlog::error("ignoring the extender's choice: {}", p);
      }
    }
    if (reported_.size() > 10000) reported_.clear();
  }
  ++(hint ? counters_.hints_found : counters_.hints_none);
  return hint;
}

void NodeSync::Allocated(const PodHint& hint) {
  if (hint.pod_uid.empty() || hint.container_index < 0) return;
  {
    std::lock_guard lock(mu_);
    done_[hint.pod_uid].insert(hint.container_index);
    marks_.push_back({hint.pod_namespace, hint.pod_name, hint.pod_uid});
  }
  cv_.notify_all();
}

void NodeSync::Used(const std::string& pod_namespace, const std::string& pod_name,
                    std::string use) {
  {
    std::lock_guard lock(mu_);
    marks_.push_back({pod_namespace, pod_name, "", std::move(use)});
  }
  cv_.notify_all();
}

bool NodeSync::WriteUse(const Mark& m) {
  std::string path = fmt::format("/api/v1/namespaces/{}/pods/{}", m.pod_namespace, m.pod_name);
  auto pod = client_.Get(path);
  absl::Status s = pod.status();
  if (pod.ok()) {
    const std::string phase = StringAt(*pod, {"status", "phase"});
    if (phase != "Succeeded" && phase != "Failed") {
      spdlog::info("pod {}/{} is {}: a newer pod of that name, not told the GPU use of the last",
                   m.pod_namespace, m.pod_name, phase.empty() ? "without a phase" : phase);
      return true;
    }
    json patch = {{"metadata", {{"annotations", {{kube::kGpuUseAnnotation, m.use}}}}}};
    s = client_.MergePatch(path, patch).status();
  }
  if (s.code() == absl::StatusCode::kNotFound) return true;  // gone: nobody to tell
  if (!s.ok()) {
    ++counters_.use_errors;
    spdlog::warn("writing the GPU use of pod {}/{}: {}", m.pod_namespace, m.pod_name,
                 std::string(s.message()));
    return false;
  }
  ++counters_.use_marks;
  return true;
}

bool NodeSync::SyncLabels() {
  // Counted every time, logged once per distinct error.
  auto fail = [&](const std::string& err) {
    ++counters_.label_errors;
    labels_current_ = false;
    if (err != last_label_error_) spdlog::error("node labels: {}", err);
    last_label_error_ = err;
    return false;
  };
  std::optional<json> node;
  if (node_informer_->synced()) node = node_informer_->Get(options_.node_name);
  if (!node) {
    auto got = client_.Get("/api/v1/nodes/" + options_.node_name);
    if (!got.ok()) {
      std::string err(got.status().message());
      if (got.status().code() != absl::StatusCode::kNotFound) return fail(err);
      return fail(fmt::format("node {} is not in the API server (is --node-name right?): {}",
                              options_.node_name, err));
    }
    node = *got;
  }
  // Our own last write may not have come back through the watch yet: the newer of the two.
  if (!last_written_.is_null() && VersionOf(last_written_) > VersionOf(*node)) node = last_written_;
  NodeFacts facts;
  facts.inventory = &state_.inventory();
  for (size_t i = 0; i < facts.inventory->gpus.size(); ++i) {
    facts.healthy.push_back(state_.healthy(static_cast<int>(i)));
    facts.sharing.push_back(SharingOf(state_.options(), static_cast<int>(i)));
  }
  facts.shares_per_gpu = state_.serves(Resource::kShare) ? state_.options().shares_per_gpu : 0;
  auto patch = NodePatch(*node, DesiredLabels(facts), DesiredAnnotations(facts));
  if (patch) {
    auto r = client_.MergePatch("/api/v1/nodes/" + options_.node_name, *patch);
    if (!r.ok()) return fail(std::string(r.status().message()));
    ++counters_.label_updates;
    last_written_ = *r;
    if (patch->contains("metadata") && (*patch)["metadata"].contains("labels")) {
      spdlog::info("node {}: labels updated: {}", options_.node_name,
                   (*patch)["metadata"]["labels"].dump());
    }
  }
  if (!last_label_error_.empty()) spdlog::info("node labels: the API server answers again");
  last_label_error_.clear();
  labels_current_ = true;
  return true;
}

bool NodeSync::FlushMarks() {
  for (;;) {
    Mark m;
    std::set<int> done;
    {
      std::lock_guard lock(mu_);
      if (marks_.empty()) return true;
      m = marks_.front();
      if (m.use.empty()) done = done_[m.uid];
    }
    if (!m.use.empty()) {
      if (!WriteUse(m)) return false;
      std::lock_guard lock(mu_);
      if (!marks_.empty()) marks_.pop_front();
      continue;
    }
    // Union with what the pod already says (another agent restart may have written some).
    std::string path = fmt::format("/api/v1/namespaces/{}/pods/{}", m.pod_namespace, m.pod_name);
    auto pod = client_.Get(path);
    absl::Status s = pod.status();
    if (pod.ok()) {
      if (StringAt(*pod, {"metadata", "uid"}) == m.uid) {
        auto have = kube::ParseAllocated(
            StringAt(*pod, {"metadata", "annotations", kube::kAllocatedAnnotation}));
        if (have.ok()) done.insert(have->begin(), have->end());
        json patch = {
            {"metadata",
             {{"annotations", {{kube::kAllocatedAnnotation, kube::FormatAllocated(done)}}}}}};
        s = client_.MergePatch(path, patch).status();
      }
    }
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
      ++counters_.mark_errors;
      spdlog::warn("marking pod {}/{} allocated: {}", m.pod_namespace, m.pod_name,
                   std::string(s.message()));
      return false;
    }
    ++counters_.allocated_marks;
    std::lock_guard lock(mu_);
    if (!marks_.empty()) marks_.pop_front();
  }
}

void NodeSync::Run() {
  std::chrono::milliseconds backoff{0};
  auto next_resync = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_);
  while (!stop_) {
    auto wake = backoff.count() > 0 ? std::chrono::steady_clock::now() + backoff : next_resync;
    cv_.wait_until(lock, wake,
                   [&] { return stop_ || ((dirty_ || !marks_.empty()) && backoff.count() == 0); });
    if (stop_) break;
    bool resync = std::chrono::steady_clock::now() >= next_resync;
    if (!dirty_ && marks_.empty() && !resync && backoff.count() == 0) continue;
    dirty_ = false;
    lock.unlock();
    bool ok = FlushMarks();
    ok = SyncLabels() && ok;
    lock.lock();
    if (ok) {
      backoff = std::chrono::milliseconds(0);
      next_resync = std::chrono::steady_clock::now() + options_.resync;
    } else {
      backoff = std::clamp(backoff * 2, std::chrono::milliseconds(500), options_.max_backoff);
      dirty_ = true;
    }
  }
}

bool NodeSync::api_server_up() const {
  for (const auto* i : {node_informer_.get(), pod_informer_.get()}) {
    if (i == nullptr || !i->synced() || !i->last_error().empty()) return false;
  }
  return true;
}

}  // namespace tessera::agent
