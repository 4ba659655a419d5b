// The engine's decisions carried out in Kubernetes (Extender::PodExecutor): a start reserves a
// pod's GPUs until kube-scheduler binds it, a stop evicts a running victim or gives back a
// reservation not yet bound; and what kube-scheduler's preempt verb hears of them (the victims the
// engine asked to stop, never a second plan). Under the extender's lock.
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"
#include "tessera/extender/extender.h"

namespace tessera::extender {

using nlohmann::json;

void Extender::PodExecutor::Start(const std::string& id, const sched::Allocation& a, double now) {
  ex.mu_.AssertHeld();
  auto it = ex.pods_.find(id);
  if (it == ex.pods_.end()) return;
  PodRec& p = it->second;
  p.allocated = true;
  p.reserved_at = now;
  p.reserved_node = ex.engine_->scheduler().state().node_name(a.node);
  ex.reserved_.insert(id);
  // Started while kube-scheduler asked about another pod: a pod it found unschedulable before
  // is nudged (a pod update makes it try again now, not after its unschedulable-pod timeout);
  // one it has not tried yet is in its active queue and comes anyway - no API call for it.
  if (id != asking && p.queued_at >= 0) ex.nudges_.emplace_back(id, p.reserved_node);
  p.queued_kind.clear();
  if (!a.request.gang.empty()) ex.placed_gangs_.insert(a.request.gang);
  spdlog::info("extender: pod {} -> node {} GPUs {}{}{}", id, p.reserved_node,
               fmt::join(a.gpus, ","), a.borrowed ? " (on borrowed quota)" : "",
               a.request.gang.empty() ? "" : " gang " + a.request.gang);
}

void Extender::PodExecutor::Stop(const std::vector<std::string>& victims, const std::string&,
                                 const std::string& reason, double) {
  ex.mu_.AssertHeld();
  const sched::ClusterState& state = ex.engine_->scheduler().state();
  for (const std::string& v : victims) {
    auto vi = ex.pods_.find(v);
    if (vi == ex.pods_.end()) continue;
    PodRec& p = vi->second;
    if (p.node.empty() && !p.binding) {
      // Reserved, no bind asked yet: nothing runs to evict (an eviction would delete a pending
      // pod). Its reservation is given back and it waits in its old place in the queue. (Once its
      // bind is under way it may run any moment: it is evicted, as a bound pod is.)
      ex.Release(v, p, ("preempted before it was bound: " + reason).c_str());
      (void)ex.engine_->Submit(SubmissionOf(p));
      released = true;
      continue;
    }
    size_t slash = v.find('/');
    const sched::Allocation* a = state.Find(v);
    Victim victim{v.substr(0, slash), v.substr(slash + 1), vi->second.uid,
                  a ? state.node_name(a->node) : "", reason};
    spdlog::info("extender: preempting pod {} on {}: {}", v, victim.node, reason);
    ex.evictions_.push_back(std::move(victim));
  }
}

PreemptResult Extender::Preempt(const json& pod,
                                const std::map<std::string, std::vector<std::string>>& candidates) {
  core::MutexLock lock(mu_);
  PreemptResult out;
  auto d = DemandOf(pod);
  if (!d.ok()) {
    out.error = std::string(d.status().message());
    return out;
  }
  if (auto it = pods_.find(d->request.id); it != pods_.end() && it->second.allocated) {
    return out;  // it has its GPUs: nothing to preempt for
  }
  // Preemption is the cycle's: what its filter step asked to stop for this pod, on the node its
  // plan chose, is the answer - never a second plan (one pod, one set of victims).
  std::optional<sched::Cycle::Awaited> awaited = engine_->cycle().Awaiting(d->request.id);
  if (!awaited) {
    spdlog::info("extender: no preemption for pod {}: {}", d->request.id,
                 engine_->cycle().Queued(d->request.id) ? *engine_->cycle().Waiting(d->request.id)
                                                        : "not queued (no filter yet)");
    return out;
  }
  const std::string node = engine_->scheduler().state().node_name(awaited->node);
  if (!candidates.contains(node)) {
    spdlog::info("extender: pod {}: Tessera preempts on {}, which kube-scheduler did not offer",
                 d->request.id, node);
    return out;
  }
  std::vector<std::string>& uids = out.victims[node];
  for (const std::string& v : awaited->victims) {
    auto it = pods_.find(v);
    if (it != pods_.end() && !it->second.uid.empty()) uids.push_back(it->second.uid);
  }
  spdlog::info("extender: pod {}: preempt on {}: {}", d->request.id, node,
               fmt::join(awaited->victims, ", "));
  return out;
}

std::vector<std::pair<std::string, std::string>> Extender::TakeNudges() {
  core::MutexLock lock(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  out.swap(nudges_);
  return out;
}

std::vector<Victim> Extender::TakeEvictions() {
  core::MutexLock lock(mu_);
  std::vector<Victim> out;
  out.swap(evictions_);
  return out;
}

}  // namespace tessera::extender
