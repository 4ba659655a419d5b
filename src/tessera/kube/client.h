#pragma once
// A small Kubernetes API-server client over libcurl: get, list (all pages), watch streams, create
// and JSON merge patch, with the config's TLS trust and identity. Objects are nlohmann::json as the
// server sends them. Errors carry the verb, the path and the server's own Status message; IsGone
// tells the "resource version too old" answer (HTTP 410, or a watch ERROR event with code 410) that
// calls for a fresh list. Thread-safe: every call uses its own connection state, and Shutdown
// makes every call in flight, watches included, return kCancelled promptly.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tessera/kube/config.h"

namespace tessera::kube {

struct ListOptions {
  std::string label_selector;  // "app=x,tier!=y"
  std::string field_selector;  // "spec.nodeName=gpu-3"
  int page_size = 500;         // `limit`; the client follows `continue` until the last page
  std::chrono::milliseconds timeout{0};  // per page; 0: ClientOptions::request_timeout
};

struct ObjectList {
  std::vector<nlohmann::json> items;
  std::string resource_version;  // the list's, to start a watch from
};

enum class EventType { kAdded, kModified, kDeleted, kBookmark };
std::string_view EventTypeName(EventType t);

struct WatchEvent {
  EventType type = EventType::kAdded;
  nlohmann::json object;
};

struct WatchOptions {
  std::string resource_version;  // start after this; empty: the server's choice
  std::string label_selector;
  std::string field_selector;
  int timeout_seconds = 300;  // the server ends the stream after this (a clean end)
  bool allow_bookmarks = true;
  // When set and true, the watch ends (kCancelled); call Client::Wake after setting it.
  const std::atomic<bool>* cancel = nullptr;
};

struct ClientOptions {
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds request_timeout{30000};  // every call but a watch
  std::string user_agent = "tessera";
};

// The HTTP status an error came from (0 when it came from no HTTP answer).
int HttpStatusOf(const absl::Status& status);
// Whether `status` says the resource version is too old (410 Gone / Expired): list again.
bool IsGone(const absl::Status& status);

class Client {
 public:
  // kInvalidArgument for a config without a server URL.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClusterConfig config,
                                                        ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // `path` is the API path: "/api/v1/nodes/gpu-3", "/api/v1/namespaces/a/pods".
  absl::StatusOr<nlohmann::json> Get(const std::string& path);
  absl::StatusOr<ObjectList> List(const std::string& path, const ListOptions& options = {});
  // Streams events to `on_event` until the server ends the stream (OkStatus), `on_event` returns
  // false (OkStatus), an error (IsGone for an expired resource version), or Shutdown (kCancelled).
  absl::Status Watch(const std::string& path, const WatchOptions& options,
                     const std::function<bool(const WatchEvent&)>& on_event);
  absl::StatusOr<nlohmann::json> Create(const std::string& path, const nlohmann::json& object);
  // PUT: replaces the object at `path` (its metadata.resourceVersion, when set, must be current:
  // else HTTP 409).
  absl::StatusOr<nlohmann::json> Replace(const std::string& path, const nlohmann::json& object);
  // DELETE; an object already gone is OK.
  absl::Status Delete(const std::string& path);
  // RFC 7386 merge patch (null removes a key).
  absl::StatusOr<nlohmann::json> MergePatch(const std::string& path, const nlohmann::json& patch);

  // Ends every call in flight and every later one with kCancelled.
  void Shutdown();
  // Makes every call in flight look at its WatchOptions::cancel now.
  void Wake();
  bool shut_down() const { return shutdown_.load(); }
  const ClusterConfig& config() const { return config_; }

  struct Call;

 private:
  Client(ClusterConfig config, ClientOptions options);
  absl::StatusOr<std::string> Token();
  // One request; `on_data` (for watches) sees the body as it arrives.
  absl::StatusOr<std::string> Perform(const std::string& method, const std::string& path,
                                      const std::string& content_type, const std::string& body,
                                      const std::function<bool(std::string_view)>* on_data,
                                      const std::atomic<bool>* cancel,
                                      std::chrono::milliseconds timeout = {});

  const ClusterConfig config_;
  const ClientOptions options_;
  std::atomic<bool> shutdown_{false};
  std::mutex mu_;
  std::set<Call*> calls_;                    // in flight, to wake on Shutdown
  std::vector<std::unique_ptr<Call>> idle_;  // kept connections
  std::string token_;
  std::chrono::steady_clock::time_point token_read_{};
};

// "a=b" pairs into a query string's values, escaped.
std::string QueryEscape(std::string_view s);

}  // namespace tessera::kube
