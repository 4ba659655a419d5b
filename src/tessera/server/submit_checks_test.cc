// A submission's checks alone (submit_checks.h), against a server's config and a machine of two
// Tesla T4s (15 GiB each), 8 CPUs and 32 GiB.
#include "tessera/server/submit_checks.h"

#include <gtest/gtest.h>

#include "tessera/devices/inventory.h"
#include "tessera/devices/simulated_source.h"
#include "tessera/server/rights.h"

namespace tessera::server {
namespace {

class SubmitChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto machine = devices::LoadSimulatedMachine("t4x2");
    ASSERT_TRUE(machine.ok()) << machine.status();
    inventory_ = machine->inventory;
    node_ = core::NodeFromInventory(inventory_, 8000, 32768);
    config_.max_grace_period_s = 60;
    config_.max_runtime_s = 86400;
    config_.default_runtime_s = 3600;
    setup_ = {.config = &config_, .inventory = &inventory_, .containers_off = "podman: not found"};
  }
  static JobSpec Spec() {
    JobSpec s;
    s.command = {"x"};
    return s;
  }
  // The check of `s` as alice's request; "" when it passes, else "<status> <message>".
  std::string Fits(const JobSpec& s) {
    const absl::Status st =
        CheckFits(s, RequestOf(s, 1, "alice"), node_, quotas_, inventory_.gpus.size());
    return st.ok() ? "" : std::to_string(HttpStatusOf(st)) + " " + std::string(st.message());
  }
  std::string Limits(JobSpec& s) {
    const absl::Status st = CheckSubmitLimits(s, setup_);
    return st.ok() ? "" : std::to_string(HttpStatusOf(st)) + " " + std::string(st.message());
  }

  core::NodeInventory inventory_;
  core::NodeSpec node_;
  ServerConfig config_;
  SubmitSetup setup_;
  sched::QuotaManager quotas_;
};

TEST_F(SubmitChecksTest, TheServersLimitsAreHeldAndTheDefaultRuntimeFilledIn) {
  JobSpec s = Spec();
  EXPECT_EQ(Limits(s), "");
  EXPECT_EQ(s.max_runtime_s, 3600);  // Slurm's DefaultTime, stored with the job
  s = Spec();
  s.grace_period_s = 61;
  EXPECT_EQ(Limits(s),
            "400 grace_period_s: 61 s is over this server's maximum of 60 s "
            "(preemption.max_grace_period_s in its config)");
  s = Spec();
  s.max_runtime_s = 86401;
  EXPECT_NE(Limits(s).find("400 max_runtime_s: "), std::string::npos) << Limits(s);
  s = Spec();
  s.image = "busybox";
  EXPECT_EQ(Limits(s), "400 image: this server cannot run containers: podman: not found");
  setup_.containers = true;
  EXPECT_EQ(Limits(s), "");
}

TEST_F(SubmitChecksTest, APartOfAModelsNameStandsForTheMachinesModelsThatHaveIt) {
  JobSpec s = Spec();
  s.gpus = 1;
  s.models = {"T4"};
  EXPECT_EQ(Limits(s), "");
  EXPECT_EQ(s.models, std::vector<std::string>{"Tesla T4"});
  s.models = {"H100"};
  const std::string e = Limits(s);
  EXPECT_EQ(e.substr(0, 4), "400 ") << e;
  EXPECT_NE(e.find("H100"), std::string::npos) << e;
}

TEST_F(SubmitChecksTest, WhatCouldNeverStartHereIsRefusedNamingWhat) {
  JobSpec s = Spec();
  s.gpus = 2;
  EXPECT_EQ(Fits(s), "");
  s.gpus = 3;
  EXPECT_EQ(Fits(s),
            "400 resources: this machine has 2 matching GPU(s) of 2; the job could never start");
  s = Spec();
  s.gpus = 1;
  s.gpu_memory_mib = 20480;
  EXPECT_EQ(Fits(s),
            "400 resources.gpu_memory: 20 GiB per GPU asked; the largest GPU here has 15 GiB: "
            "the job could never start");
  s = Spec();
  s.cpu_milli = 9000;
  EXPECT_EQ(Fits(s),
            "400 resources.cpus: 9 CPUs asked, this machine has 8; the job could never start");
  s = Spec();
  s.memory_mib = 40000;
  EXPECT_EQ(Fits(s),
            "400 resources.memory: 40000 MiB asked, this machine has 32768 MiB; the job could "
            "never start");
}

TEST_F(SubmitChecksTest, AQuotaThatCouldNeverAllowTheJobRefusesIt) {
  sched::OwnerQuota q;
  q.limit = {1, -1, -1};  // one whole GPU, no borrowing
  quotas_.Set("alice", q);
  JobSpec s = Spec();
  s.gpus = 1;
  EXPECT_EQ(Fits(s), "");
  s.gpus = 2;
  const std::string e = Fits(s);
  EXPECT_EQ(e.substr(0, 15), "400 resources: ") << e;
  EXPECT_NE(e.find("the job could never start"), std::string::npos) << e;
}

}  // namespace
}  // namespace tessera::server
