// The server's YAML config file (docs/server.md). Strict: unknown keys and bad values are errors
// naming the file, the line and the key.
#include <pwd.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <vector>

#include "fmt/format.h"
#include "tessera/core/gpu.h"
#include "tessera/server/server.h"

namespace tessera::server {
namespace {

absl::Status At(const std::string& file, const YAML::Node& n, const std::string& key,
                const std::string& what) {
  return absl::InvalidArgumentError(
      fmt::format("{}:{}: {}: {}", file, n.Mark().line + 1, key, what));
}

absl::Status Known(const std::string& file, const YAML::Node& map,
                   std::initializer_list<std::string_view> keys, const std::string& where) {
  for (const auto& kv : map) {
    std::string k = kv.first.as<std::string>();
    bool ok = false;
    for (std::string_view x : keys) ok = ok || k == x;
    if (!ok) return At(file, kv.first, where.empty() ? k : where + "." + k, "unknown key");
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Get(const std::string& file, const YAML::Node& n, const std::string& key, T* out) {
  try {
    *out = n.as<T>();
    return absl::OkStatus();
  } catch (const YAML::Exception&) {
    return At(file, n, key, "wrong type or value");
  }
}

// A whole percentage 0..`max` ("70%" or 70) at `key`; `example` is how the error shows one.
absl::Status Percent(const std::string& file, const YAML::Node& n, const std::string& key, int max,
                     const std::string& example, int* out) {
  std::string text;
  if (!Get(file, n, key, &text).ok())
    return At(file, n, key, fmt::format("expected a percentage such as {}", example));
  if (!text.empty() && text.back() == '%') text.pop_back();
  int pct = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), pct);
  if (ec != std::errc() || end != text.data() + text.size() || pct < 0 || pct > max)
    return At(file, n, key, fmt::format("expected a percentage 0..{} such as {}", max, example));
  *out = pct;
  return absl::OkStatus();
}

absl::Status Amount(const std::string& file, const YAML::Node& q, const std::string& key,
                    sched::GpuAmount* a) {
  if (!q.IsMap()) return At(file, q, key, "expected a map of gpus, gpu_share, gpu_memory");
  if (absl::Status st = Known(file, q, {"gpus", "gpu_share", "gpu_memory"}, key); !st.ok())
    return st;
  if (q["gpus"]) {
    int64_t v = 0;
    if (absl::Status st = Get(file, q["gpus"], key + ".gpus", &v); !st.ok() || v < 0) {
      return At(file, q["gpus"], key + ".gpus", "expected a whole number >= 0");
    }
    a->gpus = v;
  }
  if (q["gpu_share"]) {  // in GPUs: 2.5 = two and a half GPUs of compute
    double v = 0;
    if (absl::Status st = Get(file, q["gpu_share"], key + ".gpu_share", &v); !st.ok() || v < 0) {
      return At(file, q["gpu_share"], key + ".gpu_share", "expected GPUs of compute >= 0 (2.5)");
    }
    a->gpu_milli = static_cast<int64_t>(v * 1000 + 0.5);
  }
  if (q["gpu_memory"]) {
    auto b = core::ParseBytes(q["gpu_memory"].as<std::string>(""));
    if (!b) return At(file, q["gpu_memory"], key + ".gpu_memory", "expected a size such as 40GiB");
    a->gpu_memory_mib = static_cast<int64_t>(*b >> 20);
  }
  return absl::OkStatus();
}

// The uid of local account `user`, nullopt when there is none.
std::optional<uint32_t> AccountUid(const std::string& user) {
  passwd pw;
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr)
    return std::nullopt;
  return pw.pw_uid;
}

// The tcp section: the listener's address, its TLS pair and its bearer tokens (each a local
// account's).
absl::Status LoadTcp(const std::string& path, const YAML::Node& root, ServerConfig* c,
                     std::vector<int>* token_lines) {
  if (const YAML::Node t = root["tcp"]) {
    if (!t.IsMap()) return At(path, t, "tcp", "expected a map with listen, tokens and tls");
    if (absl::Status st = Known(path, t, {"listen", "tokens", "tls"}, "tcp"); !st.ok()) return st;
    if (const YAML::Node tls = t["tls"]) {
      if (!tls.IsMap()) return At(path, tls, "tcp.tls", "expected a map with cert and key");
      if (absl::Status st = Known(path, tls, {"cert", "key"}, "tcp.tls"); !st.ok()) return st;
      for (const char* k : {"cert", "key"}) {
        std::string v;
        if (!tls[k] || !Get(path, tls[k], std::string("tcp.tls.") + k, &v).ok() || v.empty()) {
          return At(path, tls[k] ? tls[k] : tls, std::string("tcp.tls.") + k,
                    "required: a PEM file (the certificate chain, and its private key)");
        }
        if (access(v.c_str(), R_OK) != 0) {
          return At(path, tls[k], std::string("tcp.tls.") + k,
                    fmt::format("cannot read {}: {}", v, strerror(errno)));
        }
        (std::string(k) == "cert" ? c->tls_cert_file : c->tls_key_file) = v;
      }
    }
    if (t["listen"] && !Get(path, t["listen"], "tcp.listen", &c->tcp_listen).ok()) {
      return At(path, t["listen"], "tcp.listen", "expected host:port");
    }
    if (const YAML::Node toks = t["tokens"]) {
      if (!toks.IsSequence())
        return At(path, toks, "tcp.tokens", "expected a list of {token, user, admin}");
      for (size_t i = 0; i < toks.size(); ++i) {
        const YAML::Node& tok = toks[i];
        const std::string where = fmt::format("tcp.tokens[{}]", i);
        if (!tok.IsMap()) return At(path, tok, where, "expected a map with token, user and admin");
        if (absl::Status st = Known(path, tok, {"token", "user", "admin", "metrics_only"}, where);
            !st.ok())
          return st;
        ApiToken a;
        if (tok["token"] && !Get(path, tok["token"], where + ".token", &a.token).ok()) {
          return At(path, tok["token"], where + ".token", "expected a string");
        }
        if (tok["user"] && !Get(path, tok["user"], where + ".user", &a.user).ok()) {
          return At(path, tok["user"], where + ".user", "expected a user name");
        }
        if (tok["admin"] && !Get(path, tok["admin"], where + ".admin", &a.admin).ok()) {
          return At(path, tok["admin"], where + ".admin", "expected true or false");
        }
        if (tok["metrics_only"] &&
            !Get(path, tok["metrics_only"], where + ".metrics_only", &a.metrics_only).ok()) {
          return At(path, tok["metrics_only"], where + ".metrics_only", "expected true or false");
        }
        if (a.token.size() < 16) return At(path, tok, where + ".token", "at least 16 characters");
        if (a.metrics_only) {
          // A scraper's: it reads /metrics (and /v1/health), runs nothing, is nobody.
          if (a.admin || !a.user.empty())
            return At(path, tok, where, "a metrics_only token has no user and is no admin");
          token_lines->push_back(tok["token"].Mark().line + 1);
          c->tokens.push_back(a);
          continue;
        }
        if (a.user.empty())
          return At(path, tok, where + ".user", "required: the local account its jobs run as");
        // A token's jobs run as its user: one without a local account would run as whoever the
        // server is (root, most often). Refused here rather than discovered in a job.
        std::optional<uint32_t> uid = AccountUid(a.user);
        if (!uid) {
          return At(
              path, tok["user"], where + ".user",
              fmt::format(
                  "'{}' has no local account; a token's jobs run as its user, so it must be one "
                  "of this machine's accounts",
                  a.user));
        }
        a.uid = *uid;
        token_lines->push_back(tok["user"].Mark().line + 1);
        c->tokens.push_back(a);
      }
    }
    if (!c->tcp_listen.empty() && c->tokens.empty()) {
      return At(path, t, "tcp", "a TCP listener needs at least one token");
    }
  }
  return absl::OkStatus();
}

// Priority ceilings, who may preempt others' jobs, fair share, backfill reservations.
absl::Status LoadPriorities(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  auto priority = [&](const YAML::Node& n, const std::string& key, int* out) -> absl::Status {
    int v = 0;
    if (!Get(path, n, key, &v).ok() || v < -1000 || v > 1000) {
      return At(path, n, key, "expected a priority in -1000..1000");
    }
    *out = v;
    return absl::OkStatus();
  };
  if (const YAML::Node p = root["priority_ceiling"]) {
    if (absl::Status st = priority(p, "priority_ceiling", &c->priority_ceiling); !st.ok())
      return st;
  }
  if (const YAML::Node p = root["priority_ceilings"]) {
    if (!p.IsMap()) {
      return At(path, p, "priority_ceilings",
                "expected a map of user or group:<name> to a priority");
    }
    for (const auto& kv : p) {
      std::string who = kv.first.as<std::string>();
      if (absl::Status st =
              priority(kv.second, "priority_ceilings." + who, &c->priority_ceilings[who]);
          !st.ok()) {
        return st;
      }
    }
  }
  if (const YAML::Node p = root["preempt_others"]) {
    if (!p.IsSequence()) {
      return At(path, p, "preempt_others", "expected a list of users and group:<name> entries");
    }
    for (const YAML::Node& u : p) {
      std::string who;
      if (!u.IsScalar() || !Get(path, u, "preempt_others[]", &who).ok() || who.empty()) {
        return At(path, u, "preempt_others[]", "expected a user or group:<name>");
      }
      c->preempt_others.insert(who);
    }
  }
  if (const YAML::Node f = root["fair_share"]) {
    if (!f.IsMap()) return At(path, f, "fair_share", "expected a map with half_life_s");
    if (absl::Status st = Known(path, f, {"half_life_s"}, "fair_share"); !st.ok()) return st;
    if (f["half_life_s"]) {
      double v = 0;
      if (!Get(path, f["half_life_s"], "fair_share.half_life_s", &v).ok() || v < 0 || v > 1e9) {
        return At(path, f["half_life_s"], "fair_share.half_life_s",
                  "expected seconds >= 0 (0: off)");
      }
      c->fair_share_half_life_s = v;
    }
  }
  if (const YAML::Node b = root["backfill"]) {
    if (!b.IsMap()) return At(path, b, "backfill", "expected a map with reservations");
    if (absl::Status st = Known(path, b, {"reservations"}, "backfill"); !st.ok()) return st;
    if (b["reservations"]) {
      int64_t v = 0;
      if (!Get(path, b["reservations"], "backfill.reservations", &v).ok() || v < 0 || v > 1000) {
        return At(path, b["reservations"], "backfill.reservations",
                  "expected 0..1000 (0: backfill without reservations, 1: EASY)");
      }
      c->backfill_reservations = static_cast<int>(v);
    }
  }
  return absl::OkStatus();
}

// The listener's settings.
absl::Status LoadListener(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  if (const YAML::Node l = root["listener"]) {
    if (!l.IsMap())
      return At(path, l, "listener", "expected a map of timeouts and connection limits");
    if (absl::Status st = Known(path, l,
                                {"idle_timeout_s", "request_timeout_s", "max_connections",
                                 "max_tcp_connections", "max_connections_per_peer"},
                                "listener");
        !st.ok()) {
      return st;
    }
    for (const char* k : {"idle_timeout_s", "request_timeout_s"}) {
      if (!l[k]) continue;
      double v = 0;
      if (!Get(path, l[k], std::string("listener.") + k, &v).ok() || !(v >= 0.05) || v > 3600) {
        return At(path, l[k], std::string("listener.") + k, "expected seconds in 0.05..3600");
      }
      (std::string(k) == "idle_timeout_s" ? c->idle_timeout_s : c->request_timeout_s) = v;
    }
    for (auto [k, field] : {std::pair{"max_connections", &c->max_connections},
                            {"max_tcp_connections", &c->max_tcp_connections},
                            {"max_connections_per_peer", &c->max_connections_per_peer}}) {
      if (!l[k]) continue;
      int64_t v = 0;
      if (!Get(path, l[k], std::string("listener.") + k, &v).ok() || v < 1 || v > 100000) {
        return At(path, l[k], std::string("listener.") + k, "expected a count in 1..100000");
      }
      *field = static_cast<size_t>(v);
    }
  }
  return absl::OkStatus();
}

// How jobs are confined, and whether they may run as root.
absl::Status LoadConfinement(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  if (const YAML::Node cf = root["confinement"]) {
    if (!cf.IsMap())
      return At(path, cf, "confinement",
                "expected a map: mode, cgroup, device_dir, pids_max, user_pids_max, shm_dir, "
                "private_tmp");
    if (absl::Status st = Known(
            path, cf,
            {"mode", "cgroup", "device_dir", "pids_max", "user_pids_max", "shm_dir", "private_tmp"},
            "confinement");
        !st.ok()) {
      return st;
    }
    if (cf["mode"]) {
      std::string m;
      if (!Get(path, cf["mode"], "confinement.mode", &m).ok() ||
          (m != "auto" && m != "cgroup2" && m != "cgroup1" && m != "off")) {
        return At(path, cf["mode"], "confinement.mode", "expected auto, cgroup2, cgroup1 or off");
      }
      c->confinement = m;
    }
    if (cf["cgroup"]) {
      std::string n;
      if (!Get(path, cf["cgroup"], "confinement.cgroup", &n).ok() || n.empty() || n.size() > 64 ||
          n.find('/') != std::string::npos || n[0] == '.') {
        return At(path, cf["cgroup"], "confinement.cgroup",
                  "expected a cgroup name (no '/', not starting with '.', at most 64 characters)");
      }
      c->cgroup_name = n;
      c->cgroup_name_set = true;
    }
    if (cf["device_dir"]) {
      std::string d;
      if (!Get(path, cf["device_dir"], "confinement.device_dir", &d).ok() || d.empty() ||
          d[0] != '/') {
        return At(path, cf["device_dir"], "confinement.device_dir", "expected an absolute path");
      }
      c->device_dir = d;
    }
    if (cf["shm_dir"]) {
      std::string d;
      if (!Get(path, cf["shm_dir"], "confinement.shm_dir", &d).ok() ||
          (!d.empty() && d[0] != '/')) {
        return At(path, cf["shm_dir"], "confinement.shm_dir",
                  "expected an absolute path, or \"\" for none");
      }
      c->shm_dir = d;
    }
    if (cf["pids_max"]) {
      int64_t v = 0;
      if (!Get(path, cf["pids_max"], "confinement.pids_max", &v).ok() || v < 0 || v > 4194304) {
        return At(path, cf["pids_max"], "confinement.pids_max",
                  "expected a count of tasks in 0..4194304 (0: no limit)");
      }
      c->pids_max = v;
    }
    if (cf["user_pids_max"]) {
      int64_t v = 0;
      if (!Get(path, cf["user_pids_max"], "confinement.user_pids_max", &v).ok() || v < -1 ||
          v > 4194304) {
        return At(path, cf["user_pids_max"], "confinement.user_pids_max",
                  "expected a count of tasks in 0..4194304 (0: no limit), or -1 for a quarter "
                  "of the host's");
      }
      c->user_pids_max = v;
    }
    if (cf["private_tmp"] &&
        !Get(path, cf["private_tmp"], "confinement.private_tmp", &c->private_tmp).ok()) {
      return At(path, cf["private_tmp"], "confinement.private_tmp", "expected true or false");
    }
  }
  if (const YAML::Node a = root["allow_root_jobs"]) {
    if (!Get(path, a, "allow_root_jobs", &c->allow_root_jobs).ok()) {
      return At(path, a, "allow_root_jobs", "expected true or false");
    }
  }
  return absl::OkStatus();
}

// Admins, and quotas per user and per group.
absl::Status LoadQuotas(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  if (const YAML::Node a = root["admins"]) {
    if (!a.IsSequence()) return At(path, a, "admins", "expected a list of user names");
    for (const YAML::Node& u : a) c->admins.insert(u.as<std::string>());
  }
  for (const char* key : {"quotas", "group_quotas"}) {
    const YAML::Node q = root[key];
    if (!q) continue;
    const bool groups = std::string_view(key) == "group_quotas";
    if (!q.IsMap()) {
      return At(path, q, key,
                fmt::format("expected a map of {}: {{gpus, gpu_share, gpu_memory}}",
                            groups ? "group" : "user"));
    }
    for (const auto& kv : q) {
      std::string name = kv.first.as<std::string>();
      sched::OwnerQuota oq;
      if (absl::Status st = Amount(path, kv.second, std::string(key) + "." + name, &oq.limit);
          !st.ok())
        return st;
      (groups ? c->group_quotas : c->quotas)[name] = oq;
    }
  }
  return absl::OkStatus();
}

// Preemption and what an unhealthy GPU does to its jobs.
absl::Status LoadPreemption(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  if (const YAML::Node p = root["preemption"]) {
    if (!p.IsMap())
      return At(path, p, "preemption",
                "expected a map with requeue, grace_period_s and max_grace_period_s");
    if (absl::Status st =
            Known(path, p, {"requeue", "grace_period_s", "max_grace_period_s"}, "preemption");
        !st.ok())
      return st;
    if (p["requeue"] &&
        !Get(path, p["requeue"], "preemption.requeue", &c->requeue_preempted).ok()) {
      return At(path, p["requeue"], "preemption.requeue", "expected true or false");
    }
    if (p["grace_period_s"]) {
      if (!Get(path, p["grace_period_s"], "preemption.grace_period_s", &c->grace_period_s).ok() ||
          c->grace_period_s < 0 || c->grace_period_s > 3600) {
        return At(path, p["grace_period_s"], "preemption.grace_period_s",
                  "expected seconds in 0..3600");
      }
    }
    if (p["max_grace_period_s"]) {
      if (!Get(path, p["max_grace_period_s"], "preemption.max_grace_period_s",
               &c->max_grace_period_s)
               .ok() ||
          c->max_grace_period_s < 0 || c->max_grace_period_s > 3600) {
        return At(path, p["max_grace_period_s"], "preemption.max_grace_period_s",
                  "expected seconds in 0..3600");
      }
    }
    if (c->grace_period_s > c->max_grace_period_s) {
      return At(path, p, "preemption",
                fmt::format("grace_period_s {:g} is over max_grace_period_s {:g}",
                            c->grace_period_s, c->max_grace_period_s));
    }
  }
  if (const YAML::Node u = root["unhealthy_gpu"]) {
    c->unhealthy_action = u.as<std::string>("");
    if (c->unhealthy_action != "requeue" && c->unhealthy_action != "fail") {
      return At(path, u, "unhealthy_gpu", "expected requeue or fail");
    }
  }
  return absl::OkStatus();
}

// Request sizes, per-user limits and the intercept library's context overhead.
absl::Status LoadLimits(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  if (const YAML::Node m = root["max_body_bytes"]) {
    int64_t v = 0;
    if (!Get(path, m, "max_body_bytes", &v).ok() || v < 1024 || v > (int64_t{1} << 30)) {
      return At(path, m, "max_body_bytes", "expected 1024..1073741824");
    }
    c->max_body_bytes = static_cast<size_t>(v);
  }
  if (const YAML::Node m = root["max_array_tasks"]) {
    int64_t v = 0;
    if (!Get(path, m, "max_array_tasks", &v).ok() || v < 1 || v > 1000000) {
      return At(path, m, "max_array_tasks", "expected 1..1000000");
    }
    c->max_array_tasks = static_cast<size_t>(v);
  }
  if (const YAML::Node l = root["limits"]) {
    if (!l.IsMap()) {
      return At(path, l, "limits",
                "expected a map with max_queued_jobs_per_user, max_queued_bytes_per_user, "
                "max_running_jobs_per_user, "
                "max_starts_per_pass, max_log_bytes_per_job, min_free_disk, default_runtime and "
                "max_runtime");
    }
    if (absl::Status st =
            Known(path, l,
                  {"max_queued_jobs_per_user", "max_queued_bytes_per_user",
                   "max_running_jobs_per_user", "max_starts_per_pass", "max_log_bytes_per_job",
                   "min_free_disk", "default_runtime", "max_runtime"},
                  "limits");
        !st.ok())
      return st;
    for (auto [key, field] : {std::pair{"default_runtime", &c->default_runtime_s},
                              {"max_runtime", &c->max_runtime_s}}) {
      if (!l[key]) continue;
      const std::string text = l[key].as<std::string>("");
      auto d = core::ParseDurationOrZero(text);
      if (!d || *d < 0 || *d > 1e9)
        return At(path, l[key], std::string("limits.") + key,
                  "expected a duration such as 2h, 7d, 1-00:00:00 or 0 (none)");
      *field = *d;
    }
    if (c->max_runtime_s > 0 && c->default_runtime_s > c->max_runtime_s)
      return At(path, l, "limits.default_runtime", "longer than limits.max_runtime");
    for (auto [key, field] : {std::pair{"max_log_bytes_per_job", &c->max_log_bytes_per_job},
                              {"min_free_disk", &c->min_free_disk_bytes},
                              {"max_queued_bytes_per_user", &c->max_queued_bytes_per_user}}) {
      if (!l[key]) continue;
      const std::string text = l[key].as<std::string>("");
      auto b = text == "0" ? std::optional<uint64_t>(0) : core::ParseBytes(text);
      if (!b) return At(path, l[key], std::string("limits.") + key, "expected a size such as 1GiB");
      *field = *b;
    }
    for (auto [key, field] : {std::pair{"max_queued_jobs_per_user", &c->max_queued_jobs_per_user},
                              {"max_running_jobs_per_user", &c->max_running_jobs_per_user},
                              {"max_starts_per_pass", &c->max_starts_per_pass}}) {
      if (!l[key]) continue;
      int64_t v = 0;
      if (!Get(path, l[key], std::string("limits.") + key, &v).ok() || v < 1 || v > 10000000)
        return At(path, l[key], std::string("limits.") + key, "expected a count 1..10000000");
      *field = static_cast<size_t>(v);
    }
  }
  if (const YAML::Node r = root["retention"]) {
    if (!r.IsMap())
      return At(path, r, "retention", "expected a map with jobs, logs and environments");
    if (absl::Status st = Known(path, r, {"jobs", "logs", "environments"}, "retention"); !st.ok())
      return st;
    for (auto [key, field] : {std::pair{"jobs", &c->retention_jobs_s},
                              {"logs", &c->retention_logs_s},
                              {"environments", &c->retention_env_s}}) {
      if (!r[key]) continue;
      const std::string text = r[key].as<std::string>("");
      auto d = core::ParseDurationOrZero(text);
      if (!d) {
        return At(path, r[key], std::string("retention.") + key,
                  "expected an age such as 30d or 0 (kept for good)");
      }
      *field = *d;
    }
  }
  if (const YAML::Node o = root["context_overhead"]) {
    auto b = core::ParseBytes(o.as<std::string>(""));
    if (!b) return At(path, o, "context_overhead", "expected a size such as 300MiB");
    c->context_overhead_bytes = *b;
  }
  return absl::OkStatus();
}

// Jobs with an image (podman).
absl::Status LoadContainers(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  if (const YAML::Node k = root["containers"]) {
    if (!k.IsMap())
      return At(path, k, "containers", "expected a map with podman, cdi_spec_dir and run_args");
    if (absl::Status st = Known(path, k, {"podman", "cdi_spec_dir", "run_args"}, "containers");
        !st.ok())
      return st;
    if (k["podman"] && !Get(path, k["podman"], "containers.podman", &c->podman).ok()) {
      return At(path, k["podman"], "containers.podman",
                "expected a program name or path (\"\" turns containers off)");
    }
    if (k["cdi_spec_dir"]) {
      if (!Get(path, k["cdi_spec_dir"], "containers.cdi_spec_dir", &c->cdi_spec_dir).ok() ||
          c->cdi_spec_dir.empty() || c->cdi_spec_dir[0] != '/') {
        return At(path, k["cdi_spec_dir"], "containers.cdi_spec_dir",
                  "expected an absolute folder path");
      }
    }
    if (const YAML::Node a = k["run_args"]) {
      if (!a.IsSequence())
        return At(path, a, "containers.run_args", "expected a list of podman run arguments");
      c->podman_run_args.clear();
      for (const YAML::Node& arg : a) {
        if (!arg.IsScalar()) return At(path, arg, "containers.run_args[]", "expected a string");
        c->podman_run_args.push_back(arg.as<std::string>());
      }
    }
  }
  return absl::OkStatus();
}

// GPUs shared by MPS and their control daemons.
absl::Status LoadMps(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  const YAML::Node m = root["mps"];
  if (!m) return absl::OkStatus();
  if (!m.IsMap()) return At(path, m, "mps", "expected a map with gpus, control, check_interval_s");
  if (absl::Status st = Known(path, m, {"gpus", "control", "check_interval_s"}, "mps"); !st.ok())
    return st;
  if (const YAML::Node g = m["gpus"]) {
    c->mps_gpus.clear();
    if (g.IsScalar() && g.as<std::string>() == "all") {
      c->mps_gpus.push_back("all");
    } else if (g.IsSequence()) {
      for (const YAML::Node& one : g) {
        if (!one.IsScalar() || one.as<std::string>().empty())
          return At(path, one, "mps.gpus[]", "expected a GPU index or UUID");
        c->mps_gpus.push_back(one.as<std::string>());
      }
    } else {
      return At(path, g, "mps.gpus", "expected a list of GPU indices or UUIDs, or all");
    }
  }
  if (const YAML::Node p = m["control"]) {
    if (!Get(path, p, "mps.control", &c->mps_control).ok() || c->mps_control.empty())
      return At(path, p, "mps.control", "expected the control program's name or path");
  }
  if (const YAML::Node v = m["check_interval_s"]) {
    if (!Get(path, v, "mps.check_interval_s", &c->mps_check_interval_s).ok() ||
        c->mps_check_interval_s < 0.05 || c->mps_check_interval_s > 600)
      return At(path, v, "mps.check_interval_s", "expected 0.05..600 seconds");
  }
  return absl::OkStatus();
}

// Run-time history, interference-aware sharing and the loop's poll interval.
absl::Status LoadHistory(const std::string& path, const YAML::Node& root, ServerConfig* c) {
  if (const YAML::Node h = root["history"]) {
    if (!h.IsMap()) return At(path, h, "history", "expected a map: {interval_s, window_s}");
    if (absl::Status st = Known(path, h, {"interval_s", "window_s"}, "history"); !st.ok())
      return st;
    if (const YAML::Node v = h["interval_s"]) {
      if (!Get(path, v, "history.interval_s", &c->history_interval_s).ok() ||
          c->history_interval_s < 0.05 || c->history_interval_s > 600) {
        return At(path, v, "history.interval_s", "expected 0.05..600 seconds");
      }
    }
    if (const YAML::Node v = h["window_s"]) {
      if (!Get(path, v, "history.window_s", &c->history_window_s).ok() ||
          c->history_window_s < 60 || c->history_window_s > 7 * 86400) {
        return At(path, v, "history.window_s", "expected 60..604800 seconds (a week)");
      }
    }
    if (c->history_window_s / c->history_interval_s > 100000) {
      return At(path, h, "history",
                "window_s / interval_s is over 100000 samples: a longer interval or a shorter "
                "window");
    }
  }
  if (const YAML::Node u = root["utilization_ceiling"]) {
    if (absl::Status st =
            Percent(path, u, "utilization_ceiling", 100, "70%", &c->utilization_ceiling_pct);
        !st.ok())
      return st;
  }
  if (const YAML::Node m = root["auto_size_margin"]) {
    if (absl::Status st =
            Percent(path, m, "auto_size_margin", 200, "20%", &c->auto_size_margin_pct);
        !st.ok())
      return st;
  }
  if (const YAML::Node t = root["auto_size_trial"]) {
    auto d = core::ParseDurationOrZero(t.as<std::string>(""));
    if (!d || *d < 0 || *d > 86400)
      return At(path, t, "auto_size_trial",
                "expected a duration up to a day, such as 2m, or 0 (none)");
    c->auto_size_trial_s = *d;
  }
  if (const YAML::Node u = root["utilization_ceiling_strict"]) {
    if (!Get(path, u, "utilization_ceiling_strict", &c->utilization_ceiling_strict).ok())
      return At(path, u, "utilization_ceiling_strict", "expected true or false");
  }
  if (const YAML::Node p = root["poll_interval_s"]) {
    if (!Get(path, p, "poll_interval_s", &c->poll_interval_s).ok() || c->poll_interval_s < 0.01 ||
        c->poll_interval_s > 10) {
      return At(path, p, "poll_interval_s", "expected 0.01..10");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadServerConfig(const std::string& path, ServerConfig* c) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(fmt::format("{}: cannot read the config file", path));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}:{}: {}", path, e.mark.line + 1, e.msg));
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap())
    return absl::InvalidArgumentError(fmt::format("{}: expected a map of settings", path));
  if (absl::Status st = Known(path, root,
                              {"socket",
                               "state_dir",
                               "confinement",
                               "tcp",
                               "simulate",
                               "fallback_simulate",
                               "nvml_library",
                               "policy",
                               "admins",
                               "quotas",
                               "group_quotas",
                               "preemption",
                               "unhealthy_gpu",
                               "max_body_bytes",
                               "max_array_tasks",
                               "limits",
                               "intercept_library",
                               "context_overhead",
                               "poll_interval_s",
                               "containers",
                               "allow_root_jobs",
                               "priority_ceiling",
                               "priority_ceilings",
                               "preempt_others",
                               "listener",
                               "fair_share",
                               "backfill",
                               "history",
                               "retention",
                               "utilization_ceiling",
                               "utilization_ceiling_strict",
                               "auto_size_margin",
                               "auto_size_trial",
                               "mps"},
                              "");
      !st.ok()) {
    return st;
  }
  for (const char* key : {"socket", "state_dir", "simulate", "fallback_simulate", "nvml_library",
                          "policy", "intercept_library"}) {
    if (!root[key]) continue;
    std::string v;
    if (absl::Status st = Get(path, root[key], key, &v); !st.ok()) return st;
    std::string k = key;
    if (k == "socket")
      c->socket = v;
    else if (k == "state_dir")
      c->state_dir = v;
    else if (k == "simulate")
      c->simulate = v;
    else if (k == "fallback_simulate")
      c->fallback_simulate = v;
    else if (k == "nvml_library")
      c->nvml_library = v;
    else if (k == "policy")
      c->policy = v;
    else
      c->intercept_library = v;
  }
  std::vector<int> token_lines;  // the file's line of each token's user, for errors found later
  if (absl::Status st = LoadTcp(path, root, c, &token_lines); !st.ok()) return st;
  if (absl::Status st = LoadPriorities(path, root, c); !st.ok()) return st;
  if (absl::Status st = LoadListener(path, root, c); !st.ok()) return st;
  if (absl::Status st = LoadConfinement(path, root, c); !st.ok()) return st;
  for (size_t i = 0; i < token_lines.size(); ++i) {
    const ApiToken& t = c->tokens[c->tokens.size() - token_lines.size() + i];
    if (!t.metrics_only && t.uid == 0 && !c->allow_root_jobs) {
      return absl::InvalidArgumentError(
          fmt::format("{}:{}: tcp.tokens[{}].user: '{}' is root: this token's jobs would run as "
                      "root; use an ordinary "
                      "account, or set allow_root_jobs: true if that is meant",
                      path, token_lines[i], i, t.user));
    }
  }
  if (absl::Status st = LoadQuotas(path, root, c); !st.ok()) return st;
  if (absl::Status st = LoadPreemption(path, root, c); !st.ok()) return st;
  if (absl::Status st = LoadLimits(path, root, c); !st.ok()) return st;
  if (absl::Status st = LoadContainers(path, root, c); !st.ok()) return st;
  if (absl::Status st = LoadHistory(path, root, c); !st.ok()) return st;
  if (absl::Status st = LoadMps(path, root, c); !st.ok()) return st;
  return absl::OkStatus();
}

}  // namespace tessera::server
