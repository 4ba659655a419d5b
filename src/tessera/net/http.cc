#include "tessera/net/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <condition_variable>
#include <optional>
#include <thread>

#include "fmt/format.h"

namespace tessera::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using local = asio::local::stream_protocol;
using tcp = asio::ip::tcp;

std::string UrlDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

namespace {

// Why a request's framing cannot be trusted (RFC 9112 section 6), or "" when it can: a
// Transfer-Encoding whose final coding is not chunked leaves the body's length unknown (a server
// MUST answer 400 and close), and one beside a Content-Length is what request smuggling is made of
// (a server MAY reject it; this one does, rather than guess which one a proxy in front believed).
std::string FramingProblem(const http::request_parser<http::string_body>::value_type& msg) {
  auto te = msg.find(http::field::transfer_encoding);
  if (te == msg.end()) return "";
  if (msg.find(http::field::content_length) != msg.end())
    return "both Transfer-Encoding and Content-Length (RFC 9112 section 6.3)";
  std::string_view v = te->value();
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  const size_t comma = v.rfind(',');
  std::string_view last = comma == std::string_view::npos ? v : v.substr(comma + 1);
  while (!last.empty() && (last.front() == ' ' || last.front() == '\t')) last.remove_prefix(1);
  if (!beast::iequals(last, "chunked"))
    return "Transfer-Encoding whose final coding is not chunked: the body cannot be framed (RFC "
           "9112 section 6.3)";
  return "";
}

void SplitTarget(const std::string& target, HttpRequest& r) {
  size_t q = target.find('?');
  r.path = UrlDecode(target.substr(0, q));
  if (q == std::string::npos) return;
  std::string_view rest = std::string_view(target).substr(q + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view kv = rest.substr(0, amp);
    size_t eq = kv.find('=');
    r.query[UrlDecode(kv.substr(0, eq))] =
        eq == std::string_view::npos ? "" : UrlDecode(kv.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
}

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandler handler;
  asio::io_context io;
  std::unique_ptr<local::acceptor> unix_acceptor;
  std::unique_ptr<tcp::acceptor> tcp_acceptor;
  std::unique_ptr<asio::ssl::context> tls;  // set: TCP connections speak TLS
  std::thread unix_thread, tcp_thread;
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable cv;
  std::set<int> open_fds;  // live connections, shut down on Stop
  size_t threads = 0;      // connection threads not yet done with their socket (Stop waits)
  // Per live connection: its peer key, and the time by which it must have read what it waits for
  // (the reaper shuts its reading side then, which ends the blocked read).
  struct Conn {
    std::string peer_key;
    std::chrono::steady_clock::time_point deadline;
    bool writing = false;  // the deadline is a write's: past it, both sides are shut
  };
  std::map<int, Conn> conns;
  std::map<std::string, size_t> per_peer;
  size_t unix_open = 0, tcp_open = 0;  // conns by listener
  std::thread reaper;
  std::condition_variable reaper_cv;
  // When the reaper means to look next; a deadline before it wakes it, others wait their turn (so a
  // request does not cost a wake-up of the reaper thread).
  std::chrono::steady_clock::time_point reaper_wake = std::chrono::steady_clock::time_point::max();

  // The time by which the connection's next read (or, `writing`, its write: a client that
  // pipelines requests and never reads the answers blocks a write once the buffers are full) must
  // be done; past it the reaper shuts the socket, which ends the blocked call. Seconds < 0: none.
  void SetDeadline(int fd, double seconds, bool writing = false) {
    std::lock_guard lock(mu);
    if (auto it = conns.find(fd); it != conns.end()) {
      it->second.writing = writing;
      it->second.deadline =
          seconds < 0 ? std::chrono::steady_clock::time_point::max()
                      : std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(seconds));
      if (it->second.deadline < reaper_wake) reaper_cv.notify_all();
    }
  }

  // Shuts the reading side of every connection past its deadline; wakes at the earliest deadline.
  void Reap() {
    std::unique_lock lock(mu);
    while (!stopping) {
      auto now = std::chrono::steady_clock::now();
      auto next = now + std::chrono::seconds(1);
      for (auto& [fd, c] : conns) {
        if (c.deadline <= now) {
          ::shutdown(fd, c.writing ? SHUT_RDWR : SHUT_RD);
          c.deadline = std::chrono::steady_clock::time_point::max();
        } else {
          next = std::min(next, c.deadline);
        }
      }
      reaper_wake = next;
      reaper_cv.wait_until(lock, next);
    }
  }

  static std::string PeerKey(const Peer& p) {
    if (p.unix_socket) return fmt::format("uid:{}", p.uid);
    return p.address.substr(0, p.address.rfind(':'));
  }

  HttpResponse Error(int status, const std::string& message) {
    if (options.error_response) return options.error_response(status, message);
    return HttpResponse{status, "text/plain", message};
  }

  template <typename Stream>
  void Serve(Stream& sock, Peer peer) {
    beast::flat_buffer buffer;
    const int fd = beast::get_lowest_layer(sock).native_handle();
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(options.max_body_bytes);
      parser.header_limit(16 * 1024);
      beast::error_code ec;
      // Idle until the next request's first bytes (read through the stream, not polled on the
      // socket: TLS may already hold them, read along with the handshake), then the request's own
      // limit.
      if (buffer.size() == 0) {
        SetDeadline(fd, options.idle_timeout_s);
        beast::error_code first;
        size_t n = sock.read_some(buffer.prepare(16 * 1024), first);
        if (first || n == 0) break;  // closed, or idle past the limit (the reaper shut it)
        buffer.commit(n);
      }
      SetDeadline(fd, options.request_timeout_s);
      bool timed_out = false;
      // The header first: a request whose body cannot be framed is refused before any of it is
      // read.
      std::string framing;
      http::read_header(sock, buffer, parser, ec);
      if (!ec) framing = FramingProblem(parser.get());
      if (!ec && framing.empty()) http::read(sock, buffer, parser, ec);
      if (ec) {
        std::lock_guard lock(mu);
        auto it = conns.find(fd);
        timed_out = it != conns.end() &&
                    it->second.deadline == std::chrono::steady_clock::time_point::max();
      }
      HttpResponse res;
      bool keep_alive = false;
      unsigned version = 11;
      if (!framing.empty()) {
        res = Error(400, "malformed HTTP request: " + framing);  // and closed: keep_alive false
      } else if (ec && timed_out && parser.got_some() && !stopping) {
        res = Error(408,
                    fmt::format("request not complete within {:g} s", options.request_timeout_s));
      } else if (ec == http::error::end_of_stream || ec == asio::error::eof ||
                 ec == asio::error::connection_reset || (ec && timed_out)) {
        break;
      } else if (ec == http::error::body_limit) {
        res = Error(413,
                    fmt::format("request body over the limit of {} bytes", options.max_body_bytes));
      } else if (ec == http::error::header_limit) {
        res = Error(431, "request headers over the limit of 16 KiB");
      } else if (ec) {
        if (parser.got_some() && !stopping)
          res = Error(400, "malformed HTTP request: " + ec.message());
        else
          break;
      } else {
        auto& msg = parser.get();
        HttpRequest req;
        req.method = std::string(msg.method_string());
        req.target = std::string(msg.target());
        SplitTarget(req.target, req);
        req.authorization = std::string(msg[http::field::authorization]);
        req.content_type = std::string(msg[http::field::content_type]);
        req.idempotency_key = std::string(msg["Idempotency-Key"]);
        req.last_event_id = std::string(msg["Last-Event-ID"]);
        req.body = std::move(msg.body());
        req.peer = peer;
        keep_alive = msg.keep_alive();
        version = msg.version();
        try {
          res = handler(req);
        } catch (const std::exception& e) {
          res = Error(500, std::string("internal error: ") + e.what());
        }
      }
      if (res.stream) {
        StreamResponse(sock, fd, res, version);
        break;
      }
      http::response<http::string_body> out{static_cast<http::status>(res.status), version};
      out.set(http::field::server, "tessera");
      out.set(http::field::content_type, res.content_type);
      for (const auto& [name, value] : res.headers) out.set(name, value);
      out.keep_alive(keep_alive);
      out.body() = std::move(res.body);
      out.prepare_payload();
      SetDeadline(fd, options.request_timeout_s, true);
      http::write(sock, out, ec);
      if (ec || !keep_alive) break;
    }
  }

  // A streamed response: the header, then each piece the handler writes as one chunk, with no
  // deadline (a stream is long by design; Stop shuts its socket, and the handler's writes fail).
  template <typename Stream>
  void StreamResponse(Stream& sock, int fd, HttpResponse& res, unsigned version) {
    http::response<http::empty_body> head{static_cast<http::status>(res.status), version};
    head.set(http::field::server, "tessera");
    head.set(http::field::content_type, res.content_type);
    for (const auto& [name, value] : res.headers) head.set(name, value);
    head.keep_alive(false);
    head.chunked(true);
    http::response_serializer<http::empty_body> sr{head};
    beast::error_code ec;
    http::write_header(sock, sr, ec);
    if (ec) return;
    {
      std::lock_guard lock(mu);
      if (auto it = conns.find(fd); it != conns.end())
        it->second.deadline = std::chrono::steady_clock::time_point::max();
    }
    res.stream([&](std::string_view piece) {
      if (stopping || ec) return false;
      if (piece.empty()) return true;
      // A stream is long by design, but each piece must be taken within the request timeout.
      SetDeadline(fd, options.request_timeout_s, true);
      asio::write(sock, http::make_chunk(asio::const_buffer(piece.data(), piece.size())), ec);
      SetDeadline(fd, -1);
      return !ec;
    });
    if (!ec) asio::write(sock, http::make_chunk_last(), ec);
  }

  // Shuts and closes a served connection's socket.
  template <typename Stream>
  static void Close(Stream& sock) {
    beast::error_code ignored;
    auto& raw = beast::get_lowest_layer(sock);
    raw.shutdown(std::remove_reference_t<decltype(raw)>::shutdown_both, ignored);
    raw.close(ignored);
  }

  // A TCP connection under TLS: the handshake must complete within the request timeout.
  template <typename Forget>
  void ServeTls(tcp::socket sock, Peer peer, Forget& forget) {
    const int fd = sock.native_handle();
    beast::ssl_stream<tcp::socket> stream(std::move(sock), *tls);
    SetDeadline(fd, options.request_timeout_s);
    beast::error_code ec;
    stream.handshake(asio::ssl::stream_base::server, ec);
    if (!ec) Serve(stream, std::move(peer));
    forget();
    Close(stream);
  }

  template <typename Socket>
  void Spawn(Socket sock, Peer peer) {
    const int fd = sock.native_handle();
    const std::string key = PeerKey(peer);
    constexpr bool kTcp = std::is_same_v<Socket, tcp::socket>;
    {
      std::lock_guard lock(mu);
      std::string refused;
      size_t& open = kTcp ? tcp_open : unix_open;
      size_t most = kTcp ? options.max_tcp_connections : options.max_connections;
      // The socket's last few connections are the admins' (asked only when it is that full).
      if (!kTcp && options.reserved && most > options.reserved_connections &&
          open >= most - options.reserved_connections && !options.reserved(peer)) {
        most -= options.reserved_connections;
      }
      if (open >= most) {
        refused = fmt::format("the server has {} {} connections open, its limit", open,
                              kTcp ? "TCP" : "unix socket");
      } else if (per_peer[key] >= options.max_connections_per_peer) {
        refused = fmt::format("{} connections open from you, the limit", per_peer[key]);
      }
      if (!refused.empty()) {
        // Said, not just dropped: a short answer on a fresh socket does not block.
        HttpResponse res = Error(503, refused);
        std::string out = fmt::format(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: {}\r\nContent-Length: {}\r\n"
            "Connection: close\r\n\r\n{}",
            res.content_type, res.body.size(), res.body);
        ssize_t w = ::send(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w;
        return;  // the socket closes as `sock` goes
      }
      open_fds.insert(fd);
      conns[fd] = Conn{key, std::chrono::steady_clock::time_point::max()};
      ++per_peer[key];
      ++open;
      ++threads;
    }

    auto owned = std::make_unique<Socket>(std::move(sock));
    std::thread([this, owned = std::move(owned), peer, fd, key]() mutable {
      auto forget = [&] {
        std::lock_guard lock(mu);
        open_fds.erase(fd);
        conns.erase(fd);
        --(kTcp ? tcp_open : unix_open);
        if (--per_peer[key] == 0) per_peer.erase(key);
        cv.notify_all();
      };
      // The connection is forgotten before its socket closes: a client that sees the close finds
      // its slot free at once.
      bool served = false;
      if constexpr (std::is_same_v<Socket, tcp::socket>) {
        if (tls) {
          ServeTls(std::move(*owned), peer, forget);
          served = true;
        }
      }
      if (!served) {
        Serve(*owned, peer);
        forget();
        Close(*owned);
      }
      owned.reset();  // the socket goes while the server's io_context surely lives
      std::lock_guard lock(mu);
      --threads;
      cv.notify_all();
    }).detach();
  }

  // Accepts until Stop; `peer_of` says who connected, or nullopt to refuse the connection.
  template <typename Socket, typename Acceptor, typename PeerOf>
  void Accept(Acceptor& acceptor, PeerOf peer_of) {
    while (!stopping) {
      beast::error_code ec;
      Socket sock(io);
      acceptor.accept(sock, ec);
      if (ec) {
        if (stopping) return;
        continue;
      }
      if (std::optional<Peer> peer = peer_of(sock)) Spawn(std::move(sock), *peer);
    }
  }

  static std::optional<Peer> UnixPeer(local::socket& sock) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      return std::nullopt;  // no credentials, no identity
    }
    Peer peer;
    peer.unix_socket = true;
    peer.uid = cred.uid, peer.gid = cred.gid, peer.pid = cred.pid;
    return peer;
  }

  static std::optional<Peer> TcpPeer(tcp::socket& sock) {
    Peer peer;
    beast::error_code ec;
    // No Nagle: a response (or a TLS record) written in two pieces would otherwise wait for the
    // peer's delayed ACK, 40 ms, for its second piece (measured: the extender's filter over HTTPS
    // took 44 ms instead of 0.4 ms).
    sock.set_option(tcp::no_delay(true), ec);
    auto ep = sock.remote_endpoint(ec);
    if (!ec) peer.address = fmt::format("{}:{}", ep.address().to_string(), ep.port());
    return peer;
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpHandler handler) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->handler = std::move(handler);
  const std::string& path = impl->options.unix_path;
  if (path.empty() && impl->options.tcp_address.empty()) {
    return absl::InvalidArgumentError("neither a unix socket path nor a TCP address");
  }
  if (impl->options.tls_cert_file.empty() != impl->options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and its key");
  }
  if (!impl->options.tls_cert_file.empty()) {
    if (impl->options.tcp_address.empty()) {
      return absl::InvalidArgumentError("TLS is for the TCP listener, and there is none");
    }
    impl->tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    impl->tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                           asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                           asio::ssl::context::no_tlsv1_1);
    beast::error_code ec;
    impl->tls->use_certificate_chain_file(impl->options.tls_cert_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          fmt::format("TLS certificate {}: {}", impl->options.tls_cert_file, ec.message()));
    }
    impl->tls->use_private_key_file(impl->options.tls_key_file, asio::ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          fmt::format("TLS key {}: {}", impl->options.tls_key_file, ec.message()));
    }
    if (const std::string& ca = impl->options.tls_client_ca_file; !ca.empty()) {
      impl->tls->load_verify_file(ca, ec);
      if (ec) {
        return absl::InvalidArgumentError(fmt::format("client CA {}: {}", ca, ec.message()));
      }
      impl->tls->set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
      // The chain is OpenSSL's to check; the leaf's common name ours, when names are given.
      std::vector<std::string> names = impl->options.tls_client_names;
      if (!names.empty()) {
        impl->tls->set_verify_callback([names](bool preverified, asio::ssl::verify_context& v) {
          X509_STORE_CTX* ctx = v.native_handle();
          if (!preverified || X509_STORE_CTX_get_error_depth(ctx) != 0) return preverified;
          char cn[256] = "";
          X509_NAME* subject = X509_get_subject_name(X509_STORE_CTX_get_current_cert(ctx));
          if (subject == nullptr ||
              X509_NAME_get_text_by_NID(subject, NID_commonName, cn, sizeof cn) <= 0) {
            return false;
          }
          return std::find(names.begin(), names.end(), std::string(cn)) != names.end();
        });
      }
    }
  } else if (!impl->options.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError("a client CA needs TLS (a certificate and its key)");
  }
  if (!path.empty() && path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(
        fmt::format("socket path {} is too long for a unix socket", path));
  }
  // A socket file left by a server that is gone is replaced; a live server's is not.
  struct stat st;
  if (!path.empty() && lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(fmt::format("{} exists and is not a socket", path));
    }
    // Live when it keeps accepting for a second: the listening socket of a server just killed can
    // outlive it for a moment in a child it had forked and not yet closed it in (a job being
    // started, on a loaded machine), and is gone once that child closes it.
    bool live = true;
    for (int attempt = 0; attempt < 20 && live; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      local::socket probe(impl->io);
      beast::error_code ec;
      probe.connect(local::endpoint(path), ec);
      live = !ec;
    }
    if (live) {
      return absl::FailedPreconditionError(
          fmt::format("a server is already listening on {}", path));
    }
    unlink(path.c_str());
  }
  beast::error_code ec;
  if (!path.empty()) {
    impl->unix_acceptor = std::make_unique<local::acceptor>(impl->io);
    impl->unix_acceptor->open(local::endpoint(path).protocol(), ec);
    if (!ec) impl->unix_acceptor->bind(local::endpoint(path), ec);
    if (!ec) impl->unix_acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(fmt::format("cannot listen on {}: {}", path, ec.message()));
    }
    // Anyone on the machine may connect: who they are comes from the peer credentials.
    chmod(path.c_str(), 0666);
  }
  int port = 0;
  if (!impl->options.tcp_address.empty()) {
    const std::string& a = impl->options.tcp_address;
    size_t colon = a.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(fmt::format("TCP address '{}': expected host:port", a));
    }
    std::string host = a.substr(0, colon);
    int want = 0;
    try {
      want = std::stoi(a.substr(colon + 1));
    } catch (...) {
      want = -1;
    }
    if (want < 0 || want > 65535)
      return absl::InvalidArgumentError(fmt::format("TCP address '{}': bad port", a));
    auto address = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
    if (ec) return absl::InvalidArgumentError(fmt::format("TCP address '{}': {}", a, ec.message()));
    tcp::endpoint ep(address, static_cast<unsigned short>(want));
    impl->tcp_acceptor = std::make_unique<tcp::acceptor>(impl->io);
    impl->tcp_acceptor->open(ep.protocol(), ec);
    if (!ec) impl->tcp_acceptor->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) impl->tcp_acceptor->bind(ep, ec);
    if (!ec) impl->tcp_acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return absl::UnavailableError(fmt::format("cannot listen on {}: {}", a, ec.message()));
    port = impl->tcp_acceptor->local_endpoint().port();
  }
  Impl* raw = impl.get();
  raw->reaper = std::thread([raw] { raw->Reap(); });
  if (raw->unix_acceptor) {
    raw->unix_thread =
        std::thread([raw] { raw->Accept<local::socket>(*raw->unix_acceptor, Impl::UnixPeer); });
  }
  if (raw->tcp_acceptor) {
    raw->tcp_thread =
        std::thread([raw] { raw->Accept<tcp::socket>(*raw->tcp_acceptor, Impl::TcpPeer); });
  }
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(impl)));
  server->tcp_port_ = port;
  return server;
}

void HttpServer::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  // Wake the blocked accepts, then every connection, and wait for their threads.
  if (impl_->unix_acceptor) ::shutdown(impl_->unix_acceptor->native_handle(), SHUT_RDWR);
  if (impl_->tcp_acceptor) ::shutdown(impl_->tcp_acceptor->native_handle(), SHUT_RDWR);
  if (impl_->unix_thread.joinable()) impl_->unix_thread.join();
  if (impl_->tcp_thread.joinable()) impl_->tcp_thread.join();
  beast::error_code ec;
  if (impl_->unix_acceptor) {
    impl_->unix_acceptor->close(ec);
    unlink(impl_->options.unix_path.c_str());
  }
  if (impl_->tcp_acceptor) impl_->tcp_acceptor->close(ec);
  std::unique_lock lock(impl_->mu);
  for (int fd : impl_->open_fds) ::shutdown(fd, SHUT_RDWR);
  impl_->cv.wait(lock, [&] { return impl_->open_fds.empty() && impl_->threads == 0; });
  impl_->reaper_cv.notify_all();
  lock.unlock();
  if (impl_->reaper.joinable()) impl_->reaper.join();
}

HttpServer::~HttpServer() { Stop(); }

// ---- client ----

struct HttpClient::Conn {
  asio::io_context io;
  std::unique_ptr<local::socket> unix_sock;
  std::unique_ptr<tcp::socket> tcp_sock;
  std::unique_ptr<asio::ssl::context> tls_ctx;
  std::unique_ptr<beast::ssl_stream<tcp::socket>> tls_sock;
  beast::flat_buffer buffer;

  template <typename Fn>
  void With(Fn fn) {
    if (unix_sock) return fn(*unix_sock);
    if (tls_sock) return fn(*tls_sock);
    fn(*tcp_sock);
  }
};

HttpClient::HttpClient(std::string endpoint, std::string bearer_token, std::string ca_file,
                       std::string client_cert_file, std::string client_key_file)
    : endpoint_(std::move(endpoint)),
      token_(std::move(bearer_token)),
      ca_file_(std::move(ca_file)),
      client_cert_file_(std::move(client_cert_file)),
      client_key_file_(std::move(client_key_file)) {}
HttpClient::~HttpClient() = default;

absl::StatusOr<HttpResponse> HttpClient::Send(const std::string& method, const std::string& target,
                                              const std::string& body,
                                              const std::string& idempotency_key) {
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, "tessera");
  req.set(http::field::user_agent, "tessera-cli");
  if (!token_.empty()) req.set(http::field::authorization, "Bearer " + token_);
  if (!idempotency_key.empty()) req.set("Idempotency-Key", idempotency_key);
  const bool repeatable = method != "POST" || !idempotency_key.empty();
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = body;
  req.prepare_payload();
  for (int attempt = 0; attempt < 2; ++attempt) {
    beast::error_code ec;
    const bool reused = conn_ != nullptr;
    if (!conn_) {
      conn_ = std::make_unique<Conn>();
      conn_->buffer.reserve(64 * 1024);  // an answer in a few reads, not 512 bytes each
      const bool https = endpoint_.rfind("https://", 0) == 0;
      if (https || endpoint_.rfind("tcp://", 0) == 0) {
        std::string hp = endpoint_.substr(https ? 8 : 6);
        size_t colon = hp.rfind(':');
        const std::string host = hp.substr(0, colon);
        tcp::resolver resolver(conn_->io);
        auto results = resolver.resolve(
            host, colon == std::string::npos ? (https ? "443" : "80") : hp.substr(colon + 1), ec);
        if (!https) {
          conn_->tcp_sock = std::make_unique<tcp::socket>(conn_->io);
          if (!ec) asio::connect(*conn_->tcp_sock, results, ec);
          if (!ec) conn_->tcp_sock->set_option(tcp::no_delay(true), ec);  // see TcpPeer
        } else {
          // The server's certificate must chain to the CA and name the host.
          conn_->tls_ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
          if (ca_file_.empty())
            conn_->tls_ctx->set_default_verify_paths(ec);
          else
            conn_->tls_ctx->load_verify_file(ca_file_, ec);
          if (ec) {
            std::string what = ec.message();
            conn_.reset();
            return absl::FailedPreconditionError(
                fmt::format("cannot load the CA certificates {}: {}",
                            ca_file_.empty() ? "of this system" : ca_file_, what));
          }
          conn_->tls_ctx->set_verify_mode(asio::ssl::verify_peer);
          if (!ec && !client_cert_file_.empty()) {
            conn_->tls_ctx->use_certificate_chain_file(client_cert_file_, ec);
            if (!ec)
              conn_->tls_ctx->use_private_key_file(client_key_file_, asio::ssl::context::pem, ec);
            if (ec) {
              std::string what = ec.message();
              conn_.reset();
              return absl::FailedPreconditionError(fmt::format(
                  "cannot load the client certificate {}: {}", client_cert_file_, what));
            }
          }
          conn_->tls_sock =
              std::make_unique<beast::ssl_stream<tcp::socket>>(conn_->io, *conn_->tls_ctx);
          conn_->tls_sock->set_verify_callback(asio::ssl::host_name_verification(host));
          SSL_set_tlsext_host_name(conn_->tls_sock->native_handle(), host.c_str());
          if (!ec) asio::connect(beast::get_lowest_layer(*conn_->tls_sock), results, ec);
          if (!ec) beast::get_lowest_layer(*conn_->tls_sock).set_option(tcp::no_delay(true), ec);
          if (!ec) conn_->tls_sock->handshake(asio::ssl::stream_base::client, ec);
        }
      } else {
        conn_->unix_sock = std::make_unique<local::socket>(conn_->io);
        conn_->unix_sock->connect(local::endpoint(endpoint_), ec);
      }
      if (ec) {
        conn_.reset();
        return absl::UnavailableError(
            fmt::format("cannot reach the Tessera server at {}: {} (is `tessera server` running?)",
                        endpoint_, ec.message()));
      }
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(1ull << 30);
    bool written = false;
    conn_->With([&](auto& stream) {
      http::write(stream, req, ec);
      written = !ec;
      if (!ec) http::read(stream, conn_->buffer, parser, ec);
    });
    if (ec) {
      conn_.reset();
      // Once more on a new connection: a kept-alive one the server had closed, or a request that
      // is harmless to repeat. A POST without a key that was sent may have been acted on: said,
      // never repeated blindly.
      if (attempt == 0 && (repeatable || (reused && !written) ||
                           (reused && !parser.got_some() && ec == http::error::end_of_stream))) {
        continue;
      }
      return absl::UnavailableError(
          fmt::format("request to {} failed: {}", endpoint_, ec.message()));
    }
    auto& msg = parser.get();
    HttpResponse r;
    r.status = static_cast<int>(msg.result_int());
    r.content_type = std::string(msg[http::field::content_type]);
    r.body = std::move(msg.body());
    if (!msg.keep_alive()) conn_.reset();
    return r;
  }
  return absl::UnavailableError("unreachable");
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

}  // namespace tessera::net
