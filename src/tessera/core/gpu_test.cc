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

TEST(Bytes, ParsesUnits) {
  EXPECT_EQ(ParseBytes("80GiB"), 80ull << 30);
  EXPECT_EQ(ParseBytes("512 MiB"), 512ull << 20);
  EXPECT_EQ(ParseBytes("81920"), 81920ull << 20);
  EXPECT_EQ(ParseBytes("1.5GB"), 1500000000ull);
  EXPECT_EQ(ParseBytes("10 parsecs"), std::nullopt);
  EXPECT_EQ(ParseBytes(""), std::nullopt);
  EXPECT_EQ(ParseBytes("GiB"), std::nullopt);
  EXPECT_EQ(ParseBytes("99999999999999TiB"), std::nullopt);
}

TEST(Bytes, FormatsInLargestUnit) {
  EXPECT_EQ(FormatBytes(80ull << 30), "80 GiB");
  EXPECT_EQ(FormatBytes(81559ull << 20), "79.6 GiB");
  EXPECT_EQ(FormatBytes(512), "512 B");
}

}  // namespace
}  // namespace tessera::core
