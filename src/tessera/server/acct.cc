#include "tessera/server/acct.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "nlohmann/json.hpp"
#include "tessera/server/efficiency.h"

namespace tessera::server {
namespace {

using nlohmann::json;

struct Gpus {
  std::vector<std::pair<std::string, double>> weights;  // model, GPUs (1, or the fraction)
  bool fractional = false;
};

Gpus Weigh(const std::string& placement_json, const AcctOptions& o) {
  Gpus g;
  json p = json::parse(placement_json, nullptr, false);
  if (!p.is_object() || !p.contains("gpus") || !p["gpus"].is_array()) return g;
  // A whole GPU is placed as all its compute and memory; a fraction as its share and memory.
  const int milli = p.value("milli_per_gpu", 0);
  const int64_t memory = p.value("memory_mib_per_gpu", int64_t{0});
  for (const json& x : p["gpus"]) {
    if (!x.is_object()) continue;
    const int64_t total = o.gpu_memory_mib ? o.gpu_memory_mib(x.value("index", -1)) : 0;
    const double w = HeldOfGpu(milli, memory, total);
    g.fractional = g.fractional || w < 1;
    g.weights.emplace_back(x.value("model", "unknown"), w);
  }
  return g;
}

void Sort(std::map<std::string, AcctLine>& lines, std::vector<AcctLine>* out) {
  for (auto& [key, line] : lines) {
    line.key = key;
    out->push_back(line);
  }
  std::stable_sort(out->begin(), out->end(), [](const AcctLine& a, const AcctLine& b) {
    return a.gpu_seconds > b.gpu_seconds;
  });
}

double Round1(double v) { return std::round(v * 10) / 10; }

// What a job used of what it held (efficiency.h's fractions, 0..1; -1 where not measured): its
// GPU busy share, its GPU memory peak of what it was given per GPU (at most all of it).
struct Use {
  double busy = -1, memory = -1;
};
Use UseOf(const std::string& usage_json, const std::string& placement_json) {
  const json usage = json::parse(usage_json, nullptr, false);
  const json p = json::parse(placement_json, nullptr, false);
  return {GpuBusyFraction(usage, p).value_or(-1),
          std::min(1.0, GpuMemoryFraction(usage, p).value_or(-1))};
}

// `part` of `whole` in percent, one decimal; null when nothing was measured.
json PctOf(double part, double whole) {
  return whole > 0 ? json(Round1(100 * part / whole)) : json();
}

json LineJson(const AcctLine& l) {
  return {{"key", l.key},
          {"jobs", l.jobs},
          {"succeeded", l.succeeded},
          {"failed", l.failed},
          {"cancelled", l.cancelled},
          {"running", l.running},
          {"gpu_hours", l.gpu_seconds / 3600},
          {"whole_gpu_hours", l.whole_gpu_seconds / 3600},
          {"fractional_gpu_hours", l.fractional_gpu_seconds / 3600},
          {"measured_gpu_hours", l.measured_gpu_seconds / 3600},
          {"gpu_busy_pct", PctOf(l.busy_gpu_seconds, l.measured_gpu_seconds)},
          {"gpu_memory_used_pct", PctOf(l.memory_used_gpu_seconds, l.memory_measured_gpu_seconds)},
          {"started", l.started},
          {"mean_wait_s", l.started > 0 ? l.wait_seconds / static_cast<double>(l.started) : 0.0},
          {"max_wait_s", l.max_wait_seconds}};
}

// The GPU-seconds inside [since, until] of a job whose placement lists its sizes over time
// ({"at", "gpus"}, from its run's start); nullopt when it lists none.
std::optional<double> ResizedGpuSeconds(const AcctJob& j, double since, double until) {
  const json p = json::parse(j.placement_json, nullptr, false);
  if (!p.is_object() || !p.contains("sizes") || !p["sizes"].is_array() || p["sizes"].empty())
    return std::nullopt;
  std::vector<std::pair<double, int>> sizes;
  for (const json& z : p["sizes"]) {
    if (z.is_object() && z.contains("at") && z["at"].is_number())
      sizes.emplace_back(z["at"].get<double>(), std::max(0, z.value("gpus", 0)));
  }
  if (sizes.empty()) return std::nullopt;
  double gs = 0;
  for (const AcctJob::Run& run : j.runs) {
    const double run_from = std::max(run.start, since);
    const double run_to = std::min(run.end.value_or(until), until);
    for (size_t i = 0; i < sizes.size(); ++i) {
      // The first size counts from the run's start; each until the next.
      const double from = std::max(run_from, i == 0 ? run.start : sizes[i].first);
      const double to = std::min(run_to, i + 1 < sizes.size() ? sizes[i + 1].first : run_to);
      if (to > from) gs += sizes[i].second * (to - from);
    }
  }
  return gs;
}

}  // namespace

AcctReport Account(const std::vector<AcctJob>& jobs, const AcctOptions& o) {
  AcctReport r;
  r.since = o.since;
  r.until = o.until;
  std::map<std::string, AcctLine> users, groups, models;
  for (const AcctJob& j : jobs) {
    const bool ended_in = j.ended_at && *j.ended_at >= o.since && *j.ended_at <= o.until;
    bool ran_in = false, running_at_end = false;
    for (const AcctJob::Run& run : j.runs) {
      const double end = run.end.value_or(o.until);
      if (run.start <= o.until && end >= o.since) ran_in = true;
      if (run.start <= o.until && (!run.end || *run.end > o.until)) running_at_end = true;
    }
    const bool submitted_in = j.submitted_at >= o.since && j.submitted_at <= o.until;
    if (!ended_in && !ran_in && !submitted_in) continue;
    const std::string group = o.group_of ? o.group_of(j.owner_uid) : "";
    const Gpus g = Weigh(j.placement_json, o);
    std::vector<AcctLine*> lines = {&r.total, &users[j.owner]};
    if (!group.empty()) lines.push_back(&groups[group]);
    // Its models: each counts the job once.
    std::vector<AcctLine*> all = lines;
    for (const auto& [model, weight] : g.weights) {
      AcctLine* m = &models[model];
      if (std::find(all.begin(), all.end(), m) == all.end()) all.push_back(m);
    }
    for (AcctLine* l : all) {
      ++l->jobs;
      if (ended_in) {
        if (j.state == JobState::kSucceeded) ++l->succeeded;
        if (j.state == JobState::kFailed || j.state == JobState::kLost) ++l->failed;
        if (j.state == JobState::kCancelled) ++l->cancelled;
      }
      if (running_at_end) ++l->running;
    }
    // Waits: from submission (or the end of the run before, for a re-queued job) to each start.
    double ready = j.submitted_at;
    for (const AcctJob::Run& run : j.runs) {
      if (run.start >= o.since && run.start <= o.until) {
        const double wait = std::max(0.0, run.start - ready);
        for (AcctLine* l : all) {
          ++l->started;
          l->wait_seconds += wait;
          l->max_wait_seconds = std::max(l->max_wait_seconds, wait);
        }
      }
      ready = run.end.value_or(run.start);
    }
    // GPU time inside the period, per GPU it had.
    double seconds = 0;
    for (const AcctJob::Run& run : j.runs) {
      const double from = std::max(run.start, o.since);
      const double to = std::min(run.end.value_or(o.until), o.until);
      if (to > from) seconds += to - from;
    }
    if (seconds <= 0) continue;
    const Use use = UseOf(j.usage_json, j.placement_json);
    // An elastic job resized while it ran: its GPUs over time (its sizes), each model its part of
    // its last placement.
    const std::optional<double> resized = ResizedGpuSeconds(j, o.since, o.until);
    double job_gpu_seconds = 0;
    for (const auto& [model, weight] : g.weights) {
      const double gs =
          resized ? *resized / static_cast<double>(g.weights.size()) : weight * seconds;
      job_gpu_seconds += gs;
      std::vector<AcctLine*> with_model = lines;
      with_model.push_back(&models[model]);
      for (AcctLine* l : with_model) {
        l->gpu_seconds += gs;
        (g.fractional ? l->fractional_gpu_seconds : l->whole_gpu_seconds) += gs;
        if (use.busy >= 0) l->measured_gpu_seconds += gs, l->busy_gpu_seconds += use.busy * gs;
        if (use.memory >= 0) {
          l->memory_measured_gpu_seconds += gs;
          l->memory_used_gpu_seconds += use.memory * gs;
        }
      }
    }
    if (use.busy >= 0 && use.busy < 1 && job_gpu_seconds > 0) {
      r.most_idle.push_back(
          {j.id, j.owner, j.name, job_gpu_seconds, use.busy, job_gpu_seconds * (1 - use.busy)});
    }
  }
  auto idler = [](const AcctIdleJob& a, const AcctIdleJob& b) {
    return a.idle_gpu_seconds != b.idle_gpu_seconds ? a.idle_gpu_seconds > b.idle_gpu_seconds
                                                    : a.id < b.id;
  };
  const size_t kept = std::min(kMostIdle, r.most_idle.size());
  std::partial_sort(r.most_idle.begin(), r.most_idle.begin() + static_cast<ptrdiff_t>(kept),
                    r.most_idle.end(), idler);
  r.most_idle.resize(kept);
  r.total.key = "total";
  Sort(users, &r.by_user);
  Sort(groups, &r.by_group);
  Sort(models, &r.by_model);
  return r;
}

json AcctJson(const AcctReport& r) {
  json j;
  j["since"] = r.since;
  j["until"] = r.until;
  j["total"] = LineJson(r.total);
  for (const char* by : {"user", "group", "model"}) {
    const std::vector<AcctLine>& lines = std::string(by) == "user"    ? r.by_user
                                         : std::string(by) == "group" ? r.by_group
                                                                      : r.by_model;
    json a = json::array();
    for (const AcctLine& l : lines) a.push_back(LineJson(l));
    j[std::string("by_") + by] = a;
  }
  json idle = json::array();
  for (const AcctIdleJob& x : r.most_idle) {
    idle.push_back({{"id", x.id},
                    {"owner", x.owner},
                    {"name", x.name},
                    {"gpu_hours", x.gpu_seconds / 3600},
                    {"gpu_busy_pct", Round1(100 * x.busy)},
                    {"idle_gpu_hours", x.idle_gpu_seconds / 3600}});
  }
  j["most_idle"] = std::move(idle);
  return j;
}

absl::StatusOr<std::vector<AcctJob>> AcctJobs(Store& store, double since, double until) {
  auto records = store.ListPeriod(since, until);
  if (!records.ok()) return records.status();
  auto events = store.EventsOfPeriod(since, until);
  if (!events.ok()) return events.status();
  std::vector<AcctJob> out;
  out.reserve(records->size());
  size_t e = 0;
  for (const JobRecord& r : *records) {
    AcctJob j;
    j.id = r.id;
    j.owner = r.owner;
    j.name = r.name;
    j.owner_uid = r.owner_uid;
    j.state = r.state;
    j.submitted_at = r.submitted_at;
    if (IsTerminal(r.state)) j.ended_at = r.ended_at;
    j.placement_json = r.placement_json;
    j.usage_json = r.usage_json;
    // Both are in job order: its events are the next run of them.
    while (e < events->size() && (*events)[e].job_id < r.id) ++e;
    for (; e < events->size() && (*events)[e].job_id == r.id; ++e) {
      const JobEvent& ev = (*events)[e];
      // Running again while it runs: resized (started again on a new size), the same run.
      if (ev.state == JobState::kRunning && !j.runs.empty() && !j.runs.back().end) continue;
      if (!j.runs.empty() && !j.runs.back().end) j.runs.back().end = ev.at;
      if (ev.state == JobState::kRunning) j.runs.push_back({ev.at, std::nullopt});
    }
    // A run the store says is over though no event ended it (never, but not forever either).
    if (!j.runs.empty() && !j.runs.back().end && r.state != JobState::kRunning)
      j.runs.back().end = r.ended_at.value_or(j.runs.back().start);
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace tessera::server
