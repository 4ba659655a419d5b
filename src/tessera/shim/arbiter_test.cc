#include "tessera/shim/arbiter.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tessera/shim/region.h"
#include "tessera/shim/version5_arbiter_file.h"

namespace tessera::shim {
namespace {

TEST(ArbiterShare, Parses) {
  uint32_t p = 0;
  EXPECT_TRUE(ParseShare("30%", &p));
  EXPECT_EQ(p, 300u);
  EXPECT_TRUE(ParseShare("30", &p));
  EXPECT_EQ(p, 300u);
  EXPECT_TRUE(ParseShare("0.3", &p));
  EXPECT_EQ(p, 300u);
  EXPECT_TRUE(ParseShare("100%", &p));
  EXPECT_EQ(p, 1000u);
  EXPECT_TRUE(ParseShare("12.5%", &p));
  EXPECT_EQ(p, 125u);
  for (const char* bad : {"", "0", "0%", "101%", "1.5", "-30%", " 30", "30 %", "30%x", "lots"}) {
    EXPECT_FALSE(ParseShare(bad, &p)) << bad;
  }
}

std::string TempFile(const char* name) {
  return ::testing::TempDir() + "arbiter-" + std::to_string(getpid()) + "-" + name;
}

// The 65th job on a GPU: its first launch waits for a slot (unpaced, it would take the others'
// time) and goes on as soon as one is free.
TEST(Arbiter, WithEverySlotTakenALaunchWaitsForOne) {
  std::string path = TempFile("full");
  unlink(path.c_str());
  char err[256] = "";
  ArbiterConfig c;
  c.slice_us = 1000;
  std::vector<std::unique_ptr<Arbiter>> jobs;
  for (int k = 0; k < kArbiterJobs; ++k) {
    jobs.emplace_back(Arbiter::Attach(path.c_str(), 1000 + k, c, err, sizeof err));
    ASSERT_NE(jobs.back(), nullptr) << err;
    ASSERT_GE(jobs.back()->Slot(2), 0) << k;
  }
  std::unique_ptr<Arbiter> late(Arbiter::Attach(path.c_str(), 7, c, err, sizeof err));
  ASSERT_NE(late, nullptr) << err;
  ASSERT_LT(late->Slot(2), 0) << "every slot taken";
  std::atomic<bool> freed{false}, returned_after_free{false};
  std::thread launch([&] {
    late->BeforeLaunch(2, nullptr);
    returned_after_free = freed.load();
  });
  // Once it waits, a job leaves (its slot freed as a finished job's is): the launch takes it.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (late->slot_waits() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  EXPECT_EQ(late->slot_waits(), 1u) << "the launch did not wait for a slot";
  const int slot = jobs[10]->Slot(2);
  freed = true;
  jobs[10]->data()->gpus[2].jobs[slot].key.store(0);
  launch.join();
  EXPECT_TRUE(returned_after_free) << "the launch went on unpaced while every slot was taken";
  EXPECT_EQ(late->Slot(2), slot);
  unlink(path.c_str());
}

// The machine's pacing settings are the file's, written by its maker; a file of an older version
// (an upgrade) is replaced by one of this version, not left to run unpaced.
TEST(Arbiter, TheFilesSettingsAreItsMakersAndAnOlderFileIsReplaced) {
  std::string path = TempFile("settings");
  unlink(path.c_str());
  {
    std::ofstream old(path, std::ios::binary);
    const uint64_t magic = kArbiterMagic;
    const uint32_t version = 3;
    old.write(reinterpret_cast<const char*>(&magic), sizeof magic);
    old.write(reinterpret_cast<const char*>(&version), sizeof version);
    old << std::string(1000, '\0');
  }
  char err[256] = "";
  ArbiterConfig maker;
  maker.slice_us = 8000;
  maker.queue_us = 2000;
  ASSERT_TRUE(CreateArbiterFile(path.c_str(), err, sizeof err, maker)) << err;
  ArbiterConfig tenant;
  tenant.slice_us = 1000000;  // its own environment's: not used
  tenant.queue_us = 10000000;
  std::unique_ptr<Arbiter> a(Arbiter::Attach(path.c_str(), 5, tenant, err, sizeof err));
  ASSERT_NE(a, nullptr) << err;
  EXPECT_EQ(a->slice_us(), 8000u);
  EXPECT_EQ(a->queue_us(), 2000u);
  EXPECT_EQ(a->idle_us(), 1000u);
  // A scribbled setting is not believed: the process's own stands.
  a->data()->settings.slice_us.store(7);
  std::unique_ptr<Arbiter> b(Arbiter::Attach(path.c_str(), 6, ArbiterConfig(), err, sizeof err));
  ASSERT_NE(b, nullptr) << err;
  EXPECT_EQ(b->slice_us(), ArbiterConfig().slice_us);
  unlink(path.c_str());
}

// A pid that is no process any more (a child reaped).
int32_t GonePid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

// An upgrade under running work: the new maker renames a fresh file over a version 5 one, whose
// jobs keep it mapped and charged. Their GPU time is still read - from the old file, kept for the
// maker alone at <path>.previous, added to what the job's new processes charge in the new one; a
// job of neither file reads 0. Without the kept file the old job read 0 (it ended unmeasured).
TEST(Arbiter, JobsOnTheFileOfBeforeAnUpgradeAreStillMeasured) {
  const std::string path = TempFile("upgrade");
  char previous[4200];
  ArbiterPreviousPath(path.c_str(), previous, sizeof previous);
  unlink(previous);
  const uint64_t job = ArbiterJobKey("41");
  const int gpu[] = {2};
  Version5ArbiterFile old(path);
  ASSERT_TRUE(old.ok());
  old.Put(2, 3, job, 1'500'000, Arbiter::NowMicros(), getpid(), PidNamespace());
  struct stat before;
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  char err[256] = "";
  ASSERT_TRUE(CreateArbiterFile(path.c_str(), err, sizeof err)) << err;
  auto now = std::make_unique<ArbiterData>();
  EXPECT_TRUE(ReadSharedFile(path.c_str(), sizeof *now, kArbiterMagic, kArbiterVersion, now.get(),
                             sizeof *now))
      << "a version " << kArbiterVersion << " file at the path";
  struct stat kept;
  ASSERT_EQ(stat(previous, &kept), 0) << "the old file is kept at " << previous;
  EXPECT_EQ(kept.st_ino, before.st_ino) << "the very file its jobs mapped";
  EXPECT_EQ(kept.st_mode & 07777, 0600u) << "for its maker alone";

  EXPECT_EQ(ArbiterJobUse(path.c_str(), gpu, 1, job).busy_us, 1'500'000u);
  // The old job's processes go on charging the file they mapped.
  old.Job(2, 3).busy_us = 2'000'000;
  EXPECT_EQ(ArbiterJobUse(path.c_str(), gpu, 1, job).busy_us, 2'000'000u);
  // A process of the job started after the upgrade (the new library) joins the new file: both
  // count, and only the new file counts held-back time (version 5 did not).
  std::unique_ptr<Arbiter> fresh(
      Arbiter::Attach(path.c_str(), job, ArbiterConfig(), err, sizeof err));
  ASSERT_NE(fresh, nullptr) << err;
  const int slot = fresh->Slot(2);
  ASSERT_GE(slot, 0);
  fresh->data()->gpus[2].jobs[slot].busy_us = 700'000;
  fresh->data()->gpus[2].jobs[slot].held_us = 300'000;
  ArbiterUse use = ArbiterJobUse(path.c_str(), gpu, 1, job);
  EXPECT_EQ(use.busy_us, 2'700'000u);
  EXPECT_EQ(use.held_us, 300'000u);
  EXPECT_EQ(ArbiterJobUse(path.c_str(), gpu, 1, ArbiterJobKey("42")).busy_us, 0u);
  const int other_gpu[] = {1};
  EXPECT_EQ(ArbiterJobUse(path.c_str(), other_gpu, 1, job).busy_us, 0u);

  // Its job runs: a later maker keeps the file.
  ASSERT_TRUE(CreateArbiterFile(path.c_str(), err, sizeof err)) << err;
  EXPECT_EQ(access(previous, F_OK), 0) << "removed while its job runs";
  // A file there of another owner than the arbiter's is not the maker's: not read (root only can
  // make one here; CI runs the tests as root).
  if (geteuid() == 0) {
    ASSERT_EQ(chown(previous, 65534, 65534), 0);
    EXPECT_EQ(ArbiterJobUse(path.c_str(), gpu, 1, job).busy_us, 700'000u);
    ASSERT_EQ(chown(previous, geteuid(), getegid()), 0);
  }
  // A file there of another size than its version's (cut short, or grown) is not read - mapped,
  // its rows past the end would fault - and, nothing readable in it, it is stale.
  std::string bytes;
  {
    std::ifstream in(previous, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 4096u);
  EXPECT_FALSE(ArbiterPreviousIsStale(previous, Arbiter::NowMicros())) << "the whole file";
  for (const size_t size : {bytes.size() - 4096, bytes.size() + 1}) {
    unlink(previous);
    {
      std::ofstream out(previous, std::ios::binary);
      out << bytes.substr(0, size) << std::string(size > bytes.size() ? 1 : 0, '\0');
    }
    ASSERT_EQ(chmod(previous, 0600), 0);
    EXPECT_EQ(ArbiterJobUse(path.c_str(), gpu, 1, job).busy_us, 700'000u) << size << " bytes";
    EXPECT_TRUE(ArbiterPreviousIsStale(previous, Arbiter::NowMicros())) << size << " bytes";
  }
  fresh.reset();
  unlink(previous);
  unlink(path.c_str());
}

// The previous file goes once no job in it can still use it or be unread: each slot's job last
// used it over an hour ago (or before this boot: a time past now) and its process is gone here.
// Another pid namespace's process cannot be told: the time alone decides for it.
TEST(Arbiter, ThePreviousFileGoesOnceNoJobInItCanStillRunOrBeUnread) {
  const std::string path = TempFile("stale");
  const uint64_t now = 10ull * 3600 * 1000 * 1000;  // a machine up 10 hours
  const uint64_t two_hours_ago = now - 2ull * 3600 * 1000 * 1000;
  const uint32_t here = PidNamespace();
  ASSERT_NE(here, 0u);
  const int32_t gone = GonePid();
  unlink(path.c_str());
  EXPECT_FALSE(ArbiterPreviousIsStale(path.c_str(), now)) << "none there";
  struct Case {
    const char* what;
    uint64_t last_us;
    int32_t pid;
    uint32_t pidns;
    bool stale;
  } cases[] = {
      {"used a minute ago, its process gone (its end maybe unread)", now - 60'000'000, gone, here,
       false},
      {"idle two hours, its process running here", two_hours_ago, getpid(), here, false},
      {"idle two hours, its process gone", two_hours_ago, gone, here, true},
      {"idle two hours, in another pid namespace", two_hours_ago, getpid(), here + 1, true},
      {"used before this boot (a pid of then running now is another process)", now + 1000, getpid(),
       here, true},
  };
  for (const Case& c : cases) {
    Version5ArbiterFile old(path);
    old.Put(5, 0, 77, 1000, now - 1000, getpid(), here);  // a slot that keeps it...
    old.Put(5, 0, 0, 0, 0, 0, 0);                         // ...freed: only the case's decides
    old.Put(9, 63, 77, 1000, c.last_us, c.pid, c.pidns);
    EXPECT_EQ(ArbiterPreviousIsStale(path.c_str(), now), c.stale) << c.what;
    old.Put(0, 0, 78, 1000, now - 1000, getpid(), here);  // and a job in use beside it
    EXPECT_FALSE(ArbiterPreviousIsStale(path.c_str(), now)) << c.what << ", beside one in use";
  }
  {
    // A job its maker still runs (a container's, idle two hours in its own pid namespace): kept,
    // whatever its times say; one it runs no more is judged as before.
    Version5ArbiterFile old(path);
    old.Put(9, 63, 77, 1000, two_hours_ago, getpid(), here + 1);
    const uint64_t runs[] = {5, 77}, other[] = {78};
    EXPECT_FALSE(ArbiterPreviousIsStale(path.c_str(), now, runs, 2)) << "its maker runs job 77";
    EXPECT_TRUE(ArbiterPreviousIsStale(path.c_str(), now, other, 1)) << "it runs 78 alone";
    EXPECT_TRUE(ArbiterPreviousIsStale(path.c_str(), now)) << "held jobs not said";
  }
  {
    Version5ArbiterFile empty(path);
    EXPECT_TRUE(ArbiterPreviousIsStale(path.c_str(), now)) << "no job in it";
  }
  std::ofstream(path, std::ios::trunc) << "not an arbiter";
  EXPECT_TRUE(ArbiterPreviousIsStale(path.c_str(), now)) << "nothing readable in it";
  unlink(path.c_str());

  // A maker removes it when it is stale, on the machine's own clock.
  const std::string arbiter = TempFile("stale-maker");
  char previous[4200];
  ArbiterPreviousPath(arbiter.c_str(), previous, sizeof previous);
  unlink(arbiter.c_str());
  char err[256] = "";
  ASSERT_TRUE(CreateArbiterFile(arbiter.c_str(), err, sizeof err)) << err;
  {
    Version5ArbiterFile old(previous);
    old.Put(3, 1, 79, 1000, Arbiter::NowMicros(), gone, here);
    ASSERT_TRUE(CreateArbiterFile(arbiter.c_str(), err, sizeof err)) << err;
    EXPECT_EQ(access(previous, F_OK), 0) << "its job ended just now: its use may be unread";
    old.Put(3, 1, 79, 1000, Arbiter::NowMicros() + 1000 * 1000 * 1000, gone, here);
    ASSERT_TRUE(CreateArbiterFile(arbiter.c_str(), err, sizeof err)) << err;
    EXPECT_NE(access(previous, F_OK), 0) << "left from before this boot: removed";
  }
  unlink(arbiter.c_str());
}

TEST(Arbiter, AloneAJobHoldsTheGpuAndIsChargedForIt) {
  std::string path = TempFile("alone");
  unlink(path.c_str());
  char err[256] = "";
  ArbiterConfig c;
  c.slice_us = 1000;
  std::unique_ptr<Arbiter> a(Arbiter::Attach(path.c_str(), 42, c, err, sizeof err));
  ASSERT_NE(a, nullptr) << err;
  const uint64_t t0 = Arbiter::NowMicros();
  a->BeforeLaunch(3, nullptr);  // the first launch takes the lease
  const uint64_t granted_by = Arbiter::NowMicros();
  uint64_t last = granted_by;
  // The time it was active: between launches, up to the idle allowance (a loop descheduled on a
  // busy machine is not using the GPU, and is not charged for it).
  uint64_t active = 0;
  while (Arbiter::NowMicros() < t0 + 20000) {  // never waits: alone
    const uint64_t now = Arbiter::NowMicros();
    active += std::min<uint64_t>(now - last, c.idle_us);
    last = now;
    a->BeforeLaunch(3, nullptr);
  }
  const uint64_t t1 = Arbiter::NowMicros();
  const ArbiterGpu& g = a->data()->gpus[3];
  const int slot = a->Slot(3);
  ASSERT_GE(slot, 0);
  EXPECT_EQ(g.jobs[slot].key.load(), 42u);
  EXPECT_EQ(g.jobs[slot].waits.load(), 1u) << "only the first launch looked for the lease";
  // Renewed every slice and charged for each: all the time it was active but the slice still open
  // at its last launch, and never more than the time it held the GPU. Measured, not assumed to be
  // 20 ms: a busy machine may deschedule the loop.
  const uint64_t busy = g.jobs[slot].busy_us.load();
  EXPECT_GE(busy + c.slice_us, active);
  EXPECT_LE(busy, t1 - t0);
  // (Not a floor in microseconds: on a loaded machine the loop may run a few of its 20 ms.)
  EXPECT_GT(busy, 0u) << "charged for the time it held the GPU";
  EXPECT_EQ(a->data()->gpus[0].handovers.load(), 0u) << "other GPUs untouched";
  // The server reads the same count from the file without joining (its history of the job).
  EXPECT_EQ(ArbiterBusyMicros(path.c_str(), 3, 42), busy);
  EXPECT_EQ(ArbiterBusyMicros(path.c_str(), 0, 42), 0u) << "nothing on another GPU";
  EXPECT_EQ(ArbiterBusyMicros(path.c_str(), 3, 43), 0u) << "nor for another job";
  EXPECT_EQ(ArbiterBusyMicros(path.c_str(), kArbiterGpus, 42), 0u);
  const int both[] = {0, 3, kArbiterGpus};
  EXPECT_EQ(ArbiterBusyMicros(path.c_str(), both, 3, 42), busy) << "summed over GPUs";
  EXPECT_EQ(ArbiterBusyMicros((path + ".missing").c_str(), 3, 42), 0u);
  unlink(path.c_str());
}

TEST(Arbiter, AJobsUtilizationIsItsBusyTimeOverTheLastWindow) {
  auto d = std::make_unique<ArbiterData>();
  ArbiterJob& j = d->gpus[2].jobs[5];
  j.key.store(7);
  const uint64_t t0 = 50'000'000;
  // A window opened at t0 with busy_us 10 s then; the window before it was 40% busy.
  j.window_start_us.store(t0);
  j.window_busy_us.store(10'000'000);
  j.last_window_permille.store(400);
  // A quarter of a window later, 200 ms of it busy: 200 ms + 40% of the 750 ms before = 50%.
  j.busy_us.store(10'200'000);
  EXPECT_EQ(JobUtilizationPermille(d.get(), 2, 7, t0 + 250'000), 500);
  // Idle since, and no window rolled (nothing charged): 200 ms over the 4 s the window is open.
  EXPECT_EQ(JobUtilizationPermille(d.get(), 2, 7, t0 + 4'000'000), 50);
  // A full window at work: 100%, and never more.
  j.busy_us.store(10'000'000 + kUtilizationWindowUs + 5);
  EXPECT_EQ(JobUtilizationPermille(d.get(), 2, 7, t0 + kUtilizationWindowUs), 1000);
  // Another job, another GPU, no data: no answer.
  EXPECT_EQ(JobUtilizationPermille(d.get(), 2, 8, t0), -1);
  EXPECT_EQ(JobUtilizationPermille(d.get(), 3, 7, t0), -1);
  EXPECT_EQ(JobUtilizationPermille(d.get(), kArbiterGpus, 7, t0), -1);
  EXPECT_EQ(JobUtilizationPermille(nullptr, 2, 7, t0), -1);
}

TEST(Arbiter, AJobsKeyIsWhatTheServerDerivesFromItsId) {
  EXPECT_EQ(ArbiterJobKey("17"), ArbiterJobKey("17"));
  EXPECT_NE(ArbiterJobKey("17"), ArbiterJobKey("71"));
  EXPECT_NE(ArbiterJobKey(""), 0u) << "0 is a free slot";
}

ArbiterConfig Fast() {
  ArbiterConfig c;
  c.slice_us = 20000;
  c.idle_us = 1000;
  return c;
}

// A child process of job `key` that takes GPU 0's lease (when `take`), enters a synchronize and
// then stops itself (SIGSTOP) or waits to be killed; returns once it is in there.
pid_t HolderInSync(const std::string& path, uint64_t key, bool take, bool stop) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t child = fork();
  if (child == 0) {
    char err[256];
    Arbiter* a = Arbiter::Attach(path.c_str(), key, Fast(), err, sizeof err);
    if (a == nullptr) _exit(1);
    if (take) a->BeforeLaunch(0, nullptr);
    a->EnterSync(0);
    if (write(fds[1], "x", 1) != 1) _exit(1);
    if (stop) raise(SIGSTOP);
    pause();
    _exit(0);
  }
  close(fds[1]);
  char x;
  EXPECT_EQ(read(fds[0], &x, 1), 1);
  close(fds[0]);
  return child;
}

uint64_t TakeTime(Arbiter& a) {
  const uint64_t t0 = Arbiter::NowMicros();
  a.BeforeLaunch(0, nullptr);
  return Arbiter::NowMicros() - t0;
}

TEST(Arbiter, AHolderKilledInsideASynchronizeLosesTheGpuWithinASlice) {
  const std::string path = TempFile("killed");
  unlink(path.c_str());
  pid_t holder = HolderInSync(path, 1, /*take=*/true, /*stop=*/false);
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  char err[256];
  std::unique_ptr<Arbiter> other(Arbiter::Attach(path.c_str(), 2, Fast(), err, sizeof err));
  ASSERT_NE(other, nullptr) << err;
  // Not after its slice plus the 100 ms a live holder gets to drain its work.
  EXPECT_LT(TakeTime(*other), Fast().slice_us);
  unlink(path.c_str());
}

// A process of the holding job that is not the one the arbiter recorded, killed inside a
// synchronize, gives back its count: the holder is idle again, the next job takes the GPU within a
// slice (it waited out the 100 ms limit at every slice before), and the holder is not charged the
// dead process's time.
TEST(Arbiter, AnotherProcessOfTheHolderKilledInsideASynchronizeLeavesNoCount) {
  const std::string path = TempFile("killed-other");
  unlink(path.c_str());
  char err[256];
  std::unique_ptr<Arbiter> recorded(Arbiter::Attach(path.c_str(), 7, Fast(), err, sizeof err));
  ASSERT_NE(recorded, nullptr) << err;
  recorded->BeforeLaunch(0, nullptr);  // holds GPU 0, and is the pid the slot names
  const int slot = recorded->Slot(0);
  pid_t worker = HolderInSync(path, 7, /*take=*/false, /*stop=*/false);
  ArbiterJob& job = recorded->data()->gpus[0].jobs[slot];
  ASSERT_EQ(job.in_sync.load(), 1);
  ASSERT_EQ(job.pid.load(), getpid()) << "the worker is not the recorded process";
  kill(worker, SIGKILL);
  waitpid(worker, nullptr, 0);
  std::unique_ptr<Arbiter> other(Arbiter::Attach(path.c_str(), 2, Fast(), err, sizeof err));
  ASSERT_NE(other, nullptr) << err;
  EXPECT_LT(TakeTime(*other), Fast().slice_us);
  EXPECT_EQ(job.in_sync.load(), 0);
  for (const auto& e : job.sync_procs) EXPECT_EQ(e.load(), 0u);
  unlink(path.c_str());
}

// The same for a job of many processes (an inference server's 16 workers): each killed in there is
// told (it leaked the count of every process beyond the fourth before, and the holder looked busy
// until the 100 ms limit at every slice).
TEST(Arbiter, SixteenProcessesOfTheHolderKilledInsideASynchronizeLeaveNoCount) {
  const std::string path = TempFile("killed-many");
  unlink(path.c_str());
  char err[256];
  std::unique_ptr<Arbiter> recorded(Arbiter::Attach(path.c_str(), 7, Fast(), err, sizeof err));
  ASSERT_NE(recorded, nullptr) << err;
  recorded->BeforeLaunch(0, nullptr);
  const int slot = recorded->Slot(0);
  ArbiterJob& job = recorded->data()->gpus[0].jobs[slot];
  std::vector<pid_t> workers;
  for (int i = 0; i < 16; ++i) workers.push_back(HolderInSync(path, 7, false, false));
  ASSERT_EQ(job.in_sync.load(), 16);
  for (pid_t w : workers) kill(w, SIGKILL), waitpid(w, nullptr, 0);
  std::unique_ptr<Arbiter> other(Arbiter::Attach(path.c_str(), 2, Fast(), err, sizeof err));
  ASSERT_NE(other, nullptr) << err;
  EXPECT_LT(TakeTime(*other), Fast().slice_us);
  EXPECT_EQ(job.in_sync.load(), 0);
  unlink(path.c_str());
}

// Threads of one process in a synchronize are one entry with their count; leaving takes them off.
TEST(Arbiter, ThreadsInASynchronizeAreCountedPerProcess) {
  const std::string path = TempFile("threads-sync");
  unlink(path.c_str());
  char err[256];
  std::unique_ptr<Arbiter> a(Arbiter::Attach(path.c_str(), 9, Fast(), err, sizeof err));
  ASSERT_NE(a, nullptr) << err;
  a->EnterSync(0);
  a->EnterSync(0);
  const ArbiterJob& j = a->data()->gpus[0].jobs[a->Slot(0)];
  EXPECT_EQ(j.in_sync.load(), 2);
  EXPECT_EQ(j.sync_procs[0].load(), (uint64_t{2} << 32) | static_cast<uint32_t>(getpid()));
  a->LeaveSync(0);
  EXPECT_EQ(j.sync_procs[0].load(), (uint64_t{1} << 32) | static_cast<uint32_t>(getpid()));
  a->LeaveSync(0);
  EXPECT_EQ(j.in_sync.load(), 0);
  EXPECT_EQ(j.sync_procs[0].load(), 0u);
  unlink(path.c_str());
}

TEST(Arbiter, AStoppedHolderLosesTheGpuWithinASlice) {
  const std::string path = TempFile("stopped");
  unlink(path.c_str());
  pid_t holder = HolderInSync(path, 1, /*take=*/true, /*stop=*/true);
  int status = 0;
  ASSERT_EQ(waitpid(holder, &status, WUNTRACED), holder);
  ASSERT_TRUE(WIFSTOPPED(status));
  char err[256];
  std::unique_ptr<Arbiter> other(Arbiter::Attach(path.c_str(), 2, Fast(), err, sizeof err));
  ASSERT_NE(other, nullptr) << err;
  EXPECT_LT(TakeTime(*other), Fast().slice_us);
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  unlink(path.c_str());
}

TEST(Arbiter, ARestartedProcessOfAJobStartsWithoutTheDeadOnesSynchronize) {
  const std::string path = TempFile("restart");
  unlink(path.c_str());
  pid_t first = HolderInSync(path, 7, /*take=*/false, /*stop=*/false);
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  char err[256];
  std::unique_ptr<Arbiter> again(Arbiter::Attach(path.c_str(), 7, Fast(), err, sizeof err));
  ASSERT_NE(again, nullptr) << err;
  const int slot = again->Slot(0);
  ASSERT_GE(slot, 0);
  EXPECT_EQ(again->data()->gpus[0].jobs[slot].in_sync.load(), 0);
  EXPECT_EQ(again->data()->gpus[0].jobs[slot].pid.load(), getpid());
  unlink(path.c_str());
}

TEST(Arbiter, IdleTimeIsNeverChargedAndBanksNoCredit) {
  const std::string path = TempFile("idle");
  unlink(path.c_str());
  char err[256];
  ArbiterConfig c = Fast();
  c.slice_us = 5000;
  std::unique_ptr<Arbiter> a(Arbiter::Attach(path.c_str(), 1, c, err, sizeof err));
  std::unique_ptr<Arbiter> b(Arbiter::Attach(path.c_str(), 2, c, err, sizeof err));
  ASSERT_TRUE(a && b) << err;
  ArbiterGpu& g = a->data()->gpus[0];
  // a takes the GPU and goes idle for 300 ms holding it; b takes over.
  a->BeforeLaunch(0, nullptr);
  usleep(300000);
  b->BeforeLaunch(0, nullptr);
  const ArbiterJob& ja = g.jobs[a->Slot(0)];
  EXPECT_LT(ja.busy_us.load(), 2 * c.idle_us) << "charged its idle time";
  // Alone on GPU 1, idle while holding, then launching again: not charged the idle either.
  a->BeforeLaunch(1, nullptr);
  usleep(300000);
  a->BeforeLaunch(1, nullptr);
  EXPECT_LT(a->data()->gpus[1].jobs[a->Slot(1)].busy_us.load(), 2 * c.idle_us);
  // b computes (until it has 20 ms of GPU time: on a loaded machine its thread is not always
  // on a CPU, and time off it is idle, not charged); a, back, starts level with it, not behind.
  const ArbiterJob& jb = g.jobs[b->Slot(0)];
  const uint64_t t0 = Arbiter::NowMicros();
  while (jb.vtime.load() <= 20000 && Arbiter::NowMicros() < t0 + 10'000'000)
    b->BeforeLaunch(0, nullptr);
  const uint64_t b_vtime = jb.vtime.load();
  ASSERT_GT(b_vtime, 20000u);
  a->BeforeLaunch(0, nullptr);
  EXPECT_GE(ja.vtime.load(), b_vtime);
  unlink(path.c_str());
}

// Two processes of one job (two attachments of its key) waiting at once for the GPU another job
// holds: the job was held back for as long as they waited, counted once; what it then would have
// used is its GPU time over the rest of its run.
TEST(Arbiter, AJobIsHeldBackForAsLongAsItsLaunchesWaitedCountedOnce) {
  const std::string path = TempFile("held");
  unlink(path.c_str());
  char err[256];
  const ArbiterConfig c = Fast();
  std::unique_ptr<Arbiter> holder(Arbiter::Attach(path.c_str(), 1, c, err, sizeof err));
  std::unique_ptr<Arbiter> p1(Arbiter::Attach(path.c_str(), 2, c, err, sizeof err));
  std::unique_ptr<Arbiter> p2(Arbiter::Attach(path.c_str(), 2, c, err, sizeof err));
  ASSERT_TRUE(holder && p1 && p2) << err;
  holder->BeforeLaunch(0, nullptr);
  holder->EnterSync(0);  // waiting for its own work: not idle, it keeps the GPU
  // Each process: when it began to wait, and when it got the GPU.
  std::atomic<uint64_t> began[2] = {0, 0}, got[2] = {0, 0};
  auto wait = [&](Arbiter* a, int i) {
    began[i].store(Arbiter::NowMicros());
    a->BeforeLaunch(0, nullptr);
    got[i].store(Arbiter::NowMicros());
  };
  std::thread w1(wait, p1.get(), 0);
  std::thread w2(wait, p2.get(), 1);
  const int gpu = 0;
  // Both waiting, together for 30 ms (polled; the holder is overtaken as stuck only after 100 ms).
  const uint64_t deadline = Arbiter::NowMicros() + 10'000'000;
  while ((began[0].load() == 0 || began[1].load() == 0 ||
          Arbiter::NowMicros() < std::max(began[0].load(), began[1].load()) + 30000) &&
         Arbiter::NowMicros() < deadline) {
    usleep(1000);
  }
  holder->LeaveSync(0);  // then idle: the waiters take the GPU
  w1.join();
  w2.join();
  const uint64_t first = std::min(began[0].load(), began[1].load());
  const uint64_t last = std::max(began[0].load(), began[1].load());
  const uint64_t taken = std::min(got[0].load(), got[1].load());
  const uint64_t both_done = std::max(got[0].load(), got[1].load());
  const ArbiterUse use = ArbiterJobUse(path.c_str(), &gpu, 1, 2);
  // From the first wait until the GPU was taken, less the gaps between its polls (a few us each).
  EXPECT_GE(use.held_us + 2000, (taken - first) * 9 / 10) << "it waited as long as it was kept out";
  // Both waited together from the later start: counted twice, that stretch would pass the bound.
  ASSERT_GT(taken, last + 20000) << "the two processes waited together for at least 20 ms";
  EXPECT_LE(use.held_us, both_done - first) << "two processes waiting at once are held back once";
  EXPECT_EQ(ArbiterJobUse(path.c_str(), &gpu, 1, 1).held_us, 0u) << "the holder never waited";
  unlink(path.c_str());
}

// A gang on GPUs 0 and 1 takes GPU 0 and waits for 1, which another job holds: it is held back
// on GPU 1 only. GPU 0 was its own meanwhile (it is charged for it there, the cost of taking its
// GPUs together), so a wait counted there too would say it wanted twice the GPU time it was kept
// from.
TEST(Arbiter, AGangIsHeldBackOnlyOnTheGpusItWaitsFor) {
  const std::string path = TempFile("gang-held");
  unlink(path.c_str());
  char err[256];
  ArbiterConfig gc = Fast();
  gc.gang_mask = 0b11;
  std::unique_ptr<Arbiter> other(Arbiter::Attach(path.c_str(), 1, Fast(), err, sizeof err));
  std::unique_ptr<Arbiter> gang(Arbiter::Attach(path.c_str(), 2, gc, err, sizeof err));
  ASSERT_TRUE(other && gang) << err;
  other->BeforeLaunch(1, nullptr);
  other->EnterSync(1);  // waiting for its own work: it keeps GPU 1
  std::atomic<uint64_t> began = 0, got = 0;
  std::thread rank([&] {
    began.store(Arbiter::NowMicros());
    gang->BeforeLaunch(0, nullptr);
    got.store(Arbiter::NowMicros());
  });
  const ArbiterGpu& g0 = gang->data()->gpus[0];
  const uint64_t deadline = Arbiter::NowMicros() + 10'000'000;
  // The gang holds GPU 0 and has waited 30 ms for GPU 1 (polled).
  while ((began.load() == 0 || static_cast<int>(g0.lease.load() >> 48) - 1 != gang->Slot(0) ||
          Arbiter::NowMicros() < began.load() + 30000) &&
         Arbiter::NowMicros() < deadline) {
    usleep(1000);
  }
  ASSERT_EQ(got.load(), 0u) << "the gang launched while GPU 1 was another job's";
  other->LeaveSync(1);  // then idle: the gang takes GPU 1 and launches
  rank.join();
  const int gpu0 = 0, gpu1 = 1;
  const ArbiterUse on1 = ArbiterJobUse(path.c_str(), &gpu1, 1, 2);
  EXPECT_GE(on1.held_us + 2000, (got.load() - began.load()) * 9 / 10)
      << "held back on GPU 1 for as long as it waited for it";
  EXPECT_LE(on1.held_us, got.load() - began.load());
  EXPECT_EQ(ArbiterJobUse(path.c_str(), &gpu0, 1, 2).held_us, 0u)
      << "GPU 0 was the gang's while it waited: not held back there";
  unlink(path.c_str());
}

// What the drain of a bounded low-priority launch does in the test below: the high-priority job
// comes back and takes the GPU while the low one waits for its kernel in flight (once).
Arbiter* g_high = nullptr;
int g_high_takes = 0;
bool g_high_held = false;
void HighTakesTheGpuOnce() {
  if (g_high_takes++ != 0) return;
  g_high->BeforeLaunch(0, nullptr);
  g_high_held =
      (g_high->data()->gpus[0].lease.load() >> 48) - 1 == static_cast<uint64_t>(g_high->Slot(0));
}

TEST(Arbiter, ALowJobOutrankedWhileItDrainsDoesNotLaunchOnTheTakenGpu) {
  const std::string path = TempFile("outranked");
  unlink(path.c_str());
  char err[256];
  ArbiterConfig lc = Fast(), hc = Fast();
  lc.priority = 0;
  hc.priority = 10;
  std::unique_ptr<Arbiter> low(Arbiter::Attach(path.c_str(), 1, lc, err, sizeof err));
  std::unique_ptr<Arbiter> high(Arbiter::Attach(path.c_str(), 2, hc, err, sizeof err));
  ASSERT_TRUE(low && high) << err;
  g_high = high.get();
  const ArbiterGpu& g = low->data()->gpus[0];
  auto holder = [&] { return static_cast<int>(g.lease.load() >> 48) - 1; };
  // The high job used the GPU a moment ago, so the low one is bounded: before each launch it
  // drains its work in flight. High comes back in that drain (the slow path: low just took the GPU
  // from the idle high job): low's launch waits until high has gone idle again, then holds it.
  high->BeforeLaunch(0, nullptr);
  g_high_takes = 0, g_high_held = false;
  low->BeforeLaunch(0, HighTakesTheGpuOnce);
  EXPECT_TRUE(g_high_held) << "the high job did not take the GPU in the drain";
  EXPECT_EQ(g_high_takes, 2) << "drained, outranked, waited, took the GPU back and drained again";
  EXPECT_EQ(holder(), low->Slot(0)) << "launched while the higher-priority job held the GPU";
  // The same on the fast path: low holds its lease when high comes back in its drain.
  g_high_takes = 0, g_high_held = false;
  low->BeforeLaunch(0, HighTakesTheGpuOnce);
  EXPECT_TRUE(g_high_held);
  EXPECT_EQ(g_high_takes, 2);
  EXPECT_EQ(holder(), low->Slot(0)) << "launched while the higher-priority job held the GPU";
  g_high = nullptr;
  unlink(path.c_str());
}

TEST(Arbiter, RefusesAnotherFile) {
  std::string path = TempFile("bad");
  FILE* f = fopen(path.c_str(), "w");
  fputs("something else", f);
  fclose(f);
  char err[256] = "";
  EXPECT_EQ(Arbiter::Attach(path.c_str(), 1, ArbiterConfig{}, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("not a Tessera GPU arbiter file"), std::string::npos) << err;
  err[0] = 0;
  EXPECT_FALSE(CreateArbiterFile(path.c_str(), err, sizeof err));
  EXPECT_NE(std::string(err).find("not a Tessera GPU arbiter file"), std::string::npos) << err;
  unlink(path.c_str());
}

TEST(Arbiter, CreatedAheadForJobsToJoin) {
  std::string path = TempFile("ahead");
  unlink(path.c_str());
  char err[256] = "";
  ASSERT_TRUE(CreateArbiterFile(path.c_str(), err, sizeof err)) << err;
  ASSERT_TRUE(CreateArbiterFile(path.c_str(), err, sizeof err))
      << "an existing file is kept: " << err;
  std::unique_ptr<Arbiter> a(Arbiter::Attach(path.c_str(), 7, ArbiterConfig{}, err, sizeof err));
  ASSERT_NE(a, nullptr) << err;
  EXPECT_EQ(a->data()->gpus[0].jobs[0].key.load(), 0u) << "creating it joined nobody";
  a->BeforeLaunch(0, nullptr);
  EXPECT_EQ(a->data()->gpus[0].jobs[a->Slot(0)].key.load(), 7u);
  unlink(path.c_str());
}

// Revoking a user's access (the server renames a copy over the file): the jobs' processes follow
// the copy at their next launch past a slice, and a descriptor of the old file kept by the user
// whose access was removed reaches nothing they use - zeroing or truncating it changes no pacing
// and faults nobody.
TEST(Arbiter, AReplacedFileIsFollowedAndTheOldOnesDescriptorsReachNothing) {
  const std::string path = TempFile("replaced"), next = path + ".next";
  unlink(path.c_str());
  char err[256] = "";
  ArbiterConfig c;
  c.follow_us = 0;  // looks at every launch that waits
  // No slice ends while the test runs (its file copies take milliseconds on a loaded machine): the
  // GPU time read back is the copy's, not a charge for a slice that passed.
  c.slice_us = 60'000'000;
  c.idle_us = 60'000'000;
  std::unique_ptr<Arbiter> a(Arbiter::Attach(path.c_str(), 7, c, err, sizeof err));
  ASSERT_NE(a, nullptr) << err;
  a->BeforeLaunch(0, nullptr);
  const int slot = a->Slot(0);
  a->data()->gpus[0].jobs[slot].busy_us.store(1234);
  a->EnterSync(0);
  const int kept = open(path.c_str(), O_RDWR);  // opened while its user was allowed to
  ASSERT_GE(kept, 0);

  ASSERT_TRUE(CopyArbiterFile(path.c_str(), next.c_str(), err, sizeof err)) << err;
  EXPECT_FALSE(CopyArbiterFile(path.c_str(), next.c_str(), err, sizeof err)) << "never over one";
  auto copy = std::make_unique<ArbiterData>();
  ASSERT_TRUE(ReadSharedFile(next.c_str(), sizeof(ArbiterData), kArbiterMagic, kArbiterVersion,
                             copy.get(), sizeof(ArbiterData)));
  EXPECT_EQ(copy->gpus[0].jobs[slot].key.load(), 7u) << "the jobs keep their slots";
  EXPECT_EQ(copy->gpus[0].jobs[slot].busy_us.load(), 1234u) << "and their GPU time";
  EXPECT_EQ(copy->gpus[0].jobs[slot].in_sync.load(), 0) << "a synchronize stays in its file";
  struct stat st;
  ASSERT_EQ(stat(next.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(rename(next.c_str(), path.c_str()), 0);

  // The next launch past its slice maps the new file where the old one was.
  a->data()->gpus[0].lease.store(0);  // (in the old file)
  a->BeforeLaunch(0, nullptr);
  a->LeaveSync(0);
  ASSERT_TRUE(ReadSharedFile(path.c_str(), sizeof(ArbiterData), kArbiterMagic, kArbiterVersion,
                             copy.get(), sizeof(ArbiterData)));
  EXPECT_EQ(copy->gpus[0].lease.load() >> 48, static_cast<uint64_t>(slot + 1))
      << "the launch took the lease in the new file";
  EXPECT_EQ(copy->gpus[0].jobs[slot].in_sync.load(), 0) << "never below 0";

  // The kept descriptor: zeroed, then truncated. The job's process notices nothing.
  const std::string zeros(sizeof(ArbiterData), '\0');
  ASSERT_EQ(pwrite(kept, zeros.data(), zeros.size(), 0), static_cast<ssize_t>(zeros.size()));
  ASSERT_EQ(ftruncate(kept, 0), 0);
  close(kept);
  a->BeforeLaunch(0, nullptr);  // would fault (SIGBUS) on the truncated old file
  EXPECT_EQ(a->data()->magic.load(), kArbiterMagic);
  EXPECT_EQ(a->data()->gpus[0].jobs[a->Slot(0)].key.load(), 7u);
  EXPECT_EQ(a->data()->gpus[0].jobs[a->Slot(0)].busy_us.load(), 1234u);
  // A job joining now meets it there.
  std::unique_ptr<Arbiter> b(Arbiter::Attach(path.c_str(), 8, c, err, sizeof err));
  ASSERT_NE(b, nullptr) << err;
  EXPECT_EQ(b->data()->gpus[0].lease.load() >> 48, static_cast<uint64_t>(slot + 1));

  // What is renamed over it next and is no arbiter is not followed: the mapping stays.
  FILE* f = fopen(next.c_str(), "w");
  fputs("something else", f);
  fclose(f);
  ASSERT_EQ(rename(next.c_str(), path.c_str()), 0);
  EXPECT_FALSE(a->FollowIfReplaced(Arbiter::NowMicros()));
  EXPECT_EQ(a->data()->magic.load(), kArbiterMagic);
  EXPECT_EQ(a->data()->gpus[0].jobs[a->Slot(0)].key.load(), 7u);
  unlink(path.c_str());
}

TEST(Arbiter, ACopyOfGarbageIsAFreshArbiter) {
  const std::string path = TempFile("garbage"), next = path + ".next";
  FILE* f = fopen(path.c_str(), "w");
  fputs("something else", f);
  fclose(f);
  unlink(next.c_str());
  char err[256] = "";
  ASSERT_TRUE(CopyArbiterFile(path.c_str(), next.c_str(), err, sizeof err)) << err;
  std::unique_ptr<Arbiter> a(Arbiter::Attach(next.c_str(), 7, ArbiterConfig{}, err, sizeof err));
  ASSERT_NE(a, nullptr) << err;
  EXPECT_EQ(a->data()->gpus[0].jobs[0].key.load(), 0u);
  unlink(path.c_str());
  unlink(next.c_str());
}

}  // namespace
}  // namespace tessera::shim
