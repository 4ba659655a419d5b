#include "tessera/server/dispatch_state.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <system_error>

#include "fmt/format.h"
#include "tessera/server/job_spec.h"

namespace tessera::server {

DispatchState::DispatchState(const ServerConfig& config, Rights& rights, Store& store, size_t gpus)
    : config(config),
      rights(rights),
      store(store),
      admission({config.max_running_jobs_per_user, 4 * config.max_starts_per_pass}),
      gpu_healthy(gpus, true),
      gpu_health_reason(gpus),
      gpu_device_healthy(gpus, true),
      gpu_device_reason(gpus),
      gpu_mps_down(gpus) {}

void DispatchState::Publish() {
  MachineView v;
  const auto& state = engine->scheduler().state();
  v.gpus.resize(gpu_healthy.size());
  for (size_t g = 0; g < v.gpus.size(); ++g) {
    const auto& use = state.gpu_use(0, static_cast<int>(g));
    v.gpus[g] = {.healthy = gpu_healthy[g],
                 .reason = gpu_health_reason[g],
                 .milli = use.milli,
                 .memory_mib = use.memory_mib};
  }
  auto list = [&](int64_t id, const std::vector<int>& gpus) {
    for (int g : gpus) {
      if (g >= 0 && static_cast<size_t>(g) < v.gpus.size()) v.gpus[g].jobs.push_back(id);
    }
  };
  for (const auto& [id, r] : runs->jobs()) {
    v.active.emplace(id, ActiveJob{.spec = r.spec,
                                   .owner = r.owner,
                                   .gpus = r.gpus,
                                   .pid = r.pid,
                                   .started = r.started,
                                   .stopping = r.stop.empty() ? "" : r.stop_reason,
                                   .gpu_milli = r.gpu_milli,
                                   .memory_limit_mib = r.memory_limit_mib,
                                   .region = r.region});
    list(id, r.gpus);
  }
  // Being started: recorded as running, its process not yet known here.
  for (const auto& [id, st] : starting) {
    v.active.emplace(id, ActiveJob{.starting = true,
                                   .spec = st.spec,
                                   .owner = st.owner,
                                   .gpus = st.gpus,
                                   .stopping = st.cancelled_by});
    list(id, st.gpus);
  }
  for (GpuView& g : v.gpus) std::ranges::sort(g.jobs);
  const sched::QuotaManager& qm = engine->scheduler().quotas();
  auto add = [&](const std::string& kind, const std::string& name, const std::string& owner) {
    const sched::OwnerQuota* q = qm.Get(owner);
    if (q != nullptr) v.quotas.push_back({kind, name, *q, qm.Used(owner)});
  };
  for (const auto& [user, q] : config.quotas) add("user", user, user);
  for (const auto& [group, q] : config.group_quotas) add("group", group, "group:" + group);
  v.queued = admission.size();
  v.running = runs->size();
  v.scheduling = scheduling;
  views.Publish(std::move(v), queue_changes_, QueuedFacts(), CappedChange());
  queue_changes_.clear();
}

std::vector<std::pair<int64_t, QueuedView>> DispatchState::QueuedFacts() {
  std::vector<int64_t> ids = admission.TakeNoted();
  for (const std::string& noted : engine->TakeNoted()) {
    int64_t id = 0;
    const char* end = noted.data() + noted.size();
    if (auto [p, ec] = std::from_chars(noted.data(), end, id); ec == std::errc() && p == end)
      ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<std::pair<int64_t, QueuedView>> out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    std::optional<WaitingFacts> f = admission.FactsOf(id, admission_world_);
    if (!f) continue;  // left the queue since
    const QueuedJob& q = *admission.Find(id);
    out.emplace_back(id, QueuedView{.spec = q.spec, .owner = q.owner, .facts = *std::move(f)});
    if (q.in_cycle)
      out.back().second.expected_start = engine->cycle().ExpectedStart(std::to_string(id));
  }
  return out;
}

std::shared_ptr<const CappedUsers> DispatchState::CappedChange() {
  if (published_capped_ != nullptr && *published_capped_ == admission.capped()) return nullptr;
  published_capped_ = std::make_shared<const CappedUsers>(admission.capped());
  return published_capped_;
}

void DispatchState::Enqueue(QueuedJob q) {
  queue_changes_.emplace_back(q.id, true);
  admission.Add(std::move(q));
  dirty = true;
}

void DispatchState::Dequeue(int64_t id) {
  admission.Erase(id);
  queue_changes_.emplace_back(id, false);
}

QueuedJob DispatchState::TakeQueued(int64_t id) {
  queue_changes_.emplace_back(id, false);
  return admission.Take(id);
}

std::set<int64_t> DispatchState::DependedOn() const {
  std::set<int64_t> keep;
  for (const auto& [id, q] : admission.jobs()) {
    for (const Dependency& d : q.spec->after) keep.insert(d.job);
  }
  return keep;
}

std::vector<int64_t> DispatchState::BeginChange(const std::vector<int64_t>& ids) {
  changed.wait(mu, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !admission.AnyChanging(ids); });
  return admission.BeginChange(ids, admission_world_);
}

void DispatchState::EndChange(const std::vector<int64_t>& ids) {
  admission.EndChange(ids);
  dirty = true;  // back into the cycle's queue at the next pass
  changed.notify_all();
}

std::vector<std::pair<int64_t, std::string>> DispatchState::Admit() {
  return admission.Admit(admission_world_);
}

sched::Submission DispatchState::SubmissionFor(const JobSpec& spec, int64_t id,
                                               const std::string& owner, uint32_t uid,
                                               double submitted) const {
  sched::Submission s;
  s.entry.submitted = submitted;
  s.entry.seq = static_cast<uint64_t>(id);  // the job number: the queue's third key
  core::Request& r = s.entry.request = RequestOf(spec, id, owner);
  // The groups of its owner (Rights::UserGroups) that have a quota.
  if (!config.group_quotas.empty()) {
    for (const std::string& g : rights.UserGroups(uid)) {
      if (config.group_quotas.contains(g.substr(std::string_view("group:").size())))
        r.quota_groups.push_back(g);
    }
  }
  r.preempts_others = rights.MayPreemptOthers({owner, uid, rights.IsAdmin(owner, uid)});
  s.kind = RunKindOf(spec, owner, r);
  s.requeue = spec.requeue;
  return s;
}

DependencyState DispatchState::Outcome(const Dependency& d) const {
  using S = DependencyState;
  // Queued, starting or running here: not settled. Preempted and lost jobs that are not queued
  // again are over.
  auto active = [&](int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return admission.Contains(id) || runs->contains(id) || starting.contains(id) ||
           finishing.contains(id);
  };
  auto ended = [&](int64_t id, JobState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !active(id) && state != JobState::kQueued && state != JobState::kRunning;
  };
  int64_t id = d.job;
  if (d.task >= 0) {
    auto t = store.TaskId(d.job, d.task);
    if (!t.ok()) return {S::kMissing, fmt::format("job {}_{} does not exist", d.job, d.task)};
    id = *t;
  } else if (active(id)) {
    return {S::kPending, ""};  // an array whose first task has not ended has not either
  }
  auto r = store.Get(id);
  if (!r.ok()) return {S::kMissing, fmt::format("job {} does not exist", id)};
  const std::string name =
      d.task >= 0 ? fmt::format("job {}_{}", d.job, d.task) : fmt::format("job {}", d.job);
  if (d.task < 0 && r->array_id == r->id) {
    auto tasks = store.Tasks(id);
    if (!tasks.ok()) return {S::kPending, ""};  // read again at the next pass
    size_t failed = 0;
    for (const Store::TaskState& t : *tasks) {
      if (!ended(t.id, t.state)) return {S::kPending, ""};
      if (t.state != JobState::kSucceeded) ++failed;
    }
    if (failed == 0) return {S::kOk, fmt::format("every task of array {} succeeded", d.job)};
    return {S::kNotOk, fmt::format("{} of the {} tasks of array {} did not succeed", failed,
                                   tasks->size(), d.job)};
  }
  if (!ended(id, r->state)) return {S::kPending, ""};
  if (r->state == JobState::kSucceeded) return {S::kOk, name + " succeeded"};
  return {S::kNotOk, fmt::format("{} {}", name, JobStateName(r->state))};
}

DependencyState DispatchState::AdmissionWorld::Outcome(const Dependency& dep) {
  s.mu.AssertHeld();
  return s.Outcome(dep);
}

void DispatchState::AdmissionWorld::CountActive(std::map<uint32_t, size_t>& by_user,
                                                std::map<int64_t, int>& by_array) {
  s.mu.AssertHeld();
  for (const auto& [id, r] : s.runs->jobs()) {
    if (r.array_id != 0) ++by_array[r.array_id];
    ++by_user[r.uid];
  }
  for (const auto& [id, st] : s.starting) ++by_user[st.uid];
}

absl::Status DispatchState::AdmissionWorld::EnterCycle(const QueuedJob& q) {
  s.mu.AssertHeld();
  sched::Submission sub = s.SubmissionFor(*q.spec, q.id, q.owner, q.uid, q.submitted);
  sub.entry.request.priority = q.priority;  // the stored one: it may have changed since
  return s.engine->Submit(std::move(sub));
}

void DispatchState::AdmissionWorld::LeaveCycle(int64_t id) {
  s.mu.AssertHeld();
  s.engine->Cancel(std::to_string(id));
}

const std::string* DispatchState::AdmissionWorld::CycleWaiting(int64_t id) const {
  s.mu.AssertHeld();
  return s.engine->cycle().Waiting(std::to_string(id));
}

}  // namespace tessera::server
