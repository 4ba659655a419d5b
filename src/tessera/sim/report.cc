#include "tessera/sim/report.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "fmt/format.h"

namespace tessera::sim {
namespace {

// Labels in first-appearance order.
template <typename R>
std::vector<std::string> Labels(const std::vector<R>& runs) {
  std::vector<std::string> out;
  for (const R& r : runs) {
    if (std::find(out.begin(), out.end(), r.label) == out.end()) out.push_back(r.label);
  }
  return out;
}

// CSV field: quoted when it holds a comma, quote or newline.
std::string Field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Num(double v) {
  if (std::abs(v) >= 1e6 || (std::abs(v) < 1e-3 && v != 0)) return fmt::format("{:.3g}", v);
  std::string s = fmt::format("{:.3f}", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// "42 s", "3.5 min", "2.1 h", "4.0 d".
std::string HumanSeconds(double s) {
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  if (s < 172800) return fmt::format("{:.1f} h", s / 3600);
  return fmt::format("{:.1f} d", s / 86400);
}

// Size classes (GpuSizeClass) smallest first.
std::vector<std::string> SizeOrder(const std::set<std::string>& present) {
  std::vector<std::string> out;
  for (const char* k : kGpuSizeClasses) {
    if (present.contains(k)) out.emplace_back(k);
  }
  return out;
}

}  // namespace

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<InflationSummary> SummarizeInflation(const std::vector<InflationResult>& runs) {
  std::vector<InflationSummary> out;
  for (const std::string& label : Labels(runs)) {
    InflationSummary s;
    s.label = label;
    std::vector<double> allocs;
    for (const InflationResult& r : runs) {
      if (r.label != label) continue;
      ++s.runs;
      allocs.push_back(r.final.allocated);
      s.unallocated_gpus += r.final.unallocated_gpus;
      s.fragmented_gpus += r.final.fragmented_gpus;
      s.fragmentation_ratio += r.final.fragmentation_ratio();
      s.pods_arrived += static_cast<double>(r.final.pods_arrived);
      s.pods_failed += static_cast<double>(r.final.pods_failed);
      s.seconds += r.seconds;
      for (const auto& [kind, n] : r.arrived_by_kind)
        s.by_kind[kind].first += static_cast<double>(n);
      for (const auto& [kind, n] : r.failed_by_kind)
        s.by_kind[kind].second += static_cast<double>(n);
      if (s.curve.size() < r.curve.size()) {
        s.curve.resize(r.curve.size(), 0);
        s.arrived.resize(r.curve.size(), 0);
      }
      if (s.frag_curve.size() < r.curve.size()) s.frag_curve.resize(r.curve.size(), 0);
      for (size_t i = 0; i < r.curve.size(); ++i) {
        s.curve[i] += r.curve[i].allocated;
        s.frag_curve[i] += r.curve[i].fragmented_gpus;
        s.arrived[i] = r.curve[i].arrived;
      }
    }
    double n = s.runs;
    for (double a : allocs) s.allocated += a / n;
    if (allocs.size() > 1) {
      double ss = 0;
      for (double a : allocs) ss += (a - s.allocated) * (a - s.allocated);
      s.allocated_sd = std::sqrt(ss / (n - 1));
    }
    s.unallocated_gpus /= n;
    s.fragmented_gpus /= n;
    s.fragmentation_ratio /= n;
    for (double& f : s.frag_curve) f /= n;
    s.pods_arrived /= n;
    s.pods_failed /= n;
    for (auto& [kind, v] : s.by_kind) v = {v.first / n, v.second / n};
    for (double& c : s.curve) c /= n;
    out.push_back(std::move(s));
  }
  return out;
}

std::string InflationCurveCsv(const std::vector<InflationResult>& runs) {
  std::string out =
      "policy,seed,arrived_ratio,allocated_ratio,unallocated_gpus,fragmented_gpus,"
      "fragmentation_ratio,pods_arrived,pods_failed\n";
  for (const InflationResult& r : runs) {
    for (const InflationPoint& p : r.curve) {
      out += fmt::format("{},{},{:.4f},{:.6f},{:.3f},{:.3f},{:.6f},{},{}\n", Field(r.label), r.seed,
                         p.arrived, p.allocated, p.unallocated_gpus, p.fragmented_gpus,
                         p.fragmentation_ratio(), p.pods_arrived, p.pods_failed);
    }
  }
  return out;
}

std::string InflationRunsCsv(const std::vector<InflationResult>& runs) {
  std::string out =
      "policy,seed,gpu_capacity,arrived_ratio,allocated_ratio,unallocated_gpus,"
      "fragmented_gpus,fragmentation_ratio,pods_arrived,pods_failed\n";
  for (const InflationResult& r : runs) {
    const InflationPoint& p = r.final;
    out +=
        fmt::format("{},{},{},{:.6f},{:.6f},{:.3f},{:.3f},{:.6f},{},{}\n", Field(r.label), r.seed,
                    r.capacity_milli / 1000.0, p.arrived, p.allocated, p.unallocated_gpus,
                    p.fragmented_gpus, p.fragmentation_ratio(), p.pods_arrived, p.pods_failed);
  }
  return out;
}

std::string InflationFailedCsv(const std::vector<InflationResult>& runs) {
  std::string out = "policy,seed,kind,arrived,failed\n";
  for (const InflationResult& r : runs) {
    for (const auto& [kind, n] : r.arrived_by_kind) {
      auto f = r.failed_by_kind.find(kind);
      out += fmt::format("{},{},{},{},{}\n", Field(r.label), r.seed, kind, n,
                         f == r.failed_by_kind.end() ? 0 : f->second);
    }
  }
  return out;
}

std::string ReplaySeriesCsv(const std::vector<ReplayResult>& runs) {
  std::string out = "policy,seed,window,time,allocated_ratio,fragmented_gpus,queued,running\n";
  for (const ReplayResult& r : runs) {
    for (auto [window, series] : {std::pair{"busy", &r.series}, std::pair{"whole", &r.whole}}) {
      for (const ReplaySample& p : *series) {
        out += fmt::format("{},{},{},{:.3f},{:.6f},{:.3f},{},{}\n", Field(r.label), r.seed, window,
                           p.time, p.allocated, p.fragmented_gpus, p.queued, p.running);
      }
    }
  }
  return out;
}

std::string ReplayWaitsCsv(const std::vector<ReplayResult>& runs) {
  std::string out =
      "policy,seed,size,jobs,wait_mean_s,wait_p50_s,wait_p95_s,wait_p99_s,wait_max_s\n";
  for (const ReplayResult& r : runs) {
    auto row = [&](const std::string& size, const Distribution& d) {
      out += fmt::format("{},{},{},{},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f}\n", Field(r.label), r.seed,
                         size, d.count, d.mean, d.p50, d.p95, d.p99, d.max);
    };
    row("all", r.wait);
    std::set<std::string> sizes;
    for (const auto& [k, d] : r.wait_by_gpus) sizes.insert(k);
    for (const std::string& k : SizeOrder(sizes)) row(k, r.wait_by_gpus.at(k));
  }
  return out;
}

std::string ReplayRunsCsv(const std::vector<ReplayResult>& runs) {
  std::string out =
      "policy,seed,jobs,finished,never_started,queued_at_end,preemptions,busy_start_s,busy_end_s,"
      "busy_mean_allocated_ratio,peak_allocated_ratio,mean_allocated_ratio,busy_mean_queued,"
      "peak_queued,wait_mean_s,wait_p50_s,wait_p95_s,wait_p99_s,wait_max_s,jct_mean_s,jct_p50_s,"
      "jct_p95_s,jct_p99_s\n";
  for (const ReplayResult& r : runs) {
    out += fmt::format(
        "{},{},{},{},{},{},{},{:.3f},{:.3f},{:.6f},{:.6f},{:.6f},{:.3f},{},{:.1f},{:.1f},{:.1f},"
        "{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f}\n",
        Field(r.label), r.seed, r.jobs, r.finished, r.never_started, r.queued_at_end, r.preemptions,
        r.busy_start, r.busy_end, r.busy_mean_allocated, r.peak_allocated, r.mean_allocated,
        r.busy_mean_queued, r.peak_queued, r.wait.mean, r.wait.p50, r.wait.p95, r.wait.p99,
        r.wait.max, r.jct.mean, r.jct.p50, r.jct.p95, r.jct.p99);
  }
  return out;
}

AxisTicks RoundTicks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 2.5, 5.0}) {
    if (m * mag >= raw * (1 - 1e-9)) {
      step = m * mag;
      break;
    }
  }
  AxisTicks t;
  t.step = step;
  t.lo = std::floor(lo / step + 1e-9) * step;
  t.hi = std::ceil(hi / step - 1e-9) * step;
  if (t.hi <= t.lo) t.hi = t.lo + step;
  return t;
}

std::string SvgLineChart(const std::string& title, const std::string& x_label,
                         const std::string& y_label, const std::vector<PlotSeries>& series,
                         const ChartBounds& bounds) {
  const double W = 760, H = 400, L = 78, R = 170, T = 36, B = 50;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const PlotSeries& s : series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 - x0 < 1e-12) x1 = x0 + 1;
  if (y1 - y0 < 1e-12) y1 = y0 + 1;
  AxisTicks xt = RoundTicks(x0, x1), yt = RoundTicks(y0, y1);
  // Never past what the values can be: a clamped end is a tick of its own.
  auto clamp = [](AxisTicks& t, double min, double max) {
    if (!std::isnan(min) && t.lo < min) t.lo = min;
    if (!std::isnan(max) && t.hi > max) t.hi = max;
  };
  clamp(xt, bounds.x_min, std::numeric_limits<double>::quiet_NaN());
  clamp(yt, bounds.y_min, bounds.y_max);
  // The x axis spans the data exactly (time, arrived load), its round ticks within.
  xt.lo = std::max(xt.lo, x0);
  xt.hi = std::min(xt.hi, x1);
  x0 = xt.lo, x1 = xt.hi, y0 = yt.lo, y1 = yt.hi;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\" role=\"img\" aria-label=\"{}\">\n",
      W, H, W, H, HtmlEscape(title));
  svg += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", L,
                     HtmlEscape(title));
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", L, T,
      W - L - R, H - T - B);
  // Ticks at the multiples of the step within the axis (never an odd end); a label is skipped
  // when it would crowd the one before.
  auto ticks = [](const AxisTicks& t) {
    std::vector<double> v;
    const double first = std::ceil(t.lo / t.step - 1e-9);
    for (double k = first; k * t.step <= t.hi + t.step * 1e-9; k += 1) v.push_back(k * t.step);
    return v;
  };
  double last = -1e300;
  for (double xv : ticks(xt)) {
    svg +=
        fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>",
                    px(xv), T, H - B);
    if (px(xv) - last >= 40) {
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>", px(xv),
                         H - B + 16, Num(std::abs(xv) < 1e-12 ? 0 : xv));
      last = px(xv);
    }
    svg += "\n";
  }
  last = 1e300;
  for (double yv : ticks(yt)) {
    svg +=
        fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#eee\"/>",
                    py(yv), L, W - R);
    if (last - py(yv) >= 14) {
      svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>", L - 6,
                         py(yv) + 4, Num(std::abs(yv) < 1e-12 ? 0 : yv));
      last = py(yv);
    }
    svg += "\n";
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (L + W - R) / 2,
                     H - 12, HtmlEscape(x_label));
  svg += fmt::format(
      "<text x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">"
      "{}</text>\n",
      (T + H - B) / 2, (T + H - B) / 2, HtmlEscape(y_label));
  // Colours and dash patterns cycle at different lengths: series k and k+10 differ in dashes.
  static const char* kDashes[] = {"", "8 4", "2 3", "10 3 2 3", "4 4", "12 4 2 4 2 4"};
  // The clip's id must be unique in the page that holds several charts: from the title.
  const std::string clip = fmt::format("clip-{:x}", std::hash<std::string>{}(title + y_label));
  svg += fmt::format(
      "<clipPath id=\"{}\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>"
      "</clipPath>\n",
      clip, L, T, W - L - R, H - T - B);
  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const char* color = kColors[k % std::size(kColors)];
    const char* dash = kDashes[k % std::size(kDashes)];
    std::string dash_attr = *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "";
    std::string points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      points += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
    }
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} clip-path=\"url(#{})\" "
        "points=\"{}\"/>\n",
        color, dash_attr, clip, points);
    double ly = T + 10 + 18 * static_cast<double>(k);
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"{4}/>"
        "<text x=\"{5}\" y=\"{6}\">{7}</text>\n",
        W - R + 12, ly, W - R + 40, color, dash_attr, W - R + 46, ly + 4, HtmlEscape(s.name));
  }
  svg += "</svg>\n";
  return svg;
}

std::vector<std::pair<std::string, std::string>> ReplayCharts(
    const std::vector<ReplayResult>& replay) {
  std::vector<std::pair<std::string, std::string>> out;
  if (replay.empty()) return out;
  const bool seeds = replay.size() > Labels(replay).size();
  auto name = [&](const ReplayResult& r) {
    return seeds ? fmt::format("{} #{}", r.label, r.seed) : r.label;
  };
  // The time unit that suits the span shown.
  auto unit_of = [](double span) -> std::pair<double, const char*> {
    if (span <= 600) return {1, "seconds"};
    if (span <= 36000) return {60, "minutes"};
    if (span <= 10 * 86400) return {3600, "hours"};
    return {86400, "days"};
  };
  auto chart = [&](const std::string& slug, const std::string& title, const std::string& y_label,
                   bool whole, const ChartBounds& bounds, auto value) {
    std::vector<PlotSeries> series;
    double span = 0;
    for (const ReplayResult& r : replay) {
      const auto& pts = whole ? r.whole : r.series;
      if (!pts.empty()) span = std::max(span, pts.back().time - pts.front().time);
    }
    auto [unit, unit_name] = unit_of(span);
    for (const ReplayResult& r : replay) {
      PlotSeries p{name(r), {}, {}};
      const auto& pts = whole ? r.whole : r.series;
      for (const ReplaySample& s : pts) {
        p.x.push_back((s.time - r.busy_start) / unit);
        p.y.push_back(value(s));
      }
      series.push_back(std::move(p));
    }
    out.push_back({slug, SvgLineChart(title, std::string(unit_name) + " since the first arrival",
                                      y_label, series, bounds)});
  };
  const ChartBounds percent{.y_min = 0, .y_max = 100, .x_min = 0};
  const ChartBounds count{.y_min = 0, .x_min = 0};
  chart("allocation", "GPU allocation in the busy period", "GPUs allocated, % of capacity", false,
        percent, [](const ReplaySample& s) { return 100 * s.allocated; });
  // How busy the GPUs were, where the trace says how busy its jobs kept them.
  if (std::any_of(replay.begin(), replay.end(),
                  [](const ReplayResult& r) { return r.utilization_known; })) {
    chart("busy", "GPU busy time in the busy period (modelled from the jobs' utilization)",
          "GPU busy, % of capacity", false, percent,
          [](const ReplaySample& s) { return 100 * s.busy; });
  }
  chart("queue", "Queue length in the busy period", "jobs waiting", false, count,
        [](const ReplaySample& s) { return double(s.queued); });
  chart("running", "Jobs running in the busy period", "jobs running", false, count,
        [](const ReplaySample& s) { return double(s.running); });
  chart("fragmentation", "Fragmentation in the busy period", "fragmented GPUs", false, count,
        [](const ReplaySample& s) { return s.fragmented_gpus; });
  // How long jobs waited: the share of started jobs that waited at most so long.
  {
    std::vector<PlotSeries> series;
    double longest = 0;
    for (const ReplayResult& r : replay) longest = std::max(longest, r.wait.max);
    auto [unit, unit_name] = unit_of(longest);
    for (const ReplayResult& r : replay) {
      PlotSeries p{name(r), {}, {}};
      const std::vector<double>& w = r.waits;
      // At most ~400 steps: every distinct wait where the list is short, else even ranks.
      const size_t n = w.size(), stride = std::max<size_t>(1, n / 400);
      for (size_t i = 0; i < n;) {
        size_t j = std::min(n, i + stride) - 1;
        while (j + 1 < n && w[j + 1] == w[j]) ++j;  // the whole run of equal waits
        p.x.push_back(w[j] / unit);
        p.y.push_back(100.0 * double(j + 1) / double(n));
        i = j + 1;
      }
      series.push_back(std::move(p));
    }
    // The y axis starts near the share that did not wait at all, where the lines part.
    out.push_back({"waits", SvgLineChart("Waits: share of started jobs that waited at most so long",
                                         std::string("wait, ") + unit_name, "% of started jobs",
                                         series, {.y_min = 0, .y_max = 100, .x_min = 0})});
  }
  chart("allocation-whole", "GPU allocation over the whole replay", "GPUs allocated, % of capacity",
        true, percent, [](const ReplaySample& s) { return 100 * s.allocated; });
  return out;
}

std::string HtmlReport(const std::string& title, const std::string& subtitle,
                       const std::vector<InflationResult>& inflation,
                       const std::vector<ReplayResult>& replay) {
  std::string h = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" +
                  HtmlEscape(title) +
                  "</title>\n<style>body{font-family:sans-serif;margin:24px;max-width:1000px}"
                  "table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;"
                  "padding:4px 10px;text-align:right}th{background:#f4f4f4}td:first-child,"
                  "th:first-child{text-align:left}.note{color:#555}</style></head><body>\n";
  h += "<h1>" + HtmlEscape(title) + "</h1>\n<p class=\"note\">" + HtmlEscape(subtitle) + "</p>\n";
  if (!inflation.empty()) {
    auto summaries = SummarizeInflation(inflation);
    h += "<h2>Workload inflation</h2>\n<table><tr><th>policy</th><th>runs</th>"
         "<th>GPU allocation (mean)</th><th>s.d.</th><th>unallocated GPUs</th>"
         "<th>fragmented GPUs</th><th>fragmentation ratio</th><th>pods arrived</th>"
         "<th>pods failed</th></tr>\n";
    for (const InflationSummary& s : summaries) {
      h += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{:.2f}%</td><td>{:.2f}</td><td>{:.1f}</td>"
          "<td>{:.1f}</td><td>{:.1f}%</td><td>{:.0f}</td><td>{:.0f}</td></tr>\n",
          HtmlEscape(s.label), s.runs, 100 * s.allocated, 100 * s.allocated_sd, s.unallocated_gpus,
          s.fragmented_gpus, 100 * s.fragmentation_ratio, s.pods_arrived, s.pods_failed);
    }
    h += "</table>\n";
    std::vector<PlotSeries> curves;
    for (const InflationSummary& s : summaries) {
      PlotSeries p{s.label, {}, {}};
      for (size_t i = 0; i < s.curve.size(); ++i) {
        p.x.push_back(100 * s.arrived[i]);
        p.y.push_back(100 * s.curve[i]);
      }
      curves.push_back(std::move(p));
    }
    const ChartBounds percent{.y_min = 0, .y_max = 100, .x_min = 0};
    h += SvgLineChart("GPU allocation ratio vs arrived workload (mean over seeds)",
                      "arrived GPU demand, % of capacity", "GPUs allocated, % of capacity", curves,
                      percent);
    // Zoom on the last stretch, where the policies differ.
    std::vector<PlotSeries> zoom;
    for (const PlotSeries& p : curves) {
      PlotSeries z{p.name, {}, {}};
      for (size_t i = 0; i < p.x.size(); ++i) {
        if (p.x[i] >= 80) {
          z.x.push_back(p.x[i]);
          z.y.push_back(p.y[i]);
        }
      }
      zoom.push_back(std::move(z));
    }
    h += SvgLineChart("The same, from 80% arrived", "arrived GPU demand, % of capacity",
                      "GPUs allocated, % of capacity", zoom, percent);
    std::vector<PlotSeries> frag;
    for (const InflationSummary& s : summaries) {
      PlotSeries p{s.label, {}, {}};
      for (size_t i = 0; i < s.frag_curve.size(); ++i) {
        p.x.push_back(100 * s.arrived[i]);
        p.y.push_back(s.frag_curve[i]);
      }
      frag.push_back(std::move(p));
    }
    h += SvgLineChart("Fragmented GPUs vs arrived workload (mean over seeds)",
                      "arrived GPU demand, % of capacity", "fragmented GPUs", frag,
                      {.y_min = 0, .x_min = 0});
    h += "<h3>Failed pods by kind (mean per run)</h3>\n<table><tr><th>policy</th>";
    std::set<std::string> kinds;
    for (const InflationSummary& s : summaries) {
      for (const auto& [k, v] : s.by_kind) kinds.insert(k);
    }
    for (const std::string& k : kinds) h += "<th>" + HtmlEscape(k) + "</th>";
    h += "</tr>\n";
    for (const InflationSummary& s : summaries) {
      h += "<tr><td>" + HtmlEscape(s.label) + "</td>";
      for (const std::string& k : kinds) {
        auto it = s.by_kind.find(k);
        h += it == s.by_kind.end()
                 ? "<td>-</td>"
                 : fmt::format("<td>{:.1f} of {:.1f}</td>", it->second.second, it->second.first);
      }
      h += "</tr>\n";
    }
    h += "</table>\n";
  }
  if (!replay.empty()) {
    h +=
        "<h2>Time-based replay</h2>\n<p class=\"note\">The busy period runs from the first arrival "
        "until the last job started; its allocation and queue are time-weighted means over it. "
        "The plots show it and a tenth of its length after it, where the queue has drained.</p>\n"
        "<table><tr><th>policy</th><th>seed</th><th>jobs</th><th>finished</th>"
        "<th>never started</th><th>preemptions</th><th>busy period</th>"
        "<th>allocation (busy mean)</th><th>allocation (peak)</th><th>queue (busy mean)</th>"
        "<th>queue (peak)</th><th>wait mean</th><th>wait p50</th><th>wait p95</th>"
        "<th>wait p99</th><th>JCT mean</th><th>JCT p95</th></tr>\n";
    for (const ReplayResult& r : replay) {
      h += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
          "<td>{:.2f}%</td><td>{:.2f}%</td><td>{:.1f}</td><td>{}</td><td>{:.0f} s</td>"
          "<td>{:.0f} s</td><td>{:.0f} s</td><td>{:.0f} s</td><td>{:.0f} s</td>"
          "<td>{:.0f} s</td></tr>\n",
          HtmlEscape(r.label), r.seed, r.jobs, r.finished, r.never_started, r.preemptions,
          HumanSeconds(r.busy_end - r.busy_start), 100 * r.busy_mean_allocated,
          100 * r.peak_allocated, r.busy_mean_queued, r.peak_queued, r.wait.mean, r.wait.p50,
          r.wait.p95, r.wait.p99, r.jct.mean, r.jct.p95);
    }
    h += "</table>\n";
    // Waits by job size: the largest jobs' longest wait says whether any class starves.
    std::set<std::string> sizes;
    for (const ReplayResult& r : replay) {
      for (const auto& [k, d] : r.wait_by_gpus) sizes.insert(k);
    }
    h += "<h3>Waits by job size (mean / p95 / longest)</h3>\n<table><tr><th>policy</th>"
         "<th>seed</th>";
    for (const std::string& k : SizeOrder(sizes))
      h += "<th>" + HtmlEscape(k) + (k == "cpu" || k == "share" ? "" : " GPU") + "</th>";
    h += "</tr>\n";
    for (const ReplayResult& r : replay) {
      h += fmt::format("<tr><td>{}</td><td>{}</td>", HtmlEscape(r.label), r.seed);
      for (const std::string& k : SizeOrder(sizes)) {
        auto it = r.wait_by_gpus.find(k);
        h += it == r.wait_by_gpus.end()
                 ? "<td>-</td>"
                 : fmt::format("<td>{} / {} / {} ({} jobs)</td>", HumanSeconds(it->second.mean),
                               HumanSeconds(it->second.p95), HumanSeconds(it->second.max),
                               it->second.count);
      }
      h += "</tr>\n";
    }
    h += "</table>\n";
    for (const auto& [slug, svg] : ReplayCharts(replay)) h += svg;
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace tessera::sim
