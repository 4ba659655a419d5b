#include "tessera/devices/health.h"

#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace tessera::devices {

std::string_view HealthEventKindName(HealthEvent::Kind kind) {
  switch (kind) {
    case HealthEvent::Kind::kXid:
      return "xid";
    case HealthEvent::Kind::kEccDoubleBit:
      return "ecc_double_bit";
    case HealthEvent::Kind::kEccSingleBit:
      return "ecc_single_bit";
    case HealthEvent::Kind::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

std::set<uint64_t> DefaultIgnoredXids() { return {13, 31, 43, 45, 68, 109}; }

HealthTracker::HealthTracker(int gpu_count, HealthPolicy policy, core::TimePoint start)
    : policy_(std::move(policy)), gpus_(gpu_count) {
  for (GpuHealth& g : gpus_) {
    g.since = start;
    g.last_probe = start;
  }
}

bool HealthTracker::MarkSick(int gpu, std::string reason, core::TimePoint now) {
  GpuHealth& g = gpus_[gpu];
  g.last_critical = now;
  ++g.critical_events;
  if (!g.healthy) {
    g.reason = std::move(reason);
    return false;
  }
  g.healthy = false;
  g.reason = std::move(reason);
  g.since = now;
  return true;
}

bool HealthTracker::OnEvent(const HealthEvent& event, core::TimePoint now) {
  if (event.gpu < 0 || event.gpu >= size()) return false;
  GpuHealth& g = gpus_[event.gpu];
  switch (event.kind) {
    case HealthEvent::Kind::kXid:
      ++g.xid_count;
      g.last_xid = event.xid;
      if (policy_.ignored_xids.contains(event.xid)) return false;
      return MarkSick(event.gpu, fmt::format("XID {}", event.xid), now);
    case HealthEvent::Kind::kEccSingleBit:
      if (!policy_.single_bit_ecc_is_critical) return false;
      return MarkSick(event.gpu, "single-bit ECC error", now);
    case HealthEvent::Kind::kEccDoubleBit:
      return MarkSick(event.gpu, "double-bit ECC error", now);
    case HealthEvent::Kind::kUnavailable:
      return MarkSick(event.gpu, event.detail.empty() ? "GPU unavailable" : event.detail, now);
  }
  return false;
}

bool HealthTracker::OnProbe(int gpu, const absl::Status& result, core::TimePoint now) {
  if (gpu < 0 || gpu >= size()) return false;
  GpuHealth& g = gpus_[gpu];
  g.last_probe = now;
  if (!result.ok()) {
    return MarkSick(gpu, fmt::format("not answering: {}", std::string(result.message())), now);
  }
  if (g.healthy || policy_.recovery_quiet_period == core::Duration::zero() ||
      now - g.last_critical < policy_.recovery_quiet_period) {
    return false;
  }
  g.healthy = true;
  g.reason.clear();
  g.since = now;
  return true;
}

bool HealthTracker::ProbeDue(int gpu, core::TimePoint now) const {
  const GpuHealth& g = gpus_[gpu];
  if (!g.healthy) {
    // A sick GPU is probed only to find out whether it recovered: at once when its quiet period
    // ends, then every probe interval.
    if (policy_.recovery_quiet_period == core::Duration::zero()) return false;
    core::TimePoint quiet_end = g.last_critical + policy_.recovery_quiet_period;
    if (now < quiet_end) return false;
    if (g.last_probe < quiet_end) return true;
  }
  return now - g.last_probe >= policy_.probe_interval;
}

HealthWatch::HealthWatch(DeviceSource& source, int gpu_count, HealthPolicy policy,
                         const core::Clock& clock, Callback on_change)
    : source_(source),
      clock_(clock),
      on_change_(std::move(on_change)),
      tracker_(gpu_count, std::move(policy), clock.Now()) {}

HealthWatch::~HealthWatch() { Stop(); }

void HealthWatch::Start() {
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_) Step(std::chrono::milliseconds(200));
  });
}

void HealthWatch::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void HealthWatch::Notify(const std::vector<std::pair<int, GpuHealth>>& changes) {
  for (const auto& [gpu, h] : changes) {
    if (h.healthy) {
      spdlog::info("gpu {}: healthy again", gpu);
    } else {
      spdlog::warn("gpu {}: unhealthy: {}", gpu, h.reason);
    }
    if (on_change_) on_change_(gpu, h);
  }
}

void HealthWatch::Step(std::chrono::milliseconds wait) {
  auto events = source_.WaitHealthEvents(wait);
  std::vector<std::pair<int, GpuHealth>> changes;
  bool probe_all = false;
  {
    core::MutexLock lock(mu_);
    core::TimePoint now = clock_.Now();
    if (!events.ok()) {
      if (!stream_failed_) {
        spdlog::error("health: event stream failed: {}; probing every GPU",
                      std::string(events.status().message()));
      }
      stream_failed_ = true;
      probe_all = true;
    } else {
      if (stream_failed_) spdlog::info("health: event stream works again");
      stream_failed_ = false;
      for (const HealthEvent& ev : *events) {
        if (ev.gpu < 0 || ev.gpu >= tracker_.size()) {
          spdlog::warn("health: {} on an unknown GPU; probing every GPU", ev.detail);
          probe_all = true;
          continue;
        }
        if (ev.kind == HealthEvent::Kind::kXid && tracker_.policy().ignored_xids.contains(ev.xid)) {
          spdlog::info("gpu {}: XID {} (application error, GPU stays healthy)", ev.gpu, ev.xid);
        }
        if (tracker_.OnEvent(ev, now)) changes.emplace_back(ev.gpu, tracker_.health(ev.gpu));
      }
    }
  }
  // Probes run without the lock: a hung driver call must not block Snapshot().
  std::vector<int> due;
  {
    core::MutexLock lock(mu_);
    core::TimePoint now = clock_.Now();
    for (int i = 0; i < tracker_.size(); ++i) {
      if (tracker_.ProbeDue(i, now) || (probe_all && tracker_.health(i).healthy)) due.push_back(i);
    }
  }
  for (int i : due) {
    absl::Status st = source_.Probe(i);
    core::MutexLock lock(mu_);
    if (tracker_.OnProbe(i, st, clock_.Now())) changes.emplace_back(i, tracker_.health(i));
  }
  if (!events.ok() && !stop_) {
    // The failed wait returned at once; don't spin.
    std::this_thread::sleep_for(wait);
  }
  Notify(changes);
}

std::vector<GpuHealth> HealthWatch::Snapshot() const {
  core::MutexLock lock(mu_);
  std::vector<GpuHealth> out;
  for (int i = 0; i < tracker_.size(); ++i) out.push_back(tracker_.health(i));
  return out;
}

}  // namespace tessera::devices
