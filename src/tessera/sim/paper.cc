#include "tessera/sim/paper.h"

#include <algorithm>
#include <iterator>

namespace tessera::sim {
namespace {

struct Figure {
  std::string_view policy, pod_list;
  double percent;
};

constexpr Figure kFigures[] = {
    {"random", "default", 87.47},
    {"dotprod", "default", 90.85},
    {"gpuclustering", "default", 91.88},
    {"gpupacking", "default", 92.00},
    {"bestfit", "default", 93.08},
    {"fgd", "default", 95.39},
    {"fgd", "cpu050", 95.21},
    {"fgd", "cpu100", 95.35},
    {"fgd", "cpu200", 95.05},
    {"fgd", "cpu250", 93.41},
    {"fgd", "gpushare100", 86.90},
    {"fgd", "gpushare40", 94.15},
    {"fgd", "gpushare60", 91.40},
    {"fgd", "gpushare80", 89.30},
    {"fgd", "gpuspec10", 94.95},
    {"fgd", "gpuspec20", 94.84},
    {"fgd", "gpuspec25", 94.74},
    {"fgd", "gpuspec33", 94.55},
    {"fgd", "multigpu20", 95.65},
    {"fgd", "multigpu30", 96.46},
    {"fgd", "multigpu40", 96.99},
    {"fgd", "multigpu50", 97.18},
};

}  // namespace

std::optional<double> PaperAllocationPercent(std::string_view policy, std::string_view pod_list) {
  if (policy == "fgd-paper") policy = "fgd";
  auto it = std::find_if(std::begin(kFigures), std::end(kFigures), [&](const Figure& f) {
    return f.policy == policy && f.pod_list == pod_list;
  });
  if (it == std::end(kFigures)) return std::nullopt;
  return it->percent;
}

}  // namespace tessera::sim
