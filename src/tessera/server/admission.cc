#include "tessera/server/admission.h"

#include <algorithm>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/server/store.h"

namespace tessera::server {

QueuedJob QueuedJob::Of(const JobRecord& r, std::shared_ptr<const JobSpec> spec, double since) {
  QueuedJob q;
  q.id = r.id;
  q.priority = r.priority;
  q.owner = r.owner;
  q.uid = r.owner_uid;
  q.throttle = ArrayThrottle(spec->array);
  q.spec = std::move(spec);
  q.submitted = r.submitted_at;
  q.since = since;
  q.array_id = r.array_id;
  q.array_index = r.array_index;
  q.spec_bytes = r.spec_json.size();
  return q;
}

std::string Unmeetable(const Dependency& d, const DependencyState& st) {
  using S = DependencyState;
  const bool never = st.outcome == S::kMissing ||
                     (d.kind == Dependency::Kind::kOk && st.outcome == S::kNotOk) ||
                     (d.kind == Dependency::Kind::kNotOk && st.outcome == S::kOk);
  return never ? fmt::format("{}: after {} can never be met", st.what, DependencyText(d)) : "";
}

void Admission::Add(QueuedJob q) {
  q.in_cycle = false;
  q.parked.clear();
  q.changing = false;
  q.waiting = q.held ? fmt::format("held (tessera release {})", q.array_id ? q.array_id : q.id)
                     : "not yet considered";
  q.waiting_pass = 0;
  if (auto old = jobs_.find(q.id); old != jobs_.end()) Erase(old);
  ++jobs_by_uid_[q.uid];
  if (++specs_[q.spec.get()] == 1) bytes_by_uid_[q.uid] += q.spec_bytes;
  Index(q, +1);
  const int64_t id = q.id;
  jobs_.emplace(id, std::move(q));
}

QueuedJob Admission::Take(int64_t id) {
  auto it = jobs_.find(id);
  Forget(it->second);  // first: the counts key on its spec and user
  QueuedJob q = std::move(it->second);
  jobs_.erase(it);
  return q;
}

void Admission::Erase(int64_t id) {
  if (auto it = jobs_.find(id); it != jobs_.end()) Erase(it);
}

void Admission::Erase(std::map<int64_t, QueuedJob>::iterator it) {
  Forget(it->second);
  jobs_.erase(it);
}

void Admission::Forget(const QueuedJob& q) {
  if (auto n = jobs_by_uid_.find(q.uid); n != jobs_by_uid_.end() && --n->second == 0)
    jobs_by_uid_.erase(n);
  if (auto s = specs_.find(q.spec.get()); s != specs_.end() && --s->second == 0) {
    specs_.erase(s);
    if (auto b = bytes_by_uid_.find(q.uid); b != bytes_by_uid_.end()) {
      b->second -= std::min<uint64_t>(b->second, q.spec_bytes);
      if (b->second == 0) bytes_by_uid_.erase(b);
    }
  }
  Index(q, -1);
  ++left_;
}

QueuedJob* Admission::Find(int64_t id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const QueuedJob* Admission::Find(int64_t id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

size_t Admission::JobsOf(uint32_t uid) const {
  auto it = jobs_by_uid_.find(uid);
  return it == jobs_by_uid_.end() ? 0 : it->second;
}

uint64_t Admission::BytesOf(uint32_t uid) const {
  auto it = bytes_by_uid_.find(uid);
  return it == bytes_by_uid_.end() ? 0 : it->second;
}

void Admission::Index(const QueuedJob& q, int delta) {
  if (delta > 0) Note(q.id);  // where it stands changed: what it says may have
  if (q.in_cycle) {
    auto count = [&](auto& counts, auto key) {
      auto it = counts.try_emplace(key, 0).first;
      it->second += delta;
      if (it->second == 0) counts.erase(it);
    };
    count(in_cycle_by_uid_, q.uid);
    if (q.array_id != 0) count(in_cycle_by_array_, q.array_id);
  } else if (q.held) {
    // Held: nothing to look at until released (SetHeld moves it).
  } else if (!q.parked.empty()) {
    for (const std::string& key : q.parked) {
      auto g = parked_.find(key);
      if (delta > 0) {
        g->second.second.insert(q.id);
      } else if (g != parked_.end() && g->second.second.erase(q.id) && g->second.second.empty()) {
        parked_.erase(g);
      }
    }
  } else if (delta > 0) {
    outside_by_uid_[q.uid].insert(q.id);
  } else {
    auto o = outside_by_uid_.find(q.uid);
    o->second.erase(q.id);
    if (o->second.empty()) outside_by_uid_.erase(o);
  }
}

void Admission::SetParked(QueuedJob& q, std::vector<std::pair<std::string, Dependency>> on) {
  Index(q, -1);
  q.parked.clear();
  for (auto& [key, d] : on) {
    parked_.try_emplace(key, d, std::set<int64_t>{});
    q.parked.push_back(std::move(key));
  }
  Index(q, +1);
}

void Admission::WakeParked(World& world, std::map<std::string, DependencyState>& outcomes) {
  if (left_ == parked_checked_) return;
  parked_checked_ = left_;
  std::set<int64_t> wake;
  for (const auto& [key, group] : parked_) {
    auto it = outcomes.find(key);
    if (it == outcomes.end()) it = outcomes.emplace(key, world.Outcome(group.first)).first;
    if (it->second.outcome != DependencyState::kPending)
      wake.insert(group.second.begin(), group.second.end());
  }
  for (int64_t id : wake) SetParked(jobs_.at(id), {});
}

void Admission::SetHeld(int64_t id, bool held, std::string waiting) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  QueuedJob& q = it->second;
  Say(q, std::move(waiting));
  if (q.held == held) return;
  Index(q, -1);
  q.held = held;
  q.parked.clear();  // released, it is looked at again
  Index(q, +1);
}

void Admission::SetWaiting(int64_t id, std::string waiting) {
  if (QueuedJob* q = Find(id)) Say(*q, std::move(waiting));
}

void Admission::Say(QueuedJob& q, std::string waiting) {
  if (q.waiting == waiting) return;
  q.waiting = std::move(waiting);
  Note(q.id);
}

void Admission::SetInCycle(QueuedJob& q, bool in) {
  if (q.in_cycle == in) return;
  Index(q, -1);
  q.in_cycle = in;
  Index(q, +1);
}

bool Admission::AnyChanging(const std::vector<int64_t>& ids) const {
  for (int64_t t : ids) {
    if (const QueuedJob* q = Find(t); q && q->changing) return true;
  }
  return false;
}

std::vector<int64_t> Admission::BeginChange(const std::vector<int64_t>& ids, World& world) {
  std::vector<int64_t> out;
  for (int64_t t : ids) {
    QueuedJob* q = Find(t);
    if (!q) continue;
    q->changing = true;
    Note(t);
    if (q->in_cycle) {
      world.LeaveCycle(t);
      SetInCycle(*q, false);
    }
    out.push_back(t);
  }
  return out;
}

void Admission::EndChange(const std::vector<int64_t>& ids) {
  for (int64_t t : ids) {
    if (QueuedJob* q = Find(t)) q->changing = false, Note(t);
  }
}

std::string WaitingText(const WaitingFacts& f, const CappedUsers& capped) {
  if (f.changing) return "a change to it (cancel, hold, release, priority) is being stored";
  if (!f.in_cycle && f.cappable && f.examined != capped.pass) {
    // A user at her limit: her jobs the last pass did not examine say so.
    if (auto c = capped.users.find(f.uid); c != capped.users.end()) return c->second;
  }
  return f.waiting;
}

std::optional<WaitingFacts> Admission::FactsOf(int64_t id, const World& world) const {
  const QueuedJob* q = Find(id);
  if (!q) return std::nullopt;
  WaitingFacts f{.uid = q->uid,
                 .changing = q->changing,
                 .in_cycle = q->in_cycle,
                 .cappable = !q->held && q->parked.empty(),
                 .examined = q->waiting_pass};
  if (!q->in_cycle) {
    f.waiting = q->waiting;
  } else if (const std::string* why = world.CycleWaiting(id)) {
    f.waiting = *why;
  }
  return f;
}

std::string Admission::Waiting(int64_t id, const World& world) const {
  std::optional<WaitingFacts> f = FactsOf(id, world);
  return f ? WaitingText(*f, capped_) : "";
}

std::vector<int64_t> Admission::TakeNoted() {
  std::vector<int64_t> out(noted_.begin(), noted_.end());
  noted_.clear();
  return out;
}

std::vector<std::pair<int64_t, std::string>> Admission::Admit(World& world) {
  ++pass_;
  // What each array has running or in the cycle's queue (its % limit counts both), and each user
  // (limits.max_running_jobs_per_user counts both, and the jobs being started): kept as jobs come
  // and go (SetInCycle), not counted over the queue.
  std::map<int64_t, int> active;
  std::map<uint32_t, size_t> user_active(in_cycle_by_uid_.begin(), in_cycle_by_uid_.end());
  std::map<int64_t, size_t> array_in_cycle = in_cycle_by_array_;
  for (const auto& [array, n] : in_cycle_by_array_) active[array] += static_cast<int>(n);
  world.CountActive(user_active, active);
  // An array's tasks share their dependencies: each is looked up once per pass.
  std::map<std::string, DependencyState> outcomes;
  WakeParked(world, outcomes);
  std::vector<std::pair<QueuedJob*, std::vector<std::pair<std::string, Dependency>>>> park;
  std::vector<std::pair<int64_t, std::string>> never;
  std::vector<QueuedJob*> admitted;
  capped_.users.clear();
  capped_.pass = pass_;
  auto cap = [&](uint32_t uid, const std::string& owner) {
    capped_.users[uid] = fmt::format(
        "{} has {} jobs running or starting, the most per user "
        "(limits.max_running_jobs_per_user)",
        owner, user_active[uid]);
  };
  // By user: a user at her limit costs one look, not one per job she has waiting.
  // The jobs a capped user's loop examined before her cap say their own reason (noted: what they
  // say depends on it); a user not capped needs no note of it.
  std::vector<int64_t> examined;
  for (auto& [uid, ids] : outside_by_uid_) {
    examined.clear();
    for (int64_t id : ids) {
      QueuedJob& q = jobs_.at(id);
      if (user_active[uid] >= limits_.max_running_per_user) {
        cap(uid, q.owner);
        for (int64_t e : examined) Note(e);
        break;
      }
      if (q.changing) continue;
      q.waiting_pass = pass_;
      examined.push_back(id);
      std::string pending, broken;
      std::vector<std::pair<std::string, Dependency>> pending_on;
      for (const Dependency& d : q.spec->after) {
        std::string key = DependencyText(d);
        auto it = outcomes.find(key);
        if (it == outcomes.end()) it = outcomes.emplace(key, world.Outcome(d)).first;
        if (std::string why = Unmeetable(d, it->second); !why.empty()) {
          broken = why;
          break;
        }
        if (it->second.outcome == DependencyState::kPending) pending_on.emplace_back(key, d);
        if (it->second.outcome == DependencyState::kPending && pending.empty()) {
          pending = fmt::format(
              "waiting for {} to end (after {})",
              d.task >= 0 ? fmt::format("job {}_{}", d.job, d.task) : fmt::format("job {}", d.job),
              key);
        }
      }
      if (!broken.empty()) {
        never.emplace_back(id, broken);
        continue;
      }
      if (!pending.empty()) {
        // Parked until one of them is settled: not looked at again each pass.
        Say(q, pending);
        park.emplace_back(&q, std::move(pending_on));
        continue;
      }
      if (q.array_id != 0 && q.throttle > 0 && active[q.array_id] >= q.throttle) {
        Say(q, fmt::format("array {} runs at most {} tasks at once (%{})", q.array_id, q.throttle,
                           q.throttle));
        continue;
      }
      if (q.array_id != 0 && array_in_cycle[q.array_id] >= limits_.array_window) {
        Say(q, fmt::format("behind the first {} waiting tasks of array {}",
                           array_in_cycle[q.array_id], q.array_id));
        continue;
      }
      if (absl::Status st = world.EnterCycle(q); !st.ok()) {
        spdlog::error("job {}: cannot queue it: {}", id, std::string(st.message()));
        Say(q, std::string(st.message()));
        continue;
      }
      admitted.push_back(&q);
      if (q.array_id != 0) ++active[q.array_id], ++array_in_cycle[q.array_id];
      ++user_active[q.uid];
    }
  }
  for (QueuedJob* q : admitted) SetInCycle(*q, true);
  for (auto& [q, on] : park) SetParked(*q, std::move(on));
  // Jobs whose dependencies can never be met end, so that nobody waits for them forever; their
  // own dependents are settled at a later pass. Changing until the caller has stored their end.
  for (const auto& [id, why] : never) jobs_.at(id).changing = true, Note(id);
  return never;
}

}  // namespace tessera::server
