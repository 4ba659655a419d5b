#pragma once
// `tessera agent`: the Kubernetes node agent (device plugin, health, metrics).

#include <functional>
#include <memory>
#include <ostream>

namespace CLI {
class App;
}

namespace tessera::cli {

std::shared_ptr<void> AddAgentCommand(CLI::App& app, std::function<int()>& action,
                                      std::ostream& out, std::ostream& err);

}  // namespace tessera::cli
