// `tessera server` (the daemon), its accounting and top views, and the wiring of every client verb
// (the job verbs are in jobs_cmd.cc, what they share in remote.h).
#include "tessera/cli/client_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/cli/directives.h"
#include "tessera/cli/output.h"
#include "tessera/cli/remote.h"
#include "tessera/cli/when.h"
#include "tessera/core/gpu.h"
#include "tessera/net/http.h"
#include "tessera/server/socket_path.h"

namespace tessera::cli {
namespace {

using namespace remote;  // NOLINT: this file wires remote's verbs

// The job spec the submit options describe; on bad input says why on `err` and returns nullopt.

// `acct --jobs`: one line per job that ended in the period or ran in it, like sacct, with the
// columns --format names, in the order --sort names.
int AcctJobs(State& s, net::HttpClient& c, const json& acct, double since, double until,
             std::ostream& out, std::ostream& err) {
  static const std::vector<std::string> kFields = {
      "id",          "name",    "user",      "state",   "submit",
      "start",       "end",     "elapsed",   "wait",    "gpus",
      "gpu_util",    "gpu_mem", "gpu_hours", "gpu_eff", "idle_gpu_hours",
      "gpu_mem_eff", "cpu_eff", "mem_eff",   "exit",    "reason"};
  // Fields from the job's efficiency (as `tessera eff` shows it), asked of the server only when
  // wanted: a server older than them refuses the parameter.
  static const std::set<std::string> kEfficiency = {"gpu_hours",   "gpu_eff", "idle_gpu_hours",
                                                    "gpu_mem_eff", "cpu_eff", "mem_eff"};
  auto known = [&](std::string f, const char* flag) -> std::optional<std::string> {
    for (char& ch : f) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (std::find(kFields.begin(), kFields.end(), f) != kFields.end()) return f;
    err << "tessera: " << flag << ": unknown field '" << f << "' ("
        << fmt::format("{}", fmt::join(kFields, ", ")) << ")\n";
    return std::nullopt;
  };
  std::vector<std::string> fields;
  for (size_t at = 0; at <= s.acct_format.size();) {
    const size_t comma = s.acct_format.find(',', at);
    auto f = known(s.acct_format.substr(at, comma == std::string::npos ? comma : comma - at),
                   "--format");
    if (!f) return kExitBadInput;
    fields.push_back(*std::move(f));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  std::string sort;
  if (!s.acct_sort.empty()) {
    auto f = known(s.acct_sort, "--sort");
    if (!f) return kExitBadInput;
    sort = *std::move(f);
  }
  bool efficiency = kEfficiency.contains(sort);
  for (const std::string& f : fields) efficiency = efficiency || kEfficiency.contains(f);
  // Whose: --user, else every user's for an admin (as the summary's scope says), else your own.
  std::string user = s.acct_user;
  if (user.empty() && acct.value("scope", "") != "every user's jobs") {
    const std::string scope = acct.value("scope", "");
    user = scope.substr(0, scope.rfind("'s jobs"));
  }
  int code = kExitOk;
  std::string target = "/v1/jobs?arrays=expand&env=false";
  if (efficiency) target += "&efficiency=true";
  if (!user.empty()) target += "&user=" + user;
  auto all = ListJobs(c, target, 0, err, &code);
  if (!all) return code;
  auto number = [](const json& j, const char* k) {
    return j.is_object() && j.contains(k) && j[k].is_number()
               ? std::optional<double>(j[k].get<double>())
               : std::nullopt;
  };
  // `j[k]` read in place (json::value copies: a page of a thousand jobs), null when absent.
  static const json kNone;
  auto member = [](const json& j, const char* k) -> const json& {
    return j.is_object() && j.contains(k) ? j[k] : kNone;
  };
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // One field of one job: its value (a number, text or null where not known) and its text.
  auto field = [&](const std::string& f, const json& j) -> std::pair<json, std::string> {
    const auto started = number(j, "started_at"), ended = number(j, "ended_at");
    const json& e = member(j, "efficiency");
    auto known_or_dash = [](std::optional<double> x,
                            const char* form) -> std::pair<json, std::string> {
      if (!x) return {nullptr, "-"};
      return {*x, fmt::format(fmt::runtime(form), *x)};
    };
    if (f == "id") {
      const std::string ref = JobRef(j);
      return {ref, ref};
    }
    if (f == "name" || f == "user" || f == "state" || f == "reason") {
      const std::string v = j.value(f == "user" ? "owner" : f, "");
      return {v, v};
    }
    if (f == "submit" || f == "start" || f == "end") {
      const auto t = number(j, f == "submit"  ? "submitted_at"
                               : f == "start" ? "started_at"
                                              : "ended_at");
      return {t ? json(*t) : json(nullptr), t ? LocalTimestamp(*t) : "-"};
    }
    if (f == "elapsed") {
      const double v = started ? (ended ? *ended : now) - *started : 0;
      return {v, ElapsedClock(v)};
    }
    if (f == "wait") {
      const auto sub = number(j, "submitted_at");
      const double w = sub ? (started ? *started : ended ? *ended : now) - *sub : 0;
      return {w, ElapsedClock(std::max(0.0, w))};
    }
    if (f == "gpus") {
      const size_t n = member(member(j, "placement"), "gpus").size();
      return {n, std::to_string(n)};
    }
    if (f == "gpu_util" || f == "gpu_mem") {
      const json& u = member(j, "usage");
      if (f == "gpu_util") return known_or_dash(number(u, "gpu_utilization_pct"), "{:.0f}%");
      return known_or_dash(number(u, "gpu_peak_memory_mib"), "{:.0f}MiB");
    }
    // GPU-hours from what it held and for how long (the efficiency's own gpu_hours is rounded to
    // thousandths: a job of seconds says 0, and would not rank).
    const auto gpus = number(e, "gpus"), seconds = number(e, "elapsed_s");
    const auto held =
        gpus && seconds ? std::optional<double>(*gpus * *seconds / 3600) : std::nullopt;
    if (f == "gpu_hours") return known_or_dash(held, "{:.4f}");
    if (f == "gpu_eff") return known_or_dash(number(e, "gpu_busy_pct"), "{:.0f}%");
    if (f == "idle_gpu_hours") {
      // What it held and left idle: its GPU-hours times the part not busy, where measured.
      const auto busy = number(e, "gpu_busy_pct");
      return known_or_dash(
          held && busy ? std::optional<double>(*held * (1 - *busy / 100)) : std::nullopt, "{:.4f}");
    }
    if (f == "gpu_mem_eff") return known_or_dash(number(e, "gpu_memory_pct"), "{:.0f}%");
    if (f == "cpu_eff") return known_or_dash(number(e, "cpu_pct"), "{:.0f}%");
    if (f == "mem_eff") return known_or_dash(number(e, "memory_pct"), "{:.0f}%");
    // exit
    const auto x = number(j, "exit_code");
    return {x ? json(static_cast<int>(*x)) : json(nullptr),
            x ? std::to_string(static_cast<int>(*x)) : "-"};
  };
  struct Row {
    json row;
    std::vector<std::string> line;
    json key;  // --sort's field
  };
  std::vector<Row> rows;
  for (const json& j : *all) {
    const auto started = number(j, "started_at"), ended = number(j, "ended_at");
    const bool in_period = ended
                               ? *ended >= since && *ended <= until
                               : started && *started <= until && j.value("state", "") == "running";
    if (!in_period) continue;
    Row r;
    for (const std::string& f : fields) {
      auto [v, text] = field(f, j);
      r.row[f] = std::move(v);
      r.line.push_back(std::move(text));
    }
    // (ids as numbers: 9 before 10)
    if (!sort.empty())
      r.key = sort == "id" ? json(j.value("id", int64_t{0})) : field(sort, j).first;
    rows.push_back(std::move(r));
  }
  // --sort: numbers largest first (times latest first), text in order, --reverse the other way;
  // jobs without the figure last either way; ties stay in the server's order.
  if (!sort.empty()) {
    // Whether `a` comes before `b` by --sort's order alone (a field's keys are all of one kind).
    auto first = [](const json& a, const json& b) {
      return a.is_number() ? a.get<double>() > b.get<double>()
                           : a.get<std::string>() < b.get<std::string>();
    };
    std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
      if (a.key.is_null() || b.key.is_null()) return !a.key.is_null() && b.key.is_null();
      return s.acct_reverse ? first(b.key, a.key) : first(a.key, b.key);
    });
  }
  if (s.client.output == "json" || s.client.output == "yaml") {
    json listed = json::array();
    for (Row& r : rows) listed.push_back(std::move(r.row));
    Emit(listed, s.client.output, out);
  } else if (s.client.output == "csv") {
    out << CsvRow(fields);
    for (const Row& r : rows) out << CsvRow(r.line);
  } else {
    std::vector<std::string> header;
    for (std::string f : fields) {
      for (char& ch : f) ch = ch == '_' ? ' ' : static_cast<char>(std::toupper(ch));
      header.push_back(f);
    }
    Table t(header);
    for (const Row& r : rows) t.AddRow(r.line);
    t.Print(out);
  }
  return kExitOk;
}

// `tessera acct`: GPU-hours, jobs, waits and failures over a period, per user, group or model.
// A percentage of an accounting line ("41.5%"; in CSV the bare number); "-" (CSV: empty) where
// nothing was measured.
std::string Pct(const json& line, const char* key, bool csv) {
  const json v = line.value(key, json());
  if (!v.is_number()) return csv ? "" : "-";
  return fmt::format(fmt::runtime(csv ? "{:.1f}" : "{:.1f}%"), v.get<double>());
}

int RunAcct(State& s, std::ostream& out, std::ostream& err) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto since = ParseWhen(s.since, now), until = ParseWhen(s.until, now);
  for (const auto& [flag, text, v] :
       {std::tuple{"--since", s.since, since}, std::tuple{"--until", s.until, until}}) {
    if (!v) {
      err << "tessera: " << flag << " " << text
          << ": expected now, today, yesterday, midnight, noon, a duration ago (90m, 7d, 2w, "
             "now-7days), a date (2026-11-01), a date and time (2026-11-01T08:00) or seconds "
             "since the epoch\n";
      return kExitBadInput;
    }
  }
  if (*until < *since) {
    err << "tessera: --until " << s.until << " is before --since " << s.since << "\n";
    return kExitBadInput;
  }
  net::HttpClient c = s.client.Client();
  int code = kExitOk;
  std::string target = fmt::format("/v1/acct?since={:.3f}&until={:.3f}", *since, *until);
  if (!s.acct_user.empty()) target += "&user=" + s.acct_user;
  auto r = Call(c, "GET", target, "", err, &code);  // also who may see whose accounting
  if (!r) return code;
  if (s.acct_jobs) return AcctJobs(s, c, *r, *since, *until, out, err);
  const json& lines = (*r)["by_" + s.by];
  if (s.client.output == "json" || s.client.output == "yaml") {
    Emit(*r, s.client.output, out);
    return kExitOk;
  }
  const std::vector<std::string> header = {s.by == "user"    ? "USER"
                                           : s.by == "group" ? "GROUP"
                                                             : "MODEL",
                                           "JOBS",
                                           "SUCCEEDED",
                                           "FAILED",
                                           "CANCELLED",
                                           "RUNNING",
                                           "GPU-HOURS",
                                           "WHOLE",
                                           "FRACTIONAL",
                                           "STARTS",
                                           "MEAN WAIT",
                                           "MAX WAIT",
                                           "GPU BUSY",
                                           "GPU MEM USED"};
  const bool csv_out = s.client.output == "csv";
  auto row = [csv_out](const json& l) {
    const char* secs = csv_out ? "{:.3f}" : "{:.1f}s";
    return std::vector<std::string>{l.value("key", ""),
                                    std::to_string(l.value("jobs", 0)),
                                    std::to_string(l.value("succeeded", 0)),
                                    std::to_string(l.value("failed", 0)),
                                    std::to_string(l.value("cancelled", 0)),
                                    std::to_string(l.value("running", 0)),
                                    fmt::format("{:.4f}", l.value("gpu_hours", 0.0)),
                                    fmt::format("{:.4f}", l.value("whole_gpu_hours", 0.0)),
                                    fmt::format("{:.4f}", l.value("fractional_gpu_hours", 0.0)),
                                    std::to_string(l.value("started", 0)),
                                    fmt::format(fmt::runtime(secs), l.value("mean_wait_s", 0.0)),
                                    fmt::format(fmt::runtime(secs), l.value("max_wait_s", 0.0)),
                                    Pct(l, "gpu_busy_pct", csv_out),
                                    Pct(l, "gpu_memory_used_pct", csv_out)};
  };
  if (csv_out) {
    std::vector<std::string> h = header;
    for (std::string& x : h) {
      for (char& ch : x) ch = ch == ' ' || ch == '-' ? '_' : static_cast<char>(std::tolower(ch));
    }
    h[6] = "gpu_hours";
    h[7] = "whole_gpu_hours";
    h[8] = "fractional_gpu_hours";
    h[10] = "mean_wait_s";
    h[11] = "max_wait_s";
    h[12] = "gpu_busy_pct";
    h[13] = "gpu_memory_used_pct";
    out << CsvRow(h);
    for (const json& l : lines) out << CsvRow(row(l));
    return kExitOk;
  }
  auto when = [](double t) {
    std::time_t at = static_cast<std::time_t>(t);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::localtime(&at));
    return std::string(buf);
  };
  out << fmt::format("{} from {} to {}\n\n", (*r).value("scope", ""), when(*since), when(*until));
  Table t(header);
  for (const json& l : lines) t.AddRow(row(l));
  std::vector<std::string> total = row((*r)["total"]);
  total[0] = "(total)";
  t.AddRow(total);
  t.Print(out);
  // Where the idle time went: the measured jobs that left the most of what they held idle.
  const json& idle = r->value("most_idle", json::array());
  if (idle.is_array() && !idle.empty()) {
    out << "\nthe jobs that left the most GPU time idle (one: tessera eff ID; every job: tessera "
           "acct --jobs --format id,user,name,gpu_hours,gpu_eff,idle_gpu_hours --sort "
           "idle_gpu_hours)\n";
    Table most({"ID", "USER", "NAME", "GPU-HOURS", "GPU BUSY", "IDLE GPU-HOURS"});
    for (const json& x : idle) {
      most.AddRow({std::to_string(x.value("id", int64_t{0})), x.value("owner", ""),
                   x.value("name", ""), fmt::format("{:.4f}", x.value("gpu_hours", 0.0)),
                   Pct(x, "gpu_busy_pct", false),
                   fmt::format("{:.4f}", x.value("idle_gpu_hours", 0.0))});
    }
    most.Print(out);
  }
  return kExitOk;
}

// hold / release: queued jobs, or every queued task of an array.

int RunTop(State& s, std::ostream& out, std::ostream& err) {
  net::HttpClient c = s.client.Client();
  const bool tty = isatty(STDOUT_FILENO) && &out == &std::cout;
  for (;;) {
    int code = kExitOk;
    auto info = Call(c, "GET", "/v1/info", "", err, &code);
    if (!info) return code;
    auto gpus = Call(c, "GET", "/v1/gpus", "", err, &code);
    if (!gpus) return code;
    auto jobs = Call(c, "GET", "/v1/jobs?state=running,queued", "", err, &code);
    if (!jobs) return code;
    if (s.client.output != "table") {
      Emit(json{{"info", *info}, {"gpus", (*gpus)["gpus"]}, {"jobs", (*jobs)["jobs"]}},
           s.client.output, out);
      return kExitOk;
    }
    if (tty) out << "\x1b[H\x1b[2J";
    const json conf = info->value("confinement", json::object());
    out << fmt::format("tessera {} on {}{}{}  -  {} running, {} queued\n\n",
                       (*info)["version"].get<std::string>(),
                       (*info)["hostname"].get<std::string>(),
                       (*info)["simulated"].get<bool>() ? "  [SIMULATED GPUs]" : "",
                       conf.value("mode", "none") == "none"
                           ? "  [UNCONFINED: jobs can open any GPU; " +
                                 conf.value("reason", std::string("unknown")) + "]"
                           : "",
                       (*info)["running"].get<int>(), (*info)["queued"].get<int>());
    // Allocation (what jobs were given) beside the driver's readings (what the GPU is doing; "-"
    // when the driver does not tell, as on a simulated machine).
    auto reading = [](const json& v, const char* format, double scale = 1) {
      return v.is_number() ? fmt::format(fmt::runtime(format), v.get<double>() * scale)
                           : std::string("-");
    };
    Table g({"GPU", "MODEL", "HEALTH", "ALLOCATED", "MEMORY ALLOCATED", "UTIL", "TEMP", "POWER",
             "MEM USED", "JOBS"});
    for (const json& x : (*gpus)["gpus"]) {
      const int milli = x["allocated_milli"].get<int>();
      const int bar = milli * 20 / 1000;
      std::string meter = "[" + std::string(bar, '#') + std::string(20 - bar, '.') + "]";
      std::vector<std::string> ids;
      for (const json& id : x["jobs"]) ids.push_back(std::to_string(id.get<int64_t>()));
      g.AddRow(
          {std::to_string(x["index"].get<int>()), x["model"].get<std::string>(),
           (x["healthy"].get<bool>() ? std::string("ok")
                                     : "UNHEALTHY: " + x["health_reason"].get<std::string>()) +
               (x.value("sharing", "") == "mps" ? " (MPS)" : ""),
           fmt::format("{} {:3d}%", meter, milli / 10),
           fmt::format("{} / {}",
                       core::FormatBytes(
                           static_cast<uint64_t>(x["allocated_memory_mib"].get<int64_t>()) << 20),
                       core::FormatBytes(x["memory_bytes"].get<uint64_t>())),
           reading(x.value("utilization", json()), "{:.0f}%", 100),
           reading(x.value("temperature_celsius", json()), "{:.0f}C"),
           reading(x.value("power_watts", json()), "{:.0f}W"),
           x.value("memory_used_bytes", json()).is_number()
               ? core::FormatBytes(x["memory_used_bytes"].get<uint64_t>())
               : std::string("-"),
           fmt::format("{}", fmt::join(ids, ","))});
    }
    g.Print(out);
    out << "\n";
    JobsTable((*jobs)["jobs"], out);
    out << std::flush;
    if (s.once) return kExitOk;
    std::this_thread::sleep_for(std::chrono::duration<double>(s.interval));
  }
}

}  // namespace

// A job id on the command line: a positive whole number, or a message that says so ("job id 'abc'
// is not a positive whole number") instead of CLI11's range text.
CLI::Validator JobId() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        auto digits = [](std::string_view d, size_t max) {
          return !d.empty() && d.size() <= max &&
                 std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
        };
        const size_t us = v.find('_');
        const std::string job = v.substr(0, us);
        if (!digits(job, 18) || std::stoll(job) <= 0 ||
            (us != std::string::npos && !digits(std::string_view(v).substr(us + 1), 7))) {
          return "job id '" + v +
                 "' is not a job (a positive whole number) or an array's task "
                 "(12_3)";
        }
        return "";
      },
      "ID");
}

std::shared_ptr<void> AddClientCommands(CLI::App& app, std::function<int()>& action,
                                        std::ostream& out, std::ostream& err,
                                        std::string_view only) {
  // Only the one named, when told (the small program: the others' options are never built).
  auto want = [only](std::string_view name) { return only.empty() || only == name; };
  auto s = std::make_shared<State>();
  State& st = *s;

  if (want("submit")) {
    CLI::App* sub = app.add_subcommand(
        "submit",
        "Submit a job: tessera submit [--gpus N|MIN-MAX | --gpu-mem 10GiB --gpu-share 30%] -- cmd "
        "args");
    AddSubmitOptions(sub, st);
    sub->add_flag("--parsable", st.parsable,
                  "Print only the job's id (an array's: its id), as sbatch --parsable, for "
                  "scripts: id=$(tessera submit --parsable -- ...)");
    st.client.AddTo(sub);
    st.submit_app = sub;
    sub->callback([&, s] { action = [&, s] { return RunSubmit(*s, out, err); }; });
  }

  if (want("run")) {
    CLI::App* run = app.add_subcommand(
        "run",
        "Submit a job, wait for it and stream its output; exits with its exit code (Ctrl-C "
        "cancels it), like srun");
    AddSubmitOptions(run, st);
    run->add_flag("-l,--rank-labels", st.label,
                  "Prefix each line of output with its process's rank (\"1: \"), as srun -l "
                  "(--label is a job's KEY=VALUE label here)");
    st.client.AddTo(run, false);
    run->callback([&, s] { action = [&, s] { return RunRun(*s, out, err); }; });
  }

  if (want("ls")) {
    CLI::App* ls = app.add_subcommand(
        "ls",
        "List your queued and running jobs, newest last (like squeue; --ended for the others)");
    auto* ls_state = ls->add_option("--state,-t,--states", st.states,
                                    "Only these states, comma-separated: queued, held, running, "
                                    "succeeded, failed, cancelled, preempted, lost, or all "
                                    "(default: the queued and running ones)");
    ls->add_flag("--ended", st.ls_ended,
                 "Ended jobs only: succeeded, failed and cancelled (like sacct)")
        ->excludes(ls_state);
    ls->add_option("--limit", st.limit, "At most this many, the newest (default 50)")
        ->check(CLI::Range(1, 100000));
    auto* ls_all = ls->add_flag("--all", st.ls_all, "Every user's jobs (default: your own)");
    ls->add_option("--user,-u", st.ls_user, "This user's jobs (default: your own)")
        ->excludes(ls_all);
    ls->add_flag("--expand", st.expand,
                 "Every task of an array on its own line (default: an array is one line with its "
                 "tasks counted by state)");
    st.client.AddTo(ls);
    ls->callback([&, s] { action = [&, s] { return RunLs(*s, out, err); }; });
  }

  if (want("show")) {
    CLI::App* show = app.add_subcommand("show", "Show one job with its events");
    show->add_option("id", st.id, "Job id (12, or an array's task 12_3)")
        ->required()
        ->check(JobId());
    st.client.AddTo(show);
    show->callback([&, s] { action = [&, s] { return RunShow(*s, out, err); }; });
  }

  if (want("eff")) {
    CLI::App* eff = app.add_subcommand(
        "eff", "What a job used of what it held: GPU time and memory, CPU, memory (as seff)");
    eff->add_option("id", st.id, "Job id (12, or an array's task 12_3)")
        ->required()
        ->check(JobId());
    st.client.AddTo(eff);
    eff->callback([&, s] { action = [&, s] { return RunEff(*s, out, err); }; });
  }

  if (want("logs")) {
    CLI::App* logs = app.add_subcommand("logs", "Print a job's output");
    logs->add_option("id", st.id, "Job id (12, or an array's task 12_3)")
        ->required()
        ->check(JobId());
    logs->add_flag("-f,--follow", st.follow, "Keep printing until the job ends");
    logs->add_flag("--stderr", st.stderr_stream, "The job's stderr instead of stdout");
    logs->add_flag("--raw", st.raw,
                   "The bytes as the job wrote them (by default control characters other than "
                   "newline, tab and carriage return are shown as \\xNN: a job's escape sequences "
                   "do not reach your terminal)");
    logs->add_option("--task", st.task,
                     "Of a job of several processes (--ntasks): this task's (default 0)")
        ->check(CLI::Range(0, 1023));
    st.client.AddTo(logs, false);
    logs->callback([&, s] { action = [&, s] { return RunLogs(*s, out, err); }; });
  }

  if (want("cancel")) {
    CLI::App* cancel =
        app.add_subcommand("cancel", "Cancel jobs (your own, or anyone's as an admin)");
    auto* cancel_ids =
        cancel->add_option("ids", st.ids, "Job ids: 12, an array (all its tasks) or one task, 12_3")
            ->check(JobId());
    // scancel's filters: every queued or running job that matches, instead of ids.
    cancel
        ->add_option("-u,--user", st.cancel_user,
                     "Every queued or running job of this user (scancel -u; yours unless you are "
                     "an admin)")
        ->excludes(cancel_ids);
    cancel
        ->add_option("-t,--state", st.cancel_states,
                     "With -u or --name: only jobs in these states, queued or running (scancel -t)")
        ->check(CLI::IsMember({"queued", "running", "queued,running", "running,queued"}));
    cancel
        ->add_option("-n,--name", st.cancel_name,
                     "Every queued or running job of yours (or -u's) with this name (scancel -n)")
        ->excludes(cancel_ids);
    cancel->add_flag("--force", st.force,
                     "Kill running jobs now (SIGKILL) instead of SIGTERM and their grace period");
    st.client.AddTo(cancel);
    cancel->callback([&, s] { action = [&, s] { return RunCancel(*s, out, err); }; });
  }

  if (want("priority")) {
    CLI::App* prio = app.add_subcommand(
        "priority",
        "Change a queued job's priority (yours up to your ceiling, or anyone's as an admin)");
    prio->add_option("id", st.id, "Job id (12, or an array's task 12_3)")
        ->required()
        ->check(JobId());
    prio->add_option("priority", st.priority, "The new priority, -1000..1000 (higher first)")
        ->required()
        ->check(CLI::Range(-1000, 1000));
    st.client.AddTo(prio);
    prio->callback([&, s] { action = [&, s] { return RunPriority(*s, out, err); }; });
  }

  if (want("hold") || want("release")) {
    for (bool hold : {true, false}) {
      CLI::App* h = app.add_subcommand(
          hold ? "hold" : "release",
          hold ? "Hold queued jobs: they keep their place in the queue but do not start"
               : "Release held jobs: they start in the place they held");
      h->add_option("ids", st.ids, "Job ids: 12, an array (its queued tasks) or one task, 12_3")
          ->required()
          ->check(JobId());
      st.client.AddTo(h);
      h->callback([&, s, hold] { action = [&, s, hold] { return RunHold(*s, hold, out, err); }; });
    }
  }

  if (want("acct")) {
    CLI::App* acct = app.add_subcommand(
        "acct",
        "Accounting: GPU-hours, jobs, failures and waits over a period, like sacct/sreport");
    acct->add_option("--since", st.since,
                     "From: a duration ago (90m, 7d), a date (2026-11-01), a date and time "
                     "(2026-11-01T08:00) or epoch seconds (default 7d)");
    acct->add_option("--until", st.until, "To: the same forms, or now (default now)");
    acct->add_option("--by", st.by, "One line per user, group (the owner's primary) or GPU model")
        ->check(CLI::IsMember({"user", "group", "model"}));
    acct->add_option("--user", st.acct_user,
                     "Only this user's jobs (yours are all you see unless you are an admin)");
    CLI::Option* jobs = acct->add_flag(
        "--jobs", st.acct_jobs,
        "One line per job that ended (or ran) in the period, like sacct, instead of sums");
    acct->add_option("--format", st.acct_format,
                     "With --jobs: the columns, comma-separated, of id, name, user, state, "
                     "submit, start, end, elapsed, wait, gpus, gpu_util, gpu_mem, gpu_hours, "
                     "gpu_eff, idle_gpu_hours, gpu_mem_eff, cpu_eff, mem_eff, exit, reason "
                     "(gpu_eff: busy of what it held, as tessera eff; idle_gpu_hours: the "
                     "GPU-hours it held and left idle)")
        ->capture_default_str();
    CLI::Option* sort =
        acct->add_option(
                "--sort", st.acct_sort,
                "With --jobs: order by this field - numbers largest first (times latest "
                "first), text in order, jobs without the figure last (--sort idle_gpu_hours: "
                "who left most GPU time idle)")
            ->needs(jobs);
    acct->add_flag("--reverse", st.acct_reverse, "With --sort: the other way")->needs(sort);
    acct->add_option("--socket", st.client.socket, "Server to talk to (as for the other commands)");
    acct->add_option("--token", st.client.token, "Bearer token for an https:// or tcp:// server");
    acct->add_option("--ca-cert", st.client.ca_cert, "CA certificate for an https:// server");
    acct->add_option("-o,--output", st.client.output, "Output format: table, json, yaml or csv")
        ->check(CLI::IsMember({"table", "json", "yaml", "csv"}));
    acct->callback([&, s] { action = [&, s] { return RunAcct(*s, out, err); }; });
  }

  if (want("top")) {
    CLI::App* top = app.add_subcommand("top", "A live view of the GPUs and jobs");
    top->add_flag("--once", st.once, "Print one screen and exit");
    top->add_option("--interval", st.interval, "Seconds between refreshes (default 1)")
        ->check(CLI::Range(0.1, 3600.0));
    st.client.AddTo(top);
    top->callback([&, s] { action = [&, s] { return RunTop(*s, out, err); }; });
  }
  return s;
}

}  // namespace tessera::cli
