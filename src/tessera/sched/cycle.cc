#include "tessera/sched/cycle.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <unordered_set>
#include <utility>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace tessera::sched {
namespace {

// The Scheduler's messages start "request <id>: " or "gang <id>: "; the cycle's reasons are about
// the entry already.
std::string WithoutSubject(std::string_view message) {
  size_t p = message.find(": ");
  return std::string(p == std::string_view::npos ? message : message.substr(p + 2));
}

CycleDecision StartOf(Allocation a) {
  CycleDecision d;
  d.kind = CycleDecision::Kind::kStart;
  d.id = a.id;
  d.allocation = std::move(a);
  return d;
}

// The memo key of a pass: requests of one shape, priority and preemption right fit, fail or make
// room alike.
std::string MemoKey(const core::Request& r) {
  std::string key = core::RequestShapeKey(r);
  int64_t priority = r.priority;
  key.append(reinterpret_cast<const char*>(&priority), sizeof priority);
  key.push_back(r.preempts_others ? 'o' : '-');
  // Whose it is decides what it may preempt: its own owner's work, and borrowed quota when the
  // owner is within its own (a lender reclaiming), so one owner's failure says nothing of
  // another's.
  key.append(r.owner).push_back('\0');
  for (const std::string& g : r.quota_groups) key.append(g).push_back('\0');
  return key;
}

// Allocations that stand for a backfill reservation's free GPUs during a Step.
constexpr std::string_view kPhantom = "reserved-for:";
constexpr double kNever = std::numeric_limits<double>::infinity();

// "in 95 s", or why there is no time.
std::string StartText(double start, double now) {
  if (start == kNever) return "start unknown: the running work it waits for has no expected end";
  return fmt::format("expected start in {:.0f} s", std::max(0.0, start - now));
}

}  // namespace

Cycle::Cycle(Scheduler& scheduler, CycleOptions options)
    : scheduler_(scheduler), options_(options) {}

Cycle::Key Cycle::KeyOf(const QueueEntry& e) {
  return Key{-e.request.priority, e.submitted, e.seq, e.request.id};
}

absl::Status Cycle::Enqueue(QueueEntry entry, std::string waiting) {
  if (entry.request.id.empty()) return absl::InvalidArgumentError("queue: a request needs an id");
  if (std::string bad = core::ValidateRequest(entry.request); !bad.empty()) {
    return absl::InvalidArgumentError(fmt::format("request {}: {}", entry.request.id, bad));
  }
  if (entries_.contains(entry.request.id)) {
    return absl::AlreadyExistsError(fmt::format("request {}: already queued", entry.request.id));
  }
  // A victim put back in the queue has stopped, even if its id is placed again before the requests
  // that waited for it look.
  stopping_.erase(entry.request.id);
  Key key = KeyOf(entry);
  std::string id = entry.request.id;
  Entry e{std::move(entry), key, std::move(waiting)};
  e.shape_memo = MemoKey(e.queued.request);
  e.memo = e.shape_memo;
  // With reservations, how long it runs decides whether it may take reserved GPUs.
  if (options_.reservations > 0) {
    e.memo.append(reinterpret_cast<const char*>(&e.queued.request.expected_duration_s),
                  sizeof e.queued.request.expected_duration_s);
  }
  auto [it, added] = entries_.emplace(std::move(id), std::move(e));
  order_.emplace(std::move(key), &it->second);
  Note(it->second);
  ++queue_version_;
  return absl::OkStatus();
}

bool Cycle::Remove(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  order_.erase(it->second.key);
  entries_.erase(it);
  ++queue_version_;
  return true;
}

void Cycle::Say(Entry& e, std::string_view why) {
  if (e.waiting == why) return;
  e.waiting.assign(why);
  Note(e);
}

void Cycle::SetStart(Entry& e, std::optional<double> start) {
  if (e.expected_start == start) return;
  e.expected_start = start;
  Note(e);
}

void Cycle::Note(Entry& e) {
  if (e.noted || !options_.note_changes) return;
  e.noted = true;
  noted_.push_back(e.queued.request.id);
}

std::vector<std::string> Cycle::TakeNoted() {
  for (const std::string& id : noted_) {
    if (auto it = entries_.find(id); it != entries_.end()) it->second.noted = false;
  }
  return std::exchange(noted_, {});
}

const std::string* Cycle::Waiting(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.waiting;
}

std::vector<std::string> Cycle::Order() const {
  std::vector<std::string> ids;
  ids.reserve(order_.size());
  for (const Entry* e : Ordered()) ids.push_back(e->queued.request.id);
  return ids;
}

std::optional<double> Cycle::ExpectedStart(const std::string& id) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.expected_start;
}

const std::string* Cycle::Delays(const Allocation& a, double end,
                                 const std::vector<Backfill>& backfill) {
  for (const Backfill& b : backfill) {
    if (b.node != a.node || end <= b.protect) continue;  // over before the reservation begins
    for (int g : a.gpus) {
      if (std::find(b.gpus.begin(), b.gpus.end(), g) != b.gpus.end()) return &b.holder;
    }
  }
  return nullptr;
}

std::optional<Cycle::Backfill> Cycle::Reserve(const core::Request& r, double now) {
  // Running work in the order it is expected to end; victims asked to stop end now, work without
  // an expected end last (oldest first). Other reservations' GPUs stay taken.
  struct Ending {
    double end, start;
    const std::string* id;
  };
  std::vector<Ending> running;
  for (const auto& [id, a] : scheduler_.state().allocations()) {
    if (id.starts_with(kPhantom)) continue;
    const double end = stopping_.contains(id) ? now
                       : a.request.expected_duration_s > 0
                           ? std::max(now, a.start_time + a.request.expected_duration_s)
                           : kNever;
    running.push_back({end, a.start_time, &id});
  }
  std::sort(running.begin(), running.end(), [](const Ending& x, const Ending& y) {
    return std::tie(x.end, x.start, *x.id) < std::tie(y.end, y.start, *y.id);
  });
  std::vector<std::string> ids;
  for (const Ending& e : running) ids.push_back(*e.id);  // Release invalidates the map's keys
  // Everything below is undone before it returns (move_to(0), the placement released).
  scheduler_.BeginTrial();
  // The request starts when the first k of them have ended, for the least k at which it fits.
  // Fitting only grows as more is released, so k is found by galloping (1, 2, 4, ...) and then
  // bisecting: O(log n) placements rather than one per running allocation, which on a large
  // cluster with thousands running was most of a replay's time. Released as a stack (restored in
  // reverse), moved up and down to each k tried.
  std::vector<std::pair<size_t, Allocation>> released;  // (index into ids, what was released)
  size_t at = 0;                                        // ids[0..at) are released now
  auto move_to = [&](size_t k) {
    for (; at < k; ++at) {
      if (auto a = scheduler_.Release(ids[at]); a.ok()) released.emplace_back(at, *std::move(a));
    }
    for (; at > k; --at) {
      if (!released.empty() && released.back().first == at - 1) {
        (void)scheduler_.Restore(released.back().second);
        released.pop_back();
      }
    }
  };
  auto fits = [&](size_t k) {
    move_to(k);
    return scheduler_.Fits(r, now);
  };
  const size_t n = ids.size();
  size_t lo = 0, hi = 0;  // it does not fit with lo released (nothing: Reserve's premise)
  for (size_t step = 1; lo < n; step *= 2) {
    const size_t k = std::min(n, lo + step);
    if (fits(k)) {
      hi = k;
      break;
    }
    lo = k;
  }
  std::optional<Backfill> out;
  if (hi > 0) {
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? hi : lo) = mid;
    }
    move_to(hi);
    if (auto placed = scheduler_.Place(r, now); placed.ok()) {
      const double start = running[hi - 1].end;
      out = Backfill{placed->node, placed->gpus, start, start == kNever ? now : start, r.id, {}};
      (void)scheduler_.Release(r.id);
    }
  }
  move_to(0);
  scheduler_.EndTrial();
  return out;
}

double Cycle::Usage(const std::string& owner) const {
  auto it = usage_.find(owner);
  return it == usage_.end() ? 0 : it->second;
}

void Cycle::Account(double now) {
  if (options_.fair_share_half_life_s <= 0) return;
  if (accounted_at_ >= 0 && now > accounted_at_) {
    // The interval since the last step is charged at the rate in force when it began (what ran
    // after that step's starts): work that ended meanwhile is charged to the end of the interval,
    // which the consumer closes by stepping when something ends.
    const double dt = now - accounted_at_;
    const double decay = std::exp2(-dt / options_.fair_share_half_life_s);
    for (auto& [owner, used] : usage_) used *= decay;
    for (const auto& [owner, gpus] : rate_) usage_[owner] += dt * gpus;
  }
  accounted_at_ = std::max(accounted_at_, now);
}

void Cycle::SetRate() {
  if (options_.fair_share_half_life_s <= 0) return;
  rate_.clear();
  for (const auto& [id, a] : scheduler_.state().allocations()) {
    rate_[a.request.owner] += double(a.request.gpu_milli_total()) / core::kMilliPerGpu;
  }
}

std::vector<Cycle::Entry*> Cycle::Ordered() const {
  std::vector<Entry*> out;
  out.reserve(order_.size());
  for (const auto& [key, e] : order_) out.push_back(e);
  if (options_.fair_share_half_life_s > 0) {
    // Within a priority, the owner who used the least lately first; the rest of the order stays.
    std::stable_sort(out.begin(), out.end(), [&](const Entry* a, const Entry* b) {
      const core::Request& x = a->queued.request;
      const core::Request& y = b->queued.request;
      if (x.priority != y.priority) return x.priority > y.priority;
      return Usage(x.owner) < Usage(y.owner);
    });
  }
  return out;
}

const std::string* Cycle::Overlap(const Allocation& a, const std::vector<Reservation>& reserved) {
  // The whole node, not only its GPUs: what the victims free is also CPU and memory, and a request
  // that took those beside the reserved GPUs would leave the preemptor unable to start and
  // preempting again, with no end (seen in a contended replay of the openb trace).
  for (const Reservation& r : reserved) {
    if (r.node == a.node && !r.gpus->empty()) return r.holder;  // empty: its holder has its room
  }
  return nullptr;
}

bool Cycle::StillHeld(const std::string& allocation_id) const {
  return stopping_.contains(allocation_id) && scheduler_.state().Find(allocation_id) != nullptr;
}

// What one Step carries from request to request, in queue order.
struct Cycle::Pass {
  double now = 0;
  std::vector<Entry*> order;
  // Reasons of the memo keys that neither fit nor could make room in this pass; and the memo keys
  // (without a duration) that could not make room: what preemption can do for a request does not
  // depend on how long it runs, and within a pass no new victim appears for a later request (what
  // starts after it in the queue has no lower priority).
  // Both keyed by the entries' own memo strings (those that are not an entry's, and the reasons
  // memoized apart from their entry's, kept for the pass in `kept`).
  std::unordered_map<std::string_view, const std::string*> no_fit;
  std::unordered_set<std::string_view> no_room;
  std::deque<std::string> kept;
  std::set<std::string> gangs_seen, started;
  // Room made by preemption belongs to the request it was made for. Requests after it in this
  // pass do not take it (`reserved`, in queue order), and neither do requests before it that
  // preempted nothing themselves (`prior`): a borrower queued earlier must not take back what its
  // lender just reclaimed.
  std::vector<Reservation> reserved, prior;
  // Backfill reservations of this Step, and what is left of their number; how many more requests
  // may be asked whether only the reservations keep them out (each costs a placement); how many
  // preemption plans are left.
  std::vector<Backfill> backfill;
  int reservations_left = 0;
  int explain_left = 64;
  int plans_left = 0;
  std::vector<CycleDecision> out;

  // Takes the phantoms of the reservations that a request ending at `end` would not delay (all of
  // them with -infinity) out of the scheduler; PutBack restores them.
  std::vector<Allocation> Lift(Scheduler& s, double end) const {
    std::vector<Allocation> lifted;
    for (const Backfill& b : backfill) {
      if (end > b.protect) continue;
      for (const std::string& p : b.phantoms) {
        if (auto a = s.Release(p); a.ok()) lifted.push_back(*std::move(a));
      }
    }
    return lifted;
  }
  static void PutBack(Scheduler& s, const std::vector<Allocation>& lifted) {
    for (const Allocation& a : lifted) (void)s.Restore(a);  // fails where now taken
  }
};

void Cycle::StepGang(Entry& first, Pass& pass) {
  const double now = pass.now;
  std::vector<Reservation>& reserved = pass.reserved;
  std::vector<CycleDecision>& out = pass.out;
  const core::Request& r = first.queued.request;
  std::vector<Entry*> members;
  for (Entry* e : pass.order) {
    if (e->queued.request.gang == r.gang) members.push_back(e);
  }
  std::string why;
  // Room made by preemption for the gang: it waits for every victim to stop, its nodes reserved.
  size_t awaiting = 0;
  bool preempted = false;
  for (Entry* e : members) {
    preempted |= e->reserved_node >= 0;
    std::erase_if(e->awaiting, [&](const std::string& v) { return !StillHeld(v); });
    awaiting += e->awaiting.size();
  }
  if (awaiting > 0) {
    why = fmt::format("gang {}: waiting for {} preempted job(s) to stop", r.gang, awaiting);
    for (Entry* e : members) {
      if (e->reserved_node >= 0)
        reserved.push_back({e->reserved_node, &e->reserved_gpus, &e->queued.request.id});
      Say(*e, why);
    }
    return;
  }
  // Others' rooms made by preemption are not the gang's (its own are).
  auto mine = [&](const Reservation& res) {
    for (const Entry* e : members) {
      if (*res.holder == e->queued.request.id) return true;
    }
    return false;
  };
  std::vector<Reservation> held;
  for (const Reservation& res : reserved) {
    if (!mine(res)) held.push_back(res);
  }
  for (const Reservation& res : pass.prior) {
    if (!mine(res)) held.push_back(res);
  }
  if (static_cast<int>(members.size()) < r.gang_size) {
    why = fmt::format("gang {}: {} of {} members queued", r.gang, members.size(), r.gang_size);
  } else {
    std::vector<core::Request> requests;
    for (const Entry* e : members) requests.push_back(e->queued.request);
    auto placed = scheduler_.PlaceGang(requests, now);
    const std::string* holder = nullptr;
    const std::string* preemptor = nullptr;
    for (const Allocation& a : placed.ok() ? *placed : std::vector<Allocation>{}) {
      const double end =
          a.request.expected_duration_s > 0 ? now + a.request.expected_duration_s : kNever;
      if (!holder) holder = Delays(a, end, pass.backfill);
      if (!preemptor) preemptor = Overlap(a, held);
    }
    if (holder || preemptor) {
      // Reserved GPUs still busy or partly used that its placement took, or a node a preemptor
      // made room on: all or nothing.
      for (const Allocation& a : *placed) (void)scheduler_.Release(a.id);
      why = holder ? fmt::format(
                         "gang {}: the GPUs it could take are reserved for {}, which waits longer",
                         r.gang, *holder)
                   : fmt::format(
                         "gang {}: a node it could take is reserved for {}, which "
                         "preempted to make room there",
                         r.gang, *preemptor);
    } else if (placed.ok()) {
      for (Entry* e : members) e->GiveUpRoom();
      for (Allocation& a : *placed) {
        pass.started.insert(a.id);
        out.push_back(StartOf(std::move(a)));
      }
      return;
    } else {
      why = std::string(placed.status().message());
      if (preempted) {
        // Its room did not hold (rare: a policy's choice, a GPU turned sick): given up, planned
        // again at the next Step.
        for (Entry* e : members) e->GiveUpRoom();
      } else if (options_.preemption && pass.plans_left > 0 &&
                 why.find("quota") == std::string::npos) {
        --pass.plans_left;
        if (PreemptForGang(members, now, reserved, out)) return;
      }
    }
  }
  for (Entry* e : members) Say(*e, why);
}

void Cycle::AskToStop(Entry& e, std::vector<std::string> victims, NodeId node,
                      std::vector<int> gpus, std::string reason, std::vector<Reservation>& reserved,
                      std::vector<CycleDecision>& out) {
  CycleDecision d;
  d.kind = CycleDecision::Kind::kPreempt;
  d.id = e.queued.request.id;
  d.reason = std::move(reason);
  // A victim already stopping for another request is not asked twice; this one waits for it too.
  for (const std::string& v : victims) {
    (stopping_.insert(v).second ? d.victims : d.already_stopping).push_back(v);
  }
  e.awaiting = std::move(victims);
  e.reserved_node = d.node = node;
  d.gpus = gpus;
  e.reserved_gpus = std::move(gpus);
  reserved.push_back({e.reserved_node, &e.reserved_gpus, &e.queued.request.id});
  if (!d.victims.empty() || !d.already_stopping.empty()) out.push_back(std::move(d));
}

bool Cycle::PreemptForGang(const std::vector<Entry*>& members, double now,
                           std::vector<Reservation>& reserved, std::vector<CycleDecision>& out) {
  // Member by member on the scheduler's state: each plan's victims taken out and the member placed
  // (where the policies put it with that room), so that the next member's plan counts on what the
  // earlier ones take; then all of it undone. All members must find room, or nothing is asked.
  std::vector<Allocation> taken_out;
  std::vector<Allocation> placed;
  std::vector<std::vector<std::string>> victims;
  bool ok = true;
  for (const Entry* e : members) {
    core::Request alone = e->queued.request;
    alone.gang.clear();
    alone.gang_size = 0;
    PreemptionPlan plan = scheduler_.PlanPreemption(alone, now);
    if (!plan.possible) {
      ok = false;
      break;
    }
    for (const std::string& v : plan.victims) {
      if (auto a = scheduler_.Release(v); a.ok()) taken_out.push_back(*std::move(a));
    }
    auto a = scheduler_.Place(alone, now);
    if (!a.ok()) {
      ok = false;
      break;
    }
    placed.push_back(*std::move(a));
    victims.push_back(std::move(plan.victims));
  }
  for (const Allocation& a : placed) (void)scheduler_.Release(a.id);
  for (auto it = taken_out.rbegin(); it != taken_out.rend(); ++it) (void)scheduler_.Restore(*it);
  if (!ok) return false;
  size_t total = 0;
  for (const auto& v : victims) total += v.size();
  if (total == 0) return false;  // it fits without anyone stopping: PlaceGang's word stands
  const std::string& gang = members.front()->queued.request.gang;
  const std::string why =
      fmt::format("gang {}: waiting for {} preempted job(s) to stop", gang, total);
  for (size_t i = 0; i < members.size(); ++i) {
    Entry& e = *members[i];
    AskToStop(e, std::move(victims[i]), placed[i].node, std::move(placed[i].gpus),
              fmt::format("preempted for gang {} (priority {})", gang, e.queued.request.priority),
              reserved, out);
    Say(e, why);
  }
  return true;
}

std::optional<Cycle::Awaited> Cycle::Awaiting(const std::string& id) const {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.reserved_node < 0) return std::nullopt;
  Awaited out;
  out.node = it->second.reserved_node;
  for (const std::string& v : it->second.awaiting) {
    if (StillHeld(v)) out.victims.push_back(v);
  }
  if (out.victims.empty()) return std::nullopt;
  return out;
}

absl::StatusOr<std::vector<Allocation>> Cycle::RemoveNode(NodeId node) {
  auto released = scheduler_.RemoveNode(node);
  if (!released.ok()) return released.status();
  for (const Allocation& a : *released) stopping_.erase(a.id);
  for (auto& [id, e] : entries_) {
    if (e.reserved_node != node) continue;
    e.GiveUpRoom();
    e.awaiting.clear();
  }
  return released;
}

std::vector<CycleDecision> Cycle::Step(double now, const Scope* scope) {
  if (now != instant_) {
    instant_ = now;
  } else if (!scope && last_unscoped_ && scheduler_.version() == stepped_version_ &&
             queue_version_ == stepped_queue_version_) {
    return {};  // this instant's decisions are made, and nothing they depend on has changed
  }
  for (auto it = stopping_.begin(); it != stopping_.end();) {
    it = scheduler_.state().Find(*it) != nullptr ? std::next(it) : stopping_.erase(it);
  }
  Pass pass;
  pass.now = now;
  for (const auto& [id, e] : entries_) {
    if (e.reserved_node >= 0 && !e.reserved_gpus.empty()) {
      pass.prior.push_back({e.reserved_node, &e.reserved_gpus, &id});
    }
  }
  Account(now);
  pass.reservations_left = options_.reservations;
  pass.plans_left =
      options_.preemption_plans > 0 ? options_.preemption_plans : std::numeric_limits<int>::max();
  pass.order = Ordered();
  for (Entry* entry : pass.order) {
    Entry& e = *entry;
    const core::Request& r = e.queued.request;
    const std::string* id = &r.id;
    SetStart(e, std::nullopt);
    // The scoped request (or its gang): narrowed while the cycle looks at it, and kept out of the
    // memos of what fits, which hold for requests that are not narrowed.
    const bool scoped =
        scope != nullptr && (*id == scope->id || (!r.gang.empty() && r.gang == scope->gang));
    struct Narrowed {
      const Scope* scope;
      explicit Narrowed(const Scope* s) : scope(s) {
        if (scope && scope->enter) scope->enter();
      }
      ~Narrowed() {
        if (scope && scope->leave) scope->leave();
      }
    } narrowed(scoped ? scope : nullptr);
    if (r.gang.empty()) {
      StepOne(e, scoped, pass);
    } else if (pass.gangs_seen.insert(r.gang).second) {
      StepGang(e, pass);
    }
  }
  for (const Backfill& b : pass.backfill) {
    for (const std::string& p : b.phantoms) (void)scheduler_.Release(p);
  }
  for (const std::string& id : pass.started) Remove(id);
  SetRate();
  stepped_version_ = scheduler_.version();
  stepped_queue_version_ = queue_version_;
  last_unscoped_ = scope == nullptr;
  return std::move(pass.out);
}

void Cycle::StepOne(Entry& e, bool scoped, Pass& pass) {
  const core::Request& r = e.queued.request;
  const double now = pass.now;
  bool preempted = false;  // it made room by preemption itself
  if (!e.awaiting.empty()) {
    std::erase_if(e.awaiting, [&](const std::string& v) { return !StillHeld(v); });
    if (!e.awaiting.empty()) {
      Say(e, fmt::format("waiting for {} preempted job(s) to stop", e.awaiting.size()));
      pass.reserved.push_back({e.reserved_node, &e.reserved_gpus, &r.id});
      return;
    }
    e.GiveUpRoom();  // its room is free: no longer reserved against itself
    preempted = true;
  }
  const uint64_t state = scheduler_.state_version() + 1;
  if (!preempted && !scoped && e.settled_at == state &&
      (pass.reservations_left == 0 || e.unreservable)) {
    pass.no_fit.emplace(e.memo, &e.waiting);  // its reason stands
    return;
  }
  e.settled_at = 0;
  // Narrowed, it is kept apart from the memos of its shape.
  const std::string* memo_key = &e.memo;
  const std::string* shape_key = &e.shape_memo;
  if (scoped) {
    shape_key = &pass.kept.emplace_back(e.shape_memo + "\x01narrowed");
    memo_key = &pass.kept.emplace_back(e.memo);
    pass.kept.back().insert(e.shape_memo.size(), "\x01narrowed");
  }
  const std::string& memo = *memo_key;
  const std::string& shape_memo = *shape_key;
  if (auto m = pass.no_fit.find(memo); m != pass.no_fit.end()) {
    Say(e, *m->second);
    return;
  }
  const double end = r.expected_duration_s > 0 ? now + r.expected_duration_s : kNever;
  std::string reserved_why;
  absl::StatusOr<Allocation> placed = PlaceAround(r, end, pass, &reserved_why);
  if (!reserved_why.empty()) {
    Say(e, reserved_why);
    pass.no_fit.emplace(memo, &e.waiting);
    return;
  }
  if (placed.ok()) {
    if (const std::string* holder = Delays(*placed, end, pass.backfill)) {
      // Reserved GPUs still busy, or partly used, that its placement took.
      (void)scheduler_.Release(r.id);
      Say(e,
          fmt::format("the GPUs it could take are reserved for {}, which waits longer", *holder));
      pass.no_fit.emplace(memo, &e.waiting);
      return;
    }
    const std::string* holder = Overlap(*placed, pass.reserved);
    if (!holder && !preempted) holder = Overlap(*placed, pass.prior);
    if (holder) {
      // Room made for an earlier request by preemption is its own; this one waits (not memoized:
      // another of its shape may fit elsewhere, the reservation is about the place, not the
      // shape).
      (void)scheduler_.Release(r.id);
      Say(e,
          fmt::format("its node is reserved for {}, which preempted to make room there", *holder));
      return;
    }
    pass.started.insert(r.id);
    pass.out.push_back(StartOf(std::move(*placed)));
    return;
  }
  Say(e, WithoutSubject(std::string(placed.status().message())));
  // A quota says no for this owner only: others of the same shape may still fit.
  if (e.waiting.rfind("quota", 0) == 0) return;
  // Whether preemption can make room for it at this state is known: off, or planned in vain.
  bool cannot_preempt = !options_.preemption || pass.no_room.contains(shape_memo);
  if (!cannot_preempt && pass.plans_left > 0) {
    --pass.plans_left;
    PreemptionPlan plan = scheduler_.PlanPreemption(r, now);
    if (!plan.possible) pass.no_room.insert(shape_memo), cannot_preempt = true;
    if (plan.possible && !plan.victims.empty()) {
      AskToStop(e, std::move(plan.victims), plan.node, std::move(plan.gpus),
                fmt::format("preempted for {} (priority {})", r.id, r.priority), pass.reserved,
                pass.out);
      Say(e, fmt::format("waiting for {} preempted job(s) to stop", e.awaiting.size()));
      return;
    }
  }
  if (pass.reservations_left > 0) {
    // Its reason may yet say where it is reserved: the memo keeps the reason without that.
    pass.no_fit.emplace(memo, &pass.kept.emplace_back(e.waiting));
    const bool reserved = ReserveAhead(e, pass);
    if (reserved) --pass.reservations_left;
    e.unreservable = !reserved;
    if (cannot_preempt && !reserved && !scoped) e.settled_at = state;
  } else {
    pass.no_fit.emplace(memo, &e.waiting);
    e.unreservable = false;
    if (cannot_preempt && !scoped) e.settled_at = state;
  }
}

absl::StatusOr<Allocation> Cycle::PlaceAround(const core::Request& r, double end, Pass& pass,
                                              std::string* reserved_why) {
  absl::StatusOr<Allocation> placed = scheduler_.Place(r, pass.now);
  if (placed.ok() || pass.backfill.empty()) return placed;
  // Free GPUs reserved for an earlier request are its own, unless this one is over before the
  // reservation begins.
  if (end < kNever) {
    std::vector<Allocation> lifted = pass.Lift(scheduler_, end);
    if (!lifted.empty()) placed = scheduler_.Place(r, pass.now);
    Pass::PutBack(scheduler_, lifted);
  }
  if (placed.ok() || pass.explain_left <= 0) return placed;
  // Would it fit but for the reservations? Then they are why it waits (memoized with its
  // duration: one of the same shape that ends sooner may still go). Asked for the first shapes
  // of a pass only: each costs a placement.
  --pass.explain_left;
  std::vector<Allocation> lifted = pass.Lift(scheduler_, -kNever);
  bool fits = false;
  if (!lifted.empty() && scheduler_.Place(r, pass.now).ok()) {
    fits = true;
    (void)scheduler_.Release(r.id);
  }
  Pass::PutBack(scheduler_, lifted);
  if (fits) {
    const Backfill& b = pass.backfill.front();
    *reserved_why = fmt::format("the free GPUs are reserved for {} ({}); it would {} that",
                                b.holder, StartText(b.start, pass.now),
                                end < kNever ? "end after" : "have no expected end before");
  }
  return placed;
}

bool Cycle::ReserveAhead(Entry& e, Pass& pass) {
  const core::Request& r = e.queued.request;
  std::optional<Backfill> b = Reserve(r, pass.now);
  if (!b) return false;
  SetStart(e, b->start);
  // Its GPUs that are free now are held by phantoms for the rest of this Step, so that the
  // policies place later requests around them.
  const core::NodeSpec& spec = scheduler_.state().node_spec(b->node);
  for (int g : b->gpus) {
    const GpuUse& use = scheduler_.state().gpu_use(b->node, g);
    if (use.holders != 0 || !use.healthy) continue;
    Allocation p;
    p.id = fmt::format("{}{}:{}", kPhantom, r.id, g);
    p.node = b->node;
    p.gpus = {g};
    p.milli_per_gpu = core::kMilliPerGpu;
    p.memory_mib_per_gpu = spec.gpus[g].memory_mib;
    p.request.id = p.id;
    p.request.gpus = 1;
    p.request.priority = r.priority;
    p.request.preemptible = false;
    p.start_time = pass.now;
    if (scheduler_.Restore(p).ok()) b->phantoms.push_back(p.id);
  }
  std::vector<std::string> gpus;
  for (int g : b->gpus) gpus.push_back(std::to_string(g));
  Say(e, e.waiting + fmt::format("; GPU {} of {} reserved for it ({})", fmt::join(gpus, ","),
                                 scheduler_.state().node_name(b->node),
                                 StartText(b->start, pass.now)));
  pass.backfill.push_back(*std::move(b));
  return true;
}

}  // namespace tessera::sched
