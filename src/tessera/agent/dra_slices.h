#pragma once
// The DRA driver's ResourceSlices (resource.k8s.io/v1): this node's pool of devices as
// kube-scheduler sees them. One pool named after the node, in slices of at most 128 devices (the
// API's limit; 64 when they consume counters, and the counter sets of partitionable devices in
// slices of their own, 8 sets each), owned by the Node object so that they go with it. Devices of
// an unhealthy GPU are left out. Published at start, again when health changes, again as soon as
// they are deleted or changed by someone else (watched: the kubelet deletes a node's slices when
// it starts) or when the kubelet registers the driver (Poke), and at every resync, with the pool's
// generation bumped on every change. Left in place when the agent stops, as upstream's kubelet
// plugin helper leaves them: the kubelet removes them if the driver does not come back.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "tessera/agent/dra_state.h"
#include "tessera/core/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/informer.h"

namespace tessera::agent {

// The API's limits: devices per slice (64 when they consume counters), counter sets per slice.
inline constexpr int kMaxDevicesPerSlice = 128;
inline constexpr int kMaxDevicesPerSliceWithCounters = 64;
inline constexpr int kMaxCounterSetsPerSlice = 8;
inline constexpr char kResourceSlices[] = "/apis/resource.k8s.io/v1/resourceslices";

struct SliceContext {
  std::string node_uid;  // for the owner reference; empty: none
  int64_t generation = 1;
  // sysfs, for PCIe roots ("/sys"); empty: none published.
  std::string sysfs_root = "/sys";
  // The driver's version now, when it may differ from the inventory's (an upgrade since the
  // start); empty: the inventory's.
  std::string driver_version;
};

// The slices for `state` as they should be now (ordered; names "<node>-<driver>-<i>").
std::vector<nlohmann::json> BuildResourceSlices(const DraState& state, const SliceContext& ctx);

// Whether two slices publish the same devices (names, attributes, capacities by value) in the
// same pool slot: what decides whether the pool changed.
bool SameDevices(const nlohmann::json& a, const nlohmann::json& b);

// "550.54.15" -> "550.54.15", "535.104.05" -> "535.104.5", "12.4" -> "12.4.0": a driver or CUDA
// version as the semantic version DRA's `version` attributes need; "" when it is not one.
std::string SemanticVersion(const std::string& version);

struct SlicePublisherOptions {
  std::string node_name;
  std::chrono::milliseconds resync{60000};
  std::string sysfs_root = "/sys";
  // Asked at every pass: the driver's version now (empty when it cannot tell), so that an upgrade
  // shows in the slices. May be empty.
  std::function<std::string()> driver_version;
};

struct SlicePublisherCounters {
  std::atomic<uint64_t> publishes{0};  // slices created or replaced
  std::atomic<uint64_t> errors{0};
};

class SlicePublisher {
 public:
  SlicePublisher(kube::Client& client, const DraState& state, SlicePublisherOptions options);
  ~SlicePublisher();
  SlicePublisher(const SlicePublisher&) = delete;
  SlicePublisher& operator=(const SlicePublisher&) = delete;

  void Start();
  // Stops; the slices stay.
  void Stop();
  // Makes the thread look now (a health change).
  void Poke();
  // One pass: publishes what differs. OK when the API server has the pool as it should be.
  absl::Status Sync();
  const SlicePublisherCounters& counters() const { return counters_; }

 private:
  kube::Client& client_;
  const DraState& state_;
  SlicePublisherOptions options_;
  SlicePublisherCounters counters_;
  std::string node_uid_;
  std::unique_ptr<kube::Informer> watch_;
  core::Mutex mu_;
  core::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool poked_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::agent
