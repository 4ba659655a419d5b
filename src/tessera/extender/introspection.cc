// What the extender tells about itself, for metrics, logs and tests: counts, quota use, a pod's
// allocation and why it waits. Each takes the extender's lock.
#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "tessera/extender/extender.h"

namespace tessera::extender {

Extender::Stats Extender::stats() const {
  core::MutexLock lock(mu_);
  Stats s;
  const sched::ClusterState& st = engine_->scheduler().state();
  s.nodes = static_cast<int>(nodes_.size());
  s.pods = static_cast<int>(pods_.size());
  for (sched::NodeId n = 0; n < st.node_count(); ++n) {
    for (int g = 0; g < st.gpu_count(n); ++g) {
      ++s.gpus;
      s.gpus_healthy += st.gpu_use(n, g).healthy;
      s.gpu_milli_allocated += st.gpu_use(n, g).milli;
    }
  }
  std::set<std::string> gangs;
  const double now = Now();
  for (const auto& [id, p] : pods_) {
    if (p.allocated && p.node.empty()) ++s.reserved;
    if (p.allocated && !p.node.empty()) ++s.bound;
    if (engine_->cycle().Queued(id)) {
      ++s.queued;
      const std::string kind = p.queued_kind.empty() ? "not-yet-considered" : p.queued_kind;
      ++s.pending_by_reason[kind];
      if (p.pending_since >= 0) {
        double& oldest = s.oldest_pending_seconds[kind];
        oldest = std::max(oldest, now - p.pending_since);
      }
      if (!p.demand.request.gang.empty()) gangs.insert(p.demand.request.gang);
    }
  }
  s.gangs_waiting = static_cast<int>(gangs.size());
  s.node_updates = node_updates_;
  for (const auto& [node, ids] : unaccounted_) s.unaccounted += static_cast<int>(ids.size());
  for (const auto& [node, pods] : unread_) s.unaccounted += static_cast<int>(pods.size());
  s.quota_error = quota_error_;
  return s;
}

std::map<std::string, QuotaUse> Extender::quota_use() const {
  core::MutexLock lock(mu_);
  std::map<std::string, QuotaUse> out;
  for (const auto& [ns, q] : quotas_) {
    QuotaUse& u = out[ns];
    u.quota = q;
    u.has_quota = true;
  }
  // Namespaces without a quota appear when they hold GPUs.
  for (const auto& [id, a] : engine_->scheduler().state().allocations()) out[a.request.owner];
  for (auto& [ns, u] : out) u.used = engine_->scheduler().quotas().Used(ns);
  return out;
}

std::optional<sched::Allocation> Extender::AllocationOf(const std::string& pod_id) const {
  core::MutexLock lock(mu_);
  const sched::Allocation* a = engine_->scheduler().state().Find(pod_id);
  if (!a) return std::nullopt;
  return *a;
}

std::optional<std::string> Extender::Waiting(const std::string& pod_id) const {
  core::MutexLock lock(mu_);
  const std::string* w = engine_->cycle().Waiting(pod_id);
  if (!w) return std::nullopt;
  return *w;
}

}  // namespace tessera::extender
