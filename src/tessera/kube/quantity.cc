#include "tessera/kube/quantity.h"

#include <cctype>
#include <cmath>
#include <limits>

#include "fmt/format.h"

namespace tessera::kube {

std::optional<int64_t> ParseQuantity(std::string_view text, double scale) {
  size_t i = 0;
  if (i < text.size() && text[i] == '+') ++i;
  size_t digits_start = i;
  bool dot = false;
  while (i < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[i])) || (text[i] == '.' && !dot))) {
    dot = dot || text[i] == '.';
    ++i;
  }
  std::string number(text.substr(digits_start, i - digits_start));
  if (number.empty() || number == "." || number.size() > 40) return std::nullopt;
  long double value = std::strtold(number.c_str(), nullptr);
  std::string_view suffix = text.substr(i);
  long double mult = 1;
  static const std::pair<std::string_view, long double> kSuffixes[] = {
      {"Ki", 1024.0L},
      {"Mi", 1048576.0L},
      {"Gi", 1073741824.0L},
      {"Ti", 1099511627776.0L},
      {"Pi", 1125899906842624.0L},
      {"Ei", 1152921504606846976.0L},
      {"n", 1e-9L},
      {"u", 1e-6L},
      {"m", 1e-3L},
      {"k", 1e3L},
      {"M", 1e6L},
      {"G", 1e9L},
      {"T", 1e12L},
      {"P", 1e15L},
      {"E", 1e18L},
      {"", 1.0L}};
  bool matched = false;
  for (const auto& [s, m] : kSuffixes) {
    if (suffix == s) {
      mult = m;
      matched = true;
      break;
    }
  }
  if (!matched) {
    // Exponent form: "1e3", "2E-2".
    if (suffix.size() < 2 || (suffix[0] != 'e' && suffix[0] != 'E')) return std::nullopt;
    std::string_view exp = suffix.substr(1);
    size_t j = exp[0] == '-' || exp[0] == '+' ? 1 : 0;
    if (j == exp.size() || exp.size() > 4) return std::nullopt;
    for (size_t k = j; k < exp.size(); ++k) {
      if (!std::isdigit(static_cast<unsigned char>(exp[k]))) return std::nullopt;
    }
    mult = std::pow(10.0L, std::stoi(std::string(exp)));
  }
  long double scaled = value * mult * static_cast<long double>(scale);
  if (!std::isfinite(scaled) || scaled < 0 ||
      scaled > static_cast<long double>(std::numeric_limits<int64_t>::max() / 2)) {
    return std::nullopt;
  }
  // Round up, as Kubernetes does when a quantity is read at a coarser scale; a tiny tolerance keeps
  // "0.1" * 1000 at 100 despite binary floating point.
  return static_cast<int64_t>(std::ceil(scaled - 1e-9L));
}

std::string FormatBinaryQuantity(uint64_t bytes) {
  static const char* kUnits[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  int u = 0;
  while (u < 6 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{}{}", bytes, kUnits[u]);
}

}  // namespace tessera::kube
