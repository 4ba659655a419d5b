#pragma once
// For the tests that run programs: one shell command line to completion, its stdout (stderr too
// with 2>&1 in the line) and its exit status; and what a program wrote to a file.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace tessera::test {

struct Captured {
  int code = -1;  // exit status; -1 when it did not exit normally
  std::string out;
};

inline Captured Capture(const std::string& command_line) {
  Captured c;
  FILE* p = popen(command_line.c_str(), "r");
  if (p == nullptr) return c;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) c.out.append(buf, n);
  int status = pclose(p);
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return c;
}

// The whole file at `path`; empty when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace tessera::test
