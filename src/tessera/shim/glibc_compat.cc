// Newer glibc functions the static C++ runtime of libtessera-cuda.so refers to, defined here and
// hidden, so that the library asks nothing of the job's glibc that glibc 2.17 lacks (see
// glibc_compat.h). Each is what glibc's does, or forwards to it when the running glibc has it.
#define TESSERA_GLIBC_COMPAT_DEFINITIONS
#include "tessera/shim/glibc_compat.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>

#define TESSERA_HIDDEN extern "C" __attribute__((visibility("hidden")))

#ifdef TESSERA_GLIBC_BASE
// glibc's pthread_once of the base version, by another name: this file defines pthread_once.
extern "C" int tessera_base_pthread_once(pthread_once_t* once, void (*init)(void));
__asm__(".symver tessera_base_pthread_once,pthread_once@" TESSERA_GLIBC_BASE);
#else
#define tessera_base_pthread_once pthread_once
#endif

// glibc 2.34 moved it into libc with a new version; the unwinder of the static C++ runtime refers
// to it (weakly) by the default name. Its references land here, then on the base version.
TESSERA_HIDDEN int pthread_once(pthread_once_t* once, void (*init)(void)) noexcept {
  return tessera_base_pthread_once(once, init);
}

// glibc 2.32. 0: "not single-threaded", so the C++ runtime always takes its atomic paths.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}

// glibc 2.35; forwarded to it where it exists.
TESSERA_HIDDEN int _dl_find_object(void* pc, struct dl_find_object* result) noexcept {
  using Fn = int (*)(void*, struct dl_find_object*);
  static Fn real = reinterpret_cast<Fn>(dlvsym(RTLD_DEFAULT, "_dl_find_object", "GLIBC_2.35"));
  return real != nullptr ? real(pc, result) : tessera::shim::FindObjectByPhdr(pc, result);
}

// glibc 2.34 (in libc; before, libpthread's, of the base version).
TESSERA_HIDDEN int __pthread_key_create(pthread_key_t* key, void (*destructor)(void*)) noexcept {
  return pthread_key_create(key, destructor);
}

// glibc 2.33 (before, a macro over __fxstat).
TESSERA_HIDDEN int fstat(int fd, struct stat* st) noexcept {
  return static_cast<int>(syscall(SYS_fstat, fd, st));
}

// glibc 2.33 (before, a macro over __xstat).
TESSERA_HIDDEN int stat(const char* path, struct stat* st) noexcept {
  return static_cast<int>(syscall(SYS_newfstatat, AT_FDCWD, path, st, 0));
}

// glibc 2.25 and 2.36, reached by std::random_device (the library never asks for randomness).
TESSERA_HIDDEN int getentropy(void* buffer, size_t length) noexcept {
  if (length > 256) {
    errno = EIO;
    return -1;
  }
  auto* p = static_cast<unsigned char*>(buffer);
  while (length > 0) {
    const long n = syscall(SYS_getrandom, p, length, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    length -= static_cast<size_t>(n);
  }
  return 0;
}

TESSERA_HIDDEN uint32_t arc4random(void) noexcept {
  uint32_t v = 0;
  if (getentropy(&v, sizeof v) != 0) abort();  // as glibc's: it never fails
  return v;
}
