#include "tessera/server/sampler.h"

#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tessera/core/gpu.h"
#include "tessera/server/api_response.h"
#include "tessera/server/store.h"

namespace tessera::server {

using nlohmann::json;

void Feed::Bump() {
  {
    core::MutexLock lock(mu_);
    ++version_;
  }
  cv_.notify_all();
}

bool Feed::Wait(uint64_t* seen, double timeout_s) {
  core::MutexLock lock(mu_);
  lock.WaitFor(cv_, std::chrono::duration<double>(timeout_s),
               [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || version_ != *seen; });
  *seen = version_;
  return !closed_;
}

bool Feed::SleepUntil(std::chrono::steady_clock::time_point t) {
  core::MutexLock lock(mu_);
  cv_.wait_until(mu_, t, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_; });
  return !closed_;
}

void Feed::Close() {
  {
    core::MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

Sampler::Sampler(Store& store, devices::DeviceSource& source, size_t gpus, JobHost& host,
                 const Views& views, const core::Clock& clock, Feed& feed, Options options,
                 Measure measure)
    : store_(store),
      source_(source),
      gpus_(gpus),
      host_(host),
      views_(views),
      clock_(clock),
      feed_(feed),
      options_(options),
      measure_(std::move(measure)) {}

Sampler::~Sampler() { Stop(); }

std::vector<devices::GpuTelemetry> Sampler::Telemetry() {
  core::MutexLock lock(telemetry_mu_);
  const double now = Now();
  if (telemetry_at_ >= 0 && now - telemetry_at_ < kTelemetryMaxAgeS) return telemetry_;
  telemetry_.assign(gpus_, devices::GpuTelemetry{});
  for (size_t g = 0; g < telemetry_.size(); ++g) {
    auto t = source_.ReadTelemetry(static_cast<int>(g));
    if (t.ok()) {
      telemetry_[g] = *t;
    } else {
      spdlog::debug("gpu {}: no telemetry: {}", g, std::string(t.status().message()));
    }
  }
  telemetry_at_ = now;
  return telemetry_;
}

std::string Sampler::TakeSample() {
  const double now = Now();
  const std::vector<devices::GpuTelemetry> telemetry = Telemetry();
  // The fractional jobs' own files (the arbiter's GPU time, their regions' peaks), read without
  // any lock: for their history.
  const std::shared_ptr<const MachineView> v = views_.machine();
  std::map<int64_t, JobHost::ShareUse> shares;
  std::vector<int64_t> running;
  for (const auto& [id, a] : v->active) {
    running.push_back(id);
    if (!a.starting && !a.region.empty() && !a.gpus.empty())
      shares[id] = host_.ReadShare(id, a.gpus, a.gpu_milli > 0, a.region);
  }
  if (measure_) measure_(telemetry, shares);
  host_.TidyArbiter(running);  // an upgrade's older arbiter file, once its jobs are done
  json util = json::array(), mem = json::array(), alloc = json::array(), alloc_mem = json::array();
  int busy = 0, healthy = 0;
  double allocated = 0;
  for (const GpuView& g : v->gpus) {
    alloc.push_back(static_cast<double>(g.milli) / core::kMilliPerGpu);
    alloc_mem.push_back(static_cast<uint64_t>(g.memory_mib) << 20);
    busy += g.milli > 0 || g.memory_mib > 0;
    allocated += static_cast<double>(g.milli) / core::kMilliPerGpu;
    healthy += g.healthy ? 1 : 0;
  }
  for (const devices::GpuTelemetry& t : telemetry) {
    util.push_back(OrNull(t.utilization));
    mem.push_back(OrNull(t.memory_used_bytes));
  }
  const json j = {
      {"at", now},          {"queued", v->queued},    {"running", v->running}, {"busy", busy},
      {"healthy", healthy}, {"allocated", allocated}, {"util", util},          {"mem", mem},
      {"alloc", alloc},     {"alloc_mem", alloc_mem}};
  std::string data = j.dump();
  if (absl::Status st = store_.AddSample({now, data}, now - options_.window_s); !st.ok()) {
    spdlog::warn("history: sample not stored: {}", std::string(st.message()));
  }
  {
    core::MutexLock lock(samples_mu_);
    last_sample_at_ = now;
    ++samples_taken_;
  }
  feed_.Bump();
  return data;
}

void Sampler::Start() {
  thread_ = std::thread([this] {
    auto next = std::chrono::steady_clock::now();
    do {
      TakeSample();
      next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(options_.interval_s));
    } while (feed_.SleepUntil(next));  // the interval, or until the server stops
  });
}

void Sampler::Stop() {
  if (thread_.joinable()) thread_.join();
}

std::pair<double, uint64_t> Sampler::Samples() const {
  core::MutexLock lock(samples_mu_);
  return {last_sample_at_, samples_taken_};
}

}  // namespace tessera::server
