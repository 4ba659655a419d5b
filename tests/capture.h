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

// promtool's check of a metrics page (a file), less its one complaint about dcgm-exporter's own
// label names: modelName is camelCase, and Tessera's DCGM_FI_* series carry it as dcgm-exporter
// does (a dashboard written for it groups by it). Any other lint or a parse error stays, with
// promtool's exit code; only that complaint is forgiven (code 0 when nothing else is said).
inline Captured PromtoolCheck(const std::string& file) {
  Captured c = Capture("promtool check metrics < " + file + " 2>&1");
  std::string kept;
  size_t start = 0;
  while (start < c.out.size()) {
    size_t end = c.out.find('\n', start);
    if (end == std::string::npos) end = c.out.size();
    const std::string line = c.out.substr(start, end - start);
    const bool forgiven =
        line.rfind("DCGM_FI_", 0) == 0 &&
        line.find(" label names should be written in 'snake_case' not 'camelCase'") !=
            std::string::npos &&
        line.find(' ') == line.find(" label names");
    if (!forgiven && !line.empty()) kept += line + "\n";
    start = end + 1;
  }
  // Exit 3: lint problems only (1: the page did not parse).
  if (kept.empty() && c.code == 3) c.code = 0;
  c.out = kept;
  return c;
}

// The whole file at `path`; empty when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace tessera::test
