#pragma once
// Our own minimal declarations of the CUDA driver API subset the intercept library hooks and the
// test double implements (types, result codes, signatures), matching the ABI of libcuda.so.1 (CUDA
// 12): 64-bit CUdeviceptr, the _v2 entry points, cuGetProcAddress (4 arguments) and
// cuGetProcAddress_v2 (5 arguments). Plain C so both sides can include it.

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int CUresult;
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_ILLEGAL_STATE = 401,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
  CUDA_ERROR_UNKNOWN = 999,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUfunc_st* CUfunction;
typedef struct CUarray_st* CUarray;
typedef struct CUmipmappedArray_st* CUmipmappedArray;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUgraph_st* CUgraph;
typedef int CUstreamCaptureMode;    // 0 global, 1 thread-local, 2 relaxed
typedef int CUstreamCaptureStatus;  // 0 none, 1 active, 2 invalidated
// Where a cuMemCreate allocation lives (CUmemLocation): type 1 a device (id: its ordinal), 2 the
// host, 3 a host NUMA node, 4 the current thread's host NUMA node.
typedef struct CUmemLocation_st {
  int type;
  int id;
} CUmemLocation;
enum {
  CU_MEM_LOCATION_TYPE_DEVICE = 1,
};
typedef struct CUmemAllocationProp_st {
  int type;  // CUmemAllocationType
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;
// A memory pool's properties (cuMemPoolCreate): where its memory lives.
typedef struct CUmemPoolProps_st {
  int allocType;    // CUmemAllocationType
  int handleTypes;  // CUmemAllocationHandleType
  CUmemLocation location;
  void* win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
} CUmemPoolProps;
typedef int CUmemPool_attribute;  // values are cuuint64_t for the ones below
enum {
  CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
  CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
  CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
};
// CUDA graphs' memory nodes: an allocation made when the graph runs, from the device's graph
// memory pool, which keeps it (for the next launch) until cuDeviceGraphMemTrim.
typedef struct CUgraphNode_st* CUgraphNode;
typedef int CUgraphNodeType;
enum {
  CU_GRAPH_NODE_TYPE_KERNEL = 0,
  CU_GRAPH_NODE_TYPE_EMPTY = 5,
  CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
  CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
};
typedef struct CUmemAccessDesc_st {
  CUmemLocation location;
  int flags;  // CUmemAccess_flags
} CUmemAccessDesc;
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
  CUmemPoolProps poolProps;  // location: the device the memory is on
  const CUmemAccessDesc* accessDescs;
  size_t accessDescCount;
  size_t bytesize;
  CUdeviceptr dptr;  // out: the allocation's address
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef int CUgraphMem_attribute;  // values are cuuint64_t
enum {
  CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
  CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
  CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
  CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3,
};
typedef struct CUevent_st* CUevent;
typedef struct CUlaunchAttribute_st CUlaunchAttribute;  // opaque here
typedef struct CUlaunchConfig_st {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned int numAttrs;
} CUlaunchConfig;
typedef int CUdriverProcAddressQueryResult;

typedef enum {
  CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
  CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
  CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
  CU_AD_FORMAT_SIGNED_INT8 = 0x08,
  CU_AD_FORMAT_SIGNED_INT16 = 0x09,
  CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
  CU_AD_FORMAT_HALF = 0x10,
  CU_AD_FORMAT_FLOAT = 0x20,
} CUarray_format;

typedef struct {
  size_t Width;
  size_t Height;
  CUarray_format Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
  size_t Width;
  size_t Height;
  size_t Depth;
  CUarray_format Format;
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

// The hooked entry points, as function pointer types (name_fn).
typedef CUresult (*cuInit_fn)(unsigned int);
typedef CUresult (*cuMemAlloc_v2_fn)(CUdeviceptr*, size_t);
typedef CUresult (*cuMemAllocPitch_v2_fn)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
typedef CUresult (*cuMemAllocManaged_fn)(CUdeviceptr*, size_t, unsigned int);
typedef CUresult (*cuMemAllocAsync_fn)(CUdeviceptr*, size_t, CUstream);
typedef CUresult (*cuMemAllocFromPoolAsync_fn)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
typedef CUresult (*cuMemFree_v2_fn)(CUdeviceptr);
typedef CUresult (*cuMemFreeAsync_fn)(CUdeviceptr, CUstream);
typedef CUresult (*cuMemCreate_fn)(CUmemGenericAllocationHandle*, size_t,
                                   const CUmemAllocationProp*, unsigned long long);
typedef CUresult (*cuMemRelease_fn)(CUmemGenericAllocationHandle);
// Virtual memory management: an address range reserved, a handle's memory mapped into it.
typedef CUresult (*cuMemAddressReserve_fn)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                           unsigned long long);
typedef CUresult (*cuMemAddressFree_fn)(CUdeviceptr, size_t);
typedef CUresult (*cuMemMap_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                unsigned long long);
typedef CUresult (*cuMemUnmap_fn)(CUdeviceptr, size_t);
// Sharing a handle's memory between processes: a POSIX descriptor (`*(int*)out`, imported from the
// descriptor cast to a pointer) or a 64-byte fabric handle (out and in by address).
enum { CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1, CU_MEM_HANDLE_TYPE_FABRIC = 8 };
typedef CUresult (*cuMemExportToShareableHandle_fn)(void*, CUmemGenericAllocationHandle, int,
                                                    unsigned long long);
typedef CUresult (*cuMemImportFromShareableHandle_fn)(CUmemGenericAllocationHandle*, void*, int);
typedef CUresult (*cuMemGetAllocationPropertiesFromHandle_fn)(CUmemAllocationProp*,
                                                              CUmemGenericAllocationHandle);
typedef CUresult (*cuArrayCreate_v2_fn)(CUarray*, const CUDA_ARRAY_DESCRIPTOR*);
typedef CUresult (*cuArray3DCreate_v2_fn)(CUarray*, const CUDA_ARRAY3D_DESCRIPTOR*);
typedef CUresult (*cuArrayDestroy_fn)(CUarray);
typedef CUresult (*cuMipmappedArrayCreate_fn)(CUmipmappedArray*, const CUDA_ARRAY3D_DESCRIPTOR*,
                                              unsigned int);
typedef CUresult (*cuMipmappedArrayDestroy_fn)(CUmipmappedArray);
typedef CUresult (*cuMemGetInfo_v2_fn)(size_t*, size_t*);
typedef CUresult (*cuDeviceTotalMem_v2_fn)(size_t*, CUdevice);
typedef CUresult (*cuCtxGetDevice_fn)(CUdevice*);
typedef CUresult (*cuCtxCreate_v2_fn)(CUcontext*, unsigned int, CUdevice);
typedef struct CUexecAffinityParam_st CUexecAffinityParam;  // opaque here
typedef struct CUctxCreateParams_st CUctxCreateParams;      // opaque here
typedef CUresult (*cuCtxCreate_v3_fn)(CUcontext*, CUexecAffinityParam*, int, unsigned int,
                                      CUdevice);
typedef CUresult (*cuCtxCreate_v4_fn)(CUcontext*, CUctxCreateParams*, unsigned int, CUdevice);
typedef CUresult (*cuCtxDestroy_v2_fn)(CUcontext);
typedef CUresult (*cuDevicePrimaryCtxRetain_fn)(CUcontext*, CUdevice);
typedef CUresult (*cuDevicePrimaryCtxRelease_v2_fn)(CUdevice);
typedef CUresult (*cuLaunchKernel_fn)(CUfunction, unsigned int, unsigned int, unsigned int,
                                      unsigned int, unsigned int, unsigned int, unsigned int,
                                      CUstream, void**, void**);
typedef CUresult (*cuLaunchKernelEx_fn)(const CUlaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*cuLaunchCooperativeKernel_fn)(CUfunction, unsigned int, unsigned int,
                                                 unsigned int, unsigned int, unsigned int,
                                                 unsigned int, unsigned int, CUstream, void**);
typedef CUresult (*cuGraphLaunch_fn)(CUgraphExec, CUstream);
typedef CUresult (*cuGraphInstantiateWithFlags_fn)(CUgraphExec*, CUgraph, unsigned long long);
typedef CUresult (*cuGraphExecDestroy_fn)(CUgraphExec);
typedef CUresult (*cuGraphGetNodes_fn)(CUgraph, CUgraphNode*, size_t*);
typedef CUresult (*cuGraphNodeGetType_fn)(CUgraphNode, CUgraphNodeType*);
typedef CUresult (*cuGraphMemAllocNodeGetParams_fn)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS*);
typedef CUresult (*cuDeviceGetGraphMemAttribute_fn)(CUdevice, CUgraphMem_attribute, void*);
typedef CUresult (*cuDeviceGraphMemTrim_fn)(CUdevice);
typedef struct CUmod_st* CUmodule;
typedef int CUjit_option;
typedef CUresult (*cuModuleLoadData_fn)(CUmodule*, const void*);
typedef CUresult (*cuModuleLoadDataEx_fn)(CUmodule*, const void*, unsigned int, CUjit_option*,
                                          void**);
typedef CUresult (*cuModuleUnload_fn)(CUmodule);
typedef CUresult (*cuModuleLoad_fn)(CUmodule*, const char*);
typedef CUresult (*cuModuleLoadFatBinary_fn)(CUmodule*, const void*);
// CUDA 12's context-independent loading (what the CUDA 12 runtime loads a program's kernels with).
typedef struct CUlib_st* CUlibrary;
typedef int CUlibraryOption;
typedef CUresult (*cuLibraryLoadData_fn)(CUlibrary*, const void*, CUjit_option*, void**,
                                         unsigned int, CUlibraryOption*, void**, unsigned int);
typedef CUresult (*cuLibraryLoadFromFile_fn)(CUlibrary*, const char*, CUjit_option*, void**,
                                             unsigned int, CUlibraryOption*, void**, unsigned int);
typedef CUresult (*cuLibraryUnload_fn)(CUlibrary);
typedef CUresult (*cuMemPoolCreate_fn)(CUmemoryPool*, const CUmemPoolProps*);
typedef CUresult (*cuMemPoolDestroy_fn)(CUmemoryPool);
typedef CUresult (*cuMemPoolTrimTo_fn)(CUmemoryPool, size_t);
typedef CUresult (*cuMemPoolGetAttribute_fn)(CUmemoryPool, CUmemPool_attribute, void*);
typedef CUresult (*cuDeviceGetMemPool_fn)(CUmemoryPool*, CUdevice);
typedef CUresult (*cuCtxSynchronize_fn)(void);
typedef CUresult (*cuStreamBeginCapture_v2_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*cuStreamEndCapture_fn)(CUstream, CUgraph*);
typedef CUresult (*cuStreamSynchronize_fn)(CUstream);
typedef CUresult (*cuEventSynchronize_fn)(CUevent);
typedef CUresult (*cuEventCreate_fn)(CUevent*, unsigned int);
typedef CUresult (*cuEventRecord_fn)(CUevent, CUstream);
typedef CUresult (*cuEventQuery_fn)(CUevent);
typedef CUresult (*cuEventElapsedTime_fn)(float*, CUevent, CUevent);
// Per-thread default stream variants (what `--default-stream per-thread` code calls, and what
// cuGetProcAddress hands out with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM): same signatures.
typedef cuMemAllocAsync_fn cuMemAllocAsync_ptsz_fn;
typedef cuMemAllocFromPoolAsync_fn cuMemAllocFromPoolAsync_ptsz_fn;
typedef cuMemFreeAsync_fn cuMemFreeAsync_ptsz_fn;
typedef cuLaunchKernel_fn cuLaunchKernel_ptsz_fn;
typedef cuLaunchKernelEx_fn cuLaunchKernelEx_ptsz_fn;
typedef cuLaunchCooperativeKernel_fn cuLaunchCooperativeKernel_ptsz_fn;
typedef cuGraphLaunch_fn cuGraphLaunch_ptsz_fn;
typedef cuStreamSynchronize_fn cuStreamSynchronize_ptsz_fn;
typedef cuStreamBeginCapture_v2_fn cuStreamBeginCapture_v2_ptsz_fn;
typedef cuStreamEndCapture_fn cuStreamEndCapture_ptsz_fn;
enum {
  CU_GET_PROC_ADDRESS_DEFAULT = 0,
  CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};
typedef CUresult (*cuGetProcAddress_fn)(const char*, void**, int, cuuint64_t);
typedef CUresult (*cuGetProcAddress_v2_fn)(const char*, void**, int, cuuint64_t,
                                           CUdriverProcAddressQueryResult*);

#ifdef __cplusplus
}
#endif
