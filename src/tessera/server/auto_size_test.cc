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

using nlohmann::json;
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

// With the server's auto_size_trial, a kind never measured runs first as a trial on that headroom
// (stored with its sizing, so that a restart runs the same trial), and after it is sized from the
// trial's use - never a trial again, even when the trial measured nothing. A job that asked its own
// trial, an array, or a kind measured already is not given one.
// What a trial recommends: a share of both where it used a part of each; memory alone, said to be
// all of the compute, where it kept the GPU busy; a whole GPU where it used all of both.
TEST(AutoSize, ATrialRecommendsWhatItUsedOfEach) {
  const SizingPolicy policy{.margin_pct = 20, .gpu_memory_mib = 81559, .trial_s = 120};
  TrialUse use{.util_pct = 40, .peak_mib = 3072, .kernel_launches = 24000, .run_s = 120};
  std::string said = TrialSummary("its trial of 2m is over", use, policy);
  EXPECT_THAT(said, HasSubstr("GPU 40% busy, peak GPU memory 3072MiB, 24000 kernel launches "
                              "(200/s, 2.0 ms of GPU time each on average)"));
  EXPECT_THAT(said, HasSubstr("recommended: --gpu-share 50% --gpu-mem 3840MiB (with 20% margin)"));
  use.util_pct = 98;
  said = TrialSummary("its trial of 2m is over", use, policy);
  EXPECT_THAT(said, HasSubstr("recommended: --gpu-mem 3840MiB (with 20% margin) and no --gpu-share "
                              "(98% busy + 20% is all of a GPU's compute), or"))
      << said;
  use.peak_mib = 79000;
  said = TrialSummary("its trial of 2m is over", use, policy);
  EXPECT_THAT(said, HasSubstr("recommended: --gpus 1 (with 20% margin)")) << said;
  // Held back by another job's slices: sized from what it would have used.
  use = {.util_pct = 25, .held_back_pct = 70, .demand_pct = 60, .peak_mib = 1000};
  said = TrialSummary("its trial of 2m is over", use, policy);
  EXPECT_THAT(said, HasSubstr("it would have used 60%)")) << said;
  EXPECT_THAT(said, HasSubstr("recommended: --gpu-share 75% --gpu-mem 1280MiB")) << said;
  // Its limit refused it: said, and sized from what it asked.
  use = {.util_pct = 30, .peak_mib = 1000, .refused = 2, .wanted_mib = 3000};
  said = TrialSummary("its trial of 2m is over", use, policy);
  EXPECT_THAT(said, HasSubstr("peak GPU memory 1000MiB (its limit refused 2 allocations: it asked "
                              "for 3000MiB at most)"))
      << said;
  EXPECT_THAT(said, HasSubstr("recommended: --gpu-share 40% --gpu-mem 3840MiB")) << said;
  EXPECT_THAT(TrialSummary("its trial of 2m is over", TrialUse{}, policy),
              HasSubstr("nothing was measured"));
}

TEST(AutoSize, AKindNeverMeasuredRunsFirstAsATrialThenIsSizedFromIt) {
  const SizingPolicy policy{.margin_pct = 20, .gpu_memory_mib = 81559, .trial_s = 120};
  JobSpec spec = Auto(true, true);
  SizeAutomatically(spec, sched::Prediction{}, policy);
  EXPECT_EQ(spec.gpus, 1);
  EXPECT_FALSE(spec.Share()) << "the headroom: a whole GPU";
  EXPECT_EQ(spec.sizing_trial_s, 120);
  EXPECT_EQ(spec.TrialSeconds(), 120);
  EXPECT_THAT(spec.sizing, HasSubstr("its first run is a trial of 2m with that headroom, then it "
                                     "is re-queued sized from it"));
  EXPECT_EQ(spec.sizing.find("whole GPUs this time"), std::string::npos) << spec.sizing;
  const json stored = JobSpecToJson(spec);
  EXPECT_EQ(stored["sized"]["trial_s"], 120) << stored;
  EXPECT_FALSE(stored.contains("trial_s")) << "not the user's trial";
  EXPECT_EQ(JobSpecFromJson(stored)->sizing_trial_s, 120) << "a restart runs the same trial";

  sched::Prediction measured;
  measured.util_high_pct = 40, measured.util_high_basis = "the trial";
  measured.gpu_memory_peak_mib = 3072, measured.memory_basis = "the trial";
  const JobSpec next = ResizeAfterTrial(spec, measured, policy);
  EXPECT_EQ(next.sizing_trial_s, 0);
  EXPECT_EQ(next.gpu_milli, 500);
  EXPECT_EQ(next.gpu_memory_mib, 3840);
  EXPECT_EQ(RunKindOf(next, "alice").shape, RunKindOf(spec, "alice").shape)
      << "one kind: the history the trial joined is the one it is sized from";
  const JobSpec unmeasured = ResizeAfterTrial(spec, sched::Prediction{}, policy);
  EXPECT_EQ(unmeasured.sizing_trial_s, 0) << "never a trial again";
  EXPECT_THAT(unmeasured.sizing, HasSubstr("whole GPUs this time"));

  JobSpec asked = Auto(true, true);
  asked.trial_s = 30;
  SizeAutomatically(asked, sched::Prediction{}, policy);
  EXPECT_EQ(asked.sizing_trial_s, 0) << "its own trial";
  JobSpec array = Auto(true, true);
  array.array = "0-3";
  SizeAutomatically(array, sched::Prediction{}, policy);
  EXPECT_EQ(array.sizing_trial_s, 0) << "an array's tasks run as they are";
  JobSpec known = Auto(true, true);
  SizeAutomatically(known, measured, policy);
  EXPECT_EQ(known.sizing_trial_s, 0);
  EXPECT_EQ(known.gpu_milli, 500);
  auto forged = ParseJobSpec(R"({"command": ["x"], "resources": {"gpu_share": "auto"},
                                  "sized": {"basis": "b", "trial_s": -1}})");
  ASSERT_FALSE(forged.ok());
  EXPECT_THAT(std::string(forged.status().message()), HasSubstr("sized.trial_s"));
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
  int64_t learn = -1;
  EXPECT_EQ(OutgrewItsSize(spec, {.peak_mib = 4800}, {.margin_pct = 20}, &learn),
            "it may have outgrown its automatic GPU memory: 4864MiB, measured peak 4800MiB; the "
            "next run of its kind is sized past it (or ask --gpu-mem 5888MiB)");
  EXPECT_EQ(learn, 4864) << "past its size: at least its size";
  EXPECT_EQ(OutgrewItsSize(spec, {.peak_mib = 2000}, {}, &learn), "")
      << "far below its size, nothing refused: another failure";
  EXPECT_EQ(learn, 0);
  JobSpec asked = *ParseJobSpec(R"({"command": ["x"], "resources": {"gpu_memory": "4864MiB"}})");
  EXPECT_EQ(OutgrewItsSize(asked, {.peak_mib = 4864}, {}, &learn), "")
      << "asked outright and nothing refused: the user's own size";
}

// Allocations its limit refused name what it asked at most and what to ask: for a size asked
// outright too (never learnt: the user's own), for one sized automatically (learnt, so that the
// next run of its kind is sized past it), far below the limit too (one large allocation), and as a
// whole GPU when its want plus the margin is a GPU's memory or more.
TEST(AutoSize, AllocationsItsLimitRefusedSayWhatItAskedAndWhatToAskNextTime) {
  JobSpec asked = *ParseJobSpec(R"({"command": ["x"], "resources": {"gpu_memory": "1GiB"}})");
  const SizingPolicy policy{.margin_pct = 20, .gpu_memory_mib = 81559};
  int64_t learn = -1;
  EXPECT_EQ(
      OutgrewItsSize(asked, {.peak_mib = 500, .refused = 2, .wanted_mib = 1300}, policy, &learn),
      "its GPU memory limit of 1024MiB refused 2 allocations (measured peak 500MiB; it asked "
      "for 1300MiB at most): ask --gpu-mem 1792MiB next time");
  EXPECT_EQ(learn, 0) << "asked outright: not the history's to learn";
  JobSpec sized = Auto(false, true);
  sched::Prediction p;
  p.gpu_memory_peak_mib = 800, p.memory_basis = "p95 of z";
  SizeAutomatically(sized, p, policy);
  ASSERT_EQ(sized.gpu_memory_mib, 1024);
  EXPECT_EQ(
      OutgrewItsSize(sized, {.peak_mib = 300, .refused = 1, .wanted_mib = 4396}, policy, &learn),
      "its GPU memory limit of 1024MiB (sized automatically) refused 1 allocation (measured "
      "peak 300MiB; it asked for 4396MiB at most): the next run of its kind is sized past it "
      "(or ask --gpu-mem 5376MiB)");
  EXPECT_EQ(learn, 4396);
  EXPECT_THAT(
      OutgrewItsSize(asked, {.peak_mib = 900, .refused = 1, .wanted_mib = 70000}, policy, &learn),
      HasSubstr("ask a whole GPU (--gpus 1) next time"));
  EXPECT_THAT(
      OutgrewItsSize(asked, {.peak_mib = 900, .refused = 1, .wanted_mib = 90000}, policy, &learn),
      HasSubstr("(--gpus 1, and less memory: it asked more than one GPU has)"));
  EXPECT_EQ(
      OutgrewItsSize(asked, {.peak_mib = 900, .refused = 1, .wanted_mib = 1000}, policy, &learn),
      "")
      << "a refusal within its limit (another process's count raced it) says nothing";
}

// At a run's end: a success its limit refused allocations says so as a failure would (it went on
// without them - never silently), and one sized automatically teaches what it asked; a success
// without refusals, or near its size, says nothing; a trial says nothing here (its summary does)
// but its kinds learn what it asked.
TEST(AutoSize, ASuccessItsLimitRefusedSaysSoAndATrialLearnsWhatItAsked) {
  const SizingPolicy policy{.margin_pct = 20, .gpu_memory_mib = 81559};
  JobSpec sized = Auto(false, true);
  sched::Prediction p;
  p.gpu_memory_peak_mib = 1500, p.memory_basis = "p95 of z";
  SizeAutomatically(sized, p, policy);
  ASSERT_EQ(sized.gpu_memory_mib, 2048);
  int64_t learn = -1;
  const GpuMemoryUse refused{.peak_mib = 1500, .refused = 1, .wanted_mib = 3000};
  EXPECT_EQ(MemoryOutgrownAtEnd(sized, /*failed=*/false, /*trial=*/false, refused, policy, &learn),
            "its GPU memory limit of 2048MiB (sized automatically) refused 1 allocation (measured "
            "peak 1500MiB; it asked for 3000MiB at most): the next run of its kind is sized past "
            "it (or ask --gpu-mem 3840MiB)");
  EXPECT_EQ(learn, 3000);
  EXPECT_EQ(MemoryOutgrownAtEnd(sized, false, false, {.peak_mib = 2000}, policy, &learn), "")
      << "a success near its size without a refusal is a success";
  EXPECT_EQ(learn, 0);
  EXPECT_THAT(
      MemoryOutgrownAtEnd(sized, /*failed=*/true, false, {.peak_mib = 2000}, policy, &learn),
      HasSubstr("it may have outgrown its automatic GPU memory"));
  EXPECT_EQ(MemoryOutgrownAtEnd(sized, false, /*trial=*/true, refused, policy, &learn), "");
  EXPECT_EQ(learn, 3000);
  JobSpec asked = *ParseJobSpec(R"({"command": ["x"], "resources": {"gpu_memory": "1GiB"}})");
  EXPECT_EQ(
      MemoryOutgrownAtEnd(asked, false, true, {.peak_mib = 900, .refused = 2, .wanted_mib = 1300},
                          policy, &learn),
      "");
  EXPECT_EQ(learn, 1300) << "a trial of a size asked outright teaches its auto kind too";
  EXPECT_THAT(
      MemoryOutgrownAtEnd(asked, false, false, {.peak_mib = 900, .refused = 2, .wanted_mib = 1300},
                          policy, &learn),
      HasSubstr("ask --gpu-mem 1792MiB next time"));
  EXPECT_EQ(learn, 0);
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
