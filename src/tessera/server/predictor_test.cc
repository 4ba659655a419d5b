// Run-time predictions from history: the nearest key with enough runs, the 75th percentile, the
// max runtime as a cap and as the answer without history.
#include "tessera/server/predictor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

JobSpec Spec(const std::string& name, int gpus, double max_runtime = 0) {
  JobSpec s;
  s.command = {"python", "train.py"};
  s.name = name;
  s.gpus = gpus;
  s.max_runtime_s = max_runtime;
  return s;
}

TEST(Predictor, NearestKeyWithEnoughRunsAndItsSeventyFifthPercentile) {
  DurationPredictor p;
  EXPECT_EQ(p.Predict(Spec("train", 2), "alice").seconds, 0) << "no history";
  Prediction limit = p.Predict(Spec("train", 2, 600), "alice");
  EXPECT_EQ(limit.seconds, 600);
  EXPECT_EQ(limit.basis, "its max runtime");
  for (double t : {100, 200, 300, 400}) p.Add(Spec("train", 2), "alice", t);
  Prediction own = p.Predict(Spec("train", 2), "alice");
  EXPECT_EQ(own.seconds, 300) << "p75 of 100..400";
  EXPECT_EQ(own.samples, 4);
  EXPECT_THAT(own.basis, HasSubstr("alice's runs of 'train' with this command (4 runs)"));
  EXPECT_EQ(p.Predict(Spec("train", 2, 250), "alice").seconds, 250) << "capped";
  // Another of alice's two-GPU jobs: her jobs of that shape; bob's: everyone's of that shape.
  EXPECT_THAT(p.Predict(Spec("eval", 2), "alice").basis, HasSubstr("alice's 2 GPU jobs"));
  EXPECT_THAT(p.Predict(Spec("train", 2), "bob").basis, HasSubstr("all 2 GPU jobs"));
  EXPECT_EQ(p.Predict(Spec("train", 1), "alice").seconds, 0) << "another shape";
  // One run of its own is less than three of a wider key; three of its own win.
  p.Add(Spec("eval", 2), "alice", 10);
  EXPECT_THAT(p.Predict(Spec("eval", 2), "alice").basis, HasSubstr("alice's 2 GPU jobs (5 runs)"));
  p.Add(Spec("eval", 2), "alice", 10);
  p.Add(Spec("eval", 2), "alice", 10);
  EXPECT_EQ(p.Predict(Spec("eval", 2), "alice").seconds, 10);
  // Only the last kKept runs count.
  for (size_t i = 0; i < DurationPredictor::kKept; ++i) p.Add(Spec("train", 2), "alice", 50);
  EXPECT_EQ(p.Predict(Spec("train", 2), "alice").seconds, 50);
  p.Add(Spec("train", 2), "alice", -1);  // nonsense is not history
  EXPECT_EQ(p.Predict(Spec("train", 2), "alice").seconds, 50);
}

// Comparable runs first: the same name with another command (`--epochs 1` against 100) is the
// name's history only while this command has none of its own.
TEST(Predictor, ANamedJobsRunsOfTheSameCommandComeFirst) {
  DurationPredictor p;
  JobSpec quick = Spec("train", 1), full = Spec("train", 1);
  quick.command = {"python", "train.py", "--epochs", "1"};
  full.command = {"python", "train.py", "--epochs", "100"};
  for (double t : {2, 2, 2}) p.Add(quick, "alice", t);
  Prediction before = p.Predict(full, "alice");
  EXPECT_EQ(before.seconds, 2);
  EXPECT_THAT(before.basis, HasSubstr("alice's runs of 'train' (3 runs)"));
  for (double t : {600, 610, 620}) p.Add(full, "alice", t);
  Prediction after = p.Predict(full, "alice");
  EXPECT_EQ(after.seconds, 620) << "p75 of 600, 610, 620";
  EXPECT_THAT(after.basis, HasSubstr("alice's runs of 'train' with this command (3 runs)"));
  EXPECT_EQ(p.Predict(quick, "alice").seconds, 2);
}

TEST(Predictor, UtilizationFromTheRunsThatMeasuredIt) {
  DurationPredictor p;
  JobSpec share = Spec("infer", 0);
  share.gpu_milli = 300;
  // Runs without a measurement teach run times, not utilization.
  p.Add(share, "alice", 60);
  EXPECT_EQ(p.Predict(share, "alice").util_pct, 0);
  EXPECT_EQ(p.Predict(share, "alice").util_samples, 0);
  for (double u : {20, 40, 30, 35}) p.Add(share, "alice", 60, u);
  Prediction pr = p.Predict(share, "alice");
  EXPECT_EQ(pr.util_pct, 35) << "p75 of 20, 30, 35, 40";
  EXPECT_EQ(pr.util_samples, 4);
  EXPECT_EQ(pr.util_basis, "p75 of alice's runs of 'infer' with this command (4 runs)");
  EXPECT_EQ(pr.samples, 5) << "run times count every run";
  // A user without runs of their own gets every user's runs of that shape.
  EXPECT_EQ(p.Predict(share, "bob").util_basis, "p75 of all 30% 0MiB jobs (4 runs)");
  // A measurement outside 0..100 is not history.
  p.Add(share, "carol", 60, 250);
  p.Add(share, "carol", 60, -5);
  EXPECT_EQ(p.Predict(share, "carol").util_basis, "p75 of all 30% 0MiB jobs (4 runs)");
}

TEST(Predictor, HowMuchSlowerASharesSharedRunsWereThanItsRunsAlone) {
  DurationPredictor p;
  JobSpec share = Spec("infer", 0);
  share.gpu_milli = 300;
  p.Add(share, "alice", 100, std::nullopt, false);
  p.Add(share, "alice", 150, std::nullopt, true);
  EXPECT_EQ(p.Predict(share, "alice").sharing_slowdown, 1) << "one run of each: not known";
  EXPECT_EQ(p.Predict(share, "alice").sharing_basis, "");
  p.Add(share, "alice", 120, std::nullopt, false);
  p.Add(share, "alice", 180, std::nullopt, true);
  Prediction pr = p.Predict(share, "alice");
  EXPECT_DOUBLE_EQ(pr.sharing_slowdown, 1.5) << "medians 165 / 110";
  EXPECT_EQ(pr.sharing_basis, "alice's runs of 'infer' with this command: 2 shared, 2 alone");
  // Runs whose sharing is not known (whole GPUs, older records) count for neither; faster when
  // shared is no slowdown.
  p.Add(share, "bob", 200);
  p.Add(share, "bob", 200);
  JobSpec other = Spec("fast", 0);
  other.gpu_milli = 300;
  for (double t : {100, 100}) p.Add(other, "carol", t, std::nullopt, false);
  for (double t : {80, 80}) p.Add(other, "carol", t, std::nullopt, true);
  EXPECT_EQ(p.Predict(other, "carol").sharing_slowdown, 1);
}

}  // namespace
}  // namespace tessera::server
