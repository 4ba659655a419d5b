// A small CUDA driver-API program for the intercept-library tests. It reaches the driver one of
// four ways, as real programs do, then runs commands, printing one line each:
//   cuda_client ROUTE CMD...
//   ROUTE: link (called directly, linked against libcuda.so.1) | dlsym (dlopen + dlsym) |
//          procaddr (dlsym("cuGetProcAddress"), then every entry point through it, as the CUDA 12
//          runtime does) | procaddr2 (the same through cuGetProcAddress_v2)
//   CMD:   alloc:MiB  pitch:W:H  managed:MiB  async:MiB  pool:MiB  create:MiB  array:W:H
//          vmm:MiB (created, mapped, released at once)  vmmunmap[:K]
//          vmmexport:MiB:SOCKET[:fabric]  vmmimport:SOCKET[:fabric] (shared between processes)
//          array3d:W:H:D  mipmap:W:H:LEVELS  launch:N  kernel (one, its result)  fault (a kernel
//          that faults: an illegal address)  freeall  info
//          total  fill:MiB  cycle:N:MiB
//          newpool:D  frompool:MiB  pooldestroy  threshold:MiB|max  trim:MiB  freeasync  sync
//          graph:MiB (a graph with a memory node, instantiated)  graphlaunch  graphtrim  graphpool
//          driverused:D  procs:INDEX:compute|graphics:VERSION  module  moduleex  modulefile
//          fatbinary  moduleunload  library  libraryfile  libraryunload
//          ctx:D  ctxdestroy  primary:D  primaryrelease:D  device:D  nvml:INDEX (NVML's memory
//          figures, v1 then v2: total free used MiB)  nvmlutil:INDEX (NVML's utilization)
//          hold  crash  waitfile:PATH (until PATH exists, at most 10 s; says nothing)
//          work:RUN_MS:KERNEL_US:BATCH:SLEEP_US:FROM_MS:TO_MS[:KIND] - for RUN_MS, launch BATCH
//          kernels
//            of KERNEL_US each (KIND: kernel (default), ex, coop, graph; small: 200 kernels of
//            10 us before them, as a step of many small kernels and a few long), cuCtxSynchronize,
//            sleep SLEEP_US; prints "gpu_us G batches B" for the batches finished between FROM_MS
//            and TO_MS after the start (G: their kernels' virtual GPU time; the start:
//            WORK_START_MS, CLOCK_MONOTONIC ms, when set)
//          ranks:RUN_MS:KERNEL_US:BATCH:FROM_MS:TO_MS:BARRIER:RANK:NRANKS - one rank of a
//            data-parallel job on the current device: each step launches BATCH kernels of
//            KERNEL_US, synchronizes, then waits for every rank to finish the step (the coupling
//            of an all-reduce, through a counter in the file BARRIER; the wait synchronizes again
//            and again, so that it looks busy, as NCCL's kernels waiting on the GPU); prints "steps
//            S gpu_us G" for the steps every rank finished between FROM_MS and TO_MS (the start as
//            for work)
// Results: "ok", "oom", "err <code>", numbers for info/total/fill.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/unix_socket.h"
#include "tessera/shim/cuda_abi.h"
#include "tessera/shim/host_clock.h"

extern "C" {
CUresult cuInit(unsigned int);
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
CUresult cuMemAllocManaged(CUdeviceptr*, size_t, unsigned int);
CUresult cuMemAllocAsync(CUdeviceptr*, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemExportToShareableHandle(void*, CUmemGenericAllocationHandle, int, unsigned long long);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle*, void*, int);
CUresult cuArrayCreate_v2(CUarray*, const CUDA_ARRAY_DESCRIPTOR*);
CUresult cuArray3DCreate_v2(CUarray*, const CUDA_ARRAY3D_DESCRIPTOR*);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray*, const CUDA_ARRAY3D_DESCRIPTOR*, unsigned int);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetInfo_v2(size_t*, size_t*);
CUresult cuCtxCreate_v2(CUcontext*, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDeviceTotalMem_v2(size_t*, CUdevice);
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, CUstream, void**, void**);
CUresult cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void**, void**);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned int, unsigned int, unsigned int,
                                   unsigned int, unsigned int, unsigned int, unsigned int, CUstream,
                                   void**);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphCreate(CUgraph*, unsigned int);
CUresult cuGraphAddEmptyNode(CUgraphNode*, CUgraph, const CUgraphNode*, size_t);
CUresult cuGraphAddMemAllocNode(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                CUDA_MEM_ALLOC_NODE_PARAMS*);
CUresult cuGraphInstantiateWithFlags(CUgraphExec*, CUgraph, unsigned long long);
CUresult cuDeviceGraphMemTrim(CUdevice);
CUresult cuDeviceGetGraphMemAttribute(CUdevice, CUgraphMem_attribute, void*);
CUresult cuMemPoolCreate(CUmemoryPool*, const CUmemPoolProps*);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuModuleLoadData(CUmodule*, const void*);
CUresult cuModuleLoadDataEx(CUmodule*, const void*, unsigned int, CUjit_option*, void**);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleLoad(CUmodule*, const char*);
CUresult cuModuleLoadFatBinary(CUmodule*, const void*);
CUresult cuLibraryLoadData(CUlibrary*, const void*, CUjit_option*, void**, unsigned int,
                           CUlibraryOption*, void**, unsigned int);
CUresult cuLibraryLoadFromFile(CUlibrary*, const char*, CUjit_option*, void**, unsigned int,
                               CUlibraryOption*, void**, unsigned int);
CUresult cuLibraryUnload(CUlibrary);
CUresult cuCtxCreate_v3(CUcontext*, CUexecAffinityParam*, int, unsigned int, CUdevice);
CUresult cuCtxCreate_v4(CUcontext*, CUctxCreateParams*, unsigned int, CUdevice);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph*);
CUresult cuCtxSynchronize();
CUresult cuDeviceGetMemPool(CUmemoryPool*, CUdevice);
CUresult cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute, void*);
void fakeCudaSetDevice(int);
uint64_t fakeCudaUsedBytes(int);
}

namespace {

// The host's monotonic clock (a client in a time namespace measures the same windows).
double NowMs() { return static_cast<double>(tessera::shim::HostMonotonicNs()) / 1e6; }

// WORK_START_MS (CLOCK_MONOTONIC, ms): a start shared by several processes, so that their windows
// are the same stretch of time however long each took to start; else now.
double WorkStartMs() {
  const char* shared_start = getenv("WORK_START_MS");
  return shared_start ? strtod(shared_start, nullptr) : NowMs();
}

struct Api {
  cuMemAlloc_v2_fn MemAlloc;
  cuMemAllocPitch_v2_fn MemAllocPitch;
  cuMemAllocManaged_fn MemAllocManaged;
  cuMemAllocAsync_fn MemAllocAsync;
  cuMemAllocFromPoolAsync_fn MemAllocFromPoolAsync;
  cuMemFree_v2_fn MemFree;
  cuMemFreeAsync_fn MemFreeAsync;
  cuMemCreate_fn MemCreate;
  cuMemRelease_fn MemRelease;
  cuArrayCreate_v2_fn ArrayCreate;
  cuArray3DCreate_v2_fn Array3DCreate;
  cuArrayDestroy_fn ArrayDestroy;
  cuMipmappedArrayCreate_fn MipmappedArrayCreate;
  cuMipmappedArrayDestroy_fn MipmappedArrayDestroy;
  cuMemGetInfo_v2_fn MemGetInfo;
  cuDeviceTotalMem_v2_fn DeviceTotalMem;
  cuLaunchKernel_fn LaunchKernel;
  cuMemPoolCreate_fn MemPoolCreate;
  cuMemPoolDestroy_fn MemPoolDestroy;
  cuMemPoolTrimTo_fn MemPoolTrimTo;
  cuModuleLoadData_fn ModuleLoadData;
  cuModuleLoadDataEx_fn ModuleLoadDataEx;
  cuModuleUnload_fn ModuleUnload;
  cuModuleLoad_fn ModuleLoad;
  cuModuleLoadFatBinary_fn ModuleLoadFatBinary;
  cuLibraryLoadData_fn LibraryLoadData;
  cuLibraryLoadFromFile_fn LibraryLoadFromFile;
  cuLibraryUnload_fn LibraryUnload;
  cuGraphInstantiateWithFlags_fn GraphInstantiateWithFlags;
  cuGraphLaunch_fn GraphLaunch;
  cuDeviceGraphMemTrim_fn DeviceGraphMemTrim;
  cuMemAddressReserve_fn MemAddressReserve;
  cuMemAddressFree_fn MemAddressFree;
  cuMemMap_fn MemMap;
  cuMemUnmap_fn MemUnmap;
};

Api Linked() {
  return {cuMemAlloc_v2,
          cuMemAllocPitch_v2,
          cuMemAllocManaged,
          cuMemAllocAsync,
          cuMemAllocFromPoolAsync,
          cuMemFree_v2,
          cuMemFreeAsync,
          cuMemCreate,
          cuMemRelease,
          cuArrayCreate_v2,
          cuArray3DCreate_v2,
          cuArrayDestroy,
          cuMipmappedArrayCreate,
          cuMipmappedArrayDestroy,
          cuMemGetInfo_v2,
          cuDeviceTotalMem_v2,
          cuLaunchKernel,
          cuMemPoolCreate,
          cuMemPoolDestroy,
          cuMemPoolTrimTo,
          cuModuleLoadData,
          cuModuleLoadDataEx,
          cuModuleUnload,
          cuModuleLoad,
          cuModuleLoadFatBinary,
          cuLibraryLoadData,
          cuLibraryLoadFromFile,
          cuLibraryUnload,
          cuGraphInstantiateWithFlags,
          cuGraphLaunch,
          cuDeviceGraphMemTrim,
          cuMemAddressReserve,
          cuMemAddressFree,
          cuMemMap,
          cuMemUnmap};
}

cuuint64_t g_flags = 0;  // cuGetProcAddress flags of the route (ptsz: per-thread default stream)

template <typename F>
void Get(F& out, void* lib, const char* versioned, void* gpa, const char* base, bool v2) {
  void* p = nullptr;
  if (gpa == nullptr) {
    p = dlsym(lib, versioned);
  } else if (v2) {
    CUdriverProcAddressQueryResult status;
    reinterpret_cast<cuGetProcAddress_v2_fn>(gpa)(base, &p, 12040, g_flags, &status);
  } else {
    reinterpret_cast<cuGetProcAddress_fn>(gpa)(base, &p, 12040, g_flags);
  }
  if (p == nullptr) {
    fprintf(stderr, "cuda_client: cannot resolve %s\n", versioned);
    exit(3);
  }
  out = reinterpret_cast<F>(p);
}

Api Resolved(const std::string& route) {
  // CUDA_CLIENT_LIBCUDA: the driver by a path of its own (another copy of it, say).
  const char* path = getenv("CUDA_CLIENT_LIBCUDA");
  void* lib = dlopen(path != nullptr ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    fprintf(stderr, "cuda_client: %s\n", dlerror());
    exit(3);
  }
  void* gpa = nullptr;
  bool v2 = route == "procaddr2" || route == "ptsz";
  if (route == "ptsz") g_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (route != "dlsym") {
    gpa = dlsym(lib, v2 ? "cuGetProcAddress_v2" : "cuGetProcAddress");
    if (gpa == nullptr) exit(3);
  }
  Api a;
  Get(a.MemAlloc, lib, "cuMemAlloc_v2", gpa, "cuMemAlloc", v2);
  Get(a.MemAllocPitch, lib, "cuMemAllocPitch_v2", gpa, "cuMemAllocPitch", v2);
  Get(a.MemAllocManaged, lib, "cuMemAllocManaged", gpa, "cuMemAllocManaged", v2);
  Get(a.MemAllocAsync, lib, "cuMemAllocAsync", gpa, "cuMemAllocAsync", v2);
  Get(a.MemAllocFromPoolAsync, lib, "cuMemAllocFromPoolAsync", gpa, "cuMemAllocFromPoolAsync", v2);
  Get(a.MemFree, lib, "cuMemFree_v2", gpa, "cuMemFree", v2);
  Get(a.MemFreeAsync, lib, "cuMemFreeAsync", gpa, "cuMemFreeAsync", v2);
  Get(a.MemCreate, lib, "cuMemCreate", gpa, "cuMemCreate", v2);
  Get(a.MemRelease, lib, "cuMemRelease", gpa, "cuMemRelease", v2);
  Get(a.MemAddressReserve, lib, "cuMemAddressReserve", gpa, "cuMemAddressReserve", v2);
  Get(a.MemAddressFree, lib, "cuMemAddressFree", gpa, "cuMemAddressFree", v2);
  Get(a.MemMap, lib, "cuMemMap", gpa, "cuMemMap", v2);
  Get(a.MemUnmap, lib, "cuMemUnmap", gpa, "cuMemUnmap", v2);
  Get(a.ArrayCreate, lib, "cuArrayCreate_v2", gpa, "cuArrayCreate", v2);
  Get(a.Array3DCreate, lib, "cuArray3DCreate_v2", gpa, "cuArray3DCreate", v2);
  Get(a.ArrayDestroy, lib, "cuArrayDestroy", gpa, "cuArrayDestroy", v2);
  Get(a.MipmappedArrayCreate, lib, "cuMipmappedArrayCreate", gpa, "cuMipmappedArrayCreate", v2);
  Get(a.MipmappedArrayDestroy, lib, "cuMipmappedArrayDestroy", gpa, "cuMipmappedArrayDestroy", v2);
  Get(a.MemGetInfo, lib, "cuMemGetInfo_v2", gpa, "cuMemGetInfo", v2);
  Get(a.DeviceTotalMem, lib, "cuDeviceTotalMem_v2", gpa, "cuDeviceTotalMem", v2);
  Get(a.LaunchKernel, lib, "cuLaunchKernel", gpa, "cuLaunchKernel", v2);
  Get(a.MemPoolCreate, lib, "cuMemPoolCreate", gpa, "cuMemPoolCreate", v2);
  Get(a.MemPoolDestroy, lib, "cuMemPoolDestroy", gpa, "cuMemPoolDestroy", v2);
  Get(a.MemPoolTrimTo, lib, "cuMemPoolTrimTo", gpa, "cuMemPoolTrimTo", v2);
  Get(a.ModuleLoadData, lib, "cuModuleLoadData", gpa, "cuModuleLoadData", v2);
  Get(a.ModuleLoadDataEx, lib, "cuModuleLoadDataEx", gpa, "cuModuleLoadDataEx", v2);
  Get(a.ModuleUnload, lib, "cuModuleUnload", gpa, "cuModuleUnload", v2);
  Get(a.ModuleLoad, lib, "cuModuleLoad", gpa, "cuModuleLoad", v2);
  Get(a.ModuleLoadFatBinary, lib, "cuModuleLoadFatBinary", gpa, "cuModuleLoadFatBinary", v2);
  Get(a.LibraryLoadData, lib, "cuLibraryLoadData", gpa, "cuLibraryLoadData", v2);
  Get(a.LibraryLoadFromFile, lib, "cuLibraryLoadFromFile", gpa, "cuLibraryLoadFromFile", v2);
  Get(a.LibraryUnload, lib, "cuLibraryUnload", gpa, "cuLibraryUnload", v2);
  // CUDA 12 programs ask for "cuGraphInstantiate" (the same entry point as ...WithFlags).
  Get(a.GraphInstantiateWithFlags, lib, "cuGraphInstantiateWithFlags", gpa, "cuGraphInstantiate",
      v2);
  Get(a.GraphLaunch, lib, "cuGraphLaunch", gpa, "cuGraphLaunch", v2);
  Get(a.DeviceGraphMemTrim, lib, "cuDeviceGraphMemTrim", gpa, "cuDeviceGraphMemTrim", v2);
  return a;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t c = s.find(':', start);
    out.push_back(s.substr(start, c == std::string::npos ? c : c - start));
    if (c == std::string::npos) return out;
    start = c + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cuda_client link|dlsym|procaddr|procaddr2 CMD...\n");
    return 2;
  }
  std::string route = argv[1];
  cuInit(0);
  Api api = route == "link" ? Linked() : Resolved(route);
  std::vector<CUdeviceptr> ptrs;
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<std::pair<CUdeviceptr, size_t>> mapped;  // vmm: address ranges mapped
  std::vector<CUarray> arrays;
  std::vector<CUmipmappedArray> mipmaps;
  std::vector<CUcontext> contexts;
  std::vector<CUmemoryPool> pools;
  std::vector<CUmodule> modules;
  std::vector<CUlibrary> libraries;
  std::vector<CUgraphExec> graphs;
  auto report = [](CUresult rc) {
    if (rc == CUDA_SUCCESS)
      puts("ok");
    else if (rc == CUDA_ERROR_OUT_OF_MEMORY)
      puts("oom");
    else
      printf("err %d\n", rc);
  };
  const size_t MiB = 1 << 20;
  for (int i = 2; i < argc; ++i) {
    std::vector<std::string> c = Split(argv[i]);
    auto n = [&](size_t k) { return static_cast<size_t>(strtoull(c.at(k).c_str(), nullptr, 10)); };
    CUdeviceptr p = 0;
    if (c[0] == "alloc") {
      CUresult rc = api.MemAlloc(&p, n(1) * MiB);
      if (rc == CUDA_SUCCESS) ptrs.push_back(p);
      report(rc);
    } else if (c[0] == "pitch") {
      size_t pitch = 0;
      CUresult rc = api.MemAllocPitch(&p, &pitch, n(1), n(2), 4);
      if (rc == CUDA_SUCCESS) ptrs.push_back(p);
      report(rc);
    } else if (c[0] == "managed" || c[0] == "async" || c[0] == "pool" || c[0] == "frompool") {
      // pool: from the current device's current pool named explicitly; frompool: from the pool
      // made last by newpool
      CUmemoryPool pool = nullptr;
      if (c[0] == "pool") cuDeviceGetMemPool(&pool, 0);
      if (c[0] == "frompool") pool = pools.empty() ? nullptr : pools.back();
      CUresult rc = c[0] == "managed" ? api.MemAllocManaged(&p, n(1) * MiB, 1)
                    : c[0] == "async" ? api.MemAllocAsync(&p, n(1) * MiB, nullptr)
                                      : api.MemAllocFromPoolAsync(&p, n(1) * MiB, pool, nullptr);
      if (rc == CUDA_SUCCESS) ptrs.push_back(p);
      report(rc);
    } else if (c[0] == "newpool") {
      // newpool:D - a pool of device D's memory
      CUmemPoolProps props{};
      props.allocType = 1;
      props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      props.location.id = static_cast<int>(n(1));
      CUmemoryPool pool = nullptr;
      CUresult rc = api.MemPoolCreate(&pool, &props);
      if (rc == CUDA_SUCCESS) pools.push_back(pool);
      report(rc);
    } else if (c[0] == "graph") {
      // graph:MiB - a graph of an empty node and a memory node allocating MiB on device 0,
      // instantiated (kept for graphlaunch)
      CUgraph g = nullptr;
      CUgraphNode empty = nullptr, node = nullptr;
      CUDA_MEM_ALLOC_NODE_PARAMS params{};
      params.poolProps.allocType = 1;  // pinned
      params.poolProps.location = CUmemLocation{CU_MEM_LOCATION_TYPE_DEVICE, 0};
      params.bytesize = n(1) * MiB;
      CUgraphExec exec = nullptr;
      CUresult rc = cuGraphCreate(&g, 0);
      if (rc == CUDA_SUCCESS) rc = cuGraphAddEmptyNode(&empty, g, nullptr, 0);
      if (rc == CUDA_SUCCESS) rc = cuGraphAddMemAllocNode(&node, g, &empty, 1, &params);
      if (rc == CUDA_SUCCESS) rc = api.GraphInstantiateWithFlags(&exec, g, 0);
      if (rc == CUDA_SUCCESS) graphs.push_back(exec);
      report(rc);
    } else if (c[0] == "graphlaunch") {
      report(graphs.empty() ? CUDA_ERROR_INVALID_VALUE : api.GraphLaunch(graphs.back(), nullptr));
    } else if (c[0] == "graphtrim") {
      report(api.DeviceGraphMemTrim(0));
    } else if (c[0] == "graphpool") {
      // graphpool - what device 0's graph memory pool holds, MiB
      cuuint64_t v = 0;
      cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v);
      printf("%llu\n", static_cast<unsigned long long>(v / MiB));
    } else if (c[0] == "pooldestroy") {
      report(pools.empty() ? CUDA_ERROR_INVALID_VALUE : api.MemPoolDestroy(pools.back()));
      if (!pools.empty()) pools.pop_back();
    } else if (c[0] == "threshold") {
      // threshold:MiB|max - the release threshold of device 0's current pool (max: keep
      // everything, as PyTorch's cudaMallocAsync backend sets it)
      CUmemoryPool pool = nullptr;
      cuDeviceGetMemPool(&pool, 0);
      cuuint64_t v = c[1] == "max" ? ~cuuint64_t{0} : n(1) * MiB;
      report(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
    } else if (c[0] == "trim") {
      // trim:MiB - device 0's current pool trimmed to keep at most that much
      CUmemoryPool pool = nullptr;
      cuDeviceGetMemPool(&pool, 0);
      report(api.MemPoolTrimTo(pool, n(1) * MiB));
    } else if (c[0] == "freeasync") {
      for (CUdeviceptr q : ptrs) api.MemFreeAsync(q, nullptr);
      ptrs.clear();
      puts("ok");
    } else if (c[0] == "module" || c[0] == "moduleex" || c[0] == "modulefile" ||
               c[0] == "fatbinary") {
      static const char kImage[] = "fake cubin";
      CUmodule m = nullptr;
      CUresult rc = c[0] == "module"       ? api.ModuleLoadData(&m, kImage)
                    : c[0] == "moduleex"   ? api.ModuleLoadDataEx(&m, kImage, 0, nullptr, nullptr)
                    : c[0] == "modulefile" ? api.ModuleLoad(&m, "kernels.cubin")
                                           : api.ModuleLoadFatBinary(&m, kImage);
      if (rc == CUDA_SUCCESS) modules.push_back(m);
      report(rc);
    } else if (c[0] == "moduleunload") {
      report(modules.empty() ? CUDA_ERROR_INVALID_VALUE : api.ModuleUnload(modules.back()));
      if (!modules.empty()) modules.pop_back();
    } else if (c[0] == "library" || c[0] == "libraryfile") {
      // CUDA 12's context-independent loading, as the CUDA 12 runtime loads a program's kernels.
      static const char kImage[] = "fake fatbin";
      CUlibrary l = nullptr;
      CUresult rc = c[0] == "library"
                        ? api.LibraryLoadData(&l, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0)
                        : api.LibraryLoadFromFile(&l, "kernels.fatbin", nullptr, nullptr, 0,
                                                  nullptr, nullptr, 0);
      if (rc == CUDA_SUCCESS) libraries.push_back(l);
      report(rc);
    } else if (c[0] == "libraryunload") {
      report(libraries.empty() ? CUDA_ERROR_INVALID_VALUE : api.LibraryUnload(libraries.back()));
      if (!libraries.empty()) libraries.pop_back();
    } else if (c[0] == "sync") {
      report(cuCtxSynchronize());
    } else if (c[0] == "driverused") {
      // driverused:D - what the (fake) driver has handed out on device D, in MiB
      printf("%llu\n",
             static_cast<unsigned long long>(fakeCudaUsedBytes(static_cast<int>(n(1))) / MiB));
    } else if (c[0] == "create") {
      // create:MiB[:device|:host] - on that device (default: none given, the driver's choice)
      CUmemGenericAllocationHandle h;
      CUmemAllocationProp prop{};
      prop.type = 1;
      if (c.size() > 2) {
        prop.location.type = c[2] == "host" ? 2 : CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = c[2] == "host" ? 0 : static_cast<int>(n(2));
      }
      CUresult rc = api.MemCreate(&h, n(1) * MiB, c.size() > 2 ? &prop : nullptr, 0);
      if (rc == CUDA_SUCCESS) handles.push_back(h);
      report(rc);
    } else if (c[0] == "vmm") {
      // vmm:MiB - as NVIDIA's memmap sample: a handle created, an address range reserved, the
      // handle mapped there, then released at once (the mapping keeps the memory).
      CUmemGenericAllocationHandle h;
      const size_t bytes = n(1) * MiB;
      CUresult rc = api.MemCreate(&h, bytes, nullptr, 0);
      CUdeviceptr va = 0;
      if (rc == CUDA_SUCCESS) rc = api.MemAddressReserve(&va, bytes, 0, 0, 0);
      if (rc == CUDA_SUCCESS) rc = api.MemMap(va, bytes, 0, h, 0);
      if (rc == CUDA_SUCCESS) rc = api.MemRelease(h);
      if (rc == CUDA_SUCCESS) mapped.emplace_back(va, bytes);
      report(rc);
    } else if (c[0] == "vmmexport") {
      // vmmexport:MiB:SOCKET[:fabric] - a handle created and mapped, exported (a descriptor, or a
      // fabric handle) and sent to the first process that connects to SOCKET (its size and fabric
      // bytes as data, the descriptor by SCM_RIGHTS), as an inference server hands its workers a
      // weights buffer; the sent descriptor closed here after. The handle and mapping stay.
      const bool fab = c.size() > 3 && c[3] == "fabric";
      CUmemAllocationProp prop{};
      prop.type = 1;
      prop.requestedHandleTypes = fab ? 8 : 1;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      CUmemGenericAllocationHandle h;
      uint64_t msg[9] = {n(1) * MiB};
      CUresult rc = api.MemCreate(&h, msg[0], &prop, 0);
      CUdeviceptr va = 0;
      if (rc == CUDA_SUCCESS) rc = api.MemAddressReserve(&va, msg[0], 0, 0, 0);
      if (rc == CUDA_SUCCESS) rc = api.MemMap(va, msg[0], 0, h, 0);
      int fd = -1;
      if (rc == CUDA_SUCCESS) {
        handles.push_back(h);
        mapped.emplace_back(va, msg[0]);
        rc = fab ? cuMemExportToShareableHandle(&msg[1], h, 8, 0)
                 : cuMemExportToShareableHandle(&fd, h, 1, 0);
      }
      if (rc == CUDA_SUCCESS) {
        const int srv = tessera::core::ListenUnix(c.at(2).c_str());
        const int peer = srv >= 0 ? accept(srv, nullptr, nullptr) : -1;
        if (!tessera::core::SendWithFd(peer, msg, sizeof msg, fd)) rc = CUDA_ERROR_INVALID_VALUE;
        close(peer);
        close(srv);
        if (fd >= 0) close(fd);
      }
      report(rc);
    } else if (c[0] == "vmmimport") {
      // vmmimport:SOCKET[:fabric] - what vmmexport sends, imported (the received descriptor closed
      // after, as programs do), mapped whole. The handle and mapping stay.
      const bool fab = c.size() > 2 && c[2] == "fabric";
      const int s = tessera::core::ConnectUnix(c.at(1).c_str(), 10000);
      uint64_t msg[9] = {};
      int fd = -1;
      CUresult rc = s >= 0 && tessera::core::ReceiveWithFd(s, msg, sizeof msg, &fd)
                        ? CUDA_SUCCESS
                        : CUDA_ERROR_INVALID_VALUE;
      if (s >= 0) close(s);
      CUmemGenericAllocationHandle h;
      if (rc == CUDA_SUCCESS) {
        rc = fab ? cuMemImportFromShareableHandle(&h, &msg[1], 8)
                 : cuMemImportFromShareableHandle(
                       &h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), 1);
      }
      if (fd >= 0) close(fd);
      CUdeviceptr va = 0;
      if (rc == CUDA_SUCCESS) rc = api.MemAddressReserve(&va, msg[0], 0, 0, 0);
      if (rc == CUDA_SUCCESS) rc = api.MemMap(va, msg[0], 0, h, 0);
      if (rc == CUDA_SUCCESS) {
        handles.push_back(h);
        mapped.emplace_back(va, msg[0]);
      }
      report(rc);
    } else if (c[0] == "vmmunmap") {
      // vmmunmap[:K] - the first K mappings (default all) unmapped and their ranges freed.
      size_t k = c.size() > 1 ? std::min<size_t>(n(1), mapped.size()) : mapped.size();
      CUresult rc = CUDA_SUCCESS;
      for (size_t i = 0; i < k && rc == CUDA_SUCCESS; ++i) {
        rc = api.MemUnmap(mapped[i].first, mapped[i].second);
        if (rc == CUDA_SUCCESS) rc = api.MemAddressFree(mapped[i].first, mapped[i].second);
      }
      mapped.erase(mapped.begin(), mapped.begin() + static_cast<long>(k));
      report(rc);
    } else if (c[0] == "array") {
      CUDA_ARRAY_DESCRIPTOR d{n(1), n(2), CU_AD_FORMAT_FLOAT, 1};
      CUarray a;
      CUresult rc = api.ArrayCreate(&a, &d);
      if (rc == CUDA_SUCCESS) arrays.push_back(a);
      report(rc);
    } else if (c[0] == "array3d") {
      CUDA_ARRAY3D_DESCRIPTOR d{n(1), n(2), n(3), CU_AD_FORMAT_FLOAT, 1, 0};
      CUarray a;
      CUresult rc = api.Array3DCreate(&a, &d);
      if (rc == CUDA_SUCCESS) arrays.push_back(a);
      report(rc);
    } else if (c[0] == "mipmap") {
      CUDA_ARRAY3D_DESCRIPTOR d{n(1), n(2), 0, CU_AD_FORMAT_FLOAT, 1, 0};
      CUmipmappedArray a;
      CUresult rc = api.MipmappedArrayCreate(&a, &d, static_cast<unsigned>(n(3)));
      if (rc == CUDA_SUCCESS) mipmaps.push_back(a);
      report(rc);
    } else if (c[0] == "kernel") {
      report(api.LaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
    } else if (c[0] == "fault") {  // a kernel that faults (the fake driver's grid 0xFA17)
      report(api.LaunchKernel(nullptr, 0xFA17, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
    } else if (c[0] == "launch") {
      for (size_t k = 0; k < n(1); ++k)
        api.LaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
      puts("ok");
    } else if (c[0] == "freeall") {
      for (size_t k = 0; k < ptrs.size(); ++k) {
        if (k % 2)
          api.MemFreeAsync(ptrs[k], nullptr);
        else
          api.MemFree(ptrs[k]);
      }
      for (auto h : handles) api.MemRelease(h);
      for (auto a : arrays) api.ArrayDestroy(a);
      for (auto m : mipmaps) api.MipmappedArrayDestroy(m);
      ptrs.clear(), handles.clear(), arrays.clear(), mipmaps.clear();
      puts("ok");
    } else if (c[0] == "info") {
      size_t f = 0, t = 0;
      CUresult rc = api.MemGetInfo(&f, &t);
      if (rc != CUDA_SUCCESS)
        report(rc);
      else
        printf("%zu %zu\n", f / MiB, t / MiB);
    } else if (c[0] == "total") {
      size_t t = 0;
      api.DeviceTotalMem(&t, 0);
      printf("%zu\n", t / MiB);
    } else if (c[0] == "fill") {
      int count = 0;
      while (api.MemAlloc(&p, n(1) * MiB) == CUDA_SUCCESS) {
        ptrs.push_back(p);
        ++count;
      }
      printf("%d\n", count);
    } else if (c[0] == "cycle") {
      int failures = 0;
      for (size_t k = 0; k < n(1); ++k) {
        if (api.MemAlloc(&p, n(2) * MiB) != CUDA_SUCCESS || api.MemFree(p) != CUDA_SUCCESS)
          ++failures;
      }
      printf("%d\n", failures);
    } else if (c[0] == "nvml") {
      void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
      if (nvml == nullptr) {
        printf("err nvml\n");
        continue;
      }
      struct Mem {
        unsigned long long total, free, used;
      };
      struct Mem2 {
        unsigned int version;
        unsigned long long total, reserved, free, used;
      };
      auto init = reinterpret_cast<int (*)()>(dlsym(nvml, "nvmlInit_v2"));
      auto get =
          reinterpret_cast<int (*)(unsigned, void**)>(dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"));
      auto info = reinterpret_cast<int (*)(void*, Mem*)>(dlsym(nvml, "nvmlDeviceGetMemoryInfo"));
      auto info2 =
          reinterpret_cast<int (*)(void*, Mem2*)>(dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2"));
      void* dev = nullptr;
      Mem m{};
      Mem2 m2{};
      m2.version = sizeof(Mem2) | (2u << 24);
      if (init() != 0 || get(static_cast<unsigned>(n(1)), &dev) != 0) {
        printf("err nvml\n");
        continue;
      }
      if (c.size() > 2) {  // nvml:GPU:MIG - that GPU's MIG device
        auto mig = reinterpret_cast<int (*)(void*, unsigned, void**)>(
            dlsym(nvml, "nvmlDeviceGetMigDeviceHandleByIndex"));
        if (mig == nullptr || mig(dev, static_cast<unsigned>(n(2)), &dev) != 0) {
          printf("err nvml mig\n");
          continue;
        }
      }
      if (info(dev, &m) != 0 || info2(dev, &m2) != 0) {
        printf("err nvml\n");
        continue;
      }
      printf("%llu %llu %llu | %llu %llu %llu\n", m.total / MiB, m.free / MiB, m.used / MiB,
             m2.total / MiB, m2.free / MiB, m2.used / MiB);
    } else if (c[0] == "nvmlutil") {
      // nvmlutil:INDEX - NVML's GPU utilization of that GPU (percent), reached by dlsym
      void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
      auto init = nvml ? reinterpret_cast<int (*)()>(dlsym(nvml, "nvmlInit_v2")) : nullptr;
      auto get = nvml ? reinterpret_cast<int (*)(unsigned, void**)>(
                            dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"))
                      : nullptr;
      struct Util {
        unsigned gpu, memory;
      } u{};
      auto rates = nvml ? reinterpret_cast<int (*)(void*, Util*)>(
                              dlsym(nvml, "nvmlDeviceGetUtilizationRates"))
                        : nullptr;
      void* dev = nullptr;
      if (!init || !get || !rates || init() != 0 || get(static_cast<unsigned>(n(1)), &dev) != 0 ||
          rates(dev, &u) != 0) {
        printf("err nvml\n");
        continue;
      }
      printf("util %u mem %u\n", u.gpu, u.memory);
    } else if (c[0] == "procs") {
      // procs:INDEX:compute|graphics:1|2|3 - the processes NVML lists on that GPU through that
      // call and version: "N: PID/MiB ..." in NVML's order, this process's pid written "self"
      void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
      auto init = nvml ? reinterpret_cast<int (*)()>(dlsym(nvml, "nvmlInit_v2")) : nullptr;
      auto get = nvml ? reinterpret_cast<int (*)(unsigned, void**)>(
                            dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"))
                      : nullptr;
      void* dev = nullptr;
      if (init == nullptr || get == nullptr || init() != 0 ||
          get(static_cast<unsigned>(n(1)), &dev) != 0) {
        printf("err nvml\n");
        continue;
      }
      std::string fn = std::string("nvmlDeviceGet") +
                       (c[2] == "graphics" ? "Graphics" : "Compute") + "RunningProcesses" +
                       (c[3] == "1" ? "" : "_v" + c[3]);
      struct Info1 {
        unsigned pid;
        unsigned long long used;
      };
      struct Info {
        unsigned pid;
        unsigned long long used;
        unsigned gi, ci;
      };
      unsigned count = 0;
      std::vector<Info> infos(16);
      std::vector<Info1> infos1(16);
      int rc;
      std::vector<std::pair<unsigned, unsigned long long>> got;
      if (c[3] == "1") {
        auto f = reinterpret_cast<int (*)(void*, unsigned*, Info1*)>(dlsym(nvml, fn.c_str()));
        rc = f(dev, &count, nullptr);  // how many (NVML_ERROR_INSUFFICIENT_SIZE), then them
        if (rc == 7 || rc == 0) count = 16, rc = f(dev, &count, infos1.data());
        for (unsigned k = 0; rc == 0 && k < count; ++k)
          got.emplace_back(infos1[k].pid, infos1[k].used);
      } else {
        auto f = reinterpret_cast<int (*)(void*, unsigned*, Info*)>(dlsym(nvml, fn.c_str()));
        rc = f(dev, &count, nullptr);
        if (rc == 7 || rc == 0) count = 16, rc = f(dev, &count, infos.data());
        for (unsigned k = 0; rc == 0 && k < count; ++k)
          got.emplace_back(infos[k].pid, infos[k].used);
      }
      if (rc != 0) {
        printf("err %d\n", rc);
        continue;
      }
      printf("%zu:", got.size());
      for (auto [pid, used] : got) {
        if (pid == static_cast<unsigned>(getpid()))
          printf(" self/%llu", used / MiB);
        else
          printf(" %u/%llu", pid, used / MiB);
      }
      printf("\n");
    } else if (c[0] == "ctx" || c[0] == "ctx3" || c[0] == "ctx4") {
      CUcontext ctx;
      const CUdevice dev = static_cast<CUdevice>(n(1));
      CUresult rc = c[0] == "ctx3"   ? cuCtxCreate_v3(&ctx, nullptr, 0, 0, dev)
                    : c[0] == "ctx4" ? cuCtxCreate_v4(&ctx, nullptr, 0, dev)
                                     : cuCtxCreate_v2(&ctx, 0, dev);
      if (rc == CUDA_SUCCESS) contexts.push_back(ctx);
      report(rc);
    } else if (c[0] == "ctxdestroy") {
      report(contexts.empty() ? CUDA_ERROR_INVALID_CONTEXT : cuCtxDestroy_v2(contexts.back()));
      if (!contexts.empty()) contexts.pop_back();
    } else if (c[0] == "primary") {
      CUcontext ctx;
      report(cuDevicePrimaryCtxRetain(&ctx, static_cast<CUdevice>(n(1))));
    } else if (c[0] == "primaryrelease") {
      report(cuDevicePrimaryCtxRelease_v2(static_cast<CUdevice>(n(1))));
    } else if (c[0] == "device") {
      fakeCudaSetDevice(static_cast<int>(n(1)));
      puts("ok");
    } else if (c[0] == "work") {
      const double start = WorkStartMs();
      const unsigned kernel_us = static_cast<unsigned>(n(2));
      const std::string kind = c.size() > 7 ? c[7] : "kernel";
      const char* graph = getenv("FAKE_CUDA_GRAPH_US");
      const unsigned long long each =
          kind == "graph" ? (graph ? strtoull(graph, nullptr, 10) : 1000) : kernel_us;
      unsigned long long gpu_us = 0, batches = 0;
      CUlaunchConfig config{};
      config.gridDimX = kernel_us;
      const unsigned long long small = kind == "small" ? 200 : 0;
      while (NowMs() - start < n(1)) {
        for (unsigned long long k = 0; k < small; ++k)
          api.LaunchKernel(nullptr, 10, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
        for (size_t k = 0; k < n(3); ++k) {
          if (kind == "ex")
            cuLaunchKernelEx(&config, nullptr, nullptr, nullptr);
          else if (kind == "coop")
            cuLaunchCooperativeKernel(nullptr, kernel_us, 1, 1, 1, 1, 1, 0, nullptr, nullptr);
          else if (kind == "graph")
            cuGraphLaunch(nullptr, nullptr);
          else
            api.LaunchKernel(nullptr, kernel_us, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
        }
        cuCtxSynchronize();
        double t = NowMs() - start;
        if (t >= n(5) && t < n(6)) gpu_us += each * n(3) + 10 * small, ++batches;
        if (n(4)) usleep(static_cast<useconds_t>(n(4)));
      }
      printf("gpu_us %llu batches %llu\n", gpu_us, batches);
    } else if (c[0] == "ranks") {
      const double start = WorkStartMs();
      int fd = open(c.at(6).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0 || ftruncate(fd, 2 * sizeof(std::atomic<uint64_t>)) != 0) {
        puts("err barrier");
        continue;
      }
      void* m = mmap(nullptr, 2 * sizeof(std::atomic<uint64_t>), PROT_READ | PROT_WRITE, MAP_SHARED,
                     fd, 0);
      close(fd);
      auto* arrived = static_cast<std::atomic<uint64_t>*>(m);
      std::atomic<uint64_t>* quit = arrived + 1;  // a rank has stopped: nobody waits for it
      const unsigned kernel_us = static_cast<unsigned>(n(2));
      const uint64_t ranks = n(8);
      unsigned long long steps = 0, gpu_us = 0;
      bool alone = false;
      for (uint64_t step = 1; !alone && NowMs() - start < n(1); ++step) {
        for (size_t k = 0; k < n(3); ++k)
          api.LaunchKernel(nullptr, kernel_us, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
        cuCtxSynchronize();
        arrived->fetch_add(1);
        // Waiting on the GPU, as NCCL's kernels do: a rank waiting for the others is busy.
        while (arrived->load() < step * ranks && !(alone = quit->load() != 0)) {
          cuCtxSynchronize();
          usleep(20);
        }
        const double t = NowMs() - start;
        if (!alone && t >= n(4) && t < n(5)) ++steps, gpu_us += kernel_us * n(3);
      }
      quit->store(1);
      munmap(m, 2 * sizeof(std::atomic<uint64_t>));
      printf("steps %llu gpu_us %llu\n", steps, gpu_us);
    } else if (c[0] == "waitfile") {
      fflush(stdout);
      for (int i = 0; i < 10000 && access(c.at(1).c_str(), F_OK) != 0; ++i) usleep(1000);
    } else if (c[0] == "hold") {
      puts("holding");
      fflush(stdout);
      pause();
    } else if (c[0] == "capture") {
      // A CUDA graph recorded (global mode, as PyTorch does) from K kernels of N us on a stream,
      // each launch going through the library as any other; "captured K", or why not.
      CUstream stream = reinterpret_cast<CUstream>(uintptr_t{1});
      CUresult rc = cuStreamBeginCapture_v2(stream, 0);
      for (size_t k = 0; rc == CUDA_SUCCESS && k < n(2); ++k) {
        rc = api.LaunchKernel(nullptr, static_cast<unsigned>(n(1)), 1, 1, 1, 1, 1, 0, stream,
                              nullptr, nullptr);
        if (c.size() > 3 && c[3] == "sync") cuCtxSynchronize();  // what a capture must not see
      }
      CUgraph graph = nullptr;
      CUresult end = cuStreamEndCapture(stream, &graph);
      if (rc == CUDA_SUCCESS && end == CUDA_SUCCESS)
        printf("captured %zu\n", reinterpret_cast<uintptr_t>(graph) - 1);
      else
        printf("capture failed: launch %d, end %d\n", rc, end);
    } else if (c[0] == "capturerace") {
      // N graphs recorded one after another in one thread (global mode, one kernel each) while
      // another thread of the process launches kernels and never synchronizes itself: whatever
      // synchronize meets a capture is the library's. "captures N invalidated M".
      std::atomic<bool> done{false};
      std::thread launcher([&] {
        while (!done.load())
          api.LaunchKernel(nullptr, 20, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
      });
      CUstream stream = reinterpret_cast<CUstream>(uintptr_t{3});
      size_t invalidated = 0;
      for (size_t k = 0; k < n(1); ++k) {
        if (cuStreamBeginCapture_v2(stream, 0) != CUDA_SUCCESS) {
          ++invalidated;
          continue;
        }
        api.LaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr);
        CUgraph graph = nullptr;
        if (cuStreamEndCapture(stream, &graph) != CUDA_SUCCESS) ++invalidated;
      }
      done = true;
      launcher.join();
      printf("captures %zu invalidated %zu\n", static_cast<size_t>(n(1)), invalidated);
    } else if (c[0] == "capturebegin") {
      // A capture begun on a side stream in MODE (0 global, 1 thread-local, 2 relaxed) and never
      // ended, as a framework that leaves one open would; says only an error ("err N").
      const CUresult rc = cuStreamBeginCapture_v2(reinterpret_cast<CUstream>(uintptr_t{2}),
                                                  static_cast<CUstreamCaptureMode>(n(1)));
      if (rc != CUDA_SUCCESS) printf("err %d\n", rc);
    } else if (c[0] == "routes") {
      // Every hooked call through every route (dlsym of its versioned and per-thread names, both
      // cuGetProcAddress versions with each flag) must give the library's hook - the library's
      // export of that name, found first in the process - never the driver's own function.
      struct Hooked {
        const char* base;
        const char* versioned;
        const char* per_thread;  // "" when none
      };
      const Hooked hooked[] = {
          {"cuMemAlloc", "cuMemAlloc_v2", ""},
          {"cuMemAllocPitch", "cuMemAllocPitch_v2", ""},
          {"cuMemAllocManaged", "cuMemAllocManaged", ""},
          {"cuMemAllocAsync", "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
          {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
          {"cuMemFree", "cuMemFree_v2", ""},
          {"cuMemFreeAsync", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
          {"cuMemCreate", "cuMemCreate", ""},
          {"cuMemRelease", "cuMemRelease", ""},
          {"cuMemMap", "cuMemMap", ""},
          {"cuMemUnmap", "cuMemUnmap", ""},
          {"cuMemExportToShareableHandle", "cuMemExportToShareableHandle", ""},
          {"cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", ""},
          {"cuArrayCreate", "cuArrayCreate_v2", ""},
          {"cuArray3DCreate", "cuArray3DCreate_v2", ""},
          {"cuArrayDestroy", "cuArrayDestroy", ""},
          {"cuMipmappedArrayCreate", "cuMipmappedArrayCreate", ""},
          {"cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", ""},
          {"cuMemGetInfo", "cuMemGetInfo_v2", ""},
          {"cuMemPoolCreate", "cuMemPoolCreate", ""},
          {"cuMemPoolDestroy", "cuMemPoolDestroy", ""},
          {"cuMemPoolTrimTo", "cuMemPoolTrimTo", ""},
          {"cuModuleLoadData", "cuModuleLoadData", ""},
          {"cuModuleLoadDataEx", "cuModuleLoadDataEx", ""},
          {"cuModuleUnload", "cuModuleUnload", ""},
          {"cuModuleLoad", "cuModuleLoad", ""},
          {"cuModuleLoadFatBinary", "cuModuleLoadFatBinary", ""},
          {"cuLibraryLoadData", "cuLibraryLoadData", ""},
          {"cuLibraryLoadFromFile", "cuLibraryLoadFromFile", ""},
          {"cuLibraryUnload", "cuLibraryUnload", ""},
          {"cuCtxCreate", "cuCtxCreate_v2", ""},
          {"cuCtxDestroy", "cuCtxDestroy_v2", ""},
          {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", ""},
          {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", ""},
          {"cuDeviceTotalMem", "cuDeviceTotalMem_v2", ""},
          {"cuLaunchKernel", "cuLaunchKernel", "cuLaunchKernel_ptsz"},
          {"cuLaunchKernelEx", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
          {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel",
           "cuLaunchCooperativeKernel_ptsz"},
          {"cuGraphLaunch", "cuGraphLaunch", "cuGraphLaunch_ptsz"},
          {"cuStreamBeginCapture", "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz"},
          {"cuStreamEndCapture", "cuStreamEndCapture", "cuStreamEndCapture_ptsz"},
          {"cuCtxSynchronize", "cuCtxSynchronize", ""},
          {"cuStreamSynchronize", "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
          {"cuEventSynchronize", "cuEventSynchronize", ""},
      };
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      auto gpa1 = reinterpret_cast<cuGetProcAddress_fn>(dlsym(lib, "cuGetProcAddress"));
      auto gpa2 = reinterpret_cast<cuGetProcAddress_v2_fn>(dlsym(lib, "cuGetProcAddress_v2"));
      int checked = 0;
      // The driver's own function of that name (the fake says which that is).
      auto own = reinterpret_cast<void* (*)(const char*)>(dlsym(lib, "fakeCudaOwnSymbol"));
      auto check = [&](const char* name, const std::string& route, void* got, const char* want) {
        ++checked;
        void* hook = dlsym(RTLD_DEFAULT, want);
        if (got == nullptr || got != hook || (own && got == own(want)))
          printf("unhooked %s via %s\n", name, route.c_str());
      };
      for (const Hooked& h : hooked) {
        check(h.base, "dlsym", dlsym(lib, h.versioned), h.versioned);
        if (*h.per_thread) check(h.base, "dlsym ptsz", dlsym(lib, h.per_thread), h.per_thread);
        for (cuuint64_t flags : {0, 1, 2}) {
          const char* want = flags == 2 && *h.per_thread ? h.per_thread : h.versioned;
          void* p = nullptr;
          if (gpa1) gpa1(h.base, &p, 12040, flags);
          check(h.base, "cuGetProcAddress flags " + std::to_string(flags), p, want);
          p = nullptr;
          CUdriverProcAddressQueryResult status;
          if (gpa2) gpa2(h.base, &p, 12040, flags, &status);
          check(h.base, "cuGetProcAddress_v2 flags " + std::to_string(flags), p, want);
        }
      }
      printf("routes %d checked\n", checked);
    } else if (c[0] == "syncdie") {
      // A kernel of N us, then SIGKILLed inside the synchronize that waits for it.
      api.LaunchKernel(nullptr, static_cast<unsigned>(n(1)), 1, 1, 1, 1, 1, 0, nullptr, nullptr,
                       nullptr);
      std::thread([] {
        usleep(2000);
        raise(SIGKILL);
      }).detach();
      cuCtxSynchronize();
      puts("survived");
    } else if (c[0] == "crash") {
      fflush(stdout);
      raise(SIGKILL);
    } else {
      fprintf(stderr, "cuda_client: unknown command %s\n", argv[i]);
      return 2;
    }
    fflush(stdout);
  }
  return 0;
}
