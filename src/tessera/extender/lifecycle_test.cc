// The extender restarted at random points of a long run (issue 49): each new extender is fed the
// API server's objects as one list in a random order (pods before their nodes and PodGroups, share
// pods before any node), and after every event its model must be what the API server says.
//
// Invariants, checked after each event of a relist and after each bind of the run:
// - the GPU compute allocated is the sum over the bound pods whose node it has seen;
// - every such pod holds exactly the GPUs its assignment names (by UUID), so no GPU is held by two
//   pods and a restart moves nobody;
// - once everything is listed, no bound pod is left unaccounted.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/extender/extender.h"
#include "tessera/extender/test_objects.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/object.h"

namespace tessera::extender {
namespace {

using nlohmann::json;
using testing::GpuNode;
using testing::GpuPod;
using testing::PodGroup;
using testing::PodOptions;
using Ev = kube::EventType;

constexpr int kNodes = 24;
constexpr int kSharesPerGpu = 4;

// What the API server holds, and how to check an extender against it.
class Cluster {
 public:
  Cluster() {
    for (int n = 0; n < kNodes; ++n) {
      std::string name = "node-" + std::to_string(n);
      nodes_[name] = GpuNode(name, n % 3 == 0 ? "t4x2" : "dgx-h100", {}, kSharesPerGpu);
      auto parsed = NodeOf(nodes_[name]);
      for (size_t g = 0; g < parsed->spec.gpus.size(); ++g)
        uuids_[name][parsed->spec.gpus[g].uuid] = static_cast<int>(g);
    }
  }

  std::vector<std::string> node_names() const {
    std::vector<std::string> out;
    for (const auto& [name, n] : nodes_) out.push_back(name);
    return out;
  }

  // The extender's view equals the API server's for the pods it was given (`listed`; null: all)
  // on the nodes it was given (`seen`).
  void Check(const Extender& ex, const std::set<std::string>& seen, const std::string& when,
             const std::set<std::string>* listed = nullptr) {
    int64_t want_milli = 0;
    for (const auto& [id, pod] : pods_) {
      std::string node = kube::StringAt(pod, {"spec", "nodeName"});
      if (node.empty() || !seen.contains(node) || (listed && !listed->contains(id))) continue;
      auto as = kube::ParseAssignment(
          kube::StringAt(pod, {"metadata", "annotations", kube::kAssignmentAnnotation}));
      ASSERT_TRUE(as.ok()) << id;
      std::set<int> named;
      int64_t milli = 0;
      for (const auto& c : as->containers) {
        for (const std::string& u : c.gpus) named.insert(uuids_.at(node).at(u));
        milli += c.resource == "tessera.io/gpu" ? c.count * int64_t{1000}
                                                : int64_t{1000} * c.count / kSharesPerGpu;
      }
      want_milli += milli;
      auto a = ex.AllocationOf(id);
      ASSERT_TRUE(a.has_value()) << when << ": bound pod " << id << " on " << node
                                 << " holds nothing";
      EXPECT_EQ(std::set<int>(a->gpus.begin(), a->gpus.end()), named)
          << when << ": pod " << id << " holds other GPUs than its assignment names";
    }
    EXPECT_EQ(ex.stats().gpu_milli_allocated, want_milli) << when;
  }

  std::map<std::string, json> nodes_;
  std::map<std::string, json> pods_;    // "ns/name"
  std::map<std::string, json> groups_;  // "ns/name"
  std::map<std::string, std::map<std::string, int>> uuids_;
};

class LifeRun {
 public:
  explicit LifeRun(uint32_t seed) : rng_(seed) { Restart(false); }

  // A new extender fed every object in a random order; checked after each event.
  void Restart(bool check) {
    ex_ = std::make_unique<Extender>(Options(), clock_);
    std::vector<std::pair<int, json>> events;  // 0 node, 1 pod, 2 group
    for (const auto& [n, o] : c_.nodes_) events.emplace_back(0, o);
    for (const auto& [id, o] : c_.pods_) events.emplace_back(1, o);
    for (const auto& [id, o] : c_.groups_) events.emplace_back(2, o);
    std::shuffle(events.begin(), events.end(), rng_);
    std::set<std::string> seen, listed;
    for (auto& [kind, o] : events) {
      if (kind == 0) {
        ex_->OnNode(Ev::kAdded, o);
        seen.insert(kube::StringAt(o, {"metadata", "name"}));
      } else if (kind == 1) {
        ex_->OnPod(Ev::kAdded, o);
        listed.insert(kube::ObjectKey(o));
      } else {
        ex_->OnPodGroup(Ev::kAdded, o);
      }
      if (check) {
        c_.Check(*ex_, seen,
                 "restart " + std::to_string(restarts_) + " after " + std::to_string(seen.size()) +
                     " nodes and " + std::to_string(listed.size()) + " pods",
                 &listed);
        if (::testing::Test::HasFailure()) return;
      }
    }
    if (check) {
      EXPECT_EQ(ex_->stats().unaccounted, 0);
      ++restarts_;
    }
  }

  // A pod (or a gang of them) asks, is filtered and bound as kube-scheduler would.
  void Arrive(int i) {
    std::uniform_int_distribution<int> kind(0, 9);
    int k = kind(rng_);
    const std::string ns = "team-" + std::to_string(i % 5);
    std::vector<json> pods;
    if (k <= 1) {
      std::string group = "gang-" + std::to_string(i);
      int members = 2 + static_cast<int>(rng_() % 3);
      json g = PodGroup(ns, group, members);
      c_.groups_[ns + "/" + group] = g;
      ex_->OnPodGroup(Ev::kAdded, g);
      for (int m = 0; m < members; ++m) {
        pods.push_back(
            GpuPod(ns, group + "-" + std::to_string(m), {.gpus = 2, .pod_group = group}));
      }
    } else if (k <= 5) {
      pods.push_back(GpuPod(ns, "p-" + std::to_string(i), {.gpus = 1 << (rng_() % 4)}));
    } else {
      pods.push_back(
          GpuPod(ns, "s-" + std::to_string(i), {.shares = 1 + static_cast<int>(rng_() % 3)}));
    }
    const std::vector<std::string> all = c_.node_names();
    std::vector<std::pair<json, std::string>> placed;
    for (json& pod : pods) {
      ex_->OnPod(Ev::kAdded, pod);
      FilterResult f = ex_->Filter(pod, all);
      if (f.nodes.size() == 1) placed.emplace_back(pod, f.nodes[0]);
    }
    // The rest of a gang started by its last member's filter: kube-scheduler asks again.
    for (auto& [id, node] : ex_->TakeNudges()) {
      for (json& pod : pods) {
        if (kube::ObjectKey(pod) != id) continue;
        FilterResult f = ex_->Filter(pod, all);
        if (f.nodes.size() == 1) placed.emplace_back(pod, f.nodes[0]);
      }
    }
    for (auto& [pod, node] : placed) {
      auto plan = ex_->PrepareBind(pod["metadata"]["namespace"], pod["metadata"]["name"],
                                   pod["metadata"]["uid"], node);
      if (!plan.ok()) continue;
      pod["spec"]["nodeName"] = node;
      pod["metadata"]["annotations"][kube::kAssignmentAnnotation] =
          kube::FormatAssignment(plan->assignment);
      pod["status"]["phase"] = "Running";
      c_.pods_[kube::ObjectKey(pod)] = pod;
      ex_->OnPod(Ev::kModified, pod);
      ++bound_;
    }
    // What did not place is deleted (its controller gives up), so that nothing pends for ever.
    for (json& pod : pods) {
      if (!c_.pods_.contains(kube::ObjectKey(pod))) ex_->OnPod(Ev::kDeleted, pod);
    }
    if (k <= 1 && placed.empty()) {
      std::string key = ns + "/gang-" + std::to_string(i);
      ex_->OnPodGroup(Ev::kDeleted, c_.groups_[key]);
      c_.groups_.erase(key);
    }
  }

  // Running pods end, a random one at a time.
  void End() {
    if (c_.pods_.empty()) return;
    auto it = c_.pods_.begin();
    std::advance(it, rng_() % c_.pods_.size());
    json pod = it->second;
    c_.pods_.erase(it);
    if (rng_() % 2) {
      pod["status"]["phase"] = "Succeeded";
      ex_->OnPod(Ev::kModified, pod);
    }
    ex_->OnPod(Ev::kDeleted, pod);
  }

  // A Node object deleted and created again (a node re-registered): its pods run on.
  void ReAddNode() {
    auto names = c_.node_names();
    const std::string& name = names[rng_() % names.size()];
    ex_->OnNode(Ev::kDeleted, c_.nodes_[name]);
    ex_->OnNode(Ev::kAdded, c_.nodes_[name]);
  }

  void Evictions() {
    for (const Victim& v : ex_->TakeEvictions()) {
      auto it = c_.pods_.find(v.ns + "/" + v.name);
      if (it == c_.pods_.end()) continue;
      json pod = it->second;
      c_.pods_.erase(it);
      ex_->OnPod(Ev::kDeleted, pod);
    }
  }

  void CheckAll(const std::string& when) {
    std::set<std::string> all;
    for (const auto& [n, o] : c_.nodes_) all.insert(n);
    c_.Check(*ex_, all, when);
    EXPECT_EQ(ex_->stats().unaccounted, 0) << when;
  }

  static ExtenderOptions Options() {
    ExtenderOptions o;
    o.scheduler.random_ties = false;
    o.reservation_timeout_s = 1e9;
    return o;
  }

  std::mt19937 rng_;
  core::FakeClock clock_;
  Cluster c_;
  std::unique_ptr<Extender> ex_;
  int restarts_ = 0;
  int bound_ = 0;
};

TEST(ExtenderLifecycle, RestartsAtRandomPointsOfA5000PodRunKeepEveryAllocation) {
  LifeRun run(49);
  std::set<int> restart_at;
  while (restart_at.size() < 12) restart_at.insert(200 + static_cast<int>(run.rng_() % 4800));
  for (int i = 0; i < 5000 && !::testing::Test::HasFailure(); ++i) {
    run.Arrive(i);
    run.Evictions();
    // About as many end as arrive, so the cluster stays busy (fragmented, shares mixed in).
    while (run.c_.pods_.size() > 90) run.End();
    if (run.rng_() % 2) run.End();
    if (i % 50 == 25) run.ReAddNode();
    if (i % 97 == 0) run.CheckAll("pod " + std::to_string(i));
    if (restart_at.contains(i)) run.Restart(true);
  }
  EXPECT_EQ(run.restarts_, 12);
  EXPECT_GT(run.bound_, 2500) << "the run should keep the cluster busy";
  run.CheckAll("the end");
}

TEST(ExtenderLifecycle, BoundPodsListedBeforeTheirNodesAndPodGroupsAreAccounted) {
  // The case: 4 bound gang pods (18 GPUs) listed before their nodes and PodGroup.
  core::FakeClock clock;
  Extender ex(LifeRun::Options(), clock);
  std::vector<json> nodes = {GpuNode("a", "dgx-h100"), GpuNode("b", "dgx-h100"),
                             GpuNode("c", "dgx-h100")};
  std::vector<json> pods;
  const int gpus[] = {8, 8, 1, 1};
  const char* on[] = {"a", "b", "c", "c"};
  for (int m = 0; m < 4; ++m) {
    json pod = GpuPod("ml", "w" + std::to_string(m), {.gpus = gpus[m], .pod_group = "job"});
    auto spec = NodeOf(GpuNode(on[m], "dgx-h100"))->spec;
    kube::Assignment as{on[m], 1, {{"main", "tessera.io/gpu", {}, gpus[m]}}};
    for (int g = 0; g < gpus[m]; ++g)
      as.containers[0].gpus.push_back(spec.gpus[m == 3 ? 7 - g : g].uuid);
    pod["spec"]["nodeName"] = on[m];
    pod["metadata"]["annotations"][kube::kAssignmentAnnotation] = kube::FormatAssignment(as);
    pod["status"]["phase"] = "Running";
    ex.OnPod(Ev::kAdded, pod);
  }
  // A share pod before any node says how many shares a GPU has.
  json share = GpuPod("ml", "share", {.shares = 2});
  share["spec"]["nodeName"] = "c";
  ex.OnPod(Ev::kAdded, share);
  EXPECT_EQ(ex.stats().unaccounted, 5);
  EXPECT_EQ(ex.stats().gpu_milli_allocated, 0);
  for (const json& n : nodes) ex.OnNode(Ev::kAdded, n);
  ex.OnPodGroup(Ev::kAdded, PodGroup("ml", "job", 4));
  EXPECT_EQ(ex.stats().unaccounted, 0);
  EXPECT_EQ(ex.stats().gpu_milli_allocated, 18000 + 500);
  EXPECT_EQ(ex.AllocationOf("ml/w3")->gpus, std::vector<int>{7});
  // An 8-GPU pod finds no room on a or b, where the gang runs.
  EXPECT_TRUE(ex.Filter(GpuPod("ml", "big", {.gpus = 8}), {"a", "b"}).nodes.empty());

  // The Node object deleted and created again: its pods keep their GPUs.
  ex.OnNode(Ev::kDeleted, nodes[0]);
  EXPECT_EQ(ex.stats().unaccounted, 1);
  EXPECT_EQ(ex.stats().gpu_milli_allocated, 10500);
  ex.OnNode(Ev::kAdded, nodes[0]);
  EXPECT_EQ(ex.stats().unaccounted, 0);
  EXPECT_EQ(ex.stats().gpu_milli_allocated, 18500);
  EXPECT_TRUE(ex.Filter(GpuPod("ml", "big", {.gpus = 8}), {"a", "b"}).nodes.empty());
  // Ended while its node was gone: nothing is left of it when the node is back.
  ex.OnNode(Ev::kDeleted, nodes[1]);
  json w1 = GpuPod("ml", "w1", {.gpus = 8, .pod_group = "job"});
  w1["spec"]["nodeName"] = "b";
  ex.OnPod(Ev::kDeleted, w1);
  ex.OnNode(Ev::kAdded, nodes[1]);
  EXPECT_EQ(ex.stats().gpu_milli_allocated, 10500);
  EXPECT_EQ(ex.Filter(GpuPod("ml", "big", {.gpus = 8}), {"a", "b"}).nodes,
            std::vector<std::string>{"b"});
}

TEST(ExtenderLifecycle, AReasonCountsOnlyTheNodesOffered) {
  core::FakeClock clock;
  Extender ex(LifeRun::Options(), clock);
  ex.OnNode(Ev::kAdded, GpuNode("a", "t4x2"));
  ex.OnNode(Ev::kAdded, GpuNode("b", "dgx-h100"));
  ex.OnNode(Ev::kAdded, GpuNode("c", "dgx-h100"));
  FilterResult f = ex.Filter(GpuPod("ml", "four", {.gpus = 4}), {"a"});
  EXPECT_TRUE(f.nodes.empty());
  EXPECT_EQ(f.reason.find("unhealthy"), std::string::npos) << f.reason;
  EXPECT_NE(f.reason.find("of the 1 node(s) kube-scheduler offered: a: 2 healthy GPUs free"),
            std::string::npos)
      << f.reason;
}

}  // namespace
}  // namespace tessera::extender
