#pragma once
// The API's answers: JSON bodies, and errors as {"code", "message"} with their HTTP status.

#include <map>
#include <string>

#include "nlohmann/json.hpp"
#include "tessera/server/http.h"

namespace tessera::server {

inline HttpResponse JsonResponse(int status, const nlohmann::json& j) {
  return HttpResponse{status, "application/json",
                      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

inline HttpResponse Error(int status, const std::string& message) {
  static const std::map<int, std::string> kCodes = {
      {400, "bad_request"},        {401, "unauthorized"},
      {403, "forbidden"},          {404, "not_found"},
      {405, "method_not_allowed"}, {409, "conflict"},
      {413, "payload_too_large"},  {415, "unsupported_media_type"},
      {431, "headers_too_large"},  {500, "internal"},
      {503, "unavailable"}};
  auto it = kCodes.find(status);
  return JsonResponse(status, nlohmann::json{{"code", it == kCodes.end() ? "error" : it->second},
                                             {"message", message}});
}

}  // namespace tessera::server
