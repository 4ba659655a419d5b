#pragma once
// libtessera-cuda.so runs inside jobs' own images, whose glibc is often older than the build
// machine's (Ubuntu 20.04 has 2.31, UBI 8 2.28, CentOS 7 2.17). A library that asks for a newer
// symbol version than the image has does not load, and the job then runs with no limit at all. This
// header pins the library's own calls to the oldest versions glibc has of them (dl* moved into libc
// with new versions in 2.34; the old ones remain), and glibc_compat.cc defines, hidden inside the
// library, the few newer functions the static C++ runtime reaches for. The test
// Shim.NeedsNoGlibcNewerThan2_17 reads the versions the built library asks for.
//
// Include it first in every source of the library. Harmless elsewhere (the server links the same
// region and arbiter sources): the old versions are the same functions.

#include <features.h>  // __GLIBC__, before anything else of the C library

#if defined(__GLIBC__) && defined(__x86_64__)
#define TESSERA_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__GLIBC__) && defined(__aarch64__)
#define TESSERA_GLIBC_BASE "GLIBC_2.17"
#endif

#ifdef TESSERA_GLIBC_BASE
__asm__(".symver dlopen,dlopen@" TESSERA_GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" TESSERA_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" TESSERA_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" TESSERA_GLIBC_BASE);
__asm__(".symver dl_iterate_phdr,dl_iterate_phdr@" TESSERA_GLIBC_BASE);
#ifndef TESSERA_GLIBC_COMPAT_DEFINITIONS  // glibc_compat.cc defines a hidden pthread_once
__asm__(".symver pthread_once,pthread_once@" TESSERA_GLIBC_BASE);
#endif
__asm__(".symver pthread_key_create,pthread_key_create@" TESSERA_GLIBC_BASE);
__asm__(".symver pthread_rwlock_rdlock,pthread_rwlock_rdlock@" TESSERA_GLIBC_BASE);
__asm__(".symver pthread_rwlock_wrlock,pthread_rwlock_wrlock@" TESSERA_GLIBC_BASE);
__asm__(".symver pthread_rwlock_unlock,pthread_rwlock_unlock@" TESSERA_GLIBC_BASE);
#if defined(__x86_64__)
__asm__(".symver dladdr1,dladdr1@GLIBC_2.3.3");
#else
__asm__(".symver dladdr1,dladdr1@GLIBC_2.17");
#endif
#endif

#include <dlfcn.h>

namespace tessera::shim {

// What _dl_find_object (glibc 2.35) answers for `pc`, found with dl_iterate_phdr instead: the
// mapping of the object holding `pc`, its link map and its PT_GNU_EH_FRAME. -1 when no object
// holds it. The library's unwinder uses it where glibc has no _dl_find_object of its own.
int FindObjectByPhdr(void* pc, struct dl_find_object* result);

}  // namespace tessera::shim
