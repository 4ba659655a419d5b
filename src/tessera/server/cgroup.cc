#include "tessera/server/cgroup.h"

#include <fcntl.h>
#include <linux/bpf.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace tessera::server {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `value` to a cgroup file; an error names the file and the kernel's reason.
absl::Status WriteFile(const std::string& path, const std::string& value) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(fmt::format("{}: {}", path, strerror(errno)));
  ssize_t n = write(fd, value.data(), value.size());
  int e = errno;
  close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return absl::InternalError(fmt::format("writing '{}' to {}: {}", value, path, strerror(e)));
  }
  return absl::OkStatus();
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// A "key value" line of a flat-keyed cgroup file (memory.events, cpu.stat, memory.oom_control).
int64_t KeyedValue(const std::string& text, const std::string& key, int64_t missing) {
  std::istringstream in(text);
  std::string k;
  int64_t v;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return missing;
}

int64_t Number(const std::string& path, int64_t missing) {
  std::string s = ReadFile(path);
  if (s.empty()) return missing;
  char* end = nullptr;
  long long v = strtoll(s.c_str(), &end, 10);
  return end == s.c_str() ? missing : static_cast<int64_t>(v);
}

int Bpf(int cmd, bpf_attr* attr) {
  return static_cast<int>(syscall(SYS_bpf, cmd, attr, sizeof *attr));
}

bpf_insn Insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  bpf_insn i{};
  i.code = code;
  i.dst_reg = dst;
  i.src_reg = src;
  i.off = off;
  i.imm = imm;
  return i;
}

}  // namespace

std::vector<bpf_insn> DeviceProgram(const std::vector<DeviceRule>& rules) {
  std::vector<bpf_insn> p;
  p.push_back(Insn(BPF_LDX | BPF_W | BPF_MEM, BPF_REG_2, BPF_REG_1, 0, 0));  // r2 = access_type
  p.push_back(Insn(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_3, BPF_REG_2, 0, 0));
  p.push_back(Insn(BPF_ALU64 | BPF_RSH | BPF_K, BPF_REG_3, 0, 0, 16));       // r3 = access
  p.push_back(Insn(BPF_ALU64 | BPF_AND | BPF_K, BPF_REG_2, 0, 0, 0xffff));   // r2 = type
  p.push_back(Insn(BPF_LDX | BPF_W | BPF_MEM, BPF_REG_4, BPF_REG_1, 4, 0));  // r4 = major
  p.push_back(Insn(BPF_LDX | BPF_W | BPF_MEM, BPF_REG_5, BPF_REG_1, 8, 0));  // r5 = minor
  for (const DeviceRule& r : rules) {
    std::vector<bpf_insn> block;  // jumps with off 0 are patched to the end of the block
    if (r.type != 'a') {
      block.push_back(Insn(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_2, 0, 0,
                           r.type == 'b' ? BPF_DEVCG_DEV_BLOCK : BPF_DEVCG_DEV_CHAR));
    }
    if (r.major >= 0)
      block.push_back(Insn(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_4, 0, 0, static_cast<int>(r.major)));
    if (r.minor >= 0)
      block.push_back(Insn(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_5, 0, 0, static_cast<int>(r.minor)));
    int allowed = 0;
    if (r.access.find('r') != std::string::npos) allowed |= BPF_DEVCG_ACC_READ;
    if (r.access.find('w') != std::string::npos) allowed |= BPF_DEVCG_ACC_WRITE;
    if (r.access.find('m') != std::string::npos) allowed |= BPF_DEVCG_ACC_MKNOD;
    if (allowed != (BPF_DEVCG_ACC_READ | BPF_DEVCG_ACC_WRITE | BPF_DEVCG_ACC_MKNOD)) {
      // Every access asked must be among those allowed: (access & ~allowed) == 0.
      block.push_back(Insn(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_6, BPF_REG_3, 0, 0));
      block.push_back(Insn(BPF_ALU64 | BPF_AND | BPF_K, BPF_REG_6, 0, 0, ~allowed));
      block.push_back(Insn(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_6, 0, 0, 0));
    }
    block.push_back(Insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 1));
    block.push_back(Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
    const int n = static_cast<int>(block.size());
    for (int i = 0; i < n; ++i) {
      if ((block[i].code & 0x07) == BPF_JMP && (block[i].code & 0xf0) == BPF_JNE)
        block[i].off = static_cast<int16_t>(n - i - 1);
    }
    p.insert(p.end(), block.begin(), block.end());
  }
  p.push_back(Insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0));
  p.push_back(Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
  return p;
}

namespace {

// Loads the program for `rules`; its fd, or an error with the verifier's reason.
absl::StatusOr<int> LoadDeviceProgram(const std::vector<DeviceRule>& rules) {
  std::vector<bpf_insn> prog = DeviceProgram(rules);
  static const char kLicense[] = "GPL";
  std::vector<char> log(65536);
  bpf_attr a{};
  a.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
  a.insns = reinterpret_cast<uint64_t>(prog.data());
  a.insn_cnt = static_cast<uint32_t>(prog.size());
  a.license = reinterpret_cast<uint64_t>(kLicense);
  int fd = Bpf(BPF_PROG_LOAD, &a);
  if (fd < 0) {
    // Again with the verifier's log, for its reason.
    a.log_buf = reinterpret_cast<uint64_t>(log.data());
    a.log_size = static_cast<uint32_t>(log.size());
    a.log_level = 1;
    fd = Bpf(BPF_PROG_LOAD, &a);
  }
  if (fd < 0) {
    return absl::InternalError(fmt::format("loading the BPF device program: {}{}{}",
                                           strerror(errno), log[0] ? ": " : "",
                                           std::string(log.data()).substr(0, 300)));
  }
  return fd;
}

absl::Status AttachDeviceProgram(const std::string& dir, const std::vector<DeviceRule>& rules) {
  absl::StatusOr<int> prog = LoadDeviceProgram(rules);
  if (!prog.ok()) return prog.status();
  int cg = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cg < 0) {
    close(*prog);
    return absl::InternalError(fmt::format("{}: {}", dir, strerror(errno)));
  }
  bpf_attr a{};
  a.target_fd = static_cast<uint32_t>(cg);
  a.attach_bpf_fd = static_cast<uint32_t>(*prog);
  a.attach_type = BPF_CGROUP_DEVICE;
  // With the programs of the cgroups above (a systemd unit's device policy): all must allow.
  a.attach_flags = BPF_F_ALLOW_MULTI;
  int rc = Bpf(BPF_PROG_ATTACH, &a);
  int e = errno;
  close(cg);
  close(*prog);  // the attachment holds the program for as long as the cgroup lives
  if (rc != 0) {
    return absl::InternalError(
        fmt::format("attaching the BPF device program to {}: {}", dir, strerror(e)));
  }
  return absl::OkStatus();
}

struct Mounts {
  std::string v2;                             // cgroup2 mount point; empty: none
  std::map<std::string, std::string> v1;      // controller -> mount point
  std::map<std::string, std::string> v1root;  // controller -> the mount's root in the hierarchy
  std::string v2root = "/";
};

Mounts ReadMounts(const std::string& mountinfo) {
  Mounts m;
  std::istringstream in(ReadFile(mountinfo));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::vector<std::string> fields;
    std::string w;
    while (f >> w) fields.push_back(w);
    auto dash = std::find(fields.begin(), fields.end(), "-");
    // id parent major:minor root mount-point options... - fstype source super-options
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    const std::string& root = fields[3];
    const std::string& point = fields[4];
    const std::string fstype = *(dash + 1);
    if (fstype == "cgroup2" && m.v2.empty()) {
      m.v2 = point;
      m.v2root = root;
    } else if (fstype == "cgroup") {
      std::istringstream opts(*(dash + 3));
      std::string o;
      while (std::getline(opts, o, ',')) {
        if (o == "devices" || o == "memory" || o == "cpu" || o == "cpuacct" || o == "pids") {
          if (!m.v1.contains(o)) {
            m.v1[o] = point;
            m.v1root[o] = root;
          }
        }
      }
    }
  }
  return m;
}

// Our own cgroup: per v1 controller, and "" for the unified hierarchy.
std::map<std::string, std::string> ReadSelf(const std::string& self_cgroup) {
  std::map<std::string, std::string> out;
  std::istringstream in(ReadFile(self_cgroup));
  std::string line;
  while (std::getline(in, line)) {
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      out[""] = path;
      continue;
    }
    std::istringstream c(controllers);
    std::string one;
    while (std::getline(c, one, ',')) out[one] = path;
  }
  return out;
}

// <mount>/<path of our cgroup below the mount's root>.
std::string Below(const std::string& mount, const std::string& root, const std::string& own) {
  std::string rel = own;
  if (root != "/" && rel.rfind(root, 0) == 0) rel = rel.substr(root.size());
  if (rel == "/") rel.clear();
  return mount + rel;
}

bool MakeDir(const std::string& dir, std::string* why) {
  if (mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return true;
  *why = fmt::format("cannot make {}: {}", dir, strerror(errno));
  return false;
}

}  // namespace

std::string DeviceRule::ToString() const {
  auto num = [](int64_t v) { return v < 0 ? std::string("*") : std::to_string(v); };
  return fmt::format("{} {}:{} {}", type, num(major), num(minor), access);
}

std::vector<DeviceRule> BaseDeviceRules() {
  return {
      {'c', -1, -1, "m"}, {'b', -1, -1, "m"},     // mknod anything (opening needs a rule)
      {'c', 1, 3, "rwm"}, {'c', 1, 5, "rwm"},     // null, zero
      {'c', 1, 7, "rwm"}, {'c', 1, 8, "rwm"},     // full, random
      {'c', 1, 9, "rwm"}, {'c', 5, 0, "rwm"},     // urandom, tty
      {'c', 5, 2, "rwm"}, {'c', 136, -1, "rwm"},  // ptmx, pseudo-terminals
  };
}

std::optional<DeviceRule> RuleFor(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) return std::nullopt;
  return DeviceRule{'c', static_cast<int64_t>(major(st.st_rdev)),
                    static_cast<int64_t>(minor(st.st_rdev)), "rwm"};
}

// Long (issue 32 asks for a reason): the hierarchies a machine may have (cgroup2, cgroup1, both)
// probed in one place, so that which one each resource goes to reads as one decision.
int64_t UserPidsMax(int64_t configured, const std::string& proc_sys) {
  if (configured >= 0) return configured;
  int64_t host = 0;
  for (const char* f : {"pid_max", "threads-max"}) {
    const int64_t v = Number(proc_sys + "/" + f, -1);
    if (v > 0 && (host == 0 || v < host)) host = v;
  }
  return host > 0 ? std::max<int64_t>(host / 4, 1024) : 0;
}

std::unique_ptr<Cgroups> Cgroups::Open(const CgroupOptions& o) {
  std::unique_ptr<Cgroups> c(new Cgroups());
  if (o.mode == "off") {
    c->reason_ = "confinement is off in the config";
    return c;
  }
  const Mounts m = ReadMounts(o.mountinfo);
  const auto self = ReadSelf(o.self_cgroup);
  std::vector<std::string> notes;
  auto add = [&](const std::string& base, bool v2) {
    for (size_t i = 0; i < c->hierarchies_.size(); ++i) {
      if (c->hierarchies_[i].base == base) return static_cast<int>(i);
    }
    c->hierarchies_.push_back({base, v2});
    return static_cast<int>(c->hierarchies_.size() - 1);
  };
  auto v1base = [&](const std::string& controller) -> std::string {
    if (!m.v1.contains(controller)) return "";
    auto own = self.find(controller);
    return Below(m.v1.at(controller), m.v1root.at(controller),
                 own == self.end() ? "/" : own->second) +
           "/" + o.name;
  };
  // The unified hierarchy: our cgroup there, and the controllers it offers us.
  std::string v2own, v2base;
  std::set<std::string> v2controllers;
  if (!m.v2.empty()) {
    v2own = Below(m.v2, m.v2root, self.contains("") ? self.at("") : "/");
    v2base = v2own + "/" + o.name;
    std::istringstream in(ReadFile(v2own + "/cgroup.controllers"));
    std::string w;
    while (in >> w) v2controllers.insert(w);
  }
  std::string why;
  // Devices.
  const bool v1_devices = m.v1.contains("devices");
  const bool want_v1 = o.mode == "cgroup1" || (o.mode == "auto" && v1_devices);
  const bool want_v2 = o.mode == "cgroup2" || (o.mode == "auto" && !v1_devices);
  if (want_v1) {
    if (!v1_devices) {
      c->reason_ = "no cgroup v1 devices controller is mounted";
    } else if (std::string base = v1base("devices"); MakeDir(base, &why)) {
      c->devices_ = add(base, false);
      c->mode_ = "cgroup1";
    } else {
      c->reason_ = why;
    }
  } else if (want_v2) {
    if (m.v2.empty()) {
      c->reason_ = "no cgroup2 hierarchy is mounted";
    } else if (absl::StatusOr<int> probe = LoadDeviceProgram(BaseDeviceRules()); !probe.ok()) {
      c->reason_ = std::string(probe.status().message());
    } else if (close(*probe); MakeDir(v2base, &why)) {
      c->devices_ = add(v2base, true);
      c->mode_ = "cgroup2";
    } else {
      c->reason_ = why;
    }
  }
  // Memory, CPU and pids: in the unified hierarchy when it has the controller, else v1.
  std::string enable;
  for (const char* k : {"memory", "cpu", "pids"}) {
    if (v2controllers.contains(k)) enable += fmt::format("{}+{}", enable.empty() ? "" : " ", k);
  }
  if (!enable.empty()) {
    if (!MakeDir(v2base, &why)) {
      notes.push_back(why);
    } else {
      absl::Status st = WriteFile(v2own + "/cgroup.subtree_control", enable);
      if (!st.ok() && v2own != m.v2) {
        // Processes in our cgroup keep its controllers from its children ("no internal
        // processes"): the server moves to a leaf of its own beside the jobs' subtree.
        const std::string leaf = v2own + "/" + o.name + "-server";
        if (MakeDir(leaf, &why) &&
            WriteFile(leaf + "/cgroup.procs", std::to_string(getpid())).ok()) {
          spdlog::info(
              "confinement: the server moved to {} so that its jobs' cgroups get "
              "controllers",
              leaf);
          st = WriteFile(v2own + "/cgroup.subtree_control", enable);
        }
      }
      if (st.ok()) st = WriteFile(v2base + "/cgroup.subtree_control", enable);
      if (st.ok()) {
        c->v2_enable_ = enable;
        const int h = add(v2base, true);
        if (v2controllers.contains("memory")) c->memory_ = h;
        if (v2controllers.contains("cpu")) c->cpu_ = h;
        if (v2controllers.contains("pids")) c->pids_ = h;
      } else {
        notes.push_back(std::string(st.message()));
      }
    }
  }
  for (auto [key, slot] : {std::pair{"memory", &c->memory_}, std::pair{"cpu", &c->cpu_},
                           std::pair{"cpuacct", &c->cpuacct_}, std::pair{"pids", &c->pids_}}) {
    if (*slot >= 0) continue;
    std::string base = v1base(key);
    if (base.empty()) {
      if (std::string(key) != "cpuacct") notes.push_back(fmt::format("{}: no controller", key));
    } else if (MakeDir(base, &why)) {
      *slot = add(base, false);
    } else {
      notes.push_back(fmt::format("{}: {}", key, why));
    }
  }
  for (size_t i = 0; i < c->hierarchies_.size(); ++i) {
    if (c->hierarchies_[i].v2) c->v2_ = static_cast<int>(i);
  }
  for (const std::string& n : notes) {
    c->reason_ += (c->reason_.empty() ? "" : "; ") + n;
  }
  // The subtree is this server's alone: another server with the same name under the same cgroup
  // would sweep this one's jobs, and remove the subtree when it stops.
  for (const Hierarchy& h : c->hierarchies_) {
    const int fd = open(h.base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    // (A killed server's child may hold it for a moment, as with the state folder's lock.)
    bool locked = false;
    for (int i = 0; i < 30 && !(locked = flock(fd, LOCK_EX | LOCK_NB) == 0); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!locked) {
      close(fd);
      c->busy_ = fmt::format("{} is in use by another tessera server", h.base);
      break;
    }
    c->locks_.push_back(fd);
  }
  if (!c->busy_.empty()) {
    for (int fd : c->locks_) close(fd);
    c->locks_.clear();
  }
  return c;
}

Cgroups::~Cgroups() {
  for (int fd : locks_) close(fd);
}

std::string Cgroups::JobDir(int h, int64_t job) const {
  core::MutexLock lock(dirs_mu_);
  return JobDirLocked(h, job);
}

std::string Cgroups::JobDirLocked(int h, int64_t job) const {
  return fmt::format("{}/{}job-{}", hierarchies_[h].base, UserPartLocked(job), job);
}

std::string Cgroups::UserPartLocked(int64_t job) const {
  if (auto it = user_of_.find(job); it != user_of_.end())
    return fmt::format("user-{}/", it->second);
  // Not made by this server (one before a restart or an upgrade): looked for once.
  for (int h : Used()) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(hierarchies_[h].base, ec)) {
      const std::string name = e.path().filename().string();
      char* end = nullptr;
      const long long uid = name.rfind("user-", 0) == 0 ? strtoll(name.c_str() + 5, &end, 10) : -1;
      if (uid >= 0 && *end == 0 && Exists(fmt::format("{}/job-{}", e.path().string(), job))) {
        user_of_[job] = static_cast<uint32_t>(uid);
        return name + "/";
      }
    }
  }
  return "";
}

std::vector<int> Cgroups::Used() const {
  std::set<int> s;
  for (int h : {devices_, memory_, cpu_, cpuacct_, pids_}) {
    if (h >= 0) s.insert(h);
  }
  return {s.begin(), s.end()};
}

nlohmann::json Cgroups::Describe() const {
  auto where = [&](int h, const char* v1what) -> std::string {
    if (h < 0) return "none";
    return hierarchies_[h].v2 ? "cgroup2 " + hierarchies_[h].base
                              : fmt::format("cgroup1 {} {}", v1what, hierarchies_[h].base);
  };
  nlohmann::json j;
  j["mode"] = mode_;
  j["reason"] = reason_;
  j["devices"] = devices_ < 0 ? "none"
                 : hierarchies_[devices_].v2
                     ? "BPF device program on cgroup2 " + hierarchies_[devices_].base
                     : "cgroup1 devices controller " + hierarchies_[devices_].base;
  j["memory"] = where(memory_, "memory");
  j["cpu"] = where(cpu_, "cpu");
  j["pids"] = where(pids_, "pids");
  return j;
}

absl::StatusOr<std::vector<std::string>> Cgroups::Create(int64_t job, const CgroupLimits& l) {
  std::vector<std::string> procs;
  core::MutexLock lock(dirs_mu_);
  // A leftover of an earlier job of that id (a crash): gone first, so its rules do not carry over.
  RemoveLocked(job);
  user_of_[job] = l.uid;
  absl::Status st;
  std::string why;
  for (int h : Used()) {
    // The user's cgroup first: what all their jobs share (on cgroup2 it passes the controllers
    // on; its pids.max bounds their tasks together).
    const std::string user = fmt::format("{}/user-{}", hierarchies_[h].base, l.uid);
    if (!MakeDir(user, &why)) {
      st = absl::InternalError(why);
      break;
    }
    if (hierarchies_[h].v2 && !v2_enable_.empty())
      st = WriteFile(user + "/cgroup.subtree_control", v2_enable_);
    if (st.ok() && h == pids_)
      st = WriteFile(user + "/pids.max",
                     l.user_pids_max > 0 ? std::to_string(l.user_pids_max) : "max");
    if (!st.ok()) break;
    const std::string dir = fmt::format("{}/job-{}", user, job);
    if (!MakeDir(dir, &why)) {
      st = absl::InternalError(why);
      break;
    }
    procs.push_back(dir + "/cgroup.procs");
  }
  auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dirs_mu_) {
    RemoveLocked(job);
    return s;
  };
  if (!st.ok()) return fail(st);
  if (devices_ >= 0) {
    if (hierarchies_[devices_].v2) {
      st = AttachDeviceProgram(JobDirLocked(devices_, job), l.devices);
    } else {
      const std::string dir = JobDirLocked(devices_, job);
      st = WriteFile(dir + "/devices.deny", "a");
      for (const DeviceRule& r : l.devices) {
        if (st.ok()) st = WriteFile(dir + "/devices.allow", r.ToString());
      }
    }
    if (!st.ok()) return fail(st);
  }
  if (l.memory_bytes > 0 && memory_ >= 0) {
    const std::string dir = JobDirLocked(memory_, job);
    const std::string v = std::to_string(l.memory_bytes);
    if (hierarchies_[memory_].v2) {
      st = WriteFile(dir + "/memory.max", v);
      // The limit is on memory, not memory plus swap: over it the job is killed, not swapped.
      if (st.ok() && Exists(dir + "/memory.swap.max"))
        st = WriteFile(dir + "/memory.swap.max", "0");
    } else {
      st = WriteFile(dir + "/memory.limit_in_bytes", v);
      if (st.ok() && Exists(dir + "/memory.memsw.limit_in_bytes"))
        st = WriteFile(dir + "/memory.memsw.limit_in_bytes", v);
    }
    if (!st.ok()) return fail(st);
  }
  if (l.cpu_milli > 0 && cpu_ >= 0) {
    const std::string dir = JobDirLocked(cpu_, job);
    const int64_t period = 100000, quota = l.cpu_milli * period / 1000;
    if (hierarchies_[cpu_].v2) {
      st = WriteFile(dir + "/cpu.max", fmt::format("{} {}", quota, period));
    } else {
      st = WriteFile(dir + "/cpu.cfs_period_us", std::to_string(period));
      if (st.ok()) st = WriteFile(dir + "/cpu.cfs_quota_us", std::to_string(quota));
    }
    if (!st.ok()) return fail(st);
  }
  if (l.pids_max > 0 && pids_ >= 0) {
    st = WriteFile(JobDirLocked(pids_, job) + "/pids.max", std::to_string(l.pids_max));
    if (!st.ok()) return fail(st);
  }
  return procs;
}

CgroupUsage Cgroups::Usage(int64_t job) const {
  CgroupUsage u;
  if (v2_ >= 0) {
    int64_t usec = KeyedValue(ReadFile(JobDir(v2_, job) + "/cpu.stat"), "usage_usec", -1);
    if (usec >= 0) u.cpu_seconds = static_cast<double>(usec) / 1e6;
  }
  if (u.cpu_seconds < 0 && cpuacct_ >= 0) {
    int64_t ns = Number(JobDir(cpuacct_, job) + "/cpuacct.usage", -1);
    if (ns >= 0) u.cpu_seconds = static_cast<double>(ns) / 1e9;
  }
  if (memory_ >= 0) {
    const std::string dir = JobDir(memory_, job);
    if (hierarchies_[memory_].v2) {
      u.peak_memory_bytes = Number(dir + "/memory.peak", -1);
      u.oom_kills = KeyedValue(ReadFile(dir + "/memory.events"), "oom_kill", 0);
    } else {
      u.peak_memory_bytes = Number(dir + "/memory.max_usage_in_bytes", -1);
      u.oom_kills = KeyedValue(ReadFile(dir + "/memory.oom_control"), "oom_kill", 0);
    }
  }
  return u;
}

bool Cgroups::Remove(int64_t job) {
  core::MutexLock lock(dirs_mu_);
  return RemoveLocked(job);
}

bool Cgroups::RemoveLocked(int64_t job) {
  bool all = true;
  std::vector<int> used = Used();
  // What is left (a daemon the job started, a child it did not wait for) goes with the job.
  for (int h : used) {
    const std::string dir = JobDirLocked(h, job);
    if (!Exists(dir)) continue;
    if (hierarchies_[h].v2 && Exists(dir + "/cgroup.kill")) {
      (void)WriteFile(dir + "/cgroup.kill", "1");
      continue;
    }
    std::istringstream in(ReadFile(dir + "/cgroup.procs"));
    pid_t pid;
    while (in >> pid) {
      if (pid > 0) kill(pid, SIGKILL);
    }
  }
  for (int h : used) {
    const std::string dir = JobDirLocked(h, job);
    if (rmdir(dir.c_str()) != 0 && errno != ENOENT) all = false;
    // The user's cgroup when this was their last job (busy while another runs: kept).
    if (const std::string user = UserPartLocked(job); !user.empty())
      rmdir(fmt::format("{}/{}", hierarchies_[h].base, user).c_str());
  }
  if (all) user_of_.erase(job);
  return all;
}

size_t Cgroups::Sweep(const std::set<int64_t>& keep) {
  std::set<int64_t> found;
  auto job_id = [](const std::string& name) -> int64_t {
    if (name.rfind("job-", 0) != 0) return 0;
    char* end = nullptr;
    const long long id = strtoll(name.c_str() + 4, &end, 10);
    return *end == 0 && id > 0 ? id : 0;
  };
  std::set<std::string> users;
  for (int h : Used()) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(hierarchies_[h].base, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_directory()) continue;
      if (const int64_t id = job_id(name); id > 0 && !keep.contains(id)) found.insert(id);
      if (name.rfind("user-", 0) != 0) continue;
      users.insert(e.path().string());
      for (const auto& j : std::filesystem::directory_iterator(e.path(), ec)) {
        const int64_t id = job_id(j.path().filename().string());
        if (id > 0 && j.is_directory() && !keep.contains(id)) found.insert(id);
      }
    }
  }
  for (int64_t id : found) Remove(id);
  // Users' cgroups none of whose jobs runs any more.
  for (const std::string& u : users) rmdir(u.c_str());
  return found.size();
}

void Cgroups::Close() {
  if (!busy_.empty()) return;  // another server's subtree
  for (const Hierarchy& h : hierarchies_) rmdir(h.base.c_str());
}

}  // namespace tessera::server
