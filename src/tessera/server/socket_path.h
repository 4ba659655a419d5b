#pragma once
// Where the server listens and where a client goes: apart from the server so that the client
// (tessera's small front program, client_main.cc) links none of it.

#include <functional>
#include <string>

namespace tessera::server {

// The system server's socket (the installed service's: deploy/systemd).
inline constexpr char kSystemSocket[] = "/run/tessera/tessera.sock";
// Where a server run by this user listens by default: the system socket for root, else
// $XDG_RUNTIME_DIR/tessera.sock (or /tmp/tessera-<uid>.sock).
std::string DefaultSocketPath();
// Where a client goes when neither --socket nor TESSERA_SOCKET says: the user's own server
// (DefaultSocketPath) when a socket is there (`listening`), else the system server's - so a
// student on a lab machine needs no variable, and someone running their own server gets it.
std::string ClientSocketPath(const std::string& own,
                             const std::function<bool(const std::string&)>& listening);
std::string ClientSocketPath();

}  // namespace tessera::server
