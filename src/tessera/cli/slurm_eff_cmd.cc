#include "tessera/cli/slurm_eff_cmd.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tessera/cli/app.h"
#include "tessera/cli/output.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/program.h"
#include "tessera/slurm/eff.h"

namespace tessera::cli {
namespace {

struct EffFlags {
  std::string job, sacct = "sacct", output = "table";
};

// What Slurm gave the job: "2 GPUs", "3 shards", "1 GPU and 3 shards".
std::string Allocated(const slurm::SacctEff& job) {
  std::vector<std::string> what;
  if (job.gpus_allocated > 0)
    what.push_back(fmt::format("{} GPU{}", job.gpus_allocated, job.gpus_allocated == 1 ? "" : "s"));
  if (job.shards_allocated > 0)
    what.push_back(
        fmt::format("{} shard{}", job.shards_allocated, job.shards_allocated == 1 ? "" : "s"));
  return fmt::format("{}", fmt::join(what, " and "));
}

// seff's question for GPUs, asked of sacct on any machine of the cluster: Slurm's own figures of
// the job and its nodes' AdminComment parts (docs/slurm.md).
int RunEff(const EffFlags& f, std::ostream& out, std::ostream& err) {
  const std::string sacct = devices::LookUp(f.sacct);
  if (sacct.empty()) {
    err << "tessera slurm eff: no " << f.sacct
        << " here: it reads the job from Slurm's accounting (sacct, slurmdbd)\n";
    return kExitFailure;
  }
  auto run = devices::RunCapture(
      {sacct, "-j", f.job, "-P", "-n", "--noconvert",
       std::string("--delimiter=") + slurm::kEffDelimiter, "-o", slurm::kEffFields},
      {.timeout = std::chrono::seconds(60)});
  if (!run.ok() || run->status != 0) {
    err << "tessera slurm eff: " << sacct << " -j " << f.job
        << (run.ok()
                ? fmt::format(" failed (exit {}): {}", run->status, devices::FirstLine(run->text))
                : ": " + std::string(run.status().message()))
        << "\n";
    return kExitFailure;
  }
  // sacct's own warnings (its stderr comes with its output) said, not read as the job's lines.
  std::string lines;
  for (absl::string_view line : absl::StrSplit(run->text, '\n')) {
    if (absl::StartsWith(line, "sacct: ")) {
      err << line << "\n";
    } else {
      lines.append(line.data(), line.size()).append("\n");
    }
  }
  auto job = slurm::ParseSacctEff(lines, f.job);
  if (!job.ok()) {
    err << "tessera slurm eff: " << job.status().message() << "\n";
    return kExitFailure;
  }
  auto parts = slurm::ParseAdminComment(job->admin_comment);
  if (!parts.ok()) {
    err << "tessera slurm eff: job " << job->job_id << ": " << parts.status().message()
        << ": its GPU figures are left out\n";
    parts = std::vector<slurm::NodePart>();
  }
  const nlohmann::ordered_json e = slurm::EffOf(*job, *parts);
  const Format format = *ParseFormat(f.output);
  if (format != Format::kTable) {
    EmitStructured(e, format, out);
    return kExitOk;
  }
  auto field = [&](const char* k, const std::string& v) { PrintField(out, k, v, 18); };
  auto pct = [&](const char* k) { return fmt::format("{:.1f}%", e[k].get<double>()); };
  auto has = [&](const char* k) { return e.contains(k) && e[k].is_number(); };
  auto bytes = [&](const char* k) { return core::FormatBytes(e[k].get<uint64_t>()); };
  field("job", fmt::format("{}{} of {}", job->job_id,
                           job->name.empty() ? "" : " (" + job->name + ")", job->user));
  field("state", fmt::format("{} (exit code {})", job->state, job->exit_code));
  if (job->from_first_step)
    field("record",
          "from its first step only so far (its name and the memory it asked are not "
          "in sacct yet): slurmctld sends its own within 5 s; ask again then");
  field("elapsed",
        fmt::format("{} on {} node{}, {} CPU{}", core::FormatDuration(job->elapsed_s), job->nodes,
                    job->nodes == 1 ? "" : "s", job->cpus, job->cpus == 1 ? "" : "s"));
  const size_t gpus = e["gpus"].get<size_t>();
  const size_t nodes = e["gpu_nodes"].size();
  if (nodes == 0 && (job->state == "RUNNING" || job->state == "PENDING" ||
                     job->state == "REQUEUED" || job->state == "SUSPENDED")) {
    field("GPU efficiency",
          "not yet: each node writes its part when the job ends there (tessera slurm acct on the "
          "node, or its exporter, has the figures while it runs)");
  } else if (nodes == 0 && job->gpus_allocated == 0 && job->shards_allocated == 0) {
    field("GPU efficiency",
          "none: Slurm gave it no GPUs (no gres/gpu or gres/shard in its AllocTRES; a cluster "
          "whose AccountingStorageTRES does not name them records none)");
  } else if (nodes == 0) {
    field("GPU efficiency",
          fmt::format("not recorded: Slurm gave it {}, and no tessera@ part is in its "
                      "AdminComment (a plugin with admin_comment=no, nodes without it, or a "
                      "cluster without slurmdbd)",
                      Allocated(*job)));
  } else {
    const std::string where = fmt::format("{} GPU{} on {} node{}", gpus, gpus == 1 ? "" : "s",
                                          nodes, nodes == 1 ? "" : "s");
    if (has("gpu_busy_pct")) {
      field("GPU efficiency",
            fmt::format("{} of what its compute shares held was busy ({}); {} of GPU time held "
                        "idle",
                        pct("gpu_busy_pct"), where,
                        core::FormatDuration(e["gpu_idle_seconds"].get<double>())));
    } else {
      field("GPU efficiency",
            fmt::format("not measured ({}: whole GPUs, whose busy time is not timed, or a run "
                        "under a second)",
                        where));
    }
    std::string memory = "not measured";
    if (has("gpu_memory_peak_bytes")) {
      memory = "peak " + bytes("gpu_memory_peak_bytes");
      if (has("gpu_memory_limit_bytes") && has("gpu_memory_pct"))
        memory += fmt::format(" of {} per GPU ({})", bytes("gpu_memory_limit_bytes"),
                              pct("gpu_memory_pct"));
    }
    if (const auto n = e["gpu_memory_refused"].get<uint64_t>(); n > 0)
      memory += fmt::format("; {} allocation{} refused at its limit", n, n == 1 ? "" : "s");
    field("GPU memory", memory);
  }
  field("CPU efficiency",
        has("cpu_pct")
            ? fmt::format("{} of {} CPU{} over its run ({:.1f} CPU-seconds)", pct("cpu_pct"),
                          job->cpus, job->cpus == 1 ? "" : "s", job->total_cpu_s)
            : fmt::format("{:.1f} CPU-seconds", job->total_cpu_s));
  std::string memory = "not measured";
  if (has("memory_peak_bytes")) {
    memory = "peak " + bytes("memory_peak_bytes") + " (its largest task)";
    if (has("memory_pct"))
      memory += fmt::format(" of {} per node asked ({})", bytes("memory_asked_per_node_bytes"),
                            pct("memory_pct"));
    else if (job->from_first_step)
      memory += "; the memory it asked is not in sacct yet";
  }
  field("memory", memory);
  if (nodes > 0) {
    out << "\n";
    Table t({"NODE", "GPUS", "SHARE", "BUSY", "IDLE", "PEAK-MEM", "MEM-LIMIT", "REFUSED"});
    for (const nlohmann::ordered_json& n : e["gpu_nodes"]) {
      std::vector<std::string> ids;
      for (const auto& g : n["gpus"]) ids.push_back(std::to_string(g.get<int>()));
      auto b = [&](const char* k) {
        return n.contains(k) ? core::FormatBytes(n[k].get<uint64_t>()) : std::string("-");
      };
      const double share = n["share_percent"].get<double>();
      t.AddRow({n["node"].get<std::string>(), fmt::format("{}", fmt::join(ids, ",")),
                share > 0 ? fmt::format("{:g}%", share) : "whole",
                n.contains("busy_pct") ? fmt::format("{:.0f}%", n["busy_pct"].get<double>()) : "-",
                n.contains("idle_gpu_seconds")
                    ? core::FormatDuration(n["idle_gpu_seconds"].get<double>())
                    : "-",
                b("gpu_memory_peak_bytes"), b("gpu_memory_limit_bytes"),
                std::to_string(n["refused"].get<uint64_t>())});
    }
    t.Print(out);
  }
  return kExitOk;
}

}  // namespace

std::shared_ptr<void> AddSlurmEff(CLI::App& slurm, std::function<int()>& action, std::ostream& out,
                                  std::ostream& err) {
  auto s = std::make_shared<EffFlags>();
  EffFlags& f = *s;
  CLI::App* eff = slurm.add_subcommand(
      "eff",
      "What an ended job used of what it held, from sacct on any machine of the cluster: its GPUs' "
      "busy time and memory (each node's part of its AdminComment), CPU and memory (as seff)");
  eff->add_option("job", f.job,
                  "The Slurm job id (an array's task as 42_3, a heterogeneous job's component as "
                  "42+1)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const size_t u = v.find_first_of("_+");
            auto digits = [](std::string_view d) {
              return !d.empty() && d.size() < 11 &&
                     d.find_first_not_of("0123456789") == std::string_view::npos;
            };
            return digits(std::string_view(v).substr(0, u)) &&
                           (u == std::string::npos || digits(std::string_view(v).substr(u + 1)))
                       ? ""
                       : "expected a job id such as 42, 42_3 or 42+1";
          },
          "", ""));
  eff->add_option("--sacct", f.sacct, "The sacct program to ask")->capture_default_str();
  eff->add_option("-o,--output", f.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  eff->callback([&, s] { action = [&, s] { return RunEff(f, out, err); }; });
  return s;
}

}  // namespace tessera::cli
