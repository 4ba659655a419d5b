#include "tessera/server/views.h"

#include <utility>

namespace tessera::server {

Views::Views()
    : view_(std::make_shared<const MachineView>()),
      capped_(std::make_shared<const CappedUsers>()) {}

std::shared_ptr<const MachineView> Views::machine() const {
  core::MutexLock lock(mu_);
  return view_;
}

void Views::Publish(MachineView v, const std::vector<QueueChange>& queue_changes,
                    std::vector<std::pair<int64_t, QueuedView>> queued_facts,
                    std::shared_ptr<const CappedUsers> capped) {
  auto next = std::make_shared<MachineView>(std::move(v));
  core::MutexLock lock(mu_);
  next->version = view_->version + 1;
  for (const auto& [id, in] : queue_changes) {
    if (in) {
      queued_.try_emplace(id);
    } else {
      queued_.erase(id);
    }
  }
  for (auto& [id, q] : queued_facts) {
    if (auto it = queued_.find(id); it != queued_.end()) it->second = std::move(q);
  }
  if (capped) capped_ = std::move(capped);
  view_ = std::move(next);
}

Views::Lookup Views::Find(int64_t id) const {
  Lookup l;
  core::MutexLock lock(mu_);
  l.view = view_;
  if (auto q = queued_.find(id); q != queued_.end()) {
    l.queued = q->second;
    l.capped = capped_;
  }
  if (auto it = view_->active.find(id); it != view_->active.end()) l.active = &it->second;
  return l;
}

}  // namespace tessera::server
