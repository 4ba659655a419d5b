#include "tessera/server/views.h"

#include <utility>

namespace tessera::server {

Views::Views() : view_(std::make_shared<const MachineView>()) {}

std::shared_ptr<const MachineView> Views::machine() const {
  core::MutexLock lock(mu_);
  return view_;
}

void Views::Publish(MachineView v, const std::vector<QueueChange>& queue_changes) {
  auto next = std::make_shared<MachineView>(std::move(v));
  core::MutexLock lock(mu_);
  next->version = view_->version + 1;
  for (const auto& [id, in] : queue_changes) {
    if (in) {
      queued_.insert(id);
    } else {
      queued_.erase(id);
    }
  }
  view_ = std::move(next);
}

Views::Lookup Views::Find(int64_t id) const {
  Lookup l;
  core::MutexLock lock(mu_);
  l.view = view_;
  l.queued = queued_.contains(id);
  if (auto it = view_->active.find(id); it != view_->active.end()) l.active = &it->second;
  return l;
}

}  // namespace tessera::server
