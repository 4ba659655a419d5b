#include "tessera/cli/sim_cmd.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/cli/output.h"
#include "tessera/cli/version.h"
#include "tessera/core/gpu.h"
#include "tessera/sched/fragmentation.h"
#include "tessera/sched/policy.h"
#include "tessera/sim/inflation.h"
#include "tessera/sim/paper.h"
#include "tessera/sim/replay.h"
#include "tessera/sim/report.h"
#include "tessera/sim/right_size.h"
#include "tessera/sim/slurm_trace.h"
#include "tessera/sim/trace.h"

namespace tessera::cli {
namespace {

struct SimFlags {
  std::string nodes, pods, format = "auto", policies = "all", output = "table", out_dir;
  std::string gpu_memory;
  int shards_per_gpu = 0;
  int jobs = 0;
  bool progress = true;
  uint64_t seed = 42;
};

struct PolicyRun {
  std::string label;
  std::vector<sched::WeightedPolicy> policies;
};

// "fgd,bestfit,fgd+topology:0.5" -> one run per item; '+' joins policies within an item. "all" is
// the paper's six baselines, FGD as the paper's simulator runs it, and Tessera's default; "paper"
// the six alone.
absl::StatusOr<std::vector<PolicyRun>> ParsePolicyRuns(const std::string& text) {
  std::string expanded = text;
  if (text == "all")
    expanded = "random,dotprod,gpuclustering,gpupacking,bestfit,fgd,fgd-paper,tessera";
  if (text == "paper") expanded = "random,dotprod,gpuclustering,gpupacking,bestfit,fgd";
  std::vector<PolicyRun> out;
  size_t start = 0;
  while (start <= expanded.size()) {
    size_t end = expanded.find(',', start);
    if (end == std::string::npos) end = expanded.size();
    std::string item = expanded.substr(start, end - start);
    std::string joined = item;
    std::replace(joined.begin(), joined.end(), '+', ',');
    auto p = sched::ParsePolicies(joined);
    if (!p.ok())
      return absl::InvalidArgumentError(
          fmt::format("--policies: {}", std::string(p.status().message())));
    for (const PolicyRun& r : out) {
      if (r.label == item)
        return absl::InvalidArgumentError(fmt::format("--policies: '{}' twice", item));
    }
    out.push_back({item, *p});
    start = end + 1;
    if (end == expanded.size()) break;
  }
  return out;
}

// $TESSERA_TRACES/<file>, else the copy in the checkout this binary was built from, else "".
std::string DefaultTrace(const std::string& file) {
  const char* env = std::getenv("TESSERA_TRACES");
  if (env && *env) return std::string(env) + "/" + file;
  std::string bundled = std::string(kBundledTraces) + "/" + file;
  std::error_code ec;
  return std::filesystem::exists(bundled, ec) ? bundled : "";
}

// A progress line on stderr, redrawn in place; only on a terminal.
class Progress {
 public:
  Progress(std::ostream& err, int total, bool enabled)
      : err_(err),
        total_(total),
        enabled_(enabled && isatty(STDERR_FILENO)),
        start_(std::chrono::steady_clock::now()) {}
  void Done(const std::string& what) {
    std::lock_guard lock(mu_);
    ++done_;
    if (!enabled_) return;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    int width = 30, filled = total_ ? width * done_ / total_ : width;
    err_ << fmt::format("\r[{}{}] {}/{} runs, {:.1f}s, last: {:<30}", std::string(filled, '='),
                        std::string(width - filled, ' '), done_, total_, s, what.substr(0, 30))
         << std::flush;
    if (done_ == total_) err_ << "\n";
  }

 private:
  std::ostream& err_;
  int total_, done_ = 0;
  bool enabled_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
};

// Runs fn(i) for i in [0, n) on `threads` threads.
void ParallelFor(int n, int threads, const std::function<void(int)>& fn) {
  threads = std::max(1, std::min(threads, n));
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

int Threads(int asked) {
  if (asked > 0) return asked;
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

struct Loaded {
  std::string pods_path;  // the pod list actually read (the default when --pods was not given)
  std::vector<core::NodeSpec> nodes;
  std::vector<sim::SimJob> jobs;
  std::vector<core::Request> requests;
  std::vector<sched::TypicalRequest> typical;
};

std::optional<int> Load(const SimFlags& f, Loaded& l, std::ostream& err) {
  auto format = sim::ParseTraceFormat(f.format);
  if (!format.ok()) {
    err << "tessera: --format: " << format.status().message() << "\n";
    return kExitBadInput;
  }
  std::string nodes = f.nodes.empty() ? DefaultTrace("openb_node_list_gpu_node.csv") : f.nodes;
  std::string pods = f.pods.empty() ? DefaultTrace("openb_pod_list_default.csv") : f.pods;
  if (nodes.empty() || pods.empty()) {
    err << "tessera: --nodes and --pods are required: no openb traces in " << kBundledTraces
        << " (set TESSERA_TRACES to a folder holding the openb CSVs)\n";
    return kExitBadInput;
  }
  sim::TraceOptions options;
  if (!f.gpu_memory.empty())
    options.gpu_memory_mib = static_cast<int64_t>(core::ParseBytes(f.gpu_memory).value_or(0) >> 20);
  auto n = sim::LoadNodes(nodes, *format, options);
  if (!n.ok()) {
    err << "tessera: " << n.status().message() << "\n";
    return kExitBadInput;
  }
  options.shards_per_gpu = f.shards_per_gpu > 0 ? f.shards_per_gpu : sim::ShardsPerGpu(*n);
  auto j = sim::LoadJobs(pods, *format, options);
  if (!j.ok()) {
    err << "tessera: " << j.status().message() << "\n";
    return kExitBadInput;
  }
  if (n->empty()) {
    err << "tessera: " << nodes << ": no nodes\n";
    return kExitBadInput;
  }
  if (j->empty()) {
    err << "tessera: " << pods << ": no jobs\n";
    return kExitBadInput;
  }
  l.pods_path = pods;
  l.nodes = std::move(*n);
  l.jobs = std::move(*j);
  for (const sim::SimJob& job : l.jobs) l.requests.push_back(job.request);
  l.typical = sched::TypicalRequests(l.requests);
  spdlog::info("sim: {} nodes from {}, {} jobs from {}, {} typical request shapes", l.nodes.size(),
               nodes, l.jobs.size(), pods, l.typical.size());
  return std::nullopt;
}

std::optional<int> WriteFile(const std::filesystem::path& path, const std::string& text,
                             std::ostream& err) {
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  o << text;
  o.close();
  if (!o) {
    err << "tessera: cannot write " << path.string() << "\n";
    return kExitFailure;
  }
  return std::nullopt;
}

std::optional<int> MakeOutDir(const std::string& dir, std::ostream& err) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    err << "tessera: --out " << dir << ": " << ec.message() << "\n";
    return kExitFailure;
  }
  return std::nullopt;
}

// Parses the policies, creates the output folder and loads the inputs; an exit code on failure.
std::optional<int> Prepare(const SimFlags& f, const std::string& policies,
                           std::vector<PolicyRun>& runs, Loaded& l, std::ostream& err) {
  auto parsed = ParsePolicyRuns(policies);
  if (!parsed.ok()) {
    err << "tessera: " << parsed.status().message() << "\n";
    return kExitBadInput;
  }
  runs = std::move(*parsed);
  if (!f.out_dir.empty()) {
    if (auto rc = MakeOutDir(f.out_dir, err)) return rc;
  }
  return Load(f, l, err);
}

int RunInflate(const SimFlags& f, int seeds, double ratio, double step, std::ostream& out,
               std::ostream& err) {
  std::vector<PolicyRun> runs;
  Loaded l;
  if (auto rc = Prepare(f, f.policies, runs, l, err)) return *rc;
  std::vector<std::pair<const PolicyRun*, uint64_t>> specs;
  for (const PolicyRun& r : runs) {
    for (int s = 0; s < seeds; ++s) specs.emplace_back(&r, f.seed + static_cast<uint64_t>(s));
  }
  std::vector<sim::InflationResult> results(specs.size());
  Progress progress(err, static_cast<int>(specs.size()), f.progress);
  auto t0 = std::chrono::steady_clock::now();
  ParallelFor(static_cast<int>(specs.size()), Threads(f.jobs), [&](int i) {
    sim::InflationConfig c;
    c.label = specs[i].first->label;
    c.policies = specs[i].first->policies;
    c.seed = specs[i].second;
    c.ratio = ratio;
    c.step = step;
    results[i] = sim::RunInflation(l.nodes, l.requests, l.typical, c);
    progress.Done(fmt::format("{} seed {}", c.label, c.seed));
  });
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("sim: {} inflation runs in {:.2f}s on {} threads", specs.size(), wall,
               Threads(f.jobs));
  bool paper = std::filesystem::path(l.pods_path).filename() == "openb_pod_list_default.csv" &&
               std::abs(ratio - 1.3) < 1e-9;
  auto summaries = sim::SummarizeInflation(results);
  if (!f.out_dir.empty()) {
    std::filesystem::path dir(f.out_dir);
    std::string subtitle = fmt::format(
        "{} nodes, {} jobs; every pod once in a seeded order, then pods drawn with replacement, "
        "until arrived GPU demand reaches {:.0f}% of capacity; seeds {}..{}.",
        l.nodes.size(), l.jobs.size(), 100 * ratio, f.seed, f.seed + seeds - 1);
    for (auto [name, text] :
         {std::pair{"inflation_curve.csv", sim::InflationCurveCsv(results)},
          std::pair{"inflation_runs.csv", sim::InflationRunsCsv(results)},
          std::pair{"inflation_failed.csv", sim::InflationFailedCsv(results)},
          std::pair{"report.html", sim::HtmlReport("Tessera simulator: workload "
                                                   "inflation",
                                                   subtitle, results, {})}}) {
      if (auto rc = WriteFile(dir / name, text, err)) return *rc;
    }
    spdlog::info(
        "sim: wrote {}/{{inflation_curve,inflation_runs,inflation_failed}}.csv and report.html",
        f.out_dir);
  }
  Format format = *ParseFormat(f.output);
  if (format == Format::kTable) {
    std::vector<std::string> header = {
        "POLICY",          "RUNS",       "GPU ALLOC",   "SD",         "UNALLOCATED GPUS",
        "FRAGMENTED GPUS", "FRAG RATIO", "FAILED PODS", "SECONDS/RUN"};
    if (paper) header.push_back("PAPER");
    Table t(header);
    for (const sim::InflationSummary& s : summaries) {
      std::vector<std::string> row = {
          s.label,
          std::to_string(s.runs),
          fmt::format("{:.2f}%", 100 * s.allocated),
          fmt::format("{:.2f}", 100 * s.allocated_sd),
          fmt::format("{:.1f}", s.unallocated_gpus),
          fmt::format("{:.1f}", s.fragmented_gpus),
          fmt::format("{:.1f}%", 100 * s.fragmentation_ratio),
          fmt::format("{:.0f} of {:.0f}", s.pods_failed, s.pods_arrived),
          fmt::format("{:.2f}", s.seconds / s.runs)};
      if (paper) {
        const auto figure = sim::PaperAllocationPercent(s.label, "default");
        row.push_back(figure ? fmt::format("{:.2f}%", *figure) : "-");
      }
      t.AddRow(row);
    }
    t.Print(out);
    out << fmt::format("{} runs in {:.1f}s{}\n", specs.size(), wall,
                       f.out_dir.empty() ? "" : "; CSV and report.html in " + f.out_dir);
  } else {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const sim::InflationSummary& s : summaries) {
      nlohmann::ordered_json e;
      e["policy"] = s.label;
      e["runs"] = s.runs;
      e["allocatedRatio"] = s.allocated;
      e["allocatedRatioSd"] = s.allocated_sd;
      e["unallocatedGpus"] = s.unallocated_gpus;
      e["fragmentedGpus"] = s.fragmented_gpus;
      e["fragmentationRatio"] = s.fragmentation_ratio;
      e["podsArrived"] = s.pods_arrived;
      e["podsFailed"] = s.pods_failed;
      nlohmann::ordered_json kinds = nlohmann::ordered_json::object();
      for (const auto& [k, v] : s.by_kind) kinds[k] = {{"arrived", v.first}, {"failed", v.second}};
      e["byKind"] = kinds;
      if (const auto figure = sim::PaperAllocationPercent(s.label, "default"); paper && figure)
        e["paperAllocatedRatio"] = *figure / 100;
      j.push_back(e);
    }
    EmitStructured(j, format, out);
  }
  return kExitOk;
}

// sim replay's own flags.
struct ReplayFlags {
  bool no_preemption = false;
  bool arrival_order = false;
  int samples = 200;
  double compression = 1;
  double stop_latency = 0;
  double fair_share = 0;
  int reservations = 0;
  bool predict = false;
  int utilization_ceiling = 0;
  bool ceiling_strict = false;
  bool interference = false;
  bool mps = false;
  double mps_capacity = 1;
  std::string mps_figures;  // a tessera-gpu-check --json report: mps_capacity from it
  // Each policy also run with requests right-sized from a use model (sim/right_size.h).
  bool right_size = false;
  sim::UseModel use;
  sim::RightSizing sizing;
  // Each policy also run with this share of the multi-GPU jobs elastic (ReplayConfig::elastic).
  double elastic = 0;
  double elastic_serial_fraction = 0.05;
  double resize_overhead = 60;
};

// The replay's files in --out: its series, runs and waits as CSV, and report.html with its plots.
std::optional<int> WriteReplayFiles(const SimFlags& f, const ReplayFlags& o, const Loaded& l,
                                    const std::vector<sim::ReplayResult>& results,
                                    std::ostream& err) {
  const bool no_preemption = o.no_preemption;
  const double compression = o.compression;
  {
    std::filesystem::path dir(f.out_dir);
    std::string subtitle = fmt::format(
        "{} nodes, {} jobs, seed {}, preemption {}, arrivals compressed {}x, queue order {}, "
        "backfill reservations {}, durations predicted {}{}{}{}{}{}.",
        l.nodes.size(), l.jobs.size(), f.seed, no_preemption ? "off" : "on", compression,
        o.arrival_order ? "arrival" : "priority then arrival", o.reservations,
        o.predict ? "from earlier jobs (p75 per owner and shape), else the trace's"
                  : "by the trace's predicted_duration where it has one",
        o.utilization_ceiling > 0
            ? fmt::format(", shared GPUs under {}% predicted utilization{}", o.utilization_ceiling,
                          o.ceiling_strict ? " (strict)" : "")
            : "",
        o.interference ? ", interference between shares modelled" : "",
        o.mps ? fmt::format(", GPUs shared by MPS (capacity {:g})", o.mps_capacity) : "",
        o.elastic > 0 ? fmt::format(", each policy also with {:g} of the multi-GPU jobs elastic "
                                    "(serial fraction {:g}, {:g}s per resize)",
                                    o.elastic, o.elastic_serial_fraction, o.resize_overhead)
                      : "",
        o.right_size ? fmt::format(", each policy also with requests right-sized (use model: mean "
                                   "{:g}, concentration {:g}; margin {:g}, {} milli granules)",
                                   o.use.mean, o.use.concentration, o.sizing.margin,
                                   o.sizing.granularity_milli)
                     : "");
    for (auto [name, text] :
         {std::pair{"replay_series.csv", sim::ReplaySeriesCsv(results)},
          std::pair{"replay_runs.csv", sim::ReplayRunsCsv(results)},
          std::pair{"replay_waits.csv", sim::ReplayWaitsCsv(results)},
          std::pair{"report.html", sim::HtmlReport("Tessera simulator: time-based replay", subtitle,
                                                   {}, results)}}) {
      if (auto rc = WriteFile(dir / name, text, err)) return *rc;
    }
  }
  return std::nullopt;
}

// The replay's outcome per policy on `out`: a table, or JSON/YAML with the distributions.
void PrintReplayResults(const SimFlags& f, const ReplayFlags& o,
                        const std::vector<sim::ReplayResult>& results, double wall,
                        std::ostream& out) {
  Format format = *ParseFormat(f.output);
  if (format == Format::kTable) {
    // Allocation and queue over the busy period (first arrival to last start): over the whole
    // replay a trace of long jobs makes every policy look idle.
    std::vector<std::string> columns = {
        "POLICY",   "JOBS",         "FINISHED",   "NEVER STARTED", "PREEMPTIONS",
        "BUSY",     "ALLOC (BUSY)", "PEAK ALLOC", "QUEUE (BUSY)",  "WAIT MEAN",
        "WAIT P95", "WAIT MAX",     "JCT MEAN",   "JCT P95"};
    // With interference modelled: how much the shares were slowed (run time / duration).
    if (o.interference) columns.insert(columns.end(), {"SHARE SLOWDOWN", "SLOWDOWN MAX"});
    // With elastic runs: how many jobs were elastic, and how often they grew and shrank.
    if (o.elastic > 0) columns.insert(columns.end(), {"ELASTIC", "GROWS", "SHRINKS"});
    // Where the jobs' utilization is known (the trace's, or the use model's): how busy the GPUs
    // were over the busy period, beside how much of them was allocated.
    const bool busy_known =
        std::any_of(results.begin(), results.end(),
                    [](const sim::ReplayResult& r) { return r.utilization_known; });
    if (busy_known) columns.insert(columns.begin() + 7, "GPU BUSY (BUSY)");
    columns.push_back("SECONDS");
    Table t(columns);
    for (const sim::ReplayResult& r : results) {
      std::vector<std::string> row = {r.label,
                                      std::to_string(r.jobs),
                                      std::to_string(r.finished),
                                      std::to_string(r.never_started),
                                      std::to_string(r.preemptions),
                                      fmt::format("{:.0f}s", r.busy_end - r.busy_start),
                                      fmt::format("{:.2f}%", 100 * r.busy_mean_allocated),
                                      fmt::format("{:.2f}%", 100 * r.peak_allocated),
                                      fmt::format("{:.1f}", r.busy_mean_queued),
                                      fmt::format("{:.0f}s", r.wait.mean),
                                      fmt::format("{:.0f}s", r.wait.p95),
                                      fmt::format("{:.0f}s", r.wait.max),
                                      fmt::format("{:.0f}s", r.jct.mean),
                                      fmt::format("{:.0f}s", r.jct.p95)};
      if (busy_known) {
        row.insert(row.begin() + 7,
                   fmt::format("{:.2f}%", 100 * sim::MeanBusyOver(r, r.busy_start, r.busy_end)));
      }
      if (o.interference) {
        row.push_back(fmt::format("{:.3f}x", r.share_slowdown_mean));
        row.push_back(fmt::format("{:.3f}x", r.share_slowdown_max));
      }
      if (o.elastic > 0) {
        row.insert(row.end(), {std::to_string(r.elastic_jobs), std::to_string(r.grows),
                               std::to_string(r.shrinks)});
      }
      row.push_back(fmt::format("{:.2f}", r.seconds));
      t.AddRow(row);
    }
    t.Print(out);
    out << fmt::format("{} runs in {:.1f}s{}\n", results.size(), wall,
                       f.out_dir.empty() ? "" : "; CSV and report.html in " + f.out_dir);
  } else {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    auto dist = [](const sim::Distribution& d) {
      return nlohmann::ordered_json{{"count", d.count}, {"mean", d.mean}, {"p50", d.p50},
                                    {"p95", d.p95},     {"p99", d.p99},   {"max", d.max}};
    };
    auto by_size = [&](const std::map<std::string, sim::Distribution>& m) {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const char* k : sim::kGpuSizeClasses) {
        if (auto it = m.find(k); it != m.end()) o[k] = dist(it->second);
      }
      return o;
    };
    for (const sim::ReplayResult& r : results) {
      j.push_back({{"policy", r.label},
                   {"seed", r.seed},
                   {"jobs", r.jobs},
                   {"finished", r.finished},
                   {"neverStarted", r.never_started},
                   {"queuedAtEnd", r.queued_at_end},
                   {"preemptions", r.preemptions},
                   {"busyStart", r.busy_start},
                   {"busyEnd", r.busy_end},
                   {"busyMeanAllocatedRatio", r.busy_mean_allocated},
                   {"busyMeanGpuBusyRatio",
                    r.utilization_known
                        ? nlohmann::ordered_json(sim::MeanBusyOver(r, r.busy_start, r.busy_end))
                        : nlohmann::ordered_json()},
                   {"peakAllocatedRatio", r.peak_allocated},
                   {"meanAllocatedRatio", r.mean_allocated},
                   {"busyMeanQueued", r.busy_mean_queued},
                   {"peakQueued", r.peak_queued},
                   {"waitSeconds", dist(r.wait)},
                   {"waitSecondsBySize", by_size(r.wait_by_gpus)},
                   {"jctSeconds", dist(r.jct)},
                   {"jctSecondsBySize", by_size(r.jct_by_gpus)},
                   {"shareSlowdownMean", r.share_slowdown_mean},
                   {"shareSlowdownMax", r.share_slowdown_max},
                   {"elasticJobs", r.elastic_jobs},
                   {"grows", r.grows},
                   {"shrinks", r.shrinks}});
    }
    EmitStructured(j, format, out);
  }
}

int RunReplayCmd(const SimFlags& f, ReplayFlags o, std::ostream& out, std::ostream& err) {
  const bool no_preemption = o.no_preemption;
  const double compression = o.compression;
  std::vector<PolicyRun> runs;
  Loaded l;
  if (auto rc =
          Prepare(f, f.policies == "all" ? "bestfit,fgd,tessera" : f.policies, runs, l, err)) {
    return *rc;
  }
  if (std::none_of(l.jobs.begin(), l.jobs.end(),
                   [](const sim::SimJob& j) { return j.duration >= 0; })) {
    err << "tessera: no job in the pod list has a duration (openb: deletion_time; Tessera CSV: "
           "duration), so there is nothing to replay over time; `tessera sim inflate` needs none\n";
    return kExitBadInput;
  }
  // Compressing arrivals raises the load: a sampled trace is often far lighter than its cluster.
  if (compression != 1) {
    for (sim::SimJob& j : l.jobs) j.submit /= compression;
  }
  // MPS: its capacity as a GPU measured it (tessera-gpu-check's report), else as given.
  if (!o.mps_figures.empty()) {
    std::ifstream in(o.mps_figures);
    const int open_errno = errno;
    nlohmann::json report;
    absl::StatusOr<double> capacity = absl::InvalidArgumentError(
        fmt::format("cannot read it: {}", strerror(open_errno != 0 ? open_errno : EIO)));
    if (in.is_open()) {
      report = nlohmann::json::parse(in, nullptr, false);
      capacity = report.is_discarded()
                     ? absl::InvalidArgumentError("not JSON (a tessera-gpu-check --json report)")
                     : sim::MpsCapacityOf(report);
    }
    if (!capacity.ok()) {
      err << "tessera: --mps-figures " << o.mps_figures << ": " << capacity.status().message()
          << "\n";
      return kExitBadInput;
    }
    o.mps_capacity = *capacity;
    err << fmt::format("MPS capacity {:.2f} GPUs' worth of time-sliced work, from {} ({})\n",
                       o.mps_capacity, o.mps_figures, report.value("gpu", "a GPU"));
  }
  // Right-sizing: the jobs' use from the trace or the model, and each policy run again on the
  // right-sized requests.
  std::vector<sim::SimJob> sized;
  const size_t policies = runs.size();
  if (o.right_size) {
    for (absl::Status st : {sim::CheckUseModel(o.use), sim::CheckRightSizing(o.sizing)}) {
      if (!st.ok()) {
        err << "tessera: " << st.message() << "\n";
        return kExitBadInput;
      }
    }
    sim::UseModel use = o.use;
    use.seed = f.seed;  // --seed: the model's draws too
    const size_t drawn = sim::ApplyUseModel(l.jobs, use);
    sized = sim::RightSize(l.jobs, o.sizing);
    size_t changed = 0;
    for (size_t i = 0; i < sized.size(); ++i) {
      changed += sized[i].request.gpus != l.jobs[i].request.gpus ||
                 sized[i].request.gpu_milli != l.jobs[i].request.gpu_milli;
    }
    err << fmt::format(
        "right-sizing: the use of {} jobs drawn from the model (the trace's own for "
        "the rest); {} of {} jobs ask less right-sized\n",
        drawn, changed, l.jobs.size());
    for (size_t i = 0; i < policies; ++i)
      runs.push_back({runs[i].label + " right-sized", runs[i].policies});
  }
  // Elastic: each policy run again with a share of the multi-GPU jobs elastic.
  const size_t first_elastic = runs.size();
  if (o.elastic > 0) {
    for (size_t i = 0; i < policies; ++i)
      runs.push_back({runs[i].label + " elastic", runs[i].policies});
  }
  std::vector<sim::ReplayResult> results(runs.size());
  Progress progress(err, static_cast<int>(runs.size()), f.progress);
  auto t0 = std::chrono::steady_clock::now();
  ParallelFor(static_cast<int>(runs.size()), Threads(f.jobs), [&](int i) {
    sim::ReplayConfig c;
    c.label = runs[i].label;
    c.policies = runs[i].policies;
    c.seed = f.seed;
    c.preemption = !no_preemption;
    c.samples = o.samples;
    c.stop_latency_s = o.stop_latency;
    c.fair_share_half_life_s = o.fair_share;
    c.reservations = o.reservations;
    c.predict = o.predict;
    c.utilization_ceiling_pct = o.utilization_ceiling;
    c.utilization_ceiling_strict = o.ceiling_strict;
    c.interference = o.interference;
    c.mps = o.mps;
    c.mps_capacity = o.mps_capacity;
    c.arrival_order = o.arrival_order;
    const bool elastic = static_cast<size_t>(i) >= first_elastic;
    if (elastic) {
      c.elastic = o.elastic;
      c.elastic_serial_fraction = o.elastic_serial_fraction;
      c.resize_overhead_s = o.resize_overhead;
    }
    const bool right_sized = static_cast<size_t>(i) >= policies && !elastic;
    results[i] = sim::RunReplay(l.nodes, right_sized ? sized : l.jobs, l.typical, c);
    progress.Done(c.label);
  });
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sim::AlignBusyPeriods(results);
  if (!f.out_dir.empty()) {
    if (auto rc = WriteReplayFiles(f, o, l, results, err)) return *rc;
  }
  PrintReplayResults(f, o, results, wall, out);
  return kExitOk;
}

void AddCommon(CLI::App* cmd, SimFlags& f) {
  cmd->add_option("--nodes", f.nodes,
                  "Node list (openb or Tessera CSV, or `scontrol show node -o`); default "
                  "openb_node_list_gpu_node.csv in $TESSERA_TRACES, else in the checkout's "
                  "traces/openb");
  cmd->add_option("--pods", f.pods,
                  "Pod/job list (openb or Tessera CSV, or `sacct -P`); default "
                  "openb_pod_list_default.csv in $TESSERA_TRACES, else in the checkout's "
                  "traces/openb");
  cmd->add_option("--format", f.format,
                  "Input format: auto (by first line), openb, tessera or slurm (docs/slurm.md)")
      ->check(CLI::IsMember({"auto", "openb", "tessera", "slurm"}));
  cmd->add_option("--gpu-memory", f.gpu_memory,
                  "Slurm traces: each GPU's memory (80GiB), which scontrol does not say; shards "
                  "then mean their part of it")
      ->check(CLI::Validator(
          [](std::string& v) {
            auto b = core::ParseBytes(v);
            return b && *b >= (uint64_t{1} << 20)
                       ? std::string()
                       : "expected a size such as 80GiB, got '" + v + "'";
          },
          "SIZE"));
  cmd->add_option("--shards-per-gpu", f.shards_per_gpu,
                  "Slurm traces: shards per GPU (default: from the nodes' Gres)")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--out", f.out_dir,
                  "Folder for the CSV files and report.html (created if missing)");
  cmd->add_option("-j,--jobs", f.jobs, "Runs in parallel (default: one per CPU)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("!--no-progress", f.progress, "No progress bar (it is shown only on a terminal)");
  cmd->add_option("-o,--output", f.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
}

}  // namespace

std::shared_ptr<void> AddSimCommands(CLI::App& app, std::function<int()>& action, std::ostream& out,
                                     std::ostream& err) {
  struct State {
    SimFlags inflate_flags, replay_flags;
    int seeds = 10;
    double ratio = 1.3, step = 0.01;
    ReplayFlags replay;
  };
  auto st = std::make_shared<State>();
  SimFlags& inflate_flags = st->inflate_flags;
  SimFlags& replay_flags = st->replay_flags;
  int& seeds = st->seeds;
  double& ratio = st->ratio;
  double& step = st->step;
  ReplayFlags& rf = st->replay;
  CLI::App* sim = app.add_subcommand(
      "sim", "Replay cluster traces through the scheduling core and compare policies");
  sim->require_subcommand(1);

  CLI::App* inflate = sim->add_subcommand(
      "inflate",
      "Workload inflation (the FGD paper's experiment): the pod list's pods in a seeded order, "
      "then pods drawn with replacement, arrive until their GPU demand reaches --ratio of "
      "capacity; report GPU allocation per policy");
  AddCommon(inflate, inflate_flags);
  inflate
      ->add_option("--policies", inflate_flags.policies,
                   "Policies side by side, comma-separated; '+' combines within one run "
                   "(fgd+topology:0.5); 'all' = the paper's six, fgd-paper and tessera; "
                   "'paper' = the six")
      ->capture_default_str();
  inflate->add_option("--seeds", seeds, "Runs per policy, seeds --seed, --seed+1, ...")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  inflate->add_option("--seed", inflate_flags.seed, "First seed")->capture_default_str();
  inflate->add_option("--ratio", ratio, "Arrived GPU demand at the end, as a share of capacity")
      ->check(CLI::Range(0.01, 10.0))
      ->capture_default_str();
  inflate->add_option("--step", step, "Curve resolution, as a share of capacity")
      ->check(CLI::Range(0.001, 1.0))
      ->capture_default_str();
  inflate->callback([&action, &out, &err, st] {
    action = [&out, &err, st] {
      return RunInflate(st->inflate_flags, st->seeds, st->ratio, st->step, out, err);
    };
  });

  CLI::App* replay = sim->add_subcommand(
      "replay",
      "Time-based replay: jobs arrive at their submit times, queue by priority, run for their "
      "durations; report queueing delay, JCT, allocation and fragmentation over time");
  AddCommon(replay, replay_flags);
  replay_flags.policies = "all";
  replay
      ->add_option("--policies", replay_flags.policies,
                   "Policies side by side (as for inflate); 'all' = bestfit,fgd,tessera")
      ->capture_default_str();
  replay->add_option("--seed", replay_flags.seed, "Seed for random tie-breaks")
      ->capture_default_str();
  replay->add_flag("--no-preemption", rf.no_preemption, "Never preempt lower-priority jobs");
  replay->add_flag(
      "--arrival-order", rf.arrival_order,
      "Ignore the trace's priorities: jobs queue in arrival order and nothing preempts "
      "by priority (a stock-Kubernetes-like baseline)");
  replay
      ->add_option("--compress", rf.compression,
                   "Divide submit times by this factor (durations unchanged) to raise the load")
      ->check(CLI::Range(0.001, 1e6))
      ->capture_default_str();
  replay
      ->add_option("--stop-latency", rf.stop_latency,
                   "Seconds a preempted job takes to stop and give its GPUs back")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  replay
      ->add_option("--fair-share-half-life", rf.fair_share,
                   "Order equal priorities by each owner's recent GPU use, decaying by half every "
                   "this many seconds (0: off, submission order)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  replay
      ->add_option("--reservations", rf.reservations,
                   "Backfill reservations: the first N blocked jobs keep the GPUs where they will "
                   "start (as the server does with 8; 0: none)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  replay->add_flag("--predict", rf.predict,
                   "Expected durations for reservations from the jobs that finished earlier in "
                   "the replay (p75 per owner and shape), as the server predicts from its history");
  replay
      ->add_option("--utilization-ceiling", rf.utilization_ceiling,
                   "Interference-aware sharing: with --predict, a share whose earlier runs were "
                   "measured (the trace's utilization column) shares a GPU only while the GPU's "
                   "predicted utilization stays within this percentage (the server's default: 70; "
                   "0: off)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  replay->add_flag("--utilization-ceiling-strict", rf.ceiling_strict,
                   "A share that fits nowhere within the ceiling waits (default: it goes over it, "
                   "on the least busy GPU with room)");
  replay->add_flag("--interference", rf.interference,
                   "Model interference: shares on one GPU whose utilizations add up to more than "
                   "100% each run that much slower");
  replay->add_flag("--mps", rf.mps,
                   "Share GPUs by NVIDIA MPS instead of time slices: one owner's shares on a GPU "
                   "at a time, and with --interference, shares slowed only beyond --mps-capacity");
  replay
      ->add_option("--mps-capacity", rf.mps_capacity,
                   "With --mps: the summed utilization an MPS GPU serves before its clients slow "
                   "down, in GPUs (time slices: 1)")
      ->check(CLI::Range(0.1, 16.0))
      ->capture_default_str();
  replay->add_option("--mps-figures", rf.mps_figures,
                     "With --mps: take --mps-capacity from a tessera-gpu-check --json report of a "
                     "real GPU (its check \"MPS: 4 tenants of small kernels\")");
  replay
      ->add_option("--elastic", rf.elastic,
                   "Run each policy again with this share (0..1) of the jobs of 2 or more whole "
                   "GPUs elastic: each asks half its GPUs to all of them, grows onto idle GPUs and "
                   "shrinks back when a queued job can use them (docs/simulator.md), and compare")
      ->check(CLI::Range(0.0, 1.0));
  replay
      ->add_option("--elastic-serial-fraction", rf.elastic_serial_fraction,
                   "With --elastic: the part of an elastic job's work more GPUs do not speed up "
                   "(Amdahl's law)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  replay
      ->add_option("--resize-overhead", rf.resize_overhead,
                   "With --elastic: the seconds of no progress each resize costs a job (its "
                   "checkpoint and restart)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  replay->add_flag("--right-size", rf.right_size,
                   "Run each policy again with every job of one GPU or less asking for what it "
                   "uses plus --margin (its utilization from the trace, else drawn from the use "
                   "model: --use-mean, --use-concentration), and compare");
  replay
      ->add_option("--use-mean", rf.use.mean,
                   "Use model: the mean share of what it was given a job uses, where the trace "
                   "does not say (0..1)")
      ->capture_default_str();
  replay
      ->add_option("--use-concentration", rf.use.concentration,
                   "Use model: the Beta distribution's concentration (higher: uses closer to the "
                   "mean)")
      ->capture_default_str();
  replay->add_option("--margin", rf.sizing.margin, "Right-sizing: headroom over the measured use")
      ->capture_default_str();
  replay
      ->add_option("--granularity", rf.sizing.granularity_milli,
                   "Right-sizing: requests rounded up to this many thousandths of a GPU")
      ->capture_default_str();
  replay->add_option("--samples", rf.samples, "Points of each time series")
      ->check(CLI::Range(2, 100000))
      ->capture_default_str();
  replay->callback([&action, &out, &err, st] {
    action = [&out, &err, st] { return RunReplayCmd(st->replay_flags, st->replay, out, err); };
  });
  return st;
}

}  // namespace tessera::cli
