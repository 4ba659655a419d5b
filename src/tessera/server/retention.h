#pragma once
// Retention: what the server keeps of ended jobs, and for how long (the config's retention:
// ages), and an admin's purge now (tessera admin purge). Ended jobs, their logs (every task's)
// and exit files, and their stored environments go once they ended over the age of their kind,
// a page of at most kBatch jobs of each kind at a time, so that no page holds the scheduling lock
// long. Jobs a waiting job's --after names (`keep`) stay whatever their age: it would otherwise
// wait on a job that no longer exists. Retention's own turn (Apply) comes at start, then hourly,
// and every turn while pages come full. It takes no lock: the dispatcher calls it under its
// scheduling lock, as `keep` is what is queued then (retention_test.cc drives it alone against a
// store in a temporary folder).

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/server/store.h"

namespace tessera::server {

// The ages past which each kind goes (unset: that kind stays).
struct PurgeAges {
  std::optional<double> jobs_s, logs_s, environments_s;
};
struct Purged {
  int64_t jobs = 0, logs = 0, environments = 0;
  bool more = false;  // a page was full: there may be more
};

class Retention {
 public:
  static constexpr size_t kBatch = 1000;
  // `ages`: the config's (retention:), for Apply; `state_dir` holds the jobs' logs and exit files.
  Retention(Store& store, std::string state_dir, PurgeAges ages);

  // One page of each kind asked, at `now`; the logs from *logs_from on (moved on past the page).
  // `who` begins its log lines ("retention", "purge").
  absl::StatusOr<Purged> PurgePage(const PurgeAges& ages, double now, const std::set<int64_t>& keep,
                                   Store::Ended* logs_from, const char* who);
  // Whether Apply is due at `now`.
  bool Due(double now) const { return now >= due_; }
  // A page of the config's ages; the next one due in a second while pages come full, otherwise
  // in an hour. A store error is logged (and retried at the next due time).
  void Apply(double now, const std::set<int64_t>& keep);

 private:
  Store& store_;
  std::string state_dir_;
  PurgeAges ages_;
  double due_ = 0;
  Store::Ended logs_removed_to_;  // the logs of the jobs ended up to this one are gone
};

// Removes job `id`'s logs (every task's) and its exit file from `state_dir`.
void RemoveJobFiles(const std::string& state_dir, int64_t id);

}  // namespace tessera::server
