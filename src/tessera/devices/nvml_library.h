#pragma once
// NvmlLibrary: libnvidia-ml.so.1 opened with dlopen, its entry points resolved, NVML initialised
// once and shut down (and the library closed) when the object is destroyed. Owns the handle; not
// copyable. NVML itself is thread-safe, and so are the function pointers once Load() returned.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/devices/nvml_abi.h"

namespace tessera::devices {

// The NVML entry points Tessera uses. Required ones are never null after Load(); optional ones are
// null when the library lacks them, which makes the attribute they report unknown.
struct NvmlApi {
  // Required.
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*Shutdown)() = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*DeviceGetCount)(unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetHandleByIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*DeviceGetUUID)(nvmlDevice_t, char*, unsigned) = nullptr;

  // Optional.
  nvmlReturn_t (*SystemGetDriverVersion)(char*, unsigned) = nullptr;
  nvmlReturn_t (*SystemGetCudaDriverVersion)(int*) = nullptr;
  nvmlReturn_t (*DeviceGetName)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*DeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;
  nvmlReturn_t (*DeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  // Before _v3, NVML filled an older struct whose bus id sits where busIdLegacy is now: the
  // versions below say which layout the resolved function writes.
  nvmlReturn_t (*DeviceGetPciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  int pci_info_version = 0;
  nvmlReturn_t (*DeviceGetCudaComputeCapability)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*DeviceGetEccMode)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*DeviceGetMigMode)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetNumaNodeId)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetMinorNumber)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetTopologyCommonAncestor)(nvmlDevice_t, nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*DeviceGetNvLinkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*DeviceGetNvLinkRemotePciInfo)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  int nvlink_remote_pci_info_version = 0;
  nvmlReturn_t (*DeviceGetNvLinkRemoteDeviceType)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*DeviceGetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*DeviceGetTemperature)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetPowerUsage)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetClockInfo)(nvmlDevice_t, int, unsigned*) = nullptr;
  // dcgm-exporter's other default fields (devices/dcgm.cc); each optional (older drivers, boards).
  nvmlReturn_t (*DeviceGetTotalEnergyConsumption)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*DeviceGetPcieReplayCounter)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetPcieThroughput)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetEncoderUtilization)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetDecoderUtilization)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetRemappedRows)(nvmlDevice_t, unsigned*, unsigned*, unsigned*,
                                        unsigned*) = nullptr;
  nvmlReturn_t (*DeviceGetFieldValues)(nvmlDevice_t, int, nvmlFieldValue_t*) = nullptr;
  nvmlReturn_t (*GpmQueryDeviceSupport)(nvmlDevice_t, nvmlGpmSupport_t*) = nullptr;
  nvmlReturn_t (*GpmSampleAlloc)(nvmlGpmSample_t*) = nullptr;
  nvmlReturn_t (*GpmSampleFree)(nvmlGpmSample_t) = nullptr;
  nvmlReturn_t (*GpmSampleGet)(nvmlDevice_t, nvmlGpmSample_t) = nullptr;
  nvmlReturn_t (*GpmMetricsGet)(nvmlGpmMetricsGet_t*) = nullptr;
  nvmlReturn_t (*EventSetCreate)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*EventSetFree)(nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*EventSetWait)(nvmlEventSet_t, nvmlEventData_t*, unsigned) = nullptr;
  nvmlReturn_t (*DeviceGetSupportedEventTypes)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*DeviceRegisterEvents)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
};

class NvmlLibrary {
 public:
  // The library a production build opens: found through the dynamic linker's search path.
  static constexpr const char* kDefaultPath = "libnvidia-ml.so.1";

  // Opens `path` (a file name for the linker's search, or a path), resolves the entry points
  // (preferring the newest versioned name of each), and initialises NVML. On failure the status
  // says why in one line: kNotFound when the library cannot be opened (no driver installed),
  // kFailedPrecondition when a required symbol is missing, kUnavailable when nvmlInit fails (e.g.
  // the driver is not loaded).
  static absl::StatusOr<std::unique_ptr<NvmlLibrary>> Load(const std::string& path = kDefaultPath);

  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const NvmlApi& api() const { return api_; }
  const std::string& path() const { return path_; }

  // NVML's text for a return code, with the code: "Not Supported (3)".
  std::string ErrorText(nvmlReturn_t ret) const;
  // A Status carrying `what: <nvml text>` for a failed call; OK for NVML_SUCCESS.
  absl::Status ToStatus(nvmlReturn_t ret, const std::string& what) const;

 private:
  NvmlLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}

  void* handle_;
  std::string path_;
  NvmlApi api_;
  bool initialised_ = false;
};

}  // namespace tessera::devices
