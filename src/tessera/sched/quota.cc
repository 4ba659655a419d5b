#include "tessera/sched/quota.h"

#include <algorithm>

#include "fmt/format.h"

namespace tessera::sched {
namespace {

bool Over(int64_t limit, int64_t value) { return limit >= 0 && value > limit; }

}  // namespace

GpuAmount& GpuAmount::operator+=(const GpuAmount& o) {
  gpus += o.gpus;
  gpu_milli += o.gpu_milli;
  gpu_memory_mib += o.gpu_memory_mib;
  return *this;
}

GpuAmount& GpuAmount::operator-=(const GpuAmount& o) {
  gpus -= o.gpus;
  gpu_milli -= o.gpu_milli;
  gpu_memory_mib -= o.gpu_memory_mib;
  return *this;
}

const OwnerQuota* QuotaManager::Get(const std::string& owner) const {
  auto it = quotas_.find(owner);
  return it == quotas_.end() ? nullptr : &it->second;
}

GpuAmount QuotaManager::Used(const std::string& owner) const {
  auto it = used_.find(owner);
  return it == used_.end() ? GpuAmount{} : it->second;
}

GpuAmount QuotaManager::IdleElsewhere(const std::string& owner) const {
  const OwnerQuota* mine = Get(owner);
  const std::string cohort = mine ? mine->cohort : "";
  GpuAmount idle;
  // Idle quota of the lenders, less what the cohort's other borrowers already use beyond theirs.
  auto lend = [](int64_t limit, int64_t used) { return limit >= 0 ? limit - used : 0; };
  for (const auto& [name, q] : quotas_) {
    if (name == owner || q.cohort != cohort) continue;
    GpuAmount used = Used(name);
    idle.gpus += lend(q.limit.gpus, used.gpus);
    idle.gpu_milli += lend(q.limit.gpu_milli, used.gpu_milli);
    idle.gpu_memory_mib += lend(q.limit.gpu_memory_mib, used.gpu_memory_mib);
  }
  idle.gpus = std::max<int64_t>(0, idle.gpus);
  idle.gpu_milli = std::max<int64_t>(0, idle.gpu_milli);
  idle.gpu_memory_mib = std::max<int64_t>(0, idle.gpu_memory_mib);
  return idle;
}

bool QuotaManager::WithinOwnLimit(const std::string& owner, const GpuAmount& delta) const {
  const OwnerQuota* q = Get(owner);
  if (q == nullptr) return true;
  GpuAmount after = Used(owner);
  after += delta;
  return !Over(q->limit.gpus, after.gpus) && !Over(q->limit.gpu_milli, after.gpu_milli) &&
         !Over(q->limit.gpu_memory_mib, after.gpu_memory_mib);
}

bool QuotaManager::NeverAllows(const std::string& owner, const GpuAmount& delta,
                               std::string* why) const {
  const OwnerQuota* q = Get(owner);
  if (q == nullptr) return false;
  const GpuAmount& ceiling = q->borrow ? q->borrow_limit : q->limit;
  const char* kind = q->borrow ? " (with borrowing)" : "";
  std::string said;
  if (Over(ceiling.gpus, delta.gpus)) {
    said = fmt::format("{}'s quota{}: at most {} whole GPUs at once; asks {}", owner, kind,
                       ceiling.gpus, delta.gpus);
  } else if (Over(ceiling.gpu_milli, delta.gpu_milli)) {
    said = fmt::format("{}'s quota{}: at most {:g} GPUs of compute at once; asks {:g}", owner, kind,
                       ceiling.gpu_milli / 1000.0, delta.gpu_milli / 1000.0);
  } else if (Over(ceiling.gpu_memory_mib, delta.gpu_memory_mib)) {
    said = fmt::format("{}'s quota{}: at most {} MiB of GPU memory at once; asks {} MiB", owner,
                       kind, ceiling.gpu_memory_mib, delta.gpu_memory_mib);
  } else {
    return false;
  }
  if (why) *why = said;
  return true;
}

QuotaVerdict QuotaManager::Check(const std::string& owner, const GpuAmount& delta,
                                 std::string* why) const {
  const OwnerQuota* q = Get(owner);
  if (q == nullptr) return QuotaVerdict::kAllowed;
  GpuAmount used = Used(owner);
  GpuAmount after = used;
  after += delta;
  if (WithinOwnLimit(owner, delta)) return QuotaVerdict::kAllowed;
  auto describe = [&](const GpuAmount& limit, const char* kind) {
    if (Over(limit.gpus, after.gpus)) {
      return fmt::format("owner {}: {} of {} whole GPUs used{}, wants {} more", owner, used.gpus,
                         limit.gpus, kind, delta.gpus);
    }
    if (Over(limit.gpu_milli, after.gpu_milli)) {
      return fmt::format("owner {}: {} of {} GPU-thousandths used{}, wants {} more", owner,
                         used.gpu_milli, limit.gpu_milli, kind, delta.gpu_milli);
    }
    return fmt::format("owner {}: {} of {} MiB GPU memory used{}, wants {} more", owner,
                       used.gpu_memory_mib, limit.gpu_memory_mib, kind, delta.gpu_memory_mib);
  };
  if (!q->borrow) {
    if (why) *why = describe(q->limit, "");
    return QuotaVerdict::kDenied;
  }
  // Borrowing: stay under the ceiling, and borrow no more than others leave idle.
  if (Over(q->borrow_limit.gpus, after.gpus) || Over(q->borrow_limit.gpu_milli, after.gpu_milli) ||
      Over(q->borrow_limit.gpu_memory_mib, after.gpu_memory_mib)) {
    if (why) *why = describe(q->borrow_limit, " (borrowing ceiling)");
    return QuotaVerdict::kDenied;
  }
  GpuAmount idle = IdleElsewhere(owner);
  auto excess = [](int64_t limit, int64_t value) {
    return limit >= 0 ? std::max<int64_t>(0, value - limit) : 0;
  };
  if (excess(q->limit.gpus, after.gpus) > idle.gpus ||
      excess(q->limit.gpu_milli, after.gpu_milli) > idle.gpu_milli ||
      excess(q->limit.gpu_memory_mib, after.gpu_memory_mib) > idle.gpu_memory_mib) {
    if (why) *why = describe(q->limit, "") + "; not enough idle quota to borrow";
    return QuotaVerdict::kDenied;
  }
  return QuotaVerdict::kBorrowing;
}

}  // namespace tessera::sched
