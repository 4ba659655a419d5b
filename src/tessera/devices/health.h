#pragma once
// Health of a machine's GPUs. HealthTracker is the policy (which events make a GPU sick, when it
// may recover), a pure state machine driven by events, probe results and a time; not thread-safe.
// HealthWatch runs it against a DeviceSource, on its own thread or step by step; thread-safe.

#include <atomic>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "tessera/core/clock.h"
#include "tessera/core/mutex.h"
#include "tessera/devices/device_source.h"

namespace tessera::devices {

// XIDs that application bugs cause (13 graphics engine exception, 31 MMU fault, 43 stopped channel,
// 45 preemptive cleanup, 68 video decoder exception, 109 context switch timeout): a GPU stays
// healthy.
std::set<uint64_t> DefaultIgnoredXids();

struct HealthPolicy {
  std::set<uint64_t> ignored_xids = DefaultIgnoredXids();
  // Corrected (single-bit) ECC errors are normally harmless.
  bool single_bit_ecc_is_critical = false;
  // A sick GPU is healthy again after this long without a critical event and a successful probe.
  // Zero keeps it sick until the process restarts (the behaviour of NVIDIA's device plugin).
  core::Duration recovery_quiet_period = std::chrono::minutes(5);
  // How often every GPU is probed (a GPU that stops answering is sick).
  core::Duration probe_interval = std::chrono::seconds(10);
};

struct GpuHealth {
  bool healthy = true;
  std::string reason;       // why it is sick: the last critical event or failed probe
  core::TimePoint since{};  // when the current state began
  core::TimePoint last_critical{};
  core::TimePoint last_probe{};
  uint64_t xid_count = 0;  // every XID seen on it, ignored ones included
  uint64_t last_xid = 0;   // the last of them (0: none yet)
  uint64_t critical_events = 0;
};

class HealthTracker {
 public:
  HealthTracker(int gpu_count, HealthPolicy policy, core::TimePoint start);

  // Apply an event seen at `now`. Returns true when the GPU's state changed. Events for an unknown
  // GPU change nothing (the watch probes every GPU then).
  bool OnEvent(const HealthEvent& event, core::TimePoint now);
  // Apply a probe result. A failure makes the GPU sick; a success heals a sick GPU whose quiet
  // period has passed. Returns true when the state changed.
  bool OnProbe(int gpu, const absl::Status& result, core::TimePoint now);
  // Whether `gpu` should be probed at `now`.
  bool ProbeDue(int gpu, core::TimePoint now) const;

  int size() const { return static_cast<int>(gpus_.size()); }
  const GpuHealth& health(int gpu) const { return gpus_[gpu]; }
  const HealthPolicy& policy() const { return policy_; }

 private:
  bool MarkSick(int gpu, std::string reason, core::TimePoint now);

  HealthPolicy policy_;
  std::vector<GpuHealth> gpus_;
};

class HealthWatch {
 public:
  // Called (on the watch's thread, without its lock) for every change of a GPU's state.
  using Callback = std::function<void(int gpu, const GpuHealth& health)>;

  // `source` and `clock` must outlive the watch.
  HealthWatch(DeviceSource& source, int gpu_count, HealthPolicy policy, const core::Clock& clock,
              Callback on_change);
  ~HealthWatch();
  HealthWatch(const HealthWatch&) = delete;
  HealthWatch& operator=(const HealthWatch&) = delete;

  // Runs Step in a loop on a thread of its own until Stop (or destruction).
  void Start();
  void Stop();

  // One round: wait up to `wait` for events and apply them, then run the probes that are due.
  void Step(std::chrono::milliseconds wait);

  std::vector<GpuHealth> Snapshot() const;

 private:
  void Notify(const std::vector<std::pair<int, GpuHealth>>& changes);

  DeviceSource& source_;
  const core::Clock& clock_;
  Callback on_change_;

  mutable core::Mutex mu_;
  HealthTracker tracker_ ABSL_GUARDED_BY(mu_);
  bool stream_failed_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tessera::devices
