#include "tessera/sched/fragmentation.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

namespace tessera::sched {

std::vector<TypicalRequest> TypicalRequests(const std::vector<core::Request>& requests,
                                            double coverage) {
  using Key = std::tuple<int64_t, int32_t, int, std::vector<std::string>>;
  std::map<Key, double> counts;
  double total = 0;
  for (const core::Request& r : requests) {
    if (!r.wants_gpu()) continue;
    int32_t milli = r.fractional() ? r.gpu_milli : core::kMilliPerGpu;
    int gpus = r.gpu_count();
    std::vector<std::string> models = r.models;
    std::sort(models.begin(), models.end());
    counts[Key{r.cpu_milli, milli, gpus, models}] += 1;
    total += 1;
  }
  std::vector<TypicalRequest> out;
  for (const auto& [k, n] : counts) {
    out.push_back(
        TypicalRequest{std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), n});
  }
  // Most frequent first; ties in key order (the map's), so the result is deterministic.
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.frequency > b.frequency; });
  double kept = 0;
  size_t keep = 0;
  while (keep < out.size() && (keep == 0 || kept < coverage * total - 1e-9))
    kept += out[keep++].frequency;
  out.resize(keep);
  for (TypicalRequest& t : out) t.frequency /= kept;
  return out;
}

Fragmentation::Fragmentation(std::vector<TypicalRequest> typical) : typical_(std::move(typical)) {
  for (const TypicalRequest& t : typical_) cpu_levels_.push_back(t.cpu_milli);
  std::sort(cpu_levels_.begin(), cpu_levels_.end());
  cpu_levels_.erase(std::unique(cpu_levels_.begin(), cpu_levels_.end()), cpu_levels_.end());
}

size_t Fragmentation::KeyHash::operator()(const std::vector<uint64_t>& k) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t w : k) {
    h ^= w;
    h *= 0x100000001b3ull;
    h ^= h >> 31;
  }
  return static_cast<size_t>(h);
}

uint64_t Fragmentation::Accepted(const NodeShape& shape, ShapeId shape_id, size_t t) {
  if (static_cast<size_t>(shape_id) >= accepted_.size()) accepted_.resize(shape_id + 1);
  auto& row = accepted_[shape_id];
  if (row.empty()) {
    row.resize(typical_.size());
    for (size_t i = 0; i < typical_.size(); ++i) {
      uint64_t mask = 0;
      for (size_t k = 0; k < shape.kinds.size() && k < 64; ++k) {
        const auto& models = typical_[i].models;
        if (models.empty() ||
            std::find(models.begin(), models.end(), shape.kinds[k].model) != models.end()) {
          mask |= 1ull << k;
        }
      }
      row[i] = mask;
    }
  }
  return row[t];
}

std::vector<uint64_t> Fragmentation::KeyOf(ShapeId shape_id, uint64_t cpu,
                                           const std::vector<ClassGpu>& gpus) {
  std::vector<uint64_t> key;
  key.reserve(gpus.size() + 1);
  key.push_back((uint64_t(shape_id) << 40) | cpu);
  for (const ClassGpu& g : gpus) {
    if (!g.healthy) continue;
    key.push_back((uint64_t{g.kind} << 16) | static_cast<uint64_t>(g.milli_left));
  }
  std::sort(key.begin() + 1, key.end());
  return key;
}

void Fragmentation::Remember(Memo& memo, std::vector<uint64_t> key, double value) {
  if (memo.size() >= kMemoLimit) memo.clear();
  memo.emplace(std::move(key), value);
}

double Fragmentation::Of(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
                         const std::vector<ClassGpu>& gpus) {
  if (typical_.empty()) return 0;
  // CPU matters only through which typical sizes fit.
  const auto cpu_rank = static_cast<uint64_t>(
      std::upper_bound(cpu_levels_.begin(), cpu_levels_.end(), cpu_left) - cpu_levels_.begin());
  std::vector<uint64_t> key = KeyOf(shape_id, cpu_rank, gpus);
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  double v = Compute(shape, shape_id, cpu_left, gpus);
  Remember(memo_, std::move(key), v);
  return v;
}

const std::vector<int64_t>& Fragmentation::StrandedCpuLevels(const NodeShape& shape,
                                                             ShapeId shape_id) {
  if (static_cast<size_t>(shape_id) >= stranded_levels_.size())
    stranded_levels_.resize(shape_id + 1);
  auto& levels = stranded_levels_[shape_id];
  if (levels.empty()) {
    // The CPU at which one more of t fits, up to as many of t as the shape's GPUs could ever hold.
    const auto gpus = static_cast<int64_t>(shape.gpus.size());
    for (const TypicalRequest& t : typical_) {
      if (t.cpu_milli <= 0 || t.milli_per_gpu <= 0 || t.gpus <= 0) continue;
      const int64_t most = gpus * core::kMilliPerGpu / t.milli_per_gpu / t.gpus;
      for (int64_t k = 1; k <= most; ++k) levels.push_back(k * t.cpu_milli);
    }
    std::sort(levels.begin(), levels.end());
    levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
    levels.push_back(std::numeric_limits<int64_t>::max());  // never empty once built
  }
  return levels;
}

double Fragmentation::Stranded(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
                               const std::vector<ClassGpu>& gpus) {
  if (typical_.empty()) return 0;
  const int64_t cpu = std::max<int64_t>(cpu_left, 0);
  // CPU matters only through how many of each typical request it holds, up to as many as the GPUs
  // could: the rank among the CPU amounts where one more fits.
  const std::vector<int64_t>& levels = StrandedCpuLevels(shape, shape_id);
  const auto rank =
      static_cast<uint64_t>(std::upper_bound(levels.begin(), levels.end(), cpu) - levels.begin());
  std::vector<uint64_t> key = KeyOf(shape_id, rank, gpus);
  auto it = stranded_memo_.find(key);
  if (it != stranded_memo_.end()) return it->second;
  double v = ComputeStranded(shape, shape_id, cpu, gpus);
  Remember(stranded_memo_, std::move(key), v);
  return v;
}

double Fragmentation::OfCluster(const ClusterState& st) {
  double total = 0;
  for (ClassId c : st.live_classes()) {
    ShapeId s = st.class_shape(c);
    total += Of(st.shape(s), s, st.class_cpu_left(c), st.class_gpus(c)) *
             static_cast<double>(st.class_members(c).size());
  }
  return total;
}

namespace {
int64_t HealthyFreeMilli(const std::vector<ClassGpu>& gpus) {
  int64_t total = 0;
  for (const ClassGpu& g : gpus) {
    if (g.healthy) total += g.milli_left;
  }
  return total;
}
}  // namespace

double Fragmentation::Compute(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
                              const std::vector<ClassGpu>& gpus) {
  const int64_t total = HealthyFreeMilli(gpus);
  if (total == 0) return 0;
  double frag = 0;
  for (size_t t = 0; t < typical_.size(); ++t) {
    const TypicalRequest& tr = typical_[t];
    uint64_t accepted = Accepted(shape, shape_id, t);
    int fitting = 0;
    int64_t unusable = 0;  // free compute on GPUs this request cannot use
    for (const ClassGpu& g : gpus) {
      if (!g.healthy) continue;
      bool ok = (accepted >> g.kind) & 1;
      if (ok && g.milli_left >= tr.milli_per_gpu) {
        ++fitting;
      } else {
        unusable += g.milli_left;
      }
    }
    if (fitting >= tr.gpus && cpu_left >= tr.cpu_milli) {
      frag += tr.frequency * static_cast<double>(unusable);
    } else {
      frag += tr.frequency * static_cast<double>(total);
    }
  }
  return frag;
}

double Fragmentation::ComputeStranded(const NodeShape& shape, ShapeId shape_id, int64_t cpu_left,
                                      const std::vector<ClassGpu>& gpus) {
  const int64_t total = HealthyFreeMilli(gpus);
  if (total == 0) return 0;
  double stranded = 0;
  for (size_t t = 0; t < typical_.size(); ++t) {
    const TypicalRequest& tr = typical_[t];
    const uint64_t accepted = Accepted(shape, shape_id, t);
    // How many of t the GPUs hold: shares on each GPU, or requests of whole fitting GPUs.
    int64_t by_gpu = 0;
    for (const ClassGpu& g : gpus) {
      if (g.healthy && ((accepted >> g.kind) & 1) && tr.milli_per_gpu > 0)
        by_gpu += g.milli_left / tr.milli_per_gpu;
    }
    if (tr.gpus > 1) by_gpu /= tr.gpus;
    const int64_t by_cpu = tr.cpu_milli > 0 ? cpu_left / tr.cpu_milli : by_gpu;
    const int64_t used = std::min(by_gpu, by_cpu) * tr.gpus * tr.milli_per_gpu;
    stranded += tr.frequency * static_cast<double>(total - used);
  }
  return stranded;
}

}  // namespace tessera::sched
