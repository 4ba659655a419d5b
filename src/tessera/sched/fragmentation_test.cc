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

TEST(Fragmentation, StrandedCountsGpusTheCpuCannotServe) {
  // The workload: one-GPU jobs of 8 cores. A node with 4 GPUs free and 16 cores left can host
  // one, so FGD sees nothing fragmented; but only two of them fit its CPU, and the other two
  // GPUs are stranded.
  Fragmentation f({{8000, 1000, 1, {}, 1.0}});
  NodeShape s = Shape(4);
  EXPECT_DOUBLE_EQ(f.Of(s, 0, 16000, Gpus({1000, 1000, 1000, 1000})), 0);
  EXPECT_DOUBLE_EQ(f.Stranded(s, 0, 16000, Gpus({1000, 1000, 1000, 1000})), 2000);
  EXPECT_DOUBLE_EQ(f.Stranded(s, 0, 64000, Gpus({1000, 1000, 1000, 1000})), 0);
  EXPECT_DOUBLE_EQ(f.Stranded(s, 0, 7999, Gpus({1000, 1000, 1000, 1000})), 4000);
  // Nothing free, nothing stranded.
  EXPECT_DOUBLE_EQ(f.Stranded(s, 0, 0, Gpus({0, 0, 0, 0})), 0);
}

TEST(Fragmentation, StrandedCountsWhatSharesLeaveOnEachGpu) {
  // Shares of 500 and two-GPU jobs, half each. 700 free on one GPU: one share fits and 200 stay
  // (FGD counts the 700 usable for shares); the two-GPU jobs fit the two whole GPUs once.
  Fragmentation f({{1000, 500, 1, {}, 0.5}, {1000, 1000, 2, {}, 0.5}});
  NodeShape s = Shape(3);
  const auto gpus = Gpus({700, 1000, 1000});
  EXPECT_DOUBLE_EQ(f.Of(s, 0, 64000, gpus), 0.5 * 0 + 0.5 * 700);
  EXPECT_DOUBLE_EQ(f.Stranded(s, 0, 64000, gpus), 0.5 * 200 + 0.5 * 700);
  // A model the requests cannot use strands everything.
  Fragmentation v100({{1000, 500, 1, {"V100"}, 1.0}});
  EXPECT_DOUBLE_EQ(v100.Stranded(s, 0, 64000, gpus), 2700);
}

TEST(Fragmentation, StrandedMemoIsExactAcrossCpu) {
  // The memo keys the CPU by how many of each typical request it holds: every CPU amount must give
  // what a fresh computation gives.
  const std::vector<TypicalRequest> typical = {{3000, 1000, 1, {}, 0.4},
                                               {2500, 470, 1, {}, 0.3},
                                               {8000, 1000, 2, {}, 0.2},
                                               {0, 300, 1, {}, 0.1}};
  Fragmentation memoised(typical);
  NodeShape s = Shape(4);
  for (const auto& gpus : {Gpus({1000, 1000, 1000, 1000}), Gpus({530, 1000, 60, 1000})}) {
    for (int64_t cpu = -500; cpu <= 70000; cpu += 250) {
      Fragmentation fresh(typical);
      EXPECT_DOUBLE_EQ(memoised.Stranded(s, 0, cpu, gpus), fresh.Stranded(s, 0, cpu, gpus))
          << "cpu " << cpu;
    }
  }
  EXPECT_LT(memoised.memo_size(), 100u) << "CPU amounts that hold the same share one entry";
}

TEST(Fragmentation, MemosAreBounded) {
  Fragmentation f({{1000, 100, 1, {}, 1.0}});
  NodeShape s = Shape(3);
  size_t calls = 0;
  for (int c = 0; c <= 1000 && calls < Fragmentation::kMemoLimit + 10; ++c) {
    for (int b = 0; b <= c && calls < Fragmentation::kMemoLimit + 10; ++b) {
      for (int a = 0; a <= b && calls < Fragmentation::kMemoLimit + 10; ++a, ++calls)
        f.Stranded(s, 0, 64000, Gpus({a, b, c}));
    }
  }
  EXPECT_LE(f.memo_size(), Fragmentation::kMemoLimit);
  EXPECT_GT(f.memo_size(), 0u);
  EXPECT_DOUBLE_EQ(f.Stranded(s, 0, 64000, Gpus({150, 1000, 0})), 50);
  EXPECT_DOUBLE_EQ(f.Stranded(s, 0, 999, Gpus({150, 1000, 0})), 1150);
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
