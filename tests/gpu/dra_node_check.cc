// tessera-dra-node-check: `tessera agent --dra` on this machine's real NVIDIA driver, with the
// kubelet's side of DRA (tests/fakes/kubelet) and a fake API server around it - what no CI machine
// can show: the ResourceSlice attributes read from the real NVML and sysfs, the CDI specs naming
// the real device nodes and libraries, a whole GPU and a share prepared, and inside a process run
// as the share's CDI spec says (its environment, mounts at their host paths) the share's memory
// limit under the real CUDA driver. Prints one line per check; writes the slices and specs to
// --out. Exit 0: every check passed; 1: one failed; 77: no NVIDIA driver here.
//
//   tessera-dra-node-check --tessera build/release/tessera
//       --shim build/release/libtessera-cuda.so --out /tmp/dra-check [--python python3]
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../capture.h"
#include "../cdi_edits.h"
#include "fake_apiserver.h"
#include "fake_dra_kubelet.h"

extern char** environ;

namespace {

using nlohmann::json;
using tessera::fakes::FakeApiServer;
using tessera::test::FakeDraKubelet;
namespace fs = std::filesystem;
namespace dra = tessera::test::dra;

constexpr char kDriver[] = "gpu.tessera.io";
constexpr char kNode[] = "gpu-node";
constexpr char kClaims[] = "/apis/resource.k8s.io/v1/namespaces/lab/resourceclaims";
constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices";

int failures = 0;

bool Check(bool ok, const std::string& what, const std::string& detail = "") {
  std::printf("%-5s %s%s%s\n", ok ? "pass" : "FAIL", what.c_str(), detail.empty() ? "" : ": ",
              detail.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
  return ok;
}

json Claim(const std::string& name, const std::vector<std::string>& devices, json config) {
  json results = json::array();
  for (const auto& d : devices) {
    results.push_back({{"request", "r"}, {"driver", kDriver}, {"pool", kNode}, {"device", d}});
  }
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"name", name}, {"namespace", "lab"}}},
          {"spec", {{"devices", {{"requests", json::array()}}}}},
          {"status", {{"allocation", {{"devices", {{"results", results}, {"config", config}}}}}}}};
}

// What a runtime gives a container from the CDI specs of `ids` ("vendor/class=name"): each spec's
// own edits and the device's (tests/cdi_edits.h).
tessera::test::CdiProcess CdiEdits(const std::string& cdi_dir,
                                   const std::vector<std::string>& ids) {
  tessera::test::CdiProcess out;
  for (const auto& file : fs::directory_iterator(cdi_dir)) {
    const json spec = json::parse(tessera::test::ReadFile(file.path()));
    const std::string kind = spec.value("kind", "");
    for (const json& d : spec["devices"]) {
      if (std::find(ids.begin(), ids.end(), kind + "=" + d.value("name", "")) == ids.end())
        continue;
      tessera::test::ApplyCdiEdits(spec.value("containerEdits", json::object()), &out);
      tessera::test::ApplyCdiEdits(d.value("containerEdits", json::object()), &out);
    }
  }
  return out;
}

tessera::test::Captured RunWith(const std::map<std::string, std::string>& env,
                                const std::string& python, const std::string& script) {
  // A clean environment but for where Python finds its packages (a venv, user site, PYTHONPATH).
  std::string cmd = "env -i";
  for (const char* keep : {"PATH", "HOME", "PYTHONPATH", "VIRTUAL_ENV"}) {
    if (const char* v = std::getenv(keep)) cmd += std::string(" '") + keep + "=" + v + "'";
  }
  for (const auto& [k, v] : env) cmd += " '" + k + "=" + v + "'";
  return tessera::test::Capture(cmd + " " + python + " -c '" + script + "' 2>&1");
}

}  // namespace

int main(int argc, char** argv) {
  std::string tessera = "tessera", shim, out = "dra-node-check", python = "python3", nvml;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tessera")
      tessera = argv[i + 1];
    else if (flag == "--shim")
      shim = argv[i + 1];
    else if (flag == "--out")
      out = argv[i + 1];
    else if (flag == "--python")
      python = argv[i + 1];
    else if (flag == "--nvml-library")
      nvml = argv[i + 1];  // a dry run on the fake NVML
    else {
      std::fprintf(stderr, "unknown flag %s (--tessera, --shim, --out, --python, --nvml-library)\n",
                   argv[i]);
      return 2;
    }
  }
  const bool real = nvml.empty();
  if (real && tessera::test::Capture("nvidia-smi -L 2>&1").code != 0) {
    std::puts("no NVIDIA driver here: nothing was checked");
    return 77;
  }
  if (!real) {
    std::puts(
        ("a dry run on " + nvml +
         ": what only a real driver shows (nvidia-smi's facts, sysfs, device nodes, CUDA under "
         "the CDI env) is left out")
            .c_str());
  }
  fs::create_directories(out);
  // The kubelet's sockets live under the work folder, and a unix socket's path has at most 107
  // bytes: a short temporary folder, not one under --out (a build tree can be deep), removed at
  // exit.
  const char* tmp = std::getenv("TMPDIR");
  std::string w = std::string(tmp && *tmp ? tmp : "/tmp") + "/tessera-dra-XXXXXX";
  if (mkdtemp(w.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  struct RemoveAtExit {
    std::string dir;
    ~RemoveAtExit() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{w};
  for (const char* sub : {"/kubelet", "/state", "/cdi"}) fs::create_directories(w + sub);

  FakeApiServer api;
  api.Put("/api/v1/nodes", {{"metadata", {{"name", kNode}}}});
  std::string cmd =
      "exec " + tessera + " agent --dra --dra-partitionable --shares-per-gpu 4" +
      " --driver-root / --node-name " + kNode + " --kubelet-dir " + w + "/kubelet --state-dir " +
      w + "/state --cdi-dir " + w +
      "/cdi --metrics-address '' --pod-resources-socket '' --kubeconfig " +
      api.WriteKubeconfig(w + "/kubeconfig") + (shim.empty() ? "" : " --shim-library " + shim) +
      (nvml.empty() ? "" : " --nvml-library " + nvml) + " >" + out + "/agent.log 2>&1";
  const char* sh[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(sh), environ) != 0) {
    std::perror("spawn");
    return 1;
  }
  auto log = [&] { return tessera::test::ReadFile(out + "/agent.log"); };

  // Slices: the real NVML's facts.
  bool exited = false;
  const bool published = FakeApiServer::WaitFor(
      [&] {
        exited = exited || waitpid(pid, nullptr, WNOHANG) == pid;
        return exited || api.List(kSlices).size() >= 2;
      },
      std::chrono::seconds(30));
  if (!Check(published && !exited, "ResourceSlices published")) {
    std::fputs(log().c_str(), stdout);
    if (!exited) kill(pid, SIGTERM);
    return 1;
  }
  json slices = json::array();
  for (const json& s : api.List(kSlices)) slices.push_back(s);
  std::ofstream(out + "/slices.json") << slices.dump(2);
  json whole;
  for (const json& s : slices) {
    for (const json& d : s["spec"].value("devices", json::array())) {
      if (d["name"] == "gpu-0") whole = d;
    }
  }
  const std::string smi =
      !real ? ""
            : tessera::test::Capture(
                  "nvidia-smi "
                  "--query-gpu=uuid,name,driver_version,pci.bus_id,memory.total,compute_cap "
                  "--format=csv,noheader,nounits -i 0")
                  .out;
  if (real) std::printf("nvidia-smi: %s", smi.c_str());
  if (Check(whole.is_object(), "GPU 0 published whole as gpu-0")) {
    const json& a = whole["attributes"];
    std::printf("gpu-0: %s\n", whole.dump().c_str());
    for (const char* k : {"uuid", "productName", "driverVersion", "cudaDriverVersion",
                          "cudaComputeCapability", "pciBusID", "architecture"}) {
      Check(a.contains(k), std::string("attribute ") + k, a.contains(k) ? a[k].dump() : "absent");
    }
    if (real && a.contains("uuid")) {
      Check(smi.find(a["uuid"].value("string", "?")) != std::string::npos, "uuid as nvidia-smi");
    }
    if (a.contains("driverVersion")) {
      // nvidia-smi's "580.159.04" as a semantic version: "580.159.4".
      Check(a["driverVersion"].contains("version"), "driverVersion is a version",
            a["driverVersion"].dump());
    }
    const bool root = a.contains("resource.kubernetes.io/pcieRoot");
    if (real)
      Check(root, "PCIe root from sysfs",
            root ? a["resource.kubernetes.io/pcieRoot"].dump() : "absent (see agent.log)");
    Check(whole["capacity"].contains("memory"), "memory capacity", whole["capacity"].dump());
  }

  FakeDraKubelet kubelet(w + "/kubelet");
  if (!Check(kubelet.Register(kDriver), "registered with the kubelet", kubelet.why())) {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    std::fputs(log().c_str(), stdout);
    return 1;
  }
  kubelet.WatchHealth();
  Check(kubelet.WaitHealth([](const v1::NodeWatchResourcesResponse& r) {
    for (const auto& d : r.devices()) {
      if (d.device().device_name() == "gpu-0" && d.health() == v1::HEALTHY) return true;
    }
    return false;
  }),
        "health stream says gpu-0 healthy");

  // A whole GPU: its CDI spec names the real device nodes, and CUDA sees the whole memory.
  auto uid_of = [&](const std::string& name) {
    return (*api.Get(kClaims, name))["metadata"]["uid"].get<std::string>();
  };
  api.Put(kClaims, Claim("whole", {"gpu-0"}, json::array()));
  dra::NodePrepareResourcesResponse resp;
  const bool ok = kubelet.Prepare({{"lab", "whole", uid_of("whole")}}, &resp).ok();
  const auto& entry = resp.claims().at(uid_of("whole"));
  if (Check(ok && entry.error().empty() && entry.devices_size() == 1, "whole GPU prepared",
            entry.error())) {
    std::vector<std::string> ids(entry.devices(0).cdi_device_ids().begin(),
                                 entry.devices(0).cdi_device_ids().end());
    tessera::test::CdiProcess process = CdiEdits(w + "/cdi", ids);
    std::map<std::string, std::string>& env = process.env;
    std::string listed;
    bool all_there = !process.device_nodes.empty();
    for (const auto& n : process.device_nodes) {
      listed += n + " ";
      all_there = all_there && fs::exists(n);
    }
    if (real) Check(all_there, "CDI device nodes exist", listed);  // the agent lists what exists
    env.erase("NVIDIA_VISIBLE_DEVICES");  // "void": for the runtime, not for this host process
    if (real) {
      auto r = RunWith(env, python,
                       "import torch; f, t = torch.cuda.mem_get_info(); "
                       "print(torch.cuda.device_count(), t >> 20)");
      std::printf("whole GPU under its CDI env: %s", r.out.c_str());
      Check(r.code == 0, "CUDA runs under the whole GPU's CDI env");
    }
  }
  dra::NodeUnprepareResourcesResponse un;
  Check(kubelet.Unprepare({{"lab", "whole", uid_of("whole")}}, &un).ok() &&
            un.claims().at(uid_of("whole")).error().empty(),
        "whole GPU unprepared");

  // Two of GPU 0's four shares, 8 GiB: inside, CUDA's total is 8 GiB, 6 GiB fit and 4 GiB more
  // are refused by the intercept library.
  json config = json::array({{{"source", "FromClaim"},
                              {"requests", {"r"}},
                              {"opaque",
                               {{"driver", kDriver},
                                {"parameters",
                                 {{"apiVersion", "gpu.tessera.io/v1alpha1"},
                                  {"kind", "ShareConfig"},
                                  {"memory", "8Gi"}}}}}}});
  api.Put(kClaims, Claim("share", {"gpu-0-share-0", "gpu-0-share-1"}, config));
  resp.Clear();
  const bool sok = kubelet.Prepare({{"lab", "share", uid_of("share")}}, &resp).ok();
  const auto& sentry = resp.claims().at(uid_of("share"));
  if (Check(sok && sentry.error().empty() && sentry.devices_size() >= 1, "share prepared",
            sentry.error())) {
    std::vector<std::string> ids;
    for (const auto& d : sentry.devices())
      ids.insert(ids.end(), d.cdi_device_ids().begin(), d.cdi_device_ids().end());
    std::map<std::string, std::string> env = CdiEdits(w + "/cdi", ids).env;
    env.erase("NVIDIA_VISIBLE_DEVICES");
    Check(env["TESSERA_CUDA_MEM_LIMIT"] == "0:8589934592" &&
              env["TESSERA_CUDA_COMPUTE_SHARE"] == "50%",
          "share limits in the CDI env",
          env["TESSERA_CUDA_MEM_LIMIT"] + " " + env["TESSERA_CUDA_COMPUTE_SHARE"]);
    if (real) {
      auto r = RunWith(
          env, python,
          "import torch\n"
          "f, t = torch.cuda.mem_get_info(); print(\"total MiB\", t >> 20)\n"
          "x = torch.empty(6 << 30, dtype=torch.uint8, device=\"cuda\"); print(\"6 GiB: taken\")\n"
          "try:\n"
          "  y = torch.empty(4 << 30, dtype=torch.uint8, device=\"cuda\"); print(\"4 GiB more: "
          "ALLOWED\")\n"
          "except Exception as e: print(\"4 GiB more: refused\")\n");
      std::printf("share under its CDI env:\n%s", r.out.c_str());
      Check(r.code == 0 && r.out.find("total MiB 8192") != std::string::npos,
            "CUDA's total memory is the share's 8 GiB");
      Check(r.out.find("6 GiB: taken") != std::string::npos &&
                r.out.find("4 GiB more: refused") != std::string::npos,
            "the 8 GiB limit holds under the real driver");
    }
  }
  un.Clear();
  Check(kubelet.Unprepare({{"lab", "share", uid_of("share")}}, &un).ok() &&
            un.claims().at(uid_of("share")).error().empty(),
        "share unprepared");
  for (const auto& f : fs::directory_iterator(w + "/cdi")) {
    fs::copy_file(f.path(), out + "/" + f.path().filename().string(),
                  fs::copy_options::overwrite_existing);
  }

  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "agent stopped cleanly on SIGTERM");
  // As upstream's kubelet plugin helper does: the slices stay for the kubelet to wipe if the
  // driver does not come back (an upgrade's new pod finds them current).
  Check(!api.List(kSlices).empty(), "slices left on stop for the kubelet");
  fs::remove_all(w);  // sockets, checkpoint and specs; what is worth reading was copied to --out
  std::printf("%d checks failed\n", failures);
  return failures == 0 ? 0 : 1;
}
