#include "tessera/sim/slurm_trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "fmt/format.h"
#include "tessera/core/gpu.h"

namespace tessera::sim {
namespace {

struct Fail {
  std::string message;
};

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

std::optional<int64_t> Whole(std::string_view s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// Lines with their numbers, '\r' and blank lines dropped.
std::vector<std::pair<size_t, std::string_view>> Lines(std::string_view text) {
  std::vector<std::pair<size_t, std::string_view>> out;
  size_t n = 0;
  for (std::string_view line : Split(text, '\n')) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) out.emplace_back(n, line);
  }
  return out;
}

// "2026-11-25T20:58:03" -> seconds since the epoch (UTC: only differences are used); nullopt for
// Unknown, None and the like.
std::optional<int64_t> Timestamp(std::string_view s) {
  if (s.size() != 19 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':')
    return std::nullopt;
  auto part = [&](size_t at, size_t len) { return Whole(s.substr(at, len)); };
  auto y = part(0, 4), mo = part(5, 2), d = part(8, 2), h = part(11, 2), mi = part(14, 2),
       se = part(17, 2);
  if (!y || !mo || !d || !h || !mi || !se || *mo < 1 || *mo > 12 || *d < 1 || *d > 31 || *h > 23 ||
      *mi > 59 || *se > 60)
    return std::nullopt;
  tm t{};
  t.tm_year = static_cast<int>(*y - 1900);
  t.tm_mon = static_cast<int>(*mo - 1);
  t.tm_mday = static_cast<int>(*d);
  t.tm_hour = static_cast<int>(*h);
  t.tm_min = static_cast<int>(*mi);
  t.tm_sec = static_cast<int>(*se);
  return static_cast<int64_t>(timegm(&t));
}

// Slurm's memory in TRES and RealMemory: a number with K, M (the default), G, T or P.
std::optional<int64_t> MemoryMib(std::string_view s) {
  if (s.empty()) return std::nullopt;
  double scale = 1;  // MiB
  switch (s.back()) {
    case 'K':
      scale = 1.0 / 1024;
      break;
    case 'M':
      break;
    case 'G':
      scale = 1024;
      break;
    case 'T':
      scale = 1024.0 * 1024;
      break;
    case 'P':
      scale = 1024.0 * 1024 * 1024;
      break;
    default:
      scale = 0;
  }
  if (scale != 0)
    s.remove_suffix(1);
  else
    scale = 1;
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !(v >= 0) ||
      v * scale > double(1LL << 40))
    return std::nullopt;
  return static_cast<int64_t>(std::ceil(v * scale));
}

}  // namespace

absl::StatusOr<std::vector<core::NodeSpec>> ParseScontrolNodes(std::string_view text,
                                                               std::string_view filename,
                                                               int64_t gpu_memory_mib) {
  std::vector<core::NodeSpec> nodes;
  std::set<std::string> names;
  for (const auto& [n, line] : Lines(text)) {
    auto fail = [&, n = n](const std::string& what) {
      return absl::InvalidArgumentError(fmt::format("{}:{}: {}", filename, n, what));
    };
    std::map<std::string, std::string, std::less<>> kv;
    for (std::string_view word : Split(line, ' ')) {
      if (word.empty()) continue;
      const size_t eq = word.find('=');
      if (eq == std::string_view::npos) continue;  // words of free text (a Reason's) are not ours
      kv.emplace(word.substr(0, eq), word.substr(eq + 1));
    }
    auto get = [&](const char* key) -> std::string {
      auto it = kv.find(key);
      return it == kv.end() ? "" : it->second;
    };
    core::NodeSpec node;
    node.name = get("NodeName");
    if (node.name.empty()) return fail("not a line of `scontrol show node -o` (no NodeName=)");
    if (!names.insert(node.name).second)
      return fail(fmt::format("NodeName: node '{}' listed twice", node.name));
    auto cpus = Whole(get("CPUTot"));
    if (!cpus || *cpus < 0 || *cpus > 100000)
      return fail(fmt::format("CPUTot: expected a count of CPUs, got '{}'", get("CPUTot")));
    node.cpu_milli = *cpus * 1000;
    auto mem = MemoryMib(get("RealMemory"));
    if (!mem) return fail(fmt::format("RealMemory: expected MiB, got '{}'", get("RealMemory")));
    node.memory_mib = *mem;
    int64_t gpus = 0, shards = 0;
    std::string model = "gpu";
    const std::string gres = get("Gres");
    if (!gres.empty() && gres != "(null)") {
      for (std::string_view item : Split(gres, ',')) {
        // "gpu:a100:8(S:0-1)" -> name gpu, type a100, count 8.
        if (const size_t paren = item.find('('); paren != std::string_view::npos)
          item = item.substr(0, paren);
        auto parts = Split(item, ':');
        auto count = Whole(parts.back());
        if (parts.size() < 2 || !count || *count < 0 || *count > 100000)
          return fail(fmt::format("Gres: cannot read '{}' (expected name[:type]:count)", item));
        if (parts[0] == "gpu") {
          gpus += *count;
          if (parts.size() == 3) model = std::string(parts[1]);
        } else if (parts[0] == "shard") {
          shards += *count;
        }
      }
    }
    if (gpus > 64) return fail(fmt::format("Gres: {} GPUs on one node (at most 64)", gpus));
    for (int64_t g = 0; g < gpus; ++g) {
      core::NodeGpu gpu;
      gpu.model = model;
      gpu.memory_mib = gpu_memory_mib;
      node.gpus.push_back(gpu);
    }
    if (gpus > 0 && shards > 0)
      node.labels.emplace_back(kShardsPerGpuLabel, std::to_string(shards / gpus));
    nodes.push_back(std::move(node));
  }
  return nodes;
}

int ShardsPerGpu(const std::vector<core::NodeSpec>& nodes) {
  for (const core::NodeSpec& n : nodes) {
    for (const auto& [k, v] : n.labels) {
      if (k == kShardsPerGpuLabel) return static_cast<int>(Whole(v).value_or(0));
    }
  }
  return 0;
}

absl::StatusOr<std::vector<SimJob>> ParseSacctJobs(std::string_view text, std::string_view filename,
                                                   int shards_per_gpu, int64_t gpu_memory_mib) {
  auto lines = Lines(text);
  if (lines.empty())
    return absl::InvalidArgumentError(
        fmt::format("{}:1: the file is empty (expected sacct -P's header line)", filename));
  std::map<std::string, size_t, std::less<>> column;
  const size_t width = Split(lines[0].second, '|').size();
  {
    auto names = Split(lines[0].second, '|');
    for (size_t i = 0; i < names.size(); ++i) {
      if (!column.emplace(names[i], i).second)
        return absl::InvalidArgumentError(
            fmt::format("{}:{}: field '{}' appears twice", filename, lines[0].first, names[i]));
    }
  }
  const char* tres_column = column.contains("AllocTRES") ? "AllocTRES" : "ReqTRES";
  for (const char* need : {"JobID", "Submit", "Start", "End", "State"}) {
    if (!column.contains(need))
      return absl::InvalidArgumentError(fmt::format(
          "{}:1: no {} field (sacct -P --format=JobID,User,Submit,Start,End,State,AllocTRES,"
          "Timelimit)",
          filename, need));
  }
  if (!column.contains(tres_column))
    return absl::InvalidArgumentError(
        fmt::format("{}:1: no AllocTRES (or ReqTRES) field: the jobs' resources", filename));
  struct Row {
    SimJob job;
    int64_t submit = 0;
    int nodes = 1;
  };
  std::vector<Row> rows;
  std::set<std::string> ids;
  try {
    for (size_t i = 1; i < lines.size(); ++i) {
      const auto [n, line] = lines[i];
      auto fields = Split(line, '|');
      auto fail = [&, n = n](const std::string& what) {
        throw Fail{fmt::format("{}:{}: {}", filename, n, what)};
      };
      if (fields.size() != width)
        fail(fmt::format("{} fields, the header has {}", fields.size(), width));
      auto get = [&](const char* key) -> std::string_view {
        auto it = column.find(key);
        return it == column.end() ? std::string_view() : fields[it->second];
      };
      const std::string_view id = get("JobID");
      if (id.empty()) fail("JobID: empty");
      if (id.find('.') != std::string_view::npos) continue;  // a step (sacct without -X)
      if (!ids.insert(std::string(id)).second)
        fail(fmt::format("JobID: job '{}' listed twice", id));
      const auto submit = Timestamp(get("Submit"));
      if (!submit)
        fail(fmt::format("Submit: expected a time such as 2026-11-25T20:58:03, got '{}'",
                         get("Submit")));
      const auto start = Timestamp(get("Start"));
      if (!start) continue;  // never started: used nothing
      Row row;
      row.submit = *submit;
      SimJob& j = row.job;
      j.request.id = std::string(id);
      j.request.owner = std::string(get("User"));
      if (const auto end = Timestamp(get("End"))) {
        if (*end < *start) fail(fmt::format("End {} is before Start {}", get("End"), get("Start")));
        j.duration = static_cast<double>(*end - *start);
      }
      if (const std::string_view limit = get("Timelimit");
          !limit.empty() && limit != "UNLIMITED" && limit != "Partition_Limit") {
        auto s = core::ParseDuration(limit);
        if (!s) fail(fmt::format("Timelimit: cannot read '{}'", limit));
        j.predicted_duration = std::min(*s, kMaxTraceDurationS);
      }
      int64_t gpus = 0, shards = 0;
      for (std::string_view item : Split(get(tres_column), ',')) {
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos)
          fail(fmt::format("{}: cannot read '{}'", tres_column, item));
        const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
        if (key == "cpu") {
          auto v = Whole(value);
          if (!v || *v < 0 || *v > 100000) fail(fmt::format("{}: cpu={}", tres_column, value));
          j.request.cpu_milli = *v * 1000;
        } else if (key == "mem") {
          auto v = MemoryMib(value);
          if (!v) fail(fmt::format("{}: mem={} (expected a size such as 16G)", tres_column, value));
          j.request.memory_mib = *v;
        } else if (key == "node") {
          auto v = Whole(value);
          if (!v || *v < 1 || *v > 100000) fail(fmt::format("{}: node={}", tres_column, value));
          row.nodes = static_cast<int>(*v);
        } else if (key == "gres/gpu") {
          auto v = Whole(value);
          if (!v || *v < 0 || *v > 6400) fail(fmt::format("{}: gres/gpu={}", tres_column, value));
          gpus = *v;
        } else if (key == "gres/shard") {
          auto v = Whole(value);
          if (!v || *v < 0) fail(fmt::format("{}: gres/shard={}", tres_column, value));
          shards = *v;
        }  // billing, energy, typed gres/gpu:<type> and the like: not resources to place
      }
      if (gpus > 0 && gpus % row.nodes != 0)
        fail(fmt::format("gres/gpu={} over node={} is no whole number per node", gpus, row.nodes));
      if (gpus / row.nodes > 64)
        fail(fmt::format("gres/gpu={} over node={}: more than 64 GPUs on a node", gpus, row.nodes));
      if (shards > 0 && gpus == 0) {
        if (shards_per_gpu <= 0)
          fail(
              "gres/shard: a job with shards, and no node of the cluster with shards (the node "
              "file's Gres has none)");
        if (shards / shards_per_gpu > 64)
          fail(fmt::format("gres/shard={}: more than 64 GPUs' shards", shards));
        if (shards >= shards_per_gpu) {
          j.request.gpus = static_cast<int>(shards / shards_per_gpu);  // as much as whole GPUs
        } else {
          j.request.gpu_milli = static_cast<int>(shards * 1000 / shards_per_gpu);
          if (gpu_memory_mib > 0)
            j.request.gpu_memory_mib = gpu_memory_mib * shards / shards_per_gpu;
          j.request.share_gpus = 1;
        }
      } else {
        j.request.gpus = static_cast<int>(gpus / row.nodes);
      }
      j.request.cpu_milli /= row.nodes;
      j.request.memory_mib /= row.nodes;
      rows.push_back(std::move(row));
    }
  } catch (const Fail& f) {
    return absl::InvalidArgumentError(f.message);
  }
  // The trace's clock starts at the first submission; sacct lists by job id, not time.
  int64_t t0 = INT64_MAX;
  for (const Row& r : rows) t0 = std::min(t0, r.submit);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.submit < b.submit; });
  std::vector<SimJob> jobs;
  for (Row& r : rows) {
    r.job.submit = static_cast<double>(r.submit - t0);
    if (r.nodes == 1) {
      jobs.push_back(std::move(r.job));
      continue;
    }
    for (int k = 0; k < r.nodes; ++k) {
      SimJob part = r.job;
      part.request.id = fmt::format("{}/{}", r.job.request.id, k);
      jobs.push_back(std::move(part));
    }
  }
  return jobs;
}

}  // namespace tessera::sim
