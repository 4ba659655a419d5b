#include "tessera/cli/slurm_eff_cmd.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tessera/cli/app.h"
#include "tessera/cli/output.h"
#include "tessera/cli/when.h"
#include "tessera/core/gpu.h"
#include "tessera/devices/program.h"
#include "tessera/slurm/eff.h"

namespace tessera::cli {
namespace {

struct EffFlags {
  std::string job, sacct = "sacct", output = "table";
  // Without a job: the jobs that ended in a period.
  std::string since, until, user, by, sort;
  bool all_users = false, reverse = false;
};

// The states of a job that ended, as docs/slurm.md's export selects them (sacct -s: a job in one
// of these in the period, which is when it ended).
constexpr char kEndedStates[] = "CD,F,CA,TO,OOM,NF,PR,DL";
// Kept of sacct's answer for a period: about 300,000 jobs of a step each, whose figures take
// about 1.2 GB here (100,000: 400 MB resident, docs/benchmarks.md).
constexpr size_t kMaxSacctAnswer = size_t{128} << 20;

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

// sacct's answer to `args` (its stderr apart: its warnings said on `err`, not read as its lines);
// nullopt when it could not be run or failed, said on `err` as `what` failing.
std::optional<devices::ProgramOutput> AskSacct(const std::vector<std::string>& args,
                                               const std::string& what, devices::ProgramRun run,
                                               std::ostream& err) {
  run.stderr_apart = true;
  auto answer = devices::RunCapture(args, run);
  if (!answer.ok() || answer->status != 0) {
    err << "tessera slurm eff: " << what
        << (answer.ok()
                ? fmt::format(" failed (exit {}): {}", answer->status,
                              devices::FirstLine(answer->err.empty() ? answer->text : answer->err))
                : ": " + std::string(answer.status().message()))
        << "\n";
    return std::nullopt;
  }
  for (absl::string_view line : absl::StrSplit(answer->err, '\n', absl::SkipEmpty()))
    err << line << "\n";
  return std::move(*answer);
}

// "gpu:2", "shard:3", "gpu:1,shard:3", "-": what Slurm gave the job, as --gres asks it.
std::string Gres(const slurm::SacctEff& job) {
  std::vector<std::string> what;
  if (job.gpus_allocated > 0) what.push_back(fmt::format("gpu:{}", job.gpus_allocated));
  if (job.shards_allocated > 0) what.push_back(fmt::format("shard:{}", job.shards_allocated));
  return what.empty() ? "-" : fmt::format("{}", fmt::join(what, ","));
}

// The figure --sort orders by, for a job's or a user's summary.
std::optional<double> SortKey(const nlohmann::ordered_json& e, const std::string& field) {
  static const std::map<std::string, const char*> keys = {{"elapsed", "elapsed_s"},
                                                          {"busy", "gpu_busy_pct"},
                                                          {"idle", "gpu_idle_seconds"},
                                                          {"gpu_mem", "gpu_memory_pct"},
                                                          {"cpu", "cpu_pct"},
                                                          {"mem", "memory_pct"},
                                                          {"jobs", "jobs"},
                                                          {"held", "gpu_held_seconds"}};
  const char* key = keys.at(field);
  // A user's GPU memory is the median of their jobs'.
  if (field == "gpu_mem" && e.contains("gpu_memory_pct_median")) key = "gpu_memory_pct_median";
  if (!e.contains(key) || !e[key].is_number()) return std::nullopt;
  return e[key].get<double>();
}

// Jobs as sacct listed them (a period's, an array's tasks): one line each or summed per user
// (--by user), --sort's order, and their GPU figures together. `head`: what JSON says first (the
// period, the job asked); `which`: what they are ("ended between ..."); `none`: said when there
// are none.
int PrintJobs(const EffFlags& f, const slurm::SacctJobs& jobs, nlohmann::ordered_json head,
              const std::string& which, const std::string& none, std::ostream& out,
              std::ostream& err) {
  for (const std::string& e : jobs.errors)
    err << "tessera slurm eff: " << e << ": the job is left out\n";
  std::vector<nlohmann::ordered_json> effs;
  for (const slurm::SacctEff& job : jobs.jobs) {
    auto parts = slurm::ParseAdminComment(job.admin_comment);
    if (!parts.ok()) {
      err << "tessera slurm eff: job " << job.job_id << ": " << parts.status().message()
          << ": its GPU figures are left out\n";
      parts = std::vector<slurm::NodePart>();
    }
    effs.push_back(slurm::EffOf(job, *parts));
  }
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  if (f.by == "user") {
    rows = slurm::EffByUser(effs);
  } else {
    for (auto& e : effs) rows.push_back(std::move(e));
  }
  if (!f.sort.empty()) {
    SortByFigure(
        rows, [&](const nlohmann::ordered_json& r) { return SortKey(r, f.sort); }, f.reverse);
  }
  const Format format = *ParseFormat(f.output);
  if (format != Format::kTable) {
    nlohmann::ordered_json o = std::move(head);
    o[f.by == "user" ? "users" : "jobs"] = std::move(rows);
    EmitStructured(o, format, out);
    return kExitOk;
  }
  auto pct = [](const nlohmann::ordered_json& e, const char* k) {
    return e.contains(k) ? fmt::format("{:.0f}%", e[k].get<double>()) : std::string("-");
  };
  auto duration = [](const nlohmann::ordered_json& e, const char* k) {
    return e.contains(k) ? core::FormatDuration(e[k].get<double>()) : std::string("-");
  };
  if (rows.empty()) {
    out << none << "\n";
    return kExitOk;
  }
  if (f.by == "user") {
    Table t({"USER", "JOBS", "GPU-JOBS", "GPU-HELD", "BUSY", "IDLE", "GPU-MEM", "GPU-MEM-MAX",
             "REFUSED", "CPU"});
    for (const auto& u : rows)
      t.AddRow({u["user"].get<std::string>(), std::to_string(u["jobs"].get<int>()),
                std::to_string(u["gpu_jobs"].get<int>()), duration(u, "gpu_held_seconds"),
                pct(u, "gpu_busy_pct"), duration(u, "gpu_idle_seconds"),
                pct(u, "gpu_memory_pct_median"), pct(u, "gpu_memory_pct_max"),
                std::to_string(u["gpu_memory_refused_jobs"].get<int>()), pct(u, "cpu_pct")});
    t.Print(out);
  } else {
    Table t({"JOBID", "NAME", "USER", "STATE", "ELAPSED", "GRES", "BUSY", "IDLE", "GPU-MEM",
             "REFUSED", "CPU", "MEM"});
    std::map<std::string, const slurm::SacctEff*> by_id;
    for (const slurm::SacctEff& job : jobs.jobs) by_id[job.job_id] = &job;
    for (const auto& e : rows) {
      const slurm::SacctEff& job = *by_id.at(e["job_id"].get<std::string>());
      t.AddRow({job.job_id, job.name, job.user, job.state, ElapsedClock(job.elapsed_s), Gres(job),
                pct(e, "gpu_busy_pct"), duration(e, "gpu_idle_seconds"), pct(e, "gpu_memory_pct"),
                std::to_string(e["gpu_memory_refused"].get<uint64_t>()), pct(e, "cpu_pct"),
                pct(e, "memory_pct")});
    }
    t.Print(out);
  }
  // The jobs' GPU figures together: what the shares held, how much was busy, the time idle.
  double held = 0, busy = 0, idle = 0;
  for (const auto& e : rows) {
    held += e.value("gpu_held_seconds", 0.0);
    busy += e.value("gpu_busy_seconds", 0.0);
    idle += e.value("gpu_idle_seconds", 0.0);
  }
  out << "\n" << effs.size() << " job" << (effs.size() == 1 ? "" : "s") << " " << which;
  if (held > 0)
    out << fmt::format("; their compute shares held {} of GPU time, {:.1f}% busy, {} idle",
                       core::FormatDuration(held), 100 * busy / held, core::FormatDuration(idle));
  out << "\n";
  return kExitOk;
}

// The jobs that ended in a period (sacct -S -E -s, its users as sacct selects them), one line
// each or summed per user.
int RunPeriod(const EffFlags& f, const std::string& sacct, std::ostream& out, std::ostream& err) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  double when[2] = {0, now};
  const std::string* texts[2] = {&f.since, &f.until};
  for (int i = 0; i < 2; ++i) {
    const std::string text = texts[i]->empty() ? (i == 0 ? "7d" : "now") : *texts[i];
    const std::optional<double> t = ParseWhen(text, now);
    if (!t) {
      err << "tessera slurm eff: " << (i == 0 ? "--since " : "--until ") << text << ": expected "
          << kWhenForms << "\n";
      return kExitBadInput;
    }
    when[i] = *t;
  }
  if (when[0] > when[1]) {
    err << "tessera slurm eff: --since " << LocalTimestamp(when[0]) << " is after --until "
        << LocalTimestamp(when[1]) << "\n";
    return kExitBadInput;
  }
  std::vector<std::string> args = {sacct,
                                   "-P",
                                   "-n",
                                   "--noconvert",
                                   std::string("--delimiter=") + slurm::kEffDelimiter,
                                   "-o",
                                   slurm::kEffFields,
                                   "-S",
                                   LocalTimestamp(when[0]),
                                   "-E",
                                   LocalTimestamp(when[1]),
                                   "-s",
                                   kEndedStates};
  if (!f.user.empty()) {
    args.insert(args.end(), {"-u", f.user});
  } else if (f.all_users) {
    args.push_back("-a");
  }
  // sacct takes a while over a long period of a large cluster: said on a terminal meanwhile.
  const bool tty = &err == &std::cerr && isatty(STDERR_FILENO);
  if (tty)
    err << "asking sacct for the jobs that ended between " << LocalTimestamp(when[0]) << " and "
        << LocalTimestamp(when[1]) << "..." << std::flush;
  auto run = AskSacct(args, sacct,
                      {.timeout = std::chrono::minutes(10), .max_output = kMaxSacctAnswer}, err);
  if (tty) err << "\r\x1b[K" << std::flush;  // the line cleared
  // The call as a shell takes it (the delimiter, a control character, as bash's $'\x1f').
  std::vector<std::string> shown(args.begin() + 1, args.end());
  for (std::string& a : shown)
    if (absl::StartsWith(a, "--delimiter=")) a = "--delimiter=$'\\x1f'";
  const std::string command = fmt::format("{}", fmt::join(shown, " "));
  if (!run) return kExitFailure;
  if (run->cut) {
    err << "tessera slurm eff: sacct's answer for the period is over " << (kMaxSacctAnswer >> 20)
        << " MiB: ask a shorter one (--since, --until) or one user (--user)\n";
    return kExitFailure;
  }
  auto jobs = slurm::ParseSacctEffAll(run->text);
  if (!jobs.ok()) {
    err << "tessera slurm eff: " << jobs.status().message() << "\n";
    return kExitFailure;
  }
  return PrintJobs(f, *jobs,
                   {{"since", LocalTimestamp(when[0])}, {"until", LocalTimestamp(when[1])}},
                   "ended between " + LocalTimestamp(when[0]) + " and " + LocalTimestamp(when[1]),
                   "no job ended between " + LocalTimestamp(when[0]) + " and " +
                       LocalTimestamp(when[1]) + " (sacct " + command + ")",
                   out, err);
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
  if ((f.sort == "jobs" || f.sort == "held") && f.by != "user") {
    err << "tessera slurm eff: --sort " << f.sort << " is a user's figure: with --by user\n";
    return kExitBadInput;
  }
  if (f.job.empty()) return RunPeriod(f, sacct, out, err);
  auto run = AskSacct({sacct, "-j", f.job, "-P", "-n", "--noconvert",
                       std::string("--delimiter=") + slurm::kEffDelimiter, "-o", slurm::kEffFields},
                      sacct + " -j " + f.job, {.timeout = std::chrono::seconds(60)}, err);
  if (!run) return kExitFailure;
  const std::string& lines = run->text;
  // An array's id lists its tasks (a heterogeneous job's, its components): each one's line, as
  // for a period.
  if (auto all = slurm::ParseSacctEffAll(lines);
      all.ok() && all->jobs.size() + all->errors.size() > 1 &&
      std::none_of(all->jobs.begin(), all->jobs.end(),
                   [&](const slurm::SacctEff& j) { return j.job_id == f.job; })) {
    return PrintJobs(f, *all, {{"job", f.job}}, "listed for " + f.job, "", out, err);
  }
  if (!f.by.empty() || !f.sort.empty()) {
    err << "tessera slurm eff: --by and --sort order and sum several jobs (a period's, an "
           "array's tasks): "
        << f.job << " is one\n";
    return kExitBadInput;
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
      "busy time and memory (each node's part of its AdminComment), CPU and memory (as seff); "
      "without a job, every job that ended in a period, or each user's sums (--by user)");
  CLI::Option* job =
      eff->add_option("job", f.job,
                      "The Slurm job id (an array's task as 42_3, a heterogeneous job's component "
                      "as 42+1; an array's own id lists its tasks); without one, the jobs that "
                      "ended in a period")
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
  const std::string when =
      ": a duration ago (90m, 7d), today, yesterday, a date (2026-11-01), a date and time "
      "(2026-11-01T08:00) or epoch seconds";
  for (CLI::Option* o :
       {eff->add_option("-S,--since", f.since,
                        "Without a job: the jobs that ended since" + when + " (default 7d)"),
        eff->add_option("-E,--until", f.until,
                        "Without a job: and before" + when + ", or now (default now)"),
        eff->add_option("-u,--user", f.user,
                        "Without a job: only this user's (sacct's default: yours, or everyone's "
                        "for root)"),
        eff->add_flag("-a,--all-users", f.all_users,
                      "Without a job: every user's (as sacct -a; slurmdbd's PrivateData may "
                      "refuse)"),
        eff->add_option("--by", f.by,
                        "A period's jobs (or an array's tasks): one line per user, the GPU time "
                        "they left idle most first")
            ->check(CLI::IsMember({"user"})),
        eff->add_option("--sort", f.sort,
                        "A period's jobs (or an array's tasks): order the lines by elapsed, busy, "
                        "idle, gpu_mem, cpu or mem (with --by user: also jobs, held) - largest "
                        "first, unmeasured last")
            ->check(
                CLI::IsMember({"elapsed", "busy", "idle", "gpu_mem", "cpu", "mem", "jobs", "held"})
                    .description(""))
            ->type_name("FIELD")})
    if (o->get_name() != "--by" && o->get_name() != "--sort") o->excludes(job);
  eff->add_flag("--reverse", f.reverse, "With --sort: the other way")->needs("--sort");
  eff->get_option("--user")->excludes("--all-users");
  eff->add_option("--sacct", f.sacct, "The sacct program to ask")->capture_default_str();
  eff->add_option("-o,--output", f.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  eff->callback([&, s] { action = [&, s] { return RunEff(f, out, err); }; });
  return s;
}

}  // namespace tessera::cli
