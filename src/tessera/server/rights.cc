#include "tessera/server/rights.h"

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/cord.h"
#include "fmt/format.h"
#include "tessera/server/runner.h"
#include "tessera/server/server_util.h"

namespace tessera::server {

absl::Status HttpError(int http, const std::string& message) {
  absl::Status st(http == 404   ? absl::StatusCode::kNotFound
                  : http == 400 ? absl::StatusCode::kInvalidArgument
                  : http == 403 ? absl::StatusCode::kPermissionDenied
                  : http == 409 ? absl::StatusCode::kFailedPrecondition
                  : http >= 500 ? absl::StatusCode::kInternal
                                : absl::StatusCode::kInvalidArgument,
                  message);
  st.SetPayload("tessera.io/http-status", absl::Cord(std::to_string(http)));
  return st;
}

int HttpStatusOf(const absl::Status& st) {
  if (auto p = st.GetPayload("tessera.io/http-status")) return std::atoi(std::string(*p).c_str());
  if (st.code() == absl::StatusCode::kNotFound) return 404;
  if (st.code() == absl::StatusCode::kInvalidArgument) return 400;
  if (st.code() == absl::StatusCode::kUnavailable) return 503;
  return 500;
}

bool Rights::IsAdmin(const std::string& user, uint32_t uid) const {
  if (uid == 0 || uid == geteuid() || config_.admins.contains(user)) return true;
  return std::any_of(config_.tokens.begin(), config_.tokens.end(),
                     [&](const ApiToken& t) { return t.admin && t.user == user; });
}

std::vector<std::string> Rights::UserGroups(uint32_t uid) {
  {
    core::MutexLock lock(mu_);
    if (auto it = groups_.find(uid); it != groups_.end()) return it->second;
  }
  std::vector<std::string> out;
  for (gid_t gid : AccountGroups(uid)) {
    group gr;
    group* g = nullptr;
    std::vector<char> gbuf(16384);
    if (getgrgid_r(gid, &gr, gbuf.data(), gbuf.size(), &g) == 0 && g) {
      std::string key = std::string("group:") + g->gr_name;
      if (std::find(out.begin(), out.end(), key) == out.end()) out.push_back(key);
    }
  }
  core::MutexLock lock(mu_);
  groups_[uid] = out;
  return out;
}

std::vector<std::string> Rights::Principals(const Caller& caller) {
  std::vector<std::string> out = UserGroups(caller.uid);
  out.insert(out.begin(), caller.user);
  return out;
}

int Rights::PriorityCeiling(const Caller& caller) {
  if (caller.admin) return 1000;
  int ceiling = config_.priority_ceiling;
  for (const std::string& who : Principals(caller)) {
    if (auto it = config_.priority_ceilings.find(who); it != config_.priority_ceilings.end()) {
      ceiling = std::max(ceiling, it->second);
    }
  }
  return ceiling;
}

bool Rights::MayPreemptOthers(const Caller& caller) {
  if (caller.admin) return true;
  const std::vector<std::string> who = Principals(caller);
  return std::any_of(who.begin(), who.end(),
                     [&](const std::string& p) { return config_.preempt_others.contains(p); });
}

absl::Status Rights::MaySetPriority(int priority, const Caller& caller) {
  if (int ceiling = PriorityCeiling(caller); priority > ceiling) {
    return HttpError(403, fmt::format("priority {} is above {}'s ceiling of {} (priority_ceiling "
                                      "and priority_ceilings in the server's config)",
                                      priority, caller.user, ceiling));
  }
  return absl::OkStatus();
}

absl::Status Rights::MaySubmit(const JobSpec& spec, const Caller& caller) {
  if (absl::Status st = MaySetPriority(spec.priority, caller); !st.ok()) return st;
  if (geteuid() != 0 && caller.uid != geteuid()) {
    return HttpError(403, fmt::format("this server runs as {} and cannot start jobs as {}",
                                      UserName(geteuid()), caller.user));
  }
  if (RunsAsRoot(caller.uid) && !config_.allow_root_jobs) {
    return HttpError(403,
                     "jobs do not run as root on this server: submit as an ordinary user, or set "
                     "allow_root_jobs: true in the server's config");
  }
  return absl::OkStatus();
}

absl::Status Rights::MayDependOn(
    const JobSpec& spec, const Caller& caller,
    const std::function<std::optional<std::string>(int64_t job)>& owner_of) {
  if (caller.admin) return absl::OkStatus();
  for (const Dependency& d : spec.after) {
    std::optional<std::string> owner = owner_of(d.job);
    if (!owner || *owner == caller.user) continue;
    const std::string ref =
        d.task >= 0 ? fmt::format("{}_{}", d.job, d.task) : std::to_string(d.job);
    return HttpError(403, fmt::format("after {}: job {} belongs to {}; a dependency may name only "
                                      "your own jobs (admins: anyone's)",
                                      DependencyText(d), ref, *owner));
  }
  return absl::OkStatus();
}

}  // namespace tessera::server
