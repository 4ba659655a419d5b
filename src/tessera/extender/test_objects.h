#pragma once
// Kubernetes objects for the extender's tests: GPU nodes as the agent annotates them, pods asking
// for Tessera's resources, PodGroups, the quota ConfigMap.

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tessera/devices/inventory.h"
#include "tessera/kube/gpu_annotations.h"

namespace tessera::extender::testing {

// A node simulated from a preset ("t4x2", "dgx-h100"), every GPU healthy unless `sick` names it.
inline nlohmann::json GpuNode(const std::string& name, const std::string& preset = "t4x2",
                              std::vector<int> sick = {}, int shares_per_gpu = 4) {
  auto m = devices::LoadSimulatedMachine(preset);
  kube::NodeGpus n{m->inventory, std::vector<bool>(m->inventory.gpus.size(), true), shares_per_gpu};
  for (int g : sick) n.healthy[g] = false;
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata",
           {{"name", name},
            {"uid", "uid-" + name},
            {"annotations", {{kube::kNodeGpusAnnotation, kube::FormatNodeGpus(n)}}}}},
          {"status", {{"allocatable", {{"cpu", "32"}, {"memory", "128Gi"}}}}}};
}

struct PodOptions {
  int gpus = 0;
  int shares = 0;
  int priority = 0;
  std::string pod_group;
  std::string created = "2026-11-23T10:00:00Z";
  nlohmann::json annotations = nlohmann::json::object();
};

inline nlohmann::json GpuPod(const std::string& ns, const std::string& name, PodOptions o) {
  nlohmann::json limits = nlohmann::json::object();
  if (o.gpus > 0) limits["tessera.io/gpu"] = std::to_string(o.gpus);
  if (o.shares > 0) limits["tessera.io/gpu-share"] = std::to_string(o.shares);
  nlohmann::json pod = {{"apiVersion", "v1"},
                        {"kind", "Pod"},
                        {"metadata",
                         {{"name", name},
                          {"namespace", ns},
                          {"uid", "uid-" + ns + "-" + name},
                          {"creationTimestamp", o.created},
                          {"annotations", o.annotations}}},
                        {"spec",
                         {{"schedulerName", "tessera"},
                          {"priority", o.priority},
                          {"containers",
                           {{{"name", "main"},
                             {"image", "train:1"},
                             {"resources", {{"limits", limits}, {"requests", {{"cpu", "1"}}}}}}}}}},
                        {"status", {{"phase", "Pending"}}}};
  if (!o.pod_group.empty()) {
    pod["metadata"]["labels"] = {{"scheduling.x-k8s.io/pod-group", o.pod_group}};
  }
  return pod;
}

inline nlohmann::json PodGroup(const std::string& ns, const std::string& name, int min_member) {
  return {{"apiVersion", "scheduling.x-k8s.io/v1alpha1"},
          {"kind", "PodGroup"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec", {{"minMember", min_member}}}};
}

inline nlohmann::json QuotaConfigMap(const std::string& yaml) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", "tessera-quotas"}, {"namespace", "tessera-system"}}},
          {"data", {{"quotas.yaml", yaml}}}};
}

}  // namespace tessera::extender::testing
