// libtessera-cuda.so: the CUDA driver-API intercept library (see docs/sharing.md). Loaded by
// LD_PRELOAD; finds the real driver with dlopen("libcuda.so.1") and forwards every call, counting
// GPU memory against the job's limit in the shared region. Hooked functions stay hooked however
// they are reached: by linking, by dlsym (hooked here too) and by cuGetProcAddress(_v2), whose
// answers are mapped to our hooks by the name, version and flag asked, and otherwise by comparing
// them with the real entry points. Plain C ABI; nothing throws across it.
//
// This file: the process's state, its settings (fail closed on a malformed one), fork, and the
// memory accounting every hook family shares (hooks.h). The hooks are by family: memory_hooks.cc,
// context_hooks.cc, launch_hooks.cc, nvml_hooks.cc, lookup_hooks.cc (the table of every hook).
#include "tessera/devices/nvml_abi.h"   // declarations only: the shim links nothing of Tessera
#include "tessera/shim/glibc_compat.h"  // first: pins the symbol versions
#include "tessera/shim/hooks.h"
#include "tessera/shim/host_clock.h"

namespace tessera::shim {

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
// The memory the job's allocations do not show (contexts, module code) is measured: the driver's
// own figure for this process (NVML's process list, under its pid or, in a pid namespace, the host
// pid a probe finds) less what is counted, charged per device after a context is made or a module
// loaded (Reconcile). A configured overhead counts until the first measure, or for good where
// nothing can be measured.
bool Reconcile(int device);
pthread_once_t init_once = PTHREAD_ONCE_INIT;
bool verbose = false;

// Allocations of this process by kind and address/handle. Leaked on purpose at exit: the host
// process's static destructors may still call into the driver.
std::mutex* held_mu = nullptr;
std::unordered_map<uint64_t, Held>* held = nullptr;
VmmState* vmm = nullptr;

std::mutex* pool_mu = nullptr;
std::unordered_map<uint64_t, PoolUse>* pools = nullptr;  // by handle; under *pool_mu
std::atomic<bool> any_pool{false};
// Graph memory (CUDA graphs' memory nodes): what each device's graph memory pool is charged, and
// what each instantiated graph with memory nodes allocates per device. Under *pool_mu.
uint64_t graph_charged[kMaxDevices] = {};
std::unordered_map<uint64_t, std::vector<std::pair<int, uint64_t>>>* graph_execs = nullptr;
std::atomic<bool> any_graph_memory{false};

void Log(const char* fmt, const char* a, const char* b) {
  if (verbose) fprintf(stderr, fmt, a, b);
}

void InitBacklog();

void AfterForkChild() {
  ForgetMonotonicOffset();  // the child may be in another time namespace
  ForgetFootprint();
  if (region != nullptr) region->ReattachAfterFork();
  if (held != nullptr) {
    new (held_mu) std::mutex();
    for (int k = 0; k < kKinds; ++k) held[k].clear();
    if (vmm != nullptr) *vmm = VmmState();
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

// A list of the arbiter's GPU indices ("3,5"): their bits in `mask`, and each in turn in `out`
// (at most `max` of them) when `out` is given. False when it does not parse.
bool ParseGpuIndices(const char* v, uint32_t* mask, int* out, int max) {
  int n = 0;
  for (const char* p = v; *p; ++n) {
    char* end = nullptr;
    const long x = strtol(p, &end, 10);
    if (end == p || x < 0 || x >= kArbiterGpus || (out && n >= max) || (*end != ',' && *end != 0))
      return false;
    if (out) out[n] = static_cast<int>(x);
    *mask |= 1u << x;
    p = *end ? end + 1 : end;
  }
  return true;
}

// TESSERA_CUDA_ARBITER and the settings that go with it; a malformed setting refuses CUDA.
void InitArbiter(const char* region_path) {
  const char* path = getenv("TESSERA_CUDA_ARBITER");
  if (path == nullptr || *path == 0) return;
  ArbiterConfig c;
  c.queued_us = [] { return backlog.QueuedUs(CurrentDevice()); };
  c.launch_us = [] {
    const int dev = CurrentDevice();
    return dev >= 0 && dev < kBacklogDevices ? backlog.estimate_ns(dev) / 1000 : 0;
  };
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
  // The pacing settings: the arbiter file's (its maker's), these only for a file this process
  // makes (ArbiterSettings). A queue bound is at least 100 us: 0 (none) let a tenant's queued work
  // run in the next holder's slice.
  number("TESSERA_CUDA_TIMESLICE_US", kMinSliceUs, kMaxSettingUs, &c.slice_us);
  number("TESSERA_CUDA_IDLE_US", kMinIdleUs, kMaxSettingUs, &c.idle_us);
  number("TESSERA_CUDA_QUEUE_US", kMinQueueUs, kMaxSettingUs, &c.queue_us);
  int conserving = 1, gang = 1;
  number("TESSERA_CUDA_WORK_CONSERVING", 0, 1, &conserving);
  number("TESSERA_CUDA_GANG", 0, 1, &gang);
  c.work_conserving = conserving != 0;
  for (int i = 0; i < kMaxDevices; ++i) physical_gpu[i] = i;
  if (const char* v = getenv("TESSERA_CUDA_ARBITER_GPUS"); v && *v) {
    uint32_t mask = 0;
    if (!ParseGpuIndices(v, &mask, physical_gpu, kMaxDevices)) {
      Refuse("TESSERA_CUDA_ARBITER_GPUS", v, "a list of GPU indices (3,5)");
      for (int k = 0; k < kMaxDevices; ++k) physical_gpu[k] = k;
    } else {
      // A job given several GPUs (its ranks on them): their slices are granted together, unless
      // TESSERA_CUDA_GANG=0.
      if (__builtin_popcount(mask) >= 2 && gang != 0) c.gang_mask = mask;
      // The job's ranks in several containers (the pods of one distributed job on this node),
      // each seeing only its own GPUs: the gang's GPUs here, set alike in all of them (with one
      // TESSERA_JOB_ID), so that their slices are granted together as for one container's ranks.
      if (const char* g = getenv("TESSERA_CUDA_GANG_GPUS"); g && *g) {
        uint32_t all = 0;
        if (!ParseGpuIndices(g, &all, nullptr, 0) || (all & mask) != mask) {
          Refuse("TESSERA_CUDA_GANG_GPUS", g,
                 "a list of GPU indices (0,1) that holds TESSERA_CUDA_ARBITER_GPUS");
        } else if (__builtin_popcount(all) >= 2 && gang != 0) {
          c.gang_mask = all;
        }
      }
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
    return;
  }
  queue_bound_us = arbiter->queue_us();
  const bool differs =
      (c.slice_us != ArbiterConfig().slice_us && c.slice_us != arbiter->slice_us()) ||
      (c.queue_us != 0 && c.queue_us != arbiter->queue_us()) ||
      (c.idle_us != ArbiterConfig().idle_us && c.idle_us != arbiter->idle_us());
  if (differs) {
    fprintf(stderr,
            "tessera-cuda: the arbiter's settings are its maker's (slice %llu us, queue %llu us, "
            "idle %llu us): this process's TESSERA_CUDA_TIMESLICE_US, QUEUE_US and IDLE_US are "
            "not used\n",
            static_cast<unsigned long long>(arbiter->slice_us()),
            static_cast<unsigned long long>(arbiter->queue_us()),
            static_cast<unsigned long long>(arbiter->idle_us()));
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
    real.cuMemGetAllocationPropertiesFromHandle =
        reinterpret_cast<cuMemGetAllocationPropertiesFromHandle_fn>(
            sym(real.handle, "cuMemGetAllocationPropertiesFromHandle"));
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
  if (region == nullptr && path && *path) {
    // The job's region cannot be used (not one, another user's, every process slot taken): the
    // job's limit would hold for this process alone, so CUDA is refused instead (fail closed).
    fprintf(stderr,
            "tessera-cuda: %s; CUDA is refused in this process (the job's limits cannot be kept "
            "without its region)\n",
            err);
    refused = true;
  }
  if (region == nullptr) region = Region::Private(limits, count, err, sizeof err);
  const char* overhead = getenv("TESSERA_CUDA_CONTEXT_OVERHEAD");
  if (overhead && *overhead) {
    uint64_t v[kMaxDevices];
    int n = 0;
    // 0 would stop counting contexts and modules at all: no overhead is 0.
    if (ParseLimits(overhead, v, &n) && n == kMaxDevices && v[0] > 0) {
      context_overhead = v[0];
    } else {
      Refuse("TESSERA_CUDA_CONTEXT_OVERHEAD", overhead, "a size above 0 (300MiB)");
    }
  }
  InitArbiter(path);
  if (arbiter != nullptr) InitBacklog();
  held_mu = new (std::nothrow) std::mutex();
  held = new (std::nothrow) std::unordered_map<uint64_t, Held>[kKinds];
  vmm = new (std::nothrow) VmmState();
  pool_mu = new (std::nothrow) std::mutex();
  pools = new (std::nothrow) std::unordered_map<uint64_t, PoolUse>();
  graph_execs =
      new (std::nothrow) std::unordered_map<uint64_t, std::vector<std::pair<int, uint64_t>>>();
  pthread_atfork(nullptr, nullptr, AfterForkChild);
  Log("tessera-cuda: loaded (%s%s)\n", path ? path : "private region");
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
  // A refusal is counted once, when it is the program's answer: not before idle pools are trimmed.
  const bool can_trim =
      any_pool.load(std::memory_order_acquire) || any_graph_memory.load(std::memory_order_acquire);
  if (region->Reserve(device, bytes, !can_trim)) return true;
  if (!can_trim) return false;
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
CUresult Uncount(Kind kind, uint64_t key, bool synchronous) {
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

}  // namespace tessera::shim
