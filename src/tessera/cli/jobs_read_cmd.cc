// The job verbs of `tessera` that read: ls, show, eff (what a job used of what it held), logs
// (followed with -f). Those that change jobs are in jobs_cmd.cc.

#include <algorithm>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "fmt/format.h"
#include "tessera/cli/app.h"
#include "tessera/cli/output.h"
#include "tessera/cli/remote.h"
#include "tessera/core/gpu.h"
#include "tessera/net/http.h"

namespace tessera::cli::remote {

int RunLs(State& s, std::ostream& out, std::ostream& err) {
  net::HttpClient c = s.client.Client();
  int code = kExitOk;
  std::string target = fmt::format("/v1/jobs?arrays={}", s.expand ? "expand" : "fold");
  // squeue's view by default (what is waiting or running, and what is on its way back to the
  // queue); sacct's with --ended; every job with --state all.
  const std::string states = s.ls_ended          ? "succeeded,failed,cancelled"
                             : s.states.empty()  ? "queued,running,preempted,lost"
                             : s.states == "all" ? ""
                                                 : s.states;
  if (!states.empty()) target += "&state=" + states;
  if (s.client.output == "table") target += "&env=false";  // a table shows none of it
  // Your own jobs unless asked otherwise; the server says who you are (socket or token).
  std::string user = s.ls_user;
  if (user.empty() && !s.ls_all) {
    auto info = Call(c, "GET", "/v1/info", "", err, &code);
    if (!info) return code;
    user = (*info)["caller"].value("user", "");
  }
  if (!user.empty()) target += "&user=" + user;
  bool more = false;
  auto jobs = ListJobs(c, target, static_cast<size_t>(std::max(s.limit, 1)), err, &code, &more);
  if (!jobs) return code;
  if (s.client.output == "table") {
    JobsTable(*jobs, out);
    // Said where a person reads it, not in what a script parses.
    if (more) {
      err << fmt::format("tessera: the newest {} shown; older ones with --limit N\n", jobs->size());
    } else if (jobs->empty() && s.states.empty() && !s.ls_ended) {
      err << "tessera: no queued or running jobs (ended ones: tessera ls --ended)\n";
    }
  } else {
    Emit(*jobs, s.client.output, out);
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
  auto field = [&](const char* k, const std::string& v) { PrintField(out, k, v, 12); };
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
  if (const json sized = (*j)["spec"].value("sized", json()); sized.is_object())
    field("sized", sized.value("basis", ""));
  field("gpus", Where(*j));
  if (const json rz = (*j)["spec"].value("resize", json()); rz.is_object()) {
    field("resized", rz.value("by", "") == "signal"
                         ? fmt::format("by signal (SIGUSR1, exit 75 within {:g} s, else {})",
                                       rz.value("grace_s", 60.0), rz.value("unanswered", "restart"))
                         : std::string("by restart (stopped and started again)"));
  }
  // An elastic job's sizes over its run (each from when): "2 GPUs 14:02:10, 4 GPUs 14:05:31".
  if (const json p = j->value("placement", json()); p.is_object() && p.contains("sizes")) {
    std::vector<std::string> sizes;
    for (const json& z : p["sizes"]) {
      std::time_t at = static_cast<std::time_t>(z.value("at", 0.0));
      char buf[16];
      std::strftime(buf, sizeof buf, "%H:%M:%S", std::localtime(&at));
      sizes.push_back(fmt::format("{} GPU{} from {}", z.value("gpus", 0),
                                  z.value("gpus", 0) == 1 ? "" : "s", buf));
    }
    field("sizes", fmt::format("{}", fmt::join(sizes, ", ")));
  }
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

int RunEff(State& s, std::ostream& out, std::ostream& err) {
  net::HttpClient c = s.client.Client();
  int code = kExitOk;
  auto j = Call(c, "GET", fmt::format("/v1/jobs/{}", s.id), "", err, &code);
  if (!j) return code;
  const json e = j->value("efficiency", json());
  if (!e.is_object()) {
    err << fmt::format("tessera: job {} has not started ({}): nothing used yet\n", JobRef(*j),
                       j->value("state", ""));
    return kExitFailure;
  }
  if (s.client.output != "table") {
    json o = e;
    o["id"] = (*j)["id"];
    o["owner"] = j->value("owner", "");
    o["state"] = j->value("state", "");
    o["exit_code"] = (*j)["exit_code"];
    Emit(o, s.client.output, out);
    return kExitOk;
  }
  auto field = [&](const char* k, const std::string& v) { PrintField(out, k, v, 18); };
  auto number = [&](const char* k) { return e.value(k, json()).is_number(); };
  auto pct = [&](const char* k) { return fmt::format("{:.1f}%", e[k].get<double>()); };
  const bool running = e.value("running", false);
  field("job", fmt::format("{} of {}", JobRef(*j), j->value("owner", "")));
  field("state",
        j->value("state", "") + ((*j)["exit_code"].is_number()
                                     ? fmt::format(" (exit code {})", (*j)["exit_code"].get<int>())
                                     : ""));
  field("elapsed", core::FormatDuration(e.value("elapsed_s", 0.0)));
  const double gpus = e.value("gpus", 0.0);
  if (gpus > 0) {
    // A memory-only share (no part of the compute asked) holds its memory's part of the GPU.
    const json placement = j->value("placement", json());
    const bool memory_only =
        placement.is_object() && placement.value("milli_per_gpu", json()) == json(0);
    field("GPUs held",
          fmt::format("{:g} x {} = {:.3f} GPU-hours{}", gpus,
                      core::FormatDuration(e.value("elapsed_s", 0.0)), e.value("gpu_hours", 0.0),
                      memory_only ? " (its memory's part of each GPU)" : ""));
    std::string busy = "not measured (no history sample saw it hold its GPUs alone)";
    if (running) busy = "measured at its end";
    if (!running && e.value("share", false))
      busy = "not measured (the arbiter charged it no GPU time)";
    if (memory_only)
      busy = "not measured (a share of GPU memory only: its compute is not timed by the arbiter)";
    if (number("gpu_busy_pct"))
      busy = fmt::format("{} of what it held was busy", pct("gpu_busy_pct"));
    if (number("gpu_used_pct")) {
      busy += fmt::format("; it used {} of its GPU's time, past its share (idle time lent to it)",
                          pct("gpu_used_pct"));
    }
    field("GPU efficiency", busy);
    if (number("gpu_held_back_pct") && number("gpu_demand_pct")) {
      field("GPU held back",
            fmt::format("its launches waited for the GPU {} of its run: it would have used {} of "
                        "each GPU's time",
                        pct("gpu_held_back_pct"), pct("gpu_demand_pct")));
    }
    std::string memory = running ? "measured at its end" : "not measured";
    if (number("gpu_memory_given_mib"))
      memory += fmt::format(" ({} per GPU given)",
                            core::FormatBytes(e["gpu_memory_given_mib"].get<uint64_t>() << 20));
    if (number("gpu_memory_peak_mib")) {
      memory =
          fmt::format("peak {}", core::FormatBytes(e["gpu_memory_peak_mib"].get<uint64_t>() << 20));
      if (number("gpu_memory_pct"))
        memory += fmt::format(" of {} per GPU ({})",
                              core::FormatBytes(e["gpu_memory_given_mib"].get<uint64_t>() << 20),
                              pct("gpu_memory_pct"));
    }
    if (number("gpu_memory_refused")) {
      const auto n = e["gpu_memory_refused"].get<uint64_t>();
      memory += fmt::format("; {} allocation{} refused at its limit (it asked for {} at most)", n,
                            n == 1 ? "" : "s",
                            core::FormatBytes(e.value("gpu_memory_wanted_mib", uint64_t{0}) << 20));
    }
    field("GPU memory", memory);
  }
  if (number("cpu_seconds")) {
    field("CPU efficiency",
          number("cpu_pct")
              ? fmt::format("{} of {:g} CPUs over its run ({:.1f} CPU-seconds)", pct("cpu_pct"),
                            e["cpus"].get<double>(), e["cpu_seconds"].get<double>())
              : fmt::format("{:.1f} CPU-seconds (no CPUs asked)", e["cpu_seconds"].get<double>()));
  }
  if (number("memory_peak_bytes")) {
    field("memory",
          fmt::format("peak {}", core::FormatBytes(e["memory_peak_bytes"].get<uint64_t>())) +
              (number("memory_pct")
                   ? fmt::format(" of {} ({})",
                                 core::FormatBytes(e["memory_limit_bytes"].get<uint64_t>()),
                                 pct("memory_pct"))
                   : std::string(" (no limit asked)")));
  }
  return kExitOk;
}

int RunLogs(State& s, std::ostream& out, std::ostream& err) {
  net::HttpClient c = s.client.Client();
  int64_t offset = 0;
  std::string said, carry;
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
    out << (s.raw ? data : TerminalSafe(data, &carry)) << std::flush;
    offset = (*r)["next_offset"].get<int64_t>();
    if (!s.follow || (data.empty() && (*r)["ended"].get<bool>())) {
      if (!s.raw) out << TerminalSafe("", &carry) << carry << std::flush;  // a lone last byte
      return kExitOk;
    }
    if (data.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace tessera::cli::remote
