#include "tessera/gpucheck/checks.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "tessera/gpucheck/child.h"
#include "tessera/gpucheck/driver.h"
#include "tessera/shim/arbiter.h"

extern char** environ;

namespace tessera::gpucheck {

namespace {

using Fields = std::map<std::string, std::string>;

// "a=1 b=two" -> {a: 1, b: two}; an "error=..." line keeps the rest of the line as the value.
Fields ParseFields(const std::string& line) {
  Fields f;
  if (line.rfind("error=", 0) == 0) {
    f["error"] = line.substr(6);
    return f;
  }
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t end = std::min(line.find(' ', i), line.size());
    const std::string kv = line.substr(i, end - i);
    if (const size_t eq = kv.find('='); eq != std::string::npos)
      f[kv.substr(0, eq)] = kv.substr(eq + 1);
    i = end;
  }
  return f;
}

double Num(const Fields& f, const char* key) {
  auto it = f.find(key);
  return it == f.end() ? NAN : std::strtod(it->second.c_str(), nullptr);
}

std::string Fixed(double v, int digits = 1) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

enum class Verdict { kPass, kFail, kInfo };

struct Result {
  std::string name, measured, goal;
  Verdict verdict = Verdict::kInfo;
  nlohmann::json data = nlohmann::json::object();
};

// One process of a scenario.
struct Tenant {
  std::string job;
  std::vector<std::string> env;  // the library's settings
  bool preload = true;
  std::vector<std::string> args;          // the tenant's KIND and KEY=VALUE pairs
  std::vector<std::string> program = {};  // another program than ours (the PyTorch tenant)
  // In a pid namespace of its own with its own /proc, as a container runtime starts it: the driver
  // lists it under a pid it cannot see.
  bool container = false;
};

struct Work {
  double kernel_us = 500, batch = 4, pause_us = 0, graph = 0;
};

class Checker {
 public:
  Checker(const Options& o, std::ostream& out, std::string dir)
      : options_(o), out_(out), dir_(std::move(dir)) {}

  std::vector<Result> results;
  double iters_per_us = 0;
  double start_delay_ms = 0;  // more time for tenants to get ready (PyTorch's import)

  bool Wanted(const std::string& name) const {
    if (options_.only.empty()) return true;
    return std::any_of(options_.only.begin(), options_.only.end(),
                       [&](const std::string& o) { return name.rfind(o, 0) == 0; });
  }

  // The environment of a tenant: ours without any library settings, then the tenant's.
  std::vector<std::string> EnvOf(const Tenant& t, const std::string& arbiter) const {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      if (kv.rfind("LD_PRELOAD=", 0) == 0 || kv.rfind("TESSERA_CUDA_", 0) == 0 ||
          kv.rfind("TESSERA_JOB_ID=", 0) == 0) {
        continue;
      }
      env.push_back(kv);
    }
    if (t.preload) env.push_back("LD_PRELOAD=" + (library_.empty() ? options_.library : library_));
    if (!options_.libcuda.empty()) env.push_back("TESSERA_CUDA_LIBRARY=" + options_.libcuda);
    if (!arbiter.empty()) env.push_back("TESSERA_CUDA_ARBITER=" + arbiter);
    env.push_back("TESSERA_JOB_ID=" + t.job);
    for (const auto& e : t.env) env.push_back(e);
    for (const auto& e : options_.settings) env.push_back(e);
    return env;
  }

  bool Start(const Tenant& t, const std::string& arbiter, Child* c, std::string* err) const {
    std::vector<std::string> argv = {options_.self, "--tenant"};
    if (!options_.libcuda.empty()) argv.insert(argv.begin() + 1, "--libcuda=" + options_.libcuda);
    if (!t.program.empty()) argv = t.program;
    argv.insert(argv.end(), t.args.begin(), t.args.end());
    if (t.program.empty()) argv.push_back("device=" + std::to_string(options_.device));
    if (t.container) {
      argv.insert(argv.begin(),
                  {"unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"});
    }
    return c->Spawn(argv, EnvOf(t, arbiter), err);
  }

  // Runs the tenants at once from a shared start; each one's result line. `during` runs while
  // they do (pids, start in ms). "charged_us" is added: the GPU time the arbiter charged the job.
  std::vector<Fields> Contend(
      const std::string& scenario, std::vector<Tenant> tenants, double run_ms, double from_ms,
      double to_ms, const std::function<void(const std::vector<pid_t>&, double)>& during = {}) {
    out_ << "running " << scenario << " ..." << std::endl;
    const std::string arbiter = dir_ + "/arbiter-" + std::to_string(++scenarios_);
    const double start =
        NowMs() + start_delay_ms + 2000 + 300 * static_cast<double>(tenants.size());
    std::vector<std::unique_ptr<Child>> children;
    std::vector<pid_t> pids;
    std::vector<Fields> out(tenants.size());
    for (size_t i = 0; i < tenants.size(); ++i) {
      Tenant& t = tenants[i];
      if (t.args.empty()) continue;
      t.args.push_back("start_ms=" + Fixed(start, 3));
      t.args.push_back("iters_per_us=" + Fixed(iters_per_us, 4));
      t.args.push_back("run_ms=" + Fixed(run_ms, 0));
      t.args.push_back("from_ms=" + Fixed(from_ms, 0));
      t.args.push_back("to_ms=" + Fixed(to_ms, 0));
      children.push_back(std::make_unique<Child>());
      std::string err;
      if (!Start(t, arbiter, children.back().get(), &err)) out[i]["error"] = err;
      pids.push_back(children.back()->pid());
    }
    if (during) during(pids, start);
    for (size_t i = 0; i < children.size(); ++i) {
      if (out[i].count("error")) continue;
      out[i] =
          ParseFields(children[i]->ReadLine(static_cast<int>(start - NowMs() + run_ms) + 60000));
      const int status = children[i]->Wait();
      if (!out[i].count("error") && !out[i].count("window_us"))
        out[i]["error"] = "tenant ended without a result (status " + std::to_string(status) + ")";
      out[i]["charged_us"] = std::to_string(shim::ArbiterBusyMicros(
          arbiter.c_str(), options_.device, shim::ArbiterJobKey(tenants[i].job.c_str())));
    }
    std::error_code ec;
    std::filesystem::remove(arbiter, ec);
    return out;
  }

  static std::vector<std::string> WorkArgs(const Work& w) {
    std::vector<std::string> a = {"work", "kernel_us=" + Fixed(w.kernel_us, 0),
                                  "batch=" + Fixed(w.batch, 0), "pause_us=" + Fixed(w.pause_us, 0)};
    if (w.graph > 0) a.push_back("graph=" + Fixed(w.graph, 0));
    return a;
  }

  // The first error among the tenants' results, or "".
  static std::string ErrorOf(const std::vector<Fields>& r) {
    for (const auto& f : r) {
      if (auto it = f.find("error"); it != f.end()) return it->second;
    }
    return "";
  }

  void Add(Result r) {
    const char* verdict = r.verdict == Verdict::kPass   ? "pass"
                          : r.verdict == Verdict::kFail ? "FAIL"
                                                        : "info";
    out_ << "  " << r.name << ": " << r.measured << " (" << verdict << ")" << std::endl;
    results.push_back(std::move(r));
  }
  void Failed(const std::string& name, const std::string& goal, const std::string& why) {
    Add({name, "error: " + why, goal, Verdict::kFail, {{"error", why}}});
  }

  // Shares: each tenant's part of the work the tenants completed in the window, in percent.
  static std::vector<double> Shares(const std::vector<Fields>& r, const char* key = "window_us") {
    double sum = 0;
    for (const auto& f : r) sum += Num(f, key);
    std::vector<double> s;
    for (const auto& f : r) s.push_back(sum > 0 ? 100 * Num(f, key) / sum : NAN);
    return s;
  }

  // A scenario of two jobs (30% with `heavy`, 70% with short queues): the 30% job's share of the
  // GPU time used in the window, and what the arbiter charged against what each job's work took.
  void ShareScenario(const std::string& name, const Work& heavy, double run_ms, double from_ms,
                     double to_ms) {
    ShareScenario(name,
                  {{"heavy", {"TESSERA_CUDA_COMPUTE_SHARE=30%"}, true, WorkArgs(heavy)},
                   {"steady", {"TESSERA_CUDA_COMPUTE_SHARE=70%"}, true, WorkArgs(Work{})}},
                  run_ms, from_ms, to_ms);
  }
  void ShareScenario(const std::string& name, std::vector<Tenant> tenants, double run_ms,
                     double from_ms, double to_ms) {
    const std::string goal = "30% +-5 points; charged within 5 points of used";
    std::vector<Fields> r = Contend(name, std::move(tenants), run_ms, from_ms, to_ms);
    if (std::string e = ErrorOf(r); !e.empty()) return Failed(name, goal, e);
    const double got = Shares(r)[0];
    const double used = Shares(r, "total_us")[0];
    const double charged = Shares(r, "charged_us")[0];
    const bool ok = std::fabs(got - 30) <= 5 && std::fabs(charged - used) <= 5;
    Add({name,
         "30% job got " + Fixed(got) + "%; charged " + Fixed(charged) + "% for " + Fixed(used) +
             "% used",
         goal,
         ok ? Verdict::kPass : Verdict::kFail,
         {{"share_percent", got},
          {"charged_percent", charged},
          {"used_percent", used},
          {"window_us", {Num(r[0], "window_us"), Num(r[1], "window_us")}},
          {"charged_us", {Num(r[0], "charged_us"), Num(r[1], "charged_us")}},
          {"total_us", {Num(r[0], "total_us"), Num(r[1], "total_us")}}}});
  }

  // A 30% job of `n` processes (each 4 x 1 ms per synchronize: an inference server's workers)
  // beside a 70% job of one: the job's share is what all its processes got together.
  void SeveralProcesses(int n) {
    const std::string name = "job of " + std::to_string(n) + " processes";
    const std::string goal = "30% +-5 points for the job";
    std::vector<Tenant> tenants;
    for (int i = 0; i < n; ++i)
      tenants.push_back(
          {"heavy", {"TESSERA_CUDA_COMPUTE_SHARE=30%"}, true, WorkArgs(Work{1000, 4, 0})});
    tenants.push_back({"steady", {"TESSERA_CUDA_COMPUTE_SHARE=70%"}, true, WorkArgs(Work{})});
    std::vector<Fields> r = Contend(name, std::move(tenants), 2600, 500, 2500);
    if (std::string e = ErrorOf(r); !e.empty()) return Failed(name, goal, e);
    double job = 0, used = 0;
    for (int i = 0; i < n; ++i) job += Num(r[i], "window_us"), used += Num(r[i], "total_us");
    const double other = Num(r[n], "window_us"), other_used = Num(r[n], "total_us");
    const double got = job + other > 0 ? 100 * job / (job + other) : NAN;
    // The arbiter charges the job once (its key), whichever process did the work.
    const double charged_job = Num(r[0], "charged_us"), charged_other = Num(r[n], "charged_us");
    const double charged =
        charged_job + charged_other > 0 ? 100 * charged_job / (charged_job + charged_other) : NAN;
    const double used_percent = used + other_used > 0 ? 100 * used / (used + other_used) : NAN;
    Add({name,
         "the 30% job got " + Fixed(got) + "%; charged " + Fixed(charged) + "% for " +
             Fixed(used_percent) + "% used",
         goal,
         std::fabs(got - 30) <= 5 ? Verdict::kPass : Verdict::kFail,
         {{"processes", n},
          {"share_percent", got},
          {"charged_percent", charged},
          {"used_percent", used_percent}}});
  }

  void Calibrate() {
    Child c;
    std::string err;
    if (!Start({"calibrate", {}, false, {"calibrate"}}, "", &c, &err)) {
      return Failed("calibrate", "", err);
    }
    Fields f = ParseFields(c.ReadLine());
    c.Wait();
    iters_per_us = Num(f, "iters_per_us");
    if (f.count("error") || !(iters_per_us > 0)) {
      return Failed("calibrate", "", f.count("error") ? f["error"] : "no figure");
    }
    Add({"calibrate",
         Fixed(iters_per_us, 2) + " spin iterations per us alone",
         "",
         Verdict::kInfo,
         {{"iters_per_us", iters_per_us}}});
  }

  void LaunchCost() {
    std::string goal = "library +50 ns or less per launch";
    // Alternating runs of each, the best of five: the machine's noise is one-sided.
    struct Variant {
      const char* name;
      bool preload;
      std::vector<std::string> env;
      std::string library = {};
      double best = 1e18;
    };
    std::vector<Variant> v = {{"without the library", false, {}},
                              {"library, memory limit", true, {"TESSERA_CUDA_MEM_LIMIT=64GiB"}},
                              {"library, 50% share", true, {"TESSERA_CUDA_COMPUTE_SHARE=50%"}}};
    if (!options_.baseline.empty()) {
      v.push_back(
          {"baseline, 50% share", true, {"TESSERA_CUDA_COMPUTE_SHARE=50%"}, options_.baseline});
    }
    for (int round = 0; round < 5; ++round) {
      for (Variant& x : v) {
        Child c;
        std::string err;
        const bool shared = x.env.size() == 1 && x.env[0].find("SHARE") != std::string::npos;
        library_ = x.library;
        const bool started = Start({"launch", x.env, x.preload, {"launch", "n=20000"}},
                                   shared ? dir_ + "/arbiter-launch" : "", &c, &err);
        library_.clear();
        if (!started) {
          return Failed("launch cost", goal, err);
        }
        Fields f = ParseFields(c.ReadLine());
        c.Wait();
        if (f.count("error")) return Failed("launch cost", goal, f["error"]);
        x.best = std::min(x.best, Num(f, "ns"));
      }
    }
    const double limit = v[1].best - v[0].best, share = v[2].best - v[0].best;
    nlohmann::json data = {
        {"ns_without", v[0].best}, {"ns_memory_limit", v[1].best}, {"ns_share", v[2].best}};
    std::string measured = Fixed(v[0].best) + " ns alone; library +" + Fixed(limit) +
                           " ns, with a share +" + Fixed(share) + " ns";
    bool ok = limit <= 50 && share <= 50;
    if (v.size() > 3) {
      // Against an older build in the same run: what the change costs, the driver's and the
      // machine's share left out.
      data["ns_baseline_share"] = v[3].best;
      measured += " (baseline +" + Fixed(v[3].best - v[0].best) + " ns)";
      goal = "with a share, +50 ns or less than the baseline";
      ok = v[2].best - v[3].best <= 50;
    }
    Add({"launch cost", measured, goal, ok ? Verdict::kPass : Verdict::kFail, data});
  }

  void SharesTwentyThirtyFifty() {
    const std::string name = "shares 20/30/50", goal = "each +-5 points";
    std::vector<Fields> r =
        Contend(name,
                {{"a", {"TESSERA_CUDA_COMPUTE_SHARE=20%"}, true, WorkArgs(Work{})},
                 {"b", {"TESSERA_CUDA_COMPUTE_SHARE=30%"}, true, WorkArgs(Work{})},
                 {"c", {"TESSERA_CUDA_COMPUTE_SHARE=50%"}, true, WorkArgs(Work{})}},
                2600, 500, 2500);
    if (std::string e = ErrorOf(r); !e.empty()) return Failed(name, goal, e);
    const std::vector<double> s = Shares(r);
    const bool ok =
        std::fabs(s[0] - 20) <= 5 && std::fabs(s[1] - 30) <= 5 && std::fabs(s[2] - 50) <= 5;
    Add({name,
         Fixed(s[0]) + "/" + Fixed(s[1]) + "/" + Fixed(s[2]) + "%",
         goal,
         ok ? Verdict::kPass : Verdict::kFail,
         {{"share_percent", s}}});
  }

  void WithoutTheLibrary() {
    const std::string name = "control: 30/70 without the library";
    std::vector<Fields> r =
        Contend(name,
                {{"a", {"TESSERA_CUDA_COMPUTE_SHARE=30%"}, false, WorkArgs(Work{})},
                 {"b", {"TESSERA_CUDA_COMPUTE_SHARE=70%"}, false, WorkArgs(Work{})}},
                2600, 500, 2500);
    if (std::string e = ErrorOf(r); !e.empty()) return Failed(name, "", e);
    const std::vector<double> s = Shares(r);
    Add({name,
         Fixed(s[0]) + "/" + Fixed(s[1]) + "% (the driver's own time-slicing)",
         "contention is real",
         Verdict::kInfo,
         {{"share_percent", s}}});
  }

  void StoppedTenant() {
    const std::string name = "SIGSTOP 1.5 s, then 2 s", goal = "50% +-5 points after the resume";
    std::vector<Fields> r =
        Contend(name,
                {{"stopped", {"TESSERA_CUDA_COMPUTE_SHARE=50%"}, true, WorkArgs(Work{})},
                 {"running", {"TESSERA_CUDA_COMPUTE_SHARE=50%"}, true, WorkArgs(Work{})}},
                4200, 2000, 4000, [](const std::vector<pid_t>& pids, double start) {
                  auto until = [](double ms) {
                    while (NowMs() < ms) usleep(1000);
                  };
                  until(start + 500);
                  kill(pids[0], SIGSTOP);
                  until(start + 2000);
                  kill(pids[0], SIGCONT);
                });
    if (std::string e = ErrorOf(r); !e.empty()) return Failed(name, goal, e);
    const double s = Shares(r)[0];
    Add({name,
         "stopped job got " + Fixed(s) + "%",
         goal,
         std::fabs(s - 50) <= 5 ? Verdict::kPass : Verdict::kFail,
         {{"share_percent", s}}});
  }

  void Priority() {
    const std::string goal = "high >= 95% of alone, low >= 20% of alone";
    const Work high{1000, 5, 5000}, low{200, 20, 0};
    auto run = [&](int lows, bool with_high) {
      std::vector<Tenant> t;
      if (with_high) t.push_back({"high", {"TESSERA_CUDA_PRIORITY=10"}, true, WorkArgs(high)});
      for (int i = 0; i < lows; ++i)
        t.push_back({"low" + std::to_string(i), {"TESSERA_CUDA_PRIORITY=0"}, true, WorkArgs(low)});
      return Contend("priority", t, 2600, 500, 2500);
    };
    std::vector<Fields> high_alone = run(0, true), low_alone = run(1, false);
    if (std::string e = ErrorOf(high_alone) + ErrorOf(low_alone); !e.empty()) {
      return Failed("priority", goal, e);
    }
    const double h0 = Num(high_alone[0], "window_us"), l0 = Num(low_alone[0], "window_us");
    for (int lows : {1, 2}) {
      const std::string name = "priority beside " + std::to_string(lows) + " low";
      std::vector<Fields> r = run(lows, true);
      if (std::string e = ErrorOf(r); !e.empty()) return Failed(name, goal, e);
      double low_sum = 0;
      for (int i = 1; i <= lows; ++i) low_sum += Num(r[static_cast<size_t>(i)], "window_us");
      const double h = 100 * Num(r[0], "window_us") / h0, l = 100 * low_sum / l0;
      Add({name,
           "high " + Fixed(h) + "% of alone, low " + Fixed(l) + "% of alone",
           goal,
           h >= 95 && l >= 20 ? Verdict::kPass : Verdict::kFail,
           {{"high_percent_of_alone", h}, {"low_percent_of_alone", l}}});
    }
  }

  void Memory(Nvml* nvml) {
    const std::string name = "memory limit 1 GiB";
    const std::string goal = "NVML's figure for the process <= the limit";
    constexpr double kLimit = 1 << 30;
    Child c;
    std::string err;
    if (!Start({"memory", {"TESSERA_CUDA_MEM_LIMIT=1GiB"}, true, {"memory"}}, "", &c, &err)) {
      return Failed(name, goal, err);
    }
    if (Fields f = ParseFields(c.ReadLine()); f.count("error"))
      return Failed(name, goal, f["error"]);
    if (nvml != nullptr) {
      // What a context and the check's module take before any allocation: what the library must
      // count for them (TESSERA_CUDA_CONTEXT_OVERHEAD where it cannot measure it).
      const double ctx = static_cast<double>(nvml->ProcessMemory(
          static_cast<unsigned>(options_.device), static_cast<unsigned>(c.pid())));
      Add({"context footprint",
           Fixed(ctx / (1 << 20), 0) + " MiB by NVML before any allocation",
           "",
           Verdict::kInfo,
           {{"bytes", ctx}}});
    }
    auto step = [&](const std::string& what) {
      c.Send(what);
      Fields f = ParseFields(c.ReadLine());
      if (nvml != nullptr) {
        f["nvml_bytes"] = std::to_string(nvml->ProcessMemory(static_cast<unsigned>(options_.device),
                                                             static_cast<unsigned>(c.pid())));
      }
      return f;
    };
    auto mib = [](double b) { return std::isnan(b) ? "?" : Fixed(b / (1 << 20), 0) + " MiB"; };
    auto verdict = [&](const Fields& f) {
      const double used = Num(f, "nvml_bytes");
      if (nvml == nullptr) return Verdict::kInfo;  // nothing to hold it against
      return used >= 0 && used <= kLimit ? Verdict::kPass : Verdict::kFail;
    };
    Fields alloc = step("alloc");
    if (alloc.count("error")) return Failed(name, goal, alloc["error"]);
    Add({name + ": 2 MiB+1 allocations",
         alloc["n"] + " allocated (" + mib(Num(alloc, "requested")) + " asked), NVML says " +
             mib(Num(alloc, "nvml_bytes")),
         goal, verdict(alloc), nlohmann::json(alloc)});
    Fields modules = step("modules");
    Add({name + ": + modules at the limit",
         modules["n"] + " modules loaded more, NVML says " + mib(Num(modules, "nvml_bytes")), goal,
         verdict(modules), nlohmann::json(modules)});
    Fields info = step("info");
    Add({name + ": cuMemGetInfo",
         "total " + mib(Num(info, "total")) + ", free " + mib(Num(info, "free")),
         "total = the limit", Num(info, "total") == kLimit ? Verdict::kPass : Verdict::kFail,
         nlohmann::json(info)});
    step("free");
    Fields async = step("async");
    Add({name + ": cuMemAllocAsync pool",
         async["n"] + " allocated (" + mib(Num(async, "requested")) + " asked), NVML says " +
             mib(Num(async, "nvml_bytes")),
         goal, verdict(async), nlohmann::json(async)});
    step("freeasync");
    // VMM memory released right after it is mapped stays charged until its unmap: at most 4 x
    // 256 MiB under the 1 GiB limit (12 were live before).
    Fields vmm = step("vmm");
    const double vmm_n = Num(vmm, "n");
    Add({name + ": VMM released after mapping",
         vmm["n"] + " x 256 MiB mapped, NVML says " + mib(Num(vmm, "nvml_bytes")),
         "at most 4 x 256 MiB; NVML <= the limit",
         vmm_n <= 4 && verdict(vmm) != Verdict::kFail ? verdict(vmm) : Verdict::kFail,
         nlohmann::json(vmm)});
    step("vmmfree");
    // Graph memory: one too large for the limit is refused (at capture, instantiation or launch),
    // one that fits runs ten times and NVML's figure stays within the limit.
    Fields big = step("graph:2048");
    const bool refused = big["capture"] != "0" || big["instantiate"] != "0" || big["launch"] != "0";
    Fields fits = step("graph:256");
    const bool ran = fits["capture"] == "0" && fits["instantiate"] == "0" && fits["launch"] == "0";
    Add({name + ": graph memory",
         "2 GiB graph: capture " + big["capture"] + ", instantiate " + big["instantiate"] +
             ", launch " + big["launch"] + "; 256 MiB graph x10: " + (ran ? "ran" : "failed") +
             ", NVML says " + mib(Num(fits, "nvml_bytes")),
         "2 GiB refused; 256 MiB runs, NVML <= the limit",
         refused && ran && verdict(fits) != Verdict::kFail ? verdict(fits) : Verdict::kFail,
         nlohmann::json{{"big", nlohmann::json(big)}, {"fits", nlohmann::json(fits)}}});
    c.Wait();
  }

  // VMM memory shared between two processes of a job (one region): 512 MiB exported as a
  // descriptor by one, imported and mapped by the other. Charged once while both hold it, still
  // charged after the exporter lets go (the importer's mapping keeps it), given back with the last.
  void SharedVmm() {
    const std::string name = "shared VMM 512 MiB";
    const std::vector<std::string> env = {"TESSERA_CUDA_MEM_LIMIT=4GiB",
                                          "TESSERA_CUDA_REGION=" + dir_ + "/shared-vmm.region"};
    Child a, b;
    std::string err;
    if (!Start({"exporter", env, true, {"memory"}}, "", &a, &err) ||
        !Start({"importer", env, true, {"memory"}}, "", &b, &err)) {
      return Failed(name, "", err);
    }
    for (Child* c : {&a, &b}) {
      if (Fields f = ParseFields(c->ReadLine()); f.count("error"))
        return Failed(name, "", f["error"]);
    }
    auto used = [&](Child& c) {
      c.Send("info");
      Fields f = ParseFields(c.ReadLine());
      return Num(f, "total") - Num(f, "free");
    };
    const double before = used(b);
    const std::string sock = dir_ + "/shared-vmm.sock";
    a.Send("vmmexport:" + sock);
    b.Send("vmmimport:" + sock);
    Fields exported = ParseFields(a.ReadLine()), imported = ParseFields(b.ReadLine());
    if (exported["rc"] != "0" || imported["rc"] != "0") {
      return Failed(name, "", "export rc " + exported["rc"] + ", import rc " + imported["rc"]);
    }
    const double both = used(b);
    a.Send("vmmdrop");
    a.ReadLine();
    const double importer_only = used(b);
    b.Send("vmmdrop");
    b.ReadLine();
    const double after = used(b);
    constexpr double kShared = 512.0 * (1 << 20), kSlack = 16.0 * (1 << 20);
    auto mib = [](double v) { return Fixed(v / (1 << 20), 0) + " MiB"; };
    Add({name + ": both hold it",
         "charged " + mib(both - before),
         "512 MiB: once",
         std::abs(both - before - kShared) < kSlack ? Verdict::kPass : Verdict::kFail,
         {{"charged_bytes", both - before}}});
    Add({name + ": the exporter let go",
         "charged " + mib(importer_only - before),
         "512 MiB: the importer's mapping keeps it",
         std::abs(importer_only - before - kShared) < kSlack ? Verdict::kPass : Verdict::kFail,
         {{"charged_bytes", importer_only - before}}});
    Add({name + ": both let go",
         "charged " + mib(after - before),
         "0",
         std::abs(after - before) < kSlack ? Verdict::kPass : Verdict::kFail,
         {{"charged_bytes", after - before}}});
    a.Wait();  // stdin closed: the tenants end
    b.Wait();
  }

  // A container's tenant (a pid namespace of its own), with the overhead the node agent sets for
  // every pod: contexts and modules measured under the host pid the library finds by its probe,
  // not only the fixed overhead (modules went uncounted: 5 x 400 MiB took 3,000 MiB under 1 GiB).
  void ContainerMemory(Nvml* nvml) {
    const std::string name = "container memory limit 1 GiB";
    const std::string goal = "NVML's figure for the process <= the limit";
    Child c;
    std::string err;
    if (!Start({"container",
                {"TESSERA_CUDA_MEM_LIMIT=1GiB", "TESSERA_CUDA_CONTEXT_OVERHEAD=520MiB"},
                true,
                {"memory"},
                {},
                true},
               "", &c, &err)) {
      return Failed(name, goal, err);
    }
    if (Fields f = ParseFields(c.ReadLine()); f.count("error"))
      return Failed(name, goal, f["error"]);
    // The tenant is unshare's child: its host pid, which NVML lists.
    pid_t tenant = -1;
    const std::string p = std::to_string(c.pid());
    std::ifstream("/proc/" + p + "/task/" + p + "/children") >> tenant;
    for (const char* step : {"modules", "alloc"}) {
      c.Send(step);
      Fields f = ParseFields(c.ReadLine());
      const double used =
          nvml == nullptr || tenant <= 0
              ? NAN
              : static_cast<double>(nvml->ProcessMemory(static_cast<unsigned>(options_.device),
                                                        static_cast<unsigned>(tenant)));
      f["nvml_bytes"] = Fixed(used, 0);
      Add({name + ": " + step,
           f["n"] + (std::string(step) == "modules" ? " modules" : " allocations") +
               ", NVML says " + (std::isnan(used) ? "?" : Fixed(used / (1 << 20), 0) + " MiB"),
           goal,
           std::isnan(used)                 ? Verdict::kInfo
           : used >= 0 && used <= (1 << 30) ? Verdict::kPass
                                            : Verdict::kFail,
           nlohmann::json(f)});
    }
    c.Send("free");
    c.ReadLine();
    c.Wait();
  }

  // PyTorch tenants (tests/gpu/torch_tenant.py): 200 products queued per synchronize at 30%
  // beside 4 at 70%, and a PyTorch allocation over the limit.
  void Torch() {
    auto tenant = [&](const char* job, const char* share, const char* batch) {
      return Tenant{job,
                    {std::string("TESSERA_CUDA_COMPUTE_SHARE=") + share},
                    true,
                    {std::string("batch=") + batch, "n=8192"},
                    {options_.python, options_.torch}};
    };
    start_delay_ms = 20000;
    ShareScenario("pytorch deep queue 200 products",
                  {tenant("heavy", "30%", "200"), tenant("steady", "70%", "4")}, 8000, 2000, 7000);
    start_delay_ms = 0;
    const std::string name = "pytorch memory limit 1 GiB", goal = "2 GiB refused, 256 MiB allowed";
    Child c;
    std::string err;
    if (!Start({"torch-memory",
                {"TESSERA_CUDA_MEM_LIMIT=1GiB"},
                true,
                {"mode=memory"},
                {options_.python, options_.torch}},
               "", &c, &err)) {
      return Failed(name, goal, err);
    }
    Fields f = ParseFields(c.ReadLine());
    c.Wait();
    if (f.count("error")) return Failed(name, goal, f["error"]);
    Add({name, "2 GiB: " + f["over"] + ", 256 MiB: " + f["under"], goal,
         f["over"] == "oom" && f["under"] == "ok" ? Verdict::kPass : Verdict::kFail,
         nlohmann::json(f)});
  }

  void ProcAddress() {
    // The limit leaves room for a context (about 520 MiB on an H100 with CUDA 13).
    const std::string name = "lookup routes", goal = "2 GiB refused, 64 MiB allowed under 1 GiB";
    Child c;
    std::string err;
    if (!Start({"procaddr",
                {"TESSERA_CUDA_MEM_LIMIT=1GiB"},
                true,
                {"procaddr", "over=2147483648", "under=67108864"}},
               "", &c, &err)) {
      return Failed(name, goal, err);
    }
    std::string escaped, routes;
    nlohmann::json data = nlohmann::json::array();
    for (std::string line = c.ReadLine(); !line.empty(); line = c.ReadLine()) {
      Fields f = ParseFields(line);
      if (f.count("error")) return Failed(name, goal, f["error"]);
      data.push_back(f);
      routes += (routes.empty() ? "" : ", ") + f["route"];
      if (f["over"] != "2" || f["under"] != "0") {
        escaped += " " + f["route"] + " (over " + f["over"] + ", under " + f["under"] + ")";
      }
    }
    c.Wait();
    if (data.empty()) return Failed(name, goal, "no route reported");
    Add({name,
         escaped.empty() ? std::to_string(data.size()) + " routes held: " + routes
                         : "escaped:" + escaped,
         goal, escaped.empty() ? Verdict::kPass : Verdict::kFail, data});
  }

 private:
  const Options& options_;
  std::ostream& out_;
  std::string dir_;
  std::string library_;  // the library of the tenant being started, when not options_.library
  int scenarios_ = 0;
};

const std::vector<std::string>& Names() {
  static const std::vector<std::string> names = {
      "calibrate",        "launch cost",        "shares 20/30/50",
      "control",          "deep queue 200x1ms", "deep queue 400x5ms",
      "graph replays",    "long kernels",       "job of processes",
      "SIGSTOP",          "priority",           "memory",
      "container memory", "shared VMM",         "lookup routes",
      "pytorch"};
  return names;
}

std::string Now() {
  char text[64];
  const time_t t = time(nullptr);
  tm utc;
  gmtime_r(&t, &utc);
  strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

std::vector<std::string> CheckNames() { return Names(); }

int RunChecks(const Options& options, std::ostream& out) {
  if (access(options.library.c_str(), R_OK) != 0) {
    out << "tessera-gpu-check: the intercept library " << options.library
        << " cannot be read (build it: cmake --build BUILD --target tessera-cuda)\n";
    return 2;
  }
  Driver d;
  std::string err;
  if (!d.Load(options.libcuda.c_str(), &err)) {
    out << "tessera-gpu-check: no NVIDIA driver here (" << err << "); nothing was checked\n";
    return kNoDriver;
  }
  CUresult rc = d.cuInit(0);
  CUdevice dev = 0;
  if (rc == CUDA_SUCCESS) rc = d.cuDeviceGet(&dev, options.device);
  if (rc != CUDA_SUCCESS) {
    out << "tessera-gpu-check: the driver sees no GPU " << options.device << " (" << d.Error(rc)
        << "); nothing was checked\n";
    return kNoDriver;
  }
  char gpu_name[256] = "";
  d.cuDeviceGetName(gpu_name, sizeof gpu_name, dev);
  size_t total = 0;
  d.cuDeviceTotalMem_v2(&total, dev);
  int api = 0;
  d.cuDriverGetVersion(&api);
  Nvml nvml;
  std::string nvml_err;
  const bool have_nvml = nvml.Load(&nvml_err);
  const std::string driver = have_nvml ? nvml.DriverVersion() : "";
  out << "GPU " << options.device << ": " << gpu_name << ", " << total / (1 << 20)
      << " MiB, driver " << (driver.empty() ? "?" : driver) << " (CUDA " << api / 1000 << "."
      << api % 1000 / 10 << ")\nlibrary: " << options.library << "\n";
  if (!have_nvml) out << "NVML: " << nvml_err << " (memory figures left out)\n";

  std::string dir = (std::filesystem::temp_directory_path() / "tessera-gpu-check.XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    out << "tessera-gpu-check: cannot make a temporary folder\n";
    return 1;
  }
  Checker c(options, out, dir);
  auto wanted = [&](const char* name) { return c.Wanted(name); };
  c.Calibrate();
  if (c.iters_per_us > 0) {
    if (wanted("launch cost")) c.LaunchCost();
    if (wanted("shares 20/30/50")) c.SharesTwentyThirtyFifty();
    if (wanted("control")) c.WithoutTheLibrary();
    if (wanted("deep queue 200x1ms"))
      c.ShareScenario("deep queue 200x1ms", Work{1000, 200, 0}, 2600, 500, 2500);
    if (wanted("deep queue 400x5ms"))
      c.ShareScenario("deep queue 400x5ms", Work{5000, 400, 0}, 4600, 500, 4500);
    if (wanted("graph replays"))
      c.ShareScenario("graph replays 4x50ms", Work{1000, 4, 0, 50}, 2600, 500, 2500);
    if (wanted("long kernels"))
      c.ShareScenario("long kernels 200ms", Work{200000, 1, 0}, 4600, 500, 4500);
    if (wanted("job of processes")) {
      for (int n : {2, 4, 8}) c.SeveralProcesses(n);
    }
    if (wanted("SIGSTOP")) c.StoppedTenant();
    if (wanted("priority")) c.Priority();
  }
  if (wanted("memory")) c.Memory(have_nvml ? &nvml : nullptr);
  if (wanted("container memory")) c.ContainerMemory(have_nvml ? &nvml : nullptr);
  if (wanted("shared VMM")) c.SharedVmm();
  if (wanted("lookup routes")) c.ProcAddress();
  if (!options.torch.empty() && wanted("pytorch")) c.Torch();
  std::filesystem::remove_all(dir);

  // The table.
  size_t w_name = 5, w_measured = 8;
  for (const Result& r : c.results) {
    w_name = std::max(w_name, r.name.size());
    w_measured = std::max(w_measured, r.measured.size());
  }
  auto row = [&](const std::string& a, const std::string& b, const std::string& g,
                 const std::string& v) {
    out << a << std::string(w_name + 2 - a.size(), ' ') << b
        << std::string(w_measured + 2 - b.size(), ' ') << v << "  " << g << "\n";
  };
  out << "\n";
  row("CHECK", "MEASURED", "GOAL", "RESULT");
  int failed = 0;
  nlohmann::json checks = nlohmann::json::array();
  for (const Result& r : c.results) {
    const char* v = r.verdict == Verdict::kPass   ? "pass"
                    : r.verdict == Verdict::kFail ? "FAIL"
                                                  : "info";
    failed += r.verdict == Verdict::kFail;
    row(r.name, r.measured, r.goal, v);
    checks.push_back({{"name", r.name},
                      {"measured", r.measured},
                      {"goal", r.goal},
                      {"result", v},
                      {"data", r.data}});
  }
  if (!options.json.empty()) {
    nlohmann::json doc = {
        {"gpu", gpu_name},        {"memory_mib", total / (1 << 20)}, {"driver", driver},
        {"cuda_driver_api", api}, {"library", options.library},      {"date", Now()},
        {"checks", checks}};
    std::ofstream f(options.json);
    f << doc.dump(2) << "\n";
    if (!f) out << "tessera-gpu-check: cannot write " << options.json << "\n";
  }
  out << "\n"
      << c.results.size() - static_cast<size_t>(failed) << " of " << c.results.size()
      << " checks without a failure\n";
  return failed > 0 ? 1 : 0;
}

}  // namespace tessera::gpucheck
