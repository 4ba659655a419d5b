// libtessera-cuda.so: nVML as a job sees it: its GPUs' memory as its limit, the processes list
// filtered to its own, utilization; and the footprint measure (contexts and modules) from the
// driver's per-process figures.
#include "tessera/shim/hooks.h"

using namespace tessera::shim;  // NOLINT: the hooks are C entry points over the shared state

namespace tessera::shim {

// NVML, for nvmlDeviceGetMemoryInfo(_v2): the real library and the few calls needed to tell which
// CUDA device an NVML handle is.
struct RealNvml {
  void* handle = nullptr;
  nvmlReturn_t (*GetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*GetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;
  nvmlReturn_t (*GetCount)(unsigned*) = nullptr;
  nvmlReturn_t (*GetHandleByIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*GetUUID)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*GetProcesses)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*) = nullptr;  // _v3/_v2
  nvmlReturn_t (*GetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*GetMigDeviceHandleByIndex)(nvmlDevice_t, unsigned, nvmlDevice_t*) = nullptr;
};
RealNvml real_nvml;
pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

void InitNvml() {
  real_nvml.handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (real_nvml.handle == nullptr) return;
  DlsymFn sym = RealDlsym();
  auto get = [&](auto& f, const char* name) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(sym(real_nvml.handle, name));
  };
  get(real_nvml.GetMemoryInfo, "nvmlDeviceGetMemoryInfo");
  get(real_nvml.GetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2");
  get(real_nvml.GetCount, "nvmlDeviceGetCount_v2");
  if (real_nvml.GetCount == nullptr) get(real_nvml.GetCount, "nvmlDeviceGetCount");
  get(real_nvml.GetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2");
  if (real_nvml.GetHandleByIndex == nullptr)
    get(real_nvml.GetHandleByIndex, "nvmlDeviceGetHandleByIndex");
  get(real_nvml.GetUUID, "nvmlDeviceGetUUID");
  get(real_nvml.Init, "nvmlInit_v2");
  get(real_nvml.GetUtilizationRates, "nvmlDeviceGetUtilizationRates");
  get(real_nvml.GetMigDeviceHandleByIndex, "nvmlDeviceGetMigDeviceHandleByIndex");
  get(real_nvml.GetProcesses, "nvmlDeviceGetComputeRunningProcesses_v3");
  if (real_nvml.GetProcesses == nullptr)
    get(real_nvml.GetProcesses, "nvmlDeviceGetComputeRunningProcesses_v2");
}

// The CUDA ordinal of an NVML device as this process sees it: its position in CUDA_VISIBLE_DEVICES
// (entries are UUIDs, UUID prefixes or NVML indices), or its NVML index when that is unset; -1 when
// the device is not visible to CUDA here.
int CudaOrdinal(nvmlDevice_t dev) {
  if (real_nvml.GetCount == nullptr || real_nvml.GetHandleByIndex == nullptr) return -1;
  unsigned count = 0, index = 0;
  if (real_nvml.GetCount(&count) != NVML_SUCCESS) return -1;
  for (index = 0; index < count; ++index) {
    nvmlDevice_t h;
    if (real_nvml.GetHandleByIndex(index, &h) == NVML_SUCCESS && h == dev) break;
  }
  // Not one of the GPUs: a MIG device (its own handle, from nvmlDeviceGetMigDeviceHandleByIndex or
  // by its UUID), which only its UUID in CUDA_VISIBLE_DEVICES can name.
  const bool gpu = index < count;
  const char* visible = getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr || *visible == 0) return gpu ? static_cast<int>(index) : -1;
  char uuid[kNvmlUuidBufferSize] = "";
  if (real_nvml.GetUUID != nullptr) real_nvml.GetUUID(dev, uuid, sizeof uuid);
  int ordinal = 0;
  for (const char* p = visible; *p;) {
    const char* end = strchr(p, ',');
    size_t len = end ? static_cast<size_t>(end - p) : strlen(p);
    if (len > 0) {
      if (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0) {
        if (uuid[0] != 0 && strncmp(uuid, p, len) == 0) return ordinal;
      } else if (gpu && static_cast<unsigned>(atoi(p)) == index) {
        return ordinal;
      }
    }
    ++ordinal;
    p = end ? end + 1 : p + len;
  }
  return -1;
}

// Applies the job's limit to NVML's figures for `dev`.
void Limit(nvmlDevice_t dev, unsigned long long* total, unsigned long long* free_bytes,
           unsigned long long* used) {
  if (!Ready()) return;
  int ordinal = CudaOrdinal(dev);
  uint64_t limit = region->Limit(ordinal);
  if (ordinal < 0 || limit == 0 || limit >= *total) return;
  region->ReclaimDeadIfDue(kMemoryQueryReclaimUs);
  uint64_t in_use = region->Used(ordinal);
  *total = limit;
  *used = in_use < limit ? in_use : limit;
  *free_bytes = limit - *used;
}

// The processes NVML lists on CUDA device `device`, with what each holds; false when it cannot
// say (no NVML, the device not found, more than 256 processes).
struct Listing {
  nvmlProcessInfo_t infos[256];
  unsigned n = 0;
  // What `pid` holds (0: not listed); NVML_VALUE_NOT_AVAILABLE as is.
  uint64_t Of(unsigned pid) const {
    for (unsigned k = 0; k < n; ++k) {
      if (infos[k].pid == pid) return infos[k].usedGpuMemory;
    }
    return 0;
  }
  bool Has(unsigned pid) const {
    for (unsigned k = 0; k < n; ++k) {
      if (infos[k].pid == pid) return true;
    }
    return false;
  }
};

bool List(int device, Listing* out) {
  pthread_once(&nvml_once, InitNvml);
  static const bool nvml_ready = real_nvml.Init != nullptr && real_nvml.Init() == NVML_SUCCESS;
  if (!nvml_ready || real_nvml.GetProcesses == nullptr || real_nvml.GetCount == nullptr)
    return false;
  unsigned count = 0;
  if (real_nvml.GetCount(&count) != NVML_SUCCESS) return false;
  auto list = [&](nvmlDevice_t dev) {
    out->n = 256;
    return real_nvml.GetProcesses(dev, &out->n, out->infos) == NVML_SUCCESS;
  };
  for (unsigned index = 0; index < count; ++index) {
    nvmlDevice_t dev;
    if (real_nvml.GetHandleByIndex(index, &dev) != NVML_SUCCESS) continue;
    if (CudaOrdinal(dev) == device) return list(dev);
    // A MIG instance given to the job (CUDA_VISIBLE_DEVICES=MIG-...): its own process list, which
    // the driver keeps per instance (NVML_VALUE_NOT_AVAILABLE where it will not tell this user).
    for (unsigned mi = 0; real_nvml.GetMigDeviceHandleByIndex != nullptr && mi < 8; ++mi) {
      nvmlDevice_t mig;
      if (real_nvml.GetMigDeviceHandleByIndex(dev, mi, &mig) != NVML_SUCCESS) continue;
      if (CudaOrdinal(mig) == device) return list(mig);
    }
  }
  return false;
}

// This process's pid as the driver lists it. The NVIDIA driver does not translate pids: in a pid
// namespace (a container) it lists a process under its host pid, which the process cannot see. 0:
// not known yet (then its own pid is looked for). Forgotten in a forked child.
std::atomic<int> driver_pid{0};
std::atomic<int> probes_left{3};  // rounds of ProbeDriverPid a process may spend

// Finds this process in the driver's list by what only it does at that moment: a probe allocation
// that appears under one pid while it lives and leaves with its free, by its exact size (8 to 38
// MiB in steps of 2 MiB, drawn anew each round, so that two processes probing at once rarely
// match each other's; the driver's memory pages are 2 MiB). Needs a current context on `device`
// (made current by the call being measured). 0 when not found: no context here, the probe
// refused, or another process's memory moved by as much at the same moment, three rounds over.
// The probe is the driver's memory for those few calls, not the job's: not charged.
int ProbeDriverPid(int device) {
  CUdevice current = -1;
  if (real.cuCtxGetDevice == nullptr || real.cuCtxGetDevice(&current) != CUDA_SUCCESS ||
      current != device || real.cuMemAlloc_v2 == nullptr || real.cuMemFree_v2 == nullptr)
    return 0;
  static Listing before, during, after;  // 8 KiB each; under footprint_mu (Reconcile)
  unsigned seed = static_cast<unsigned>(getpid()) ^ static_cast<unsigned>(Arbiter::NowMicros());
  for (int round = 0; round < 3; ++round) {
    const uint64_t probe = (8ull + 2ull * (rand_r(&seed) % 16)) << 20;
    if (!List(device, &before)) return 0;
    CUdeviceptr p = 0;
    if (real.cuMemAlloc_v2(&p, probe) != CUDA_SUCCESS) return 0;
    const bool listed = List(device, &during);
    real.cuMemFree_v2(p);
    if (!listed || !List(device, &after)) return 0;
    auto grew_by_probe = [&](uint64_t from, uint64_t to) {
      return to >= from + probe && to < from + probe + (1ull << 20);
    };
    int found = 0, candidates = 0;
    for (unsigned k = 0; k < during.n; ++k) {
      const unsigned pid = during.infos[k].pid;
      const uint64_t with = during.infos[k].usedGpuMemory;
      if (with == ~0ull) return 0;  // not measurable here
      if (grew_by_probe(before.Of(pid), with) && grew_by_probe(after.Of(pid), with)) {
        found = static_cast<int>(pid);
        ++candidates;
      }
    }
    if (candidates == 1) return found;
  }
  return 0;
}

// The GPU memory the driver says this process holds on CUDA device `device` (NVML's process list:
// contexts, module code, allocations); false when it cannot say (no NVML, the device not found,
// this process not found in the list: under its own pid or, in a pid namespace, the host pid a
// probe found).
bool Footprint(int device, uint64_t* bytes) {
  static Listing listing;  // under footprint_mu (Reconcile)
  if (!List(device, &listing)) return false;
  int me = driver_pid.load();
  if (me == 0 && !listing.Has(static_cast<unsigned>(getpid())) && probes_left.load() > 0) {
    probes_left.fetch_sub(1);
    if (const int found = ProbeDriverPid(device); found > 0) {
      driver_pid.store(found);
      if (found != getpid()) region->SetDriverPid(found);  // the job's NVML lists show it
      if (found != getpid() && verbose) {
        fprintf(stderr, "tessera-cuda: the driver lists this process as pid %d\n", found);
      }
      if (!List(device, &listing)) return false;
    }
  }
  me = driver_pid.load();
  if (me == 0) me = getpid();
  if (!listing.Has(static_cast<unsigned>(me))) return false;
  // NVML_VALUE_NOT_AVAILABLE (all bits set) where the driver cannot say (some vGPU and MIG setups):
  // not measurable, never a huge charge.
  const uint64_t held = listing.Of(static_cast<unsigned>(me));
  if (held == ~0ull) return false;
  *bytes = held;
  return true;
}

std::mutex footprint_mu;
uint64_t invisible[kMaxDevices];  // charged for what allocations do not show; under footprint_mu

void ForgetFootprint() {
  new (&footprint_mu) std::mutex();  // fork() may have copied it locked
  for (uint64_t& v : invisible) v = 0;
  driver_pid.store(0);
  probes_left.store(3);
  ForgetFixedOverheads();
}

// Charges `device` what this process holds there beyond its counted allocations (contexts, module
// code), as the driver measures it; false when more is needed than the limit leaves (nothing
// charged then). True when it cannot be measured.
bool Reconcile(int device) {
  if (device < 0 || device >= kMaxDevices || !Ready()) return true;
  std::lock_guard lock(footprint_mu);
  uint64_t measured = 0;
  // Not listed: nothing held when it has no context there; otherwise not measurable here.
  if (Footprint(device, &measured)) {
    if (context_overhead > 0) DropFixedOverheads();  // measured: the fallback is not needed
  } else if (contexts_on[device].load() > 0) {
    return true;
  }
  const uint64_t mine = region->SlotUsed(device);
  const uint64_t counted = mine > invisible[device] ? mine - invisible[device] : 0;
  const uint64_t want = measured > counted ? measured - counted : 0;
  uint64_t& have = invisible[device];
  if (want > have) {
    if (!Reserve(device, want - have)) return false;
  } else if (want < have) {
    region->Release(device, have - want);
  }
  have = want;
  return true;
}

}  // namespace tessera::shim

TESSERA_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t* m) {
  pthread_once(&nvml_once, InitNvml);
  if (real_nvml.GetMemoryInfo == nullptr) return NVML_ERROR_UNINITIALIZED;
  nvmlReturn_t rc = real_nvml.GetMemoryInfo(dev, m);
  if (rc == NVML_SUCCESS && m != nullptr) Limit(dev, &m->total, &m->free, &m->used);
  return rc;
}

// GPU utilization inside a job with a compute share is the job's own: the part of the last second
// (tessera::shim::kUtilizationWindowUs) it held the GPU busy at the arbiter, not the GPU's as all
// its tenants keep it. A job without a slot on that GPU (nothing launched there yet) is at 0. The
// memory utilization (bandwidth) is the GPU's: the arbiter cannot tell whose it is.
TESSERA_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t* u) {
  pthread_once(&nvml_once, InitNvml);
  if (real_nvml.GetUtilizationRates == nullptr) return NVML_ERROR_UNINITIALIZED;
  nvmlReturn_t rc = real_nvml.GetUtilizationRates(dev, u);
  if (rc != NVML_SUCCESS || u == nullptr || !Ready() || arbiter == nullptr) return rc;
  const int ordinal = CudaOrdinal(dev);
  if (ordinal < 0 || ordinal >= kMaxDevices) return rc;
  const int permille = JobUtilizationPermille(arbiter->data(), physical_gpu[ordinal],
                                              arbiter->key(), Arbiter::NowMicros());
  u->gpu = permille < 0 ? 0u : static_cast<unsigned>((permille + 5) / 10);
  return rc;
}

TESSERA_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t* m) {
  pthread_once(&nvml_once, InitNvml);
  if (real_nvml.GetMemoryInfo_v2 == nullptr) return NVML_ERROR_UNINITIALIZED;
  nvmlReturn_t rc = real_nvml.GetMemoryInfo_v2(dev, m);
  if (rc == NVML_SUCCESS && m != nullptr) {
    unsigned long long used = m->used;
    Limit(dev, &m->total, &m->free, &used);
    if (used != m->used) m->used = used, m->reserved = 0;
  }
  return rc;
}

namespace tessera::shim {

// The processes NVML lists on a GPU, kept to the job's own (those holding a slot in its region):
// a tenant does not see its co-tenants' pids and memory. Fails closed: without a region, none.
template <typename Info>
nvmlReturn_t OwnProcesses(nvmlReturn_t rc, unsigned* count, Info* infos) {
  if (rc != NVML_SUCCESS || count == nullptr || infos == nullptr) return rc;
  pthread_once(&init_once, Init);
  unsigned kept = 0;
  for (unsigned i = 0; i < *count; ++i) {
    if (region != nullptr && region->HasProcess(static_cast<int>(infos[i].pid)))
      infos[kept++] = infos[i];
  }
  *count = kept;
  return rc;
}

template <typename Info>
using ProcessesFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned*, Info*);

}  // namespace tessera::shim

// nvmlDevice{Compute,Graphics}RunningProcesses, every version: the job's own processes only.
#define TESSERA_NVML_PROCESSES(name, Info)                                                    \
  TESSERA_EXPORT nvmlReturn_t name(nvmlDevice_t dev, unsigned* count, Info* infos) {          \
    static ProcessesFn<Info> real_fn = [] {                                                   \
      pthread_once(&nvml_once, InitNvml);                                                     \
      return real_nvml.handle == nullptr                                                      \
                 ? nullptr                                                                    \
                 : reinterpret_cast<ProcessesFn<Info>>(RealDlsym()(real_nvml.handle, #name)); \
    }();                                                                                      \
    if (real_fn == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;                             \
    return OwnProcesses(real_fn(dev, count, infos), count, infos);                            \
  }
TESSERA_NVML_PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
TESSERA_NVML_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
TESSERA_NVML_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
TESSERA_NVML_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
TESSERA_NVML_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t)
TESSERA_NVML_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
#undef TESSERA_NVML_PROCESSES
