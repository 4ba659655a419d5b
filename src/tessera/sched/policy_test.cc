// Each policy alone on small hand-made clusters where the right answer is obvious.
#include "tessera/sched/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "tessera/sched/scheduler.h"
#include "tessera/sched/test_util.h"

namespace tessera::sched {
namespace {

using ::testing::HasSubstr;
using testing::Node;
using testing::Share;
using testing::Whole;

std::unique_ptr<Scheduler> Make(const std::string& policies, bool random_ties = false) {
  SchedulerConfig c;
  c.policies = *ParsePolicies(policies);
  c.random_ties = random_ties;
  return std::make_unique<Scheduler>(c);
}

std::string NodeOf(Scheduler& s, const core::Request& r) {
  Decision d = s.Decide(r);
  return d.placed ? s.state().node_name(d.node) : "none: " + d.why_not;
}

TEST(Policies, ParseNamesWeightsAndErrors) {
  auto p = ParsePolicies("fgd,topology:0.5");
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[1].name, "topology");
  EXPECT_DOUBLE_EQ((*p)[1].weight, 0.5);
  EXPECT_EQ(ParsePolicies("all")->size(), AllPolicyNames().size());
  EXPECT_THAT(std::string(ParsePolicies("fgd,bogus").status().message()),
              HasSubstr("unknown policy 'bogus'"));
  EXPECT_FALSE(ParsePolicies("fgd:-1").ok());
  // "tessera" expands to the default set, scaled by its weight.
  auto t = ParsePolicies("tessera:2");
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->size(), DefaultPolicies().size());
  EXPECT_EQ((*t)[0].name, "fgd");
  EXPECT_DOUBLE_EQ((*t)[1].weight, 2 * DefaultPolicies()[1].weight);
  EXPECT_FALSE(ParsePolicies("").ok());
}

TEST(Policies, RegistryNamesEachPolicyOnceAndBuildsItsPlugin) {
  std::set<std::string> names;
  Fragmentation frag;
  for (const PolicyDef& d : ScorePolicies()) {
    EXPECT_TRUE(names.insert(std::string(d.name)).second) << "twice: " << d.name;
    EXPECT_FALSE(d.summary.empty()) << d.name;
    EXPECT_NE(d.make(&frag), nullptr) << d.name;
    EXPECT_EQ(FindScorePolicy(d.name), &d);
  }
  EXPECT_EQ(names.size(), 11u);
  EXPECT_EQ(FindScorePolicy("bogus"), nullptr);
  // Only FGD as the paper runs it asks for ties to the first node.
  for (const PolicyDef& d : ScorePolicies())
    EXPECT_EQ(d.make(&frag)->TiesToFirstNode(), d.name == "fgd-paper") << d.name;
  // Only the policies with a GPU preference choose where a share goes.
  EXPECT_TRUE(FindScorePolicy("fgd")->make(&frag)->ChoosesShareGpu());
  EXPECT_TRUE(FindScorePolicy("dotprod")->make(&frag)->ChoosesShareGpu());
  EXPECT_FALSE(FindScorePolicy("binpack")->make(&frag)->ChoosesShareGpu());
  // The unknown-policy error lists what is known, from the registry.
  EXPECT_THAT(std::string(ParsePolicies("nope").status().message()), HasSubstr("gpuclustering"));
}

// Two nodes, one half full: binpack fills it, spread avoids it.
void HalfFull(Scheduler& s) {
  ASSERT_TRUE(s.AddNode(Node("a", 4)).ok());
  ASSERT_TRUE(s.AddNode(Node("b", 4)).ok());
  auto placed = s.Place(Whole("first", 2));
  ASSERT_TRUE(placed.ok());
}

TEST(Policies, BinpackFillsTheBusyNode) {
  auto s = Make("binpack");
  HalfFull(*s);
  std::string busy = s->state().node_name(s->state().Find("first")->node);
  EXPECT_EQ(NodeOf(*s, Whole("x", 1)), busy);
}

TEST(Policies, SpreadAvoidsTheBusyNode) {
  auto s = Make("spread");
  HalfFull(*s);
  std::string busy = s->state().node_name(s->state().Find("first")->node);
  EXPECT_NE(NodeOf(*s, Whole("x", 1)), busy);
}

TEST(Policies, BestFitLeavesTheLeastOver) {
  auto s = Make("bestfit");
  ASSERT_TRUE(s->AddNode(Node("big", 8)).ok());
  ASSERT_TRUE(s->AddNode(Node("small", 2)).ok());
  EXPECT_EQ(NodeOf(*s, Whole("x", 2)), "small");
}

TEST(Policies, GpuPackingPrefersSharedGpus) {
  auto s = Make("gpupacking");
  ASSERT_TRUE(s->AddNode(Node("a", 2)).ok());
  ASSERT_TRUE(s->AddNode(Node("b", 2)).ok());
  auto first = s->Place(Share("s1", 300));
  ASSERT_TRUE(first.ok());
  Decision d = s->Decide(Share("s2", 300));
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.node, first->node);
  EXPECT_EQ(d.gpus, first->gpus) << "the GPU already shared";
}

TEST(Policies, GpuClusteringGroupsSameSizedWork) {
  auto s = Make("gpuclustering");
  ASSERT_TRUE(s->AddNode(Node("a", 8)).ok());
  ASSERT_TRUE(s->AddNode(Node("b", 8)).ok());
  ASSERT_TRUE(s->AddNode(Node("c", 8)).ok());
  auto two = s->Place(Whole("two", 2));
  auto share = s->Place(Share("share", 500));
  ASSERT_TRUE(two.ok() && share.ok());
  EXPECT_EQ(s->Decide(Whole("two-b", 2)).node, two->node);
  EXPECT_EQ(s->Decide(Share("share-b", 200)).node, share->node);
}

TEST(Policies, FgdPutsSharesWhereTheyFragmentLeast) {
  auto s = Make("fgd");
  ASSERT_TRUE(s->AddNode(Node("a", 1)).ok());
  ASSERT_TRUE(s->AddNode(Node("b", 1)).ok());
  // The workload is whole-GPU jobs and 500/1000 shares in equal numbers.
  s->SetTypicalRequests({{1000, 1000, 1, {}, 0.5}, {1000, 500, 1, {}, 0.5}});
  auto first = s->Place(Share("s1", 500));
  ASSERT_TRUE(first.ok());
  // A second half share completes the half-used GPU instead of breaking a whole one.
  EXPECT_EQ(s->Decide(Share("s2", 500)).node, first->node);
}

TEST(Policies, FgdKeepsCpuOnlyWorkFromStrandingGpus) {
  auto s = Make("fgd");
  // "small" has just enough CPU for its GPU's typical job; "big" has plenty.
  ASSERT_TRUE(s->AddNode(Node("small", 1, 8000)).ok());
  ASSERT_TRUE(s->AddNode(Node("big", 1, 64000)).ok());
  s->SetTypicalRequests({{4000, 1000, 1, {}, 1.0}});
  // A CPU-only job on "small" would leave 2 cores there: its GPU could then take no typical job.
  EXPECT_EQ(NodeOf(*s, Whole("cpu-job", 0, 6000)), "big");
}

TEST(Policies, FgdChoosesTheGpuWithinANode) {
  auto s = Make("fgd");
  ASSERT_TRUE(s->AddNode(Node("a", 2)).ok());
  s->SetTypicalRequests({{1000, 1000, 1, {}, 0.5}, {1000, 400, 1, {}, 0.5}});
  auto first = s->Place(Share("s1", 600));
  ASSERT_TRUE(first.ok());
  Decision d = s->Decide(Share("s2", 400));
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.gpus, first->gpus) << "filling the used GPU keeps a whole one free";
}

TEST(Policies, FgdBreaksEqualFragmentationByBestFitNotAtRandom) {
  // The workload is 1-GPU jobs: a 1-GPU job fragments no node, so FGD's own score ties on "busy"
  // (4 of 8 GPUs taken) and "idle". The fuller node wins, whatever the seed of the random
  // tie-break (which took either before).
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    SchedulerConfig c;
    c.policies = *ParsePolicies("fgd");
    c.seed = seed;
    Scheduler s(c);
    ASSERT_TRUE(s.AddNode(Node("busy", 8)).ok());
    s.SetTypicalRequests({{1000, 1000, 1, {}, 1.0}});
    ASSERT_TRUE(s.Place(Whole("four", 4)).ok());  // the only node then
    ASSERT_TRUE(s.AddNode(Node("idle", 8)).ok());
    EXPECT_EQ(NodeOf(s, Whole("x", 1)), "busy") << "seed " << seed;
  }
}

TEST(Policies, TesseraKeepsCpuOnlyWorkOffANodeWhoseCpuIsAlreadyShort) {
  // One-GPU jobs of 4 cores: "lean" has CPU for two of them beside its four GPUs, "rich" for
  // sixteen. A 4-core CPU-only job fits either, and FGD sees no fragment on either (each can still
  // host a typical job), so best fit alone sends it to the fuller "lean" - leaving CPU for one job
  // there and three of its GPUs stranded. The stranded measure counts them.
  for (const char* policy : {"tessera", "fgd,bestfit:0.01,topology:0.5"}) {
    auto s = Make(policy);
    ASSERT_TRUE(s->AddNode(Node("lean", 4, 8000)).ok());
    ASSERT_TRUE(s->AddNode(Node("rich", 4, 64000)).ok());
    s->SetTypicalRequests({{4000, 1000, 1, {}, 1.0}});
    EXPECT_EQ(NodeOf(*s, Whole("cpu-job", 0, 4000)),
              policy == std::string("tessera") ? "rich" : "lean")
        << policy;
  }
}

TEST(Policies, FgdPaperScoresInWholePointsAndTiesToTheFirstNode) {
  // As the paper's simulator runs FGD: an integer score 0..100, and equal scores to the node
  // added first. "busy" (4 of 8 GPUs taken) and "idle" score alike for a one-GPU job; exact FGD
  // breaks the tie by best fit, the paper's by node order.
  for (const char* policy : {"fgd", "fgd-paper"}) {
    auto s = Make(policy, /*random_ties=*/true);
    ASSERT_TRUE(s->AddNode(Node("idle", 8)).ok());
    ASSERT_TRUE(s->AddNode(Node("busy", 8)).ok());
    s->SetTypicalRequests({{1000, 1000, 1, {}, 1.0}});
    Allocation four;
    four.id = "four";
    four.node = 1;
    four.gpus = {0, 1, 2, 3};
    four.milli_per_gpu = 1000;
    four.request = Whole("four", 4);
    ASSERT_TRUE(s->Restore(four).ok());
    EXPECT_EQ(NodeOf(*s, Whole("x", 1)), policy == std::string("fgd") ? "busy" : "idle") << policy;
  }
}

TEST(Policies, FgdPaperTiesGoToTheLowestNodeNotTheFirstClass) {
  // Four identical nodes; a job placed on "a" and released sends "a" back to the end of its
  // class's member list. Ties without random choice go to the class's first member ("d" here);
  // fgd-paper's go to the node added first, whatever the seed.
  for (const char* policy : {"fgd", "fgd-paper"}) {
    for (bool random_ties : {false, true}) {
      if (policy == std::string("fgd") && random_ties) continue;
      auto s = Make(policy, random_ties);
      for (const char* n : {"a", "b", "c", "d"}) ASSERT_TRUE(s->AddNode(Node(n, 8)).ok());
      s->SetTypicalRequests({{1000, 1000, 1, {}, 1.0}});
      ASSERT_TRUE(s->Place(Whole("x", 8)).ok());
      ASSERT_EQ(s->state().node_name(s->Release("x")->node), "a");
      EXPECT_EQ(NodeOf(*s, Whole("y", 1)), policy == std::string("fgd") ? "d" : "a") << policy;
    }
  }
}

TEST(Policies, DotProductPrefersComplementaryNodes) {
  auto s = Make("dotprod");
  core::NodeSpec cpu_heavy = Node("cpu-free", 2, 64000);
  core::NodeSpec gpu_heavy = Node("gpu-free", 2, 64000);
  ASSERT_TRUE(s->AddNode(cpu_heavy).ok());
  ASSERT_TRUE(s->AddNode(gpu_heavy).ok());
  core::Request eat_cpu = Whole("eat-cpu", 0, 60000);
  core::Request eat_gpu = Whole("eat-gpu", 2, 1000);
  // Make "gpu-free" short of CPU and "cpu-free" short of GPUs.
  ASSERT_TRUE(s->Place(eat_cpu).ok());
  ASSERT_TRUE(s->Place(eat_gpu).ok());
  // Both fit a 2000m CPU-only request; its dot product with free resources is lower on the node
  // whose free resources are mostly GPU.
  Decision d = s->Decide(Whole("cpu-job", 0, 2000));
  ASSERT_TRUE(d.placed);
  EXPECT_EQ(d.node, s->state().Find("eat-cpu")->node);
}

TEST(Policies, RandomIsSeededAndCoversFeasibleNodes) {
  auto pick = [](uint64_t seed) {
    SchedulerConfig c;
    c.policies = *ParsePolicies("random");
    c.seed = seed;
    Scheduler s(c);
    for (int i = 0; i < 8; ++i) (void)s.AddNode(Node("n" + std::to_string(i), 1));
    std::vector<int> nodes;
    for (int i = 0; i < 8; ++i) {
      auto a = s.Place(Whole("j" + std::to_string(i), 1));
      nodes.push_back(a.ok() ? a->node : -1);
    }
    return nodes;
  };
  EXPECT_EQ(pick(7), pick(7));
  EXPECT_NE(pick(7), pick(8));
  auto nodes = pick(7);
  std::sort(nodes.begin(), nodes.end());
  EXPECT_EQ(nodes, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7})) << "8 jobs fill all 8 nodes";
}

core::NodeSpec L40sBox(const std::string& name) {
  // Two sockets; per socket two PCIe switches of two GPUs each (like the pcie-l40s-2socket preset).
  core::NodeSpec n = Node(name, 8, 128000, 1 << 20, "L40S", 46068);
  n.topology = core::Topology(8);
  for (int a = 0; a < 8; ++a) {
    n.gpus[a].numa_node = a / 4;
    for (int b = a + 1; b < 8; ++b) {
      core::PcieLevel l = a / 4 != b / 4   ? core::PcieLevel::kSystem
                          : a / 2 != b / 2 ? core::PcieLevel::kNumaNode
                                           : core::PcieLevel::kSingleSwitch;
      n.topology.SetLink(a, b, core::GpuLink{.pcie = l});
    }
  }
  return n;
}

TEST(Policies, TopologyChoosesLinkedGpusAndKeepsGoodSetsIntact) {
  auto s = Make("topology");
  ASSERT_TRUE(s->AddNode(L40sBox("box")).ok());
  auto pair = s->Place(Whole("pair", 2));
  ASSERT_TRUE(pair.ok());
  EXPECT_EQ(pair->gpus[1], pair->gpus[0] + 1);
  EXPECT_EQ(pair->gpus[0] % 2, 0) << "a switch pair";
  auto quad = s->Place(Whole("quad", 4));
  ASSERT_TRUE(quad.ok());
  // The other socket is whole: the quad goes there, one NUMA node, two switch pairs.
  int socket = quad->gpus[0] / 4;
  for (int g : quad->gpus) EXPECT_EQ(g / 4, socket);
  EXPECT_NE(socket, pair->gpus[0] / 4);
  auto pair2 = s->Place(Whole("pair2", 2));
  ASSERT_TRUE(pair2.ok());
  EXPECT_EQ(pair2->gpus[0] / 2, pair2->gpus[1] / 2) << "the remaining switch pair, not a split";
}

TEST(Policies, RequiredNvlinkFiltersWithReason) {
  auto s = Make("fgd");
  ASSERT_TRUE(s->AddNode(L40sBox("pcie-only")).ok());
  core::Request r = Whole("nv", 2);
  r.topology = core::TopologyMode::kRequire;
  Decision d = s->Decide(r);
  EXPECT_FALSE(d.placed);
  EXPECT_THAT(d.why_not, HasSubstr("no 2 free GPUs all linked by NVLink"));
  r.topology_scope = core::TopologyScope::kNumaNode;
  EXPECT_TRUE(s->Decide(r).placed);
}

TEST(Policies, PreferredNvlinkWinsOverPcie) {
  auto s = Make("topology");
  ASSERT_TRUE(s->AddNode(L40sBox("pcie")).ok());
  core::NodeSpec nv = L40sBox("nvlink");
  nv.name = "nvlink";
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      core::GpuLink l = nv.topology.link(a, b);
      l.nvlinks = 18;
      l.via_nvswitch = true;
      nv.topology.SetLink(a, b, l);
    }
  }
  ASSERT_TRUE(s->AddNode(nv).ok());
  core::Request r = Whole("job", 4);
  r.topology = core::TopologyMode::kPrefer;
  EXPECT_EQ(NodeOf(*s, r), "nvlink");
}

TEST(Policies, AttributeSelectorAndHealthFilter) {
  auto s = Make("bestfit");
  ASSERT_TRUE(s->AddNode(Node("t4", 2, 64000, 1 << 18, "T4", 15360)).ok());
  ASSERT_TRUE(s->AddNode(Node("a100", 2, 64000, 1 << 18, "A100", 81920)).ok());
  core::Request r = Whole("x", 1);
  r.models = {"A100"};
  EXPECT_EQ(NodeOf(*s, r), "a100");
  r.models.clear();
  r.min_gpu_memory_mib = 40000;
  EXPECT_EQ(NodeOf(*s, r), "a100");
  r.min_gpu_memory_mib = 0;
  r.min_compute_capability = core::ComputeCapability{9, 0};
  EXPECT_THAT(s->Decide(r).why_not, HasSubstr("no GPU matches the selector (2 nodes"));
  ASSERT_TRUE(s->SetGpuHealth(1, 0, false).ok());
  ASSERT_TRUE(s->SetGpuHealth(1, 1, false).ok());
  core::Request a100 = Whole("y", 1);
  a100.models = {"A100"};
  Decision d = s->Decide(a100);
  EXPECT_FALSE(d.placed);
  EXPECT_THAT(d.why_not, HasSubstr("0 healthy GPUs free, wants 1 (2 unhealthy)"));
}

// A share with a predicted utilization.
core::Request BusyShare(const std::string& id, int milli, int util, int ceiling = 70,
                        bool strict = true) {
  core::Request r = Share(id, milli);
  r.expected_util_pct = util;
  r.util_ceiling_pct = ceiling;
  r.util_ceiling_strict = strict;
  return r;
}

TEST(Policies, SharesStayUnderAStrictPredictedUtilizationCeiling) {
  for (const char* policy : {"fgd", "tessera", "bestfit", "gpupacking"}) {
    auto s = Make(policy);
    ASSERT_TRUE(s->AddNode(Node("n", 2)).ok());
    // 50% predicted on one GPU: a second 50% would make it 100% (over 70) and goes to the other
    // GPU, though every packing policy prefers the shared one by its room.
    auto a = s->Place(BusyShare("a", 300, 50));
    ASSERT_TRUE(a.ok()) << policy;
    auto b = s->Place(BusyShare("b", 300, 50));
    ASSERT_TRUE(b.ok()) << policy;
    EXPECT_NE(a->gpus, b->gpus) << policy;
    // 20% more fits under the ceiling beside either (50 + 20 = 70).
    auto c = s->Place(BusyShare("c", 300, 20));
    ASSERT_TRUE(c.ok()) << policy;
    // Now one GPU is at 70% predicted and the other at 50%: another 30% fits neither, though
    // both have compute left; the reason says so.
    Decision d = s->Decide(BusyShare("d", 100, 30));
    EXPECT_FALSE(d.placed) << policy;
    EXPECT_EQ(d.why_not,
              "n: 2 GPUs with room would be predicted busier than the 70% utilization ceiling with "
              "this job's 30%")
        << policy;
    // Without a ceiling, or without a prediction, it fits as before.
    EXPECT_TRUE(s->Decide(BusyShare("e", 100, 30, 0)).placed) << policy;
    EXPECT_TRUE(s->Decide(BusyShare("f", 100, 0)).placed) << policy;
    // When the 50% job ends its GPU takes the 30% (20 + 30 <= 70... or 50 + 0).
    ASSERT_TRUE(s->Release("b").ok()) << policy;
    EXPECT_TRUE(s->Decide(BusyShare("g", 100, 30)).placed) << policy;
  }
}

TEST(Policies, OverASoftCeilingAShareTakesTheLeastBusyGpuAndOnlyWhenNothingIsWithin) {
  for (const char* policy : {"fgd,bestfit:0.01", "bestfit", "spread", "binpack"}) {
    auto s = Make(policy);
    ASSERT_TRUE(s->AddNode(Node("n", 2)).ok());
    // 60% on one GPU; 40% cannot join it (100% > 70%, strict): the other GPU.
    ASSERT_TRUE(s->Place(BusyShare("a", 200, 60)).ok());
    ASSERT_TRUE(s->Place(BusyShare("b", 200, 40)).ok());
    // 35% more is over the ceiling on both (95%, 75%). Soft, it goes to the less busy GPU;
    // strict, it waits.
    Decision soft = s->Decide(BusyShare("soft", 100, 35, 70, /*strict=*/false));
    ASSERT_TRUE(soft.placed) << policy << ": " << soft.why_not;
    EXPECT_EQ(s->state().gpu_use(soft.node, soft.gpus[0]).util_pct, 40) << policy;
    EXPECT_FALSE(s->Decide(BusyShare("strict", 100, 35, 70, /*strict=*/true)).placed) << policy;
  }
}

TEST(Policies, APlaceWithinASoftCeilingWinsOverABetterScoreAboveIt) {
  for (const char* policy : {"fgd,bestfit:0.01", "bestfit", "spread", "binpack"}) {
    auto s = Make(policy);
    ASSERT_TRUE(s->AddNode(Node("x", 1)).ok());
    ASSERT_TRUE(s->AddNode(Node("y", 1)).ok());
    // One GPU each: 60% predicted with a tenth of its compute taken, 65% with half.
    auto small = s->Place(BusyShare("small", 100, 60));
    ASSERT_TRUE(small.ok());
    auto large = s->Place(BusyShare("large", 500, 65));
    ASSERT_TRUE(large.ok());
    ASSERT_NE(small->node, large->node);
    // 8% more: within the ceiling only beside "small" (68%; 73% beside "large"), whichever node the
    // policy's own score prefers.
    Decision d = s->Decide(BusyShare("more", 100, 8, 70, /*strict=*/false));
    ASSERT_TRUE(d.placed) << policy;
    EXPECT_EQ(d.node, small->node) << policy;
    // Nothing within anywhere: the less busy GPU, by the least overshoot.
    Decision over = s->Decide(BusyShare("over", 100, 20, 70, /*strict=*/false));
    ASSERT_TRUE(over.placed) << policy;
    EXPECT_EQ(over.node, small->node) << policy;
  }
}

TEST(Policies, AGpuWithNoPredictedHolderTakesAnyShare) {
  auto s = Make("fgd");
  ASSERT_TRUE(s->AddNode(Node("n", 1)).ok());
  // A share whose utilization nobody predicted leaves the GPU at 0% predicted: a 90% share still
  // goes there (the ceiling only keeps predicted busy jobs apart), and so does a lone 90% on an
  // empty GPU.
  ASSERT_TRUE(s->Place(Share("unknown", 300)).ok());
  auto a = s->Place(BusyShare("busy", 300, 90));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(s->state().gpu_use(0, 0).util_pct, 90);
  Decision d = s->Decide(BusyShare("more", 100, 10));
  EXPECT_FALSE(d.placed);
  ASSERT_TRUE(s->Release("busy").ok());
  EXPECT_EQ(s->state().gpu_use(0, 0).util_pct, 0);
  EXPECT_TRUE(s->Decide(BusyShare("more", 100, 10)).placed);
}

TEST(Policies, WhyNotNamesTheNodeAndTheShortfall) {
  auto s = Make("fgd");
  ASSERT_TRUE(s->AddNode(Node("node-17", 2)).ok());
  Decision d = s->Decide(Whole("big", 4));
  EXPECT_FALSE(d.placed);
  EXPECT_EQ(d.why_not, "node-17: 2 healthy GPUs free, wants 4");
  Decision cpu = s->Decide(Whole("cpu", 1, 100000));
  EXPECT_EQ(cpu.why_not, "node-17: 64000m CPU free, wants 100000m");
}

TEST(ShareGpuOrder, RequiredFirstThenBestFitThenTheMostFree) {
  // GPU 0: 2 free shares, 1: 10 (a whole GPU), 2: 5, 3: 6. Four wanted.
  const std::map<int, int> free = {{0, 2}, {1, 10}, {2, 5}, {3, 6}};
  EXPECT_THAT(ShareGpuOrder(free, 4, {}), ::testing::ElementsAre(2, 3, 1, 0))
      << "the fullest GPU that holds all four, the whole one last of those; then the rest";
  EXPECT_THAT(ShareGpuOrder(free, 4, {0}), ::testing::ElementsAre(0, 2, 3, 1, 0));
  // More than any GPU holds: the most free first.
  EXPECT_THAT(ShareGpuOrder(free, 12, {}), ::testing::ElementsAre(1, 3, 2, 0));
}

}  // namespace
}  // namespace tessera::sched
