#pragma once
// Internal: a small CSV reader for the trace loaders. Columns by header name (required and
// optional; unknown ones refused), no quoting (the traces have none), errors as "file:line: what"
// thrown as ParseError and turned into a Status by the loader.

#include <charconv>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fmt/format.h"

namespace tessera::sim::csv {

struct ParseError {
  std::string message;
};

// Splits one CSV line (the trace has no quoting) into fields.
inline std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t comma = line.find(',', start);
    out.push_back(line.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

inline bool ValidName(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x21 || c == 0x7f) return false;
  }
  return true;
}

class Csv {
 public:
  Csv(std::string_view text, std::string_view filename, std::vector<std::string> required,
      std::vector<std::string> optional)
      : text_(text), filename_(filename) {
    std::string_view header;
    if (!NextLine(header)) Fail(1, "the file is empty (expected a header line)");
    auto names = Fields(header);
    for (size_t i = 0; i < names.size(); ++i) {
      std::string name(names[i]);
      if (columns_.contains(name)) Fail(1, fmt::format("column '{}' appears twice", name));
      columns_[name] = i;
    }
    for (const std::string& r : required) {
      if (!columns_.contains(r)) Fail(1, fmt::format("missing column '{}'", r));
    }
    std::set<std::string> known(required.begin(), required.end());
    known.insert(optional.begin(), optional.end());
    for (const auto& [name, i] : columns_) {
      if (!known.contains(name)) Fail(1, fmt::format("unknown column '{}'", name));
    }
    width_ = names.size();
  }

  // Advances to the next non-empty row; false at the end.
  bool Next() {
    std::string_view line;
    while (NextLine(line)) {
      if (line.empty()) continue;
      row_ = Fields(line);
      if (row_.size() != width_) {
        Fail(line_, fmt::format("expected {} fields, got {}", width_, row_.size()));
      }
      return true;
    }
    return false;
  }

  bool Has(const std::string& column) const { return columns_.contains(column); }
  std::string_view Get(const std::string& column) const { return row_[columns_.at(column)]; }

  int64_t Int(const std::string& column, int64_t lo, int64_t hi) const {
    std::string_view s = Get(column);
    int64_t v = 0;
    auto res = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size() || v < lo || v > hi) {
      Fail(line_, fmt::format("{}: expected an integer {}..{}, got '{}'", column, lo, hi, s));
    }
    return v;
  }

  std::optional<int64_t> OptionalInt(const std::string& column, int64_t lo, int64_t hi) const {
    if (!Has(column) || Get(column).empty()) return std::nullopt;
    return Int(column, lo, hi);
  }

  // The row's name in `column`, checked to be a name (printable, no spaces, at most 253 bytes) and,
  // with `seen`, not listed before: "sn: not a node name: '...'", "name: pod 'a' listed twice".
  std::string_view Name(const std::string& column, std::string_view what,
                        std::set<std::string, std::less<>>* seen) const {
    std::string_view name = Get(column);
    if (!ValidName(name)) Fail(line_, fmt::format("{}: not a {} name: '{}'", column, what, name));
    if (seen != nullptr && !seen->emplace(name).second) {
      Fail(line_, fmt::format("{}: {} '{}' listed twice", column, what, name));
    }
    return name;
  }

  // "A100|H100" -> {"A100", "H100"}; an empty model is an error.
  std::vector<std::string> Models(const std::string& column) const {
    std::vector<std::string> out;
    std::string_view spec = Get(column);
    size_t start = 0;
    for (;;) {
      size_t bar = spec.find('|', start);
      std::string_view m = spec.substr(start, bar == std::string_view::npos ? bar : bar - start);
      if (m.empty()) Fail(line_, fmt::format("{}: empty model in '{}'", column, spec));
      out.emplace_back(m);
      if (bar == std::string_view::npos) break;
      start = bar + 1;
    }
    return out;
  }

  [[noreturn]] void Fail(size_t line, const std::string& what) const {
    throw ParseError{fmt::format("{}:{}: {}", filename_, line, what)};
  }
  size_t line() const { return line_; }

 private:
  bool NextLine(std::string_view& out) {
    if (pos_ >= text_.size()) return false;
    size_t nl = text_.find('\n', pos_);
    out = text_.substr(pos_, nl == std::string_view::npos ? std::string_view::npos : nl - pos_);
    pos_ = nl == std::string_view::npos ? text_.size() : nl + 1;
    if (!out.empty() && out.back() == '\r') out.remove_suffix(1);
    ++line_;
    return true;
  }

  std::string_view text_;
  std::string_view filename_;
  size_t pos_ = 0;
  size_t line_ = 0;
  size_t width_ = 0;
  std::map<std::string, size_t> columns_;
  std::vector<std::string_view> row_;
};

inline absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fmt::format("{}: cannot open for reading", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace tessera::sim::csv
