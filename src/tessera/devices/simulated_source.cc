#include "tessera/devices/simulated_source.h"

#include "fmt/format.h"

namespace tessera::devices {

SimulatedSource::SimulatedSource(SimulatedMachine machine, const core::Clock& clock)
    : machine_(std::move(machine)),
      clock_(clock),
      start_(clock.Now()),
      lost_(machine_.inventory.gpus.size(), false) {}

absl::StatusOr<core::NodeInventory> SimulatedSource::Discover() { return machine_.inventory; }

core::Duration SimulatedSource::ApplyDueLocked() {
  const auto& script = machine_.health_events;
  core::TimePoint now = clock_.Now();
  while (next_scripted_ < script.size() && start_ + script[next_scripted_].after <= now) {
    const ScriptedHealthEvent& s = script[next_scripted_++];
    switch (s.action) {
      case ScriptedHealthEvent::Action::kEvent:
        queue_.push_back(s.event);
        break;
      case ScriptedHealthEvent::Action::kLose:
        lost_[s.event.gpu] = true;
        break;
      case ScriptedHealthEvent::Action::kRestore:
        lost_[s.event.gpu] = false;
        break;
    }
  }
  if (next_scripted_ == script.size()) return core::Duration::max();
  return start_ + script[next_scripted_].after - now;
}

absl::StatusOr<std::vector<HealthEvent>> SimulatedSource::WaitHealthEvents(
    std::chrono::milliseconds timeout) {
  core::MutexLock lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    core::Duration until_next = ApplyDueLocked();
    if (!queue_.empty()) break;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    auto wait = std::min<core::Duration>(deadline - now, until_next);
    lock.WaitFor(cv_, wait);
  }
  std::vector<HealthEvent> out(queue_.begin(), queue_.end());
  queue_.clear();
  return out;
}

absl::Status SimulatedSource::Probe(int index) {
  if (index < 0 || static_cast<size_t>(index) >= machine_.inventory.gpus.size()) {
    return absl::InvalidArgumentError(fmt::format("gpu {}: no such GPU", index));
  }
  core::MutexLock lock(mu_);
  ApplyDueLocked();
  if (lost_[index]) {
    return absl::UnavailableError(fmt::format("gpu {} ({}): simulated: not answering", index,
                                              machine_.inventory.gpus[index].uuid));
  }
  return absl::OkStatus();
}

absl::StatusOr<GpuTelemetry> SimulatedSource::ReadTelemetry(int index) {
  if (absl::Status st = Probe(index); !st.ok()) return st;
  core::MutexLock lock(mu_);
  return static_cast<size_t>(index) < telemetry_.size() ? telemetry_[index] : GpuTelemetry{};
}

absl::Status SimulatedSource::SetTelemetry(int index, const GpuTelemetry& telemetry) {
  if (index < 0 || static_cast<size_t>(index) >= machine_.inventory.gpus.size()) {
    return absl::InvalidArgumentError(fmt::format("gpu {}: no such GPU", index));
  }
  core::MutexLock lock(mu_);
  if (telemetry_.size() < lost_.size()) telemetry_.resize(lost_.size());
  telemetry_[index] = telemetry;
  return absl::OkStatus();
}

absl::Status SimulatedSource::Inject(const HealthEvent& event) {
  if (event.gpu < 0 || static_cast<size_t>(event.gpu) >= machine_.inventory.gpus.size()) {
    return absl::InvalidArgumentError(fmt::format("gpu {}: no such GPU", event.gpu));
  }
  {
    core::MutexLock lock(mu_);
    queue_.push_back(event);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status SimulatedSource::SetLost(int index, bool lost) {
  if (index < 0 || static_cast<size_t>(index) >= machine_.inventory.gpus.size()) {
    return absl::InvalidArgumentError(fmt::format("gpu {}: no such GPU", index));
  }
  core::MutexLock lock(mu_);
  lost_[index] = lost;
  return absl::OkStatus();
}

}  // namespace tessera::devices
