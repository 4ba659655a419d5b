#include "tessera/cli/slurm_cmd.h"

#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/cli/output.h"
#include "tessera/cli/slurm_eff_cmd.h"
#include "tessera/cli/when.h"
#include "tessera/core/gpu.h"
#include "tessera/core/users.h"
#include "tessera/net/http.h"
#include "tessera/slurm/node.h"
#include "tessera/slurm/step.h"

namespace tessera::cli {
namespace {

struct SlurmFlags {
  std::string state_dir = "/var/lib/tessera-slurm";
  std::string output = "table";
  std::vector<uint32_t> jobs;
  std::string listen = "127.0.0.1:9410";
  std::string user, since, sort;
  bool reverse = false;
};

// One row of `tessera slurm acct`: a run of a job on one GPU, with its figures (nullopt: not
// measured).
struct AcctRow {
  const nlohmann::json* run;
  const nlohmann::json* gpu;
  double share;  // percent; 0: whole GPU
  std::optional<double> gpu_time, util, busy, idle, peak, limit, mem_used;
};

AcctRow RowOf(const nlohmann::json& run, const nlohmann::json& g) {
  AcctRow row{&run, &g, run.value("share_percent", 0.0), {}, {}, {}, {}, {}, {}, {}};
  auto number = [&](const char* key) -> std::optional<double> {
    const auto it = g.find(key);
    if (it == g.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  const double held = row.share > 0 ? row.share : 100.0;  // percent of the GPU
  row.gpu_time = number("gpu_time_s");
  row.util = number("utilization_percent");
  if (row.util) row.busy = std::min(100.0, 100 * *row.util / held);
  // The GPU time it held and left idle: what it held over its run less what it used of that.
  if (const slurm::GpuHeld use = slurm::HeldOf(run, g); use.busy_s)
    row.idle = use.held_s - *use.busy_s;
  row.peak = number("peak_memory_bytes");
  row.limit = number("memory_limit_bytes");
  if (row.peak && row.limit && *row.limit > 0) row.mem_used = 100 * *row.peak / *row.limit;
  return row;
}

// The figure `--sort` orders by; nullopt sorts last.
std::optional<double> SortKey(const AcctRow& r, const std::string& field) {
  if (field == "job") return r.run->value("job_id", 0.0);
  if (field == "start") return r.run->value("started", 0.0);
  if (field == "end") return r.run->value("ended", 0.0);
  if (field == "elapsed") return r.run->value("ended", 0.0) - r.run->value("started", 0.0);
  if (field == "gpu_time") return r.gpu_time;
  if (field == "util") return r.util;
  if (field == "busy") return r.busy;
  if (field == "idle") return r.idle;
  if (field == "peak_mem") return r.peak;
  return r.mem_used;  // mem_used
}

int RunAcct(const SlurmFlags& f, std::ostream& out, std::ostream& err) {
  std::optional<uid_t> only_uid;
  if (!f.user.empty()) {
    if (const passwd* pw = getpwnam(f.user.c_str()); pw != nullptr) {
      only_uid = pw->pw_uid;
    } else if (f.user.find_first_not_of("0123456789") == std::string::npos && f.user.size() < 11) {
      only_uid = static_cast<uid_t>(std::stoul(f.user));
    } else {
      err << "tessera slurm acct: --user " << f.user << ": no such user on this machine\n";
      return kExitBadInput;
    }
  }
  std::optional<double> since;
  if (!f.since.empty()) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    since = ParseWhen(f.since, now);
    if (!since) {
      err << "tessera slurm acct: --since " << f.since << ": expected " << kWhenForms << "\n";
      return kExitBadInput;
    }
  }
  auto records = slurm::ReadAccounting(f.state_dir, f.jobs);
  if (!records.ok()) {
    err << "tessera slurm acct: " << records.status().message() << "\n";
    return kExitFailure;
  }
  // A requeued job's earlier runs (an automatic trial) first, each a run of its own; only the
  // user's and those that ended since --since.
  auto wanted = [&](const nlohmann::json& r) {
    return (!only_uid || r.value("uid", uid_t(-1)) == *only_uid) &&
           (!since || r.value("ended", 0.0) >= *since);
  };
  std::vector<const nlohmann::json*> runs;
  for (const auto& r : *records) {
    if (r.contains("earlier_runs") && r["earlier_runs"].is_array())
      for (const auto& e : r["earlier_runs"])
        if (e.is_object() && e.contains("gpus") && e["gpus"].is_array() && wanted(e))
          runs.push_back(&e);
    if (wanted(r)) runs.push_back(&r);
  }
  std::vector<AcctRow> rows;
  for (const nlohmann::json* r : runs) {
    for (const auto& g : (*r)["gpus"])
      if (g.is_object()) rows.push_back(RowOf(*r, g));
  }
  if (!f.sort.empty()) {
    // Largest first (latest, for times), those without the figure last; --reverse the other way.
    SortByFigure(
        rows, [&](const AcctRow& r) { return SortKey(r, f.sort); }, f.reverse);
  }
  const Format format = *ParseFormat(f.output);
  if (format != Format::kTable) {
    // The records as the epilog wrote them (a requeued job's earlier runs in it), in the order of
    // their first row, each measured GPU with the GPU time it held idle (idle_gpu_s).
    std::map<const nlohmann::json*, const nlohmann::json*> record_of;
    for (const auto& r : *records) {
      record_of[&r] = &r;
      if (r.contains("earlier_runs") && r["earlier_runs"].is_array())
        for (const auto& e : r["earlier_runs"]) record_of[&e] = &r;
    }
    auto with_idle = [](const nlohmann::json& run) {
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(run.dump());
      const nlohmann::json& gpus = run["gpus"];
      for (size_t i = 0; gpus.is_array() && i < gpus.size(); ++i) {
        if (!gpus[i].is_object()) continue;
        if (const auto idle = RowOf(run, gpus[i]).idle) j["gpus"][i]["idle_gpu_s"] = *idle;
      }
      return j;
    };
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    std::set<const nlohmann::json*> done;
    for (const AcctRow& row : rows) {
      const nlohmann::json* r = record_of.at(row.run);
      if (!done.insert(r).second) continue;
      nlohmann::ordered_json j = with_idle(*r);
      if (r->contains("earlier_runs") && (*r)["earlier_runs"].is_array()) {
        j["earlier_runs"] = nlohmann::ordered_json::array();
        for (const auto& e : (*r)["earlier_runs"]) {
          j["earlier_runs"].push_back(e.is_object() && e.contains("gpus")
                                          ? with_idle(e)
                                          : nlohmann::ordered_json::parse(e.dump()));
        }
      }
      all.push_back(std::move(j));
    }
    EmitStructured(all, format, out);
    return kExitOk;
  }
  // One row per job and GPU, as sacct prints one per step; with what it used of what it held, as
  // seff does for CPUs: its busy time of its share (or whole GPU), the GPU time it held idle, its
  // peak of its memory limit.
  Table t({"JOB", "USER", "START", "ELAPSED", "GPU", "SHARE", "GPU-TIME", "UTIL", "PEAK-MEM",
           "MEM-LIMIT", "BUSY", "IDLE", "MEM-USED"});
  // Its user's name, as sacct shows it (the uid where this machine has no such user).
  std::map<uid_t, std::string> names;
  auto user_name = [&](uid_t uid) -> const std::string& {
    auto [it, added] = names.try_emplace(uid);
    if (added) it->second = core::LoginName(uid).value_or(std::to_string(uid));
    return it->second;
  };
  auto percent = [](const std::optional<double>& v) -> std::string {
    return v ? fmt::format("{:.0f}%", *v) : "-";
  };
  auto clock = [](const std::optional<double>& v) -> std::string {
    return v ? ElapsedClock(std::floor(*v)) : "-";
  };
  for (const AcctRow& row : rows) {
    const nlohmann::json& r = *row.run;
    const nlohmann::json& g = *row.gpu;
    const int64_t started = r.value("started", int64_t{0}), ended = r.value("ended", int64_t{0});
    auto bytes = [&](const std::optional<double>& v, bool limit) -> std::string {
      if (!v) return "-";
      return *v == 0 && limit ? "none" : core::FormatBytes(static_cast<uint64_t>(*v));
    };
    t.AddRow({std::to_string(r.value("job_id", 0u)), user_name(r.value("uid", uid_t{0})),
              LocalTimestamp(static_cast<double>(started)),
              ElapsedClock(static_cast<double>(std::max<int64_t>(0, ended - started))),
              std::to_string(g.value("index", -1)),
              row.share > 0 ? fmt::format("{:g}%", row.share) : "whole", clock(row.gpu_time),
              percent(row.util), bytes(row.peak, false), bytes(row.limit, true), percent(row.busy),
              clock(row.idle), percent(row.mem_used)});
  }
  t.Print(out);
  // What a trial recommends, how "auto" sized a job and whether it outgrew it, under the table.
  for (const nlohmann::json* run : runs) {
    const nlohmann::json& r = *run;
    // A share whose launches waited for the GPU: what it would have used (seff's question, asked
    // of what it wanted rather than what it was let use).
    for (const auto& g : r["gpus"]) {
      if (!g.is_object() || !g.contains("held_back_percent") || !g.contains("demand_percent") ||
          !g["held_back_percent"].is_number() || !g["demand_percent"].is_number()) {
        continue;
      }
      out << fmt::format(
          "job {} GPU {}: its launches waited for the GPU {:.0f}% of its run: it would have used "
          "{:.0f}% of it\n",
          r.value("job_id", 0u), g.value("index", -1), g["held_back_percent"].get<double>(),
          g["demand_percent"].get<double>());
    }
    for (const char* key : {"sizing", "advice", "outgrew"}) {
      if (r.contains(key) && r[key].is_string())
        out << "job " << r.value("job_id", 0u) << ": " << r[key].get<std::string>() << "\n";
    }
  }
  return kExitOk;
}

int RunExporter(const SlurmFlags& f, std::ostream& err) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string hostname = host, state_dir = f.state_dir;
  net::HttpServerOptions o;
  o.tcp_address = f.listen;
  auto srv = net::HttpServer::Start(o, [&](const net::HttpRequest& req) {
    net::HttpResponse r;
    if (req.method != "GET") {
      r.status = 405;
      r.body = "only GET\n";
    } else if (req.path == "/metrics") {
      r.content_type = "text/plain; version=0.0.4";
      r.body = slurm::NodeMetrics(state_dir, hostname, slurm::BootTime());
    } else if (req.path == "/healthz") {
      r.body = "ok\n";
    } else {
      r.status = 404;
      r.body = "/metrics or /healthz\n";
    }
    return r;
  });
  if (!srv.ok()) {
    err << "tessera slurm exporter: " << srv.status().message() << "\n";
    return kExitFailure;
  }
  spdlog::info("tessera slurm exporter: /metrics on port {} for the jobs in {}", (*srv)->tcp_port(),
               state_dir);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("signal {}: stopping", sig);
  (*srv)->Stop();
  return kExitOk;
}

}  // namespace

std::shared_ptr<void> AddSlurmCommands(CLI::App& app, std::function<int()>& action,
                                       std::ostream& out, std::ostream& err) {
  auto s = std::make_shared<SlurmFlags>();
  SlurmFlags& f = *s;
  CLI::App* slurm = app.add_subcommand(
      "slurm", "What the Slurm plugin (tessera-spank.so) records on a node (docs/slurm.md)");
  slurm->require_subcommand(1);
  auto state = [&](CLI::App* c) {
    c->add_option("--state-dir", f.state_dir, "The plugin's state_dir= in plugstack.conf")
        ->capture_default_str();
  };
  CLI::App* acct = slurm->add_subcommand(
      "acct", "Ended jobs' GPU time, utilization and peak GPU memory on this node, per GPU");
  acct->add_option("jobs", f.jobs, "Slurm job ids (default: every job recorded)");
  acct->add_option("--user", f.user, "Only this user's jobs (a name or a uid)");
  acct->add_option("--since", f.since,
                   "Only jobs that ended since: a duration ago (90m, 7d), a date (2026-11-01), "
                   "a date and time (2026-11-01T08:00) or epoch seconds (default: all)");
  CLI::Option* sort =
      acct->add_option("--sort", f.sort,
                       "Order the rows by job, start, end, elapsed, gpu_time, util, busy, idle, "
                       "peak_mem or mem_used - largest (latest) first, unmeasured last (--sort "
                       "idle: the GPU time held and left idle)")
          ->check(CLI::IsMember({"job", "start", "end", "elapsed", "gpu_time", "util", "busy",
                                 "idle", "peak_mem", "mem_used"})
                      .description(""))  // the fields are in the help: a man page breaks them
          ->type_name("FIELD");
  acct->add_flag("--reverse", f.reverse, "With --sort: the other way")->needs(sort);
  state(acct);
  acct->add_option("-o,--output", f.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  acct->callback([&, s] { action = [&, s] { return RunAcct(f, out, err); }; });
  auto eff = AddSlurmEff(*slurm, action, out, err);
  CLI::App* exporter = slurm->add_subcommand(
      "exporter", "Serve the running jobs' GPU use on this node as Prometheus metrics");
  state(exporter);
  exporter->add_option("--listen", f.listen, "host:port for /metrics and /healthz (:0 any port)")
      ->capture_default_str();
  exporter->callback([&, s] { action = [&, s] { return RunExporter(f, err); }; });
  return std::make_shared<std::pair<std::shared_ptr<SlurmFlags>, std::shared_ptr<void>>>(s, eff);
}

}  // namespace tessera::cli
