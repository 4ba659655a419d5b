#include "tessera/kube/client.h"

#include <curl/curl.h>

#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "fmt/format.h"

namespace tessera::kube {
namespace {

constexpr char kHttpStatusPayload[] = "tessera.io/http-status";

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

absl::Status HttpError(int http, const std::string& what, const std::string& detail) {
  absl::StatusCode code;
  switch (http) {
    case 400:
    case 422:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case 401:
      code = absl::StatusCode::kUnauthenticated;
      break;
    case 403:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case 404:
      code = absl::StatusCode::kNotFound;
      break;
    case 409:
      code = absl::StatusCode::kAborted;
      break;
    case 410:
      code = absl::StatusCode::kFailedPrecondition;
      break;
    case 429:
      code = absl::StatusCode::kResourceExhausted;
      break;
    default:
      code = http >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnknown;
  }
  absl::Status s(code, fmt::format("{}: HTTP {}: {}", what, http, detail));
  s.SetPayload(kHttpStatusPayload, absl::Cord(std::to_string(http)));
  return s;
}

// The server's Status message when the body is one, else the start of the body.
std::string Detail(const std::string& body) {
  try {
    auto j = nlohmann::json::parse(body);
    if (j.is_object() && j.value("kind", "") == "Status") {
      std::string reason = j.value("reason", "");
      std::string message = j.value("message", "");
      return reason.empty() ? message : reason + ": " + message;
    }
  } catch (const nlohmann::json::exception&) {
  }
  std::string d = body.substr(0, 200);
  for (char& c : d) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return d.empty() ? "(empty body)" : d;
}

size_t OnHeaderIgnored(char*, size_t size, size_t n, void*) { return size * n; }

}  // namespace

std::string_view EventTypeName(EventType t) {
  switch (t) {
    case EventType::kAdded:
      return "ADDED";
    case EventType::kModified:
      return "MODIFIED";
    case EventType::kDeleted:
      return "DELETED";
    case EventType::kBookmark:
      return "BOOKMARK";
  }
  return "?";
}

int HttpStatusOf(const absl::Status& status) {
  auto p = status.GetPayload(kHttpStatusPayload);
  if (!p) return 0;
  try {
    return std::stoi(std::string(*p));
  } catch (...) {
    return 0;
  }
}

bool IsGone(const absl::Status& status) { return HttpStatusOf(status) == 410; }

std::string QueryEscape(std::string_view s) {
  // libcurl's escaping (RFC 3986 unreserved characters kept); it needs no handle since 7.82.
  char* escaped = curl_easy_escape(nullptr, s.data(), static_cast<int>(s.size()));
  if (!escaped) return "";
  std::string out(escaped);
  curl_free(escaped);
  return out;
}

// One pooled connection: an easy handle in its own multi handle (which keeps the connection
// alive between calls), so a call can wait in curl_multi_poll and be woken by Shutdown.
struct Client::Call {
  CURLM* multi = nullptr;
  CURL* easy = nullptr;
  // Per request:
  std::string body;
  const std::function<bool(std::string_view)>* on_data = nullptr;
  bool stopped_by_reader = false;
  char error[CURL_ERROR_SIZE] = {};

  Call() {
    multi = curl_multi_init();
    easy = curl_easy_init();
  }
  ~Call() {
    if (easy) curl_easy_cleanup(easy);
    if (multi) curl_multi_cleanup(multi);
  }

  static size_t OnWrite(char* data, size_t size, size_t n, void* self) {
    auto* c = static_cast<Call*>(self);
    size_t len = size * n;
    long http = 0;
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &http);
    if (c->on_data && http == 200) {
      if (!(*c->on_data)(std::string_view(data, len))) {
        c->stopped_by_reader = true;
        return 0;  // ends the transfer (CURLE_WRITE_ERROR, which Perform reads as a clean stop)
      }
      return len;
    }
    if (c->body.size() + len > (64u << 20)) return 0;  // a runaway answer
    c->body.append(data, len);
    return len;
  }
};

Client::Client(ClusterConfig config, ClientOptions options)
    : config_(std::move(config)), options_(std::move(options)) {}

Client::~Client() {
  Shutdown();
  std::lock_guard lock(mu_);
  idle_.clear();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClusterConfig config,
                                                       ClientOptions options) {
  if (config.server.empty()) {
    return absl::InvalidArgumentError("kube client: the config has no server URL");
  }
  GlobalInit();
  return std::unique_ptr<Client>(new Client(std::move(config), std::move(options)));
}

void Client::Shutdown() {
  shutdown_ = true;
  Wake();
}

void Client::Wake() {
  std::lock_guard lock(mu_);
  for (Call* c : calls_) curl_multi_wakeup(c->multi);
}

absl::StatusOr<std::string> Client::Token() {
  if (config_.token_file.empty()) return config_.token;
  std::lock_guard lock(mu_);
  // A projected service-account token is rotated on disk; reading it every 10 s is enough.
  auto now = std::chrono::steady_clock::now();
  if (token_.empty() || now - token_read_ > std::chrono::seconds(10)) {
    auto t = CurrentToken(config_);
    if (!t.ok()) return t.status();
    token_ = *t;
    token_read_ = now;
  }
  return token_;
}

absl::StatusOr<std::string> Client::Perform(const std::string& method, const std::string& path,
                                            const std::string& content_type,
                                            const std::string& body,
                                            const std::function<bool(std::string_view)>* on_data,
                                            const std::atomic<bool>* cancel,
                                            std::chrono::milliseconds timeout) {
  const bool stream = on_data != nullptr;
  auto cancelled = [&] { return shutdown_ || (cancel && cancel->load()); };
  std::string what = fmt::format("{} {}", method, path);
  if (shutdown_) return absl::CancelledError(what + ": the client is shut down");
  auto token = Token();
  if (!token.ok())
    return absl::Status(token.status().code(), what + ": " + std::string(token.status().message()));
  std::unique_ptr<Call> call;
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      call = std::move(idle_.back());
      idle_.pop_back();
      curl_easy_reset(call->easy);  // keeps the live connection
      call->body.clear();
      call->stopped_by_reader = false;
      call->error[0] = 0;
    } else {
      call = std::make_unique<Call>();
    }
    if (!call->multi || !call->easy) return absl::ResourceExhaustedError(what + ": curl init");
    calls_.insert(call.get());
  }
  // Back to the pool (a few kept) when the call ends, however it ends.
  struct Return {
    Client* self;
    std::unique_ptr<Call>& c;
    ~Return() {
      std::lock_guard lock(self->mu_);
      self->calls_.erase(c.get());
      c->on_data = nullptr;
      if (self->idle_.size() < 8 && !self->shutdown_) self->idle_.push_back(std::move(c));
    }
  } give_back{this, call};

  CURL* e = call->easy;
  std::string url = config_.server + path;
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, call->error);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Call::OnWrite);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, call.get());
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &OnHeaderIgnored);
  curl_easy_setopt(e, CURLOPT_USERAGENT, options_.user_agent.c_str());
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
  if (!stream) {
    auto limit = timeout.count() > 0 ? timeout : options_.request_timeout;
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(limit.count()));
  }
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 30L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  if (!config_.ca_pem.empty()) {
    curl_blob blob{const_cast<char*>(config_.ca_pem.data()), config_.ca_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(e, CURLOPT_CAINFO_BLOB, &blob);
  }
  if (config_.insecure_skip_tls_verify) {
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!config_.client_cert_pem.empty()) {
    curl_blob cert{const_cast<char*>(config_.client_cert_pem.data()),
                   config_.client_cert_pem.size(), CURL_BLOB_COPY};
    curl_blob key{const_cast<char*>(config_.client_key_pem.data()), config_.client_key_pem.size(),
                  CURL_BLOB_COPY};
    curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &cert);
    curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
    curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &key);
    curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
  }
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept: application/json");
  if (!token->empty()) {
    headers = curl_slist_append(headers, ("Authorization: Bearer " + *token).c_str());
  }
  if (!content_type.empty()) {
    headers = curl_slist_append(headers, ("Content-Type: " + content_type).c_str());
  }
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
  if (method == "GET") {
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method.c_str());
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body.c_str());
  }
  call->on_data = on_data;

  curl_multi_add_handle(call->multi, e);
  CURLcode result = CURLE_OK;
  bool done = false;
  while (!done) {
    int running = 0;
    CURLMcode mc = curl_multi_perform(call->multi, &running);
    if (mc != CURLM_OK) {
      result = CURLE_FAILED_INIT;
      break;
    }
    int queued = 0;
    while (CURLMsg* m = curl_multi_info_read(call->multi, &queued)) {
      if (m->msg == CURLMSG_DONE) {
        result = m->data.result;
        done = true;
      }
    }
    if (done || cancelled()) break;
    curl_multi_poll(call->multi, nullptr, 0, 1000, nullptr);
    if (cancelled()) break;
  }
  curl_multi_remove_handle(call->multi, e);
  curl_slist_free_all(headers);
  if (!done) {
    return absl::CancelledError(what + (shutdown_ ? ": the client is shut down" : ": cancelled"));
  }

  long http = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &http);
  if (result != CURLE_OK && !(result == CURLE_WRITE_ERROR && call->stopped_by_reader)) {
    std::string err = call->error[0] ? call->error : curl_easy_strerror(result);
    if (result == CURLE_WRITE_ERROR) err = "the answer is larger than 64 MiB";
    return absl::UnavailableError(fmt::format("{}: {}: {}", what, config_.server, err));
  }
  if (http < 200 || http >= 300) return HttpError(static_cast<int>(http), what, Detail(call->body));
  std::string out;
  out.swap(call->body);
  return out;
}

namespace {

absl::StatusOr<nlohmann::json> ParseObject(const std::string& what, const std::string& body) {
  try {
    auto j = nlohmann::json::parse(body);
    if (!j.is_object()) {
      return absl::InternalError(what + ": the server's answer is not a JSON object");
    }
    return j;
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(
        fmt::format("{}: the server's answer is not JSON ({}): {}", what, e.what(), Detail(body)));
  }
}

void AddQuery(std::string& path, const std::string& key, const std::string& value) {
  if (value.empty()) return;
  path += path.find('?') == std::string::npos ? '?' : '&';
  path += key + "=" + QueryEscape(value);
}

}  // namespace

absl::StatusOr<nlohmann::json> Client::Get(const std::string& path) {
  auto body = Perform("GET", path, "", "", nullptr, nullptr);
  if (!body.ok()) return body.status();
  return ParseObject("GET " + path, *body);
}

absl::StatusOr<ObjectList> Client::List(const std::string& path, const ListOptions& options) {
  ObjectList out;
  std::string cont;
  for (int page = 0;; ++page) {
    std::string p = path;
    AddQuery(p, "labelSelector", options.label_selector);
    AddQuery(p, "fieldSelector", options.field_selector);
    if (options.page_size > 0) AddQuery(p, "limit", std::to_string(options.page_size));
    AddQuery(p, "continue", cont);
    auto body = Perform("GET", p, "", "", nullptr, nullptr, options.timeout);
    if (!body.ok()) return body.status();
    auto j = ParseObject("GET " + p, *body);
    if (!j.ok()) return j.status();
    const auto& items = (*j)["items"];
    if (!items.is_array() && !items.is_null()) {
      return absl::InternalError(fmt::format("GET {}: items: expected a list", p));
    }
    for (const auto& it : items) {
      if (!it.is_object())
        return absl::InternalError(fmt::format("GET {}: an item is not an object", p));
      out.items.push_back(it);
    }
    const auto& meta = (*j)["metadata"];
    if (meta.is_object()) {
      if (meta.contains("resourceVersion") && meta["resourceVersion"].is_string()) {
        out.resource_version = meta["resourceVersion"].get<std::string>();
      }
      cont = meta.contains("continue") && meta["continue"].is_string()
                 ? meta["continue"].get<std::string>()
                 : "";
    } else {
      cont.clear();
    }
    if (cont.empty()) break;
    if (page > 100000) return absl::InternalError(fmt::format("GET {}: endless pages", path));
  }
  return out;
}

absl::Status Client::Watch(const std::string& path, const WatchOptions& options,
                           const std::function<bool(const WatchEvent&)>& on_event) {
  std::string p = path;
  AddQuery(p, "watch", "1");
  AddQuery(p, "resourceVersion", options.resource_version);
  AddQuery(p, "labelSelector", options.label_selector);
  AddQuery(p, "fieldSelector", options.field_selector);
  if (options.timeout_seconds > 0) {
    AddQuery(p, "timeoutSeconds", std::to_string(options.timeout_seconds));
  }
  if (options.allow_bookmarks) AddQuery(p, "allowWatchBookmarks", "true");
  std::string what = "WATCH " + p;

  std::string pending;
  absl::Status stream_error;
  std::function<bool(std::string_view)> on_data = [&](std::string_view chunk) {
    pending.append(chunk);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(pending.data() + start, nl - start);
      if (line.empty() || line == "\r") continue;
      WatchEvent ev;
      try {
        auto j = nlohmann::json::parse(line);
        std::string type = j.at("type").get<std::string>();
        const auto& obj = j.at("object");
        if (type == "ERROR") {
          int code = obj.is_object() ? obj.value("code", 500) : 500;
          std::string message = obj.is_object() ? obj.value("message", "") : "";
          stream_error = HttpError(code, what, "watch error event: " + message);
          return false;
        }
        if (type == "ADDED") {
          ev.type = EventType::kAdded;
        } else if (type == "MODIFIED") {
          ev.type = EventType::kModified;
        } else if (type == "DELETED") {
          ev.type = EventType::kDeleted;
        } else if (type == "BOOKMARK") {
          ev.type = EventType::kBookmark;
        } else {
          stream_error =
              absl::InternalError(fmt::format("{}: unknown watch event type \"{}\"", what, type));
          return false;
        }
        if (!obj.is_object()) {
          stream_error = absl::InternalError(what + ": a watch event's object is not an object");
          return false;
        }
        ev.object = obj;
      } catch (const nlohmann::json::exception& e) {
        stream_error =
            absl::InternalError(fmt::format("{}: a watch event is not JSON ({}): {}", what,
                                            e.what(), std::string(line.substr(0, 200))));
        return false;
      }
      if (!on_event(ev)) return false;
    }
    pending.erase(0, start);
    if (pending.size() > (16u << 20)) {
      stream_error = absl::InternalError(what + ": a watch event is larger than 16 MiB");
      return false;
    }
    return true;
  };
  auto body = Perform("GET", p, "", "", &on_data, options.cancel);
  if (!body.ok()) return body.status();
  return stream_error;
}

absl::StatusOr<nlohmann::json> Client::Create(const std::string& path,
                                              const nlohmann::json& object) {
  auto body = Perform("POST", path, "application/json", object.dump(), nullptr, nullptr);
  if (!body.ok()) return body.status();
  return ParseObject("POST " + path, *body);
}

absl::StatusOr<nlohmann::json> Client::Replace(const std::string& path,
                                               const nlohmann::json& object) {
  auto body = Perform("PUT", path, "application/json", object.dump(), nullptr, nullptr);
  if (!body.ok()) return body.status();
  return ParseObject("PUT " + path, *body);
}

absl::Status Client::Delete(const std::string& path) {
  auto body = Perform("DELETE", path, "application/json", "", nullptr, nullptr);
  if (!body.ok() && HttpStatusOf(body.status()) != 404) return body.status();
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> Client::MergePatch(const std::string& path,
                                                  const nlohmann::json& patch) {
  auto body =
      Perform("PATCH", path, "application/merge-patch+json", patch.dump(), nullptr, nullptr);
  if (!body.ok()) return body.status();
  return ParseObject("PATCH " + path, *body);
}

}  // namespace tessera::kube
