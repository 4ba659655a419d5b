#pragma once
// What the hook families of libtessera-cuda.so share: the process's state and settings and the
// memory accounting (shim.cc), and the hooks by family (memory_hooks.cc, context_hooks.cc,
// launch_hooks.cc, nvml_hooks.cc, lookup_hooks.cc - the lookup table of every hook is there).
// Internal to the library: every name here is hidden; only the hooked C entry points
// (TESSERA_EXPORT) are exported.
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
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

using DlsymFn = void* (*)(void*, const char*);

// How often memory queries (cuMemGetInfo, NVML's memory info) give back dead processes' memory.
constexpr uint64_t kMemoryQueryReclaimUs = 100'000;

// The real driver's entry points, by the names we hook.
#define TESSERA_HOOKED(X)           \
  X(cuMemAlloc_v2)                  \
  X(cuMemAllocPitch_v2)             \
  X(cuMemAllocManaged)              \
  X(cuMemAllocAsync)                \
  X(cuMemAllocFromPoolAsync)        \
  X(cuMemFree_v2)                   \
  X(cuMemFreeAsync)                 \
  X(cuMemCreate)                    \
  X(cuMemRelease)                   \
  X(cuMemMap)                       \
  X(cuMemUnmap)                     \
  X(cuMemExportToShareableHandle)   \
  X(cuMemImportFromShareableHandle) \
  X(cuArrayCreate_v2)               \
  X(cuArray3DCreate_v2)             \
  X(cuArrayDestroy)                 \
  X(cuMipmappedArrayCreate)         \
  X(cuMipmappedArrayDestroy)        \
  X(cuMemGetInfo_v2)                \
  X(cuCtxCreate_v2)                 \
  X(cuCtxCreate_v3)                 \
  X(cuCtxCreate_v4)                 \
  X(cuCtxDestroy_v2)                \
  X(cuDevicePrimaryCtxRetain)       \
  X(cuDevicePrimaryCtxRelease_v2)   \
  X(cuDeviceTotalMem_v2)            \
  X(cuLaunchKernel)                 \
  X(cuLaunchKernelEx)               \
  X(cuLaunchCooperativeKernel)      \
  X(cuGraphLaunch)                  \
  X(cuGraphInstantiateWithFlags)    \
  X(cuDeviceGraphMemTrim)           \
  X(cuMemPoolCreate)                \
  X(cuMemPoolDestroy)               \
  X(cuMemPoolTrimTo)                \
  X(cuModuleLoadData)               \
  X(cuModuleLoadDataEx)             \
  X(cuModuleUnload)                 \
  X(cuModuleLoad)                   \
  X(cuModuleLoadFatBinary)          \
  X(cuLibraryLoadData)              \
  X(cuLibraryLoadFromFile)          \
  X(cuLibraryUnload)                \
  X(cuStreamBeginCapture_v2)        \
  X(cuStreamEndCapture)             \
  X(cuCtxSynchronize)               \
  X(cuStreamSynchronize)            \
  X(cuEventSynchronize)             \
  X(cuGetProcAddress)               \
  X(cuGetProcAddress_v2)            \
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
  // Asked, not hooked: the device of an imported handle's memory.
  cuMemGetAllocationPropertiesFromHandle_fn cuMemGetAllocationPropertiesFromHandle = nullptr;
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

enum Kind : int { kDevicePtr, kHandle, kArray, kMipmapped, kKinds };
struct Held {
  uint64_t bytes;
  int device;
  uint64_t pool = 0;  // taken from this memory pool (its handle); 0: none
};

// This process's memory pools (see PoolAlloc).
struct PoolUse {
  int device = 0;
  uint64_t charged = 0;  // what the region holds for this pool
  uint64_t live = 0;     // what its allocations not yet freed take
  bool destroyed = false;
};

// The process's state (shim.cc).
extern DlsymFn real_dlsym;
extern Real real;
extern Region* region;
extern Arbiter* arbiter;
extern Backlog backlog;
extern uint64_t queue_bound_us;
extern int physical_gpu[kMaxDevices];
extern uint64_t context_overhead;
extern std::atomic<int> contexts_on[kMaxDevices];
extern pthread_once_t init_once;
extern bool verbose;
extern std::mutex* held_mu;
extern std::unordered_map<uint64_t, Held>* held;
// VMM (under held_mu): this process's mappings (address -> size and handle) and how many each
// handle has, and the handles released while still mapped - charged until their last unmap, as
// the driver keeps their memory until then.
struct VmmState {
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> mappings;
  std::unordered_map<uint64_t, int> mapped;
  std::unordered_set<uint64_t> released;
  // Memory shared with other processes of the job (Region::Share, Region::Join): this process's
  // handles of it -> its id; per id, how many such handles (live, or released but still mapped)
  // and this process's kept copy of an exported descriptor (-1: none).
  std::unordered_map<uint64_t, uint64_t> shared;
  std::unordered_map<uint64_t, std::pair<int, int>> ids;
  // Imported memory that is no shared memory of the job (another job's export, or nothing to tell
  // it by): charged here as this process's while mapped - its largest mapping - and its device.
  std::unordered_map<uint64_t, std::pair<uint64_t, int>> foreign;
};
extern VmmState* vmm;
extern std::mutex* pool_mu;
extern std::unordered_map<uint64_t, PoolUse>* pools;
extern std::atomic<bool> any_pool;
extern uint64_t graph_charged[kMaxDevices];
extern std::unordered_map<uint64_t, std::vector<std::pair<int, uint64_t>>>* graph_execs;
extern std::atomic<bool> any_graph_memory;
extern bool refused;

// Shared by the hook families (defined where their family is).
DlsymFn RealDlsym();
void Log(const char* fmt, const char* a, const char* b = "");
void AfterForkChild();
void Refuse(const char* name, const char* value, const char* expected);
void InitArbiter(const char* region_path);
void InitBacklog();
void Init();
int CurrentDevice();
bool Remember(Kind kind, uint64_t key, Held h);
bool Forget(Kind kind, uint64_t key, Held* out);
void Refresh(uint64_t handle, PoolUse& u);
void RefreshGraphLocked(int device);
std::vector<std::pair<int, uint64_t>> GraphAllocations(CUgraph g);
void TrimIdleLocked(int device);
bool ChargeGraphLocked(int device, uint64_t bytes);
bool Reserve(int device, uint64_t bytes);
void RefreshPools();
void PoolFreed(const Held& h, bool synchronous);
uint64_t DriverBytes(uint64_t bytes);
uint64_t PtrKey(void* p);
uint64_t HandleKey(void* p);
uint64_t ObjectKey(void* p);
CUresult Uncount(Kind kind, uint64_t key, bool synchronous = true);
uint64_t FormatBytes(CUarray_format f);
uint64_t ArrayBytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned channels);
// A context on `device` (`primary`: a retain of its primary context) charged / given back.
bool TakeContext(int device, bool primary);
void DropContext(int device, bool primary);
int ArbiterGpu();
CUresult SynchronizeContext();
void Drain();
bool Recorded(CUstream stream);
CUstream PerThread(CUstream stream);
void Decrement(std::atomic<int>& n);
CUresult BeginCapture(cuStreamBeginCapture_v2_fn fn, CUstream stream, CUstreamCaptureMode mode);
CUresult EndCapture(cuStreamEndCapture_fn fn, CUstream stream, CUgraph* graph);
void* Redirect(void* fn);
void* HookFor(const char* symbol, int version, cuuint64_t flags, void* answer);
void* NextAfter(const void* caller, const char* name, DlsymFn sym);
const link_map* DriverMap();
bool InAnotherDriverCopy(void* fn);
void InitNvml();
int CudaOrdinal(nvmlDevice_t dev);
void Limit(nvmlDevice_t dev, unsigned long long* total, unsigned long long* free_bytes,
           unsigned long long* used);
bool Footprint(int device, uint64_t* bytes);
bool Reconcile(int device);
// After fork(): the child (a new slot in the region, a new pid for the driver) has measured and
// charged nothing yet (nvml_hooks.cc).
void ForgetFootprint();
// Gives back the configured context overheads charged so far and charges none from then on: this
// process's footprint is measured (context_hooks.cc). ForgetFixedOverheads: after fork().
void DropFixedOverheads();
void ForgetFixedOverheads();

inline bool Ready() {
  pthread_once(&init_once, Init);
  return !refused && real.handle != nullptr && region != nullptr && held != nullptr &&
         pools != nullptr && pool_mu != nullptr;
}

// A memory pool grows by whole chunks, not by what is asked: on an H100 (driver 580) 251
// allocations of 2 MiB + 1 from the default pool (502 MiB) left it holding 512 MiB, which NVML
// counted against the process. What a pool's allocations need is charged rounded up to this, so
// that the chunk the driver takes is already within the limit.
inline constexpr uint64_t kPoolChunk = uint64_t{32} << 20;

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
    auto missing = [&] {
      const uint64_t need = (u.live + bytes + kPoolChunk - 1) / kPoolChunk * kPoolChunk;
      return need > u.charged ? need - u.charged : 0;
    };
    extra = missing();
    if (extra > 0 && !region->Reserve(device, extra, /*count_refusal=*/false)) {
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

}  // namespace tessera::shim

// The hooks, for the lookup table (lookup_hooks.cc) and the families that call one another's.
#define TESSERA_DECLARE_HOOK(name) TESSERA_EXPORT std::remove_pointer_t<::name##_fn> name;
TESSERA_HOOKED(TESSERA_DECLARE_HOOK)
#undef TESSERA_DECLARE_HOOK

// NVML's hooks (nvml_hooks.cc), for dlsym's answers (lookup_hooks.cc).
TESSERA_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t* m);
TESSERA_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t* m);
TESSERA_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t* u);
#define TESSERA_DECLARE_PROCESSES(name, Info) \
  TESSERA_EXPORT nvmlReturn_t name(nvmlDevice_t dev, unsigned* count, Info* infos);
TESSERA_DECLARE_PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
TESSERA_DECLARE_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
TESSERA_DECLARE_PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
TESSERA_DECLARE_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
TESSERA_DECLARE_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t)
TESSERA_DECLARE_PROCESSES(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
#undef TESSERA_DECLARE_PROCESSES
