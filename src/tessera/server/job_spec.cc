#include "tessera/server/job_spec.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>
#include <system_error>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "tessera/core/gpu.h"

namespace tessera::server {
namespace {

// The least compute share a job may ask: 1/64 of a GPU (rounded up to a permille), so that a GPU
// never holds more compute shares than its arbiter paces (shim::kArbiterJobs).
constexpr double kMinSharePercent = 1.6;

using nlohmann::json;

absl::Status Bad(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", field, what));
}

std::string TypeName(const json& v) { return v.type_name(); }

absl::Status Unknown(const json& obj, std::initializer_list<std::string_view> known,
                     std::string_view where) {
  for (const auto& [k, v] : obj.items()) {
    bool ok = false;
    for (std::string_view n : known) ok = ok || k == n;
    if (!ok) {
      return absl::InvalidArgumentError(where.empty()
                                            ? fmt::format("unknown field '{}'", k)
                                            : fmt::format("{}: unknown field '{}'", where, k));
    }
  }
  return absl::OkStatus();
}

absl::Status String(const json& v, std::string_view field, std::string* out, size_t max = 4096) {
  if (!v.is_string()) return Bad(field, fmt::format("expected a string, got {}", TypeName(v)));
  *out = v.get<std::string>();
  if (out->size() > max) return Bad(field, fmt::format("longer than {} characters", max));
  return absl::OkStatus();
}

// A portable environment variable name (POSIX.1-2017, 8.1): letters, digits and '_', not starting
// with a digit. Anything else (a newline, '=', a space) is not a name a shell or a process can use,
// and may be read as more than one variable by what the environment is handed to.
bool PosixName(std::string_view k) {
  if (k.empty() || (k[0] >= '0' && k[0] <= '9')) return false;
  for (char c : k) {
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  }
  return true;
}

absl::Status StringMap(const json& v, std::string_view field,
                       std::map<std::string, std::string>* out, bool env_names) {
  if (!v.is_object())
    return Bad(field, fmt::format("expected an object of strings, got {}", TypeName(v)));
  if (v.size() > 1000) return Bad(field, "more than 1000 entries");
  for (const auto& [k, val] : v.items()) {
    if (k.empty() || k.size() > 256 || k.find('\0') != std::string::npos) {
      return Bad(field, fmt::format("bad name '{}'", k));
    }
    if (env_names && !PosixName(k)) {
      return Bad(field, fmt::format("bad name {}: a variable name is letters, digits and '_', not "
                                    "starting with a digit",
                                    json(k).dump()));
    }
    std::string s;
    if (absl::Status st = String(val, fmt::format("{}.{}", field, k), &s, 65536); !st.ok())
      return st;
    if (s.find('\0') != std::string::npos)
      return Bad(fmt::format("{}.{}", field, k), "contains a NUL byte");
    (*out)[k] = s;
  }
  return absl::OkStatus();
}

// Seconds as a number, or as a duration people write ("90s", "15m", "1h", "01:00:00",
// "1-00:00:00": core::ParseDuration); above 0 (or 0 too, with `zero`) and at most `most`.
absl::Status Seconds(const json& v, std::string_view field, bool zero, double most, double* out) {
  std::optional<double> s;
  if (v.is_number()) {
    s = v.get<double>();
  } else if (v.is_string()) {
    const std::string t = v.get<std::string>();
    s = zero && (t == "0" || t == "0s") ? std::optional<double>(0) : core::ParseDuration(t);
  }
  if (!s || !(*s >= 0) || (!zero && *s == 0) || *s > most) {
    return Bad(field, fmt::format("expected seconds in {}..{:g} (90, \"90s\", \"15m\", \"1h\", "
                                  "\"01:30:00\", \"1-00:00:00\"), got {}",
                                  zero ? "0" : "0 (not included)", most, v.dump()));
  }
  *out = *s;
  return absl::OkStatus();
}

absl::Status Integer(const json& v, std::string_view field, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer())
    return Bad(field, fmt::format("expected a whole number, got {}", TypeName(v)));
  // (A non-negative literal is unsigned in nlohmann's eyes: checked against both bounds too.)
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) ||
                                   (lo > 0 && v.get<uint64_t>() < static_cast<uint64_t>(lo))
                             : v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return Bad(field, fmt::format("expected {}..{}, got {}", lo, hi, v.dump()));
  }
  *out = v.get<int64_t>();
  return absl::OkStatus();
}

// "10GiB", "512MiB" or a number of MiB.
absl::Status Memory(const json& v, std::string_view field, int64_t* mib) {
  uint64_t bytes = 0;
  if (v.is_number_integer()) {
    int64_t m = 0;
    if (absl::Status st = Integer(v, field, 1, int64_t{1} << 30, &m); !st.ok()) return st;
    *mib = m;
    return absl::OkStatus();
  }
  if (!v.is_string())
    return Bad(field, fmt::format("expected a size such as \"10GiB\", got {}", TypeName(v)));
  auto parsed = core::ParseBytes(v.get<std::string>());
  if (!parsed || *parsed < (1u << 20) || *parsed > (uint64_t{1} << 50)) {
    return Bad(field, fmt::format("expected a size between 1MiB and 1PiB such as \"10GiB\", got {}",
                                  v.dump()));
  }
  bytes = *parsed;
  *mib = static_cast<int64_t>(bytes >> 20);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Parse again for the position of the error.
    try {
      json unused = json::parse(text);
      (void)unused;
    } catch (const json::parse_error& e) {
      return absl::InvalidArgumentError(fmt::format("malformed JSON: {}", e.what()));
    }
    return absl::InvalidArgumentError("malformed JSON");
  }
  return JobSpecFromJson(j);
}

// Long by design (issue 32 asks for a reason): one block per field of the job format, in the
// order of its reference in docs/server.md, each with its own error; split, the fields would only
// move apart from each other.
// The server's sizing of a job's "auto" resources, as stored with it (JobSpecToJson): the sizes
// it was given (none: whole GPUs) and how they were found.
static absl::Status ParseSized(const json& v, JobSpec& s) {
  if (!v.is_object() || !v.contains("basis") || !v["basis"].is_string())
    return Bad("sized", "expected an object with a basis (set by the server)");
  if (absl::Status st = Unknown(v, {"basis", "gpu_share", "gpu_memory", "trial_s"}, "sized");
      !st.ok())
    return st;
  s.sizing = v["basis"].get<std::string>();
  if (v.contains("trial_s")) {
    if (absl::Status st = Seconds(v["trial_s"], "sized.trial_s", false, 86400, &s.sizing_trial_s);
        !st.ok())
      return st;
  }
  if (v.contains("gpu_memory")) {
    if (!s.gpu_memory_auto) return Bad("sized.gpu_memory", "the job's gpu_memory is not auto");
    if (absl::Status st = Memory(v["gpu_memory"], "sized.gpu_memory", &s.gpu_memory_mib); !st.ok())
      return st;
  }
  if (v.contains("gpu_share")) {
    if (!s.gpu_share_auto) return Bad("sized.gpu_share", "the job's gpu_share is not auto");
    std::string t = v["gpu_share"].is_string() ? v["gpu_share"].get<std::string>() : "";
    double pct = 0;
    if (!t.empty() && t.back() == '%') t.pop_back();
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), pct);
    if (ec != std::errc() || end != t.data() + t.size() || !(pct >= kMinSharePercent && pct < 100))
      return Bad("sized.gpu_share",
                 fmt::format("expected a share such as \"35%\", got {}", v["gpu_share"].dump()));
    s.gpu_milli = static_cast<int>(std::lround(pct * 10));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> JobSpecFromJson(const json& j) {
  if (!j.is_object())
    return absl::InvalidArgumentError(fmt::format("expected a JSON object, got {}", TypeName(j)));
  if (absl::Status st = Unknown(
          j, {"command",       "env",          "workdir",     "name",          "labels",
              "resources",     "priority",     "preemptible", "max_runtime_s", "grace_period_s",
              "image",         "array",        "after",       "hold",          "ntasks",
              "tasks_per_gpu", "task_failure", "stdout_file", "stderr_file",   "requeue",
              "sized",         "trial_s",      "resize"},
          "");
      !st.ok()) {
    return st;
  }
  JobSpec s;
  if (!j.contains("command")) return Bad("command", "required: the program and its arguments");
  const json& cmd = j["command"];
  if (!cmd.is_array() || cmd.empty())
    return Bad("command", "expected a non-empty array of strings");
  if (cmd.size() > 10000) return Bad("command", "more than 10000 arguments");
  for (size_t i = 0; i < cmd.size(); ++i) {
    std::string a;
    if (absl::Status st = String(cmd[i], fmt::format("command[{}]", i), &a, 1 << 17); !st.ok())
      return st;
    if (a.find('\0') != std::string::npos)
      return Bad(fmt::format("command[{}]", i), "contains a NUL byte");
    s.command.push_back(std::move(a));
  }
  if (s.command[0].empty()) return Bad("command[0]", "empty program name");
  if (j.contains("env")) {
    if (absl::Status st = StringMap(j["env"], "env", &s.env, true); !st.ok()) return st;
  }
  if (j.contains("labels")) {
    if (absl::Status st = StringMap(j["labels"], "labels", &s.labels, false); !st.ok()) return st;
  }
  if (j.contains("workdir")) {
    if (absl::Status st = String(j["workdir"], "workdir", &s.workdir); !st.ok()) return st;
    if (!s.workdir.empty() && s.workdir[0] != '/')
      return Bad("workdir", "expected an absolute path");
  }
  if (j.contains("name")) {
    if (absl::Status st = String(j["name"], "name", &s.name, 128); !st.ok()) return st;
  }
  if (j.contains("image")) {
    if (absl::Status st = String(j["image"], "image", &s.image, 512); !st.ok()) return st;
  }
  if (j.contains("priority")) {
    int64_t p = 0;
    if (absl::Status st = Integer(j["priority"], "priority", -1000, 1000, &p); !st.ok()) return st;
    s.priority = static_cast<int>(p);
  }
  if (j.contains("preemptible")) {
    if (!j["preemptible"].is_boolean()) {
      return Bad("preemptible",
                 fmt::format("expected true or false, got {}", TypeName(j["preemptible"])));
    }
    s.preemptible = j["preemptible"].get<bool>();
  }
  if (j.contains("max_runtime_s")) {
    if (absl::Status st =
            Seconds(j["max_runtime_s"], "max_runtime_s", false, 1e9, &s.max_runtime_s);
        !st.ok())
      return st;
  }
  if (j.contains("grace_period_s")) {
    if (absl::Status st =
            Seconds(j["grace_period_s"], "grace_period_s", true, 3600, &s.grace_period_s);
        !st.ok())
      return st;
  }
  if (j.contains("resize")) {
    const json& rz = j["resize"];
    if (!rz.is_object())
      return Bad("resize", fmt::format("expected an object, got {}", TypeName(rz)));
    if (absl::Status st = Unknown(rz, {"by", "grace_s", "unanswered"}, "resize"); !st.ok())
      return st;
    if (!rz.contains("by")) return Bad("resize.by", "required: signal or restart");
    if (absl::Status st = String(rz["by"], "resize.by", &s.resize_by, 16); !st.ok()) return st;
    if (s.resize_by != "signal" && s.resize_by != "restart")
      return Bad("resize.by", fmt::format("expected signal or restart, got '{}'", s.resize_by));
    if (rz.contains("grace_s")) {
      if (absl::Status st = Seconds(rz["grace_s"], "resize.grace_s", true, 3600, &s.resize_grace_s);
          !st.ok())
        return st;
    }
    if (rz.contains("unanswered")) {
      if (absl::Status st = String(rz["unanswered"], "resize.unanswered", &s.resize_unanswered, 16);
          !st.ok())
        return st;
      if (s.resize_unanswered != "restart" && s.resize_unanswered != "keep") {
        return Bad("resize.unanswered",
                   fmt::format("expected restart or keep, got '{}'", s.resize_unanswered));
      }
    }
  }
  if (j.contains("trial_s")) {
    if (absl::Status st = Seconds(j["trial_s"], "trial_s", false, 86400, &s.trial_s); !st.ok())
      return st;
  }
  if (j.contains("array")) {
    // Its indices are checked against the server's maximum at submission (ParseArray).
    if (absl::Status st = String(j["array"], "array", &s.array, 4096); !st.ok()) return st;
    if (s.array.empty()) return Bad("array", "empty (e.g. \"0-99%8\")");
  }
  if (j.contains("after")) {
    const json& v = j["after"];
    if (!v.is_array())
      return Bad("after",
                 fmt::format("expected an array such as [\"ok:12\"], got {}", TypeName(v)));
    if (v.size() > 1000) return Bad("after", "more than 1000 dependencies");
    for (size_t i = 0; i < v.size(); ++i) {
      std::string text;
      const std::string field = fmt::format("after[{}]", i);
      if (absl::Status st = String(v[i], field, &text, 64); !st.ok()) return st;
      auto d = ParseDependency(text);
      if (!d.ok()) return Bad(field, std::string(d.status().message()));
      if (std::find(s.after.begin(), s.after.end(), *d) == s.after.end()) s.after.push_back(*d);
    }
  }
  if (j.contains("hold")) {
    if (!j["hold"].is_boolean())
      return Bad("hold", fmt::format("expected true or false, got {}", TypeName(j["hold"])));
    s.hold = j["hold"].get<bool>();
  }
  for (const char* f : {"ntasks", "tasks_per_gpu"}) {
    if (!j.contains(f)) continue;
    int64_t n = 0;
    if (absl::Status st = Integer(j[f], f, 1, 1024, &n); !st.ok()) return st;
    (std::string_view(f) == "ntasks" ? s.ntasks : s.tasks_per_gpu) = static_cast<int>(n);
  }
  if (s.ntasks > 0 && s.tasks_per_gpu > 0)
    return Bad("ntasks", "give ntasks (in all) or tasks_per_gpu, not both");
  if (j.contains("task_failure")) {
    if (absl::Status st = String(j["task_failure"], "task_failure", &s.task_failure, 16); !st.ok())
      return st;
    if (s.task_failure != "kill" && s.task_failure != "wait")
      return Bad("task_failure", fmt::format("expected kill or wait, got '{}'", s.task_failure));
  }
  for (const char* f : {"stdout_file", "stderr_file"}) {
    if (!j.contains(f)) continue;
    std::string text;
    if (absl::Status st = String(j[f], f, &text, 4096); !st.ok()) return st;
    if (text.empty()) return Bad(f, "empty (e.g. \"train-%j.out\")");
    if (text.find('\0') != std::string::npos) return Bad(f, "contains a NUL byte");
    if (absl::Status st = CheckOutputPattern(text); !st.ok())
      return Bad(f, std::string(st.message()));
    if (text[0] != '/' && s.workdir.empty())
      return Bad(f, fmt::format("'{}' is relative: give an absolute path or a workdir", text));
    (std::string_view(f) == "stdout_file" ? s.stdout_file : s.stderr_file) = std::move(text);
  }
  if (j.contains("requeue")) {
    if (!j["requeue"].is_boolean())
      return Bad("requeue", fmt::format("expected true or false, got {}", TypeName(j["requeue"])));
    s.requeue = j["requeue"].get<bool>();
  }
  if (j.contains("resources")) {
    const json& r = j["resources"];
    if (!r.is_object())
      return Bad("resources", fmt::format("expected an object, got {}", TypeName(r)));
    if (absl::Status st = Unknown(r,
                                  {"gpus", "gpus_max", "gpu_memory", "gpu_share", "model",
                                   "min_gpu_memory", "topology", "cpus", "memory", "sharing"},
                                  "resources");
        !st.ok()) {
      return st;
    }
    if (r.contains("gpus")) {
      int64_t g = 0;
      if (absl::Status st = Integer(r["gpus"], "resources.gpus", 0, 64, &g); !st.ok()) return st;
      s.gpus = static_cast<int>(g);
    }
    if (r.contains("gpus_max")) {
      int64_t g = 0;
      if (absl::Status st = Integer(r["gpus_max"], "resources.gpus_max", 1, 64, &g); !st.ok())
        return st;
      s.gpus_max = static_cast<int>(g);
      if (s.gpus_max < std::max(s.gpus, 1)) {
        return Bad("resources.gpus_max",
                   fmt::format("{} is below resources.gpus ({}): give the most GPUs it can use",
                               s.gpus_max, s.gpus));
      }
    }
    if (r.contains("gpu_memory") && r["gpu_memory"] == "auto") {
      s.gpu_memory_auto = true;
    } else if (r.contains("gpu_memory")) {
      if (absl::Status st = Memory(r["gpu_memory"], "resources.gpu_memory", &s.gpu_memory_mib);
          !st.ok())
        return st;
    }
    if (r.contains("gpu_share") && r["gpu_share"] == "auto") {
      s.gpu_share_auto = true;
    } else if (r.contains("gpu_share")) {
      // "30%" and 30 are percent; a number below 1 without '%' is a fraction (0.3 = 30%, as the
      // intercept library reads TESSERA_CUDA_COMPUTE_SHARE); 1 without '%' is ambiguous (1%, or a
      // whole GPU?) and refused.
      const json& v = r["gpu_share"];
      double pct = -1;
      bool percent_sign = false;
      if (v.is_number()) {
        pct = v.get<double>();
      } else if (v.is_string()) {
        std::string t = v.get<std::string>();
        if (!t.empty() && t.back() == '%') t.pop_back(), percent_sign = true;
        try {
          size_t used = 0;
          pct = std::stod(t, &used);
          if (used != t.size() || t.empty() || !(t[0] >= '0' && t[0] <= '9')) pct = -1;
        } catch (...) {
          pct = -1;
        }
      }
      if (!percent_sign && pct == 1) {
        return Bad("resources.gpu_share",
                   fmt::format("{} is ambiguous: write \"1%\" for one percent, or leave gpu_share "
                               "out for a whole GPU",
                               v.is_string() ? v.get<std::string>() : v.dump()));
      }
      if (!percent_sign && pct > 0 && pct < 1) pct *= 100;  // a fraction
      // At least 1/64 of a GPU: a GPU's arbiter paces 64 jobs, so no GPU is given more compute
      // shares than it can pace (a 65th would wait for a slot).
      if (!(pct >= kMinSharePercent && pct < 100)) {
        return Bad("resources.gpu_share",
                   fmt::format("expected a share of a GPU between {}% (1/64: a GPU paces 64 jobs) "
                               "and 99.9% (\"30%\", 30 or 0.3), got {}; for whole GPUs leave it "
                               "out",
                               kMinSharePercent, v.dump()));
      }
      s.gpu_milli = static_cast<int>(std::lround(pct * 10));
    }
    if (r.contains("model")) {
      const json& v = r["model"];
      if (v.is_string()) {
        s.models.push_back(v.get<std::string>());
      } else if (v.is_array()) {
        for (size_t i = 0; i < v.size(); ++i) {
          std::string m;
          if (absl::Status st = String(v[i], fmt::format("resources.model[{}]", i), &m, 128);
              !st.ok())
            return st;
          s.models.push_back(m);
        }
      } else {
        return Bad("resources.model",
                   fmt::format("expected a string or an array of strings, got {}", TypeName(v)));
      }
      for (const std::string& m : s.models) {
        if (m.empty()) return Bad("resources.model", "empty model name");
      }
    }
    if (r.contains("min_gpu_memory")) {
      if (absl::Status st =
              Memory(r["min_gpu_memory"], "resources.min_gpu_memory", &s.min_gpu_memory_mib);
          !st.ok()) {
        return st;
      }
    }
    if (r.contains("cpus")) {
      const json& v = r["cpus"];
      if (!v.is_number() || !(v.get<double>() >= 0.01) || v.get<double>() > 4096) {
        return Bad(
            "resources.cpus",
            fmt::format("expected a number of CPUs between 0.01 and 4096, got {}", v.dump()));
      }
      s.cpu_milli = std::llround(v.get<double>() * 1000);
    }
    if (r.contains("memory")) {
      if (absl::Status st = Memory(r["memory"], "resources.memory", &s.memory_mib); !st.ok())
        return st;
    }
    if (r.contains("topology")) {
      if (absl::Status st = String(r["topology"], "resources.topology", &s.topology, 16); !st.ok())
        return st;
      if (s.topology != "none" && s.topology != "prefer" && s.topology != "require") {
        return Bad("resources.topology",
                   fmt::format("expected none, prefer or require, got '{}'", s.topology));
      }
    }
    if (r.contains("sharing")) {
      if (absl::Status st = String(r["sharing"], "resources.sharing", &s.sharing, 16); !st.ok())
        return st;
      if (!core::ParseGpuSharing(s.sharing)) {
        return Bad("resources.sharing",
                   fmt::format("expected time-slice or mps, got '{}'", s.sharing));
      }
    }
  }
  if (j.contains("sized")) {
    if (absl::Status st = ParseSized(j["sized"], s); !st.ok()) return st;
  }
  if (std::string why = core::ValidateRequest(RequestOf(s, 1, "")); !why.empty())
    return Bad("resources", why);
  if (s.gpus_max > 0) {
    // The job is told its size by its GPU list; per-GPU processes and shares have one size.
    if (s.Share() || s.gpu_share_auto || s.gpu_memory_auto)
      return Bad("resources.gpus_max", "an elastic job asks for whole GPUs, not a share of them");
    if (s.tasks_per_gpu > 0)
      return Bad("resources.gpus_max",
                 "an elastic job runs its own processes on the GPUs it is given; not with "
                 "tasks_per_gpu");
  }
  if (!s.resize_by.empty()) {
    if (s.gpus_max == 0)
      return Bad("resize", "only an elastic job is resized: ask a range of GPUs (--gpus MIN-MAX)");
    if (s.Tasks() > 1)
      return Bad("resize", "a job resized while it runs is one process group: not with ntasks");
    if (!s.image.empty() && s.resize_by == "signal") {
      return Bad("resize.by",
                 "a job in a container does not see the resize file; use resize by restart");
    }
  }
  if (s.tasks_per_gpu > 0 && s.gpus == 0 && !s.Share()) {
    return Bad("tasks_per_gpu",
               "the job asks for no GPU (resources.gpus, gpu_share, gpu_memory); use ntasks");
  }
  if (s.Tasks() > 1 && !s.image.empty())
    return Bad("image", "a job in a container runs one process; ntasks/tasks_per_gpu need none");
  if (s.sharing == "mps") {
    if (s.gpus > 1 && s.Tasks() < s.gpus) {
      return Bad("resources.sharing",
                 fmt::format("an MPS job on {} GPUs needs a process per GPU (tasks_per_gpu, or "
                             "ntasks >= {}): each process is a client of one GPU's daemon",
                             s.gpus, s.gpus));
    }
  }
  return s;
}

json JobSpecToJson(const JobSpec& s) {
  json j;
  j["command"] = s.command;
  if (!s.env.empty()) j["env"] = s.env;
  if (!s.workdir.empty()) j["workdir"] = s.workdir;
  if (!s.name.empty()) j["name"] = s.name;
  if (!s.labels.empty()) j["labels"] = s.labels;
  json r = json::object();
  if (s.gpus > 0) r["gpus"] = s.gpus;
  if (s.gpus_max > 0) r["gpus_max"] = s.gpus_max;
  if (s.gpu_memory_auto) {
    r["gpu_memory"] = "auto";
  } else if (s.gpu_memory_mib > 0) {
    r["gpu_memory"] = fmt::format("{}MiB", s.gpu_memory_mib);
  }
  if (s.gpu_share_auto) {
    r["gpu_share"] = "auto";
  } else if (s.gpu_milli > 0) {
    r["gpu_share"] = fmt::format("{:g}%", s.gpu_milli / 10.0);
  }
  if (!s.sizing.empty()) {
    json sized = {{"basis", s.sizing}};
    if (s.gpu_share_auto && s.gpu_milli > 0)
      sized["gpu_share"] = fmt::format("{:g}%", s.gpu_milli / 10.0);
    if (s.gpu_memory_auto && s.gpu_memory_mib > 0)
      sized["gpu_memory"] = fmt::format("{}MiB", s.gpu_memory_mib);
    if (s.sizing_trial_s > 0) sized["trial_s"] = s.sizing_trial_s;
    j["sized"] = std::move(sized);
  }
  if (!s.models.empty()) r["model"] = s.models;
  if (s.min_gpu_memory_mib > 0) r["min_gpu_memory"] = fmt::format("{}MiB", s.min_gpu_memory_mib);
  if (s.topology != "none") r["topology"] = s.topology;
  if (!s.sharing.empty()) r["sharing"] = s.sharing;
  if (s.cpu_milli > 0) r["cpus"] = static_cast<double>(s.cpu_milli) / 1000;
  if (s.memory_mib > 0) r["memory"] = fmt::format("{}MiB", s.memory_mib);
  j["resources"] = r;
  j["priority"] = s.priority;
  j["preemptible"] = s.preemptible;
  if (s.max_runtime_s > 0) j["max_runtime_s"] = s.max_runtime_s;
  if (s.grace_period_s >= 0) j["grace_period_s"] = s.grace_period_s;
  if (s.trial_s > 0) j["trial_s"] = s.trial_s;
  if (!s.resize_by.empty()) {
    j["resize"] = {
        {"by", s.resize_by}, {"grace_s", s.resize_grace_s}, {"unanswered", s.resize_unanswered}};
  }
  if (!s.image.empty()) j["image"] = s.image;
  if (!s.array.empty()) j["array"] = s.array;
  if (!s.after.empty()) {
    json a = json::array();
    for (const Dependency& d : s.after) a.push_back(DependencyText(d));
    j["after"] = a;
  }
  if (s.hold) j["hold"] = true;
  if (s.ntasks > 0) j["ntasks"] = s.ntasks;
  if (s.tasks_per_gpu > 0) j["tasks_per_gpu"] = s.tasks_per_gpu;
  if (s.Tasks() > 1 && s.task_failure != "kill") j["task_failure"] = s.task_failure;
  if (!s.stdout_file.empty()) j["stdout_file"] = s.stdout_file;
  if (!s.stderr_file.empty()) j["stderr_file"] = s.stderr_file;
  if (s.requeue) j["requeue"] = *s.requeue;
  return j;
}

absl::StatusOr<std::string> ExpandOutputPattern(std::string_view pattern, const OutputNames& n) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out += pattern[i];
      continue;
    }
    const size_t at = i++;
    int width = 0;
    while (i < pattern.size() && pattern[i] >= '0' && pattern[i] <= '9' && width < 100)
      width = width * 10 + (pattern[i++] - '0');
    if (i >= pattern.size()) {
      return absl::InvalidArgumentError(
          fmt::format("'%' at the end (write %% for a percent sign)"));
    }
    auto number = [&](int64_t v) { out += fmt::format("{:0{}}", v, width); };
    switch (pattern[i]) {
      case '%':
        out += '%';
        break;
      case 'j':
        number(n.job_id);
        break;
      case 'A':
        number(n.array_id != 0 ? n.array_id : n.job_id);
        break;
      case 'a':
        number(n.array_index >= 0 ? n.array_index : 4294967294);
        break;
      case 't':
        number(n.task);
        break;
      case 'u':
        out += n.user;
        break;
      case 'x':
        out += n.name;
        break;
      case 'N':
        out += n.host;
        break;
      default:
        return absl::InvalidArgumentError(fmt::format(
            "unknown escape '{}' at {} (Tessera has %j job, %A array, %a index, %t task, %u user, "
            "%x name, %N host, %% percent)",
            pattern.substr(at, i - at + 1), at + 1));
    }
  }
  return out;
}

absl::Status CheckOutputPattern(std::string_view pattern) {
  return ExpandOutputPattern(pattern, OutputNames{}).status();
}

std::string OutputFileOf(const JobSpec& spec, const OutputNames& names, bool err) {
  const std::string& pattern =
      err && !spec.stderr_file.empty() ? spec.stderr_file : spec.stdout_file;
  if (pattern.empty()) return "";
  auto path = ExpandOutputPattern(pattern, names);
  if (!path.ok() || path->empty()) return "";  // checked at submission
  if ((*path)[0] == '/' || spec.workdir.empty()) return *path;
  return spec.workdir + (spec.workdir.back() == '/' ? "" : "/") + *path;
}

std::string DependencyText(const Dependency& d) {
  const char* kind = d.kind == Dependency::Kind::kOk      ? "ok"
                     : d.kind == Dependency::Kind::kNotOk ? "notok"
                                                          : "any";
  return d.task >= 0 ? fmt::format("{}:{}_{}", kind, d.job, d.task)
                     : fmt::format("{}:{}", kind, d.job);
}

namespace {

// A whole number 0..max in `text` (digits only).
std::optional<int64_t> Number(std::string_view text, int64_t max) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v > max) return std::nullopt;
  return v;
}

}  // namespace

absl::StatusOr<Dependency> ParseDependency(std::string_view text) {
  Dependency d;
  const size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  if (colon == std::string_view::npos || (kind != "ok" && kind != "notok" && kind != "any")) {
    return absl::InvalidArgumentError(fmt::format(
        "'{}': expected ok:ID, notok:ID or any:ID (ID a job, an array, or ARRAY_INDEX)", text));
  }
  d.kind = kind == "ok"      ? Dependency::Kind::kOk
           : kind == "notok" ? Dependency::Kind::kNotOk
                             : Dependency::Kind::kAny;
  std::string_view ref = text.substr(colon + 1);
  const size_t us = ref.find('_');
  auto job = Number(ref.substr(0, us), int64_t{1} << 53);
  std::optional<int64_t> task = us == std::string_view::npos
                                    ? std::optional<int64_t>(-1)
                                    : Number(ref.substr(us + 1), kMaxArrayIndex);
  if (!job || *job <= 0 || !task) {
    return absl::InvalidArgumentError(
        fmt::format("'{}': '{}' is not a job id (12) or an array task (12_3)", text, ref));
  }
  d.job = *job;
  d.task = static_cast<int>(*task);
  return d;
}

int ArrayThrottle(std::string_view text) {
  const size_t pct = text.rfind('%');
  if (pct == std::string_view::npos) return 0;
  return static_cast<int>(Number(text.substr(pct + 1), 1000000).value_or(0));
}

absl::StatusOr<ArrayRange> ParseArray(std::string_view text, size_t max_tasks) {
  ArrayRange out;
  std::string_view list = text;
  if (size_t pct = text.rfind('%'); pct != std::string_view::npos) {
    auto t = Number(text.substr(pct + 1), 1000000);
    if (!t || *t == 0) {
      return absl::InvalidArgumentError(fmt::format(
          "'{}': after % comes how many tasks may run at once (a number from 1)", text));
    }
    out.throttle = static_cast<int>(*t);
    list = text.substr(0, pct);
  }
  if (list.empty())
    return absl::InvalidArgumentError(fmt::format("'{}': no index given (e.g. 0-99%8)", text));
  std::vector<int> all;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (comma != std::string_view::npos && list.empty()) item = "";  // a trailing comma
    int64_t step = 1;
    if (size_t colon = item.find(':'); colon != std::string_view::npos) {
      auto s = Number(item.substr(colon + 1), kMaxArrayIndex);
      if (!s || *s == 0) {
        return absl::InvalidArgumentError(
            fmt::format("'{}': the step after ':' in '{}' must be a number from 1", text, item));
      }
      step = *s;
      item = item.substr(0, colon);
    }
    const size_t dash = item.find('-');
    auto lo = Number(item.substr(0, dash), kMaxArrayIndex);
    auto hi = dash == std::string_view::npos ? lo : Number(item.substr(dash + 1), kMaxArrayIndex);
    if (!lo || !hi) {
      return absl::InvalidArgumentError(
          fmt::format("'{}': '{}' is not an index or a range of indices (0..{}), such as 5 or 0-99",
                      text, item, kMaxArrayIndex));
    }
    if (*hi < *lo) {
      return absl::InvalidArgumentError(
          fmt::format("'{}': the range {} runs backwards (write {}-{})", text, item, *hi, *lo));
    }
    for (int64_t i = *lo; i <= *hi; i += step) {
      all.push_back(static_cast<int>(i));
      if (all.size() > max_tasks) {
        return absl::InvalidArgumentError(fmt::format(
            "'{}': more than {} tasks, this server's most for one array (max_array_tasks)", text,
            max_tasks));
      }
    }
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  out.indices = std::move(all);
  return out;
}

namespace {

// Whether `part` occurs in `model` from the start of a word to the end of one, case aside.
bool HasWords(const std::string& model, const std::string& part) {
  if (part.empty() || part.size() > model.size()) return false;
  auto lower = [](std::string v) {
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return v;
  };
  const std::string m = lower(model), p = lower(part);
  for (size_t at = m.find(p); at != std::string::npos; at = m.find(p, at + 1)) {
    const size_t end = at + p.size();
    if ((at == 0 || m[at - 1] == ' ' || m[at - 1] == '-') &&
        (end == m.size() || m[end] == ' ' || m[end] == '-')) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::Status ResolveModels(JobSpec* spec, const std::vector<std::string>& available) {
  std::vector<std::string> resolved;
  auto add = [&](const std::string& m) {
    if (std::find(resolved.begin(), resolved.end(), m) == resolved.end()) resolved.push_back(m);
  };
  std::vector<std::string> distinct;
  for (const std::string& a : available) {
    if (std::find(distinct.begin(), distinct.end(), a) == distinct.end()) distinct.push_back(a);
  }
  for (const std::string& asked : spec->models) {
    if (std::find(distinct.begin(), distinct.end(), asked) != distinct.end()) {
      add(asked);
      continue;
    }
    size_t before = resolved.size();
    for (const std::string& a : distinct) {
      if (HasWords(a, asked)) add(a);
    }
    if (resolved.size() == before) {
      return absl::InvalidArgumentError(
          fmt::format("resources.model: '{}' is none of this machine's GPU models ({})", asked,
                      fmt::join(distinct, ", ")));
    }
  }
  spec->models = resolved;
  return absl::OkStatus();
}

core::Request RequestOf(const JobSpec& s, int64_t job_id, const std::string& owner) {
  core::Request r;
  r.id = std::to_string(job_id);
  r.cpu_milli = s.cpu_milli;
  r.memory_mib = s.memory_mib;
  // With a share (gpu_share, gpu_memory), `gpus` is how many GPUs get it; else whole GPUs.
  r.gpus = s.Share() ? 0 : s.gpus;
  r.share_gpus = s.Share() ? s.gpus : 0;
  r.gpus_max = s.Share() ? 0 : s.gpus_max;
  r.resizable = r.gpus_max > 0 && !s.resize_by.empty();
  r.gpu_milli = s.gpu_milli;
  r.gpu_memory_mib = s.gpu_memory_mib;
  r.models = s.models;
  r.min_gpu_memory_mib = s.min_gpu_memory_mib;
  r.topology = s.topology == "require"  ? core::TopologyMode::kRequire
               : s.topology == "prefer" ? core::TopologyMode::kPrefer
                                        : core::TopologyMode::kNone;
  r.sharing = core::ParseGpuSharing(s.sharing);
  r.priority = s.priority;
  r.preemptible = s.preemptible;
  r.owner = owner;
  return r;
}

sched::RunKind RunKindOf(const JobSpec& spec, const std::string& user) {
  return RunKindOf(spec, user, RequestOf(spec, 0, ""));
}

sched::RunKind RunKindOf(const JobSpec& spec, const std::string& user, const core::Request& r) {
  return {.user = user,
          .name = spec.name,
          .command = spec.command,
          .shape = spec.Auto() ? HistoryShape(spec) : sched::HistoryShape(r, spec.Tasks()),
          .max_runtime_s = spec.max_runtime_s};
}

std::string HistoryShape(const JobSpec& spec) {
  if (!spec.Auto()) return sched::HistoryShape(RequestOf(spec, 0, ""), spec.Tasks());
  // Sized automatically: known by what it asked ("auto"), not by what it was sized to, so that its
  // runs are one kind whatever each was given.
  std::string s = fmt::format(
      "{} {}", spec.gpu_share_auto ? "auto" : fmt::format("{:g}%", spec.gpu_milli / 10.0),
      spec.gpu_memory_auto ? "auto" : fmt::format("{}MiB", spec.gpu_memory_mib));
  if (spec.gpus > 1) s += fmt::format(" on {} GPUs", spec.gpus);
  if (spec.Tasks() > 1) s += fmt::format(" x{}", spec.Tasks());
  if (!spec.models.empty()) s += fmt::format(" [{}]", fmt::join(spec.models, ","));
  return s;
}

}  // namespace tessera::server
