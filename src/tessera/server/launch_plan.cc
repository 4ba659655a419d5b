#include "tessera/server/launch_plan.h"

#include <pwd.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/net/http.h"
#include "tessera/server/server_util.h"

namespace tessera::server {

using nlohmann::json;

std::string OutputFilePath(const LaunchSetup& setup, int64_t id, int64_t array_id, int array_index,
                           const std::string& owner, const JobSpec& spec, int task, bool err) {
  if (spec.stdout_file.empty() && spec.stderr_file.empty()) return "";
  OutputNames n;
  n.job_id = id;
  n.array_id = array_id;
  n.array_index = array_index;
  n.task = task;
  n.user = owner;
  n.name = !spec.name.empty() ? spec.name
                              : std::filesystem::path(spec.command.at(0)).filename().string();
  n.host = setup.hostname;
  return OutputFileOf(spec, n, err);
}

RunningJob NewRunningJob(const ServerConfig& config, int64_t id, const JobSpec& spec,
                         std::vector<int> gpus, double started) {
  RunningJob run;
  run.id = id;
  run.gpus = std::move(gpus);
  run.started = started;
  run.max_runtime_s = spec.max_runtime_s;
  run.tasks = spec.Tasks();
  // A job's own grace, within the server's maximum (one stored under a larger maximum included).
  run.grace_period_s =
      std::min(spec.grace_period_s >= 0 ? spec.grace_period_s : config.grace_period_s,
               config.max_grace_period_s);
  run.memory_limit_mib = spec.gpu_memory_mib;
  run.gpu_milli = spec.gpu_milli;
  // A share's limits are kept in its region; a trial on whole GPUs gets one too, without limits,
  // for the intercept library to count its kernels (its kernel mix) and what it allocates.
  if ((RequestOf(spec, id, "").fractional() || spec.TrialSeconds() > 0) && !run.gpus.empty())
    run.region = JobFilePath(config.state_dir, "regions", id, ".region");
  run.container = !spec.image.empty();
  run.memory_mib = spec.memory_mib;
  return run;
}

LaunchPlan PlanLaunch(const LaunchSetup& setup, const QueuedJob& q, const sched::Allocation& a,
                      double now) {
  const ServerConfig& config = *setup.config;
  const core::NodeInventory& inventory = *setup.inventory;
  auto job_file = [&](const char* dir, const char* suffix) {
    return JobFilePath(config.state_dir, dir, q.id, suffix);
  };
  auto output_file = [&](int task, bool err) {
    return OutputFilePath(setup, q.id, q.array_id, q.array_index, q.owner, *q.spec, task, err);
  };
  LaunchPlan l;
  json placement;
  placement["gpus"] = json::array();
  std::vector<std::string> uuids;
  for (int g : a.gpus) {
    const core::Gpu& gpu = inventory.gpus[g];
    placement["gpus"].push_back({{"index", g}, {"uuid", gpu.uuid}, {"model", gpu.model}});
    uuids.push_back(gpu.uuid);
  }
  placement["milli_per_gpu"] = a.milli_per_gpu;
  placement["memory_mib_per_gpu"] = a.memory_mib_per_gpu;
  l.placement_json = placement.dump();
  l.where = a.gpus.empty() ? "no GPU" : fmt::format("GPU {}", fmt::join(a.gpus, ","));
  LaunchSpec& ls = l.spec;
  ls.job_id = q.id;
  ls.argv = q.spec->command;
  ls.env = q.spec->env;
  ls.workdir = q.spec->workdir;
  // What a batch script written for Slurm reads, beside Tessera's names: the job's id and name,
  // the folder it was submitted from, its array's. Not SLURM_JOBID, SLURM_NTASKS or
  // SLURM_NODELIST: MPI launchers and PyTorch Lightning take those for a Slurm allocation and
  // would srun (docs/server.md, "Coming from Slurm").
  ls.env["SLURM_JOB_ID"] = std::to_string(q.id);
  if (!q.spec->name.empty()) ls.env["SLURM_JOB_NAME"] = q.spec->name;
  if (!q.spec->workdir.empty()) ls.env["SLURM_SUBMIT_DIR"] = q.spec->workdir;
  if (q.array_id != 0) {
    ls.env["TESSERA_ARRAY_JOB_ID"] = std::to_string(q.array_id);
    ls.env["TESSERA_ARRAY_TASK_ID"] = std::to_string(q.array_index);
    ls.env["SLURM_ARRAY_JOB_ID"] = std::to_string(q.array_id);
    ls.env["SLURM_ARRAY_TASK_ID"] = std::to_string(q.array_index);
  }
  // Resized by signal while it runs: where it reads its new GPUs (RunningJobs::AskResize).
  if (q.spec->Resizable() && q.spec->resize_by == "signal")
    ls.env["TESSERA_RESIZE_FILE"] = ResizeFilePath(config.state_dir, q.id);
  ls.stdout_path = job_file("logs", ".out");
  ls.stderr_path = job_file("logs", ".err");
  ls.user_stdout = output_file(0, false);
  ls.user_stderr = output_file(0, true);
  ls.gpu_uuids = uuids;
  ls.exit_path = job_file("exit", "");
  ls.max_log_bytes = config.max_log_bytes_per_job;
  if (const int n = q.spec->Tasks(); n > 1) {
    // One process per task, with what torchrun, NCCL and MPI programs read; all the job's GPUs
    // visible to each (LOCAL_RANK picks one), TESSERA_TASK_GPU the one a task would take in turn.
    // One free on loopback now; 29500 (torchrun's default) when none can be had.
    const int free_port = net::FreeLoopbackPort();
    const std::string port = std::to_string(free_port > 0 ? free_port : 29500);
    for (int r = 0; r < n; ++r) {
      TaskLaunch t;
      t.env = {{"RANK", std::to_string(r)},
               {"LOCAL_RANK", std::to_string(r)},
               {"WORLD_SIZE", std::to_string(n)},
               {"LOCAL_WORLD_SIZE", std::to_string(n)},
               {"GROUP_RANK", "0"},
               {"NODE_RANK", "0"},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port},
               {"TESSERA_TASK_ID", std::to_string(r)},
               {"TESSERA_NTASKS", std::to_string(n)}};
      if (!a.gpus.empty())
        t.env["TESSERA_TASK_GPU"] = std::to_string(r * static_cast<int>(a.gpus.size()) / n);
      // Task 0 writes the job's own logs; the others theirs (tessera logs --task N).
      t.stdout_path = r == 0 ? ls.stdout_path : TaskLogPath(config.state_dir, q.id, r, ".out");
      t.stderr_path = r == 0 ? ls.stderr_path : TaskLogPath(config.state_dir, q.id, r, ".err");
      t.user_stdout = output_file(r, false);
      t.user_stderr = output_file(r, true);
      ls.tasks.push_back(std::move(t));
    }
    ls.kill_on_task_failure = q.spec->task_failure == "kill";
    ls.task_grace_s = static_cast<int>(std::ceil(
        std::min(q.spec->grace_period_s >= 0 ? q.spec->grace_period_s : config.grace_period_s,
                 config.max_grace_period_s)));
  }
  l.run = NewRunningJob(config, q.id, *q.spec, a.gpus, now);
  l.run.uid = q.uid;
  l.run.array_id = q.array_id;
  l.run.array_index = q.array_index;
  l.run.priority = q.priority;
  l.run.spec = q.spec;
  l.run.owner = q.owner;
  if (!l.run.region.empty()) {
    ShareLimits share;
    share.library = config.intercept_library;
    share.region = l.run.region;
    share.memory_bytes = static_cast<uint64_t>(q.spec->gpu_memory_mib) << 20;
    share.arbiter = setup.arbiter_file;
    share.share_milli = q.spec->gpu_milli;
    share.priority = q.priority;
    share.physical_gpus = a.gpus;
    share.context_overhead_bytes = config.context_overhead_bytes;
    // In a container the library cannot measure the context (its pids are not NVML's): the
    // measured figure for the GPU's model, unless the config names one.
    if (share.context_overhead_bytes == 0 && l.run.container && !a.gpus.empty() &&
        a.gpus[0] < static_cast<int>(setup.node->gpus.size())) {
      share.context_overhead_bytes =
          core::DefaultContextOverhead(setup.node->gpus[a.gpus[0]].model);
    }
    ls.share = share;
  }
  // An MPS job's processes are clients of their GPU's daemon (its pipe folder), with its share as
  // MPS's own limits: its part of the GPU's SMs and its pinned memory. The library's memory
  // accounting stays on (MPS's limit is per process; the job's total holds by the library); its
  // kernels are not paced in time slices (they run beside the other clients').
  std::optional<std::string> not_mps;
  if (q.spec->sharing == "mps" && !a.gpus.empty()) {
    for (int g : a.gpus) {
      if (setup.mps == nullptr || !setup.mps->Has(g)) {
        not_mps = fmt::format("it asked MPS and GPU {} is not in MPS mode (mps.gpus)", g);
      }
    }
    if (!not_mps) {
      // Each client sees its own daemon's one GPU, as CUDA ordinal 0.
      auto client = [&](int g) {
        return devices::MpsClientEnv(
            setup.mps->PipeDir(g), a.request.fractional() ? a.milli_per_gpu : 0,
            a.request.fractional() ? a.memory_mib_per_gpu : 0, 1, q.priority);
      };
      for (const auto& [k, v] : client(a.gpus[0])) ls.env[k] = v;
      // A task of a job on several MPS GPUs is a client of its own GPU's daemon and sees that GPU
      // alone (a client shown a GPU its server does not have fails, as NVIDIA's MPS documentation
      // warns): LOCAL_RANK is no device ordinal then, every task's GPU is ordinal 0.
      for (size_t r = 0; r < ls.tasks.size() && a.gpus.size() > 1; ++r) {
        const int g = a.gpus[r * a.gpus.size() / ls.tasks.size()];
        for (const auto& [k, v] : client(g)) ls.tasks[r].env[k] = v;
        ls.tasks[r].env["CUDA_VISIBLE_DEVICES"] = inventory.gpus[g].uuid;
        ls.tasks[r].env["NVIDIA_VISIBLE_DEVICES"] = inventory.gpus[g].uuid;
        ls.tasks[r].env["TESSERA_TASK_GPU"] = "0";
      }
      if (ls.share) ls.share->arbiter.clear();
      ls.host_shm = true;
    }
  }
  // A user's job runs with that user's own uid, gid and groups, or not at all: an account that
  // cannot be looked up now (no passwd entry, deleted since submitting, an NSS outage) has no
  // group to run in, and the server's would be root's.
  std::optional<std::string> no_account;
  if (geteuid() == 0 && q.uid != 0) {
    ls.uid = q.uid;
    passwd pw;
    passwd* found = nullptr;
    std::vector<char> buf(16384);
    const int e = getpwuid_r(q.uid, &pw, buf.data(), buf.size(), &found);
    if (e == 0 && found) {
      ls.gid = pw.pw_gid;
    } else {
      no_account = fmt::format(
          "the account of uid {} cannot be looked up ({}): a job runs only with its user's own "
          "uid, gid and groups",
          q.uid, e != 0 ? strerror(e) : "no such user");
    }
  }
  if (!l.run.container && setup.confines) {
    // Its cgroup: the nodes every process needs, the driver's control nodes, its own GPUs.
    CgroupLimits limits;
    limits.devices = BaseDeviceRules();
    for (const char* control : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}) {
      if (auto r = RuleFor(config.device_dir + "/" + control)) limits.devices.push_back(*r);
    }
    for (int g : a.gpus) {
      const std::optional<int>& minor = inventory.gpus[g].minor;
      if (!minor) continue;
      if (auto r = RuleFor(fmt::format("{}/nvidia{}", config.device_dir, *minor)))
        limits.devices.push_back(*r);
    }
    limits.memory_bytes = q.spec->memory_mib << 20;
    limits.cpu_milli = q.spec->cpu_milli;
    limits.pids_max = config.pids_max;
    limits.uid = q.uid;
    limits.user_pids_max = UserPidsMax(config.user_pids_max);
    l.limits = std::move(limits);
  }
  if (l.run.container && !setup.containers) {
    // Accepted by a server that had podman (kept across a restart); this one has none.
    l.refused = absl::FailedPreconditionError(
        fmt::format("this server cannot run containers: {}", setup.containers_off));
  } else if (RunsAsRoot(q.uid) && !config.allow_root_jobs) {
    // Accepted under a config that allowed it (kept across a restart); this one does not.
    l.refused = absl::PermissionDeniedError(
        "jobs do not run as root on this server (allow_root_jobs is off)");
  } else if (no_account) {
    l.refused = absl::FailedPreconditionError(*no_account);
  } else if (not_mps) {
    // Placed by an engine that had the GPU in MPS mode (a job recovered across a config change):
    // run outside MPS, it would not be what it asked.
    l.refused = absl::FailedPreconditionError(*not_mps);
  }
  return l;
}

}  // namespace tessera::server
