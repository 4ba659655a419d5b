#pragma once
// Small helpers the standalone server's parts share (the dispatcher, the API, the daemon).

#include <pwd.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/core/users.h"
#include "tessera/server/job_spec.h"
#include "tessera/server/store.h"

namespace tessera::server {

inline std::string UserName(uid_t uid) {
  return core::LoginName(uid).value_or(fmt::format("uid:{}", uid));
}

// Text a user chose (a command), as the server's log shows it: control characters and bytes
// that are not printable ASCII escaped (\xNN), and at most `max` characters of it, then how long it
// was - a log line never carries a whole 1 MB command, nor a terminal's escape sequences.
inline std::string LogText(std::string_view text, size_t max = 200) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max) {
      out += fmt::format("... ({} bytes in all)", text.size());
      break;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

// The pid a server wrote into its state folder's lock file (`fd`, open), "" when none reads.
inline std::string LockHolder(int fd) {
  char holder[32] = {};
  const ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
  std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid;
}

inline std::string Hostname() {
  char buf[256] = "";
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// Compares two secrets in time that depends only on their length.
inline bool SameSecret(const std::string& a, const std::string& b) {
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Digits only, at most `max_digits` of them (so the value cannot overflow); nullopt otherwise.
inline std::optional<int64_t> ParseDigits(std::string_view s, size_t max_digits) {
  if (s.empty() || s.size() > max_digits) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

inline std::optional<int64_t> ParseId(std::string_view s) {
  const std::optional<int64_t> v = ParseDigits(s, 18);
  return v && *v > 0 ? v : std::nullopt;
}

inline nlohmann::json EventsJson(const std::vector<JobEvent>& events) {
  nlohmann::json out = nlohmann::json::array();
  for (const JobEvent& e : events)
    out.push_back({{"at", e.at}, {"state", JobStateName(e.state)}, {"reason", e.reason}});
  return out;
}

inline nlohmann::json JobJson(const JobRecord& r) {
  nlohmann::json j;
  j["id"] = r.id;
  j["name"] = r.name;
  j["owner"] = r.owner;
  j["state"] = std::string(JobStateName(r.state));
  j["priority"] = r.priority;
  j["submitted_at"] = r.submitted_at;
  j["started_at"] = r.started_at ? nlohmann::json(*r.started_at) : nlohmann::json(nullptr);
  j["ended_at"] = r.ended_at ? nlohmann::json(*r.ended_at) : nlohmann::json(nullptr);
  j["exit_code"] = r.exit_code ? nlohmann::json(*r.exit_code) : nlohmann::json(nullptr);
  // Set once the job's process exists (a job is marked running just before it is launched).
  j["pid"] = r.pid > 0 ? nlohmann::json(r.pid) : nlohmann::json(nullptr);
  j["reason"] = r.reason;
  j["placement"] = r.placement_json.empty()
                       ? nlohmann::json(nullptr)
                       : nlohmann::json::parse(r.placement_json, nullptr, false);
  j["spec"] = nlohmann::json::parse(r.spec_json, nullptr, false);
  j["usage"] = r.usage_json.empty() ? nlohmann::json(nullptr)
                                    : nlohmann::json::parse(r.usage_json, nullptr, false);
  j["held"] = r.state == JobState::kQueued && r.held;
  // A task of an array: "12_3" names it (task 3 of array 12, whose id is its first task's).
  j["array_id"] = r.array_id != 0 ? nlohmann::json(r.array_id) : nlohmann::json(nullptr);
  j["array_index"] = r.array_id != 0 ? nlohmann::json(r.array_index) : nlohmann::json(nullptr);
  return j;
}

// A whole number 0..kMaxArrayIndex: an array task's index.
inline std::optional<int> ParseIndex(std::string_view s) {
  const std::optional<int64_t> v = ParseDigits(s, 8);
  return v && *v <= kMaxArrayIndex ? std::optional(static_cast<int>(*v)) : std::nullopt;
}

// What of a job only its owner and admins see: its environment (tokens, keys), working directory
// and logs. Others see the rest (who, what shape, state, why).
inline void HideDetails(nlohmann::json& job) {
  if (job.contains("spec") && job["spec"].is_object()) {
    job["spec"].erase("env");
    job["spec"].erase("workdir");
  }
  job["details_hidden"] = "env, workdir and logs are shown to the job's owner and admins only";
}

// Whether a "host:port" listens on loopback only (127.0.0.0/8, ::1, localhost).
inline bool IsLoopback(const std::string& host_port) {
  std::string host = host_port.substr(0, host_port.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Whether a job of `uid` would run as root: the server switches to the job's user only when it is
// root.
inline bool RunsAsRoot(uint32_t uid) { return geteuid() == 0 && uid == 0; }

}  // namespace tessera::server
