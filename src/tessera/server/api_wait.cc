// GET /v1/jobs/N/wait: a client that follows a job (tessera run) told at once of what changed.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/server/api.h"
#include "tessera/server/api_response.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/server_util.h"

namespace tessera::server {

using json = nlohmann::json;

namespace {
// How often a waiting request looks at the output's size (a state change wakes it at once).
constexpr double kOutputCheckS = 0.005;
constexpr double kMaxWaitS = 30;
}  // namespace

Api::LogFile Api::LogFileOf(const JobRecord& r, const JobSpec* spec, int task, bool stderr_stream) {
  if (spec != nullptr) {
    std::string user =
        d_.OutputFile(r.id, r.array_id, r.array_index, r.owner, *spec, task, stderr_stream);
    if (!user.empty()) return {std::move(user), true};
  }
  const char* suffix = stderr_stream ? ".err" : ".out";
  return {task == 0 ? d_.JobFile("logs", r.id, suffix) : d_.TaskLog(r.id, task, suffix), false};
}

net::HttpResponse Api::Wait(const net::HttpRequest& req, int64_t id, const Caller& c) {
  // The store's version before the job is read: a commit after it is seen below.
  uint64_t seen = 0;
  (void)d_.feed().Wait(&seen, 0);
  auto r = store_.Get(id);
  if (!r.ok()) return StatusError(r.status());
  if (!c.admin && r->owner != c.user) {
    return Error(403, fmt::format("job {} belongs to {}; only its owner or an admin may follow it",
                                  id, r->owner));
  }
  for (const auto& [k, v] : req.query) {
    if (k != "state" && k != "bytes" && k != "timeout_s")
      return Error(400, fmt::format("unknown query parameter '{}' (state, bytes, timeout_s)", k));
  }
  const std::string known = req.query.contains("state") ? req.query.at("state") : "";
  if (!known.empty() && !ParseJobState(known))
    return Error(400, fmt::format("state: unknown state '{}'", known));
  int64_t bytes = -1;
  if (auto it = req.query.find("bytes"); it != req.query.end()) {
    auto v = it->second == "0" ? std::optional<int64_t>(0) : ParseId(it->second);
    if (!v) return Error(400, fmt::format("bytes: expected a byte count, got '{}'", it->second));
    bytes = *v;
  }
  double timeout = 10;
  if (auto it = req.query.find("timeout_s"); it != req.query.end()) {
    char* end = nullptr;
    timeout = std::strtod(it->second.c_str(), &end);
    if (end == it->second.c_str() || *end != '\0' || !(timeout >= 0 && timeout <= kMaxWaitS))
      return Error(400, fmt::format("timeout_s: expected 0..{:.0f} seconds, got '{}'", kMaxWaitS,
                                    it->second));
  }
  // Its output: every task's stdout and stderr, where the logs endpoint reads them (the paths
  // found once; their sizes looked at often).
  auto spec = ParseJobSpec(r->spec_json);
  std::vector<LogFile> files;
  for (int task = 0; task < (spec.ok() ? spec->Tasks() : 1); ++task) {
    for (const bool err : {false, true})
      files.push_back(LogFileOf(*r, spec.ok() ? &*spec : nullptr, task, err));
  }
  auto output_bytes = [&] {
    int64_t total = 0;
    for (const LogFile& f : files) {
      struct stat st {};
      if (lstat(f.path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          (!f.user || st.st_uid == r->owner_uid))
        total += st.st_size;
    }
    return total;
  };
  // Until the job's state is not `state`, its output is more than `bytes`, or the time is up. The
  // store's commits wake it (the job read again only then); the output is looked at every few ms.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  for (;;) {
    const int64_t now_bytes = output_bytes();
    const bool changed = JobStateName(r->state) != known || now_bytes > bytes;
    if (changed || std::chrono::steady_clock::now() >= deadline) {
      return JsonResponse(200, json{{"state", JobStateName(r->state)},
                                    {"ended", IsTerminal(r->state)},
                                    {"bytes", now_bytes},
                                    {"changed", changed}});
    }
    const uint64_t before = seen;
    if (!d_.feed().Wait(&seen, kOutputCheckS)) return Error(503, "the server is stopping");
    if (seen != before) {
      r = store_.Get(id);
      if (!r.ok()) return StatusError(r.status());
    }
  }
}

}  // namespace tessera::server
