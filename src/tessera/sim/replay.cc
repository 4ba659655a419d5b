#include "tessera/sim/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>
#include <set>
#include <unordered_set>

#include "fmt/format.h"
#include "tessera/sim/cluster.h"

namespace tessera::sim {
namespace {


std::string ShapeKey(const core::Request& r) {
  std::string k = fmt::format("{}/{}/{}/{}/{}/{}", r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli,
                              r.gpu_memory_mib, r.priority);
  for (const std::string& m : r.models) k += "/" + m;
  return k;
}

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
                       const std::vector<sched::TypicalRequest>& typical, const ReplayConfig& config) {
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
  // Queue: higher priority first, then earlier submission, then trace order.
  using QueueKey = std::tuple<int, double, size_t>;
  std::set<QueueKey> queue;
  auto key_of = [&](size_t i) { return QueueKey{-jobs[i].request.priority, jobs[i].submit, i}; };
  using Departure = std::tuple<double, size_t, int>;  // end time, job, epoch
  std::priority_queue<Departure, std::vector<Departure>, std::greater<>> departures;
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
      p.queued = static_cast<int64_t>(queue.size());
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
    state[i].running = false;
    --running;
    allocated_milli -= jobs[i].request.gpu_milli_total();
  };
  std::unordered_map<std::string, size_t> index_of;
  for (size_t i = 0; i < jobs.size(); ++i) index_of[jobs[i].request.id] = i;

  // Jobs of one shape (resources and priority) fit or not alike: a pass tries each shape once.
  std::vector<std::string> shape_of(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) shape_of[i] = ShapeKey(jobs[i].request);
  auto schedule_pass = [&](double now) {
    std::unordered_set<std::string_view> failed_shapes;
    for (auto it = queue.begin(); it != queue.end();) {
      size_t i = std::get<2>(*it);
      const core::Request& r = jobs[i].request;
      std::string_view shape = shape_of[i];
      if (failed_shapes.contains(shape)) {
        ++it;
        continue;
      }
      auto placed = s.Place(r, now);
      if (!placed.ok() && config.preemption) {
        sched::PreemptionPlan plan = s.PlanPreemption(r, now);
        if (plan.possible && !plan.victims.empty()) {
          for (const std::string& v : plan.victims) {
            auto victim = index_of.find(v);
            if (victim == index_of.end() || !state[victim->second].running) continue;
            if (!s.Release(v).ok()) continue;
            size_t vi = victim->second;
            stop(vi);
            ++state[vi].epoch;
            state[vi].remaining = jobs[vi].duration;
            queue.insert(key_of(vi));
            ++out.preemptions;
          }
          placed = s.Place(r, now);
        }
      }
      if (!placed.ok()) {
        failed_shapes.insert(shape);
        ++it;
        continue;
      }
      it = queue.erase(it);
      start(i, now);
    }
  };

  size_t next_arrival = 0;
  while (next_arrival < order.size() || !departures.empty()) {
    double now = std::numeric_limits<double>::infinity();
    if (next_arrival < order.size()) now = jobs[order[next_arrival]].submit;
    if (!departures.empty()) now = std::min(now, std::get<0>(departures.top()));
    advance(now);
    bool changed = false;
    while (!departures.empty() && std::get<0>(departures.top()) <= now) {
      auto [end, i, epoch] = departures.top();
      departures.pop();
      if (epoch != state[i].epoch || !state[i].running) continue;  // preempted meanwhile
      (void)s.Release(jobs[i].request.id);
      stop(i);
      state[i].finished = true;
      ++out.finished;
      jcts.push_back(end - jobs[i].submit);
      changed = true;
    }
    while (next_arrival < order.size() && jobs[order[next_arrival]].submit <= now) {
      queue.insert(key_of(order[next_arrival]));
      ++next_arrival;
      changed = true;
    }
    if (changed) schedule_pass(now);
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
  out.queued_at_end = static_cast<int64_t>(queue.size());
  out.wait = Summarize(std::move(waits));
  out.jct = Summarize(std::move(jcts));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera::sim
