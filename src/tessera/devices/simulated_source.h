#pragma once
// SimulatedSource: the DeviceSource of a simulated machine (an inventory file or preset). Its GPUs
// can be made sick and well again by scripted events (from the file) or by calls (Inject, SetLost),
// so that the layers above can be tested without a GPU. Thread-safe.

#include <deque>

#include "absl/base/thread_annotations.h"
#include "tessera/core/clock.h"
#include "tessera/core/mutex.h"
#include "tessera/devices/device_source.h"
#include "tessera/devices/inventory.h"

namespace tessera::devices {

class SimulatedSource final : public DeviceSource {
 public:
  // Scripted events count their `after` from construction, on `clock`.
  explicit SimulatedSource(SimulatedMachine machine,
                           const core::Clock& clock = core::SteadyClock::Get());

  absl::StatusOr<core::NodeInventory> Discover() override;
  absl::StatusOr<std::vector<HealthEvent>> WaitHealthEvents(
      std::chrono::milliseconds timeout) override;
  absl::Status Probe(int index) override;
  absl::StatusOr<GpuTelemetry> ReadTelemetry(int index) override;

  // Queues `event` for the next WaitHealthEvents. kInvalidArgument if its GPU does not exist.
  absl::Status Inject(const HealthEvent& event);
  // Makes GPU `index` stop (true) or resume (false) answering probes.
  absl::Status SetLost(int index, bool lost);
  // What ReadTelemetry answers for GPU `index` from now on (empty readings until set).
  absl::Status SetTelemetry(int index, const GpuTelemetry& telemetry);

 private:
  // Applies scripted events that are due; returns the time until the next one (or max()).
  core::Duration ApplyDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SimulatedMachine machine_;
  const core::Clock& clock_;
  const core::TimePoint start_;

  core::Mutex mu_;
  core::CondVar cv_;
  size_t next_scripted_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<HealthEvent> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> lost_ ABSL_GUARDED_BY(mu_);
  std::vector<GpuTelemetry> telemetry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::devices
