// `tessera server` (the daemon) and its client verbs: submit, ls, show, logs, cancel, top.
#include "tessera/cli/server_cmd.h"

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
#include <random>
#include <thread>
#include <tuple>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/cli/app.h"
#include "tessera/cli/directives.h"
#include "tessera/cli/output.h"
#include "tessera/cli/when.h"
#include "tessera/core/gpu.h"
#include "tessera/net/http.h"
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
          ->check(CLI::Validator(
              [](std::string& v) -> std::string {
                if (v == "table" || v == "json" || v == "yaml") return "";
                return fmt::format(
                    "'{}' is not an output format (table, json or yaml); a job's output file is "
                    "submit's --stdout FILE (Slurm's --output)",
                    v);
              },
              "FORMAT"));
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
  net::HttpClient Client() const { return net::HttpClient(Endpoint(), Token(), Ca()); }
};

// One API call; on failure says why on `err` and returns nullopt with the exit code set.
std::optional<json> Call(net::HttpClient& c, const std::string& method, const std::string& target,
                         const std::string& body, std::ostream& err, int* code,
                         const std::string& idempotency_key = "") {
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
    // 2 for what the user wrote wrong (a bad request); 1 for everything that failed otherwise: not
    // found, forbidden, a conflict, over a limit, the server's own trouble (README's exit codes).
    *code = r->status == 400 || r->status == 413 || r->status == 431 ? kExitBadInput : kExitFailure;
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
  const bool share = r.contains("gpu_share") || r.contains("gpu_memory");
  if (r.contains("gpu_share")) out += r["gpu_share"].get<std::string>();
  if (r.contains("gpu_memory"))
    out += (out.empty() ? "" : " ") + r["gpu_memory"].get<std::string>();
  // Whole GPUs, or how many GPUs get the share.
  if (r.contains("gpus") && !share) out = fmt::format("{} GPU", r["gpus"].get<int>());
  if (r.contains("gpus") && share && r["gpus"].get<int>() > 1)
    out += fmt::format(" on {} GPUs", r["gpus"].get<int>());
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

// How a job is named on the command line: 12, an array's task 12_3, or a folded array 12_[0-99%8].
std::string JobRef(const json& j) {
  if (j.contains("array") && j["array"].is_object() && j["array"].value("folded", false))
    return fmt::format("{}_[{}]", j["array"]["id"].get<int64_t>(), j["array"].value("range", ""));
  if (j.value("array_id", json()).is_number())
    return fmt::format("{}_{}", j["array_id"].get<int64_t>(), j["array_index"].get<int>());
  return std::to_string(j["id"].get<int64_t>());
}

// A job's state; a folded array's counts of tasks by state ("queued:84 running:8"); "held".
std::string StateText(const json& j, bool array = false) {
  if (j.contains("array") && j["array"].is_object() &&
      (array || j["array"].value("folded", false))) {
    std::vector<std::string> parts;
    for (const char* s :
         {"running", "queued", "succeeded", "failed", "cancelled", "preempted", "lost"}) {
      if (j["array"]["states"].contains(s))
        parts.push_back(fmt::format("{}:{}", s, j["array"]["states"][s].get<int64_t>()));
    }
    if (j["array"].value("held", 0) > 0)
      parts.push_back(fmt::format("(held:{})", j["array"]["held"].get<int64_t>()));
    return fmt::format("{}", fmt::join(parts, " "));
  }
  return j.value("held", false) ? "held" : j.value("state", "");
}

// "in 5m", "now", "5m ago" for a time relative to now.
std::string Relative(double at) {
  const double now = static_cast<double>(std::time(nullptr));
  if (std::abs(at - now) < 1) return "now";
  return at > now ? "in " + Age(now - (at - now)) : Age(at) + " ago";
}

// When a queued job is expected to start (its reservation) or a running one to end (its
// prediction), like squeue --start; "-" when unknown.
std::string Expected(const json& j) {
  const std::string state = j.value("state", "");
  if (state == "queued" && j.value("expected_start", json()).is_number())
    return "start " + Relative(j["expected_start"].get<double>());
  if (state == "queued" && j.value("reserved", false)) return "start ?";
  if (state == "running" && j.value("expected_end", json()).is_number()) {
    // A predicted end that has passed is no history: the job runs longer than expected.
    const double end = j["expected_end"].get<double>();
    const double now = static_cast<double>(std::time(nullptr));
    if (end < now - 1) return "overdue " + Age(end);
    return "end " + Relative(end);
  }
  return "-";
}

void JobsTable(const json& jobs, std::ostream& out) {
  Table t({"ID", "NAME", "USER", "STATE", "PRIO", "ASKS", "GPU", "AGE", "EXPECTED", "REASON"});
  for (const json& j : jobs) {
    std::string reason =
        j.contains("waiting") ? j["waiting"].get<std::string>() : j.value("reason", "");
    if (reason.size() > 60) reason = reason.substr(0, 57) + "...";
    t.AddRow({JobRef(j), j.value("name", ""), j.value("owner", ""), StateText(j),
              std::to_string(j.value("priority", 0)), Resources(j["spec"]), Where(j),
              Age(j.value("submitted_at", 0.0)), Expected(j), reason});
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
  // submit, run
  std::string array, task_failure;
  std::vector<std::string> after;
  bool hold = false;
  std::string stdout_file, stderr_file;
  bool requeue = false, no_requeue = false;
  int ntasks = 0, tasks_per_gpu = 0;
  int gpus = 0;
  std::string gpu_mem, gpu_share, name, workdir, image, mem, idempotency_key;
  double cpus = 0;
  std::vector<std::string> models, envs, labels, command;
  int priority = 0;
  bool no_preempt = false, no_env = false;
  std::string max_runtime;  // as the user wrote it ("1h", "01:00:00", 3600): the server parses it
  std::string grace;
  // ls / show / logs / cancel / top
  std::string states;
  std::string ls_user;
  bool ls_all = false;
  int limit = 50;
  bool expand = false;
  std::string id;  // 12, or an array's task 12_3
  std::vector<std::string> ids;
  int task = -1;
  // acct
  std::string since = "7d", until = "now", by = "user", acct_user;
  bool follow = false, stderr_stream = false, once = false;
  bool force = false;      // cancel --force
  bool acct_jobs = false;  // acct --jobs
  std::string acct_format = "id,name,user,state,start,end,elapsed,gpus,exit";
  double interval = 1;
  CLI::App* submit_app = nullptr;  // what `submit` was given, for its script's directives
  bool label = false;              // run -l
};

// A job's output as `tessera run` shows it: every process's, each stream in whole lines (a line
// of one process is never cut by another's), prefixed with the rank ("1: ") under -l; one
// process's output as it comes when unlabelled.
class RankOutput {
 public:
  RankOutput(int tasks, bool label) : tasks_(tasks), label_(label), held_(2 * tasks) {}
  void Add(int task, int stream, const std::string& data, std::ostream& os) {
    if (tasks_ == 1 && !label_) {
      os << data << std::flush;
      return;
    }
    std::string& held = held_[static_cast<size_t>(2 * task + stream)];
    held += data;
    size_t start = 0;
    for (size_t nl; (nl = held.find('\n', start)) != std::string::npos; start = nl + 1)
      Line(task, std::string_view(held).substr(start, nl + 1 - start), os);
    held.erase(0, start);
    os << std::flush;
  }
  // What is left without a newline at the end.
  void Flush(std::ostream& out, std::ostream& err) {
    for (int t = 0; t < tasks_; ++t) {
      for (int k = 0; k < 2; ++k) {
        std::string& held = held_[static_cast<size_t>(2 * t + k)];
        if (held.empty()) continue;
        Line(t, held + "\n", k == 0 ? out : err);
        held.clear();
      }
    }
  }

 private:
  void Line(int task, std::string_view line, std::ostream& os) {
    if (label_) os << task << ": ";
    os << line;
  }
  int tasks_;
  bool label_;
  std::vector<std::string> held_;
};

// `tessera run`: Ctrl-C (or SIGTERM) asks for the job to be cancelled.
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

// The job spec the submit options describe; on bad input says why on `err` and returns nullopt.
std::optional<json> BuildSpec(const State& s, const char* verb, std::ostream& err) {
  if (s.command.empty()) {
    err << "tessera: " << verb << " needs a command after --, e.g. tessera " << verb
        << " --gpus 1 -- python train.py\n";
    return std::nullopt;
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
      return std::nullopt;
    }
    env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  spec["env"] = env;
  json labels = json::object();
  for (const std::string& kv : s.labels) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      err << "tessera: --label " << kv << ": expected KEY=VALUE\n";
      return std::nullopt;
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
  if (!s.max_runtime.empty()) spec["max_runtime_s"] = s.max_runtime;
  if (!s.grace.empty()) spec["grace_period_s"] = s.grace;
  if (!s.array.empty()) spec["array"] = s.array;
  if (!s.after.empty()) {
    // "ok:5,6" (or Slurm's "ok:5:6") is ok:5 and ok:6; the server checks each.
    json after = json::array();
    for (const std::string& a : s.after) {
      const size_t colon = a.find(':');
      if (colon == std::string::npos) {
        after.push_back(a);  // the server says what is wrong with it
        continue;
      }
      std::string rest = a.substr(colon + 1);
      std::replace(rest.begin(), rest.end(), ':', ',');
      size_t start = 0;
      do {
        const size_t comma = rest.find(',', start);
        after.push_back(a.substr(0, colon + 1) + rest.substr(start, comma - start));
        start = comma == std::string::npos ? comma : comma + 1;
      } while (start != std::string::npos);
    }
    spec["after"] = after;
  }
  if (s.hold) spec["hold"] = true;
  if (s.ntasks > 0) spec["ntasks"] = s.ntasks;
  if (s.tasks_per_gpu > 0) spec["tasks_per_gpu"] = s.tasks_per_gpu;
  if (!s.task_failure.empty()) spec["task_failure"] = s.task_failure;
  if (!s.stdout_file.empty()) spec["stdout_file"] = s.stdout_file;
  if (!s.stderr_file.empty()) spec["stderr_file"] = s.stderr_file;
  if (s.requeue || s.no_requeue) spec["requeue"] = s.requeue;
  return spec;
}

// Submits `spec` with the options' idempotency key (a random one by default); the job, or nullopt
// with *code set.
std::optional<json> SubmitSpec(const State& s, const json& spec, std::ostream& err, int* code) {
  net::HttpClient c = s.client.Client();
  // The submission's key: a repeat (this client's own after a lost answer, or a rerun with
  // --idempotency-key) gets the job the first one made instead of a second job.
  std::string key = s.idempotency_key;
  if (key.empty()) {
    std::random_device rd;
    key = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
  }
  return Call(c, "POST", "/v1/jobs", spec.dump(), err, code, key);
}

void AddSubmitOptions(CLI::App* c, State& s);

// `tessera submit job.sh`: the script's #TESSERA and #SBATCH lines, for the options the command
// line did not give (directives.h); a script that is not executable runs with its #! interpreter.
// False (said) when a directive is wrong.
bool ApplyScriptDirectives(State& s, std::ostream& err) {
  if (s.command.empty() || s.submit_app == nullptr) return true;
  const std::string& path = s.command[0];
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return true;
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.rfind("#!", 0) != 0) return true;  // a program, not a script
  auto d = ParseDirectives(text, path);
  if (!d.ok()) {
    err << "tessera: " << d.status().message() << "\n";
    return false;
  }
  for (const std::string& w : d->warnings) err << "tessera: " << w << "\n";
  // Parsed into the same options, but only those the command line did not give: it wins.
  CLI::App lines;
  AddSubmitOptions(&lines, s);
  for (const Directive& dir : d->directives) {
    std::vector<std::string> keep;
    for (size_t i = 0; i < dir.args.size(); ++i) {
      const CLI::Option* o = s.submit_app->get_option_no_throw(dir.args[i]);
      const bool takes = o != nullptr && o->get_type_size() != 0;
      if (o == nullptr || o->count() == 0) {
        keep.push_back(dir.args[i]);
        if (takes && i + 1 < dir.args.size()) keep.push_back(dir.args[i + 1]);
      }
      if (takes) ++i;
    }
    if (keep.empty()) continue;
    try {
      std::vector<std::string> argv(keep.rbegin(), keep.rend());  // CLI11 takes them reversed
      lines.parse(argv);
    } catch (const CLI::ParseError& e) {
      err << "tessera: " << path << ":" << dir.line << ": " << dir.text << ": " << e.what() << "\n";
      return false;
    }
  }
  if (access(path.c_str(), X_OK) != 0 && !d->interpreter.empty())
    s.command.insert(s.command.begin(), d->interpreter);
  return true;
}

int RunSubmit(State& s, std::ostream& out, std::ostream& err) {
  if (!ApplyScriptDirectives(s, err)) return kExitBadInput;
  auto spec = BuildSpec(s, "submit", err);
  if (!spec) return kExitBadInput;
  int code = kExitOk;
  auto job = SubmitSpec(s, *spec, err, &code);
  if (!job) return code;
  if (s.client.output == "table") {
    const int64_t id = (*job)["id"].get<int64_t>();
    if (job->contains("array")) {
      const json& a = (*job)["array"];
      out << fmt::format("submitted array {} ({} tasks, {}_<index>: jobs {}..{})", id,
                         a["tasks"].get<int64_t>(), id, id, a["last_id"].get<int64_t>());
    } else {
      out << "submitted job " << id;
    }
    out << (s.hold ? " held (tessera release " + std::to_string(id) + ")" : "")
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
  net::HttpClient c = s.client.Client();
  int code = kExitOk;
  std::string target =
      fmt::format("/v1/jobs?limit={}&arrays={}", s.limit, s.expand ? "expand" : "fold");
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
  net::HttpClient c = s.client.Client();
  int code = kExitOk;
  auto j = Call(c, "GET", fmt::format("/v1/jobs/{}", s.id), "", err, &code);
  if (!j) return code;
  if (s.client.output != "table") {
    Emit(*j, s.client.output, out);
    return kExitOk;
  }
  auto field = [&](const char* k, const std::string& v) {
    out << fmt::format("{:<12} {}\n", k, Printable(v));
  };
  field("id", JobRef(*j) == std::to_string((*j)["id"].get<int64_t>())
                  ? JobRef(*j)
                  : fmt::format("{} (job {})", JobRef(*j), (*j)["id"].get<int64_t>()));
  if (const json a = j->value("array", json()); a.is_object()) {
    field("array", fmt::format("{} [{}]: {} tasks; {}", a["id"].get<int64_t>(),
                               a.value("range", ""), a.value("tasks", 0), StateText(*j, true)));
  }
  field("name", j->value("name", ""));
  field("owner", j->value("owner", ""));
  field("state", j->value("held", false) ? "queued, held" : j->value("state", ""));
  field("reason",
        j->contains("waiting") ? (*j)["waiting"].get<std::string>() : j->value("reason", ""));
  field("priority", std::to_string(j->value("priority", 0)));
  if (Expected(*j) != "-") field("expected", Expected(*j));
  if (j->value("expected_duration_s", json()).is_number()) {
    field("runs for", fmt::format("~{:.0f} s ({})", (*j)["expected_duration_s"].get<double>(),
                                  j->value("prediction", "")));
  }
  if (j->value("expected_gpu_utilization_pct", json()).is_number()) {
    field("gpu busy", fmt::format("~{}% ({})", (*j)["expected_gpu_utilization_pct"].get<int>(),
                                  j->value("utilization_prediction", "")));
  }
  if (j->value("sharing_slowdown", json()).is_number()) {
    field("shared",
          fmt::format("runs ~{:.2f}x slower beside others ({})",
                      (*j)["sharing_slowdown"].get<double>(), j->value("sharing_prediction", "")));
  }
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
    if (u.contains("gpu_utilization_pct"))
      parts.push_back(fmt::format("GPU {:.0f}% busy", u["gpu_utilization_pct"].get<double>()));
    if (u.contains("gpu_peak_memory_mib"))
      parts.push_back(fmt::format(
          "peak GPU memory {}", core::FormatBytes(u["gpu_peak_memory_mib"].get<uint64_t>() << 20)));
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
  net::HttpClient c = s.client.Client();
  int64_t offset = 0;
  std::string said;
  for (;;) {
    int code = kExitOk;
    auto r = Call(c, "GET",
                  fmt::format("/v1/jobs/{}/logs?stream={}&offset={}{}", s.id,
                              s.stderr_stream ? "stderr" : "stdout", offset,
                              s.task >= 0 ? fmt::format("&task={}", s.task) : ""),
                  "", err, &code);
    if (!r) return code;
    // Output that went to a file of the user's: said once, with what keeps it from being shown.
    if (const std::string file = r->value("file", ""); !file.empty() && file != said) {
      err << fmt::format(
          "tessera: job {} writes its {} to {}{}\n", s.id, s.stderr_stream ? "stderr" : "stdout",
          file,
          r->contains("file_error") ? " (" + (*r)["file_error"].get<std::string>() + ")" : "");
      said = file;
    }
    std::string data = (*r)["data"].get<std::string>();
    out << data << std::flush;
    offset = (*r)["next_offset"].get<int64_t>();
    if (!s.follow || (data.empty() && (*r)["ended"].get<bool>())) return kExitOk;
    if (data.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

int RunCancel(State& s, std::ostream& out, std::ostream& err) {
  net::HttpClient c = s.client.Client();
  int worst = kExitOk;
  for (const std::string& id : s.ids) {
    int code = kExitOk;
    auto j = Call(c, "POST", fmt::format("/v1/jobs/{}/cancel{}", id, s.force ? "?force=true" : ""),
                  "", err, &code);
    if (!j) {
      worst = std::max(worst, code);
      continue;
    }
    if (s.client.output == "table") {
      if (j->contains("array") && id.find('_') == std::string::npos &&
          (*j)["array"]["id"] == (*j)["id"]) {
        out << fmt::format("array {}: {}\n", id, StateText(*j, true));
      } else {
        out << fmt::format("job {}: {}{}\n", id, j->value("state", ""),
                           j->contains("stopping") ? " (stopping: SIGTERM sent)" : "");
      }
    } else {
      Emit(*j, s.client.output, out);
    }
  }
  return worst;
}

// `tessera run`: submits, says why the job waits, streams its stdout and stderr as they come, and
// exits with its exit code. Ctrl-C cancels the job (and still waits for it to end).
int RunRun(State& s, std::ostream& out, std::ostream& err) {
  if (!s.array.empty()) {
    err << "tessera: run takes one job; submit an array with tessera submit --array\n";
    return kExitBadInput;
  }
  auto spec = BuildSpec(s, "run", err);
  if (!spec) return kExitBadInput;
  int code = kExitOk;
  auto job = SubmitSpec(s, *spec, err, &code);
  if (!job) return code;
  const int64_t id = (*job)["id"].get<int64_t>();
  err << "tessera: job " << id << " submitted" << (s.hold ? " held" : "") << "\n";
  stop_requested = 0;
  struct sigaction sa {};
  sa.sa_handler = [](int) { stop_requested = 1; };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  net::HttpClient c = s.client.Client();
  // Every process's output, as srun shows it: the job's processes as it asked for them.
  const int tasks =
      s.tasks_per_gpu > 0 ? s.tasks_per_gpu * std::max(s.gpus, 1) : std::max(s.ntasks, 1);
  RankOutput shown(tasks, s.label);
  std::vector<int64_t> offsets(static_cast<size_t>(2 * tasks), 0);
  bool cancelling = false, started = false;
  std::string said;
  for (;;) {
    if (stop_requested && !cancelling) {
      cancelling = true;
      err << "tessera: cancelling job " << id << "\n";
      (void)Call(c, "POST", fmt::format("/v1/jobs/{}/cancel", id), "", err, &code);
    }
    bool any = false, ended = false;
    for (int t = 0; t < tasks; ++t) {
      for (int k = 0; k < 2; ++k) {
        int64_t& offset = offsets[static_cast<size_t>(2 * t + k)];
        auto r = Call(
            c, "GET",
            fmt::format("/v1/jobs/{}/logs?stream={}&offset={}{}", id, k == 0 ? "stdout" : "stderr",
                        offset, tasks > 1 ? fmt::format("&task={}", t) : ""),
            "", err, &code);
        if (!r) return code;
        const std::string data = (*r)["data"].get<std::string>();
        shown.Add(t, k, data, k == 0 ? out : err);
        offset = (*r)["next_offset"].get<int64_t>();
        any = any || !data.empty();
        ended = (*r)["ended"].get<bool>();
        started = started || (*r)["state"] != "queued";
      }
    }
    if (ended && !any) {
      shown.Flush(out, err);
      break;
    }
    if (!started) {
      // Why it waits, said once per change.
      auto j = Call(c, "GET", fmt::format("/v1/jobs/{}", id), "", err, &code);
      if (!j) return code;
      std::string why = j->value("waiting", "");
      if (!why.empty() && why != said) err << "tessera: job " << id << " waits: " << why << "\n";
      said = why;
    }
    if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto j = Call(c, "GET", fmt::format("/v1/jobs/{}", id), "", err, &code);
  if (!j) return code;
  const std::string state = j->value("state", "");
  if (state == "succeeded") return kExitOk;
  err << "tessera: job " << id << " " << state << ": " << j->value("reason", "") << "\n";
  // Its own exit code, as srun gives it; 130 for one cancelled here, 1 when none is known.
  if ((*j)["exit_code"].is_number()) return (*j)["exit_code"].get<int>();
  return cancelling ? 130 : kExitFailure;
}

// `tessera acct`: GPU-hours, jobs, waits and failures over a period, per user, group or model.
// `acct --jobs`: one line per job that ended in the period or ran in it, like sacct, with the
// columns --format names.
int AcctJobs(State& s, net::HttpClient& c, const json& acct, double since, double until,
             std::ostream& out, std::ostream& err) {
  static const std::vector<std::string> kFields = {
      "id",      "name", "user", "state",    "submit",  "start", "end",
      "elapsed", "wait", "gpus", "gpu_util", "gpu_mem", "exit",  "reason"};
  std::vector<std::string> fields;
  for (size_t at = 0; at <= s.acct_format.size();) {
    const size_t comma = s.acct_format.find(',', at);
    std::string f = s.acct_format.substr(at, comma == std::string::npos ? comma : comma - at);
    for (char& ch : f) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (std::find(kFields.begin(), kFields.end(), f) == kFields.end()) {
      err << "tessera: --format: unknown field '" << f << "' ("
          << fmt::format("{}", fmt::join(kFields, ", ")) << ")\n";
      return kExitBadInput;
    }
    fields.push_back(f);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  // Whose: --user, else every user's for an admin (as the summary's scope says), else your own.
  std::string user = s.acct_user;
  if (user.empty() && acct.value("scope", "") != "every user's jobs") {
    const std::string scope = acct.value("scope", "");
    user = scope.substr(0, scope.rfind("'s jobs"));
  }
  int code = kExitOk;
  std::string target = "/v1/jobs?arrays=expand";
  if (!user.empty()) target += "&user=" + user;
  auto r = Call(c, "GET", target, "", err, &code);
  if (!r) return code;
  auto number = [](const json& j, const char* k) {
    return j.contains(k) && j[k].is_number() ? std::optional<double>(j[k].get<double>())
                                             : std::nullopt;
  };
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  json rows = json::array();
  std::vector<std::vector<std::string>> cells;
  for (const json& j : (*r)["jobs"]) {
    const auto started = number(j, "started_at"), ended = number(j, "ended_at");
    const bool in_period = ended
                               ? *ended >= since && *ended <= until
                               : started && *started <= until && j.value("state", "") == "running";
    if (!in_period) continue;
    json row;
    std::vector<std::string> line;
    for (const std::string& f : fields) {
      json v;
      std::string text;
      if (f == "id") {
        v = JobRef(j), text = v.get<std::string>();
      } else if (f == "name") {
        v = j.value("name", ""), text = v.get<std::string>();
      } else if (f == "user") {
        v = j.value("owner", ""), text = v.get<std::string>();
      } else if (f == "state") {
        v = j.value("state", ""), text = v.get<std::string>();
      } else if (f == "submit" || f == "start" || f == "end") {
        const auto t = number(j, f == "submit"  ? "submitted_at"
                                 : f == "start" ? "started_at"
                                                : "ended_at");
        v = t ? json(*t) : json(nullptr), text = t ? LocalTimestamp(*t) : "-";
      } else if (f == "elapsed") {
        const double e = started ? (ended ? *ended : now) - *started : 0;
        v = e, text = ElapsedClock(e);
      } else if (f == "wait") {
        const auto sub = number(j, "submitted_at");
        const double w = sub ? (started ? *started : ended ? *ended : now) - *sub : 0;
        v = w, text = ElapsedClock(std::max(0.0, w));
      } else if (f == "gpus") {
        const json& p = j.value("placement", json());
        v = p.is_object() && p.contains("gpus") ? p["gpus"].size() : 0;
        text = std::to_string(v.get<size_t>());
      } else if (f == "gpu_util" || f == "gpu_mem") {
        const json& u = j.value("usage", json());
        const char* k = f == "gpu_util" ? "gpu_utilization_pct" : "gpu_peak_memory_mib";
        const auto x = u.is_object() ? number(u, k) : std::nullopt;
        v = x ? json(*x) : json(nullptr);
        text = !x                ? "-"
               : f == "gpu_util" ? fmt::format("{:.0f}%", *x)
                                 : fmt::format("{:.0f}MiB", *x);
      } else if (f == "exit") {
        const auto x = number(j, "exit_code");
        v = x ? json(static_cast<int>(*x)) : json(nullptr),
        text = x ? std::to_string(static_cast<int>(*x)) : "-";
      } else {
        v = j.value("reason", ""), text = v.get<std::string>();
      }
      row[f] = v;
      line.push_back(text);
    }
    rows.push_back(row);
    cells.push_back(line);
  }
  if (s.client.output == "json" || s.client.output == "yaml") {
    Emit(rows, s.client.output, out);
  } else if (s.client.output == "csv") {
    out << CsvRow(fields);
    for (const auto& line : cells) out << CsvRow(line);
  } else {
    std::vector<std::string> header;
    for (std::string f : fields) {
      for (char& ch : f) ch = ch == '_' ? ' ' : static_cast<char>(std::toupper(ch));
      header.push_back(f);
    }
    Table t(header);
    for (auto& line : cells) t.AddRow(line);
    t.Print(out);
  }
  return kExitOk;
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
                                           "MAX WAIT"};
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
                                    fmt::format(fmt::runtime(secs), l.value("max_wait_s", 0.0))};
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
  return kExitOk;
}

// hold / release: queued jobs, or every queued task of an array.
int RunHold(State& s, bool hold, std::ostream& out, std::ostream& err) {
  net::HttpClient c = s.client.Client();
  int worst = kExitOk;
  for (const std::string& id : s.ids) {
    int code = kExitOk;
    auto j = Call(c, "POST", fmt::format("/v1/jobs/{}/{}", id, hold ? "hold" : "release"), "", err,
                  &code);
    if (!j) {
      worst = std::max(worst, code);
      continue;
    }
    if (s.client.output != "table") {
      Emit(*j, s.client.output, out);
    } else if (j->contains("array") && id.find('_') == std::string::npos &&
               (*j)["array"]["id"] == (*j)["id"]) {
      out << fmt::format("array {}: {}\n", id, StateText(*j, true));
    } else {
      out << fmt::format("job {}: {}\n", id, StateText(*j));
    }
  }
  return worst;
}

// `tessera priority ID P`: a queued job's new priority (POST /v1/jobs/ID/priority).
int RunPriority(State& s, std::ostream& out, std::ostream& err) {
  net::HttpClient c = s.client.Client();
  int code = kExitOk;
  auto j = Call(c, "POST", fmt::format("/v1/jobs/{}/priority", s.id),
                json{{"priority", s.priority}}.dump(), err, &code);
  if (!j) return code;
  if (s.client.output != "table") {
    Emit(*j, s.client.output, out);
  } else {
    out << fmt::format("job {}: priority {} ({})\n", s.id, j->value("priority", 0), StateText(*j));
  }
  return kExitOk;
}

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

// A duration on the command line as the server reads it (core::ParseDuration; "0" too with
// `zero`), at most `most` seconds: refused here, before any server is asked.
CLI::Validator Duration(bool zero, double most) {
  return CLI::Validator(
      [zero, most](std::string& v) -> std::string {
        const std::optional<double> s =
            zero && (v == "0" || v == "0s") ? std::optional<double>(0) : core::ParseDuration(v);
        if (s && *s <= most) return "";
        return fmt::format(
            "'{}' is not a duration of {} up to {:g} s (90, 90s, 15m, 1h, 1h30m, "
            "HH:MM:SS, D-HH:MM:SS)",
            v, zero ? "0" : "more than 0", most);
      },
      "DURATION");
}

// The options of a job, for submit and run alike.
void AddSubmitOptions(CLI::App* c, State& s) {
  c->add_option("--gpus", s.gpus,
                "Whole GPUs; with --gpu-mem/--gpu-share, how many GPUs get that fraction "
                "(default one)")
      ->check(CLI::Range(0, 64));
  c->add_option("--gpu-mem", s.gpu_mem,
                "A fraction of a GPU: this much of its memory (10GiB), on each of --gpus GPUs");
  c->add_option("--gpu-share", s.gpu_share,
                "A fraction of a GPU: this share of its compute (30%, 30 or 0.3), on each of "
                "--gpus GPUs");
  c->add_option("--model", s.models,
                "Acceptable GPU model(s): a name as `tessera gpus` shows it, or whole words of "
                "one (H100, 'A100 80GB')")
      ->allow_extra_args(false);
  c->add_option("--cpus", s.cpus,
                "Host CPUs (2, 0.5): scheduled against the machine's and a limit of the job's "
                "cgroup")
      ->check(CLI::Range(0.01, 4096.0));
  c->add_option("--mem", s.mem,
                "Host memory (16G, 16GiB, 16384 MiB): scheduled, and the job is killed (OOM) "
                "above it");
  c->add_option("--priority", s.priority,
                "Priority, -1000..1000 (higher first; may preempt lower)");
  c->add_flag("--no-preempt", s.no_preempt, "This job may not be preempted");
  c->add_option("--name", s.name, "A name for the job");
  c->add_option("--max-runtime", s.max_runtime,
                "Stop the job after this long: 3600, 90s, 15m, 1h, 1h30m, HH:MM:SS, D-HH:MM:SS")
      ->check(Duration(false, 1e9));
  c->add_option("--grace", s.grace,
                "Time between SIGTERM and SIGKILL when the job is stopped: 30, 30s, 2m (default: "
                "the server's, 30 s; at most its maximum)")
      ->check(Duration(true, 3600));
  c->add_option("--env", s.envs, "Set NAME=VALUE in the job's environment (repeatable)")
      ->allow_extra_args(false);
  c->add_flag("--no-env", s.no_env, "Do not pass this shell's environment to the job");
  c->add_option("--label", s.labels, "KEY=VALUE label (repeatable)")->allow_extra_args(false);
  c->add_option("--workdir", s.workdir,
                "Working directory (default: the current one; with --image, the image's)");
  c->add_option("--image", s.image,
                "Run in a container of this image (podman; the GPUs handed over as CDI devices). "
                "Only --env variables go in, not this shell's");
  c->add_option("--idempotency-key", s.idempotency_key,
                "A key for this submission (default: a random one): submitting again with the "
                "same key gives the job the first one made, not a second job");
  c->add_option("command", s.command, "The command and its arguments, after --");
  c->add_option("--array", s.array,
                "An array of tasks, one per index: 0-99, 1,5,9, 0-30:10, with %N for at most N "
                "running at once (0-99%8); each gets TESSERA_ARRAY_TASK_ID")
      ->check(CLI::Validator(
          [](std::string& v) {
            return v.empty() ? std::string("empty; give indices such as 0-99%8") : std::string();
          },
          "INDICES"));
  c->add_option("--after", s.after,
                "Start only after these jobs end: ok:ID[,ID] (succeeded), notok:ID (failed or "
                "cancelled), any:ID; ID a job, an array (all its tasks) or ARRAY_INDEX "
                "(repeatable)")
      ->allow_extra_args(false);
  c->add_flag("--hold", s.hold, "Queue the job held: it starts once released (tessera release)");
  auto* ntasks = c->add_option("-n,--ntasks", s.ntasks,
                               "Start this many processes on the job's GPUs (RANK, LOCAL_RANK, "
                               "WORLD_SIZE, MASTER_ADDR, MASTER_PORT set for each)")
                     ->check(CLI::Range(1, 1024));
  c->add_option("--tasks-per-gpu", s.tasks_per_gpu,
                "Start this many processes per GPU of the job (like --ntasks)")
      ->check(CLI::Range(1, 1024))
      ->excludes(ntasks);
  c->add_option("--task-failure", s.task_failure,
                "With several processes: kill (default: one failing stops the others, the job "
                "fails) or wait (all run to their end; the job fails if one did)")
      ->check(CLI::IsMember({"kill", "wait"}));
  c->add_option("--stdout", s.stdout_file,
                "Write the job's stdout (and stderr, without --stderr) to this file of yours "
                "instead of the server's logs (Slurm's --output): %j job, %A array, %a index, "
                "%t task, %u user, %x name, %N host, %% percent; relative to --workdir; "
                "appended to. tessera logs reads it there");
  c->add_option("--stderr", s.stderr_file,
                "Write the job's stderr to this file of yours (Slurm's --error); the same "
                "patterns as --stdout");
  auto* requeue =
      c->add_flag("--requeue", s.requeue,
                  "Back to the queue when preempted or when its GPU fails (default: the "
                  "server's settings)");
  c->add_flag("--no-requeue", s.no_requeue,
              "End (preempted or failed) instead of going back to the queue")
      ->excludes(requeue);
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
  AddSubmitOptions(sub, st);
  st.client.AddTo(sub);
  st.submit_app = sub;
  sub->callback([&, s] { action = [&, s] { return RunSubmit(*s, out, err); }; });

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

  CLI::App* ls = app.add_subcommand("ls", "List jobs (newest last)");
  ls->add_option("--state", st.states, "Only these states, comma-separated (queued,running,...)");
  ls->add_option("--limit", st.limit, "At most this many, the newest (default 50)")
      ->check(CLI::Range(1, 100000));
  auto* ls_all = ls->add_flag("--all", st.ls_all, "Every user's jobs (default: your own)");
  ls->add_option("--user", st.ls_user, "This user's jobs (default: your own)")->excludes(ls_all);
  ls->add_flag("--expand", st.expand,
               "Every task of an array on its own line (default: an array is one line with its "
               "tasks counted by state)");
  st.client.AddTo(ls);
  ls->callback([&, s] { action = [&, s] { return RunLs(*s, out, err); }; });

  CLI::App* show = app.add_subcommand("show", "Show one job with its events");
  show->add_option("id", st.id, "Job id (12, or an array's task 12_3)")->required()->check(JobId());
  st.client.AddTo(show);
  show->callback([&, s] { action = [&, s] { return RunShow(*s, out, err); }; });

  CLI::App* logs = app.add_subcommand("logs", "Print a job's output");
  logs->add_option("id", st.id, "Job id (12, or an array's task 12_3)")->required()->check(JobId());
  logs->add_flag("-f,--follow", st.follow, "Keep printing until the job ends");
  logs->add_flag("--stderr", st.stderr_stream, "The job's stderr instead of stdout");
  logs->add_option("--task", st.task,
                   "Of a job of several processes (--ntasks): this task's (default 0)")
      ->check(CLI::Range(0, 1023));
  st.client.AddTo(logs, false);
  logs->callback([&, s] { action = [&, s] { return RunLogs(*s, out, err); }; });

  CLI::App* cancel =
      app.add_subcommand("cancel", "Cancel jobs (your own, or anyone's as an admin)");
  cancel->add_option("ids", st.ids, "Job ids: 12, an array (all its tasks) or one task, 12_3")
      ->required()
      ->check(JobId());
  cancel->add_flag("--force", st.force,
                   "Kill running jobs now (SIGKILL) instead of SIGTERM and their grace period");
  st.client.AddTo(cancel);
  cancel->callback([&, s] { action = [&, s] { return RunCancel(*s, out, err); }; });

  CLI::App* prio = app.add_subcommand(
      "priority",
      "Change a queued job's priority (yours up to your ceiling, or anyone's as an admin)");
  prio->add_option("id", st.id, "Job id (12, or an array's task 12_3)")->required()->check(JobId());
  prio->add_option("priority", st.priority, "The new priority, -1000..1000 (higher first)")
      ->required()
      ->check(CLI::Range(-1000, 1000));
  st.client.AddTo(prio);
  prio->callback([&, s] { action = [&, s] { return RunPriority(*s, out, err); }; });

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

  CLI::App* acct = app.add_subcommand(
      "acct", "Accounting: GPU-hours, jobs, failures and waits over a period, like sacct/sreport");
  acct->add_option("--since", st.since,
                   "From: a duration ago (90m, 7d), a date (2026-11-01), a date and time "
                   "(2026-11-01T08:00) or epoch seconds (default 7d)");
  acct->add_option("--until", st.until, "To: the same forms, or now (default now)");
  acct->add_option("--by", st.by, "One line per user, group (the owner's primary) or GPU model")
      ->check(CLI::IsMember({"user", "group", "model"}));
  acct->add_option("--user", st.acct_user,
                   "Only this user's jobs (yours are all you see unless you are an admin)");
  acct->add_flag("--jobs", st.acct_jobs,
                 "One line per job that ended (or ran) in the period, like sacct, instead of sums");
  acct->add_option("--format", st.acct_format,
                   "With --jobs: the columns, from id,name,user,state,submit,start,end,elapsed,"
                   "wait,gpus,gpu_util,gpu_mem,exit,reason")
      ->capture_default_str();
  acct->add_option("--socket", st.client.socket, "Server to talk to (as for the other commands)");
  acct->add_option("--token", st.client.token, "Bearer token for an https:// or tcp:// server");
  acct->add_option("--ca-cert", st.client.ca_cert, "CA certificate for an https:// server");
  acct->add_option("-o,--output", st.client.output, "Output format: table, json, yaml or csv")
      ->check(CLI::IsMember({"table", "json", "yaml", "csv"}));
  acct->callback([&, s] { action = [&, s] { return RunAcct(*s, out, err); }; });

  CLI::App* top = app.add_subcommand("top", "A live view of the GPUs and jobs");
  top->add_flag("--once", st.once, "Print one screen and exit");
  top->add_option("--interval", st.interval, "Seconds between refreshes (default 1)")
      ->check(CLI::Range(0.1, 3600.0));
  st.client.AddTo(top);
  top->callback([&, s] { action = [&, s] { return RunTop(*s, out, err); }; });
  return s;
}

}  // namespace tessera::cli
