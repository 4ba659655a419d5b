#include "tessera/agent/node_labels.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tessera/kube/gpu_annotations.h"
#include "tessera/kube/object.h"

namespace tessera::agent {
namespace {

bool Alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

std::string Major(const std::string& version) { return version.substr(0, version.find('.')); }

}  // namespace

std::string LabelValue(std::string_view text) {
  std::string out;
  for (char c : text) {
    out += Alnum(c) || c == '.' || c == '_' || c == '-' ? c : '-';
  }
  if (out.size() > 63) out.resize(63);
  while (!out.empty() && !Alnum(out.front())) out.erase(0, 1);
  while (!out.empty() && !Alnum(out.back())) out.pop_back();
  return out;
}

std::map<std::string, std::string> DesiredLabels(const NodeFacts& facts) {
  const core::NodeInventory& inv = *facts.inventory;
  std::map<std::string, std::string> l;
  const int n = static_cast<int>(inv.gpus.size());
  l["tessera.io/gpu.present"] = n > 0 ? "true" : "false";
  l["tessera.io/gpu.count"] = std::to_string(n);
  l["tessera.io/gpu.healthy"] =
      std::to_string(std::count(facts.healthy.begin(), facts.healthy.end(), true));
  if (inv.simulated) l["tessera.io/gpu.simulated"] = "true";
  if (facts.shares_per_gpu > 0) l["tessera.io/gpu.shares"] = std::to_string(facts.shares_per_gpu);
  if (n == 0) return l;
  // How its GPUs are shared: a pod that needs MPS (or must not have it) selects on this.
  const auto mps = std::count(facts.sharing.begin(), facts.sharing.end(), core::GpuSharing::kMps);
  l["tessera.io/gpu.sharing"] = mps == 0 ? "time-slice" : mps == n ? "mps" : "mixed";

  std::set<std::string> products;
  std::optional<uint64_t> memory;
  std::optional<core::ComputeCapability> cc;
  bool mig_known = false, mig = false;
  for (const core::Gpu& g : inv.gpus) {
    products.insert(g.model);
    // The smallest GPU is what a pod can count on, whichever GPU it gets.
    if (g.memory_bytes) memory = memory ? std::min(*memory, *g.memory_bytes) : *g.memory_bytes;
    if (g.compute_capability) {
      cc = cc ? std::min(*cc, *g.compute_capability) : *g.compute_capability;
    }
    if (g.mig_enabled) {
      mig_known = true;
      mig = mig || *g.mig_enabled;
    }
  }
  std::string product = products.size() == 1 ? LabelValue(*products.begin()) : "mixed";
  if (!product.empty()) l["tessera.io/gpu.product"] = product;
  if (memory) l["tessera.io/gpu.memory"] = std::to_string(*memory >> 20);  // MiB
  if (cc) {
    l["tessera.io/gpu.compute.major"] = std::to_string(cc->major);
    l["tessera.io/gpu.compute.minor"] = std::to_string(cc->minor);
  }
  if (mig_known) l["tessera.io/gpu.mig"] = mig ? "true" : "false";
  bool nvlink = false;
  for (int a = 0; a < inv.topology.size(); ++a) {
    for (int b = a + 1; b < inv.topology.size(); ++b) {
      nvlink = nvlink || inv.topology.link(a, b).has_nvlink();
    }
  }
  l["tessera.io/gpu.nvlink"] = nvlink ? "true" : "false";
  if (!inv.driver_version.empty()) {
    l["tessera.io/driver.version"] = LabelValue(inv.driver_version);
    l["tessera.io/driver.major"] = LabelValue(Major(inv.driver_version));
  }
  if (!inv.cuda_driver_version.empty()) {
    l["tessera.io/cuda.version"] = LabelValue(inv.cuda_driver_version);
    l["tessera.io/cuda.major"] = LabelValue(Major(inv.cuda_driver_version));
  }
  for (auto it = l.begin(); it != l.end();) {
    it = it->second.empty() ? l.erase(it) : std::next(it);
  }
  return l;
}

std::map<std::string, std::string> DesiredAnnotations(const NodeFacts& facts) {
  kube::NodeGpus n{*facts.inventory, facts.healthy, facts.shares_per_gpu, facts.sharing};
  return {{kube::kNodeGpusAnnotation, kube::FormatNodeGpus(n)}};
}

std::optional<nlohmann::json> NodePatch(const nlohmann::json& node,
                                        const std::map<std::string, std::string>& labels,
                                        const std::map<std::string, std::string>& annotations) {
  static const nlohmann::json kNone = nlohmann::json::object();
  const nlohmann::json* l = kube::FieldAt(node, {"metadata", "labels"});
  const nlohmann::json* a = kube::FieldAt(node, {"metadata", "annotations"});
  const nlohmann::json& have_labels = l && l->is_object() ? *l : kNone;
  const nlohmann::json& have_annotations = a && a->is_object() ? *a : kNone;
  nlohmann::json patch_labels = nlohmann::json::object();
  nlohmann::json patch_annotations = nlohmann::json::object();
  for (const auto& [k, v] : labels) {
    if (kube::StringAt(have_labels, {k.c_str()}) != v) patch_labels[k] = v;
  }
  // Remove what we set before and no longer set; nothing else.
  std::string owned_before = kube::StringAt(have_annotations, {kOwnedLabelsAnnotation});
  for (const auto& k : absl::StrSplit(owned_before, ',', absl::SkipEmpty())) {
    std::string key(k);
    if (key.rfind(kLabelPrefix, 0) != 0 || labels.contains(key)) continue;
    if (have_labels.contains(key)) patch_labels[key] = nullptr;
  }
  std::vector<std::string> keys;
  for (const auto& [k, v] : labels) keys.push_back(k);
  std::map<std::string, std::string> want_annotations = annotations;
  want_annotations[kOwnedLabelsAnnotation] = absl::StrJoin(keys, ",");
  for (const auto& [k, v] : want_annotations) {
    if (kube::StringAt(have_annotations, {k.c_str()}) != v) patch_annotations[k] = v;
  }
  if (patch_labels.empty() && patch_annotations.empty()) return std::nullopt;
  nlohmann::json patch = {{"metadata", nlohmann::json::object()}};
  if (!patch_labels.empty()) patch["metadata"]["labels"] = patch_labels;
  if (!patch_annotations.empty()) patch["metadata"]["annotations"] = patch_annotations;
  return patch;
}

}  // namespace tessera::agent
