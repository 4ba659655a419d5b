// The extender's bound pods in the model (issue 49): a pod bound to a node holds the GPUs its
// assignment names; one whose node is not in the model yet (listed after the pod, deleted and not
// re-added) or cannot hold them waits in unaccounted_, and is accounted as soon as its node can.
#include <algorithm>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"
#include "tessera/extender/extender.h"

namespace tessera::extender {

using nlohmann::json;

absl::Status Extender::RestoreBound(const std::string& id, PodRec& p) {
  sched::NodeId n = engine_->scheduler().state().FindNode(p.node);
  if (n < 0) {
    return absl::NotFoundError(fmt::format("node {} has no Tessera GPUs", p.node));
  }
  const core::Request& r = p.demand.request;
  const core::NodeSpec& spec = engine_->scheduler().state().node_spec(n);
  sched::Allocation a;
  a.id = id;
  a.node = n;
  a.request = r;
  a.start_time = Now();
  a.milli_per_gpu = r.fractional() ? r.gpu_milli : core::kMilliPerGpu;
  a.memory_mib_per_gpu = r.fractional() ? r.gpu_memory_mib : 0;
  // CPU and memory are kube-scheduler's to check; the GPUs are what the model must hold.
  auto restore = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status st = engine_->Restore(a);
    if (st.ok()) return st;
    sched::Allocation gpus_only = a;
    gpus_only.request.cpu_milli = 0;
    gpus_only.request.memory_mib = 0;
    return engine_->Restore(gpus_only);
  };
  const int want = r.gpu_count();
  // The GPUs from the assignment written at bind (by UUID: a node whose GPUs changed order keeps
  // them), else the first with room (a pod bound by another scheduler, or whose annotation was
  // lost, or whose GPUs are held by one bound on top of it).
  if (!p.assignment.empty()) {
    auto as = kube::ParseAssignment(p.assignment);
    if (as.ok() && as->node == p.node) {
      for (const auto& c : as->containers) {
        // A share counts the memory it was given (sized "auto" then, maybe otherwise now).
        if (c.memory && r.fractional()) {
          a.memory_mib_per_gpu = static_cast<int64_t>(*c.memory >> 20);
          a.request.gpu_memory_mib = a.memory_mib_per_gpu;
        }
        for (const std::string& uuid : c.gpus) {
          for (size_t g = 0; g < spec.gpus.size(); ++g) {
            if (spec.gpus[g].uuid == uuid &&
                std::find(a.gpus.begin(), a.gpus.end(), static_cast<int>(g)) == a.gpus.end()) {
              a.gpus.push_back(static_cast<int>(g));
            }
          }
        }
      }
    }
    if (static_cast<int>(a.gpus.size()) == want) {
      absl::Status st = restore();
      if (st.ok()) {
        p.allocated = true;
        return st;
      }
      spdlog::warn(
          "extender: pod {}: GPUs {} of {} named by its assignment cannot be held ({}); "
          "counted on others with room",
          id, fmt::join(a.gpus, ","), p.node, std::string(st.message()));
    }
  }
  a.gpus.clear();
  for (int g = 0; g < static_cast<int>(spec.gpus.size()) && static_cast<int>(a.gpus.size()) < want;
       ++g) {
    const sched::GpuUse& u = engine_->scheduler().state().gpu_use(n, g);
    if (u.milli + a.milli_per_gpu <= core::kMilliPerGpu &&
        u.memory_mib + a.memory_mib_per_gpu <= spec.gpus[g].memory_mib) {
      a.gpus.push_back(g);
    }
  }
  absl::Status st = restore();
  if (st.ok()) p.allocated = true;
  return st;
}

void Extender::Unwait(const std::string& node, const std::string& id) {
  auto u = unaccounted_.find(node);
  if (u == unaccounted_.end()) return;
  u->second.erase(id);
  if (u->second.empty()) unaccounted_.erase(u);
}

void Extender::Account(const std::string& id, PodRec& p) {
  absl::Status st = RestoreBound(id, p);
  if (!st.ok()) {
    auto [at, added] = unaccounted_[p.node].insert(id);
    if (added) {
      spdlog::info(
          "extender: pod {} runs on {}; its GPUs are accounted when the node can hold "
          "them: {}",
          id, p.node, std::string(st.message()));
    }
    return;
  }
  Unwait(p.node, id);
  if (!p.demand.pod_group.empty()) {
    // A gang with a bound member has started: later pods of its group place on their own.
    placed_gangs_.insert(p.demand.request.owner + "/" + p.demand.pod_group);
  }
  spdlog::info("extender: pod {} found bound to {} (GPUs {})", id, p.node,
               fmt::join(engine_->scheduler().state().Find(id)->gpus, ","));
}

void Extender::AccountWaiting(const std::string& node) {
  if (auto u = unread_.find(node); u != unread_.end()) {
    std::map<std::string, json> pods = std::move(u->second);
    unread_.erase(u);
    for (const auto& [id, pod] : pods) OnPodLocked(kube::EventType::kModified, pod);
  }
  auto u = unaccounted_.find(node);
  if (u == unaccounted_.end()) return;
  std::vector<std::string> named, unnamed;
  for (const std::string& id : u->second) {
    auto p = pods_.find(id);
    if (p == pods_.end()) continue;
    (p->second.assignment.empty() ? unnamed : named).push_back(id);
  }
  for (const auto* ids : {&named, &unnamed}) {
    for (const std::string& id : *ids) {
      auto p = pods_.find(id);
      if (p != pods_.end() && !p->second.allocated && p->second.node == node)
        Account(id, p->second);
    }
  }
}

}  // namespace tessera::extender
