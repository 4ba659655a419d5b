#pragma once
// Running tests/shim/cuda_client under the intercept library against the fake driver, for the
// tests.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "../capture.h"

extern char** environ;

namespace tessera::shim_test {

inline std::string TempPath(const std::string& name) {
  std::string dir = ::testing::TempDir() + "tessera-shim-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

struct Env {
  std::string limit;
  std::string region;
  bool preload = true;
  std::string extra;
};

inline std::string Command(const Env& env, const std::string& route, const std::string& cmds) {
  std::string c = "env LD_LIBRARY_PATH=" TESSERA_FAKE_CUDA_DIR;
  if (env.preload) c += " LD_PRELOAD=" TESSERA_SHIM_LIBRARY;
  if (!env.limit.empty()) c += " TESSERA_CUDA_MEM_LIMIT='" + env.limit + "'";
  if (!env.region.empty()) c += " TESSERA_CUDA_REGION=" + env.region;
  c += " " + env.extra + " " TESSERA_CUDA_CLIENT " " + route + " " + cmds;
  return c;
}

// Runs the client to completion; stdout (and stderr with 2>&1 in cmds).
inline std::string RunClient(const Env& env, const std::string& route, const std::string& cmds) {
  return tessera::test::Capture(Command(env, route, cmds)).out;
}

// A process left running, its stdout readable: Stop() kills it, Output() waits for its end.
struct Running {
  pid_t pid = -1;
  FILE* out = nullptr;
  std::string first_line;
  void Stop() {
    if (pid > 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
    if (out) fclose(out);
    pid = -1, out = nullptr;
  }
  // Everything it writes from here until it ends.
  std::string Output() {
    std::string all;
    char buf[512];
    size_t n;
    while (out && (n = fread(buf, 1, sizeof buf, out)) > 0) all.append(buf, n);
    if (out) fclose(out);
    if (pid > 0) waitpid(pid, nullptr, 0);
    pid = -1, out = nullptr;
    return all;
  }
};

// `/bin/sh -c shell`, its stdout a pipe to read.
inline Running Spawn(const std::string& shell) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  const char* argv[] = {"/bin/sh", "-c", shell.c_str(), nullptr};
  Running r;
  posix_spawn(&r.pid, "/bin/sh", &fa, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  r.out = fdopen(fds[0], "r");
  return r;
}

// The client left running; its first line is read.
inline Running Start(const Env& env, const std::string& route, const std::string& cmds) {
  Running r = Spawn("exec " + Command(env, route, cmds));
  char line[256] = "";
  if (fgets(line, sizeof line, r.out)) r.first_line = line;
  return r;
}

}  // namespace tessera::shim_test
