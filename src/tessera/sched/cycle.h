#pragma once
// The scheduling cycle: Tessera's one queue policy, driven by the simulator, the standalone server
// and the Kubernetes extender alike. A Cycle holds the queue of waiting requests; Step(now) walks
// it in order (higher priority first, then earlier submission, then lower sequence number) against
// the Scheduler's cluster state and returns what to do: start a request (its allocation is already
// recorded in the Scheduler), or stop running allocations to make room for one (preemption). What
// is left waiting says why (Waiting()). The cycle executes nothing and reads no clock: each
// consumer drives it with its own time and carries out its decisions.
//
// Preemption is not instant: a victim keeps its resources until the consumer has seen it stop and
// calls Scheduler::Release (and Enqueue again, to requeue it under the same id). Meanwhile the
// request it was stopped for waits for exactly those victims instead of choosing more, and the GPUs
// its plan counts on (the victims' and any already free) are reserved for it: requests after it in
// the queue are not started on them.
//
// Deterministic for a given Scheduler seed and call sequence. Not thread-safe; the Scheduler it
// drives must outlive it and is changed only through it or with Release/Restore by the same
// consumer.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "tessera/sched/scheduler.h"

namespace tessera::sched {

struct QueueEntry {
  core::Request request;  // request.id names the entry
  double submitted = 0;   // second sort key
  uint64_t seq = 0;       // third sort key: a job number or a trace position
};

struct CycleOptions {
  // Whether a request that fits nowhere may stop lower-priority preemptible allocations
  // (Scheduler::PlanPreemption).
  bool preemption = true;
  // Fair share: > 0 orders requests of equal priority by their owner's recent GPU use first (the
  // GPU-seconds of its allocations, decaying by half every this many seconds), then by submission.
  // 0: off (priority, submission, sequence only).
  double fair_share_half_life_s = 0;
  // Backfill with reservations: the first `reservations` requests in queue order that can start
  // neither now nor by preemption get the place where they will start when running work ends, in
  // the order of its expected end (start + request.expected_duration_s; unknown last), and that
  // time as their expected start. A later request is not placed on reserved GPUs unless it is
  // expected to end before the reservation begins (a request of unknown duration never is). 1 is
  // EASY backfill; more reserve for more of the queue (conservative). 0: none - a later request
  // takes any free GPU, so a large request can wait behind a stream of small ones.
  int reservations = 0;
  // Preemption plans looked for in one Step, at most (for the first blocked requests in queue
  // order, the ones preemption is for): each looks at every node, and a queue of thousands that
  // cannot fit would otherwise cost that for each of them at every step. Later requests wait for a
  // later step. 0: no limit.
  int preemption_plans = 32;
  // Keep which queued requests' Waiting() or ExpectedStart() changed, for TakeNoted (a read model
  // of the queue asks; nobody else pays for it).
  bool note_changes = false;
};

struct CycleDecision {
  enum class Kind { kStart, kPreempt };
  Kind kind = Kind::kStart;
  std::string id;                    // the queued request
  Allocation allocation;             // kStart: where it now runs (recorded in the Scheduler)
  std::vector<std::string> victims;  // kPreempt: allocations to stop, gang mates included
  // kPreempt: victims it waits for too that an earlier request of the pass already asked to stop
  // (not asked twice; an elastic request shrinking is asked to give back this room as well).
  std::vector<std::string> already_stopping;
  std::string reason;  // kPreempt: for the victims' records
  // kPreempt: where the request goes once the victims are gone (the room it waits for).
  NodeId node = -1;
  std::vector<int> gpus;
};

class Cycle {
 public:
  explicit Cycle(Scheduler& scheduler, CycleOptions options = {});
  Cycle(const Cycle&) = delete;
  Cycle& operator=(const Cycle&) = delete;

  // Adds a request to the queue. kAlreadyExists when its id is queued; kInvalidArgument when it is
  // malformed (core::ValidateRequest) or has no id. A victim enqueued again counts as stopped.
  // `waiting`: what Waiting() says until a Step looks at it.
  absl::Status Enqueue(QueueEntry entry, std::string waiting = "not yet considered");
  // Takes a request out of the queue (cancelled); false when it was not queued.
  bool Remove(const std::string& id);

  // Narrows what one queued request (or every member of its gang) may take in a Step: `enter` is
  // called before the cycle looks at it and `leave` after, so that what `enter` closes (the
  // extender marks the nodes kube-scheduler did not offer the pod) is closed for it alone - the
  // other requests of the Step are decided without it, and what it could not get is not
  // remembered against requests of its shape.
  struct Scope {
    std::string id;
    std::string gang;  // its gang, when it has one
    std::function<void()> enter, leave;
  };

  // One pass over the queue at time `now`: the requests started (removed from the queue, their
  // allocations recorded) and the preemptions asked, in queue order. Requests of a shape (resources
  // and priority) that neither fit nor could make room are not tried again in the same pass:
  // nothing is freed during a pass. `scope`: one request narrowed (Scope).
  std::vector<CycleDecision> Step(double now, const Scope* scope = nullptr);

  // Why a queued request waits, as of the last Step that looked at it ("not yet considered"
  // before); nullptr when it is not queued.
  const std::string* Waiting(const std::string& id) const;
  bool Queued(const std::string& id) const { return entries_.contains(id); }
  size_t size() const { return entries_.size(); }
  // Allocations asked to stop whose resources are still held.
  size_t stopping() const { return stopping_.size(); }
  // Victim `allocation_id` gave back what it was asked to, though an allocation of its id stays
  // (an elastic request that keeps part of what it grew onto): no request waits for it now.
  void Stopped(const std::string& allocation_id) { stopping_.erase(allocation_id); }
  // Queued ids in queue order (with fair share: as of the last Step's usage).
  std::vector<std::string> Order() const;
  // An owner's recent GPU use as fair share counts it: decayed GPU-seconds, as of the last Step.
  double Usage(const std::string& owner) const;
  // The victims the cycle asked to stop for a queued request that still hold resources, and the
  // node its plan puts it on; nullopt when it awaits none. What a cluster scheduler's own
  // preemption verb answers for it: the same victims, never a second plan.
  struct Awaited {
    NodeId node = -1;
    std::vector<std::string> victims;
  };
  std::optional<Awaited> Awaiting(const std::string& id) const;

  // Takes a node out of the scheduler (Scheduler::RemoveNode): its allocations are released and
  // returned (the caller requeues or forgets them), victims among them are no longer stopping, and
  // queued requests whose preemption made room there give that room up (planned again at the next
  // Step). kNotFound for an unknown or removed node.
  absl::StatusOr<std::vector<Allocation>> RemoveNode(NodeId node);

  // When a queued request holding a reservation is expected to start, as of the last Step
  // (infinity: reserved, but the running work it waits for has no expected end); nullopt when it
  // holds none.
  std::optional<double> ExpectedStart(const std::string& id) const;
  // With note_changes: the queued ids whose Waiting() or ExpectedStart() changed since the last
  // call, each once (some may have left the queue since): what a read model of the queue
  // refreshes, at the cost of what changed rather than of the queue.
  std::vector<std::string> TakeNoted();

 private:
  // (-priority, submitted, seq, id): std::set order is the queue order.
  using Key = std::tuple<int, double, uint64_t, std::string>;
  struct Entry {
    QueueEntry queued;
    Key key;
    std::string waiting = "not yet considered";
    std::vector<std::string> awaiting;  // victims stopped for it that still hold resources
    NodeId reserved_node = -1;          // while awaiting: where its preemption plan puts it
    std::vector<int> reserved_gpus;
    std::optional<double> expected_start;  // its backfill reservation's time, as of the last Step
    // What the pass's memos know it by (MemoKey; with its duration when reservations are on), and
    // its shape's key for preemption: made once, when it is queued.
    std::string memo, shape_memo;
    // Found no room at the scheduler's state_version() settled_at - 1 (0: not known), with
    // preemption unable to make any and, when `unreservable`, no backfill reservation to be had:
    // while the state is the same, a pass gives it the same answer without asking again.
    uint64_t settled_at = 0;
    bool unreservable = false;
    bool noted = false;  // in noted_
    void GiveUpRoom() {
      reserved_gpus.clear();
      reserved_node = -1;
    }
  };
  // A backfill reservation: where a request that cannot start now will, and from when.
  struct Backfill {
    NodeId node = -1;
    std::vector<int> gpus;
    double start = 0;  // infinity: unknown
    // Work that ends after this would delay it: its start, or now when that is unknown (then
    // nothing may take its GPUs).
    double protect = 0;
    std::string holder;
    std::vector<std::string> phantoms;  // allocations that keep its free GPUs from others this Step
  };
  // Where and when `r` starts if running work ends in the order of its expected end; nullopt when
  // it would not even then. Leaves the scheduler as it found it.
  std::optional<Backfill> Reserve(const core::Request& r, double now);
  // Whether `a` overlaps a backfill reservation that a request ending at `end` would delay.
  static const std::string* Delays(const Allocation& a, double end,
                                   const std::vector<Backfill>& backfill);
  struct Reservation {
    NodeId node;
    const std::vector<int>* gpus;
    const std::string* holder;
  };
  // The holder of a reservation on `a`'s node (room made by preemption: the node's GPUs, CPU and
  // memory are its holder's until it starts), nullptr when none.
  static const std::string* Overlap(const Allocation& a, const std::vector<Reservation>& reserved);
  static Key KeyOf(const QueueEntry& e);
  // Places the whole gang of `first` (its members found in this pass's `order`) or says why not;
  // not on GPUs reserved for earlier requests (`backfill`) that it would delay, nor on a node a
  // preemptor made room on (`reserved`).
  // When it fits nowhere and preemption is on, room is made for all of it (PreemptForGang), and it
  // waits for every victim to stop.
  struct Pass;
  void StepGang(Entry& first, Pass& pass);
  // One queued request (not of a gang) in a Step: waits for its victims, is placed where the
  // pass's reservations allow, else preempts for room, else may get a backfill reservation.
  void StepOne(Entry& e, bool scoped, Pass& pass);
  // Places `r` (ending at `end`) on what the pass's backfill reservations leave it; on failure,
  // sets `reserved_why` when only those reservations keep it from fitting.
  absl::StatusOr<Allocation> PlaceAround(const core::Request& r, double end, Pass& pass,
                                         std::string* reserved_why);
  // Reserves where and when `e` starts (Reserve) and holds its free GPUs with phantoms for the
  // rest of the pass; false when it would not start even as running work ends.
  bool ReserveAhead(Entry& e, Pass& pass);
  // Asks `e`'s victims to stop (a kPreempt in `out`, without those already stopping) and reserves
  // where they make room for it (`node`, `gpus`; in `reserved` for the rest of the Step).
  void AskToStop(Entry& e, std::vector<std::string> victims, NodeId node, std::vector<int> gpus,
                 std::string reason, std::vector<Reservation>& reserved,
                 std::vector<CycleDecision>& out);
  // Plans preemption for every member of a gang on the scheduler's state (undone after); when all
  // find room, asks the victims to stop (a kPreempt per member), reserves each member's node and
  // returns true.
  bool PreemptForGang(const std::vector<Entry*>& members, double now,
                      std::vector<Reservation>& reserved, std::vector<CycleDecision>& out);
  // Whether a victim asked to stop still holds its resources.
  bool StillHeld(const std::string& allocation_id) const;
  // Charges the GPUs running since the last Step to their owners and decays older use.
  void Account(double now);
  // The GPUs each owner holds now (after a Step's starts): the rate of the next interval.
  void SetRate();
  // The queued entries in this Step's order.
  std::vector<Entry*> Ordered() const;
  // Sets what Waiting() and ExpectedStart() say of `e`, noting it (TakeNoted) when that changes.
  void Say(Entry& e, std::string_view why);
  void SetStart(Entry& e, std::optional<double> start);
  void Note(Entry& e);

  Scheduler& scheduler_;
  CycleOptions options_;
  std::map<Key, Entry*> order_;  // into entries_ (its nodes stay put)
  std::unordered_map<std::string, Entry> entries_;
  std::vector<std::string> noted_;  // TakeNoted's
  std::set<std::string> stopping_;  // victims asked to stop, until their allocation is released
  std::unordered_map<std::string, double> usage_;  // owner -> decayed GPU-seconds (fair share)
  std::unordered_map<std::string, double> rate_;   // owner -> GPUs held since the last Step
  double accounted_at_ = -1;
  // A Step at the same instant as the last, unscoped like it, with the scheduler and the queue as
  // it left them, decides nothing (its decisions are made): repeated steps - the extender steps at
  // every filter, the server at every turn - change nothing by being repeated.
  double instant_ = std::numeric_limits<double>::quiet_NaN();  // the last Step's time
  uint64_t queue_version_ = 0, stepped_queue_version_ = 0, stepped_version_ = 0;
  bool last_unscoped_ = false;
};

}  // namespace tessera::sched
