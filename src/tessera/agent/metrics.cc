#include "tessera/agent/metrics.h"

#include <unistd.h>

#include <algorithm>

#include "fmt/format.h"
#include "tessera/devices/dcgm.h"
#include "tessera/devices/mps_metrics.h"
#include "tessera/net/prometheus.h"
#include "tessera/shim/region.h"

namespace tessera::agent {
namespace {

using Labels = net::MetricsPage::Labels;
using Page = net::MetricsPage;

void AddHolder(Labels& l, const ContainerRef* c) {
  l.push_back({"container", c ? c->container : ""});
  l.push_back({"namespace", c ? c->pod_namespace : ""});
  l.push_back({"pod", c ? c->pod : ""});
}

// DCGM_FI_* series: dcgm-exporter's labels (modelName included), with the pod, namespace and
// container that hold the GPU (empty: none).
Labels DcgmGpuLabels(const std::string& host, const core::Gpu& g, const ContainerRef* c) {
  Labels l = devices::DcgmLabels(g, host);
  AddHolder(l, c);
  return l;
}

// Tessera's own GPU series: the labels every Tessera source gives a GPU (the server's and the Slurm
// exporter's too: gpu, uuid, model, hostname; docs/metrics.md), with the device node and holders.
// dcgm-exporter's capitalized keys stay on the DCGM_FI_* series alone.
Labels GpuLabels(const std::string& host, const core::Gpu& g, const ContainerRef* c) {
  Labels l = {{"gpu", std::to_string(g.index)},
              {"uuid", g.uuid},
              {"model", g.model},
              {"hostname", host},
              {"device", fmt::format("nvidia{}", g.minor.value_or(g.index))}};
  AddHolder(l, c);
  return l;
}

}  // namespace

std::string RenderMetrics(const std::string& hostname, const std::vector<GpuSample>& gpus,
                          const std::vector<ShareSample>& shares,
                          const AgentCountersSample& counters, bool virtual_gpus) {
  Page p;
  // One series per GPU with its first holder's pod labels (empty when nobody holds it), or, with
  // virtual_gpus, one per holder.
  auto per_holder = [&](const GpuSample& s, double value, auto labels) {
    if (s.holders.empty()) {
      p.Sample(labels(hostname, *s.gpu, nullptr), value);
      return;
    }
    if (!virtual_gpus) {
      p.Sample(labels(hostname, *s.gpu, &s.holders.front()), value);
      return;
    }
    for (const ContainerRef& c : s.holders) p.Sample(labels(hostname, *s.gpu, &c), value);
  };
  for (const devices::DcgmField& f : devices::DcgmFields()) {
    bool any = false;
    for (const GpuSample& s : gpus) any |= s.telemetry && f.value(*s.telemetry).has_value();
    if (!any) continue;
    p.Family(f.name, f.type, f.help);
    for (const GpuSample& s : gpus) {
      if (!s.telemetry) continue;
      if (auto v = f.value(*s.telemetry)) per_holder(s, *v, DcgmGpuLabels);
    }
  }
  p.Family("tessera_gpu_healthy", "gauge",
           "1 while the GPU is healthy (advertised to the kubelet as Healthy), else 0.");
  for (const GpuSample& s : gpus) per_holder(s, s.health.healthy ? 1 : 0, GpuLabels);
  if (std::any_of(gpus.begin(), gpus.end(), [](const GpuSample& s) { return s.mps; })) {
    using devices::kMpsDaemonUp, devices::kMpsDaemonDeaths, devices::kMpsServerFaults;
    p.Family(kMpsDaemonUp.name, kMpsDaemonUp.type, kMpsDaemonUp.help);
    for (const GpuSample& s : gpus) {
      if (s.mps) p.Sample(GpuLabels(hostname, *s.gpu, nullptr), s.mps->up ? 1 : 0);
    }
    p.Family(kMpsDaemonDeaths.name, kMpsDaemonDeaths.type, kMpsDaemonDeaths.help);
    for (const GpuSample& s : gpus) {
      if (s.mps) p.Sample(GpuLabels(hostname, *s.gpu, nullptr), s.mps->deaths);
    }
    p.Family(kMpsServerFaults.name, kMpsServerFaults.type, kMpsServerFaults.help);
    for (const GpuSample& s : gpus) {
      if (s.mps) p.Sample(GpuLabels(hostname, *s.gpu, nullptr), s.mps->server_faults);
    }
  }
  p.Family("tessera_gpu_xid_errors_total", "counter",
           "XID errors seen on the GPU since the agent started, ignored ones included.");
  for (const GpuSample& s : gpus) {
    p.Sample(GpuLabels(hostname, *s.gpu, nullptr), static_cast<double>(s.health.xid_count));
  }
  p.Family("tessera_gpu_health_changes_total", "counter",
           "Times the GPU went from healthy to unhealthy or back since the agent started.");
  for (const GpuSample& s : gpus) {
    p.Sample(GpuLabels(hostname, *s.gpu, nullptr), static_cast<double>(s.health_changes));
  }
  auto share_labels = [&](const ShareSample& s, size_t i) {
    Labels l = {
        {"allocation", s.allocation.id}, {"uuid", s.allocation.gpus[i]}, {"hostname", hostname}};
    l.push_back({"container", s.holder ? s.holder->container : ""});
    l.push_back({"namespace", s.holder ? s.holder->pod_namespace : ""});
    l.push_back({"pod", s.holder ? s.holder->pod : ""});
    return l;
  };
  p.Family("tessera_share_memory_used_bytes", "gauge",
           "GPU memory in use by a fractional allocation's processes, from its shared region.");
  for (const ShareSample& s : shares) {
    for (size_t i = 0; i < s.used.size() && i < s.allocation.gpus.size(); ++i) {
      p.Sample(share_labels(s, i), static_cast<double>(s.used[i]));
    }
  }
  p.Family("tessera_share_memory_limit_bytes", "gauge",
           "GPU memory limit of a fractional allocation (0: none).");
  for (const ShareSample& s : shares) {
    for (size_t i = 0; i < s.limit.size() && i < s.allocation.gpus.size(); ++i) {
      p.Sample(share_labels(s, i), static_cast<double>(s.limit[i]));
    }
  }
  // Their ratio is a namespace's GPU efficiency (what `tessera eff` says of one job).
  p.Family("tessera_pod_gpu_given_seconds_total", "counter",
           "GPU-seconds ended pods were given (GPUs, or a share of them, times their life), by "
           "namespace and resource, since the agent started.");
  for (const auto& [key, seconds] : counters.ended_gpu_seconds) {
    p.Sample({{"namespace", key.first}, {"resource", key.second}, {"hostname", hostname}},
             seconds.first);
  }
  p.Family("tessera_pod_gpu_busy_seconds_total", "counter",
           "GPU-seconds ended pods kept their GPUs busy (a share: the arbiter's charge; a whole "
           "GPU: its utilization as sampled), by namespace and resource, since the agent started.");
  for (const auto& [key, seconds] : counters.ended_gpu_seconds) {
    p.Sample({{"namespace", key.first}, {"resource", key.second}, {"hostname", hostname}},
             seconds.second);
  }
  p.Family("tessera_pod_gpu_held_back_seconds_total", "counter",
           "GPU-seconds the launches of ended time-sliced share pods waited for their GPU (other "
           "pods' slices: they wanted more than they got), by namespace and resource, since the "
           "agent started.");
  for (const auto& [key, seconds] : counters.ended_held_back_seconds) {
    p.Sample({{"namespace", key.first}, {"resource", key.second}, {"hostname", hostname}}, seconds);
  }
  p.Family("tessera_agent_allocations", "gauge", "Allocations the agent holds, by resource.");
  p.Sample({{"resource", kGpuResource}}, static_cast<double>(counters.whole_allocations));
  p.Sample({{"resource", kShareResource}}, static_cast<double>(counters.share_allocations));
  p.Family("tessera_agent_allocate_requests_total", "counter",
           "Allocate calls from the kubelet, by result.");
  p.Sample({{"result", "ok"}}, static_cast<double>(counters.allocations));
  p.Sample({{"result", "error"}}, static_cast<double>(counters.allocation_errors));
  p.Family("tessera_agent_preferred_allocation_requests_total", "counter",
           "GetPreferredAllocation calls from the kubelet.");
  p.Sample({}, static_cast<double>(counters.preferred));
  p.Family("tessera_agent_registrations_total", "counter",
           "Successful registrations with the kubelet (one per resource and kubelet start).");
  p.Sample({}, static_cast<double>(counters.registrations));
  p.Family("tessera_agent_pod_resources_errors_total", "counter",
           "PodResources List calls that failed.");
  p.Sample({}, static_cast<double>(counters.pod_resources_errors));
  p.Family("tessera_agent_api_server_configured", "gauge",
           "1 when the agent has an API server to label its node and read the extender's choices.");
  p.Sample({}, counters.api_server_configured ? 1 : 0);
  p.Family("tessera_agent_api_server_up", "gauge",
           "1 when its watches of the API server (its node, its pods) are synced and their last "
           "list or watch succeeded; 0 also without an API server (see _configured).");
  p.Sample({}, counters.api_server_up ? 1 : 0);
  // Without an API server there are no labels to keep current: no sample rather than a 0 that
  // reads as a failure.
  if (counters.api_server_configured) {
    p.Family("tessera_agent_node_labels_current", "gauge",
             "1 when the last check of the node's labels and annotations succeeded.");
    p.Sample({}, counters.labels_current ? 1 : 0);
  }
  p.Family("tessera_agent_node_label_updates_total", "counter",
           "Merge patches that changed the node's labels or annotations.");
  p.Sample({}, static_cast<double>(counters.label_updates));
  p.Family("tessera_agent_node_label_errors_total", "counter",
           "Failed reads or writes of the node's labels.");
  p.Sample({}, static_cast<double>(counters.label_errors));
  p.Family("tessera_agent_pod_hints_total", "counter",
           "Lookups of the extender's GPU choice for an Allocate, by result.");
  p.Sample({{"result", "found"}}, static_cast<double>(counters.hints_found));
  p.Sample({{"result", "none"}}, static_cast<double>(counters.hints_none));
  p.Sample({{"result", "error"}}, static_cast<double>(counters.hint_errors));
  p.Family("tessera_agent_pod_allocated_marks_total", "counter",
           "Pods marked tessera.io/allocated, by result.");
  p.Sample({{"result", "ok"}}, static_cast<double>(counters.allocated_marks));
  p.Sample({{"result", "error"}}, static_cast<double>(counters.mark_errors));
  p.Family("tessera_agent_pod_gpu_use_writes_total", "counter",
           "Ended pods told what they used of their GPUs (tessera.io/gpu-use), by result.");
  p.Sample({{"result", "ok"}}, static_cast<double>(counters.use_marks));
  p.Sample({{"result", "error"}}, static_cast<double>(counters.use_errors));
  net::AddSelfMetrics(p, "agent");
  return p.Take();
}

bool ReadRegion(const std::string& path, std::vector<uint64_t>* used,
                std::vector<uint64_t>* limit) {
  // A pod's file: copied, never mapped (the pod can truncate it), and only the head.
  const auto d = shim::ReadRegionHead(path.c_str());
  if (d == nullptr) return false;
  const bool ok = d->device_count <= shim::kMaxDevices;
  if (ok) {
    used->clear();
    limit->clear();
    for (uint32_t i = 0; i < d->device_count; ++i) {
      used->push_back(d->used[i].load());
      limit->push_back(d->limit[i]);
    }
  }
  return ok;
}

}  // namespace tessera::agent
