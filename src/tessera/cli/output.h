#pragma once
// Output for every command: -o table|json|yaml. Structured data is built once as JSON; YAML is
// rendered from the same tree, so the two never disagree. Table is a small column aligner.

#include <algorithm>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::cli {

enum class Format { kTable, kJson, kYaml };

std::optional<Format> ParseFormat(const std::string& text);

// Writes `value` as pretty JSON or block YAML (kTable is the caller's business).
void EmitStructured(const nlohmann::ordered_json& value, Format format, std::ostream& out);

// `text` safe to print on a terminal: control characters (C0 but none, DEL, C1 as UTF-8), which
// another user's job name or a reason could carry to move the cursor, recolour or retitle the
// terminal, are shown visibly as \xNN (\t, \n, \r as such); the rest, UTF-8 included, as it is.
std::string Printable(std::string_view text);

// One "key   value" line of a page about one thing (`tessera show`, `tessera eff`): the key
// padded to `width`, the value made Printable.
void PrintField(std::ostream& out, std::string_view key, std::string_view value, size_t width);

// A job's output as `tessera logs` prints it: as Printable, but newlines, tabs and carriage returns
// (progress bars) pass as they are. `carry`: a C1 sequence's first byte left at the end of the
// last chunk, prefixed to this one (kept for the next when this one ends in one).
std::string TerminalSafe(std::string_view text, std::string* carry);

// Whether `text` is UTF-8 (what JSON carries); false with the offset of the first byte that is not
// part of a well-formed sequence.
bool IsUtf8(std::string_view text, size_t* bad = nullptr);

// One CSV line (RFC 4180): the cells joined by commas, each quoted when it holds a comma, a quote
// or a newline; ends with "\n".
std::string CsvRow(const std::vector<std::string>& cells);

// A length of time as sacct writes it: "01:02:03", "2-01:02:03" (whole seconds, rounded).
std::string ElapsedClock(double seconds);
// A time (seconds since the epoch) in local time as sacct writes it: "2026-11-25T20:58:03".
std::string LocalTimestamp(double seconds);

// `rows` in the order of a figure (`key(row)`: an optional number), largest first and those
// without it last; `reverse`: smallest first, those without it still last. Stable: rows of one
// figure keep their order (`--sort` of the accounting commands).
template <typename Rows, typename Key>
void SortByFigure(Rows& rows, const Key& key, bool reverse) {
  std::stable_sort(rows.begin(), rows.end(), [&](const auto& a, const auto& b) {
    const auto x = key(a), y = key(b);
    if (!x || !y) return x.has_value() && !y.has_value();
    return reverse ? *x < *y : *x > *y;
  });
}

// Rows of cells printed under a header, columns padded to the widest cell, two spaces apart; every
// cell made Printable.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) {
    for (std::string& cell : row) cell = Printable(cell);
    rows_.push_back(std::move(row));
  }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace tessera::cli
