#pragma once
// `tessera slurm`: what the Slurm plugin (tessera-spank.so) leaves on a node: `acct` (ended jobs'
// GPU time and peak memory), `exporter` (running jobs' use for Prometheus). docs/slurm.md.

#include <functional>
#include <memory>
#include <ostream>

namespace CLI {
class App;
}

namespace tessera::cli {

std::shared_ptr<void> AddSlurmCommands(CLI::App& app, std::function<int()>& action,
                                       std::ostream& out, std::ostream& err);

}  // namespace tessera::cli
