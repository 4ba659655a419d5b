#pragma once
// HTTP/1.1 for the standalone server, the agent and the extender, on a unix socket (the caller's
// identity from the socket's peer credentials) and/or TCP, optionally under TLS. Built on
// Boost.Beast: one thread per connection, keep-alive, a body size limit (413) and a header size
// limit; Stop closes every connection. The client side is what the CLI and the tests use. Knows
// nothing of the API: a handler turns requests into responses.

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::net {

struct Peer {
  bool unix_socket = false;  // true: uid/gid/pid are the kernel's word for who connected
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
  std::string address;  // TCP: "ip:port"
};

struct HttpRequest {
  std::string method;                        // "GET"
  std::string target;                        // "/v1/jobs?state=running"
  std::string path;                          // "/v1/jobs"
  std::map<std::string, std::string> query;  // decoded
  std::string authorization;                 // the Authorization header
  std::string content_type;
  std::string idempotency_key;  // the Idempotency-Key header
  std::string last_event_id;    // the Last-Event-ID header (a server-sent event stream's resume)
  std::string body;
  Peer peer;
};

// Writes one piece of a streamed response; false once the client is gone or the server stops.
using StreamWrite = std::function<bool(std::string_view)>;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::map<std::string, std::string> headers;  // more headers ("Cache-Control", ...)
  // Set: the response is streamed (chunked) instead of `body`: the connection's thread calls it,
  // and it writes until it returns; the connection closes after.
  std::function<void(const StreamWrite&)> stream;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  std::string unix_path;    // replaced if a stale socket file is there; empty: no unix socket
  std::string tcp_address;  // "127.0.0.1:8080", ":0" for any free port; empty: no TCP
  // PEM files: both set, the TCP listener speaks TLS (1.2 or later) only.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Set: TLS clients must present a certificate that chains to this CA (PEM), else the handshake
  // fails; with `tls_client_names` too, its subject's common name must be one of them.
  std::string tls_client_ca_file;
  std::vector<std::string> tls_client_names;
  size_t max_body_bytes = 1 << 20;
  // A kept-alive connection with no request for this long is closed.
  double idle_timeout_s = 60;
  // Once a request's first byte has come, the whole request must within this (else 408, closed):
  // a client that sends a Content-Length and no body holds no thread for long.
  double request_timeout_s = 10;
  // Connections open at once on the unix socket and on TCP, each listener its own budget (idle
  // connections from the network cannot lock local users out), and from one peer (a uid on the
  // socket, an address on TCP); one over either gets 503 and is closed. A response the client does
  // not read for request_timeout_s (its buffers full) closes the connection too.
  size_t max_connections = 512;
  size_t max_tcp_connections = 512;
  size_t max_connections_per_peer = 64;
  // The last `reserved_connections` of max_connections are for the unix socket peers `reserved`
  // says yes to (root and the admins): accounts that fill the socket with idle connections do not
  // lock an admin out. Null: no reserve.
  size_t reserved_connections = 16;
  std::function<bool(const Peer&)> reserved;
  // Answer for bodies over the limit and unreadable requests; the handler never sees them.
  std::function<HttpResponse(int status, const std::string& message)> error_response;
};

class HttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpHandler handler);
  ~HttpServer();
  void Stop();
  int tcp_port() const { return tcp_port_; }

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int tcp_port_ = 0;
};

// A blocking client for one server: a unix socket path, or "tcp://host:port".
class HttpClient {
 public:
  // `endpoint`: a unix socket path, tcp://host:port, or https://host:port (TLS; the server's
  // certificate checked against `ca_file`, or the system's CAs when empty, and its host name).
  // `client_cert_file`/`client_key_file` (PEM): a certificate to present (mutual TLS).
  explicit HttpClient(std::string endpoint, std::string bearer_token = "", std::string ca_file = "",
                      std::string client_cert_file = "", std::string client_key_file = "");
  ~HttpClient();
  // Sends one request on a kept-alive connection (reconnecting when needed). kUnavailable when the
  // server cannot be reached, naming the endpoint. A request that fails after it was sent is sent
  // again once on a new connection only when repeating it is harmless: not a POST, or a POST with
  // an `idempotency_key` (sent as the Idempotency-Key header; the server answers a repeat with what
  // the first one made).
  absl::StatusOr<HttpResponse> Send(const std::string& method, const std::string& target,
                                    const std::string& body = "",
                                    const std::string& idempotency_key = "");

  struct Conn;

 private:
  std::string endpoint_;
  std::string token_;
  std::string ca_file_;
  std::string client_cert_file_, client_key_file_;
  std::unique_ptr<Conn> conn_;
};

// "a%20b" -> "a b"; "+" is kept.
std::string UrlDecode(std::string_view s);

// A TCP port free on 127.0.0.1 now (the kernel's pick for a socket bound to port 0, closed again;
// close-on-exec meanwhile, so a process forked beside it does not hold it); 0 when none can be had.
// For a peer that must be told its port before it listens (a job's MASTER_PORT, a test's daemon).
int FreeLoopbackPort();

}  // namespace tessera::net
