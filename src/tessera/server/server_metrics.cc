#include "tessera/server/server_metrics.h"

#include <unistd.h>

#include <map>
#include <memory>

#include "fmt/format.h"
#include "tessera/devices/dcgm.h"
#include "tessera/devices/mps_metrics.h"
#include "tessera/net/prometheus.h"
#include "tessera/shim/region.h"

namespace tessera::server {

const std::vector<double>& SchedulingStats::Buckets() {
  static const std::vector<double> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                               1,     2.5,  5,     10,   30,  60};
  return kBuckets;
}

void SchedulingStats::Started(double latency_s) {
  for (size_t i = 0; i < Buckets().size(); ++i) {
    if (latency_s <= Buckets()[i]) ++counts_[i];
  }
  sum_ += latency_s;
  ++count_;
}

void SchedulingStats::Pass(double seconds) {
  last_pass_s_ = seconds;
  ++passes_;
}

RegionMemory ReadRegionMemory(const std::string& path) {
  RegionMemory out;
  // The job's own file: copied, never mapped (a job truncating it would fault a mapping's reader),
  // and only the head, where the totals are.
  const auto d = shim::ReadRegionHead(path.c_str());
  if (d == nullptr) {
    out.readable = false;
    return out;
  }
  for (int i = 0; i < shim::kMaxDevices; ++i) {
    out.used += d->used[i].load();
    out.peak = std::max(out.peak, d->peak[i].load());
    out.refused += d->refused[i].load();
    out.wanted = std::max(out.wanted, d->wanted_peak[i].load());
  }
  return out;
}

// Long by design: one block per metric family, in the order of docs/metrics.md.
std::string RenderServerMetrics(const ServerMetricsSnapshot& s) {
  net::MetricsPage p;
  using Labels = net::MetricsPage::Labels;
  // Accounting since the store began, as counters (what `tessera acct` sums over a period).
  p.Family("tessera_acct_computations_total", "counter",
           "Times the accounting totals below were computed: by a scrape (request) or off the "
           "request path (refresher).");
  p.Sample({{"where", "request"}}, static_cast<double>(s.acct_on_request));
  p.Sample({{"where", "refresher"}}, static_cast<double>(s.acct_refreshed));
  if (s.acct_age_s >= 0) {
    p.Family("tessera_acct_age_seconds", "gauge", "Age of the accounting totals below.");
    p.Sample({}, s.acct_age_s);
  }
  if (s.acct) {
    const AcctReport& all = *s.acct;
    p.Family("tessera_acct_gpu_seconds_total", "counter",
             "GPU-seconds used by jobs (a fraction of a GPU weighted by its share or memory), by "
             "user and kind (whole, fractional).");
    for (const AcctLine& l : all.by_user) {
      p.Sample({{"user", l.key}, {"kind", "whole"}}, l.whole_gpu_seconds);
      p.Sample({{"user", l.key}, {"kind", "fractional"}}, l.fractional_gpu_seconds);
    }
    p.Family("tessera_acct_measured_gpu_seconds_total", "counter",
             "GPU-seconds of jobs whose use was measured (the efficiency's base), by user.");
    for (const AcctLine& l : all.by_user) p.Sample({{"user", l.key}}, l.measured_gpu_seconds);
    p.Family("tessera_acct_busy_gpu_seconds_total", "counter",
             "Of those, the GPU-seconds the jobs kept their GPUs (or shares) busy, by user: "
             "busy / measured is how much of what they held they used.");
    for (const AcctLine& l : all.by_user) p.Sample({{"user", l.key}}, l.busy_gpu_seconds);
    p.Family("tessera_acct_model_gpu_seconds_total", "counter", "GPU-seconds used, by GPU model.");
    for (const AcctLine& l : all.by_model) p.Sample({{"model", l.key}}, l.gpu_seconds);
    p.Family("tessera_acct_group_gpu_seconds_total", "counter",
             "GPU-seconds used, by the owner's primary group.");
    for (const AcctLine& l : all.by_group) p.Sample({{"group", l.key}}, l.gpu_seconds);
    p.Family("tessera_acct_jobs_ended_total", "counter", "Jobs ended, by user and outcome.");
    for (const AcctLine& l : all.by_user) {
      for (auto [outcome, n] : {std::pair{"succeeded", l.succeeded},
                                {"failed", l.failed},
                                {"cancelled", l.cancelled}}) {
        p.Sample({{"user", l.key}, {"outcome", outcome}}, static_cast<double>(n));
      }
    }
    p.Family("tessera_acct_wait_seconds_total", "counter",
             "Seconds jobs waited from submission (or re-queue) to start, by user.");
    for (const AcctLine& l : all.by_user) p.Sample({{"user", l.key}}, l.wait_seconds);
    p.Family("tessera_acct_starts_total", "counter", "Job runs started, by user.");
    for (const AcctLine& l : all.by_user)
      p.Sample({{"user", l.key}}, static_cast<double>(l.started));
  }
  const size_t n = s.gpus.size();
  auto gpu = [&](size_t g) -> Labels {
    return {{"gpu", std::to_string(g)},
            {"uuid", s.gpus[g].uuid},
            {"model", s.gpus[g].model},
            {"hostname", s.hostname}};
  };
  p.Family("tessera_gpu_simulated", "gauge",
           "1 when the GPUs are a simulated machine, not a driver's.");
  p.Sample({{"hostname", s.hostname}}, s.simulated ? 1 : 0);
  p.Family("tessera_gpu_healthy", "gauge",
           "1 when the GPU takes work, 0 when it turned unhealthy.");
  for (size_t g = 0; g < n; ++g) p.Sample(gpu(g), g < s.healthy.size() && s.healthy[g] ? 1 : 0);
  if (!s.mps.empty()) {
    using devices::kMpsDaemonUp, devices::kMpsDaemonDeaths, devices::kMpsServerFaults;
    p.Family(kMpsDaemonUp.name, kMpsDaemonUp.type, kMpsDaemonUp.help);
    for (const ServerMetricsSnapshot::Mps& m : s.mps) {
      if (static_cast<size_t>(m.gpu) < n) p.Sample(gpu(m.gpu), m.up ? 1 : 0);
    }
    p.Family(kMpsDaemonDeaths.name, kMpsDaemonDeaths.type, kMpsDaemonDeaths.help);
    for (const ServerMetricsSnapshot::Mps& m : s.mps) {
      if (static_cast<size_t>(m.gpu) < n) p.Sample(gpu(m.gpu), m.deaths);
    }
    p.Family(kMpsServerFaults.name, kMpsServerFaults.type, kMpsServerFaults.help);
    for (const ServerMetricsSnapshot::Mps& m : s.mps) {
      if (static_cast<size_t>(m.gpu) < n) p.Sample(gpu(m.gpu), m.server_faults);
    }
  }
  p.Family("tessera_gpu_xid_errors_total", "counter",
           "XID errors seen on the GPU, ignored ones included.");
  for (size_t g = 0; g < n; ++g)
    p.Sample(gpu(g), static_cast<double>(g < s.xids.size() ? s.xids[g] : 0));
  p.Family("tessera_gpu_memory_total_bytes", "gauge", "GPU memory.");
  for (size_t g = 0; g < n; ++g)
    p.Sample(gpu(g), static_cast<double>(s.gpus[g].memory_bytes.value_or(0)));
  // Readings the driver does not give are left out (no sample), not reported as 0.
  auto reading = [&](const char* name, const char* help, auto field) {
    p.Family(name, "gauge", help);
    for (size_t g = 0; g < n && g < s.telemetry.size(); ++g) {
      if (const auto& v = s.telemetry[g].*field) p.Sample(gpu(g), static_cast<double>(*v));
    }
  };
  reading("tessera_gpu_utilization_ratio",
          "Share of the last sample period a kernel ran on the GPU (0..1).",
          &devices::GpuTelemetry::utilization);
  reading("tessera_gpu_memory_utilization_ratio",
          "Share of the last sample period GPU memory was read or written (0..1).",
          &devices::GpuTelemetry::memory_utilization);
  reading("tessera_gpu_memory_used_bytes", "GPU memory in use, by every process (driver's count).",
          &devices::GpuTelemetry::memory_used_bytes);
  reading("tessera_gpu_temperature_celsius", "GPU die temperature.",
          &devices::GpuTelemetry::temperature_celsius);
  reading("tessera_gpu_power_watts", "GPU power draw.", &devices::GpuTelemetry::power_watts);
  // The same readings under dcgm-exporter's names, units and labels (devices/dcgm.h), for
  // dashboards and alerts written for it; a family only when some GPU gives the reading.
  for (const devices::DcgmField& f : devices::DcgmFields()) {
    bool any = false;
    for (size_t g = 0; g < n && g < s.telemetry.size(); ++g)
      any |= f.value(s.telemetry[g]).has_value();
    if (!any) continue;
    p.Family(f.name, f.type, f.help);
    for (size_t g = 0; g < n && g < s.telemetry.size(); ++g) {
      if (auto v = f.value(s.telemetry[g]))
        p.Sample(devices::DcgmLabels(s.gpus[g], s.hostname), *v);
    }
  }
  p.Family("tessera_gpu_allocated_ratio", "gauge", "Compute allocated to jobs, in GPUs (0..1).");
  for (size_t g = 0; g < n && g < s.allocated_share.size(); ++g)
    p.Sample(gpu(g), s.allocated_share[g]);
  p.Family("tessera_gpu_allocated_memory_bytes", "gauge", "GPU memory allocated to jobs.");
  for (size_t g = 0; g < n && g < s.allocated_memory_bytes.size(); ++g)
    p.Sample(gpu(g), static_cast<double>(s.allocated_memory_bytes[g]));
  auto job = [&](const ServerMetricsSnapshot::Job& j) -> Labels {
    return {{"job_id", std::to_string(j.id)},
            {"gpu", std::to_string(j.gpu)},
            {"user", j.user},
            {"hostname", s.hostname}};
  };
  p.Family("tessera_job_gpu_share_ratio", "gauge",
           "A job's compute share of its GPU (0..1; whole GPUs 1).");
  for (const auto& j : s.jobs) p.Sample(job(j), j.share);
  p.Family("tessera_job_gpu_memory_limit_bytes", "gauge", "A fractional job's GPU memory limit.");
  for (const auto& j : s.jobs) {
    if (!j.region.empty()) p.Sample(job(j), static_cast<double>(j.limit_bytes));
  }
  // The job's own region file, read once per job: a job that truncated or scribbled on it has no
  // memory reading (no sample) and is marked unreadable. Its use per GPU is its device's.
  std::map<int64_t, std::shared_ptr<shim::RegionData>> regions;
  for (const auto& j : s.jobs) {
    if (!j.region.empty() && !regions.contains(j.id))
      regions[j.id] = std::shared_ptr<shim::RegionData>(shim::ReadRegionHead(j.region.c_str()));
  }
  p.Family("tessera_job_gpu_memory_used_bytes", "gauge",
           "GPU memory a fractional job's processes hold on this GPU (intercept library).");
  for (const auto& j : s.jobs) {
    auto it = regions.find(j.id);
    if (it != regions.end() && it->second && j.ordinal < shim::kMaxDevices)
      p.Sample(job(j), static_cast<double>(it->second->used[j.ordinal].load()));
  }
  p.Family("tessera_job_usage_readable", "gauge",
           "1 when a fractional job's shared region reads as a region, 0 when it does not (the job "
           "removed, truncated or overwrote its file): its figures are then unknown.");
  for (const auto& j : s.jobs) {
    auto it = regions.find(j.id);
    if (it != regions.end()) p.Sample(job(j), it->second ? 1 : 0);
  }
  p.Family("tessera_queue_length", "gauge", "Jobs waiting to start.");
  p.Sample({}, static_cast<double>(s.queued));
  p.Family("tessera_jobs_running", "gauge", "Jobs running.");
  p.Sample({}, static_cast<double>(s.running));
  const SchedulingStats& st = s.scheduling;
  p.Family("tessera_scheduling_latency_seconds", "histogram",
           "From submission (or re-queueing) to start.");
  for (size_t i = 0; i < SchedulingStats::Buckets().size(); ++i) {
    p.Sample({{"le", fmt::format("{:g}", SchedulingStats::Buckets()[i])}},
             static_cast<double>(st.counts_[i]), "_bucket");
  }
  p.Sample({{"le", "+Inf"}}, static_cast<double>(st.count_), "_bucket");
  p.Sample({}, st.sum_, "_sum");
  p.Sample({}, static_cast<double>(st.count_), "_count");
  p.Family("tessera_scheduling_pass_seconds", "gauge", "Duration of the last scheduling pass.");
  p.Sample({}, st.last_pass_s_);
  p.Family("tessera_scheduling_passes_total", "counter", "Scheduling passes run.");
  p.Sample({}, static_cast<double>(st.passes_));
  net::AddSelfMetrics(p, "server");
  return p.Take();
}

}  // namespace tessera::server
