#include "tessera/server/recovery.h"

#include <signal.h>

#include <filesystem>
#include <map>
#include <optional>

#include "absl/status/statusor.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/server/job_ends.h"
#include "tessera/server/job_host.h"
#include "tessera/server/runner.h"
#include "tessera/server/running_jobs.h"
#include "tessera/server/store.h"

namespace tessera::server {

absl::StatusOr<Recovery::Counts> Recovery::Run(World& world, double now) {
  auto jobs = store_.List({JobState::kQueued, JobState::kRunning, JobState::kPreempted});
  if (!jobs.ok()) return jobs.status();
  Counts n;
  // An array's tasks share one spec: parsed once.
  std::map<int64_t, std::shared_ptr<const JobSpec>> array_specs;
  for (const JobRecord& r : *jobs) {
    std::shared_ptr<const JobSpec> spec;
    if (auto it = array_specs.find(r.array_id); r.array_id != 0 && it != array_specs.end())
      spec = it->second;
    if (!spec) {
      auto parsed = ParseJobSpec(r.spec_json);
      if (!parsed.ok()) {
        spdlog::error("job {}: stored spec unreadable ({}); left as is", r.id,
                      std::string(parsed.status().message()));
        ++n.unreadable;
        continue;
      }
      spec = std::make_shared<const JobSpec>(*std::move(parsed));
      if (r.array_id != 0) array_specs[r.array_id] = spec;
    }
    if (r.state == JobState::kPreempted) {
      if (!spec->requeue.value_or(options_.requeue_preempted)) continue;
      if (store_.Transition(r.id, JobState::kQueued, "re-queued after preemption", now).ok())
        ++n.requeued;
    }
    if (r.state == JobState::kQueued || r.state == JobState::kPreempted) {
      QueuedJob q = QueuedJob::Of(r, spec, r.submitted_at);
      q.held = r.state == JobState::kQueued && r.held;
      world.Enqueue(std::move(q));
      ++n.queued;
      continue;
    }
    // Running when the last server stopped.
    const std::string exit_path = JobFilePath(options_.state_dir, "exit", r.id);
    std::optional<StopAsked> stop = ReadStopFile(options_.state_dir, r.id);
    if (r.pid > 0 && host_.Alive(static_cast<pid_t>(r.pid), r.pid_start_time)) {
      if (absl::Status st = world.Adopt(r, spec, stop); !st.ok()) {
        spdlog::warn("job {}: cannot re-adopt its GPUs ({}); stopping it", r.id,
                     std::string(st.message()));
        host_.Signal(static_cast<pid_t>(r.pid), SIGKILL);
        (void)store_.Transition(r.id, JobState::kLost,
                                fmt::format("cannot re-adopt: {}", std::string(st.message())), now);
        ++n.lost;
        continue;
      }
      ++n.adopted;
      spdlog::info("job {}: still running (pid {}), re-adopted", r.id, r.pid);
      continue;
    }
    ++n.ended;
    std::optional<int> code = r.pid > 0 ? ReadExitFile(exit_path) : std::nullopt;
    TransitionFields f;
    f.ended_at = now;
    if (code) f.exit_code = *code;
    if (stop && r.pid > 0) {
      // Stopped before the server went down: its end is what the stop asked (EndOf), not its
      // exit code - a preempted job goes back to the queue by the rules, a cancelled one is
      // cancelled. A trial that ended so measured nothing: the job is tried again.
      RunningJob asked;
      asked.stop = stop->why;
      asked.stop_reason = stop->reason;
      asked.container = !spec->image.empty();
      const bool requeue_wanted = spec->requeue.value_or(
          stop->why == "unhealthy" ? options_.requeue_unhealthy : options_.requeue_preempted);
      EndOutcome end = EndOf(asked, code.value_or(-1), code.has_value(), {}, requeue_wanted);
      end.reason += " (ended while the server was down)";
      if (stop->why == "trial" && spec->trial_s <= 0 && spec->sizing_trial_s > 0)
        end = {JobState::kPreempted, end.reason + ", unmeasured: re-queued to be tried again",
               true};
      if (end.requeue) f.requeue = "re-queued after a stop asked before the server went down";
      if (store_.Transition(r.id, end.to, end.reason, now, f).ok() && end.requeue) {
        world.Enqueue(QueuedJob::Of(r, spec, now));
        ++n.requeued;
      }
    } else if (spec->Resizable() && r.pid > 0 && (!code || *code == kResizeExitCode) &&
               ReadResizeFile(options_.state_dir, r.id)) {
      // Asked to resize by signal, it ended (checkpointed) while the server was down: it goes
      // back to the queue at its place, and starts again on what fits then.
      f.requeue = "re-queued: it ended for its resize while the server was down";
      if (store_
              .Transition(r.id, JobState::kPreempted,
                          fmt::format("ended for its resize ({}) while the server was down",
                                      code ? fmt::format("exit code {}", *code)
                                           : std::string("exit status unknown")),
                          now, f)
              .ok()) {
        world.Enqueue(QueuedJob::Of(r, spec, now));
        ++n.requeued;
      }
    } else if (code) {
      (void)store_.Transition(
          r.id, *code == 0 ? JobState::kSucceeded : JobState::kFailed,
          fmt::format("ended with exit code {} while the server was down", *code), now, f);
    } else {
      (void)store_.Transition(
          r.id, JobState::kLost,
          r.pid > 0 ? "its process ended while the server was down, exit status unknown"
                    : "the server stopped while starting it",
          now, f);
    }
    std::error_code ec;
    std::filesystem::remove(exit_path, ec);
    RemoveStopFile(options_.state_dir, r.id);
    RemoveResizeFile(options_.state_dir, r.id);
    // Its container may have outlived the podman client (killed with the server's group, say).
    if (!spec->image.empty() && options_.containers) host_.RemoveContainer(r.id);
  }
  spdlog::info(
      "recovered: {} queued ({} re-queued after preemption), {} running re-adopted, {} ended while "
      "down, {} lost, {} unreadable",
      n.queued, n.requeued, n.adopted, n.ended, n.lost, n.unreadable);
  return n;
}

}  // namespace tessera::server
