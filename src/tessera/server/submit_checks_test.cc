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
  // What a check said: "" when it passed, else "<status> <message>".
  static std::string Said(const absl::Status& st) {
    return st.ok() ? "" : std::to_string(HttpStatusOf(st)) + " " + std::string(st.message());
  }
  // The check of `s` as alice's request.
  std::string Fits(const JobSpec& s) {
    return Said(CheckFits(s, RequestOf(s, 1, "alice"), node_, quotas_, inventory_.gpus.size()));
  }
  std::string Limits(JobSpec& s) { return Said(CheckSubmitLimits(s, setup_)); }

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

// What the server's state says: the disk's room, the user's caps on what waits, an
// Idempotency-Key's form.
TEST_F(SubmitChecksTest, TheDiskTheQueueCapsAndTheKeyAreHeld) {
  config_.state_dir = "/tmp";
  EXPECT_EQ(Said(CheckDiskRoom(config_, false)), "");
  EXPECT_EQ(Said(CheckDiskRoom(config_, true)),
            "507 the server's disk (/tmp) filled up: its reserve went to record how jobs ended; "
            "no new work until room is made");
  config_.min_free_disk_bytes = uint64_t{1} << 62;  // more than any disk has free
  EXPECT_EQ(Said(CheckDiskRoom(config_, false)).substr(0, 3), "507");
  config_.max_queued_jobs_per_user = 10;
  config_.max_queued_bytes_per_user = 1000;
  EXPECT_EQ(Said(CheckQueueRoom(config_, "alice", 9, 1, 0, 1000)), "");
  EXPECT_EQ(Said(CheckQueueRoom(config_, "alice", 9, 2, 0, 10)),
            "429 alice has 9 jobs waiting and this would add 2: at most 10 per user "
            "(limits.max_queued_jobs_per_user in the server's config)");
  EXPECT_EQ(Said(CheckQueueRoom(config_, "alice", 0, 1, 900, 101)).substr(0, 45),
            "429 alice's waiting jobs hold 900 B (commands");
  EXPECT_EQ(Said(CheckIdempotencyKey("")), "");
  EXPECT_EQ(Said(CheckIdempotencyKey(std::string(128, 'k'))), "");
  for (const std::string& bad : {std::string(129, 'k'), std::string("a b"), std::string("a\x01")})
    EXPECT_EQ(Said(CheckIdempotencyKey(bad)).substr(0, 18), "400 Idempotency-Ke") << bad;
}

// Dependencies on jobs that exist and can still turn out as asked.
TEST_F(SubmitChecksTest, ADependencyOnAJobThatIsNotOrCanNeverTurnOutAsAskedIsRefused) {
  const DependencyLookup look{.exists = [](int64_t job, int task) -> absl::Status {
                                if (job == 99) return absl::InternalError("store: disk I/O error");
                                if (job > 5 || task > 3) return absl::NotFoundError("no such job");
                                return absl::OkStatus();
                              },
                              .outcome =
                                  [](const Dependency& d) {
                                    return d.job == 2 ? DependencyState{DependencyState::kNotOk,
                                                                        "job 2 failed"}
                                                      : DependencyState{};
                                  }};
  auto said = [&](std::vector<Dependency> after) { return Said(CheckDependencies(after, look)); };
  EXPECT_EQ(said({{.job = 1}, {.job = 3, .task = 2}}), "");
  EXPECT_EQ(said({{.job = 1}, {.job = 7}}),
            "400 after ok:7: job 7 does not exist (a dependency names a job submitted before, so "
            "dependencies never form a cycle)");
  EXPECT_EQ(said({{.job = 3, .task = 4}}).substr(0, 34), "400 after ok:3_4: job 3_4 does not");
  EXPECT_EQ(said({{.job = 2}}).substr(0, 16), "422 after ok:2: ");
  EXPECT_EQ(said({{.kind = Dependency::Kind::kNotOk, .job = 2}}), "") << "failed, as asked";
  EXPECT_EQ(said({{.job = 99}}), "500 store: disk I/O error");
}

}  // namespace
}  // namespace tessera::server
