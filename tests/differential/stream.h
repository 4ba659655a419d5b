#pragma once
// The job stream the differential tests run through the scheduling engine's executors, and what
// they compare: every start (which job, when, on which GPUs).

#include <cmath>
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
// What an elastic job's restart on its new size costs it (loading its checkpoint), on both sides.
constexpr double kRestartOverhead = 3;
// Amdahl's serial fraction of a job resized while it runs (both sides): on 4 GPUs a job of 2 works
// 1.69x as fast.
constexpr double kSerialFraction = 0.1;

struct StreamJob {
  double submit;  // seconds after kEpoch, whole
  json spec;      // the job as POSTed
  double duration;
};

// A seeded stream: whole-second arrivals and durations (exact in both clocks), priorities 0..2,
// shapes from one GPU to all eight and fractions of one; with `elastic`, half the jobs of
// two or more whole GPUs may take up to twice as many (resources.gpus_max, at most eight), half
// of those resized while they run (by signal: they checkpoint and start again on their new size),
// the others started larger for good; and a lull of ten minutes after every twentieth job lets the
// queue drain for an elastic one (2 to 4; after every second lull resized while it runs, shrunk for
// a job that comes next and grown again when that one ends).
inline std::vector<StreamJob> Stream(uint64_t seed, int n, bool elastic = false) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<StreamJob> jobs;
  double t = 0;
  for (int i = 0; i < n; ++i) {
    t += pick(0, 6);
    // A lull: the queue drains, and the elastic job that comes next starts larger.
    if (elastic && i % 20 == 19) t += 600;
    // After every second lull, a short one: the elastic job shrunk for the job before grows again.
    if (elastic && i % 40 == 2 && i > 2) t += 40;
    StreamJob j;
    j.submit = t;
    j.duration = pick(5, 60);
    j.spec = {{"command", {"sleep", std::to_string(static_cast<int>(j.duration))}},
              {"priority", pick(0, 2)}};
    int shape = pick(0, 9);
    if (shape < 6) {
      static constexpr int kGpus[] = {1, 1, 2, 2, 4, 8};
      j.spec["resources"] = {{"gpus", kGpus[shape]}};
      if (elastic && kGpus[shape] >= 2 && kGpus[shape] < 8 && pick(0, 1) == 0) {
        j.spec["resources"]["gpus_max"] = 2 * kGpus[shape];
        if (pick(0, 2) > 0) j.spec["resize"] = {{"by", "signal"}};
      }
    } else {
      j.spec["resources"] = {{"gpu_share", std::to_string(pick(1, 6) * 10) + "%"},
                             {"gpu_memory", "8GiB"}};
    }
    if (elastic && i > 0 && i % 20 == 0) {
      j.spec["resources"] = {{"gpus", 2}, {"gpus_max", 4}};
      j.spec.erase("resize");
      if (i % 40 == 0) j.spec["resize"] = {{"by", "signal"}};
    }
    if (pick(0, 9) == 0) j.spec["preemptible"] = false;
    // After every second lull: a job of one GPU; an elastic job started on 4 GPUs (its own 2 and 2
    // it grew onto), long enough to shrink and grow again while it runs; a job of 4 GPUs of the
    // highest priority, for which it gives back what it grew onto (3 of the 8 GPUs are free), and
    // which ends before the next arrival: the elastic job grows again.
    if (elastic && i % 40 == 39) {
      j.spec["resources"] = {{"gpus", 1}};
      j.spec.erase("resize");
      j.duration = 60;
    } else if (elastic && i % 40 == 0 && i > 0) {
      j.duration = 120;
    } else if (elastic && i % 40 == 1 && i > 1) {
      j.spec["resources"] = {{"gpus", 4}};
      j.spec["priority"] = 2;
      j.duration = 20;
      j.spec.erase("resize");
    }
    j.spec["command"][1] = std::to_string(static_cast<int>(j.duration));
    jobs.push_back(std::move(j));
  }
  return jobs;
}

struct Start {
  std::string id;
  double at;
  std::vector<int> gpus;
  // The same start: the same job on the same GPUs at the same time - to the microsecond, as the
  // server's clock counts whole nanoseconds and a job that works faster on more GPUs ends between
  // them.
  bool operator==(const Start& o) const {
    return id == o.id && gpus == o.gpus && std::abs(at - o.at) < 1e-6;
  }
};
inline std::ostream& operator<<(std::ostream& o, const Start& s) {
  o << "job " << s.id << " at " << s.at << " on [";
  for (int g : s.gpus) o << g << ' ';
  return o << ']';
}

}  // namespace tessera
