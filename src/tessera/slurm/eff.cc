#include "tessera/slurm/eff.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "fmt/format.h"
#include "tessera/core/gpu.h"

namespace tessera::slurm {
namespace {

using nlohmann::json;

// For fmt, which knows std's string_view and not this absl's.
std::string_view Std(absl::string_view v) { return {v.data(), v.size()}; }

// A number as text holds it whole ("96", "3.9"), not negative; nullopt else.
std::optional<double> Number(absl::string_view t) {
  double v = 0;
  if (t.empty() || t.front() == '-' || t.front() == '+') return std::nullopt;
  const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// "3.9 gib", "512 mib", "0 b": FormatBytes' forms, lower case.
std::optional<uint64_t> PartBytes(absl::string_view t) {
  const size_t space = t.find(' ');
  if (space == absl::string_view::npos) return std::nullopt;
  const std::optional<double> v = Number(t.substr(0, space));
  const absl::string_view unit = t.substr(space + 1);
  int shift = -1;
  for (const auto& [name, s] : {std::pair<absl::string_view, int>{"b", 0},
                                {"kib", 10},
                                {"mib", 20},
                                {"gib", 30},
                                {"tib", 40}}) {
    if (unit == name) shift = s;
  }
  if (!v || shift < 0 || *v * std::ldexp(1.0, shift) >= 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(std::llround(*v * std::ldexp(1.0, shift)));
}

// sacct's sizes with --noconvert: "1234K", "4000M", "0", "" (none); powers of 1024.
absl::StatusOr<std::optional<uint64_t>> SacctBytes(absl::string_view t) {
  if (t.empty()) return std::optional<uint64_t>();
  int shift = 0;
  const char* units = "KMGTP";
  if (const char* u = std::strchr(units, std::toupper(static_cast<unsigned char>(t.back())));
      u != nullptr && *u != '\0') {
    shift = 10 * static_cast<int>(u - units + 1);
    t.remove_suffix(1);
  }
  const std::optional<double> v = Number(t);
  if (!v) return absl::InvalidArgumentError("not a size such as 1234K or 4000M");
  // Slurm's "none" and "unlimited" (NO_VAL64, INFINITE64), as sacct prints them: unknown (seen for
  // ReqMem as 18446744073709551616.00M).
  if (*v >= 0x1p63 || *v * std::ldexp(1.0, shift) >= 0x1p63) return std::optional<uint64_t>();
  return std::optional<uint64_t>(static_cast<uint64_t>(std::llround(*v * std::ldexp(1.0, shift))));
}

// sacct's times: [D-]HH:MM:SS, MM:SS.mmm, 00:MM:SS; "" none (0).
absl::StatusOr<double> SacctSeconds(absl::string_view t) {
  if (t.empty()) return 0.0;
  const auto bad =
      absl::InvalidArgumentError("not a time such as 1-02:03:04, 02:03:04 or 03:04.567");
  double days = 0;
  if (const size_t dash = t.find('-'); dash != absl::string_view::npos) {
    const std::optional<double> d = Number(t.substr(0, dash));
    if (!d || *d != std::floor(*d)) return bad;
    days = *d;
    t.remove_prefix(dash + 1);
  }
  std::vector<absl::string_view> f = absl::StrSplit(t, ':');
  if (f.size() != 2 && f.size() != 3) return bad;
  double s = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const std::optional<double> v = Number(f[i]);
    // Only the seconds have a fraction; minutes and seconds are under 60.
    if (!v || (i + 1 < f.size() && *v != std::floor(*v)) || (i > 0 && *v >= 60)) return bad;
    s = s * 60 + *v;
  }
  return days * 86400 + s;
}

absl::StatusOr<int> Count(absl::string_view t) {
  int v = 0;
  const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size() || v < 0)
    return absl::InvalidArgumentError("not a count");
  return v;
}

absl::StatusOr<NodePart> ReadPart(absl::string_view part) {
  const std::string lower = absl::AsciiStrToLower(part);
  absl::string_view rest = lower;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        fmt::format("AdminComment part '{}': {}", Std(part), Std(why)));
  };
  rest.remove_prefix(absl::string_view("tessera@").size());
  NodePart p;
  const size_t colon = rest.find(": ");
  if (colon == 0 || colon == absl::string_view::npos) return bad("no node name before ': '");
  p.node = std::string(rest.substr(0, colon));
  rest.remove_prefix(colon + 2);
  if (!absl::ConsumePrefix(&rest, "gpus ") && !absl::ConsumePrefix(&rest, "gpu "))
    return bad("expected 'gpu N' or 'gpus N,M' after the node");
  const size_t open = rest.find(" (");
  const size_t close = rest.find("): ");
  if (open == absl::string_view::npos || close == absl::string_view::npos || close < open)
    return bad("expected '(25% share)' or '(whole)' after the GPUs, then ': '");
  for (absl::string_view g : absl::StrSplit(rest.substr(0, open), ',', absl::SkipEmpty())) {
    absl::StatusOr<int> i = Count(g);
    if (!i.ok()) return bad(fmt::format("GPU '{}' is not an index", Std(g)));
    p.gpus.push_back(*i);
  }
  absl::string_view kind = rest.substr(open + 2, close - open - 2);
  if (kind != "whole" && kind != "whole gpus") {
    if (!absl::ConsumeSuffix(&kind, "% share each") && !absl::ConsumeSuffix(&kind, "% share"))
      return bad(fmt::format("'{}' is neither a share nor whole GPUs", Std(kind)));
    const std::optional<double> share = Number(kind);
    if (!share || *share <= 0 || *share > 100) return bad(fmt::format("share '{}%'", Std(kind)));
    p.share_percent = *share;
  }
  rest.remove_prefix(close + 3);
  // What it says of its use; items a newer plugin adds are passed over.
  for (absl::string_view item : absl::StrSplit(rest, ", ")) {
    absl::string_view v = item;
    if (item == "ran under a second") {
      p.under_a_second = true;
    } else if (absl::ConsumeSuffix(&v, "% busy")) {
      const std::optional<double> b = Number(v);
      if (!b || *b > 100) return bad(fmt::format("'{}'", Std(item)));
      p.busy_percent = *b;
    } else if (absl::ConsumeSuffix(&v, " of gpu time idle")) {
      const std::optional<double> s = v == "0s" ? 0.0 : core::ParseDuration(Std(v));
      if (!s) return bad(fmt::format("'{}'", Std(item)));
      p.idle_s = *s;
    } else if (absl::ConsumePrefix(&v, "peak ")) {
      const size_t of = v.find(" of ");
      p.peak_bytes = PartBytes(v.substr(0, of));
      if (!p.peak_bytes) return bad(fmt::format("'{}'", Std(item)));
      if (of != absl::string_view::npos) {
        absl::string_view limit = v.substr(of + 4);
        if (const size_t paren = limit.find(" ("); paren != absl::string_view::npos)
          limit = limit.substr(0, paren);
        p.limit_bytes = PartBytes(limit);
        if (!p.limit_bytes) return bad(fmt::format("'{}'", Std(item)));
      }
    } else if (absl::ConsumeSuffix(&v, " allocations refused at its limit") ||
               absl::ConsumeSuffix(&v, " allocation refused at its limit")) {
      absl::StatusOr<int> n = Count(v);
      if (!n.ok()) return bad(fmt::format("'{}'", Std(item)));
      p.refused = static_cast<uint64_t>(*n);
    }
  }
  return p;
}

}  // namespace

absl::StatusOr<std::vector<NodePart>> ParseAdminComment(std::string_view comment_text) {
  const absl::string_view comment(comment_text.data(), comment_text.size());
  std::vector<NodePart> out;
  for (absl::string_view part : absl::StrSplit(comment, " | ")) {
    part = absl::StripAsciiWhitespace(part);
    if (!absl::StartsWithIgnoreCase(part, "tessera@")) continue;
    absl::StatusOr<NodePart> p = ReadPart(part);
    if (!p.ok()) return p.status();
    out.push_back(std::move(*p));
  }
  return out;
}

namespace {

using Row = std::vector<absl::string_view>;

const std::vector<std::string>& FieldNames() {
  static const std::vector<std::string> names = absl::StrSplit(kEffFields, ',');
  return names;
}

// sacct's lines, each split into its fields; an error names a line without as many as asked.
absl::StatusOr<std::vector<Row>> SacctRows(absl::string_view text) {
  std::vector<Row> rows;
  size_t n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    Row f = absl::StrSplit(line, kEffDelimiter);
    if (f.size() != FieldNames().size())
      return absl::InvalidArgumentError(fmt::format("sacct line {}: {} fields, expected {} ({})", n,
                                                    f.size(), FieldNames().size(), kEffFields));
    rows.push_back(std::move(f));
  }
  return rows;
}

// The job of line `j` with its steps' lines (`steps`: those whose id is the job's and a dot).
absl::StatusOr<SacctEff> JobOf(const Row& j, const std::vector<const Row*>& steps) {
  const std::vector<std::string>& kNames = FieldNames();
  auto field_error = [&](size_t i, const absl::Status& st) {
    return absl::InvalidArgumentError(fmt::format("sacct, job {}: {} '{}': {}", Std(j[0]),
                                                  kNames[i], Std(j[i]), Std(st.message())));
  };
  SacctEff e;
  e.job_id = std::string(j[0]);
  e.name = std::string(j[1]);
  e.user = std::string(j[2]);
  e.state = std::string(j[3]);
  e.exit_code = std::string(j[4]);
  for (auto [i, out] : {std::pair<size_t, int*>{5, &e.nodes}, {6, &e.cpus}}) {
    absl::StatusOr<int> v = Count(j[i]);
    if (!v.ok()) return field_error(i, v.status());
    *out = *v;
  }
  absl::StatusOr<int> elapsed = Count(j[7]);
  if (!elapsed.ok()) return field_error(7, elapsed.status());
  e.elapsed_s = *elapsed;
  absl::StatusOr<double> cpu = SacctSeconds(j[8]);
  if (!cpu.ok()) return field_error(8, cpu.status());
  e.total_cpu_s = *cpu;
  absl::StatusOr<std::optional<uint64_t>> mem = SacctBytes(j[9]);
  if (!mem.ok()) return field_error(9, mem.status());
  e.req_mem_bytes = *mem;
  e.from_first_step = e.name == "allocation" && !e.req_mem_bytes;
  e.admin_comment = std::string(j[11]);
  // "billing=8,cpu=8,gres/gpu=2,gres/shard=3,mem=8000M,node=2": the untyped counts (a type's own,
  // gres/gpu:a100=2, is within them).
  for (absl::string_view item : absl::StrSplit(j[12], ',', absl::SkipEmpty())) {
    const size_t eq = item.find('=');
    const absl::string_view key = item.substr(0, eq);
    if (eq == absl::string_view::npos || (key != "gres/gpu" && key != "gres/shard")) continue;
    absl::StatusOr<int> n = Count(item.substr(eq + 1));
    if (!n.ok()) return field_error(12, n.status());
    (key == "gres/gpu" ? e.gpus_allocated : e.shards_allocated) = *n;
  }
  // Its largest task: the highest MaxRSS of its steps (and its own line, where sacct gives one).
  std::vector<const Row*> lines = steps;
  lines.push_back(&j);
  for (const Row* line : lines) {
    const Row& r = *line;
    absl::StatusOr<std::optional<uint64_t>> rss = SacctBytes(r[10]);
    if (!rss.ok())
      return absl::InvalidArgumentError(fmt::format("sacct, step {}: MaxRSS '{}': {}", Std(r[0]),
                                                    Std(r[10]), Std(rss.status().message())));
    if (*rss && (!e.max_rss_bytes || **rss > *e.max_rss_bytes)) e.max_rss_bytes = *rss;
  }
  return e;
}

}  // namespace

absl::StatusOr<SacctEff> ParseSacctEff(std::string_view text_in, std::string_view job_id_in) {
  const absl::string_view text(text_in.data(), text_in.size()),
      job_id(job_id_in.data(), job_id_in.size());
  absl::StatusOr<std::vector<Row>> read = SacctRows(text);
  if (!read.ok()) return read.status();
  const std::vector<Row>& rows = *read;
  // The job's own line: its id as asked, else the one line that is not a step (a job array's task
  // asked by its own id, which sacct lists as 42_3).
  const Row* job = nullptr;
  std::vector<absl::string_view> jobs;
  for (const auto& r : rows) {
    if (r[0].find('.') != absl::string_view::npos) continue;
    jobs.push_back(r[0]);
    if (r[0] == job_id) job = &r;
  }
  if (job == nullptr && jobs.size() == 1) {
    for (const auto& r : rows) {
      if (r[0] == jobs[0]) job = &r;
    }
  }
  if (job == nullptr && jobs.empty())
    return absl::NotFoundError(fmt::format("sacct lists no job {}", Std(job_id)));
  if (job == nullptr)
    return absl::InvalidArgumentError(
        fmt::format("sacct lists {} jobs for {} ({}, ...: an array's tasks or a heterogeneous "
                    "job's components): name one",
                    jobs.size(), Std(job_id), Std(jobs[0])));
  std::vector<const Row*> steps;
  const std::string step = std::string((*job)[0]) + ".";
  for (const Row& r : rows)
    if (absl::StartsWith(r[0], step)) steps.push_back(&r);
  return JobOf(*job, steps);
}

absl::StatusOr<SacctJobs> ParseSacctEffAll(std::string_view text_in) {
  absl::StatusOr<std::vector<Row>> rows =
      SacctRows(absl::string_view(text_in.data(), text_in.size()));
  if (!rows.ok()) return rows.status();
  // Each job's line, in sacct's order, with the lines of its steps (after it, as sacct lists them;
  // a step whose job's line is not there is left out: sacct lists none such).
  std::vector<std::pair<const Row*, std::vector<const Row*>>> jobs;
  std::unordered_map<std::string_view, size_t> index;
  for (const Row& r : *rows) {
    const size_t dot = r[0].find('.');
    if (dot == absl::string_view::npos) {
      index.emplace(Std(r[0]), jobs.size());
      jobs.push_back({&r, {}});
    } else if (auto it = index.find(Std(r[0].substr(0, dot))); it != index.end()) {
      jobs[it->second].second.push_back(&r);
    }
  }
  SacctJobs out;
  for (const auto& [line, steps] : jobs) {
    absl::StatusOr<SacctEff> job = JobOf(*line, steps);
    if (job.ok()) {
      out.jobs.push_back(std::move(*job));
    } else {
      out.errors.push_back(std::string(job.status().message()));
    }
  }
  return out;
}

nlohmann::ordered_json EffOf(const SacctEff& job, const std::vector<NodePart>& parts) {
  using ojson = nlohmann::ordered_json;
  ojson o = {
      {"job_id", job.job_id}, {"name", job.name},           {"user", job.user},
      {"state", job.state},   {"exit_code", job.exit_code}, {"nodes", job.nodes},
      {"cpus", job.cpus},     {"elapsed_s", job.elapsed_s}, {"cpu_seconds", job.total_cpu_s}};
  if (job.from_first_step) o["recorded_from_first_step"] = true;
  if (job.elapsed_s > 0 && job.cpus > 0)
    o["cpu_pct"] = 100 * job.total_cpu_s / (job.elapsed_s * job.cpus);
  if (job.max_rss_bytes) o["memory_peak_bytes"] = *job.max_rss_bytes;
  if (job.req_mem_bytes && *job.req_mem_bytes > 0) {
    const uint64_t per_node = *job.req_mem_bytes / static_cast<uint64_t>(std::max(1, job.nodes));
    o["memory_asked_per_node_bytes"] = per_node;
    if (job.max_rss_bytes && per_node > 0)
      o["memory_pct"] = 100.0 * static_cast<double>(*job.max_rss_bytes) / per_node;
  }
  double held = 0, busy = 0, idle = 0;
  bool measured = false;
  size_t gpus = 0;
  uint64_t refused = 0;
  std::optional<uint64_t> peak, limit;
  std::optional<double> peak_pct;
  ojson nodes = ojson::array();
  for (const NodePart& p : parts) {
    ojson n = {{"node", p.node}, {"gpus", p.gpus}, {"share_percent", p.share_percent}};
    gpus += p.gpus.size();
    if (p.busy_percent && !p.under_a_second) {
      const double h = job.elapsed_s * p.share_percent / 100 * static_cast<double>(p.gpus.size());
      measured = true;
      held += h;
      busy += h * *p.busy_percent / 100;
      idle += p.idle_s.value_or(h * (1 - *p.busy_percent / 100));
      n["busy_pct"] = *p.busy_percent;
      n["held_gpu_seconds"] = h;
      if (p.idle_s) n["idle_gpu_seconds"] = *p.idle_s;
    }
    if (p.peak_bytes) {
      n["gpu_memory_peak_bytes"] = *p.peak_bytes;
      if (!peak || *p.peak_bytes > *peak) peak = p.peak_bytes, limit = p.limit_bytes;
      if (p.limit_bytes && *p.limit_bytes > 0) {
        const double pct = 100.0 * static_cast<double>(*p.peak_bytes) / *p.limit_bytes;
        if (!peak_pct || pct > *peak_pct) peak_pct = pct;
      }
    }
    if (p.limit_bytes) n["gpu_memory_limit_bytes"] = *p.limit_bytes;
    n["refused"] = p.refused;
    refused += p.refused;
    if (p.under_a_second) n["ran_under_a_second"] = true;
    nodes.push_back(std::move(n));
  }
  // What Slurm gave it; then what the nodes' parts say it held.
  o["gpus_allocated"] = job.gpus_allocated;
  o["shards_allocated"] = job.shards_allocated;
  o["gpus"] = gpus;
  if (measured) {
    o["gpu_held_seconds"] = held;
    o["gpu_busy_seconds"] = busy;
    o["gpu_idle_seconds"] = idle;
    if (held > 0) o["gpu_busy_pct"] = 100 * busy / held;
  }
  if (peak) o["gpu_memory_peak_bytes"] = *peak;
  if (limit) o["gpu_memory_limit_bytes"] = *limit;
  if (peak_pct) o["gpu_memory_pct"] = *peak_pct;
  o["gpu_memory_refused"] = refused;
  o["gpu_nodes"] = std::move(nodes);
  return o;
}

nlohmann::ordered_json EffByUser(const std::vector<nlohmann::ordered_json>& jobs) {
  using ojson = nlohmann::ordered_json;
  struct Sums {
    int jobs = 0, gpu_jobs = 0, refused_jobs = 0;
    double held = 0, busy = 0, idle = 0, cpu = 0, cpu_held = 0;
    bool measured = false;
    std::vector<double> memory_pct;
  };
  std::map<std::string, Sums> users;
  for (const ojson& j : jobs) {
    Sums& u = users[j.value("user", std::string())];
    ++u.jobs;
    if (!j["gpu_nodes"].empty()) ++u.gpu_jobs;
    if (j.contains("gpu_held_seconds")) {
      u.measured = true;
      u.held += j["gpu_held_seconds"].get<double>();
      u.busy += j["gpu_busy_seconds"].get<double>();
      u.idle += j["gpu_idle_seconds"].get<double>();
    }
    if (j.contains("gpu_memory_pct")) u.memory_pct.push_back(j["gpu_memory_pct"].get<double>());
    if (j["gpu_memory_refused"].get<uint64_t>() > 0) ++u.refused_jobs;
    u.cpu += j["cpu_seconds"].get<double>();
    u.cpu_held += j["elapsed_s"].get<double>() * j["cpus"].get<double>();
  }
  ojson out = ojson::array();
  for (auto& [user, u] : users) {
    ojson o = {{"user", user}, {"jobs", u.jobs}, {"gpu_jobs", u.gpu_jobs}};
    if (u.measured) {
      o["gpu_held_seconds"] = u.held;
      o["gpu_busy_seconds"] = u.busy;
      o["gpu_idle_seconds"] = u.idle;
      if (u.held > 0) o["gpu_busy_pct"] = 100 * u.busy / u.held;
    }
    if (!u.memory_pct.empty()) {
      // The middle job's peak of its GPU memory limit (the lower of the two middle ones).
      std::sort(u.memory_pct.begin(), u.memory_pct.end());
      o["gpu_memory_pct_median"] = u.memory_pct[(u.memory_pct.size() - 1) / 2];
      o["gpu_memory_pct_max"] = u.memory_pct.back();
    }
    o["gpu_memory_refused_jobs"] = u.refused_jobs;
    o["cpu_seconds"] = u.cpu;
    if (u.cpu_held > 0) o["cpu_pct"] = 100 * u.cpu / u.cpu_held;
    out.push_back(std::move(o));
  }
  // The GPU time left idle, most first (unmeasured last), then by name.
  std::stable_sort(out.begin(), out.end(), [](const ojson& a, const ojson& b) {
    return a.value("gpu_idle_seconds", -1.0) > b.value("gpu_idle_seconds", -1.0);
  });
  return out;
}

}  // namespace tessera::slurm
