#include "tessera/sim/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
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

}  // namespace

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
    if (config.predict) {
      auto h = history.find(history_key(i));
      if (h != history.end() && !h->second.empty()) {
        std::vector<double> v(h->second.begin(), h->second.end());
        const size_t at = (3 * v.size() + 3) / 4 - 1;  // the 75th percentile's rank, from 0
        std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
        r.expected_duration_s = v[at];
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

  const int samples = std::max(config.samples, 2);
  const double span = std::max(horizon - start_time, 1.0);
  int next_sample = 0;
  double last_time = start_time, area = 0;
  // A sample every span/(samples-1) seconds; the grid goes on past the estimated end when waiting
  // made the replay longer.
  auto sample_until = [&](double t) {
    for (;;) {
      double ts = start_time + span * next_sample / (samples - 1);
      if (ts > t) break;
      ReplaySample p;
      p.time = ts;
      p.allocated = capacity > 0 ? double(allocated_milli) / double(capacity) : 0;
      p.fragmented_gpus = s.FragmentedMilli() / core::kMilliPerGpu;
      p.queued = static_cast<int64_t>(cycle.size());
      p.running = running;
      out.series.push_back(p);
      ++next_sample;
    }
  };
  auto advance = [&](double t) {
    sample_until(t);
    if (capacity > 0) area += (t - last_time) * double(allocated_milli) / double(capacity);
    last_time = t;
  };
  auto start = [&](size_t i, double now) {
    state[i].running = true;
    state[i].started = now;
    ++running;
    allocated_milli += jobs[i].request.gpu_milli_total();
    if (capacity > 0) {
      out.peak_allocated = std::max(out.peak_allocated, double(allocated_milli) / double(capacity));
    }
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
  while (next_arrival < order.size() || !departures.empty() || !stops.empty()) {
    double now = std::min(next_time(departures), next_time(stops));
    if (next_arrival < order.size()) now = std::min(now, jobs[order[next_arrival]].submit);
    advance(now);
    bool changed = false;
    while (!departures.empty() && std::get<0>(departures.top()) <= now) {
      auto [end, i, epoch] = departures.top();
      departures.pop();
      if (epoch != state[i].epoch || !state[i].running) continue;  // preempted meanwhile
      stop(i);
      state[i].finished = true;
      ++out.finished;
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
      enqueue(order[next_arrival]);
      ++next_arrival;
      changed = true;
    }
    if (changed) step(now);
  }
  double end_time = std::max(last_time, horizon);
  advance(end_time);
  out.end_time = end_time;
  out.mean_allocated = end_time > start_time ? area / (end_time - start_time) : 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (state[i].started >= 0) {
      waits.push_back(state[i].started - jobs[i].submit);
    } else {
      ++out.never_started;
    }
  }
  out.queued_at_end = static_cast<int64_t>(cycle.size());
  out.wait = Summarize(std::move(waits));
  out.jct = Summarize(std::move(jcts));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera::sim
