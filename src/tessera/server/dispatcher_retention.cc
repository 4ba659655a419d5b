// Retention: what the server keeps of ended jobs, and for how long (config retention:), and an
// admin's purge now (tessera admin purge).
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

absl::StatusOr<Dispatcher::Purged> Dispatcher::PurgePage(const PurgeAges& ages, double now,
                                                         Store::Ended* logs_from, const char* who) {
  Purged p;
  if (ages.jobs_s) {
    // Never what a waiting job's --after names: it would wait on a job that no longer exists.
    std::set<int64_t> keep;
    for (const auto& [id, q] : admission_.jobs()) {
      for (const Dependency& d : q.spec->after) keep.insert(d.job);
    }
    auto gone = store_->PurgeEnded(now - *ages.jobs_s, keep, kRetentionBatch);
    if (!gone.ok()) return gone.status();
    for (int64_t id : *gone) RemoveJobFiles(id);
    if (!gone->empty())
      spdlog::info("{}: {} jobs that ended over {} ago removed with their logs (jobs {}..{})", who,
                   gone->size(), core::FormatDuration(*ages.jobs_s), gone->front(), gone->back());
    p.jobs = static_cast<int64_t>(gone->size());
    p.more = gone->size() >= kRetentionBatch;
  }
  if (ages.logs_s) {
    // From where the last page stopped, a page at a time.
    auto page = store_->EndedAfter(*logs_from, now - *ages.logs_s, kRetentionBatch);
    if (!page.ok()) return page.status();
    for (const Store::Ended& e : *page) RemoveJobFiles(e.id);
    if (!page->empty()) {
      spdlog::info("{}: logs of {} jobs that ended over {} ago removed", who, page->size(),
                   core::FormatDuration(*ages.logs_s));
      *logs_from = page->back();
    }
    p.logs = static_cast<int64_t>(page->size());
    p.more = p.more || page->size() >= kRetentionBatch;
  }
  if (ages.environments_s) {
    auto n = store_->PurgeEnvironments(now - *ages.environments_s, kRetentionBatch);
    if (!n.ok()) return n.status();
    if (*n > 0)
      spdlog::info("{}: the stored environments of {} jobs that ended over {} ago dropped", who, *n,
                   core::FormatDuration(*ages.environments_s));
    p.environments = *n;
    p.more = p.more || *n >= static_cast<int64_t>(kRetentionBatch);
  }
  return p;
}

void Dispatcher::ApplyRetention(double now) {
  auto age = [](double s) { return s > 0 ? std::optional<double>(s) : std::nullopt; };
  const PurgeAges ages{age(config_.retention_jobs_s), age(config_.retention_logs_s),
                       age(config_.retention_env_s)};
  auto page = PurgePage(ages, now, &logs_removed_to_, "retention");
  if (!page.ok()) spdlog::warn("retention: {}", std::string(page.status().message()));
  // While pages come full, the next turn goes on; else in an hour.
  retention_due_ = now + (page.ok() && page->more ? 1 : 3600);
}

absl::StatusOr<Dispatcher::Purged> Dispatcher::Purge(const PurgeAges& ages, double now) {
  Purged all;
  Store::Ended logs_from;  // the oldest end: every page of logs up to the cutoff
  for (;;) {
    absl::StatusOr<Purged> page;
    {
      core::MutexLock lock(mu_);
      page = PurgePage(ages, now, &logs_from, "purge");
    }
    if (!page.ok()) return page.status();
    all.jobs += page->jobs;
    all.logs += page->logs;
    all.environments += page->environments;
    if (!page->more) return all;
  }
}

}  // namespace tessera::server
