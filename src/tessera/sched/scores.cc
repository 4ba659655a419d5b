// Tessera's built-in score policies, each a ScorePlugin (registered in policy_registry.cc).
#include <algorithm>
#include <bit>
#include <cmath>

#include "tessera/sched/policy.h"

namespace tessera::sched {
namespace {

using Positions = absl::InlinedVector<int, 8>;

// Uniformly random among feasible nodes: every node scores alike; the scheduler's seeded tie-break
// decides.
class Random final : public ScorePlugin {
 public:
  double Score(const ScoreInput&) const override { return 0; }
};

// How allocated the node would be (CPU, memory, GPU compute, averaged): kube-scheduler's
// MostAllocated (binpack) or LeastAllocated (spread).
class Allocated final : public ScorePlugin {
 public:
  explicit Allocated(bool most) : most_(most) {}
  double Score(const ScoreInput& in) const override {
    const NodeShape& shape = *in.node.shape;
    const core::Request& r = in.request;
    double used = 0;
    int dims = 0;
    if (shape.cpu_milli > 0) {
      used += double(shape.cpu_milli - in.node.cpu_left + r.cpu_milli) / shape.cpu_milli;
      ++dims;
    }
    if (shape.memory_mib > 0) {
      used += double(shape.memory_mib - in.node.memory_left + r.memory_mib) / shape.memory_mib;
      ++dims;
    }
    if (!in.node.gpus->empty()) {
      used += double(GpuCapacity(in.node) - GpuLeftTotal(in.node) + r.gpu_milli_total()) /
              GpuCapacity(in.node);
      ++dims;
    }
    double u = dims ? used / dims : 0;
    return most_ ? u : 1 - u;
  }

 private:
  bool most_;
};

// Least CPU and GPU left over, normalised by the largest node (0..1, higher is fuller).
double BestFitValue(const ScoreInput& in) {
  double s =
      0.5 * double(in.node.cpu_left - in.request.cpu_milli) / in.scale.max_cpu_milli +
      0.5 * double(GpuLeftTotal(in.node) - in.request.gpu_milli_total()) / in.scale.max_gpu_milli;
  return 1 - s;
}

class BestFit final : public ScorePlugin {
 public:
  double Score(const ScoreInput& in) const override { return BestFitValue(in); }
};

// Tetris: the smallest dot product of free and requested resources.
class DotProduct final : public ScorePlugin {
 public:
  bool ChoosesShareGpu() const override { return true; }
  double Score(const ScoreInput& in) const override {
    const NodeShape& shape = *in.node.shape;
    const std::vector<ClassGpu>& gpus = *in.node.gpus;
    const core::Request& r = in.request;
    if (shape.cpu_milli == 0) return 0;
    double free_cpu = double(in.node.cpu_left) / shape.cpu_milli;
    double want_cpu = double(r.cpu_milli) / shape.cpu_milli;
    double free_gpu = 0, want_gpu = 0;
    if (r.fractional() && !in.positions.empty()) {
      // A share on several GPUs: the GPUs' mean.
      for (int p : in.positions) free_gpu += gpus[p].milli_left / 1000.0;
      free_gpu /= static_cast<double>(in.positions.size());
      want_gpu = r.gpu_milli / 1000.0;
    } else if (!gpus.empty()) {
      free_gpu = double(GpuLeftTotal(in.node)) / GpuCapacity(in.node);
      want_gpu = double(r.gpu_milli_total()) / GpuCapacity(in.node);
    }
    return 1 - (free_cpu * want_cpu + free_gpu * want_gpu) / 2;
  }
};

// Shared GPUs first, then used nodes, then idle nodes.
class GpuPacking final : public ScorePlugin {
 public:
  double Score(const ScoreInput& in) const override {
    if (!in.request.wants_gpu()) return 0;
    const std::vector<ClassGpu>& gpus = *in.node.gpus;
    int fully_free = 0;
    for (const ClassGpu& g : gpus) fully_free += g.healthy && g.milli_left == core::kMilliPerGpu;
    if (fully_free == static_cast<int>(gpus.size())) {
      return std::max(100 / 3 - fully_free, fully_free) / 100.0;
    }
    int free_used = 0;
    int64_t free_ratio = 0;
    for (int p : in.positions) {
      if (gpus[p].milli_left == core::kMilliPerGpu) ++free_used;
      free_ratio += gpus[p].milli_left * 100 / core::kMilliPerGpu;
    }
    if (free_used > 0) return std::max<int64_t>(100 / 2 - free_used, 100 / 3) / 100.0;
    return std::max<int64_t>(100 - free_ratio / 10, 100 / 2) / 100.0;
  }
};

// Nodes already running work of the same GPU size.
class GpuClustering final : public ScorePlugin {
 public:
  double Score(const ScoreInput& in) const override {
    int tag = AffinityTag(in.request);
    if (tag == 0) return 0;
    uint16_t gpu_tags = in.node.tags & ~uint16_t{1};  // CPU-only work does not count
    int64_t left = GpuLeftTotal(in.node);
    int64_t base = 100 / 4 * (in.scale.max_gpu_milli - left) / in.scale.max_gpu_milli;
    int64_t offset;
    if (gpu_tags & (1u << tag)) {
      offset = std::popcount(gpu_tags) == 1 ? 75 : 50;
    } else {
      offset = gpu_tags == 0 ? 25 : 0;
    }
    return double(base + offset) / 100.0;
  }
};

// Fragmentation gradient descent: the least growth of the node's fragmentation against the typical
// workload (docs/scheduling.md, FGD). Also, by the same gradient, the least growth of what runs of
// the typical requests could not fill (Fragmentation::Stranded), and FGD as the paper's simulator
// scores it.
class Fgd final : public ScorePlugin {
 public:
  enum class Mode {
    kFgd,       // exact scores; equal growth decided by best fit
    kStranded,  // Fragmentation::Stranded instead of Of(); exact, no second key
    kPaper,     // the reference simulator's integer 0..100 score, ties to the first node
  };
  Fgd(Fragmentation* frag, Mode mode) : frag_(frag), mode_(mode) {}
  bool ChoosesShareGpu() const override { return frag_ != nullptr; }
  bool TiesToFirstNode() const override { return mode_ == Mode::kPaper; }
  double Score(const ScoreInput& in) const override {
    // CPU-only requests are scored too: the CPU they take can strand a node's GPUs.
    if (frag_ == nullptr || frag_->empty()) return 0.5;
    const NodeShape& shape = *in.node.shape;
    const std::vector<ClassGpu>& gpus = *in.node.gpus;
    const core::Request& r = in.request;
    auto measure = [&](int64_t cpu_left, const std::vector<ClassGpu>& g) {
      return mode_ == Mode::kStranded ? frag_->Stranded(shape, in.node.shape_id, cpu_left, g)
                                      : frag_->Of(shape, in.node.shape_id, cpu_left, g);
    };
    const double before = measure(in.node.cpu_left, gpus);
    std::vector<ClassGpu> after(gpus.begin(), gpus.end());
    for (int p : in.positions) {
      after[p].milli_left -= r.fractional() ? r.gpu_milli : core::kMilliPerGpu;
    }
    const double frag_after = measure(in.node.cpu_left - r.cpu_milli, after);
    const double fgd = 1.0 / (1.0 + std::exp(-(before - frag_after) / 1000.0));
    if (mode_ == Mode::kStranded) return fgd;
    // The reference truncates to an integer node score (framework.MaxNodeScore = 100); the many
    // ties this makes go to the first node (TiesToFirstNode), as its simulator's selectHost does.
    if (mode_ == Mode::kPaper) return std::floor(fgd * 100) / 100;
    // Equal fragmentation growth (many nodes are in the same state, or the typical workload fits
    // alike) is decided by a second key instead of at random: the fuller node (best fit), which
    // keeps emptier nodes whole for the larger pods to come, and for a share the fuller GPU of it.
    // Scaled far below any real difference (a difference of one thousandth of a GPU's
    // fragmentation moves the first key by about 2.5e-4).
    double second = BestFitValue(in);
    if (r.fractional() && !in.positions.empty()) {
      double full = 0;
      for (int p : in.positions) full += 1.0 - double(gpus[p].milli_left) / core::kMilliPerGpu;
      second += full / static_cast<double>(in.positions.size());
    }
    return fgd + kTieBreak * second;
  }

 private:
  static constexpr double kTieBreak = 1e-7;
  Fragmentation* frag_;
  Mode mode_;
};

// The best-linked GPU set; satisfies "prefer" topology wishes.
class TopologyScore final : public ScorePlugin {
 public:
  double Score(const ScoreInput& in) const override {
    const core::Request& r = in.request;
    if (r.gpus < 2) return 1;
    const Positions& positions = in.positions;
    double pairs = double(positions.size()) * (positions.size() - 1) / 2;
    double avg = LinkCost(in.node.shape->topology, positions) / pairs;
    double quality = 1.0 / (1.0 + avg);
    if (r.topology == core::TopologyMode::kPrefer) {
      bool ok = in.node.shape->topology.size() > 0 &&
                SatisfiesScope(in.node, positions, r.topology_scope);
      return 0.5 * quality + (ok ? 0.5 : 0);
    }
    return quality;
  }
};

}  // namespace

std::unique_ptr<ScorePlugin> NewRandomScore(Fragmentation*) { return std::make_unique<Random>(); }
std::unique_ptr<ScorePlugin> NewSpreadScore(Fragmentation*) {
  return std::make_unique<Allocated>(false);
}
std::unique_ptr<ScorePlugin> NewBinpackScore(Fragmentation*) {
  return std::make_unique<Allocated>(true);
}
std::unique_ptr<ScorePlugin> NewBestFitScore(Fragmentation*) { return std::make_unique<BestFit>(); }
std::unique_ptr<ScorePlugin> NewDotProductScore(Fragmentation*) {
  return std::make_unique<DotProduct>();
}
std::unique_ptr<ScorePlugin> NewGpuPackingScore(Fragmentation*) {
  return std::make_unique<GpuPacking>();
}
std::unique_ptr<ScorePlugin> NewGpuClusteringScore(Fragmentation*) {
  return std::make_unique<GpuClustering>();
}
std::unique_ptr<ScorePlugin> NewFgdScore(Fragmentation* f) {
  return std::make_unique<Fgd>(f, Fgd::Mode::kFgd);
}
std::unique_ptr<ScorePlugin> NewStrandedScore(Fragmentation* f) {
  return std::make_unique<Fgd>(f, Fgd::Mode::kStranded);
}
std::unique_ptr<ScorePlugin> NewFgdPaperScore(Fragmentation* f) {
  return std::make_unique<Fgd>(f, Fgd::Mode::kPaper);
}
std::unique_ptr<ScorePlugin> NewTopologyScore(Fragmentation*) {
  return std::make_unique<TopologyScore>();
}

}  // namespace tessera::sched
