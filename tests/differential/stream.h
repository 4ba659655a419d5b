#pragma once
// The job stream the differential tests run through the scheduling engine's executors, and what
// they compare: every start (which job, when, on which GPUs).

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tessera {

using nlohmann::json;

constexpr double kEpoch = 1'800'000'000;  // the fake clock's start, seconds
constexpr double kStopLatency = 2;

struct StreamJob {
  double submit;  // seconds after kEpoch, whole
  json spec;      // the job as POSTed
  double duration;
};

// A seeded stream: whole-second arrivals and durations (exact in both clocks), priorities 0..2,
// shapes from one GPU to all eight and fractions of one.
inline std::vector<StreamJob> Stream(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<StreamJob> jobs;
  double t = 0;
  for (int i = 0; i < n; ++i) {
    t += pick(0, 6);
    StreamJob j;
    j.submit = t;
    j.duration = pick(5, 60);
    j.spec = {{"command", {"sleep", std::to_string(static_cast<int>(j.duration))}},
              {"priority", pick(0, 2)}};
    int shape = pick(0, 9);
    if (shape < 6) {
      static constexpr int kGpus[] = {1, 1, 2, 2, 4, 8};
      j.spec["resources"] = {{"gpus", kGpus[shape]}};
    } else {
      j.spec["resources"] = {{"gpu_share", std::to_string(pick(1, 6) * 10) + "%"},
                             {"gpu_memory", "8GiB"}};
    }
    if (pick(0, 9) == 0) j.spec["preemptible"] = false;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

struct Start {
  std::string id;
  double at;
  std::vector<int> gpus;
  bool operator==(const Start&) const = default;
};
inline std::ostream& operator<<(std::ostream& o, const Start& s) {
  o << "job " << s.id << " at " << s.at << " on [";
  for (int g : s.gpus) o << g << ' ';
  return o << ']';
}

}  // namespace tessera
