// libtessera-cuda.so: allocations and frees of every kind (device memory, managed, async and
// pooled, VMM handles, arrays), memory pools and graph memory, and the memory the process is told
// it has (cuMemGetInfo, cuDeviceTotalMem): each counted against the job's limit in its region.
#include <fcntl.h>
#include <unistd.h>

#include "tessera/shim/hooks.h"

using namespace tessera::shim;  // NOLINT: the hooks are C entry points over the shared state

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

namespace {
// Handle `h` is gone from this process (released, and its last mapping here unmapped): its charge
// given back - or, for memory shared with other processes of the job, this process's part in it
// (Region::Leave passes the charge to another holder, or gives it back with the last).
void LetGo(uint64_t h) {
  uint64_t id = 0;
  int kept = -1;
  std::pair<uint64_t, int> foreign{0, -1};
  {
    std::lock_guard lock(*held_mu);
    if (auto it = vmm->shared.find(h); it != vmm->shared.end()) {
      const uint64_t of = it->second;
      vmm->shared.erase(it);
      auto e = vmm->ids.find(of);
      if (e != vmm->ids.end() && --e->second.first <= 0) {
        id = of;
        kept = e->second.second;
        vmm->ids.erase(e);
      }
      if (id == 0) return;  // another handle of it here still holds it
    } else if (auto f = vmm->foreign.find(h); f != vmm->foreign.end()) {
      foreign = f->second;
      vmm->foreign.erase(f);
    }
  }
  if (id != 0) {
    region->Leave(id);
    if (kept >= 0) close(kept);
  } else if (foreign.second >= 0) {
    if (foreign.first > 0) region->Release(foreign.second, foreign.first);
  } else {
    Uncount(kHandle, h);
  }
}

// This process's copy of a descriptor it exports or imports: the witness by which the job's other
// processes recognise the same memory (kcmp); -1 when it cannot be made.
int KeepCopy(int fd) { return fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1; }
}  // namespace

// Memory exported to be shared with other processes becomes the job's shared memory, charged once
// while any process of the job holds it (RegionData::shared). The charge stays this process's
// until it lets go; then it passes to another holder.
TESSERA_EXPORT CUresult cuMemExportToShareableHandle(void* out, CUmemGenericAllocationHandle handle,
                                                     int type, unsigned long long flags) {
  if (!Ready() || real.cuMemExportToShareableHandle == nullptr || vmm == nullptr)
    return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult rc = real.cuMemExportToShareableHandle(out, handle, type, flags);
  if (rc != CUDA_SUCCESS || out == nullptr) return rc;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && type != CU_MEM_HANDLE_TYPE_FABRIC)
    return rc;  // Windows handles: not on this platform
  const bool fd_type = type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const int kept = fd_type ? KeepCopy(*static_cast<const int*>(out)) : -1;
  const auto* fabric = fd_type ? nullptr : static_cast<const uint8_t*>(out);
  uint64_t id = 0;
  {
    std::lock_guard lock(*held_mu);
    if (auto it = vmm->shared.find(handle); it != vmm->shared.end()) id = it->second;
  }
  if (id != 0) {  // exported again: one more witness, if this process has none
    bool keep = false;
    {
      std::lock_guard lock(*held_mu);
      auto& e = vmm->ids[id];
      if (e.second < 0 && kept >= 0) e.second = kept, keep = true;
    }
    if (keep) {
      region->AddWitness(id, kept);
    } else if (kept >= 0) {
      close(kept);
    }
    return rc;
  }
  Held held;
  if (!Forget(kHandle, handle, &held)) {  // not memory this process charged (on the host)
    if (kept >= 0) close(kept);
    return rc;
  }
  id = region->Share(held.device, held.bytes, kept, fabric);
  bool remembered = false;
  if (id != 0) {
    try {
      std::lock_guard lock(*held_mu);
      vmm->shared[handle] = id;
      vmm->ids[id] = {1, kept};
      remembered = true;
    } catch (...) {
    }
    if (!remembered) region->Leave(id);  // gives the charge back: charged again below
  }
  if (!remembered) {
    // Not shared (a region without the table, the table full): this process's alone, as before;
    // an importer then charges it again (too much, never too little).
    if (kept >= 0) close(kept);
    if (id != 0) region->Reserve(held.device, held.bytes);
    Remember(kHandle, handle, held);
  }
  return rc;
}

// An imported handle of the job's shared memory holds no new memory: this process joins its
// holders. Imported memory that is not the job's (another job's export, or no way to tell) is
// charged as this process's own while mapped.
TESSERA_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                       void* os_handle, int type) {
  if (!Ready() || real.cuMemImportFromShareableHandle == nullptr || vmm == nullptr)
    return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult rc = real.cuMemImportFromShareableHandle(handle, os_handle, type);
  if (rc != CUDA_SUCCESS || handle == nullptr) return rc;
  const bool fd_type = type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const int fd = fd_type ? static_cast<int>(reinterpret_cast<intptr_t>(os_handle)) : -1;
  const auto* fabric =
      type == CU_MEM_HANDLE_TYPE_FABRIC ? static_cast<const uint8_t*>(os_handle) : nullptr;
  const int kept = KeepCopy(fd);
  int device = -1;
  uint64_t bytes = 0;
  const uint64_t id =
      fd >= 0 || fabric != nullptr ? region->Join(fd, fabric, kept, &device, &bytes) : 0;
  bool close_kept = id == 0;
  try {
    std::lock_guard lock(*held_mu);
    if (id != 0) {
      vmm->shared[*handle] = id;
      auto [e, fresh] = vmm->ids.try_emplace(id, 0, kept);
      ++e->second.first;
      close_kept = !fresh;  // this process holds it already: one witness is enough
    } else {
      CUmemAllocationProp prop{};
      const bool known =
          real.cuMemGetAllocationPropertiesFromHandle != nullptr &&
          real.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) == CUDA_SUCCESS &&
          prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE;
      vmm->foreign[*handle] = {0, known ? prop.location.id : CurrentDevice()};
    }
  } catch (...) {
  }
  if (close_kept && kept >= 0) close(kept);
  return rc;
}

// A handle released while it is mapped keeps its memory (the driver frees it at the last unmap):
// it stays charged until then. NVIDIA's memmap sample releases right after mapping; 12 x 256 MiB
// were live under a 1 GiB limit when the release gave the charge back.
TESSERA_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (!Ready() || real.cuMemRelease == nullptr || vmm == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemRelease(handle);
  if (rc != CUDA_SUCCESS) return rc;
  {
    std::lock_guard lock(*held_mu);
    if (auto it = vmm->mapped.find(handle); it != vmm->mapped.end() && it->second > 0) {
      vmm->released.insert(handle);
      return rc;
    }
  }
  LetGo(handle);
  return rc;
}

TESSERA_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (!Ready() || real.cuMemMap == nullptr || vmm == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemMap(ptr, size, offset, handle, flags);
  if (rc != CUDA_SUCCESS) return rc;
  bool fits = true;
  try {
    std::lock_guard lock(*held_mu);
    // Another job's memory imported here: charged as this process's, its largest mapping.
    if (auto f = vmm->foreign.find(handle); f != vmm->foreign.end() && size > f->second.first) {
      fits = region->Reserve(f->second.second, size - f->second.first);
      if (fits) f->second.first = size;
    }
    if (fits) {
      vmm->mappings[ptr] = {size, handle};
      ++vmm->mapped[handle];
    }
  } catch (...) {
    // Not remembered, its release would give the charge back early: undone instead.
    fits = false;
  }
  if (!fits) {
    real.cuMemUnmap(ptr, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return rc;
}

TESSERA_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  if (!Ready() || real.cuMemUnmap == nullptr || vmm == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = real.cuMemUnmap(ptr, size);
  if (rc != CUDA_SUCCESS) return rc;
  // Every mapping in the range goes; a released handle whose last it was gives its charge back.
  std::vector<uint64_t> gone;
  try {
    std::lock_guard lock(*held_mu);
    auto it = vmm->mappings.lower_bound(ptr);
    while (it != vmm->mappings.end() && it->first < ptr + size) {
      const uint64_t h = it->second.second;
      auto m = vmm->mapped.find(h);
      if (m != vmm->mapped.end() && --m->second <= 0) {
        vmm->mapped.erase(m);
        if (vmm->released.erase(h) != 0) gone.push_back(h);
      }
      it = vmm->mappings.erase(it);
    }
  } catch (...) {
    // Out of memory for the list: those handles stay charged (fail closed: too much, never less).
  }
  for (uint64_t h : gone) LetGo(h);
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
