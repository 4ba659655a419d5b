#include "tessera/sched/fragmentation.h"

#include <gtest/gtest.h>

namespace tessera::sched {
namespace {

NodeShape Shape(int gpus, const std::string& model = "A100") {
  NodeShape s;
  s.cpu_milli = 64000;
  s.memory_mib = 1 << 20;
  s.kinds.push_back(core::NodeGpu{model, 40960, {8, 0}, 0, ""});
  for (int i = 0; i < gpus; ++i) {
    s.gpus.push_back(s.kinds[0]);
    s.gpu_kind.push_back(0);
  }
  return s;
}

std::vector<ClassGpu> Gpus(std::vector<int> lefts) {
  std::vector<ClassGpu> out;
  for (int l : lefts) out.push_back(ClassGpu{0, true, l, 40960});
  return out;
}

TEST(Fragmentation, CountsWhatTypicalRequestsCannotUse) {
  // Half the workload wants a whole GPU, half wants 600/1000 of one.
  Fragmentation f({{1000, 1000, 1, {}, 0.5}, {1000, 600, 1, {}, 0.5}});
  NodeShape s = Shape(2);
  // GPUs with 1000 and 500 free: both requests fit on the free GPU; the 500 is useless to both.
  EXPECT_DOUBLE_EQ(f.Of(s, 0, 64000, Gpus({1000, 500})), 500);
  // 700 and 500: the whole-GPU request cannot fit at all (all 1200 count), the share wastes the
  // 500.
  EXPECT_DOUBLE_EQ(f.Of(s, 0, 64000, Gpus({700, 500})), 0.5 * 1200 + 0.5 * 500);
  // No CPU left: nothing fits, everything is fragment.
  EXPECT_DOUBLE_EQ(f.Of(s, 0, 500, Gpus({1000, 500})), 1500);
  // Nothing free, nothing fragmented.
  EXPECT_DOUBLE_EQ(f.Of(s, 0, 64000, Gpus({0, 0})), 0);
}

TEST(Fragmentation, ModelsTheRequestCannotUseAreAllFragment) {
  Fragmentation f({{1000, 1000, 1, {"V100"}, 1.0}});
  NodeShape s = Shape(1, "T4");
  EXPECT_DOUBLE_EQ(f.Of(s, 0, 64000, Gpus({1000})), 1000);
}

TEST(Fragmentation, UnhealthyGpusAreNotFree) {
  Fragmentation f({{1000, 1000, 1, {}, 1.0}});
  NodeShape s = Shape(2);
  auto gpus = Gpus({1000, 300});
  gpus[0].healthy = false;
  EXPECT_DOUBLE_EQ(f.Of(s, 0, 64000, gpus), 300);
}

TEST(Fragmentation, MemoIsExactAcrossCpuWithinARank) {
  Fragmentation f({{4000, 1000, 1, {}, 0.5}, {8000, 500, 1, {}, 0.5}});
  NodeShape s = Shape(2);
  double a = f.Of(s, 0, 5000, Gpus({1000, 200}));
  double b = f.Of(s, 0, 7999, Gpus({200, 1000}));
  EXPECT_DOUBLE_EQ(a, b);
  EXPECT_EQ(f.memo_size(), 1u);
  double c = f.Of(s, 0, 8000, Gpus({1000, 200}));
  EXPECT_NE(a, c);
}

TEST(TypicalRequests, MergesShapesAndNormalises) {
  std::vector<core::Request> rs(4);
  rs[0].gpus = 1;
  rs[1].gpus = 1;
  rs[2].gpu_milli = 300;
  rs[3].cpu_milli = 100;  // CPU only: left out
  auto t = TypicalRequests(rs);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].milli_per_gpu, 1000);
  EXPECT_DOUBLE_EQ(t[0].frequency, 2.0 / 3);
  EXPECT_EQ(t[1].milli_per_gpu, 300);
  auto top = TypicalRequests(rs, 0.5);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_DOUBLE_EQ(top[0].frequency, 1.0);
}

}  // namespace
}  // namespace tessera::sched
