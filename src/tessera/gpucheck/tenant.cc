#include "tessera/gpucheck/tenant.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/unix_socket.h"
#include "tessera/gpucheck/driver.h"

namespace tessera::gpucheck {

namespace {

using Args = std::map<std::string, double>;

double Arg(const Args& a, const char* key, double fallback) {
  auto it = a.find(key);
  return it == a.end() ? fallback : it->second;
}

void SleepUntil(double ms) {
  for (double now = NowMs(); now < ms; now = NowMs()) {
    usleep(static_cast<useconds_t>((ms - now) * 1000));
  }
}

// Launches spin for `iters` on the tenant's stream, as a grid of `us` blocks: only the first one
// works on a GPU (the others end at once), while the fake driver's virtual GPU takes a kernel's
// gridDimX for its length in us - so the check also runs against the fake.
CUresult Spin(const Driver& d, const Gpu& g, uint64_t iters, double us) {
  unsigned long long n = iters, sink = g.sink;
  void* params[] = {&n, &sink};
  const auto grid = static_cast<unsigned>(std::max(1.0, us));
  return d.cuLaunchKernel(g.spin, grid, 1, 1, 1, 1, 1, 0, g.stream, params, nullptr);
}

int Calibrate(const Driver& d, const Gpu& g) {
  CUevent a = nullptr, b = nullptr;
  if (d.cuEventCreate(&a, 0) != CUDA_SUCCESS || d.cuEventCreate(&b, 0) != CUDA_SUCCESS) {
    std::puts("error=cuEventCreate");
    return 1;
  }
  constexpr uint64_t kIters = 1 << 22;
  float best = 0;
  for (int i = 0; i < 6; ++i) {
    d.cuEventRecord(a, g.stream);
    const CUresult rc = Spin(d, g, kIters, 1);
    d.cuEventRecord(b, g.stream);
    if (rc != CUDA_SUCCESS || d.cuEventSynchronize(b) != CUDA_SUCCESS) {
      std::printf("error=%s\n", d.Error(rc).c_str());
      return 1;
    }
    float ms = 0;
    d.cuEventElapsedTime(&ms, a, b);
    if (i > 0 && (best == 0 || ms < best)) best = ms;  // the first run warms up
  }
  std::printf("iters_per_us=%.4f kernel_ms=%.4f\n", kIters / (best * 1000.0), best);
  return 0;
}

int Launch(const Driver& d, const Gpu& g, long n) {
  for (int i = 0; i < 200; ++i)
    d.cuLaunchKernel(g.empty, 1, 1, 1, 1, 1, 1, 0, g.stream, nullptr, nullptr);
  d.cuCtxSynchronize();
  double spent = 0;
  for (long done = 0; done < n;) {
    const double t0 = NowMs();
    for (int i = 0; i < 500 && done < n; ++i, ++done) {
      const CUresult rc =
          d.cuLaunchKernel(g.empty, 1, 1, 1, 1, 1, 1, 0, g.stream, nullptr, nullptr);
      if (rc != CUDA_SUCCESS) {
        std::printf("error=%s\n", d.Error(rc).c_str());
        return 1;
      }
    }
    spent += NowMs() - t0;
    d.cuCtxSynchronize();
  }
  std::printf("ns=%.1f\n", spent * 1e6 / static_cast<double>(n));
  return 0;
}

int Work(const Driver& d, const Gpu& g, const Args& a) {
  const double kernel_us = Arg(a, "kernel_us", 500);
  const int batch = static_cast<int>(Arg(a, "batch", 4));
  const double pause_us = Arg(a, "pause_us", 0);
  const double run_ms = Arg(a, "run_ms", 2000), from = Arg(a, "from_ms", 0),
               to = Arg(a, "to_ms", 2000), start = Arg(a, "start_ms", NowMs());
  const int graph_kernels = static_cast<int>(Arg(a, "graph", 0));
  const auto iters = static_cast<uint64_t>(kernel_us * Arg(a, "iters_per_us", 100));
  const double unit_us = graph_kernels > 0 ? graph_kernels * kernel_us : kernel_us;
  std::vector<CUevent> events(static_cast<size_t>(batch));
  CUevent ref = nullptr;
  CUresult rc = d.cuEventCreate(&ref, 0);
  for (auto& e : events) rc = rc != CUDA_SUCCESS ? rc : d.cuEventCreate(&e, 0);
  CUgraphExec exec = nullptr;
  if (rc == CUDA_SUCCESS && graph_kernels > 0) {
    // A graph recorded from a stream in global mode, as PyTorch records its CUDA graphs.
    rc = d.cuStreamBeginCapture_v2(g.stream, 0);
    for (int k = 0; rc == CUDA_SUCCESS && k < graph_kernels; ++k) rc = Spin(d, g, iters, kernel_us);
    CUgraph graph = nullptr;
    const CUresult end = d.cuStreamEndCapture(g.stream, &graph);
    if (rc == CUDA_SUCCESS) rc = end;
    if (rc == CUDA_SUCCESS) rc = d.cuGraphInstantiateWithFlags(&exec, graph, 0);
  }
  if (rc != CUDA_SUCCESS) {
    std::printf("error=setup: %s\n", d.Error(rc).c_str());
    return 1;
  }
  // Where the GPU's event times sit on this host's clock: a reference event, waited for.
  d.cuEventRecord(ref, g.stream);
  d.cuEventSynchronize(ref);
  const double ref_ms = NowMs();
  if (ref_ms > start) std::fprintf(stderr, "late by %.0f ms\n", ref_ms - start);
  SleepUntil(start);
  double window_us = 0, total_us = 0;
  long units = 0;
  while (NowMs() - start < run_ms) {
    for (int k = 0; k < batch; ++k) {
      rc = exec != nullptr ? d.cuGraphLaunch(exec, g.stream) : Spin(d, g, iters, kernel_us);
      if (rc == CUDA_SUCCESS) rc = d.cuEventRecord(events[static_cast<size_t>(k)], g.stream);
      if (rc != CUDA_SUCCESS) {
        std::printf("error=launch: %s\n", d.Error(rc).c_str());
        return 1;
      }
    }
    if ((rc = d.cuCtxSynchronize()) != CUDA_SUCCESS) {
      std::printf("error=cuCtxSynchronize: %s\n", d.Error(rc).c_str());
      return 1;
    }
    for (CUevent e : events) {
      float ms = 0;
      d.cuEventElapsedTime(&ms, ref, e);
      const double done = ref_ms + ms - start;
      total_us += unit_us;
      ++units;
      if (done >= from && done < to) window_us += unit_us;
    }
    if (pause_us > 0) usleep(static_cast<useconds_t>(pause_us));
  }
  std::printf("window_us=%.0f total_us=%.0f units=%ld\n", window_us, total_us, units);
  return 0;
}

// Steps read from stdin, one result line each, so that the parent can read NVML's figures for
// this process between them.
int Memory(const Driver& d, const Gpu& g) {
  constexpr size_t kChunk = (2u << 20) + 1;  // 2 MiB + 1: the driver takes 4 MiB for it
  std::vector<CUdeviceptr> held, pooled;
  std::vector<CUmodule> modules;
  std::vector<CUdeviceptr> mapped;  // VMM: ranges of kVmm each, their handles released
  constexpr size_t kVmm = size_t{256} << 20;
  struct Shared {
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    uint64_t bytes;
  };
  std::vector<Shared> shared;  // exported or imported: released and unmapped by "vmmdrop"
  std::string step;
  std::puts("ready=1");
  std::fflush(stdout);
  while (std::getline(std::cin, step)) {
    CUresult rc = CUDA_SUCCESS;
    if (step == "alloc") {
      while (held.size() < 100000) {
        CUdeviceptr p = 0;
        if ((rc = d.cuMemAlloc_v2(&p, kChunk)) != CUDA_SUCCESS) break;
        held.push_back(p);
      }
      std::printf("n=%zu requested=%zu rc=%d\n", held.size(), held.size() * kChunk, rc);
    } else if (step == "modules") {
      while (modules.size() < 1000) {
        CUmodule m = nullptr;
        if ((rc = d.cuModuleLoadData(&m, kKernelsPtx)) != CUDA_SUCCESS) break;
        modules.push_back(m);
      }
      std::printf("n=%zu rc=%d\n", modules.size(), rc);
    } else if (step == "info") {
      size_t free = 0, total = 0;
      rc = d.cuMemGetInfo_v2(&free, &total);
      std::printf("free=%zu total=%zu rc=%d\n", free, total, rc);
    } else if (step == "free") {
      for (CUdeviceptr p : held) d.cuMemFree_v2(p);
      for (CUmodule m : modules) d.cuModuleUnload(m);
      held.clear();
      modules.clear();
      std::puts("freed=1");
    } else if (step == "async") {
      while (pooled.size() < 100000) {
        CUdeviceptr p = 0;
        if ((rc = d.cuMemAllocAsync(&p, kChunk, g.stream)) != CUDA_SUCCESS) break;
        if ((rc = d.cuStreamSynchronize(g.stream)) != CUDA_SUCCESS) break;
        pooled.push_back(p);
      }
      std::printf("n=%zu requested=%zu rc=%d\n", pooled.size(), pooled.size() * kChunk, rc);
    } else if (step == "vmm") {
      // NVIDIA's memmap sample: each handle released right after it is mapped (the driver keeps
      // its memory until the unmap). Up to 12 x 256 MiB.
      CUmemAllocationProp prop{};
      prop.type = 1;  // CU_MEM_ALLOCATION_TYPE_PINNED
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = g.device;
      while (mapped.size() < 12) {
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr va = 0;
        if ((rc = d.cuMemCreate(&h, kVmm, &prop, 0)) != CUDA_SUCCESS) break;
        if ((rc = d.cuMemAddressReserve(&va, kVmm, 0, 0, 0)) != CUDA_SUCCESS) {
          d.cuMemRelease(h);
          break;
        }
        rc = d.cuMemMap(va, kVmm, 0, h, 0);
        d.cuMemRelease(h);
        if (rc != CUDA_SUCCESS) {
          d.cuMemAddressFree(va, kVmm);
          break;
        }
        mapped.push_back(va);
      }
      std::printf("n=%zu requested=%zu rc=%d\n", mapped.size(), mapped.size() * kVmm, rc);
    } else if (step.rfind("vmmexport:", 0) == 0 || step.rfind("vmmimport:", 0) == 0) {
      // 512 MiB exported as a descriptor and sent over a unix socket to the other tenant, which
      // imports and maps it (an inference server handing its workers a weights buffer).
      const bool exporting = step[3] == 'e';
      const std::string path = step.substr(10);
      uint64_t bytes = size_t{512} << 20;
      int fd = -1;
      CUmemGenericAllocationHandle h = 0;
      CUdeviceptr va = 0;
      if (d.cuMemExportToShareableHandle == nullptr ||
          d.cuMemImportFromShareableHandle == nullptr) {
        rc = CUDA_ERROR_NOT_SUPPORTED;
      } else if (exporting) {
        CUmemAllocationProp prop{};
        prop.type = 1;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = g.device;
        rc = d.cuMemCreate(&h, bytes, &prop, 0);
        if (rc == CUDA_SUCCESS) rc = d.cuMemExportToShareableHandle(&fd, h, 1, 0);
        const int srv = rc == CUDA_SUCCESS ? core::ListenUnix(path.c_str()) : -1;
        const int peer = srv >= 0 ? accept(srv, nullptr, nullptr) : -1;
        if (rc == CUDA_SUCCESS && (peer < 0 || !core::SendWithFd(peer, &bytes, sizeof bytes, fd)))
          rc = CUDA_ERROR_INVALID_VALUE;
        for (int x : {peer, srv, fd}) {
          if (x >= 0) close(x);
        }
      } else {
        const int s = core::ConnectUnix(path.c_str(), 10000);
        rc = s >= 0 && core::ReceiveWithFd(s, &bytes, sizeof bytes, &fd) && fd >= 0
                 ? CUDA_SUCCESS
                 : CUDA_ERROR_INVALID_VALUE;
        if (s >= 0) close(s);
        if (rc == CUDA_SUCCESS)
          rc = d.cuMemImportFromShareableHandle(
              &h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), 1);
        if (fd >= 0) close(fd);
      }
      if (rc == CUDA_SUCCESS) rc = d.cuMemAddressReserve(&va, bytes, 0, 0, 0);
      if (rc == CUDA_SUCCESS) rc = d.cuMemMap(va, bytes, 0, h, 0);
      if (rc == CUDA_SUCCESS) shared.push_back({h, va, bytes});
      std::printf("%s=1 rc=%d\n", exporting ? "exported" : "imported", rc);
    } else if (step == "vmmdrop") {
      for (const Shared& x : shared) {
        d.cuMemRelease(x.handle);
        d.cuMemUnmap(x.va, x.bytes);
        d.cuMemAddressFree(x.va, x.bytes);
      }
      shared.clear();
      std::puts("dropped=1");
    } else if (step == "vmmfree") {
      for (CUdeviceptr va : mapped) d.cuMemUnmap(va, kVmm), d.cuMemAddressFree(va, kVmm);
      mapped.clear();
      std::puts("freed=1");
    } else if (step.rfind("graph:", 0) == 0) {
      // A graph with a memory node of N MiB (captured: cuMemAllocAsync and cuMemFreeAsync in one
      // stream capture, as frameworks record them), instantiated and launched 10 times: its memory
      // comes from the device's graph memory pool, which keeps it between launches.
      const size_t bytes = std::stoull(step.substr(6)) << 20;
      CUgraph graph = nullptr;
      CUgraphExec exec = nullptr;
      CUdeviceptr p = 0;
      CUresult inst = CUDA_SUCCESS, launch = CUDA_SUCCESS;
      rc = d.cuStreamBeginCapture_v2(g.stream, 0);
      if (rc == CUDA_SUCCESS) {
        const CUresult a = d.cuMemAllocAsync(&p, bytes, g.stream);
        if (a == CUDA_SUCCESS) d.cuMemFreeAsync(p, g.stream);
        rc = d.cuStreamEndCapture(g.stream, &graph);
        if (rc == CUDA_SUCCESS) rc = a;
      }
      if (rc == CUDA_SUCCESS) inst = d.cuGraphInstantiateWithFlags(&exec, graph, 0);
      for (int i = 0; rc == CUDA_SUCCESS && inst == CUDA_SUCCESS && i < 10; ++i) {
        launch = d.cuGraphLaunch(exec, g.stream);
        if (launch == CUDA_SUCCESS) launch = d.cuStreamSynchronize(g.stream);
        if (launch != CUDA_SUCCESS) break;
      }
      std::printf("capture=%d instantiate=%d launch=%d\n", rc, inst, launch);
    } else if (step == "freeasync") {
      for (CUdeviceptr p : pooled) d.cuMemFreeAsync(p, g.stream);
      rc = d.cuStreamSynchronize(g.stream);
      pooled.clear();
      std::printf("freed=1 rc=%d\n", rc);
    } else {
      std::printf("error=unknown step %s\n", step.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

// Allocates through each way a program finds cuMemAlloc: every one must meet the limit.
int ProcAddress(const Driver& d, const Args& a) {
  const auto over = static_cast<size_t>(Arg(a, "over", 512.0 * (1 << 20)));
  const auto under = static_cast<size_t>(Arg(a, "under", 64.0 * (1 << 20)));
  struct Route {
    std::string name;
    cuMemAlloc_v2_fn fn;
  };
  std::vector<Route> routes = {{"dlsym", d.cuMemAlloc_v2}};
  for (int version : {3020, 11000, 12000}) {
    if (d.cuGetProcAddress == nullptr) break;
    void* p = nullptr;
    d.cuGetProcAddress("cuMemAlloc", &p, version, CU_GET_PROC_ADDRESS_DEFAULT);
    routes.push_back(
        {"cuGetProcAddress@" + std::to_string(version), reinterpret_cast<cuMemAlloc_v2_fn>(p)});
  }
  if (d.cuGetProcAddress_v2 != nullptr) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult found = 0;
    d.cuGetProcAddress_v2("cuMemAlloc", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    routes.push_back({"cuGetProcAddress_v2@12000", reinterpret_cast<cuMemAlloc_v2_fn>(p)});
  }
  for (const Route& r : routes) {
    if (r.fn == nullptr) {
      std::printf("route=%s over=-1 under=-1\n", r.name.c_str());
      continue;
    }
    CUdeviceptr p = 0, q = 0;
    const CUresult rc_over = r.fn(&p, over);
    if (rc_over == CUDA_SUCCESS) d.cuMemFree_v2(p);
    const CUresult rc_under = r.fn(&q, under);
    if (rc_under == CUDA_SUCCESS) d.cuMemFree_v2(q);
    std::printf("route=%s over=%d under=%d\n", r.name.c_str(), rc_over, rc_under);
  }
  return 0;
}

}  // namespace

int RunTenant(int argc, char** argv, const char* libcuda) {
  if (argc < 1) return 2;
  const std::string kind = argv[0];
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string kv = argv[i];
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "tenant: expected KEY=VALUE, got %s\n", kv.c_str());
      return 2;
    }
    args[kv.substr(0, eq)] = std::strtod(kv.c_str() + eq + 1, nullptr);
  }
  Driver d;
  Gpu g;
  std::string err;
  if (!d.Load(libcuda, &err) || !g.Open(d, static_cast<int>(Arg(args, "device", 0)), &err)) {
    std::printf("error=%s\n", err.c_str());
    return 1;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (kind == "calibrate") return Calibrate(d, g);
  if (kind == "launch") return Launch(d, g, static_cast<long>(Arg(args, "n", 20000)));
  if (kind == "work") return Work(d, g, args);
  if (kind == "memory") return Memory(d, g);
  if (kind == "procaddr") return ProcAddress(d, args);
  std::printf("error=unknown tenant %s\n", kind.c_str());
  return 2;
}

}  // namespace tessera::gpucheck
