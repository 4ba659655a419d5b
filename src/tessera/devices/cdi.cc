#include "tessera/devices/cdi.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/devices/atomic_file.h"

namespace tessera::devices {
namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

// The user-space driver a CUDA program loads (by SONAME, as the dynamic loader asks for them) and
// the tools people expect in a GPU container.
constexpr const char* kLibraries[] = {
    "libcuda.so.1",        "libcudadebugger.so.1",
    "libnvidia-ml.so.1",   "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4", "libnvidia-opencl.so.1",
    "libnvidia-cfg.so.1",  "libnvidia-allocator.so.1",
};
// Libraries only named with the driver version (loaded by that name from the ones above).
constexpr const char* kVersionedLibraries[] = {"libnvidia-gpucomp.so", "libnvidia-nvvm.so"};
constexpr const char* kBinaries[] = {"nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control",
                                     "nvidia-cuda-mps-server"};
constexpr const char* kControlNodes[] = {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                         "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"};
constexpr const char* kPersistencedSocket = "/run/nvidia-persistenced/socket";

std::string Under(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  return (fs::path(root) / fs::path(path).relative_path()).string();
}

// `path` (absolute, as on the host) as it is found here under `root`, with symbolic links
// followed as the host would follow them: an absolute link's target is taken under `root` too
// (stat() here would follow it into this container's own files). "" when it leads nowhere or
// loops.
std::string Resolve(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  std::vector<std::string> todo;  // components still to walk, last first
  for (const auto& c : fs::path(path).relative_path()) todo.insert(todo.begin(), c.string());
  std::string at = "/";  // resolved so far, as on the host
  for (int links = 0; !todo.empty();) {
    const std::string c = todo.back();
    todo.pop_back();
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      at = fs::path(at).parent_path().string();
      if (at.empty()) at.assign(1, '/');
      continue;
    }
    const std::string next = (fs::path(at) / c).string();
    char target[4096];
    const ssize_t n = readlink(Under(root, next).c_str(), target, sizeof target - 1);
    if (n < 0) {
      at = next;  // not a link (or missing: the stat of the whole path says so)
      continue;
    }
    if (++links > 40) return "";
    target[n] = 0;
    const fs::path t(target);
    if (t.is_absolute()) at.assign(1, '/');
    std::vector<std::string> more;
    for (const auto& part : t.relative_path()) more.push_back(part.string());
    for (auto it = more.rbegin(); it != more.rend(); ++it) todo.push_back(*it);
  }
  return Under(root, at);
}

bool IsCharDevice(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// The first of `dirs` holding a regular file (links followed, as on the host) called `name`, as a
// path under "/".
std::string FindIn(const DriverSearch& s, const std::vector<std::string>& dirs,
                   const std::string& name) {
  for (const std::string& d : dirs) {
    std::string p = d + "/" + name;
    if (IsFile(Resolve(s.root, p))) return p;
  }
  return "";
}

}  // namespace

std::string FindDriverLibrary(const DriverSearch& search, const std::string& soname) {
  const std::string p = FindIn(search, search.library_dirs, soname);
  return p.empty() ? "" : Resolve(search.root, p);
}

DriverFiles FindDriverFiles(const core::NodeInventory& inventory, const DriverSearch& search) {
  DriverFiles f;
  f.host_root = search.host_root.empty() ? "/" : search.host_root;
  const std::string& dev = search.dev_root.empty() ? search.root : search.dev_root;
  for (const core::Gpu& g : inventory.gpus) {
    std::string node = g.minor ? fmt::format("/dev/nvidia{}", *g.minor) : "";
    f.gpu_nodes.push_back(!node.empty() && IsCharDevice(Under(dev, node)) ? node : "");
  }
  for (const char* n : kControlNodes) {
    if (IsCharDevice(Under(dev, n))) f.control_nodes.push_back(n);
  }
  std::set<std::string> seen;
  auto add = [&](const std::string& p) {
    if (!p.empty() && seen.insert(p).second) f.mounts.push_back(p);
  };
  for (const char* lib : kLibraries) add(FindIn(search, search.library_dirs, lib));
  if (!inventory.driver_version.empty()) {
    for (const char* lib : kVersionedLibraries) {
      add(FindIn(search, search.library_dirs, fmt::format("{}.{}", lib, inventory.driver_version)));
    }
  }
  for (const char* bin : kBinaries) add(FindIn(search, search.binary_dirs, bin));
  if (IsSocket(Resolve(search.root, kPersistencedSocket))) add(kPersistencedSocket);
  return f;
}

std::string CdiDeviceName(std::string_view gpu_uuid) {
  return fmt::format("{}={}", kCdiKind, gpu_uuid);
}

std::string BuildCdiSpec(const core::NodeInventory& inventory, const DriverFiles& files) {
  ordered_json devices = ordered_json::array();
  ordered_json all_nodes = ordered_json::array(), all_env = ordered_json::array();
  for (size_t i = 0; i < inventory.gpus.size(); ++i) {
    const core::Gpu& g = inventory.gpus[i];
    ordered_json edits;
    std::string env = fmt::format("TESSERA_GPU_{}_UUID={}", g.index, g.uuid);
    edits["env"] = {env};
    all_env.push_back(env);
    if (i < files.gpu_nodes.size() && !files.gpu_nodes[i].empty()) {
      edits["deviceNodes"] = {{{"path", files.gpu_nodes[i]}}};
      all_nodes.push_back({{"path", files.gpu_nodes[i]}});
    }
    // The same GPU under its UUID (stable; what Tessera hands out) and its index (for people).
    devices.push_back({{"name", g.uuid}, {"containerEdits", edits}});
    devices.push_back({{"name", std::to_string(g.index)}, {"containerEdits", edits}});
  }
  ordered_json all_edits;
  all_edits["env"] = all_env;
  if (!all_nodes.empty()) all_edits["deviceNodes"] = all_nodes;
  devices.push_back({{"name", "all"}, {"containerEdits", all_edits}});

  ordered_json spec;
  spec["cdiVersion"] = "0.3.0";
  spec["kind"] = kCdiKind;
  spec["devices"] = devices;
  ordered_json common = ordered_json::object();
  if (!files.control_nodes.empty()) {
    common["deviceNodes"] = ordered_json::array();
    for (const std::string& n : files.control_nodes) common["deviceNodes"].push_back({{"path", n}});
  }
  if (!files.mounts.empty()) {
    common["mounts"] = ordered_json::array();
    for (const std::string& m : files.mounts) {
      common["mounts"].push_back({{"hostPath", Under(files.host_root, m)},
                                  {"containerPath", m},
                                  {"options", {"ro", "nosuid", "nodev", "bind"}}});
    }
  }
  if (!common.empty()) spec["containerEdits"] = common;
  return spec.dump(2) + "\n";
}

absl::StatusOr<std::string> WriteCdiSpec(const std::string& dir, const std::string& spec) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::FailedPreconditionError(fmt::format("CDI spec folder {}: {}", dir, ec.message()));
  const std::string path = dir + "/tessera.io-gpu.json";
  // 0644 whatever the umask: runtimes of every user read it.
  if (absl::Status st = WriteFileAtomically(path, spec, 0644); !st.ok()) {
    return absl::FailedPreconditionError(fmt::format("CDI spec {}", std::string(st.message())));
  }
  return path;
}

}  // namespace tessera::devices
