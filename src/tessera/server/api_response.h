#pragma once
// The API's answers: JSON bodies, and errors as {"code", "message"} with their HTTP status; and
// the small parsers its handlers share.

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "tessera/net/http.h"

namespace tessera::server {

inline net::HttpResponse JsonResponse(int status, const nlohmann::json& j) {
  return net::HttpResponse{status, "application/json",
                           j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

inline net::HttpResponse Error(int status, const std::string& message) {
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

// 404 for a job that is not there, 500 for anything else the store says.
inline net::HttpResponse StatusError(const absl::Status& st) {
  return Error(st.code() == absl::StatusCode::kNotFound ? 404 : 500, std::string(st.message()));
}

// 400 for a malformed reference, 404 for a job that is not there, 500 for the rest.
inline net::HttpResponse RefError(const absl::Status& st) {
  return Error(st.code() == absl::StatusCode::kInvalidArgument ? 400
               : st.code() == absl::StatusCode::kNotFound      ? 404
                                                               : 500,
               std::string(st.message()));
}

// A value, or JSON null when there is none.
template <typename T>
nlohmann::json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// A time as a query gives it: seconds since the epoch, 0..1e11; nullopt for anything else.
inline std::optional<double> ParseEpochSeconds(const std::string& v) {
  char* end = nullptr;
  const double t = strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(t >= 0) || t > 1e11) return std::nullopt;
  return t;
}

}  // namespace tessera::server
