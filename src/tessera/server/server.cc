// The daemon: the dispatcher, the API and the listeners, started and stopped together.
#include "tessera/server/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "tessera/server/api.h"
#include "tessera/server/api_response.h"
#include "tessera/server/dispatcher.h"
#include "tessera/server/server_util.h"

namespace tessera::server {

ServerConfig DefaultServerConfig() {
  ServerConfig c;
  c.socket = DefaultSocketPath();
  if (geteuid() == 0) {
    c.state_dir = "/var/lib/tessera";
  } else {
    const char* home = getenv("HOME");
    c.state_dir = std::string(home && *home ? home : "/tmp") + "/.local/state/tessera";
  }
  return c;
}

std::string StateCgroupName(const std::string& state_dir) {
  std::error_code ec;
  std::string path = std::filesystem::weakly_canonical(state_dir, ec).string();
  if (ec || path.empty()) path = state_dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path == DefaultServerConfig().state_dir) return "tessera";
  uint32_t h = 2166136261u;  // FNV-1a: stable across builds and machines
  for (unsigned char ch : path) h = (h ^ ch) * 16777619u;
  return fmt::format("tessera-{:08x}", h);
}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerConfig config, ServerDeps deps) {
  auto d = Dispatcher::Create(std::move(config), std::move(deps));
  if (!d.ok()) return d.status();
  std::unique_ptr<Server> s(new Server());
  s->dispatcher_ = std::move(*d);
  s->api_ = std::make_unique<Api>(*s->dispatcher_);
  return s;
}

Server::~Server() { Stop(); }

absl::Status Server::Start(StartOptions options) {
  if (absl::Status st = dispatcher_->Start(options.loop, options.health); !st.ok()) return st;
  if (options.loop) api_->StartMetricsRefresher(kMetricsAcctMaxAgeS / 2);
  if (!options.listen) return absl::OkStatus();
  const ServerConfig& c = dispatcher_->config();
  net::HttpServerOptions ho;
  ho.unix_path = c.socket;
  ho.tcp_address = c.tcp_listen;
  ho.max_body_bytes = c.max_body_bytes;
  ho.idle_timeout_s = c.idle_timeout_s;
  ho.request_timeout_s = c.request_timeout_s;
  ho.max_connections = c.max_connections;
  ho.max_tcp_connections = c.max_tcp_connections;
  ho.max_connections_per_peer = c.max_connections_per_peer;
  ho.reserved = [this](const net::Peer& p) {
    return p.unix_socket && (p.uid == 0 || dispatcher_->rights().IsAdmin(UserName(p.uid), p.uid));
  };
  ho.tls_cert_file = c.tls_cert_file;
  ho.tls_key_file = c.tls_key_file;
  ho.error_response = [](int status, const std::string& message) { return Error(status, message); };
  auto http =
      net::HttpServer::Start(ho, [this](const net::HttpRequest& r) { return api_->Handle(r); });
  if (!http.ok()) {
    Stop();
    return http.status();
  }
  http_ = std::move(*http);
  const bool tls = !c.tls_cert_file.empty();
  spdlog::info("listening on {}{}", c.socket,
               c.tcp_listen.empty() ? ""
                                    : fmt::format(" and tcp port {} ({})", http_->tcp_port(),
                                                  tls ? "TLS, " + c.tls_cert_file : "plain HTTP"));
  if (!c.tcp_listen.empty() && !tls && !IsLoopback(c.tcp_listen)) {
    spdlog::warn(
        "tcp.listen {} is not a loopback address and has no TLS: bearer tokens and jobs' "
        "environments travel in clear; set tcp.tls {{cert, key}} in the config",
        c.tcp_listen);
  }
  return absl::OkStatus();
}

void Server::Stop() {
  if (http_) http_->Stop();  // no request is answered after this
  if (api_) api_->StopMetricsRefresher();
  if (dispatcher_) dispatcher_->Stop();
}

net::HttpResponse Server::Handle(const net::HttpRequest& req) { return api_->Handle(req); }
void Server::StartMetricsRefresher(double period_s) { api_->StartMetricsRefresher(period_s); }
bool Server::RunOnce() { return dispatcher_->RunOnce(); }
std::string Server::TakeSample() { return dispatcher_->TakeSample(); }
const core::NodeSpec& Server::node() const { return dispatcher_->node(); }
const core::NodeInventory& Server::inventory() const { return dispatcher_->inventory(); }
const std::string& Server::fallback_reason() const { return dispatcher_->fallback_reason(); }
int Server::tcp_port() const { return http_ ? http_->tcp_port() : 0; }

}  // namespace tessera::server
