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
#include "nlohmann/json.hpp"
#include "tessera/core/numeric.h"
#include "tessera/sched/cycle.h"
#include "tessera/sched/engine.h"
#include "tessera/sched/predictor.h"
#include "tessera/sim/cluster.h"

namespace tessera::sim {
namespace {

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
  d.p50 = core::PercentileOfSorted(values, 0.50);
  d.p95 = core::PercentileOfSorted(values, 0.95);
  d.p99 = core::PercentileOfSorted(values, 0.99);
  d.max = values.back();
  return d;
}

namespace {

// One replay: the jobs' states, the simulated clock's queues of departures and stops, and what is
// measured, around the production engine (RunReplay).
class Replay final : public sched::Executor {
 public:
  Replay(const std::vector<core::NodeSpec>& nodes, const std::vector<SimJob>& jobs,
         const std::vector<sched::TypicalRequest>& typical, const ReplayConfig& config);
  ReplayResult Run();

  // sched::Executor: what the engine decides, carried out on the simulated clock.
  void Start(const std::string& id, const sched::Allocation& a, double now) override;
  void Stop(const std::vector<std::string>& victims, const std::string&, const std::string&,
            double now) override;
  bool Resizes() const override { return out_.elastic_jobs > 0; }
  void Resize(const std::string& id, const sched::Allocation& holds, double now) override;

 private:
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
    int64_t held_milli = 0;         // GPU compute it holds
    // Elastic: its GPUs now (the speed it runs at); a resize under way: its new size and GPUs,
    // and when the job has checkpointed for it (asked + the stop latency).
    int gpus = 0, resize_to = 0;
    std::vector<int> resize_gpus;
    double resize_at = 0;
    sched::NodeId node = -1;
  };
  using Departure = std::tuple<double, size_t, int, int>;  // end time, job, epoch, generation
  using Departures = std::priority_queue<Departure, std::vector<Departure>, std::greater<>>;

  sched::RunKind KindOf(size_t i) const;
  void Enqueue(size_t i);
  // A share's demand on its GPU (percent): its utilization, else its compute share.
  double Demand(size_t i) const;
  // How busy a job keeps each GPU it holds, in percent.
  double Load(size_t i) const;
  void AddLoad(int64_t key, double pct);
  // The rate share `j` progresses at among the shares `on` one GPU: all alike, or by priority
  // (config.interference_priorities): each priority from what the higher ones leave.
  double RateOf(const std::vector<size_t>& on, size_t j) const;
  // Moves the rates (and departures) of the shares of GPU `key` to what it can serve now.
  void Rebalance(int64_t key, double now);
  void StartJob(size_t i, double now, const sched::Allocation& a);
  void StopJob(size_t i, double now);
  void Record(double t);
  bool Depart(double now);      // the departures due by `now`; whether any
  bool EndStops(double now);    // the stops due by `now`; whether any
  bool EndResizes(double now);  // the resizes due by `now`; whether any
  // Elastic: how fast it runs on `n` GPUs, relative to its traced size (Amdahl's law).
  double Speed(size_t i, int n) const;
  // Elastic: holds `gpus` of `node` now (the busy and allocated figures).
  void Hold(size_t i, sched::NodeId node, const std::vector<int>& gpus);
  // Elastic: from `now` (after `pause` without progress) it runs on `n` GPUs.
  void Reschedule(size_t i, double now, double pause, int n);
  void Summarize(double start_time, double horizon);

  const std::vector<SimJob>& jobs_;
  const ReplayConfig& config_;
  ReplayResult out_;
  int64_t capacity_ = 0;
  sched::Scheduler* scheduler_ = nullptr;  // the engine's
  std::unique_ptr<sched::Engine> engine_;
  std::vector<State> state_;
  std::unordered_map<std::string, size_t> index_of_;
  Departures departures_;
  Departures stops_;    // victims asked to stop hold their resources until the stop latency passed
  Departures resizes_;  // elastic jobs checkpointing for a resize, until the stop latency passed
  // By job: elastic, made so (ReplayConfig::elastic: its request halved at its arrival) or as it
  // arrived (core::Request::resizable).
  std::vector<bool> elastic_, made_elastic_;
  int64_t running_ = 0, allocated_milli_ = 0;
  // How busy each GPU (node << 8 | GPU) is: its holders' summed utilization, and the sum over GPUs
  // of that up to 100%.
  std::unordered_map<int64_t, double> load_on_;
  double busy_pct_ = 0;
  double gpu_count_ = 0;
  // Interference: the running shares of each GPU (node << 8 | GPU).
  std::unordered_map<int64_t, std::vector<size_t>> shares_on_;
  std::vector<double> jcts_, slowdowns_;
  std::map<std::string, std::vector<double>> jct_by_gpus_;
  std::map<int, std::vector<double>> jct_by_priority_, slowdown_by_priority_;
  // The state after every event (the report resamples it over the busy period and the whole
  // replay); the time-weighted means are integrals of this step function.
  std::vector<ReplaySample> events_;
  double last_arrival_ = 0, last_start_ = 0;
};

Replay::Replay(const std::vector<core::NodeSpec>& nodes, const std::vector<SimJob>& jobs,
               const std::vector<sched::TypicalRequest>& typical, const ReplayConfig& config)
    : jobs_(jobs), config_(config), state_(jobs.size()) {
  out_.label = config.label;
  out_.seed = config.seed;
  out_.jobs = static_cast<int64_t>(jobs.size());
  // MPS: every GPU in MPS mode (its shares placed one owner at a time, Enqueue).
  std::vector<core::NodeSpec> mps_nodes;
  if (config.mps) {
    mps_nodes = nodes;
    for (core::NodeSpec& n : mps_nodes) {
      for (core::NodeGpu& g : n.gpus) g.sharing = core::GpuSharing::kMps;
    }
  }
  auto scheduler = NewSimScheduler(config.mps ? mps_nodes : nodes, typical, config.policies,
                                   config.seed, &capacity_);
  scheduler_ = scheduler.get();
  gpu_count_ = static_cast<double>(capacity_) / core::kMilliPerGpu;
  elastic_.assign(jobs.size(), false);
  made_elastic_.assign(jobs.size(), false);
  std::mt19937_64 draw(config.seed ^ 0x656c6173u);
  for (size_t i = 0; i < jobs.size(); ++i) {
    state_[i].remaining = jobs[i].duration;
    index_of_[jobs[i].request.id] = i;
    const core::Request& r = jobs[i].request;
    // Drawn for every job, so that the same seed makes the same jobs elastic at any share.
    const double u = std::uniform_real_distribution<double>(0, 1)(draw);
    if (r.resizable && r.elastic()) {
      elastic_[i] = true;
      ++out_.elastic_jobs;
    } else if (r.gpus >= 2 && r.gang.empty() && u < config.elastic) {
      elastic_[i] = made_elastic_[i] = true;
      ++out_.elastic_jobs;
    }
  }
  // The queue, its order, backfill, preemption planning, requeue after preemption and run-time
  // predictions (config.predict: from the jobs finished so far) are the production engine's.
  engine_ = std::make_unique<sched::Engine>(
      std::move(scheduler), *this,
      sched::EngineOptions{.cycle = {.preemption = config.preemption,
                                     .fair_share_half_life_s = config.fair_share_half_life_s,
                                     .reservations = config.reservations},
                           .requeue_preempted = config.requeue_preempted,
                           .predict_from_kind_only = config.predict_from_kind_only,
                           .utilization_ceiling_pct = config.utilization_ceiling_pct,
                           .utilization_ceiling_strict = config.utilization_ceiling_strict});
}

sched::RunKind Replay::KindOf(size_t i) const {
  const SimJob& j = jobs_[i];
  return sched::RunKind{.user = j.request.owner,
                        .name = j.name,
                        .command = j.command,
                        .shape = sched::HistoryShape(j.request, j.tasks),
                        .max_runtime_s = j.max_runtime_s};
}

void Replay::Enqueue(size_t i) {
  core::Request r = jobs_[i].request;
  if (made_elastic_[i]) {
    r.gpus_max = r.gpus;
    r.resizable = true;
    r.gpus = (r.gpus + 1) / 2;
  }
  if (config_.arrival_order) r.priority = 0;
  if (config_.mps && r.fractional()) r.sharing = core::GpuSharing::kMps;
  // The trace's own prediction, where it has one (0 means unknown to the cycle: a prediction of
  // no time at all is a millisecond); history's replaces it (config.predict).
  if (jobs_[i].predicted_duration >= 0)
    r.expected_duration_s = std::max(jobs_[i].predicted_duration, 1e-3);
  sched::Submission sub{sched::QueueEntry{std::move(r), jobs_[i].submit, static_cast<uint64_t>(i)},
                        std::nullopt, std::nullopt};
  if (config_.predict) sub.kind = KindOf(i);
  (void)engine_->Submit(std::move(sub));
}

double Replay::Demand(size_t i) const {
  return jobs_[i].utilization >= 0 ? jobs_[i].utilization : jobs_[i].request.gpu_milli / 10.0;
}

double Replay::Load(size_t i) const {
  if (jobs_[i].request.fractional()) return Demand(i);
  return jobs_[i].utilization >= 0 ? jobs_[i].utilization : 100.0;
}

void Replay::AddLoad(int64_t key, double pct) {
  double& load = load_on_[key];
  busy_pct_ -= std::min(100.0, load);
  load = std::max(0.0, load + pct);
  busy_pct_ += std::min(100.0, load);
}

double Replay::RateOf(const std::vector<size_t>& on, size_t j) const {
  if (config_.mps) {  // at once on the SMs: slowed only beyond what MPS serves
    double total = 0;
    for (size_t k : on) total += Demand(k);
    const double capacity = 100 * config_.mps_capacity;
    return total > capacity ? capacity / total : 1.0;
  }
  if (!config_.interference_priorities) {
    double total = 0;
    for (size_t k : on) total += Demand(k);
    return total > 100 ? 100 / total : 1.0;
  }
  const int mine = jobs_[j].request.priority;
  std::map<int, double, std::greater<>> level;  // priority -> summed demand
  for (size_t k : on) level[jobs_[k].request.priority] += Demand(k);
  double left = 100;
  for (auto it = level.begin(); it != level.end(); ++it) {
    double rate = it->second > left ? std::max(0.0, left) / it->second : 1.0;
    if (std::next(it) != level.end()) rate *= config_.priority_share_efficiency;
    if (it->first == mine) return rate;
    left -= it->second * rate;
  }
  return 1.0;
}

void Replay::Rebalance(int64_t key, double now) {
  const std::vector<size_t>& on = shares_on_[key];
  for (size_t j : on) {
    const double rate = RateOf(on, j);
    State& st = state_[j];
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
    departures_.emplace(st.end, j, st.epoch, st.gen);
  }
}

void Replay::StartJob(size_t i, double now, const sched::Allocation& a) {
  last_start_ = std::max(last_start_, now);
  State& st = state_[i];
  st.running = true;
  st.started = now;
  ++running_;
  st.held_milli = 0;
  Hold(i, a.node, a.gpus);
  if (st.remaining < 0) return;  // runs to the end of the replay
  if (elastic_[i]) {
    st.work_left = st.remaining;
    st.gpus = 0;
    Reschedule(i, now, 0, static_cast<int>(a.gpus.size()));
    return;
  }
  // Modelled for a share of one GPU; one of several GPUs runs at its own pace.
  if (config_.interference && jobs_[i].request.fractional() && a.gpus.size() == 1) {
    st.gpu_key = (int64_t{a.node} << 8) | a.gpus[0];
    st.work_left = st.remaining, st.since = now, st.rate = 0;  // no departure yet
    st.end = std::numeric_limits<double>::infinity();
    shares_on_[st.gpu_key].push_back(i);
    Rebalance(st.gpu_key, now);
    return;
  }
  st.end = now + st.remaining;
  departures_.emplace(st.end, i, st.epoch, st.gen);
}

void Replay::StopJob(size_t i, double now) {
  State& st = state_[i];
  st.running = false;
  --running_;
  allocated_milli_ -= st.held_milli;
  st.held_milli = 0;
  for (int64_t key : st.gpu_keys) AddLoad(key, -Load(i));
  st.gpu_keys.clear();
  st.resize_to = 0;
  if (st.gpu_key >= 0) {
    std::vector<size_t>& on = shares_on_[st.gpu_key];
    on.erase(std::find(on.begin(), on.end(), i));
    Rebalance(st.gpu_key, now);
    st.gpu_key = -1;
  }
}

void Replay::Hold(size_t i, sched::NodeId node, const std::vector<int>& gpus) {
  State& st = state_[i];
  for (int64_t key : st.gpu_keys) AddLoad(key, -Load(i));
  st.gpu_keys.clear();
  for (int g : gpus) {
    st.gpu_keys.push_back((int64_t{node} << 8) | g);
    AddLoad(st.gpu_keys.back(), Load(i));
  }
  allocated_milli_ -= st.held_milli;
  st.held_milli = jobs_[i].request.fractional()
                      ? jobs_[i].request.gpu_milli_total()
                      : int64_t{core::kMilliPerGpu} * int64_t(gpus.size());
  allocated_milli_ += st.held_milli;
  st.node = node;
}

double Replay::Speed(size_t i, int n) const {
  return core::ElasticSpeed(config_.elastic_serial_fraction, n, jobs_[i].request.gpus);
}

void Replay::Reschedule(size_t i, double now, double pause, int n) {
  State& st = state_[i];
  if (st.gpus > 0)
    st.work_left = std::max(0.0, st.work_left - std::max(0.0, now - st.since) * st.rate);
  st.gpus = n;
  st.since = now + pause;
  st.rate = Speed(i, n);
  ++st.gen;
  st.end = st.since + st.work_left / st.rate;
  departures_.emplace(st.end, i, st.epoch, st.gen);
}

void Replay::Resize(const std::string& id, const sched::Allocation& holds, double now) {
  const size_t i = index_of_.at(id);
  State& st = state_[i];
  if (!st.running || st.remaining < 0) return;
  const int n = static_cast<int>(holds.gpus.size());
  if (now <= st.started) {  // grown in the step that started it: it starts on all of them
    ++out_.grows;
    Hold(i, holds.node, holds.gpus);
    Reschedule(i, now, 0, n);
    if (config_.record_runs && !out_.runs.empty() && out_.runs.back().id == id)
      out_.runs.back().gpus = holds.gpus;
    return;
  }
  // Grown: the new GPUs are held from now on (idle until it starts again on them).
  if (holds.gpus.size() > st.gpu_keys.size()) Hold(i, holds.node, holds.gpus);
  // Asked once: a later resize before it has checkpointed changes where it starts again, not
  // when (as the server rewrites the resize file and signals once).
  if (st.resize_to == 0) {
    st.resize_at = now + config_.stop_latency_s;
    resizes_.emplace(st.resize_at, i, st.epoch, 0);
  }
  st.resize_to = n;
  st.resize_gpus = holds.gpus;
}

bool Replay::EndResizes(double now) {
  bool any = false;
  while (!resizes_.empty() && std::get<0>(resizes_.top()) <= now) {
    auto [when, i, epoch, gen] = resizes_.top();
    resizes_.pop();
    State& st = state_[i];
    if (epoch != st.epoch || !st.running || st.resize_to == 0) continue;
    // It has checkpointed and exited: it starts again on its new GPUs (a shrink's others free).
    // Counted now, once however often it was asked before (the engine asks a shrink again when
    // a second queued request of the same pass takes more of what it grew onto).
    ++(st.resize_to > st.gpus ? out_.grows : out_.shrinks);
    Hold(i, st.node, st.resize_gpus);
    Reschedule(i, when, config_.resize_overhead_s, st.resize_to);
    if (config_.record_runs)
      out_.runs.push_back({jobs_[i].request.id, when, st.node, st.resize_gpus, true});
    st.resize_to = 0;
    (void)engine_->Resized(jobs_[i].request.id);  // a shrink's GPUs go back to the engine
    any = true;
  }
  return any;
}

void Replay::Start(const std::string& id, const sched::Allocation& a, double now) {
  if (config_.record_runs) out_.runs.push_back({id, now, a.node, a.gpus});
  StartJob(index_of_.at(id), now, a);
}

void Replay::Stop(const std::vector<std::string>& victims, const std::string&, const std::string&,
                  double now) {
  for (const std::string& v : victims) {
    auto victim = index_of_.find(v);
    if (victim == index_of_.end() || !state_[victim->second].running) continue;
    // Asked to stop, a job is preempted when it ends, even if it would have finished first: like
    // the server, which cannot tell a checkpoint-and-exit from a natural end, it starts over.
    State& vs = state_[victim->second];
    ++vs.epoch;  // its departure no longer counts
    double natural_end = vs.remaining >= 0 ? vs.end : now + config_.stop_latency_s;
    // Checkpointing for a resize, it exits then (as the server sees it: preempted).
    if (vs.resize_to > 0) natural_end = std::min(natural_end, vs.resize_at);
    stops_.emplace(std::min(now + config_.stop_latency_s, natural_end), victim->second, vs.epoch,
                   0);
  }
}

void Replay::Record(double t) {
  ReplaySample p;
  p.time = t;
  p.allocated = capacity_ > 0 ? double(allocated_milli_) / double(capacity_) : 0;
  p.fragmented_gpus = scheduler_->FragmentedMilli() / core::kMilliPerGpu;
  p.queued = static_cast<int64_t>(engine_->cycle().size());
  p.running = running_;
  p.busy = gpu_count_ > 0 ? std::max(0.0, busy_pct_) / (100 * gpu_count_) : 0;
  if (!events_.empty() && events_.back().time == t) {
    events_.back() = p;
  } else {
    events_.push_back(p);
  }
  // Starts raise allocation only within a step, so the state after it holds the peak.
  out_.peak_allocated = std::max(out_.peak_allocated, p.allocated);
  out_.peak_queued = std::max(out_.peak_queued, p.queued);
}

bool Replay::Depart(double now) {
  bool any = false;
  while (!departures_.empty() && std::get<0>(departures_.top()) <= now) {
    auto [end, i, epoch, gen] = departures_.top();
    departures_.pop();
    // Preempted meanwhile, or its end moved (interference).
    if (epoch != state_[i].epoch || gen != state_[i].gen || !state_[i].running) continue;
    const SimJob& job = jobs_[i];
    const double ran = end - state_[i].started;
    StopJob(i, end);
    engine_->Ended(job.request.id);
    state_[i].finished = true;
    ++out_.finished;
    if (job.request.fractional() && job.duration > 0) slowdowns_.push_back(ran / job.duration);
    if (config_.predict) {
      engine_->history().Add(
          KindOf(i), ran,
          job.utilization >= 0 ? std::optional<double>(job.utilization) : std::nullopt);
    }
    jcts_.push_back(end - job.submit);
    jct_by_gpus_[GpuSizeClass(job.request)].push_back(jcts_.back());
    jct_by_priority_[job.request.priority].push_back(jcts_.back());
    if (job.duration >= 1)
      slowdown_by_priority_[job.request.priority].push_back(jcts_.back() / job.duration);
    any = true;
  }
  return any;
}

bool Replay::EndStops(double now) {
  bool any = false;
  while (!stops_.empty() && std::get<0>(stops_.top()) <= now) {
    auto [when, i, epoch, gen] = stops_.top();
    stops_.pop();
    if (epoch != state_[i].epoch || !state_[i].running) continue;
    StopJob(i, when);
    ++state_[i].epoch;
    state_[i].remaining = jobs_[i].duration;  // a preempted job starts over
    // Queued again (config.requeue_preempted), under its id and in its place.
    (void)engine_->Stopped(jobs_[i].request.id, sched::StopCause::kPreempted);
    ++out_.preemptions;
    any = true;
  }
  return any;
}

ReplayResult Replay::Run() {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<size_t> order(jobs_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs_[a].submit < jobs_[b].submit; });
  const double start_time = jobs_.empty() ? 0 : jobs_[order.front()].submit;
  double horizon = start_time;
  for (const SimJob& j : jobs_) horizon = std::max(horizon, j.submit + std::max(j.duration, 0.0));
  last_arrival_ = last_start_ = start_time;
  auto next_time = [](const Departures& q) {
    return q.empty() ? std::numeric_limits<double>::infinity() : std::get<0>(q.top());
  };
  size_t next_arrival = 0;
  Record(start_time);
  while (next_arrival < order.size() || !departures_.empty() || !stops_.empty() ||
         !resizes_.empty()) {
    double now = std::min({next_time(departures_), next_time(stops_), next_time(resizes_)});
    if (next_arrival < order.size()) now = std::min(now, jobs_[order[next_arrival]].submit);
    bool changed = Depart(now);
    changed = EndStops(now) || changed;
    changed = EndResizes(now) || changed;
    while (next_arrival < order.size() && jobs_[order[next_arrival]].submit <= now) {
      last_arrival_ = jobs_[order[next_arrival]].submit;
      Enqueue(order[next_arrival]);
      ++next_arrival;
      changed = true;
    }
    if (changed) {
      engine_->Step(now);
      Record(now);
    }
  }
  Summarize(start_time, horizon);
  out_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::move(out_);
}

void Replay::Summarize(double start_time, double horizon) {
  ReplayResult& out = out_;
  const double end_time = std::max(events_.back().time, horizon);
  out.end_time = end_time;
  out.busy_start = start_time;
  out.busy_end = std::max({last_arrival_, last_start_, start_time});
  out.mean_allocated = Integral(events_, start_time, end_time, &ReplaySample::allocated);
  out.events = std::move(events_);
  const int samples = std::max(config_.samples, 2);
  out.whole = Resample(out.events, start_time, std::max(end_time, start_time + 1), samples);
  SetBusyPeriod(out, out.busy_start, out.busy_end, samples);
  std::vector<double> waits;
  std::map<std::string, std::vector<double>> by_size;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    if (state_[i].started >= 0) {
      waits.push_back(state_[i].started - jobs_[i].submit);
      by_size[GpuSizeClass(jobs_[i].request)].push_back(waits.back());
    } else {
      ++out.never_started;
    }
  }
  for (auto& [size, w] : by_size) out.wait_by_gpus[size] = sim::Summarize(std::move(w));
  out.queued_at_end = static_cast<int64_t>(engine_->cycle().size());
  std::sort(waits.begin(), waits.end());
  out.waits = waits;
  out.wait = sim::Summarize(std::move(waits));
  out.jct = sim::Summarize(std::move(jcts_));
  for (auto& [size, v] : jct_by_gpus_) out.jct_by_gpus[size] = sim::Summarize(std::move(v));
  for (auto& [p, v] : jct_by_priority_) out.jct_by_priority[p] = sim::Summarize(std::move(v));
  for (auto& [p, v] : slowdown_by_priority_)
    out.slowdown_by_priority[p] = sim::Summarize(std::move(v));
  for (const SimJob& j : jobs_) out.utilization_known = out.utilization_known || j.utilization >= 0;
  if (!slowdowns_.empty()) {
    double sum = 0;
    for (double x : slowdowns_) {
      sum += x;
      out.share_slowdown_max = std::max(out.share_slowdown_max, x);
    }
    out.share_slowdown_mean = sum / static_cast<double>(slowdowns_.size());
  }
}

}  // namespace

absl::StatusOr<double> MpsCapacityOf(const nlohmann::json& report) {
  constexpr std::string_view kCheck = "MPS: 4 tenants of small kernels";
  const nlohmann::json* checks =
      report.is_object() && report.contains("checks") ? &report["checks"] : nullptr;
  if (checks == nullptr || !checks->is_array()) {
    return absl::InvalidArgumentError("not a tessera-gpu-check --json report (no list \"checks\")");
  }
  for (const nlohmann::json& c : *checks) {
    if (!c.is_object() || c.value("name", "") != kCheck) continue;
    const nlohmann::json d = c.value("data", nlohmann::json::object());
    const double slices = d.value("time_slices_ratio", 0.0), mps = d.value("mps_ratio", 0.0);
    if (!(slices > 0) || !(mps > 0)) {
      return absl::InvalidArgumentError(
          fmt::format("check \"{}\" has no time_slices_ratio and mps_ratio above 0 (it failed: {})",
                      kCheck, c.value("measured", "")));
    }
    return mps / slices;
  }
  return absl::InvalidArgumentError(fmt::format(
      "the report has no check \"{}\" (run tessera-gpu-check --only MPS --json FILE on a GPU)",
      kCheck));
}

ReplayResult RunReplay(const std::vector<core::NodeSpec>& nodes, const std::vector<SimJob>& jobs,
                       const std::vector<sched::TypicalRequest>& typical,
                       const ReplayConfig& config) {
  return Replay(nodes, jobs, typical, config).Run();
}

}  // namespace tessera::sim
