// libtessera-cuda.so: kernel and graph launches paced by the GPU arbiter (compute shares, priority)
// with the queue bound (backlog.h), synchronizes counted as time held, and stream capture (nothing
// paced while capturing).
#include "tessera/shim/hooks.h"

using namespace tessera::shim;  // NOLINT: the hooks are C entry points over the shared state

namespace tessera::shim {

int ArbiterGpu() {
  int d = CurrentDevice();
  return d >= 0 && d < kMaxDevices ? physical_gpu[d] : -1;
}

// Stream captures under way in this process (CUDA graphs being recorded). Launches on a capturing
// stream are recorded, not run (the graph's replay is what is paced): they pass unpaced; launches
// on other streams are paced as ever. The library's own synchronize (its drain) must not meet a
// capture that forbids it: one in the global mode (PyTorch's default) anywhere in the process, or
// one in the thread-local mode in the same thread; relaxed captures forbid nothing.
constexpr int kCaptureStreams = 16;
std::atomic<int> captures{0};              // all modes: any stream capturing at all
std::atomic<int> untracked_captures{0};    // beyond kCaptureStreams: then every launch passes
std::atomic<int> untracked_forbidding{0};  // of those, in the global mode
std::atomic<CUstream> capturing[kCaptureStreams];
std::atomic<int> forbidding_captures{0};  // global mode
thread_local int thread_captures = 0;     // thread-local mode, begun by this thread
// A drain holds it shared; a capture begins holding it exclusively, so that no drain's
// synchronize is under way when the capture starts (it invalidated 1 in 14,000 captures in a
// tight loop before).
std::shared_mutex capture_mu;

// The driver's cuCtxSynchronize: once it returns, what this process queued on the current
// device before it has run (the queue bound counts it done).
CUresult SynchronizeContext() {
  if (real.cuCtxSynchronize == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const int dev = CurrentDevice();
  const uint64_t upto = backlog.launched(dev);
  const CUresult rc = real.cuCtxSynchronize();
  if (rc == CUDA_SUCCESS) backlog.Drained(dev, upto);
  return rc;
}

void Drain() {
  if (real.cuCtxSynchronize == nullptr) return;
  // A capture that forbids a synchronize (the global mode anywhere, or this thread's own): the
  // drain waits until the blind launches' estimated end instead (backlog.h).
  if (thread_captures > 0) return backlog.BlindDrain(CurrentDevice());
  std::shared_lock lock(capture_mu);
  if (forbidding_captures.load(std::memory_order_acquire) == 0)
    SynchronizeContext();
  else
    backlog.BlindDrain(CurrentDevice());
}

bool Recorded(CUstream stream) {
  if (captures.load(std::memory_order_relaxed) == 0) return false;  // the fast path
  if (untracked_captures.load(std::memory_order_relaxed) > 0) return true;
  if (stream == nullptr) return false;  // the legacy default stream is never captured
  for (const auto& s : capturing) {
    if (s.load(std::memory_order_relaxed) == stream) return true;
  }
  return false;
}

// A thread waiting for its own GPU work keeps its job from looking idle to the arbiter.
struct SyncScope {
  int gpu;
  explicit SyncScope(int g = arbiter ? ArbiterGpu() : -1) : gpu(g) {
    if (gpu >= 0) arbiter->EnterSync(gpu);
  }
  ~SyncScope() {
    if (gpu >= 0) arbiter->LeaveSync(gpu);
  }
};

// Every launch: counted, then (with an arbiter) held while this process has more than the bound
// queued on the device (waiting for its own work, as in a synchronize), and until this job holds
// the GPU - unless it is recorded into a graph. Returns the device whose queue the launch joins
// (Launched after it), or -1 when the queue is not tracked: no arbiter, a capturing stream, or a
// capture under way that forbids what the marks do. `token` is what Launched needs.
inline int Pace(CUstream stream, Backlog::Token* token) {
  region->CountLaunch();
  if (arbiter == nullptr || Recorded(stream)) return -1;
  const int dev = CurrentDevice();
  const int gpu = dev >= 0 && dev < kMaxDevices ? physical_gpu[dev] : -1;
  const bool tracked =
      backlog.enabled() &&
      (captures.load(std::memory_order_relaxed) == 0 ||
       (thread_captures == 0 && forbidding_captures.load(std::memory_order_relaxed) == 0));
  if (tracked && backlog.Over(dev)) {
    // Like the drain: no capture that forbids it begins while it looks at its marks.
    std::shared_lock lock(capture_mu);
    if (forbidding_captures.load(std::memory_order_acquire) == 0) {
      SyncScope scope(gpu);
      backlog.Wait(dev);
    }
  }
  // Blind: a capture under way forbids what the marks do. Counted and bounded by estimate.
  const bool blind = !tracked && backlog.enabled();
  if (blind && backlog.BlindOver(dev)) {
    SyncScope scope(gpu);
    backlog.BlindWait(dev);
  }
  arbiter->BeforeLaunch(gpu, Drain);
  if (blind) backlog.BlindLaunched(dev);
  if (!tracked) return -1;
  *token = backlog.Before(dev, stream, captures.load(std::memory_order_relaxed) == 0);
  return dev;
}

}  // namespace tessera::shim

namespace tessera::shim {

// The bodies of the hooks that exist in a legacy and a per-thread default stream version, given
// the driver's entry point of that version. Called once Ready().
// The stream a launch of a per-thread default stream entry point (_ptsz) runs on: a null stream
// there is the thread's own default stream (CU_STREAM_PER_THREAD), not the legacy one.
CUstream PerThread(CUstream stream) {
  return stream != nullptr ? stream : reinterpret_cast<CUstream>(uintptr_t{2});
}

// The stream argument says where the launch runs (its capture, its completion marks).
template <typename Fn, typename... Args>
CUresult Paced(CUstream stream, Fn fn, Args... args) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  Backlog::Token token;
  const int dev = Pace(stream, &token);
  const CUresult rc = fn(args...);
  if (dev >= 0) backlog.Launched(token, dev, stream, rc == CUDA_SUCCESS);
  return rc;
}

template <typename Fn, typename... Args>
CUresult Synced(Fn fn, Args... args) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc;
  {
    SyncScope scope;
    rc = fn(args...);
  }
  if (rc == CUDA_SUCCESS) RefreshPools();  // pools give memory back at synchronizes
  return rc;
}

void Decrement(std::atomic<int>& n) {
  int v = n.load();
  while (v > 0 && !n.compare_exchange_weak(v, v - 1)) {
  }
}

// Which captures forbid a synchronize (cuda.h's CUstreamCaptureMode: 0 global, 1 thread-local, 2
// relaxed), per stream, so that EndCapture knows what it ends.
struct CaptureMode {
  std::atomic<CUstream> stream{nullptr};
  std::atomic<int> mode{0};
};
CaptureMode capture_modes[kCaptureStreams];

CUresult BeginCapture(cuStreamBeginCapture_v2_fn fn, CUstream stream, CUstreamCaptureMode mode) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  std::unique_lock lock(capture_mu);  // no drain's synchronize under way as it begins
  CUresult rc = fn(stream, mode);
  if (rc != CUDA_SUCCESS) return rc;
  if (mode == 0) forbidding_captures.fetch_add(1, std::memory_order_acq_rel);
  if (mode == 1) ++thread_captures;
  bool tracked = false;
  for (int i = 0; i < kCaptureStreams && !tracked; ++i) {
    CUstream free = nullptr;
    if (capturing[i].compare_exchange_strong(free, stream)) {
      capture_modes[i].mode.store(static_cast<int>(mode));
      capture_modes[i].stream.store(stream);
      tracked = true;
    }
  }
  if (!tracked) {
    untracked_captures.fetch_add(1);
    if (mode == 0) untracked_forbidding.fetch_add(1);
  }
  captures.fetch_add(1, std::memory_order_acq_rel);
  return rc;
}

CUresult EndCapture(cuStreamEndCapture_fn fn, CUstream stream, CUgraph* graph) {
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult rc = fn(stream, graph);
  // Ended (made a graph, or invalidated and over) unless the stream was not capturing or another
  // thread must end it.
  if (rc == CUDA_ERROR_ILLEGAL_STATE || rc == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) return rc;
  bool found = false;
  for (int i = 0; i < kCaptureStreams && !found; ++i) {
    if (capture_modes[i].stream.load() != stream) continue;
    const int mode = capture_modes[i].mode.load();
    capture_modes[i].stream.store(nullptr);
    CUstream s = stream;
    if (capturing[i].compare_exchange_strong(s, nullptr)) {
      found = true;
      if (mode == 0) Decrement(forbidding_captures);
      if (mode == 1 && thread_captures > 0) --thread_captures;
    }
  }
  if (!found) {  // one of the untracked ones (which, is not known: a global one first)
    Decrement(untracked_captures);
    if (untracked_forbidding.load() > 0) {
      Decrement(untracked_forbidding);
      Decrement(forbidding_captures);
    }
  }
  Decrement(captures);
  return rc;
}

}  // namespace tessera::shim

TESSERA_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                       unsigned int gz, unsigned int bx, unsigned int by,
                                       unsigned int bz, unsigned int shared, CUstream stream,
                                       void** params, void** extra) {
  return Ready() ? Paced(stream, real.cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shared, stream,
                         params, extra)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                            unsigned int gz, unsigned int bx, unsigned int by,
                                            unsigned int bz, unsigned int shared, CUstream stream,
                                            void** params, void** extra) {
  return Ready() ? Paced(PerThread(stream), real.cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz,
                         shared, stream, params, extra)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                         void** extra) {
  return Ready() ? Paced(config ? config->hStream : nullptr, real.cuLaunchKernelEx, config, f,
                         params, extra)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                              void** params, void** extra) {
  return Ready() ? Paced(PerThread(config ? config->hStream : nullptr), real.cuLaunchKernelEx_ptsz,
                         config, f, params, extra)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                                  unsigned int gz, unsigned int bx, unsigned int by,
                                                  unsigned int bz, unsigned int shared,
                                                  CUstream stream, void** params) {
  return Ready() ? Paced(stream, real.cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shared,
                         stream, params)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx,
                                                       unsigned int gy, unsigned int gz,
                                                       unsigned int bx, unsigned int by,
                                                       unsigned int bz, unsigned int shared,
                                                       CUstream stream, void** params) {
  return Ready() ? Paced(PerThread(stream), real.cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx,
                         by, bz, shared, stream, params)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

// A graph launch, paced; a graph with memory nodes first has its devices' graph memory pools
// charged for what it allocates (refused, out of memory, when the limit does not allow it), and
// after the launch what the driver says they hold.
template <typename Fn>
CUresult GraphLaunch(Fn fn, CUgraphExec exec, CUstream stream, CUstream paced_as = nullptr) {
  if (!Ready()) return CUDA_ERROR_NOT_INITIALIZED;
  std::vector<std::pair<int, uint64_t>> allocs;
  if (any_graph_memory.load(std::memory_order_acquire)) {
    std::lock_guard lock(*pool_mu);
    auto it = graph_execs->find(reinterpret_cast<uint64_t>(exec));
    if (it != graph_execs->end()) {
      allocs = it->second;
      for (const auto& [dev, bytes] : allocs) {
        if (!ChargeGraphLocked(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
  }
  CUresult rc = Paced(paced_as ? paced_as : stream, fn, exec, stream);
  if (!allocs.empty()) {
    std::lock_guard lock(*pool_mu);
    for (const auto& [dev, bytes] : allocs) RefreshGraphLocked(dev);
  }
  return rc;
}

TESSERA_EXPORT CUresult cuGraphLaunch(CUgraphExec graph, CUstream stream) {
  return GraphLaunch(real.cuGraphLaunch, graph, stream);
}
TESSERA_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec graph, CUstream stream) {
  return GraphLaunch(real.cuGraphLaunch_ptsz, graph, stream, PerThread(stream));
}

TESSERA_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  return Ready() ? BeginCapture(real.cuStreamBeginCapture_v2, stream, mode)
                 : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  return Ready() ? BeginCapture(real.cuStreamBeginCapture_v2_ptsz, stream, mode)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return Ready() ? EndCapture(real.cuStreamEndCapture, stream, graph) : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return Ready() ? EndCapture(real.cuStreamEndCapture_ptsz, stream, graph)
                 : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuCtxSynchronize() {
  return Ready() ? Synced(SynchronizeContext) : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  return Ready() ? Synced(real.cuStreamSynchronize, stream) : CUDA_ERROR_NOT_INITIALIZED;
}
TESSERA_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  return Ready() ? Synced(real.cuStreamSynchronize_ptsz, stream) : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuEventSynchronize(CUevent event) {
  return Ready() ? Synced(real.cuEventSynchronize, event) : CUDA_ERROR_NOT_INITIALIZED;
}

TESSERA_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                         cuuint64_t flags);
TESSERA_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* status);
