#include "tessera/core/gpu.h"

#include <array>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tessera::core {
namespace {

struct LevelInfo {
  PcieLevel level;
  std::string_view code;
  std::string_view description;
};

constexpr std::array<LevelInfo, 8> kLevels = {{
    {PcieLevel::kSelf, "X", "the same GPU"},
    {PcieLevel::kBoard, "BRD", "the same board"},
    {PcieLevel::kSingleSwitch, "PIX", "a single PCIe switch"},
    {PcieLevel::kMultipleSwitches, "PXB", "multiple PCIe switches, no host bridge"},
    {PcieLevel::kHostBridge, "PHB", "a PCIe host bridge"},
    {PcieLevel::kNumaNode, "NODE", "host bridges within one NUMA node"},
    {PcieLevel::kSystem, "SYS", "the interconnect between NUMA nodes (sockets)"},
    {PcieLevel::kUnknown, "?", "unknown"},
}};

}  // namespace

std::string_view PcieLevelCode(PcieLevel level) { return kLevels[static_cast<size_t>(level)].code; }

std::string_view PcieLevelDescription(PcieLevel level) {
  return kLevels[static_cast<size_t>(level)].description;
}

std::optional<PcieLevel> ParsePcieLevelCode(std::string_view code) {
  for (const LevelInfo& info : kLevels) {
    if (info.code == code) return info.level;
  }
  return std::nullopt;
}

std::string LinkLabel(const GpuLink& link) {
  if (link.pcie == PcieLevel::kSelf) return "X";
  if (link.has_nvlink()) return "NV" + std::to_string(link.nvlinks);
  return std::string(PcieLevelCode(link.pcie));
}

Topology::Topology(int gpu_count) : size_(gpu_count), links_(size_t(gpu_count) * gpu_count) {
  for (int i = 0; i < gpu_count; ++i) links_[i * size_ + i].pcie = PcieLevel::kSelf;
}

void Topology::SetLink(int a, int b, const GpuLink& link) {
  assert(a != b && a >= 0 && b >= 0 && a < size_ && b < size_);
  links_[a * size_ + b] = link;
  links_[b * size_ + a] = link;
}

std::string FormatComputeCapability(const ComputeCapability& cc) {
  return std::to_string(cc.major) + "." + std::to_string(cc.minor);
}

std::optional<ComputeCapability> ParseComputeCapability(std::string_view text) {
  size_t dot = text.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  ComputeCapability cc;
  auto major = std::from_chars(text.data(), text.data() + dot, cc.major);
  auto minor = std::from_chars(text.data() + dot + 1, text.data() + text.size(), cc.minor);
  if (major.ec != std::errc() || major.ptr != text.data() + dot || minor.ec != std::errc() ||
      minor.ptr != text.data() + text.size() || dot == 0 || dot + 1 == text.size() ||
      cc.major < 0 || cc.minor < 0 || cc.major > 99 || cc.minor > 9) {
    return std::nullopt;
  }
  return cc;
}

uint64_t DefaultContextOverhead(std::string_view model) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  for (std::string_view measured : {"H100", "H200"}) {
    if (model.find(measured) != std::string_view::npos) return 520 * kMiB;
  }
  return 512 * kMiB;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr std::array<const char*, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0 || std::fabs(value - std::round(value)) < 0.05) {
    std::snprintf(buf, sizeof buf, "%.0f %s", value, kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

std::optional<uint64_t> ParseBytes(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  size_t num_end = 0;
  while (num_end < text.size() &&
         ((text[num_end] >= '0' && text[num_end] <= '9') || text[num_end] == '.')) {
    ++num_end;
  }
  if (num_end == 0) return std::nullopt;
  double value = 0;
  auto res = std::from_chars(text.data(), text.data() + num_end, value);
  if (res.ec != std::errc() || res.ptr != text.data() + num_end) return std::nullopt;
  std::string_view unit = text.substr(num_end);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  static constexpr struct {
    std::string_view name;
    double factor;
  } kUnits[] = {
      {"", 1024.0 * 1024},  // a bare number is MiB
      {"B", 1},
      {"KiB", 1024.0},
      {"MiB", 1024.0 * 1024},
      {"GiB", 1024.0 * 1024 * 1024},
      {"TiB", 1024.0 * 1024 * 1024 * 1024},
      // Slurm's `--mem=16G` and Kubernetes' `16Gi`: powers of 1024 as well.
      {"K", 1024.0},
      {"M", 1024.0 * 1024},
      {"G", 1024.0 * 1024 * 1024},
      {"T", 1024.0 * 1024 * 1024 * 1024},
      {"Ki", 1024.0},
      {"Mi", 1024.0 * 1024},
      {"Gi", 1024.0 * 1024 * 1024},
      {"Ti", 1024.0 * 1024 * 1024 * 1024},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
  };
  for (const auto& u : kUnits) {
    if (u.name == unit) {
      double bytes = value * u.factor;
      if (!(bytes >= 0) || bytes > 1.8e19) return std::nullopt;
      return static_cast<uint64_t>(std::llround(bytes));
    }
  }
  return std::nullopt;
}

}  // namespace tessera::core

namespace tessera::core {

std::string FormatDuration(double seconds) {
  auto total = static_cast<int64_t>(seconds + 0.5);
  if (total <= 0) return "0s";
  std::string out;
  for (auto [unit, name] :
       {std::pair<int64_t, char>{86400, 'd'}, {3600, 'h'}, {60, 'm'}, {1, 's'}}) {
    if (total >= unit) out += std::to_string(total / unit) + name, total %= unit;
  }
  return out;
}

std::optional<double> ParseDuration(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  // A whole number (or a decimal one), parsed exactly; false on anything else.
  auto number = [](std::string_view t, double* out) {
    if (t.empty() || t.front() == '-' || t.front() == '+') return false;
    auto res = std::from_chars(t.data(), t.data() + t.size(), *out);
    return res.ec == std::errc() && res.ptr == t.data() + t.size() && *out >= 0;
  };
  double seconds = 0;
  if (text.find(':') != std::string_view::npos || text.find('-') != std::string_view::npos) {
    // Slurm's forms: [D-]HH[:MM[:SS]] with a day, else [[HH:]MM:]SS... as Slurm reads them: MM,
    // MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
    double days = 0;
    std::string_view rest = text;
    const size_t dash = text.find('-');
    if (dash != std::string_view::npos) {
      if (!number(text.substr(0, dash), &days)) return std::nullopt;
      rest = text.substr(dash + 1);
    }
    std::vector<double> parts;
    for (size_t at = 0;;) {
      const size_t colon = rest.find(':', at);
      double v = 0;
      if (!number(rest.substr(at, colon == std::string_view::npos ? colon : colon - at), &v))
        return std::nullopt;
      parts.push_back(v);
      if (colon == std::string_view::npos) break;
      at = colon + 1;
    }
    if (parts.size() > 3) return std::nullopt;
    if (dash != std::string_view::npos) {
      parts.resize(3, 0);  // D-HH, D-HH:MM, D-HH:MM:SS
      seconds = days * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2];
    } else if (parts.size() == 3) {
      seconds = parts[0] * 3600 + parts[1] * 60 + parts[2];
    } else {  // MM:SS
      seconds = parts[0] * 60 + parts[1];
    }
  } else {
    // "90", "90s", "15m", "1h", "2d", and sums of them: "1h30m".
    size_t at = 0;
    while (at < text.size()) {
      size_t end = at;
      while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || text[end] == '.'))
        ++end;
      double v = 0;
      if (!number(text.substr(at, end - at), &v)) return std::nullopt;
      double unit = 1;
      if (end < text.size()) {
        switch (text[end]) {
          case 's':
            unit = 1;
            break;
          case 'm':
            unit = 60;
            break;
          case 'h':
            unit = 3600;
            break;
          case 'd':
            unit = 86400;
            break;
          default:
            return std::nullopt;
        }
        ++end;
      } else if (at != 0) {
        return std::nullopt;  // "1h30": a unit for every part after the first
      }
      seconds += v * unit;
      at = end;
    }
  }
  if (!(seconds > 0) || seconds > 1e9) return std::nullopt;
  return seconds;
}

std::optional<double> ParseDurationOrZero(std::string_view text) {
  return text == "0" ? std::optional<double>(0) : ParseDuration(text);
}

}  // namespace tessera::core
