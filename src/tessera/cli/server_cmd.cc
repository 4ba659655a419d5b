// `tessera server` (the daemon) and its client verbs: submit, ls, show, logs, cancel, top.
#include "tessera/cli/server_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/cli/output.h"
#include "tessera/core/gpu.h"
#include "tessera/server/http.h"
#include "tessera/server/server.h"

extern char** environ;

namespace tessera::cli {
namespace {

// Ordered: answers are shown with the server's key order, and go to EmitStructured as they are.
using json = nlohmann::ordered_json;

struct ClientFlags {
  std::string socket;
  std::string token;
  std::string ca_cert;
  std::string output = "table";
  void AddTo(CLI::App* c, bool with_output = true) {
    c->add_option("--socket", socket,
                  "Server to talk to: a unix socket path, https://host:port or tcp://host:port "
                  "(default $TESSERA_SOCKET, else " +
                      server::DefaultSocketPath() + ")");
    c->add_option("--token", token,
                  "Bearer token for an https:// or tcp:// server (default $TESSERA_TOKEN)");
    c->add_option("--ca-cert", ca_cert,
                  "CA certificate (PEM) that an https:// server's certificate must chain to "
                  "(default $TESSERA_CA_CERT, else the system's CAs)");
    if (with_output) {
      c->add_option("-o,--output", output, "Output format: table, json or yaml")
          ->check(CLI::IsMember({"table", "json", "yaml"}));
    }
  }
  std::string Endpoint() const {
    if (!socket.empty()) return socket;
    const char* e = getenv("TESSERA_SOCKET");
    return e && *e ? e : server::DefaultSocketPath();
  }
  std::string Token() const {
    if (!token.empty()) return token;
    const char* e = getenv("TESSERA_TOKEN");
    return e ? e : "";
  }
  std::string Ca() const {
    if (!ca_cert.empty()) return ca_cert;
    const char* e = getenv("TESSERA_CA_CERT");
    return e ? e : "";
  }
  server::HttpClient Client() const { return server::HttpClient(Endpoint(), Token(), Ca()); }
};

// One API call; on failure says why on `err` and returns nullopt with the exit code set.
std::optional<json> Call(server::HttpClient& c, const std::string& method,
                         const std::string& target, const std::string& body, std::ostream& err,
                         int* code, const std::string& idempotency_key = "") {
  auto r = c.Send(method, target, body, idempotency_key);
  if (!r.ok()) {
    err << "tessera: " << r.status().message() << "\n";
    *code = kExitFailure;
    return std::nullopt;
  }
  json j = json::parse(r->body, nullptr, false);
  if (r->status >= 400) {
    std::string msg =
        j.is_object() && j.contains("message") ? j["message"].get<std::string>() : r->body;
    err << "tessera: " << msg << "\n";
    *code = r->status < 500 ? kExitBadInput : kExitFailure;
    return std::nullopt;
  }
  if (j.is_discarded()) {
    err << "tessera: the server's answer is not JSON\n";
    *code = kExitFailure;
    return std::nullopt;
  }
  return j;
}

std::string Age(double since) {
  double s = std::max(0.0, static_cast<double>(std::time(nullptr)) - since);
  if (s < 120) return fmt::format("{:.0f}s", s);
  if (s < 7200) return fmt::format("{:.0f}m", s / 60);
  if (s < 172800) return fmt::format("{:.0f}h", s / 3600);
  return fmt::format("{:.0f}d", s / 86400);
}

std::string Resources(const json& spec) {
  const json r = spec.value("resources", json::object());
  std::string out;
  if (r.contains("gpus")) out = fmt::format("{} GPU", r["gpus"].get<int>());
  if (r.contains("gpu_share")) out += r["gpu_share"].get<std::string>();
  if (r.contains("gpu_memory"))
    out += (out.empty() ? "" : " ") + r["gpu_memory"].get<std::string>();
  if (r.contains("cpus"))
    out += (out.empty() ? "" : " ") + fmt::format("{:g} CPU", r["cpus"].get<double>());
  if (r.contains("memory")) out += (out.empty() ? "" : " ") + r["memory"].get<std::string>();
  return out.empty() ? "-" : out;
}

std::string Where(const json& job) {
  const json& p = job["placement"];
  if (!p.is_object() || p["gpus"].empty()) return "";
  std::vector<std::string> g;
  for (const json& x : p["gpus"]) g.push_back(std::to_string(x.value("index", -1)));
  return fmt::format("{}", fmt::join(g, ","));
}

void JobsTable(const json& jobs, std::ostream& out) {
  Table t({"ID", "NAME", "USER", "STATE", "PRIO", "ASKS", "GPU", "AGE", "REASON"});
  for (const json& j : jobs) {
    std::string reason =
        j.contains("waiting") ? j["waiting"].get<std::string>() : j.value("reason", "");
    if (reason.size() > 60) reason = reason.substr(0, 57) + "...";
    t.AddRow({std::to_string(j["id"].get<int64_t>()), j.value("name", ""), j.value("owner", ""),
              j.value("state", ""), std::to_string(j.value("priority", 0)), Resources(j["spec"]),
              Where(j), Age(j.value("submitted_at", 0.0)), reason});
  }
  t.Print(out);
}

void Emit(const json& j, const std::string& format, std::ostream& out) {
  EmitStructured(j, *ParseFormat(format), out);
}

struct State {
  ClientFlags client;
  // server
  std::string config_path;
  std::string socket, state_dir, simulate, fallback_simulate = "dgx-h100", tcp;
  bool allow_root_jobs = false;
  // submit
  int gpus = 0;
  std::string gpu_mem, gpu_share, name, workdir, image, mem, idempotency_key;
  double cpus = 0;
  std::vector<std::string> models, envs, labels, command;
  int priority = 0;
  bool no_preempt = false, no_env = false;
  double max_runtime = 0;
  double grace = -1;
  // ls / show / logs / cancel / top
  std::string states;
  std::string ls_user;
  bool ls_all = false;
  int limit = 50;
  int64_t id = 0;
  std::vector<int64_t> ids;
  bool follow = false, stderr_stream = false, once = false;
  double interval = 1;
};

volatile sig_atomic_t stop_requested = 0;

int RunServer(State& s, std::ostream& out, std::ostream& err) {
  (void)out;
  server::ServerConfig c = server::DefaultServerConfig();
  c.fallback_simulate = s.fallback_simulate;
  if (!s.config_path.empty()) {
    if (absl::Status st = server::LoadServerConfig(s.config_path, &c); !st.ok()) {
      err << "tessera: " << st.message() << "\n";
      return kExitBadInput;
    }
  }
  if (!s.socket.empty()) c.socket = s.socket;
  if (!s.state_dir.empty()) c.state_dir = s.state_dir;
  if (!s.simulate.empty()) c.simulate = s.simulate;
  if (!s.tcp.empty()) c.tcp_listen = s.tcp;
  if (s.allow_root_jobs) c.allow_root_jobs = true;
  if (!c.tcp_listen.empty() && c.tokens.empty()) {
    err << "tessera: a TCP listener needs tokens (tcp.tokens in the config file)\n";
    return kExitBadInput;
  }
  if (c.intercept_library.empty()) c.intercept_library = FindInterceptLibrary();
  // Stop on SIGTERM/SIGINT, taken synchronously; the server's threads never see them.
  sigset_t set = BlockStopSignals();
  auto srv = server::Server::Create(c);
  if (!srv.ok()) {
    err << "tessera: " << srv.status().message() << "\n";
    return srv.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  if (absl::Status st = (*srv)->Start(); !st.ok()) {
    err << "tessera: " << st.message() << "\n";
    return kExitFailure;
  }
  spdlog::info("tessera server ready: socket {}, state in {}", c.socket, c.state_dir);
  if (geteuid() == 0) {
    spdlog::info(
        c.allow_root_jobs
            ? "jobs of root run as root (allow_root_jobs)"
            : "jobs run as their submitting user; root's are refused (allow_root_jobs is off)");
  }
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info(
      "signal {}: stopping (running jobs keep running and are re-adopted at the next start)", sig);
  (*srv)->Stop();
  return kExitOk;
}

int RunSubmit(State& s, std::ostream& out, std::ostream& err) {
  if (s.command.empty()) {
    err << "tessera: submit needs a command after --, e.g. tessera submit --gpus 1 -- python "
           "train.py\n";
    return kExitBadInput;
  }
  json spec;
  spec["command"] = s.command;
  json env = json::object();
  // A container gets only what --env says: this shell's PATH, HOME and the like mean nothing in its
  // image.
  if (!s.no_env && s.image.empty()) {
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      size_t eq = kv.find('=');
      if (eq != std::string::npos && eq > 0) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  for (const std::string& kv : s.envs) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      err << "tessera: --env " << kv << ": expected NAME=VALUE\n";
      return kExitBadInput;
    }
    env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  spec["env"] = env;
  json labels = json::object();
  for (const std::string& kv : s.labels) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      err << "tessera: --label " << kv << ": expected KEY=VALUE\n";
      return kExitBadInput;
    }
    labels[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (!labels.empty()) spec["labels"] = labels;
  std::error_code ec;
  if (!s.image.empty()) {
    spec["image"] = s.image;
    if (!s.workdir.empty()) spec["workdir"] = s.workdir;  // else the image's
  } else {
    spec["workdir"] = s.workdir.empty() ? std::filesystem::current_path(ec).string() : s.workdir;
  }
  if (!s.name.empty()) spec["name"] = s.name;
  json res = json::object();
  if (s.gpus > 0) res["gpus"] = s.gpus;
  if (!s.gpu_mem.empty()) res["gpu_memory"] = s.gpu_mem;
  if (!s.gpu_share.empty()) res["gpu_share"] = s.gpu_share;
  if (!s.models.empty()) res["model"] = s.models;
  if (s.cpus > 0) res["cpus"] = s.cpus;
  if (!s.mem.empty()) res["memory"] = s.mem;
  spec["resources"] = res;
  spec["priority"] = s.priority;
  spec["preemptible"] = !s.no_preempt;
  if (s.max_runtime > 0) spec["max_runtime_s"] = s.max_runtime;
  if (s.grace >= 0) spec["grace_period_s"] = s.grace;
  server::HttpClient c = s.client.Client();
  int code = kExitOk;
  // The submission's key: a repeat (this client's own after a lost answer, or a rerun with
  // --idempotency-key) gets the job the first one made instead of a second job.
  std::string key = s.idempotency_key;
  if (key.empty()) {
    std::random_device rd;
    key = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
  }
  auto job = Call(c, "POST", "/v1/jobs", spec.dump(), err, &code, key);
  if (!job) return code;
  if (s.client.output == "table") {
    out << "submitted job "
        << (*job)["id"].get<int64_t>()
        // The user's own key used again (a repeat of this client's own retry is no news).
        << (job->value("repeated", false) && !s.idempotency_key.empty()
                ? " (already: this key's submission was stored before)"
                : "")
        << "\n";
  } else {
    Emit(*job, s.client.output, out);
  }
  return kExitOk;
}

int RunLs(State& s, std::ostream& out, std::ostream& err) {
  server::HttpClient c = s.client.Client();
  int code = kExitOk;
  std::string target = fmt::format("/v1/jobs?limit={}", s.limit);
  if (!s.states.empty()) target += "&state=" + s.states;
  // Your own jobs unless asked otherwise; the server says who you are (socket or token).
  std::string user = s.ls_user;
  if (user.empty() && !s.ls_all) {
    auto info = Call(c, "GET", "/v1/info", "", err, &code);
    if (!info) return code;
    user = (*info)["caller"].value("user", "");
  }
  if (!user.empty()) target += "&user=" + user;
  auto r = Call(c, "GET", target, "", err, &code);
  if (!r) return code;
  if (s.client.output == "table") {
    JobsTable((*r)["jobs"], out);
  } else {
    Emit((*r)["jobs"], s.client.output, out);
  }
  return kExitOk;
}

int RunShow(State& s, std::ostream& out, std::ostream& err) {
  server::HttpClient c = s.client.Client();
  int code = kExitOk;
  auto j = Call(c, "GET", fmt::format("/v1/jobs/{}", s.id), "", err, &code);
  if (!j) return code;
  if (s.client.output != "table") {
    Emit(*j, s.client.output, out);
    return kExitOk;
  }
  auto field = [&](const char* k, const std::string& v) {
    out << fmt::format("{:<12} {}\n", k, v);
  };
  field("id", std::to_string((*j)["id"].get<int64_t>()));
  field("name", j->value("name", ""));
  field("owner", j->value("owner", ""));
  field("state", j->value("state", ""));
  field("reason",
        j->contains("waiting") ? (*j)["waiting"].get<std::string>() : j->value("reason", ""));
  field("priority", std::to_string(j->value("priority", 0)));
  field("asks", Resources((*j)["spec"]));
  field("gpus", Where(*j));
  if ((*j)["spec"].contains("image"))
    field("image", (*j)["spec"]["image"].get<std::string>() + " (podman)");
  field("command",
        fmt::format("{}", fmt::join((*j)["spec"]["command"].get<std::vector<std::string>>(), " ")));
  if (!(*j)["exit_code"].is_null())
    field("exit code", std::to_string((*j)["exit_code"].get<int>()));
  if (const json u = j->value("usage", json()); u.is_object()) {
    std::vector<std::string> parts;
    if (u.contains("cpu_seconds"))
      parts.push_back(fmt::format("{:.2f} CPU seconds", u["cpu_seconds"].get<double>()));
    if (u.contains("peak_memory_bytes"))
      parts.push_back(
          fmt::format("peak memory {}", core::FormatBytes(u["peak_memory_bytes"].get<uint64_t>())));
    if (u.value("oom_kills", 0) > 0)
      parts.push_back(fmt::format("{} OOM kills", u["oom_kills"].get<int64_t>()));
    field("used", fmt::format("{}", fmt::join(parts, ", ")));
  }
  out << "events:\n";
  Table t({"AT", "STATE", "REASON"});
  for (const json& e : (*j)["events"]) {
    std::time_t at = static_cast<std::time_t>(e["at"].get<double>());
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&at));
    t.AddRow({buf, e["state"].get<std::string>(), e["reason"].get<std::string>()});
  }
  t.Print(out);
  return kExitOk;
}

int RunLogs(State& s, std::ostream& out, std::ostream& err) {
  server::HttpClient c = s.client.Client();
  int64_t offset = 0;
  for (;;) {
    int code = kExitOk;
    auto r = Call(c, "GET",
                  fmt::format("/v1/jobs/{}/logs?stream={}&offset={}", s.id,
                              s.stderr_stream ? "stderr" : "stdout", offset),
                  "", err, &code);
    if (!r) return code;
    std::string data = (*r)["data"].get<std::string>();
    out << data << std::flush;
    offset = (*r)["next_offset"].get<int64_t>();
    if (!s.follow || (data.empty() && (*r)["ended"].get<bool>())) return kExitOk;
    if (data.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

int RunCancel(State& s, std::ostream& out, std::ostream& err) {
  server::HttpClient c = s.client.Client();
  int worst = kExitOk;
  for (int64_t id : s.ids) {
    int code = kExitOk;
    auto j = Call(c, "POST", fmt::format("/v1/jobs/{}/cancel", id), "", err, &code);
    if (!j) {
      worst = std::max(worst, code);
      continue;
    }
    if (s.client.output == "table") {
      out << fmt::format("job {}: {}{}\n", id, j->value("state", ""),
                         j->contains("stopping") ? " (stopping: SIGTERM sent)" : "");
    } else {
      Emit(*j, s.client.output, out);
    }
  }
  return worst;
}

int RunTop(State& s, std::ostream& out, std::ostream& err) {
  server::HttpClient c = s.client.Client();
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
           x["healthy"].get<bool>() ? "ok" : "UNHEALTHY: " + x["health_reason"].get<std::string>(),
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
        bool digits = !v.empty() && v.size() <= 18 &&
                      std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || std::stoll(v) <= 0)
          return "job id '" + v + "' is not a positive whole number";
        return "";
      },
      "ID");
}

std::shared_ptr<void> AddServerCommands(CLI::App& app, std::function<int()>& action,
                                        std::ostream& out, std::ostream& err) {
  auto s = std::make_shared<State>();
  State& st = *s;

  CLI::App* srv = app.add_subcommand(
      "server", "Run the standalone server: this machine's GPUs shared by many users");
  srv->add_option("-c,--config", st.config_path,
                  "YAML config file (docs/server.md); none needed for the defaults");
  srv->add_option("--socket", st.socket,
                  "Unix socket to listen on (default " + server::DefaultSocketPath() + ")");
  srv->add_option("--state-dir", st.state_dir, "Where the database, logs and shared regions live");
  srv->add_option("--simulate", st.simulate,
                  "Simulate this machine (a preset or inventory file) instead of the driver");
  srv->add_option(
      "--fallback-simulate", st.fallback_simulate,
      "Preset to simulate when no NVIDIA driver is found (default dgx-h100; empty: fail)");
  srv->add_option("--tcp", st.tcp,
                  "Also listen on TCP host:port (needs tokens in the config file)");
  srv->add_flag(
      "--allow-root-jobs", st.allow_root_jobs,
      "Let root (on the socket, or a token for root) run jobs as root (config: allow_root_jobs)");
  srv->callback([&, s] { action = [&, s] { return RunServer(*s, out, err); }; });

  CLI::App* sub = app.add_subcommand(
      "submit",
      "Submit a job: tessera submit [--gpus N | --gpu-mem 10GiB --gpu-share 30%] -- cmd args");
  sub->add_option("--gpus", st.gpus, "Whole GPUs")->check(CLI::Range(0, 64));
  sub->add_option("--gpu-mem", st.gpu_mem,
                  "A fraction of one GPU: this much of its memory (10GiB)");
  sub->add_option("--gpu-share", st.gpu_share,
                  "A fraction of one GPU: this share of its compute (30%)");
  sub->add_option("--model", st.models,
                  "Acceptable GPU model(s): a name as `tessera gpus` shows it, or whole words of "
                  "one (H100, 'A100 80GB')")
      ->allow_extra_args(false);
  sub->add_option("--cpus", st.cpus,
                  "Host CPUs (2, 0.5): scheduled against the machine's and a limit of the job's "
                  "cgroup")
      ->check(CLI::Range(0.01, 4096.0));
  sub->add_option("--mem", st.mem,
                  "Host memory (16GiB): scheduled, and the job is killed (OOM) above it");
  sub->add_option("--priority", st.priority,
                  "Priority, -1000..1000 (higher first; may preempt lower)");
  sub->add_flag("--no-preempt", st.no_preempt, "This job may not be preempted");
  sub->add_option("--name", st.name, "A name for the job");
  sub->add_option("--max-runtime", st.max_runtime, "Stop the job after this many seconds");
  sub->add_option(
         "--grace", st.grace,
         "Seconds between SIGTERM and SIGKILL when the job is stopped (default: the server's, 30)")
      ->check(CLI::Range(0.0, 3600.0));
  sub->add_option("--env", st.envs, "Set NAME=VALUE in the job's environment (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--no-env", st.no_env, "Do not pass this shell's environment to the job");
  sub->add_option("--label", st.labels, "KEY=VALUE label (repeatable)")->allow_extra_args(false);
  sub->add_option("--workdir", st.workdir,
                  "Working directory (default: the current one; with --image, the image's)");
  sub->add_option("--image", st.image,
                  "Run in a container of this image (podman; the GPUs handed over as CDI devices). "
                  "Only --env variables go in, not this shell's");
  sub->add_option("--idempotency-key", st.idempotency_key,
                  "A key for this submission (default: a random one): submitting again with the "
                  "same key gives the job the first one made, not a second job");
  sub->add_option("command", st.command, "The command and its arguments, after --");
  st.client.AddTo(sub);
  sub->callback([&, s] { action = [&, s] { return RunSubmit(*s, out, err); }; });

  CLI::App* ls = app.add_subcommand("ls", "List jobs (newest last)");
  ls->add_option("--state", st.states, "Only these states, comma-separated (queued,running,...)");
  ls->add_option("--limit", st.limit, "At most this many, the newest (default 50)")
      ->check(CLI::Range(1, 100000));
  auto* ls_all = ls->add_flag("--all", st.ls_all, "Every user's jobs (default: your own)");
  ls->add_option("--user", st.ls_user, "This user's jobs (default: your own)")->excludes(ls_all);
  st.client.AddTo(ls);
  ls->callback([&, s] { action = [&, s] { return RunLs(*s, out, err); }; });

  CLI::App* show = app.add_subcommand("show", "Show one job with its events");
  show->add_option("id", st.id, "Job id")->required()->check(JobId());
  st.client.AddTo(show);
  show->callback([&, s] { action = [&, s] { return RunShow(*s, out, err); }; });

  CLI::App* logs = app.add_subcommand("logs", "Print a job's output");
  logs->add_option("id", st.id, "Job id")->required()->check(JobId());
  logs->add_flag("-f,--follow", st.follow, "Keep printing until the job ends");
  logs->add_flag("--stderr", st.stderr_stream, "The job's stderr instead of stdout");
  st.client.AddTo(logs, false);
  logs->callback([&, s] { action = [&, s] { return RunLogs(*s, out, err); }; });

  CLI::App* cancel =
      app.add_subcommand("cancel", "Cancel jobs (your own, or anyone's as an admin)");
  cancel->add_option("ids", st.ids, "Job ids")->required()->check(JobId());
  st.client.AddTo(cancel);
  cancel->callback([&, s] { action = [&, s] { return RunCancel(*s, out, err); }; });

  CLI::App* top = app.add_subcommand("top", "A live view of the GPUs and jobs");
  top->add_flag("--once", st.once, "Print one screen and exit");
  top->add_option("--interval", st.interval, "Seconds between refreshes (default 1)")
      ->check(CLI::Range(0.1, 3600.0));
  st.client.AddTo(top);
  top->callback([&, s] { action = [&, s] { return RunTop(*s, out, err); }; });
  return s;
}

}  // namespace tessera::cli
