#include "tessera/devices/nvml_library.h"

#include <dlfcn.h>

#include <initializer_list>

#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace tessera::devices {
namespace {

// Resolves the first name of `names` (newest version first) that the library exports.
// Returns the position in `names` of the one resolved (0 = newest), -1 when none is exported.
template <typename Fn>
int Resolve(void* handle, Fn*& out, std::initializer_list<const char*> names) {
  int pos = 0;
  for (const char* name : names) {
    if (void* sym = dlsym(handle, name)) {
      out = reinterpret_cast<Fn*>(sym);
      return pos;
    }
    ++pos;
  }
  out = nullptr;
  return -1;
}

absl::StatusCode CodeFor(nvmlReturn_t ret) {
  switch (ret) {
    case NVML_ERROR_NOT_SUPPORTED:
      return absl::StatusCode::kUnimplemented;
    case NVML_ERROR_NO_PERMISSION:
      return absl::StatusCode::kPermissionDenied;
    case NVML_ERROR_INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case NVML_ERROR_NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case NVML_ERROR_TIMEOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case NVML_ERROR_DRIVER_NOT_LOADED:
    case NVML_ERROR_GPU_IS_LOST:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmlLibrary>> NvmlLibrary::Load(const std::string& path) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::NotFoundError(
        fmt::format("no NVIDIA driver: cannot load {}: {}", path, err ? err : "unknown error"));
  }
  std::unique_ptr<NvmlLibrary> lib(new NvmlLibrary(handle, path));
  NvmlApi& a = lib->api_;
  Resolve(handle, a.Init, {"nvmlInit_v2", "nvmlInit"});
  Resolve(handle, a.Shutdown, {"nvmlShutdown"});
  Resolve(handle, a.ErrorString, {"nvmlErrorString"});
  Resolve(handle, a.DeviceGetCount, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
  Resolve(handle, a.DeviceGetHandleByIndex,
          {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  Resolve(handle, a.DeviceGetUUID, {"nvmlDeviceGetUUID"});

  std::string missing;
  auto require = [&](const void* fn, const char* name) {
    if (fn == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  require(reinterpret_cast<const void*>(a.Init), "nvmlInit_v2");
  require(reinterpret_cast<const void*>(a.Shutdown), "nvmlShutdown");
  require(reinterpret_cast<const void*>(a.ErrorString), "nvmlErrorString");
  require(reinterpret_cast<const void*>(a.DeviceGetCount), "nvmlDeviceGetCount_v2");
  require(reinterpret_cast<const void*>(a.DeviceGetHandleByIndex), "nvmlDeviceGetHandleByIndex_v2");
  require(reinterpret_cast<const void*>(a.DeviceGetUUID), "nvmlDeviceGetUUID");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        fmt::format("{}: not a usable NVML: missing required symbol(s) {}", path, missing));
  }

  Resolve(handle, a.SystemGetDriverVersion, {"nvmlSystemGetDriverVersion"});
  Resolve(handle, a.SystemGetCudaDriverVersion,
          {"nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"});
  Resolve(handle, a.DeviceGetName, {"nvmlDeviceGetName"});
  Resolve(handle, a.DeviceGetMemoryInfo_v2, {"nvmlDeviceGetMemoryInfo_v2"});
  Resolve(handle, a.DeviceGetMemoryInfo, {"nvmlDeviceGetMemoryInfo"});
  a.pci_info_version =
      3 - Resolve(handle, a.DeviceGetPciInfo,
                  {"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"});
  Resolve(handle, a.DeviceGetCudaComputeCapability, {"nvmlDeviceGetCudaComputeCapability"});
  Resolve(handle, a.DeviceGetEccMode, {"nvmlDeviceGetEccMode"});
  Resolve(handle, a.DeviceGetMigMode, {"nvmlDeviceGetMigMode"});
  Resolve(handle, a.DeviceGetNumaNodeId, {"nvmlDeviceGetNumaNodeId"});
  Resolve(handle, a.DeviceGetMinorNumber, {"nvmlDeviceGetMinorNumber"});
  Resolve(handle, a.DeviceGetTopologyCommonAncestor, {"nvmlDeviceGetTopologyCommonAncestor"});
  Resolve(handle, a.DeviceGetNvLinkState, {"nvmlDeviceGetNvLinkState"});
  // nvmlDeviceGetNvLinkRemotePciInfo_v2 writes today's nvmlPciInfo_t; the unversioned one the old
  // layout.
  a.nvlink_remote_pci_info_version =
      Resolve(handle, a.DeviceGetNvLinkRemotePciInfo,
              {"nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"}) == 0
          ? 3
          : 1;
  Resolve(handle, a.DeviceGetNvLinkRemoteDeviceType, {"nvmlDeviceGetNvLinkRemoteDeviceType"});
  Resolve(handle, a.DeviceGetUtilizationRates, {"nvmlDeviceGetUtilizationRates"});
  Resolve(handle, a.DeviceGetTemperature, {"nvmlDeviceGetTemperature"});
  Resolve(handle, a.DeviceGetPowerUsage, {"nvmlDeviceGetPowerUsage"});
  Resolve(handle, a.DeviceGetClockInfo, {"nvmlDeviceGetClockInfo"});
  Resolve(handle, a.DeviceGetTotalEnergyConsumption, {"nvmlDeviceGetTotalEnergyConsumption"});
  Resolve(handle, a.DeviceGetPcieReplayCounter, {"nvmlDeviceGetPcieReplayCounter"});
  Resolve(handle, a.DeviceGetPcieThroughput, {"nvmlDeviceGetPcieThroughput"});
  Resolve(handle, a.DeviceGetEncoderUtilization, {"nvmlDeviceGetEncoderUtilization"});
  Resolve(handle, a.DeviceGetDecoderUtilization, {"nvmlDeviceGetDecoderUtilization"});
  Resolve(handle, a.DeviceGetRemappedRows, {"nvmlDeviceGetRemappedRows"});
  Resolve(handle, a.DeviceGetFieldValues, {"nvmlDeviceGetFieldValues"});
  Resolve(handle, a.GpmQueryDeviceSupport, {"nvmlGpmQueryDeviceSupport"});
  Resolve(handle, a.GpmSampleAlloc, {"nvmlGpmSampleAlloc"});
  Resolve(handle, a.GpmSampleFree, {"nvmlGpmSampleFree"});
  Resolve(handle, a.GpmSampleGet, {"nvmlGpmSampleGet"});
  Resolve(handle, a.GpmMetricsGet, {"nvmlGpmMetricsGet"});
  Resolve(handle, a.EventSetCreate, {"nvmlEventSetCreate"});
  Resolve(handle, a.EventSetFree, {"nvmlEventSetFree"});
  Resolve(handle, a.EventSetWait, {"nvmlEventSetWait_v2", "nvmlEventSetWait"});
  Resolve(handle, a.DeviceGetSupportedEventTypes, {"nvmlDeviceGetSupportedEventTypes"});
  Resolve(handle, a.DeviceRegisterEvents, {"nvmlDeviceRegisterEvents"});

  nvmlReturn_t ret = a.Init();
  if (ret != NVML_SUCCESS) {
    return absl::UnavailableError(
        fmt::format("no usable NVIDIA driver: nvmlInit: {}", lib->ErrorText(ret)));
  }
  lib->initialised_ = true;
  spdlog::debug("nvml: loaded {}", path);
  return lib;
}

NvmlLibrary::~NvmlLibrary() {
  if (initialised_) {
    nvmlReturn_t ret = api_.Shutdown();
    if (ret != NVML_SUCCESS) spdlog::warn("nvml: nvmlShutdown: {}", ErrorText(ret));
  }
  dlclose(handle_);
}

std::string NvmlLibrary::ErrorText(nvmlReturn_t ret) const {
  const char* text = api_.ErrorString ? api_.ErrorString(ret) : nullptr;
  return fmt::format("{} ({})", text ? text : "unknown error", ret);
}

absl::Status NvmlLibrary::ToStatus(nvmlReturn_t ret, const std::string& what) const {
  if (ret == NVML_SUCCESS) return absl::OkStatus();
  return absl::Status(CodeFor(ret), fmt::format("{}: nvml: {}", what, ErrorText(ret)));
}

}  // namespace tessera::devices
