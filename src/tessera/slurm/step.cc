#include "tessera/slurm/step.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "tessera/core/gpu.h"
#include "tessera/core/numeric.h"
#include "tessera/core/request.h"
#include "tessera/devices/mps.h"
#include "tessera/server/file_acl.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"

namespace tessera::slurm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::optional<long> ParseWhole(std::string_view text) {
  long v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::string Arbiter(const PluginConfig& c) { return c.state_dir + "/arbiter/gpu.arbiter"; }
std::string Region(const PluginConfig& c, uint32_t job) {
  return fmt::format("{}/regions/{}.region", c.state_dir, job);
}
std::string Record(const PluginConfig& c, uint32_t job) {
  return fmt::format("{}/jobs/{}.json", c.state_dir, job);
}
std::string Acct(const PluginConfig& c, uint32_t job) {
  return fmt::format("{}/acct/{}.json", c.state_dir, job);
}
std::string JobKey(uint32_t job) { return fmt::format("slurm-{}", job); }

// The state folder's lock, held while the records and the arbiter's ACL change (steps and epilogs
// of several jobs run at once, in separate processes).
class StateLock {
 public:
  explicit StateLock(const std::string& dir) {
    fd_ = open((dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~StateLock() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

absl::Status MakeFolder(const std::string& path, mode_t mode) {
  if (mkdir(path.c_str(), mode) != 0 && errno != EEXIST)
    return absl::InternalError(fmt::format("cannot create {}: {}", path, strerror(errno)));
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
    return absl::FailedPreconditionError(
        fmt::format("{} is not a folder of the plugin's own user: refused", path));
  if (chmod(path.c_str(), mode) != 0)
    return absl::InternalError(fmt::format("chmod {}: {}", path, strerror(errno)));
  return absl::OkStatus();
}

// A record and region left by an earlier job under this id, moved to stale/<job>.<time>.json and
// .region (kept for the admin: who it was, what it held); what was done, for the log.
std::string SetAside(const PluginConfig& c, uint32_t job, uid_t was, uid_t now_uid, time_t now) {
  const std::string dir = c.state_dir + "/stale";
  (void)MakeFolder(dir, 0700);
  const std::string base = fmt::format("{}/{}.{}", dir, job, static_cast<int64_t>(now));
  rename(Record(c, job).c_str(), (base + ".json").c_str());
  rename(Region(c, job).c_str(), (base + ".region").c_str());
  return fmt::format(
      "job {}: a record of an earlier job {} of uid {} was still here (its epilog never ran); "
      "set aside as {}.json, not used for this job of uid {}",
      job, job, was, base, now_uid);
}

absl::Status MakeState(const PluginConfig& c) {
  // Folders above it that are missing (state_dir=/var/lib/tessera-slurm/%n on a fresh node) are
  // made as mkdir -p would, passable by every user (0711); existing ones are left as they are.
  std::vector<std::string> missing;
  for (fs::path p = fs::path(c.state_dir).parent_path(); !p.empty() && p != p.root_path();
       p = p.parent_path()) {
    if (access(p.c_str(), F_OK) == 0) break;
    missing.push_back(p.string());
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (mkdir(it->c_str(), 0711) != 0 && errno != EEXIST)
      return absl::InternalError(fmt::format("cannot create {}: {}", *it, strerror(errno)));
  }
  // Folders every user passes through (0711) but only root lists or writes; the records root's.
  for (const auto& [dir, mode] :
       std::vector<std::pair<std::string, mode_t>>{{c.state_dir, 0711},
                                                   {c.state_dir + "/arbiter", 0711},
                                                   {c.state_dir + "/regions", 0711},
                                                   {c.state_dir + "/jobs", 0700},
                                                   {c.state_dir + "/acct", 0755}}) {
    if (absl::Status st = MakeFolder(dir, mode); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// A job's record as SetUpStep writes it; nullopt when the file is not one.
std::optional<NodeJob> ReadNodeJob(const std::string& path) {
  std::ifstream in(path);
  const json r = json::parse(in, nullptr, false);
  if (!r.is_object()) return std::nullopt;
  try {
    NodeJob j;
    j.job_id = r.value("job_id", 0u);
    j.uid = r.value("uid", 0u);
    j.gid = r.value("gid", 0u);
    j.gpus = r.value("gpus", std::vector<int>{});
    j.share_permille = r.value("share_permille", 0u);
    j.memory_bytes = r.value("memory_bytes", uint64_t{0});
    j.started = r.value("started", int64_t{0});
    j.name = r.value("name", "");
    j.share_auto = r.value("share_auto", false);
    j.memory_auto = r.value("memory_auto", false);
    j.sizing = r.value("sizing", "");
    j.trial_s = r.value("trial_s", 0.0);
    j.auto_trial = r.value("auto_trial", false);
    j.restarts = r.value("restarts", 0u);
    j.trial_end = r.value("trial_end", "");
    return j;
  } catch (const json::exception&) {
    return std::nullopt;  // a field of another type
  }
}

json RecordJson(const NodeJob& j) {
  json r = {{"job_id", j.job_id},
            {"uid", j.uid},
            {"gid", j.gid},
            {"gpus", j.gpus},
            {"share_permille", j.share_permille},
            {"memory_bytes", j.memory_bytes},
            {"started", j.started}};
  if (!j.name.empty()) r["name"] = j.name;
  if (j.share_auto) r["share_auto"] = true;
  if (j.memory_auto) r["memory_auto"] = true;
  if (!j.sizing.empty()) r["sizing"] = j.sizing;
  if (j.trial_s > 0) r["trial_s"] = j.trial_s;
  if (j.auto_trial) r["auto_trial"] = true;
  if (j.restarts > 0) r["restarts"] = j.restarts;
  if (!j.trial_end.empty()) r["trial_end"] = j.trial_end;
  return r;
}

// The users with a job that has a compute share on this node (from the records).
std::set<uid_t> ShareUsers(const PluginConfig& c) {
  std::set<uid_t> users;
  for (const auto& [id, j] : NodeJobs(c.state_dir)) {
    if (j.share_permille > 0 && j.uid != 0) users.insert(j.uid);
  }
  return users;
}

absl::Status WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return absl::InternalError(fmt::format("cannot create {}: {}", tmp, strerror(errno)));
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  fchmod(fd, mode) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::InternalError(fmt::format("cannot write {}: {}", path, strerror(errno)));
  }
  return absl::OkStatus();
}

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr double kMemoryStepMiB = 256, kShareStepPct = 5;

std::string Mib(uint64_t bytes) { return fmt::format("{}MiB", core::MibRoundedUp(bytes)); }

// What a job that its memory limit held back should be told, whether it failed or went on: how
// many allocations were refused, its peak, the most it asked and what to ask (sized "auto": that
// its next job of the name is sized past it); empty otherwise.
std::string Outgrew(const PluginConfig& config, const json& acct) {
  const bool sized = acct.value("memory_auto", false);
  uint64_t refused = 0, peak = 0, wanted = 0, limit = 0;
  for (const json& g : acct["gpus"]) {
    refused += g.value("refused", uint64_t{0});
    peak = std::max(peak, g.value("peak_memory_bytes", uint64_t{0}));
    wanted = std::max(wanted, g.value("wanted_peak_bytes", uint64_t{0}));
    limit = std::max(limit, g.value("memory_limit_bytes", uint64_t{0}));
  }
  if (refused == 0) return "";
  const double next = core::SizeFromUse(static_cast<double>(std::max(peak, wanted)) / kMiB,
                                        config.auto_margin_pct / 100.0, kMemoryStepMiB);
  const std::string said =
      fmt::format("{} of {} refused {} allocation{} (measured peak {}; it asked for {} at most)",
                  sized ? "its automatic GPU memory" : "its GPU memory limit", Mib(limit), refused,
                  refused == 1 ? "" : "s", Mib(peak), Mib(wanted));
  if (!sized) return fmt::format("{}: ask --tessera-mem={:.0f}M next time", said, next);
  return fmt::format("{}: the next job named '{}' is sized past it (or ask --tessera-mem={:.0f}M)",
                     said, acct.value("name", ""), next);
}

// A job name's part of its history files' names (FNV-1a, hex): a step reads only its name's
// records, not all its user's.
std::string NameKey(const std::string& name) {
  uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

// The user's folder of the history: root's alone (0700), as the records are.
std::string UserHistory(const PluginConfig& config, uid_t uid) {
  return fmt::format("{}/{}", HistoryDir(config), uid);
}

// Writes an ended job's record into its user's history (<name hash>.<job>.<node>.json: the nodes
// of a shared history_dir= write files of their own - named by the Slurm node, else the host,
// which several slurmd of one host share) and keeps the newest kHistoryKept.
absl::Status KeepInHistory(const PluginConfig& config, const json& acct) {
  const std::string dir = UserHistory(config, acct.value("uid", 0u));
  for (const std::string& d : {HistoryDir(config), dir}) {
    if (absl::Status st = MakeFolder(d, 0700); !st.ok()) return st;
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string node = config.node.empty() || config.node.find('/') != std::string::npos
                               ? std::string(host)
                               : config.node;
  // A requeued run's record beside its earlier runs' (Slurm keeps the job's id): <job>-<restarts>.
  const uint32_t restarts = acct.value("restarts", 0u);
  const std::string path = fmt::format(
      "{}/{}.{}{}.{}.json", dir, NameKey(acct.value("name", "")), acct.value("job_id", 0u),
      restarts > 0 ? fmt::format("-{}", restarts) : std::string(), node);
  if (absl::Status st = WriteFile(path, acct.dump() + "\n", 0600); !st.ok()) return st;
  std::vector<std::pair<fs::file_time_type, fs::path>> kept;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".json") kept.emplace_back(e.last_write_time(ec), e.path());
  }
  if (kept.size() <= kHistoryKept) return absl::OkStatus();
  std::sort(kept.begin(), kept.end());
  for (size_t i = 0; i + kHistoryKept < kept.size(); ++i) fs::remove(kept[i].second, ec);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PluginConfig> ParsePluginArgs(const std::vector<std::string>& args,
                                             const std::string& node) {
  PluginConfig c;
  c.node = node;
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(fmt::format("plugstack.conf: '{}': {}", a, why));
    };
    if (eq == std::string::npos || value.empty()) return bad("expected key=value");
    if ((key == "state_dir" || key == "history_dir") && value.find("%n") != std::string::npos) {
      if (node.empty() || node.find('/') != std::string::npos || node == "." || node == "..")
        return bad(node.empty() ? "%n is the Slurm node's name, which is not known here "
                                  "(SLURMD_NODENAME is not set)"
                                : "%n: the node's name '" + node + "' is no folder name");
      value = absl::StrReplaceAll(value, {{"%n", node}});
    }
    if (key == "library") {
      if (value[0] != '/') return bad("the library's path must be absolute");
      c.library = value;
    } else if (key == "state_dir") {
      if (value[0] != '/') return bad("the folder's path must be absolute");
      c.state_dir = value;
      while (c.state_dir.size() > 1 && c.state_dir.back() == '/') c.state_dir.pop_back();
    } else if (key == "shards_per_gpu") {
      auto n = ParseWhole(value);
      // At most the jobs one GPU's arbiter paces: a shard step beyond them would wait for a slot.
      if (!n || *n < 1 || *n > shim::kArbiterJobs) {
        return bad("expected a count of shards from 1 to 64 (the jobs a GPU's arbiter paces)");
      }
      c.shards_per_gpu = static_cast<int>(*n);
    } else if (key == "gpu_memory" || key == "context_overhead") {
      auto b = core::ParseBytes(value);
      if (!b || (key == "gpu_memory" && *b == 0))
        return bad("expected a size such as 80GiB or 16G");
      (key == "gpu_memory" ? c.gpu_memory_bytes : c.context_overhead_bytes) = *b;
    } else if (key == "mps_gpus") {
      c.mps_all = value == "all";
      std::vector<std::string> words;
      if (!c.mps_all) words = absl::StrSplit(value, ',');
      for (const std::string& w : words) {
        auto n = ParseWhole(w);
        if (!n || *n > 1023) return bad("expected all, or GPU indices such as 0,1");
        c.mps_gpus.push_back(static_cast<int>(*n));
      }
    } else if (key == "mps_control") {
      c.mps_control = value;
    } else if (key == "history_dir") {
      if (value[0] != '/') return bad("the folder's path must be absolute");
      c.history_dir = value;
      while (c.history_dir.size() > 1 && c.history_dir.back() == '/') c.history_dir.pop_back();
    } else if (key == "auto_margin") {
      auto n = ParseWhole(value.back() == '%' ? value.substr(0, value.size() - 1) : value);
      if (!n || *n < 0 || *n > 200) return bad("expected a margin from 0% to 200%");
      c.auto_margin_pct = static_cast<int>(*n);
    } else if (key == "auto_trial") {
      const std::optional<double> s = core::ParseDurationOrZero(value);
      if (!s || *s > kMaxTrialSeconds)
        return bad("expected a length of at most a day such as 2m or 90s (0: none)");
      c.auto_trial_s = *s;
    } else if (key == "admin_comment") {
      if (value != "yes" && value != "no") return bad("expected yes or no");
      c.admin_comment = value == "yes";
    } else {
      return bad(
          "unknown key (library, state_dir, shards_per_gpu, gpu_memory, context_overhead, "
          "mps_gpus, mps_control, history_dir, auto_margin, auto_trial, admin_comment)");
    }
  }
  if (c.library.empty()) return absl::InvalidArgumentError("plugstack.conf: library= is required");
  return c;
}

bool IsMps(const PluginConfig& config, int gpu) {
  return config.mps_all ||
         std::find(config.mps_gpus.begin(), config.mps_gpus.end(), gpu) != config.mps_gpus.end();
}

std::string HistoryDir(const PluginConfig& config) {
  return config.history_dir.empty() ? config.state_dir + "/history" : config.history_dir;
}

absl::Status CheckStepOptions(const std::string& share_option, const std::string& mem_option,
                              const std::string& trial_option) {
  if (!trial_option.empty()) {
    const std::optional<double> s = core::ParseDuration(trial_option);
    if (!s || *s > kMaxTrialSeconds)
      return absl::InvalidArgumentError(fmt::format(
          "--tessera-trial={}: expected a length of at most a day such as 2m, 90s or 1:00:00",
          trial_option));
  }
  if (!share_option.empty() && share_option != "auto") {
    uint32_t p = 0;
    if (!shim::ParseShare(share_option.c_str(), &p))
      return absl::InvalidArgumentError(
          fmt::format("--tessera-share={}: expected a share of a GPU such as 30% or 0.3, or auto",
                      share_option));
  }
  if (!mem_option.empty() && mem_option != "auto") {
    auto b = core::ParseBytes(mem_option);
    if (!b || *b == 0)
      return absl::InvalidArgumentError(fmt::format(
          "--tessera-mem={}: expected a size such as 10G or 512MiB, or auto", mem_option));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepLimits> DecideLimits(const PluginConfig& config, const StepRequest& request) {
  StepLimits l;
  for (std::string_view rest = request.gpus; !rest.empty();) {
    const size_t comma = rest.find(',');
    auto n = ParseWhole(rest.substr(0, comma));
    if (!n || *n < 0 || *n >= shim::kArbiterGpus)
      return absl::InvalidArgumentError(
          fmt::format("the step's GPUs '{}' are not a list of indices below {}", request.gpus,
                      shim::kArbiterGpus));
    l.gpus.push_back(static_cast<int>(*n));
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
  }
  const bool asks =
      !request.share_option.empty() || !request.mem_option.empty() || !request.trial_option.empty();
  if (l.gpus.empty()) {
    if (asks)
      return absl::InvalidArgumentError(
          "--tessera-share/--tessera-mem/--tessera-trial need GPUs: ask for them with "
          "--gres=shard:N or --gres=gpu:N");
    return l;  // no GPU: left alone
  }
  // What the step's gres means: its shards' part of each GPU, or whole GPUs.
  uint32_t share = 1000;
  uint64_t memory = config.gpu_memory_bytes;
  if (!request.shards.empty()) {
    auto n = ParseWhole(request.shards);
    if (!n || *n < 1)
      return absl::InvalidArgumentError(
          fmt::format("SLURM_SHARDS_ON_NODE '{}' is not a count", request.shards));
    if (config.shards_per_gpu == 0)
      return absl::FailedPreconditionError(
          "the step has shards but plugstack.conf gives no shards_per_gpu= (gres.conf's shard "
          "Count per GPU)");
    if (config.gpu_memory_bytes == 0)
      return absl::FailedPreconditionError(
          "the step has shards but plugstack.conf gives no gpu_memory= (each GPU's memory)");
    const long shards = std::min<long>(*n, config.shards_per_gpu);
    share = static_cast<uint32_t>(shards * 1000 / config.shards_per_gpu);
    memory = static_cast<uint64_t>(static_cast<unsigned __int128>(config.gpu_memory_bytes) *
                                   shards / config.shards_per_gpu);
    l.share_permille = std::max<uint32_t>(share, 1);
    l.memory_bytes = memory;
  }
  if (absl::Status st =
          CheckStepOptions(request.share_option, request.mem_option, request.trial_option);
      !st.ok())
    return st;
  l.name = request.job_name;
  l.batch_step = request.batch_step;
  l.restarts = request.restarts;
  l.not_requeueable = request.not_requeueable;
  l.batch_host = request.batch_host;
  l.nodes = request.nodes;
  if (!request.trial_option.empty()) {
    // A trial measures: it runs on what its shards mean, whatever else it asked.
    l.trial_s = *core::ParseDuration(request.trial_option);
    return l;
  }
  l.share_auto = request.share_option == "auto";
  l.memory_auto = request.mem_option == "auto";
  if (!request.share_option.empty() && !l.share_auto) {
    uint32_t p = 0;
    (void)shim::ParseShare(request.share_option.c_str(), &p);  // checked above
    if (p > share)
      return absl::InvalidArgumentError(fmt::format(
          "--tessera-share={} is more than the step's {} mean ({:g}%)", request.share_option,
          request.shards.empty() ? "GPUs" : "shards", share / 10.0));
    l.share_permille = p;
  }
  if (!request.mem_option.empty() && !l.memory_auto) {
    const std::optional<uint64_t> b = core::ParseBytes(request.mem_option);  // checked above
    if (memory > 0 && *b > memory)
      return absl::InvalidArgumentError(
          fmt::format("--tessera-mem={} is more than the step's {} mean ({})", request.mem_option,
                      request.shards.empty() ? "GPUs" : "shards", core::FormatBytes(memory)));
    l.memory_bytes = *b;
  }
  return l;
}

int64_t BootTime() {
  std::ifstream in("/proc/stat");
  for (std::string word; in >> word;) {
    if (word == "btime") {
      int64_t t = 0;
      in >> t;
      return t;
    }
  }
  return 0;
}

absl::StatusOr<StepEnvironment> SetUpStep(const PluginConfig& config, uint32_t job_id, uid_t uid,
                                          gid_t gid, const StepLimits& asked,
                                          const std::string& ld_preload, time_t now,
                                          int64_t boot_time) {
  StepEnvironment env;
  StepLimits limits = asked;
  if (limits.gpus.empty()) return env;
  if (access(config.library.c_str(), R_OK) != 0)
    return absl::FailedPreconditionError(fmt::format("the intercept library {} cannot be read: {}",
                                                     config.library, strerror(errno)));
  if (absl::Status st = MakeState(config); !st.ok()) return st;
  StateLock lock(config.state_dir);
  if (!lock.ok())
    return absl::InternalError(
        fmt::format("cannot lock {}/.lock: {}", config.state_dir, strerror(errno)));
  const std::string region = Region(config, job_id), record = Record(config, job_id);
  // An earlier job under this id (a reused id: another user's, or one from before this node's
  // boot, whoever's): its files are never this job's.
  if (access(record.c_str(), F_OK) == 0) {
    const std::optional<NodeJob> earlier = ReadNodeJob(record);
    if (!earlier || earlier->uid != uid || (boot_time > 0 && earlier->started < boot_time))
      env.notes.push_back(SetAside(config, job_id, earlier ? earlier->uid : uid_t(-1), uid, now));
  }
  // "auto" and a trial are the job's, decided at its first step here; its later steps (srun in
  // its batch script) get what that one was given.
  int64_t started = now;
  std::string sizing;
  if (access(record.c_str(), F_OK) == 0) {
    if (const std::optional<NodeJob> first = ReadNodeJob(record)) {
      started = first->started;
      sizing = first->sizing;
      if (limits.memory_auto && first->memory_auto) limits.memory_bytes = first->memory_bytes;
      if (limits.share_auto && first->share_auto) limits.share_permille = first->share_permille;
      if (first->trial_s > 0) limits.trial_s = first->trial_s;
      limits.auto_trial = first->auto_trial;
      if (!first->trial_end.empty()) sizing += "; " + first->trial_end;
    }
  } else if (limits.memory_auto || limits.share_auto) {
    const KindUse use = HistoryOf(config, uid, limits.name);
    // Nothing measured for what it sizes "auto": with auto_trial=, a batch job's first run is a
    // trial, then it is requeued and sized from it (once: a requeued run is never a trial again).
    const bool unmeasured =
        (limits.memory_auto && use.memory_runs == 0) || (limits.share_auto && use.util_runs == 0);
    // (A batch job's step on another of its nodes: its trial, if any, is its batch step's.)
    const std::string no_trial =
        !limits.batch_step && !limits.batch_host.empty()
            ? fmt::format(
                  "a batch job's trial is decided on its batch node {} (this step runs measured, "
                  "and a requeue there ends it)",
                  limits.batch_host)
        : !limits.batch_step              ? "not a batch job"
        : limits.restarts > 0             ? "requeued already"
        : !limits.not_requeueable.empty() ? limits.not_requeueable
                                          : "";
    if (unmeasured && config.auto_trial_s > 0 && no_trial.empty()) {
      limits.trial_s = config.auto_trial_s;
      limits.auto_trial = true;
      sizing = fmt::format(
          "auto: no ended run of your jobs named '{}' yet{}: this run is a trial of {} on what its "
          "shards mean, then the job is requeued and sized from it",
          limits.name, use.unusable.empty() ? "" : " readable (" + use.unusable + ")",
          core::FormatDuration(config.auto_trial_s));
    } else {
      sizing = SizeAuto(config, use, limits);
      if (unmeasured && config.auto_trial_s > 0)
        sizing += fmt::format("; no trial first: {}", no_trial);
    }
  }
  // A job of several nodes is said on each (each node sizes its own part): named.
  const std::string said_job = limits.nodes > 1 && !config.node.empty()
                                   ? fmt::format("job {} on {}", job_id, config.node)
                                   : fmt::format("job {}", job_id);
  if (!sizing.empty()) env.say = fmt::format("tessera: {}: {}", said_job, sizing);
  if (limits.trial_s > 0 && limits.auto_trial) {
    env.trial_deadline = started + static_cast<int64_t>(std::ceil(limits.trial_s));
    env.requeue_at_trial_end = true;
    // Its steps started past the deadline (the requeue refused: it runs on) run measured.
    if (env.trial_deadline <= now) env.trial_deadline = 0, env.requeue_at_trial_end = false;
  } else if (limits.trial_s > 0) {
    env.trial_deadline = started + static_cast<int64_t>(std::ceil(limits.trial_s));
    // A step of the job after its trial ended (a batch script's srun past it) is not started only
    // to be stopped at once.
    if (env.trial_deadline <= now) {
      return absl::FailedPreconditionError(
          fmt::format("its trial of {} ended {} s ago: the step is not run",
                      core::FormatDuration(limits.trial_s), now - env.trial_deadline));
    }
    env.say = fmt::format(
        "tessera: {} is a trial of {}: its steps are stopped {} s after its start, then "
        "`tessera slurm acct {}` on its node says what it used and what to ask",
        said_job, core::FormatDuration(limits.trial_s), env.trial_deadline - started, job_id);
  }
  const bool mps =
      std::any_of(limits.gpus.begin(), limits.gpus.end(), [&](int g) { return IsMps(config, g); });
  std::optional<devices::MpsDaemons> daemons;
  if (mps) {
    const int g = limits.gpus[0];
    if (limits.gpus.size() > 1) {
      return absl::FailedPreconditionError(fmt::format(
          "its GPUs {} include one shared by MPS (plugstack.conf mps_gpus=): a process is the "
          "client of one GPU's MPS server, so a step on an MPS GPU has one GPU",
          fmt::join(limits.gpus, ",")));
    }
    for (const auto& [id, other] : NodeJobs(config.state_dir)) {
      if (id == job_id || other.uid == uid ||
          std::find(other.gpus.begin(), other.gpus.end(), g) == other.gpus.end())
        continue;
      return absl::FailedPreconditionError(fmt::format(
          "GPU {} is shared by MPS and its server runs user {}'s job {}: MPS serves one user's "
          "clients at a time (submit again once it ends, or ask for a GPU not in mps_gpus=)",
          g, other.uid, id));
    }
    // The daemon (tessera-slurm-mps@<gpu>.service: outside every job's cgroup, so that it
    // outlives the job that would have started it) shows its GPU by index: its clients name it
    // alike. A step is a client only of a daemon that answers.
    daemons.emplace(config.mps_control, config.state_dir + "/mps",
                    std::vector<devices::MpsGpu>{{g, std::to_string(g)}});
    if (absl::Status st = daemons->Check(g); !st.ok()) {
      return absl::FailedPreconditionError(fmt::format(
          "GPU {} is shared by MPS and its daemon does not answer ({}): start it with systemctl "
          "start tessera-slurm-mps@{}",
          g, std::string(st.message()), g));
    }
  }
  // A whole-GPU step that Slurm placed on a GPU shard jobs hold (gpu and shard are separate gres
  // to Slurm): unpaced it would take their shares. It gets what they leave - the rest of the GPU's
  // time and, where gpu_memory= is known, of its memory - and is paced with them.
  if (limits.share_permille == 0 && (limits.memory_bytes == 0 || limits.memory_auto)) {
    uint32_t taken = 0;
    uint64_t held = 0;
    std::vector<std::string> beside;
    for (const auto& [id, other] : NodeJobs(config.state_dir)) {
      if (id == job_id || other.share_permille == 0) continue;
      if (std::none_of(other.gpus.begin(), other.gpus.end(), [&](int g) {
            return std::find(limits.gpus.begin(), limits.gpus.end(), g) != limits.gpus.end();
          }))
        continue;
      taken += other.share_permille;
      held += other.memory_bytes;
      beside.push_back(std::to_string(id));
    }
    if (!beside.empty()) {
      limits.share_permille = taken >= 1000 ? 10 : 1000 - taken;
      if (config.gpu_memory_bytes > held) {
        const uint64_t left = config.gpu_memory_bytes - held;
        limits.memory_bytes = limits.memory_bytes > 0 ? std::min(limits.memory_bytes, left) : left;
      }
      env.notes.push_back(fmt::format(
          "job {}: a whole GPU ({}) shard jobs {} are on: paced with them at the {:g}% they "
          "leave{}",
          job_id, fmt::join(limits.gpus, ","), fmt::join(beside, ","), limits.share_permille / 10.0,
          limits.memory_bytes > 0
              ? fmt::format(", memory {}", core::FormatBytes(limits.memory_bytes))
              : std::string()));
    }
  }
  // The job's region: one for all its steps here (its memory is the job's), made by its first.
  if (access(record.c_str(), F_OK) != 0) {
    unlink(region.c_str());
    const std::vector<uint64_t> per_gpu(limits.gpus.size(), limits.memory_bytes);
    char err[256] = {};
    if (!shim::CreateRegionFile(region.c_str(), per_gpu.data(), static_cast<int>(per_gpu.size()),
                                err, sizeof err))
      return absl::InternalError(err);
    if (chown(region.c_str(), uid, gid) != 0)
      return absl::InternalError(fmt::format("chown {}: {}", region, strerror(errno)));
    const NodeJob job{.job_id = job_id,
                      .uid = uid,
                      .gid = gid,
                      .gpus = limits.gpus,
                      .share_permille = limits.share_permille,
                      .memory_bytes = limits.memory_bytes,
                      .started = static_cast<int64_t>(now),
                      .name = limits.name,
                      .share_auto = limits.share_auto,
                      .memory_auto = limits.memory_auto,
                      .sizing = sizing,
                      .trial_s = limits.trial_s,
                      .auto_trial = limits.auto_trial,
                      .restarts = limits.restarts};
    if (absl::Status st = WriteFile(record, RecordJson(job).dump() + "\n", 0600); !st.ok())
      return st;
  }
  std::string preload = config.library;
  // A step inherits its batch step's LD_PRELOAD, the library already first in it.
  if (ld_preload.rfind(config.library, 0) == 0)
    preload = ld_preload;
  else if (!ld_preload.empty())
    preload += ":" + ld_preload;
  env.set["LD_PRELOAD"] = preload;
  env.set["TESSERA_JOB_ID"] = JobKey(job_id);
  env.set["TESSERA_CUDA_REGION"] = region;
  if (limits.memory_bytes > 0)
    env.set["TESSERA_CUDA_MEM_LIMIT"] = std::to_string(limits.memory_bytes);
  else
    env.unset.push_back("TESSERA_CUDA_MEM_LIMIT");
  if (config.context_overhead_bytes > 0)
    env.set["TESSERA_CUDA_CONTEXT_OVERHEAD"] = std::to_string(config.context_overhead_bytes);
  const char* arbiter_vars[] = {"TESSERA_CUDA_ARBITER", "TESSERA_CUDA_ARBITER_GPUS",
                                "TESSERA_CUDA_COMPUTE_SHARE", "TESSERA_CUDA_PRIORITY"};
  if (daemons) {
    // Its kernels run beside the other clients' on the SMs MPS gives it, not in time slices; the
    // library's memory accounting stays on.
    const int g = limits.gpus[0];
    for (const auto& [k, v] :
         devices::MpsClientEnv(daemons->PipeDir(g), static_cast<int>(limits.share_permille),
                               static_cast<int64_t>(limits.memory_bytes >> 20), 1)) {
      env.set[k] = v;
    }
    env.set["CUDA_VISIBLE_DEVICES"] = std::to_string(g);
    env.unset.insert(env.unset.end(), std::begin(arbiter_vars), std::end(arbiter_vars));
    return env;
  }
  if (limits.share_permille == 0) {
    env.unset.insert(env.unset.end(), std::begin(arbiter_vars), std::end(arbiter_vars));
    return env;
  }
  const std::string arbiter = Arbiter(config);
  char err[256] = {};
  if (!shim::CreateArbiterFile(arbiter.c_str(), err, sizeof err)) return absl::InternalError(err);
  if (chmod(arbiter.c_str(), 0600) != 0)
    return absl::InternalError(fmt::format("chmod {}: {}", arbiter, strerror(errno)));
  if (uid != geteuid()) {
    // The job's user may write it while the job runs (an ACL entry): refused without ACLs rather
    // than opened to every user.
    if (absl::Status st = server::SetUserAcl(arbiter, ShareUsers(config)); !st.ok()) return st;
  }
  env.set["TESSERA_CUDA_ARBITER"] = arbiter;
  env.set["TESSERA_CUDA_ARBITER_GPUS"] = fmt::format("{}", fmt::join(limits.gpus, ","));
  env.set["TESSERA_CUDA_COMPUTE_SHARE"] = fmt::format("{:g}%", limits.share_permille / 10.0);
  env.set["TESSERA_CUDA_PRIORITY"] =
      std::string(1, '0');  // not a literal: GCC 12 misreads one here (-Wrestrict)
  return env;
}

std::map<uint32_t, std::string> RecordFiles(const std::string& dir) {
  std::map<uint32_t, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename();
    if (e.path().extension() != ".json") continue;
    char* end = nullptr;
    const unsigned long id = strtoul(name.c_str(), &end, 10);
    if (end != name.c_str() && std::string(end) == ".json")
      out[static_cast<uint32_t>(id)] = e.path().string();
  }
  return out;
}

std::map<uint32_t, NodeJob> NodeJobs(const std::string& state_dir) {
  std::map<uint32_t, NodeJob> out;
  for (const auto& [id, path] : RecordFiles(state_dir + "/jobs")) {
    if (std::optional<NodeJob> j = ReadNodeJob(path)) out[id] = *std::move(j);
  }
  return out;
}

namespace {

std::string TotalsPath(const std::string& state_dir) { return state_dir + "/totals.json"; }

json TotalsJson(const UserTotals& t) {
  return {{"jobs", t.jobs},
          {"whole_gpu_seconds", t.whole_gpu_seconds},
          {"fractional_gpu_seconds", t.fractional_gpu_seconds},
          {"measured_gpu_seconds", t.measured_gpu_seconds},
          {"busy_gpu_seconds", t.busy_gpu_seconds},
          {"memory_refused_jobs", t.memory_refused_jobs}};
}

// Adds the ended job's record to its user's totals (the state lock held). A totals file that is
// not one is set aside as totals.json.unreadable.<time> and counted anew: said in the status.
absl::Status CountInTotals(const PluginConfig& config, const json& acct, time_t now) {
  const std::string path = TotalsPath(config.state_dir);
  NodeTotals totals = ReadTotals(config.state_dir);
  std::string said;
  if (!totals.unreadable.empty()) {
    const std::string aside = fmt::format("{}.unreadable.{}", path, static_cast<int64_t>(now));
    rename(path.c_str(), aside.c_str());
    said = fmt::format("{}; set aside as {}, counted anew from this job", totals.unreadable, aside);
  }
  AddToTotals(acct, totals.users[acct.value("uid", uid_t{0})]);
  json users = json::object();
  for (const auto& [uid, t] : totals.users) users[std::to_string(uid)] = TotalsJson(t);
  absl::Status st = WriteFile(path, json{{"users", users}}.dump(1) + "\n", 0644);
  if (!st.ok()) return st;
  if (!said.empty()) return absl::DataLossError(said);
  return absl::OkStatus();
}

}  // namespace

GpuHeld HeldOf(const json& run, const json& gpu) {
  const double ran = static_cast<double>(
      std::max<int64_t>(0, run.value("ended", int64_t{0}) - run.value("started", int64_t{0})));
  const double share = run.value("share_percent", 0.0);
  GpuHeld out{.held_s = ran * (share > 0 ? share / 100 : 1.0)};
  if (const auto busy = gpu.find("gpu_time_s"); busy != gpu.end() && busy->is_number())
    out.busy_s = std::min(out.held_s, busy->get<double>());
  return out;
}

void AddToTotals(const json& acct, UserTotals& t) {
  ++t.jobs;
  const bool fractional =
      acct.value("share_percent", 0.0) > 0 || acct.value("memory_limit_bytes", uint64_t{0}) > 0;
  bool refused = false;
  for (const json& g : acct.value("gpus", json::array())) {
    if (!g.is_object()) continue;
    const GpuHeld use = HeldOf(acct, g);
    (fractional ? t.fractional_gpu_seconds : t.whole_gpu_seconds) += use.held_s;
    if (use.busy_s) {
      t.measured_gpu_seconds += use.held_s;
      t.busy_gpu_seconds += *use.busy_s;
    }
    if (const auto r = g.find("refused"); r != g.end() && r->is_number() && r->get<double>() > 0)
      refused = true;
  }
  if (refused) ++t.memory_refused_jobs;
}

NodeTotals ReadTotals(const std::string& state_dir) {
  NodeTotals out;
  const std::string path = TotalsPath(state_dir);
  std::ifstream in(path);
  if (!in) return out;  // no job ended here yet
  const json all = json::parse(in, nullptr, false);
  auto unreadable = [&] {
    out.users.clear();
    out.unreadable = fmt::format("{}: not the plugin's totals", path);
    return out;
  };
  if (!all.is_object() || !all.contains("users") || !all["users"].is_object()) return unreadable();
  try {
    for (const auto& [key, v] : all["users"].items()) {
      const std::optional<long> uid = ParseWhole(key);
      if (!uid || *uid < 0 || !v.is_object()) return unreadable();
      UserTotals& t = out.users[static_cast<uid_t>(*uid)];
      t.jobs = v.value("jobs", uint64_t{0});
      t.whole_gpu_seconds = v.value("whole_gpu_seconds", 0.0);
      t.fractional_gpu_seconds = v.value("fractional_gpu_seconds", 0.0);
      t.measured_gpu_seconds = v.value("measured_gpu_seconds", 0.0);
      t.busy_gpu_seconds = v.value("busy_gpu_seconds", 0.0);
      t.memory_refused_jobs = v.value("memory_refused_jobs", uint64_t{0});
    }
  } catch (const json::exception&) {
    return unreadable();  // a figure of another type
  }
  return out;
}

absl::StatusOr<std::string> EndJob(const PluginConfig& config, uint32_t job_id, time_t now,
                                   std::optional<uid_t> ending_uid, json* record_out) {
  const std::string record = Record(config, job_id), region = Region(config, job_id);
  if (access(record.c_str(), F_OK) != 0) return std::string();
  StateLock lock(config.state_dir);
  const std::optional<NodeJob> job = ReadNodeJob(record);
  if (!job) return absl::DataLossError(fmt::format("{}: not a record of the plugin", record));
  if (ending_uid && *ending_uid != job->uid) {
    // An earlier job's record under a reused id: not this job's to account.
    return absl::FailedPreconditionError(SetAside(config, job_id, job->uid, *ending_uid, now));
  }
  const std::vector<int>& gpus = job->gpus;
  const uint32_t share = job->share_permille;
  const uid_t uid = job->uid;
  const int64_t started = job->started;
  const double ran_s = std::max<double>(1e-3, static_cast<double>(now - started));
  // What the job used: its region's peak per GPU (in the order of its CUDA ordinals), the GPU
  // time the arbiter charged it on each.
  auto head = shim::ReadRegionHead(region.c_str());
  json per_gpu = json::array();
  for (size_t i = 0; i < gpus.size(); ++i) {
    json g = {{"index", gpus[i]}};
    if (head && i < shim::kMaxDevices) {
      g["peak_memory_bytes"] = head->peak[i].load();
      g["memory_limit_bytes"] = head->limit[i];
      if (const uint64_t refused = head->refused[i].load(); refused > 0) {
        g["refused"] = refused;
        g["wanted_peak_bytes"] = head->wanted_peak[i].load();
      }
    }
    if (share > 0) {
      const shim::ArbiterUse use = shim::ArbiterJobUse(Arbiter(config).c_str(), &gpus[i], 1,
                                                       shim::ArbiterJobKey(JobKey(job_id).c_str()));
      g["gpu_time_s"] = static_cast<double>(use.busy_us) / 1e6;
      g["utilization_percent"] = std::min(100.0, static_cast<double>(use.busy_us) / 1e4 / ran_s);
      // Its launches waited for the GPU (other jobs' slices): for how long, and what it would
      // have used had they not - what its kind learns (KindUseOf).
      const double demand = core::DemandPct(static_cast<double>(use.busy_us),
                                            static_cast<double>(use.held_us), ran_s * 1e6);
      if (use.held_us > 0 && demand >= 0) {
        g["held_back_percent"] = std::min(100.0, static_cast<double>(use.held_us) / 1e4 / ran_s);
        g["demand_percent"] = demand;
      }
    }
    per_gpu.push_back(g);
  }
  json acct = {{"job_id", job_id},
               {"uid", uid},
               {"started", started},
               {"ended", static_cast<int64_t>(now)},
               {"share_percent", share / 10.0},
               {"memory_limit_bytes", job->memory_bytes},
               {"gpus", per_gpu}};
  if (!head) acct["usage"] = "unreadable: the job's region was not a region any more";
  if (const uint64_t launches = shim::ReadRegionLaunches(region.c_str()); launches > 0)
    acct["kernel_launches"] = launches;
  if (!job->name.empty()) acct["name"] = job->name;
  if (job->memory_auto) acct["memory_auto"] = true;
  if (job->share_auto) acct["share_auto"] = true;
  if (!job->sizing.empty()) acct["sizing"] = job->sizing;
  if (job->trial_s > 0) {
    acct["trial_s"] = job->trial_s;
    if (job->auto_trial) acct["auto_trial"] = true;
    if (!job->trial_end.empty()) acct["trial_end"] = job->trial_end;
    acct["advice"] = TrialAdvice(config, acct);
  }
  if (job->restarts > 0) acct["restarts"] = job->restarts;
  if (std::string outgrew = Outgrew(config, acct); !outgrew.empty()) acct["outgrew"] = outgrew;
  const std::string path = Acct(config, job_id);
  if (job->restarts > 0) {
    // A requeued job's earlier run here (its trial) ended under the same id: kept with this one.
    std::ifstream in(path);
    json earlier = json::parse(in, nullptr, false);
    if (earlier.is_object() && earlier.value("uid", uid_t(-1)) == uid &&
        earlier.value("started", int64_t{0}) < started) {
      json runs = earlier.contains("earlier_runs") && earlier["earlier_runs"].is_array()
                      ? earlier["earlier_runs"]
                      : json::array();
      earlier.erase("earlier_runs");
      runs.push_back(std::move(earlier));
      acct["earlier_runs"] = std::move(runs);
    }
  }
  absl::Status written = WriteFile(path, acct.dump(2) + "\n", 0644);
  if (head) {
    // Its user's history, for "auto": never fails the epilog (said in slurmd's log).
    json run = acct;
    run.erase("earlier_runs");  // each kept as its own record already
    if (absl::Status st = KeepInHistory(config, run); !st.ok() && written.ok()) written = st;
  }
  // Its user's totals here (the exporter's counters): once, as its record goes below.
  if (absl::Status st = CountInTotals(config, acct, now); !st.ok() && written.ok()) written = st;
  if (record_out != nullptr) *record_out = std::move(acct);
  unlink(region.c_str());
  unlink(record.c_str());
  if (share > 0 && uid != geteuid()) {
    const std::set<uid_t> users = ShareUsers(config);
    // Her last job here with a compute share: her access goes, kept descriptors included.
    absl::Status st = users.contains(uid) ? server::SetUserAcl(Arbiter(config), users)
                                          : server::ReplaceArbiter(Arbiter(config), users);
    if (!st.ok()) return st;
  }
  if (!written.ok()) return written;
  return path;
}

absl::Status NoteTrialEnd(const PluginConfig& config, uint32_t job_id, const std::string& said) {
  StateLock lock(config.state_dir);
  if (!lock.ok())
    return absl::InternalError(
        fmt::format("cannot lock {}/.lock: {}", config.state_dir, strerror(errno)));
  const std::string record = Record(config, job_id);
  std::optional<NodeJob> job = ReadNodeJob(record);
  if (!job) return absl::NotFoundError(fmt::format("{}: no record of the job", record));
  job->trial_end = said;
  return WriteFile(record, RecordJson(*job).dump() + "\n", 0600);
}

KindUse KindUseOf(const std::vector<std::string>& records, const std::string& name) {
  std::vector<double> peaks, utils;
  for (const std::string& text : records) {
    const json r = json::parse(text, nullptr, false);
    if (!r.is_object()) continue;
    try {
      if (r.value("name", "") != name || !r.contains("gpus") || !r["gpus"].is_array())
        continue;  // another kind (a name of the same hash)
      double peak = 0, util = -1;
      const bool sized = r.value("memory_auto", false);
      for (const json& g : r["gpus"]) {
        double mib = g.value("peak_memory_bytes", 0.0) / kMiB;
        // Held back by its automatic size: it needed at least what it asked.
        if (sized && g.value("refused", 0.0) > 0)
          mib = std::max(mib, g.value("wanted_peak_bytes", 0.0) / kMiB);
        peak = std::max(peak, mib);
        if (g.contains("utilization_percent"))
          util = std::max(util, g["utilization_percent"].get<double>());
        // What it would have used where its launches waited for the GPU: a share held to its
        // slices is measured at most at its size.
        if (g.contains("demand_percent") && g.contains("utilization_percent"))
          util = std::max(util, g["demand_percent"].get<double>());
      }
      // Only what a record of the plugin can say: no negative, no infinite use.
      if (std::isfinite(peak) && peak > 0) peaks.push_back(peak);
      if (std::isfinite(util) && util >= 0) utils.push_back(std::min(util, 100.0));
    } catch (const json::exception&) {
      continue;  // a field of another type
    }
  }
  KindUse use;
  if (!peaks.empty()) {
    use.peak_bytes = static_cast<uint64_t>(std::min(core::Percentile(peaks, 0.95), 1e12) * kMiB);
    use.memory_runs = static_cast<int>(peaks.size());
  }
  if (!utils.empty()) {
    use.util_pct = core::Percentile(utils, 0.95);
    use.util_runs = static_cast<int>(utils.size());
  }
  return use;
}

KindUse HistoryOf(const PluginConfig& config, uid_t uid, const std::string& name) {
  KindUse use;
  const std::string dir = UserHistory(config, uid);
  for (const std::string& d : {HistoryDir(config), dir}) {
    struct stat st;
    if (lstat(d.c_str(), &st) != 0) return use;  // nothing kept yet
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
      use.unusable = fmt::format("{} is not a folder of the plugin's own user alone", d);
      return use;
    }
  }
  // Its name's files, newest written first: only the newest kHistorySized are read.
  std::error_code ec;
  const std::string prefix = NameKey(name) + ".";
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".json" && e.path().filename().string().starts_with(prefix))
      files.emplace_back(e.last_write_time(ec), e.path());
  }
  std::sort(files.begin(), files.end(), std::greater<>());
  if (files.size() > kHistorySized) files.resize(kHistorySized);
  std::vector<std::string> records;
  for (const auto& [written, path] : files) {
    std::ifstream in(path);
    records.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return KindUseOf(records, name);
}

std::string SizeAuto(const PluginConfig& config, const KindUse& use, StepLimits& limits) {
  std::vector<std::string> said;
  const double margin = config.auto_margin_pct / 100.0;
  const std::string kind = fmt::format("of your jobs named '{}'", limits.name) +
                           (use.unusable.empty() ? "" : " readable (" + use.unusable + ")");
  if (limits.memory_auto) {
    // The most it may be given: what its shards mean, or a whole GPU's memory.
    const uint64_t ceiling =
        limits.memory_bytes > 0 ? limits.memory_bytes : config.gpu_memory_bytes;
    const std::string most = ceiling > 0 ? core::FormatBytes(ceiling) : "not limited";
    if (use.memory_runs == 0) {
      said.push_back(fmt::format(
          "--tessera-mem=auto: {} (no ended run {} yet: measured for the next)", most, kind));
    } else {
      const double peak_mib = static_cast<double>(use.peak_bytes) / kMiB;
      const auto sized =
          static_cast<uint64_t>(core::SizeFromUse(peak_mib, margin, kMemoryStepMiB)) * kMiB;
      const std::string basis =
          fmt::format("a peak of {:.0f}MiB, p95 of {} run{} {}, + {}%", peak_mib, use.memory_runs,
                      use.memory_runs == 1 ? "" : "s", kind, config.auto_margin_pct);
      if (ceiling > 0 && sized >= ceiling) {
        said.push_back(fmt::format("--tessera-mem=auto: {} ({}: all it may have)", most, basis));
      } else {
        limits.memory_bytes = sized;
        said.push_back(fmt::format("--tessera-mem=auto: {} ({})", Mib(sized), basis));
      }
    }
  }
  if (limits.share_auto) {
    const uint32_t ceiling = limits.share_permille > 0 ? limits.share_permille : 1000;
    if (use.util_runs == 0) {
      said.push_back(
          fmt::format("--tessera-share=auto: {:g}% (no ended run {} with a measured share yet)",
                      ceiling / 10.0, kind));
    } else {
      const double pct = std::max(core::SizeFromUse(use.util_pct, margin, kShareStepPct), 5.0);
      const auto permille = static_cast<uint32_t>(std::lround(pct * 10));
      const std::string basis =
          fmt::format("{:.0f}% busy, p95 of {} run{} {}, + {}%", use.util_pct, use.util_runs,
                      use.util_runs == 1 ? "" : "s", kind, config.auto_margin_pct);
      if (permille >= ceiling) {
        said.push_back(fmt::format("--tessera-share=auto: {:g}% ({}: all it may have)",
                                   ceiling / 10.0, basis));
      } else {
        limits.share_permille = permille;
        said.push_back(fmt::format("--tessera-share=auto: {:g}% ({})", permille / 10.0, basis));
      }
    }
  }
  return fmt::format("{}", fmt::join(said, "; "));
}

std::string TrialAdvice(const PluginConfig& config, const json& acct) {
  const double ran =
      static_cast<double>(acct.value("ended", int64_t{0}) - acct.value("started", int64_t{0}));
  uint64_t peak = 0;
  double util = -1, held = -1, demand = -1;
  size_t gpus = 0;
  for (const json& g : acct.value("gpus", json::array())) {
    ++gpus;
    peak = std::max(peak, g.value("peak_memory_bytes", uint64_t{0}));
    if (g.contains("utilization_percent"))
      util = std::max(util, g.value("utilization_percent", 0.0));
    if (g.contains("demand_percent") && g.contains("held_back_percent")) {
      demand = std::max(demand, g.value("demand_percent", 0.0));
      held = std::max(held, g.value("held_back_percent", 0.0));
    }
  }
  const double margin = config.auto_margin_pct / 100.0;
  std::vector<std::string> measured;
  measured.push_back(util >= 0
                         ? fmt::format("its GPU {:.0f}% busy", util)
                         : std::string("its GPU time not measured (a whole GPU is not paced)"));
  if (util >= 0 && demand > util) {
    measured.back() += fmt::format(
        " (its launches waited for the GPU {:.0f}% of the time: it would have used {:.0f}%)", held,
        demand);
    util = demand;  // what it is sized from
  }
  measured.push_back(fmt::format("peak GPU memory {}", Mib(peak)));
  if (const uint64_t launches = acct.value("kernel_launches", uint64_t{0}); launches > 0)
    measured.push_back(fmt::format("{} kernel launches ({:.1f}/s)", launches,
                                   static_cast<double>(launches) / std::max(ran, 1.0)));
  const double mem_mib =
      peak > 0 ? core::SizeFromUse(static_cast<double>(peak) / kMiB, margin, kMemoryStepMiB) : 0;
  std::string ask;
  const std::string memory = mem_mib > 0 ? fmt::format(" --tessera-mem={:.0f}M", mem_mib) : "";
  const int per_gpu = config.shards_per_gpu;
  const double gpu_mib = static_cast<double>(config.gpu_memory_bytes) / kMiB;
  if (per_gpu > 0 && gpu_mib > 0) {
    // Shards enough for its memory and (where measured) its GPU time, with the margin.
    int shards = std::max(1, static_cast<int>(std::ceil(mem_mib / gpu_mib * per_gpu - 1e-9)));
    if (util >= 0) {
      const double pct = core::SizeFromUse(util, margin, kShareStepPct);
      shards = std::max(shards, static_cast<int>(std::ceil(pct / 100.0 * per_gpu - 1e-9)));
    }
    ask = shards >= per_gpu
              ? fmt::format("--gres=gpu:{} (its use with {}% margin is a whole GPU's)",
                            std::max<size_t>(gpus, 1), config.auto_margin_pct)
              : fmt::format("--gres=shard:{}{} (with {}% margin)", shards, memory,
                            config.auto_margin_pct);
  } else {
    ask = fmt::format("{} (with {}% margin)", memory.empty() ? "its shards" : memory.substr(1),
                      config.auto_margin_pct);
  }
  if (acct.value("auto_trial", false)) {
    // auto_trial='s run: what it asked is "auto", sized from this trial when it runs again.
    return fmt::format("its automatic trial of {} ended after {:.0f} s: {}; {}",
                       core::FormatDuration(acct.value("trial_s", 0.0)), ran,
                       fmt::join(measured, ", "),
                       acct.value("trial_end", std::string("its next run is sized from it")));
  }
  return fmt::format(
      "its trial of {} ended after {:.0f} s: {}; recommended: {}, or --tessera-mem=auto, which "
      "sizes from this trial",
      core::FormatDuration(acct.value("trial_s", 0.0)), ran, fmt::join(measured, ", "), ask);
}

std::string AdminCommentPart(const json& acct, const std::string& node) {
  const double ran = static_cast<double>(
      std::max<int64_t>(0, acct.value("ended", int64_t{0}) - acct.value("started", int64_t{0})));
  const double share = acct.value("share_percent", 0.0);
  std::vector<std::string> gpus;
  double held = 0, busy = 0, peak = 0, peak_of = 0, limit = 0;
  bool measured = false;
  uint64_t refused = 0;
  for (const json& g : acct.value("gpus", json::array())) {
    if (!g.is_object()) continue;
    gpus.push_back(std::to_string(g.value("index", -1)));
    if (const GpuHeld use = HeldOf(acct, g); use.busy_s) {
      measured = true;
      held += use.held_s;
      busy += *use.busy_s;
    }
    const double p = g.value("peak_memory_bytes", 0.0), l = g.value("memory_limit_bytes", 0.0);
    if (p >= peak) peak = p, limit = l;
    if (l > 0) peak_of = std::max(peak_of, 100 * p / l);
    refused += g.value("refused", uint64_t{0});
  }
  std::vector<std::string> said;
  if (ran < 1) {
    said.push_back("ran under a second");
  } else if (measured) {
    said.push_back(fmt::format("{:.0f}% busy", held > 0 ? 100 * busy / held : 0.0));
    said.push_back(fmt::format("{} of GPU time idle", core::FormatDuration(held - busy)));
  } else {
    said.push_back("busy not measured (a whole GPU)");
  }
  if (peak > 0 || limit > 0) {
    said.push_back(limit > 0
                       ? fmt::format("peak {} of {} ({:.0f}%)",
                                     core::FormatBytes(static_cast<uint64_t>(peak)),
                                     core::FormatBytes(static_cast<uint64_t>(limit)), peak_of)
                       : fmt::format("peak {}", core::FormatBytes(static_cast<uint64_t>(peak))));
  }
  if (refused > 0)
    said.push_back(
        fmt::format("{} allocation{} refused at its limit", refused, refused == 1 ? "" : "s"));
  // In lower case: sacctmgr, which writes it to a finished job's record, lowers what it is given.
  return absl::AsciiStrToLower(fmt::format(
      "tessera@{}: GPU{} {} ({}): {}", node, gpus.size() == 1 ? "" : "s", fmt::join(gpus, ","),
      share > 0 ? fmt::format("{:g}% share{}", share, gpus.size() == 1 ? "" : " each")
                : std::string(gpus.size() == 1 ? "whole" : "whole GPUs"),
      fmt::join(said, ", ")));
}

std::string MergeAdminComment(const std::string& existing, const std::string& node,
                              const std::string& part) {
  const std::string mine = absl::AsciiStrToLower("tessera@" + node + ":");
  std::vector<std::string> kept;
  for (absl::string_view p : absl::StrSplit(existing, " | ")) {
    const absl::string_view t = absl::StripAsciiWhitespace(p);
    if (!t.empty() && !absl::StartsWithIgnoreCase(t, mine)) kept.emplace_back(t);
  }
  kept.push_back(part);
  return absl::StrJoin(kept, " | ");
}

std::string WriteAdminComment(
    const std::string& node, const std::string& part,
    const std::function<std::optional<std::string>(std::string&)>& current,
    const std::function<bool(const std::string&, std::string&)>& write,
    const std::optional<std::string>& alone,
    const std::function<void(std::chrono::milliseconds)>& wait) {
  std::string err;
  if (alone) {
    if (alone->find(part) != std::string::npos) return "";
    if (write(MergeAdminComment(*alone, node, part), err)) return "";
  }
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::optional<std::string> now = current(err);
    if (!now) return err;
    if (now->find(part) != std::string::npos) return "";
    if (!write(MergeAdminComment(*now, node, part), err)) return err;
    // Another node's part written at the same time may have replaced this one: read it back.
    const std::optional<std::string> after = current(err);
    if (!after) return err;
    if (after->find(part) != std::string::npos) return "";
    const std::chrono::milliseconds pause(50 + (getpid() + attempt * 37) % 200);
    if (wait) {
      wait(pause);
    } else {
      std::this_thread::sleep_for(pause);
    }
  }
  return "other nodes' writes kept replacing it";
}

}  // namespace tessera::slurm
