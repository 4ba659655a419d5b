#include "tessera/net/prometheus.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "fmt/format.h"

namespace tessera::net {

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void MetricsPage::Family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  name_ = name;
}

void MetricsPage::Sample(const Labels& labels, double value, std::string_view suffix) {
  out_ += name_;
  out_ += suffix;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += fmt::format("{}=\"{}\"", labels[i].first, EscapeLabelValue(labels[i].second));
    }
    out_ += '}';
  }
  out_ += fmt::format(" {}\n", value);
}

void AddSelfMetrics(MetricsPage& p, std::string_view component) {
  p.Family("tessera_build_info", "gauge", "The running build: 1, labelled with its version.");
  p.Sample({{"component", std::string(component)}, {"version", TESSERA_VERSION_STRING}}, 1);
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // /proc/self/stat: after the command's ")", field 3 is the state; utime and stime are fields 14
  // and 15, starttime 22 (clock ticks since boot), vsize 23 (bytes), rss 24 (pages).
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  std::vector<std::string> f;
  if (const size_t close = stat.rfind(')'); close != std::string::npos) {
    std::istringstream rest(stat.substr(close + 2));
    for (std::string w; rest >> w;) f.push_back(w);
  }
  auto field = [&](size_t n) { return n - 3 < f.size() ? std::stod(f[n - 3]) : -1.0; };
  double boot = -1;
  std::ifstream proc_stat("/proc/stat");
  for (std::string key; proc_stat >> key;) {
    if (key == "btime") {
      proc_stat >> boot;
      break;
    }
    std::string skip;
    std::getline(proc_stat, skip);
  }
  if (f.size() >= 22 && tick > 0) {
    p.Family("process_cpu_seconds_total", "counter", "User and system CPU time spent, seconds.");
    p.Sample({}, (field(14) + field(15)) / tick);
    p.Family("process_virtual_memory_bytes", "gauge", "Virtual memory size, bytes.");
    p.Sample({}, field(23));
    p.Family("process_resident_memory_bytes", "gauge", "Resident memory size, bytes.");
    p.Sample({}, field(24) * page);
    if (boot >= 0) {
      p.Family("process_start_time_seconds", "gauge",
               "Start time of the process since the Unix epoch, seconds.");
      p.Sample({}, boot + field(22) / tick);
    }
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    int n = 0;
    while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    p.Family("process_open_fds", "gauge", "Open file descriptors.");
    p.Sample({}, n - 1);  // less the one reading the folder
  }
  if (rlimit r{}; getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
    p.Family("process_max_fds", "gauge", "Maximum number of open file descriptors.");
    p.Sample({}, static_cast<double>(r.rlim_cur));
  }
}

}  // namespace tessera::net
