#include "tessera/extender/objects.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "tessera/kube/gpu_annotations.h"
#include "tessera/kube/object.h"

namespace tessera::extender {
namespace {

using kube::FieldAt;
using kube::StringAt;
using nlohmann::json;

// A quantity field: a string as Kubernetes writes it, or a bare number.
absl::StatusOr<int64_t> QuantityField(const json* v, double scale, const std::string& where) {
  if (!v || v->is_null()) return 0;
  std::optional<int64_t> q;
  if (v->is_string()) {
    q = ParseQuantity(v->get<std::string>(), scale);
  } else if (v->is_number()) {
    q = ParseQuantity(v->dump(), scale);
  }
  if (!q)
    return absl::InvalidArgumentError(fmt::format("{}: not a quantity: {}", where, v->dump()));
  return *q;
}

}  // namespace

absl::StatusOr<NodeGpusInfo> NodeOf(const json& node) {
  std::string name = StringAt(node, {"metadata", "name"});
  if (name.empty()) return absl::InvalidArgumentError("node: metadata.name is missing");
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(fmt::format(
        "node: metadata.name is {} characters, over Kubernetes' {}", name.size(), kMaxNameLength));
  }
  NodeGpusInfo out;
  out.spec.name = name;
  std::string where = "node " + name;
  auto cpu = QuantityField(FieldAt(node, {"status", "allocatable", "cpu"}), 1000,
                           where + ": status.allocatable.cpu");
  if (!cpu.ok()) return cpu.status();
  auto mem = QuantityField(FieldAt(node, {"status", "allocatable", "memory"}), 1.0 / (1 << 20),
                           where + ": status.allocatable.memory");
  if (!mem.ok()) return mem.status();
  out.spec.cpu_milli = *cpu;
  out.spec.memory_mib = *mem;
  if (const json* labels = FieldAt(node, {"metadata", "labels"}); labels && labels->is_object()) {
    for (const auto& [k, v] : labels->items()) {
      if (v.is_string()) out.spec.labels.emplace_back(k, v.get<std::string>());
    }
  }
  std::string gpus = StringAt(node, {"metadata", "annotations", kube::kNodeGpusAnnotation});
  if (gpus.empty()) return out;
  auto parsed = kube::ParseNodeGpus(gpus);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", where, std::string(parsed.status().message())));
  }
  out.has_agent = true;
  out.healthy = parsed->healthy;
  out.shares_per_gpu = parsed->shares_per_gpu;
  for (const core::Gpu& g : parsed->inventory.gpus) {
    core::NodeGpu ng;
    ng.model = g.model;
    ng.memory_mib = g.memory_bytes ? static_cast<int64_t>(*g.memory_bytes >> 20) : 0;
    if (g.compute_capability) ng.compute_capability = *g.compute_capability;
    ng.numa_node = g.numa_node.value_or(-1);
    ng.uuid = g.uuid;
    ng.sharing = parsed->sharing[out.spec.gpus.size()];
    out.spec.gpus.push_back(std::move(ng));
  }
  out.spec.topology = parsed->inventory.topology;
  return out;
}

// Long by design: one block per thing read of a pod (containers, resources, annotations,
// priority, gang), each with its own error naming the field, in the order docs/kubernetes.md lists
// them.
bool HasTesseraResources(const json& pod) {
  for (const char* list : {"containers", "initContainers"}) {
    const json* cs = FieldAt(pod, {"spec", list});
    if (!cs || !cs->is_array()) continue;
    for (const json& c : *cs) {
      for (const char* kind : {"limits", "requests"}) {
        const json* r = FieldAt(c, {"resources", kind});
        if (r && r->is_object() &&
            (r->contains("tessera.io/gpu") || r->contains("tessera.io/gpu-share"))) {
          return true;
        }
      }
    }
  }
  return false;
}

sched::RunKind UseKind(sched::RunKind kind) {
  // Known by neither a Job, a controller nor a command, a pod is one of its namespace's pods of
  // its shape - never of every namespace's (the history's shape-only keys): whoever may edit a pod
  // can write its tessera.io/gpu-use, so what sizes a namespace's pods comes from its own.
  if (kind.name.empty() && kind.command.empty()) kind.command = {kPodsOfItsShape};
  return kind;
}

std::string PodShape(const core::Request& r, bool share_auto, bool memory_auto,
                     int64_t memory_mib) {
  if (!share_auto) {
    if (!r.fractional()) return sched::HistoryShape(r, 1, false);
    core::Request m = r;
    m.gpu_memory_mib = memory_mib;
    return sched::HistoryShape(m, 1, memory_auto);
  }
  core::Request any = r;  // written as a share of any size, then "auto" in place of its size
  any.gpus = 0;
  any.gpu_milli = 1;
  any.gpu_memory_mib = memory_mib;
  const std::string s = sched::HistoryShape(any, 1, memory_auto);
  return "auto" + s.substr(s.find(' '));
}

std::vector<sched::RunKind> UseKinds(const PodDemand& d) {
  std::vector<sched::RunKind> kinds = {UseKind(d.kind)};
  if (!d.request.fractional() && !d.share_auto) return kinds;
  for (bool share_auto : {d.share_auto, true}) {
    for (bool memory_auto : {d.memory_auto_asked, true}) {
      sched::RunKind k = UseKind(d.kind);
      k.shape = PodShape(d.request, share_auto, memory_auto, d.memory_mib_asked);
      if (std::ranges::none_of(kinds, [&](const auto& o) { return o.shape == k.shape; }))
        kinds.push_back(std::move(k));
    }
  }
  return kinds;
}

absl::StatusOr<PodDemand> PodDemandOf(const json& pod, int shares_per_gpu) {
  std::string name = StringAt(pod, {"metadata", "name"});
  std::string ns = StringAt(pod, {"metadata", "namespace"});
  if (name.empty()) return absl::InvalidArgumentError("pod: metadata.name is missing");
  // Names as Kubernetes bounds them (a DNS subdomain, a namespace a DNS label): nothing longer
  // reaches a log, an answer or the model (a 60 MiB name was echoed and logged whole).
  if (name.size() > kMaxNameLength || ns.size() > 63) {
    return absl::InvalidArgumentError(fmt::format(
        "pod: metadata.name ({} characters) or metadata.namespace ({}) over Kubernetes' bounds "
        "(253, 63)",
        name.size(), ns.size()));
  }
  if (ns.empty()) ns = "default";
  const std::string where = "pod " + ns + "/" + name;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", where, what));
  };
  PodDemand d;
  core::Request& r = d.request;
  r.id = ns + "/" + name;
  r.owner = ns;

  int64_t init_cpu = 0, init_mem = 0;
  int whole = 0;
  std::vector<ContainerDemand> shares;
  for (const char* list : {"initContainers", "containers"}) {
    const json* cs = FieldAt(pod, {"spec", list});
    if (!cs) continue;
    if (!cs->is_array()) return bad(fmt::format("spec.{}: expected a list", list));
    for (size_t i = 0; i < cs->size(); ++i) {
      const json& c = (*cs)[i];
      std::string cw = fmt::format("spec.{}[{}]", list, i);
      if (!c.is_object()) return bad(cw + ": expected an object");
      std::string cname = StringAt(c, {"name"});
      // Requests default to limits for extended resources (they must be equal).
      auto amount = [&](const char* res, double scale) -> absl::StatusOr<int64_t> {
        const json* v = FieldAt(c, {"resources", "requests", res});
        if (!v) v = FieldAt(c, {"resources", "limits", res});
        return QuantityField(v, scale, fmt::format("{}: {}.resources {}", where, cw, res));
      };
      auto cpu = amount("cpu", 1000);
      if (!cpu.ok()) return cpu.status();
      auto mem = amount("memory", 1.0 / (1 << 20));
      if (!mem.ok()) return mem.status();
      if (std::string(list) == "initContainers") {
        init_cpu = std::max(init_cpu, *cpu);
        init_mem = std::max(init_mem, *mem);
      } else {
        r.cpu_milli += *cpu;
        r.memory_mib += *mem;
      }
      for (const char* res : {"tessera.io/gpu", "tessera.io/gpu-share"}) {
        auto n = amount(res, 1);
        if (!n.ok()) return n.status();
        if (*n == 0) continue;
        if (*n > 1000) return bad(fmt::format("{}: {} {} is more than any node has", cw, res, *n));
        ContainerDemand cd{cname, res, static_cast<int>(*n)};
        if (std::string(res) == "tessera.io/gpu") {
          whole += cd.count;
        } else {
          shares.push_back(cd);
        }
        d.containers.push_back(cd);
      }
    }
  }
  r.cpu_milli = std::max(r.cpu_milli, init_cpu);
  r.memory_mib = std::max(r.memory_mib, init_mem);
  if (d.containers.empty()) return bad("requests neither tessera.io/gpu nor tessera.io/gpu-share");
  if (whole > 0 && !shares.empty()) {
    return bad("asks for whole GPUs and shares together; Tessera places one or the other per pod");
  }
  if (shares.size() > 1) return bad("asks for shares in more than one container");
  const json* ann = FieldAt(pod, {"metadata", "annotations"});
  auto annotation = [&](const char* key) -> std::string {
    return ann && ann->is_object() ? StringAt(*ann, {key}) : "";
  };
  if (whole > 0) {
    r.gpus = whole;
  } else {
    if (shares_per_gpu <= 0) return bad("asks for shares, but no node serves tessera.io/gpu-share");
    int count = shares[0].count;
    if (count >= shares_per_gpu) {
      return bad(fmt::format("asks for {} shares of {} per GPU: ask for tessera.io/gpu instead",
                             count, shares_per_gpu));
    }
    r.gpu_milli = count * core::kMilliPerGpu / shares_per_gpu;
    if (r.gpu_milli < 1) r.gpu_milli = 1;
  }
  // A share's memory (a pod whose share was sized "auto" keeps it in its kind's shape even where
  // it was sized a whole GPU, which has all of its GPU's memory).
  int64_t memory_mib = 0;
  bool memory_auto = false;
  if (std::string m = annotation(kGpuMemoryAnnotation); m == "auto") {
    memory_auto = true;
  } else if (!m.empty()) {
    auto mib = ParseQuantity(m, 1.0 / (1 << 20));
    if (!mib || *mib <= 0) {
      return bad(fmt::format("annotation {}: expected a quantity such as 10Gi, or auto, got \"{}\"",
                             kGpuMemoryAnnotation, m));
    }
    memory_mib = *mib;
  }
  if (std::string a = annotation(kGpuShareAnnotation); !a.empty()) {
    if (a != "auto") {
      return bad(fmt::format(
          "annotation {}: expected auto (a count of shares goes in the container's resources), "
          "got \"{}\"",
          kGpuShareAnnotation, a));
    }
    d.share_auto = true;
    d.admitted_sizing = annotation(kSizingAnnotation);
    // Sized at admission, or not at all: without the webhook the pod's count is a guess nobody
    // checked, and it would be placed as if it were measured.
    if (d.admitted_sizing.rfind("gpu-share", 0) != 0) {
      return bad(fmt::format(
          "annotation {}: auto, but the pod was not sized when it was created (no {} from the "
          "extender's admission webhook): is deploy/components/auto-share installed? "
          "(docs/kubernetes.md)",
          kGpuShareAnnotation, kSizingAnnotation));
    }
  }
  d.memory_auto_asked = memory_auto;
  d.memory_mib_asked = memory_mib;
  if (r.fractional()) {
    d.memory_auto = memory_auto;
    r.gpu_memory_mib = memory_auto ? 0 : memory_mib;
  }
  if (const json* p = FieldAt(pod, {"spec", "priority"}); p && !p->is_null()) {
    if (!p->is_number_integer()) return bad("spec.priority: expected a whole number");
    int64_t v = p->get<int64_t>();
    r.priority = static_cast<int>(std::clamp<int64_t>(v, -2000000000, 2000000000));
  }
  if (std::string models = annotation(kGpuModelAnnotation); !models.empty()) {
    size_t start = 0;
    while (start <= models.size()) {
      size_t comma = models.find(',', start);
      if (comma == std::string::npos) comma = models.size();
      std::string m = models.substr(start, comma - start);
      if (m.empty()) {
        return bad(fmt::format("annotation {}: an empty model name", kGpuModelAnnotation));
      }
      r.models.push_back(m);
      start = comma + 1;
    }
  }
  if (std::string t = annotation(kTopologyAnnotation); !t.empty()) {
    if (t == "prefer-nvlink" || t == "require-nvlink" || t == "prefer-numa" ||
        t == "require-numa") {
      r.topology =
          t.rfind("prefer", 0) == 0 ? core::TopologyMode::kPrefer : core::TopologyMode::kRequire;
      r.topology_scope = t.find("nvlink") != std::string::npos ? core::TopologyScope::kNvlink
                                                               : core::TopologyScope::kNumaNode;
    } else {
      return bad(fmt::format(
          "annotation {}: expected prefer-nvlink, require-nvlink, prefer-numa or require-numa, "
          "got \"{}\"",
          kTopologyAnnotation, t));
    }
  }
  if (std::string u = annotation(kGpuUtilizationAnnotation); !u.empty()) {
    std::string digits = u.back() == '%' ? u.substr(0, u.size() - 1) : u;
    int pct = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pct);
    if (ec != std::errc() || end != digits.data() + digits.size() || pct < 1 || pct > 100) {
      return bad(fmt::format("annotation {}: expected a percentage 1..100 such as 40%, got \"{}\"",
                             kGpuUtilizationAnnotation, u));
    }
    if (!r.fractional()) {
      return bad(fmt::format("annotation {}: only a pod asking for tessera.io/gpu-share has one",
                             kGpuUtilizationAnnotation));
    }
    r.expected_util_pct = pct;
  }
  if (std::string m = annotation(kSharingAnnotation); !m.empty()) {
    r.sharing = core::ParseGpuSharing(m);
    if (!r.sharing) {
      return bad(fmt::format("annotation {}: expected time-slice or mps, got \"{}\"",
                             kSharingAnnotation, m));
    }
    // The device plugin makes a container an MPS client only for a share (DRA: ShareConfig).
    if (r.mps() && !r.fractional()) {
      return bad(fmt::format(
          "annotation {}: mps is for a pod asking for tessera.io/gpu-share (a whole GPU is the "
          "pod's own; with DRA, a ShareConfig's sharing asks MPS for whole GPUs)",
          kSharingAnnotation));
    }
  }
  if (std::string t = annotation(kTrialAnnotation); !t.empty()) {
    std::optional<double> s = core::ParseDuration(t);
    if (!s || *s < 1 || *s > 7 * 86400) {
      return bad(fmt::format(
          "annotation {}: expected a duration from 1s to 7d such as 2m or 90s, got \"{}\"",
          kTrialAnnotation, t));
    }
    d.trial_s = std::ceil(*s);
  }
  if (std::string p = annotation(kPreemptibleAnnotation); !p.empty()) {
    if (p != "true" && p != "false") {
      return bad(fmt::format("annotation {}: expected true or false", kPreemptibleAnnotation));
    }
    r.preemptible = p == "true";
  }
  d.pod_group = StringAt(pod, {"metadata", "labels", kPodGroupLabel});
  if (std::string g = annotation(kGangAnnotation); !g.empty()) {
    std::string size = annotation(kGangSizeAnnotation);
    int n = 0;
    auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), n);
    if (ec != std::errc() || end != size.data() + size.size() || n < 1 || n > 10000) {
      return bad(fmt::format("annotation {}: expected 1..10000 with {}", kGangSizeAnnotation,
                             kGangAnnotation));
    }
    r.gang = ns + "/" + g;
    r.gang_size = n;
  }
  if (std::string err = core::ValidateRequest(r); !err.empty()) return bad(err);
  d.kind = PodKindOf(pod);
  d.kind.shape = PodShape(r, d.share_auto, memory_auto, memory_mib);
  return d;
}

sched::RunKind PodKindOf(const json& pod) {
  sched::RunKind k;
  k.user = StringAt(pod, {"metadata", "namespace"});
  if (k.user.empty()) k.user = "default";
  k.name = StringAt(pod, {"metadata", "labels", "batch.kubernetes.io/job-name"});
  if (k.name.empty()) k.name = StringAt(pod, {"metadata", "labels", "job-name"});
  if (const json* owners = FieldAt(pod, {"metadata", "ownerReferences"});
      k.name.empty() && owners && owners->is_array()) {
    for (const json& o : *owners) {
      if (o.is_object() && o.value("controller", false) && o.value("name", json()).is_string()) {
        k.name = o.value("kind", std::string()) + "/" + o["name"].get<std::string>();
      }
    }
  }
  if (const json* cs = FieldAt(pod, {"spec", "containers"}); cs && cs->is_array() && !cs->empty()) {
    for (const char* part : {"command", "args"}) {
      const json* v = FieldAt((*cs)[0], {part});
      if (!v || !v->is_array()) continue;
      for (const json& a : *v)
        if (a.is_string()) k.command.push_back(a.get<std::string>());
    }
  }
  if (const json* dl = FieldAt(pod, {"spec", "activeDeadlineSeconds"}); dl && dl->is_number())
    k.max_runtime_s = std::max(0.0, dl->get<double>());
  return k;
}

bool AsksDraClaims(const json& pod) {
  const json* claims = FieldAt(pod, {"spec", "resourceClaims"});
  return claims && claims->is_array() && !claims->empty();
}

}  // namespace tessera::extender
