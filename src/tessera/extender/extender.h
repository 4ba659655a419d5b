#pragma once
// The scheduler extender's decisions (issue 15), with no I/O: the cluster as the API server shows
// it (nodes with the agents' GPUs, Tessera pods, PodGroups, the quota ConfigMap) kept in a
// sched::Scheduler, and kube-scheduler's four verbs answered by the same sched::Cycle the
// simulator and the standalone server drive.
//
// How kube-scheduler's calls map onto the cycle:
// - filter: the pod joins the cycle's queue (priority, then creation time), the cycle steps, and
//   the pod is answered the one node where the cycle started it. Starting means reserving: the
//   allocation is recorded at once, so the next pod's filter sees those GPUs taken. A pod that
//   does not start stays queued and is answered, per node, why not (FailedNodes). A step may also
//   start other queued pods (the rest of a gang when its last member arrives; a pod whose
//   preemption victims are gone): they hold their reservation until kube-scheduler asks again.
// - prioritize: 10 for the reserved node, 0 for the others (the decision was made in filter).
// - bind: the reservation becomes the pod's `tessera.io/assignment` (the service writes it, then
//   the Binding); a reservation not bound within `reservation_timeout_s` is released.
// - preempt: the victims the cycle asked to stop for the pod in its filter step (Cycle::Awaiting)
//   on the node its plan chose, when kube-scheduler offered that node; never a plan of its own.
//   Victims the cycle asks for are also handed to the service to evict (TakeEvictions):
//   kube-scheduler's own preemption only considers lower priorities, so reclaiming borrowed quota
//   at equal priority is ours to do.
//
// The model is a function of what the API server says, whatever the order of its events (issue 49):
// a bound pod seen before its node, before its PodGroup, or while its node is out of the model
// (deleted and not yet re-added, changed) waits, unaccounted, and is accounted as soon as its node
// is in the model, with the GPUs its assignment names. After every event the GPUs allocated are
// the bound pods' (where their nodes are known) plus the reservations, and no GPU is held past its
// capacity.
//
// Thread-safe: one lock around the model (kube-scheduler's filter and bind calls overlap).

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/core/clock.h"
#include "tessera/core/mutex.h"
#include "tessera/extender/admission.h"
#include "tessera/extender/objects.h"
#include "tessera/kube/client.h"
#include "tessera/kube/gpu_annotations.h"
#include "tessera/sched/cycle.h"
#include "tessera/sched/engine.h"
#include "tessera/sched/scheduler.h"

namespace tessera::extender {

struct ExtenderOptions {
  sched::SchedulerConfig scheduler;
  sched::CycleOptions cycle;
  // A pod started (reserved) by the cycle and not bound within this many seconds gives its GPUs
  // back and leaves the queue (kube-scheduler dropped it, or another scheduler took it).
  double reservation_timeout_s = 60;
  // FGD's typical workload: recomputed from the Tessera pods seen, each time this many more have
  // been seen (0: only what SetTypicalRequests gives).
  int typical_refresh_pods = 256;
  // Interference-aware sharing: a share whose pod says its expected GPU utilization
  // (tessera.io/gpu-utilization) goes where its GPU's predicted utilization stays within this
  // percentage, else on the least busy GPU with room (strict: it waits). 0: off.
  int utilization_ceiling_pct = 70;
  bool utilization_ceiling_strict = false;
  // A pod sized "auto" (tessera.io/gpu-memory: auto) gets the 95th percentile of what pods of its
  // kind used plus this margin (percent), rounded up to 256 MiB.
  int auto_size_margin_pct = 20;
};

// An Event the service should post on a pod (the extender does no I/O).
struct Notice {
  std::string ns, name, uid;
  std::string type;  // "Normal" or "Warning"
  std::string reason, action, note;
};

// A filter answer, as kube-scheduler's ExtenderFilterResult has it.
struct FilterResult {
  std::vector<std::string> nodes;                   // the chosen node (empty: none)
  std::map<std::string, std::string> failed;        // may fit later
  std::map<std::string, std::string> unresolvable;  // no Tessera GPUs there: retrying won't help
  std::string error;                                // the pod cannot be placed as written
  // For logs and metrics: why it waits, and its class ("gang", "quota", "preemption", "no-fit",
  // "nodes") when not placed.
  std::string reason;
  std::string wait_kind;
};

// A running pod the cycle asked to stop.
struct Victim {
  std::string ns, name, uid, node;
  std::string reason;
};

struct PreemptResult {
  std::map<std::string, std::vector<std::string>> victims;  // node -> victim pod UIDs
  std::string error;
};

// A bind the service should carry out: write `assignment` on the pod, then create its Binding.
struct BindPlan {
  kube::Assignment assignment;
  std::string pod_id;  // "ns/name"
  std::string sizing;  // sized "auto": how (written on the pod as tessera.io/sizing)
  double trial_s = 0;  // a trial: its spec.activeDeadlineSeconds is set to this first
};

struct QuotaUse {
  sched::GpuAmount used;
  sched::OwnerQuota quota;
  bool has_quota = false;
};

// What a trial pod's end says (Event TrialResult): what it measured and, for a pod on one GPU, the
// shares and memory to ask with `margin_pct` (rounded up to a share of `shares_per_gpu` and 256
// MiB), or a whole GPU.
std::string TrialAdvice(const PodDemand& d, const kube::GpuUse& use, int shares_per_gpu,
                        int margin_pct);
// The same for a DRA pod's trial of `trial_s`: its claims' shares as a part of a GPU and their
// ShareConfig memory, with `margin_pct`.
std::string DraTrialAdvice(double trial_s, const kube::GpuUse& use, int margin_pct);

class Extender {
 public:
  Extender(ExtenderOptions options, const core::Clock& clock);
  Extender(const Extender&) = delete;
  Extender& operator=(const Extender&) = delete;

  // Informer events (`object` is the last state for kDeleted).
  void OnNode(kube::EventType type, const nlohmann::json& node);
  void OnPod(kube::EventType type, const nlohmann::json& pod);
  void OnPodGroup(kube::EventType type, const nlohmann::json& group);
  // The quota ConfigMap (docs/kubernetes.md); nullptr when there is none (no quotas). On error
  // the quotas in force stay and the error names the key and field.
  absl::Status SetQuotas(const nlohmann::json* configmap);
  void SetTypicalRequests(std::vector<sched::TypicalRequest> typical);

  // kube-scheduler's verbs. `candidates`: the nodes kube-scheduler's own filters passed.
  FilterResult Filter(const nlohmann::json& pod, const std::vector<std::string>& candidates);
  std::vector<std::pair<std::string, int>> Prioritize(const nlohmann::json& pod,
                                                      const std::vector<std::string>& candidates);
  // The assignment for a reserved pod, or why not (then its reservation is released and the pod
  // requeued by kube-scheduler). kFailedPrecondition: no reservation or another node.
  // The admission webhook's question (admission.h): the share of `pod`'s container `container`,
  // which asks `asked` shares (0: none), when the pod asks tessera.io/gpu-share "auto": the 95th
  // percentile of the busy share of the ended pods of its kind (its shape with "auto" for its
  // share) plus auto_size_margin_pct, rounded up to whole shares, never more than it asks (a
  // whole GPU's shares when it asks none); a whole GPU when that reaches one. Nothing measured
  // yet: what it asks, else a whole GPU. kUnavailable until a node says how many shares a GPU has.
  absl::StatusOr<ShareSize> SizeShare(const nlohmann::json& pod, size_t container, int asked);
  // The admission webhook's question for a DRA claim asking "auto" (admission.h's ClaimAsk), made
  // for `pod`: sized from the ended pods of the pod's kind whose claims' use their agents wrote
  // (kDraShareShape): its memory the 95th percentile of their peaks plus auto_size_margin_pct,
  // rounded up to 256 MiB; its count of shares their busy share plus that margin, in shares of
  // `shares_per_gpu` (the DRA driver's, DraAdvisor::SharesPerGpu), never more than it asks.
  // Nothing measured yet: what it asks (memory: its shares' part). kUnavailable where a count is
  // "auto" and no node publishes shares yet.
  absl::StatusOr<ClaimSize> SizeClaim(const nlohmann::json& pod, const ClaimAsk& ask,
                                      int shares_per_gpu);
  absl::StatusOr<BindPlan> PrepareBind(const std::string& ns, const std::string& name,
                                       const std::string& uid, const std::string& node);
  // The service could not write the assignment or the Binding: the reservation is released.
  void BindFailed(const std::string& pod_id, const std::string& why);
  // `candidates`: node -> the UIDs of the victims kube-scheduler proposes there.
  PreemptResult Preempt(const nlohmann::json& pod,
                        const std::map<std::string, std::vector<std::string>>& candidates);
  // Victims asked to stop since the last call, for the service to evict. Also the bound members
  // of a gang whose other members' reservations expired: a gang runs whole or not at all.
  std::vector<Victim> TakeEvictions();
  // Pods the cycle started while kube-scheduler was asking about another (the rest of a gang):
  // (pod id, node). The service marks them (annotation tessera.io/reservation), which is a pod
  // update, so kube-scheduler takes them out of its unschedulable queue and asks again.
  std::vector<std::pair<std::string, std::string>> TakeNudges();
  // Events to post: a trial's result, a pod that outgrew its automatic memory.
  std::vector<Notice> TakeNotices();
  // The measured use it has learned (the last kUseRecordsKept ended pods' records, per history
  // kind, at most kUseHistoryBytes), for the service to keep in a ConfigMap across restarts: a
  // JSON array's text, or nullopt when nothing changed since the last call. LoadUseHistory replays
  // such an array into the history (records of pods learned already are skipped, and their pods'
  // later events too); malformed records are skipped and counted in the answer.
  std::optional<std::string> TakeUseHistory();
  int LoadUseHistory(const nlohmann::json& records);
  static constexpr size_t kUseRecordsKept = 2000;
  static constexpr size_t kUseHistoryBytes = 900 * 1024;  // the array's JSON, at most
  // Releases reservations older than the timeout. Filter calls it too.
  void Expire();

  // For metrics, logs and tests.
  struct Stats {
    int pods = 0;   // Tessera pods known: pending, reserved or running
    int nodes = 0;  // with Tessera GPUs
    int gpus = 0;   // on them
    int gpus_healthy = 0;
    int64_t gpu_milli_allocated = 0;
    int queued = 0;                                // pods waiting in the cycle
    int reserved = 0;                              // started, not yet bound
    int bound = 0;                                 // running or bound, holding GPUs
    std::map<std::string, int> pending_by_reason;  // wait_kind -> pods queued
    // wait_kind -> how long the longest-waiting of them has been queued, in seconds
    std::map<std::string, double> oldest_pending_seconds;
    int gangs_waiting = 0;
    uint64_t node_updates = 0;  // nodes added, changed or removed, each in place
    // Bound Tessera pods whose GPUs are not in the model yet: their node is unknown (listed
    // after the pod, deleted and not re-added) or could not hold them.
    int unaccounted = 0;
    std::string quota_error;  // the last quota ConfigMap's error, "" when it was fine
  };
  Stats stats() const;
  std::map<std::string, QuotaUse> quota_use() const;
  // A pod's allocation (reserved or bound), if any.
  std::optional<sched::Allocation> AllocationOf(const std::string& pod_id) const;
  // Why a queued pod waits, if it is queued.
  std::optional<std::string> Waiting(const std::string& pod_id) const;

 private:
  struct NodeRec {
    NodeGpusInfo info;
    std::string fingerprint;  // what changes the scheduling model (not health)
  };
  struct PodRec {
    std::string uid;
    std::string node;         // spec.nodeName ("" while pending)
    PodDemand demand;         // when tessera
    bool allocated = false;   // holds an allocation in the scheduler
    double reserved_at = -1;  // >= 0: reserved by filter, not bound yet
    std::string reserved_node;
    uint64_t seq = 0;           // arrival order (queue tie-break)
    std::string queued_kind;    // wait kind while queued
    double created = 0;         // metadata.creationTimestamp, seconds (queue order)
    double queued_at = -1;      // its first filter that left it waiting
    double pending_since = -1;  // when this extender first queued it (informer or filter)
    double started = -1;        // since when it runs (status.startTime, else when seen bound)
    bool binding = false;       // a bind to its reserved node is under way or done (PrepareBind)
    std::string assignment;     // its tessera.io/assignment annotation, once bound
  };

  // While it lives, the GPUs of nodes outside `allowed` count as unhealthy: nothing is placed or
  // planned there. Nodes whose GPUs are sick already stay so. Held only while the cycle looks at
  // the pod that asked (sched::Cycle::Scope), never around a whole step.
  class Fence {
   public:
    Fence(Extender& ex, const std::unordered_set<std::string>& allowed, bool all)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(ex.mu_);
    ~Fence();

   private:
    Extender& ex_;
    std::vector<std::pair<sched::NodeId, int>> fenced_;
  };

  // Whether `names` include every node with Tessera GPUs.
  bool CoversAllNodes(const std::unordered_set<std::string>& names) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The candidates as a set, and whether they include every node with Tessera GPUs.
  const std::unordered_set<std::string>& Allowed(const std::vector<std::string>& candidates,
                                                 bool* all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double Now() const { return core::Seconds(clock_.Now()); }
  // A node into the scheduler with its sick GPUs marked; -1 (logged) when the model refuses it.
  sched::NodeId AddToModel(const std::string& name, const NodeRec& n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A node out of the scheduler and the cycle (sched::Cycle::RemoveNode): the pods that held
  // GPUs there lose them (returned, their records updated).
  std::vector<sched::Allocation> RemoveFromModel(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RestoreBound(const std::string& id, PodRec& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnPodLocked(kube::EventType type, const nlohmann::json& pod)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A bound pod's GPUs into the model, or the pod set aside (unaccounted_) until its node can
  // hold them; logged either way.
  void Account(const std::string& id, PodRec& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `id` no longer waits to be accounted on `node` (an empty entry goes too).
  void Unwait(const std::string& node, const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bound pods waiting for `node` accounted, those whose assignment names their GPUs first.
  void AccountWaiting(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(const std::string& id, PodRec& p, const char* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the pod's GPUs, takes it out of the queue and drops its record.
  void Forget(std::unordered_map<std::string, PodRec>::iterator it, const char* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the engine is given for a pod: its request, queued by creation time and arrival order,
  // known to history by its kind.
  static sched::Submission SubmissionOf(const PodRec& p) {
    return {sched::QueueEntry{p.demand.request, p.created, p.seq}, p.demand.kind, std::nullopt};
  }
  // A record for a Tessera pod seen for the first time.
  std::unordered_map<std::string, PodRec>::iterator Track(const std::string& id,
                                                          const nlohmann::json& pod,
                                                          PodDemand demand)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLocked(double now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int SharesPerGpu() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<PodDemand> DemandOf(const nlohmann::json& pod) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The engine's decisions carried out, under mu_ (Step runs in a filter): a start reserves the
  // GPUs for the pod until it is bound (nudging those started while another pod asked), a stop
  // evicts the victims.
  struct PodExecutor : sched::Executor {
    explicit PodExecutor(Extender& ex) : ex(ex) {}
    void Start(const std::string& id, const sched::Allocation& a, double now) override;
    void Stop(const std::vector<std::string>& victims, const std::string& for_id,
              const std::string& reason, double now) override;
    Extender& ex;
    std::string asking;     // the pod whose filter stepped the engine
    bool released = false;  // a victim was only reserved: released at once, room made now
  };
  void NoteTypical(const core::Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An ended pod's tessera.io/gpu-use (written by its agent) into the history that sizes "auto"
  // pods, once per pod; a trial's result and an outgrown automatic size said (notices_).
  void LearnUse(const nlohmann::json& pod) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pod's tessera.io/gpu-memory "auto" sized from its kind's history (d.sizing says how).
  void SizeAuto(PodDemand& d) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `all`: the candidates cover every node with Tessera GPUs.
  FilterResult Explain(const PodRec& p, const std::vector<std::string>& candidates, bool all,
                       const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ExtenderOptions options_;
  const core::Clock& clock_;
  mutable core::Mutex mu_;
  std::map<std::string, NodeRec> nodes_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, PodRec> pods_ ABSL_GUARDED_BY(mu_);  // "ns/name"
  std::set<std::string> reserved_ ABSL_GUARDED_BY(mu_);  // pods started by filter, not yet bound
  std::map<std::string, int> pod_groups_ ABSL_GUARDED_BY(mu_);  // "ns/name" -> minMember
  std::set<std::string> placed_gangs_ ABSL_GUARDED_BY(mu_);     // gangs whose members were started
  std::map<std::string, sched::OwnerQuota> quotas_ ABSL_GUARDED_BY(mu_);
  std::string quota_error_ ABSL_GUARDED_BY(mu_);
  std::vector<sched::TypicalRequest> typical_ ABSL_GUARDED_BY(mu_);
  bool typical_fixed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<core::Request> seen_requests_
      ABSL_GUARDED_BY(mu_);  // recent Tessera pod requests, for FGD
  size_t seen_since_refresh_ ABSL_GUARDED_BY(mu_) = 0;
  PodExecutor executor_ ABSL_GUARDED_BY(mu_){*this};
  std::unique_ptr<sched::Engine> engine_ ABSL_GUARDED_BY(mu_);
  uint64_t node_updates_ ABSL_GUARDED_BY(mu_) = 0;
  // node -> bound pods there whose GPUs are not in the model (tracked in pods_).
  std::unordered_map<std::string, std::set<std::string>> unaccounted_ ABSL_GUARDED_BY(mu_);
  // node -> bound Tessera pods there whose demand cannot be read yet (a share before any node
  // says how many shares a GPU has): the pod as last seen.
  std::unordered_map<std::string, std::map<std::string, nlohmann::json>> unread_
      ABSL_GUARDED_BY(mu_);
  double expired_at_ ABSL_GUARDED_BY(mu_) = -1e300;  // the last look for lapsed reservations
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Victim> evictions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> nudges_ ABSL_GUARDED_BY(mu_);
  std::vector<Notice> notices_ ABSL_GUARDED_BY(mu_);
  // UIDs of ended pods whose use history has (until they are deleted).
  std::unordered_set<std::string> learned_ ABSL_GUARDED_BY(mu_);
  // What it learned, oldest first, each record's JSON text (bounded: kUseRecordsKept, and
  // use_bytes_ within kUseHistoryBytes), as TakeUseHistory gives it.
  std::deque<std::string> use_records_ ABSL_GUARDED_BY(mu_);
  size_t use_bytes_ ABSL_GUARDED_BY(mu_) = 2;  // of the array: "[", "]" and a comma a record
  bool use_records_changed_ ABSL_GUARDED_BY(mu_) = false;
  // One ended pod's measured use (its uid) into the history under each of `kinds` (its own first,
  // then those of the same name and command its use sizes too, UseKinds), kept as one record.
  void Learn(const std::string& uid, const std::vector<sched::RunKind>& kinds,
             std::optional<double> busy_pct, double peak_mib) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t nodes_version_ ABSL_GUARDED_BY(mu_) = 0;  // bumped when a node comes or goes
  std::vector<std::string> last_candidates_ ABSL_GUARDED_BY(mu_);
  std::unordered_set<std::string> last_allowed_ ABSL_GUARDED_BY(mu_);
  bool last_all_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t last_all_version_ ABSL_GUARDED_BY(mu_) = ~uint64_t{0};
};

// The quota ConfigMap's `quotas.yaml` (docs/kubernetes.md) as owner quotas per namespace.
absl::StatusOr<std::map<std::string, sched::OwnerQuota>> ParseQuotas(const std::string& yaml);

}  // namespace tessera::extender
