// libtessera-cuda.so: how a hook stays hooked however it is reached: the driver's entry points
// mapped to the hooks by address (Redirect) and by name and version (cuGetProcAddress, the table of
// every hook), and dlsym, which also keeps RTLD_NEXT right for interposers loaded after this one
// and refuses a second copy of the driver.
#include "tessera/shim/hooks.h"

using namespace tessera::shim;  // NOLINT: the hooks are C entry points over the shared state

namespace tessera::shim {

// A real entry point -> our hook for it; anything else unchanged.
void* Redirect(void* fn) {
  if (fn == nullptr) return fn;
#define TESSERA_REDIRECT(name) \
  if (fn == reinterpret_cast<void*>(real.name)) return reinterpret_cast<void*>(&::name);
  TESSERA_HOOKED(TESSERA_REDIRECT)
#undef TESSERA_REDIRECT
  return fn;
}

}  // namespace tessera::shim

namespace tessera::shim {

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
    TESSERA_NAMED("cuMemMap", 10020, 1 << 30, cuMemMap, nullptr, nullptr),
    TESSERA_NAMED("cuMemUnmap", 10020, 1 << 30, cuMemUnmap, nullptr, nullptr),
    TESSERA_NAMED("cuMemExportToShareableHandle", 10020, 1 << 30, cuMemExportToShareableHandle,
                  nullptr, nullptr),
    TESSERA_NAMED("cuMemImportFromShareableHandle", 10020, 1 << 30, cuMemImportFromShareableHandle,
                  nullptr, nullptr),
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

}  // namespace tessera::shim

// dlsym is hooked so that a program (or the CUDA runtime) that dlopens libcuda.so.1 and looks entry
// points up by name gets our hooks too.
namespace tessera::shim {
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

// Whether the object `m` is a CUDA driver, by what it is rather than its file's name (a copy
// renamed libnvcuda-x.so is one too): it defines the entry points only a driver does - cuInit,
// cuDriverGetVersion and cuGetExportTable (the runtime's private tables) - itself, not through a
// dependency. A tracer or other interposer that wraps a few cu* calls defines no
// cuGetExportTable.
bool IsCudaDriver(const link_map* m) {
  if (m->l_name == nullptr || m->l_name[0] == 0) return false;  // the program itself
  void* h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return false;
  DlsymFn sym = RealDlsym();
  bool all = sym != nullptr;
  for (const char* name : {"cuInit", "cuDriverGetVersion", "cuGetExportTable"}) {
    if (!all) break;
    void* f = sym(h, name);
    Dl_info info;
    link_map* in = nullptr;
    all = f != nullptr && dladdr1(f, &info, reinterpret_cast<void**>(&in), RTLD_DL_LINKMAP) != 0 &&
          in == m;
  }
  dlclose(h);
  return all;
}

// Whether `fn` lies in another copy of the CUDA driver than the hooked one: a driver's file
// loaded from another path, under any name (another object with its own state), which the hooks
// would not see. Said once.
bool InAnotherDriverCopy(void* fn) {
  Dl_info info;
  link_map* m = nullptr;
  if (dladdr1(fn, &info, reinterpret_cast<void**>(&m), RTLD_DL_LINKMAP) == 0 || m == nullptr ||
      m == DriverMap() || m->l_name == nullptr) {
    return false;
  }
  if (!IsCudaDriver(m)) return false;
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    fprintf(stderr,
            "tessera-cuda: %s is another copy of the CUDA driver than the one this job's limits "
            "hold on; its entry points are refused\n",
            m->l_name);
  }
  return true;
}
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
