#include "tessera/cli/app.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tessera/slurm/eff.h"

namespace tessera::cli {
namespace {

using ::testing::HasSubstr;

struct Result {
  int code;
  std::string out, err;
};

Result Cli(std::vector<const char*> args) {
  args.insert(args.begin(), "tessera");
  std::ostringstream out, err;
  int code = RunCli(static_cast<int>(args.size()), args.data(), out, err);
  return {code, out.str(), err.str()};
}

// `tessera submit -- echo $'caf\xe9'` aborted (an uncaught JSON exception, rc 134): now refused,
// saying which argument and which byte, before any server is asked.
TEST(Cli, ACommandThatIsNotUtf8IsRefusedPlainly) {
  Result r = Cli({"submit", "--socket", "/nonexistent/tessera.sock", "--", "echo", "caf\xe9"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("command[1] is not UTF-8 text (byte 0xe9 at offset 3)"));
}

TEST(Cli, JobIdsThatAreNotNumbersAreSaidPlainly) {
  // Before: "Value abc not in range 0.000000 to 1797693134862315...". Refused before any server
  // is asked.
  for (auto args : std::vector<std::vector<const char*>>{
           {"show", "abc"}, {"logs", "-1"}, {"cancel", "3", "x7"}, {"show", "0"}, {"eff", "1x"}}) {
    Result r = Cli(args);
    EXPECT_EQ(r.code, 2) << args[0];
    EXPECT_THAT(r.err + r.out, HasSubstr("is not a job (a positive whole number)")) << args[0];
    EXPECT_THAT(r.err + r.out, ::testing::Not(HasSubstr("not in range"))) << args[0];
  }
}

TEST(Cli, GpusJsonListsEightNvlinkedH100s) {
  Result r = Cli({"gpus", "-o", "json", "--simulate", "dgx-h100"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["simulated"], true);
  ASSERT_EQ(j["gpus"].size(), 8u);
  EXPECT_EQ(j["gpus"][3]["model"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j["gpus"][3]["compute_capability"], "9.0");
  EXPECT_EQ(j["gpus"][3]["device_node"], "/dev/nvidia3");
  EXPECT_EQ(j["gpus"][3]["answers"], true);
  ASSERT_EQ(j["links"].size(), 28u);
  for (const auto& l : j["links"]) {
    EXPECT_EQ(l["label"], "NV18");
    EXPECT_EQ(l["nvlinks"], 18);
  }
}

TEST(Cli, GpusYamlCarriesTheSameData) {
  Result r = Cli({"gpus", "-o", "yaml", "--simulate", "t4x2"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  YAML::Node y = YAML::Load(r.out);
  EXPECT_EQ(y["simulated"].as<bool>(), true);
  EXPECT_EQ(y["gpus"].size(), 2u);
  EXPECT_EQ(y["gpus"][1]["model"].as<std::string>(), "Tesla T4");
  EXPECT_EQ(y["gpus"][1]["memory_mib"].as<int>(), 15360);
  EXPECT_EQ(y["links"][0]["pcie"].as<std::string>(), "NODE");
}

TEST(Cli, GpusTableSaysSimulated) {
  Result r = Cli({"gpus", "--simulate", "mixed-a100-t4"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SIMULATED machine"));
  EXPECT_THAT(r.out, HasSubstr("NVIDIA A100 80GB PCIe"));
  EXPECT_THAT(r.out, HasSubstr("Tesla T4"));
  EXPECT_THAT(r.out, HasSubstr("80 GiB"));
}

TEST(Cli, TopoShowsSocketSplit) {
  Result r = Cli({"topo", "--simulate", "pcie-l40s-2socket"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("NUMA node 0: GPU0 GPU1 GPU2 GPU3"));
  EXPECT_THAT(r.out, HasSubstr("NUMA node 1: GPU4 GPU5 GPU6 GPU7"));
  EXPECT_THAT(r.out, HasSubstr("Legend:"));
  EXPECT_THAT(r.out, HasSubstr("SYS  = through the interconnect between NUMA nodes"));
  // GPU0's row: X, PIX to GPU1, NODE to GPU2/3, SYS to the other socket, NUMA 0.
  EXPECT_THAT(r.out, ::testing::ContainsRegex("GPU0 +X +PIX +NODE +NODE +SYS +SYS +SYS +SYS +0"));
}

TEST(Cli, TopoJsonMatrix) {
  Result r = Cli({"topo", "-o", "json", "--simulate", "hgx-a100"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["matrix"][0][0], "X");
  EXPECT_EQ(j["matrix"][0][1], "NV12");
  EXPECT_EQ(j["numa_nodes"][7], 1);
}

TEST(Cli, NoDriverFailsWithHintUnlessFallback) {
  setenv("TESSERA_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  Result r = Cli({"gpus"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("no NVIDIA driver"));
  EXPECT_THAT(r.err, HasSubstr("--simulate"));
  Result fb = Cli({"gpus", "--fallback-simulate", "t4x2", "-o", "json"});
  EXPECT_EQ(fb.code, kExitOk) << fb.err;
  EXPECT_THAT(fb.err, HasSubstr("SIMULATED machine 't4x2'"));
  EXPECT_EQ(nlohmann::json::parse(fb.out)["gpus"].size(), 2u);
  unsetenv("TESSERA_NVML_LIBRARY");
}

TEST(Cli, UsesTheDriverWhenItLoads) {
  std::string dir =
      std::filesystem::temp_directory_path() / ("tessera-cli-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/s.json")
      << R"({"devices": [{"uuid": "GPU-real-0", "name": "NVIDIA L4", "cc": [8, 9]}]})";
  setenv("FAKE_NVML_SCENARIO", (dir + "/s.json").c_str(), 1);
  setenv("TESSERA_NVML_LIBRARY", TESSERA_TEST_FAKES_DIR "/nvml-full/libnvidia-ml.so.1", 1);
  Result r = Cli({"gpus", "-o", "json", "--fallback-simulate", "t4x2"});
  unsetenv("TESSERA_NVML_LIBRARY");
  unsetenv("FAKE_NVML_SCENARIO");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["simulated"], false);
  EXPECT_EQ(j["source"], "nvml");
  EXPECT_EQ(j["gpus"][0]["uuid"], "GPU-real-0");
  EXPECT_EQ(j["gpus"][0]["model"], "NVIDIA L4");
}

TEST(Cli, BadInventoryFileIsExitTwoWithFileLine) {
  std::string path = std::filesystem::temp_directory_path() /
                     ("tessera-bad-" + std::to_string(getpid()) + ".yaml");
  std::ofstream(path)
      << "name: x\ngpus:\n  - {model: X, count: two, memory: 1GiB, compute_capability: \"8.0\"}\n";
  Result r = Cli({"gpus", "--simulate", path.c_str()});
  std::filesystem::remove(path);
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr(path + ":3: count: expected an integer 1..64, got 'two'"));
  EXPECT_TRUE(r.out.empty());
}

TEST(Cli, UnknownPresetAndBadFlagsAreExitTwo) {
  EXPECT_EQ(Cli({"gpus", "--simulate", "nope"}).code, kExitBadInput);
  EXPECT_EQ(Cli({"gpus", "--simulate", "/no/such.yaml"}).code, kExitBadInput);
  Result bad_format = Cli({"gpus", "-o", "xml", "--simulate", "t4x2"});
  EXPECT_EQ(bad_format.code, kExitBadInput);
  EXPECT_THAT(bad_format.err, HasSubstr("xml"));
  EXPECT_EQ(Cli({"frobnicate"}).code, kExitBadInput);
  EXPECT_EQ(Cli({}).code, kExitBadInput);
  EXPECT_EQ(Cli({"presets", "--show", "nope"}).code, kExitBadInput);
}

TEST(Cli, OutOfRangeNewFlagsAreExitTwoNamingTheFlag) {
  // Refused before any server or trace is read.
  const std::vector<std::pair<std::vector<const char*>, const char*>> cases = {
      {{"submit", "--grace", "-5", "--", "true"}, "--grace"},
      {{"submit", "--grace", "4000", "--", "true"}, "--grace"},
      {{"submit", "--grace", "2 fortnights", "--", "true"}, "--grace"},
      {{"submit", "--max-runtime", "1h30", "--", "true"}, "--max-runtime"},
      {{"submit", "--max-runtime", "0", "--", "true"}, "--max-runtime"},
      {{"sim", "replay", "--stop-latency", "-1"}, "--stop-latency"},
      {{"sim", "replay", "--fair-share-half-life", "-3"}, "--fair-share-half-life"},
      {{"ls", "--all", "--user", "nobody"}, "excludes"},
  };
  for (const auto& [args, flag] : cases) {
    Result r = Cli(args);
    EXPECT_EQ(r.code, kExitBadInput) << flag;
    EXPECT_THAT(r.err + r.out, HasSubstr(flag)) << r.err;
  }
}

// A misspelt command gets a suggestion, a command's option written before the command says where it
// goes; both exit 2 (usage).
TEST(Cli, TyposAndMisplacedOptionsAreSaidPlainly) {
  Result typo = Cli({"sumbit", "--", "true"});
  EXPECT_EQ(typo.code, kExitBadInput);
  EXPECT_THAT(typo.err, HasSubstr("unknown command 'sumbit'; did you mean 'submit'?"));
  EXPECT_THAT(Cli({"lss"}).err, HasSubstr("did you mean 'ls'?"));
  EXPECT_THAT(Cli({"frobnicate"}).err, HasSubstr("unknown command 'frobnicate'\n"));
  Result misplaced = Cli({"--socket", "/tmp/x", "ls"});
  EXPECT_EQ(misplaced.code, kExitBadInput);
  EXPECT_THAT(misplaced.err, HasSubstr("'--socket' is not an option of tessera itself: options go "
                                       "after the command (tessera ls --socket ...)"));
  EXPECT_THAT(Cli({"--log-level", "warn", "sumbit"}).err, HasSubstr("did you mean 'submit'?"));
}

TEST(Cli, HelpEverywhere) {
  for (std::vector<const char*> args : {std::vector<const char*>{"--help"},
                                        {"gpus", "--help"},
                                        {"topo", "--help"},
                                        {"version", "--help"},
                                        {"presets", "--help"}}) {
    Result r = Cli(args);
    EXPECT_EQ(r.code, kExitOk) << args.back();
    EXPECT_THAT(r.out, HasSubstr("Usage")) << args.front();
  }
  EXPECT_THAT(Cli({"gpus", "--help"}).out, HasSubstr("--simulate"));
}

TEST(Cli, VersionAndPresets) {
  Result v = Cli({"version", "-o", "json"});
  ASSERT_EQ(v.code, kExitOk);
  EXPECT_FALSE(nlohmann::json::parse(v.out)["version"].get<std::string>().empty());
  Result p = Cli({"presets"});
  ASSERT_EQ(p.code, kExitOk);
  EXPECT_THAT(p.out, HasSubstr("pcie-l40s-2socket"));
  Result show = Cli({"presets", "--show", "t4x2"});
  ASSERT_EQ(show.code, kExitOk);
  EXPECT_THAT(show.out, HasSubstr("name: t4x2"));
}

// `tessera slurm acct` on a node's accounting records: each GPU's GPU time held and left idle
// (what it held over its run less its GPU time; not measured for a whole GPU), the rows ordered
// by it (a requeued job's earlier run a row of its own), one user's or those ended since a time
// only; JSON keeps each record whole, in the rows' order, with idle_gpu_s per measured GPU.
// `tessera slurm eff` against a sacct that prints what Slurm 22.05's prints for a two-node job
// (its own line and its steps', the two nodes' parts in its AdminComment) and a warning on stderr.
// A new empty folder `name` under the tests' own, removed when this goes however the test ends.
struct ScratchDir {
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::path(::testing::TempDir()) / name) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path path;
};

TEST(Cli, SlurmEffSaysWhatAJobUsedFromSacct) {
  const ScratchDir scratch("slurm-eff");
  const std::filesystem::path& dir = scratch.path;
  const std::string comment =
      "site: checked | tessera@node-a: gpu 1 (25% share): 80% busy, 5s of gpu time idle, peak 3 "
      "gib of 4 gib (75%), 2 allocations refused at its limit | tessera@n2: gpus 0,1 (50% share "
      "each): 60% busy, 40s of gpu time idle, peak 6 gib of 8 gib (75%)";
  // It answers only what `tessera slurm eff` must ask: the job, its steps, the fields, raw units.
  auto script = [&](const std::string& name, const std::string& comment_field,
                    const std::string& state = "COMPLETED", const std::string& job = "train",
                    const std::string& tres = "billing=8,cpu=8,gres/shard=10,node=2",
                    const std::string& mem = "8000M") {
    const std::string path = (dir / name).string();
    std::ofstream(path)
        << "#!/bin/sh\n"
           "[ \"$*\" = \"-j 42 -P -n --noconvert --delimiter=$(printf '\\037') -o "
        << tessera::slurm::kEffFields
        << "\" ] || { echo \"sacct: error: unexpected arguments: $*\" >&2; exit 1; }\n"
           "echo 'sacct: warning: the database is slow' >&2\n"
           "printf '42\\037"
        << job << "\\037alice\\037" << state << "\\0370:0\\0372\\0378\\037100\\03706:40.000\\037"
        << mem << "\\037\\037%s\\037%s\\n' '" << comment_field << "' '" << tres
        << "'\n"
           "printf '42.batch\\037batch\\037\\037COMPLETED\\0370:0\\0371\\0374\\037100\\03703:20.500"
           "\\037\\0371048576K\\037\\037\\n'\n"
           "printf '42.0\\037python\\037\\037COMPLETED\\0370:0\\0372\\0378\\03795\\03703:19.500"
           "\\037\\0372097152K\\037\\037\\n'\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    return path;
  };
  const std::string sacct = script("sacct", comment);
  Result r = Cli({"slurm", "eff", "42", "--sacct", sacct.c_str()});
  ASSERT_EQ(r.code, kExitOk) << r.err << r.out;
  EXPECT_THAT(r.err, HasSubstr("sacct: warning: the database is slow")) << "said, not parsed";
  for (const char* line : {
           "job                42 (train) of alice\n",
           "state              COMPLETED (exit code 0:0)\n",
           "elapsed            1m40s on 2 nodes, 8 CPUs\n",
           // 25 GPU-seconds at 80% and 100 at 60%: 80 of 125 busy.
           "GPU efficiency     64.0% of what its compute shares held was busy (3 GPUs on 2 nodes); "
           "45s of GPU time held idle\n",
           "GPU memory         peak 6 GiB of 8 GiB per GPU (75.0%); 2 allocations refused at its "
           "limit\n",
           "CPU efficiency     50.0% of 8 CPUs over its run (400.0 CPU-seconds)\n",
           "memory             peak 2 GiB (its largest task) of 3.9 GiB per node asked (51.2%)\n",
       }) {
    EXPECT_THAT(r.out, HasSubstr(line)) << r.out;
  }
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\nnode-a +1 +25% +80% +5s +3 GiB +4 GiB +2\n"))
      << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\nn2 +0,1 +50% +60% +40s +6 GiB +8 GiB +0\n"))
      << r.out;
  r = Cli({"slurm", "eff", "42", "--sacct", sacct.c_str(), "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto e = nlohmann::json::parse(r.out);
  EXPECT_EQ(e["gpu_busy_pct"], 64.0);
  EXPECT_EQ(e["gpu_idle_seconds"], 45.0);
  EXPECT_EQ(e["gpu_nodes"].size(), 2u);
  r = Cli({"slurm", "eff", "42", "--sacct", sacct.c_str(), "-o", "yaml"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(YAML::Load(r.out)["gpu_busy_pct"].as<double>(), 64.0) << r.out;
  // A part someone changed into what it is not: named, and Slurm's own figures still shown.
  const std::string changed = script("sacct-changed", "tessera@node-a: gpu 1 (lots): 80% busy");
  r = Cli({"slurm", "eff", "42", "--sacct", changed.c_str()});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.err, HasSubstr("'lots' is neither a share nor whole GPUs")) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU efficiency     not recorded: Slurm gave it 10 shards, and no "
                               "tessera@ part is in its AdminComment"))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("CPU efficiency     50.0% of 8 CPUs")) << r.out;
  // A job name that is not UTF-8 (Latin-1) and holds a terminal's escape: JSON that reads, with
  // the byte replaced; the table shows the escape instead of obeying it.
  const std::string latin = script("sacct-latin1", comment, "COMPLETED", "caf\xe9\x1b[2J");
  r = Cli({"slurm", "eff", "42", "--sacct", latin.c_str(), "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto named = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(named.is_object()) << r.out;
  EXPECT_EQ(named["name"], "caf\xef\xbf\xbd\x1b[2J");
  r = Cli({"slurm", "eff", "42", "--sacct", latin.c_str()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job                42 (caf")) << r.out;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\x1b"))) << r.out;
  // A job Slurm gave no GPUs: none to measure (JSON: what Slurm gave, from AllocTRES).
  const std::string cpus = script("sacct-cpus", "", "COMPLETED", "train", "billing=8,cpu=8,node=2");
  r = Cli({"slurm", "eff", "42", "--sacct", cpus.c_str()});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU efficiency     none: Slurm gave it no GPUs")) << r.out;
  r = Cli({"slurm", "eff", "42", "--sacct", sacct.c_str(), "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["shards_allocated"], 10) << r.out;
  // A job slurmdbd has from its first step only (Slurm 22.05, seen on the real one: named
  // "allocation", the memory it asked unknown until slurmctld's pass): said, not shown as asked.
  const std::string first =
      script("sacct-first-step", comment, "COMPLETED", "allocation",
             "billing=8,cpu=8,gres/shard=10,node=2", "18446744073709551616.00M");
  r = Cli({"slurm", "eff", "42", "--sacct", first.c_str()});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("record             from its first step only so far (its name and "
                               "the memory it asked are not in sacct yet): slurmctld sends its "
                               "own within 5 s; ask again then\n"))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("memory             peak 2 GiB (its largest task); the memory it "
                               "asked is not in sacct yet\n"))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("GPU efficiency     64.0% of")) << "the parts are read as ever";
  r = Cli({"slurm", "eff", "42", "--sacct", first.c_str(), "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["recorded_from_first_step"], true) << r.out;
  EXPECT_FALSE(nlohmann::json::parse(r.out).contains("memory_asked_per_node_bytes")) << r.out;
  r = Cli({"slurm", "eff", "42", "--sacct", sacct.c_str()});
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\nrecord "))) << r.out;
  // A job still running: its nodes have not written their parts yet.
  const std::string running = script("sacct-running", "", "RUNNING");
  r = Cli({"slurm", "eff", "42", "--sacct", running.c_str()});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU efficiency     not yet: each node writes its part when the "
                               "job ends there"))
      << r.out;
  // sacct failing (another job than the script knows), missing; a job id that is not one.
  r = Cli({"slurm", "eff", "43", "--sacct", sacct.c_str()});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr(" -j 43 failed (exit 1): sacct: error: unexpected arguments"));
  r = Cli({"slurm", "eff", "42", "--sacct", (dir / "none").c_str()});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("it reads the job from Slurm's accounting")) << r.err;
  for (const char* id : {"42.0", "x", "-1", "42_", "42+", "42_1+2", "12345678901"}) {
    r = Cli({"slurm", "eff", id, "--sacct", sacct.c_str()});
    EXPECT_EQ(r.code, kExitBadInput) << id;
    EXPECT_THAT(r.err, HasSubstr("expected a job id such as 42, 42_3 or 42+1")) << id << r.err;
  }
}

// Without a job: every job that ended in a period, as sacct selects them (the period, the ended
// states, its users), one line each or each user's sums, the GPU time left idle most first.
TEST(Cli, SlurmEffListsAPeriodsJobsAndSumsThemPerUser) {
  const ScratchDir scratch("slurm-eff-all");
  const std::filesystem::path& dir = scratch.path;
  auto line = [](std::vector<std::string> f) {
    std::string out;
    for (size_t i = 0; i < f.size(); ++i) out += (i ? tessera::slurm::kEffDelimiter : "") + f[i];
    return out + "\n";
  };
  // alice's share job on two nodes (125 GPU-seconds held, 80 busy, 45 idle), bob's on one (25
  // held, 5 busy), alice's without GPUs, bob's whose line does not read, carol's whole GPU.
  const std::string alice =
      line({"42", "train", "alice", "COMPLETED", "0:0", "2", "8", "100", "06:40.000", "8000M", "",
            "tessera@node-a: gpu 1 (25% share): 80% busy, 5s of gpu time idle, peak 3 gib of 4 "
            "gib (75%), 2 allocations refused at its limit | tessera@n2: gpus 0,1 (50% share "
            "each): 60% busy, 40s of gpu time idle, peak 6 gib of 8 gib (75%)",
            "billing=8,cpu=8,gres/shard=10,node=2"}) +
      line({"42.batch", "batch", "", "COMPLETED", "0:0", "1", "4", "100", "03:20.500", "",
            "1048576K", "", ""}) +
      line({"42.0", "python", "", "COMPLETED", "0:0", "2", "8", "95", "03:19.500", "", "2097152K",
            "", ""});
  const std::string bob =
      line({"43", "eval", "bob", "COMPLETED", "0:0", "1", "2", "50", "00:50.000", "1000M", "",
            "tessera@node-b: gpu 0 (50% share): 20% busy, 20s of gpu time idle, peak 1 gib of 8 "
            "gib (12%)",
            "billing=2,cpu=2,gres/shard=4,node=1"}) +
      line({"43.0", "python", "", "COMPLETED", "0:0", "1", "2", "50", "00:50.000", "", "512000K",
            "", ""}) +
      line({"45", "bad", "bob", "COMPLETED", "0:0", "1", "1", "10", "00:01.000", "lots", "", "",
            ""});
  const std::string rest =
      line({"44", "prep", "alice", "FAILED", "1:0", "1", "4", "10", "00:40.000", "4000M", "", "",
            "billing=4,cpu=4,node=1"}) +
      line({"46", "whole", "carol", "TIMEOUT", "0:0", "1", "1", "30", "00:15.000", "1000M", "",
            "tessera@node-c: gpu 1 (whole): busy not measured (a whole gpu)", "gres/gpu=1"});
  std::ofstream(dir / "all.txt") << alice << bob << rest;
  std::ofstream(dir / "bob.txt") << bob;
  // It answers only what the command must ask: the period (local time), the ended states, -a or
  // -u bob; a warning on stderr, written between its lines.
  const std::string base = std::string("-P -n --noconvert --delimiter=$(printf '\\037') -o ") +
                           tessera::slurm::kEffFields +
                           " -S 2026-11-01T00:00:00 -E 2026-11-02T08:00:00 -s "
                           "CD,F,CA,TO,OOM,NF,PR,DL";
  const std::string sacct = (dir / "sacct").string();
  std::ofstream(sacct) << "#!/bin/sh\n"
                          "if [ \"$*\" = \""
                       << base << " -a\" ]; then f=all; elif [ \"$*\" = \"" << base
                       << " -u bob\" ]; then f=bob; else\n"
                          "  echo \"sacct: error: unexpected arguments: $*\" >&2; exit 1; fi\n"
                          "head -n 2 "
                       << (dir / "").string() << "$f.txt\n"
                       << "echo 'sacct: warning: the database is slow' >&2\n"
                          "tail -n +3 "
                       << (dir / "").string() << "$f.txt\n";
  std::filesystem::permissions(sacct, std::filesystem::perms::owner_all);
  const std::vector<const char*> period = {"slurm",   "eff",        "--sacct", sacct.c_str(),
                                           "--since", "2026-11-01", "--until", "2026-11-02T08:00"};
  auto with = [&](std::vector<const char*> more) {
    std::vector<const char*> args = period;
    args.insert(args.end(), more.begin(), more.end());
    return Cli(args);
  };
  Result r = with({"-a"});
  ASSERT_EQ(r.code, kExitOk) << r.err << r.out;
  EXPECT_THAT(r.err, HasSubstr("sacct: warning: the database is slow\n")) << "said, not parsed";
  EXPECT_THAT(r.err, HasSubstr("tessera slurm eff: sacct, job 45: ReqMem 'lots': not a size "
                               "such as 1234K or 4000M: the job is left out\n"))
      << r.err;
  for (const std::string re :
       {"JOBID +NAME +USER +STATE +ELAPSED +GRES +BUSY +IDLE +GPU-MEM +REFUSED +CPU +MEM\n",
        "\n42 +train +alice +COMPLETED +00:01:40 +shard:10 +64% +45s +75% +2 +50% +51%\n",
        "\n43 +eval +bob +COMPLETED +00:00:50 +shard:4 +20% +20s +12% +0 +50% +50%\n",
        "\n44 +prep +alice +FAILED +00:00:10 +- +- +- +- +0 +100% +-\n",
        "\n46 +whole +carol +TIMEOUT +00:00:30 +gpu:1 +- +- +- +0 +50% +-\n",
        // 150 GPU-seconds held by shares, 85 busy, 65 idle.
        "\n\n4 jobs ended between 2026-11-01T00:00:00 and 2026-11-02T08:00:00; their compute "
        "shares held 2m30s of GPU time, 56.7% busy, 1m5s idle\n"})
    EXPECT_THAT(r.out, ::testing::ContainsRegex(re)) << r.out;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\n45 "))) << r.out;
  // As JSON: the period and each job's figures, as for one job.
  r = with({"-a", "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto all = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(all.is_object()) << r.out;
  EXPECT_EQ(all["since"], "2026-11-01T00:00:00");
  EXPECT_EQ(all["until"], "2026-11-02T08:00:00");
  ASSERT_EQ(all["jobs"].size(), 4u) << r.out;
  EXPECT_EQ(all["jobs"][0]["job_id"], "42");
  EXPECT_EQ(all["jobs"][0]["gpu_busy_pct"], 64.0);
  EXPECT_EQ(all["jobs"][0]["memory_peak_bytes"], 2u << 30) << "its steps' largest task";
  EXPECT_EQ(all["jobs"][1]["memory_pct"], 50.0);
  // Sorted: the GPU time left idle, most first, unmeasured last; --reverse the other way (the
  // unmeasured still last).
  r = with({"-a", "--sort", "idle", "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::vector<std::string> order;
  nlohmann::json sorted = nlohmann::json::parse(r.out);
  for (const auto& j : sorted["jobs"]) order.push_back(j["job_id"]);
  EXPECT_EQ(order, (std::vector<std::string>{"42", "43", "44", "46"}));
  r = with({"-a", "--sort", "idle", "--reverse", "-o", "json"});
  order.clear();
  sorted = nlohmann::json::parse(r.out);
  for (const auto& j : sorted["jobs"]) order.push_back(j["job_id"]);
  EXPECT_EQ(order, (std::vector<std::string>{"43", "42", "44", "46"}));
  // Per user: their jobs' sums, the GPU time left idle most first.
  r = with({"-a", "--by", "user"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  for (const std::string re :
       {"USER +JOBS +GPU-JOBS +GPU-HELD +BUSY +IDLE +GPU-MEM +GPU-MEM-MAX +REFUSED +CPU\n",
        // alice: 440 CPU-seconds of 840.
        "\nalice +2 +1 +2m5s +64% +45s +75% +75% +1 +52%\n",
        "\nbob +1 +1 +25s +20% +20s +12% +12% +0 +50%\n", "\ncarol +1 +1 +- +- +- +- +- +0 +50%\n"})
    EXPECT_THAT(r.out, ::testing::ContainsRegex(re)) << r.out;
  EXPECT_LT(r.out.find("\nalice"), r.out.find("\nbob")) << r.out;
  EXPECT_LT(r.out.find("\nbob"), r.out.find("\ncarol")) << r.out;
  r = with({"-a", "--by", "user", "-o", "yaml"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const YAML::Node users = YAML::Load(r.out)["users"];
  ASSERT_EQ(users.size(), 3u) << r.out;
  EXPECT_EQ(users[0]["user"].as<std::string>(), "alice");
  EXPECT_DOUBLE_EQ(users[0]["gpu_held_seconds"].as<double>(), 125);
  EXPECT_DOUBLE_EQ(users[0]["cpu_pct"].as<double>(), 100.0 * 440 / 840);
  r = with({"-a", "--by", "user", "--sort", "jobs", "-o", "json"});
  EXPECT_EQ(nlohmann::json::parse(r.out)["users"][0]["user"], "alice") << r.out;
  // One user, as sacct -u selects them.
  r = with({"-u", "bob", "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["jobs"].size(), 1u) << r.out;
  // sacct refusing (arguments it does not answer: here, none of -a and -u), said with its own
  // words; flags that do not go together; times that are not times.
  r = with({});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("failed (exit 1): sacct: error: unexpected arguments")) << r.err;
  for (const auto& [args, says] : std::vector<std::pair<std::vector<const char*>, std::string>>{
           {{"--since", "yesterdayish"}, "--since yesterdayish: expected a duration ago"},
           {{"--sort", "held"}, "--sort held is a user's figure: with --by user"},
           {{"--since", "2026-11-01", "--until", "2026-10-01"},
            "is after --until 2026-10-01T00:00:00"}}) {
    std::vector<const char*> a = {"slurm", "eff", "--sacct", sacct.c_str()};
    a.insert(a.end(), args.begin(), args.end());
    r = Cli(a);
    EXPECT_EQ(r.code, kExitBadInput) << says;
    EXPECT_THAT(r.err, HasSubstr(says)) << r.err;
  }
  r = Cli({"slurm", "eff", "42", "--since", "1d"});
  EXPECT_EQ(r.code, kExitBadInput);
  // An array's own id: sacct lists its tasks, each a line as for a period; --by and --sort too.
  std::ofstream(dir / "array.txt")
      << line({"50_1", "sweep", "dana", "COMPLETED", "0:0", "1", "2", "100", "01:40.000", "2000M",
               "", "tessera@node-a: gpu 0 (25% share): 90% busy, 3s of gpu time idle",
               "gres/shard=2"})
      << line({"50_1.0", "python", "", "COMPLETED", "0:0", "1", "2", "99", "01:40.000", "",
               "1024000K", "", ""})
      << line({"50_2", "sweep", "dana", "FAILED", "1:0", "1", "2", "100", "00:20.000", "2000M", "",
               "tessera@node-b: gpu 1 (25% share): 10% busy, 23s of gpu time idle",
               "gres/shard=2"});
  const std::string array = (dir / "sacct-array").string();
  std::ofstream(array) << "#!/bin/sh\n[ \"$*\" = \"-j 50 -P -n --noconvert "
                          "--delimiter=$(printf '\\037') -o "
                       << tessera::slurm::kEffFields
                       << "\" ] || { echo \"sacct: error: unexpected arguments: $*\" >&2; exit 1; "
                          "}\ncat "
                       << (dir / "array.txt").string() << "\n";
  std::filesystem::permissions(array, std::filesystem::perms::owner_all);
  r = Cli({"slurm", "eff", "50", "--sacct", array.c_str()});
  ASSERT_EQ(r.code, kExitOk) << r.err << r.out;
  for (const std::string re : {"\n50_1 +sweep +dana +COMPLETED +00:01:40 +shard:2 +90% +3s +- +0 "
                               "+50% +50%\n",
                               "\n50_2 +sweep +dana +FAILED +00:01:40 +shard:2 +10% +23s +- +0 "
                               "+10% +-\n",
                               "\n2 jobs listed for 50; their compute shares held 50s of GPU "
                               "time, 50.0% busy, 26s idle\n"})
    EXPECT_THAT(r.out, ::testing::ContainsRegex(re)) << r.out;
  r = Cli({"slurm", "eff", "50", "--sacct", array.c_str(), "--sort", "busy", "--reverse", "-o",
           "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto tasks = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_EQ(tasks["job"], "50") << r.out;
  ASSERT_EQ(tasks["jobs"].size(), 2u) << r.out;
  EXPECT_EQ(tasks["jobs"][0]["job_id"], "50_2") << "the least busy first";
  r = Cli({"slurm", "eff", "50", "--sacct", array.c_str(), "--by", "user", "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["users"][0]["jobs"], 2) << r.out;
  // One job: --by and --sort have nothing to order or sum.
  std::ofstream(dir / "one.txt") << alice;
  const std::string one = (dir / "sacct-one").string();
  std::ofstream(one) << "#!/bin/sh\ncat " << (dir / "one.txt").string() << "\n";
  std::filesystem::permissions(one, std::filesystem::perms::owner_all);
  r = Cli({"slurm", "eff", "42", "--sacct", one.c_str(), "--sort", "busy"});
  EXPECT_EQ(r.code, kExitBadInput) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--by and --sort order and sum several jobs (a period's, an "
                               "array's tasks): 42 is one"));
  // An answer past what is kept (128 MiB): refused, with what to do, not read in part.
  const std::string huge = (dir / "sacct-huge").string();
  std::ofstream(huge) << "#!/bin/sh\nhead -c 134217829 /dev/zero | tr '\\0' x\n";
  std::filesystem::permissions(huge, std::filesystem::perms::owner_all);
  r = Cli({"slurm", "eff", "--sacct", huge.c_str()});
  EXPECT_EQ(r.code, kExitFailure) << r.err;
  EXPECT_THAT(r.err, HasSubstr("sacct's answer for the period is over 128 MiB: ask a shorter one "
                               "(--since, --until) or one user (--user)"));
  EXPECT_EQ(r.out, "");
  // A period without jobs.
  const std::string none = (dir / "sacct-none").string();
  std::ofstream(none) << "#!/bin/sh\nexit 0\n";
  std::filesystem::permissions(none, std::filesystem::perms::owner_all);
  r = Cli(
      {"slurm", "eff", "--sacct", none.c_str(), "--since", "2026-11-01", "--until", "2026-11-02"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("no job ended between 2026-11-01T00:00:00 and "
                               "2026-11-02T00:00:00 (sacct -P -n --noconvert --delimiter=$'\\x1f' "
                               "-o JobID,"))
      << r.out;
  EXPECT_EQ(r.out.find('\x1f'), std::string::npos) << "no control character on the terminal";
}

TEST(Cli, SlurmAcctSaysAndSortsTheGpuTimeHeldIdle) {
  // Under the tests' own folder (removed when they end), and removed here however the test ends.
  const ScratchDir scratch("slurm-acct");
  const std::filesystem::path& dir = scratch.path;
  std::filesystem::create_directories(dir / "acct");
  auto gpu = [](int index, double gpu_time, double util) {
    return nlohmann::json{{"index", index},
                          {"gpu_time_s", gpu_time},
                          {"utilization_percent", util},
                          {"peak_memory_bytes", uint64_t{1} << 30},
                          {"memory_limit_bytes", uint64_t{2} << 30}};
  };
  // 41: a quarter for 1000 s, 50 s busy: 200 s held idle. 42 (nobody's): a half for 100 s, 45 s
  // busy: 5 s idle. 43: a whole GPU, not measured. 44: its trial (24 s idle), then its run (0).
  constexpr int64_t t0 = 1'790'000'000;  // 2026-09-21
  const std::vector<nlohmann::json> records = {{{"job_id", 41},
                                                {"uid", 0},
                                                {"started", t0 + 1000},
                                                {"ended", t0 + 2000},
                                                {"share_percent", 25.0},
                                                {"gpus", {gpu(0, 50, 5)}}},
                                               {{"job_id", 42},
                                                {"uid", 65534},
                                                {"started", t0 + 1000},
                                                {"ended", t0 + 1100},
                                                {"share_percent", 50.0},
                                                {"gpus", {gpu(1, 45, 45)}}},
                                               {{"job_id", 43},
                                                {"uid", 0},
                                                {"started", t0 + 3000},
                                                {"ended", t0 + 4000},
                                                {"share_percent", 0.0},
                                                {"gpus", {{{"index", 2}}}}},
                                               {{"job_id", 44},
                                                {"uid", 0},
                                                {"started", t0 + 5000},
                                                {"ended", t0 + 5100},
                                                {"share_percent", 25.0},
                                                {"gpus", {gpu(0, 25, 25)}},
                                                {"earlier_runs",
                                                 {{{"job_id", 44},
                                                   {"uid", 0},
                                                   {"started", t0 + 500},
                                                   {"ended", t0 + 600},
                                                   {"share_percent", 25.0},
                                                   {"gpus", {gpu(0, 1, 1)}}}}}}};
  for (const auto& r : records)
    std::ofstream(dir / "acct" / (std::to_string(r["job_id"].get<int>()) + ".json")) << r.dump();
  const std::string state = dir.string();
  // The row of `job` that reads `idle` in the IDLE column, its offset in `out` (npos: none).
  auto at = [](const std::string& out, const std::string& job, const std::string& idle) {
    std::smatch m;
    const std::regex row("\n" + job + " [^\n]* " + idle + " +[^ \n]+\n");  // IDLE, MEM-USED
    return std::regex_search(out, m, row) ? static_cast<size_t>(m.position(0)) : std::string::npos;
  };
  Result r = Cli({"slurm", "acct", "--state-dir", state.c_str(), "--sort", "idle"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr(" BUSY  IDLE      MEM-USED\n")) << r.out;
  const size_t j41 = at(r.out, "41", "00:03:20"), trial = at(r.out, "44", "00:00:24"),
               j42 = at(r.out, "42", "00:00:05"), j44 = at(r.out, "44", "00:00:00"),
               j43 = at(r.out, "43", "-");
  for (size_t p : {j41, trial, j42, j44, j43}) ASSERT_NE(p, std::string::npos) << r.out;
  EXPECT_LT(j41, trial) << r.out;
  EXPECT_LT(trial, j42) << r.out;
  EXPECT_LT(j42, j44) << r.out;
  EXPECT_LT(j44, j43) << "unmeasured last\n" << r.out;
  r = Cli({"slurm", "acct", "--state-dir", state.c_str(), "--sort", "idle", "--reverse"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_LT(at(r.out, "44", "00:00:00"), at(r.out, "42", "00:00:05")) << r.out;
  EXPECT_LT(at(r.out, "44", "00:00:24"), at(r.out, "41", "00:03:20")) << r.out;
  EXPECT_LT(at(r.out, "41", "00:03:20"), at(r.out, "43", "-")) << "unmeasured last still";
  // One user's (a name or a uid), those ended since a time.
  r = Cli({"slurm", "acct", "--state-dir", state.c_str(), "--user", "nobody"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(at(r.out, "42", "00:00:05"), std::string::npos) << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\n42 +nobody +")) << "its user by name";
  EXPECT_EQ(r.out.find("\n41 "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\n44 "), std::string::npos) << r.out;
  const std::string since = std::to_string(t0 + 2500);
  r = Cli({"slurm", "acct", "--state-dir", state.c_str(), "--user", "0", "--since", since.c_str()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out.find("\n41 "), std::string::npos) << "ended before --since\n" << r.out;
  EXPECT_EQ(r.out.find("\n42 "), std::string::npos) << r.out;
  EXPECT_NE(at(r.out, "43", "-"), std::string::npos) << r.out;
  EXPECT_NE(at(r.out, "44", "00:00:00"), std::string::npos) << r.out;
  EXPECT_EQ(at(r.out, "44", "00:00:24"), std::string::npos) << "its trial ended before\n" << r.out;
  // JSON: whole records in the rows' order, idle_gpu_s on measured GPUs, earlier runs kept.
  r = Cli({"slurm", "acct", "--state-dir", state.c_str(), "--sort", "idle", "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto all = nlohmann::json::parse(r.out);
  ASSERT_EQ(all.size(), 4u) << r.out;
  std::vector<int> order;
  for (const auto& j : all) order.push_back(j["job_id"]);
  EXPECT_EQ(order, (std::vector<int>{41, 44, 42, 43}));
  EXPECT_EQ(all[0]["gpus"][0]["idle_gpu_s"], 200.0);
  EXPECT_EQ(all[1]["earlier_runs"][0]["gpus"][0]["idle_gpu_s"], 24.0);
  EXPECT_EQ(all[1]["gpus"][0]["idle_gpu_s"], 0.0);
  EXPECT_FALSE(all[3]["gpus"][0].contains("idle_gpu_s")) << "a whole GPU is not measured";
  // Bad flags: said, exit 2.
  for (const auto& [args, why] : std::vector<std::pair<std::vector<const char*>, std::string>>{
           {{"--user", "no-such-user-here"}, "--user no-such-user-here: no such user"},
           {{"--since", "last tuesday"}, "--since last tuesday: expected a duration ago"},
           {{"--sort", "fun"}, "--sort: fun not in {job,start,end,elapsed,gpu_time,util,busy"},
           {{"--reverse"}, "--reverse requires --sort"}}) {
    std::vector<const char*> a = {"slurm", "acct", "--state-dir", state.c_str()};
    a.insert(a.end(), args.begin(), args.end());
    r = Cli(a);
    EXPECT_EQ(r.code, 2) << args[0];
    EXPECT_THAT(r.err + r.out, HasSubstr(why)) << args[0];
  }
}

}  // namespace
}  // namespace tessera::cli
