#include "tessera/sim/openb.h"

#include <charconv>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "fmt/format.h"
#include "tessera/sim/csv.h"

namespace tessera::sim {
namespace {

using csv::Csv;
using csv::ParseError;
using csv::ReadFile;

}  // namespace

int64_t OpenbGpuMemoryMib(std::string_view model) {
  static const std::map<std::string_view, int64_t> kMemory = {
      {"V100M16", 16384}, {"V100M32", 32768}, {"P100", 16384}, {"T4", 15360},
      {"A10", 23028},     {"P4", 7611},       {"A100", 81920}};
  auto it = kMemory.find(model);
  return it == kMemory.end() ? 0 : it->second;
}

absl::StatusOr<std::vector<core::NodeSpec>> ParseOpenbNodes(std::string_view csv,
                                                            std::string_view filename) {
  try {
    Csv c(csv, filename, {"sn", "cpu_milli", "memory_mib", "gpu", "model"}, {});
    std::vector<core::NodeSpec> nodes;
    std::set<std::string, std::less<>> names;
    while (c.Next()) {
      core::NodeSpec n;
      n.name = std::string(c.Name("sn", "node", &names));
      n.cpu_milli = c.Int("cpu_milli", 0, 10'000'000);
      n.memory_mib = c.Int("memory_mib", 0, 1LL << 32);
      int64_t gpus = c.Int("gpu", 0, 64);
      std::string model(c.Get("model"));
      if (gpus > 0 && model.empty()) c.Fail(c.line(), "model: a node with GPUs needs a model");
      if (gpus == 0 && !model.empty()) c.Fail(c.line(), "model: a node without GPUs has no model");
      for (int64_t g = 0; g < gpus; ++g) {
        n.gpus.push_back(core::NodeGpu{
            model, OpenbGpuMemoryMib(model), {}, -1, fmt::format("{}-gpu{}", n.name, g)});
      }
      nodes.push_back(std::move(n));
    }
    return nodes;
  } catch (const ParseError& e) {
    return absl::InvalidArgumentError(e.message);
  }
}

absl::StatusOr<std::vector<TracePod>> ParseOpenbPods(std::string_view csv,
                                                     std::string_view filename) {
  try {
    Csv c(csv, filename, {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"},
          {"gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"});
    std::vector<TracePod> pods;
    std::set<std::string, std::less<>> names;
    while (c.Next()) {
      TracePod p;
      core::Request& r = p.request;
      r.id = std::string(c.Name("name", "pod", &names));
      r.cpu_milli = c.Int("cpu_milli", 0, 10'000'000);
      r.memory_mib = c.Int("memory_mib", 0, 1LL << 32);
      int64_t num_gpu = c.Int("num_gpu", 0, 8);
      int64_t milli = c.Int("gpu_milli", 0, 1000);
      if (num_gpu == 0 && milli != 0) {
        c.Fail(c.line(), fmt::format("gpu_milli: expected 0 with num_gpu 0, got {}", milli));
      }
      if (num_gpu == 1 && milli == 0)
        c.Fail(c.line(), "gpu_milli: expected 1..1000 with num_gpu 1, got 0");
      if (num_gpu > 1 && milli != 1000) {
        c.Fail(c.line(),
               fmt::format("gpu_milli: expected 1000 with num_gpu {}, got {}", num_gpu, milli));
      }
      if (num_gpu == 1 && milli < 1000) {
        r.gpu_milli = static_cast<int>(milli);
      } else {
        r.gpus = static_cast<int>(num_gpu);
      }
      if (c.Has("gpu_spec") && !c.Get("gpu_spec").empty()) {
        if (num_gpu == 0) c.Fail(c.line(), "gpu_spec: a pod without GPUs cannot ask for a model");
        r.models = c.Models("gpu_spec");
      }
      if (c.Has("qos")) {
        p.qos = std::string(c.Get("qos"));
        static const std::set<std::string, std::less<>> kQos = {"", "LS", "BE", "Burstable",
                                                                "Guaranteed"};
        if (!kQos.contains(p.qos)) {
          c.Fail(c.line(),
                 fmt::format("qos: expected LS, BE, Burstable or Guaranteed, got '{}'", p.qos));
        }
      }
      if (c.Has("pod_phase")) p.phase = std::string(c.Get("pod_phase"));
      p.creation_time = c.OptionalInt("creation_time", 0, 1LL << 40);
      p.deletion_time = c.OptionalInt("deletion_time", 0, 1LL << 40);
      p.scheduled_time = c.OptionalInt("scheduled_time", 0, 1LL << 40);
      if (p.creation_time && p.deletion_time && *p.deletion_time < *p.creation_time) {
        c.Fail(c.line(), fmt::format("deletion_time: {} is before creation_time {}",
                                     *p.deletion_time, *p.creation_time));
      }
      pods.push_back(std::move(p));
    }
    return pods;
  } catch (const ParseError& e) {
    return absl::InvalidArgumentError(e.message);
  }
}

absl::StatusOr<std::vector<core::NodeSpec>> LoadOpenbNodes(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseOpenbNodes(*text, path);
}

absl::StatusOr<std::vector<TracePod>> LoadOpenbPods(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseOpenbPods(*text, path);
}

}  // namespace tessera::sim
