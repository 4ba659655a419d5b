#pragma once
// Who may do what on this server, from its config: the API asks before it acts (issue 32: every
// rights check in one room). Who is an admin, a user's groups (cached), their priority ceiling,
// whether their jobs may preempt others', and whether a submission or a priority change is theirs
// to make. Thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "tessera/core/mutex.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/server.h"

namespace tessera::server {

// Who asks: the user and uid the API established (unix peer credentials or a token).
struct Caller {
  std::string user;
  uint32_t uid = 0;
  bool admin = false;
};

// An error the API answers with HTTP status `http`; HttpStatusOf gives it back (404 for kNotFound,
// 400 for kInvalidArgument, 500 for the rest of errors without one).
absl::Status HttpError(int http, const std::string& message);
int HttpStatusOf(const absl::Status& st);

class Rights {
 public:
  // `config` must outlive this.
  explicit Rights(const ServerConfig& config) : config_(config) {}

  // root, the server's own user, a configured admin, or an admin token's user.
  bool IsAdmin(const std::string& user, uint32_t uid) const;
  // "group:<name>" for each group of the account (cached per uid).
  std::vector<std::string> UserGroups(uint32_t uid);
  // The highest priority the caller may ask for (priority_ceiling, raised by priority_ceilings
  // for the user or any of their groups; 1000 for admins).
  int PriorityCeiling(const Caller& caller);
  // Whether the caller's jobs may preempt other users' (preemption.preempt_others; admins).
  bool MayPreemptOthers(const Caller& caller);

  // 403 (HttpError) for a submission the caller may not make: a priority over their ceiling, a job
  // that would run as root where allow_root_jobs is off, a user this server (not root) cannot
  // become. OkStatus otherwise; what the job asks of the machine is the dispatcher's to judge.
  absl::Status MaySubmit(const JobSpec& spec, const Caller& caller);
  // 403 for a priority over the caller's ceiling.
  absl::Status MaySetPriority(int priority, const Caller& caller);
  // 403 for a dependency (`after`) on another user's job (admins: anyone's). `owner_of` says whose
  // a job is, nullopt for a job that does not exist (the dispatcher refuses those, 400).
  absl::Status MayDependOn(const JobSpec& spec, const Caller& caller,
                           const std::function<std::optional<std::string>(int64_t job)>& owner_of);

 private:
  std::vector<std::string> Principals(const Caller& caller);

  const ServerConfig& config_;
  core::Mutex mu_;
  std::map<uint32_t, std::vector<std::string>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::server
