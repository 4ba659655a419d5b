#include "tessera/server/retention.h"

#include <unistd.h>

#include <utility>

#include "spdlog/spdlog.h"
#include "tessera/core/gpu.h"
#include "tessera/server/running_jobs.h"

namespace tessera::server {

void RemoveJobFiles(const std::string& state_dir, int64_t id) {
  unlink(JobFilePath(state_dir, "logs", id, ".out").c_str());
  unlink(JobFilePath(state_dir, "logs", id, ".err").c_str());
  // Tasks 1.. of a job of several processes, numbered without gaps.
  for (int t = 1;; ++t) {
    const bool out = unlink(TaskLogPath(state_dir, id, t, ".out").c_str()) == 0;
    const bool err = unlink(TaskLogPath(state_dir, id, t, ".err").c_str()) == 0;
    if (!out && !err) break;
  }
  unlink(JobFilePath(state_dir, "exit", id).c_str());
  RemoveStopFile(state_dir, id);
}

Retention::Retention(Store& store, std::string state_dir, PurgeAges ages)
    : store_(store), state_dir_(std::move(state_dir)), ages_(ages) {}

absl::StatusOr<Purged> Retention::PurgePage(const PurgeAges& ages, double now,
                                            const std::set<int64_t>& keep, Store::Ended* logs_from,
                                            const char* who) {
  Purged p;
  if (ages.jobs_s) {
    auto gone = store_.PurgeEnded(now - *ages.jobs_s, keep, kBatch);
    if (!gone.ok()) return gone.status();
    for (int64_t id : *gone) RemoveJobFiles(state_dir_, id);
    if (!gone->empty())
      spdlog::info("{}: {} jobs that ended over {} ago removed with their logs (jobs {}..{})", who,
                   gone->size(), core::FormatDuration(*ages.jobs_s), gone->front(), gone->back());
    p.jobs = static_cast<int64_t>(gone->size());
    p.more = gone->size() >= kBatch;
  }
  if (ages.logs_s) {
    // From where the last page stopped, a page at a time.
    auto page = store_.EndedAfter(*logs_from, now - *ages.logs_s, kBatch);
    if (!page.ok()) return page.status();
    for (const Store::Ended& e : *page) RemoveJobFiles(state_dir_, e.id);
    if (!page->empty()) {
      spdlog::info("{}: logs of {} jobs that ended over {} ago removed", who, page->size(),
                   core::FormatDuration(*ages.logs_s));
      *logs_from = page->back();
    }
    p.logs = static_cast<int64_t>(page->size());
    p.more = p.more || page->size() >= kBatch;
  }
  if (ages.environments_s) {
    auto n = store_.PurgeEnvironments(now - *ages.environments_s, kBatch);
    if (!n.ok()) return n.status();
    if (*n > 0)
      spdlog::info("{}: the stored environments of {} jobs that ended over {} ago dropped", who, *n,
                   core::FormatDuration(*ages.environments_s));
    p.environments = *n;
    p.more = p.more || *n >= static_cast<int64_t>(kBatch);
  }
  return p;
}

void Retention::Apply(double now, const std::set<int64_t>& keep) {
  auto page = PurgePage(ages_, now, keep, &logs_removed_to_, "retention");
  if (!page.ok()) spdlog::warn("retention: {}", std::string(page.status().message()));
  // While pages come full, the next turn goes on; else in an hour.
  due_ = now + (page.ok() && page->more ? 1 : 3600);
}

}  // namespace tessera::server
