#pragma once
// The client side of `tessera`'s server verbs, shared by client_cmd.cc (accounting, top and the
// wiring of every client verb), serve_cmd.cc (the daemon) and jobs_cmd.cc (submit, run, ls, show,
// logs, cancel, hold, priority): the flags every client verb takes, one API call, how jobs are
// shown, the parsed options, and the verbs themselves.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "tessera/net/http.h"
#include "tessera/server/server.h"

namespace tessera::cli::remote {

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
                  "(default $TESSERA_SOCKET, else your own server's " +
                      server::DefaultSocketPath() + " when it is there, else the system's " +
                      server::kSystemSocket + ")");
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
    return e && *e ? e : server::ClientSocketPath();
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

// GET /v1/jobs (`target`: the path and its query, without limit or before) for the newest `want`
// jobs (0: all), newest last, in pages of what the server answers at once ("more",
// "next_before"); an array folded in two pages is listed once. `more`: the server had older ones
// than the `want` returned.
std::optional<json> ListJobs(net::HttpClient& c, const std::string& target, size_t want,
                             std::ostream& err, int* code, bool* more = nullptr);
std::optional<json> Call(net::HttpClient& c, const std::string& method, const std::string& target,
                         const std::string& body, std::ostream& err, int* code,
                         const std::string& idempotency_key = "");

// How a job is shown: its age, resources, GPUs, id (12, 12_3), state, times.
std::string Age(double since);
std::string Resources(const json& spec);
std::string Where(const json& job);
std::string JobRef(const json& j);
std::string StateText(const json& j, bool array = false);
std::string Relative(double at);
std::string Expected(const json& j);
void JobsTable(const json& jobs, std::ostream& out);
void Emit(const json& j, const std::string& format, std::ostream& out);

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
  int gpus_max = 0;       // --gpus MIN-MAX: elastic
  std::string gpus_text;  // --gpus as written (N or MIN-MAX), put in gpus and gpus_max
  std::string gpu_mem, gpu_share, sharing, name, workdir, image, mem, idempotency_key;
  std::string gres;  // Slurm's --gres, already put in gpus and models
  double cpus = 0;
  std::vector<std::string> models, envs, labels, command;
  int priority = 0;
  bool no_preempt = false, no_env = false;
  std::string trial;        // --trial: as the user wrote it ("2m")
  std::string max_runtime;  // as the user wrote it ("1h", "01:00:00", 3600): the server parses it
  std::string grace;
  // --resize signal|restart, --resize-grace, --resize-unanswered: an elastic job resized while it
  // runs
  std::string resize, resize_grace, resize_unanswered;
  // ls / show / logs / cancel / top
  std::string states;
  std::string ls_user;
  bool ls_all = false;
  bool ls_ended = false;  // ls --ended: ended jobs only (sacct's view)
  int limit = 50;
  bool expand = false;
  std::string id;  // 12, or an array's task 12_3
  std::vector<std::string> ids;
  int task = -1;
  // acct
  std::string since = "7d", until = "now", by = "user", acct_user;
  bool follow = false, stderr_stream = false, once = false;
  bool raw = false;    // logs: the bytes as written (else control characters shown escaped)
  bool force = false;  // cancel --force
  std::string cancel_user, cancel_states, cancel_name;  // cancel -u, -t, -n
  bool acct_jobs = false;                               // acct --jobs
  std::string acct_format = "id,name,user,state,start,end,elapsed,gpus,exit";
  std::string acct_sort;      // acct --jobs --sort FIELD
  bool acct_reverse = false;  // acct --jobs --reverse
  double interval = 1;
  CLI::App* submit_app = nullptr;  // what `submit` was given, for its script's directives
  bool label = false;              // run -l
  bool parsable = false;           // submit --parsable: the id alone, as sbatch --parsable
};

// A job's output as `tessera run` shows it: every process's, each stream in whole lines (a line
// of one process is never cut by another's), prefixed with the rank ("1: ") under -l; one
// process's output as it comes when unlabelled.

// The job verbs (jobs_cmd.cc).
int RunSubmit(State& s, std::ostream& out, std::ostream& err);
int RunLs(State& s, std::ostream& out, std::ostream& err);
int RunShow(State& s, std::ostream& out, std::ostream& err);
int RunEff(State& s, std::ostream& out, std::ostream& err);
int RunLogs(State& s, std::ostream& out, std::ostream& err);
int RunCancel(State& s, std::ostream& out, std::ostream& err);
int RunRun(State& s, std::ostream& out, std::ostream& err);
int RunHold(State& s, bool hold, std::ostream& out, std::ostream& err);
int RunPriority(State& s, std::ostream& out, std::ostream& err);
// A duration option's check: 90, 90s, 15m, 1h, HH:MM:SS, D-HH:MM:SS (0 allowed when `zero`).
CLI::Validator Duration(bool zero, double most);
// The options of a job, for submit and run alike.
void AddSubmitOptions(CLI::App* c, State& s);

}  // namespace tessera::cli::remote
