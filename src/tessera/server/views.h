#pragma once
// Views: the server's read models. What the API's job and GPU pages, /metrics, the dashboard's
// streams and the history sampler read of the machine - each GPU's health and allocation and its
// jobs, the jobs started and not ended, the quotas in use, the counts - without the dispatcher's
// scheduling lock, so that a reader never waits for a scheduling pass, a launch or the store.
//
// The contract:
// - One writer, the dispatcher, publishes a whole MachineView (immutable once published, shared by
//   readers) each time it has changed what a view shows, before it lets go of its lock: a reader
//   that comes after a change (a submit's answer, a job's start on the event stream) sees it.
// - Which jobs are queued is kept apart, as jobs come and go (a queue of ten thousand is not copied
//   per publication), and changes with the publication that goes with it: a job moving from the
//   queue to its start is seen queued or started, never neither.
// - A reader holds Views' own lock only to copy a pointer or look up one id; no other lock is ever
//   taken under it.
// - Each queued job's facts (why it waits, its expected start) are kept apart the same way and
//   refreshed only for the jobs whose facts changed (Admission and the cycle note them), so that a
//   pass that changes nothing publishes nothing of ten thousand queued jobs; the users capped in
//   the last pass come whole (they are few).

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "tessera/core/mutex.h"
#include "tessera/sched/quota.h"
#include "tessera/server/admission.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/server_metrics.h"

namespace tessera::server {

// A job started and not ended: being started (its state already says running, its process is not
// known yet) or running.
struct ActiveJob {
  bool starting = false;
  std::shared_ptr<const JobSpec> spec;
  std::string owner;
  std::vector<int> gpus;
  pid_t pid = 0;
  double started = 0;
  std::string stopping;  // why it is being stopped (a starting job: who cancelled it); empty: not
  int gpu_milli = 0;     // a share's compute
  int64_t memory_limit_mib = 0;  // a share's GPU memory limit
  std::string region;            // a share's region file; empty: whole GPUs
};

struct GpuView {
  bool healthy = true;
  std::string reason;
  int32_t milli = 0;          // allocated
  int64_t memory_mib = 0;     // allocated
  std::vector<int64_t> jobs;  // started on it, ascending
};

struct QuotaView {
  std::string kind, name;  // "user" | "group"
  sched::OwnerQuota quota;
  sched::GpuAmount used;
};

// A queued job as a reader sees it.
struct QueuedView {
  std::shared_ptr<const JobSpec> spec;
  std::string owner;
  WaitingFacts facts;  // why it waits: WaitingText(facts, capped users)
  // Its backfill reservation's start (infinity: reserved, its start unknown); nullopt: none.
  std::optional<double> expected_start;
};

struct MachineView {
  uint64_t version = 0;  // set by Views::Publish, one more each time
  std::vector<GpuView> gpus;
  std::map<int64_t, ActiveJob> active;
  std::vector<QuotaView> quotas;
  size_t queued = 0, running = 0;
  SchedulingStats scheduling;  // latency (submit to start) and passes, for /metrics
};

class Views {
 public:
  Views();
  // The last view published (an empty one before the first).
  std::shared_ptr<const MachineView> machine() const;
  // A job that entered the queue (true) or left it (false).
  using QueueChange = std::pair<int64_t, bool>;
  // Publishes `v` with the queue's changes since the last publication, in the order they were
  // made, then the facts of the queued jobs whose facts changed (those no longer queued are
  // skipped), and the users capped (null: unchanged).
  void Publish(MachineView v, const std::vector<QueueChange>& queue_changes,
               std::vector<std::pair<int64_t, QueuedView>> queued_facts = {},
               std::shared_ptr<const CappedUsers> capped = nullptr);
  // What a reader learns of one job at once: the view it was read from, and the job as queued
  // (then it is not in view->active) or as started.
  struct Lookup {
    std::shared_ptr<const MachineView> view;
    std::optional<QueuedView> queued;
    std::shared_ptr<const CappedUsers> capped;  // with `queued`
    const ActiveJob* active = nullptr;          // into *view; null: not started or ended
  };
  Lookup Find(int64_t id) const;

 private:
  mutable core::Mutex mu_;
  std::shared_ptr<const MachineView> view_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<int64_t, QueuedView> queued_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const CappedUsers> capped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::server
