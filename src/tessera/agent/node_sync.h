#pragma once
// The agent's side of the API server: keeps its Node's labels and `tessera.io/gpus` annotation
// current (node_labels.h), and finds, for the kubelet's Allocate, the pending pod on this node
// that the extender chose GPUs for (`tessera.io/assignment`), marking each container it allocated
// (`tessera.io/allocated`). Watches the Node and the node's Pods through informers; writes go
// through one thread with backoff, so the kubelet's calls never wait on a slow API server except
// for one bounded fresh list when the watch has not shown a pending pod yet. Thread-safe.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "nlohmann/json.hpp"
#include "tessera/agent/device_state.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"

namespace tessera::agent {

struct NodeSyncOptions {
  std::string node_name;
  // Labels are checked this often even without a change (someone may have edited them).
  std::chrono::milliseconds resync{60000};
  std::chrono::milliseconds max_backoff{30000};
  // The bound on the fresh pod list an Allocate may wait for.
  std::chrono::milliseconds hint_list_timeout{2000};
};

struct NodeSyncCounters {
  std::atomic<uint64_t> label_updates{0};
  std::atomic<uint64_t> label_errors{0};
  std::atomic<uint64_t> hints_found{0};
  std::atomic<uint64_t> hints_none{0};
  std::atomic<uint64_t> hint_errors{0};  // bad annotations, failed lists
  std::atomic<uint64_t> allocated_marks{0};
  std::atomic<uint64_t> mark_errors{0};
  // Ended pods told what they used (tessera.io/gpu-use), and writes that failed (retried).
  std::atomic<uint64_t> use_marks{0};
  std::atomic<uint64_t> use_errors{0};
};

// The pending pod whose next unallocated container needs `count` devices of `r`, oldest
// assignment first. `pods` are the node's pods as the API server has them; `done` the container
// indices already allocated per pod UID that the API server may not show yet. Pods with a bad
// annotation are skipped and described in `problems` (one line each).
std::optional<PodHint> ChooseHint(const std::vector<nlohmann::json>& pods,
                                  const std::string& node_name, Resource r, int count,
                                  const std::map<std::string, std::set<int>>& done,
                                  std::vector<std::string>* problems);

// Whether a pending pod on this node that the extender did not place asks for `count` devices of
// `r` in one container: the kubelet is most likely admitting that one, so no hint is due.
bool UnplacedCandidate(const std::vector<nlohmann::json>& pods, const std::string& node_name,
                       Resource r, int count);

class NodeSync {
 public:
  // Starts the informers and the writer thread. `client` and `state` must outlive it.
  NodeSync(kube::Client& client, DeviceState& state, NodeSyncOptions options);
  ~NodeSync();
  NodeSync(const NodeSync&) = delete;
  NodeSync& operator=(const NodeSync&) = delete;
  void Stop();

  // Health or inventory changed: bring the labels up to date soon.
  void Poke();
  // For GetPreferredAllocation and Allocate.
  std::optional<PodHint> Hint(Resource r, int count);
  // Allocate succeeded for `hint`'s container: remember it now, write it to the pod soon.
  void Allocated(const PodHint& hint);
  // A pod's GPUs were released: write what it used (`tessera.io/gpu-use`, FormatGpuUse) on it soon
  // - only while the pod of that name has ended (a newer pod of the same name is not it).
  void Used(const std::string& pod_namespace, const std::string& pod_name, std::string use);

  const NodeSyncCounters& counters() const { return counters_; }
  // Whether the last label write (or check) succeeded.
  bool labels_current() const { return labels_current_.load(); }
  // Whether its watches of the API server (the node, the node's pods) are synced and their last
  // list or watch went well: what it knows of the cluster is current.
  bool api_server_up() const;

 private:
  void Run();
  bool SyncLabels();  // false on an error worth a backoff
  bool FlushMarks();

  kube::Client& client_;
  DeviceState& state_;
  const NodeSyncOptions options_;
  NodeSyncCounters counters_;
  std::atomic<bool> labels_current_{false};
  std::unique_ptr<kube::Informer> node_informer_;
  std::unique_ptr<kube::Informer> pod_informer_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool dirty_ = true;
  std::map<std::string, std::set<int>> done_;  // pod UID -> container indices allocated
  struct Mark {
    std::string pod_namespace, pod_name, uid;
    std::string use;  // not empty: this is its tessera.io/gpu-use to write instead
  };
  bool WriteUse(const Mark& m);
  std::deque<Mark> marks_;          // pods whose tessera.io/allocated or gpu-use must be written
  std::set<std::string> reported_;  // problems already logged
  std::string last_label_error_;
  nlohmann::json last_written_;  // the node as our last patch left it (the watch may lag)
  std::thread thread_;
};

}  // namespace tessera::agent
