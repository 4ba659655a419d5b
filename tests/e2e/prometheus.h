#pragma once
// A real Prometheus (Debian's `prometheus`) for the tests: scrapes the given targets every second
// into a TSDB under the test's folder, and answers instant queries through its HTTP API. Its port
// is one found free (FreeLoopbackPort: Prometheus tells no port 0 it chose), tried again should
// another take it.
// Also: the checks a dashboard's expressions must pass against it (DashboardProblems).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../capture.h"
#include "fmt/format.h"
#include "tessera/kube/client.h"
#include "tessera/net/http.h"

namespace tessera::test {

inline bool HavePrometheus() { return Capture("command -v prometheus >/dev/null").code == 0; }

class Prometheus {
 public:
  struct Target {
    std::string job;            // the scrape job's name
    std::string address;        // host:port
    std::string token;          // bearer token; empty: none
    bool honor_labels = false;  // as deploy/base/servicemonitor.yaml has it for agent and extender
  };

  Prometheus(const std::string& dir, const std::vector<Target>& targets) : dir_(dir) {
    std::ofstream cfg(dir + "/prometheus.yml");
    cfg << "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n";
    // One scrape job per name, with all of its targets (a name may be used once).
    std::vector<std::string> done;
    for (const Target& t : targets) {
      if (std::find(done.begin(), done.end(), t.job) != done.end()) continue;
      done.push_back(t.job);
      cfg << "  - job_name: " << t.job << "\n";
      if (!t.token.empty()) cfg << "    authorization: {credentials: " << t.token << "}\n";
      if (t.honor_labels) cfg << "    honor_labels: true\n";
      cfg << "    static_configs: [{targets: [";
      std::string sep;
      for (const Target& same : targets) {
        if (same.job != t.job) continue;
        cfg << sep << "'" << same.address << "'";
        sep = ", ";
      }
      cfg << "]}]\n";
    }
    cfg.close();
    for (int attempt = 0; attempt < 3 && pid_ <= 0; ++attempt) {
      port_ = net::FreeLoopbackPort();
      const std::string cmd = fmt::format(
          "exec setpriv --pdeathsig TERM prometheus --config.file={0}/prometheus.yml "
          "--storage.tsdb.path={0}/tsdb --web.listen-address=127.0.0.1:{1} --log.level=warn "
          ">>{0}/prometheus.log 2>&1",
          dir, port_);
      const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
      if (posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0)
        pid_ = -1;
      // Up, or gone (its port taken after all: another).
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
        if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        auto r = net::HttpClient(Endpoint()).Send("GET", "/-/ready");
        if (r.ok() && r->status == 200) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }
  ~Prometheus() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool up() const { return pid_ > 0; }
  std::string Log() const { return ReadFile(dir_ + "/prometheus.log"); }
  std::string Endpoint() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

  // An instant query's whole answer ({"status": "error", "error": ...} when it does not parse);
  // null when Prometheus did not answer.
  nlohmann::json Raw(const std::string& promql) const {
    auto r =
        net::HttpClient(Endpoint()).Send("GET", "/api/v1/query?query=" + kube::QueryEscape(promql));
    if (!r.ok()) return nullptr;
    return nlohmann::json::parse(r->body, nullptr, false);
  }
  // Its result vector ([] on any failure, which the caller reports).
  nlohmann::json Query(const std::string& promql) const {
    nlohmann::json j = Raw(promql);
    if (!j.is_object() || j.value("status", "") != "success") return nlohmann::json::array();
    return j["data"]["result"];
  }
  // Polls `promql` until it has at least `n` series (a scrape or two away).
  nlohmann::json Await(const std::string& promql, size_t n = 1, double seconds = 30) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    nlohmann::json r = Query(promql);
    while (r.size() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      r = Query(promql);
    }
    return r;
  }

 private:
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// Grafana's variables as a query sees them with "All" chosen: $x in a matcher is the regex ".*"
// (the dashboards' allValue), $__rate_interval a minute.
inline std::string WithVariables(std::string expr) {
  expr = std::regex_replace(expr, std::regex(R"(\$__rate_interval)"), "1m");
  return std::regex_replace(expr, std::regex(R"(\$[A-Za-z_]+)"), ".*");
}

// What is wrong with one dashboard expression against what Prometheus has scraped: it does not
// parse; it names a metric no target exports (any word like tessera_*, DCGM_*, process_*); or a
// label it groups by or matches on is on no series of the metrics it reads (a panel that would
// draw one unlabeled line, or nothing). Empty: nothing.
inline std::vector<std::string> DashboardProblems(const Prometheus& prom,
                                                  const std::string& grafana_expr) {
  std::vector<std::string> out;
  const std::string expr = WithVariables(grafana_expr);
  const nlohmann::json answer = prom.Raw(expr);
  if (!answer.is_object() || answer.value("status", "") != "success") {
    out.push_back(fmt::format("does not run: {}",
                              answer.is_object() ? answer.value("error", "") : "no answer"));
    return out;
  }
  std::set<std::string> metrics;
  const std::regex metric(R"(\b((?:tessera|DCGM|process)_[A-Za-z0-9_]+)\b)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), metric);
       it != std::sregex_iterator(); ++it) {
    metrics.insert((*it)[1]);
  }
  std::string names;
  for (const std::string& m : metrics) {
    if (prom.Query("count(" + m + ")").empty()) out.push_back("no series of " + m);
    names += (names.empty() ? "" : "|") + m;
  }
  if (names.empty()) return out;
  // Labels: in by (...)/without (...) and in {label op "value"} matchers.
  std::set<std::string> labels;
  const std::regex grouping(R"(\b(?:by|without)\s*\(([^)]*)\))");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), grouping);
       it != std::sregex_iterator(); ++it) {
    const std::string list = (*it)[1];
    const std::regex word(R"([A-Za-z_][A-Za-z0-9_]*)");
    for (auto w = std::sregex_iterator(list.begin(), list.end(), word); w != std::sregex_iterator();
         ++w) {
      labels.insert(w->str());
    }
  }
  const std::regex matcher(R"(([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*")");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), matcher);
       it != std::sregex_iterator(); ++it) {
    labels.insert((*it)[1]);
  }
  for (const std::string& l : labels) {
    if (l == "le" || l == "instance" || l == "job" || l == "__name__") continue;
    if (prom.Query(fmt::format("count({{__name__=~\"{}\", {}!=\"\"}})", names, l)).empty())
      out.push_back(fmt::format("label {} is on no series of {}", l, names));
  }
  return out;
}

// NVIDIA's dcgm-exporter dashboard (grafana/dcgm-exporter-dashboard.json as it ships: each
// panel's expression and its $Hostname/$gpu variables, written out here) run against `prom` one
// host at a time, as a user picks one, with `gpus` GPUs in all: what is wrong. For each host its
// variables list its GPUs; every per-GPU panel draws one line per GPU with the labels it groups by;
// the Power Total gauge equals the host's power counted once per GPU (by UUID); and the host
// exports one DCGM_FI_DEV_POWER_USAGE series per GPU (a GPU shared by pods is not split, as
// dcgm-exporter does by default: a split drew 4 lines for 3 GPUs and 990 W for 740 W on
// dashboards that sum the raw series). Empty: nothing.
inline std::vector<std::string> NvidiaDashboardProblems(const Prometheus& prom, size_t gpus) {
  struct Panel {
    const char* title;
    const char* promql;               // $Hostname and $gpu as the dashboard has them
    std::vector<std::string> labels;  // each must be on every series the query returns
    bool per_gpu = true;              // else one series
  };
  const std::vector<Panel> panels = {
      {"GPU Temperature",
       R"(max(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, uuid))",
       {"Hostname", "gpu"}},
      {"GPU Avg. Temp",
       R"(avg(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"}))",
       {},
       false},
      {"GPU Power Usage",
       R"(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"})"
       R"() by (Hostname, gpu, uuid))",
       {"Hostname", "gpu"}},
      {"GPU Power Total",
       R"(sum(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (gpu)))",
       {},
       false},
      {"GPU SM Clocks",
       R"(max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"$Hostname", gpu=~"$gpu"} * 1000000)"
       R"() by (Hostname, UUID, gpu))",
       {"Hostname", "UUID", "gpu"}},
      {"GPU Utilization",
       R"(max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname=~"$Hostname", gpu=~"$gpu"})"
       R"() by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE))",
       {"Hostname", "gpu"}},
      {"Tensor Core Utilization",
       R"(max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"$Hostname", gpu=~"$gpu"})"
       R"() by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE))",
       {"Hostname", "gpu"}},
      {"GPU Framebuffer Mem Used",
       R"(max(DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname", gpu=~"$gpu"})"
       R"() by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE))",
       {"Hostname", "gpu"}},
  };
  auto with = [](std::string q, const std::string& host) {
    for (size_t at; (at = q.find("$Hostname")) != std::string::npos;) q.replace(at, 9, host);
    for (size_t at; (at = q.find("$gpu")) != std::string::npos;) q.replace(at, 4, ".*");
    return q;
  };
  std::vector<std::string> out;
  // $Hostname: label_values(DCGM_FI_DEV_FB_FREE, Hostname); $gpu: (...{Hostname=~"$Hostname"},
  // gpu).
  std::map<std::string, size_t> hosts;
  for (const nlohmann::json& s : prom.Await("count by (Hostname) (DCGM_FI_DEV_FB_FREE)", 1))
    hosts[s["metric"].value("Hostname", "")] = 0;
  size_t total = 0;
  for (auto& [host, n] : hosts) {
    n = prom.Query(with(R"(count by (gpu) (DCGM_FI_DEV_FB_FREE{Hostname=~"$Hostname"}))", host))
            .size();
    total += n;
    const nlohmann::json raw =
        prom.Query(with(R"(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname"})", host));
    if (raw.size() != n)
      out.push_back(
          fmt::format("{}: {} DCGM_FI_DEV_POWER_USAGE series for {} GPUs", host, raw.size(), n));
    for (const Panel& p : panels) {
      const std::string q = with(p.promql, host);
      const size_t want = p.per_gpu ? n : 1;
      nlohmann::json r = prom.Await(q, want);
      if (r.size() != want) {
        out.push_back(fmt::format("{} on {}: {} -> {} series, not {}: {}", p.title, host, q,
                                  r.size(), want, r.dump()));
        continue;
      }
      for (const nlohmann::json& series : r) {
        for (const std::string& l : p.labels) {
          if (series["metric"].value(l, "").empty())
            out.push_back(
                fmt::format("{} on {}: no label {} on {}", p.title, host, l, series.dump()));
        }
      }
      if (std::string(p.title) == "GPU Power Total") {
        const nlohmann::json truth = prom.Query(
            with(R"(sum(max by (UUID) (DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname"})))", host));
        const double got = std::stod(r[0]["value"][1].get<std::string>());
        const double want_w =
            truth.empty() ? -1 : std::stod(truth[0]["value"][1].get<std::string>());
        if (std::abs(got - want_w) > 0.01)
          out.push_back(
              fmt::format("GPU Power Total on {}: {} W, its GPUs draw {} W", host, got, want_w));
      }
    }
  }
  if (total != gpus)
    out.push_back(fmt::format("the dashboard's variables list {} GPUs on {} hosts, not {}", total,
                              hosts.size(), gpus));
  return out;
}

// Labels Prometheus renamed on ingestion (exported_*: a target's label that collided with one of
// its own) on any series of `selector`, as "series: label"; and the number of series looked at.
inline std::vector<std::string> RenamedLabels(const Prometheus& prom, const std::string& selector,
                                              size_t* looked_at = nullptr) {
  std::vector<std::string> out;
  const nlohmann::json all = prom.Query(selector);
  if (looked_at) *looked_at = all.size();
  for (const nlohmann::json& s : all) {
    for (const auto& [k, v] : s["metric"].items()) {
      if (k.rfind("exported_", 0) == 0) out.push_back(s["metric"].dump() + ": " + k);
    }
  }
  return out;
}

}  // namespace tessera::test
