#pragma once
// Our own declarations of the subset of the NVML C ABI that Tessera calls (names, values and field
// order as NVIDIA's nvml.h and its API reference give them). No NVIDIA header is needed to build:
// symbols are resolved with dlsym at run time. Field order is ABI.

#include <cstdint>

extern "C" {

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;

enum : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_ALREADY_INITIALIZED = 5,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_RESET_REQUIRED = 16,
  NVML_ERROR_UNKNOWN = 999,
};

enum : int {
  NVML_TOPOLOGY_INTERNAL = 0,
  NVML_TOPOLOGY_SINGLE = 10,
  NVML_TOPOLOGY_MULTIPLE = 20,
  NVML_TOPOLOGY_HOSTBRIDGE = 30,
  NVML_TOPOLOGY_NODE = 40,
  NVML_TOPOLOGY_SYSTEM = 50,
};

// nvmlIntNvLinkDeviceType_t
enum : int {
  NVML_NVLINK_DEVICE_TYPE_GPU = 0,
  NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1,
  NVML_NVLINK_DEVICE_TYPE_SWITCH = 2,
  NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF,
};

constexpr unsigned long long nvmlEventTypeSingleBitEccError = 0x1ULL;
constexpr unsigned long long nvmlEventTypeDoubleBitEccError = 0x2ULL;
constexpr unsigned long long nvmlEventTypeXidCriticalError = 0x8ULL;
constexpr unsigned long long nvmlEventTypeGpuUnavailableError = 0x4000ULL;

// nvmlTemperatureSensors_t: the GPU die sensor.
constexpr int kNvmlTemperatureGpu = 0;
// nvmlPcieUtilCounter_t for nvmlDeviceGetPcieThroughput (KB/s over the last 20 ms).
constexpr int kNvmlPcieUtilTxBytes = 0, kNvmlPcieUtilRxBytes = 1;

constexpr unsigned kNvmlDeviceNameBufferSize = 96;
constexpr unsigned kNvmlUuidBufferSize = 96;
constexpr unsigned kNvmlDriverVersionBufferSize = 80;

typedef struct {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;
constexpr unsigned kNvmlMemoryV2Version = sizeof(nvmlMemory_v2_t) | (2u << 24);

typedef struct {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;

typedef struct {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

// nvmlDeviceGetFieldValues: one entry per field asked (fieldId set by the caller), each answered
// with its own return code and a value of `valueType` (nvmlValueType_t) in the 8-byte union.
constexpr unsigned NVML_FI_DEV_MEMORY_TEMP = 82;  // memory temperature, C (HBM boards)
// NVLink data payload sent and received since the driver loaded, KiB: scopeId is a link, or
// kNvmlScopeAllLinks for the sum over every link (NOT_SUPPORTED without NVLink).
constexpr unsigned NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138;
constexpr unsigned NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139;
constexpr unsigned kNvmlScopeAllLinks = 0xFFFFFFFFu;
enum : int {
  kNvmlValueDouble = 0,
  kNvmlValueUnsignedInt = 1,
  kNvmlValueUnsignedLong = 2,
  kNvmlValueUnsignedLongLong = 3,
  kNvmlValueSignedLongLong = 4,
  kNvmlValueSignedInt = 5,
};
typedef union {
  double dVal;
  int siVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  long long sllVal;
} nvmlValue_t;
typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
} nvmlFieldValue_t;
static_assert(sizeof(nvmlFieldValue_t) == 40);

// A process on a GPU (nvmlDevice{Compute,Graphics}RunningProcesses): the first version's
// record, and the one of _v2 and _v3 (with the MIG instance it runs on).
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlEventData_t;

// nvmlClockType_t
enum : int { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };

// GPU performance monitoring (GPM; Hopper and later): two samples taken apart give each metric's
// average over the time between them.
typedef struct nvmlGpmSample_st* nvmlGpmSample_t;
constexpr unsigned NVML_GPM_SUPPORT_VERSION = 1;
typedef struct {
  unsigned int version;
  unsigned int isSupportedDevice;
} nvmlGpmSupport_t;
// nvmlGpmMetricId_t: percent of the time the SMs did any tensor (HMMA/IMMA/DFMA) work, 0..100.
constexpr unsigned NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5;
// Percent of the DRAM bandwidth used against its theoretical maximum, 0..100.
constexpr unsigned NVML_GPM_METRIC_DRAM_BW_UTIL = 10;
typedef struct {
  unsigned int metricId;
  nvmlReturn_t nvmlReturn;
  double value;
  struct {
    char* shortName;
    char* longName;
    char* unit;
  } metricInfo;
} nvmlGpmMetric_t;
constexpr unsigned NVML_GPM_METRICS_GET_VERSION = 1;
// The library reads and writes the first numMetrics entries; headers size the array by their
// NVML_GPM_METRIC_MAX (98 at first, more since), so any size holding what is asked is the ABI.
constexpr unsigned kGpmMetricSlots = 256;
typedef struct {
  unsigned int version;
  unsigned int numMetrics;
  nvmlGpmSample_t sample1;
  nvmlGpmSample_t sample2;
  nvmlGpmMetric_t metrics[kGpmMetricSlots];
} nvmlGpmMetricsGet_t;

}  // extern "C"
