#pragma once
// Options written in a batch script, as sbatch users write them: `tessera submit job.sh` reads the
// script's leading comment block for `#TESSERA` lines (tessera submit's own options) and `#SBATCH`
// lines (sbatch's, translated where Tessera has the same thing; the rest said and ignored). Options
// on the command line win over the script's, as with sbatch. docs/server.md, "Coming from Slurm".

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::cli {

struct Directive {
  int line = 0;                   // in the script, from 1
  std::string text;               // the line as written
  std::vector<std::string> args;  // tessera submit options it means ("--gpus", "2")
};

struct ScriptDirectives {
  std::vector<Directive> directives;
  std::vector<std::string> warnings;  // "job.sh:4: #SBATCH --partition: not used by Tessera ..."
  std::string interpreter;            // from the #! line ("/bin/bash"); empty: none
};

// The directives of the script `text` (named `path` in messages): lines after the #! line up to the
// first line that is neither blank nor a comment. An #SBATCH option Tessera has no equivalent of is
// a warning; a malformed one (--gres=gpu:x) an error naming the file and line.
absl::StatusOr<ScriptDirectives> ParseDirectives(const std::string& text, const std::string& path);

// One #SBATCH line's words (after "#SBATCH") as tessera submit options; the options Tessera does
// not use go to `ignored` (as written). Error: what is wrong with one.
absl::StatusOr<std::vector<std::string>> TranslateSbatch(const std::vector<std::string>& words,
                                                         std::vector<std::string>* ignored);

// `--gpus` as written: "N" (0 to 64 GPUs) or "MIN-MAX" (elastic, 1 <= MIN <= MAX <= 64), as
// {N, 0} or {MIN, MAX}. Error: what is wrong, naming the text (the caller names the flag).
absl::StatusOr<std::pair<int, int>> ParseGpuRange(const std::string& text);

// Splits a directive's rest into words: spaces separate, '...' and "..." quote.
std::vector<std::string> SplitWords(const std::string& text);

}  // namespace tessera::cli
