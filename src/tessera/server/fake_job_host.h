#pragma once
// FakeJobHost: a JobHost for tests that touches nothing on the machine. Its processes are a
// FakeLauncher's (jobs "sleep N" on a fake clock); it confines every job when told to (recording
// each cgroup's limits), refuses confinement when told to, answers a cgroup's accounting as set,
// keeps a cgroup "busy" for as many removals as set, records the regions it was asked to make and
// remove, the containers removed, and who may write the arbiter. Thread-safe.

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/server/fake_launcher.h"
#include "tessera/server/job_host.h"

namespace tessera::server {

class FakeJobHost final : public JobHost {
 public:
  // `launcher` must outlive the host.
  explicit FakeJobHost(FakeLauncher& launcher) : launcher_(launcher) {}

  // ---- what the test sets ----
  void set_confines(bool on) {
    std::lock_guard lock(mu_);
    confines_ = on;
  }
  void RefuseConfinement(std::string why) {
    std::lock_guard lock(mu_);
    refuse_ = std::move(why);
  }
  void SetUsage(int64_t job, CgroupUsage usage) {
    std::lock_guard lock(mu_);
    usage_[job] = usage;
  }
  // Called with each job's id as its launch begins (its start already recorded), outside the
  // host's lock: what a reader sees while a process is being made.
  void set_on_launch(std::function<void(int64_t)> f) {
    std::lock_guard lock(mu_);
    on_launch_ = std::move(f);
  }
  // Called at each RepairArbiter, which the dispatcher asks under its scheduling lock: a test
  // holds the lock as long as `f` runs.
  void set_on_repair_arbiter(std::function<void()> f) {
    std::lock_guard lock(mu_);
    on_repair_arbiter_ = std::move(f);
  }
  // What ReadShare answers for `job` from now on (nothing measured until set).
  void SetShareUse(int64_t job, ShareUse use) {
    std::lock_guard lock(mu_);
    share_use_[job] = use;
  }
  // What KernelLaunches answers for `region` from now on (0 until set).
  void SetKernelLaunches(const std::string& region, uint64_t n) {
    std::lock_guard lock(mu_);
    kernel_launches_[region] = n;
  }
  // The next `times` removals of job's cgroup find it busy.
  void KeepBusy(int64_t job, int times) {
    std::lock_guard lock(mu_);
    busy_[job] = times;
  }

  // ---- what the test reads ----
  struct Made {
    std::optional<CgroupLimits> limits;
    std::optional<ShareLimits> share;
    std::optional<uid_t> uid;
    std::optional<gid_t> gid;
    bool container = false;
  };
  std::map<int64_t, Made> launches() const {
    std::lock_guard lock(mu_);
    return launches_;
  }
  std::set<int64_t> cgroups() const {  // made and not removed
    std::lock_guard lock(mu_);
    return cgroups_;
  }
  int unconfine_calls(int64_t job) const {
    std::lock_guard lock(mu_);
    auto it = unconfine_calls_.find(job);
    return it == unconfine_calls_.end() ? 0 : it->second;
  }
  std::set<std::string> regions() const {  // made and not removed
    std::lock_guard lock(mu_);
    return regions_;
  }
  std::vector<int64_t> containers_removed() const {
    std::lock_guard lock(mu_);
    return containers_removed_;
  }
  std::vector<int64_t> private_dirs_removed() const {
    std::lock_guard lock(mu_);
    return private_dirs_removed_;
  }
  std::map<uint32_t, int> arbiter_users() const {
    std::lock_guard lock(mu_);
    return arbiter_users_;
  }

  // ---- JobHost ----
  absl::StatusOr<Launched> Launch(LaunchSpec& spec,
                                  const std::optional<CgroupLimits>& limits) override {
    std::function<void(int64_t)> on_launch;
    {
      std::lock_guard lock(mu_);
      on_launch = on_launch_;
    }
    if (on_launch) on_launch(spec.job_id);
    {
      std::lock_guard lock(mu_);
      launches_[spec.job_id] =
          Made{limits, spec.share, spec.uid, spec.gid, spec.container.has_value()};
      if (spec.share) regions_.insert(spec.share->region);
      if (limits) {
        if (!refuse_.empty())
          return absl::FailedPreconditionError("cannot confine the job: " + refuse_);
        cgroups_.insert(spec.job_id);
        spec.cgroup_procs = {"fake-cgroup/" + std::to_string(spec.job_id) + "/cgroup.procs"};
      }
    }
    auto launched = launcher_.Start(spec);
    if (!launched.ok() && limits) {
      std::lock_guard lock(mu_);
      cgroups_.erase(spec.job_id);
    }
    return launched;
  }
  bool Signal(pid_t pgid, int sig) override { return launcher_.Signal(pgid, sig); }
  std::optional<int> Reap(pid_t pid) override { return launcher_.Reap(pid); }
  bool Alive(pid_t pid, uint64_t start_time) override { return launcher_.Alive(pid, start_time); }
  bool WatchableByPidfd() const override { return false; }

  bool confines() const override {
    std::lock_guard lock(mu_);
    return confines_;
  }
  Confinement confinement() const override {
    std::lock_guard lock(mu_);
    if (!confines_) return Confinement{"none", "a fake host", nlohmann::json::object()};
    return Confinement{
        "fake", "", {{"devices", "fake"}, {"memory", "fake"}, {"cpu", "fake"}, {"pids", "fake"}}};
  }
  CgroupUsage Usage(int64_t job) override {
    std::lock_guard lock(mu_);
    auto it = usage_.find(job);
    return it == usage_.end() ? CgroupUsage{} : it->second;
  }
  bool Unconfine(int64_t job) override {
    std::lock_guard lock(mu_);
    ++unconfine_calls_[job];
    if (int& b = busy_[job]; b > 0) {
      --b;
      return false;
    }
    cgroups_.erase(job);
    return true;
  }
  size_t Sweep(const std::set<int64_t>& keep) override {
    std::lock_guard lock(mu_);
    return std::erase_if(cgroups_, [&](int64_t id) { return !keep.contains(id); });
  }
  void RemovePrivateDirs(int64_t job) override {
    std::lock_guard lock(mu_);
    private_dirs_removed_.push_back(job);
  }
  void Close() override {}

  void UseContainers(const ContainerRuntime&) override {}
  void RemoveContainer(int64_t job) override {
    std::lock_guard lock(mu_);
    containers_removed_.push_back(job);
  }

  ShareUse ReadShare(int64_t job, const std::vector<int>&, bool, const std::string&) override {
    std::lock_guard lock(mu_);
    auto it = share_use_.find(job);
    return it == share_use_.end() ? ShareUse{} : it->second;
  }
  void RemoveRegion(const std::string& region) override {
    std::lock_guard lock(mu_);
    regions_.erase(region);
  }
  uint64_t KernelLaunches(const std::string& region) override {
    std::lock_guard lock(mu_);
    auto it = kernel_launches_.find(region);
    return it == kernel_launches_.end() ? 0 : it->second;
  }

  void ArbiterUser(uint32_t uid, int delta) override {
    std::lock_guard lock(mu_);
    if ((arbiter_users_[uid] += delta) <= 0) arbiter_users_.erase(uid);
  }
  void RepairArbiter() override {
    std::function<void()> f;
    {
      std::lock_guard lock(mu_);
      f = on_repair_arbiter_;
    }
    if (f) f();
  }
  std::string arbiter_access() const override { return "a fake host"; }
  void TidyArbiter(const std::vector<int64_t>&) override {}

 private:
  FakeLauncher& launcher_;
  mutable std::mutex mu_;
  bool confines_ = false;
  std::string refuse_;
  std::map<int64_t, CgroupUsage> usage_;
  std::map<int64_t, int> busy_;
  std::map<int64_t, Made> launches_;
  std::set<int64_t> cgroups_;
  std::map<int64_t, int> unconfine_calls_;
  std::set<std::string> regions_;
  std::vector<int64_t> containers_removed_;
  std::vector<int64_t> private_dirs_removed_;
  std::map<uint32_t, int> arbiter_users_;
  std::function<void(int64_t)> on_launch_;
  std::function<void()> on_repair_arbiter_;
  std::map<int64_t, ShareUse> share_use_;
  std::map<std::string, uint64_t> kernel_launches_;
};

}  // namespace tessera::server
