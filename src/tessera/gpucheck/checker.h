#pragma once
// What the real-GPU checks share (checks.h): the tenants' result lines, a result, a tenant, the
// work it does, and the Checker that starts tenants and keeps the results. The checks themselves
// are Checker's members: the compute ones in checks.cc, the memory ones in checks_memory.cc.

#include <sys/types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "tessera/gpucheck/checks.h"
#include "tessera/gpucheck/child.h"
#include "tessera/gpucheck/driver.h"
#include "tessera/shim/arbiter.h"

extern char** environ;

namespace tessera::gpucheck::check {

using Fields = std::map<std::string, std::string>;

// "a=1 b=two" -> {a: 1, b: two}; an "error=..." line keeps the rest of the line as the value.
inline Fields ParseFields(const std::string& line) {
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

inline double Num(const Fields& f, const char* key) {
  auto it = f.find(key);
  return it == f.end() ? NAN : std::strtod(it->second.c_str(), nullptr);
}

inline std::string Fixed(double v, int digits = 1) {
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
  // they do (pids, start in ms). "charged_us" is added: the GPU time the arbiter charged the job;
  // "held_us": how long its launches waited for the GPU.
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
      const int device = options_.device;
      const shim::ArbiterUse used = shim::ArbiterJobUse(
          arbiter.c_str(), &device, 1, shim::ArbiterJobKey(tenants[i].job.c_str()));
      out[i]["charged_us"] = std::to_string(used.busy_us);
      // How long its launches waited for the GPU (what it would have used: docs/sharing.md).
      out[i]["held_us"] = std::to_string(used.held_us);
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
          {"held_us", {Num(r[0], "held_us"), Num(r[1], "held_us")}},
          {"total_us", {Num(r[0], "total_us"), Num(r[1], "total_us")}}}});
  }

  // A 30% job of `n` processes (each 4 x 1 ms per synchronize: an inference server's workers)
  // beside a 70% job of one: the job's share is what all its processes got together.
  void SeveralProcesses(int n);
  void Calibrate();
  void LaunchCost();
  void SharesTwentyThirtyFifty();
  void WithoutTheLibrary();
  void StoppedTenant();
  void Priority();
  void Memory(Nvml* nvml);
  // VMM memory shared between two processes of a job (one region): 512 MiB exported as a
  // descriptor by one, imported and mapped by the other. Charged once while both hold it, still
  // charged after the exporter lets go (the importer's mapping keeps it), given back with the last.
  void SharedVmm();
  // A container's tenant (a pid namespace of its own), with the overhead the node agent sets for
  // every pod: contexts and modules measured under the host pid the library finds by its probe,
  // not only the fixed overhead (modules went uncounted: 5 x 400 MiB took 3,000 MiB under 1 GiB).
  void ContainerMemory(Nvml* nvml);
  // PyTorch tenants (tests/gpu/torch_tenant.py): 200 products queued per synchronize at 30%
  // beside 4 at 70%, and a PyTorch allocation over the limit.
  void Torch();
  void ProcAddress();
  // MPS beside time slices (checks_mps.cc): 4 tenants of small kernels alone, in slices and under
  // MPS; MPS's pinned memory limit against NVML; a client killed mid-kernel. Info where there is
  // no MPS.
  void Mps(Nvml* nvml);

 private:
  const Options& options_;
  std::ostream& out_;
  std::string dir_;
  std::string library_;  // the library of the tenant being started, when not options_.library
  int scenarios_ = 0;
};

}  // namespace tessera::gpucheck::check
