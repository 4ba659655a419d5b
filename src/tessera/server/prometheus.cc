#include "tessera/server/prometheus.h"

#include "fmt/format.h"

namespace tessera::server {

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

}  // namespace tessera::server
