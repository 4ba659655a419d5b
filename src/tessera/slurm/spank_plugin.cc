// tessera-spank.so: Tessera's GPU sharing in Slurm, as a SPANK plugin that slurmd's step daemons
// (and srun/sbatch, for its options) load through plugstack.conf:
//
//   required /usr/lib/tessera/tessera-spank.so library=/usr/lib/tessera/libtessera-cuda.so
//            shards_per_gpu=8 gpu_memory=80GiB   (one line)
//
// For a step given GPUs or shards, before its tasks start (slurmstepd, as root): the limits its
// shards mean (or its --tessera-share/--tessera-mem options ask), the job's region and the node's
// arbiter set up (step.h), and the tasks' environment: LD_PRELOAD of the library with those
// limits. A step whose limits cannot be set is refused (fail closed) with the reason on the user's
// stderr. At the job's end on the node (its epilog): its accounting written, its files removed.
// Slurm's own device confinement (ConstrainDevices) stays Slurm's. docs/slurm.md.
// spank.h declares the plugin's callbacks outside its own extern "C" block.
extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/slurmdb.h>
#include <slurm/spank.h>
}

#include <dlfcn.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "nlohmann/json.hpp"
#include "tessera/devices/program.h"
#include "tessera/slurm/step.h"

// SPANK_PLUGIN(tessera, 1), with the external linkage that a const at namespace scope lacks in C++.
extern "C" {
extern const char plugin_name[] = "tessera";
extern const char plugin_type[] = "spank";
extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
extern const unsigned int spank_plugin_version = 1;
}

namespace {

constexpr uint32_t kExternStep = 0xfffffffc;  // slurm.h's SLURM_EXTERN_CONT
constexpr uint32_t kBatchStep = 0xfffffffb;   // slurm.h's SLURM_BATCH_SCRIPT
constexpr uint32_t kJobRunning = 1;           // slurm.h's JOB_RUNNING: requeue only if running
// The most the epilog waits for a part's write into an ended job's accounting record (slurmdbd).
constexpr std::chrono::seconds kDatabaseWrite{10};

// The error of the last Slurm call, as slurm_get_errno of the slurmstepd this runs in says it
// (errno where it has none).
int SlurmErrno() {
  const auto get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "slurm_get_errno"));
  return get ? get() : errno;
}

// `e` in Slurm's words (slurm_strerror knows its own codes too), else strerror's.
std::string SlurmError(int e) {
  const auto text = reinterpret_cast<char* (*)(int)>(dlsym(RTLD_DEFAULT, "slurm_strerror"));
  return text ? std::string(text(e)) : std::string(strerror(e));
}
std::string SlurmError() { return SlurmError(SlurmErrno()); }

// The job as slurmctld has it (slurm_load_job, looked up as Requeue's is): for an "auto" job's
// trial, how often it was requeued, whether Slurm would requeue it, and a batch job's batch node.
void AskSlurmctld(uint32_t job, tessera::slurm::StepRequest& request) {
  const auto load =
      reinterpret_cast<decltype(&slurm_load_job)>(dlsym(RTLD_DEFAULT, "slurm_load_job"));
  const auto free_msg = reinterpret_cast<decltype(&slurm_free_job_info_msg)>(
      dlsym(RTLD_DEFAULT, "slurm_free_job_info_msg"));
  if (!load || !free_msg) {
    request.not_requeueable = "slurmstepd has no slurm_load_job";
    return;
  }
  job_info_msg_t* info = nullptr;
  if (load(&info, job, SHOW_ALL) != 0 || info == nullptr || info->record_count < 1) {
    request.not_requeueable = "slurmctld did not say whether it may requeue it: " + SlurmError();
    if (info) free_msg(info);
    return;
  }
  const slurm_job_info_t& j = info->job_array[0];
  request.restarts = j.restart_cnt;
  request.not_requeueable = j.requeue == 0 ? "--no-requeue (or JobRequeue=0)" : "";
  if (j.batch_flag != 0 && j.batch_host != nullptr) request.batch_host = j.batch_host;
  free_msg(info);
}

// Requeues the job (slurmctld then stops its steps everywhere and queues it again) with
// slurm_requeue of the slurmstepd this runs in: the plugin links nothing of libslurm, so it calls
// the one the daemon already loaded (libslurmfull). Empty when done, else why not.
std::string Requeue(uint32_t job) {
  using RequeueFn = int (*)(uint32_t, uint32_t);
  const auto requeue = reinterpret_cast<RequeueFn>(dlsym(RTLD_DEFAULT, "slurm_requeue"));
  if (!requeue) return "slurmstepd has no slurm_requeue";
  // JOB_RUNNING: a job already requeued (by another of its steps' trial end) is left as it is.
  if (requeue(job, kJobRunning) == 0) return "";
  return SlurmError();
}

// `part` in an ended job's AdminComment in its accounting record, through the slurmdbd API of the
// slurmstepd this epilog runs in (libslurmfull's slurmdb_*: the query and the update sacct and
// sacctmgr would make, on one connection, without starting them; a job of one node, `alone`, is
// not read before or after). Empty when written, else why not.
std::string CommentInDatabase(uint32_t job, const std::string& node, const std::string& part,
                              const std::optional<std::string>& alone) {
  auto find = [](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(RTLD_DEFAULT, name));
    return fn != nullptr;
  };
  decltype(&slurmdb_connection_get) connect;
  decltype(&slurmdb_connection_close) close;
  decltype(&slurmdb_connection_commit) commit;
  decltype(&slurmdb_jobs_get) jobs_get;
  decltype(&slurmdb_job_modify) job_modify;
  decltype(&slurm_list_create) list_create;
  decltype(&slurm_list_destroy) list_destroy;
  decltype(&slurm_list_append) list_append;
  decltype(&slurm_list_iterator_create) iterate;
  decltype(&slurm_list_next) next;
  decltype(&slurm_list_iterator_destroy) iterated;
  decltype(&slurm_list_count) list_count;
  slurm_conf_t* conf = nullptr;
  if (!find(connect, "slurmdb_connection_get") || !find(close, "slurmdb_connection_close") ||
      !find(commit, "slurmdb_connection_commit") || !find(jobs_get, "slurmdb_jobs_get") ||
      !find(job_modify, "slurmdb_job_modify") || !find(list_create, "slurm_list_create") ||
      !find(list_destroy, "slurm_list_destroy") || !find(list_append, "slurm_list_append") ||
      !find(iterate, "slurm_list_iterator_create") || !find(next, "slurm_list_next") ||
      !find(iterated, "slurm_list_iterator_destroy") || !find(list_count, "slurm_list_count") ||
      !find(conf, "slurm_conf") || conf->cluster_name == nullptr)
    return "slurmstepd has no slurmdbd API (slurmdb_job_modify)";
  uint16_t flags = 0;
  void* db = connect(&flags);
  if (db == nullptr) return "slurmdbd: no connection: " + SlurmError();
  // This job (its latest run, as sacct -X shows it) on this cluster: a job of the same id on
  // another cluster of the same database is not this one.
  slurm_selected_step_t step{};
  step.array_task_id = NO_VAL;
  step.het_job_offset = NO_VAL;
  step.step_id = {job, NO_VAL, NO_VAL};
  slurmdb_job_cond_t cond{};
  cond.db_flags = SLURMDB_JOB_FLAG_NOTSET;
  cond.flags = JOBCOND_FLAG_NO_STEP | JOBCOND_FLAG_NO_DEFAULT_USAGE;
  cond.cluster_list = list_create(nullptr);  // (items not ours to free)
  list_append(cond.cluster_list, conf->cluster_name);
  cond.step_list = list_create(nullptr);
  list_append(cond.step_list, &step);
  const std::string err = tessera::slurm::WriteAdminComment(
      node, part,
      [&](std::string& e) -> std::optional<std::string> {
        List jobs = jobs_get(db, &cond);
        if (jobs == nullptr) {
          e = "slurmdbd did not list the job: " + SlurmError();
          return std::nullopt;
        }
        std::string comment;
        ListIterator it = iterate(jobs);
        if (const auto* rec = static_cast<slurmdb_job_rec_t*>(next(it)); rec && rec->admin_comment)
          comment = rec->admin_comment;
        iterated(it);
        list_destroy(jobs);
        return comment;
      },
      [&](const std::string& merged, std::string& e) {
        // As slurmdb_create_job_rec makes one: no field but the AdminComment changed.
        slurmdb_job_rec_t rec{};
        rec.array_task_id = NO_VAL;
        rec.derived_ec = NO_VAL;
        rec.state = JOB_PENDING;
        rec.requid = -1;
        rec.lft = NO_VAL;
        rec.resvid = NO_VAL;
        std::string copy = merged;
        rec.admin_comment = copy.data();
        List changed = job_modify(db, &cond, &rec);
        const bool ok = changed != nullptr && list_count(changed) > 0;
        if (!ok) e = "slurmdbd did not change it: " + SlurmError();
        if (changed) list_destroy(changed);
        if (ok && commit(db, true) != SLURM_SUCCESS) {
          e = "slurmdbd did not commit it: " + SlurmError();
          return false;
        }
        return ok;
      },
      alone);
  list_destroy(cond.cluster_list);
  list_destroy(cond.step_list);
  close(&db);
  return err;
}

// Writes the job's use on this node into its AdminComment, where sacct shows it after the job.
// While slurmctld still has the job unfinished (a requeued run), with slurm_update_job of the
// slurmstepd this epilog runs in (as root, an administrator); an ended job's (slurmctld refuses
// to change it) in its accounting record, through slurmdbd - which a cluster needs for it. Empty
// when written (`where` says where), else why not.
std::string CommentOnJob(uint32_t job, const std::string& node, const std::string& part,
                         std::string& where) {
  const auto load =
      reinterpret_cast<decltype(&slurm_load_job)>(dlsym(RTLD_DEFAULT, "slurm_load_job"));
  const auto free_msg = reinterpret_cast<decltype(&slurm_free_job_info_msg)>(
      dlsym(RTLD_DEFAULT, "slurm_free_job_info_msg"));
  const auto init = reinterpret_cast<decltype(&slurm_init_job_desc_msg)>(
      dlsym(RTLD_DEFAULT, "slurm_init_job_desc_msg"));
  const auto update =
      reinterpret_cast<decltype(&slurm_update_job)>(dlsym(RTLD_DEFAULT, "slurm_update_job"));
  bool finished = false;
  std::string api = "slurmstepd has no slurm_update_job";
  // A job of this one node: its comment as slurmctld has it (see WriteAdminComment).
  std::optional<std::string> alone;
  // slurmctld did not give the job (not there, or did not answer).
  bool unknown = !(load && free_msg && init && update);
  if (!unknown) {
    auto why = [&] {
      const int e = SlurmErrno();
      // Finished, or already gone from slurmctld's memory (MinJobAge): its accounting record.
      finished = finished || e == ESLURM_JOB_FINISHED || e == ESLURM_INVALID_JOB_ID;
      return SlurmError(e);
    };
    api = tessera::slurm::WriteAdminComment(
        node, part,
        [&](std::string& err) -> std::optional<std::string> {
          job_info_msg_t* info = nullptr;
          if (load(&info, job, SHOW_ALL) != 0 || info == nullptr || info->record_count < 1) {
            err = "slurmctld did not give the job: " + why();
            unknown = true;
            if (info) free_msg(info);
            return std::nullopt;
          }
          const char* c = info->job_array[0].admin_comment;
          std::string comment = c ? c : "";
          alone.reset();
          if (info->job_array[0].num_nodes == 1) alone = comment;
          // (Ended, as at an epilog but a requeued run's: slurmctld refuses to change it.)
          finished = (info->job_array[0].job_state & JOB_STATE_BASE) > JOB_SUSPENDED;
          free_msg(info);
          return comment;
        },
        [&](const std::string& merged, std::string& err) {
          if (finished) {
            err = "the job has ended";
            return false;
          }
          job_desc_msg_t desc;
          init(&desc);
          desc.job_id = job;
          std::string copy = merged;
          desc.admin_comment = copy.data();
          if (update(&desc) == 0) return true;
          err = "slurmctld refused it: " + why();
          return false;
        });
    if (api.empty()) {
      where = "slurmctld";
      return "";
    }
  }
  if (!finished && !unknown) return api;
  // Ended (or slurmctld would not say): its accounting record - from a child process, which is
  // given kDatabaseWrite: Slurm waits MessageTimeout + 35 s for each answer of slurmdbd, and the
  // job's resources wait for its epilog; nor can a crash in those calls take the epilog with it.
  const absl::StatusOr<std::string> db = tessera::devices::RunInChild(
      [&] { return CommentInDatabase(job, node, part, alone); }, kDatabaseWrite);
  if (!db.ok())
    return api + "; in its accounting record: slurmdbd: " + std::string(db.status().message());
  if (!db->empty()) return api + "; in its accounting record: " + *db;
  where = "slurmdbd";
  return "";
}

std::string share_option, mem_option, trial_option;
// Said on the step's first task's stderr (how "auto" sized the job, its trial).
std::string say;
// Why the step's limits could not be set (slurmstepd): said on each task's stderr, where the user
// looks (in init_post_opt the step's output is not connected yet), and the task not run.
std::string refusal;

// Refuses the step: said in slurmd's log now and on its tasks' stderr when they start.
int Refuse(const std::string& why) {
  refusal = "tessera: " + why;
  slurm_error("%s", refusal.c_str());
  return ESPANK_SUCCESS;
}

// Each option checked as it is read - by srun, sbatch and salloc too, before anything is
// allocated: a callback that fails makes them stop (sbatch goes on past a failed init_post_opt),
// so a mistyped option is refused at submission, not billed and failed at its step's launch. What
// the step's shards allow is checked at the step.
int Checked(const std::string& share, const std::string& mem, const std::string& trial = "") {
  if (absl::Status st = tessera::slurm::CheckStepOptions(share, mem, trial); !st.ok()) {
    slurm_error("tessera: %s", std::string(st.message()).c_str());
    return -1;
  }
  return 0;
}
int OnShare(int, const char* arg, int) {
  share_option = arg ? arg : "";
  return Checked(share_option, "");
}
int OnMem(int, const char* arg, int) {
  mem_option = arg ? arg : "";
  return Checked("", mem_option);
}
int OnTrial(int, const char* arg, int) {
  trial_option = arg ? arg : "";
  return Checked("", "", trial_option);
}

// A trial's end (slurmstepd, a thread of its own): at the deadline its tasks - each a pidfd, so
// that a pid reused after the task was reaped is never signalled - and their process groups get
// SIGTERM, and SIGKILL 10 s later if they are still there (Slurm's own KillWait default). The
// step's end (slurm_spank_exit) stops the watch.
// An auto_trial= run's end requeues the job instead (Requeue); where Slurm refuses (a job not
// requeueable: --no-requeue, JobRequeue=0, an array task being ended) it runs on, measured, and
// its accounting says why.
class TrialWatch {
 public:
  void Arm(int64_t deadline, bool requeue, tessera::slurm::PluginConfig config) {
    deadline_ = deadline;
    requeue_ = requeue;
    config_ = std::move(config);
  }
  bool armed() const { return deadline_ > 0; }
  void Add(pid_t pid, uint32_t job) {
    std::lock_guard<std::mutex> l(mu_);
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    // Without a pidfd (a kernel before 5.3) the task is not stopped at the trial's end: said.
    if (fd < 0)
      slurm_error("tessera: job %u: task %d cannot be watched for its trial: %m", job, pid);
    tasks_.push_back({pid, fd});
    if (!thread_.joinable()) thread_ = std::thread([this, job] { Watch(job); });
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (const Task& t : tasks_)
      if (t.fd >= 0) close(t.fd);
    tasks_.clear();
  }

 private:
  struct Task {
    pid_t pid;
    int fd;
  };
  void Signal(int sig) {
    for (const Task& t : tasks_) {
      if (t.fd < 0 || syscall(SYS_pidfd_send_signal, t.fd, sig, nullptr, 0) != 0) continue;
      // Its process group too (a batch script's children), never slurmstepd's own.
      if (const pid_t g = getpgid(t.pid); g > 1 && g != getpgrp()) kill(-g, sig);
    }
  }
  void Watch(uint32_t job) {
    std::unique_lock<std::mutex> l(mu_);
    const auto at = std::chrono::system_clock::from_time_t(static_cast<time_t>(deadline_));
    if (cv_.wait_until(l, at, [this] { return stop_; })) return;
    if (requeue_) {
      l.unlock();  // its tasks' start (Add) is not held up by the RPC
      const std::string why = Requeue(job);
      const std::string said = why.empty() ? "then requeued: its next run is sized from it"
                                           : "Slurm did not requeue it (" + why +
                                                 "): it ran on, on what its shards mean";
      slurm_info("tessera: job %u: its automatic trial is over: %s", job, said.c_str());
      if (absl::Status st = tessera::slurm::NoteTrialEnd(config_, job, said); !st.ok())
        slurm_error("tessera: job %u: %s", job, std::string(st.message()).c_str());
      return;  // Slurm stops its steps (requeued), or they run on
    }
    slurm_info("tessera: job %u: its trial is over: its step is stopped (SIGTERM)", job);
    Signal(SIGTERM);
    if (cv_.wait_for(l, std::chrono::seconds(10), [this] { return stop_; })) return;
    Signal(SIGKILL);
  }
  int64_t deadline_ = 0;
  bool requeue_ = false;
  tessera::slurm::PluginConfig config_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Task> tasks_;
  std::thread thread_;
};
TrialWatch trial;
uint32_t step_job = 0;

std::string Env(spank_t sp, const char* name) {
  char buf[4096] = {};
  return spank_getenv(sp, name, buf, sizeof buf) == ESPANK_SUCCESS ? std::string(buf) : "";
}

// `node`: the Slurm node's name (SLURMD_NODENAME), for %n and the history's file names.
absl::StatusOr<tessera::slurm::PluginConfig> Config(int ac, char** av, const std::string& node) {
  return tessera::slurm::ParsePluginArgs(std::vector<std::string>(av, av + ac), node);
}

}  // namespace

extern "C" {

// Registered in every context (not the spank_options table, which sbatch and salloc ignore), so
// that they work on srun's and sbatch's command lines and as #SBATCH lines.
int slurm_spank_init(spank_t sp, int, char**) {
  static struct spank_option options[] = {
      {const_cast<char*>("tessera-share"), const_cast<char*>("SHARE"),
       const_cast<char*>("[Tessera] GPU time share of each GPU, at most what the step's shards "
                         "mean (30% or 0.3), or auto: sized from your jobs of this name"),
       1, 0, OnShare},
      {const_cast<char*>("tessera-mem"), const_cast<char*>("SIZE"),
       const_cast<char*>("[Tessera] GPU memory limit on each GPU, at most what the step's "
                         "shards mean (10G, 512MiB), or auto: sized from your jobs of this name"),
       1, 0, OnMem},
      {const_cast<char*>("tessera-trial"), const_cast<char*>("LENGTH"),
       const_cast<char*>("[Tessera] a trial run: stopped after LENGTH (2m, 90s), its GPU use "
                         "measured and a size recommended (tessera slurm acct JOB)"),
       1, 0, OnTrial}};
  for (auto& o : options) {
    if (spank_option_register(sp, &o) != ESPANK_SUCCESS) {
      slurm_error("tessera: cannot register --%s", o.name);
      return ESPANK_ERROR;
    }
  }
  return ESPANK_SUCCESS;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char** av) {
  if (spank_remote(sp) != 1) return ESPANK_SUCCESS;  // srun/sbatch: only the options (checked)
  uint32_t job = 0, step = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
    return Refuse("cannot tell the step's job, user or group");
  }
  if (step == kExternStep) return ESPANK_SUCCESS;  // the job's extern step runs nothing
  tessera::slurm::StepRequest request;
  request.gpus = Env(sp, "SLURM_STEP_GPUS");
  if (request.gpus.empty()) request.gpus = Env(sp, "SLURM_JOB_GPUS");
  request.shards = Env(sp, "SLURM_SHARDS_ON_NODE");
  // (slurmstepd sets SLURMD_NODENAME in its own environment at its start; the tasks' is set later.)
  const char* node = getenv("SLURMD_NODENAME");
  auto config = Config(ac, av, node ? node : Env(sp, "SLURMD_NODENAME"));
  if (!config.ok()) {
    // A wrong plugstack.conf line refuses the steps it would limit - those with GPUs - not every
    // step on the node.
    if (request.gpus.empty() && request.shards.empty()) {
      slurm_info("tessera: job %u step %u has no GPU; %s", job, step,
                 std::string(config.status().message()).c_str());
      return ESPANK_SUCCESS;
    }
    return Refuse("job " + std::to_string(job) + ": " +
                  std::string(config.status().message()));  // "plugstack.conf: 'word': why"
  }
  request.share_option = share_option;
  request.mem_option = mem_option;
  request.trial_option = trial_option;
  request.job_name = Env(sp, "SLURM_JOB_NAME");
  request.batch_step = step == kBatchStep;
  if (uint32_t nodes = 0; spank_get_item(sp, S_JOB_NNODES, &nodes) == ESPANK_SUCCESS && nodes > 0)
    request.nodes = nodes;
  // (S_SLURM_RESTART_COUNT is 0 in a batch step of Slurm 22.05: slurmctld is asked. Also of
  // another step: on a node of a batch job other than its batch node, it says so.)
  if (config.ok() && config->auto_trial_s > 0 && request.trial_option.empty() &&
      (share_option == "auto" || mem_option == "auto"))
    AskSlurmctld(job, request);
  auto limits = tessera::slurm::DecideLimits(*config, request);
  if (!limits.ok())
    return Refuse("job " + std::to_string(job) + ": " + std::string(limits.status().message()));
  if (limits->gpus.empty()) return ESPANK_SUCCESS;  // no GPU: left alone
  auto env = tessera::slurm::SetUpStep(*config, job, uid, gid, *limits, Env(sp, "LD_PRELOAD"),
                                       time(nullptr), tessera::slurm::BootTime());
  if (!env.ok())
    return Refuse("job " + std::to_string(job) +
                  ": its GPU limits cannot be set up: " + std::string(env.status().message()));
  for (const std::string& note : env->notes) slurm_info("tessera: %s", note.c_str());
  say = env->say;
  if (!say.empty()) slurm_info("%s", say.c_str());
  step_job = job;
  if (env->trial_deadline > 0) trial.Arm(env->trial_deadline, env->requeue_at_trial_end, *config);
  for (const std::string& name : env->unset) spank_unsetenv(sp, name.c_str());
  for (const auto& [name, value] : env->set) {
    if (spank_setenv(sp, name.c_str(), value.c_str(), 1) != ESPANK_SUCCESS)
      return Refuse("job " + std::to_string(job) + ": cannot set " + name +
                    " in the step's environment");
  }
  slurm_verbose("tessera: job %u step %u: GPUs %s, share %u permille, memory %llu bytes each", job,
                step, request.gpus.c_str(), limits->share_permille,
                static_cast<unsigned long long>(limits->memory_bytes));
  return ESPANK_SUCCESS;
}

// Each task, in its own process before it runs the user's program: a refused step runs nothing.
// (slurmstepd only logs a failed callback and runs the task anyway: the task ends here, exit code
// 1, the reason on its stderr.)
int slurm_spank_task_init_privileged(spank_t sp, int, char**) {
  if (refusal.empty()) {
    // How it was sized, or its trial: once per step and node (each sizes its part), on its first
    // task there's stderr.
    if (int task = 1;
        !say.empty() && spank_get_item(sp, S_TASK_ID, &task) == ESPANK_SUCCESS && task == 0) {
      fprintf(stderr, "%s\n", say.c_str());
      fflush(stderr);
    }
    return ESPANK_SUCCESS;
  }
  slurm_error("%s", refusal.c_str());
  fflush(stderr);
  _exit(1);
}

// slurmstepd, each task just started: a trial's tasks are watched until its end.
int slurm_spank_task_post_fork(spank_t sp, int, char**) {
  if (spank_remote(sp) != 1 || !trial.armed()) return ESPANK_SUCCESS;
  pid_t pid = 0;
  if (spank_get_item(sp, S_TASK_PID, &pid) == ESPANK_SUCCESS && pid > 0) trial.Add(pid, step_job);
  return ESPANK_SUCCESS;
}

int slurm_spank_exit(spank_t sp, int, char**) {
  if (spank_remote(sp) == 1) trial.Stop();
  return ESPANK_SUCCESS;
}

int slurm_spank_job_epilog(spank_t sp, int ac, char** av) {
  uint32_t job = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) {
    const char* id = getenv("SLURM_JOB_ID");
    job = id ? static_cast<uint32_t>(strtoul(id, nullptr, 10)) : 0;
  }
  const char* node = getenv("SLURMD_NODENAME");
  auto config = Config(ac, av, node ? node : "");
  if (!config.ok() || job == 0) return ESPANK_SUCCESS;  // said at the step's start
  // The ending job's user, so that an earlier job's record under a reused id is not taken for it.
  std::optional<uid_t> uid;
  if (uid_t u = 0; spank_get_item(sp, S_JOB_UID, &u) == ESPANK_SUCCESS) {
    uid = u;
  } else if (const char* e = getenv("SLURM_JOB_UID"); e && *e) {
    uid = static_cast<uid_t>(strtoul(e, nullptr, 10));
  }
  nlohmann::json record;
  auto acct = tessera::slurm::EndJob(*config, job, time(nullptr), uid, &record);
  // An epilog that fails drains the node: the job's end is logged, never refused.
  if (!acct.ok())
    slurm_error("tessera: job %u: %s", job, std::string(acct.status().message()).c_str());
  else if (!acct->empty())
    slurm_info("tessera: job %u: accounting in %s", job, acct->c_str());
  if (record.is_object() && config->admin_comment) {
    // Its use here in the job's AdminComment: sacct shows every node's, after the job too - and
    // where its file, history or totals could not be written (a full disk), the one place left.
    std::string name = config->node;
    if (name.empty()) {
      char host[256] = {};
      gethostname(host, sizeof host - 1);
      name = host;
    }
    const std::string part = tessera::slurm::AdminCommentPart(record, name);
    // (How long it took: the node's epilog, which holds the job's resources until it ends.)
    const auto t0 = std::chrono::steady_clock::now();
    std::string where;
    const std::string why = CommentOnJob(job, name, part, where);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (why.empty())
      slurm_info("tessera: job %u: AdminComment (%s, written in %.0f ms): %s", job, where.c_str(),
                 ms, part.c_str());
    else
      slurm_error(
          "tessera: job %u: its AdminComment was not written in %.0f ms (%s; a cluster without "
          "slurmdbd: admin_comment=no in plugstack.conf): %s",
          job, ms, why.c_str(), part.c_str());
  }
  return ESPANK_SUCCESS;
}

}  // extern "C"
