// One API call and how jobs are shown, for every client verb (remote.h).
#include "tessera/cli/remote.h"

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
#include <set>
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

namespace tessera::cli::remote {

std::optional<json> Call(net::HttpClient& c, const std::string& method, const std::string& target,
                         const std::string& body, std::ostream& err, int* code,
                         const std::string& idempotency_key) {
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
  if (r.contains("gpus_max") && !share)  // elastic: "2-8 GPU"
    out = fmt::format("{}-{} GPU", r.value("gpus", 0), r["gpus_max"].get<int>());
  if (r.contains("gpus") && share && r["gpus"].get<int>() > 1)
    out += fmt::format(" on {} GPUs", r["gpus"].get<int>());
  if (r.contains("cpus"))
    out += (out.empty() ? "" : " ") + fmt::format("{:g} CPU", r["cpus"].get<double>());
  if (r.contains("memory")) out += (out.empty() ? "" : " ") + r["memory"].get<std::string>();
  if (r.value("sharing", "") == "mps") out += (out.empty() ? "" : " ") + std::string("MPS");
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
std::string StateText(const json& j, bool array) {
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

std::optional<json> ListJobs(net::HttpClient& c, const std::string& target, size_t want,
                             std::ostream& err, int* code, bool* more) {
  if (more) *more = false;
  json jobs = json::array();
  std::set<int64_t> arrays;
  int64_t before = 0;
  const char* sep = target.find('?') == std::string::npos ? "?" : "&";
  while (want == 0 || jobs.size() < want) {
    const size_t page_size = want == 0 ? 10000 : std::min<size_t>(want - jobs.size(), 10000);
    std::string page = target + sep + fmt::format("limit={}", page_size);
    if (before > 0) page += fmt::format("&before={}", before);
    auto r = Call(c, "GET", page, "", err, code);
    if (!r) return std::nullopt;
    json older = json::array();
    for (json& j : (*r)["jobs"]) {
      const json a = j.value("array", json());
      if (a.is_object() && a.value("folded", false) &&
          !arrays.insert(a.value("id", int64_t{0})).second)
        continue;
      older.push_back(std::move(j));
    }
    older.insert(older.end(), jobs.begin(), jobs.end());
    jobs = std::move(older);
    const bool older_left = r->value("more", false);
    if (more) *more = older_left;
    if (!older_left) break;
    before = r->value("next_before", int64_t{0});
    if (before <= 0) break;
  }
  return jobs;
}

}  // namespace tessera::cli::remote
