#include "tessera/slurm/node.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "fmt/format.h"
#include "tessera/core/users.h"
#include "tessera/net/prometheus.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"
#include "tessera/slurm/step.h"

namespace tessera::slurm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

}  // namespace

absl::StatusOr<std::vector<json>> ReadAccounting(const std::string& state_dir,
                                                 const std::vector<uint32_t>& jobs) {
  const std::string dir = state_dir + "/acct";
  if (!fs::is_directory(dir))
    return absl::NotFoundError(
        fmt::format("{}: no such folder (is state_dir= in plugstack.conf another one?)", dir));
  std::map<uint32_t, std::string> all = RecordFiles(dir);
  std::vector<std::pair<uint32_t, std::string>> chosen;
  if (jobs.empty()) {
    chosen.assign(all.begin(), all.end());
  } else {
    for (uint32_t j : jobs) {
      auto it = all.find(j);
      if (it == all.end())
        return absl::NotFoundError(fmt::format(
            "job {}: no accounting in {} (not ended on this node, or it had no GPUs here)", j,
            dir));
      chosen.emplace_back(*it);
    }
  }
  std::vector<json> out;
  for (const auto& [id, path] : chosen) {
    std::ifstream in(path);
    json r = json::parse(in, nullptr, false);
    if (!r.is_object() || !r.contains("job_id") || !r["gpus"].is_array())
      return absl::DataLossError(fmt::format("{}: not an accounting record", path));
    out.push_back(std::move(r));
  }
  return out;
}

// A user's name as the server says an owner ("uid:1234" when the machine has none).
std::string UserName(uid_t uid) {
  return core::LoginName(uid).value_or(fmt::format("uid:{}", uid));
}

std::string NodeMetrics(const std::string& state_dir, const std::string& hostname,
                        int64_t boot_time) {
  struct Row {
    uint32_t job;
    std::string user;
    int gpu;
    size_t ordinal;
    double share;
    uint64_t limit;
  };
  std::vector<Row> rows;
  std::map<uint32_t, std::unique_ptr<shim::RegionData>> regions;
  std::map<uint32_t, bool> readable;
  int stale = 0;
  for (const auto& [id, j] : NodeJobs(state_dir)) {
    if (boot_time > 0 && j.started < boot_time) {
      ++stale;  // its epilog never ran before the reboot: not running
      continue;
    }
    const std::string user = UserName(j.uid);
    for (size_t i = 0; i < j.gpus.size(); ++i) {
      rows.push_back({id, user, j.gpus[i], i, j.share_permille ? j.share_permille / 1000.0 : 1.0,
                      j.memory_bytes});
    }
    auto head = shim::ReadRegionHead(fmt::format("{}/regions/{}.region", state_dir, id).c_str());
    readable[id] = head != nullptr;
    regions[id] = std::move(head);
  }
  net::MetricsPage p;
  auto labels = [&](const Row& row) -> net::MetricsPage::Labels {
    return {{"job_id", fmt::format("slurm-{}", row.job)},
            {"slurm_job_id", std::to_string(row.job)},
            {"user", row.user},
            {"gpu", std::to_string(row.gpu)},
            {"hostname", hostname}};
  };
  p.Family("tessera_job_gpu_share_ratio", "gauge",
           "A job's compute share of its GPU (0..1; whole GPUs 1).");
  for (const Row& r : rows) p.Sample(labels(r), r.share);
  p.Family("tessera_job_gpu_memory_limit_bytes", "gauge", "A fractional job's GPU memory limit.");
  for (const Row& r : rows) {
    if (r.limit > 0) p.Sample(labels(r), static_cast<double>(r.limit));
  }
  p.Family("tessera_job_gpu_memory_used_bytes", "gauge",
           "GPU memory a fractional job's processes hold (intercept library).");
  for (const Row& r : rows) {
    const auto& head = regions[r.job];
    if (head && r.ordinal < shim::kMaxDevices)
      p.Sample(labels(r), static_cast<double>(head->used[r.ordinal].load()));
  }
  p.Family("tessera_job_gpu_busy_seconds_total", "counter",
           "GPU time the arbiter charged a job with a compute share.");
  const std::string arbiter = state_dir + "/arbiter/gpu.arbiter";
  std::vector<shim::ArbiterUse> used(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (r.share >= 1.0) continue;
    used[i] = shim::ArbiterJobUse(arbiter.c_str(), &r.gpu, 1,
                                  shim::ArbiterJobKey(fmt::format("slurm-{}", r.job).c_str()));
    p.Sample(labels(r), static_cast<double>(used[i].busy_us) / 1e6);
  }
  p.Family("tessera_job_gpu_held_back_seconds_total", "counter",
           "How long a job with a compute share had launches waiting for its GPU (other jobs' "
           "slices: it wanted more than it got).");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].share < 1.0) p.Sample(labels(rows[i]), static_cast<double>(used[i].held_us) / 1e6);
  }
  p.Family("tessera_job_usage_readable", "gauge",
           "1 when a job's shared region reads as a region, 0 when it does not (the job removed, "
           "truncated or overwrote its file): its figures are then unknown.");
  for (const Row& r : rows) p.Sample(labels(r), readable[r.job] ? 1 : 0);
  p.Family("tessera_slurm_stale_job_records", "gauge",
           "Records of jobs set up before this node's last boot (their epilog never ran): not "
           "running; set aside when Slurm gives their id again, or removed by an admin.");
  p.Sample({{"hostname", hostname}}, stale);
  // Ended jobs, per user, since the plugin first ran on this node (totals.json): counters to sum
  // over the cluster's nodes (the server's tessera_acct_* are one server's).
  const NodeTotals totals = ReadTotals(state_dir);
  std::vector<std::pair<std::string, const UserTotals*>> users;
  for (const auto& [uid, t] : totals.users) users.emplace_back(UserName(uid), &t);
  auto user = [&](const std::string& name) -> net::MetricsPage::Labels {
    return {{"user", name}, {"hostname", hostname}};
  };
  p.Family("tessera_slurm_acct_totals_readable", "gauge",
           "1 when the node's totals of ended jobs (totals.json) read as such; 0 when not (the "
           "next epilog sets the file aside and counts anew).");
  p.Sample({{"hostname", hostname}}, totals.unreadable.empty() ? 1 : 0);
  p.Family("tessera_slurm_acct_jobs_ended_total", "counter",
           "Jobs with GPUs that ended on this node, by user.");
  for (const auto& [name, t] : users) p.Sample(user(name), static_cast<double>(t->jobs));
  p.Family("tessera_slurm_acct_gpu_seconds_total", "counter",
           "GPU-seconds ended jobs held on this node (a compute share weighted by its share), by "
           "user and kind (whole, fractional: a share or a GPU memory limit).");
  for (const auto& [name, t] : users) {
    auto l = user(name);
    l.emplace_back("kind", "whole");
    p.Sample(l, t->whole_gpu_seconds);
    l.back().second = "fractional";
    p.Sample(l, t->fractional_gpu_seconds);
  }
  p.Family("tessera_slurm_acct_measured_gpu_seconds_total", "counter",
           "Of those, the GPU-seconds of jobs whose GPU time was measured (a compute share), by "
           "user.");
  for (const auto& [name, t] : users) p.Sample(user(name), t->measured_gpu_seconds);
  p.Family("tessera_slurm_acct_busy_gpu_seconds_total", "counter",
           "The GPU time those jobs used, at most what they held, by user: busy / measured is how "
           "much of what they held they used.");
  for (const auto& [name, t] : users) p.Sample(user(name), t->busy_gpu_seconds);
  p.Family("tessera_slurm_acct_gpu_memory_refused_jobs_total", "counter",
           "Ended jobs whose GPU memory limit refused an allocation, by user.");
  for (const auto& [name, t] : users)
    p.Sample(user(name), static_cast<double>(t->memory_refused_jobs));
  net::AddSelfMetrics(p, "slurm-exporter");
  return p.Take();
}

}  // namespace tessera::slurm
