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

// promtool's check of a metrics page (a file), less its complaints about dcgm-exporter's own names
// on Tessera's DCGM_FI_* series: the label modelName is camelCase, and some counters have no
// "_total" or carry "COUNTER" in their name - kept as dcgm-exporter has them (dashboards and alerts
// written for it read them). Any other lint or a parse error stays, with promtool's exit code (0
// when nothing else is said).
inline Captured PromtoolCheck(const std::string& file) {
  Captured c = Capture("promtool check metrics < " + file + " 2>&1");
  std::string kept;
  size_t start = 0;
  while (start < c.out.size()) {
    size_t end = c.out.find('\n', start);
    if (end == std::string::npos) end = c.out.size();
    const std::string line = c.out.substr(start, end - start);
    // dcgm-exporter's own names and labels, kept as it has them for its dashboards and alerts:
    // modelName, and counters without "_total" (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION...).
    // Each complaint is "<metric> <what>": only these, only of DCGM_FI_* names.
    bool forgiven = false;
    if (line.rfind("DCGM_FI_", 0) == 0) {
      const std::string what = line.substr(line.find(' ') + 1);
      for (const char* ok : {"label names should be written in 'snake_case' not 'camelCase'",
                             "counter metrics should have \"_total\" suffix",
                             "metric name should not include type 'counter'"})
        forgiven |= what.rfind(ok, 0) == 0;
    }
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
