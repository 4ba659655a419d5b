#pragma once
// Quotas per owner (namespace/user): hard limits on whole GPUs, GPU compute share and GPU memory,
// and optional borrowing of quota other owners leave idle. Borrowed usage is marked so that
// preemption can reclaim it for its rightful owner. Not thread-safe.

#include <cstdint>
#include <map>
#include <string>

namespace tessera::sched {

// Amounts of GPU resources. In limits, a negative value means unlimited.
struct GpuAmount {
  int64_t gpus = 0;       // whole GPUs
  int64_t gpu_milli = 0;  // compute, thousandths of a GPU (whole GPUs count 1000 each)
  int64_t gpu_memory_mib = 0;

  GpuAmount& operator+=(const GpuAmount& o);
  GpuAmount& operator-=(const GpuAmount& o);
  friend bool operator==(const GpuAmount&, const GpuAmount&) = default;
};

struct OwnerQuota {
  GpuAmount limit{-1, -1, -1};         // the owner's own quota
  bool borrow = false;                 // may exceed `limit` with idle quota of others...
  GpuAmount borrow_limit{-1, -1, -1};  // ...up to this ceiling
  // Owners lend and borrow only within their cohort ("" is a cohort too: all owners without one).
  std::string cohort;
};

enum class QuotaVerdict { kAllowed, kBorrowing, kDenied };

class QuotaManager {
 public:
  void Set(const std::string& owner, const OwnerQuota& quota) {
    quotas_[owner] = quota;
    ++limits_version_;
  }
  const OwnerQuota* Get(const std::string& owner) const;
  // Replaces every quota at once (usage is kept).
  void Replace(std::map<std::string, OwnerQuota> quotas) {
    quotas_ = std::move(quotas);
    ++limits_version_;
  }
  // Bumped whenever the limits change (use changes with the allocations).
  uint64_t limits_version() const { return limits_version_; }

  // Whether `owner` may add `delta`. On kDenied, `why` says which limit ("owner alice: 3 of 4 GPUs
  // used, wants 2 more").
  QuotaVerdict Check(const std::string& owner, const GpuAmount& delta, std::string* why) const;
  // Whether `delta` alone is more than `owner` may ever hold at once - its limit, or its borrowing
  // ceiling when it may borrow - so that a job asking it could never start; `why` names the limit
  // ("alice's quota: at most 2 whole GPUs at once; asks 4").
  bool NeverAllows(const std::string& owner, const GpuAmount& delta, std::string* why) const;

  void Add(const std::string& owner, const GpuAmount& delta) { used_[owner] += delta; }
  void Sub(const std::string& owner, const GpuAmount& delta) { used_[owner] -= delta; }
  GpuAmount Used(const std::string& owner) const;
  // True when `owner` uses less than its own limit in every dimension after adding `delta`.
  bool WithinOwnLimit(const std::string& owner, const GpuAmount& delta) const;

 private:
  // Quota that owners of `owner`'s cohort other than itself hold and neither use nor lend already
  // (what other borrowers of the cohort have taken beyond their own limits is not idle).
  GpuAmount IdleElsewhere(const std::string& owner) const;

  std::map<std::string, OwnerQuota> quotas_;
  uint64_t limits_version_ = 0;
  std::map<std::string, GpuAmount> used_;
};

}  // namespace tessera::sched
