#include "tessera/cli/slurm_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/cli/output.h"
#include "tessera/core/gpu.h"
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
};

int RunAcct(const SlurmFlags& f, std::ostream& out, std::ostream& err) {
  auto records = slurm::ReadAccounting(f.state_dir, f.jobs);
  if (!records.ok()) {
    err << "tessera slurm acct: " << records.status().message() << "\n";
    return kExitFailure;
  }
  const Format format = *ParseFormat(f.output);
  if (format != Format::kTable) {
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (const auto& r : *records) all.push_back(nlohmann::ordered_json::parse(r.dump()));
    EmitStructured(all, format, out);
    return kExitOk;
  }
  // One row per job and GPU, as sacct prints one per step; with what it used of what it held, as
  // seff does for CPUs: its busy time of its share (or whole GPU), its peak of its memory limit.
  Table t({"JOB", "UID", "START", "ELAPSED", "GPU", "SHARE", "GPU-TIME", "UTIL", "PEAK-MEM",
           "MEM-LIMIT", "BUSY", "MEM-USED"});
  // A requeued job's earlier runs (an automatic trial) first, each a run of its own.
  std::vector<nlohmann::json> runs;
  for (const auto& r : *records) {
    if (r.contains("earlier_runs") && r["earlier_runs"].is_array())
      for (const auto& e : r["earlier_runs"])
        if (e.is_object() && e.contains("gpus") && e["gpus"].is_array()) runs.push_back(e);
    runs.push_back(r);
  }
  for (const auto& r : runs) {
    const int64_t started = r.value("started", int64_t{0}), ended = r.value("ended", int64_t{0});
    const double share = r.value("share_percent", 0.0);
    auto busy_of_held = [&](const nlohmann::json& g) -> std::string {
      if (!g.contains("utilization_percent")) return "-";
      const double held = share > 0 ? share : 100.0;
      return fmt::format("{:.0f}%",
                         std::min(100.0, 100 * g["utilization_percent"].get<double>() / held));
    };
    auto memory_used = [](const nlohmann::json& g) -> std::string {
      if (!g.contains("peak_memory_bytes") || g.value("memory_limit_bytes", uint64_t{0}) == 0)
        return "-";
      return fmt::format("{:.0f}%", 100.0 * g["peak_memory_bytes"].get<double>() /
                                        g["memory_limit_bytes"].get<double>());
    };
    for (const auto& g : r["gpus"]) {
      auto bytes = [&](const char* key) -> std::string {
        if (!g.contains(key)) return "-";
        const uint64_t b = g[key].get<uint64_t>();
        return b == 0 && std::string(key) == "memory_limit_bytes" ? "none" : core::FormatBytes(b);
      };
      t.AddRow(
          {std::to_string(r.value("job_id", 0u)), std::to_string(r.value("uid", 0u)),
           LocalTimestamp(static_cast<double>(started)),
           ElapsedClock(static_cast<double>(std::max<int64_t>(0, ended - started))),
           std::to_string(g.value("index", -1)), share > 0 ? fmt::format("{:g}%", share) : "whole",
           g.contains("gpu_time_s") ? ElapsedClock(std::floor(g["gpu_time_s"].get<double>())) : "-",
           g.contains("utilization_percent")
               ? fmt::format("{:.0f}%", g["utilization_percent"].get<double>())
               : "-",
           bytes("peak_memory_bytes"), bytes("memory_limit_bytes"), busy_of_held(g),
           memory_used(g)});
    }
  }
  t.Print(out);
  // What a trial recommends, how "auto" sized a job and whether it outgrew it, under the table.
  for (const auto& r : runs) {
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
  state(acct);
  acct->add_option("-o,--output", f.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  acct->callback([&, s] { action = [&, s] { return RunAcct(f, out, err); }; });
  CLI::App* exporter = slurm->add_subcommand(
      "exporter", "Serve the running jobs' GPU use on this node as Prometheus metrics");
  state(exporter);
  exporter->add_option("--listen", f.listen, "host:port for /metrics and /healthz (:0 any port)")
      ->capture_default_str();
  exporter->callback([&, s] { action = [&, s] { return RunExporter(f, err); }; });
  return s;
}

}  // namespace tessera::cli
