// FindObjectByPhdr (glibc_compat.h): _dl_find_object's answer from dl_iterate_phdr.
#include <link.h>
#include <stdint.h>
#include <unistd.h>

#include "tessera/shim/glibc_compat.h"

namespace tessera::shim {
namespace {

struct Search {
  uintptr_t pc;
  struct dl_find_object* out;
  bool found;
};

int Visit(struct dl_phdr_info* info, size_t, void* arg) {
  auto* s = static_cast<Search*>(arg);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  const void* eh_frame = nullptr;
  bool inside = false;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    if (p.p_type == PT_GNU_EH_FRAME)
      eh_frame = reinterpret_cast<const void*>(info->dlpi_addr + p.p_vaddr);
    if (p.p_type != PT_LOAD) continue;
    const uintptr_t start = info->dlpi_addr + p.p_vaddr, end = start + p.p_memsz;
    lo = start < lo ? start : lo;
    hi = end > hi ? end : hi;
    if (s->pc >= start && s->pc < end) inside = true;
  }
  if (!inside) return 0;
  s->out->dlfo_flags = 0;
  s->out->dlfo_map_start = reinterpret_cast<void*>(lo & ~(page - 1));
  s->out->dlfo_map_end = reinterpret_cast<void*>(hi);
  s->out->dlfo_eh_frame = const_cast<void*>(eh_frame);
  s->found = true;
  return 1;
}

}  // namespace

int FindObjectByPhdr(void* pc, struct dl_find_object* result) {
  Search s{reinterpret_cast<uintptr_t>(pc), result, false};
  dl_iterate_phdr(Visit, &s);
  if (!s.found) return -1;
  Dl_info info;
  struct link_map* map = nullptr;
  result->dlfo_link_map =
      dladdr1(pc, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0 ? map : nullptr;
#if DLFO_STRUCT_HAS_EH_DBASE
  result->dlfo_eh_dbase = nullptr;
#endif
  return 0;
}

}  // namespace tessera::shim
