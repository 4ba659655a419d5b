#include "tessera/sim/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <unordered_map>

#include "fmt/format.h"
#include "tessera/sched/cycle.h"
#include "tessera/sched/engine.h"
#include "tessera/sched/predictor.h"
#include "tessera/sim/cluster.h"

namespace tessera::sim {
namespace {

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  // Nearest rank.
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

// The time-weighted mean of a step function (each event's value holds until the next event) over
// [from, to]; the value at `from` if the interval is empty.
template <typename T>
double Integral(const std::vector<ReplaySample>& events, double from, double to,
                T ReplaySample::*field) {
  if (events.empty()) return 0;
  auto at = [&](size_t k) { return static_cast<double>(events[k].*field); };
  // The last event at or before `from`.
  size_t k = static_cast<size_t>(
      std::upper_bound(events.begin(), events.end(), from,
                       [](double t, const ReplaySample& e) { return t < e.time; }) -
      events.begin());
  k = k == 0 ? 0 : k - 1;
  if (!(to > from)) return at(k);
  double area = 0, t = from;
  for (; k < events.size(); ++k) {
    double next = k + 1 < events.size() ? std::min(events[k + 1].time, to) : to;
    if (next > t) area += (next - t) * at(k);
    t = std::max(t, next);
    if (t >= to) break;
  }
  return area / (to - from);
}

// `n` points evenly over [from, to]; each holds the highest value of each field since the point
// before (the state at that point included), so that a spike shorter than the spacing - a queue
// that fills and drains within minutes of a span of days - still shows. The first point is the
// state at `from`.
std::vector<ReplaySample> Resample(const std::vector<ReplaySample>& events, double from, double to,
                                   int n) {
  std::vector<ReplaySample> out;
  if (events.empty()) return out;
  size_t k = 0;  // the last event at or before the previous point
  while (k + 1 < events.size() && events[k + 1].time <= from) ++k;
  for (int i = 0; i < n; ++i) {
    double t = from + (to - from) * i / (n - 1);
    ReplaySample p = events[k];
    while (k + 1 < events.size() && events[k + 1].time <= t) {
      ++k;
      if (i == 0) {
        p = events[k];
        continue;
      }
      p.allocated = std::max(p.allocated, events[k].allocated);
      p.fragmented_gpus = std::max(p.fragmented_gpus, events[k].fragmented_gpus);
      p.queued = std::max(p.queued, events[k].queued);
      p.running = std::max(p.running, events[k].running);
      p.busy = std::max(p.busy, events[k].busy);
    }
    p.time = t;
    out.push_back(p);
  }
  return out;
}

}  // namespace

void SetBusyPeriod(ReplayResult& r, double from, double to, int samples) {
  r.busy_start = from;
  r.busy_end = to;
  r.busy_mean_allocated = MeanAllocatedOver(r, from, to);
  r.busy_mean_queued = Integral(r.events, from, to, &ReplaySample::queued);
  // A tenth of the busy period after it: where the queue has drained.
  const double busy = std::max(to - from, 1.0);
  r.series = Resample(r.events, from, std::min(from + 1.1 * busy, std::max(r.end_time, from + 1)),
                      std::max(samples, 2));
}

double MeanAllocatedOver(const ReplayResult& r, double from, double to) {
  return Integral(r.events, from, to, &ReplaySample::allocated);
}

double MeanBusyOver(const ReplayResult& r, double from, double to) {
  return Integral(r.events, from, to, &ReplaySample::busy);
}

void AlignBusyPeriods(std::vector<ReplayResult>& runs) {
  if (runs.empty()) return;
  double from = runs[0].busy_start, to = runs[0].busy_end;
  for (const ReplayResult& r : runs) {
    from = std::min(from, r.busy_start);
    to = std::max(to, r.busy_end);
  }
  for (ReplayResult& r : runs) SetBusyPeriod(r, from, to, static_cast<int>(r.series.size()));
}

std::string GpuSizeClass(const core::Request& r) {
  if (r.gpus <= 0) return r.wants_gpu() ? "share" : "cpu";
  if (r.gpus >= 5) return "5+";
  if (r.gpus >= 3) return "3-4";
  return std::to_string(r.gpus);
}

Distribution Summarize(std::vector<double> values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  d.p50 = Percentile(values, 0.50);
  d.p95 = Percentile(values, 0.95);
  d.p99 = Percentile(values, 0.99);
  d.max = values.back();
  return d;
}

ReplayResult RunReplay(const std::vector<core::NodeSpec>& nodes, const std::vector<SimJob>& jobs,
                       const std::vector<sched::TypicalRequest>& typical,
                       const ReplayConfig& config) {
  auto t0 = std::chrono::steady_clock::now();
  ReplayResult out;
  out.label = config.label;
  out.seed = config.seed;
  out.jobs = static_cast<int64_t>(jobs.size());
  int64_t capacity = 0;
  auto scheduler = NewSimScheduler(nodes, typical, config.policies, config.seed, &capacity);
  sched::Scheduler& s = *scheduler;

  std::vector<size_t> order(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs[a].submit < jobs[b].submit; });
  double start_time = jobs.empty() ? 0 : jobs[order.front()].submit;
  double horizon = start_time;
  for (const SimJob& j : jobs) horizon = std::max(horizon, j.submit + std::max(j.duration, 0.0));

  struct State {
    double started = -1;
    double remaining = 0;  // a preempted job starts over
    int epoch = 0;
    bool running = false, finished = false;
    // Interference (config.interference): the GPU a running share is on, the work it has left
    // (seconds at full speed) as of `since`, its rate since then (0 until its departure is set),
    // and the generation of its departure (moved when the rate changes).
    int64_t gpu_key = -1;
    double work_left = 0, since = 0, rate = 1;
    int gen = 0;
    double end = 0;  // when its departure is due (the natural end a stop is compared with)
    std::vector<int64_t> gpu_keys;  // the GPUs it holds, whole or shared (the busy figure)
  };
  std::vector<State> state(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) state[i].remaining = jobs[i].duration;
  // What the engine decides, carried out on the simulated clock (set below).
  struct Executor : sched::Executor {
    std::function<void(const std::string&, const sched::Allocation&, double)> start;
    std::function<void(const std::vector<std::string>&, double)> stop;
    void Start(const std::string& id, const sched::Allocation& a, double now) override {
      start(id, a, now);
    }
    void Stop(const std::vector<std::string>& victims, const std::string&, const std::string&,
              double now) override {
      stop(victims, now);
    }
  } executor;
  // The queue, its order, backfill, preemption planning, requeue after preemption and run-time
  // predictions (config.predict: from the jobs finished so far) are the production engine's.
  sched::Engine engine(std::move(scheduler), executor,
                       {.cycle = {.preemption = config.preemption,
                                  .fair_share_half_life_s = config.fair_share_half_life_s,
                                  .reservations = config.reservations},
                        .requeue_preempted = config.requeue_preempted,
                        .utilization_ceiling_pct = config.utilization_ceiling_pct,
                        .utilization_ceiling_strict = config.utilization_ceiling_strict});
  const sched::Cycle& cycle = engine.cycle();
  auto kind_of = [&](size_t i) {
    const SimJob& j = jobs[i];
    return sched::RunKind{.user = j.request.owner,
                          .name = j.name,
                          .command = j.command,
                          .shape = sched::HistoryShape(j.request, j.tasks),
                          .max_runtime_s = j.max_runtime_s};
  };
  auto enqueue = [&](size_t i) {
    core::Request r = jobs[i].request;
    if (config.arrival_order) r.priority = 0;
    // The trace's own prediction, where it has one (0 means unknown to the cycle: a prediction of
    // no time at all is a millisecond); history's replaces it (config.predict).
    if (jobs[i].predicted_duration >= 0)
      r.expected_duration_s = std::max(jobs[i].predicted_duration, 1e-3);
    sched::Submission sub{sched::QueueEntry{std::move(r), jobs[i].submit, static_cast<uint64_t>(i)},
                          std::nullopt, std::nullopt};
    if (config.predict) sub.kind = kind_of(i);
    (void)engine.Submit(std::move(sub));
  };
  using Departure = std::tuple<double, size_t, int, int>;  // end time, job, epoch, generation
  std::priority_queue<Departure, std::vector<Departure>, std::greater<>> departures;
  // Victims asked to stop: they hold their resources until the stop latency has passed.
  std::priority_queue<Departure, std::vector<Departure>, std::greater<>> stops;
  int64_t running = 0, allocated_milli = 0;
  // How busy each GPU (node << 8 | GPU) is: its holders' summed utilization, and the sum over GPUs
  // of that up to 100%.
  std::unordered_map<int64_t, double> load_on;
  double busy_pct = 0;
  const double gpu_count = static_cast<double>(capacity) / core::kMilliPerGpu;
  auto add_load = [&](int64_t key, double pct) {
    double& load = load_on[key];
    busy_pct -= std::min(100.0, load);
    load = std::max(0.0, load + pct);
    busy_pct += std::min(100.0, load);
  };
  std::vector<double> waits, jcts;
  std::map<int, std::vector<double>> jct_by_priority, slowdown_by_priority;

  // The state after every event (the report resamples it over the busy period and the whole
  // replay); the time-weighted means are integrals of this step function.
  std::vector<ReplaySample> events;
  auto record = [&](double t) {
    ReplaySample p;
    p.time = t;
    p.allocated = capacity > 0 ? double(allocated_milli) / double(capacity) : 0;
    p.fragmented_gpus = s.FragmentedMilli() / core::kMilliPerGpu;
    p.queued = static_cast<int64_t>(cycle.size());
    p.running = running;
    p.busy = gpu_count > 0 ? std::max(0.0, busy_pct) / (100 * gpu_count) : 0;
    if (!events.empty() && events.back().time == t) {
      events.back() = p;
    } else {
      events.push_back(p);
    }
    // Starts raise allocation only within a step, so the state after it holds the peak.
    out.peak_allocated = std::max(out.peak_allocated, p.allocated);
    out.peak_queued = std::max(out.peak_queued, p.queued);
  };
  double last_arrival = start_time, last_start = start_time;
  // Interference: the running shares of each GPU (node << 8 | GPU), and their rates moved to
  // what the GPU can serve whenever that set changes.
  std::unordered_map<int64_t, std::vector<size_t>> shares_on;
  auto demand = [&](size_t i) {
    return jobs[i].utilization >= 0 ? jobs[i].utilization : jobs[i].request.gpu_milli / 10.0;
  };
  // The rate each share on a GPU progresses at: all alike, or by priority
  // (config.interference_priorities): each priority from what the higher ones leave.
  auto rate_of = [&](const std::vector<size_t>& on, size_t j) {
    if (!config.interference_priorities) {
      double total = 0;
      for (size_t k : on) total += demand(k);
      return total > 100 ? 100 / total : 1.0;
    }
    const int mine = jobs[j].request.priority;
    std::map<int, double, std::greater<>> level;  // priority -> summed demand
    for (size_t k : on) level[jobs[k].request.priority] += demand(k);
    double left = 100;
    for (auto it = level.begin(); it != level.end(); ++it) {
      double rate = it->second > left ? std::max(0.0, left) / it->second : 1.0;
      if (std::next(it) != level.end()) rate *= config.priority_share_efficiency;
      if (it->first == mine) return rate;
      left -= it->second * rate;
    }
    return 1.0;
  };
  auto rebalance = [&](int64_t key, double now) {
    const std::vector<size_t>& on = shares_on[key];
    for (size_t j : on) {
      const double rate = rate_of(on, j);
      State& st = state[j];
      if (st.rate == rate) continue;  // its departure stands
      st.work_left = std::max(0.0, st.work_left - (now - st.since) * st.rate);
      st.since = now;
      st.rate = rate;
      ++st.gen;         // the departure set before no longer counts
      if (rate <= 0) {  // held back by higher priorities: no departure until it moves
        st.end = std::numeric_limits<double>::infinity();
        continue;
      }
      st.end = now + st.work_left / rate;
      departures.emplace(st.end, j, st.epoch, st.gen);
    }
  };
  // How busy a job keeps each GPU it holds, in percent.
  auto load = [&](size_t i) {
    if (jobs[i].request.fractional()) return demand(i);
    return jobs[i].utilization >= 0 ? jobs[i].utilization : 100.0;
  };
  auto start = [&](size_t i, double now, const sched::Allocation& a) {
    last_start = std::max(last_start, now);
    State& st = state[i];
    st.running = true;
    st.started = now;
    ++running;
    allocated_milli += jobs[i].request.gpu_milli_total();
    for (int g : a.gpus) {
      st.gpu_keys.push_back((int64_t{a.node} << 8) | g);
      add_load(st.gpu_keys.back(), load(i));
    }
    if (st.remaining < 0) return;  // runs to the end of the replay
    // Modelled for a share of one GPU; one of several GPUs runs at its own pace.
    if (config.interference && jobs[i].request.fractional() && a.gpus.size() == 1) {
      st.gpu_key = (int64_t{a.node} << 8) | a.gpus[0];
      st.work_left = st.remaining, st.since = now, st.rate = 0;  // no departure yet
      st.end = std::numeric_limits<double>::infinity();
      shares_on[st.gpu_key].push_back(i);
      rebalance(st.gpu_key, now);
      return;
    }
    st.end = now + st.remaining;
    departures.emplace(st.end, i, st.epoch, st.gen);
  };
  auto stop = [&](size_t i, double now) {
    State& st = state[i];
    st.running = false;
    --running;
    allocated_milli -= jobs[i].request.gpu_milli_total();
    for (int64_t key : st.gpu_keys) add_load(key, -load(i));
    st.gpu_keys.clear();
    if (st.gpu_key >= 0) {
      std::vector<size_t>& on = shares_on[st.gpu_key];
      on.erase(std::find(on.begin(), on.end(), i));
      rebalance(st.gpu_key, now);
      st.gpu_key = -1;
    }
  };
  std::vector<double> slowdowns;
  std::unordered_map<std::string, size_t> index_of;
  for (size_t i = 0; i < jobs.size(); ++i) index_of[jobs[i].request.id] = i;
  executor.start = [&](const std::string& id, const sched::Allocation& a, double now) {
    if (config.record_runs) out.runs.push_back({id, now, a.node, a.gpus});
    start(index_of.at(id), now, a);
  };
  executor.stop = [&](const std::vector<std::string>& victims, double now) {
    for (const std::string& v : victims) {
      auto victim = index_of.find(v);
      if (victim == index_of.end() || !state[victim->second].running) continue;
      // Asked to stop, a job is preempted when it ends, even if it would have finished first:
      // like the server, which cannot tell a checkpoint-and-exit from a natural end, it starts
      // over.
      State& vs = state[victim->second];
      ++vs.epoch;  // its departure no longer counts
      const double natural_end = vs.remaining >= 0 ? vs.end : now + config.stop_latency_s;
      stops.emplace(std::min(now + config.stop_latency_s, natural_end), victim->second, vs.epoch,
                    0);
    }
  };
  auto step = [&](double now) { engine.Step(now); };
  auto next_time = [](const auto& q) {
    return q.empty() ? std::numeric_limits<double>::infinity() : std::get<0>(q.top());
  };

  size_t next_arrival = 0;
  record(start_time);
  while (next_arrival < order.size() || !departures.empty() || !stops.empty()) {
    double now = std::min(next_time(departures), next_time(stops));
    if (next_arrival < order.size()) now = std::min(now, jobs[order[next_arrival]].submit);
    bool changed = false;
    while (!departures.empty() && std::get<0>(departures.top()) <= now) {
      auto [end, i, epoch, gen] = departures.top();
      departures.pop();
      // Preempted meanwhile, or its end moved (interference).
      if (epoch != state[i].epoch || gen != state[i].gen || !state[i].running) continue;
      const double ran = end - state[i].started;
      stop(i, end);
      engine.Ended(jobs[i].request.id);
      state[i].finished = true;
      ++out.finished;
      if (jobs[i].request.fractional() && jobs[i].duration > 0)
        slowdowns.push_back(ran / jobs[i].duration);
      if (config.predict) {
        engine.history().Add(
            kind_of(i), ran,
            jobs[i].utilization >= 0 ? std::optional<double>(jobs[i].utilization) : std::nullopt);
      }
      jcts.push_back(end - jobs[i].submit);
      jct_by_priority[jobs[i].request.priority].push_back(jcts.back());
      if (jobs[i].duration >= 1)
        slowdown_by_priority[jobs[i].request.priority].push_back(jcts.back() / jobs[i].duration);
      changed = true;
    }
    while (!stops.empty() && std::get<0>(stops.top()) <= now) {
      auto [when, i, epoch, gen] = stops.top();
      stops.pop();
      if (epoch != state[i].epoch || !state[i].running) continue;
      stop(i, when);
      ++state[i].epoch;
      state[i].remaining = jobs[i].duration;  // a preempted job starts over
      // Queued again (config.requeue_preempted), under its id and in its place.
      (void)engine.Stopped(jobs[i].request.id, sched::StopCause::kPreempted);
      ++out.preemptions;
      changed = true;
    }
    while (next_arrival < order.size() && jobs[order[next_arrival]].submit <= now) {
      last_arrival = jobs[order[next_arrival]].submit;
      enqueue(order[next_arrival]);
      ++next_arrival;
      changed = true;
    }
    if (changed) {
      step(now);
      record(now);
    }
  }
  const double end_time = std::max(events.back().time, horizon);
  out.end_time = end_time;
  out.busy_start = start_time;
  out.busy_end = std::max({last_arrival, last_start, start_time});
  out.mean_allocated = Integral(events, start_time, end_time, &ReplaySample::allocated);
  out.events = std::move(events);
  const int samples = std::max(config.samples, 2);
  out.whole = Resample(out.events, start_time, std::max(end_time, start_time + 1), samples);
  SetBusyPeriod(out, out.busy_start, out.busy_end, samples);
  std::map<std::string, std::vector<double>> by_size;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (state[i].started >= 0) {
      waits.push_back(state[i].started - jobs[i].submit);
      by_size[GpuSizeClass(jobs[i].request)].push_back(waits.back());
    } else {
      ++out.never_started;
    }
  }
  for (auto& [size, w] : by_size) out.wait_by_gpus[size] = Summarize(std::move(w));
  out.queued_at_end = static_cast<int64_t>(cycle.size());
  std::sort(waits.begin(), waits.end());
  out.waits = waits;
  out.wait = Summarize(std::move(waits));
  out.jct = Summarize(std::move(jcts));
  for (auto& [p, v] : jct_by_priority) out.jct_by_priority[p] = Summarize(std::move(v));
  for (auto& [p, v] : slowdown_by_priority) out.slowdown_by_priority[p] = Summarize(std::move(v));
  for (const SimJob& j : jobs) out.utilization_known = out.utilization_known || j.utilization >= 0;
  if (!slowdowns.empty()) {
    double sum = 0;
    for (double x : slowdowns) {
      sum += x;
      out.share_slowdown_max = std::max(out.share_slowdown_max, x);
    }
    out.share_slowdown_mean = sum / static_cast<double>(slowdowns.size());
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera::sim
