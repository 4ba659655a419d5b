#pragma once
// JobEnds: what a job's end means, and its record. The dispatcher takes an ended job out of
// RunningJobs (running_jobs.h) and frees its GPUs in the engine under its scheduling lock; then,
// without that lock, JobEnds:
// - reads the job's last GPU use (a share's arbiter count and region peak) and its cgroup's
//   accounting (CPU time, peak memory, OOM kills), and removes what it left behind (its region,
//   cgroup, private /tmp and /dev/shm, a container whose client was stopped);
// - decides the end (EndOf: succeeded, failed and why, cancelled, preempted and re-queued, lost);
// - adds a success's run time to the history before the end is recorded, so that whoever sees it
//   ended finds it there;
// - records the end in the Store. When the disk is full it gives up its reserve (a file of
//   kReserveBytes in the state folder, its blocks allocated) for the end; when even that fails the
//   end is kept, the job's exit file with it (a restart still tells how it ended), and recorded at
//   a later Tend once there is room. While the reserve is given up, disk_full() says so (the
//   dispatcher refuses submits: 507) until Tend makes it again.
// A re-queued job is recorded queued again and handed back to the dispatcher to enqueue.
// Record and Tend are the dispatcher's loop thread's (one at a time); disk_full may be read from
// any thread. job_ends_test.cc drives it alone against a FakeJobHost and a store in a temporary
// folder.

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/server/admission.h"
#include "tessera/server/auto_size.h"
#include "tessera/server/cgroup.h"
#include "tessera/server/job_host.h"
#include "tessera/server/running_jobs.h"
#include "tessera/server/store.h"

namespace tessera::sched {
class DurationPredictor;
}  // namespace tessera::sched
namespace tessera::server {

// A job whose process ended, as the dispatcher hands it over, and what came of its record.
struct Ending {
  RunningJob run;
  int exit_code = -1;
  bool exit_known = false;
  bool requeue_wanted = false;       // stopped, and the engine's rules put it back in the queue
  bool cgroup_left = false;          // its cgroup could not be removed yet (retry later)
  std::optional<QueuedJob> requeue;  // recorded queued again: to be enqueued
};

// What a job's end teaches the history that predicts run times and sizes "auto" jobs - the one
// rule for an end as it happens (JobEnds::Record) and for the ends a restart reads back from the
// store (Dispatcher::LoadHistory):
// - a trial (`trial`: stopped at its time): its use, under its kind and its "auto" kind
//   (TrialKinds), not its cut-short run time;
// - a success: its run time, utilization and peak GPU memory under its kind;
// - a failure: only what it needed past its automatic memory size;
// its memory, for a trial or a success, the larger of its peak and what its limit refused it
// (`outgrown_mib`, from MemoryOutgrownAtEnd; 0: nothing).
struct EndFacts {
  JobState to = JobState::kFailed;
  bool trial = false;
  double run_s = 0;
  std::optional<double> util;
  std::optional<bool> shared_gpu;
  int64_t peak_mib = 0;
  int64_t outgrown_mib = 0;
};
void LearnFromEnd(sched::DurationPredictor& history, const JobSpec& spec, const std::string& owner,
                  const EndFacts& end);

// The end of a job: the state it goes to and why, and whether it is queued again.
struct EndOutcome {
  JobState to = JobState::kFailed;
  std::string reason;
  bool requeue = false;
};
// What `r`'s end means given why it was stopped (RunningJob::stop), its exit code (when known),
// its cgroup's accounting and the engine's rule on re-queueing it.
EndOutcome EndOf(const RunningJob& r, int exit_code, bool exit_known, const CgroupUsage& usage,
                 bool requeue_wanted);

class JobEnds {
 public:
  struct Options {
    std::string state_dir;    // the exit files and the reserve
    bool containers = false;  // jobs may run in containers (one left behind is removed)
    SizingPolicy sizing;      // a job sized automatically that outgrew its size says so
  };
  JobEnds(JobHost& host, Store& store, sched::DurationPredictor& history, Options options);

  // The end of `e.run` at `now`: measured, cleaned up, decided and recorded (or kept, when the
  // disk is full); e.cgroup_left and e.requeue say what is left for the dispatcher.
  void Record(Ending& e, double now);
  // About once a second: records the ends kept, once there is room, then makes the reserve again.
  // Returns the jobs those records queued again (preempted and re-queued), for the dispatcher to
  // enqueue, as Record's e.requeue.
  std::vector<QueuedJob> Tend(double now);
  // Makes the reserve; false (errno set) when it cannot be.
  bool MakeReserve();
  // The reserve has been given up (or could not be made): no new work until Tend makes it again.
  bool disk_full() const { return reserve_used_.load(); }
  void set_disk_full() { reserve_used_ = true; }
  size_t kept() const { return unrecorded_.size(); }

  static constexpr uint64_t kReserveBytes = uint64_t{8} << 20;

 private:
  // An end the store could not record (its disk full), kept for a later Tend.
  struct Unrecorded {
    int64_t id = 0;
    JobState to = JobState::kFailed;
    std::string reason;
    double at = 0;
    TransitionFields fields;
  };
  bool UseReserve();  // true when there was one to give up
  // Job `id`, recorded queued again, as the dispatcher enqueues it; nullopt (said) when its record
  // cannot be read back.
  std::optional<QueuedJob> Requeued(int64_t id, double now);
  void RemoveEndFiles(int64_t id) const;  // its exit and stop files: its end is recorded

  JobHost& host_;
  Store& store_;
  sched::DurationPredictor& history_;
  Options options_;
  std::vector<Unrecorded> unrecorded_;
  std::atomic<bool> reserve_used_{false};
};

// Removes the files user `uid` owns directly in `shm_dir` (not root's, not this process's user's)
// that no live process of that user holds open or mapped (read from `proc_dir`'s fd/ and maps):
// what a user's jobs left in shared memory, once none of them runs. Returns how many went.
size_t RemoveUserShm(const std::string& shm_dir, uint32_t uid,
                     const std::string& proc_dir = "/proc");

}  // namespace tessera::server
