// Sizing "auto" resources from a seeded history: the 95th percentile of what jobs of the kind used
// plus the margin, rounded up; whole GPUs where nothing was measured or the size reaches a GPU;
// what was asked outright stays; the stored spec queues the same request after a restart; and a
// job that failed at its automatic memory says what it peaked at and what to ask.
#include "tessera/server/auto_size.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "tessera/sched/predictor.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

JobSpec Auto(bool share, bool memory) {
  auto s =
      ParseJobSpec(std::string(R"({"command": ["python", "serve.py"], "name": "serve",)") +
                   R"("resources": {)" + (share ? R"("gpu_share": "auto")" : "") +
                   (share && memory ? "," : "") + (memory ? R"("gpu_memory": "auto")" : "") + "}}");
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : JobSpec{};
}

// A history where alice's runs of 'serve' (asked "auto") kept their GPU 10..28% busy and peaked at
// 3000..4900 MiB.
void Seed(sched::DurationPredictor& h, const JobSpec& spec) {
  for (int i = 0; i < 20; ++i) {
    const sched::RunKind kind = RunKindOf(spec, "alice");
    h.Add(kind, 60, 10.0 + i, true);
    h.AddGpuMemoryPeak(kind, 3000 + 100 * i);
  }
}

TEST(AutoSize, ASeededHistorySizesTheShareAndMemoryAtItsP95PlusTheMargin) {
  JobSpec spec = Auto(true, true);
  sched::DurationPredictor h(/*kind_only=*/true);
  Seed(h, spec);
  SizeAutomatically(spec, h.Predict(RunKindOf(spec, "alice")),
                    {.margin_pct = 20, .gpu_memory_mib = 81559});
  // p95 of 10..29% is 28%: +20% is 33.6%, rounded up to 35%. p95 of 3000..4900 MiB is 4800 MiB:
  // +20% is 5760 MiB, rounded up to 5888 MiB (23 x 256).
  EXPECT_EQ(spec.gpu_milli, 350);
  EXPECT_EQ(spec.gpu_memory_mib, 5888);
  EXPECT_THAT(spec.sizing, HasSubstr("gpu_share 35%: 28% busy (p95 of alice's runs of 'serve'"));
  EXPECT_THAT(spec.sizing, HasSubstr("gpu_memory 5888MiB: a peak of 4800MiB"));
  // Its kind is what it asked, whatever it was sized to: the next run finds the same history.
  EXPECT_EQ(RunKindOf(spec, "alice").shape, "auto auto");
  // Stored and read back (a restart): the same request, and still "auto".
  auto back = JobSpecFromJson(JobSpecToJson(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->gpu_milli, 350);
  EXPECT_EQ(back->gpu_memory_mib, 5888);
  EXPECT_TRUE(back->gpu_share_auto && back->gpu_memory_auto);
  EXPECT_EQ(back->sizing, spec.sizing);
  EXPECT_EQ(JobSpecToJson(spec)["resources"]["gpu_share"], "auto");
  const core::Request r = RequestOf(*back, 7, "alice");
  EXPECT_TRUE(r.fractional());
  EXPECT_EQ(r.gpu_milli, 350);
  EXPECT_EQ(r.gpu_memory_mib, 5888);
}

TEST(AutoSize, WithoutMeasuredRunsAJobGetsAWholeGpuThisTime) {
  JobSpec spec = Auto(true, true);
  SizeAutomatically(spec, sched::Prediction{}, {.gpu_memory_mib = 81559});
  EXPECT_EQ(spec.gpus, 1);
  EXPECT_FALSE(spec.Share());
  EXPECT_THAT(spec.sizing, HasSubstr("no measured runs of its kind yet"));
  EXPECT_THAT(spec.sizing, HasSubstr("whole GPUs this time; its use is measured for the next"));
  const core::Request r = RequestOf(*JobSpecFromJson(JobSpecToJson(spec)), 1, "alice");
  EXPECT_EQ(r.gpus, 1) << "a whole GPU after a restart too";
}

TEST(AutoSize, APartAskedOutrightStaysAndAWholeSizeIsTheGpus) {
  // Memory auto beside an asked 30% share: the share stays, memory is sized.
  auto s = ParseJobSpec(
      R"({"command": ["serve"], "resources": {"gpu_share": "30%", "gpu_memory": "auto"}})");
  ASSERT_TRUE(s.ok()) << s.status();
  sched::Prediction p;
  p.gpu_memory_peak_mib = 1000, p.memory_basis = "p95 of x";
  SizeAutomatically(*s, p, {.margin_pct = 0, .gpu_memory_mib = 16384});
  EXPECT_EQ(s->gpu_milli, 300);
  EXPECT_EQ(s->gpu_memory_mib, 1024);
  // A busy kind: its share plus the margin reaches the whole GPU.
  JobSpec busy = Auto(true, false);
  p.util_high_pct = 90, p.util_high_basis = "p95 of y";
  SizeAutomatically(busy, p, {.margin_pct = 20});
  EXPECT_EQ(busy.gpus, 1);
  EXPECT_FALSE(busy.Share());
  EXPECT_THAT(busy.sizing, HasSubstr("90% busy (p95 of y) + 20% is a whole GPU"));
  // A peak past the GPU's memory: not limited (whole), and the share alone.
  JobSpec big = Auto(true, true);
  p.util_high_pct = 20, p.gpu_memory_peak_mib = 15000;
  SizeAutomatically(big, p, {.margin_pct = 20, .gpu_memory_mib = 16384});
  EXPECT_EQ(big.gpu_milli, 250);
  EXPECT_EQ(big.gpu_memory_mib, 0);
  EXPECT_THAT(big.sizing, HasSubstr("is a whole GPU's"));
}

TEST(AutoSize, AJobThatFailedAtItsAutomaticMemorySaysWhatItPeakedAt) {
  JobSpec spec = Auto(false, true);
  sched::Prediction p;
  p.gpu_memory_peak_mib = 4000, p.memory_basis = "p95 of z";
  SizeAutomatically(spec, p, {.margin_pct = 20, .gpu_memory_mib = 81559});
  ASSERT_EQ(spec.gpu_memory_mib, 4864);
  EXPECT_EQ(OutgrewItsSize(spec, 4800, {.margin_pct = 20}),
            "it may have outgrown its automatic GPU memory: 4864MiB, measured peak 4800MiB; the "
            "next run of its kind is sized past it (or ask --gpu-mem 5888MiB)");
  EXPECT_EQ(OutgrewItsSize(spec, 2000, {}), "") << "far below its size: another failure";
  JobSpec asked = *ParseJobSpec(R"({"command": ["x"], "resources": {"gpu_memory": "4864MiB"}})");
  EXPECT_EQ(OutgrewItsSize(asked, 4864, {}), "") << "asked outright: the user's own size";
}

TEST(AutoSize, ASizingIsTheServersToSayNotTheUsers) {
  auto s = ParseJobSpec(R"({"command": ["x"], "resources": {"gpu_share": "30%"},
                            "sized": {"basis": "mine", "gpu_share": "10%"}})");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("sized.gpu_share"));
  s = ParseJobSpec(R"({"command": ["x"], "resources": {"gpu_share": "auto"},
                       "sized": {"basis": "b", "gpu_share": "200%"}})");
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace tessera::server
