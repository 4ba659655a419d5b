#include "tessera/cli/output.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace tessera::cli {
namespace {

TEST(Output, YamlRoundTripsJsonTypes) {
  nlohmann::json j = {{"s", "08"},
                      {"n", 8},
                      {"f", 1.5},
                      {"b", false},
                      {"null", nullptr},
                      {"list", {1, 2}},
                      {"nested", {{"k", "v: w"}}}};
  std::ostringstream out;
  EmitStructured(j, Format::kYaml, out);
  YAML::Node y = YAML::Load(out.str());
  EXPECT_EQ(y["s"].as<std::string>(), "08") << "strings stay strings";
  EXPECT_EQ(y["n"].as<int>(), 8);
  EXPECT_DOUBLE_EQ(y["f"].as<double>(), 1.5);
  EXPECT_FALSE(y["b"].as<bool>());
  EXPECT_TRUE(y["null"].IsNull());
  EXPECT_EQ(y["list"][1].as<int>(), 2);
  EXPECT_EQ(y["nested"]["k"].as<std::string>(), "v: w");
}

TEST(Output, TableAlignsColumns) {
  Table t({"A", "LONG HEADER"});
  t.AddRow({"wide cell", "x"});
  std::ostringstream out;
  t.Print(out);
  EXPECT_EQ(out.str(), "A          LONG HEADER\nwide cell  x\n");
}

// Another user's job name reaches everyone's terminal through `tessera ls --all`: escape sequences
// (here one that retitles the terminal and one that clears it) and C1 controls are shown as text;
// UTF-8 stays as it is.
TEST(Output, TablesShowControlCharactersVisibly) {
  EXPECT_EQ(Printable("train\x1b]0;pwned\x07"), "train\\x1b]0;pwned\\x07");
  EXPECT_EQ(Printable("a\tb\nc\rd\x7f"), "a\\tb\\nc\\rd\\x7f");
  EXPECT_EQ(Printable("\xc2\x9b"
                      "2J"),
            "\\x9b2J")
      << "CSI as a C1 control";
  EXPECT_EQ(Printable("r\xc3\xa9sum\xc3\xa9 \xe2\x9c\x93"), "r\xc3\xa9sum\xc3\xa9 \xe2\x9c\x93");
  Table t({"NAME"});
  t.AddRow({"x\x1b[2J\x1b[H"});
  std::ostringstream out;
  t.Print(out);
  EXPECT_EQ(out.str(), "NAME\nx\\x1b[2J\\x1b[H\n");
  EXPECT_EQ(out.str().find('\x1b'), std::string::npos);
}

// `tessera logs` (issue 51): a job's ESC and OSC 52 (clipboard) sequences and C1 controls do not
// reach the reader's terminal, even split across two reads; lines, tabs and progress bars' \r do.
TEST(Output, LogsShowAJobsEscapeSequencesAsText) {
  std::string carry;
  EXPECT_EQ(TerminalSafe("epoch 1\r\tloss 0.5\n", &carry), "epoch 1\r\tloss 0.5\n");
  EXPECT_EQ(TerminalSafe("x\x1b]52;c;cm0gLXJmIH4=\x07y", &carry), "x\\x1b]52;c;cm0gLXJmIH4=\\x07y");
  EXPECT_EQ(TerminalSafe("a\xc2", &carry), "a");
  EXPECT_EQ(TerminalSafe("\x9b"
                         "2J caf\xc3\xa9",
                         &carry),
            "\\x9b2J caf\xc3\xa9");
  EXPECT_EQ(carry, "");
}

TEST(Output, Utf8IsToldFromOtherBytes) {
  size_t bad = 0;
  EXPECT_TRUE(IsUtf8("r\xc3\xa9sum\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsUtf8("caf\xe9", &bad));
  EXPECT_EQ(bad, 3u);
  EXPECT_FALSE(IsUtf8("\xc0\xaf"));      // overlong
  EXPECT_FALSE(IsUtf8("\xed\xa0\x80"));  // a surrogate
  EXPECT_FALSE(IsUtf8("\xe2\x9c"));      // cut short
}

// -o json escapes C1 controls (U+009B is a terminal's CSI) and never aborts on bytes that are not
// UTF-8.
TEST(Output, JsonOutputEscapesC1AndSurvivesBadBytes) {
  std::ostringstream out;
  EmitStructured(nlohmann::ordered_json{{"name",
                                         "a\xc2\x9b"
                                         "2J"},
                                        {"raw", "caf\xe9"}},
                 Format::kJson, out);
  EXPECT_EQ(out.str().find("\xc2\x9b"), std::string::npos) << out.str();
  const auto back = nlohmann::json::parse(out.str());
  EXPECT_EQ(back["name"],
            "a\xc2\x9b"
            "2J")
      << "the same text, escaped";
  EXPECT_EQ(back["raw"], "caf\xef\xbf\xbd") << "U+FFFD for the byte that is not UTF-8";
}

TEST(Output, CsvRowQuotesWhatNeedsIt) {
  EXPECT_EQ(CsvRow({"a", "b c", ""}), "a,b c,\n");
  EXPECT_EQ(CsvRow({"x,y", "say \"hi\"", "two\nlines"}),
            "\"x,y\",\"say \"\"hi\"\"\",\"two\nlines\"\n");
}

TEST(Output, ParseFormat) {
  EXPECT_EQ(ParseFormat("json"), Format::kJson);
  EXPECT_EQ(ParseFormat("JSON"), std::nullopt);
}

TEST(Output, ElapsedAsSacctWritesIt) {
  EXPECT_EQ(ElapsedClock(0), "00:00:00");
  EXPECT_EQ(ElapsedClock(3723.4), "01:02:03");
  EXPECT_EQ(ElapsedClock(2 * 86400 + 3723), "2-01:02:03");
}

}  // namespace
}  // namespace tessera::cli
