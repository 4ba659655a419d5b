// The memory checks: a limit against NVML's own per-process figures, memory shared between
// processes through VMM export and import, a container's memory, and the driver's lookup routes.
#include <unistd.h>

#include <fstream>

#include "tessera/gpucheck/checker.h"

namespace tessera::gpucheck::check {

void Checker::Memory(Nvml* nvml) {
  const std::string name = "memory limit 1 GiB";
  const std::string goal = "NVML's figure for the process <= the limit";
  constexpr double kLimit = 1 << 30;
  Child c;
  std::string err;
  if (!Start({"memory", {"TESSERA_CUDA_MEM_LIMIT=1GiB"}, true, {"memory"}}, "", &c, &err)) {
    return Failed(name, goal, err);
  }
  if (Fields f = ParseFields(c.ReadLine()); f.count("error")) return Failed(name, goal, f["error"]);
  if (nvml != nullptr) {
    // What a context and the check's module take before any allocation: what the library must
    // count for them (TESSERA_CUDA_CONTEXT_OVERHEAD where it cannot measure it).
    const double ctx = static_cast<double>(nvml->ProcessMemory(
        static_cast<unsigned>(options_.device), static_cast<unsigned>(c.pid())));
    Add({"context footprint",
         Fixed(ctx / (1 << 20), 0) + " MiB by NVML before any allocation",
         "",
         Verdict::kInfo,
         {{"bytes", ctx}}});
  }
  auto step = [&](const std::string& what) {
    c.Send(what);
    Fields f = ParseFields(c.ReadLine());
    if (nvml != nullptr) {
      f["nvml_bytes"] = std::to_string(nvml->ProcessMemory(static_cast<unsigned>(options_.device),
                                                           static_cast<unsigned>(c.pid())));
    }
    return f;
  };
  auto mib = [](double b) { return std::isnan(b) ? "?" : Fixed(b / (1 << 20), 0) + " MiB"; };
  auto verdict = [&](const Fields& f) {
    const double used = Num(f, "nvml_bytes");
    if (nvml == nullptr) return Verdict::kInfo;  // nothing to hold it against
    return used >= 0 && used <= kLimit ? Verdict::kPass : Verdict::kFail;
  };
  Fields alloc = step("alloc");
  if (alloc.count("error")) return Failed(name, goal, alloc["error"]);
  Add({name + ": 2 MiB+1 allocations",
       alloc["n"] + " allocated (" + mib(Num(alloc, "requested")) + " asked), NVML says " +
           mib(Num(alloc, "nvml_bytes")),
       goal, verdict(alloc), nlohmann::json(alloc)});
  Fields modules = step("modules");
  Add({name + ": + modules at the limit",
       modules["n"] + " modules loaded more, NVML says " + mib(Num(modules, "nvml_bytes")), goal,
       verdict(modules), nlohmann::json(modules)});
  Fields info = step("info");
  Add({name + ": cuMemGetInfo",
       "total " + mib(Num(info, "total")) + ", free " + mib(Num(info, "free")), "total = the limit",
       Num(info, "total") == kLimit ? Verdict::kPass : Verdict::kFail, nlohmann::json(info)});
  step("free");
  Fields async = step("async");
  Add({name + ": cuMemAllocAsync pool",
       async["n"] + " allocated (" + mib(Num(async, "requested")) + " asked), NVML says " +
           mib(Num(async, "nvml_bytes")),
       goal, verdict(async), nlohmann::json(async)});
  step("freeasync");
  // VMM memory released right after it is mapped stays charged until its unmap: at most 4 x
  // 256 MiB under the 1 GiB limit (12 were live before).
  Fields vmm = step("vmm");
  const double vmm_n = Num(vmm, "n");
  Add({name + ": VMM released after mapping",
       vmm["n"] + " x 256 MiB mapped, NVML says " + mib(Num(vmm, "nvml_bytes")),
       "at most 4 x 256 MiB; NVML <= the limit",
       vmm_n <= 4 && verdict(vmm) != Verdict::kFail ? verdict(vmm) : Verdict::kFail,
       nlohmann::json(vmm)});
  step("vmmfree");
  // Graph memory: one too large for the limit is refused (at capture, instantiation or launch),
  // one that fits runs ten times and NVML's figure stays within the limit.
  Fields big = step("graph:2048");
  const bool refused = big["capture"] != "0" || big["instantiate"] != "0" || big["launch"] != "0";
  Fields fits = step("graph:256");
  const bool ran = fits["capture"] == "0" && fits["instantiate"] == "0" && fits["launch"] == "0";
  Add({name + ": graph memory",
       "2 GiB graph: capture " + big["capture"] + ", instantiate " + big["instantiate"] +
           ", launch " + big["launch"] + "; 256 MiB graph x10: " + (ran ? "ran" : "failed") +
           ", NVML says " + mib(Num(fits, "nvml_bytes")),
       "2 GiB refused; 256 MiB runs, NVML <= the limit",
       refused && ran && verdict(fits) != Verdict::kFail ? verdict(fits) : Verdict::kFail,
       nlohmann::json{{"big", nlohmann::json(big)}, {"fits", nlohmann::json(fits)}}});
  c.Wait();
}

void Checker::SharedVmm() {
  const std::string name = "shared VMM 512 MiB";
  const std::vector<std::string> env = {"TESSERA_CUDA_MEM_LIMIT=4GiB",
                                        "TESSERA_CUDA_REGION=" + dir_ + "/shared-vmm.region"};
  Child a, b;
  std::string err;
  if (!Start({"exporter", env, true, {"memory"}}, "", &a, &err) ||
      !Start({"importer", env, true, {"memory"}}, "", &b, &err)) {
    return Failed(name, "", err);
  }
  for (Child* c : {&a, &b}) {
    if (Fields f = ParseFields(c->ReadLine()); f.count("error"))
      return Failed(name, "", f["error"]);
  }
  auto used = [&](Child& c) {
    c.Send("info");
    Fields f = ParseFields(c.ReadLine());
    return Num(f, "total") - Num(f, "free");
  };
  const double before = used(b);
  const std::string sock = dir_ + "/shared-vmm.sock";
  a.Send("vmmexport:" + sock);
  b.Send("vmmimport:" + sock);
  Fields exported = ParseFields(a.ReadLine()), imported = ParseFields(b.ReadLine());
  if (exported["rc"] != "0" || imported["rc"] != "0") {
    return Failed(name, "", "export rc " + exported["rc"] + ", import rc " + imported["rc"]);
  }
  const double both = used(b);
  a.Send("vmmdrop");
  a.ReadLine();
  const double importer_only = used(b);
  b.Send("vmmdrop");
  b.ReadLine();
  const double after = used(b);
  constexpr double kShared = 512.0 * (1 << 20), kSlack = 16.0 * (1 << 20);
  auto mib = [](double v) { return Fixed(v / (1 << 20), 0) + " MiB"; };
  Add({name + ": both hold it",
       "charged " + mib(both - before),
       "512 MiB: once",
       std::abs(both - before - kShared) < kSlack ? Verdict::kPass : Verdict::kFail,
       {{"charged_bytes", both - before}}});
  Add({name + ": the exporter let go",
       "charged " + mib(importer_only - before),
       "512 MiB: the importer's mapping keeps it",
       std::abs(importer_only - before - kShared) < kSlack ? Verdict::kPass : Verdict::kFail,
       {{"charged_bytes", importer_only - before}}});
  Add({name + ": both let go",
       "charged " + mib(after - before),
       "0",
       std::abs(after - before) < kSlack ? Verdict::kPass : Verdict::kFail,
       {{"charged_bytes", after - before}}});
  a.Wait();  // stdin closed: the tenants end
  b.Wait();
}

void Checker::ContainerMemory(Nvml* nvml) {
  const std::string name = "container memory limit 1 GiB";
  const std::string goal = "NVML's figure for the process <= the limit";
  Child c;
  std::string err;
  if (!Start({"container",
              {"TESSERA_CUDA_MEM_LIMIT=1GiB", "TESSERA_CUDA_CONTEXT_OVERHEAD=520MiB"},
              true,
              {"memory"},
              {},
              true},
             "", &c, &err)) {
    return Failed(name, goal, err);
  }
  if (Fields f = ParseFields(c.ReadLine()); f.count("error")) return Failed(name, goal, f["error"]);
  // The tenant is unshare's child: its host pid, which NVML lists.
  pid_t tenant = -1;
  const std::string p = std::to_string(c.pid());
  std::ifstream("/proc/" + p + "/task/" + p + "/children") >> tenant;
  for (const char* step : {"modules", "alloc"}) {
    c.Send(step);
    Fields f = ParseFields(c.ReadLine());
    const double used =
        nvml == nullptr || tenant <= 0
            ? NAN
            : static_cast<double>(nvml->ProcessMemory(static_cast<unsigned>(options_.device),
                                                      static_cast<unsigned>(tenant)));
    f["nvml_bytes"] = Fixed(used, 0);
    Add({name + ": " + step,
         f["n"] + (std::string(step) == "modules" ? " modules" : " allocations") + ", NVML says " +
             (std::isnan(used) ? "?" : Fixed(used / (1 << 20), 0) + " MiB"),
         goal,
         std::isnan(used)                 ? Verdict::kInfo
         : used >= 0 && used <= (1 << 30) ? Verdict::kPass
                                          : Verdict::kFail,
         nlohmann::json(f)});
  }
  c.Send("free");
  c.ReadLine();
  c.Wait();
}

void Checker::ProcAddress() {
  // The limit leaves room for a context (about 520 MiB on an H100 with CUDA 13).
  const std::string name = "lookup routes", goal = "2 GiB refused, 64 MiB allowed under 1 GiB";
  Child c;
  std::string err;
  if (!Start({"procaddr",
              {"TESSERA_CUDA_MEM_LIMIT=1GiB"},
              true,
              {"procaddr", "over=2147483648", "under=67108864"}},
             "", &c, &err)) {
    return Failed(name, goal, err);
  }
  std::string escaped, routes;
  nlohmann::json data = nlohmann::json::array();
  for (std::string line = c.ReadLine(); !line.empty(); line = c.ReadLine()) {
    Fields f = ParseFields(line);
    if (f.count("error")) return Failed(name, goal, f["error"]);
    data.push_back(f);
    routes += (routes.empty() ? "" : ", ") + f["route"];
    if (f["over"] != "2" || f["under"] != "0") {
      escaped += " " + f["route"] + " (over " + f["over"] + ", under " + f["under"] + ")";
    }
  }
  c.Wait();
  if (data.empty()) return Failed(name, goal, "no route reported");
  Add({name,
       escaped.empty() ? std::to_string(data.size()) + " routes held: " + routes
                       : "escaped:" + escaped,
       goal, escaped.empty() ? Verdict::kPass : Verdict::kFail, data});
}

}  // namespace tessera::gpucheck::check
