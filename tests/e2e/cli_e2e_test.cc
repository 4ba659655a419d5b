// The tessera binary as users run it: a separate process, real exit codes, real dlopen of the fake NVML.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Result {
  int code;
  std::string out;
};

// Runs `args` through the shell with the tessera binary; captures stdout (stderr with 2>&1 in args).
Result Tessera(const std::string& args, const std::string& env = "") {
  std::string cmd = env + " " + TESSERA_BINARY + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(TesseraBinary, GpusJsonOnSimulatedDgx) {
  Result r = Tessera("gpus -o json --simulate dgx-h100");
  ASSERT_EQ(r.code, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["gpus"].size(), 8u);
  for (const auto& l : j["links"]) EXPECT_EQ(l["label"], "NV18");
}

TEST(TesseraBinary, NoDriverIsExitOneWithOneLineReason) {
  Result r = Tessera("gpus 2>&1", "TESSERA_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("no NVIDIA driver"));
}

TEST(TesseraBinary, FakeDriverThroughDlopen) {
  std::string scenario = "/tmp/tessera-e2e-" + std::to_string(getpid()) + ".json";
  FILE* f = fopen(scenario.c_str(), "w");
  fputs(R"({"devices": [{"name": "NVIDIA A10", "nvswitch_links": 0}, {"name": "NVIDIA A10"}]})", f);
  fclose(f);
  Result r = Tessera("topo -o json",
                     "FAKE_NVML_SCENARIO=" + scenario + " TESSERA_NVML_LIBRARY=" TESSERA_TEST_FAKES_DIR
                     "/nvml-full/libnvidia-ml.so.1");
  remove(scenario.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["simulated"], false);
  EXPECT_EQ(j["matrix"][0][1], "SYS");
}

TEST(TesseraBinary, BadFlagIsExitTwo) {
  EXPECT_EQ(Tessera("gpus --no-such-flag 2>/dev/null").code, 2);
}

}  // namespace
