#pragma once
// Output for every command: -o table|json|yaml. Structured data is built once as JSON; YAML is
// rendered from the same tree, so the two never disagree. Table is a small column aligner.

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace tessera::cli {

enum class Format { kTable, kJson, kYaml };

std::optional<Format> ParseFormat(const std::string& text);

// Writes `value` as pretty JSON or block YAML (kTable is the caller's business).
void EmitStructured(const nlohmann::ordered_json& value, Format format, std::ostream& out);

// Rows of cells printed under a header, columns padded to the widest cell, two spaces apart.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace tessera::cli
