// The extender's help for DRA pods without HTTP: their demand read from claims and templates,
// free devices from ResourceSlices less allocated claims, filter, and FGD's score.
#include "tessera/extender/dra.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/extender/test_objects.h"

namespace tessera::extender {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

using testing::DraAllocated;
using testing::DraPod;
using testing::DraSlice;
using testing::DraTemplate;

TEST(DraAdvisor, FreeDevicesAreTheSlicesLessAllocatedClaimsOfTheNewestGeneration) {
  DraAdvisor a;
  a.OnSlice(DraSlice("n1"), false);
  a.OnSlice(DraSlice("n2"), false);
  a.OnClaim(DraAllocated("c1", "n1", {"gpu-0", "gpu-3-share-0"}), false);
  a.OnClaim(DraAllocated("other", "n1", {"gpu-1"}), false);
  json foreign = DraAllocated("x", "n1", {"gpu-2"});  // another driver's device of the same name
  foreign["status"]["allocation"]["devices"]["results"][0]["driver"] = "net.example.com";
  a.OnClaim(foreign, false);
  auto f = a.Free();
  EXPECT_EQ(f["n1"].whole, 1);
  EXPECT_EQ(f["n1"].shares, 3);
  EXPECT_EQ(f["n2"].whole, 3);
  a.OnClaim(DraAllocated("other", "n1", {"gpu-1"}), true);  // deleted: its GPU is free again
  EXPECT_EQ(a.Free()["n1"].whole, 2);
  a.OnSlice(DraSlice("n2", 0), false);  // an older generation is ignored
  EXPECT_EQ(a.Free()["n2"].whole, 3);
  a.OnSlice(DraSlice("n2"), true);
  EXPECT_FALSE(a.Free().contains("n2"));
}

TEST(DraAdvisor, DemandComesFromTemplatesClaimsAndWhereAClaimIsAllocated) {
  DraAdvisor a;
  a.OnTemplate(DraTemplate("two", kDraGpuClass, 2), false);
  a.OnTemplate(DraTemplate("shares", kDraShareClass, 3, true), false);
  DraDemand d = a.DemandOf(DraPod("two"));
  ASSERT_EQ(d.requests.size(), 1u);
  EXPECT_FALSE(d.requests[0].share);
  EXPECT_EQ(d.requests[0].count, 2);
  d = a.DemandOf(DraPod("shares"));
  ASSERT_EQ(d.requests.size(), 1u);
  EXPECT_TRUE(d.requests[0].share);
  EXPECT_TRUE(d.requests[0].same_gpu);
  // The claim the template made, once allocated (another pod shares it): pinned to its node.
  json pod = DraPod("two");
  pod["status"]["resourceClaimStatuses"] = {{{"name", "gpu"}, {"resourceClaimName", "p-gpu-x1"}}};
  a.OnClaim(DraAllocated("p-gpu-x1", "n2", {"gpu-0", "gpu-1"}), false);
  d = a.DemandOf(pod);
  EXPECT_TRUE(d.requests.empty());
  EXPECT_THAT(d.pinned, ElementsAre("n2"));
  // Other classes, All mode, an unknown template: nothing asked of Tessera.
  a.OnTemplate(DraTemplate("nic", "nic.example.com", 1), false);
  EXPECT_TRUE(a.DemandOf(DraPod("nic")).empty());
  EXPECT_TRUE(a.DemandOf(DraPod("missing")).empty());
  EXPECT_TRUE(a.DemandOf({{"metadata", {{"name", "p"}, {"namespace", "a"}}}}).empty());
}

TEST(DraAdvisor, FilterDropsNodesWhoseFreeDevicesCannotHoldTheClaimsAndKeepsUnknownOnes) {
  DraAdvisor a;
  a.OnSlice(DraSlice("n1"), false);
  a.OnSlice(DraSlice("n2"), false);
  a.OnClaim(DraAllocated("c1", "n1", {"gpu-3-share-0", "gpu-3-share-1"}), false);
  a.OnTemplate(DraTemplate("three", kDraShareClass, 3, true), false);
  std::map<std::string, std::string> failed;
  auto ok = a.Filter(a.DemandOf(DraPod("three")), {"n1", "n2", "cpu-node"}, &failed);
  EXPECT_THAT(ok, ElementsAre("n2", "cpu-node"));
  EXPECT_THAT(failed["n1"], HasSubstr("3 whole, 2 shares"));
  // Pinned to n2: n1 fails whatever it has.
  DraDemand pinned;
  pinned.pinned = {"n2"};
  failed.clear();
  EXPECT_THAT(a.Filter(pinned, {"n1", "n2"}, &failed), ElementsAre("n2"));
  EXPECT_THAT(failed["n1"], HasSubstr("allocated on n2"));
}

TEST(DraAdvisor, AShareScoresHigherWhereItFillsAGpuAlreadySplitThanWhereItSplitsAWholeOne) {
  DraAdvisor a;
  a.OnSlice(DraSlice("n1"), false);
  a.OnSlice(DraSlice("n2"), false);
  // n1's share GPU is half taken; n2's is untouched (a whole GPU's worth of shares).
  a.OnClaim(DraAllocated("c1", "n1", {"gpu-3-share-0", "gpu-3-share-1"}), false);
  a.OnTemplate(DraTemplate("whole", kDraGpuClass, 1), false);
  a.OnTemplate(DraTemplate("one", kDraShareClass, 1), false);
  // The workload seen so far: whole GPUs too (FGD's typical requests come from the demands).
  a.Prioritize(a.DemandOf(DraPod("whole")), {"n1", "n2"});
  auto scores = a.Prioritize(a.DemandOf(DraPod("one")), {"n1", "n2", "cpu-node"});
  EXPECT_THAT(scores, ElementsAre(Pair("n1", 10), Pair("n2", 0), Pair("cpu-node", 0)));
}

TEST(DraAdvisor, PartitionableDevicesOfOneGpuAreWholeOrSharesNeverBoth) {
  // Every GPU both whole and in four shares (the agent's --dra-partitionable).
  json slice = DraSlice("n1");
  for (int g = 0; g < 3; ++g) {
    for (int k = 0; k < 4; ++k) {
      slice["spec"]["devices"].push_back(
          {{"name", "gpu-" + std::to_string(g) + "-share-" + std::to_string(k)},
           {"attributes",
            {{"type", {{"string", "share"}}},
             {"index", {{"int", g}}},
             {"sharesPerGpu", {{"int", 4}}}}},
           {"capacity", {{"memory", {{"value", "20Gi"}}}}}});
    }
  }
  slice["spec"]["devices"].push_back(
      {{"name", "gpu-3"},
       {"attributes", {{"type", {{"string", "gpu"}}}, {"index", {{"int", 3}}}}},
       {"capacity", {{"memory", {{"value", "80Gi"}}}}}});
  DraAdvisor a;
  a.OnSlice(slice, false);
  EXPECT_EQ(a.Free()["n1"].whole, 4);
  EXPECT_EQ(a.Free()["n1"].shares, 16);
  // GPU 0 given whole: its shares go too; a share of GPU 3: GPU 3 is no longer whole.
  a.OnClaim(DraAllocated("c1", "n1", {"gpu-0", "gpu-3-share-2"}), false);
  EXPECT_EQ(a.Free()["n1"].whole, 2);
  EXPECT_EQ(a.Free()["n1"].shares, 11);
  a.OnTemplate(DraTemplate("three", kDraGpuClass, 3), false);
  std::map<std::string, std::string> failed;
  EXPECT_TRUE(a.Filter(a.DemandOf(DraPod("three")), {"n1"}, &failed).empty());
  EXPECT_THAT(failed["n1"], HasSubstr("2 whole, 11 shares"));
}

}  // namespace
}  // namespace tessera::extender
