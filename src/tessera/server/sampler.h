#pragma once
// The machine's history and its GPUs' telemetry, and what wakes the event streams.
//
// Feed: the event streams' side (GET /v1/events, the dashboard): a version that whoever changes
// what a stream shows bumps (the store at each event, a GPU's health, a sample), on which the
// streams wait. Closed when the server stops.
//
// Sampler: every history_interval_s one sample of the machine - jobs queued and running, GPUs busy
// and healthy, what is allocated, each GPU's utilization and memory - read from the views
// (views.h) and the telemetry, stored (the store keeps history_window_s of them) and told to the
// streams. Each sample's readings (the telemetry, and the shares' own files: the arbiter's GPU
// time and each region's peak, read here without any lock) are handed to `measure`, which adds
// them to what the running jobs are measured to use; then the arbiter file an upgrade kept is
// removed once its jobs are done (JobHost::TidyArbiter). Telemetry is read from the driver at most
// once a second however often it is asked (the API's GPU page and /metrics ask too). Only its own
// locks are taken; `measure` takes the dispatcher's. sampler_test.cc drives it alone.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "tessera/core/clock.h"
#include "tessera/core/mutex.h"
#include "tessera/devices/device_source.h"
#include "tessera/server/job_host.h"
#include "tessera/server/views.h"

namespace tessera::server {

class Store;

class Feed {
 public:
  void Bump();
  // Waits until the version passes `seen` (then updates it) or `timeout_s`; false once closed.
  bool Wait(uint64_t* seen, double timeout_s);
  // Waits until `t` or the close; false once closed.
  bool SleepUntil(std::chrono::steady_clock::time_point t);
  void Close();

 private:
  core::Mutex mu_;
  core::CondVar cv_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class Sampler {
 public:
  using Measure = std::function<void(const std::vector<devices::GpuTelemetry>&,
                                     const std::map<int64_t, JobHost::ShareUse>&)>;
  struct Options {
    double interval_s = 5;
    double window_s = 86400;
  };
  // Every argument must outlive the sampler.
  Sampler(Store& store, devices::DeviceSource& source, size_t gpus, JobHost& host,
          const Views& views, const core::Clock& clock, Feed& feed, Options options,
          Measure measure);
  ~Sampler();  // Stop

  // Every GPU's telemetry, at most kTelemetryMaxAgeS old; a GPU that does not answer gets empty
  // readings.
  static constexpr double kTelemetryMaxAgeS = 1.0;
  std::vector<devices::GpuTelemetry> Telemetry();
  // One sample now, stored and told to the streams; its JSON.
  std::string TakeSample();
  // A sample every interval on a thread of its own, until Stop or the feed's close.
  void Start();
  void Stop();  // the feed must be closed first, or the thread waits out its interval
  // The last sample's time (-1: none yet) and how many were taken.
  std::pair<double, uint64_t> Samples() const;

 private:
  double Now() const { return core::Seconds(clock_.Now()); }

  Store& store_;
  devices::DeviceSource& source_;
  const size_t gpus_;
  JobHost& host_;
  const Views& views_;
  const core::Clock& clock_;
  Feed& feed_;
  const Options options_;
  const Measure measure_;
  std::thread thread_;

  core::Mutex telemetry_mu_;
  double telemetry_at_ ABSL_GUARDED_BY(telemetry_mu_) = -1;
  std::vector<devices::GpuTelemetry> telemetry_ ABSL_GUARDED_BY(telemetry_mu_);

  mutable core::Mutex samples_mu_;
  double last_sample_at_ ABSL_GUARDED_BY(samples_mu_) = -1;
  uint64_t samples_taken_ ABSL_GUARDED_BY(samples_mu_) = 0;
};

}  // namespace tessera::server
