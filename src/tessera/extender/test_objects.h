#pragma once
// Kubernetes objects for the extender's tests: GPU nodes as the agent annotates them, pods asking
// for Tessera's resources, PodGroups, the quota ConfigMap; DRA slices, claims and templates.

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tessera/core/request.h"
#include "tessera/devices/inventory.h"
#include "tessera/kube/gpu_annotations.h"

namespace tessera::extender::testing {

// A node simulated from a preset ("t4x2", "dgx-h100"), every GPU healthy unless `sick` names it.
// `mps`: the GPUs its agent runs in MPS mode.
inline nlohmann::json GpuNode(const std::string& name, const std::string& preset = "t4x2",
                              std::vector<int> sick = {}, int shares_per_gpu = 4,
                              std::vector<int> mps = {}) {
  auto m = devices::LoadSimulatedMachine(preset);
  kube::NodeGpus n{m->inventory, std::vector<bool>(m->inventory.gpus.size(), true), shares_per_gpu};
  for (int g : sick) n.healthy[g] = false;
  n.sharing.assign(m->inventory.gpus.size(), core::GpuSharing::kTimeSlice);
  for (int g : mps) n.sharing[g] = core::GpuSharing::kMps;
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

// A node of a trace as the agent would annotate it, with 100 shares per GPU (the agent's most): a
// share is 10 thousandths of a GPU, and the openb traces' fractions are all multiples of 10.
inline nlohmann::json OpenbNode(const core::NodeSpec& n) {
  kube::NodeGpus g;
  g.inventory.hostname = n.name;
  for (size_t i = 0; i < n.gpus.size(); ++i) {
    core::Gpu gpu;
    gpu.index = static_cast<int>(i);
    gpu.uuid = "GPU-" + n.name + "-" + std::to_string(i);
    gpu.model = n.gpus[i].model;
    gpu.memory_bytes = static_cast<uint64_t>(n.gpus[i].memory_mib) << 20;
    if (n.gpus[i].compute_capability.major > 0) {
      gpu.compute_capability = n.gpus[i].compute_capability;
    }
    if (n.gpus[i].numa_node >= 0) gpu.numa_node = n.gpus[i].numa_node;
    g.inventory.gpus.push_back(gpu);
  }
  g.inventory.topology = n.topology;
  g.healthy.assign(n.gpus.size(), true);
  g.shares_per_gpu = 100;
  nlohmann::json node;
  node["metadata"]["name"] = n.name;
  node["metadata"]["annotations"][kube::kNodeGpusAnnotation] = kube::FormatNodeGpus(g);
  node["status"]["allocatable"]["cpu"] = std::to_string(n.cpu_milli) + "m";
  node["status"]["allocatable"]["memory"] = std::to_string(n.memory_mib) + "Mi";
  return node;
}

// A trace's request as a pod in namespace "openb" (see OpenbNode for shares: gpu_milli / 10).
inline nlohmann::json OpenbPod(const core::Request& r, const std::string& name) {
  nlohmann::json c;
  c["name"] = "main";
  if (r.gpus > 0) c["resources"]["limits"]["tessera.io/gpu"] = std::to_string(r.gpus);
  if (r.gpu_milli > 0) {
    c["resources"]["limits"]["tessera.io/gpu-share"] = std::to_string(r.gpu_milli / 10);
  }
  c["resources"]["requests"]["cpu"] = std::to_string(r.cpu_milli) + "m";
  c["resources"]["requests"]["memory"] = std::to_string(r.memory_mib) + "Mi";
  nlohmann::json pod;
  pod["metadata"]["name"] = name;
  pod["metadata"]["namespace"] = "openb";
  pod["metadata"]["uid"] = "uid-" + name;
  pod["metadata"]["annotations"] = nlohmann::json::object();
  if (!r.models.empty()) {
    std::string models;
    for (const auto& m : r.models) models += (models.empty() ? "" : ",") + m;
    pod["metadata"]["annotations"]["tessera.io/gpu-model"] = models;
  }
  if (r.gpu_memory_mib > 0) {
    pod["metadata"]["annotations"]["tessera.io/gpu-memory"] =
        std::to_string(r.gpu_memory_mib) + "Mi";
  }
  pod["spec"]["containers"] = nlohmann::json::array({c});
  pod["status"]["phase"] = "Pending";
  return pod;
}

// DRA: a node's ResourceSlice as the agent publishes it (GPUs 0-2 whole, GPU 3 in four shares,
// H100s); a claim of namespace a allocated on `node`; a claim template; a pod using a template.
inline nlohmann::json DraSlice(const std::string& node, int64_t generation = 1) {
  nlohmann::json devs = nlohmann::json::array();
  auto dev = [&](const std::string& name, int gpu, const char* type, const char* memory) {
    nlohmann::json d = {{"name", name},
                        {"attributes",
                         {{"type", {{"string", type}}},
                          {"index", {{"int", gpu}}},
                          {"productName", {{"string", "NVIDIA H100 80GB HBM3"}}}}},
                        {"capacity", {{"memory", {{"value", memory}}}}}};
    if (std::string(type) == "share") d["attributes"]["sharesPerGpu"] = {{"int", 4}};
    devs.push_back(d);
  };
  for (int g = 0; g < 3; ++g) dev("gpu-" + std::to_string(g), g, "gpu", "80Gi");
  for (int k = 0; k < 4; ++k) dev("gpu-3-share-" + std::to_string(k), 3, "share", "20Gi");
  return {{"metadata", {{"name", node + "-gpu.tessera.io-0"}}},
          {"spec",
           {{"driver", "gpu.tessera.io"},
            {"nodeName", node},
            {"pool", {{"name", node}, {"generation", generation}, {"resourceSliceCount", 1}}},
            {"devices", devs}}}};
}

inline nlohmann::json DraAllocated(const std::string& name, const std::string& node,
                                   const std::vector<std::string>& devices) {
  nlohmann::json results = nlohmann::json::array();
  for (const auto& d : devices) {
    results.push_back(
        {{"request", "r"}, {"driver", "gpu.tessera.io"}, {"pool", node}, {"device", d}});
  }
  return {{"metadata", {{"name", name}, {"namespace", "a"}, {"uid", "uid-" + name}}},
          {"status", {{"allocation", {{"devices", {{"results", results}}}}}}}};
}

inline nlohmann::json DraTemplate(const std::string& name, const char* cls, int count,
                                  bool same_gpu = false) {
  nlohmann::json t = {
      {"metadata", {{"name", name}, {"namespace", "a"}}},
      {"spec",
       {{"spec",
         {{"devices",
           {{"requests",
             {{{"name", "r"}, {"exactly", {{"deviceClassName", cls}, {"count", count}}}}}}}}}}}}};
  if (same_gpu) {
    t["spec"]["spec"]["devices"]["constraints"] = {
        {{"requests", {"r"}}, {"matchAttribute", "gpu.tessera.io/uuid"}}};
  }
  return t;
}

inline nlohmann::json DraPod(const std::string& tmpl) {
  return {{"metadata", {{"name", "p"}, {"namespace", "a"}}},
          {"spec", {{"resourceClaims", {{{"name", "gpu"}, {"resourceClaimTemplateName", tmpl}}}}}}};
}

}  // namespace tessera::extender::testing
