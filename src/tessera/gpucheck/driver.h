#pragma once
// The real CUDA driver and NVML as the GPU check reaches them: loaded at run time (dlopen), entry
// points found with dlsym - the route the intercept library hooks when it is preloaded - and the
// check's kernels as PTX, JIT-compiled by the driver (no nvcc needed). Not thread-safe: one thread
// of a check's process uses it.

#include <cstdint>
#include <string>

#include "tessera/devices/nvml_abi.h"
#include "tessera/shim/cuda_abi.h"

namespace tessera::gpucheck {

// The driver API entry points the check calls, resolved by name.
struct Driver {
  void* handle = nullptr;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  cuDeviceTotalMem_v2_fn cuDeviceTotalMem_v2 = nullptr;
  cuDevicePrimaryCtxRetain_fn cuDevicePrimaryCtxRetain = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  cuCtxSynchronize_fn cuCtxSynchronize = nullptr;
  cuModuleLoadData_fn cuModuleLoadData = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  cuModuleUnload_fn cuModuleUnload = nullptr;
  cuLaunchKernel_fn cuLaunchKernel = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  cuStreamSynchronize_fn cuStreamSynchronize = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  cuEventSynchronize_fn cuEventSynchronize = nullptr;
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;
  cuMemAlloc_v2_fn cuMemAlloc_v2 = nullptr;
  cuMemFree_v2_fn cuMemFree_v2 = nullptr;
  cuMemAllocAsync_fn cuMemAllocAsync = nullptr;
  cuMemFreeAsync_fn cuMemFreeAsync = nullptr;
  cuMemGetInfo_v2_fn cuMemGetInfo_v2 = nullptr;
  cuStreamBeginCapture_v2_fn cuStreamBeginCapture_v2 = nullptr;
  cuStreamEndCapture_fn cuStreamEndCapture = nullptr;
  cuGraphInstantiateWithFlags_fn cuGraphInstantiateWithFlags = nullptr;
  cuGraphLaunch_fn cuGraphLaunch = nullptr;
  // Virtual memory management (NVIDIA's memmap sample's calls).
  cuMemCreate_fn cuMemCreate = nullptr;
  cuMemRelease_fn cuMemRelease = nullptr;
  cuMemAddressReserve_fn cuMemAddressReserve = nullptr;
  cuMemAddressFree_fn cuMemAddressFree = nullptr;
  cuMemMap_fn cuMemMap = nullptr;
  cuMemUnmap_fn cuMemUnmap = nullptr;
  // Shared between processes (optional: older drivers lack them).
  cuMemExportToShareableHandle_fn cuMemExportToShareableHandle = nullptr;
  cuMemImportFromShareableHandle_fn cuMemImportFromShareableHandle = nullptr;
  cuGetProcAddress_fn cuGetProcAddress = nullptr;        // may be missing
  cuGetProcAddress_v2_fn cuGetProcAddress_v2 = nullptr;  // CUDA 12+; may be missing
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;

  // Loads the driver (`path`, else libcuda.so.1) and resolves every entry point above but the
  // optional ones. On failure false, with what is missing in `err`.
  bool Load(const char* path, std::string* err);
  // "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" for a result code.
  std::string Error(CUresult rc) const;
};

// The check's kernels: `spin(u64 iters, u64 sink)` (one thread of block 0 runs `iters` dependent
// multiply-adds, every other thread returns at once; GPU work whose length does not depend on how
// much of the GPU it gets while it runs) and `empty()`.
extern const char kKernelsPtx[];

// A process's hold on one GPU: its primary context made current, the kernels loaded, a stream.
struct Gpu {
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;
  CUfunction spin = nullptr, empty = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr sink = 0;  // where `spin` would write (never, in practice): keeps its loop alive
  // On failure false, with the failing call in `err`.
  bool Open(const Driver& d, int ordinal, std::string* err);
};

// NVML's per-process figures, from outside the measured process (no intercept library here).
class Nvml {
 public:
  // Loads libnvidia-ml.so.1 and initializes it; false (and `err`) when it cannot.
  bool Load(std::string* err);
  ~Nvml();
  // The device memory NVML says process `pid` uses on GPU `index`, in bytes; -1 when it does not
  // list the process or cannot say.
  int64_t ProcessMemory(unsigned index, unsigned pid) const;
  std::string DriverVersion() const;

 private:
  void* handle_ = nullptr;
  nvmlReturn_t (*shutdown_)() = nullptr;
  nvmlReturn_t (*handle_by_index_)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*processes_)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*) = nullptr;
  nvmlReturn_t (*driver_version_)(char*, unsigned) = nullptr;
};

// CLOCK_MONOTONIC in milliseconds.
double NowMs();

}  // namespace tessera::gpucheck
