#pragma once
// Prometheus text exposition (format 0.0.4): a page of metric families, each a HELP and TYPE line
// and its samples, label values escaped. Shared by the node agent's and the extender's /metrics.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::net {

class MetricsPage {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Starts a family: `type` is counter, gauge or histogram.
  void Family(std::string_view name, std::string_view type, std::string_view help);
  // A sample of the current family; `suffix` names a histogram's _bucket, _sum or _count series.
  void Sample(const Labels& labels, double value, std::string_view suffix = "");
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
  std::string name_;
};

// A label value as the text format writes it: backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view v);

// What every Tessera component exports about itself: `tessera_build_info{component, version} 1`,
// and the process's own series as Prometheus' client libraries name them
// (process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_start_time_seconds, process_open_fds, process_max_fds), read from /proc; a reading /proc
// does not give is left out.
void AddSelfMetrics(MetricsPage& p, std::string_view component);

}  // namespace tessera::net
