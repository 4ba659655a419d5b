#pragma once
// The scheduling engine: everything Tessera decides about running work, in one place, for its
// three drivers - `sim replay`, the standalone server and the Kubernetes extender. It owns the
// Scheduler (the cluster and its allocations), the Cycle (the queue, backfill, preemption plans,
// victims being stopped), the one run-time and utilization predictor (sched::DurationPredictor) and
// the rules around them: what a request is expected to take, how many starts one step makes, and
// whether a stopped allocation goes back to the queue. A driver is an Executor: it carries out the
// engine's starts and stops, supplies the time and tells the engine what happened (arrivals, ends,
// stops, node changes). Nothing else decides.
//
// Not thread-safe (the driver serializes its calls); the predictor alone may be fed from another
// thread (history()).

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/sched/cycle.h"
#include "tessera/sched/predictor.h"
#include "tessera/sched/scheduler.h"

namespace tessera::sched {

// What a driver carries out. Called from inside Engine::Step, which must not be re-entered; a
// callback may tell the engine of ends and stops (Ended, Stopped) and submit (Submit).
class Executor {
 public:
  virtual ~Executor() = default;
  // Run queued request `id` on `allocation` (already recorded in the Scheduler). When it ends the
  // driver calls Engine::Ended, or Engine::Stopped if it was stopped for a reason the requeue rules
  // name.
  virtual void Start(const std::string& id, const Allocation& allocation, double now) = 0;
  // Stop these running allocations to make room for queued request `for_id` (`reason` says so for
  // the victims' records). They keep their resources until the driver reports each one stopped
  // (Engine::Stopped); meanwhile `for_id` waits for exactly them.
  virtual void Stop(const std::vector<std::string>& victims, const std::string& for_id,
                    const std::string& reason, double now) = 0;
  // Whether this driver resizes running work: its elastic requests that are resizable (core::
  // Request::resizable). The others (core::Request::gpus_max) start on the most GPUs up to their
  // maximum that fit when they start, if no queued request wants a GPU then (else on their
  // minimum), all of them their own, and keep that size to their end (Slurm's --nodes MIN-MAX).
  virtual bool Resizes() const { return false; }
  // Resize running elastic request `id` to `holds`: every GPU it holds now, its own and those it
  // grew onto (Engine::Holding). Grown, the new GPUs are already recorded as its own; shrunk, the
  // GPUs it gives up stay its own until the driver calls Engine::Resized(id) (the job checkpointed
  // and runs on `holds` alone). Called only when Resizes().
  virtual void Resize(const std::string& id, const Allocation& holds, double now) {
    (void)id, (void)holds, (void)now;
  }
};

// Why a running allocation was stopped, for the requeue rules.
enum class StopCause {
  kPreempted,  // a victim of preemption
  kUnhealthy,  // its GPU failed
};

struct EngineOptions {
  CycleOptions cycle;
  // Whether a stopped allocation goes back to the queue (under its id, with its submission time and
  // sequence, so it keeps its place), by cause; a request's own Submission::requeue overrides.
  bool requeue_preempted = true;
  bool requeue_unhealthy = false;
  // Whether the engine queues it again itself (the simulator) or only says so and the driver
  // submits it again through its own admission (the server: its store, holds and limits).
  bool requeue_through_driver = false;
  // History predicts a named job from its own name's (or command's) runs alone
  // (DurationPredictor's kind_only): the server; the simulator's traces take the shape keys too.
  bool predict_from_kind_only = false;
  // Starts one Step makes at most (0: no limit): those with GPUs first (an idle GPU costs most),
  // then the rest in queue order; a gang whole or not at all. The others stay queued, placed again
  // at the next Step.
  size_t max_starts_per_step = 0;
  std::string max_starts_setting = "the limit per step";  // how the waiting reason names it
  // Interference-aware sharing: a share whose history shows it busy counts its predicted
  // utilization against this ceiling per GPU (core::Request::util_ceiling_pct); 0: off.
  int utilization_ceiling_pct = 0;
  bool utilization_ceiling_strict = false;
};

// A request as submitted to the engine: QueueEntry plus what history knows it by.
struct Submission {
  QueueEntry entry;
  std::optional<RunKind> kind;  // none: no prediction (the request's own expectations stand)
  std::optional<bool> requeue;  // its own wish when stopped; none: the engine's rules
};

class Engine {
 public:
  Engine(std::unique_ptr<Scheduler> scheduler, Executor& executor, EngineOptions options = {});
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request, its expected run time and utilization filled from history first (Expect)
  // when it says its kind. The Cycle's errors (kAlreadyExists, kInvalidArgument).
  absl::Status Submit(Submission s);
  // Takes a request out of the queue; false when it was not queued.
  bool Cancel(const std::string& id);

  // One pass at time `now`: the Executor is told what to start and what to stop. Returns the
  // number of starts. `scope`: one request narrowed (Cycle::Scope).
  size_t Step(double now, const Cycle::Scope* scope = nullptr);
  // Starts the last Step put off (max_starts_per_step): the driver steps again soon.
  size_t deferred() const { return deferred_; }

  // A running allocation ended (finished, failed, cancelled, given back): its resources are free.
  // false when it was not running.
  bool Ended(const std::string& id);
  // A running allocation stopped for `cause`: its resources are free, and it goes back to the
  // queue when the rules (or its own wish) say so - queued here, unless requeue_through_driver.
  // Returns whether it goes back.
  bool Stopped(const std::string& id, StopCause cause);
  // Elastic requests (core::Request::gpus_max) that are resizable, when the Executor Resizes(): a
  // started one grows, at the end of a Step, onto free GPUs of its node - only when no queued
  // request wants a GPU, and within its owner's quota - as a second allocation (GrownId:
  // reclaimable, the lowest priority, no CPU or memory of its own) that quotas and fair share count
  // as its. A queued request that can use them plans preemption as it would (preemption on: without
  // it nothing grows), finds the grown GPUs the cheapest victims, whatever its priority or owner,
  // and the engine asks the request to shrink (Executor::Resize) instead of stopping anyone whole:
  // by the grown GPUs in the room the queued request's plan waits for, keeping the others (a
  // request that counted on a victim already asked to stop for another plans again once that one
  // shrank, which may shrink it further). The GPUs stay held until the driver says it shrank
  // (Resized); meanwhile the queued request waits for exactly them, as for any victim. Ending or
  // stopping a request releases what it grew onto.
  //
  // A shrink asked of `id` is done: the GPUs it gave back are free (what it keeps past its minimum
  // stays grown onto). false when none was asked.
  bool Resized(const std::string& id);
  // What running request `id` holds now: its allocation and the GPUs it grew onto, in one
  // allocation (its request's gpus the total); nullopt when it is not running here.
  std::optional<Allocation> Holding(const std::string& id) const;
  // The id of the allocation of the GPUs elastic request `id` grew onto.
  static std::string GrownId(const std::string& id) { return id + "+grown"; }
  // Whether `id` was asked to shrink and has not yet said it did.
  bool Shrinking(const std::string& id) const { return shrinking_.contains(id); }
  // Elastic `id` keeps the size it runs at (it did not answer a resize to grow): what it grew onto
  // is free again, and it is neither grown nor shrunk from now on. false when it was not resized.
  bool FixSize(const std::string& id);

  // Records an allocation decided earlier (a server re-adopting its running jobs, the extender
  // learning of a pod bound before it started): Scheduler::Restore. With its submission, it can be
  // queued again when stopped, as if it had started here. An elastic request of whole GPUs that
  // started larger holds what its allocation lists (its request's gpus that many, up to its
  // maximum); one resized while it runs holds its first `gpus` as its own and the rest as grown
  // onto (they are given back first).
  absl::Status Restore(const Allocation& a, std::optional<Submission> s = std::nullopt);
  // Takes a node out (Cycle::RemoveNode): its allocations are released and returned.
  absl::StatusOr<std::vector<Allocation>> RemoveNode(NodeId node);

  // Fills `r`'s expected duration and, for a share under a utilization ceiling, its expected
  // utilization, from the history of runs of `kind`. A prediction from runs replaces what `r` says;
  // a bound from its max runtime only fills an unknown duration.
  void Expect(core::Request& r, const RunKind& kind) const;
  // A successful run of `kind` joins the history (thread-safe).
  DurationPredictor& history() { return history_; }
  const DurationPredictor& history() const { return history_; }

  Scheduler& scheduler() { return *scheduler_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  const Cycle& cycle() const { return cycle_; }
  // The queued ids whose reason or expected start changed (Cycle::TakeNoted; with
  // cycle.note_changes).
  std::vector<std::string> TakeNoted() { return cycle_.TakeNoted(); }
  const EngineOptions& options() const { return options_; }

 private:
  // Queues `s` (Submit) with `waiting` as its reason until the next Step looks.
  absl::Status Queue(Submission s, std::string waiting);
  // Takes `it`'s submission out of queued_ (it started, was cancelled or is queued again).
  Submission Unqueue(std::unordered_map<std::string, Submission>::iterator it);
  // The elastic request whose grown GPUs `allocation_id` are; nullptr when it is none.
  const std::string* GrownOf(const std::string& allocation_id) const;
  // The GPUs of grown allocation `grown_id` (a victim of `d`) outside the room `d` waits for: what
  // the elastic request keeps when it shrinks. Empty (all given back) when the room takes none.
  std::vector<int> KeptFrom(const CycleDecision& d, const std::string& grown_id) const;
  // Asks elastic `id` to give back what it grew onto but `keep` (once until Resized).
  void Shrink(const std::string& id, std::vector<int> keep, double now);
  // `own` with `more` GPUs of its node as well (sorted; its request's gpus the total).
  static Allocation WithGpus(Allocation own, const std::vector<int>& more);
  // Whether elastic `r` is resized while it runs: it is resizable and the driver resizes.
  bool Resizing(const core::Request& r) const;
  // Whether elastic requests may grow now (see Resized).
  bool MayGrow() const;
  // Places elastic `own`, just placed for its minimum, on the most GPUs up to its maximum that fit
  // now within its owner's own quota (the policies choosing where): the part past its minimum as
  // its grown allocation when `grown`, else all of them its own (its request's gpus that many);
  // false, `own` as it was, when no larger size fits.
  bool PlaceLarger(Allocation& own, bool grown, double now);
  // The allocation of `gpus` that elastic `own` grew onto (GrownId, reclaimable, on its node, its
  // share per GPU, GrownRequest), from `now`.
  static Allocation GrownAllocation(const Allocation& own, std::vector<int> gpus, double now);
  // The request of what elastic `r` grew onto: `gpus` of them, reclaimable, the lowest priority.
  static core::Request GrownRequest(const core::Request& r, int gpus);
  // Grows the running elastic requests onto free GPUs (see Resized).
  void Grow(double now);
  // Forgets elastic `id` and frees the GPUs it grew onto (it ended, stopped or left).
  void ForgetElastic(const std::string& id);

  std::unique_ptr<Scheduler> scheduler_;
  Executor& executor_;
  EngineOptions options_;
  Cycle cycle_;
  DurationPredictor history_;
  // Requests as submitted (before Expect), to queue them again: while in the cycle's queue, and
  // once started until Ended or Stopped.
  std::unordered_map<std::string, Submission> queued_, running_;
  // How many of queued_ want a GPU (MayGrow at every step without a walk of the queue).
  size_t queued_for_gpus_ = 0;
  // Running elastic requests (ordered: growth is deterministic), and those asked to shrink with
  // the grown GPUs each keeps.
  std::set<std::string> elastic_;
  std::map<std::string, std::vector<int>> shrinking_;
  size_t deferred_ = 0;
};

}  // namespace tessera::sched
