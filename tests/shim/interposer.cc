// A second interposer as profilers and tracers are written: it wraps puts and finds the next
// definition with dlsym(RTLD_NEXT, ...). Preloaded beside libtessera-cuda.so, before or after it,
// it must get libc's puts; were it handed its own, it would call itself (said, then abort).
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

namespace {
int calls = 0;
int depth = 0;
}  // namespace

extern "C" __attribute__((visibility("default"))) int puts(const char* s) {
  using Fn = int (*)(const char*);
  static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "puts"));
  if (next == nullptr || depth > 0) {
    fputs("interposer: dlsym(RTLD_NEXT, \"puts\") gave the interposer's own puts\n", stderr);
    abort();
  }
  ++calls;
  ++depth;
  const int r = next(s);
  --depth;
  return r;
}

__attribute__((destructor)) void Report() { fprintf(stderr, "interposer: %d puts\n", calls); }
