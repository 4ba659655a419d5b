// The job verbs of `tessera` that change jobs: submit (a command or a script with its
// directives), run (live output, the job's exit code), cancel, hold/release, priority; and the
// options a job takes. Those that read (ls, show, eff, logs) are in jobs_read_cmd.cc.
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
#include "tessera/cli/remote.h"
#include "tessera/cli/when.h"
#include "tessera/core/gpu.h"
#include "tessera/net/http.h"
#include "tessera/server/server.h"

extern char** environ;

namespace tessera::cli::remote {

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
  if (s.gpus_max > 0) res["gpus_max"] = s.gpus_max;
  if (!s.gpu_mem.empty()) res["gpu_memory"] = s.gpu_mem;
  if (!s.gpu_share.empty()) res["gpu_share"] = s.gpu_share;
  if (!s.sharing.empty()) res["sharing"] = s.sharing;
  if (!s.models.empty()) res["model"] = s.models;
  if (s.cpus > 0) res["cpus"] = s.cpus;
  if (!s.mem.empty()) res["memory"] = s.mem;
  spec["resources"] = res;
  spec["priority"] = s.priority;
  spec["preemptible"] = !s.no_preempt;
  if (!s.max_runtime.empty()) spec["max_runtime_s"] = s.max_runtime;
  if (!s.grace.empty()) spec["grace_period_s"] = s.grace;
  if (!s.trial.empty()) spec["trial_s"] = s.trial;
  if (!s.resize.empty()) {
    json resize = {{"by", s.resize}};
    if (!s.resize_grace.empty()) resize["grace_s"] = s.resize_grace;
    if (!s.resize_unanswered.empty()) resize["unanswered"] = s.resize_unanswered;
    spec["resize"] = resize;
  } else if (!s.resize_grace.empty() || !s.resize_unanswered.empty()) {
    err << "tessera: --resize-grace and --resize-unanswered go with --resize signal\n";
    return std::nullopt;
  }
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
  // JSON carries UTF-8 text: a command or environment with other bytes is refused here, saying
  // where (it aborted the CLI before).
  for (const char* field : {"command", "env"}) {
    if (!spec.contains(field)) continue;
    for (const auto& [k, v] : spec[field].items()) {
      const std::string text = v.is_string() ? v.get<std::string>() : "";
      size_t bad = 0;
      if (IsUtf8(text, &bad) && IsUtf8(k)) continue;
      err << fmt::format(
          "tessera: {}[{}] is not UTF-8 text (byte 0x{:02x} at offset {}): a job's command and "
          "environment travel as JSON text; pass such bytes in a file, or let the job make them "
          "(printf '\\351')\n",
          field, k, IsUtf8(text) ? 0 : static_cast<unsigned char>(text[bad]), bad);
      *code = kExitBadInput;
      return std::nullopt;
    }
  }
  return Call(c, "POST", "/v1/jobs", spec.dump(), err, code, key);
}

void AddSubmitOptions(CLI::App* c, State& s);

// Whether the command line gave `o` or an option that sets the same thing under another spelling
// (Slurm's --time for --max-runtime, --gres for --gpus and --model).
bool GivenOnCommandLine(const CLI::App& app, const CLI::Option& o) {
  static const std::vector<std::vector<std::string>> kSame = {
      {"--max-runtime", "--time"}, {"--gpus", "--gres"}, {"--model", "--gres"}};
  if (o.count() > 0) return true;
  for (const auto& same : kSame) {
    if (std::find(same.begin(), same.end(), "--" + o.get_single_name()) == same.end()) continue;
    for (const std::string& name : same) {
      const CLI::Option* other = app.get_option_no_throw(name);
      if (other != nullptr && other->count() > 0) return true;
    }
  }
  return false;
}

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
      if (o == nullptr || !GivenOnCommandLine(*s.submit_app, *o)) {
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
  if (s.parsable) {
    // What a script reads: the job's (or the array's) id and nothing else, as sbatch --parsable.
    out << (*job)["id"].get<int64_t>() << "\n";
    return kExitOk;
  }
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

int RunCancel(State& s, std::ostream& out, std::ostream& err) {
  net::HttpClient c = s.client.Client();
  int worst = kExitOk;
  if (s.ids.empty() && s.cancel_user.empty() && s.cancel_name.empty()) {
    err << "tessera: cancel what? Job ids (12, 12_3), or -u USER / --name NAME for every queued "
           "or running job of theirs\n";
    return kExitBadInput;
  }
  if (s.ids.empty()) {
    // scancel -u/-n/-t: the matching jobs, each (an array's tasks one by one: a state filter
    // applies to each).
    int code = kExitOk;
    std::string user = s.cancel_user;
    if (user.empty()) {
      auto info = Call(c, "GET", "/v1/info", "", err, &code);
      if (!info) return code;
      user = (*info)["caller"].value("user", "");
    }
    const std::string states = s.cancel_states.empty() ? "queued,running" : s.cancel_states;
    auto jobs = ListJobs(c, fmt::format("/v1/jobs?arrays=expand&state={}&user={}", states, user), 0,
                         err, &code);
    if (!jobs) return code;
    for (const json& j : *jobs) {
      if (!s.cancel_name.empty() && j.value("name", "") != s.cancel_name) continue;
      s.ids.push_back(JobRef(j));
    }
    if (s.ids.empty()) {
      err << fmt::format("tessera: no {} job of {}{} to cancel\n", states, user,
                         s.cancel_name.empty() ? "" : " named '" + s.cancel_name + "'");
      return kExitOk;
    }
  }
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
        // A running job's stop is sent by the server's loop, maybe after this answer: said for
        // every running job, not only one already marked stopping.
        const bool stopping = j->contains("stopping") || j->value("state", "") == "running";
        out << fmt::format("job {}: {}{}\n", id, j->value("state", ""),
                           !stopping ? ""
                           : s.force ? " (stopping: SIGKILL sent)"
                                     : " (stopping: SIGTERM sent, SIGKILL after its grace period)");
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
  std::string said, state = "queued";
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
        state = (*r)["state"].get<std::string>();
        started = started || state != "queued";
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
    if (!any && !stop_requested) {
      // Until its state changes or it writes more (the server answers at once), a quarter of a
      // second at most so that Ctrl-C is acted on soon.
      int64_t bytes = 0;
      for (int64_t o : offsets) bytes += o;
      auto w =
          Call(c, "GET",
               fmt::format("/v1/jobs/{}/wait?state={}&bytes={}&timeout_s=0.25", id, state, bytes),
               "", err, &code);
      if (!w) return code;
    }
  }
  auto j = Call(c, "GET", fmt::format("/v1/jobs/{}", id), "", err, &code);
  if (!j) return code;
  state = j->value("state", "");
  if (state == "succeeded") return kExitOk;
  err << "tessera: job " << id << " " << state << ": " << j->value("reason", "") << "\n";
  // Its own exit code, as srun gives it; 130 for one cancelled here, 1 when none is known.
  if ((*j)["exit_code"].is_number()) return (*j)["exit_code"].get<int>();
  return cancelling ? 130 : kExitFailure;
}

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
  auto* gpus =
      c->add_option("--gpus", s.gpus_text,
                    "Whole GPUs; with --gpu-mem/--gpu-share, how many GPUs get that fraction "
                    "(default one). MIN-MAX (2-8): elastic, it starts when MIN fit, on as many "
                    "up to MAX as fit while nothing queued wants a GPU, and keeps that size "
                    "(with --resize: resized while it runs); it reads how many it got from "
                    "CUDA_VISIBLE_DEVICES")
          ->check(CLI::Validator(
              [&s](std::string& v) -> std::string {
                absl::StatusOr<std::pair<int, int>> range = ParseGpuRange(v);
                if (!range.ok()) return std::string(range.status().message());
                std::tie(s.gpus, s.gpus_max) = *range;
                return "";
              },
              "N|MIN-MAX"));
  c->add_option("--gpu-mem", s.gpu_mem,
                "A fraction of a GPU: this much of its memory (10GiB), on each of --gpus GPUs; "
                "auto: sized by the server from what jobs of its kind used");
  c->add_option("--gpu-share", s.gpu_share,
                "A fraction of a GPU: this share of its compute (30%, 30 or 0.3), on each of "
                "--gpus GPUs; auto: sized by the server from what jobs of its kind used");
  c->add_option("--sharing", s.sharing,
                "How its GPUs are shared: time-slice (paced slices: priorities, preemption, a "
                "share whatever its process count) or mps (NVIDIA MPS: kernels of several "
                "processes at once; an MPS GPU serves one user's jobs at a time). Default: a "
                "share in time slices")
      ->check(CLI::IsMember({"time-slice", "mps"}));
  auto* models = c->add_option("--model", s.models,
                               "Acceptable GPU model(s): a name as `tessera gpus` shows it, or "
                               "whole words of one (H100, 'A100 80GB')")
                     ->allow_extra_args(false);
  // Slurm's spelling: gpu:N or gpu:TYPE:N, as sbatch takes it.
  c->add_option("--gres", s.gres,
                "Slurm's gpu:N or gpu:TYPE:N (--gpus N --model TYPE), or mps:N (--sharing mps "
                "--gpu-share N%)")
      ->check(CLI::Validator(
          [&s](std::string& v) -> std::string {
            std::vector<std::string> ignored;
            auto args = TranslateSbatch({"--gres", v}, &ignored);
            if (!args.ok()) return std::string(args.status().message());
            if (args->empty())
              return "--gres=" + v + ": Tessera schedules gpu (gpu:N, gpu:TYPE:N) and mps:N";
            for (size_t i = 0; i + 1 < args->size(); i += 2) {
              if ((*args)[i] == "--gpus") s.gpus = std::stoi((*args)[i + 1]);
              if ((*args)[i] == "--model") s.models.push_back((*args)[i + 1]);
              if ((*args)[i] == "--sharing") s.sharing = (*args)[i + 1];
              if ((*args)[i] == "--gpu-share") s.gpu_share = (*args)[i + 1];
            }
            return "";
          },
          "gpu[:TYPE]:N"))
      ->excludes(gpus)
      ->excludes(models);
  c->add_option("--cpus,-c,--cpus-per-task", s.cpus,
                "Host CPUs (2, 0.5): scheduled against the machine's and a limit of the job's "
                "cgroup")
      ->check(CLI::Range(0.01, 4096.0));
  c->add_option("--mem", s.mem,
                "Host memory (16G, 16GiB, 16384 MiB): scheduled, and the job is killed (OOM) "
                "above it");
  c->add_option("--priority", s.priority,
                "Priority, -1000..1000 (higher first; may preempt lower)");
  c->add_flag("--no-preempt", s.no_preempt, "This job may not be preempted");
  c->add_option("--name,-J,--job-name", s.name, "A name for the job");
  auto* max_runtime =
      c->add_option("--max-runtime", s.max_runtime,
                    "Stop the job after this long: 3600 (seconds), 90s, 15m, 1h, 1h30m, HH:MM:SS, "
                    "D-HH:MM:SS (default and most: the server's limits)")
          ->check(Duration(false, 1e9));
  // Slurm's --time: a bare number is minutes.
  c->add_option("-t,--time", s.max_runtime,
                "Slurm's --time: as --max-runtime, but a bare number is minutes (10 = 10m), "
                "MM:SS, HH:MM:SS, D-HH, D-HH:MM")
      ->transform(CLI::Validator(
          [](std::string& v) -> std::string {
            if (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos) v += "m";
            return "";
          },
          "TIME"))
      ->check(Duration(false, 1e9))
      ->excludes(max_runtime);
  c->add_option("--trial", s.trial,
                "A trial run: stop it after this long (2m, 90s), as a success that says what it "
                "used and the --gpu-share/--gpu-mem it recommends; its use sizes later "
                "--gpu-share/--gpu-mem auto jobs of its kind")
      ->check(Duration(false, 86400));
  c->add_option("--resize", s.resize,
                "With --gpus MIN-MAX: resize the job while it runs. signal: it is told its new "
                "GPUs in $TESSERA_RESIZE_FILE and by SIGUSR1, checkpoints and exits 75, and is "
                "started again on them; restart: it is stopped (SIGTERM) and started again on "
                "them. Default: its size is fixed when it starts")
      ->check(CLI::IsMember({"signal", "restart"}));
  c->add_option("--resize-grace", s.resize_grace,
                "With --resize signal: how long it has to exit 75 after SIGUSR1 (default 60s)")
      ->check(Duration(true, 3600));
  c->add_option("--resize-unanswered", s.resize_unanswered,
                "With --resize signal, when it has not exited in its grace: restart (stop it and "
                "start it again on its new size; the default) or keep (a growth is given up; a "
                "shrink is carried out anyway)")
      ->check(CLI::IsMember({"restart", "keep"}));
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

}  // namespace tessera::cli::remote
