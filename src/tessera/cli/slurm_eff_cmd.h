#pragma once
// `tessera slurm eff JOB`: seff's question for GPUs, asked of sacct on any machine of the cluster
// (docs/slurm.md). A client command: the small `tessera` runs it itself (client_main.cc), as
// `tessera-full slurm` lists it among the others.

#include <functional>
#include <memory>
#include <ostream>

namespace CLI {
class App;
}

namespace tessera::cli {

// Adds `eff` to the `slurm` command; the returned state lives as long as the command line.
std::shared_ptr<void> AddSlurmEff(CLI::App& slurm, std::function<int()>& action, std::ostream& out,
                                  std::ostream& err);

}  // namespace tessera::cli
