// A fake libnvidia-ml.so.1 for tests: a real shared library exporting the nvml* symbols Tessera
// uses. What it reports is scripted by the JSON scenario file named in $FAKE_NVML_SCENARIO, read at
// the first nvmlInit (see tests/fakes/nvml/README.md for the format). Versioned builds export
// subsets of the symbols (a version script per variant) to exercise the loader's fallbacks.

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../cuda/gpu_kernel_client.h"
#include "tessera/devices/nvml_abi.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct NvLink {
  std::string remote_bus;
  int type = NVML_NVLINK_DEVICE_TYPE_GPU;
  bool active = true;
};

struct Device {
  std::string uuid, name, bus_id;
  unsigned long long memory_total = 0;
  int cc_major = 0, cc_minor = 0;
  int ecc = 1, mig = -1;  // -1: MIG not supported
  int numa = -1;          // -1: nvmlDeviceGetNumaNodeId not supported
  unsigned minor = 0;
  unsigned utilization = 0, memory_utilization = 0, temperature = 40, power_mw = 100000;
  unsigned sm_clock_mhz = 1410, mem_clock_mhz = 1215;
  // GPU performance monitoring (GPM): on Hopper and later boards; the tensor pipes' activity, %.
  bool gpm = false;
  double tensor_util = 0, dram_util = 0;
  // dcgm-exporter's other fields: energy since load (mJ, from power over time when not scripted),
  // PCIe, the video engines, remapped rows (Ampere and later: "remapped_rows" in the scenario).
  long long energy_mj = -1;
  unsigned long long nvlink_tx_kib = 0, nvlink_rx_kib = 0;  // over all its links
  unsigned pcie_replays = 0, pcie_tx_kbps = 0, pcie_rx_kbps = 0, enc_util = 0, dec_util = 0;
  bool remapping = false;
  int memory_temp = -1;  // -1: the field answers NOT_SUPPORTED (a GDDR board)
  unsigned rows_correctable = 0, rows_uncorrectable = 0, remap_pending = 0, remap_failure = 0;
  unsigned long long memory_used = 0;
  // Its compute processes (pid, GPU memory); self_memory > 0: the calling process is one of them.
  std::vector<std::pair<unsigned, unsigned long long>> processes;
  unsigned long long self_memory = 0;
  // "self_memory": "cuda" - what the fake libcuda.so.1 in this process holds on the device of the
  // same index (fakeCudaUsedBytes), as a real driver reports a process's contexts, modules and
  // allocations.
  bool self_from_cuda = false;
  std::vector<NvLink> nvlinks;
  std::map<std::string, int> errors;
  long lost_from_ms = -1, lost_until_ms = -1;
};

struct Event {
  long at_ms;
  unsigned device;
  unsigned long long type, data;
};

struct EventSet {
  std::map<unsigned, unsigned long long> registered;  // device -> event types
  size_t cursor = 0;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;
  int init_refs = 0;
  Clock::time_point init_time;
  json scenario;
  std::vector<std::unique_ptr<Device>> devices;
  // MIG devices (instances) of each GPU, by the GPU's index: handles of their own, not counted.
  std::map<unsigned, std::vector<std::unique_ptr<Device>>> migs;
  std::vector<std::vector<int>> topology;
  std::vector<Event> events;
  std::map<std::string, int> errors;
  std::map<std::string, long> calls;
  long shutdowns = 0;
  std::vector<std::unique_ptr<EventSet>> sets;
};

State& S() {
  static State s;
  return s;
}

long ElapsedMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - S().init_time)
      .count();
}

void Count(const char* fn) {
  std::lock_guard lock(S().mu);
  ++S().calls[fn];
}

// Returns the scripted error of `fn` (globally or for `dev`), or GPU_IS_LOST in the device's lost
// window.
int Scripted(const char* fn, const Device* dev = nullptr) {
  State& s = S();
  std::lock_guard lock(s.mu);
  ++s.calls[fn];
  if (s.init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (auto it = s.errors.find(fn); it != s.errors.end()) return it->second;
  if (dev != nullptr) {
    if (auto it = dev->errors.find(fn); it != dev->errors.end()) return it->second;
    long t = ElapsedMs();
    if (dev->lost_from_ms >= 0 && t >= dev->lost_from_ms &&
        (dev->lost_until_ms < 0 || t < dev->lost_until_ms)) {
      return NVML_ERROR_GPU_IS_LOST;
    }
  }
  return NVML_SUCCESS;
}

Device* Dev(nvmlDevice_t handle) {
  for (auto& d : S().devices) {
    if (reinterpret_cast<nvmlDevice_t>(d.get()) == handle) return d.get();
  }
  for (auto& [gpu, list] : S().migs) {
    for (auto& m : list) {
      if (reinterpret_cast<nvmlDevice_t>(m.get()) == handle) return m.get();
    }
  }
  return nullptr;
}

int LoadScenario(State& s) {
  const char* path = std::getenv("FAKE_NVML_SCENARIO");
  s.scenario = json::object();
  if (path != nullptr && *path) {
    std::ifstream in(path);
    if (!in) {
      std::fprintf(stderr, "fake nvml: cannot read scenario %s\n", path);
      return NVML_ERROR_UNKNOWN;
    }
    try {
      s.scenario = json::parse(in);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fake nvml: bad scenario %s: %s\n", path, e.what());
      return NVML_ERROR_UNKNOWN;
    }
  }
  const json& j = s.scenario;
  s.devices.clear();
  s.events.clear();
  s.errors.clear();
  s.sets.clear();
  if (j.contains("errors")) s.errors = j["errors"].get<std::map<std::string, int>>();
  int index = 0;
  for (const json& d : j.value("devices", json::array())) {
    auto dev = std::make_unique<Device>();
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-fa4e0000-0000-0000-0000-%012d", index);
    dev->uuid = d.value("uuid", std::string(uuid));
    dev->name = d.value("name", std::string("NVIDIA Fake GPU"));
    char bus[32];
    std::snprintf(bus, sizeof bus, "00000000:%02X:00.0", 0x10 + index);
    dev->bus_id = d.value("pci_bus_id", std::string(bus));
    dev->memory_total = d.value("memory_total", 16ull << 30);
    if (d.contains("cc")) {
      dev->cc_major = d["cc"][0];
      dev->cc_minor = d["cc"][1];
    } else {
      dev->cc_major = 8;
    }
    dev->ecc = d.value("ecc", 1);
    dev->mig = d.value("mig", -1);
    dev->numa = d.value("numa", -1);
    dev->minor = d.value("minor", index);
    dev->utilization = d.value("utilization", 0u);
    dev->memory_utilization = d.value("memory_utilization", dev->utilization / 2);
    dev->memory_used = d.value("memory_used", dev->memory_total / 100);
    dev->temperature = d.value("temperature", 40u);
    dev->power_mw = d.value("power_mw", 100000u);
    dev->sm_clock_mhz = d.value("sm_clock_mhz", 1410u);
    dev->mem_clock_mhz = d.value("mem_clock_mhz", 1215u);
    dev->gpm = d.value("gpm", dev->name.find("H100") != std::string::npos ||
                                  dev->name.find("H200") != std::string::npos);
    dev->tensor_util = d.value("tensor_util", 0.0);
    dev->dram_util = d.value("dram_util", 0.0);
    dev->energy_mj = d.value("energy_mj", -1LL);
    dev->pcie_replays = d.value("pcie_replays", 0u);
    dev->nvlink_tx_kib = d.value("nvlink_tx_kib", 0ull);
    dev->nvlink_rx_kib = d.value("nvlink_rx_kib", 0ull);
    dev->pcie_tx_kbps = d.value("pcie_tx_kbps", 0u);
    dev->pcie_rx_kbps = d.value("pcie_rx_kbps", 0u);
    dev->enc_util = d.value("enc_util", 0u);
    // HBM boards (H100, H200, A100) report their memory's temperature; others do not.
    const bool hbm = dev->name.find("H100") != std::string::npos ||
                     dev->name.find("H200") != std::string::npos ||
                     dev->name.find("A100") != std::string::npos;
    dev->memory_temp = d.value("memory_temp", hbm ? static_cast<int>(dev->temperature) + 8 : -1);
    dev->dec_util = d.value("dec_util", 0u);
    // "remapped_rows": {"correctable": N, "uncorrectable": N, "pending": 0|1, "failure": 0|1};
    // by default on Ampere and later (compute capability 8+), as the driver answers.
    dev->remapping = dev->cc_major >= 8;
    if (d.contains("remapped_rows")) {
      const json& r = d["remapped_rows"];
      dev->remapping = !r.is_null();
      if (r.is_object()) {
        dev->rows_correctable = r.value("correctable", 0u);
        dev->rows_uncorrectable = r.value("uncorrectable", 0u);
        dev->remap_pending = r.value("pending", 0u);
        dev->remap_failure = r.value("failure", 0u);
      }
    }
    // "processes": [{"pid": N, "used_memory": bytes}], "self_memory": bytes (the caller too)
    for (const json& pr : d.value("processes", json::array()))
      dev->processes.emplace_back(pr.value("pid", 0u), pr.value("used_memory", 0ull));
    if (d.contains("self_memory") && d["self_memory"].is_string()) {
      dev->self_from_cuda = d["self_memory"] == "cuda";
    } else {
      dev->self_memory = d.value("self_memory", 0ull);
    }
    if (d.contains("errors")) dev->errors = d["errors"].get<std::map<std::string, int>>();
    dev->lost_from_ms = d.value("lost_from_ms", -1L);
    dev->lost_until_ms = d.value("lost_until_ms", -1L);
    for (const json& l : d.value("nvlinks", json::array())) {
      dev->nvlinks.push_back(NvLink{l.value("remote", std::string()),
                                    l.value("type", int(NVML_NVLINK_DEVICE_TYPE_GPU)),
                                    l.value("active", true)});
    }
    // Shorthand: N links into an NVSwitch fabric.
    for (int k = 0; k < d.value("nvswitch_links", 0); ++k) {
      dev->nvlinks.push_back(NvLink{"00000000:C0:00.0", NVML_NVLINK_DEVICE_TYPE_SWITCH, true});
    }
    // "mig_devices": [{"uuid": "MIG-...", "memory_total": bytes, "memory_used": bytes}]
    int mig_index = 0;
    for (const json& m : d.value("mig_devices", json::array())) {
      auto mig = std::make_unique<Device>(*dev);
      mig->nvlinks.clear();
      char muuid[64];
      std::snprintf(muuid, sizeof muuid, "MIG-fa4e0000-0000-0000-%04d-%012d", index, mig_index++);
      mig->uuid = m.value("uuid", std::string(muuid));
      mig->memory_total = m.value("memory_total", dev->memory_total / 7);
      mig->memory_used = m.value("memory_used", mig->memory_total / 100);
      s.migs[static_cast<unsigned>(index)].push_back(std::move(mig));
    }
    s.devices.push_back(std::move(dev));
    ++index;
  }
  s.topology.clear();
  if (j.contains("topology")) s.topology = j["topology"].get<std::vector<std::vector<int>>>();
  for (const json& e : j.value("events", json::array())) {
    s.events.push_back(Event{e.value("at_ms", 0L), e.value("device", 0u),
                             e.value("type", nvmlEventTypeXidCriticalError),
                             e.value("data", 0ull)});
  }
  return j.value("init_error", 0);
}

void CopyString(char* dst, unsigned len, const std::string& src) {
  if (len == 0) return;
  std::snprintf(dst, len, "%s", src.c_str());
}

// The nvmlPciInfo_t layout before _v3: the bus id first, in 16 bytes.
struct LegacyPciInfo {
  char busId[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  unsigned reserved[4];
};

void FillPci(const std::string& bus_id, nvmlPciInfo_t* pci) {
  std::memset(pci, 0, sizeof *pci);
  CopyString(pci->busId, sizeof pci->busId, bus_id);
  CopyString(pci->busIdLegacy, sizeof pci->busIdLegacy, bus_id.substr(4));
  std::sscanf(bus_id.c_str(), "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
}

void FillLegacyPci(const std::string& bus_id, LegacyPciInfo* pci) {
  std::memset(pci, 0, sizeof *pci);
  CopyString(pci->busId, sizeof pci->busId, bus_id.substr(4));
  std::sscanf(bus_id.c_str(), "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
}

nvmlReturn_t InitImpl(const char* name) {
  State& s = S();
  std::lock_guard lock(s.mu);
  ++s.calls[name];
  if (s.init_refs == 0) {
    s.calls.clear();
    s.calls[name] = 1;
    int err = LoadScenario(s);
    if (err != 0) return err;
    s.init_time = Clock::now();
  }
  ++s.init_refs;
  return NVML_SUCCESS;
}

}  // namespace

// Test hooks, not part of NVML.
EXPORT long fakeNvmlCallCount(const char* fn) {
  std::lock_guard lock(S().mu);
  auto it = S().calls.find(fn);
  return it == S().calls.end() ? 0 : it->second;
}
EXPORT long fakeNvmlShutdownCount() {
  std::lock_guard lock(S().mu);
  return S().shutdowns;
}
EXPORT int fakeNvmlInitRefs() {
  std::lock_guard lock(S().mu);
  return S().init_refs;
}

EXPORT nvmlReturn_t nvmlInit_v2() { return InitImpl("nvmlInit_v2"); }
EXPORT nvmlReturn_t nvmlInit() { return InitImpl("nvmlInit"); }

EXPORT nvmlReturn_t nvmlShutdown() {
  State& s = S();
  std::lock_guard lock(s.mu);
  ++s.calls["nvmlShutdown"];
  if (s.init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  --s.init_refs;
  ++s.shutdowns;
  s.cv.notify_all();
  return NVML_SUCCESS;
}

EXPORT const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* buf, unsigned len) {
  if (int e = Scripted("nvmlSystemGetDriverVersion")) return e;
  CopyString(buf, len, S().scenario.value("driver_version", std::string("550.00.00")));
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* v) {
  if (int e = Scripted("nvmlSystemGetCudaDriverVersion_v2")) return e;
  *v = S().scenario.value("cuda_driver_version", 12040);
  return NVML_SUCCESS;
}

static nvmlReturn_t CountImpl(const char* name, unsigned* count) {
  if (int e = Scripted(name)) return e;
  *count = static_cast<unsigned>(S().devices.size());
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* c) {
  return CountImpl("nvmlDeviceGetCount_v2", c);
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned* c) { return CountImpl("nvmlDeviceGetCount", c); }

static nvmlReturn_t HandleImpl(const char* name, unsigned i, nvmlDevice_t* h) {
  if (int e = Scripted(name)) return e;
  if (i >= S().devices.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *h = reinterpret_cast<nvmlDevice_t>(S().devices[i].get());
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t* h) {
  return HandleImpl("nvmlDeviceGetHandleByIndex_v2", i, h);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned i, nvmlDevice_t* h) {
  return HandleImpl("nvmlDeviceGetHandleByIndex", i, h);
}

#define DEVICE_OR_FAIL(fn)              \
  Device* d = Dev(dev);                 \
  if (d == nullptr) {                   \
    Count(fn);                          \
    return NVML_ERROR_INVALID_ARGUMENT; \
  }                                     \
  if (int e = Scripted(fn, d)) return e;

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char* buf, unsigned len) {
  DEVICE_OR_FAIL("nvmlDeviceGetUUID");
  CopyString(buf, len, d->uuid);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char* buf, unsigned len) {
  DEVICE_OR_FAIL("nvmlDeviceGetName");
  CopyString(buf, len, d->name);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t* m) {
  DEVICE_OR_FAIL("nvmlDeviceGetMemoryInfo");
  m->total = d->memory_total;
  m->used = d->memory_used;
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}

// The running processes, as NVML answers: too small a buffer (or none) gets the count needed and
// NVML_ERROR_INSUFFICIENT_SIZE.
template <typename Info>
nvmlReturn_t RunningProcesses(Device* d, unsigned* count, Info* infos) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  std::vector<std::pair<unsigned, unsigned long long>> all = d->processes;
  unsigned long long self = d->self_memory;
  std::string listed;
  if (d->self_from_cuda &&
      fake_gpu_kernel::Ask("list " + std::to_string(d->minor) + "\n", &listed)) {
    // The machine's table (gpu_kernel.h): every process by its host pid, this one included, as
    // the real driver answers in any pid namespace.
    unsigned pid = 0;
    unsigned long long bytes = 0;
    for (const char* p = listed.c_str(); sscanf(p, "%u %llu", &pid, &bytes) == 2;) {
      all.emplace_back(pid, bytes);
      p = strchr(p, '\n');
      if (p == nullptr) break;
      ++p;
    }
    self = 0;
  } else if (d->self_from_cuda) {
    auto used = reinterpret_cast<uint64_t (*)(int)>(dlsym(RTLD_DEFAULT, "fakeCudaUsedBytes"));
    self = used ? used(static_cast<int>(d->minor)) : 0;
  }
  if (self > 0) all.emplace_back(static_cast<unsigned>(getpid()), self);
  if (*count < all.size() || (infos == nullptr && !all.empty())) {
    *count = static_cast<unsigned>(all.size());
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  for (size_t i = 0; i < all.size(); ++i) {
    infos[i] = Info{};
    infos[i].pid = all[i].first;
    infos[i].usedGpuMemory = all[i].second;
  }
  *count = static_cast<unsigned>(all.size());
  return NVML_SUCCESS;
}
#define FAKE_PROCESSES(name, Info)                                           \
  EXPORT nvmlReturn_t name(nvmlDevice_t dev, unsigned* count, Info* infos) { \
    DEVICE_OR_FAIL(#name);                                                   \
    return RunningProcesses(d, count, infos);                                \
  }
FAKE_PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
FAKE_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
FAKE_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
FAKE_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
FAKE_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t)
FAKE_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
#undef FAKE_PROCESSES

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t* m) {
  DEVICE_OR_FAIL("nvmlDeviceGetMemoryInfo_v2");
  if (m->version != kNvmlMemoryV2Version) return NVML_ERROR_INVALID_ARGUMENT;
  m->total = d->memory_total;
  m->reserved = d->memory_total / 200;
  m->used = d->memory_used;
  m->free = m->total - m->used - m->reserved;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t* pci) {
  DEVICE_OR_FAIL("nvmlDeviceGetPciInfo_v3");
  FillPci(d->bus_id, pci);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t dev, LegacyPciInfo* pci) {
  DEVICE_OR_FAIL("nvmlDeviceGetPciInfo");
  FillLegacyPci(d->bus_id, pci);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int* major, int* minor) {
  DEVICE_OR_FAIL("nvmlDeviceGetCudaComputeCapability");
  *major = d->cc_major;
  *minor = d->cc_minor;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, int* current, int* pending) {
  DEVICE_OR_FAIL("nvmlDeviceGetEccMode");
  *current = *pending = d->ecc;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned index,
                                                        nvmlDevice_t* mig) {
  DEVICE_OR_FAIL("nvmlDeviceGetMigDeviceHandleByIndex");
  if (mig == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  State& st = S();
  for (size_t i = 0; i < st.devices.size(); ++i) {
    if (st.devices[i].get() != d) continue;
    auto it = st.migs.find(static_cast<unsigned>(i));
    if (it == st.migs.end() || index >= it->second.size()) return NVML_ERROR_NOT_FOUND;
    *mig = reinterpret_cast<nvmlDevice_t>(it->second[index].get());
    return NVML_SUCCESS;
  }
  return NVML_ERROR_INVALID_ARGUMENT;  // a MIG device has no MIG devices
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned* current, unsigned* pending) {
  DEVICE_OR_FAIL("nvmlDeviceGetMigMode");
  if (d->mig < 0) return NVML_ERROR_NOT_SUPPORTED;
  *current = *pending = static_cast<unsigned>(d->mig);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, unsigned* node) {
  DEVICE_OR_FAIL("nvmlDeviceGetNumaNodeId");
  if (d->numa < 0) return NVML_ERROR_NOT_SUPPORTED;
  *node = static_cast<unsigned>(d->numa);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned* minor) {
  DEVICE_OR_FAIL("nvmlDeviceGetMinorNumber");
  *minor = d->minor;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b,
                                                        int* level) {
  Device* da = Dev(a);
  Device* db = Dev(b);
  if (int e = Scripted("nvmlDeviceGetTopologyCommonAncestor", da)) return e;
  if (da == nullptr || db == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  size_t ia = 0, ib = 0;
  for (size_t i = 0; i < S().devices.size(); ++i) {
    if (S().devices[i].get() == da) ia = i;
    if (S().devices[i].get() == db) ib = i;
  }
  const auto& t = S().topology;
  *level = (ia < t.size() && ib < t[ia].size()) ? t[ia][ib] : NVML_TOPOLOGY_SYSTEM;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned link, int* active) {
  DEVICE_OR_FAIL("nvmlDeviceGetNvLinkState");
  if (d->nvlinks.empty()) return NVML_ERROR_NOT_SUPPORTED;
  if (link >= d->nvlinks.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *active = d->nvlinks[link].active ? 1 : 0;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned link,
                                                        nvmlPciInfo_t* pci) {
  DEVICE_OR_FAIL("nvmlDeviceGetNvLinkRemotePciInfo_v2");
  if (link >= d->nvlinks.size()) return NVML_ERROR_INVALID_ARGUMENT;
  FillPci(d->nvlinks[link].remote_bus, pci);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t dev, unsigned link,
                                                     LegacyPciInfo* pci) {
  DEVICE_OR_FAIL("nvmlDeviceGetNvLinkRemotePciInfo");
  if (link >= d->nvlinks.size()) return NVML_ERROR_INVALID_ARGUMENT;
  FillLegacyPci(d->nvlinks[link].remote_bus, pci);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t dev, unsigned link,
                                                        int* type) {
  DEVICE_OR_FAIL("nvmlDeviceGetNvLinkRemoteDeviceType");
  if (link >= d->nvlinks.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *type = d->nvlinks[link].type;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t* u) {
  DEVICE_OR_FAIL("nvmlDeviceGetUtilizationRates");
  u->gpu = d->utilization;
  u->memory = d->memory_utilization;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned* t) {
  DEVICE_OR_FAIL("nvmlDeviceGetTemperature");
  if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
  *t = d->temperature;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned* mw) {
  DEVICE_OR_FAIL("nvmlDeviceGetPowerUsage");
  *mw = d->power_mw;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned* mhz) {
  DEVICE_OR_FAIL("nvmlDeviceGetClockInfo");
  if (mhz == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS) {
    *mhz = d->sm_clock_mhz;
  } else if (type == NVML_CLOCK_MEM) {
    *mhz = d->mem_clock_mhz;
  } else {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long* mj) {
  DEVICE_OR_FAIL("nvmlDeviceGetTotalEnergyConsumption");
  if (mj == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (d->energy_mj >= 0) {
    *mj = static_cast<unsigned long long>(d->energy_mj);
  } else {
    // Its power since nvmlInit, as the counter grows on a real board.
    const double s = std::chrono::duration<double>(Clock::now() - S().init_time).count();
    *mj = static_cast<unsigned long long>(d->power_mw * s);
  }
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned* n) {
  DEVICE_OR_FAIL("nvmlDeviceGetPcieReplayCounter");
  if (n == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *n = d->pcie_replays;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter, unsigned* kbps) {
  DEVICE_OR_FAIL("nvmlDeviceGetPcieThroughput");
  if (kbps == nullptr || counter < 0 || counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
  *kbps = counter == 0 ? d->pcie_tx_kbps : d->pcie_rx_kbps;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t dev, unsigned* util,
                                                    unsigned* period_us) {
  DEVICE_OR_FAIL("nvmlDeviceGetEncoderUtilization");
  if (util == nullptr || period_us == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *util = d->enc_util;
  *period_us = 167000;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t dev, unsigned* util,
                                                    unsigned* period_us) {
  DEVICE_OR_FAIL("nvmlDeviceGetDecoderUtilization");
  if (util == nullptr || period_us == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *util = d->dec_util;
  *period_us = 167000;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned* correctable,
                                              unsigned* uncorrectable, unsigned* pending,
                                              unsigned* failure) {
  DEVICE_OR_FAIL("nvmlDeviceGetRemappedRows");
  if (!d->remapping) return NVML_ERROR_NOT_SUPPORTED;  // before Ampere: retired pages instead
  if (correctable == nullptr || uncorrectable == nullptr || pending == nullptr ||
      failure == nullptr)
    return NVML_ERROR_INVALID_ARGUMENT;
  *correctable = d->rows_correctable;
  *uncorrectable = d->rows_uncorrectable;
  *pending = d->remap_pending;
  *failure = d->remap_failure;
  return NVML_SUCCESS;
}

// Field values as the driver answers them: the call succeeds and each entry says whether its field
// could be read, with its value's type.
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t* v) {
  DEVICE_OR_FAIL("nvmlDeviceGetFieldValues");
  if (count < 0 || (count > 0 && v == nullptr)) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < count; ++i) {
    v[i].timestamp = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    v[i].latencyUsec = 0;
    const unsigned field = v[i].fieldId;
    if (field == NVML_FI_DEV_MEMORY_TEMP && d->memory_temp >= 0) {
      v[i].nvmlReturn = NVML_SUCCESS;
      v[i].valueType = kNvmlValueUnsignedInt;
      v[i].value.uiVal = static_cast<unsigned>(d->memory_temp);
    } else if ((field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ||
                field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) &&
               !d->nvlinks.empty()) {
      // The scope is a link or all of them; the total is spread over the links, the rest on 0.
      const unsigned long long total =
          field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? d->nvlink_tx_kib : d->nvlink_rx_kib;
      const unsigned links = static_cast<unsigned>(d->nvlinks.size());
      const unsigned scope = v[i].scopeId;
      if (scope != kNvmlScopeAllLinks && scope >= links) {
        v[i].nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        continue;
      }
      v[i].nvmlReturn = NVML_SUCCESS;
      v[i].valueType = kNvmlValueUnsignedLongLong;
      v[i].value.ullVal = scope == kNvmlScopeAllLinks ? total
                          : scope == 0                ? total / links + total % links
                                                      : total / links;
    } else {
      v[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
  }
  return NVML_SUCCESS;
}

// GPM as the driver has it: a sample is a snapshot of one GPU's counters; a metric needs two of the
// same GPU, the second taken after the first.
struct nvmlGpmSample_st {
  Device* device = nullptr;
  long seq = 0;
};
std::atomic<long> gpm_seq{0};

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t* support) {
  DEVICE_OR_FAIL("nvmlGpmQueryDeviceSupport");
  if (support == nullptr || support->version != NVML_GPM_SUPPORT_VERSION)
    return NVML_ERROR_INVALID_ARGUMENT;
  support->isSupportedDevice = d->gpm ? 1 : 0;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t* sample) {
  Count("nvmlGpmSampleAlloc");
  if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *sample = new nvmlGpmSample_st();
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
  Count("nvmlGpmSampleFree");
  delete sample;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
  DEVICE_OR_FAIL("nvmlGpmSampleGet");
  if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (!d->gpm) return NVML_ERROR_NOT_SUPPORTED;
  sample->device = d;
  sample->seq = ++gpm_seq;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t* get) {
  Count("nvmlGpmMetricsGet");
  if (get == nullptr || get->version != NVML_GPM_METRICS_GET_VERSION || get->sample1 == nullptr ||
      get->sample2 == nullptr || get->numMetrics == 0 || get->numMetrics > kGpmMetricSlots)
    return NVML_ERROR_INVALID_ARGUMENT;
  if (get->sample1->device == nullptr || get->sample1->device != get->sample2->device ||
      get->sample2->seq <= get->sample1->seq)
    return NVML_ERROR_INVALID_ARGUMENT;
  for (unsigned i = 0; i < get->numMetrics; ++i) {
    nvmlGpmMetric_t& m = get->metrics[i];
    m.metricInfo = {nullptr, nullptr, nullptr};
    if (m.metricId == NVML_GPM_METRIC_ANY_TENSOR_UTIL) {
      m.nvmlReturn = NVML_SUCCESS;
      m.value = get->sample2->device->tensor_util;
    } else if (m.metricId == NVML_GPM_METRIC_DRAM_BW_UTIL) {
      m.nvmlReturn = NVML_SUCCESS;
      m.value = get->sample2->device->dram_util;
    } else {
      m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
      m.value = 0;
    }
  }
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  if (int e = Scripted("nvmlEventSetCreate")) return e;
  std::lock_guard lock(S().mu);
  S().sets.push_back(std::make_unique<EventSet>());
  *set = reinterpret_cast<nvmlEventSet_t>(S().sets.back().get());
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  Count("nvmlEventSetFree");
  std::lock_guard lock(S().mu);
  auto& sets = S().sets;
  for (auto it = sets.begin(); it != sets.end(); ++it) {
    if (reinterpret_cast<nvmlEventSet_t>(it->get()) == set) {
      sets.erase(it);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long* types) {
  DEVICE_OR_FAIL("nvmlDeviceGetSupportedEventTypes");
  *types = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError |
           nvmlEventTypeSingleBitEccError;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types,
                                             nvmlEventSet_t set) {
  DEVICE_OR_FAIL("nvmlDeviceRegisterEvents");
  std::lock_guard lock(S().mu);
  auto* es = reinterpret_cast<EventSet*>(set);
  for (size_t i = 0; i < S().devices.size(); ++i) {
    if (S().devices[i].get() == d) es->registered[static_cast<unsigned>(i)] |= types;
  }
  return NVML_SUCCESS;
}

static nvmlReturn_t WaitImpl(const char* name, nvmlEventSet_t set, nvmlEventData_t* data,
                             unsigned timeout_ms) {
  if (int e = Scripted(name)) return e;
  State& s = S();
  std::unique_lock lock(s.mu);
  auto* es = reinterpret_cast<EventSet*>(set);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    // Skip events this set did not register for.
    while (es->cursor < s.events.size()) {
      const Event& ev = s.events[es->cursor];
      auto it = es->registered.find(ev.device);
      if (it != es->registered.end() && (it->second & ev.type)) break;
      ++es->cursor;
    }
    if (s.init_refs == 0) return NVML_ERROR_UNINITIALIZED;
    auto now = Clock::now();
    if (es->cursor < s.events.size()) {
      const Event& ev = s.events[es->cursor];
      auto due = s.init_time + std::chrono::milliseconds(ev.at_ms);
      if (due <= now) {
        ++es->cursor;
        data->device = reinterpret_cast<nvmlDevice_t>(s.devices.at(ev.device).get());
        data->eventType = ev.type;
        data->eventData = ev.data;
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
        return NVML_SUCCESS;
      }
      if (due < deadline) {
        s.cv.wait_until(lock, due);
        continue;
      }
    }
    if (now >= deadline) return NVML_ERROR_TIMEOUT;
    s.cv.wait_until(lock, deadline);
  }
}
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned ms) {
  return WaitImpl("nvmlEventSetWait_v2", set, data, ms);
}
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t* data, unsigned ms) {
  return WaitImpl("nvmlEventSetWait", set, data, ms);
}
