// Retention: what the server keeps of ended jobs, and for how long (config retention:).
#include <unistd.h>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/server/dispatcher.h"

namespace tessera::server {

void Dispatcher::RemoveJobFiles(int64_t id) const {
  unlink(JobFile("logs", id, ".out").c_str());
  unlink(JobFile("logs", id, ".err").c_str());
  // Tasks 1.. of a job of several processes, numbered without gaps.
  for (int t = 1;; ++t) {
    const bool out = unlink(TaskLog(id, t, ".out").c_str()) == 0;
    const bool err = unlink(TaskLog(id, t, ".err").c_str()) == 0;
    if (!out && !err) break;
  }
  unlink(JobFile("exit", id).c_str());
}

void Dispatcher::ApplyRetention(double now) {
  bool more = false;
  if (config_.retention_jobs_s > 0) {
    // Never what a waiting job's --after names: it would wait on a job that no longer exists.
    std::set<int64_t> keep;
    for (const auto& [id, q] : queued_) {
      for (const Dependency& d : q.spec->after) keep.insert(d.job);
    }
    auto gone = store_->PurgeEnded(now - config_.retention_jobs_s, keep, kRetentionBatch);
    if (gone.ok()) {
      for (int64_t id : *gone) RemoveJobFiles(id);
      if (!gone->empty())
        spdlog::info(
            "retention: {} jobs that ended over {} ago removed with their logs (jobs {}..{})",
            gone->size(), core::FormatDuration(config_.retention_jobs_s), gone->front(),
            gone->back());
      more = gone->size() >= kRetentionBatch;
    } else {
      spdlog::warn("retention: {}", std::string(gone.status().message()));
    }
  }
  if (config_.retention_logs_s > 0) {
    // From where the last page stopped (at start: the oldest end), a page at a time.
    const double before = now - config_.retention_logs_s;
    if (auto page = store_->EndedAfter(logs_removed_to_, before, kRetentionBatch); page.ok()) {
      for (const Store::Ended& e : *page) RemoveJobFiles(e.id);
      if (!page->empty()) {
        spdlog::info("retention: logs of {} jobs that ended over {} ago removed", page->size(),
                     core::FormatDuration(config_.retention_logs_s));
        logs_removed_to_ = page->back();
      }
      more = more || page->size() >= kRetentionBatch;
    } else {
      spdlog::warn("retention: {}", std::string(page.status().message()));
    }
  }
  if (config_.retention_env_s > 0) {
    auto n = store_->PurgeEnvironments(now - config_.retention_env_s, kRetentionBatch);
    if (!n.ok()) {
      spdlog::warn("retention: {}", std::string(n.status().message()));
    } else if (*n > 0) {
      spdlog::info("retention: the stored environments of {} jobs that ended over {} ago dropped",
                   *n, core::FormatDuration(config_.retention_env_s));
      more = more || *n >= static_cast<int64_t>(kRetentionBatch);
    }
  }
  retention_due_ = now + (more ? 1 : 3600);
}

}  // namespace tessera::server
