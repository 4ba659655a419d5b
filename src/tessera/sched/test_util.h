#pragma once
// Small builders for scheduler tests.

#include <string>

#include "tessera/core/request.h"

namespace tessera::sched::testing {

inline core::NodeSpec Node(const std::string& name, int gpus, int64_t cpu = 64000,
                           int64_t mem = 256 * 1024, const std::string& model = "A100",
                           int64_t gpu_mem = 40960) {
  core::NodeSpec n;
  n.name = name;
  n.cpu_milli = cpu;
  n.memory_mib = mem;
  for (int i = 0; i < gpus; ++i) {
    n.gpus.push_back(core::NodeGpu{model, gpu_mem, {8, 0}, 0, name + "-gpu" + std::to_string(i)});
  }
  return n;
}

inline core::Request Whole(const std::string& id, int gpus, int64_t cpu = 1000) {
  core::Request r;
  r.id = id;
  r.gpus = gpus;
  r.cpu_milli = cpu;
  r.memory_mib = 1024;
  return r;
}

inline core::Request Share(const std::string& id, int milli, int64_t cpu = 1000) {
  core::Request r;
  r.id = id;
  r.gpu_milli = milli;
  r.cpu_milli = cpu;
  r.memory_mib = 1024;
  return r;
}

}  // namespace tessera::sched::testing
