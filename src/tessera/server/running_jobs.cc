#include "tessera/server/running_jobs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tessera/core/gpu.h"
#include "tessera/core/numeric.h"
#include "tessera/core/request.h"
#include "tessera/server/runner.h"
#include "tessera/server/store.h"

namespace tessera::server {

using nlohmann::json;

std::string JobFilePath(const std::string& state_dir, const char* dir, int64_t id,
                        const char* suffix) {
  return fmt::format("{}/{}/{}{}", state_dir, dir, id, suffix);
}

void WriteStopFile(const std::string& state_dir, int64_t id, const StopAsked& stop) {
  const std::string path = JobFilePath(state_dir, "stop", id);
  const std::string tmp = path + ".tmp";
  const std::string text =
      nlohmann::json{{"why", stop.why}, {"reason", stop.reason}, {"at", stop.at}}.dump();
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  const bool ok =
      fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (fd >= 0) close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    spdlog::warn(
        "job {}: cannot keep its stop in {} ({}): a restart before it ends records it "
        "by its exit code",
        id, path, strerror(errno));
    unlink(tmp.c_str());
  }
}

std::optional<StopAsked> ReadStopFile(const std::string& state_dir, int64_t id) {
  const std::string path = JobFilePath(state_dir, "stop", id);
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("why") || !j["why"].is_string() || !j.contains("reason") ||
      !j["reason"].is_string() || !j.contains("at") || !j["at"].is_number()) {
    spdlog::warn("job {}: its stop file {} is unreadable; ignored", id, path);
    return std::nullopt;
  }
  return StopAsked{j["why"].get<std::string>(), j["reason"].get<std::string>(),
                   j["at"].get<double>()};
}

void RemoveStopFile(const std::string& state_dir, int64_t id) {
  unlink(JobFilePath(state_dir, "stop", id).c_str());
}

std::string ResizeFilePath(const std::string& state_dir, int64_t id) {
  return JobFilePath(state_dir, "resize", id);
}

void WriteResizeFile(const std::string& state_dir, int64_t id,
                     const std::vector<std::string>& uuids, double asked_at, uint32_t uid) {
  const std::string path = ResizeFilePath(state_dir, id);
  const std::string tmp = path + ".tmp";
  const std::string text = fmt::format(
      "TESSERA_RESIZE_GPUS={}\nCUDA_VISIBLE_DEVICES={}\nTESSERA_RESIZE_ASKED_AT={:.3f}\n",
      uuids.size(), fmt::join(uuids, ","), asked_at);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0400);
  bool ok = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  // Its job reads it as its owner.
  if (ok && geteuid() == 0 && uid != 0) ok = fchown(fd, uid, static_cast<gid_t>(-1)) == 0;
  if (fd >= 0) close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    spdlog::warn("job {}: cannot write its resize file {} ({}); it is resized when it ends", id,
                 path, strerror(errno));
    unlink(tmp.c_str());
  }
}

std::optional<double> ReadResizeFile(const std::string& state_dir, int64_t id) {
  const std::string path = ResizeFilePath(state_dir, id);
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  while (std::getline(in, line)) {
    constexpr std::string_view kAt = "TESSERA_RESIZE_ASKED_AT=";
    if (!line.starts_with(kAt)) continue;
    char* end = nullptr;
    const std::string v = line.substr(kAt.size());
    const double at = std::strtod(v.c_str(), &end);
    if (end != v.c_str() && *end == '\0' && std::isfinite(at)) return at;
  }
  spdlog::warn("job {}: its resize file {} is unreadable; taken as asked now", id, path);
  return 0.0;
}

void RemoveResizeFile(const std::string& state_dir, int64_t id) {
  unlink(ResizeFilePath(state_dir, id).c_str());
}

std::string TaskLogPath(const std::string& state_dir, int64_t id, int task, const char* suffix) {
  return JobFilePath(state_dir, "logs", id, fmt::format(".{}{}", task, suffix).c_str());
}

void RunningJob::AddShareReading(const JobHost::ShareUse& s) {
  // The arbiter's counts start again when a process of the job claims a fresh slot (one that died
  // and came back): what was counted before stays counted.
  auto add = [](uint64_t reading, uint64_t& seen, uint64_t& total) {
    total += reading >= seen ? reading - seen : reading;
    seen = reading;
  };
  add(s.busy_us, arbiter_seen_us, arbiter_busy_us);
  add(s.held_us, arbiter_held_seen_us, arbiter_held_us);
  gpu_peak_mib = std::max<int64_t>(gpu_peak_mib, s.peak_bytes >> 20);
  gpu_refused = std::max(gpu_refused, s.refused);
  gpu_wanted_mib =
      std::max<int64_t>(gpu_wanted_mib, static_cast<int64_t>(core::MibRoundedUp(s.wanted_bytes)));
}

std::optional<double> RunningJob::GpuUtilization(double now) const {
  if (gpus.empty()) return std::nullopt;
  // A share with a compute share: the GPU time the arbiter charged it over its run time.
  if (!region.empty() && gpu_milli > 0) {
    const double ran_us = (now - started) * 1e6;
    if (ran_us <= 0 || arbiter_busy_us == 0) return std::nullopt;
    return std::min(100.0, 100.0 * static_cast<double>(arbiter_busy_us) / ran_us);
  }
  // Otherwise the GPUs' own utilization, from the samples in which it held them alone.
  if (util_samples == 0) return std::nullopt;
  return std::clamp(100.0 * util_sum / util_samples, 0.0, 100.0);
}

std::optional<RunningJob::HeldBack> RunningJob::GpuHeldBack(double now) const {
  if (gpus.empty() || region.empty() || gpu_milli <= 0 || arbiter_held_us == 0) return std::nullopt;
  const double ran_us = (now - started) * 1e6;
  if (ran_us < 1) return std::nullopt;
  const double demand = core::DemandPct(static_cast<double>(arbiter_busy_us),
                                        static_cast<double>(arbiter_held_us), ran_us);
  if (demand < 0) return std::nullopt;
  return HeldBack{std::min(100.0, 100.0 * static_cast<double>(arbiter_held_us) / ran_us), demand};
}

CgroupUsage RunningJob::WithEarlier(const CgroupUsage& last) const {
  if (restarts == 0) return last;
  CgroupUsage all = last;
  if (earlier.cpu_seconds >= 0)
    all.cpu_seconds = std::max(0.0, last.cpu_seconds) + earlier.cpu_seconds;
  all.peak_memory_bytes = std::max(last.peak_memory_bytes, earlier.peak_memory_bytes);
  all.oom_kills = last.oom_kills + earlier.oom_kills;
  return all;
}

RecordedUse UsageOf(const JobRecord& r) {
  RecordedUse out;
  const json u = r.usage_json.empty() ? json() : json::parse(r.usage_json, nullptr, false);
  if (!u.is_object()) return out;
  auto field = [&](const char* key) { return u.contains(key) ? u[key] : json(); };
  auto mib = [&](const char* key) -> int64_t {
    const json v = field(key);
    return v.is_number_integer() ? std::max<int64_t>(0, v.get<int64_t>()) : 0;
  };
  if (const json v = field("gpu_utilization_pct"); v.is_number()) out.util = v.get<double>();
  if (const json v = field("gpu_demand_pct"); v.is_number() && out.util)
    out.util = std::max(*out.util, v.get<double>());
  if (const json v = field("shared_gpu"); v.is_boolean()) out.shared_gpu = v.get<bool>();
  const json trial = field("trial");
  out.trial = trial.is_boolean() && trial.get<bool>();
  out.memory = {.peak_mib = mib("gpu_peak_memory_mib"),
                .refused = static_cast<uint64_t>(mib("gpu_memory_refused")),
                .wanted_mib = mib("gpu_memory_wanted_mib")};
  return out;
}

RunningJob& RunningJobs::Add(RunningJob r) {
  const int64_t id = r.id;
  return jobs_[id] = std::move(r);
}

void RunningJobs::NoteSharing(RunningJob& run) {
  if (run.region.empty() || run.gpus.empty()) return;
  for (auto& [other_id, other] : jobs_) {
    if (other_id == run.id || other.region.empty() || other.gpus != run.gpus) continue;
    other.shared_gpu = run.shared_gpu = true;
  }
}

void RunningJobs::NoteSharingSince(const std::vector<JobRecord>& others) {
  struct Ended {
    std::vector<int> gpus;
    double at = 0;
  };
  std::vector<Ended> ended;  // the shares among the others that ended, their placements parsed once
  for (const JobRecord& o : others) {
    if (!o.started_at || !o.ended_at || jobs_.contains(o.id)) continue;
    const json p = json::parse(o.placement_json, nullptr, false);
    // A whole GPU (all its compute) never ran beside a share on it.
    if (!p.is_object() || !p.contains("gpus") || !p["gpus"].is_array() ||
        p.value("milli_per_gpu", 0) >= core::kMilliPerGpu) {
      continue;
    }
    Ended& e = ended.emplace_back(Ended{.at = *o.ended_at});
    for (const json& g : p["gpus"])
      if (g.is_object() && g.value("index", -1) >= 0) e.gpus.push_back(g["index"].get<int>());
  }
  for (auto& [id, run] : jobs_) {
    if (!run.adopted || run.region.empty() || run.gpus.empty()) continue;
    NoteSharing(run);
    for (const Ended& e : ended)
      if (e.gpus == run.gpus && e.at > run.started) run.shared_gpu = true;
  }
}

std::optional<double> RunningJobs::EarliestAdoptedShare() const {
  std::optional<double> at;
  for (const auto& [id, run] : jobs_) {
    if (run.adopted && !run.region.empty() && !run.gpus.empty())
      at = std::min(at.value_or(run.started), run.started);
  }
  return at;
}

void RunningJobs::StopOn(int gpu, const std::string& why, const std::string& reason, double now,
                         bool mps_only) {
  for (auto& [id, r] : jobs_) {
    if (mps_only && !(r.spec && r.spec->sharing == "mps")) continue;
    if (std::find(r.gpus.begin(), r.gpus.end(), gpu) != r.gpus.end())
      RequestStop(r, why, reason, now);
  }
}

RunningJob* RunningJobs::Find(int64_t id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

RunningJob RunningJobs::Take(int64_t id) {
  auto node = jobs_.extract(id);
  return node.empty() ? RunningJob{} : std::move(node.mapped());
}

bool RunningJobs::AnyOf(uint32_t uid) const {
  return std::any_of(jobs_.begin(), jobs_.end(),
                     [&](const auto& r) { return r.second.uid == uid; });
}

namespace {

// No resize is asked of `r` any more: its target and its resize file go.
void DropResize(RunningJob& r, const std::string& state_dir) {
  r.resize_to.clear();
  RemoveResizeFile(state_dir, r.id);
}

}  // namespace

void RunningJobs::RequestStop(RunningJob& r, const std::string& why, const std::string& reason,
                              double now) {
  if (!r.stop.empty()) {
    // Stopping to be resized: another stop is what its end is, its SIGTERM already sent.
    if (r.stop != "resize" || why == "resize") return;
    r.stop = why;
    r.stop_reason = reason;
    DropResize(r, options_.state_dir);
    WriteStopFile(options_.state_dir, r.id, {why, reason, r.stop_at});
    spdlog::info("job {}: stopping ({}) while it stopped to be resized", r.id, reason);
    return;
  }
  r.stop = why;
  r.stop_reason = reason;
  r.stop_at = now;
  if (why != "resize") DropResize(r, options_.state_dir);
  WriteStopFile(options_.state_dir, r.id, {why, reason, now});
  spdlog::info("job {}: stopping ({}): SIGTERM, SIGKILL after {} s", r.id, reason,
               r.grace_period_s);
  if (!host_.Signal(r.pid, SIGTERM)) host_.Signal(r.pid, SIGKILL);
}

void RunningJobs::AskResize(RunningJob& r, std::vector<int> to,
                            const std::vector<std::string>& uuids, double now) {
  if (!r.spec || !r.spec->Resizable()) return;
  if (!r.stop.empty() && r.stop != "resize") return;  // its GPUs go with it
  const bool asked = !r.resize_to.empty();
  if (!asked && to == r.gpus) return;
  r.resize_to = std::move(to);
  const std::string size =
      fmt::format("{} GPU{} ({})", r.resize_to.size(), r.resize_to.size() == 1 ? "" : "s",
                  fmt::join(r.resize_to, ","));
  if (r.spec->resize_by == "restart") {
    RequestStop(r, "resize", fmt::format("stopped to be started again on {}", size), now);
    return;
  }
  // By signal: told in its file (rewritten when asked again), signalled once.
  const double at = asked ? r.resize_at : now;
  WriteResizeFile(options_.state_dir, r.id, uuids, at, r.uid);
  if (asked || !r.stop.empty()) {
    spdlog::info("job {}: its resize is now to {}", r.id, size);
    return;
  }
  r.resize_at = now;
  spdlog::info("job {}: resizing to {}: SIGUSR1; started again there when it exits {} within {} s",
               r.id, size, kResizeExitCode, r.spec->resize_grace_s);
  host_.Signal(r.pid, SIGUSR1);
}

bool RunningJobs::EndsForResize(const RunningJob& r, std::optional<int> code) {
  if (r.resize_to.empty()) return false;
  if (r.stop == "resize") return true;
  // Killed by the signal itself (no handler yet, as just after a start): it went as asked.
  return r.stop.empty() && (code == kResizeExitCode || code == 128 + SIGUSR1);
}

void RunningJobs::Kill(RunningJob& r, const std::string& why) {
  if (r.killed) return;
  spdlog::info("job {}: {}: SIGKILL", r.id, why);
  host_.Signal(r.pid, SIGKILL);
  // Killing podman's client leaves the container to its monitor: remove it by name.
  if (r.container && containers_) host_.RemoveContainer(r.id);
  r.killed = true;
}

uint64_t RunningJobs::LogBytes(const RunningJob& r) const {
  uint64_t bytes = 0;
  auto add = [&](const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_size);
  };
  add(JobFilePath(options_.state_dir, "logs", r.id, ".out"));
  add(JobFilePath(options_.state_dir, "logs", r.id, ".err"));
  for (int t = 1; t < r.tasks; ++t) {
    add(TaskLogPath(options_.state_dir, r.id, t, ".out"));
    add(TaskLogPath(options_.state_dir, r.id, t, ".err"));
  }
  return bytes;
}

std::vector<std::pair<int64_t, std::optional<int>>> RunningJobs::Check(double now) {
  // Logs are measured about once a second (a stat per log of each running job), not every look.
  const uint64_t max_logs = options_.max_log_bytes_per_job;
  const bool check_logs = max_logs > 0 && now - logs_checked_ >= 1;
  if (check_logs) logs_checked_ = now;
  std::vector<std::pair<int64_t, std::optional<int>>> ended;
  for (auto& [id, r] : jobs_) {
    std::optional<int> code;
    bool gone = false;
    if (!r.adopted) {
      code = host_.Reap(r.pid);
      gone = code.has_value();
    } else if (!host_.Alive(r.pid, r.start_time)) {
      gone = true;
      code = ReadExitFile(JobFilePath(options_.state_dir, "exit", id));
    }
    if (gone) {
      ended.emplace_back(id, code);
      continue;
    }
    if (!r.resize_to.empty() && r.stop.empty() && r.spec &&
        now - r.resize_at >= r.spec->resize_grace_s) {
      // It did not answer its resize by signal in its grace: a shrink is carried out anyway (a
      // job waits for the GPUs), a growth as it declared.
      const bool grows = r.resize_to.size() > r.gpus.size();
      std::vector<int> to = r.resize_to, on = r.gpus;
      std::sort(to.begin(), to.end());
      std::sort(on.begin(), on.end());
      if (to == on) {
        // Asked before a server restart, to where it runs now: nothing to do.
        DropResize(r, options_.state_dir);
      } else if (grows && r.spec->resize_unanswered == "keep") {
        spdlog::info("job {}: did not answer its resize in {} s; it keeps its {} GPU(s)", id,
                     r.spec->resize_grace_s, r.gpus.size());
        DropResize(r, options_.state_dir);
        kept_.push_back(id);
      } else {
        RequestStop(
            r, "resize",
            fmt::format("did not answer its resize in {:g} s: stopped to be started again "
                        "on {} GPU(s) ({})",
                        r.spec->resize_grace_s, r.resize_to.size(), fmt::join(r.resize_to, ",")),
            now);
      }
    }
    if (r.spec && r.spec->TrialSeconds() > 0 && now - r.started >= r.spec->TrialSeconds()) {
      RequestStop(
          r, "trial",
          fmt::format("its trial of {} is over", core::FormatDuration(r.spec->TrialSeconds())),
          now);
    }
    if (r.max_runtime_s > 0 && now - r.started > r.max_runtime_s) {
      RequestStop(r, "timeout", fmt::format("ran past its max runtime of {:g} s", r.max_runtime_s),
                  now);
    }
    if (check_logs && r.stop.empty()) {
      if (const uint64_t bytes = LogBytes(r); bytes > max_logs) {
        RequestStop(r, "logs",
                    fmt::format("its logs reached {} MiB, over the limit of {} MiB "
                                "(limits.max_log_bytes_per_job)",
                                bytes >> 20, max_logs >> 20),
                    now);
      }
    }
    if (!r.stop.empty() && !r.killed && now - r.stop_at >= r.grace_period_s) {
      Kill(r, fmt::format("still running {} s after SIGTERM", r.grace_period_s));
    }
  }
  return ended;
}

void RunningJobs::Measure(const std::vector<devices::GpuTelemetry>& telemetry,
                          const std::vector<int>& holders,
                          const std::map<int64_t, JobHost::ShareUse>& shares) {
  for (auto& [id, r] : jobs_) {
    if (r.gpus.empty()) continue;
    if (auto s = shares.find(id); s != shares.end()) r.AddShareReading(s->second);
    // The GPUs' readings count for it only where it holds them alone.
    bool alone = true, known = true;
    double util = 0;
    int64_t peak = 0;
    for (int g : r.gpus) {
      const size_t i = static_cast<size_t>(g);
      if (i >= telemetry.size() || i >= holders.size() || holders[i] != 1) {
        alone = false;
        break;
      }
      const devices::GpuTelemetry& t = telemetry[i];
      if (t.utilization) {
        util += *t.utilization;
      } else {
        known = false;
      }
      if (t.memory_used_bytes) peak = std::max<int64_t>(peak, *t.memory_used_bytes >> 20);
    }
    if (!alone) continue;
    if (known) {
      r.util_sum += util / static_cast<double>(r.gpus.size());
      ++r.util_samples;
    }
    // Whole GPUs: what the GPUs say they hold (context included), with what a trial's region saw.
    if (r.region.empty() || (r.gpu_milli == 0 && r.memory_limit_mib == 0))
      r.gpu_peak_mib = std::max(r.gpu_peak_mib, peak);
  }
}

}  // namespace tessera::server
