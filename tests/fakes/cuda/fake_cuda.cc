// A fake libcuda.so.1 for the tests: a virtual GPU whose device memory is host memory (so a leak or
// a double free shows), with the entry points the intercept library hooks, cuGetProcAddress(_v2)
// mapping base names to versioned entry points as the real driver does, and hooks for the tests.
//   FAKE_CUDA_DEVICES      number of devices (default 1)
//   FAKE_CUDA_MEMORY_MIB   memory per device (default 16384)
//   FAKE_CUDA_CLOCK        a file shared by all processes holding each device's virtual clock, so
//   that
//                          kernels of different processes contend for the same virtual GPU time
//                          (without it each process has a GPU of its own)
//   FAKE_CUDA_GRAPH_US     virtual time of one cuGraphLaunch (default 1000)
//   FAKE_CUDA_CONTEXT_MIB  device memory a context takes (default 0)
//   FAKE_CUDA_MODULE_MIB   device memory a loaded module takes (default 0)
//   FAKE_CUDA_SHARED_PTSZ  cuGetProcAddress answers per-thread requests with the legacy address
//   FAKE_GPU_KERNEL        the fake driver's kernel side (gpu_kernel.h): every change of this
//                          process's device memory is told to it
// MPS, as the real driver reads it: with CUDA_MPS_PIPE_DIRECTORY naming a folder where a control
// daemon listens (mps/fake_mps_control.cc), cuInit connects as its client (waiting, as MPS makes
// it, while another user's server runs) and tells it CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; the pinned limit ("0=4096M,1=2G") caps each ordinal's
// allocations; a launch after the daemon went away fails (CUDA_ERROR_MPS_CONNECTION_FAILED). No
// daemon there: the process runs without MPS, as the real driver does. A kernel of grid width
// 0xFA17 faults (CUDA_ERROR_ILLEGAL_ADDRESS); an MPS client's fault ends its server, and the
// other clients' next launch fails as above.
// Kernels occupy virtual GPU time: gridDimX microseconds each, run one at a time per device in
// launch order across processes (first come, first served, as one GPU's queue), asynchronously: a
// launch returns at once and cuCtxSynchronize/cuStreamSynchronize/cuEventSynchronize wait until
// this process's kernels on the current device are done.
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu_kernel_client.h"
#include "tessera/shim/cuda_abi.h"
#include "tessera/shim/host_clock.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// The machine's GPUs (FAKE_CUDA_DEVICES) as this process sees them: CUDA_VISIBLE_DEVICES, as the
// real driver reads it, narrows and reorders them by index (the real driver stops at the first
// entry past the machine's). The fake has no UUIDs: a list naming GPUs by UUID leaves every GPU
// visible. Ordinal i is machine GPU Visible()[i]: the one whose virtual clock its kernels occupy.
const std::vector<int>& Visible() {
  static const std::vector<int> v = [] {
    const char* e = getenv("FAKE_CUDA_DEVICES");
    const int machine = e ? atoi(e) : 1;
    std::vector<int> out;
    const char* list = getenv("CUDA_VISIBLE_DEVICES");
    if (list == nullptr) {
      for (int i = 0; i < machine; ++i) out.push_back(i);
      return out;
    }
    for (const char* p = list; *p;) {
      char* end = nullptr;
      const long i = strtol(p, &end, 10);
      if (end == p || (*end != ',' && *end != 0)) {  // a UUID: not resolvable here
        out.clear();
        for (int k = 0; k < machine; ++k) out.push_back(k);
        return out;
      }
      if (i < 0 || i >= machine) break;
      out.push_back(static_cast<int>(i));
      p = *end ? end + 1 : end;
    }
    return out;
  }();
  return v;
}
int Devices() { return static_cast<int>(Visible().size()); }
uint64_t MemoryPerDevice() {
  const char* e = getenv("FAKE_CUDA_MEMORY_MIB");
  return (e ? strtoull(e, nullptr, 10) : 16384ull) << 20;
}

std::mutex mu;
std::unordered_map<uint64_t, std::pair<uint64_t, int>>& Live() {  // address/handle -> bytes, device
  static auto* m = new std::unordered_map<uint64_t, std::pair<uint64_t, int>>();
  return *m;
}
// Device memory this process holds per device. With FAKE_GPU_KERNEL every change is told to the
// fake driver's kernel side (gpu_kernel.h) before the call returns, as the real driver's own
// accounting is, so that NVML in any process lists this one under its host pid.
struct UsedBytes {
  std::atomic<uint64_t> v{0};
  void Tell() const;
  uint64_t load() const { return v.load(); }
  bool compare_exchange_weak(uint64_t& cur, uint64_t next) {
    if (!v.compare_exchange_weak(cur, next)) return false;
    Tell();
    return true;
  }
  uint64_t fetch_sub(uint64_t b) {
    const uint64_t before = v.fetch_sub(b);
    Tell();
    return before;
  }
  UsedBytes& operator-=(uint64_t b) {
    fetch_sub(b);
    return *this;
  }
};
UsedBytes used[16];
void UsedBytes::Tell() const {
  if (getenv("FAKE_GPU_KERNEL") == nullptr) return;
  fake_gpu_kernel::Ask(
      "used " + std::to_string(this - used) + " " + std::to_string(v.load()) + "\n", nullptr);
}
std::atomic<uint64_t> launches{0};
std::atomic<int> initialized{0};
thread_local int current_device = 0;

// MPS (see the top): the connection to the control daemon (-1: not a client) and the pinned
// memory limit per ordinal (0: none).
constexpr CUresult kMpsConnectionFailed = static_cast<CUresult>(805);
constexpr CUresult kIllegalAddress = static_cast<CUresult>(700);
// A kernel launched with this grid width faults (an illegal address): CUDA_ERROR_ILLEGAL_ADDRESS,
// and as an MPS client it tells the daemon, which ends its server and so its other clients.
constexpr unsigned int kFaultingGrid = 0xFA17;
int mps_fd = -1;
uint64_t mps_limit[16] = {};

// "0=4096M,1=2G" into mps_limit (K, M, G suffixes; bare bytes).
void ParsePinnedLimits(const char* text) {
  for (const char* p = text; p && *p;) {
    char* end = nullptr;
    const long ordinal = strtol(p, &end, 10);
    if (end == p || *end != '=') return;
    p = end + 1;
    uint64_t v = strtoull(p, &end, 10);
    if (end == p) return;
    if (*end == 'K' || *end == 'k') v <<= 10, ++end;
    if (*end == 'M' || *end == 'm') v <<= 20, ++end;
    if (*end == 'G' || *end == 'g') v <<= 30, ++end;
    if (ordinal >= 0 && ordinal < 16) mps_limit[ordinal] = v;
    if (*end != ',') return;
    p = end + 1;
  }
}

// Connects to the MPS control daemon when there is one, and waits until it gives this process a
// server (another user's may run). Once, at the first cuInit.
void ConnectMps() {
  const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (dir == nullptr) return;
  const std::string path = std::string(dir) + "/control";
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return;
  strcpy(a.sun_path, path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return;
  }
  const char* pct = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  const char* limits = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
  const std::string hello = "client " + std::to_string(getpid()) + " " + std::to_string(getuid()) +
                            " " + (pct && *pct ? pct : "-") + " " +
                            (limits && *limits ? limits : "-") + "\n";
  if (send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) {
    close(fd);
    return;
  }
  char reply[64];
  const ssize_t n = read(fd, reply, sizeof reply);  // blocks while another user's server runs
  if (n < 3 || strncmp(reply, "ok ", 3) != 0) {
    close(fd);
    return;
  }
  ParsePinnedLimits(limits);
  mps_fd = fd;
}

// Whether this process is an MPS client whose server went away.
bool MpsLost() {
  if (mps_fd < 0) return false;
  pollfd p{mps_fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

CUresult Take(uint64_t bytes, unsigned long long* key_out) {
  int dev = current_device;
  uint64_t cur = used[dev].load();
  do {
    if (cur + bytes > MemoryPerDevice()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (mps_limit[dev] > 0 && cur + bytes > mps_limit[dev]) return CUDA_ERROR_OUT_OF_MEMORY;
  } while (!used[dev].compare_exchange_weak(cur, cur + bytes));
  void* p = malloc(bytes ? bytes : 1);  // untouched pages cost nothing
  if (p == nullptr) {
    used[dev].fetch_sub(bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::lock_guard lock(mu);
  Live()[reinterpret_cast<uint64_t>(p)] = {bytes, dev};
  *key_out = reinterpret_cast<uint64_t>(p);
  return CUDA_SUCCESS;
}

// A handle's memory as a file, once it is exported or imported (cuMemExportToShareableHandle):
// what names it across processes. Closed when the handle goes. Under mu.
std::unordered_map<uint64_t, int>& HandleFile() {
  static auto* m = new std::unordered_map<uint64_t, int>();
  return *m;
}

CUresult Give(uint64_t key) {
  std::pair<uint64_t, int> v;
  {
    std::lock_guard lock(mu);
    auto it = Live().find(key);
    if (it == Live().end()) return CUDA_ERROR_INVALID_VALUE;
    v = it->second;
    Live().erase(it);
    if (auto f = HandleFile().find(key); f != HandleFile().end()) {
      close(f->second);
      HandleFile().erase(f);
    }
  }
  used[v.second].fetch_sub(v.first);
  free(reinterpret_cast<void*>(key));
  return CUDA_SUCCESS;
}

}  // namespace

FAKE_EXPORT CUresult cuInit(unsigned int) {
  static std::once_flag mps_once;
  std::call_once(mps_once, ConnectMps);
  initialized = 1;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDriverGetVersion(int* v) {
  *v = 12040;
  return CUDA_SUCCESS;
}
// Every real driver exports it (the runtime's private tables); none here.
FAKE_EXPORT CUresult cuGetExportTable(const void** table, const void*) {
  if (table) *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}
FAKE_EXPORT CUresult cuDeviceGetCount(int* n) {
  *n = Devices();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= Devices()) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  *d = current_device;
  return CUDA_SUCCESS;
}
// Test hook standing in for making another device's context current.
FAKE_EXPORT void fakeCudaSetDevice(int d) { current_device = d; }
FAKE_EXPORT uint64_t fakeCudaUsedBytes(int d) { return used[d].load(); }
FAKE_EXPORT uint64_t fakeCudaLaunches() { return launches.load(); }

// What a context and a loaded module take of device memory (FAKE_CUDA_CONTEXT_MIB,
// FAKE_CUDA_MODULE_MIB; default 0), counted in the device's use as the driver's own memory.
uint64_t CostOf(const char* env) {
  const char* e = getenv(env);
  return (e ? strtoull(e, nullptr, 10) : 0ull) << 20;
}
bool Charge(int d, uint64_t bytes) {
  uint64_t cur = used[d].load();
  do {
    if (cur + bytes > MemoryPerDevice()) return false;
  } while (!used[d].compare_exchange_weak(cur, cur + bytes));
  return true;
}
std::mutex ctx_mu;
std::map<uintptr_t, int>& ContextDevice() {  // created contexts -> device; under ctx_mu
  static auto* m = new std::map<uintptr_t, int>();
  return *m;
}
int primary_refs[16];  // under ctx_mu

// Contexts: opaque tokens; creating one makes its device current for the calling thread.
FAKE_EXPORT CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned int, CUdevice d) {
  if (ctx == nullptr || d < 0 || d >= Devices()) return CUDA_ERROR_INVALID_VALUE;
  if (!Charge(d, CostOf("FAKE_CUDA_CONTEXT_MIB"))) return CUDA_ERROR_OUT_OF_MEMORY;
  static std::atomic<uintptr_t> next{0x1000};
  const uintptr_t h = next.fetch_add(16);
  {
    std::lock_guard lock(ctx_mu);
    ContextDevice()[h] = d;
  }
  *ctx = reinterpret_cast<CUcontext>(h);
  current_device = d;
  return CUDA_SUCCESS;
}
// The later versions (execution affinity, create parameters): a context like any other here.
FAKE_EXPORT CUresult cuCtxCreate_v3(CUcontext* ctx, CUexecAffinityParam*, int, unsigned int flags,
                                    CUdevice d) {
  return cuCtxCreate_v2(ctx, flags, d);
}
FAKE_EXPORT CUresult cuCtxCreate_v4(CUcontext* ctx, CUctxCreateParams*, unsigned int flags,
                                    CUdevice d) {
  return cuCtxCreate_v2(ctx, flags, d);
}
FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lock(ctx_mu);
  auto it = ContextDevice().find(reinterpret_cast<uintptr_t>(ctx));
  if (it != ContextDevice().end()) {
    used[it->second].fetch_sub(CostOf("FAKE_CUDA_CONTEXT_MIB"));
    ContextDevice().erase(it);
  }
  return CUDA_SUCCESS;
}
// The primary context: made at the first retain, gone at the last release.
FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (ctx == nullptr || d < 0 || d >= Devices()) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(ctx_mu);
  if (primary_refs[d] == 0 && !Charge(d, CostOf("FAKE_CUDA_CONTEXT_MIB")))
    return CUDA_ERROR_OUT_OF_MEMORY;
  ++primary_refs[d];
  *ctx = reinterpret_cast<CUcontext>(static_cast<uintptr_t>(0x100 + d));
  current_device = d;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  if (d < 0 || d >= Devices()) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(ctx_mu);
  if (primary_refs[d] > 0 && --primary_refs[d] == 0)
    used[d].fetch_sub(CostOf("FAKE_CUDA_CONTEXT_MIB"));
  return CUDA_SUCCESS;
}
// Modules: their code and data take FAKE_CUDA_MODULE_MIB on the current device until unloaded.
namespace {
std::map<uintptr_t, int>& ModuleDevice() {  // under ctx_mu
  static auto* m = new std::map<uintptr_t, int>();
  return *m;
}
}  // namespace
FAKE_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int d = current_device;
  if (!Charge(d, CostOf("FAKE_CUDA_MODULE_MIB"))) return CUDA_ERROR_OUT_OF_MEMORY;
  static std::atomic<uintptr_t> next{0x9000};
  const uintptr_t h = next.fetch_add(16);
  std::lock_guard lock(ctx_mu);
  ModuleDevice()[h] = d;
  *module = reinterpret_cast<CUmodule>(h);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int,
                                        CUjit_option*, void**) {
  return cuModuleLoadData(module, image);
}
FAKE_EXPORT CUresult cuModuleUnload(CUmodule module) {
  std::lock_guard lock(ctx_mu);
  auto it = ModuleDevice().find(reinterpret_cast<uintptr_t>(module));
  if (it == ModuleDevice().end()) return CUDA_ERROR_INVALID_VALUE;
  used[it->second].fetch_sub(CostOf("FAKE_CUDA_MODULE_MIB"));
  ModuleDevice().erase(it);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* path) {
  return path == nullptr ? CUDA_ERROR_INVALID_VALUE : cuModuleLoadData(module, path);
}
FAKE_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* image) {
  return cuModuleLoadData(module, image);
}
// Libraries (CUDA 12): loaded eagerly into the current device's context, FAKE_CUDA_MODULE_MIB
// like a module, until unloaded.
FAKE_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                                       unsigned int, CUlibraryOption*, void**, unsigned int) {
  if (library == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUmodule m = nullptr;
  const CUresult rc = cuModuleLoadData(&m, code);
  if (rc == CUDA_SUCCESS) *library = reinterpret_cast<CUlibrary>(m);
  return rc;
}
FAKE_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* path, CUjit_option* jit,
                                           void** jit_values, unsigned int jit_count,
                                           CUlibraryOption* options, void** values,
                                           unsigned int count) {
  return cuLibraryLoadData(library, path, jit, jit_values, jit_count, options, values, count);
}
FAKE_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  return cuModuleUnload(reinterpret_cast<CUmodule>(library));
}

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  if (d < 0 || d >= Devices()) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = MemoryPerDevice();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  *total = MemoryPerDevice();
  *free_bytes = MemoryPerDevice() - used[current_device].load();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  return Take(bytes, p);
}
FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* p, size_t* pitch, size_t width, size_t height,
                                        unsigned int) {
  if (p == nullptr || pitch == nullptr || width == 0 || height == 0)
    return CUDA_ERROR_INVALID_VALUE;
  *pitch = (width + 511) / 512 * 512;  // rows padded to 512 bytes
  return Take(*pitch * height, p);
}
FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* p, size_t bytes, unsigned int) {
  return bytes == 0 ? CUDA_ERROR_INVALID_VALUE : Take(bytes, p);
}

// Memory pools (the stream-ordered allocator behind cuMemAllocAsync and cudaMallocAsync), as the
// driver keeps them: a pool reserves device memory by 32 MiB chunks as its allocations need it and
// keeps what they free for reuse; at each synchronize it gives back what it holds beyond the larger
// of its use and its release threshold (default 0), and cuMemPoolTrimTo gives back what is unused
// above the amount asked to keep. Each device has a default pool, which is its current pool until
// cuDeviceSetMemPool names another.
namespace {
struct Pool {
  int device = 0;
  uint64_t reserved = 0, in_use = 0, threshold = 0;
  bool destroyed = false;  // destroyed with allocations outstanding: goes when the last is freed
};
std::map<uintptr_t, Pool>& Pools() {  // under mu
  static auto* m = new std::map<uintptr_t, Pool>();
  return *m;
}
std::unordered_map<uint64_t, std::pair<uint64_t, uintptr_t>>& PoolLive() {  // ptr -> bytes, pool
  static auto* m = new std::unordered_map<uint64_t, std::pair<uint64_t, uintptr_t>>();
  return *m;
}
std::atomic<uintptr_t> current_pool[16];  // 0: the default pool
uintptr_t DefaultPool(int device) { return 0xd0000 + 16 * static_cast<uintptr_t>(device); }
Pool* FindPool(uintptr_t h) {  // under mu; the default pools exist from the start
  auto it = Pools().find(h);
  if (it != Pools().end()) return it->second.destroyed ? nullptr : &it->second;
  for (int d = 0; d < Devices() && d < 16; ++d) {
    if (h == DefaultPool(d)) return &(Pools()[h] = Pool{d});
  }
  return nullptr;
}
void Shrink(Pool& p, uint64_t keep) {  // under mu
  if (keep < p.in_use) keep = p.in_use;
  if (p.reserved > keep) used[p.device].fetch_sub(p.reserved - keep), p.reserved = keep;
}
CUresult PoolTake(uintptr_t handle, uint64_t bytes, CUdeviceptr* out) {
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mu);
  Pool* p = FindPool(handle);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t idle = p->reserved - p->in_use;
  if (bytes > idle) {
    // By whole 32 MiB chunks, as a real pool grows (an H100's default pool held 512 MiB for 502
    // MiB of allocations).
    constexpr uint64_t kChunk = uint64_t{32} << 20;
    const uint64_t grow = (bytes - idle + kChunk - 1) / kChunk * kChunk;
    uint64_t cur = used[p->device].load();
    do {
      if (cur + grow > MemoryPerDevice()) return CUDA_ERROR_OUT_OF_MEMORY;
    } while (!used[p->device].compare_exchange_weak(cur, cur + grow));
    p->reserved += grow;
  }
  void* m = malloc(1);  // an address of its own; the pool's memory is counted, not touched
  if (m == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  p->in_use += bytes;
  PoolLive()[reinterpret_cast<uint64_t>(m)] = {bytes, handle};
  *out = reinterpret_cast<uint64_t>(m);
  return CUDA_SUCCESS;
}
// Frees a pool allocation (back into its pool); false when `ptr` is not one.
bool PoolGive(uint64_t ptr) {
  std::lock_guard lock(mu);
  auto it = PoolLive().find(ptr);
  if (it == PoolLive().end()) return false;
  auto [bytes, handle] = it->second;
  PoolLive().erase(it);
  free(reinterpret_cast<void*>(ptr));
  Pool& p = Pools()[handle];
  p.in_use -= bytes;
  if (p.destroyed && p.in_use == 0) {
    used[p.device].fetch_sub(p.reserved);
    Pools().erase(handle);
  }
  return true;
}
void ReleaseAtSync() {
  std::lock_guard lock(mu);
  for (auto& [h, p] : Pools()) {
    if (!p.destroyed) Shrink(p, p.threshold);
  }
}
}  // namespace

FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice d) {
  if (pool == nullptr || d < 0 || d >= Devices()) return CUDA_ERROR_INVALID_VALUE;
  *pool = reinterpret_cast<CUmemoryPool>(DefaultPool(d));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice d) {
  if (pool == nullptr || d < 0 || d >= Devices()) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t cur = current_pool[d].load();
  *pool = reinterpret_cast<CUmemoryPool>(cur ? cur : DefaultPool(d));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool) {
  std::lock_guard lock(mu);
  if (d < 0 || d >= Devices() || FindPool(reinterpret_cast<uintptr_t>(pool)) == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  current_pool[d] = reinterpret_cast<uintptr_t>(pool);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  if (pool == nullptr || props == nullptr || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      props->location.id < 0 || props->location.id >= Devices())
    return CUDA_ERROR_INVALID_VALUE;
  static std::atomic<uintptr_t> next{0xe0000};
  uintptr_t h = next.fetch_add(16);
  std::lock_guard lock(mu);
  Pools()[h] = Pool{props->location.id};
  *pool = reinterpret_cast<CUmemoryPool>(h);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  std::lock_guard lock(mu);
  const uintptr_t h = reinterpret_cast<uintptr_t>(pool);
  Pool* p = FindPool(h);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (h == DefaultPool(p->device)) return CUDA_ERROR_INVALID_VALUE;  // the driver's own
  if (current_pool[p->device].load() == h) current_pool[p->device] = 0;
  Shrink(*p, 0);
  if (p->in_use == 0) {
    Pools().erase(h);
  } else {
    p->destroyed = true;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  std::lock_guard lock(mu);
  Pool* p = FindPool(reinterpret_cast<uintptr_t>(pool));
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Shrink(*p, keep);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                           void* value) {
  std::lock_guard lock(mu);
  Pool* p = FindPool(reinterpret_cast<uintptr_t>(pool));
  if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  cuuint64_t v;
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      v = p->threshold;
      break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      v = p->reserved;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      v = p->in_use;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  *static_cast<cuuint64_t*>(value) = v;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                           void* value) {
  std::lock_guard lock(mu);
  Pool* p = FindPool(reinterpret_cast<uintptr_t>(pool));
  if (p == nullptr || value == nullptr || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    return CUDA_ERROR_INVALID_VALUE;
  p->threshold = *static_cast<cuuint64_t*>(value);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream) {
  const int d = current_device;
  const uintptr_t cur = current_pool[d].load();
  return PoolTake(cur ? cur : DefaultPool(d), bytes, p);
}
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t bytes, CUmemoryPool pool,
                                             CUstream) {
  return PoolTake(reinterpret_cast<uintptr_t>(pool), bytes, p);
}
// Pool memory may be freed either way (cuMemFree waits for the stream first).
FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return PoolGive(p) ? CUDA_SUCCESS : Give(p); }
FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream) {
  return PoolGive(p) ? CUDA_SUCCESS : Give(p);
}
FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t bytes,
                                 const CUmemAllocationProp*, unsigned long long) {
  return bytes == 0 ? CUDA_ERROR_INVALID_VALUE : Take(bytes, h);
}
// VMM as the driver has it: releasing a handle frees its memory only once its last mapping is
// gone ("the memory is released when all mappings are unmapped"); until then it is in use.
namespace {
std::atomic<uint64_t> next_va{0x7f0000000000ull};
std::map<uint64_t, std::pair<uint64_t, uint64_t>>& Mappings() {  // va -> (size, handle)
  static auto* m = new std::map<uint64_t, std::pair<uint64_t, uint64_t>>();
  return *m;
}
std::unordered_map<uint64_t, int>& MapCount() {  // handle -> mappings
  static auto* m = new std::unordered_map<uint64_t, int>();
  return *m;
}
std::set<uint64_t>& ReleasedMapped() {  // handles released while mapped
  static auto* m = new std::set<uint64_t>();
  return *m;
}
}  // namespace
FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  {
    std::lock_guard lock(mu);
    if (!Live().contains(h) || ReleasedMapped().contains(h)) return CUDA_ERROR_INVALID_VALUE;
    if (auto it = MapCount().find(h); it != MapCount().end() && it->second > 0) {
      ReleasedMapped().insert(h);
      return CUDA_SUCCESS;
    }
  }
  return Give(h);
}
// Sharing between processes. A descriptor export is a new open file of the handle's memfd each
// time, as the driver gives a new descriptor per export; a fabric handle is 64 bytes naming the
// memfd's inode and the size. An imported handle holds no memory of this process's own (the
// exporter's is the memory) and keeps its file open until released.
FAKE_EXPORT CUresult cuMemExportToShareableHandle(void* out, CUmemGenericAllocationHandle h,
                                                  int type, unsigned long long) {
  std::lock_guard lock(mu);
  auto it = Live().find(h);
  if (out == nullptr || it == Live().end()) return CUDA_ERROR_INVALID_VALUE;
  if (type != 1 && type != 8) return CUDA_ERROR_NOT_SUPPORTED;
  int& file = HandleFile()[h];
  if (file == 0) {
    file = memfd_create("fake-vmm", MFD_CLOEXEC);
    if (file < 0 || ftruncate(file, static_cast<off_t>(it->second.first)) != 0)
      return CUDA_ERROR_OUT_OF_MEMORY;
  }
  struct stat st;
  fstat(file, &st);
  if (type == 1) {
    const std::string self = "/proc/self/fd/" + std::to_string(file);
    *static_cast<int*>(out) = open(self.c_str(), O_RDWR | O_CLOEXEC);
  } else {
    uint64_t fabric[8] = {0x5242414642414b46ull /* "FAKEFABR" */, static_cast<uint64_t>(st.st_ino),
                          static_cast<uint64_t>(st.st_size)};
    memcpy(out, fabric, sizeof fabric);
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* h, void* os,
                                                    int type) {
  if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int file = -1;
  if (type == 1) {
    struct stat st;
    const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os));
    if (fstat(fd, &st) != 0 || st.st_size == 0) return CUDA_ERROR_INVALID_VALUE;
    file = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  } else if (type == 8) {
    uint64_t fabric[8];
    memcpy(fabric, os, sizeof fabric);
    if (fabric[0] != 0x5242414642414b46ull) return CUDA_ERROR_INVALID_VALUE;
  } else {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  void* key = malloc(1);
  std::lock_guard lock(mu);
  Live()[reinterpret_cast<uint64_t>(key)] = {0, current_device};
  if (file >= 0) HandleFile()[reinterpret_cast<uint64_t>(key)] = file;
  *h = reinterpret_cast<uint64_t>(key);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                            CUmemGenericAllocationHandle h) {
  std::lock_guard lock(mu);
  auto it = Live().find(h);
  if (prop == nullptr || it == Live().end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = CUmemAllocationProp{};
  prop->type = 1;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = it->second.second;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr,
                                         unsigned long long) {
  if (p == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  *p = next_va.fetch_add((size + 0xfffff) & ~0xfffffull);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr, size_t) { return CUDA_SUCCESS; }
FAKE_EXPORT CUresult cuMemMap(CUdeviceptr va, size_t size, size_t, CUmemGenericAllocationHandle h,
                              unsigned long long) {
  std::lock_guard lock(mu);
  if (!Live().contains(h) || ReleasedMapped().contains(h) || size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!Mappings().emplace(va, std::make_pair(static_cast<uint64_t>(size), h)).second)
    return CUDA_ERROR_INVALID_VALUE;  // already mapped there
  ++MapCount()[h];
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  std::vector<uint64_t> freed;
  {
    std::lock_guard lock(mu);
    auto it = Mappings().lower_bound(va);
    if (it == Mappings().end() || it->first >= va + size) return CUDA_ERROR_INVALID_VALUE;
    while (it != Mappings().end() && it->first < va + size) {
      const uint64_t h = it->second.second;
      if (--MapCount()[h] == 0) {
        MapCount().erase(h);
        if (ReleasedMapped().erase(h)) freed.push_back(h);
      }
      it = Mappings().erase(it);
    }
  }
  for (uint64_t h : freed) Give(h);
  return CUDA_SUCCESS;
}

namespace {
uint64_t ElementBytes(CUarray_format f) {
  return f == CU_AD_FORMAT_UNSIGNED_INT8 || f == CU_AD_FORMAT_SIGNED_INT8 ? 1
         : f == CU_AD_FORMAT_UNSIGNED_INT16 || f == CU_AD_FORMAT_SIGNED_INT16 ||
                 f == CU_AD_FORMAT_HALF
             ? 2
             : 4;
}
}  // namespace

FAKE_EXPORT CUresult cuArrayCreate_v2(CUarray* a, const CUDA_ARRAY_DESCRIPTOR* d) {
  if (a == nullptr || d == nullptr || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long key;
  CUresult rc =
      Take(d->Width * (d->Height ? d->Height : 1) * ElementBytes(d->Format) * d->NumChannels, &key);
  if (rc == CUDA_SUCCESS) *a = reinterpret_cast<CUarray>(key);
  return rc;
}
FAKE_EXPORT CUresult cuArray3DCreate_v2(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  if (a == nullptr || d == nullptr || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long key;
  CUresult rc = Take(d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
                         ElementBytes(d->Format) * d->NumChannels,
                     &key);
  if (rc == CUDA_SUCCESS) *a = reinterpret_cast<CUarray>(key);
  return rc;
}
FAKE_EXPORT CUresult cuArrayDestroy(CUarray a) { return Give(reinterpret_cast<uint64_t>(a)); }
FAKE_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* a, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                            unsigned int levels) {
  if (a == nullptr || d == nullptr || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t bytes = 0;
  size_t w = d->Width, h = d->Height, z = d->Depth;
  for (unsigned l = 0; l < (levels ? levels : 1); ++l) {
    bytes += w * (h ? h : 1) * (z ? z : 1) * ElementBytes(d->Format) * d->NumChannels;
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : h;
    z = z > 1 ? z / 2 : z;
  }
  unsigned long long key;
  CUresult rc = Take(bytes, &key);
  if (rc == CUDA_SUCCESS) *a = reinterpret_cast<CUmipmappedArray>(key);
  return rc;
}
FAKE_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
  return Give(reinterpret_cast<uint64_t>(a));
}

namespace {

struct VirtualClock {
  std::atomic<uint64_t> busy_until[16];  // ns, CLOCK_MONOTONIC
};

VirtualClock* Clock() {
  static VirtualClock* c = [] {
    const char* path = getenv("FAKE_CUDA_CLOCK");
    void* m = MAP_FAILED;
    if (path && *path) {
      int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd >= 0 && ftruncate(fd, sizeof(VirtualClock)) == 0) {  // zero-filled when new
        m = mmap(nullptr, sizeof(VirtualClock), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
      if (fd >= 0) close(fd);
    }
    if (m == MAP_FAILED) {
      m = mmap(nullptr, sizeof(VirtualClock), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
               -1, 0);
    }
    return static_cast<VirtualClock*>(m);
  }();
  return c;
}

// The GPU's clock: the host's, whatever time namespace the calling process is in (a real GPU's
// completion times do not move with a process's clock).
uint64_t NowNs() { return tessera::shim::HostMonotonicNs(); }

std::atomic<uint64_t> my_done[16];      // when this process's last kernel per device ends
std::atomic<uint64_t> my_kernel_ns{0};  // virtual GPU time this process has launched

CUresult Occupy(uint64_t us) {
  launches.fetch_add(1, std::memory_order_relaxed);
  const int dev = current_device;
  auto& busy = Clock()->busy_until[Visible()[dev]];
  const uint64_t now = NowNs();
  uint64_t b = busy.load();
  uint64_t end;
  do {
    end = (b > now ? b : now) + us * 1000;
  } while (!busy.compare_exchange_weak(b, end));
  uint64_t d = my_done[dev].load();
  while (d < end && !my_done[dev].compare_exchange_weak(d, end)) {
  }
  my_kernel_ns.fetch_add(us * 1000, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

// Stream capture, as the driver has it: launches on a capturing stream are recorded, not run; a
// synchronize or an event query while a capture in global mode is under way in the process is
// refused and invalidates it (what breaks PyTorch's CUDA graphs and vLLM's).
std::mutex capture_mu;
struct Capture {
  CUstreamCaptureMode mode = 0;
  bool invalidated = false;
  uint64_t kernels = 0;
};
std::map<CUstream, Capture> captures;

bool Recorded(CUstream s) {
  std::lock_guard lock(capture_mu);
  auto it = captures.find(s);
  if (it == captures.end()) return false;
  ++it->second.kernels;
  return true;
}

// Whether a synchronize is refused now (and the global captures invalidated).
bool SyncBreaksCapture() {
  std::lock_guard lock(capture_mu);
  bool broke = false;
  for (auto& [stream, c] : captures) {
    if (c.mode == 0) c.invalidated = broke = true;
  }
  return broke;
}

CUresult WaitMine() {
  if (SyncBreaksCapture()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  // The real driver spins while it waits (CU_CTX_SCHED_AUTO with fewer contexts than cores) and
  // returns within microseconds of the work's end; a sleep with the default 50 us timer slack
  // would make every synchronize cost a job tens of microseconds it does not lose on a GPU.
  static thread_local const bool precise = prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) == 0;
  (void)precise;
  const uint64_t done = my_done[current_device].load();
  for (uint64_t now = NowNs(); now < done; now = NowNs()) {
    uint64_t left = done - now;
    timespec t{static_cast<time_t>(left / 1000000000ull), static_cast<long>(left % 1000000000ull)};
    nanosleep(&t, nullptr);
  }
  ReleaseAtSync();
  return CUDA_SUCCESS;
}

}  // namespace

FAKE_EXPORT uint64_t fakeCudaKernelNs() { return my_kernel_ns.load(); }

FAKE_EXPORT CUresult cuLaunchKernel(CUfunction, unsigned int gx, unsigned int, unsigned int,
                                    unsigned int, unsigned int, unsigned int, unsigned int,
                                    CUstream stream, void**, void**) {
  if (MpsLost()) return kMpsConnectionFailed;
  if (gx == kFaultingGrid) {
    if (mps_fd >= 0) (void)!send(mps_fd, "fault\n", 6, MSG_NOSIGNAL);
    return kIllegalAddress;
  }
  return Recorded(stream) ? CUDA_SUCCESS : Occupy(gx);
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  std::lock_guard lock(capture_mu);
  if (captures.contains(stream)) return CUDA_ERROR_ILLEGAL_STATE;
  captures[stream] = Capture{mode};
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  std::lock_guard lock(capture_mu);
  auto it = captures.find(stream);
  if (it == captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
  const Capture c = it->second;
  captures.erase(it);
  if (c.invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (graph) *graph = reinterpret_cast<CUgraph>(static_cast<uintptr_t>(c.kernels + 1));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  std::lock_guard lock(capture_mu);
  auto it = captures.find(stream);
  if (status) *status = it == captures.end() ? 0 : it->second.invalidated ? 2 : 1;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction, void**, void**) {
  return config == nullptr ? CUDA_ERROR_INVALID_VALUE : Occupy(config->gridDimX);
}
FAKE_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction, unsigned int gx, unsigned int,
                                               unsigned int, unsigned int, unsigned int,
                                               unsigned int, unsigned int, CUstream, void**) {
  return Occupy(gx);
}
// CUDA graphs with memory nodes, as the driver has them: a graph is its nodes (allocation nodes
// with their size and device, empty nodes); an instantiated graph knows what it allocates on each
// device; launching it makes the device's graph memory pool hold at least that much device memory,
// kept for the next launches until cuDeviceGraphMemTrim gives it back (here every launch is done
// at once, so all of it). A graph from a stream capture has no nodes.
namespace {
struct FakeNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  uint64_t bytes = 0;
  int device = 0;
  CUdeviceptr dptr = 0;
};
struct FakeGraph {
  std::vector<FakeNode*> nodes;
};
std::mutex graph_mu;
std::set<FakeGraph*> graphs;                           // made by cuGraphCreate
std::map<CUgraphExec, std::map<int, uint64_t>> execs;  // instantiated: bytes per device
uint64_t graph_reserved[16], graph_reserved_high[16];  // the graph memory pools
uint64_t next_graph_address = 0x7f0000000000ull;

// `bytes` of device `dev`'s memory, or false when it does not have them.
bool TakeOn(int dev, uint64_t bytes) {
  uint64_t cur = used[dev].load();
  do {
    if (cur + bytes > MemoryPerDevice()) return false;
  } while (!used[dev].compare_exchange_weak(cur, cur + bytes));
  return true;
}
}  // namespace

FAKE_EXPORT CUresult cuGraphCreate(CUgraph* graph, unsigned int) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* g = new FakeGraph;
  std::lock_guard lock(graph_mu);
  graphs.insert(g);
  *graph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
  std::lock_guard lock(graph_mu);
  auto* g = reinterpret_cast<FakeGraph*>(graph);
  if (!graphs.erase(g)) return CUDA_SUCCESS;  // a captured graph: nothing of it kept
  for (FakeNode* n : g->nodes) delete n;
  delete g;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode* node, CUgraph graph, const CUgraphNode*,
                                         size_t) {
  std::lock_guard lock(graph_mu);
  auto* g = reinterpret_cast<FakeGraph*>(graph);
  if (node == nullptr || !graphs.contains(g)) return CUDA_ERROR_INVALID_VALUE;
  g->nodes.push_back(new FakeNode{});
  *node = reinterpret_cast<CUgraphNode>(g->nodes.back());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph graph, const CUgraphNode*,
                                            size_t, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  std::lock_guard lock(graph_mu);
  auto* g = reinterpret_cast<FakeGraph*>(graph);
  if (node == nullptr || params == nullptr || params->bytesize == 0 || !graphs.contains(g) ||
      params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      params->poolProps.location.id < 0 || params->poolProps.location.id >= Devices()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  params->dptr = next_graph_address;
  next_graph_address += (params->bytesize + 0xfffff) & ~0xfffffull;
  g->nodes.push_back(new FakeNode{CU_GRAPH_NODE_TYPE_MEM_ALLOC, params->bytesize,
                                  params->poolProps.location.id, params->dptr});
  *node = reinterpret_cast<CUgraphNode>(g->nodes.back());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode* nodes, size_t* count) {
  std::lock_guard lock(graph_mu);
  auto* g = reinterpret_cast<FakeGraph*>(graph);
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const size_t n = graphs.contains(g) ? g->nodes.size() : 0;
  if (nodes != nullptr) {
    for (size_t i = 0; i < *count; ++i)
      nodes[i] = i < n ? reinterpret_cast<CUgraphNode>(g->nodes[i]) : nullptr;
  }
  *count = n;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType* type) {
  if (node == nullptr || type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = reinterpret_cast<FakeNode*>(node)->type;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node,
                                                  CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  auto* n = reinterpret_cast<FakeNode*>(node);
  if (n == nullptr || params == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
    return CUDA_ERROR_INVALID_VALUE;
  *params = CUDA_MEM_ALLOC_NODE_PARAMS{};
  params->poolProps.location = CUmemLocation{CU_MEM_LOCATION_TYPE_DEVICE, n->device};
  params->bytesize = n->bytes;
  params->dptr = n->dptr;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                                 unsigned long long) {
  if (exec == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mu);
  std::map<int, uint64_t> bytes;
  if (auto* g = reinterpret_cast<FakeGraph*>(graph); graphs.contains(g)) {
    for (const FakeNode* n : g->nodes) {
      if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) bytes[n->device] += n->bytes;
    }
  }
  *exec = reinterpret_cast<CUgraphExec>(new char);
  execs[*exec] = std::move(bytes);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  std::lock_guard lock(graph_mu);
  if (execs.erase(exec)) delete reinterpret_cast<char*>(exec);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr,
                                                  void* value) {
  if (dev < 0 || dev >= Devices() || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mu);
  cuuint64_t v = 0;
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
      v = graph_reserved[dev];
      break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      v = graph_reserved_high[dev];
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  *static_cast<cuuint64_t*>(value) = v;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
  if (dev < 0 || dev >= Devices()) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(graph_mu);
  used[dev] -= graph_reserved[dev];
  graph_reserved[dev] = 0;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream) {
  {
    // Its allocations: the graph memory pool grows to hold them (out of memory when the device
    // cannot).
    std::lock_guard lock(graph_mu);
    auto it = execs.find(exec);
    if (it != execs.end()) {
      for (const auto& [dev, bytes] : it->second) {
        if (bytes <= graph_reserved[dev]) continue;
        if (!TakeOn(dev, bytes - graph_reserved[dev])) return CUDA_ERROR_OUT_OF_MEMORY;
        graph_reserved[dev] = bytes;
        graph_reserved_high[dev] = std::max(graph_reserved_high[dev], bytes);
      }
    }
  }
  const char* e = getenv("FAKE_CUDA_GRAPH_US");
  return Occupy(e ? strtoull(e, nullptr, 10) : 1000);
}
FAKE_EXPORT CUresult cuCtxSynchronize() { return WaitMine(); }
FAKE_EXPORT CUresult cuStreamSynchronize(CUstream) { return WaitMine(); }
FAKE_EXPORT CUresult cuEventSynchronize(CUevent) { return WaitMine(); }

// What the GPU check (tessera-gpu-check) needs beside the rest: a device name, streams, kernels by
// name (any name: a kernel is its gridDimX in us here), and timing events. An event records when
// this process's work queued so far on the device will be done on the virtual clock, as a real
// event completes after the work before it; elapsed times are the differences.
FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (name == nullptr || len <= 0 || dev < 0 || dev >= Devices()) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, static_cast<size_t>(len), "Fake GPU %d", dev);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  if (f == nullptr || m == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *f = reinterpret_cast<CUfunction>(m);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamCreate(CUstream* s, unsigned) {
  static std::atomic<uintptr_t> next{0x1000};
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *s = reinterpret_cast<CUstream>(next.fetch_add(1));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventCreate(CUevent* e, unsigned) {
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *e = reinterpret_cast<CUevent>(new std::atomic<uint64_t>(0));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  delete reinterpret_cast<std::atomic<uint64_t>*>(e);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventRecord(CUevent e, CUstream) {
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  reinterpret_cast<std::atomic<uint64_t>*>(e)->store(
      std::max(my_done[current_device].load(), NowNs()));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventQuery(CUevent e) {
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // As the driver: a query is one of the calls a capture in the global mode forbids.
  if (SyncBreaksCapture()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return NowNs() >= reinterpret_cast<std::atomic<uint64_t>*>(e)->load() ? CUDA_SUCCESS
                                                                        : 600;  // NOT_READY
}
FAKE_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent from, CUevent to) {
  if (ms == nullptr || from == nullptr || to == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto a = reinterpret_cast<std::atomic<uint64_t>*>(from)->load();
  const auto b = reinterpret_cast<std::atomic<uint64_t>*>(to)->load();
  *ms = static_cast<float>((static_cast<double>(b) - static_cast<double>(a)) / 1e6);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGetErrorString(CUresult rc, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = rc == CUDA_SUCCESS               ? "no error"
          : rc == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory"
                                           : "error";
  return CUDA_SUCCESS;
}

// The per-thread default stream variants: their own entry points (as in the real driver), the same
// work here.
FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* p, size_t n, CUstream s) {
  return cuMemAllocAsync(p, n, s);
}
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* p, size_t n, CUmemoryPool pool,
                                                  CUstream s) {
  return cuMemAllocFromPoolAsync(p, n, pool, s);
}
FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
FAKE_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                         unsigned int gz, unsigned int bx, unsigned int by,
                                         unsigned int bz, unsigned int shared, CUstream s,
                                         void** params, void** extra) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}
FAKE_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* c, CUfunction f, void** params,
                                           void** extra) {
  return cuLaunchKernelEx(c, f, params, extra);
}
FAKE_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                                    unsigned int gz, unsigned int bx,
                                                    unsigned int by, unsigned int bz,
                                                    unsigned int shared, CUstream s,
                                                    void** params) {
  return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, s, params);
}
FAKE_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return cuGraphLaunch(g, s); }
FAKE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
FAKE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) {
  return cuStreamBeginCapture_v2(s, m);
}
FAKE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) {
  return cuStreamEndCapture(s, g);
}

// This library's own entry point of an exported name - not whatever another library (the intercept
// library) exports of the same name - for tests that check nobody hands it out; nullptr: none.
FAKE_EXPORT void* fakeCudaOwnSymbol(const char* name) {
  static const std::unordered_map<std::string, void*> kOwn = {
      {"cuMemAlloc_v2", (void*)&cuMemAlloc_v2},
      {"cuMemAllocPitch_v2", (void*)&cuMemAllocPitch_v2},
      {"cuMemAllocManaged", (void*)&cuMemAllocManaged},
      {"cuMemAllocAsync", (void*)&cuMemAllocAsync},
      {"cuMemAllocAsync_ptsz", (void*)&cuMemAllocAsync_ptsz},
      {"cuMemAllocFromPoolAsync", (void*)&cuMemAllocFromPoolAsync},
      {"cuMemAllocFromPoolAsync_ptsz", (void*)&cuMemAllocFromPoolAsync_ptsz},
      {"cuMemFree_v2", (void*)&cuMemFree_v2},
      {"cuMemFreeAsync", (void*)&cuMemFreeAsync},
      {"cuMemFreeAsync_ptsz", (void*)&cuMemFreeAsync_ptsz},
      {"cuMemCreate", (void*)&cuMemCreate},
      {"cuMemExportToShareableHandle", (void*)&cuMemExportToShareableHandle},
      {"cuMemImportFromShareableHandle", (void*)&cuMemImportFromShareableHandle},
      {"cuMemGetAllocationPropertiesFromHandle", (void*)&cuMemGetAllocationPropertiesFromHandle},
      {"cuMemRelease", (void*)&cuMemRelease},
      {"cuMemMap", (void*)&cuMemMap},
      {"cuMemUnmap", (void*)&cuMemUnmap},
      {"cuArrayCreate_v2", (void*)&cuArrayCreate_v2},
      {"cuArray3DCreate_v2", (void*)&cuArray3DCreate_v2},
      {"cuArrayDestroy", (void*)&cuArrayDestroy},
      {"cuMipmappedArrayCreate", (void*)&cuMipmappedArrayCreate},
      {"cuMipmappedArrayDestroy", (void*)&cuMipmappedArrayDestroy},
      {"cuMemGetInfo_v2", (void*)&cuMemGetInfo_v2},
      {"cuCtxCreate_v2", (void*)&cuCtxCreate_v2},
      {"cuCtxCreate_v3", (void*)&cuCtxCreate_v3},
      {"cuCtxCreate_v4", (void*)&cuCtxCreate_v4},
      {"cuCtxDestroy_v2", (void*)&cuCtxDestroy_v2},
      {"cuDevicePrimaryCtxRetain", (void*)&cuDevicePrimaryCtxRetain},
      {"cuDevicePrimaryCtxRelease_v2", (void*)&cuDevicePrimaryCtxRelease_v2},
      {"cuDeviceTotalMem_v2", (void*)&cuDeviceTotalMem_v2},
      {"cuLaunchKernel", (void*)&cuLaunchKernel},
      {"cuLaunchKernel_ptsz", (void*)&cuLaunchKernel_ptsz},
      {"cuLaunchKernelEx", (void*)&cuLaunchKernelEx},
      {"cuLaunchKernelEx_ptsz", (void*)&cuLaunchKernelEx_ptsz},
      {"cuLaunchCooperativeKernel", (void*)&cuLaunchCooperativeKernel},
      {"cuLaunchCooperativeKernel_ptsz", (void*)&cuLaunchCooperativeKernel_ptsz},
      {"cuGraphLaunch", (void*)&cuGraphLaunch},
      {"cuGraphLaunch_ptsz", (void*)&cuGraphLaunch_ptsz},
      {"cuStreamBeginCapture_v2", (void*)&cuStreamBeginCapture_v2},
      {"cuStreamBeginCapture_v2_ptsz", (void*)&cuStreamBeginCapture_v2_ptsz},
      {"cuStreamEndCapture", (void*)&cuStreamEndCapture},
      {"cuStreamEndCapture_ptsz", (void*)&cuStreamEndCapture_ptsz},
      {"cuCtxSynchronize", (void*)&cuCtxSynchronize},
      {"cuStreamSynchronize", (void*)&cuStreamSynchronize},
      {"cuStreamSynchronize_ptsz", (void*)&cuStreamSynchronize_ptsz},
      {"cuEventSynchronize", (void*)&cuEventSynchronize},
      {"cuMemPoolCreate", (void*)&cuMemPoolCreate},
      {"cuMemPoolDestroy", (void*)&cuMemPoolDestroy},
      {"cuMemPoolTrimTo", (void*)&cuMemPoolTrimTo},
      {"cuModuleLoadData", (void*)&cuModuleLoadData},
      {"cuModuleLoadDataEx", (void*)&cuModuleLoadDataEx},
      {"cuModuleUnload", (void*)&cuModuleUnload},
      {"cuModuleLoad", (void*)&cuModuleLoad},
      {"cuModuleLoadFatBinary", (void*)&cuModuleLoadFatBinary},
      {"cuLibraryLoadData", (void*)&cuLibraryLoadData},
      {"cuLibraryLoadFromFile", (void*)&cuLibraryLoadFromFile},
      {"cuLibraryUnload", (void*)&cuLibraryUnload},
      {"cuGraphInstantiateWithFlags", (void*)&cuGraphInstantiateWithFlags},
      {"cuDeviceGraphMemTrim", (void*)&cuDeviceGraphMemTrim},
  };
  auto it = name ? kOwn.find(name) : kOwn.end();
  return it == kOwn.end() ? nullptr : it->second;
}

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t,
                                         CUdriverProcAddressQueryResult*);

namespace {
// Base name -> entry point, as the driver resolves it for CUDA 12 callers (the _v2 versions), the
// per-thread default stream variant when asked with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.
void* Lookup(const std::string& name, int version, cuuint64_t flags) {
  static const std::unordered_map<std::string, void*> kPerThread = {
      {"cuMemAllocAsync", (void*)&cuMemAllocAsync_ptsz},
      {"cuMemAllocFromPoolAsync", (void*)&cuMemAllocFromPoolAsync_ptsz},
      {"cuMemFreeAsync", (void*)&cuMemFreeAsync_ptsz},
      {"cuLaunchKernel", (void*)&cuLaunchKernel_ptsz},
      {"cuLaunchKernelEx", (void*)&cuLaunchKernelEx_ptsz},
      {"cuLaunchCooperativeKernel", (void*)&cuLaunchCooperativeKernel_ptsz},
      {"cuGraphLaunch", (void*)&cuGraphLaunch_ptsz},
      {"cuStreamSynchronize", (void*)&cuStreamSynchronize_ptsz},
      {"cuStreamBeginCapture", (void*)&cuStreamBeginCapture_v2_ptsz},
      {"cuStreamEndCapture", (void*)&cuStreamEndCapture_ptsz},
  };
  // FAKE_CUDA_SHARED_PTSZ=1: a driver whose per-thread variants share the legacy entry point's
  // address (one implementation reading the flag): asked with the per-thread flag, it answers the
  // legacy address. An interceptor that maps answers by address alone hands out the wrong hook.
  static const bool shared_ptsz = getenv("FAKE_CUDA_SHARED_PTSZ") != nullptr;
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && !shared_ptsz) {
    if (auto it = kPerThread.find(name); it != kPerThread.end() && version >= 3020)
      return it->second;
  }
  static const std::unordered_map<std::string, void*> kTable = {
      {"cuInit", (void*)&cuInit},
      {"cuDriverGetVersion", (void*)&cuDriverGetVersion},
      {"cuGetExportTable", (void*)&cuGetExportTable},
      {"cuDeviceGetCount", (void*)&cuDeviceGetCount},
      {"cuDeviceGet", (void*)&cuDeviceGet},
      {"cuCtxGetDevice", (void*)&cuCtxGetDevice},
      {"cuCtxCreate", (void*)&cuCtxCreate_v2},
      {"cuCtxDestroy", (void*)&cuCtxDestroy_v2},
      {"cuDevicePrimaryCtxRetain", (void*)&cuDevicePrimaryCtxRetain},
      {"cuDevicePrimaryCtxRelease", (void*)&cuDevicePrimaryCtxRelease_v2},
      {"cuDeviceTotalMem", (void*)&cuDeviceTotalMem_v2},
      {"cuMemGetInfo", (void*)&cuMemGetInfo_v2},
      {"cuMemAlloc", (void*)&cuMemAlloc_v2},
      {"cuMemAllocPitch", (void*)&cuMemAllocPitch_v2},
      {"cuMemAllocManaged", (void*)&cuMemAllocManaged},
      {"cuMemAllocAsync", (void*)&cuMemAllocAsync},
      {"cuMemAllocFromPoolAsync", (void*)&cuMemAllocFromPoolAsync},
      {"cuMemFree", (void*)&cuMemFree_v2},
      {"cuMemFreeAsync", (void*)&cuMemFreeAsync},
      {"cuMemCreate", (void*)&cuMemCreate},
      {"cuMemExportToShareableHandle", (void*)&cuMemExportToShareableHandle},
      {"cuMemImportFromShareableHandle", (void*)&cuMemImportFromShareableHandle},
      {"cuMemGetAllocationPropertiesFromHandle", (void*)&cuMemGetAllocationPropertiesFromHandle},
      {"cuMemRelease", (void*)&cuMemRelease},
      {"cuMemAddressReserve", (void*)&cuMemAddressReserve},
      {"cuMemAddressFree", (void*)&cuMemAddressFree},
      {"cuMemMap", (void*)&cuMemMap},
      {"cuMemUnmap", (void*)&cuMemUnmap},
      {"cuArrayCreate", (void*)&cuArrayCreate_v2},
      {"cuArray3DCreate", (void*)&cuArray3DCreate_v2},
      {"cuArrayDestroy", (void*)&cuArrayDestroy},
      {"cuMipmappedArrayCreate", (void*)&cuMipmappedArrayCreate},
      {"cuMipmappedArrayDestroy", (void*)&cuMipmappedArrayDestroy},
      {"cuLaunchKernel", (void*)&cuLaunchKernel},
      {"cuLaunchKernelEx", (void*)&cuLaunchKernelEx},
      {"cuLaunchCooperativeKernel", (void*)&cuLaunchCooperativeKernel},
      {"cuGraphLaunch", (void*)&cuGraphLaunch},
      {"cuStreamBeginCapture", (void*)&cuStreamBeginCapture_v2},
      {"cuStreamEndCapture", (void*)&cuStreamEndCapture},
      {"cuStreamIsCapturing", (void*)&cuStreamIsCapturing},
      {"cuCtxSynchronize", (void*)&cuCtxSynchronize},
      {"cuStreamSynchronize", (void*)&cuStreamSynchronize},
      {"cuEventSynchronize", (void*)&cuEventSynchronize},
      {"cuGetProcAddress", (void*)&cuGetProcAddress_v2},
      {"cuDeviceGetDefaultMemPool", (void*)&cuDeviceGetDefaultMemPool},
      {"cuDeviceGetMemPool", (void*)&cuDeviceGetMemPool},
      {"cuDeviceSetMemPool", (void*)&cuDeviceSetMemPool},
      {"cuMemPoolCreate", (void*)&cuMemPoolCreate},
      {"cuMemPoolDestroy", (void*)&cuMemPoolDestroy},
      {"cuMemPoolTrimTo", (void*)&cuMemPoolTrimTo},
      {"cuMemPoolGetAttribute", (void*)&cuMemPoolGetAttribute},
      {"cuMemPoolSetAttribute", (void*)&cuMemPoolSetAttribute},
      {"cuModuleLoadData", (void*)&cuModuleLoadData},
      {"cuModuleLoadDataEx", (void*)&cuModuleLoadDataEx},
      {"cuModuleUnload", (void*)&cuModuleUnload},
      {"cuModuleLoad", (void*)&cuModuleLoad},
      {"cuModuleLoadFatBinary", (void*)&cuModuleLoadFatBinary},
      {"cuLibraryLoadData", (void*)&cuLibraryLoadData},
      {"cuLibraryLoadFromFile", (void*)&cuLibraryLoadFromFile},
      {"cuLibraryUnload", (void*)&cuLibraryUnload},
      {"cuGraphCreate", (void*)&cuGraphCreate},
      {"cuGraphDestroy", (void*)&cuGraphDestroy},
      {"cuGraphAddEmptyNode", (void*)&cuGraphAddEmptyNode},
      {"cuGraphAddMemAllocNode", (void*)&cuGraphAddMemAllocNode},
      {"cuGraphGetNodes", (void*)&cuGraphGetNodes},
      {"cuGraphNodeGetType", (void*)&cuGraphNodeGetType},
      {"cuGraphMemAllocNodeGetParams", (void*)&cuGraphMemAllocNodeGetParams},
      {"cuGraphInstantiateWithFlags", (void*)&cuGraphInstantiateWithFlags},
      {"cuGraphInstantiate", (void*)&cuGraphInstantiateWithFlags},
      {"cuGraphExecDestroy", (void*)&cuGraphExecDestroy},
      {"cuDeviceGetGraphMemAttribute", (void*)&cuDeviceGetGraphMemAttribute},
      {"cuDeviceGraphMemTrim", (void*)&cuDeviceGraphMemTrim},
  };
  auto it = kTable.find(name);
  return it == kTable.end() || version < 3020 ? nullptr : it->second;
}
}  // namespace

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = Lookup(symbol, version, flags);
  if (status) *status = *pfn ? 0 : 1;
  return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                      cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}
