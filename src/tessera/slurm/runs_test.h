#pragma once
// Accounting records of ended runs (acct/<job>.json as EndJob writes them) that the tests of the
// AdminComment's parts (step_test.cc) and of `tessera slurm eff`'s reading of them (eff_test.cc)
// share: what one writes, the other reads back.

#include <cstdint>

#include "nlohmann/json.hpp"

namespace tessera::slurm::test {

inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// A quarter of GPU 1 for 100 s, 20 s of it busy, 3 of its 4 GiB at peak, two refusals.
inline const nlohmann::json& QuarterRun() {
  static const nlohmann::json run = {{"started", 1000},
                                     {"ended", 1100},
                                     {"share_percent", 25.0},
                                     {"gpus",
                                      {{{"index", 1},
                                        {"gpu_time_s", 20.0},
                                        {"peak_memory_bytes", 3 * kGiB},
                                        {"memory_limit_bytes", 4 * kGiB},
                                        {"refused", 2}}}}};
  return run;
}

// Halves of GPUs 0 and 1 for 100 s, 10 and 70 s busy (70 is past its half: counted as the 50 it
// held), 1 and 6 GiB of 8 at peak.
inline const nlohmann::json& HalvesRun() {
  static const nlohmann::json run = {{"started", 0},
                                     {"ended", 100},
                                     {"share_percent", 50.0},
                                     {"gpus",
                                      {{{"index", 0},
                                        {"gpu_time_s", 10.0},
                                        {"peak_memory_bytes", kGiB},
                                        {"memory_limit_bytes", 8 * kGiB}},
                                       {{"index", 1},
                                        {"gpu_time_s", 70.0},
                                        {"peak_memory_bytes", 6 * kGiB},
                                        {"memory_limit_bytes", 8 * kGiB}}}}};
  return run;
}

// A whole GPU 2 for an hour, 40 GiB at peak (its busy time not measured).
inline const nlohmann::json& WholeRun() {
  static const nlohmann::json run = {{"started", 0},
                                     {"ended", 3600},
                                     {"share_percent", 0.0},
                                     {"gpus", {{{"index", 2}, {"peak_memory_bytes", 40 * kGiB}}}}};
  return run;
}

}  // namespace tessera::slurm::test
