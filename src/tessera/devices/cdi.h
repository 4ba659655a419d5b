#pragma once
// CDI (Container Device Interface) specs for this machine's GPUs, so that a container runtime
// (podman, containerd, CRI-O) hands a container exactly the GPUs it was given: their device nodes,
// the driver's control nodes, and the user-space driver libraries and tools bound read-only at
// their host paths. Devices are named `tessera.io/gpu=<uuid>` (what Tessera uses),
// `tessera.io/gpu=<index>` and `tessera.io/gpu=all`. See docs/server.md ("Containers").

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/core/gpu.h"

namespace tessera::devices {

inline constexpr std::string_view kCdiKind = "tessera.io/gpu";

// The driver files a container needs, as paths on this machine. Only files that exist are listed: a
// simulated machine has none, and its devices carry only their environment.
struct DriverFiles {
  std::vector<std::string> gpu_nodes;      // per GPU index: /dev/nvidia<minor>, "" when it has none
  std::vector<std::string> control_nodes;  // /dev/nvidiactl, /dev/nvidia-uvm, ...
  std::vector<std::string> mounts;  // libraries (by SONAME), tools, the persistenced socket: where
                                    // a container sees them
  std::string host_root = "/";      // the mounts are at these paths under it on the host
};

struct DriverSearch {
  // Where the driver's files are looked for: "/" on a host; in the node agent's container, where
  // the host's driver root is mounted (--driver-root). Paths found are given as under "/".
  std::string root = "/";
  // Where device nodes are looked for; empty: under `root` (the agent's container has the host's
  // /dev at /dev, whatever the driver root).
  std::string dev_root;
  // What `root` is on the host: "/", or the folder of a containerized driver (the GPU operator's
  // /run/nvidia/driver). A spec's mounts name host paths under it.
  std::string host_root = "/";
  std::vector<std::string> library_dirs = {"/usr/lib/x86_64-linux-gnu",
                                           "/lib/x86_64-linux-gnu",
                                           "/usr/lib64",
                                           "/usr/lib/aarch64-linux-gnu",
                                           "/usr/lib",
                                           "/usr/local/nvidia/lib64",  // GKE's and some images'
                                           "/usr/local/nvidia/lib"};
  std::vector<std::string> binary_dirs = {"/usr/bin", "/usr/local/bin", "/usr/sbin",
                                          "/usr/local/nvidia/bin"};
};

// Where `soname` (libnvidia-ml.so.1) is under `search.root` in its library folders, as a path that
// can be opened here (the root included); "" when it is in none.
std::string FindDriverLibrary(const DriverSearch& search, const std::string& soname);

// Looks for the driver files of `inventory`'s GPUs (device nodes by their minor number; libraries
// by SONAME, plus those only named with the driver version). Device nodes must be character
// devices.
DriverFiles FindDriverFiles(const core::NodeInventory& inventory, const DriverSearch& search = {});

// "tessera.io/gpu=<uuid>": how a job's GPU is asked of the runtime.
std::string CdiDeviceName(std::string_view gpu_uuid);

// The spec (JSON text) for `inventory`: a device per GPU under its UUID and its index, and "all".
// Each GPU's edits are its device node and TESSERA_GPU_<index>_UUID; the spec-wide edits, shared by
// every device, are the control nodes and the read-only mounts (hostPath under files.host_root,
// containerPath as found). cdiVersion is the lowest that has
// every field used (0.3.0).
std::string BuildCdiSpec(const core::NodeInventory& inventory, const DriverFiles& files);

// Writes `spec` to <dir>/tessera.io-gpu.json (created with its folder, replaced atomically, mode
// 0644); returns the file's path. kFailedPrecondition naming the path when it cannot.
absl::StatusOr<std::string> WriteCdiSpec(const std::string& dir, const std::string& spec);

}  // namespace tessera::devices
