#include "tessera/cli/output.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>

#include "fmt/format.h"

namespace tessera::cli {
namespace {

void ToYaml(const nlohmann::ordered_json& v, YAML::Emitter& e) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object:
      e << YAML::BeginMap;
      for (const auto& [key, value] : v.items()) {
        e << YAML::Key << key << YAML::Value;
        ToYaml(value, e);
      }
      e << YAML::EndMap;
      break;
    case nlohmann::ordered_json::value_t::array:
      // Short lists of scalars read best on one line.
      if (!v.empty() &&
          std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_primitive(); }) &&
          v.size() <= 16) {
        e << YAML::Flow;
      }
      e << YAML::BeginSeq;
      for (const auto& item : v) ToYaml(item, e);
      e << YAML::EndSeq;
      break;
    case nlohmann::ordered_json::value_t::string:
      e << YAML::DoubleQuoted << v.get<std::string>();
      break;
    case nlohmann::ordered_json::value_t::boolean:
      e << (v.get<bool>() ? "true" : "false");
      break;
    case nlohmann::ordered_json::value_t::null:
      e << YAML::Null;
      break;
    default:
      e << v.dump();
      break;
  }
}

}  // namespace

std::optional<Format> ParseFormat(const std::string& text) {
  if (text == "table") return Format::kTable;
  if (text == "json") return Format::kJson;
  if (text == "yaml") return Format::kYaml;
  return std::nullopt;
}

void EmitStructured(const nlohmann::ordered_json& value, Format format, std::ostream& out) {
  if (format == Format::kYaml) {
    YAML::Emitter e;
    ToYaml(value, e);
    out << e.c_str() << "\n";
  } else {
    // Control characters are escaped by JSON's rules but for C1 (U+0080..U+009F: U+009B is a
    // terminal's CSI): those too, as \u00XX. Text that is not UTF-8 never aborts the output.
    const std::string text =
        value.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    std::string safe;
    safe.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) <= 0x9f &&
          static_cast<unsigned char>(text[i + 1]) >= 0x80) {
        safe += fmt::format("\\u{:04x}", static_cast<unsigned char>(text[++i]));
      } else {
        safe += static_cast<char>(c);
      }
    }
    out << safe << "\n";
  }
}

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool c1 = c == 0xc2 && i + 1 < text.size() &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9f;
    if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c1) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[++i]));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

void PrintField(std::ostream& out, std::string_view key, std::string_view value, size_t width) {
  out << fmt::format("{:<{}} {}\n", key, width, Printable(value));
}

std::string TerminalSafe(std::string_view chunk, std::string* carry) {
  std::string text = *carry;
  text.append(chunk);
  carry->clear();
  if (!text.empty() && static_cast<unsigned char>(text.back()) == 0xc2) {
    carry->assign(1, '\xc2');  // perhaps the start of a C1 character: decided with the next chunk
    text.pop_back();
  }
  std::string out;
  out.reserve(text.size());
  size_t from = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool c1 = c == 0xc2 && i + 1 < text.size() &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9f;
    const bool control = (c < 0x20 && c != '\n' && c != '\t' && c != '\r') || c == 0x7f;
    if (!control && !c1) continue;
    out.append(text, from, i - from);
    out += Printable(text.substr(i, c1 ? 2 : 1));
    if (c1) ++i;
    from = i + 1;
  }
  out.append(text, from, std::string::npos);
  return out;
}

bool IsUtf8(std::string_view t, size_t* bad) {
  for (size_t i = 0; i < t.size();) {
    const auto c = static_cast<unsigned char>(t[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n != 0 && i + n <= t.size() && !(n == 2 && c < 0xc2) && !(c > 0xf4);
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(t[i + k]) >> 6) == 0x2;
    if (ok && n == 3) {  // no overlong forms, no surrogates
      const auto d = static_cast<unsigned char>(t[i + 1]);
      ok = !(c == 0xe0 && d < 0xa0) && !(c == 0xed && d >= 0xa0);
    }
    if (ok && n == 4) {
      const auto d = static_cast<unsigned char>(t[i + 1]);
      ok = !(c == 0xf0 && d < 0x90) && !(c == 0xf4 && d >= 0x90);
    }
    if (!ok) {
      if (bad) *bad = i;
      return false;
    }
    i += n;
  }
  return true;
}

std::string CsvRow(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i) line += ',';
    const std::string& v = cells[i];
    if (v.find_first_of(",\"\n") == std::string::npos) {
      line += v;
      continue;
    }
    line += '"';
    for (char ch : v) line += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    line += '"';
  }
  return line + "\n";
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  };
  print(header_);
  for (const auto& r : rows_) print(r);
}

std::string ElapsedClock(double seconds) {
  const long long t = std::llround(seconds);
  return t >= 86400
             ? fmt::format("{}-{:02}:{:02}:{:02}", t / 86400, t / 3600 % 24, t / 60 % 60, t % 60)
             : fmt::format("{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
}

std::string LocalTimestamp(double seconds) {
  const std::time_t v = static_cast<std::time_t>(seconds);
  std::tm local{};
  localtime_r(&v, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &local);
  return buf;
}

}  // namespace tessera::cli
