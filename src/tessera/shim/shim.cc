// libtessera-cuda.so: the CUDA driver-API intercept library (see docs/sharing.md). Loaded by
// LD_PRELOAD; finds the real driver with dlopen("libcuda.so.1") and forwards every call, counting
// GPU memory against the job's limit in the shared region. Hooked functions stay hooked however
// they are reached: by linking, by dlsym (hooked here too) and by cuGetProcAddress(_v2), whose
// answers are mapped to our hooks by the name, version and flag asked, and otherwise by comparing
// them with the real entry points. Plain C ABI;
// nothing throws across it.
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/devices/nvml_abi.h"  // declarations only: the shim links nothing of Tessera
#include "tessera/shim/arbiter.h"
#include "tessera/shim/backlog.h"
#include "tessera/shim/cuda_abi.h"
#include "tessera/shim/glibc_compat.h"  // first: pins the symbol versions
#include "tessera/shim/region.h"

#define TESSERA_EXPORT extern "C" __attribute__((visibility("default")))

namespace tessera::shim {
namespace {

using DlsymFn = void* (*)(void*, const char*);

// How often memory queries (cuMemGetInfo, NVML's memory info) give back dead processes' memory.
constexpr uint64_t kMemoryQueryReclaimUs = 100'000;
DlsymFn real_dlsym = nullptr;

DlsymFn RealDlsym() {
  if (real_dlsym == nullptr) {
    // glibc 2.34 moved dlsym into libc with a new version; older ones have only GLIBC_2.2.5.
    void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (f == nullptr) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    real_dlsym = reinterpret_cast<DlsymFn>(f);
  }
  return real_dlsym;
}

// The real driver's entry points, by the names we hook.
#define TESSERA_HOOKED(X)         \
  X(cuMemAlloc_v2)                \
  X(cuMemAllocPitch_v2)           \
  X(cuMemAllocManaged)            \
  X(cuMemAllocAsync)              \
  X(cuMemAllocFromPoolAsync)      \
  X(cuMemFree_v2)                 \
  X(cuMemFreeAsync)               \
  X(cuMemCreate)                  \
  X(cuMemRelease)                 \
  X(cuArrayCreate_v2)             \
  X(cuArray3DCreate_v2)           \
  X(cuArrayDestroy)               \
  X(cuMipmappedArrayCreate)       \
  X(cuMipmappedArrayDestroy)      \
  X(cuMemGetInfo_v2)              \
  X(cuCtxCreate_v2)               \
  X(cuCtxCreate_v3)               \
  X(cuCtxCreate_v4)               \
  X(cuCtxDestroy_v2)              \
  X(cuDevicePrimaryCtxRetain)     \
  X(cuDevicePrimaryCtxRelease_v2) \
  X(cuDeviceTotalMem_v2)          \
  X(cuLaunchKernel)               \
  X(cuLaunchKernelEx)             \
  X(cuLaunchCooperativeKernel)    \
  X(cuGraphLaunch)                \
  X(cuGraphInstantiateWithFlags)  \
  X(cuDeviceGraphMemTrim)         \
  X(cuMemPoolCreate)              \
  X(cuMemPoolDestroy)             \
  X(cuMemPoolTrimTo)              \
  X(cuModuleLoadData)             \
  X(cuModuleLoadDataEx)           \
  X(cuModuleUnload)               \
  X(cuModuleLoad)                 \
  X(cuModuleLoadFatBinary)        \
  X(cuLibraryLoadData)            \
  X(cuLibraryLoadFromFile)        \
  X(cuLibraryUnload)              \
  X(cuStreamBeginCapture_v2)      \
  X(cuStreamEndCapture)           \
  X(cuCtxSynchronize)             \
  X(cuStreamSynchronize)          \
  X(cuEventSynchronize)           \
  X(cuGetProcAddress)             \
  X(cuGetProcAddress_v2)          \
  TESSERA_PER_THREAD(X)

// The per-thread default stream variants of the hooked calls that take a stream.
#define TESSERA_PER_THREAD(X)       \
  X(cuMemAllocAsync_ptsz)           \
  X(cuMemAllocFromPoolAsync_ptsz)   \
  X(cuMemFreeAsync_ptsz)            \
  X(cuLaunchKernel_ptsz)            \
  X(cuLaunchKernelEx_ptsz)          \
  X(cuLaunchCooperativeKernel_ptsz) \
  X(cuGraphLaunch_ptsz)             \
  X(cuStreamSynchronize_ptsz)       \
  X(cuStreamBeginCapture_v2_ptsz)   \
  X(cuStreamEndCapture_ptsz)

struct Real {
  void* handle = nullptr;
  cuCtxGetDevice_fn cuCtxGetDevice = nullptr;
  // Asked, not hooked: which pool cuMemAllocAsync takes from, and how much a pool holds.
  cuDeviceGetMemPool_fn cuDeviceGetMemPool = nullptr;
  cuMemPoolGetAttribute_fn cuMemPoolGetAttribute = nullptr;
  // Asked, not hooked: what a graph allocates, how much the graph memory pools hold.
  cuGraphGetNodes_fn cuGraphGetNodes = nullptr;
  cuGraphNodeGetType_fn cuGraphNodeGetType = nullptr;
  cuGraphMemAllocNodeGetParams_fn cuGraphMemAllocNodeGetParams = nullptr;
  cuGraphExecDestroy_fn cuGraphExecDestroy = nullptr;
  cuDeviceGetGraphMemAttribute_fn cuDeviceGetGraphMemAttribute = nullptr;
  // Called, not hooked: the completion marks of the queue bound (backlog.h).
  cuEventCreate_fn cuEventCreate = nullptr;
  cuEventRecord_fn cuEventRecord = nullptr;
  cuEventQuery_fn cuEventQuery = nullptr;
  cuEventElapsedTime_fn cuEventElapsedTime = nullptr;
#define TESSERA_FIELD(name) name##_fn name = nullptr;
  TESSERA_HOOKED(TESSERA_FIELD)
#undef TESSERA_FIELD
};
Real real;
Region* region = nullptr;
// Compute share and priority: the machine's GPU arbiter, when the job has one
// (TESSERA_CUDA_ARBITER).
Arbiter* arbiter = nullptr;
// How much GPU work this process may queue ahead while it shares a GPU (TESSERA_CUDA_QUEUE_US,
// default the time slice): a job that queues deep cannot run on others' slices.
Backlog backlog;
uint64_t queue_bound_us = 0;
int physical_gpu[kMaxDevices];  // CUDA ordinal here -> the arbiter's GPU index
// Context overhead (bytes per device this process holds a context on), counted once per device
// while any context of this process lives there.
uint64_t context_overhead = 0;
std::atomic<int> contexts_on[kMaxDevices];
// Without a configured overhead, the memory the job's allocations do not show (contexts, module
// code) is measured: the driver's own figure for this process (NVML's process list) less what is
// counted, charged per device after a context is made or a module loaded (Reconcile).
bool measure_footprint = false;
bool Reconcile(int device);
pthread_once_t init_once = PTHREAD_ONCE_INIT;
bool verbose = false;

enum Kind : int { kDevicePtr, kHandle, kArray, kMipmapped, kKinds };
struct Held {
  uint64_t bytes;
  int device;
  uint64_t pool = 0;  // taken from this memory pool (its handle); 0: none
};
// Allocations of this process by kind and address/handle. Leaked on purpose at exit: the host
// process's static destructors may still call into the driver.
std::mutex* held_mu = nullptr;
std::unordered_map<uint64_t, Held>* held = nullptr;
// This process's memory pools (see PoolAlloc).
struct PoolUse {
  int device = 0;
  uint64_t charged = 0;  // what the region holds for this pool
  uint64_t live = 0;     // what its allocations not yet freed take
  bool destroyed = false;
};
std::mutex* pool_mu = nullptr;
std::unordered_map<uint64_t, PoolUse>* pools = nullptr;  // by handle; under *pool_mu
std::atomic<bool> any_pool{false};
// Graph memory (CUDA graphs' memory nodes): what each device's graph memory pool is charged, and
// what each instantiated graph with memory nodes allocates per device. Under *pool_mu.
uint64_t graph_charged[kMaxDevices] = {};
std::unordered_map<uint64_t, std::vector<std::pair<int, uint64_t>>>* graph_execs = nullptr;
std::atomic<bool> any_graph_memory{false};

void Log(const char* fmt, const char* a, const char* b = "") {
  if (verbose) fprintf(stderr, fmt, a, b);
}

void InitBacklog();

void AfterForkChild() {
  if (region != nullptr) region->ReattachAfterFork();
  if (held != nullptr) {
    new (held_mu) std::mutex();
    for (int k = 0; k < kKinds; ++k) held[k].clear();
  }
  if (pools != nullptr) {
    new (pool_mu) std::mutex();
    pools->clear();
    any_pool = false;
  }
  // CUDA does not cross a fork: the child starts with nothing queued (and no events).
  new (&backlog) Backlog();
  if (arbiter != nullptr) InitBacklog();
}

// Set when a setting is malformed: the library then refuses every call it hooks (allocations,
// contexts, modules, launches), so the process runs no CUDA work rather than run it without the
// limit it was meant to have (fail closed).
bool refused = false;

void Refuse(const char* name, const char* value, const char* expected) {
  fprintf(stderr,
          "tessera-cuda: %s='%s' is not %s; CUDA is refused in this process (a malformed setting "
          "never lifts a limit)\n",
          name, value, expected);
  refused = true;
}

// TESSERA_CUDA_ARBITER and the settings that go with it; a malformed setting refuses CUDA.
void InitArbiter(const char* region_path) {
  const char* path = getenv("TESSERA_CUDA_ARBITER");
  if (path == nullptr || *path == 0) return;
  ArbiterConfig c;
  if (const char* v = getenv("TESSERA_CUDA_COMPUTE_SHARE");
      v && *v && !ParseShare(v, &c.share_permille)) {
    Refuse("TESSERA_CUDA_COMPUTE_SHARE", v, "a share (30%, 0.3)");
  }
  auto number = [](const char* name, long lo, long hi, auto* out) {
    const char* v = getenv(name);
    if (v == nullptr || *v == 0) return;
    char* end = nullptr;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end != 0 || x < lo || x > hi) {
      char expected[96];
      snprintf(expected, sizeof expected, "a whole number in [%ld, %ld]", lo, hi);
      Refuse(name, v, expected);
      return;
    }
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(x);
  };
  number("TESSERA_CUDA_PRIORITY", -1000000, 1000000, &c.priority);
  number("TESSERA_CUDA_TIMESLICE_US", 100, 10000000, &c.slice_us);
  number("TESSERA_CUDA_IDLE_US", 50, 10000000, &c.idle_us);
  queue_bound_us = c.slice_us;
  number("TESSERA_CUDA_QUEUE_US", 0, 10000000, &queue_bound_us);
  int conserving = 1, gang = 1;
  number("TESSERA_CUDA_WORK_CONSERVING", 0, 1, &conserving);
  number("TESSERA_CUDA_GANG", 0, 1, &gang);
  c.work_conserving = conserving != 0;
  for (int i = 0; i < kMaxDevices; ++i) physical_gpu[i] = i;
  if (const char* v = getenv("TESSERA_CUDA_ARBITER_GPUS"); v && *v) {
    int i = 0;
    bool ok = true;
    for (const char* p = v; *p && ok; ++i) {
      char* end = nullptr;
      long x = strtol(p, &end, 10);
      ok = end != p && x >= 0 && x < kArbiterGpus && i < kMaxDevices && (*end == ',' || *end == 0);
      if (ok) physical_gpu[i] = static_cast<int>(x), p = *end ? end + 1 : end;
    }
    if (!ok) {
      Refuse("TESSERA_CUDA_ARBITER_GPUS", v, "a list of GPU indices (3,5)");
      for (int k = 0; k < kMaxDevices; ++k) physical_gpu[k] = k;
    } else {
      // A job given several GPUs (its ranks on them): their slices are granted together, unless
      // TESSERA_CUDA_GANG=0.
      uint32_t mask = 0;
      for (int k = 0; k < i; ++k) mask |= 1u << physical_gpu[k];
      if (__builtin_popcount(mask) >= 2 && gang != 0) c.gang_mask = mask;
    }
  }
  const char* job = getenv("TESSERA_JOB_ID");
  uint64_t key = job && *job                   ? ArbiterJobKey(job)
                 : region_path && *region_path ? ArbiterJobKey(region_path)
                                               : static_cast<uint64_t>(getpid());
  char err[256] = "";
  arbiter = Arbiter::Attach(path, key, c, err, sizeof err);
  if (arbiter == nullptr) {
    fprintf(stderr, "tessera-cuda: %s; kernel launches are not paced\n", err);
  }
}

void InitBacklog() {
  BacklogOps ops;
  ops.event_create = real.cuEventCreate;
  ops.event_record = real.cuEventRecord;
  ops.event_query = real.cuEventQuery;
  ops.event_elapsed = real.cuEventElapsedTime;
  ops.now_us = [] {  // coarse (a few ms): when to time a launch, how long a wait may last
    timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1000000 + static_cast<uint64_t>(t.tv_nsec) / 1000;
  };
  ops.sleep_us = [](uint64_t us) {
    timespec t{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000 * 1000)};
    nanosleep(&t, nullptr);
  };
  backlog.Init(ops, queue_bound_us);
  if (queue_bound_us != 0 && !backlog.enabled()) {
    fprintf(stderr, "tessera-cuda: the driver lacks CUDA events; queued work is not bounded\n");
  }
}

void Init() {
  verbose = getenv("TESSERA_CUDA_LOG") != nullptr;
  const char* lib = getenv("TESSERA_CUDA_LIBRARY");
  real.handle = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (real.handle == nullptr) {
    fprintf(stderr, "tessera-cuda: cannot load the CUDA driver: %s\n", dlerror());
  } else {
    DlsymFn sym = RealDlsym();
    real.cuCtxGetDevice = reinterpret_cast<cuCtxGetDevice_fn>(sym(real.handle, "cuCtxGetDevice"));
    real.cuDeviceGetMemPool =
        reinterpret_cast<cuDeviceGetMemPool_fn>(sym(real.handle, "cuDeviceGetMemPool"));
    real.cuMemPoolGetAttribute =
        reinterpret_cast<cuMemPoolGetAttribute_fn>(sym(real.handle, "cuMemPoolGetAttribute"));
#define TESSERA_RESOLVE(name) real.name = reinterpret_cast<name##_fn>(sym(real.handle, #name));
    TESSERA_RESOLVE(cuGraphGetNodes)
    TESSERA_RESOLVE(cuGraphNodeGetType)
    TESSERA_RESOLVE(cuGraphMemAllocNodeGetParams)
    TESSERA_RESOLVE(cuGraphExecDestroy)
    TESSERA_RESOLVE(cuDeviceGetGraphMemAttribute)
    TESSERA_RESOLVE(cuEventCreate)
    TESSERA_RESOLVE(cuEventRecord)
    TESSERA_RESOLVE(cuEventQuery)
    // CUDA 12.8 made _v2 the one headers name (the same signature); the first stays for others.
    real.cuEventElapsedTime =
        reinterpret_cast<cuEventElapsedTime_fn>(sym(real.handle, "cuEventElapsedTime_v2"));
    if (real.cuEventElapsedTime == nullptr)
      real.cuEventElapsedTime =
          reinterpret_cast<cuEventElapsedTime_fn>(sym(real.handle, "cuEventElapsedTime"));
    TESSERA_HOOKED(TESSERA_RESOLVE)
#undef TESSERA_RESOLVE
  }
  uint64_t limits[kMaxDevices] = {};
  int count = 0;
  const char* limit_text = getenv("TESSERA_CUDA_MEM_LIMIT");
  if (limit_text && *limit_text && !ParseLimits(limit_text, limits, &count)) {
    Refuse("TESSERA_CUDA_MEM_LIMIT", limit_text, "a size (10GiB, 10G, 10GB, 0:10GiB,1:20GiB)");
  }
  char err[256] = "";
  const char* path = getenv("TESSERA_CUDA_REGION");
  if (path && *path) region = Region::Attach(path, limits, count, err, sizeof err);
  if (region == nullptr) {
    if (path && *path)
      fprintf(stderr, "tessera-cuda: %s; limits apply to this process alone\n", err);
    region = Region::Private(limits, count, err, sizeof err);
  }
  const char* overhead = getenv("TESSERA_CUDA_CONTEXT_OVERHEAD");
  measure_footprint = overhead == nullptr || *overhead == 0;
  if (overhead && *overhead) {
    uint64_t v[kMaxDevices];
    int n = 0;
    if (ParseLimits(overhead, v, &n) && n == kMaxDevices) {
      context_overhead = v[0];
    } else {
      Refuse("TESSERA_CUDA_CONTEXT_OVERHEAD", overhead, "a size (300MiB)");
    }
  }
  InitArbiter(path);
  if (arbiter != nullptr) InitBacklog();
  held_mu = new (std::nothrow) std::mutex();
  held = new (std::nothrow) std::unordered_map<uint64_t, Held>[kKinds];
  pool_mu = new (std::nothrow) std::mutex();
  pools = new (std::nothrow) std::unordered_map<uint64_t, PoolUse>();
  graph_execs =
      new (std::nothrow) std::unordered_map<uint64_t, std::vector<std::pair<int, uint64_t>>>();
  pthread_atfork(nullptr, nullptr, AfterForkChild);
  Log("tessera-cuda: loaded (%s%s)\n", path ? path : "private region");
}

inline bool Ready() {
  pthread_once(&init_once, Init);
  return !refused && real.handle != nullptr && region != nullptr && held != nullptr &&
         pools != nullptr && pool_mu != nullptr;
}

int CurrentDevice() {
  CUdevice d = 0;
  if (real.cuCtxGetDevice == nullptr || real.cuCtxGetDevice(&d) != CUDA_SUCCESS) return 0;
  return d;
}

bool Remember(Kind kind, uint64_t key, Held h) {
  try {
    std::lock_guard lock(*held_mu);
    held[kind][key] = h;
    return true;
  } catch (...) {
    return false;
  }
}

bool Forget(Kind kind, uint64_t key, Held* out) {
  std::lock_guard lock(*held_mu);
  auto it = held[kind].find(key);
  if (it == held[kind].end()) return false;
  *out = it->second;
  held[kind].erase(it);
  return true;
}

// Memory pools (cuMemAllocAsync, cuMemAllocFromPoolAsync: the stream-ordered allocator behind
// cudaMallocAsync). A pool keeps the memory its allocations free, for reuse, until the driver gives
// it back (at a synchronize, above the pool's release threshold) or it is trimmed or destroyed:
// that memory is the job's as much as what is allocated, so each pool is charged the larger of what
// its live allocations take and what the driver says it holds
// (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), read again after synchronizes, trims and frees. When an
// allocation would not fit, the idle memory of this process's pools on that device is trimmed
// first, as a caching allocator empties its cache before it reports out of memory.

// Charges the pool what it holds now: more when the driver reports more (if the limit allows),
// less once the driver gave memory back. Under *pool_mu.
void Refresh(uint64_t handle, PoolUse& u) {
  uint64_t target = u.live;
  cuuint64_t reserved = 0;
  if (!u.destroyed && real.cuMemPoolGetAttribute != nullptr &&
      real.cuMemPoolGetAttribute(reinterpret_cast<CUmemoryPool>(handle),
                                 CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == CUDA_SUCCESS &&
      reserved > target) {
    target = reserved;
  }
  if (target < u.charged) {
    region->Release(u.device, u.charged - target);
    u.charged = target;
  } else if (target > u.charged && region->Reserve(u.device, target - u.charged)) {
    u.charged = target;
  }
}

// Graph memory: a graph's memory nodes allocate when it runs, from the device's graph memory
// pool, which keeps the memory for the next launches until cuDeviceGraphMemTrim. Each device's
// pool is charged what the driver says it holds (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), read
// again after launches of graphs with memory nodes and after trims; a graph is refused at
// instantiation when what it allocates could never fit beside what the job holds, and a launch that
// would grow the pool past the limit is refused (out of memory) before it runs.

// Charges `device`'s graph memory pool what the driver says it holds, as far as the limit allows.
// Under *pool_mu.
void RefreshGraphLocked(int device) {
  cuuint64_t reserved = 0;
  if (device < 0 || device >= kMaxDevices || real.cuDeviceGetGraphMemAttribute == nullptr ||
      real.cuDeviceGetGraphMemAttribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                                        &reserved) != CUDA_SUCCESS) {
    return;
  }
  uint64_t& charged = graph_charged[device];
  if (reserved < charged) {
    region->Release(device, charged - reserved);
    charged = reserved;
  } else if (reserved > charged && region->Reserve(device, reserved - charged)) {
    charged = reserved;
  }
}

// What graph `g`'s memory nodes allocate, per device (CUDA ordinal); empty when none (or the driver
// cannot say).
std::vector<std::pair<int, uint64_t>> GraphAllocations(CUgraph g) {
  std::vector<std::pair<int, uint64_t>> out;
  if (real.cuGraphGetNodes == nullptr || real.cuGraphNodeGetType == nullptr ||
      real.cuGraphMemAllocNodeGetParams == nullptr) {
    return out;
  }
  try {
    size_t n = 0;
    if (real.cuGraphGetNodes(g, nullptr, &n) != CUDA_SUCCESS || n == 0) return out;
    std::vector<CUgraphNode> nodes(n);
    if (real.cuGraphGetNodes(g, nodes.data(), &n) != CUDA_SUCCESS) return out;
    uint64_t per_device[kMaxDevices] = {};
    for (size_t i = 0; i < n && i < nodes.size(); ++i) {
      CUgraphNodeType type = 0;
      CUDA_MEM_ALLOC_NODE_PARAMS p{};
      if (real.cuGraphNodeGetType(nodes[i], &type) != CUDA_SUCCESS ||
          type != CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
          real.cuGraphMemAllocNodeGetParams(nodes[i], &p) != CUDA_SUCCESS) {
        continue;
      }
      const int dev = p.poolProps.location.id;
      if (dev >= 0 && dev < kMaxDevices) per_device[dev] += p.bytesize;
    }
    for (int d = 0; d < kMaxDevices; ++d) {
      if (per_device[d] > 0) out.emplace_back(d, per_device[d]);
    }
  } catch (...) {
    out.clear();
  }
  return out;
}

// Gives the idle memory of this process's pools (and graph memory pools) on `device` back to the
// driver. Under *pool_mu.
void TrimIdleLocked(int device) {
  for (auto& [handle, u] : *pools) {
    if (u.device != device || u.destroyed || u.charged <= u.live) continue;
    if (real.cuMemPoolTrimTo != nullptr)
      real.cuMemPoolTrimTo(reinterpret_cast<CUmemoryPool>(handle), 0);
    Refresh(handle, u);
  }
  if (device >= 0 && device < kMaxDevices && graph_charged[device] > 0 &&
      real.cuDeviceGraphMemTrim != nullptr) {
    real.cuDeviceGraphMemTrim(device);
    RefreshGraphLocked(device);
  }
}

// Charges `device`'s graph memory pool up to `bytes` (what a graph allocates there), trimming the
// idle pool and graph memory of that device first when the limit does not allow it; false
// (nothing more charged) when it still does not. Under *pool_mu.
bool ChargeGraphLocked(int device, uint64_t bytes) {
  auto missing = [&] { return bytes > graph_charged[device] ? bytes - graph_charged[device] : 0; };
  if (missing() == 0) return true;
  if (!region->Reserve(device, missing())) {
    TrimIdleLocked(device);  // may lower the graph pool's charge: what is missing is asked again
    if (missing() > 0 && !region->Reserve(device, missing())) return false;
  }
  graph_charged[device] = std::max(graph_charged[device], bytes);
  return true;
}

// Region::Reserve, trying again after trimming the pools' idle memory on that device.
bool Reserve(int device, uint64_t bytes) {
  if (region->Reserve(device, bytes)) return true;
  if (!any_pool.load(std::memory_order_acquire) &&
      !any_graph_memory.load(std::memory_order_acquire)) {
    return false;
  }
  std::lock_guard lock(*pool_mu);
  TrimIdleLocked(device);
  return region->Reserve(device, bytes);
}

// Every pool's charge read again (after a synchronize, when the driver gives memory back).
void RefreshPools() {
  if (!any_pool.load(std::memory_order_acquire)) return;
  std::lock_guard lock(*pool_mu);
  for (auto& [handle, u] : *pools) Refresh(handle, u);
}

// An allocation of `bytes` from `pool` (its device `device` unless the pool was created with
// another) by `call`.
template <typename Call>
CUresult PoolAlloc(CUmemoryPool pool, int device, uint64_t bytes, CUdeviceptr* out, Call call) {
  const uint64_t handle = reinterpret_cast<uint64_t>(pool);
  uint64_t extra = 0;
  try {
    std::lock_guard lock(*pool_mu);
    auto [it, added] = pools->try_emplace(handle);
    PoolUse& u = it->second;
    if (added) {
      u.device = device;
      any_pool.store(true, std::memory_order_release);
    }
    device = u.device;
    auto missing = [&] { return u.live + bytes > u.charged ? u.live + bytes - u.charged : 0; };
    extra = missing();
    if (extra > 0 && !region->Reserve(device, extra)) {
      TrimIdleLocked(device);
      extra = missing();
      if (extra > 0 && !region->Reserve(device, extra)) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    u.charged += extra;
    u.live += bytes;
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult rc = call();
  if (rc == CUDA_SUCCESS && Remember(kDevicePtr, *out, Held{bytes, device, handle})) return rc;
  std::lock_guard lock(*pool_mu);
  PoolUse& u = (*pools)[handle];
  u.live -= bytes;
  u.charged -= extra;
  region->Release(device, extra);
  return rc == CUDA_SUCCESS ? CUDA_ERROR_OUT_OF_MEMORY : rc;
}

// A pool allocation freed: the memory stays the pool's (charged) until the driver says otherwise;
// `synchronous` (cuMemFree) frees may have let the driver give it back at once.
void PoolFreed(const Held& h, bool synchronous) {
  std::lock_guard lock(*pool_mu);
  auto it = pools->find(h.pool);
  if (it == pools->end()) return;
  PoolUse& u = it->second;
  u.live -= h.bytes < u.live ? h.bytes : u.live;
  if (u.destroyed && u.live == 0) {
    region->Release(u.device, u.charged);
    pools->erase(it);
  } else if (synchronous) {
    Refresh(h.pool, u);
  }
}

// Reserves, allocates with `call`, remembers; gives the reservation back when anything fails.
template <typename Call>
// `on`: the device (CUDA ordinal) the memory is on; -2: the current context's.
CUresult Counted(Kind kind, uint64_t bytes, Call call, uint64_t (*key_of)(void*), void* out,
                 int on = -2) {
  const int device = on == -2 ? CurrentDevice() : on;
  if (!Reserve(device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = call();
  if (rc != CUDA_SUCCESS) {
    region->Release(device, bytes);
    return rc;
  }
  if (!Remember(kind, key_of(out), Held{bytes, device})) {
    region->Release(device, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return rc;
}

// What the driver takes of device memory for an allocation of `bytes` (cuMemAlloc, managed,
// pitched): one larger than a 2 MiB page gets whole pages (measured on an H100 with driver 580:
// 252 allocations of 2 MiB + 1 took 1,008 MiB by NVML's per-process figure, 4 MiB each). Smaller
// ones may share pages and are counted as asked.
uint64_t DriverBytes(uint64_t bytes) {
  constexpr uint64_t kPage = uint64_t{2} << 20;
  return bytes > kPage ? (bytes + kPage - 1) / kPage * kPage : bytes;
}

uint64_t PtrKey(void* p) { return *static_cast<CUdeviceptr*>(p); }
uint64_t HandleKey(void* p) { return *static_cast<CUmemGenericAllocationHandle*>(p); }
uint64_t ObjectKey(void* p) { return reinterpret_cast<uint64_t>(*static_cast<void**>(p)); }

// `synchronous`: freed by cuMemFree (not stream-ordered).
CUresult Uncount(Kind kind, uint64_t key, bool synchronous = true) {
  Held h;
  if (!Forget(kind, key, &h)) return CUDA_SUCCESS;
  if (h.pool != 0) {
    PoolFreed(h, synchronous);
  } else {
    region->Release(h.device, h.bytes);
  }
  return CUDA_SUCCESS;
}

uint64_t FormatBytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    default:
      return 4;  // 32-bit formats; other formats are at most this per channel
  }
}

uint64_t ArrayBytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned channels) {
  return static_cast<uint64_t>(w) * (h ? h : 1) * (d ? d : 1) * FormatBytes(f) *
         (channels ? channels : 1);
}

}  // namespace
}  // namespace tessera::shim

using namespace tessera::shim;

TESSERA_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  if (!Ready() || real.cuMemAlloc_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return Counted(
      kDevicePtr, DriverBytes(bytes), [&] { return real.cuMemAlloc_v2(dptr, bytes); }, PtrKey,
      dptr);
}

TESSERA_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                                           size_t height, unsigned int element) {
  if (!Ready() || real.cuMemAllocPitch_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  // The pitch is known only afterwards: reserve the least it can be, then the padding.
  const int device = CurrentDevice();
  uint64_t least = DriverBytes(static_cast<uint64_t>(width) * height);
  if (!Reserve(device, least)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = real.cuMemAllocPitch_v2(dptr, pitch, width, height, element);
  if (rc != CUDA_SUCCESS) {
    region->Release(device, least);
    return rc;
  }
  uint64_t bytes = DriverBytes(static_cast<uint64_t>(*pitch) * height);
  if (bytes > least && !region->Reserve(device, bytes - least)) {
    real.cuMemFree_v2(*dptr);
    region->Release(device, least);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (!Remember(kDevicePtr, *dptr, Held{bytes > least ? bytes : least, device})) {
    real.cuMemFree_v2(*dptr);
    region->Release(device, bytes > least ? bytes : least);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return rc;
}

TESSERA_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  if (!Ready() || real.cuMemAllocManaged == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  // Managed memory may all migrate to the GPU: counted as device memory.
  return Counted(
      kDevicePtr, DriverBytes(bytes), [&] { return real.cuMemAllocManaged(dptr, bytes, flags); },
      PtrKey, dptr);
}

namespace {
// The hooks of calls that take a stream, given the driver's legacy or per-thread entry point.
// cuMemAllocAsync takes from the device's current pool (counted as a plain allocation when the
// driver cannot say which that is).
CUresult AllocAsync(cuMemAllocAsync_fn fn, CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const int device = CurrentDevice();
  CUmemoryPool pool = nullptr;
  if (dptr != nullptr && real.cuDeviceGetMemPool != nullptr &&
      real.cuDeviceGetMemPool(&pool, device) == CUDA_SUCCESS && pool != nullptr) {
    return PoolAlloc(pool, device, bytes, dptr, [&] { return fn(dptr, bytes, stream); });
  }
  return Counted(
      kDevicePtr, bytes, [&] { return fn(dptr, bytes, stream); }, PtrKey, dptr, device);
}
CUresult AllocFromPoolAsync(cuMemAllocFromPoolAsync_fn fn, CUdeviceptr* dptr, size_t bytes,
                            CUmemoryPool pool, CUstream stream) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (pool == nullptr || dptr == nullptr)
    return fn(dptr, bytes, pool, stream);  // the driver's error
  return PoolAlloc(pool, CurrentDevice(), bytes, dptr,
                   [&] { return fn(dptr, bytes, pool, stream); });
}
CUresult FreeAsync(cuMemFreeAsync_fn fn, CUdeviceptr dptr, CUstream stream) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = fn(dptr, stream);
  if (rc == CUDA_SUCCESS) Uncount(kDevicePtr, dptr, /*synchronous=*/false);
  return rc;
}
}  // namespace

TESSERA_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return Ready() ? AllocAsync(real.cuMemAllocAsync, dptr, bytes, stream)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return Ready() ? AllocAsync(real.cuMemAllocAsync_ptsz, dptr, bytes, stream)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                                CUstream stream) {
  return Ready() ? AllocFromPoolAsync(real.cuMemAllocFromPoolAsync, dptr, bytes, pool, stream)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes,
                                                     CUmemoryPool pool, CUstream stream) {
  return Ready() ? AllocFromPoolAsync(real.cuMemAllocFromPoolAsync_ptsz, dptr, bytes, pool, stream)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  if (!Ready() || real.cuMemFree_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemFree_v2(dptr);
  if (rc == CUDA_SUCCESS) Uncount(kDevicePtr, dptr);
  return rc;
}

TESSERA_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return Ready() ? FreeAsync(real.cuMemFreeAsync, dptr, stream) : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return Ready() ? FreeAsync(real.cuMemFreeAsync_ptsz, dptr, stream) : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                                    const CUmemAllocationProp* prop, unsigned long long flags) {
  if (!Ready() || real.cuMemCreate == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  // On the device `prop` names, not the current one; memory on the host is not GPU memory.
  if (prop != nullptr && prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real.cuMemCreate(handle, bytes, prop, flags);
  return Counted(
      kHandle, bytes, [&] { return real.cuMemCreate(handle, bytes, prop, flags); }, HandleKey,
      handle, prop != nullptr ? prop->location.id : -2);
}

TESSERA_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (!Ready() || real.cuMemRelease == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemRelease(handle);
  if (rc == CUDA_SUCCESS) Uncount(kHandle, handle);
  return rc;
}

TESSERA_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  if (!Ready() || real.cuMemPoolCreate == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemPoolCreate(pool, props);
  // Its memory is on the device its properties name, whichever is current when it is used.
  if (rc == CUDA_SUCCESS && pool != nullptr && props != nullptr &&
      props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    try {
      std::lock_guard lock(*pool_mu);
      (*pools)[reinterpret_cast<uint64_t>(*pool)] = PoolUse{.device = props->location.id};
      any_pool.store(true, std::memory_order_release);
    } catch (...) {
    }
  }
  return rc;
}

TESSERA_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  if (!Ready() || real.cuMemPoolTrimTo == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemPoolTrimTo(pool, keep);
  std::lock_guard lock(*pool_mu);
  auto it = pools->find(reinterpret_cast<uint64_t>(pool));
  if (rc == CUDA_SUCCESS && it != pools->end()) Refresh(it->first, it->second);
  return rc;
}

TESSERA_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                                    unsigned long long flags) {
  if (!Ready() || real.cuGraphInstantiateWithFlags == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuGraphInstantiateWithFlags(exec, graph, flags);
  if (rc != CUDA_SUCCESS || exec == nullptr || graph_execs == nullptr) return rc;
  std::vector<std::pair<int, uint64_t>> allocs = GraphAllocations(graph);
  if (allocs.empty()) return rc;
  std::lock_guard lock(*pool_mu);
  // What it allocates must be able to fit beside what the job holds (its graph memory pool may
  // grow to it): otherwise it could never run. The pool goes back to what the driver says it holds
  // after the check.
  for (const auto& [dev, bytes] : allocs) {
    const bool fits = ChargeGraphLocked(dev, bytes);
    RefreshGraphLocked(dev);
    if (fits) continue;
    if (real.cuGraphExecDestroy != nullptr) real.cuGraphExecDestroy(*exec);
    *exec = nullptr;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  try {
    (*graph_execs)[reinterpret_cast<uint64_t>(*exec)] = std::move(allocs);
  } catch (...) {
    if (real.cuGraphExecDestroy != nullptr) real.cuGraphExecDestroy(*exec);
    *exec = nullptr;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  any_graph_memory.store(true, std::memory_order_release);
  return rc;
}

TESSERA_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
  if (!Ready() || real.cuDeviceGraphMemTrim == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuDeviceGraphMemTrim(device);
  if (rc == CUDA_SUCCESS) {
    std::lock_guard lock(*pool_mu);
    RefreshGraphLocked(device);
  }
  return rc;
}

TESSERA_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  if (!Ready() || real.cuMemPoolDestroy == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemPoolDestroy(pool);
  if (rc != CUDA_SUCCESS) return rc;
  // Its idle memory goes now; what its live allocations take, when they are freed.
  std::lock_guard lock(*pool_mu);
  auto it = pools->find(reinterpret_cast<uint64_t>(pool));
  if (it == pools->end()) return rc;
  PoolUse& u = it->second;
  u.destroyed = true;
  region->Release(u.device, u.charged - u.live);
  u.charged = u.live;
  if (u.live == 0) pools->erase(it);
  return rc;
}

TESSERA_EXPORT CUresult cuArrayCreate_v2(CUarray* array, const CUDA_ARRAY_DESCRIPTOR* desc) {
  if (!Ready() || real.cuArrayCreate_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (desc == nullptr) return real.cuArrayCreate_v2(array, desc);
  uint64_t bytes = ArrayBytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
  return Counted(
      kArray, bytes, [&] { return real.cuArrayCreate_v2(array, desc); }, ObjectKey, array);
}

TESSERA_EXPORT CUresult cuArray3DCreate_v2(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  if (!Ready() || real.cuArray3DCreate_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (desc == nullptr) return real.cuArray3DCreate_v2(array, desc);
  uint64_t bytes =
      ArrayBytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
  return Counted(
      kArray, bytes, [&] { return real.cuArray3DCreate_v2(array, desc); }, ObjectKey, array);
}

TESSERA_EXPORT CUresult cuArrayDestroy(CUarray array) {
  if (!Ready() || real.cuArrayDestroy == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuArrayDestroy(array);
  if (rc == CUDA_SUCCESS) Uncount(kArray, reinterpret_cast<uint64_t>(array));
  return rc;
}

TESSERA_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* array,
                                               const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                               unsigned int levels) {
  if (!Ready() || real.cuMipmappedArrayCreate == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (desc == nullptr) return real.cuMipmappedArrayCreate(array, desc, levels);
  uint64_t bytes = 0;
  size_t w = desc->Width, h = desc->Height, d = desc->Depth;
  for (unsigned l = 0; l < (levels ? levels : 1); ++l) {
    bytes += ArrayBytes(w, h, d, desc->Format, desc->NumChannels);
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : h;
    d = d > 1 ? d / 2 : d;
  }
  return Counted(
      kMipmapped, bytes, [&] { return real.cuMipmappedArrayCreate(array, desc, levels); },
      ObjectKey, array);
}

TESSERA_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
  if (!Ready() || real.cuMipmappedArrayDestroy == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMipmappedArrayDestroy(array);
  if (rc == CUDA_SUCCESS) Uncount(kMipmapped, reinterpret_cast<uint64_t>(array));
  return rc;
}

TESSERA_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  if (!Ready() || real.cuMemGetInfo_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemGetInfo_v2(free_bytes, total_bytes);
  if (rc != CUDA_SUCCESS) return rc;
  const int device = CurrentDevice();
  uint64_t limit = region->Limit(device);
  if (limit == 0) return rc;
  // What dead processes held is given back at most every kMemoryQueryReclaimUs here (frameworks ask
  // often; a full reclaim reads every attached process); a reservation that would fail reclaims.
  region->ReclaimDeadIfDue(kMemoryQueryReclaimUs);
  uint64_t used = region->Used(device);
  uint64_t left = used >= limit ? 0 : limit - used;  // clamped: never "negative" free memory
  if (free_bytes != nullptr && left < *free_bytes) *free_bytes = left;
  if (total_bytes != nullptr && limit < *total_bytes) *total_bytes = limit;
  return rc;
}

TESSERA_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  if (!Ready() || real.cuDeviceTotalMem_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuDeviceTotalMem_v2(bytes, device);
  uint64_t limit = region->Limit(device);
  if (rc == CUDA_SUCCESS && bytes != nullptr && limit != 0 && limit < *bytes) *bytes = limit;
  return rc;
}

namespace tessera::shim {
namespace {

// The first context of this process on `device` takes the overhead from the job's limit.
bool TakeContext(int device) {
  if (device < 0 || device >= kMaxDevices) return true;
  if (contexts_on[device].fetch_add(1) == 0 && context_overhead > 0 &&
      !Reserve(device, context_overhead)) {
    contexts_on[device].fetch_sub(1);
    return false;
  }
  return true;
}

void DropContext(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  int before = contexts_on[device].load();
  while (before > 0 && !contexts_on[device].compare_exchange_weak(before, before - 1)) {
  }
  if (before == 1 && context_overhead > 0) region->Release(device, context_overhead);
}

std::mutex context_mu;
std::unordered_map<CUcontext, int>* context_device = nullptr;  // created contexts -> device

}  // namespace
}  // namespace tessera::shim

namespace {
// A context created on `device` by `create` (whichever cuCtxCreate version): its overhead counted
// while it lives.
template <typename Create>
CUresult CountedContext(CUcontext* ctx, CUdevice device, Create create) {
  if (!TakeContext(device)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = create();
  if (rc != CUDA_SUCCESS) {
    DropContext(device);
    return rc;
  }
  if (measure_footprint && !Reconcile(device)) {  // its memory does not fit the job's limit
    real.cuCtxDestroy_v2(*ctx);
    DropContext(device);
    Reconcile(device);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  try {
    std::lock_guard lock(context_mu);
    if (context_device == nullptr) context_device = new std::unordered_map<CUcontext, int>();
    (*context_device)[*ctx] = device;
  } catch (...) {
  }
  return rc;
}
}  // namespace

TESSERA_EXPORT CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned int flags, CUdevice device) {
  if (!Ready() || real.cuCtxCreate_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedContext(ctx, device, [&] { return real.cuCtxCreate_v2(ctx, flags, device); });
}

TESSERA_EXPORT CUresult cuCtxCreate_v3(CUcontext* ctx, CUexecAffinityParam* params, int n,
                                       unsigned int flags, CUdevice device) {
  if (!Ready() || real.cuCtxCreate_v3 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedContext(ctx, device,
                        [&] { return real.cuCtxCreate_v3(ctx, params, n, flags, device); });
}

TESSERA_EXPORT CUresult cuCtxCreate_v4(CUcontext* ctx, CUctxCreateParams* params,
                                       unsigned int flags, CUdevice device) {
  if (!Ready() || real.cuCtxCreate_v4 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedContext(ctx, device,
                        [&] { return real.cuCtxCreate_v4(ctx, params, flags, device); });
}

TESSERA_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (!Ready() || real.cuCtxDestroy_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuCtxDestroy_v2(ctx);
  if (rc == CUDA_SUCCESS) {
    int device = -1;
    {
      std::lock_guard lock(context_mu);
      if (context_device != nullptr) {
        auto it = context_device->find(ctx);
        if (it != context_device->end()) {
          device = it->second;
          context_device->erase(it);
        }
      }
    }
    DropContext(device);
    if (measure_footprint && device >= 0) Reconcile(device);
  }
  return rc;
}

TESSERA_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  if (!Ready() || real.cuDevicePrimaryCtxRetain == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!TakeContext(device)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = real.cuDevicePrimaryCtxRetain(ctx, device);
  if (rc != CUDA_SUCCESS) {
    DropContext(device);
  } else if (measure_footprint && !Reconcile(device)) {
    real.cuDevicePrimaryCtxRelease_v2(device);
    DropContext(device);
    Reconcile(device);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return rc;
}

TESSERA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  if (!Ready() || real.cuDevicePrimaryCtxRelease_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuDevicePrimaryCtxRelease_v2(device);
  if (rc == CUDA_SUCCESS) {
    DropContext(device);
    if (measure_footprint) Reconcile(device);
  }
  return rc;
}

namespace {
// A module's code and data live in device memory: measured like a context's (Reconcile); one that
// does not fit the job's limit is unloaded again and refused.
CUresult CountedModule(CUresult rc, CUmodule* module) {
  if (rc != CUDA_SUCCESS || !measure_footprint || module == nullptr) return rc;
  const int device = CurrentDevice();
  if (Reconcile(device)) return rc;
  real.cuModuleUnload(*module);
  Reconcile(device);
  return CUDA_ERROR_OUT_OF_MEMORY;
}
}  // namespace

TESSERA_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (!Ready() || real.cuModuleLoadData == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedModule(real.cuModuleLoadData(module, image), module);
}

TESSERA_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int n,
                                           CUjit_option* options, void** values) {
  if (!Ready() || real.cuModuleLoadDataEx == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedModule(real.cuModuleLoadDataEx(module, image, n, options, values), module);
}

TESSERA_EXPORT CUresult cuModuleUnload(CUmodule module) {
  if (!Ready() || real.cuModuleUnload == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuModuleUnload(module);
  if (rc == CUDA_SUCCESS && measure_footprint) Reconcile(CurrentDevice());
  return rc;
}

TESSERA_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* path) {
  if (!Ready() || real.cuModuleLoad == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedModule(real.cuModuleLoad(module, path), module);
}

TESSERA_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* image) {
  if (!Ready() || real.cuModuleLoadFatBinary == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedModule(real.cuModuleLoadFatBinary(module, image), module);
}

namespace {
// Reconcile on every device where this process has a context; false when one did not fit (the
// devices after it are not measured).
bool ReconcileContextDevices() {
  for (int d = 0; d < kMaxDevices; ++d) {
    if (contexts_on[d].load() > 0 && !Reconcile(d)) return false;
  }
  return true;
}

// A library is loaded into every context the process has (eagerly; lazily, a kernel's code when
// it is first launched there: measured at the next event): measured on each device with one of
// this process's contexts; one that does not fit is unloaded again and refused.
CUresult CountedLibrary(CUresult rc, CUlibrary* library) {
  if (rc != CUDA_SUCCESS || !measure_footprint || library == nullptr) return rc;
  if (ReconcileContextDevices()) return rc;
  real.cuLibraryUnload(*library);
  ReconcileContextDevices();
  return CUDA_ERROR_OUT_OF_MEMORY;
}
}  // namespace

TESSERA_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code,
                                          CUjit_option* jit_options, void** jit_values,
                                          unsigned int jit_count, CUlibraryOption* options,
                                          void** values, unsigned int count) {
  if (!Ready() || real.cuLibraryLoadData == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedLibrary(real.cuLibraryLoadData(library, code, jit_options, jit_values, jit_count,
                                               options, values, count),
                        library);
}

TESSERA_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* path,
                                              CUjit_option* jit_options, void** jit_values,
                                              unsigned int jit_count, CUlibraryOption* options,
                                              void** values, unsigned int count) {
  if (!Ready() || real.cuLibraryLoadFromFile == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CountedLibrary(real.cuLibraryLoadFromFile(library, path, jit_options, jit_values,
                                                   jit_count, options, values, count),
                        library);
}

TESSERA_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  if (!Ready() || real.cuLibraryUnload == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuLibraryUnload(library);
  if (rc == CUDA_SUCCESS && measure_footprint) ReconcileContextDevices();
  return rc;
}

namespace tessera::shim {
namespace {

int ArbiterGpu() {
  int d = CurrentDevice();
  return d >= 0 && d < kMaxDevices ? physical_gpu[d] : -1;
}

// Stream captures under way in this process (CUDA graphs being recorded). Launches on a capturing
// stream are recorded, not run (the graph's replay is what is paced): they pass unpaced; launches
// on other streams are paced as ever. The library's own synchronize (its drain) must not meet a
// capture that forbids it: one in the global mode (PyTorch's default) anywhere in the process, or
// one in the thread-local mode in the same thread; relaxed captures forbid nothing.
constexpr int kCaptureStreams = 16;
std::atomic<int> captures{0};              // all modes: any stream capturing at all
std::atomic<int> untracked_captures{0};    // beyond kCaptureStreams: then every launch passes
std::atomic<int> untracked_forbidding{0};  // of those, in the global mode
std::atomic<CUstream> capturing[kCaptureStreams];
std::atomic<int> forbidding_captures{0};  // global mode
thread_local int thread_captures = 0;     // thread-local mode, begun by this thread
// A drain holds it shared; a capture begins holding it exclusively, so that no drain's
// synchronize is under way when the capture starts (it invalidated 1 in 14,000 captures in a
// tight loop before).
std::shared_mutex capture_mu;

// The driver's cuCtxSynchronize: once it returns, what this process queued on the current
// device before it has run (the queue bound counts it done).
CUresult SynchronizeContext() {
  if (real.cuCtxSynchronize == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const int dev = CurrentDevice();
  const uint64_t upto = backlog.launched(dev);
  const CUresult rc = real.cuCtxSynchronize();
  if (rc == CUDA_SUCCESS) backlog.Drained(dev, upto);
  return rc;
}

void Drain() {
  if (real.cuCtxSynchronize == nullptr || thread_captures > 0) return;
  std::shared_lock lock(capture_mu);
  if (forbidding_captures.load(std::memory_order_acquire) == 0) SynchronizeContext();
}

bool Recorded(CUstream stream) {
  if (captures.load(std::memory_order_relaxed) == 0) return false;  // the fast path
  if (untracked_captures.load(std::memory_order_relaxed) > 0) return true;
  if (stream == nullptr) return false;  // the legacy default stream is never captured
  for (const auto& s : capturing) {
    if (s.load(std::memory_order_relaxed) == stream) return true;
  }
  return false;
}

// A thread waiting for its own GPU work keeps its job from looking idle to the arbiter.
struct SyncScope {
  int gpu;
  explicit SyncScope(int g = arbiter ? ArbiterGpu() : -1) : gpu(g) {
    if (gpu >= 0) arbiter->EnterSync(gpu);
  }
  ~SyncScope() {
    if (gpu >= 0) arbiter->LeaveSync(gpu);
  }
};

// Every launch: counted, then (with an arbiter) held while this process has more than the bound
// queued on the device (waiting for its own work, as in a synchronize), and until this job holds
// the GPU - unless it is recorded into a graph. Returns the device whose queue the launch joins
// (Launched after it), or -1 when the queue is not tracked: no arbiter, a capturing stream, or a
// capture under way that forbids what the marks do. `token` is what Launched needs.
inline int Pace(CUstream stream, Backlog::Token* token) {
  region->CountLaunch();
  if (arbiter == nullptr || Recorded(stream)) return -1;
  const int dev = CurrentDevice();
  const int gpu = dev >= 0 && dev < kMaxDevices ? physical_gpu[dev] : -1;
  const bool tracked =
      backlog.enabled() &&
      (captures.load(std::memory_order_relaxed) == 0 ||
       (thread_captures == 0 && forbidding_captures.load(std::memory_order_relaxed) == 0));
  if (tracked && backlog.Over(dev)) {
    // Like the drain: no capture that forbids it begins while it looks at its marks.
    std::shared_lock lock(capture_mu);
    if (forbidding_captures.load(std::memory_order_acquire) == 0) {
      SyncScope scope(gpu);
      backlog.Wait(dev);
    }
  }
  arbiter->BeforeLaunch(gpu, Drain);
  if (!tracked) return -1;
  *token = backlog.Before(dev, stream, captures.load(std::memory_order_relaxed) == 0);
  return dev;
}

}  // namespace
}  // namespace tessera::shim

namespace tessera::shim {
namespace {

// The bodies of the hooks that exist in a legacy and a per-thread default stream version, given
// the driver's entry point of that version. Called once Ready().
// The stream a launch of a per-thread default stream entry point (_ptsz) runs on: a null stream
// there is the thread's own default stream (CU_STREAM_PER_THREAD), not the legacy one.
CUstream PerThread(CUstream stream) {
  return stream != nullptr ? stream : reinterpret_cast<CUstream>(uintptr_t{2});
}

// The stream argument says where the launch runs (its capture, its completion marks).
template <typename Fn, typename... Args>
CUresult Paced(CUstream stream, Fn fn, Args... args) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  Backlog::Token token;
  const int dev = Pace(stream, &token);
  const CUresult rc = fn(args...);
  if (dev >= 0) backlog.Launched(token, dev, stream, rc == CUDA_SUCCESS);
  return rc;
}

template <typename Fn, typename... Args>
CUresult Synced(Fn fn, Args... args) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc;
  {
    SyncScope scope;
    rc = fn(args...);
  }
  if (rc == CUDA_SUCCESS) RefreshPools();  // pools give memory back at synchronizes
  return rc;
}

void Decrement(std::atomic<int>& n) {
  int v = n.load();
  while (v > 0 && !n.compare_exchange_weak(v, v - 1)) {
  }
}

// Which captures forbid a synchronize (cuda.h's CUstreamCaptureMode: 0 global, 1 thread-local, 2
// relaxed), per stream, so that EndCapture knows what it ends.
struct CaptureMode {
  std::atomic<CUstream> stream{nullptr};
  std::atomic<int> mode{0};
};
CaptureMode capture_modes[kCaptureStreams];

CUresult BeginCapture(cuStreamBeginCapture_v2_fn fn, CUstream stream, CUstreamCaptureMode mode) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  std::unique_lock lock(capture_mu);  // no drain's synchronize under way as it begins
  CUresult rc = fn(stream, mode);
  if (rc != CUDA_SUCCESS) return rc;
  if (mode == 0) forbidding_captures.fetch_add(1, std::memory_order_acq_rel);
  if (mode == 1) ++thread_captures;
  bool tracked = false;
  for (int i = 0; i < kCaptureStreams && !tracked; ++i) {
    CUstream free = nullptr;
    if (capturing[i].compare_exchange_strong(free, stream)) {
      capture_modes[i].mode.store(static_cast<int>(mode));
      capture_modes[i].stream.store(stream);
      tracked = true;
    }
  }
  if (!tracked) {
    untracked_captures.fetch_add(1);
    if (mode == 0) untracked_forbidding.fetch_add(1);
  }
  captures.fetch_add(1, std::memory_order_acq_rel);
  return rc;
}

CUresult EndCapture(cuStreamEndCapture_fn fn, CUstream stream, CUgraph* graph) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = fn(stream, graph);
  // Ended (made a graph, or invalidated and over) unless the stream was not capturing or another
  // thread must end it.
  if (rc == CUDA_ERROR_ILLEGAL_STATE || rc == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) return rc;
  bool found = false;
  for (int i = 0; i < kCaptureStreams && !found; ++i) {
    if (capture_modes[i].stream.load() != stream) continue;
    const int mode = capture_modes[i].mode.load();
    capture_modes[i].stream.store(nullptr);
    CUstream s = stream;
    if (capturing[i].compare_exchange_strong(s, nullptr)) {
      found = true;
      if (mode == 0) Decrement(forbidding_captures);
      if (mode == 1 && thread_captures > 0) --thread_captures;
    }
  }
  if (!found) {  // one of the untracked ones (which, is not known: a global one first)
    Decrement(untracked_captures);
    if (untracked_forbidding.load() > 0) {
      Decrement(untracked_forbidding);
      Decrement(forbidding_captures);
    }
  }
  Decrement(captures);
  return rc;
}

}  // namespace
}  // namespace tessera::shim

TESSERA_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                       unsigned int gz, unsigned int bx, unsigned int by,
                                       unsigned int bz, unsigned int shared, CUstream stream,
                                       void** params, void** extra) {
  return Ready() ? Paced(stream, real.cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shared, stream,
                         params, extra)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                            unsigned int gz, unsigned int bx, unsigned int by,
                                            unsigned int bz, unsigned int shared, CUstream stream,
                                            void** params, void** extra) {
  return Ready() ? Paced(PerThread(stream), real.cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz,
                         shared, stream, params, extra)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                         void** extra) {
  return Ready() ? Paced(config ? config->hStream : nullptr, real.cuLaunchKernelEx, config, f,
                         params, extra)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                              void** params, void** extra) {
  return Ready() ? Paced(PerThread(config ? config->hStream : nullptr), real.cuLaunchKernelEx_ptsz,
                         config, f, params, extra)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                                  unsigned int gz, unsigned int bx, unsigned int by,
                                                  unsigned int bz, unsigned int shared,
                                                  CUstream stream, void** params) {
  return Ready() ? Paced(stream, real.cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shared,
                         stream, params)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx,
                                                       unsigned int gy, unsigned int gz,
                                                       unsigned int bx, unsigned int by,
                                                       unsigned int bz, unsigned int shared,
                                                       CUstream stream, void** params) {
  return Ready() ? Paced(PerThread(stream), real.cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx,
                         by, bz, shared, stream, params)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

// A graph launch, paced; a graph with memory nodes first has its devices' graph memory pools
// charged for what it allocates (refused, out of memory, when the limit does not allow it), and
// after the launch what the driver says they hold.
template <typename Fn>
CUresult GraphLaunch(Fn fn, CUgraphExec exec, CUstream stream, CUstream paced_as = nullptr) {
  if (!Ready()) return CUDA_ERROR_NOT_INITIALIZED;
  std::vector<std::pair<int, uint64_t>> allocs;
  if (any_graph_memory.load(std::memory_order_acquire)) {
    std::lock_guard lock(*pool_mu);
    auto it = graph_execs->find(reinterpret_cast<uint64_t>(exec));
    if (it != graph_execs->end()) {
      allocs = it->second;
      for (const auto& [dev, bytes] : allocs) {
        if (!ChargeGraphLocked(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
  }
  CUresult rc = Paced(paced_as ? paced_as : stream, fn, exec, stream);
  if (!allocs.empty()) {
    std::lock_guard lock(*pool_mu);
    for (const auto& [dev, bytes] : allocs) RefreshGraphLocked(dev);
  }
  return rc;
}

TESSERA_EXPORT CUresult cuGraphLaunch(CUgraphExec graph, CUstream stream) {
  return GraphLaunch(real.cuGraphLaunch, graph, stream);
}
TESSERA_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec graph, CUstream stream) {
  return GraphLaunch(real.cuGraphLaunch_ptsz, graph, stream, PerThread(stream));
}

TESSERA_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  return Ready() ? BeginCapture(real.cuStreamBeginCapture_v2, stream, mode)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  return Ready() ? BeginCapture(real.cuStreamBeginCapture_v2_ptsz, stream, mode)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return Ready() ? EndCapture(real.cuStreamEndCapture, stream, graph) : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return Ready() ? EndCapture(real.cuStreamEndCapture_ptsz, stream, graph)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuCtxSynchronize() {
  return Ready() ? Synced(SynchronizeContext) : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  return Ready() ? Synced(real.cuStreamSynchronize, stream) : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  return Ready() ? Synced(real.cuStreamSynchronize_ptsz, stream) : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuEventSynchronize(CUevent event) {
  return Ready() ? Synced(real.cuEventSynchronize, event) : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                         cuuint64_t flags);
TESSERA_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* status);

namespace tessera::shim {
namespace {

// A real entry point -> our hook for it; anything else unchanged.
void* Redirect(void* fn) {
  if (fn == nullptr) return fn;
#define TESSERA_REDIRECT(name) \
  if (fn == reinterpret_cast<void*>(real.name)) return reinterpret_cast<void*>(&::name);
  TESSERA_HOOKED(TESSERA_REDIRECT)
#undef TESSERA_REDIRECT
  return fn;
}

}  // namespace
}  // namespace tessera::shim

namespace tessera::shim {
namespace {

// The hooks by the name a caller asks cuGetProcAddress for, for the versions whose ABI they have:
// the first line (whatever address the driver answers with); the address match is the second, for
// names not listed here.
struct Named {
  const char* name;
  int min_version, max_version;  // [min, max): the ABI of our hook
  void* hook;
  void** real;       // what the hook calls
  void* per_thread;  // the per-thread default stream hook; nullptr: none
  void** real_per_thread;
};

#define TESSERA_NAMED(base, min, max, hook, ...)                                            \
  Named {                                                                                   \
    base, min, max, reinterpret_cast<void*>(&::hook), reinterpret_cast<void**>(&real.hook), \
        __VA_ARGS__                                                                         \
  }
#define TESSERA_PTSZ(hook) reinterpret_cast<void*>(&::hook), reinterpret_cast<void**>(&real.hook)

const Named kNamed[] = {
    TESSERA_NAMED("cuMemAlloc", 3020, 1 << 30, cuMemAlloc_v2, nullptr, nullptr),
    TESSERA_NAMED("cuMemAllocPitch", 3020, 1 << 30, cuMemAllocPitch_v2, nullptr, nullptr),
    TESSERA_NAMED("cuMemAllocManaged", 6000, 1 << 30, cuMemAllocManaged, nullptr, nullptr),
    TESSERA_NAMED("cuMemAllocAsync", 11020, 1 << 30, cuMemAllocAsync,
                  TESSERA_PTSZ(cuMemAllocAsync_ptsz)),
    TESSERA_NAMED("cuMemAllocFromPoolAsync", 11020, 1 << 30, cuMemAllocFromPoolAsync,
                  TESSERA_PTSZ(cuMemAllocFromPoolAsync_ptsz)),
    TESSERA_NAMED("cuMemFree", 3020, 1 << 30, cuMemFree_v2, nullptr, nullptr),
    TESSERA_NAMED("cuMemFreeAsync", 11020, 1 << 30, cuMemFreeAsync,
                  TESSERA_PTSZ(cuMemFreeAsync_ptsz)),
    TESSERA_NAMED("cuMemCreate", 10020, 1 << 30, cuMemCreate, nullptr, nullptr),
    TESSERA_NAMED("cuMemRelease", 10020, 1 << 30, cuMemRelease, nullptr, nullptr),
    TESSERA_NAMED("cuMemGetInfo", 3020, 1 << 30, cuMemGetInfo_v2, nullptr, nullptr),
    TESSERA_NAMED("cuArrayCreate", 3020, 1 << 30, cuArrayCreate_v2, nullptr, nullptr),
    TESSERA_NAMED("cuArray3DCreate", 3020, 1 << 30, cuArray3DCreate_v2, nullptr, nullptr),
    TESSERA_NAMED("cuArrayDestroy", 2000, 1 << 30, cuArrayDestroy, nullptr, nullptr),
    TESSERA_NAMED("cuMipmappedArrayCreate", 5000, 1 << 30, cuMipmappedArrayCreate, nullptr,
                  nullptr),
    TESSERA_NAMED("cuMipmappedArrayDestroy", 5000, 1 << 30, cuMipmappedArrayDestroy, nullptr,
                  nullptr),
    TESSERA_NAMED("cuDeviceTotalMem", 3020, 1 << 30, cuDeviceTotalMem_v2, nullptr, nullptr),
    TESSERA_NAMED("cuCtxDestroy", 4000, 1 << 30, cuCtxDestroy_v2, nullptr, nullptr),
    TESSERA_NAMED("cuDevicePrimaryCtxRetain", 7000, 1 << 30, cuDevicePrimaryCtxRetain, nullptr,
                  nullptr),
    TESSERA_NAMED("cuDevicePrimaryCtxRelease", 11000, 1 << 30, cuDevicePrimaryCtxRelease_v2,
                  nullptr, nullptr),
    TESSERA_NAMED("cuCtxSynchronize", 2000, 1 << 30, cuCtxSynchronize, nullptr, nullptr),
    TESSERA_NAMED("cuEventSynchronize", 2000, 1 << 30, cuEventSynchronize, nullptr, nullptr),
    TESSERA_NAMED("cuMemPoolCreate", 11020, 1 << 30, cuMemPoolCreate, nullptr, nullptr),
    TESSERA_NAMED("cuMemPoolDestroy", 11020, 1 << 30, cuMemPoolDestroy, nullptr, nullptr),
    TESSERA_NAMED("cuMemPoolTrimTo", 11020, 1 << 30, cuMemPoolTrimTo, nullptr, nullptr),
    TESSERA_NAMED("cuModuleLoadData", 2000, 1 << 30, cuModuleLoadData, nullptr, nullptr),
    TESSERA_NAMED("cuModuleLoadDataEx", 2010, 1 << 30, cuModuleLoadDataEx, nullptr, nullptr),
    TESSERA_NAMED("cuModuleUnload", 2000, 1 << 30, cuModuleUnload, nullptr, nullptr),
    TESSERA_NAMED("cuModuleLoad", 2000, 1 << 30, cuModuleLoad, nullptr, nullptr),
    TESSERA_NAMED("cuModuleLoadFatBinary", 2000, 1 << 30, cuModuleLoadFatBinary, nullptr, nullptr),
    TESSERA_NAMED("cuLibraryLoadData", 12000, 1 << 30, cuLibraryLoadData, nullptr, nullptr),
    TESSERA_NAMED("cuLibraryLoadFromFile", 12000, 1 << 30, cuLibraryLoadFromFile, nullptr, nullptr),
    TESSERA_NAMED("cuLibraryUnload", 12000, 1 << 30, cuLibraryUnload, nullptr, nullptr),
    TESSERA_NAMED("cuLaunchKernel", 4000, 1 << 30, cuLaunchKernel,
                  TESSERA_PTSZ(cuLaunchKernel_ptsz)),
    TESSERA_NAMED("cuLaunchKernelEx", 11060, 1 << 30, cuLaunchKernelEx,
                  TESSERA_PTSZ(cuLaunchKernelEx_ptsz)),
    TESSERA_NAMED("cuLaunchCooperativeKernel", 9000, 1 << 30, cuLaunchCooperativeKernel,
                  TESSERA_PTSZ(cuLaunchCooperativeKernel_ptsz)),
    TESSERA_NAMED("cuGraphLaunch", 10000, 1 << 30, cuGraphLaunch, TESSERA_PTSZ(cuGraphLaunch_ptsz)),
    TESSERA_NAMED("cuGraphInstantiateWithFlags", 11040, 1 << 30, cuGraphInstantiateWithFlags,
                  nullptr, nullptr),
    // From CUDA 12 "cuGraphInstantiate" is the same entry point (before: another signature).
    TESSERA_NAMED("cuGraphInstantiate", 12000, 1 << 30, cuGraphInstantiateWithFlags, nullptr,
                  nullptr),
    TESSERA_NAMED("cuDeviceGraphMemTrim", 11040, 1 << 30, cuDeviceGraphMemTrim, nullptr, nullptr),
    TESSERA_NAMED("cuStreamBeginCapture", 10010, 1 << 30, cuStreamBeginCapture_v2,
                  TESSERA_PTSZ(cuStreamBeginCapture_v2_ptsz)),
    TESSERA_NAMED("cuStreamEndCapture", 10000, 1 << 30, cuStreamEndCapture,
                  TESSERA_PTSZ(cuStreamEndCapture_ptsz)),
    TESSERA_NAMED("cuStreamSynchronize", 2000, 1 << 30, cuStreamSynchronize,
                  TESSERA_PTSZ(cuStreamSynchronize_ptsz)),
};
#undef TESSERA_NAMED
#undef TESSERA_PTSZ

// What cuGetProcAddress hands out for `symbol`: the hook of that name for this version and stream
// flavour (by name: the driver's address for it may be any alias, or shared between the legacy and
// per-thread variants), else the hook of the driver's answer when it is an entry point we hook (by
// address: an alias name we do not list), else the answer.
void* HookFor(const char* symbol, int version, cuuint64_t flags, void* answer) {
  if (answer == nullptr) return answer;
  if (symbol != nullptr) {
    for (const Named& n : kNamed) {
      if (strcmp(n.name, symbol) != 0 || version < n.min_version || version >= n.max_version)
        continue;
      const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
      // A hook whose own entry point was not found at load calls the driver's answer.
      if (per_thread && n.per_thread) {
        if (*n.real_per_thread == nullptr) *n.real_per_thread = answer;
        return n.per_thread;
      }
      if (*n.real == nullptr) *n.real = answer;
      return n.hook;
    }
  }
  void* by_address = Redirect(answer);
  if (verbose && by_address != answer) {
    fprintf(stderr, "tessera-cuda: cuGetProcAddress(%s, %d, %llu): hooked by its address\n",
            symbol ? symbol : "(null)", version, static_cast<unsigned long long>(flags));
  }
  return by_address;
}

}  // namespace
}  // namespace tessera::shim

TESSERA_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                         cuuint64_t flags) {
  if (!Ready() || real.cuGetProcAddress == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuGetProcAddress(symbol, pfn, version, flags);
  if (rc == CUDA_SUCCESS && pfn != nullptr)
    *pfn = tessera::shim::HookFor(symbol, version, flags, *pfn);
  return rc;
}

TESSERA_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* status) {
  if (!Ready() || real.cuGetProcAddress_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
  if (rc == CUDA_SUCCESS && pfn != nullptr)
    *pfn = tessera::shim::HookFor(symbol, version, flags, *pfn);
  return rc;
}

namespace tessera::shim {
namespace {

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

// The GPU memory the driver says this process holds on CUDA device `device` (NVML's process list:
// contexts, module code, allocations); false when it cannot say (no NVML, the device not found,
// this process not listed under its pid - as in another pid namespace).
bool Footprint(int device, uint64_t* bytes) {
  pthread_once(&nvml_once, InitNvml);
  static const bool nvml_ready = real_nvml.Init != nullptr && real_nvml.Init() == NVML_SUCCESS;
  if (!nvml_ready || real_nvml.GetProcesses == nullptr || real_nvml.GetCount == nullptr)
    return false;
  unsigned count = 0;
  if (real_nvml.GetCount(&count) != NVML_SUCCESS) return false;
  for (unsigned index = 0; index < count; ++index) {
    nvmlDevice_t dev;
    if (real_nvml.GetHandleByIndex(index, &dev) != NVML_SUCCESS || CudaOrdinal(dev) != device)
      continue;
    nvmlProcessInfo_t infos[256];
    unsigned n = 256;
    if (real_nvml.GetProcesses(dev, &n, infos) != NVML_SUCCESS) return false;
    const unsigned me = static_cast<unsigned>(getpid());
    for (unsigned k = 0; k < n; ++k) {
      if (infos[k].pid == me) {
        // NVML_VALUE_NOT_AVAILABLE (all bits set) where the driver cannot say (some vGPU and MIG
        // setups): not measurable, never a huge charge.
        if (infos[k].usedGpuMemory == ~0ull) return false;
        *bytes = infos[k].usedGpuMemory;
        return true;
      }
    }
    return false;
  }
  return false;
}

std::mutex footprint_mu;
uint64_t invisible[kMaxDevices];  // charged for what allocations do not show; under footprint_mu

// Charges `device` what this process holds there beyond its counted allocations (contexts, module
// code), as the driver measures it; false when more is needed than the limit leaves (nothing
// charged then). True when it cannot be measured.
bool Reconcile(int device) {
  if (device < 0 || device >= kMaxDevices || !Ready()) return true;
  std::lock_guard lock(footprint_mu);
  uint64_t measured = 0;
  // Not listed: nothing held when it has no context there; otherwise not measurable here.
  if (!Footprint(device, &measured) && contexts_on[device].load() > 0) return true;
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

}  // namespace
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
namespace {

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

}  // namespace
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

namespace tessera::shim {
namespace {

// dlsym(RTLD_NEXT, name) as its caller would have it without this hook. glibc resolves RTLD_NEXT
// from the address it is called from, which is now this library's: another interposer preloaded
// after this one (a profiler, a tracer) would be handed its own function and call itself forever.
// So: the first object after the caller's in the load order that defines `name` itself.
void* NextAfter(const void* caller, const char* name, DlsymFn sym) {
  Dl_info info;
  struct link_map* from = nullptr;
  if (dladdr1(caller, &info, reinterpret_cast<void**>(&from), RTLD_DL_LINKMAP) == 0 ||
      from == nullptr) {
    return sym(RTLD_NEXT, name);  // a caller in no object (JIT code): glibc's answer from here
  }
  for (struct link_map* m = from->l_next; m != nullptr; m = m->l_next) {
    if (m->l_name == nullptr || m->l_name[0] == 0) continue;
    void* h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) continue;  // the vDSO, or an object being unloaded
    void* fn = sym(h, name);
    dlclose(h);
    struct link_map* owner = nullptr;
    if (fn != nullptr &&
        dladdr1(fn, &info, reinterpret_cast<void**>(&owner), RTLD_DL_LINKMAP) != 0 && owner == m) {
      return fn;  // defined by m itself, not by a dependency of it found through its handle
    }
  }
  return nullptr;
}

}  // namespace
}  // namespace tessera::shim

// dlsym is hooked so that a program (or the CUDA runtime) that dlopens libcuda.so.1 and looks entry
// points up by name gets our hooks too.
namespace tessera::shim {
namespace {
// The driver's object in this process (the one the hooks call), for telling another copy of it.
const link_map* DriverMap() {
  static const link_map* map = [] {
    Dl_info info;
    link_map* m = nullptr;
    void* fn = reinterpret_cast<void*>(real.cuCtxGetDevice);
    return fn != nullptr && dladdr1(fn, &info, reinterpret_cast<void**>(&m), RTLD_DL_LINKMAP) != 0
               ? m
               : nullptr;
  }();
  return map;
}

// Whether `fn` lies in another copy of the CUDA driver than the hooked one: a libcuda.so file
// loaded from another path (another inode, so another object with its own state), which the
// hooks would not see. Said once.
bool InAnotherDriverCopy(void* fn) {
  Dl_info info;
  link_map* m = nullptr;
  if (dladdr1(fn, &info, reinterpret_cast<void**>(&m), RTLD_DL_LINKMAP) == 0 || m == nullptr ||
      m == DriverMap() || m->l_name == nullptr) {
    return false;
  }
  const char* base = strrchr(m->l_name, '/');
  base = base != nullptr ? base + 1 : m->l_name;
  if (strncmp(base, "libcuda.so", 10) != 0) return false;
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    fprintf(stderr,
            "tessera-cuda: %s is another copy of the CUDA driver than the one this job's limits "
            "hold on; its entry points are refused\n",
            m->l_name);
  }
  return true;
}
}  // namespace
}  // namespace tessera::shim

TESSERA_EXPORT void* dlsym(void* handle, const char* name) {
  DlsymFn sym = RealDlsym();
  if (sym == nullptr) return nullptr;
  void* fn = handle == RTLD_NEXT
                 ? NextAfter(__builtin_extract_return_addr(__builtin_return_address(0)), name, sym)
                 : sym(handle, name);
  if (fn == nullptr) return fn;
  // Refused (a malformed setting): still the hook, which refuses, never the driver's own entry.
  if (name[0] == 'c' && name[1] == 'u' && (Ready() || refused)) {
    void* hooked = Redirect(fn);
    // A second copy of the driver (opened by another path) would run unlimited and unpaced.
    return hooked == fn && InAnotherDriverCopy(fn) ? nullptr : hooked;
  }
  if (name[0] != 'n' || strncmp(name, "nvmlDevice", 10) != 0) return fn;
  static const struct {
    const char* name;
    void* hook;
  } kNvml[] = {
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void*>(&nvmlDeviceGetMemoryInfo)},
      {"nvmlDeviceGetMemoryInfo_v2", reinterpret_cast<void*>(&nvmlDeviceGetMemoryInfo_v2)},
      {"nvmlDeviceGetUtilizationRates", reinterpret_cast<void*>(&nvmlDeviceGetUtilizationRates)},
      {"nvmlDeviceGetComputeRunningProcesses",
       reinterpret_cast<void*>(&nvmlDeviceGetComputeRunningProcesses)},
      {"nvmlDeviceGetComputeRunningProcesses_v2",
       reinterpret_cast<void*>(&nvmlDeviceGetComputeRunningProcesses_v2)},
      {"nvmlDeviceGetComputeRunningProcesses_v3",
       reinterpret_cast<void*>(&nvmlDeviceGetComputeRunningProcesses_v3)},
      {"nvmlDeviceGetGraphicsRunningProcesses",
       reinterpret_cast<void*>(&nvmlDeviceGetGraphicsRunningProcesses)},
      {"nvmlDeviceGetGraphicsRunningProcesses_v2",
       reinterpret_cast<void*>(&nvmlDeviceGetGraphicsRunningProcesses_v2)},
      {"nvmlDeviceGetGraphicsRunningProcesses_v3",
       reinterpret_cast<void*>(&nvmlDeviceGetGraphicsRunningProcesses_v3)},
  };
  for (const auto& n : kNvml) {
    if (strcmp(name, n.name) == 0) return n.hook;
  }
  return fn;
}
