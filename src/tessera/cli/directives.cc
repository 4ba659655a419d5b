#include "tessera/cli/directives.h"

#include <cctype>
#include <sstream>

#include "fmt/format.h"

namespace tessera::cli {
namespace {

bool Whole(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// Slurm's --time: a bare number is minutes (Tessera's is seconds), "MM:SS", "HH:MM:SS", "D-HH",
// "D-HH:MM", "D-HH:MM:SS" read alike.
std::string SlurmTime(const std::string& t) { return Whole(t) ? t + "m" : t; }

}  // namespace

absl::StatusOr<std::pair<int, int>> ParseGpuRange(const std::string& text) {
  const size_t dash = text.find('-');
  const std::string min = text.substr(0, dash);
  const std::string max = dash == std::string::npos ? "" : text.substr(dash + 1);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        fmt::format("'{}': {} (N: 0 to 64 GPUs; MIN-MAX: an elastic job, 2-8)", text, why));
  };
  if (!Whole(min) || min.size() > 2 ||
      (dash != std::string::npos && (!Whole(max) || max.size() > 2)))
    return bad("not a GPU count");
  const int lo = std::stoi(min);
  if (dash == std::string::npos) {
    if (lo > 64) return bad("more than 64 GPUs");
    return std::pair{lo, 0};
  }
  const int hi = std::stoi(max);
  if (lo < 1) return bad("an elastic job starts on 1 GPU or more");
  if (hi < lo) return bad(fmt::format("its most ({}) is below its fewest ({})", hi, lo));
  if (hi > 64) return bad("more than 64 GPUs");
  return std::pair{lo, hi};
}

std::vector<std::string> SplitWords(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  bool in = false;
  char quote = 0;
  for (char c : text) {
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        cur += c;
    } else if (c == '\'' || c == '"') {
      quote = c, in = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in) out.push_back(cur), cur.clear(), in = false;
    } else {
      cur += c, in = true;
    }
  }
  if (in) out.push_back(cur);
  return out;
}

absl::StatusOr<std::vector<std::string>> TranslateSbatch(const std::vector<std::string>& words,
                                                         std::vector<std::string>* ignored) {
  ignored->clear();
  std::vector<std::string> out;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string opt = words[i], value;
    // --opt=value, --opt value, -X value, -Xvalue.
    bool takes = true;
    if (opt.rfind("--", 0) == 0) {
      if (const size_t eq = opt.find('='); eq != std::string::npos)
        value = opt.substr(eq + 1), opt.resize(eq), takes = false;
    } else if (opt.size() > 2 && opt[0] == '-') {
      value = opt.substr(2), opt.resize(2), takes = false;
    }
    static const char* kFlags[] = {"--hold", "-H", "--requeue",  "--no-requeue", "--exclusive",
                                   "--wait", "-W", "--parsable", "--overcommit", "-O"};
    bool flag = false;
    for (const char* f : kFlags) flag = flag || opt == f;
    if (!flag && takes) {
      if (i + 1 >= words.size())
        return absl::InvalidArgumentError(fmt::format("{} needs a value", opt));
      value = words[++i];
    }
    if (opt == "-J" || opt == "--job-name") {
      out.insert(out.end(), {"--name", value});
    } else if (opt == "--gres") {
      // gpu:N or gpu:TYPE:N (several gres, comma-separated: the gpu one); Slurm's mps:N (N
      // percent of one GPU, as gres/mps counts it) is a share of one GPU under MPS.
      bool found = false;
      std::stringstream items(value);
      for (std::string item; std::getline(items, item, ',');) {
        if (item.rfind("mps:", 0) == 0) {
          const std::string pct = item.substr(4);
          if (!Whole(pct) || std::stoi(pct) < 1 || std::stoi(pct) > 99)
            return absl::InvalidArgumentError(
                fmt::format("--gres={}: expected mps:count, 1..99 percent of a GPU", value));
          out.insert(out.end(), {"--sharing", "mps", "--gpu-share", pct + "%"});
          found = true;
          continue;
        }
        if (item.rfind("gpu", 0) != 0) continue;
        std::vector<std::string> parts;
        std::stringstream p(item);
        for (std::string part; std::getline(p, part, ':');) parts.push_back(part);
        if (parts[0] != "gpu") continue;
        const std::string count = parts.size() == 1 ? "1" : parts.back();
        if (!Whole(count) || parts.size() > 3)
          return absl::InvalidArgumentError(
              fmt::format("--gres={}: expected gpu[:type]:count", value));
        out.insert(out.end(), {"--gpus", count});
        if (parts.size() == 3) out.insert(out.end(), {"--model", parts[1]});
        found = true;
      }
      if (!found) ignored->push_back(opt + "=" + value);
    } else if (opt == "-G" || opt == "--gpus" || opt == "--gpus-per-node") {
      // N or TYPE:N.
      const size_t colon = value.rfind(':');
      const std::string count = colon == std::string::npos ? value : value.substr(colon + 1);
      if (!ParseGpuRange(count).ok())
        return absl::InvalidArgumentError(
            fmt::format("{}={}: expected [type:]count or [type:]MIN-MAX", opt, value));
      out.insert(out.end(), {"--gpus", count});
      if (colon != std::string::npos) out.insert(out.end(), {"--model", value.substr(0, colon)});
    } else if (opt == "-c" || opt == "--cpus-per-task") {
      out.insert(out.end(), {"--cpus", value});
    } else if (opt == "--mem") {
      out.insert(out.end(), {"--mem", value});
    } else if (opt == "-t" || opt == "--time") {
      out.insert(out.end(), {"--max-runtime", SlurmTime(value)});
    } else if (opt == "-a" || opt == "--array") {
      out.insert(out.end(), {"--array", value});
    } else if (opt == "-n" || opt == "--ntasks") {
      out.insert(out.end(), {"--ntasks", value});
    } else if (opt == "-H" || opt == "--hold") {
      out.push_back("--hold");
    } else if (opt == "--requeue" || opt == "--no-requeue") {
      out.push_back(opt);
    } else if (opt == "-o" || opt == "--output") {
      out.insert(out.end(), {"--stdout", value});
    } else if (opt == "-e" || opt == "--error") {
      out.insert(out.end(), {"--stderr", value});
    } else if (opt == "-d" || opt == "--dependency") {
      // afterok:1:2,afterany:3 (a '?' list: either is unsupported).
      std::stringstream deps(value);
      for (std::string d; std::getline(deps, d, ',');) {
        const size_t colon = d.find(':');
        const std::string kind = d.substr(0, colon);
        const char* ours = kind == "afterok"      ? "ok"
                           : kind == "afternotok" ? "notok"
                           : kind == "afterany"   ? "any"
                                                  : nullptr;
        if (ours == nullptr || colon == std::string::npos)
          return absl::InvalidArgumentError(
              fmt::format("--dependency={}: Tessera has afterok, afternotok and afterany", value));
        out.insert(out.end(), {"--after", std::string(ours) + d.substr(colon)});
      }
    } else {
      // partition, account, qos, nodes, mail...: Slurm's alone.
      ignored->push_back(flag || takes ? opt : opt + "=" + value);
    }
  }
  return out;
}

absl::StatusOr<ScriptDirectives> ParseDirectives(const std::string& text, const std::string& path) {
  ScriptDirectives d;
  std::stringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (n == 1 && line.rfind("#!", 0) == 0) {
      auto words = SplitWords(line.substr(2));
      if (!words.empty()) d.interpreter = words[0];
      continue;
    }
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;  // blank
    if (line[first] != '#') break;             // the script's first command: no more directives
    for (const char* tag : {"#TESSERA", "#SBATCH"}) {
      const std::string t = tag;
      if (line.compare(first, t.size(), t) != 0) continue;
      const std::string rest = line.substr(first + t.size());
      if (!rest.empty() && !std::isspace(static_cast<unsigned char>(rest[0]))) continue;
      Directive dir{n, line.substr(first), SplitWords(rest)};
      if (t == "#SBATCH") {
        std::vector<std::string> ignored;
        auto args = TranslateSbatch(dir.args, &ignored);
        if (!args.ok())
          return absl::InvalidArgumentError(fmt::format("{}:{}: {}: {}", path, n, dir.text,
                                                        std::string(args.status().message())));
        for (const std::string& what : ignored)
          d.warnings.push_back(
              fmt::format("{}:{}: #SBATCH {}: not used by Tessera (ignored)", path, n, what));
        if (args->empty()) continue;
        dir.args = *std::move(args);
      }
      d.directives.push_back(std::move(dir));
    }
  }
  return d;
}

}  // namespace tessera::cli
