// A fake `podman` for the server's tests: the subset of its command line Tessera uses, with
// podman's own checks where they matter - every --device must resolve to a device of a CDI spec in
// the spec folders (podman's error text and exit code 125 otherwise), bound files must exist, the
// image must be known - and then the command runs as a plain child process (no isolation) with the
// container's environment: CDI edits, then --env. Signals are passed on to it as podman's sig-proxy
// does.
//
//   fake_podman --fake-state DIR [--old] <podman arguments>
//
// DIR holds `images` (one known image per line), and gets `<name>.json` (what each run was given),
// `<name>.pid` while it runs and `rm.log` (one line per `podman rm`). --old plays a podman without
// --cdi-spec-dir (it then reads /etc/cdi and /var/run/cdi only, as podman 4.3 does).

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

extern char** environ;

namespace {

using nlohmann::json;

pid_t child = -1;

void Forward(int sig) {
  if (child > 0) kill(child, sig);
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "Error: %s\n", message.c_str());
  return 125;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// "kind=name" -> the device's edits followed by its spec's edits, from every *.json spec in `dirs`.
// Specs must parse and name a kind; devices need a name and edits, as CDI loaders demand.
bool LoadCdi(const std::vector<std::string>& dirs,
             std::map<std::string, std::vector<json>>* devices, std::string* error) {
  for (const std::string& dir : dirs) {
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() < 5 || name.substr(name.size() - 5) != ".json") continue;
      std::ifstream in(dir + "/" + name);
      json spec = json::parse(in, nullptr, false);
      if (spec.is_discarded() || !spec.contains("cdiVersion") || !spec.contains("kind") ||
          !spec.contains("devices")) {
        *error = "CDI spec " + dir + "/" + name + ": malformed";
        closedir(d);
        return false;
      }
      for (const json& dev : spec["devices"]) {
        if (!dev.contains("name") || !dev.contains("containerEdits") ||
            dev["containerEdits"].empty()) {
          *error = "CDI spec " + dir + "/" + name + ": invalid device, empty device edits";
          closedir(d);
          return false;
        }
        std::vector<json> edits = {dev["containerEdits"]};
        if (spec.contains("containerEdits")) edits.push_back(spec["containerEdits"]);
        (*devices)[spec["kind"].get<std::string>() + "=" + dev["name"].get<std::string>()] = edits;
      }
    }
    closedir(d);
  }
  return true;
}

int Run(const std::string& state, const std::vector<std::string>& global,
        const std::vector<std::string>& cdi_dirs, const std::vector<std::string>& args) {
  json record;
  record["global"] = global;  // before `run` (the wrapper's --fake-state included)
  record["argv"] = args;
  std::string name, image, user, workdir;
  std::vector<std::string> devices, volumes, envs, flags;
  std::map<std::string, std::string> limits;  // memory, cpus, pids-limit
  size_t i = 0;
  auto value = [&](const std::string& flag) -> std::string {
    if (i + 1 >= args.size()) return "";
    (void)flag;
    return args[++i];
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("-", 0) != 0) break;
    if (a == "--rm")
      flags.push_back(a);
    else if (a == "--name")
      name = value(a);
    else if (a == "--label")
      flags.push_back("--label " + value(a));
    else if (a == "--user")
      user = value(a);
    else if (a == "--workdir")
      workdir = value(a);
    else if (a == "--device")
      devices.push_back(value(a));
    else if (a == "--volume")
      volumes.push_back(value(a));
    else if (a == "--env")
      envs.push_back(value(a));
    else if (a == "--memory" || a == "--cpus" || a == "--pids-limit")
      limits[a.substr(2)] = value(a);
    else if (a.find('=') != std::string::npos)
      flags.push_back(a);  // --opt=value from the config
    else
      return Fail("fake podman: unknown flag " + a + " (use --flag=value)");
  }
  if (i >= args.size()) return Fail("fake podman: no image");
  image = args[i++];
  std::vector<std::string> command(args.begin() + static_cast<long>(i), args.end());
  record.update({{"name", name},
                 {"image", image},
                 {"user", user},
                 {"workdir", workdir},
                 {"devices", devices},
                 {"volumes", volumes},
                 {"flags", flags},
                 {"limits", limits},
                 {"command", command}});
  std::vector<std::string> own_env;
  for (char** e = environ; *e; ++e) own_env.push_back(*e);
  record["podman_env"] = own_env;

  std::vector<std::string> images = ReadLines(state + "/images");
  if (std::find(images.begin(), images.end(), image) == images.end()) {
    return Fail(image + ": image not known");
  }
  std::map<std::string, std::vector<json>> cdi;
  std::string error;
  if (!LoadCdi(cdi_dirs, &cdi, &error)) return Fail("setting up CDI devices: " + error);
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
      {"container", "podman"},
      {"HOSTNAME", name}};
  std::set<std::string> spec_wide_applied;
  for (const std::string& d : devices) {
    auto it = cdi.find(d);
    if (it == cdi.end()) return Fail("setting up CDI devices: unresolvable CDI devices " + d);
    for (const json& edits : it->second) {
      for (const json& kv : edits.value("env", json::array())) {
        std::string s = kv.get<std::string>();
        env[s.substr(0, s.find('='))] = s.substr(s.find('=') + 1);
      }
      for (const json& m : edits.value("mounts", json::array())) {
        if (!Exists(m["hostPath"].get<std::string>())) {
          return Fail("CDI mount " + m["hostPath"].get<std::string>() +
                      ": no such file or directory");
        }
      }
    }
  }
  for (const std::string& v : volumes) {
    std::string host = v.substr(0, v.find(':'));
    if (!Exists(host)) return Fail("statfs " + host + ": no such file or directory");
  }
  for (const std::string& kv : envs) env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  record["env"] = env;
  {
    std::ofstream out(state + "/" + name + ".json");
    out << record.dump(2);
  }
  if (command.empty()) return Fail("fake podman: images here have no default command");

  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (std::string& s : command) argv.push_back(s.data());
  argv.push_back(nullptr);
  signal(SIGTERM, Forward);
  signal(SIGINT, Forward);
  child = fork();
  if (child == 0) {
    if (!workdir.empty() && Exists(workdir) && chdir(workdir.c_str()) != 0) _exit(126);
    // Looked up in the container's PATH, as the runtime does.
    std::string path = env["PATH"];
    if (command[0].find('/') != std::string::npos) {
      execve(argv[0], argv.data(), envp.data());
    } else {
      size_t start = 0;
      while (start <= path.size()) {
        size_t colon = path.find(':', start);
        std::string p =
            path.substr(start, colon == std::string::npos ? std::string::npos : colon - start) +
            "/" + command[0];
        execve(p.c_str(), argv.data(), envp.data());
        if (colon == std::string::npos) break;
        start = colon + 1;
      }
    }
    std::fprintf(
        stderr, "Error: crun: executable file `%s` not found in $PATH: No such file or directory\n",
        command[0].c_str());
    _exit(127);
  }
  { std::ofstream(state + "/" + name + ".pid") << child << "\n"; }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  unlink((state + "/" + name + ".pid").c_str());
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

int Remove(const std::string& state, const std::vector<std::string>& args) {
  std::string name = args.empty() ? "" : args.back();
  {
    std::ofstream log(state + "/rm.log", std::ios::app);
    log << "rm";
    for (const std::string& a : args) log << " " << a;
    log << "\n";
  }
  std::ifstream pid_file(state + "/" + name + ".pid");
  long pid = 0;
  if (pid_file >> pid && pid > 0) kill(static_cast<pid_t>(pid), SIGKILL);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string state;
  bool old = false;
  std::vector<std::string> cdi_dirs;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    if (args[i] == "--fake-state" && i + 1 < args.size()) {
      state = args[++i];
    } else if (args[i] == "--old") {
      old = true;
    } else if (args[i] == "--cdi-spec-dir" && i + 1 < args.size() && !old) {
      cdi_dirs.push_back(args[++i]);
    } else {
      break;
    }
  }
  if (i >= args.size()) return Fail("fake podman: no command");
  const std::string verb = args[i];
  std::vector<std::string> rest(args.begin() + static_cast<long>(i) + 1, args.end());
  if (verb == "--version") {
    std::printf("podman version %s\n", old ? "4.3.1-fake" : "5.2.0-fake");
    return 0;
  }
  if (verb == "--help") {
    std::printf("Manage pods, containers and images\n\nOptions:\n%s      --log-level string\n",
                old ? "" : "      --cdi-spec-dir stringArray   Set the CDI spec directory path\n");
    return 0;
  }
  if (state.empty()) return Fail("fake podman: --fake-state DIR is required");
  if (cdi_dirs.empty()) cdi_dirs = {"/etc/cdi", "/var/run/cdi"};
  if (verb == "run")
    return Run(state, std::vector<std::string>(args.begin(), args.begin() + static_cast<long>(i)),
               cdi_dirs, rest);
  if (verb == "rm") return Remove(state, rest);
  return Fail("fake podman: unsupported command " + verb);
}
