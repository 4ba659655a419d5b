#pragma once
// The standalone server's /metrics page (docs/metrics.md): what it shows is taken from the server
// under its lock as a snapshot (ServerMetricsSnapshot, cheap copies), then written without the lock
// - the reads of the fractional jobs' shared regions and the text itself included - through the
// Prometheus writer shared with the agent and the extender (prometheus.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/gpu.h"
#include "tessera/devices/device_source.h"
#include "tessera/server/acct.h"

namespace tessera::server {

struct ServerMetricsSnapshot;

// Scheduling latency (submission or re-queue to start) and the scheduling passes. Not thread-safe:
// the server keeps it under its lock.
class SchedulingStats {
 public:
  void Started(double latency_s);
  void Pass(double seconds);
  // The histogram's bucket bounds, in seconds.
  static const std::vector<double>& Buckets();

 private:
  friend std::string RenderServerMetrics(const ServerMetricsSnapshot&);
  std::vector<uint64_t> counts_ = std::vector<uint64_t>(Buckets().size(), 0);
  double sum_ = 0;
  uint64_t count_ = 0;
  uint64_t passes_ = 0;
  double last_pass_s_ = 0;
};

struct ServerMetricsSnapshot {
  std::optional<AcctReport> acct;  // since the store began; nullopt when it could not be read
  // How often the accounting was computed by a scrape and by the refresher, and its age (s; -1:
  // none yet).
  uint64_t acct_on_request = 0, acct_refreshed = 0;
  double acct_age_s = -1;
  std::string hostname;
  bool simulated = false;
  std::vector<core::Gpu> gpus;
  std::vector<bool> healthy;
  std::vector<uint64_t> xids;                    // per GPU (0 when unknown)
  std::vector<devices::GpuTelemetry> telemetry;  // per GPU
  std::vector<double> allocated_share;           // per GPU, in GPUs
  std::vector<int64_t> allocated_memory_bytes;   // per GPU
  // One per running job and GPU it holds (a job on 8 GPUs: 8), with the same labels all its life.
  struct Job {
    int64_t id = 0;
    std::string user;
    int gpu = -1;
    int ordinal = 0;   // the GPU's place among the job's (its CUDA ordinal, its region's device)
    double share = 0;  // of its GPU (whole GPUs: 1; no GPU: 0)
    int64_t limit_bytes = 0;  // fractional jobs: their GPU memory limit
    std::string region;       // fractional jobs: their shared region (memory in use read from it)
  };
  std::vector<Job> jobs;  // the running ones
  // The GPUs in MPS mode: whether each one's control daemon answers, and how often it died.
  struct Mps {
    int gpu = 0;
    bool up = false;
    int deaths = 0;
    int server_faults = 0;
  };
  std::vector<Mps> mps;
  size_t queued = 0, running = 0;
  SchedulingStats scheduling;
};

// The page, in the Prometheus text format (0.0.4).
std::string RenderServerMetrics(const ServerMetricsSnapshot& s);

// The GPU memory a job's shared region counts now (on all its GPUs) and at most on one GPU since
// it was made (bytes); zeros and `readable` false when the file cannot be read or is not a region
// of this version (the job can truncate or overwrite its own file at any time: the read copies it
// through pread and never faults).
struct RegionMemory {
  uint64_t used = 0, peak = 0;
  uint64_t refused = 0, wanted = 0;  // allocations refused for the limit; the most it wanted
  bool readable = true;
};
RegionMemory ReadRegionMemory(const std::string& path);

}  // namespace tessera::server
