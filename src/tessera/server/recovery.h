#pragma once
// Recovery: what a server starting on a state folder makes of the jobs its store says were
// queued, running or preempted when the last server stopped (killed, crashed, upgraded, or the
// machine rebooted). Each such job ends up in exactly one place:
// - queued (and held, if it was), at its place by its submission time;
// - preempted: queued again when its spec (or the server's requeue_preempted) says so, its
//   re-queue recorded first; otherwise left as it is;
// - running, its process alive (the same pid and start time: a pid reused by another process is
//   not the job's): adopted with the GPUs its placement names; if they cannot be had (another
//   adopted job holds them), its process group is killed and it is recorded lost;
// - running, its process gone: ended, with the exit code its exit file holds (written by the
//   runner at its end) or lost when there is none, the exit file removed, and a container left
//   behind by a killed podman client removed; an elastic job asked to resize (its stop or resize
//   file) that ended so is queued again at its place;
// - a stored spec that no longer parses: left as it is, and said.
// It records through the Store and asks the machine through the JobHost; what the server does with
// a queued or adopted job - its queue, the engine, its tables of running jobs - it asks through
// Recovery::World. recovery_test.cc drives it alone against a store in a temporary folder, a
// FakeJobHost and a World of its own.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "tessera/server/admission.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/running_jobs.h"

namespace tessera::server {

class JobHost;
class Store;
struct JobRecord;

class Recovery {
 public:
  class World {
   public:
    virtual ~World() = default;
    // A job that waits again (queued or re-queued).
    virtual void Enqueue(QueuedJob q) = 0;
    // A running job whose process is alive, to be tracked again with its GPUs (its record's
    // placement), still stopping when `stop` says a stop was asked of it (its stop file). An
    // error: it cannot be (the GPUs are held); it is then killed and lost.
    virtual absl::Status Adopt(const JobRecord& r, std::shared_ptr<const JobSpec> spec,
                               std::optional<StopAsked> stop) = 0;
  };
  struct Options {
    std::string state_dir;           // its exit/<id> and stop/<id> files
    bool requeue_preempted = false;  // the server's default (a spec's `requeue` wins)
    bool requeue_unhealthy = false;  // the same for a job stopped for its failed GPU
    bool containers = false;         // podman is there: a container left behind is removed
  };
  struct Counts {
    int queued = 0, adopted = 0, requeued = 0, ended = 0, unreadable = 0, lost = 0;
  };
  Recovery(Store& store, JobHost& host, Options options)
      : store_(store), host_(host), options_(std::move(options)) {}

  // Goes over the stored jobs once, at `now`. Fails only when the store cannot list them.
  absl::StatusOr<Counts> Run(World& world, double now);

 private:
  Store& store_;
  JobHost& host_;
  Options options_;
};

}  // namespace tessera::server
