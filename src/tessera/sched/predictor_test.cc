// Run-time predictions from history: the nearest key with enough runs, the 75th percentile, the
// max runtime as a cap and as the answer without history.
#include "tessera/sched/predictor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::sched {
namespace {

using ::testing::HasSubstr;

// A job's run as the server describes it: its name, the command, whole GPUs or a share.
struct Spec {
  Spec(std::string name, int gpus, double max_runtime = 0) : name(std::move(name)), gpus(gpus) {
    max_runtime_s = max_runtime;
  }
  std::string name;
  int gpus = 0, gpu_milli = 0;
  std::vector<std::string> command = {"python", "train.py"};
  double max_runtime_s = 0;
  RunKind Of(const std::string& user) const {
    core::Request r;
    r.gpus = gpus;
    r.gpu_milli = gpu_milli;
    return {user, name, command, HistoryShape(r), max_runtime_s};
  }
};

// The server's: a job known by its name or command is predicted from those runs alone - not
// another user's `true`, nor the user's own other jobs of the same shape.
TEST(Predictor, KindOnlyPredictsANamedJobFromItsOwnRunsAlone) {
  DurationPredictor p(/*kind_only=*/true);
  for (int i = 0; i < 5; ++i) p.Add(Spec("true", 1).Of("alice"), 0.01);
  EXPECT_EQ(p.Predict(Spec("true", 1).Of("alice")).samples, 5);
  EXPECT_EQ(p.Predict(Spec("true", 1).Of("bob")).seconds, 0) << "another user's runs";
  EXPECT_EQ(p.Predict(Spec("train", 1, 600).Of("alice")).basis, "its max runtime")
      << "the user's other jobs of that shape";
  EXPECT_EQ(p.Predict(Spec("train", 1, 600).Of("alice")).seconds, 600);
}

TEST(Predictor, NearestKeyWithEnoughRunsAndItsSeventyFifthPercentile) {
  DurationPredictor p;
  EXPECT_EQ(p.Predict(Spec("train", 2).Of("alice")).seconds, 0) << "no history";
  Prediction limit = p.Predict(Spec("train", 2, 600).Of("alice"));
  EXPECT_EQ(limit.seconds, 600);
  EXPECT_EQ(limit.basis, "its max runtime");
  for (double t : {100, 200, 300, 400}) p.Add(Spec("train", 2).Of("alice"), t);
  Prediction own = p.Predict(Spec("train", 2).Of("alice"));
  EXPECT_EQ(own.seconds, 300) << "p75 of 100..400";
  EXPECT_EQ(own.samples, 4);
  EXPECT_THAT(own.basis, HasSubstr("alice's runs of 'train' with this command (4 runs)"));
  EXPECT_EQ(p.Predict(Spec("train", 2, 250).Of("alice")).seconds, 250) << "capped";
  // Another of alice's two-GPU jobs: her jobs of that shape; bob's: everyone's of that shape.
  EXPECT_THAT(p.Predict(Spec("eval", 2).Of("alice")).basis, HasSubstr("alice's 2 GPU jobs"));
  EXPECT_THAT(p.Predict(Spec("train", 2).Of("bob")).basis, HasSubstr("all 2 GPU jobs"));
  EXPECT_EQ(p.Predict(Spec("train", 1).Of("alice")).seconds, 0) << "another shape";
  // One run of its own is less than three of a wider key; three of its own win.
  p.Add(Spec("eval", 2).Of("alice"), 10);
  EXPECT_THAT(p.Predict(Spec("eval", 2).Of("alice")).basis,
              HasSubstr("alice's 2 GPU jobs (5 runs)"));
  p.Add(Spec("eval", 2).Of("alice"), 10);
  p.Add(Spec("eval", 2).Of("alice"), 10);
  EXPECT_EQ(p.Predict(Spec("eval", 2).Of("alice")).seconds, 10);
  // Only the last kKept runs count.
  for (size_t i = 0; i < DurationPredictor::kKept; ++i) p.Add(Spec("train", 2).Of("alice"), 50);
  EXPECT_EQ(p.Predict(Spec("train", 2).Of("alice")).seconds, 50);
  p.Add(Spec("train", 2).Of("alice"), -1);  // nonsense is not history
  EXPECT_EQ(p.Predict(Spec("train", 2).Of("alice")).seconds, 50);
}

// Comparable runs first: the same name with another command (`--epochs 1` against 100) is the
// name's history only while this command has none of its own.
TEST(Predictor, ANamedJobsRunsOfTheSameCommandComeFirst) {
  DurationPredictor p;
  Spec quick = Spec("train", 1), full = Spec("train", 1);
  quick.command = {"python", "train.py", "--epochs", "1"};
  full.command = {"python", "train.py", "--epochs", "100"};
  for (double t : {2, 2, 2}) p.Add(quick.Of("alice"), t);
  Prediction before = p.Predict(full.Of("alice"));
  EXPECT_EQ(before.seconds, 2);
  EXPECT_THAT(before.basis, HasSubstr("alice's runs of 'train' (3 runs)"));
  for (double t : {600, 610, 620}) p.Add(full.Of("alice"), t);
  Prediction after = p.Predict(full.Of("alice"));
  EXPECT_EQ(after.seconds, 620) << "p75 of 600, 610, 620";
  EXPECT_THAT(after.basis, HasSubstr("alice's runs of 'train' with this command (3 runs)"));
  EXPECT_EQ(p.Predict(quick.Of("alice")).seconds, 2);
}

TEST(Predictor, UtilizationFromTheRunsThatMeasuredIt) {
  DurationPredictor p;
  Spec share = Spec("infer", 0);
  share.gpu_milli = 300;
  // Runs without a measurement teach run times, not utilization.
  p.Add(share.Of("alice"), 60);
  EXPECT_EQ(p.Predict(share.Of("alice")).util_pct, 0);
  EXPECT_EQ(p.Predict(share.Of("alice")).util_samples, 0);
  for (double u : {20, 40, 30, 35}) p.Add(share.Of("alice"), 60, u);
  Prediction pr = p.Predict(share.Of("alice"));
  EXPECT_EQ(pr.util_pct, 35) << "p75 of 20, 30, 35, 40";
  EXPECT_EQ(pr.util_samples, 4);
  EXPECT_EQ(pr.util_basis, "p75 of alice's runs of 'infer' with this command (4 runs)");
  EXPECT_EQ(pr.samples, 5) << "run times count every run";
  // A user without runs of their own gets every user's runs of that shape.
  EXPECT_EQ(p.Predict(share.Of("bob")).util_basis, "p75 of all 30% 0MiB jobs (4 runs)");
  // A measurement outside 0..100 is not history.
  p.Add(share.Of("carol"), 60, 250);
  p.Add(share.Of("carol"), 60, -5);
  EXPECT_EQ(p.Predict(share.Of("carol")).util_basis, "p75 of all 30% 0MiB jobs (4 runs)");
}

TEST(Predictor, HowMuchSlowerASharesSharedRunsWereThanItsRunsAlone) {
  DurationPredictor p;
  Spec share = Spec("infer", 0);
  share.gpu_milli = 300;
  p.Add(share.Of("alice"), 100, std::nullopt, false);
  p.Add(share.Of("alice"), 150, std::nullopt, true);
  EXPECT_EQ(p.Predict(share.Of("alice")).sharing_slowdown, 1) << "one run of each: not known";
  EXPECT_EQ(p.Predict(share.Of("alice")).sharing_basis, "");
  p.Add(share.Of("alice"), 120, std::nullopt, false);
  p.Add(share.Of("alice"), 180, std::nullopt, true);
  Prediction pr = p.Predict(share.Of("alice"));
  EXPECT_DOUBLE_EQ(pr.sharing_slowdown, 1.5) << "medians 165 / 110";
  EXPECT_EQ(pr.sharing_basis, "alice's runs of 'infer' with this command: 2 shared, 2 alone");
  // Runs whose sharing is not known (whole GPUs, older records) count for neither; faster when
  // shared is no slowdown.
  p.Add(share.Of("bob"), 200);
  p.Add(share.Of("bob"), 200);
  Spec other = Spec("fast", 0);
  other.gpu_milli = 300;
  for (double t : {100, 100}) p.Add(other.Of("carol"), t, std::nullopt, false);
  for (double t : {80, 80}) p.Add(other.Of("carol"), t, std::nullopt, true);
  EXPECT_EQ(p.Predict(other.Of("carol")).sharing_slowdown, 1);
}

// A trace's run has neither name nor command: its owner's runs of its shape, then everyone's.
TEST(Predictor, ARunKnownByNeitherNameNorCommandIsKnownByItsOwnerAndShape) {
  DurationPredictor p;
  core::Request share;
  share.gpu_milli = 500;
  share.gpu_memory_mib = 4096;
  share.share_gpus = 2;
  share.models = {"H100"};
  const RunKind alice{.user = "alice", .shape = HistoryShape(share)};
  EXPECT_EQ(alice.shape, "50% 4096MiB on 2 GPUs [H100]");
  for (double t : {10, 20}) p.Add(alice, t);
  Prediction own = p.Predict(alice);
  EXPECT_EQ(own.seconds, 20);
  EXPECT_EQ(own.basis, "p75 of alice's 50% 4096MiB on 2 GPUs [H100] jobs (2 runs)");
  RunKind bob = alice;
  bob.user = "bob";
  EXPECT_EQ(p.Predict(bob).basis, "p75 of all 50% 4096MiB on 2 GPUs [H100] jobs (2 runs)");
  p.Add(bob, 15);
  EXPECT_EQ(p.Predict(bob).seconds, 20) << "one run of bob's (15) is less than everyone's three";
  EXPECT_EQ(p.keys(), 3u) << "alice's, bob's and everyone's";
  core::Request whole;
  whole.gpus = 2;
  EXPECT_EQ(HistoryShape(whole, 4), "2 GPU x4");
  EXPECT_EQ(HistoryShape(core::Request{}), "no-GPU");
}

}  // namespace
}  // namespace tessera::sched
