#include "tessera/devices/nvml_source.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <tuple>

#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace tessera::devices {
namespace {

core::PcieLevel LevelFromNvml(int level) {
  switch (level) {
    case NVML_TOPOLOGY_INTERNAL:
      return core::PcieLevel::kBoard;
    case NVML_TOPOLOGY_SINGLE:
      return core::PcieLevel::kSingleSwitch;
    case NVML_TOPOLOGY_MULTIPLE:
      return core::PcieLevel::kMultipleSwitches;
    case NVML_TOPOLOGY_HOSTBRIDGE:
      return core::PcieLevel::kHostBridge;
    case NVML_TOPOLOGY_NODE:
      return core::PcieLevel::kNumaNode;
    case NVML_TOPOLOGY_SYSTEM:
      return core::PcieLevel::kSystem;
    default:
      return core::PcieLevel::kUnknown;
  }
}

// Reads /sys/bus/pci/devices/<bus id>/numa_node under `root`; nullopt when absent or -1.
std::optional<int> NumaFromSysfs(const std::string& root, const std::string& bus_id) {
  std::string canonical = CanonicalPciBusId(bus_id);
  if (canonical.empty()) return std::nullopt;
  // sysfs names the device with a 4-digit, lower-case domain: 0000:18:00.0.
  std::string name = canonical.substr(4);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::ifstream in(root + "/sys/bus/pci/devices/" + name + "/numa_node");
  int node = -1;
  if (!(in >> node) || node < 0) return std::nullopt;
  return node;
}

// The bus id from a struct filled by a call of the given layout version (see NvmlApi).
std::string BusIdOf(nvmlPciInfo_t& pci, int version) {
  pci.busId[sizeof pci.busId - 1] = '\0';
  pci.busIdLegacy[sizeof pci.busIdLegacy - 1] = '\0';
  std::string raw = version >= 3 ? pci.busId : pci.busIdLegacy;
  std::string canonical = CanonicalPciBusId(raw);
  return canonical.empty() ? raw : canonical;
}

std::string CudaVersionText(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

// A field value the driver answered, as a number; none when it could not read it or its type is
// one this build does not know (no reading rather than a wrong one).
std::optional<double> FieldValue(const nvmlFieldValue_t& v) {
  if (v.nvmlReturn != NVML_SUCCESS) return std::nullopt;
  switch (v.valueType) {
    case kNvmlValueDouble:
      return v.value.dVal;
    case kNvmlValueUnsignedInt:
      return v.value.uiVal;
    case kNvmlValueSignedInt:
      return v.value.siVal;
    case kNvmlValueUnsignedLong:
      return static_cast<double>(v.value.ulVal);
    case kNvmlValueUnsignedLongLong:
      return static_cast<double>(v.value.ullVal);
    case kNvmlValueSignedLongLong:
      return static_cast<double>(v.value.sllVal);
    default:
      return std::nullopt;
  }
}

}  // namespace

std::string CanonicalPciBusId(std::string_view bus_id) {
  // domain:bus:device.function, each a run of hex digits with a range.
  auto field = [&](char sep, unsigned max, unsigned& out) {
    size_t end = sep ? bus_id.find(sep) : bus_id.size();
    if (end == 0 || end == std::string_view::npos || end > 8) return false;
    out = 0;
    for (char c : bus_id.substr(0, end)) {
      if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
      out = out * 16 +
            (std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    bus_id.remove_prefix(sep ? end + 1 : end);
    return out <= max;
  };
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  if (!field(':', 0xffffffffu, domain) || !field(':', 0xff, bus) || !field('.', 0x1f, device) ||
      !field('\0', 7, function)) {
    return "";
  }
  return fmt::format("{:08X}:{:02X}:{:02X}.{:X}", domain, bus, device, function);
}

absl::StatusOr<std::unique_ptr<NvmlSource>> NvmlSource::Create(const NvmlSourceOptions& options) {
  auto lib = NvmlLibrary::Load(options.library_path);
  if (!lib.ok()) return lib.status();
  const NvmlApi& api = (*lib)->api();
  unsigned count = 0;
  nvmlReturn_t ret = api.DeviceGetCount(&count);
  if (ret != NVML_SUCCESS) return (*lib)->ToStatus(ret, "nvmlDeviceGetCount");
  std::vector<nvmlDevice_t> handles(count);
  for (unsigned i = 0; i < count; ++i) {
    ret = api.DeviceGetHandleByIndex(i, &handles[i]);
    if (ret != NVML_SUCCESS) {
      return (*lib)->ToStatus(ret, fmt::format("gpu {}: nvmlDeviceGetHandleByIndex", i));
    }
  }
  return std::unique_ptr<NvmlSource>(new NvmlSource(std::move(*lib), options, std::move(handles)));
}

NvmlSource::~NvmlSource() {
  {
    core::MutexLock lock(gpm_mu_);
    for (Gpm& g : gpm_) {
      for (nvmlGpmSample_t sample : {g.previous, g.current}) {
        if (sample != nullptr && lib_->api().GpmSampleFree) lib_->api().GpmSampleFree(sample);
      }
    }
  }
  core::MutexLock lock(mu_);
  if (event_set_ != nullptr && lib_->api().EventSetFree) lib_->api().EventSetFree(event_set_);
}

std::pair<std::optional<double>, std::optional<double>> NvmlSource::ReadGpm(int index) {
  const NvmlApi& api = lib_->api();
  if (!api.GpmQueryDeviceSupport || !api.GpmSampleAlloc || !api.GpmSampleGet ||
      !api.GpmMetricsGet) {
    return {};
  }
  core::MutexLock lock(gpm_mu_);
  if (gpm_.size() < handles_.size()) gpm_.resize(handles_.size());
  Gpm& g = gpm_[static_cast<size_t>(index)];
  if (g.supported < 0) {
    nvmlGpmSupport_t support = {};
    support.version = NVML_GPM_SUPPORT_VERSION;
    g.supported = api.GpmQueryDeviceSupport(handles_[index], &support) == NVML_SUCCESS &&
                          support.isSupportedDevice != 0 &&
                          api.GpmSampleAlloc(&g.previous) == NVML_SUCCESS &&
                          api.GpmSampleAlloc(&g.current) == NVML_SUCCESS
                      ? 1
                      : 0;
  }
  if (g.supported == 0) return {};
  if (api.GpmSampleGet(handles_[index], g.current) != NVML_SUCCESS) {
    g.have_previous = false;
    return {};
  }
  std::pair<std::optional<double>, std::optional<double>> out;
  if (g.have_previous) {
    // Large (10 KiB): one per reading would do on the stack, but a reader thread's stack is not
    // ours to spend.
    auto get = std::make_unique<nvmlGpmMetricsGet_t>();
    get->version = NVML_GPM_METRICS_GET_VERSION;
    get->numMetrics = 2;
    get->sample1 = g.previous;
    get->sample2 = g.current;
    get->metrics[0].metricId = NVML_GPM_METRIC_ANY_TENSOR_UTIL;
    get->metrics[1].metricId = NVML_GPM_METRIC_DRAM_BW_UTIL;
    if (api.GpmMetricsGet(get.get()) == NVML_SUCCESS) {
      auto ratio = [&](int i) -> std::optional<double> {
        const nvmlGpmMetric_t& m = get->metrics[i];
        if (m.nvmlReturn != NVML_SUCCESS || m.value < 0) return std::nullopt;
        return std::min(m.value, 100.0) / 100.0;
      };
      out = {ratio(0), ratio(1)};
    }
  }
  std::swap(g.previous, g.current);
  g.have_previous = true;
  return out;
}

absl::StatusOr<core::NodeInventory> NvmlSource::Discover() {
  const NvmlApi& api = lib_->api();
  core::NodeInventory inv;
  inv.source = "nvml";
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) inv.hostname = host;
  if (api.SystemGetDriverVersion) {
    char buf[kNvmlDriverVersionBufferSize] = {};
    if (api.SystemGetDriverVersion(buf, sizeof buf) == NVML_SUCCESS) inv.driver_version = buf;
  }
  if (api.SystemGetCudaDriverVersion) {
    int v = 0;
    if (api.SystemGetCudaDriverVersion(&v) == NVML_SUCCESS)
      inv.cuda_driver_version = CudaVersionText(v);
  }

  for (size_t i = 0; i < handles_.size(); ++i) {
    nvmlDevice_t dev = handles_[i];
    core::Gpu gpu;
    gpu.index = static_cast<int>(i);
    char buf[kNvmlUuidBufferSize] = {};
    nvmlReturn_t ret = api.DeviceGetUUID(dev, buf, sizeof buf);
    if (ret != NVML_SUCCESS)
      return lib_->ToStatus(ret, fmt::format("gpu {}: nvmlDeviceGetUUID", i));
    gpu.uuid = buf;

    if (api.DeviceGetName) {
      char name[kNvmlDeviceNameBufferSize] = {};
      if (api.DeviceGetName(dev, name, sizeof name) == NVML_SUCCESS) gpu.model = name;
    }
    bool have_memory = false;
    if (api.DeviceGetMemoryInfo_v2) {
      nvmlMemory_v2_t mem = {};
      mem.version = kNvmlMemoryV2Version;
      if (api.DeviceGetMemoryInfo_v2(dev, &mem) == NVML_SUCCESS) {
        gpu.memory_bytes = mem.total;
        have_memory = true;
      }
    }
    if (!have_memory && api.DeviceGetMemoryInfo) {
      nvmlMemory_t mem = {};
      if (api.DeviceGetMemoryInfo(dev, &mem) == NVML_SUCCESS) gpu.memory_bytes = mem.total;
    }
    if (api.DeviceGetCudaComputeCapability) {
      int major = 0, minor = 0;
      if (api.DeviceGetCudaComputeCapability(dev, &major, &minor) == NVML_SUCCESS) {
        gpu.compute_capability = core::ComputeCapability{major, minor};
      }
    }
    if (api.DeviceGetPciInfo) {
      nvmlPciInfo_t pci = {};
      if (api.DeviceGetPciInfo(dev, &pci) == NVML_SUCCESS) {
        gpu.pci_bus_id = BusIdOf(pci, api.pci_info_version);
      }
    }
    if (api.DeviceGetNumaNodeId) {
      unsigned node = 0;
      if (api.DeviceGetNumaNodeId(dev, &node) == NVML_SUCCESS)
        gpu.numa_node = static_cast<int>(node);
    }
    if (!gpu.numa_node && !gpu.pci_bus_id.empty()) {
      gpu.numa_node = NumaFromSysfs(options_.sysfs_root, gpu.pci_bus_id);
    }
    if (api.DeviceGetMinorNumber) {
      unsigned minor = 0;
      if (api.DeviceGetMinorNumber(dev, &minor) == NVML_SUCCESS)
        gpu.minor = static_cast<int>(minor);
    }
    if (api.DeviceGetEccMode) {
      int current = 0, pending = 0;
      if (api.DeviceGetEccMode(dev, &current, &pending) == NVML_SUCCESS) {
        gpu.ecc_enabled = current != 0;
      }
    }
    if (api.DeviceGetMigMode) {
      unsigned current = 0, pending = 0;
      ret = api.DeviceGetMigMode(dev, &current, &pending);
      if (ret == NVML_SUCCESS) {
        gpu.mig_enabled = current != 0;
      } else if (ret == NVML_ERROR_NOT_SUPPORTED) {
        gpu.mig_enabled = false;  // not MIG-capable: MIG is certainly off
      }
    }
    inv.gpus.push_back(std::move(gpu));
  }
  inv.topology = ProbeTopology(inv.gpus);
  return inv;
}

core::Topology NvmlSource::ProbeTopology(const std::vector<core::Gpu>& gpus) const {
  const NvmlApi& api = lib_->api();
  const int n = static_cast<int>(gpus.size());
  core::Topology topo(n);
  std::map<std::string, int> by_bus;
  for (const core::Gpu& g : gpus) {
    if (!g.pci_bus_id.empty()) by_bus[g.pci_bus_id] = g.index;
  }

  // NVLink: count each GPU's active links, by what is at their far end.
  std::vector<std::vector<int>> direct(n, std::vector<int>(n, 0));
  std::vector<int> switch_links(n, 0);
  if (api.DeviceGetNvLinkState) {
    // Link counts differ across GPU generations (6, 12, 18, ...): probe until the driver says there
    // is no such link. The cap guards against a driver that never says so.
    constexpr unsigned kMaxLinksProbed = 64;
    for (int i = 0; i < n; ++i) {
      for (unsigned link = 0; link < kMaxLinksProbed; ++link) {
        int active = 0;
        nvmlReturn_t ret = api.DeviceGetNvLinkState(handles_[i], link, &active);
        if (ret == NVML_ERROR_INVALID_ARGUMENT || ret == NVML_ERROR_NOT_SUPPORTED) break;
        if (ret != NVML_SUCCESS || !active) continue;
        int type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
        if (api.DeviceGetNvLinkRemoteDeviceType &&
            api.DeviceGetNvLinkRemoteDeviceType(handles_[i], link, &type) != NVML_SUCCESS) {
          type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
        }
        int peer = -1;
        if (api.DeviceGetNvLinkRemotePciInfo) {
          nvmlPciInfo_t pci = {};
          if (api.DeviceGetNvLinkRemotePciInfo(handles_[i], link, &pci) == NVML_SUCCESS) {
            auto it = by_bus.find(BusIdOf(pci, api.nvlink_remote_pci_info_version));
            if (it != by_bus.end()) peer = it->second;
          }
        }
        if (peer >= 0 && peer != i && type != NVML_NVLINK_DEVICE_TYPE_SWITCH) {
          ++direct[i][peer];
        } else if (type == NVML_NVLINK_DEVICE_TYPE_SWITCH ||
                   (type == NVML_NVLINK_DEVICE_TYPE_UNKNOWN && peer < 0)) {
          ++switch_links[i];
        }
      }
    }
  }

  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      core::GpuLink link;
      if (api.DeviceGetTopologyCommonAncestor) {
        int level = 0;
        if (api.DeviceGetTopologyCommonAncestor(handles_[a], handles_[b], &level) == NVML_SUCCESS) {
          link.pcie = LevelFromNvml(level);
        }
      }
      int d = std::max(direct[a][b], direct[b][a]);
      if (d > 0) {
        link.nvlinks = d;
      } else if (switch_links[a] > 0 && switch_links[b] > 0) {
        link.nvlinks = std::min(switch_links[a], switch_links[b]);
        link.via_nvswitch = true;
      }
      topo.SetLink(a, b, link);
    }
  }
  return topo;
}

absl::Status NvmlSource::EnsureEventSet() {
  core::MutexLock lock(mu_);
  if (event_set_tried_) return event_set_status_;
  event_set_tried_ = true;
  const NvmlApi& api = lib_->api();
  if (!api.EventSetCreate || !api.EventSetWait || !api.DeviceRegisterEvents) {
    event_set_status_ = absl::UnimplementedError("nvml: this library has no event API");
    return event_set_status_;
  }
  nvmlReturn_t ret = api.EventSetCreate(&event_set_);
  if (ret != NVML_SUCCESS) {
    event_set_ = nullptr;
    event_set_status_ = lib_->ToStatus(ret, "nvmlEventSetCreate");
    return event_set_status_;
  }
  constexpr unsigned long long kWanted =
      nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError |
      nvmlEventTypeSingleBitEccError | nvmlEventTypeGpuUnavailableError;
  for (size_t i = 0; i < handles_.size(); ++i) {
    unsigned long long types = kWanted;
    if (api.DeviceGetSupportedEventTypes) {
      unsigned long long supported = 0;
      if (api.DeviceGetSupportedEventTypes(handles_[i], &supported) == NVML_SUCCESS) {
        types &= supported;
      }
    }
    if (types == 0) {
      spdlog::warn("gpu {}: supports no health events; its health comes from probes alone", i);
      continue;
    }
    ret = api.DeviceRegisterEvents(handles_[i], types, event_set_);
    if (ret != NVML_SUCCESS) {
      spdlog::warn("gpu {}: nvmlDeviceRegisterEvents: {}; its health comes from probes alone", i,
                   lib_->ErrorText(ret));
    }
  }
  return absl::OkStatus();
}

int NvmlSource::IndexOf(nvmlDevice_t handle) const {
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (handles_[i] == handle) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<std::vector<HealthEvent>> NvmlSource::WaitHealthEvents(
    std::chrono::milliseconds timeout) {
  if (absl::Status st = EnsureEventSet(); !st.ok()) return st;
  nvmlEventSet_t set;
  {
    core::MutexLock lock(mu_);
    set = event_set_;
  }
  std::vector<HealthEvent> events;
  // Take the first event with the full timeout, then drain whatever is already queued.
  unsigned wait_ms = static_cast<unsigned>(std::max<int64_t>(0, timeout.count()));
  for (;;) {
    nvmlEventData_t data = {};
    nvmlReturn_t ret = lib_->api().EventSetWait(set, &data, wait_ms);
    if (ret == NVML_ERROR_TIMEOUT) break;
    if (ret != NVML_SUCCESS) {
      if (!events.empty()) break;  // report what we have; the failure shows again next time
      return lib_->ToStatus(ret, "nvmlEventSetWait");
    }
    wait_ms = 0;
    HealthEvent ev;
    ev.gpu = IndexOf(data.device);
    if (data.eventType & nvmlEventTypeXidCriticalError) {
      ev.kind = HealthEvent::Kind::kXid;
      ev.xid = data.eventData;
      ev.detail = fmt::format("XID {}", data.eventData);
    } else if (data.eventType & nvmlEventTypeDoubleBitEccError) {
      ev.kind = HealthEvent::Kind::kEccDoubleBit;
      ev.detail = "double-bit ECC error";
    } else if (data.eventType & nvmlEventTypeSingleBitEccError) {
      ev.kind = HealthEvent::Kind::kEccSingleBit;
      ev.detail = "single-bit ECC error";
    } else if (data.eventType & nvmlEventTypeGpuUnavailableError) {
      ev.kind = HealthEvent::Kind::kUnavailable;
      ev.detail = "GPU unavailable";
    } else {
      continue;
    }
    events.push_back(std::move(ev));
  }
  return events;
}

absl::Status NvmlSource::Probe(int index) {
  if (index < 0 || static_cast<size_t>(index) >= handles_.size()) {
    return absl::InvalidArgumentError(fmt::format("gpu {}: no such GPU", index));
  }
  const NvmlApi& api = lib_->api();
  char buf[kNvmlUuidBufferSize] = {};
  nvmlReturn_t ret = api.DeviceGetUUID(handles_[index], buf, sizeof buf);
  if (ret != NVML_SUCCESS) return lib_->ToStatus(ret, fmt::format("gpu {}: probe", index));
  // The UUID may be cached by the driver; a memory query reaches the device.
  if (api.DeviceGetMemoryInfo) {
    nvmlMemory_t mem = {};
    ret = api.DeviceGetMemoryInfo(handles_[index], &mem);
    if (ret != NVML_SUCCESS && ret != NVML_ERROR_NOT_SUPPORTED) {
      return lib_->ToStatus(ret, fmt::format("gpu {} ({}): probe", index, buf));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GpuTelemetry> NvmlSource::ReadTelemetry(int index) {
  if (index < 0 || static_cast<size_t>(index) >= handles_.size()) {
    return absl::InvalidArgumentError(fmt::format("gpu {}: no such GPU", index));
  }
  const NvmlApi& api = lib_->api();
  nvmlDevice_t dev = handles_[index];
  GpuTelemetry t;
  // A reading the driver does not offer (not supported, no permission) stays empty; a GPU that has
  // fallen off the bus or needs a reset is an error, as for Probe.
  absl::Status failed;
  auto ok = [&](nvmlReturn_t ret, const char* what) {
    if (ret == NVML_SUCCESS) return true;
    if (ret == NVML_ERROR_GPU_IS_LOST || ret == NVML_ERROR_RESET_REQUIRED) {
      if (failed.ok()) failed = lib_->ToStatus(ret, fmt::format("gpu {}: {}", index, what));
    }
    return false;
  };
  if (api.DeviceGetUtilizationRates) {
    nvmlUtilization_t u = {};
    if (ok(api.DeviceGetUtilizationRates(dev, &u), "utilization")) {
      t.utilization = std::min(u.gpu, 100u) / 100.0;
      t.memory_utilization = std::min(u.memory, 100u) / 100.0;
    }
  }
  bool have_memory = false;
  if (api.DeviceGetMemoryInfo_v2) {
    nvmlMemory_v2_t mem = {};
    mem.version = kNvmlMemoryV2Version;
    if (ok(api.DeviceGetMemoryInfo_v2(dev, &mem), "memory")) {
      t.memory_used_bytes = mem.used, t.memory_free_bytes = mem.free, have_memory = true;
      t.memory_reserved_bytes = mem.reserved;
    }
  }
  if (!have_memory && api.DeviceGetMemoryInfo) {
    nvmlMemory_t mem = {};
    if (ok(api.DeviceGetMemoryInfo(dev, &mem), "memory"))
      t.memory_used_bytes = mem.used, t.memory_free_bytes = mem.free;
  }
  if (api.DeviceGetClockInfo) {
    unsigned mhz = 0;
    if (ok(api.DeviceGetClockInfo(dev, NVML_CLOCK_SM, &mhz), "SM clock")) t.sm_clock_mhz = mhz;
    if (ok(api.DeviceGetClockInfo(dev, NVML_CLOCK_MEM, &mhz), "memory clock"))
      t.memory_clock_mhz = mhz;
  }
  std::tie(t.tensor_active, t.dram_active) = ReadGpm(index);
  if (api.DeviceGetTotalEnergyConsumption) {
    unsigned long long mj = 0;
    if (ok(api.DeviceGetTotalEnergyConsumption(dev, &mj), "energy")) t.energy_mj = mj;
  }
  if (api.DeviceGetPcieReplayCounter) {
    unsigned n = 0;
    if (ok(api.DeviceGetPcieReplayCounter(dev, &n), "PCIe replays")) t.pcie_replays = n;
  }
  if (api.DeviceGetPcieThroughput) {
    unsigned kbps = 0;
    if (ok(api.DeviceGetPcieThroughput(dev, kNvmlPcieUtilTxBytes, &kbps), "PCIe TX"))
      t.pcie_tx_kbps = kbps;
    if (ok(api.DeviceGetPcieThroughput(dev, kNvmlPcieUtilRxBytes, &kbps), "PCIe RX"))
      t.pcie_rx_kbps = kbps;
  }
  for (auto [fn, field, what] :
       {std::tuple{api.DeviceGetEncoderUtilization, &GpuTelemetry::encoder_utilization, "encoder"},
        std::tuple{api.DeviceGetDecoderUtilization, &GpuTelemetry::decoder_utilization,
                   "decoder"}}) {
    unsigned percent = 0, period_us = 0;
    if (fn && ok(fn(dev, &percent, &period_us), what)) t.*field = std::min(percent, 100u) / 100.0;
  }
  if (api.DeviceGetFieldValues) {
    nvmlFieldValue_t v[3] = {};
    v[0].fieldId = NVML_FI_DEV_MEMORY_TEMP;
    v[1].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, v[1].scopeId = kNvmlScopeAllLinks;
    v[2].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, v[2].scopeId = kNvmlScopeAllLinks;
    if (ok(api.DeviceGetFieldValues(dev, 3, v), "field values")) {
      t.memory_temperature_celsius = FieldValue(v[0]);
      std::optional<double> tx = FieldValue(v[1]), rx = FieldValue(v[2]);
      if (tx && rx && *tx >= 0 && *rx >= 0) t.nvlink_data_kib = static_cast<uint64_t>(*tx + *rx);
    }
  }
  if (api.DeviceGetRemappedRows) {
    unsigned correctable = 0, uncorrectable = 0, pending = 0, failure = 0;
    if (ok(api.DeviceGetRemappedRows(dev, &correctable, &uncorrectable, &pending, &failure),
           "remapped rows")) {
      t.remapped_rows_correctable = correctable, t.remapped_rows_uncorrectable = uncorrectable;
      t.row_remap_pending = pending != 0, t.row_remap_failure = failure != 0;
    }
  }
  if (api.DeviceGetTemperature) {
    unsigned celsius = 0;
    if (ok(api.DeviceGetTemperature(dev, kNvmlTemperatureGpu, &celsius), "temperature"))
      t.temperature_celsius = celsius;
  }
  if (api.DeviceGetPowerUsage) {
    unsigned milliwatts = 0;
    if (ok(api.DeviceGetPowerUsage(dev, &milliwatts), "power")) t.power_watts = milliwatts / 1000.0;
  }
  if (!failed.ok()) return absl::UnavailableError(failed.message());
  return t;
}

}  // namespace tessera::devices
