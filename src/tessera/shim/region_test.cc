// The shared accounting region in one process (and a child that dies): limits, saturation, reclaim.
#include "tessera/shim/region.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace tessera::shim {
namespace {

std::string Path(const std::string& name) {
  std::string p = ::testing::TempDir() + "region-test-" + std::to_string(getpid()) + "-" + name;
  std::filesystem::remove(p);
  return p;
}

TEST(Limits, ParseOneForAllOrPerDevice) {
  uint64_t l[kMaxDevices];
  int n = 0;
  ASSERT_TRUE(ParseLimits("1GiB", l, &n));
  EXPECT_EQ(n, kMaxDevices);
  EXPECT_EQ(l[0], 1ull << 30);
  EXPECT_EQ(l[15], 1ull << 30);
  ASSERT_TRUE(ParseLimits("0:512MiB,2:1073741824", l, &n));
  EXPECT_EQ(n, 3);
  EXPECT_EQ(l[0], 512ull << 20);
  EXPECT_EQ(l[1], 0u);
  EXPECT_EQ(l[2], 1ull << 30);
  for (const char* bad : {"", "lots", "1XB", "0:", "99:1GiB", "0:1GiB;1:2GiB", "-1", "10Gb", "1.5",
                          "1 0GiB", "1e9", " 1GiB", "1GiB ", "1.2.3GiB", "99999999999T",
                          "18446744073709551616", "0x10", "inf", "1,5GiB"}) {
    EXPECT_FALSE(ParseLimits(bad, l, &n)) << bad;
  }
}

// Units as users write them: Slurm's K/M/G/T and the IEC names are powers of 1024, the SI names
// powers of 1000; decimals with a unit, one space before it.
TEST(Limits, SizesAsUsersWriteThem) {
  const struct {
    const char* text;
    uint64_t bytes;
  } cases[] = {
      {"10G", 10ull << 30},
      {"10Gi", 10ull << 30},
      {"10GiB", 10ull << 30},
      {"10 GiB", 10ull << 30},
      {"10GB", 10000000000ull},
      {"512M", 512ull << 20},
      {"512MB", 512000000ull},
      {"1.5GiB", 1536ull << 20},
      {"0.5G", 512ull << 20},
      {"2T", 2ull << 40},
      {"4096", 4096},
      {"4096B", 4096},
      {"1K", 1024},
      {"18446744073709551615", ~0ull},
  };
  for (const auto& c : cases) {
    uint64_t l[kMaxDevices];
    int n = 0;
    ASSERT_TRUE(ParseLimits(c.text, l, &n)) << c.text;
    EXPECT_EQ(l[0], c.bytes) << c.text;
  }
  uint64_t l[kMaxDevices];
  int n = 0;
  ASSERT_TRUE(ParseLimits("0:1.5G,1:2GB", l, &n));
  EXPECT_EQ(l[0], 1536ull << 20);
  EXPECT_EQ(l[1], 2000000000ull);
}

TEST(Region, ReserveStopsAtTheLimitAndReleaseNeverUnderflows) {
  uint64_t limits[1] = {1000};
  char err[128];
  Region* r = Region::Attach(Path("a").c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  EXPECT_TRUE(r->Reserve(0, 600));
  EXPECT_FALSE(r->Reserve(0, 401));
  EXPECT_TRUE(r->Reserve(0, 400));
  EXPECT_EQ(r->Used(0), 1000u);
  EXPECT_FALSE(r->Reserve(0, UINT64_MAX)) << "no wrap-around";
  r->Release(0, 5000);
  EXPECT_EQ(r->Used(0), 0u) << "clamped at zero, not a huge number";
  EXPECT_EQ(r->Peak(0), 1000u) << "the most it held, kept after the release";
  EXPECT_TRUE(r->Reserve(0, 300));
  EXPECT_EQ(r->Peak(0), 1000u);
  EXPECT_TRUE(r->Reserve(1, 1ull << 40)) << "device 1 has no limit";
  EXPECT_FALSE(r->Reserve(kMaxDevices, 1));
}

TEST(Region, ThreadsRacingNeverExceedTheLimit) {
  uint64_t limits[1] = {10'000};
  char err[128];
  Region* r = Region::Attach(Path("race").c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10'000; ++i) granted += r->Reserve(0, 7);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 10'000 / 7);
  EXPECT_EQ(r->Used(0), uint64_t(10'000 / 7 * 7));
  EXPECT_EQ(r->Peak(0), r->Used(0)) << "the peak follows every racing reservation";
}

// A child process attaches to the region at `path` (limit 1000 on device 0), reserves `bytes` and
// exits holding them; its exit status (0: it did).
int ExitHolding(const std::string& path, uint64_t bytes) {
  pid_t child = fork();
  if (child == 0) {
    uint64_t limits[1] = {1000};
    char err[128];
    Region* r = Region::Attach(path.c_str(), limits, 1, err, sizeof err);
    _exit(r != nullptr && r->Reserve(0, bytes) ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WEXITSTATUS(status);
}

TEST(Region, DeadProcessMemoryIsReclaimedWhenNeeded) {
  std::string path = Path("dead");
  uint64_t limits[1] = {1000};
  ASSERT_EQ(ExitHolding(path, 900), 0);
  char err[128];
  Region* r = Region::Attach(path.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  EXPECT_EQ(r->Used(0), 900u) << "still counted until someone needs it";
  EXPECT_TRUE(r->Reserve(0, 900)) << "a reservation that would not fit reclaims first";
  EXPECT_EQ(r->data()->reclaimed_bytes.load(), 900u);
  EXPECT_EQ(r->Used(0), 900u);
}

// Memory queries reclaim at most once per interval (a full reclaim reads every attached process):
// the first in a process does, one within the interval does not, one after it does again.
TEST(Region, MemoryQueriesReclaimAtMostOncePerInterval) {
  const std::string path = Path("due");
  uint64_t limits[1] = {1000};
  char err[128];
  Region* r = Region::Attach(path.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  const uint64_t hour_us = 3'600'000'000;
  ASSERT_EQ(ExitHolding(path, 300), 0);
  EXPECT_EQ(r->ReclaimDeadIfDue(hour_us), 1) << "the first query reclaims";
  EXPECT_EQ(r->Used(0), 0u);
  ASSERT_EQ(ExitHolding(path, 300), 0);
  EXPECT_EQ(r->ReclaimDeadIfDue(hour_us), 0) << "not again within the interval";
  EXPECT_EQ(r->Used(0), 300u);
  EXPECT_EQ(r->ReclaimDeadIfDue(0), 1) << "past it";
  EXPECT_EQ(r->Used(0), 0u);
}

// A region file is trusted only when this user or root made it and others cannot write it, and
// never through a symlink: another user's file (its limit 0: none) lifted the limit before. The
// process's own limit holds whatever the file says: the stricter of the two applies.
TEST(Region, UntrustedFilesAreRefusedAndTheStricterLimitApplies) {
  ASSERT_EQ(geteuid(), 0u) << "files of another user are made with chown, as root";
  uint64_t none[1] = {0}, mine[1] = {1000};
  char err[256] = "";
  const std::string theirs = Path("theirs");
  ASSERT_TRUE(CreateRegionFile(theirs.c_str(), none, 1, err, sizeof err)) << err;
  ASSERT_EQ(chown(theirs.c_str(), 4242, 4242), 0);
  EXPECT_EQ(Region::Attach(theirs.c_str(), mine, 1, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("belongs to another user: refused"), std::string::npos) << err;
  const std::string link = Path("link");
  const std::string target = Path("target");
  ASSERT_TRUE(CreateRegionFile(target.c_str(), none, 1, err, sizeof err)) << err;
  std::filesystem::create_symlink(target, link);
  EXPECT_EQ(Region::Attach(link.c_str(), mine, 1, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("is a symlink: refused"), std::string::npos) << err;
  // Root's own file, open to all (the node agent's, for containers of unknown users): trusted.
  ASSERT_EQ(chmod(target.c_str(), 0666), 0);
  Region* r = Region::Attach(target.c_str(), mine, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  EXPECT_EQ(r->Limit(0), 1000u) << "the file says none; the process's own 1000 holds";
  EXPECT_FALSE(r->Reserve(0, 1001));
  EXPECT_TRUE(r->Reserve(0, 1000));
  const std::string strict = Path("strict");
  uint64_t small[1] = {500};
  ASSERT_TRUE(CreateRegionFile(strict.c_str(), small, 1, err, sizeof err)) << err;
  Region* s = Region::Attach(strict.c_str(), mine, 1, err, sizeof err);
  ASSERT_NE(s, nullptr) << err;
  EXPECT_EQ(s->Limit(0), 500u) << "the file's stricter limit";
}

// A process that exec()s keeps its pid and start time; its new image attaches again, and what the
// old image held (gone with its CUDA context) is given back rather than charged for good (500 MiB
// stayed charged before). Two attaches in one process stand for the two images.
TEST(Region, AnImageAfterExecGivesBackWhatTheFormerImageHeld) {
  const std::string path = Path("exec");
  uint64_t limits[1] = {1000};
  char err[128];
  Region* before = Region::Attach(path.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(before, nullptr) << err;
  ASSERT_TRUE(before->Reserve(0, 500));
  Region* after = Region::Attach(path.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(after, nullptr) << err;
  EXPECT_EQ(after->Used(0), 0u);
  EXPECT_EQ(after->data()->reclaimed_bytes.load(), 500u);
  EXPECT_TRUE(after->Reserve(0, 1000)) << "the whole limit is the new image's";
  int mine = 0;
  for (const ProcSlot& s : after->data()->procs) mine += s.pid.load() == getpid();
  EXPECT_EQ(mine, 1) << "one slot for the process";
}

TEST(Region, RefusesAFileOfAnotherKind) {
  std::string path = Path("junk");
  FILE* f = fopen(path.c_str(), "w");
  fputs("junk", f);
  fclose(f);
  uint64_t limits[1] = {1};
  char err[256] = "";
  EXPECT_EQ(Region::Attach(path.c_str(), limits, 1, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("not a Tessera shared region"), std::string::npos) << err;
}

TEST(Region, ReadingACopyRefusesWhatIsNotARegionOfThisVersion) {
  const std::string path = Path("readonly");
  uint64_t limits[1] = {4096};
  char err[128] = {};
  ASSERT_TRUE(CreateRegionFile(path.c_str(), limits, 1, err, sizeof err)) << err;
  auto d = std::make_unique<RegionData>();
  const size_t head = offsetof(RegionData, procs);
  ASSERT_TRUE(ReadSharedFile(path.c_str(), sizeof(RegionData), kRegionMagic, kRegionVersion,
                             d.get(), head));
  EXPECT_EQ(d->limit[0], 4096u);
  EXPECT_FALSE(ReadSharedFile(path.c_str(), sizeof(RegionData), kRegionMagic, kRegionVersion + 1,
                              d.get(), head))
      << "another version";
  EXPECT_FALSE(ReadSharedFile(path.c_str(), sizeof(RegionData), kRegionMagic + 1, kRegionVersion,
                              d.get(), head))
      << "another kind";
  EXPECT_FALSE(ReadSharedFile(path.c_str(), sizeof(RegionData) - 8, kRegionMagic, kRegionVersion,
                              d.get(), head))
      << "another size";
  EXPECT_FALSE(ReadSharedFile(Path("missing").c_str(), sizeof(RegionData), kRegionMagic,
                              kRegionVersion, d.get(), head));
  // Not followed: a symlink (to a real region) and a FIFO (which would block a plain open).
  const std::string link = Path("link");
  std::filesystem::create_symlink(path, link);
  EXPECT_FALSE(
      ReadSharedFile(link.c_str(), sizeof(RegionData), kRegionMagic, kRegionVersion, d.get(), head))
      << "a symlink";
  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(OpenSharedFile(fifo.c_str(), sizeof(RegionData), kRegionMagic, kRegionVersion), -1);
}

// The job owns its region file and may shrink it at any moment, also between the reader's checks
// and its read: the read fails, where a mapping's reader died of SIGBUS.
TEST(Region, AFileTruncatedAfterItWasOpenedFailsTheReadInsteadOfFaulting) {
  const std::string path = Path("truncated");
  uint64_t limits[1] = {4096};
  char err[128] = {};
  ASSERT_TRUE(CreateRegionFile(path.c_str(), limits, 1, err, sizeof err)) << err;
  const int fd = OpenSharedFile(path.c_str(), sizeof(RegionData), kRegionMagic, kRegionVersion);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  auto d = std::make_unique<RegionData>();
  EXPECT_FALSE(ReadSharedAt(fd, d.get(), offsetof(RegionData, procs), 0));
  EXPECT_FALSE(ReadSharedAt(fd, d.get(), 8, sizeof(RegionData) - 8)) << "past the new end";
  EXPECT_TRUE(ReadSharedAt(fd, d.get(), 16, 0)) << "what is still there reads";
  close(fd);
}

TEST(Region, CreatedAheadForAJobThatThenAttaches) {
  const std::string path = Path("ahead");
  uint64_t limits[1] = {4096};
  char err[128] = {};
  ASSERT_TRUE(CreateRegionFile(path.c_str(), limits, 1, err, sizeof err)) << err;
  EXPECT_EQ(std::filesystem::file_size(path), sizeof(RegionData));
  ASSERT_TRUE(CreateRegionFile(path.c_str(), limits, 1, err, sizeof err))
      << "an existing region is kept: " << err;
  // The job attaches with a looser limit: the file's (the server's, stricter) holds, and no slot
  // was taken ahead.
  uint64_t other[1] = {8192};
  Region* r = Region::Attach(path.c_str(), other, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  EXPECT_EQ(r->Limit(0), 4096u);
  EXPECT_TRUE(r->Reserve(0, 4096));
  int taken = 0;
  for (const ProcSlot& s : r->data()->procs) taken += s.pid.load() != 0;
  EXPECT_EQ(taken, 1);
  const std::string junk = Path("junk");
  { std::ofstream(junk) << "not a region"; }
  EXPECT_FALSE(CreateRegionFile(junk.c_str(), limits, 1, err, sizeof err));
  EXPECT_NE(std::string(err).find("not a Tessera"), std::string::npos) << err;
}

// A file made by a build before the shared VMM table (its earlier, shorter size) is still a
// region: attached and read alike, its processes charging shared memory each on their own.
TEST(Region, AFileOfTheLayoutBeforeTheSharedTableIsStillARegion) {
  const std::string path = Path("older");
  uint64_t limits[1] = {4096};
  char err[128] = {};
  ASSERT_TRUE(CreateRegionFile(path.c_str(), limits, 1, err, sizeof err)) << err;
  std::filesystem::resize_file(path, kRegionSizeWithoutShared);
  Region* r = Region::Attach(path.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  EXPECT_FALSE(r->HasSharedTable());
  EXPECT_TRUE(r->Reserve(0, 1000));
  EXPECT_EQ(r->Share(0, 1000, -1, nullptr), 0u) << "no table: not shared";
  auto head = ReadRegionHead(path.c_str());
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->used[0].load(), 1000u);
  std::filesystem::resize_file(path, kRegionSizeWithoutShared + 8);
  EXPECT_EQ(ReadRegionHead(path.c_str()), nullptr) << "any other size is refused";
}

// An allocation refused for the limit is counted, with what the job would have held had it been
// given; the reader sees both. A file of the layout before them (the shared table's) is still a
// region whose refusals read as none; a device without a limit refuses nothing.
TEST(Region, RefusalsAreCountedWithWhatTheJobWouldHaveHeld) {
  const std::string path = Path("refusals");
  uint64_t limits[2] = {4096, 0};
  char err[128] = {};
  Region* r = Region::Attach(path.c_str(), limits, 2, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  ASSERT_TRUE(r->Reserve(0, 3000));
  EXPECT_FALSE(r->Reserve(0, 2000));
  EXPECT_FALSE(r->Reserve(0, 1500));
  EXPECT_TRUE(r->Reserve(0, 1000));
  EXPECT_FALSE(r->Reserve(0, UINT64_MAX)) << "no wrap-around";
  auto head = ReadRegionHead(path.c_str());
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->refused[0].load(), 3u);
  EXPECT_EQ(head->wanted_peak[0].load(), UINT64_MAX) << "the largest want, saturated";
  EXPECT_EQ(head->peak[0].load(), 4000u);
  EXPECT_EQ(head->refused[1].load(), 0u);

  const std::string small = Path("refusals-small");
  Region* s = Region::Attach(small.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(s, nullptr) << err;
  ASSERT_TRUE(s->Reserve(0, 3000));
  EXPECT_FALSE(s->Reserve(0, 2000));
  head = ReadRegionHead(small.c_str());
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->wanted_peak[0].load(), 5000u) << "held 3000, asked 2000 more";

  const std::string older = Path("refusals-older");
  ASSERT_TRUE(CreateRegionFile(older.c_str(), limits, 1, err, sizeof err)) << err;
  std::filesystem::resize_file(older, kRegionSizeWithoutRefusals);
  Region* o = Region::Attach(older.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(o, nullptr) << err;
  EXPECT_TRUE(o->HasSharedTable()) << "the shared table is in that layout";
  EXPECT_FALSE(o->Reserve(0, 5000)) << "still refused, just not counted";
  head = ReadRegionHead(older.c_str());
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->refused[0].load(), 0u);
  EXPECT_EQ(std::filesystem::file_size(older), kRegionSizeWithoutRefusals)
      << "nothing written past";
}

// The launches every process counted in its slot add up for the reader, a process that ended
// included; a file that is not a region reads as none.
TEST(Region, EveryProcesssLaunchesAddUpForTheReader) {
  const std::string path = Path("launches");
  uint64_t limits[1] = {0};
  char err[128] = {};
  Region* r = Region::Attach(path.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  for (int i = 0; i < 3; ++i) r->CountLaunch();
  const pid_t child = fork();
  if (child == 0) {
    r->ReattachAfterFork();
    r->CountLaunch();
    r->CountLaunch();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(ReadRegionLaunches(path.c_str()), 5u);
  const std::string junk = Path("launches-junk");
  { std::ofstream(junk) << "not a region"; }
  EXPECT_EQ(ReadRegionLaunches(junk.c_str()), 0u);
  EXPECT_EQ(ReadRegionLaunches(Path("launches-missing").c_str()), 0u);
}

// Shared memory's charge: once, to one holder; passed on when it leaves or dies; given back with
// the last. The other holder is a forked child (a process of its own, with a slot of its own).
TEST(Region, SharedMemoryIsChargedOnceAndPassedOnToTheNextHolder) {
  const std::string path = Path("shared");
  uint64_t limits[1] = {4096};
  char err[128] = {};
  Region* r = Region::Attach(path.c_str(), limits, 1, err, sizeof err);
  ASSERT_NE(r, nullptr) << err;
  ASSERT_TRUE(r->HasSharedTable());
  uint8_t fabric[64] = {1, 2, 3};
  ASSERT_TRUE(r->Reserve(0, 1000));
  const uint64_t id = r->Share(0, 1000, -1, fabric);
  ASSERT_NE(id, 0u);
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  if (child == 0) {
    r->ReattachAfterFork();
    int device = -1;
    uint64_t bytes = 0;
    uint8_t other[64] = {9};
    int code = r->Join(-1, other, -1, &device, &bytes) == 0 ? 0 : 1;  // another allocation
    code |= r->Join(-1, fabric, -1, &device, &bytes) == id && device == 0 && bytes == 1000 ? 0 : 2;
    char c = 'j';
    (void)!write(to_parent[1], &c, 1);
    (void)!read(to_child[0], &c, 1);                               // the parent left
    code |= r->SlotUsed(0) == 1000 && r->Used(0) == 1000 ? 0 : 4;  // the charge passed here
    r->Leave(id);
    code |= r->Used(0) == 0 ? 0 : 8;  // the last holder gave it back
    _exit(code);
  }
  char c = 0;
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  EXPECT_EQ(r->Used(0), 1000u) << "once while both hold it";
  r->Leave(id);
  EXPECT_EQ(r->Used(0), 1000u) << "the child holds it still";
  EXPECT_EQ(r->SlotUsed(0), 0u);
  (void)!write(to_child[1], "l", 1);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits of the child's failed checks";
  EXPECT_EQ(r->Used(0), 0u);
  int device = -1;
  uint64_t bytes = 0;
  EXPECT_EQ(r->Join(-1, fabric, -1, &device, &bytes), 0u) << "gone";
  // A holder that dies passes nothing on when it is the last: its slot gives the charge back.
  ASSERT_TRUE(r->Reserve(0, 500));
  const uint64_t again = r->Share(0, 500, -1, fabric);
  const pid_t holder = fork();
  if (holder == 0) {
    r->ReattachAfterFork();
    _exit(r->Join(-1, fabric, -1, &device, &bytes) == again ? 0 : 1);
  }
  waitpid(holder, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  r->Leave(again);
  EXPECT_EQ(r->Used(0), 500u) << "the dead child, not yet reclaimed, holds it";
  EXPECT_EQ(r->ReclaimDead(), 2) << "both children's slots";
  EXPECT_EQ(r->Used(0), 0u) << "the dead holder's slot gave it back";
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

TEST(Region, StartTimeTellsAReusedPid) {
  EXPECT_GT(ProcessStartTime(getpid()), 0u);
  EXPECT_EQ(ProcessStartTime(999'999'999), 0u);
}

}  // namespace
}  // namespace tessera::shim
