#pragma once
// `tessera extender`: the Kubernetes scheduler extender (filter, prioritize, bind, preempt).

#include <functional>
#include <memory>
#include <ostream>

namespace CLI {
class App;
}

namespace tessera::cli {

std::shared_ptr<void> AddExtenderCommand(CLI::App& app, std::function<int()>& action,
                                         std::ostream& out, std::ostream& err);

}  // namespace tessera::cli
