#include "tessera/server/job_operations.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/server/auto_size.h"
#include "tessera/server/server_util.h"
#include "tessera/server/submit_checks.h"

namespace tessera::server {

absl::StatusOr<JobOperations::Submitted> JobOperations::Submit(JobSpec spec_in,
                                                               const Caller& caller,
                                                               const std::string& idempotency_key) {
  // Who may submit what, and depend on whose jobs, was asked of Rights by the API, before this.
  const std::string& user = caller.user;
  const uint32_t uid = caller.uid;
  std::optional<JobSpec> spec(std::move(spec_in));
  // Room for the store to record every end: no new work once the state folder's disk is nearly
  // full.
  if (absl::Status st = CheckDiskRoom(state_.config, state_.ends->disk_full()); !st.ok()) return st;
  if (absl::Status st = CheckSubmitLimits(*spec, {.config = setup_.config,
                                                  .inventory = setup_.inventory,
                                                  .containers = setup_.containers,
                                                  .containers_off = setup_.containers_off});
      !st.ok()) {
    return st;
  }
  // "auto" resources: sized now, from what jobs of its kind used (stored sized, so that a restart
  // queues the same request); its kind is what it asked, "auto".
  if (!spec->sizing.empty())
    return HttpError(400, "sized: set by the server; ask gpu_share or gpu_memory \"auto\"");
  if (spec->Auto()) {
    SizeAutomatically(*spec, state_.history->Predict(RunKindOf(*spec, user)),
                      SizingPolicyOf(state_.config, setup_.inventory, spec->models));
  }
  // Refuse what can never fit (more GPUs than the machine has, a model it lacks) now, not in the
  // queue: by the scheduler's own test of a GPU against the request.
  const core::Request r = state_.SubmissionFor(*spec, 1, user, uid).entry.request;
  {
    core::MutexLock lock(state_.mu);
    if (absl::Status st =
            CheckFits(*spec, r, state_.engine->scheduler().state().node_spec(0),
                      state_.engine->scheduler().quotas(), setup_.inventory->gpus.size());
        !st.ok()) {
      return st;
    }
  }
  // An array: its indices, within the server's maximum.
  std::optional<ArrayRange> range;
  if (!spec->array.empty()) {
    auto a = ParseArray(spec->array, state_.config.max_array_tasks);
    if (!a.ok()) return HttpError(400, fmt::format("array: {}", std::string(a.status().message())));
    range = *std::move(a);
  }
  const bool held = spec->hold;
  spec->hold = false;  // a state of the job (held, released), not of its spec
  JobRecord rec;
  rec.name = spec->name;
  rec.owner_uid = uid;
  rec.owner = user;
  rec.spec_json = JobSpecToJson(*spec).dump();
  // The user's caps on what waits: an array counts each task, its spec once.
  {
    core::MutexLock lock(state_.mu);
    if (absl::Status st = CheckQueueRoom(state_.config, user, state_.admission.JobsOf(uid),
                                         range ? range->indices.size() : 1,
                                         state_.admission.BytesOf(uid), rec.spec_json.size());
        !st.ok()) {
      return st;
    }
  }
  // Dependencies: on jobs that exist (submitted before this one, so no cycle can form) and that
  // can still turn out as asked (whose they may be was asked of Rights by the API).
  {
    core::MutexLock lock(state_.mu);
    const DependencyLookup look{
        .exists = [&](int64_t job, int task) -> absl::Status {
          if (task < 0) return state_.store.Get(job).status();
          return state_.store.TaskId(job, task).ok() ? absl::OkStatus() : absl::NotFoundError("");
        },
        .outcome =
            [&](const Dependency& d) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return state_.Outcome(d);
            }};  // the lock held above
    if (absl::Status st = CheckDependencies(spec->after, look); !st.ok()) return st;
  }
  rec.priority = spec->priority;
  rec.held = held;
  rec.idempotency_key = idempotency_key;
  if (absl::Status st = CheckIdempotencyKey(idempotency_key); !st.ok()) return st;
  const double now = Now();
  bool existed = false;
  // Durable before the answer; an array's tasks all at once.
  auto id = range ? state_.store.InsertArray(rec, range->indices, now, &existed)
                  : state_.store.Insert(rec, now, &existed);
  if (!id.ok()) return HttpError(500, std::string(id.status().message()));
  if (existed) {
    // A repeat (the client did not hear the first answer): the job it already made, once.
    auto first = state_.store.Get(*id);
    if (!first.ok()) return HttpError(500, std::string(first.status().message()));
    if (first->spec_json != rec.spec_json) {
      return HttpError(422, fmt::format("Idempotency-Key '{}' was used for another submission "
                                        "(job {})",
                                        rec.idempotency_key, *id));
    }
    spdlog::info("job {}: submitted again by {} (same Idempotency-Key): not stored twice", *id,
                 user);
    return Submitted{*std::move(first), true, 0};
  }
  const size_t n = range ? range->indices.size() : 1;
  {
    DispatchState::ChangeLock lock(state_);
    auto shared = std::make_shared<const JobSpec>(*std::move(spec));
    for (size_t i = 0; i < n; ++i) {
      QueuedJob q;
      q.id = *id + static_cast<int64_t>(i);
      q.priority = shared->priority;
      q.owner = user;
      q.uid = uid;
      q.spec = shared;
      q.submitted = q.since = now;
      q.spec_bytes = rec.spec_json.size();
      q.held = held;
      if (range) {
        q.array_id = *id;
        q.array_index = range->indices[i];
        q.throttle = range->throttle;
      }
      state_.Enqueue(std::move(q));
    }
    spdlog::info("job {}: submitted by {}{}{}: {}", *id, user,
                 range ? fmt::format(" (array of {} tasks, {})", n, shared->array) : "",
                 held ? " held" : "", LogText(fmt::format("{}", fmt::join(shared->command, " "))));
  }
  state_.wake.notify_all();
  auto stored = state_.store.Get(*id);
  if (!stored.ok()) return HttpError(500, std::string(stored.status().message()));
  return Submitted{*std::move(stored), false, range ? n : 0};
}

absl::Status JobOperations::Cancel(const std::vector<int64_t>& ids, const std::string& ref,
                                   const JobRecord& first, const std::string& user, bool force) {
  const int64_t id = ids.front();
  const double now = Now();
  const std::string reason = "cancelled by " + user + (force ? " (forced: SIGKILL)" : "");
  DispatchState::ChangeLock lock(state_);
  // Queued ones in one transaction (an array's thousands of tasks among them), stored without the
  // lock while they are kept out of the cycle; running ones are stopped; the rest (ended, or
  // preempted and not queued again) one by one.
  const std::vector<int64_t> queued = state_.BeginChange(ids);
  std::vector<int64_t> others;
  for (int64_t t : ids) {
    if (state_.admission.Contains(t)) continue;
    if (RunningJob* r = state_.runs->Find(t)) {
      state_.runs->RequestStop(*r, "cancel", reason, now);
      if (force) state_.runs->Kill(*r, "cancelled with --force");
    } else if (auto s = state_.starting.find(t); s != state_.starting.end()) {
      s->second.cancelled_by = reason;  // stopped as soon as its process exists
    } else if (state_.finishing.contains(t)) {
      if (ids.size() == 1) {
        state_.EndChange(queued);
        return HttpError(409,
                         fmt::format("job {} has already ended (its end is being recorded)", ref));
      }
    } else {
      others.push_back(t);
    }
  }
  for (int64_t t : others) {
    auto o = t == id ? absl::StatusOr<JobRecord>(first) : state_.store.Get(t);
    if (!o.ok() || IsTerminal(o->state)) {
      if (ids.size() == 1) {
        return HttpError(
            409, fmt::format("job {} has already ended ({})", ref, JobStateName(first.state)));
      }
      continue;
    }
    if (absl::Status st = state_.store.Transition(t, JobState::kCancelled, reason, now); !st.ok()) {
      state_.EndChange(queued);
      return HttpError(500, std::string(st.message()));
    }
  }
  if (!queued.empty()) {
    state_.Publish();  // the running ones' stops
    state_.mu.unlock();
    absl::Status st = state_.store.TransitionMany(queued, JobState::kCancelled, reason, now);
    state_.mu.lock();
    if (st.ok()) {
      for (int64_t t : queued) {
        state_.Dequeue(t);
      }
    }
    state_.EndChange(queued);
    if (!st.ok()) return HttpError(500, std::string(st.message()));
  }
  state_.wake.notify_all();
  return absl::OkStatus();
}

absl::Status JobOperations::Hold(const std::vector<int64_t>& ids, const std::string& ref,
                                 const JobRecord& first, bool hold, const std::string& user) {
  const int64_t id = ids.front();
  const double now = Now();
  DispatchState::ChangeLock lock(state_);  // the jobs' reasons are published before it goes
  // Kept out of the cycle while the change is stored without the lock: those whose state changes.
  const std::vector<int64_t> taken = state_.BeginChange(ids);
  if (ids.size() == 1 && taken.empty()) {  // not queued (any more: BeginChange may have waited)
    auto now_r = state_.store.Get(id);
    return HttpError(409, fmt::format("job {} is {}: only a queued job can be {}", ref,
                                      JobStateName(now_r.ok() ? now_r->state : first.state),
                                      hold ? "held" : "released"));
  }
  std::vector<int64_t> change;
  for (int64_t t : taken) {
    if (state_.admission.Find(t)->held != hold) change.push_back(t);
  }
  absl::Status st;
  if (!change.empty()) {
    const std::string reason = fmt::format("{} by {}", hold ? "held" : "released", user);
    state_.Publish();  // they say a change is being stored
    state_.mu.unlock();
    st = state_.store.SetHeld(change, hold, reason, now);
    state_.mu.lock();
    for (int64_t t : change) {
      if (!st.ok()) break;  // still queued: nothing takes a job that is changing
      state_.admission.SetHeld(t, hold,
                               hold ? fmt::format("held by {} (tessera release {})", user, ref)
                                    : "released; not yet considered");
    }
    // Released: it keeps its place (its submission time), so goes where it would have been.
    if (st.ok()) spdlog::info("job {}: {} ({} job(s))", ref, reason, change.size());
  }
  state_.EndChange(taken);
  if (!st.ok()) return HttpError(500, std::string(st.message()));
  state_.wake.notify_all();
  return absl::OkStatus();
}

JobOperations::Live JobOperations::LiveOf(int64_t id) const {
  Live l;
  const double now = Now();
  const Views::Lookup f = state_.views.Find(id);  // never the scheduling lock
  if (f.queued) {
    const QueuedView& q = *f.queued;
    l.queued = l.known = true;
    l.waiting = WaitingText(q.facts, *f.capped);
    // None: no reservation; infinite: one whose start is unknown (reserved all the same).
    const std::optional<double>& start = q.expected_start;
    if (start && std::isfinite(*start)) l.expected_start = std::max(*start, now);
    l.reserved = start.has_value();
    if (q.spec) l.prediction = state_.history->Predict(RunKindOf(*q.spec, q.owner));
    return l;
  }
  if (f.active == nullptr) return l;
  const ActiveJob& a = *f.active;
  l.known = true;
  l.stopping = a.stopping;
  l.prediction = state_.history->Predict(RunKindOf(*a.spec, a.owner));
  if (!a.starting) {
    l.pid = a.pid;
    if (l.prediction.seconds > 0) l.expected_end = a.started + l.prediction.seconds;
  }
  return l;
}

absl::Status JobOperations::SetPriority(int64_t id, const std::string& ref, const JobRecord& first,
                                        int priority, const Caller& caller) {
  // The caller's right to this priority was asked of Rights by the API, before this.
  const double now = Now();
  DispatchState::ChangeLock lock(state_);  // the job's reason is published before it goes
  // Out of the cycle while the change is stored without the lock; back at its new place after.
  const std::vector<int64_t> change = state_.BeginChange({id});
  if (change.empty()) {  // not queued (any more: BeginChange may have waited)
    auto now_r = state_.store.Get(id);
    return HttpError(409, fmt::format("job {} is {}: only a queued job's priority can change", ref,
                                      JobStateName(now_r.ok() ? now_r->state : first.state)));
  }
  const std::string reason = fmt::format(
      "priority {} -> {} by {}", state_.admission.Find(id)->priority, priority, caller.user);
  state_.Publish();  // it says a change is being stored
  state_.mu.unlock();
  absl::Status st = state_.store.SetPriority(id, priority, reason, now);
  state_.mu.lock();
  if (QueuedJob* q = state_.admission.Find(id); st.ok() && q) {  // nothing takes it meanwhile
    q->priority = priority;
    state_.admission.SetWaiting(id, "priority changed; not yet considered");
    spdlog::info("job {}: {}", id, reason);
  }
  state_.EndChange(change);
  if (!st.ok()) return HttpError(500, std::string(st.message()));
  state_.wake.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<Purged> JobOperations::Purge(const PurgeAges& ages, double now) {
  Purged all;
  Store::Ended logs_from;  // the oldest end: every page of logs up to the cutoff
  for (;;) {
    absl::StatusOr<Purged> page;
    {
      core::MutexLock lock(state_.mu);
      page = state_.retention->PurgePage(ages, now, state_.DependedOn(), &logs_from, "purge");
    }
    if (!page.ok()) return page.status();
    all.jobs += page->jobs;
    all.logs += page->logs;
    all.environments += page->environments;
    if (!page->more) return all;
  }
}

}  // namespace tessera::server
