// FindObjectByPhdr, the library's _dl_find_object where glibc has none (before 2.35), against
// glibc's own on this machine: the same mapping, link map and unwind table for code in the test
// itself, in libc and in a library loaded later with dlopen; nothing for an address in no object.
#include "tessera/shim/glibc_compat.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tessera::shim {
namespace {

void Same(void* pc, const std::string& what) {
  struct dl_find_object want = {}, got = {};
  ASSERT_EQ(_dl_find_object(pc, &want), 0) << what;
  ASSERT_EQ(FindObjectByPhdr(pc, &got), 0) << what;
  EXPECT_EQ(got.dlfo_map_start, want.dlfo_map_start) << what;
  EXPECT_EQ(got.dlfo_map_end, want.dlfo_map_end) << what;
  EXPECT_EQ(got.dlfo_link_map, want.dlfo_link_map) << what;
  EXPECT_EQ(got.dlfo_eh_frame, want.dlfo_eh_frame) << what;
  EXPECT_NE(got.dlfo_eh_frame, nullptr) << what << ": every object here has an unwind table";
}

TEST(GlibcCompat, FindsObjectsAsGlibcDoes) {
  Same(reinterpret_cast<void*>(&Same), "the test's own code");
  Same(reinterpret_cast<void*>(&snprintf), "libc");
  void* lib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  void* fn = dlsym(lib, "crc32");
  ASSERT_NE(fn, nullptr);
  Same(fn, "a library opened later");
  dlclose(lib);
  struct dl_find_object none = {};
  int on_stack = 0;
  EXPECT_EQ(FindObjectByPhdr(&on_stack, &none), -1) << "the stack is in no object";
  EXPECT_EQ(FindObjectByPhdr(nullptr, &none), -1);
}

}  // namespace
}  // namespace tessera::shim
