#pragma once
// The MPS families that the agent's /metrics and the server's export alike, named and explained
// once (docs/metrics.md): each GPU shared by MPS, labelled as the exporter labels its GPUs.

namespace tessera::devices {

struct MetricFamily {
  const char* name;
  const char* type;
  const char* help;
};

inline constexpr MetricFamily kMpsDaemonUp{
    "tessera_gpu_mps_daemon_up", "gauge",
    "For a GPU shared by MPS: 1 when its control daemon answers, 0 when it is down (the GPU takes "
    "no work then: the agent advertises it Unhealthy)."};
inline constexpr MetricFamily kMpsDaemonDeaths{
    "tessera_gpu_mps_daemon_deaths_total", "counter",
    "For a GPU shared by MPS: times its control daemon was found gone (its clients lost their "
    "server; it was started again)."};
inline constexpr MetricFamily kMpsServerFaults{
    "tessera_gpu_mps_server_faults_total", "counter",
    "For a GPU shared by MPS: times one of its MPS servers ended while clients of it still ran (a "
    "fatal fault in one client ends its server and the other clients on it)."};

}  // namespace tessera::devices
