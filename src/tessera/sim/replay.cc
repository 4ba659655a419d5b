#include "tessera/sim/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <queue>
#include <unordered_map>

#include "fmt/format.h"
#include "tessera/sched/cycle.h"
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
  };
  std::vector<State> state(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) state[i].remaining = jobs[i].duration;
  // The queue, its order, backfill and preemption planning are the production cycle's.
  sched::Cycle cycle(s, {.preemption = config.preemption,
                         .fair_share_half_life_s = config.fair_share_half_life_s,
                         .reservations = config.reservations});
  // Durations of the jobs finished so far, by owner and shape (config.predict).
  std::unordered_map<std::string, std::deque<double>> history;
  auto history_key = [&](size_t i) {
    return jobs[i].request.owner + '\0' + core::RequestShapeKey(jobs[i].request);
  };
  auto enqueue = [&](size_t i) {
    core::Request r = jobs[i].request;
    if (config.arrival_order) r.priority = 0;
    if (config.expected_duration) {
      r.expected_duration_s = config.expected_duration(i);
    } else {
      // 0 means unknown to the cycle: a prediction of no time at all is a millisecond.
      if (jobs[i].predicted_duration >= 0)
        r.expected_duration_s = std::max(jobs[i].predicted_duration, 1e-3);
      if (config.predict) {
        auto h = history.find(history_key(i));
        if (h != history.end() && !h->second.empty()) {
          std::vector<double> v(h->second.begin(), h->second.end());
          const size_t at = (3 * v.size() + 3) / 4 - 1;  // the 75th percentile's rank, from 0
          std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
          r.expected_duration_s = std::max(v[at], 1e-3);
        }
      }
    }
    (void)cycle.Enqueue(sched::QueueEntry{std::move(r), jobs[i].submit, static_cast<uint64_t>(i)});
  };
  using Departure = std::tuple<double, size_t, int>;  // end time, job, epoch
  std::priority_queue<Departure, std::vector<Departure>, std::greater<>> departures;
  // Victims asked to stop: they hold their resources until the stop latency has passed.
  std::priority_queue<Departure, std::vector<Departure>, std::greater<>> stops;
  int64_t running = 0, allocated_milli = 0;
  std::vector<double> waits, jcts;

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
  auto start = [&](size_t i, double now) {
    last_start = std::max(last_start, now);
    state[i].running = true;
    state[i].started = now;
    ++running;
    allocated_milli += jobs[i].request.gpu_milli_total();
    if (state[i].remaining >= 0) departures.emplace(now + state[i].remaining, i, state[i].epoch);
  };
  auto stop = [&](size_t i) {
    (void)s.Release(jobs[i].request.id);
    state[i].running = false;
    --running;
    allocated_milli -= jobs[i].request.gpu_milli_total();
  };
  std::unordered_map<std::string, size_t> index_of;
  for (size_t i = 0; i < jobs.size(); ++i) index_of[jobs[i].request.id] = i;
  auto step = [&](double now) {
    for (const sched::CycleDecision& d : cycle.Step(now)) {
      if (d.kind == sched::CycleDecision::Kind::kStart) {
        if (config.record_runs)
          out.runs.push_back({d.id, now, d.allocation.node, d.allocation.gpus});
        start(index_of.at(d.id), now);
        continue;
      }
      for (const std::string& v : d.victims) {
        auto victim = index_of.find(v);
        if (victim == index_of.end() || !state[victim->second].running) continue;
        // Asked to stop, a job is preempted when it ends, even if it would have finished first:
        // like the server, which cannot tell a checkpoint-and-exit from a natural end, it starts
        // over.
        State& vs = state[victim->second];
        ++vs.epoch;  // its departure no longer counts
        const double natural_end =
            vs.remaining >= 0 ? vs.started + vs.remaining : now + config.stop_latency_s;
        stops.emplace(std::min(now + config.stop_latency_s, natural_end), victim->second, vs.epoch);
      }
    }
  };
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
      auto [end, i, epoch] = departures.top();
      departures.pop();
      if (epoch != state[i].epoch || !state[i].running) continue;  // preempted meanwhile
      stop(i);
      state[i].finished = true;
      ++out.finished;
      if (config.finished) config.finished(i, jobs[i].duration);
      if (config.predict) {
        std::deque<double>& h = history[history_key(i)];
        h.push_back(jobs[i].duration);
        if (h.size() > 50) h.pop_front();
      }
      jcts.push_back(end - jobs[i].submit);
      changed = true;
    }
    while (!stops.empty() && std::get<0>(stops.top()) <= now) {
      auto [when, i, epoch] = stops.top();
      stops.pop();
      if (epoch != state[i].epoch || !state[i].running) continue;
      stop(i);
      ++state[i].epoch;
      state[i].remaining = jobs[i].duration;  // a preempted job starts over
      enqueue(i);
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
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera::sim
