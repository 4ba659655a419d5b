#include "tessera/gpucheck/driver.h"

#include <dlfcn.h>
#include <time.h>

#include <string>
#include <vector>

namespace tessera::gpucheck {

namespace {

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*out == nullptr && missing != nullptr)
    *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *out != nullptr;
}

// The kernels for `target` (sm_70: JIT-compiled for any newer GPU).
std::string KernelsFor(const char* target) {
  std::string ptx = kKernelsPtx;
  const std::string from = ".target sm_70";
  ptx.replace(ptx.find(from), from.size(), std::string(".target ") + target);
  return ptx;
}

}  // namespace

const char kKernelsPtx[] = R"(.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(.param .u64 iters, .param .u64 sink)
{
  .reg .pred %p<4>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<6>;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  or.b32 %r3, %r1, %r2;
  setp.ne.s32 %p1, %r3, 0;
  @%p1 bra DONE;
  ld.param.u64 %rd1, [iters];
  ld.param.u64 %rd2, [sink];
  mov.u64 %rd3, 0;
  mov.u32 %r4, 1;
LOOP:
  setp.ge.u64 %p2, %rd3, %rd1;
  @%p2 bra END;
  mad.lo.s32 %r4, %r4, 1664525, 1013904223;
  add.s64 %rd3, %rd3, 1;
  bra.uni LOOP;
END:
  setp.ne.s32 %p3, %r4, 7;
  @%p3 bra DONE;
  cvta.to.global.u64 %rd4, %rd2;
  st.global.u32 [%rd4], %r4;
DONE:
  ret;
}

.visible .entry empty()
{
  ret;
}
)";

bool Driver::Load(const char* path, std::string* err) {
  const char* name = path != nullptr && *path ? path : "libcuda.so.1";
  handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    *err = std::string("cannot load the CUDA driver (") + name + "): " + dlerror();
    return false;
  }
  std::string missing;
  Resolve(handle, "cuInit", &cuInit, &missing);
  Resolve(handle, "cuDriverGetVersion", &cuDriverGetVersion, &missing);
  Resolve(handle, "cuDeviceGet", &cuDeviceGet, &missing);
  Resolve(handle, "cuDeviceGetName", &cuDeviceGetName, &missing);
  Resolve(handle, "cuDeviceTotalMem_v2", &cuDeviceTotalMem_v2, &missing);
  Resolve(handle, "cuDevicePrimaryCtxRetain", &cuDevicePrimaryCtxRetain, &missing);
  Resolve(handle, "cuCtxSetCurrent", &cuCtxSetCurrent, &missing);
  Resolve(handle, "cuCtxSynchronize", &cuCtxSynchronize, &missing);
  Resolve(handle, "cuModuleLoadData", &cuModuleLoadData, &missing);
  Resolve(handle, "cuModuleGetFunction", &cuModuleGetFunction, &missing);
  Resolve(handle, "cuModuleUnload", &cuModuleUnload, &missing);
  Resolve(handle, "cuLaunchKernel", &cuLaunchKernel, &missing);
  Resolve(handle, "cuStreamCreate", &cuStreamCreate, &missing);
  Resolve(handle, "cuStreamSynchronize", &cuStreamSynchronize, &missing);
  Resolve(handle, "cuEventCreate", &cuEventCreate, &missing);
  Resolve(handle, "cuEventRecord", &cuEventRecord, &missing);
  Resolve(handle, "cuEventSynchronize", &cuEventSynchronize, &missing);
  // CUDA 12.8 made _v2 the one headers name; the first stays for older programs.
  if (!Resolve(handle, "cuEventElapsedTime_v2", &cuEventElapsedTime, nullptr))
    Resolve(handle, "cuEventElapsedTime", &cuEventElapsedTime, &missing);
  Resolve(handle, "cuMemAlloc_v2", &cuMemAlloc_v2, &missing);
  Resolve(handle, "cuMemFree_v2", &cuMemFree_v2, &missing);
  Resolve(handle, "cuMemAllocAsync", &cuMemAllocAsync, &missing);
  Resolve(handle, "cuMemFreeAsync", &cuMemFreeAsync, &missing);
  Resolve(handle, "cuMemGetInfo_v2", &cuMemGetInfo_v2, &missing);
  Resolve(handle, "cuStreamBeginCapture_v2", &cuStreamBeginCapture_v2, &missing);
  Resolve(handle, "cuStreamEndCapture", &cuStreamEndCapture, &missing);
  Resolve(handle, "cuGraphInstantiateWithFlags", &cuGraphInstantiateWithFlags, &missing);
  Resolve(handle, "cuGraphLaunch", &cuGraphLaunch, &missing);
  Resolve(handle, "cuMemCreate", &cuMemCreate, &missing);
  Resolve(handle, "cuMemRelease", &cuMemRelease, &missing);
  Resolve(handle, "cuMemAddressReserve", &cuMemAddressReserve, &missing);
  Resolve(handle, "cuMemAddressFree", &cuMemAddressFree, &missing);
  Resolve(handle, "cuMemMap", &cuMemMap, &missing);
  Resolve(handle, "cuMemUnmap", &cuMemUnmap, &missing);
  Resolve(handle, "cuMemExportToShareableHandle", &cuMemExportToShareableHandle, nullptr);
  Resolve(handle, "cuMemImportFromShareableHandle", &cuMemImportFromShareableHandle, nullptr);
  Resolve(handle, "cuGetErrorString", &cuGetErrorString, &missing);
  Resolve(handle, "cuGetProcAddress", &cuGetProcAddress, nullptr);
  Resolve(handle, "cuGetProcAddress_v2", &cuGetProcAddress_v2, nullptr);
  if (!missing.empty()) {
    *err = std::string(name) + " is not a CUDA driver this check can use: it lacks " + missing;
    return false;
  }
  return true;
}

std::string Driver::Error(CUresult rc) const {
  const char* text = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(rc, &text) != CUDA_SUCCESS ||
      text == nullptr) {
    text = "unknown";
  }
  return "CUDA error " + std::to_string(rc) + ": " + text;
}

bool Gpu::Open(const Driver& d, int ordinal, std::string* err) {
  auto failed = [&](const char* call, CUresult rc) {
    *err = std::string(call) + ": " + d.Error(rc);
    return false;
  };
  CUresult rc = d.cuInit(0);
  if (rc != CUDA_SUCCESS) return failed("cuInit", rc);
  if ((rc = d.cuDeviceGet(&device, ordinal)) != CUDA_SUCCESS) return failed("cuDeviceGet", rc);
  if ((rc = d.cuDevicePrimaryCtxRetain(&context, device)) != CUDA_SUCCESS)
    return failed("cuDevicePrimaryCtxRetain", rc);
  if ((rc = d.cuCtxSetCurrent(context)) != CUDA_SUCCESS) return failed("cuCtxSetCurrent", rc);
  for (const char* target : {"sm_70", "sm_90"}) {
    const std::string ptx = KernelsFor(target);
    if ((rc = d.cuModuleLoadData(&module, ptx.c_str())) == CUDA_SUCCESS) break;
  }
  if (rc != CUDA_SUCCESS) return failed("cuModuleLoadData (the check's PTX)", rc);
  if ((rc = d.cuModuleGetFunction(&spin, module, "spin")) != CUDA_SUCCESS)
    return failed("cuModuleGetFunction(spin)", rc);
  if ((rc = d.cuModuleGetFunction(&empty, module, "empty")) != CUDA_SUCCESS)
    return failed("cuModuleGetFunction(empty)", rc);
  if ((rc = d.cuStreamCreate(&stream, /*CU_STREAM_NON_BLOCKING*/ 1)) != CUDA_SUCCESS)
    return failed("cuStreamCreate", rc);
  if ((rc = d.cuMemAlloc_v2(&sink, 256)) != CUDA_SUCCESS) return failed("cuMemAlloc_v2(256)", rc);
  return true;
}

bool Nvml::Load(std::string* err) {
  handle_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    *err = std::string("cannot load NVML: ") + dlerror();
    return false;
  }
  nvmlReturn_t (*init)() = nullptr;
  std::string missing;
  Resolve(handle_, "nvmlInit_v2", &init, &missing);
  Resolve(handle_, "nvmlShutdown", &shutdown_, &missing);
  Resolve(handle_, "nvmlDeviceGetHandleByIndex_v2", &handle_by_index_, &missing);
  Resolve(handle_, "nvmlDeviceGetComputeRunningProcesses_v3", &processes_, &missing);
  Resolve(handle_, "nvmlSystemGetDriverVersion", &driver_version_, &missing);
  if (!missing.empty()) {
    *err = "NVML lacks " + missing;
    shutdown_ = nullptr;
    return false;
  }
  if (const nvmlReturn_t rc = init(); rc != NVML_SUCCESS) {
    *err = "nvmlInit_v2: error " + std::to_string(rc);
    shutdown_ = nullptr;
    return false;
  }
  return true;
}

Nvml::~Nvml() {
  if (shutdown_ != nullptr) shutdown_();
  if (handle_ != nullptr) dlclose(handle_);
}

int64_t Nvml::ProcessMemory(unsigned index, unsigned pid) const {
  if (processes_ == nullptr) return -1;
  nvmlDevice_t dev = nullptr;
  if (handle_by_index_(index, &dev) != NVML_SUCCESS) return -1;
  std::vector<nvmlProcessInfo_t> procs(64);
  unsigned count = static_cast<unsigned>(procs.size());
  nvmlReturn_t rc = processes_(dev, &count, procs.data());
  if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
    procs.resize(count + 16);
    count = static_cast<unsigned>(procs.size());
    rc = processes_(dev, &count, procs.data());
  }
  if (rc != NVML_SUCCESS) return -1;
  for (unsigned i = 0; i < count; ++i) {
    if (procs[i].pid == pid) return static_cast<int64_t>(procs[i].usedGpuMemory);
  }
  return -1;
}

std::string Nvml::DriverVersion() const {
  char text[96] = "";
  if (driver_version_ == nullptr || driver_version_(text, sizeof text) != NVML_SUCCESS) return "";
  return text;
}

double NowMs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

}  // namespace tessera::gpucheck
