#include "tessera/core/gpu.h"

#include <gtest/gtest.h>

namespace tessera::core {
namespace {

TEST(Topology, SetLinkIsSymmetricAndDiagonalIsSelf) {
  Topology t(3);
  EXPECT_EQ(t.link(1, 1).pcie, PcieLevel::kSelf);
  EXPECT_EQ(t.link(0, 2).pcie, PcieLevel::kUnknown);
  t.SetLink(0, 2, GpuLink{.nvlinks = 4, .pcie = PcieLevel::kSystem});
  EXPECT_EQ(t.link(2, 0).nvlinks, 4);
  EXPECT_EQ(t.link(0, 2).pcie, PcieLevel::kSystem);
}

TEST(LinkLabel, UsesNvidiaSmiVocabulary) {
  EXPECT_EQ(LinkLabel({.nvlinks = 18, .via_nvswitch = true, .pcie = PcieLevel::kSystem}), "NV18");
  EXPECT_EQ(LinkLabel({.pcie = PcieLevel::kSingleSwitch}), "PIX");
  EXPECT_EQ(LinkLabel({.pcie = PcieLevel::kSystem}), "SYS");
  EXPECT_EQ(LinkLabel({.nvlinks = 2, .pcie = PcieLevel::kSelf}), "X");
}

TEST(PcieLevel, CodesRoundTrip) {
  for (int i = 0; i <= static_cast<int>(PcieLevel::kUnknown); ++i) {
    auto level = static_cast<PcieLevel>(i);
    EXPECT_EQ(ParsePcieLevelCode(PcieLevelCode(level)), level);
  }
  EXPECT_EQ(ParsePcieLevelCode("NV4"), std::nullopt);
}

TEST(ComputeCapability, ParsesAndRejects) {
  EXPECT_EQ(ParseComputeCapability("9.0"), (ComputeCapability{9, 0}));
  EXPECT_EQ(ParseComputeCapability("12.1"), (ComputeCapability{12, 1}));
  EXPECT_EQ(ParseComputeCapability("9"), std::nullopt);
  EXPECT_EQ(ParseComputeCapability("9."), std::nullopt);
  EXPECT_EQ(ParseComputeCapability(".5"), std::nullopt);
  EXPECT_EQ(ParseComputeCapability("9.0x"), std::nullopt);
  EXPECT_EQ(ParseComputeCapability("-1.0"), std::nullopt);
  EXPECT_EQ(FormatComputeCapability({8, 6}), "8.6");
  EXPECT_LT((ComputeCapability{8, 6}), (ComputeCapability{9, 0}));
}

TEST(ContextOverhead, MeasuredModelsAndADefaultForTheRest) {
  EXPECT_EQ(DefaultContextOverhead("NVIDIA H100 80GB HBM3"), 520ull << 20);
  EXPECT_EQ(DefaultContextOverhead("NVIDIA H200"), 520ull << 20);
  EXPECT_EQ(DefaultContextOverhead("Tesla T4"), 512ull << 20);
}

TEST(Bytes, ParsesUnits) {
  EXPECT_EQ(MibRoundedUp(0), 0u);
  EXPECT_EQ(MibRoundedUp(1), 1u);
  EXPECT_EQ(MibRoundedUp(1ull << 20), 1u);
  EXPECT_EQ(MibRoundedUp((1ull << 20) + 1), 2u);
  EXPECT_EQ(MibRoundedUp(~0ull), ~0ull >> 20) << "no overflow";
  EXPECT_EQ(ParseBytes("80GiB"), 80ull << 30);
  EXPECT_EQ(ParseBytes("16G"), 16ull << 30) << "Slurm's --mem=16G";
  EXPECT_EQ(ParseBytes("16Gi"), 16ull << 30) << "Kubernetes' 16Gi";
  EXPECT_EQ(ParseBytes("512M"), 512ull << 20);
  EXPECT_EQ(ParseBytes("10GB"), 10000000000ull) << "SI, as written";
  EXPECT_EQ(ParseBytes("10Gb"), std::nullopt);
  EXPECT_EQ(ParseBytes("512 MiB"), 512ull << 20);
  EXPECT_EQ(ParseBytes("81920"), 81920ull << 20);
  EXPECT_EQ(ParseBytes("1.5GB"), 1500000000ull);
  EXPECT_EQ(ParseBytes("10 parsecs"), std::nullopt);
  EXPECT_EQ(ParseBytes(""), std::nullopt);
  EXPECT_EQ(ParseBytes("GiB"), std::nullopt);
  EXPECT_EQ(ParseBytes("99999999999999TiB"), std::nullopt);
}

// "0" is none where an age or limit may be off (config retention:, limits:, admin purge); every
// other form is ParseDuration's.
TEST(Duration, ZeroIsNoneWhereAllowedAndEverythingElseAsParseDuration) {
  EXPECT_EQ(ParseDurationOrZero("0"), 0.0);
  EXPECT_EQ(ParseDurationOrZero("30d"), 30 * 86400.0);
  EXPECT_EQ(ParseDuration("0"), std::nullopt);
  for (const char* bad : {"", "0s", "-1", "soon", "00"})
    EXPECT_EQ(ParseDurationOrZero(bad), std::nullopt) << bad;
}

TEST(Duration, ParsesWhatPeopleAndSlurmWrite) {
  const std::pair<const char*, double> good[] = {
      {"90", 90},     {"90s", 90},           {"15m", 900},     {"1h", 3600},
      {"2d", 172800}, {"1h30m", 5400},       {"1.5h", 5400},   {"01:00:00", 3600},
      {"05:30", 330}, {"1-00:00:00", 86400}, {"1-12", 129600}, {"2-01:30", 178200},
      {" 10m ", 600},
  };
  for (const auto& [text, seconds] : good) EXPECT_EQ(ParseDuration(text), seconds) << text;
  for (const char* bad : {"", "0", "-5", "1x", "h", "1h30", "1:2:3:4", "a:b", "1-", "--1", "0s",
                          "1e3", "+5", "9999999999999"}) {
    EXPECT_EQ(ParseDuration(bad), std::nullopt) << bad;
  }
}

TEST(Duration, FormatsInExactUnitsAndReadsBack) {
  EXPECT_EQ(FormatDuration(604800), "7d");
  EXPECT_EQ(FormatDuration(5400), "1h30m");
  EXPECT_EQ(FormatDuration(90), "1m30s");
  EXPECT_EQ(FormatDuration(0), "0s");
  for (double s : {1.0, 59.0, 3601.0, 86399.0, 90061.0})
    EXPECT_EQ(ParseDuration(FormatDuration(s)), s);
}

TEST(Bytes, FormatsInLargestUnit) {
  EXPECT_EQ(FormatBytes(80ull << 30), "80 GiB");
  EXPECT_EQ(FormatBytes(81559ull << 20), "79.6 GiB");
  EXPECT_EQ(FormatBytes(512), "512 B");
}

}  // namespace
}  // namespace tessera::core
