#pragma once
// NVIDIA's Multi-Process Service for the GPUs the config puts in MPS mode (mps.gpus): one control
// daemon per GPU, `nvidia-cuda-mps-control -d` with its own pipe and log folders
// (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY under <state_dir>/mps/gpu<index>/) and only
// its GPU visible (CUDA_VISIBLE_DEVICES), so each GPU has its own server and its own
// one-user-at-a-time rule, as the scheduler places (core::Request::sharing). The daemon is asked
// and stopped through the control program's documented commands on its stdin (get_server_list,
// quit). A job's processes reach their GPU's daemon through its pipe folder (MpsClientEnv).
// A watch thread asks each daemon every interval; one that stops answering is reported down, is
// started again, and reported up once it answers. It also lists each daemon's servers and their
// clients, and counts a server that ended under running clients (a client's fatal fault).

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/core/gpu.h"
#include "tessera/core/mutex.h"
#include "tessera/devices/program.h"

namespace tessera::devices {

struct MpsGpu {
  int index = 0;     // the server's GPU index
  std::string uuid;  // what its daemon is shown (CUDA_VISIBLE_DEVICES)
};

// The GPUs the config's mps.gpus names ("all", indices, UUIDs) on this machine, in index order;
// kInvalidArgument naming one that is not there.
absl::StatusOr<std::vector<MpsGpu>> MpsGpusOf(const std::vector<std::string>& names,
                                              const core::NodeInventory& inventory);

// A daemon's state as the watch last saw it.
struct MpsDaemonState {
  int gpu = 0;
  bool up = false;
  std::string reason;  // why not, when down
  int starts = 0;      // times this server started it (a restart after a death counts)
  int deaths = 0;      // times it was seen gone after it had answered
  // Times one of its MPS servers ended while clients of it still ran: a fatal fault in one client
  // ends its server and every other client of it (the daemon then starts a new server).
  int server_faults = 0;
  int clients = 0;        // the processes its servers had at the last look
  bool reported = false;  // the watch has told its state at least once
};

class MpsDaemons {
 public:
  // `control`: the control program (a path, or a name the PATH finds); `root`: the folder that
  // holds each GPU's pipe and log folders (made 0755: clients of every user connect there).
  MpsDaemons(std::string control, std::string root, std::vector<MpsGpu> gpus);
  ~MpsDaemons();
  MpsDaemons(const MpsDaemons&) = delete;
  MpsDaemons& operator=(const MpsDaemons&) = delete;

  const std::vector<MpsGpu>& gpus() const { return gpus_; }
  bool Has(int gpu) const;
  std::string PipeDir(int gpu) const;
  std::string LogDir(int gpu) const;

  // Whether the daemon of `gpu` answers get_server_list; the error says how it does not.
  absl::Status Check(int gpu) const;
  // Starts the daemon of `gpu` unless one answers, and waits until it does (up to `wait`).
  absl::Status Ensure(int gpu, std::chrono::milliseconds wait = std::chrono::seconds(10));
  // Tells the daemon of `gpu` to quit (its MPS server and clients go with it); OK when none runs.
  absl::Status Stop(int gpu);

  // The watch: Ensure for every GPU now, then a thread that checks each every `interval` and
  // calls `changed(gpu, up, reason)` when one goes down or comes back (a dead one is started
  // again). `changed` is called on the watch's thread, not under its lock.
  using Changed = std::function<void(int gpu, bool up, const std::string& reason)>;
  void Start(std::chrono::milliseconds interval, Changed changed);
  // Stops the watch; with `quit`, the daemons too (the server is stopping for good).
  void StopWatch(bool quit);
  // Tells the daemons this server ran for GPUs that are no longer in MPS mode (a pipe folder under
  // the root for a GPU not in gpus()) to quit; returns their GPUs.
  std::vector<int> QuitLeftBehind();
  std::vector<MpsDaemonState> States() const;

 private:
  // Runs the control program with `command` on its stdin, to `gpu`'s daemon (its folders; any
  // GPU index, in MPS mode or not).
  absl::StatusOr<ProgramOutput> Ask(int gpu, const std::string& command,
                                    std::chrono::milliseconds timeout) const;
  // The control program's environment for `gpu`'s daemon.
  std::map<std::string, std::string> Env(int gpu) const;
  const MpsGpu* Find(int gpu) const;
  // One round of the watch: each daemon checked, a dead one started again, the servers of one
  // that answers looked at (WatchServers).
  void Round();
  // Its daemon's answer to get_server_list (the servers' ids, a line each); kUnavailable saying
  // how it does not answer. Check is this without the list.
  absl::StatusOr<std::string> ServerList(int gpu) const;
  // The MPS servers of `gpu`'s daemon (`server_list`, as ServerList gave it) and their clients'
  // pids now. A server gone since the last look while a client of it still runs (a live process,
  // not a zombie) ended under its clients: counted in server_faults and said. Clients are seen by
  // the pids the daemon gives, so a daemon in another pid namespace than this process's counts
  // nothing.
  void WatchServers(int gpu, const std::string& server_list);

  std::string control_, root_;
  std::vector<MpsGpu> gpus_;
  Changed changed_;
  std::chrono::milliseconds interval_{2000};
  mutable core::Mutex mu_;
  core::CondVar wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int, MpsDaemonState> states_ ABSL_GUARDED_BY(mu_);
  // By GPU: its daemon's servers (ids) and their clients' pids at the last look.
  std::map<int, std::map<long, std::vector<long>>> servers_ ABSL_GUARDED_BY(mu_);
  std::thread watch_;
};

// What a job's process needs to be a client of its GPU's daemon, with its limits: the pipe
// folder, its part of the GPU's SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, from its compute share;
// 100 when it asked none), its pinned memory per CUDA ordinal (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// "0=4096M,1=4096M", from its memory share; none when it asked none) and its priority among the
// server's clients (CUDA_MPS_CLIENT_PRIORITY: 1, below normal, for a job of negative priority;
// else 0; drivers before CUDA 12.2's ignore it).
std::map<std::string, std::string> MpsClientEnv(const std::string& pipe_dir, int share_milli,
                                                int64_t memory_mib, int ordinals, int priority = 0);

}  // namespace tessera::devices
