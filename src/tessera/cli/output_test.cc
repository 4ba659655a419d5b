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

TEST(Output, ParseFormat) {
  EXPECT_EQ(ParseFormat("json"), Format::kJson);
  EXPECT_EQ(ParseFormat("JSON"), std::nullopt);
}

}  // namespace
}  // namespace tessera::cli
