#include "tessera/sim/trace.h"

#include "tessera/sim/csv.h"
#include "tessera/sim/openb.h"
#include "tessera/sim/slurm_trace.h"

namespace tessera::sim {
namespace {

using csv::Csv;
using csv::ParseError;

std::string_view FirstLine(std::string_view text) {
  size_t nl = text.find('\n');
  return text.substr(0, nl);
}

bool IsOpenbHeader(std::string_view header, std::string_view first_column) {
  return header.substr(0, first_column.size()) == first_column &&
         (header.size() == first_column.size() || header[first_column.size()] == ',');
}

double Seconds(const Csv& c, const std::string& column, double max = 1e12) {
  std::string_view s = c.Get(column);
  double v = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size() || !(v >= 0)) {
    c.Fail(c.line(), fmt::format("{}: expected seconds >= 0, got '{}'", column, s));
  }
  if (v > max) {
    c.Fail(c.line(), fmt::format("{}: {} s is more than {:.0f} s ({})", column, s, max,
                                 max == kMaxTraceDurationS ? "ten years" : "the limit"));
  }
  return v;
}

}  // namespace

absl::StatusOr<TraceFormat> ParseTraceFormat(std::string_view text) {
  if (text == "auto") return TraceFormat::kAuto;
  if (text == "openb") return TraceFormat::kOpenb;
  if (text == "tessera") return TraceFormat::kTessera;
  if (text == "slurm") return TraceFormat::kSlurm;
  return absl::InvalidArgumentError(
      fmt::format("unknown trace format '{}' (known: auto, openb, tessera, slurm)", text));
}

int OpenbPriority(std::string_view qos) {
  if (qos == "LS") return 3;
  if (qos == "Guaranteed") return 2;
  if (qos == "BE") return 0;
  return 1;
}

absl::StatusOr<std::vector<core::NodeSpec>> ParseTesseraNodes(std::string_view text,
                                                              std::string_view filename) {
  try {
    Csv c(text, filename, {"name", "cpu_milli", "memory_mib", "gpus"},
          {"gpu_model", "gpu_memory_mib", "count"});
    std::vector<core::NodeSpec> nodes;
    std::set<std::string, std::less<>> names;
    while (c.Next()) {
      std::string_view name =
          c.Name("name", "node", nullptr);  // uniqueness: per expanded name below
      core::NodeSpec n;
      n.cpu_milli = c.Int("cpu_milli", 0, 10'000'000);
      n.memory_mib = c.Int("memory_mib", 0, 1LL << 32);
      int64_t gpus = c.Int("gpus", 0, 64);
      std::string model = c.Has("gpu_model") ? std::string(c.Get("gpu_model")) : "";
      if (gpus > 0 && model.empty()) c.Fail(c.line(), "gpu_model: a node with GPUs needs a model");
      std::optional<int64_t> gpu_mem = c.OptionalInt("gpu_memory_mib", 1, 1LL << 24);
      int64_t count = c.OptionalInt("count", 1, 100'000).value_or(1);
      if (static_cast<int64_t>(nodes.size()) + count > 1'000'000) {
        c.Fail(c.line(), "count: more than 1,000,000 nodes in all");
      }
      for (int64_t k = 0; k < count; ++k) {
        core::NodeSpec node = n;
        node.name = count == 1 ? std::string(name) : fmt::format("{}-{}", name, k);
        if (!names.emplace(node.name).second) {
          c.Fail(c.line(), fmt::format("name: node '{}' listed twice", node.name));
        }
        for (int64_t g = 0; g < gpus; ++g) {
          node.gpus.push_back(core::NodeGpu{model,
                                            gpu_mem.value_or(OpenbGpuMemoryMib(model)),
                                            {},
                                            -1,
                                            fmt::format("{}-gpu{}", node.name, g)});
        }
        nodes.push_back(std::move(node));
      }
    }
    return nodes;
  } catch (const ParseError& e) {
    return absl::InvalidArgumentError(e.message);
  }
}

absl::StatusOr<std::vector<SimJob>> ParseTesseraJobs(std::string_view text,
                                                     std::string_view filename) {
  try {
    Csv c(text, filename, {"name", "cpu_milli", "memory_mib"},
          {"gpus", "gpu_milli", "gpu_memory_mib", "share_gpus", "gpu_models", "priority",
           "preemptible", "submit_time", "duration", "predicted_duration", "user", "utilization"});
    std::vector<SimJob> jobs;
    std::set<std::string, std::less<>> names;
    while (c.Next()) {
      SimJob j;
      core::Request& r = j.request;
      r.id = std::string(c.Name("name", "job", &names));
      r.cpu_milli = c.Int("cpu_milli", 0, 10'000'000);
      r.memory_mib = c.Int("memory_mib", 0, 1LL << 32);
      r.gpus = static_cast<int>(c.OptionalInt("gpus", 0, 64).value_or(0));
      r.gpu_milli = static_cast<int>(c.OptionalInt("gpu_milli", 0, 999).value_or(0));
      r.gpu_memory_mib = c.OptionalInt("gpu_memory_mib", 0, 1LL << 24).value_or(0);
      if (r.gpus > 0 && (r.gpu_milli > 0 || r.gpu_memory_mib > 0)) {
        c.Fail(c.line(), "gpus: whole GPUs and a share (gpu_milli, gpu_memory_mib) are exclusive");
      }
      if (c.Has("share_gpus") && !c.Get("share_gpus").empty()) {
        r.share_gpus = static_cast<int>(c.Int("share_gpus", 1, 64));
        if (!r.fractional())
          c.Fail(c.line(),
                 "share_gpus: only a share (gpu_milli, gpu_memory_mib) is on several GPUs");
      }
      if (c.Has("gpu_models") && !c.Get("gpu_models").empty()) {
        r.models = c.Models("gpu_models");
        if (!r.wants_gpu())
          c.Fail(c.line(), "gpu_models: a job without GPUs cannot ask for a model");
      }
      r.priority = static_cast<int>(c.OptionalInt("priority", -1000, 1000).value_or(0));
      r.preemptible = c.OptionalInt("preemptible", 0, 1).value_or(1) == 1;
      if (c.Has("submit_time") && !c.Get("submit_time").empty())
        j.submit = Seconds(c, "submit_time");
      if (c.Has("duration") && !c.Get("duration").empty())
        j.duration = Seconds(c, "duration", kMaxTraceDurationS);
      if (c.Has("predicted_duration") && !c.Get("predicted_duration").empty())
        j.predicted_duration = Seconds(c, "predicted_duration", kMaxTraceDurationS);
      if (c.Has("user") && !c.Get("user").empty())
        r.owner = std::string(c.Name("user", "user", nullptr));
      if (c.Has("utilization") && !c.Get("utilization").empty()) {
        j.utilization = static_cast<double>(c.Int("utilization", 0, 100));
        if (!r.fractional())
          c.Fail(c.line(),
                 "utilization: only a share of a GPU (gpu_milli, gpu_memory_mib) has one");
      }
      if (std::string bad = core::ValidateRequest(r); !bad.empty()) c.Fail(c.line(), bad);
      jobs.push_back(std::move(j));
    }
    return jobs;
  } catch (const ParseError& e) {
    return absl::InvalidArgumentError(e.message);
  }
}

absl::StatusOr<std::vector<core::NodeSpec>> LoadNodes(const std::string& path, TraceFormat format,
                                                      const TraceOptions& options) {
  auto text = csv::ReadFile(path);
  if (!text.ok()) return text.status();
  if (format == TraceFormat::kAuto) {
    const std::string_view first = FirstLine(*text);
    format = first.starts_with("NodeName=") ? TraceFormat::kSlurm
             : IsOpenbHeader(first, "sn")   ? TraceFormat::kOpenb
                                            : TraceFormat::kTessera;
  }
  if (format == TraceFormat::kSlurm) return ParseScontrolNodes(*text, path, options.gpu_memory_mib);
  return format == TraceFormat::kOpenb ? ParseOpenbNodes(*text, path)
                                       : ParseTesseraNodes(*text, path);
}

absl::StatusOr<std::vector<SimJob>> LoadJobs(const std::string& path, TraceFormat format,
                                             const TraceOptions& options) {
  auto text = csv::ReadFile(path);
  if (!text.ok()) return text.status();
  if (format == TraceFormat::kAuto) {
    std::string_view header = FirstLine(*text);
    format = header.find('|') != std::string_view::npos         ? TraceFormat::kSlurm
             : header.find("num_gpu") != std::string_view::npos ? TraceFormat::kOpenb
                                                                : TraceFormat::kTessera;
  }
  if (format == TraceFormat::kSlurm)
    return ParseSacctJobs(*text, path, options.shards_per_gpu, options.gpu_memory_mib);
  if (format == TraceFormat::kTessera) return ParseTesseraJobs(*text, path);
  auto pods = ParseOpenbPods(*text, path);
  if (!pods.ok()) return pods.status();
  std::vector<SimJob> jobs;
  jobs.reserve(pods->size());
  for (TracePod& p : *pods) {
    SimJob j;
    j.request = std::move(p.request);
    j.request.priority = OpenbPriority(p.qos);
    j.request.preemptible = j.request.priority <= 1;
    j.submit = static_cast<double>(p.creation_time.value_or(0));
    if (p.deletion_time) {
      int64_t start = p.scheduled_time && *p.scheduled_time > 0 ? *p.scheduled_time
                                                                : p.creation_time.value_or(0);
      j.duration = static_cast<double>(std::max<int64_t>(*p.deletion_time - start, 0));
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

}  // namespace tessera::sim
