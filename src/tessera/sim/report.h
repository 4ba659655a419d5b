#pragma once
// Reports of simulator runs: per-policy summaries over seeds, CSV for every series (fixed
// formatting, so equal runs give byte-identical files) and a self-contained HTML report with SVG
// plots.

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tessera/sim/inflation.h"
#include "tessera/sim/replay.h"

namespace tessera::sim {

struct InflationSummary {
  std::string label;
  int runs = 0;
  double allocated = 0, allocated_sd = 0;  // final GPU allocation ratio, mean and sample s.d.
  double unallocated_gpus = 0;
  double fragmented_gpus = 0;
  double fragmentation_ratio = 0;  // fragmented / unallocated, mean
  double pods_arrived = 0, pods_failed = 0;
  std::map<std::string, std::pair<double, double>> by_kind;  // kind -> (arrived, failed), means
  std::vector<double> arrived, curve;                        // mean allocation ratio per step
  std::vector<double> frag_curve;                            // mean fragmented GPUs per step
  double seconds = 0;                                        // summed wall time
};

// One summary per label, in the order labels first appear.
std::vector<InflationSummary> SummarizeInflation(const std::vector<InflationResult>& runs);

std::string InflationCurveCsv(const std::vector<InflationResult>& runs);
std::string InflationRunsCsv(const std::vector<InflationResult>& runs);
std::string InflationFailedCsv(const std::vector<InflationResult>& runs);
std::string ReplaySeriesCsv(const std::vector<ReplayResult>& runs);
std::string ReplayRunsCsv(const std::vector<ReplayResult>& runs);
// Waits per run, all jobs and by size class (GpuSizeClass).
std::string ReplayWaitsCsv(const std::vector<ReplayResult>& runs);

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;
};
// What the values can be: the axes never run past these (NaN: unbounded), e.g. 0..100 for a
// percentage.
struct ChartBounds {
  double y_min = 0, y_max = std::numeric_limits<double>::quiet_NaN();
  double x_min = std::numeric_limits<double>::quiet_NaN();
};
// A line chart as inline SVG: round ticks (1, 2, 2.5 or 5 times a power of ten) over the data's
// range, clamped to `bounds`; each series its own colour and dash pattern, so lines that coincide
// stay told apart.
std::string SvgLineChart(const std::string& title, const std::string& x_label,
                         const std::string& y_label, const std::vector<PlotSeries>& series,
                         const ChartBounds& bounds = {});

// Round ticks for an axis over [lo, hi]: the step and the first and last tick (the axis' ends).
struct AxisTicks {
  double lo = 0, hi = 1, step = 0.2;
};
AxisTicks RoundTicks(double lo, double hi, int target = 5);

// The replay's plots as (name, inline SVG): allocation, queue, running, fragmentation (over the
// busy period), busy (how busy the GPUs were, where the trace says how busy its jobs kept them),
// waits (their distribution), allocation-whole (over the whole replay).
std::vector<std::pair<std::string, std::string>> ReplayCharts(
    const std::vector<ReplayResult>& replay);

// The whole report: summary tables and plots. `subtitle` says what ran (inputs, seeds).
std::string HtmlReport(const std::string& title, const std::string& subtitle,
                       const std::vector<InflationResult>& inflation,
                       const std::vector<ReplayResult>& replay);

std::string HtmlEscape(const std::string& s);

}  // namespace tessera::sim
