// libtessera-cuda.so: contexts (created, primary, destroyed: each context's overhead counted while
// it lives) and module and library loads (their code's memory, measured).
#include "tessera/shim/hooks.h"

using namespace tessera::shim;  // NOLINT: the hooks are C entry points over the shared state

namespace tessera::shim {

// Each context costs its own overhead on its device (its local memory, printf and launch
// buffers): every created context, and the device's primary context once while it is retained
// (the driver hands the same one to every retain). Charged against the job's limit while it lives.
// (Before, once per device: 5 contexts took 2,200 MiB under a 1 GiB limit in a container.)
// The configured overhead is the fallback of a launcher that expects the driver's own figure to
// be out of reach (a container): once this process is measured (Reconcile, by its pid or the
// host pid a probe found), the fixed charges are given back and the measure alone counts.
std::atomic<int> primary_retains[kMaxDevices];
std::atomic<uint64_t> fixed_charged[kMaxDevices];  // configured overheads charged, per device
std::atomic<bool> measured_exactly{false};

bool TakeContext(int device, bool primary) {
  if (device < 0 || device >= kMaxDevices) return true;
  contexts_on[device].fetch_add(1);
  const bool first_retain = primary && primary_retains[device].fetch_add(1) == 0;
  if (context_overhead > 0 && !measured_exactly.load() && (!primary || first_retain)) {
    if (!Reserve(device, context_overhead)) {
      contexts_on[device].fetch_sub(1);
      if (primary) primary_retains[device].fetch_sub(1);
      return false;
    }
    fixed_charged[device].fetch_add(context_overhead);
  }
  return true;
}

void DropContext(int device, bool primary) {
  if (device < 0 || device >= kMaxDevices) return;
  auto down = [](std::atomic<int>& n) {
    int before = n.load();
    while (before > 0 && !n.compare_exchange_weak(before, before - 1)) {
    }
    return before;
  };
  down(contexts_on[device]);
  const bool last_retain = primary && down(primary_retains[device]) == 1;
  if (context_overhead == 0 || (primary && !last_retain)) return;
  // Its fixed charge, if it still has one (none once measured).
  uint64_t charged = fixed_charged[device].load(), give = 0;
  do {
    give = charged < context_overhead ? charged : context_overhead;
  } while (!fixed_charged[device].compare_exchange_weak(charged, charged - give));
  if (give > 0) region->Release(device, give);
}

void ForgetFixedOverheads() {
  for (auto& c : fixed_charged) c.store(0);
  measured_exactly.store(false);
}

void DropFixedOverheads() {
  if (measured_exactly.exchange(true)) return;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (const uint64_t charged = fixed_charged[d].exchange(0); charged > 0)
      region->Release(d, charged);
  }
}

std::mutex context_mu;
std::unordered_map<CUcontext, int>* context_device = nullptr;  // created contexts -> device

}  // namespace tessera::shim

namespace {
// A context created on `device` by `create` (whichever cuCtxCreate version): its overhead counted
// while it lives.
template <typename Create>
CUresult CountedContext(CUcontext* ctx, CUdevice device, Create create) {
  if (!TakeContext(device, false)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = create();
  if (rc != CUDA_SUCCESS) {
    DropContext(device, false);
    return rc;
  }
  if (!Reconcile(device)) {  // its memory does not fit the job's limit
    real.cuCtxDestroy_v2(*ctx);
    DropContext(device, false);
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
    DropContext(device, false);
    if (device >= 0) Reconcile(device);
  }
  return rc;
}

TESSERA_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  if (!Ready() || real.cuDevicePrimaryCtxRetain == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!TakeContext(device, true)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = real.cuDevicePrimaryCtxRetain(ctx, device);
  if (rc != CUDA_SUCCESS) {
    DropContext(device, true);
  } else if (!Reconcile(device)) {
    real.cuDevicePrimaryCtxRelease_v2(device);
    DropContext(device, true);
    Reconcile(device);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return rc;
}

TESSERA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  if (!Ready() || real.cuDevicePrimaryCtxRelease_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuDevicePrimaryCtxRelease_v2(device);
  if (rc == CUDA_SUCCESS) {
    DropContext(device, true);
    Reconcile(device);
  }
  return rc;
}

namespace {
// A module's code and data live in device memory: measured like a context's (Reconcile); one that
// does not fit the job's limit is unloaded again and refused.
CUresult CountedModule(CUresult rc, CUmodule* module) {
  if (rc != CUDA_SUCCESS || module == nullptr) return rc;
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
  if (rc == CUDA_SUCCESS) Reconcile(CurrentDevice());
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
  if (rc != CUDA_SUCCESS || library == nullptr) return rc;
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
  if (rc == CUDA_SUCCESS) ReconcileContextDevices();
  return rc;
}
