#include "tessera/server/job_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "tessera/core/gpu.h"

namespace tessera::server {
namespace {

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

absl::Status StringMap(const json& v, std::string_view field,
                       std::map<std::string, std::string>* out, bool env_names) {
  if (!v.is_object())
    return Bad(field, fmt::format("expected an object of strings, got {}", TypeName(v)));
  if (v.size() > 1000) return Bad(field, "more than 1000 entries");
  for (const auto& [k, val] : v.items()) {
    if (k.empty() || k.size() > 256 || (env_names && k.find('=') != std::string::npos) ||
        k.find('\0') != std::string::npos) {
      return Bad(field, fmt::format("bad name '{}'", k));
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

absl::Status Integer(const json& v, std::string_view field, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer())
    return Bad(field, fmt::format("expected a whole number, got {}", TypeName(v)));
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi)
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

absl::StatusOr<JobSpec> JobSpecFromJson(const json& j) {
  if (!j.is_object())
    return absl::InvalidArgumentError(fmt::format("expected a JSON object, got {}", TypeName(j)));
  if (absl::Status st =
          Unknown(j,
                  {"command", "env", "workdir", "name", "labels", "resources", "priority",
                   "preemptible", "max_runtime_s", "grace_period_s", "image"},
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
    const json& v = j["max_runtime_s"];
    if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > 1e9) {
      return Bad("max_runtime_s", fmt::format("expected seconds > 0, got {}", v.dump()));
    }
    s.max_runtime_s = v.get<double>();
  }
  if (j.contains("grace_period_s")) {
    const json& v = j["grace_period_s"];
    if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > 3600) {
      return Bad("grace_period_s", fmt::format("expected seconds in 0..3600, got {}", v.dump()));
    }
    s.grace_period_s = v.get<double>();
  }
  if (j.contains("resources")) {
    const json& r = j["resources"];
    if (!r.is_object())
      return Bad("resources", fmt::format("expected an object, got {}", TypeName(r)));
    if (absl::Status st = Unknown(r,
                                  {"gpus", "gpu_memory", "gpu_share", "model", "min_gpu_memory",
                                   "topology", "cpus", "memory"},
                                  "resources");
        !st.ok()) {
      return st;
    }
    if (r.contains("gpus")) {
      int64_t g = 0;
      if (absl::Status st = Integer(r["gpus"], "resources.gpus", 0, 64, &g); !st.ok()) return st;
      s.gpus = static_cast<int>(g);
    }
    if (r.contains("gpu_memory")) {
      if (absl::Status st = Memory(r["gpu_memory"], "resources.gpu_memory", &s.gpu_memory_mib);
          !st.ok())
        return st;
    }
    if (r.contains("gpu_share")) {
      const json& v = r["gpu_share"];
      double pct = -1;
      if (v.is_number()) {
        pct = v.get<double>();
      } else if (v.is_string()) {
        std::string t = v.get<std::string>();
        if (!t.empty() && t.back() == '%') t.pop_back();
        try {
          size_t used = 0;
          pct = std::stod(t, &used);
          if (used != t.size()) pct = -1;
        } catch (...) {
          pct = -1;
        }
      }
      if (!(pct >= 0.1 && pct < 100)) {
        return Bad(
            "resources.gpu_share",
            fmt::format(
                "expected a share of one GPU between 0.1% and 99.9% (\"30%\" or 30), got {}; "
                "ask for whole GPUs with resources.gpus",
                v.dump()));
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
    if (s.gpus > 0 && (s.gpu_milli > 0 || s.gpu_memory_mib > 0)) {
      return Bad(
          "resources",
          "ask for whole GPUs (gpus) or a fraction of one (gpu_memory, gpu_share), not both");
    }
  }
  if (std::string why = core::ValidateRequest(RequestOf(s, 1, "")); !why.empty())
    return Bad("resources", why);
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
  if (s.gpu_memory_mib > 0) r["gpu_memory"] = fmt::format("{}MiB", s.gpu_memory_mib);
  if (s.gpu_milli > 0) r["gpu_share"] = fmt::format("{:g}%", s.gpu_milli / 10.0);
  if (!s.models.empty()) r["model"] = s.models;
  if (s.min_gpu_memory_mib > 0) r["min_gpu_memory"] = fmt::format("{}MiB", s.min_gpu_memory_mib);
  if (s.topology != "none") r["topology"] = s.topology;
  if (s.cpu_milli > 0) r["cpus"] = static_cast<double>(s.cpu_milli) / 1000;
  if (s.memory_mib > 0) r["memory"] = fmt::format("{}MiB", s.memory_mib);
  j["resources"] = r;
  j["priority"] = s.priority;
  j["preemptible"] = s.preemptible;
  if (s.max_runtime_s > 0) j["max_runtime_s"] = s.max_runtime_s;
  if (s.grace_period_s >= 0) j["grace_period_s"] = s.grace_period_s;
  if (!s.image.empty()) j["image"] = s.image;
  return j;
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
  r.gpus = s.gpus;
  r.gpu_milli = s.gpu_milli;
  r.gpu_memory_mib = s.gpu_memory_mib;
  r.models = s.models;
  r.min_gpu_memory_mib = s.min_gpu_memory_mib;
  r.topology = s.topology == "require"  ? core::TopologyMode::kRequire
               : s.topology == "prefer" ? core::TopologyMode::kPrefer
                                        : core::TopologyMode::kNone;
  r.priority = s.priority;
  r.preemptible = s.preemptible;
  r.owner = owner;
  return r;
}

}  // namespace tessera::server
