// The API's admin-only upkeep: POST /v1/admin/purge.
#include <spdlog/spdlog.h>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/core/gpu.h"
#include "tessera/server/api.h"
#include "tessera/server/api_response.h"

namespace tessera::server {

using json = nlohmann::json;

net::HttpResponse Api::Purge(const net::HttpRequest& req, const Caller& c) {
  if (!c.admin) return Error(403, "only an admin may purge ended jobs");
  const json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object())
    return Error(400,
                 "expected a JSON object: {\"jobs_s\": AGE, \"logs_s\": AGE, "
                 "\"environments_s\": AGE} (seconds since the jobs ended; at least one)");
  Dispatcher::PurgeAges ages;
  for (const auto& [key, value] : body.items()) {
    std::optional<double>* field = key == "jobs_s"           ? &ages.jobs_s
                                   : key == "logs_s"         ? &ages.logs_s
                                   : key == "environments_s" ? &ages.environments_s
                                                             : nullptr;
    if (field == nullptr)
      return Error(400, fmt::format("unknown field '{}' (jobs_s, logs_s, environments_s)", key));
    if (!value.is_number() || value.get<double>() < 0)
      return Error(400, fmt::format("{}: expected an age in seconds, 0 or more", key));
    *field = value.get<double>();
  }
  if (!ages.jobs_s && !ages.logs_s && !ages.environments_s)
    return Error(400, "nothing to purge: name jobs_s, logs_s or environments_s");
  auto done = d_.Purge(ages, d_.Now());
  if (!done.ok()) return Error(500, std::string(done.status().message()));
  spdlog::info("purge by {}: {} jobs, the logs of {}, the environments of {}", c.user, done->jobs,
               done->logs, done->environments);
  return JsonResponse(
      200, json{{"jobs", done->jobs}, {"logs", done->logs}, {"environments", done->environments}});
}

}  // namespace tessera::server
