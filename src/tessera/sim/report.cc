#include "tessera/sim/report.h"

#include <algorithm>
#include <cmath>
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
  std::string out = "policy,seed,time,allocated_ratio,fragmented_gpus,queued,running\n";
  for (const ReplayResult& r : runs) {
    for (const ReplaySample& p : r.series) {
      out += fmt::format("{},{},{:.1f},{:.6f},{:.3f},{},{}\n", Field(r.label), r.seed, p.time,
                         p.allocated, p.fragmented_gpus, p.queued, p.running);
    }
  }
  return out;
}

std::string ReplayRunsCsv(const std::vector<ReplayResult>& runs) {
  std::string out =
      "policy,seed,jobs,finished,never_started,queued_at_end,preemptions,"
      "mean_allocated_ratio,peak_allocated_ratio,wait_mean_s,wait_p50_s,wait_p95_s,wait_p99_s,wait_"
      "max_s,"
      "jct_mean_s,jct_p50_s,jct_p95_s,jct_p99_s\n";
  for (const ReplayResult& r : runs) {
    out += fmt::format(
        "{},{},{},{},{},{},{},{:.6f},{:.6f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},"
        "{:.1f},{:.1f}\n",
        Field(r.label), r.seed, r.jobs, r.finished, r.never_started, r.queued_at_end, r.preemptions,
        r.mean_allocated, r.peak_allocated, r.wait.mean, r.wait.p50, r.wait.p95, r.wait.p99,
        r.wait.max, r.jct.mean, r.jct.p50, r.jct.p95, r.jct.p99);
  }
  return out;
}

std::string SvgLineChart(const std::string& title, const std::string& x_label,
                         const std::string& y_label, const std::vector<PlotSeries>& series) {
  const double W = 760, H = 400, L = 70, R = 170, T = 36, B = 50;
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
  double pad = (y1 - y0) * 0.05;
  y0 -= pad;
  y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H, W, H);
  svg += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", L,
                     HtmlEscape(title));
  // Axes and ticks.
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", L, T,
      W - L - R, H - T - B);
  for (int i = 0; i <= 5; ++i) {
    double xv = x0 + (x1 - x0) * i / 5, yv = y0 + (y1 - y0) * i / 5;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        px(xv), T, H - B, H - B + 16, Num(xv));
    svg += fmt::format(
        "<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#eee\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        py(yv), L, W - R, L - 6, py(yv) + 4, Num(yv));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (L + W - R) / 2,
                     H - 12, HtmlEscape(x_label));
  svg += fmt::format(
      "<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">"
      "{}</text>\n",
      (T + H - B) / 2, (T + H - B) / 2, HtmlEscape(y_label));
  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const char* color = kColors[k % std::size(kColors)];
    std::string points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      points += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
    }
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                       color, points);
    double ly = T + 10 + 18 * static_cast<double>(k);
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/>"
        "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
        W - R + 12, ly, W - R + 32, color, W - R + 38, ly + 4, HtmlEscape(s.name));
  }
  svg += "</svg>\n";
  return svg;
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
    h += SvgLineChart("GPU allocation ratio vs arrived workload (mean over seeds)",
                      "arrived GPU demand, % of capacity", "GPUs allocated, % of capacity", curves);
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
                      "GPUs allocated, % of capacity", zoom);
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
                      "arrived GPU demand, % of capacity", "fragmented GPUs", frag);
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
    h += "<h2>Time-based replay</h2>\n<table><tr><th>policy</th><th>seed</th><th>jobs</th>"
         "<th>finished</th><th>never started</th><th>preemptions</th><th>mean allocation</th>"
         "<th>wait mean</th><th>wait p50</th><th>wait p95</th><th>wait p99</th><th>JCT mean</th>"
         "</tr>\n";
    for (const ReplayResult& r : replay) {
      h += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
          "<td>{:.2f}%</td><td>{:.0f} s</td><td>{:.0f} s</td><td>{:.0f} s</td>"
          "<td>{:.0f} s</td><td>{:.0f} s</td></tr>\n",
          HtmlEscape(r.label), r.seed, r.jobs, r.finished, r.never_started, r.preemptions,
          100 * r.mean_allocated, r.wait.mean, r.wait.p50, r.wait.p95, r.wait.p99, r.jct.mean);
    }
    h += "</table>\n";
    auto chart = [&](const std::string& title, const std::string& y_label, auto value) {
      std::vector<PlotSeries> series;
      for (const ReplayResult& r : replay) {
        PlotSeries p{replay.size() > Labels(replay).size() ? fmt::format("{} #{}", r.label, r.seed)
                                                           : r.label,
                     {},
                     {}};
        double t0 = r.series.empty() ? 0 : r.series.front().time;
        for (const ReplaySample& s : r.series) {
          p.x.push_back((s.time - t0) / 3600.0);
          p.y.push_back(value(s));
        }
        series.push_back(std::move(p));
      }
      h += SvgLineChart(title, "hours since the first arrival", y_label, series);
    };
    chart("GPU allocation over time", "GPUs allocated, % of capacity",
          [](const ReplaySample& s) { return 100 * s.allocated; });
    chart("Fragmentation over time", "fragmented GPUs",
          [](const ReplaySample& s) { return s.fragmented_gpus; });
    chart("Queue length over time", "jobs waiting",
          [](const ReplaySample& s) { return double(s.queued); });
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace tessera::sim
