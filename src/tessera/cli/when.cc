#include "tessera/cli/when.h"

#include <cctype>
#include <cstdlib>
#include <ctime>
#include <string_view>
#include <utility>

namespace tessera::cli {
namespace {

// Today's (or `days_ago` days before's) local midnight, plus `hour` hours.
double LocalDay(double now, int days_ago, int hour) {
  const time_t t = static_cast<time_t>(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  tm.tm_mday -= days_ago;
  tm.tm_hour = hour;
  tm.tm_min = tm.tm_sec = 0;
  tm.tm_isdst = -1;
  return static_cast<double>(mktime(&tm));
}

// "90m" / "7d" / "2w" (one letter) or "7days" / "2hours" / "1week" (sacct's words): seconds.
std::optional<double> Ago(std::string_view text) {
  static const std::pair<std::string_view, double> kUnits[] = {
      {"seconds", 1}, {"second", 1},   {"s", 1},          {"minutes", 60},  {"minute", 60},
      {"m", 60},      {"hours", 3600}, {"hour", 3600},    {"h", 3600},      {"days", 86400},
      {"day", 86400}, {"d", 86400},    {"weeks", 604800}, {"week", 604800}, {"w", 604800}};
  for (const auto& [unit, seconds] : kUnits) {
    if (text.size() <= unit.size() || text.substr(text.size() - unit.size()) != unit) continue;
    // "7days" ends in "s" too: a unit whose number does not read is not this one.
    const std::string number(text.substr(0, text.size() - unit.size()));
    if (number.empty() || !std::isdigit(static_cast<unsigned char>(number[0]))) continue;
    char* end = nullptr;
    const double v = strtod(number.c_str(), &end);
    if (*end != '\0' || !(v >= 0)) continue;
    return v * seconds;
  }
  return std::nullopt;
}

}  // namespace

std::optional<double> ParseWhen(const std::string& text, double now) {
  if (text == "now") return now;
  if (text == "today" || text == "midnight") return LocalDay(now, 0, 0);
  if (text == "yesterday") return LocalDay(now, 1, 0);
  if (text == "noon") return LocalDay(now, 0, 12);
  if (text.rfind("now-", 0) == 0) {
    auto ago = Ago(std::string_view(text).substr(4));
    return ago ? std::optional<double>(now - *ago) : std::nullopt;
  }
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  if (std::isalpha(static_cast<unsigned char>(text.back()))) {
    auto ago = Ago(text);
    return ago ? std::optional<double>(now - *ago) : std::nullopt;
  }
  for (const char* f : {"%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d"}) {
    std::tm tm{};
    const char* end = strptime(text.c_str(), f, &tm);
    if (end && *end == '\0') {
      tm.tm_isdst = -1;
      return static_cast<double>(mktime(&tm));
    }
  }
  char* end = nullptr;
  const double v = strtod(text.c_str(), &end);
  if (*end == '\0' && v > 1e8) return v;
  return std::nullopt;
}

}  // namespace tessera::cli
