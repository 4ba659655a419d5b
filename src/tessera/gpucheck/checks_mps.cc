// The MPS checks (issue 57): what NVIDIA's Multi-Process Service does beside time slices on this
// GPU, with a control daemon of the check's own for the device (its own pipe and log folders).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/gpucheck/checker.h"

namespace tessera::gpucheck::check {
namespace {

// `control`'s environment for a daemon of the check's own: its folders, only `device` visible.
std::vector<std::string> MpsEnv(const std::string& dir, int device) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("CUDA_MPS_", 0) == 0 || kv.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0) continue;
    env.push_back(kv);
  }
  env.push_back("CUDA_MPS_PIPE_DIRECTORY=" + dir + "/pipe");
  env.push_back("CUDA_MPS_LOG_DIRECTORY=" + dir + "/log");
  env.push_back("CUDA_VISIBLE_DEVICES=" + std::to_string(device));
  return env;
}

// Runs `control` with `command` on its stdin (none: `-d`, a daemon); its exit status.
int Control(const std::string& control, const std::string& command,
            const std::vector<std::string>& env) {
  Child c;
  std::string err;
  const bool started =
      command.empty()
          ? c.Spawn({control, "-d"}, env, &err)
          : c.Spawn({"/bin/sh", "-c", "echo \"$1\" | \"$0\"", control, command}, env, &err);
  if (!started) return -1;
  const int status = c.Wait();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

void Checker::Mps(Nvml* nvml) {
  const std::string control = options_.mps_control;
  const std::string dir = dir_ + "/mps";
  std::error_code ec;
  std::filesystem::create_directories(dir + "/pipe", ec);
  std::filesystem::create_directories(dir + "/log", ec);
  const std::vector<std::string> env = MpsEnv(dir, options_.device);
  if (Control(control, "", env) != 0) {
    Add({"MPS",
         "no MPS here: `" + control + " -d` did not start a daemon (see " + dir + "/log)",
         "",
         Verdict::kInfo,
         {{"error", "the control daemon did not start"}}});
    return;
  }
  bool up = false;
  for (int i = 0; i < 200 && !(up = Control(control, "get_server_list", env) == 0); ++i)
    usleep(25000);
  if (!up) {
    Control(control, "quit", env);
    return Failed("MPS", "", "the control daemon started but does not answer get_server_list");
  }
  // What a tenant needs to be a client of the check's daemon, with MPS's own limits.
  auto client = [&](const std::string& percent, const std::string& pinned = "") {
    std::vector<std::string> e = {"CUDA_MPS_PIPE_DIRECTORY=" + dir + "/pipe",
                                  "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + percent};
    if (!pinned.empty()) e.push_back("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + pinned);
    return e;
  };
  // 4 tenants of small kernels (50 us, 8 per synchronize): alone, in time slices (the library,
  // 25% each) and under MPS (25% of the SMs each). Throughput: kernel time done in the window.
  const Work small{50, 8, 0};
  auto total = [](const std::vector<Fields>& r) {
    double t = 0;
    for (const Fields& f : r) t += Num(f, "window_us");
    return t;
  };
  auto each = [](const std::vector<Fields>& r) {
    std::vector<double> v;
    for (const Fields& f : r) v.push_back(Num(f, "window_us"));
    return v;
  };
  const std::string goal = "info: throughput against one tenant alone";
  std::vector<Fields> alone =
      Contend("MPS: one tenant alone", {{"alone", {}, false, WorkArgs(small)}}, 2600, 500, 2500);
  std::vector<Tenant> sliced, spatial;
  for (int i = 0; i < 4; ++i) {
    const std::string job = "t" + std::to_string(i);
    sliced.push_back({job, {"TESSERA_CUDA_COMPUTE_SHARE=25%"}, true, WorkArgs(small)});
    spatial.push_back({"m" + std::to_string(i), client("25"), false, WorkArgs(small)});
  }
  std::vector<Fields> slices = Contend("MPS: 4 tenants in time slices", sliced, 2600, 500, 2500);
  std::vector<Fields> mps = Contend("MPS: 4 tenants under MPS", spatial, 2600, 500, 2500);
  if (std::string e = ErrorOf(alone) + ErrorOf(slices) + ErrorOf(mps); !e.empty()) {
    Failed("MPS: 4 tenants of small kernels", goal, e);
  } else {
    const double base = total(alone);
    Add({"MPS: 4 tenants of small kernels",
         "in time slices " + Fixed(total(slices) / base, 2) + "x one alone, under MPS " +
             Fixed(total(mps) / base, 2) + "x",
         goal,
         Verdict::kInfo,
         {{"alone_us", base},
          {"time_slices_us", each(slices)},
          {"mps_us", each(mps)},
          {"time_slices_ratio", total(slices) / base},
          {"mps_ratio", total(mps) / base}}});
  }
  // MPS's pinned memory limit (1 GiB) against NVML's figure for the client.
  {
    const std::string name = "MPS: pinned memory limit 1 GiB";
    const std::string limit_goal = "NVML's figure for the client <= 1 GiB + its context";
    Child c;
    std::string err;
    if (!Start({"mps-memory", client("100", "0=1G"), false, {"memory"}}, "", &c, &err)) {
      Failed(name, limit_goal, err);
    } else if (Fields f = ParseFields(c.ReadLine()); f.count("error")) {
      Failed(name, limit_goal, f["error"]);
    } else {
      c.Send("alloc");
      Fields alloc = ParseFields(c.ReadLine());
      const double nvml_bytes =
          nvml != nullptr
              ? static_cast<double>(nvml->ProcessMemory(static_cast<unsigned>(options_.device),
                                                        static_cast<unsigned>(c.pid())))
              : NAN;
      alloc["nvml_bytes"] = Fixed(nvml_bytes, 0);
      // Under MPS the client's context lives in the server; what NVML shows for the client is its
      // allocations (and the limit is on those).
      const bool held = !std::isnan(nvml_bytes) && nvml_bytes <= (1 << 30) + (64 << 20);
      Add({name,
           alloc["n"] + " allocated (" + Fixed(Num(alloc, "requested") / (1 << 20), 0) +
               " MiB asked), NVML says " +
               (std::isnan(nvml_bytes) ? "?" : Fixed(nvml_bytes / (1 << 20), 0) + " MiB"),
           limit_goal,
           nvml == nullptr ? Verdict::kInfo
           : held          ? Verdict::kPass
                           : Verdict::kFail,
           nlohmann::json(alloc)});
      c.Send("free");
      c.ReadLine();
    }
  }
  // A client killed mid-kernel (SIGKILL 0.5 s in): what its three co-tenants on the same server
  // saw.
  {
    std::vector<Tenant> four;
    for (int i = 0; i < 4; ++i)
      four.push_back({"k" + std::to_string(i), client("25"), false, WorkArgs(Work{20000, 2, 0})});
    std::vector<Fields> r = Contend("MPS: a client killed mid-kernel", four, 2600, 1000, 2500,
                                    [](const std::vector<pid_t>& pids, double start) {
                                      while (NowMs() < start + 500) usleep(1000);
                                      kill(pids[0], SIGKILL);
                                    });
    std::string seen;
    int ran_on = 0;
    for (size_t i = 1; i < r.size(); ++i) {
      const bool error = r[i].count("error") > 0;
      ran_on += !error && Num(r[i], "window_us") > 0;
      seen += (seen.empty() ? "" : "; ") + std::string("co-tenant ") + std::to_string(i) + ": " +
              (error ? "error " + r[i]["error"] : Fixed(Num(r[i], "window_us") / 1000, 0) + " ms");
    }
    Add({"MPS: a client killed mid-kernel",
         std::to_string(ran_on) + " of 3 co-tenants ran on (" + seen + ")",
         "info: what MPS does to the others",
         Verdict::kInfo,
         {{"co_tenants_running", ran_on}}});
  }
  if (Control(control, "quit", env) != 0) out_ << "MPS: the check's daemon did not quit\n";
}

}  // namespace tessera::gpucheck::check
