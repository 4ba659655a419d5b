// The standalone server in-process on a simulated DGX H100, state on /dev/shm (the database's
// fsyncs are the disk's business, not ours): submit-to-running latency of a job that fits (median,
// p99), API read throughput on the unix socket (GET /v1/jobs/1, keep-alive, 1 and 2 client
// threads), the hand-over of all GPUs from a job that ends to one that waits for them, one
// scheduling pass over 10,000 queued jobs that cannot start (identical, and 2,001 distinct shapes)
// with the latency of reading a queued job meanwhile, and the latency of API reads while 200 jobs
// are submitted and started at once.
//   build/bench/bench/server_bench            everything
//   build/bench/bench/server_bench --burst    only the reads during a burst of starts
//   build/bench/bench/server_bench --submit [DIR]   only durable submits from 8 clients, state in
//                                                   DIR (default /var/tmp; a disk, not a tmpfs)
//   build/bench/bench/server_bench --queued [N]     only the passes over N (10,000) queued jobs,
//                                                   with backfill reservations and without
//   build/bench/bench/server_bench --submit-queued [DIR]  durable submits from 8 clients with an
//                                                   empty queue and with 20,000 jobs waiting (for
//                                                   GPUs, held, or for a job to end)
//   build/bench/bench/server_bench --ends [DIR]     only the reads while 200 jobs end, state
//                                                   in DIR (default /var/tmp), fsync +5 ms
//   build/bench/bench/server_bench --changes [DIR]  only the reads while 4 clients hold, release,
//                                                   reprioritize and cancel 200 queued jobs,
//                                                   state in DIR (default /var/tmp), fsync +5 ms
//   build/bench/bench/server_bench --array [DIR]    a 10,000-task array against 10,000 jobs:
//                                                   storing, database growth, scheduling pass
//   build/bench/bench/server_bench --acct-jobs [N]  a page of N (1,000) ended jobs listed without
//                                                   and with each job's efficiency (issue 58)
//   build/bench/bench/server_bench --listing        greedy readers (issue 51): 300 held jobs of
//                                                   0.9 MB and 30,000 small ones listed in full by
//                                                   8 readers at once: the server's peak memory,
//                                                   a listing's time, small submits meanwhile
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "sqlite3.h"
#include "tessera/net/http.h"
#include "tessera/server/server.h"
#include "tessera/server/store.h"

using nlohmann::json;
using tessera::net::HttpClient;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string Job(const std::string& cmd, int gpus, int priority = 0, bool preemptible = true) {
  return json{{"command", {"/bin/sh", "-c", cmd}},
              {"resources", {{"gpus", gpus}}},
              {"priority", priority},
              {"preemptible", preemptible}}
      .dump();
}

// A reader on its own connection timing GETs of `paths` in turn (by default /v1/jobs/1 and
// /v1/info, both need the server's state) until Stop, which prints what it saw during `what`.
class Reader {
 public:
  explicit Reader(const std::string& socket,
                  std::vector<std::string> paths = {"/v1/jobs/1", "/v1/info"})
      : thread_([this, socket, paths = std::move(paths)] {
          HttpClient mine(socket);
          for (size_t i = 0; !stop_; ++i) {
            auto t0 = Clock::now();
            (void)mine.Send("GET", paths[i % paths.size()]);
            lat_.push_back(Since(t0) * 1000);
          }
        }) {}
  void Stop(const std::string& what, double seconds) {
    stop_ = true;
    thread_.join();
    std::sort(lat_.begin(), lat_.end());
    if (lat_.empty()) lat_.push_back(0);
    printf("API reads %s (%.2f s, %zu reads): p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
           what.c_str(), seconds, lat_.size(), lat_[lat_.size() / 2], lat_[lat_.size() * 99 / 100],
           lat_.back());
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<double> lat_;
  std::thread thread_;
};

// Reads while 200 jobs without GPUs are submitted at once, so that the loop starts them in one
// burst of forks and execs.
void ReadsDuringBurst(const std::string& socket) {
  HttpClient c(socket);
  (void)c.Send("POST", "/v1/jobs", json{{"command", {"true"}}}.dump());
  Reader reader(socket);
  std::vector<int64_t> ids;
  auto t0 = Clock::now();
  for (int i = 0; i < 200; ++i) {
    ids.push_back(json::parse(
        c.Send("POST", "/v1/jobs", json{{"command", {"sleep", "0.5"}}}.dump())->body)["id"]);
  }
  // Until the last of them has started.
  for (;;) {
    std::string st =
        json::parse(c.Send("GET", "/v1/jobs/" + std::to_string(ids.back()))->body)["state"];
    if (st != "queued") break;
  }
  reader.Stop("during a burst of 200 job starts", Since(t0));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // let them end
}

// A server on a simulated DGX H100 with its socket and state in `dir`, run by whoever runs the
// benchmark (root too), without containers (this machine's podman and /var/run/cdi are left alone).
tessera::server::ServerConfig BenchConfig(const std::string& dir) {
  tessera::server::ServerConfig config;
  config.socket = dir + "/s.sock";
  config.state_dir = dir + "/state";
  config.simulate = "dgx-h100";
  config.allow_root_jobs = true;
  config.podman = "";
  return config;
}

// A SQLite VFS that is the default one plus a fixed delay in every sync: a disk whose flush takes
// that long (a SATA SSD without power-loss protection, a network volume), on any machine.
std::atomic<int> g_sync_delay_us{0};
sqlite3_vfs g_slow_vfs;
sqlite3_vfs* g_real_vfs = nullptr;
// Each kind of file SQLite opens (database, WAL...) may have its own methods: a slow copy of each,
// and the real one behind each copy.
std::mutex g_methods_mu;
std::map<const sqlite3_io_methods*, std::unique_ptr<sqlite3_io_methods>> g_slow_of;
std::map<const sqlite3_io_methods*, const sqlite3_io_methods*> g_real_of;

int SlowSync(sqlite3_file* f, int flags) {
  if (int us = g_sync_delay_us.load(); us > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  const sqlite3_io_methods* real;
  {
    std::lock_guard lock(g_methods_mu);
    real = g_real_of.at(f->pMethods);
  }
  return real->xSync(f, flags);
}

int SlowOpen(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out) {
  int rc = g_real_vfs->xOpen(g_real_vfs, name, f, flags, out);
  if (rc == SQLITE_OK && f->pMethods) {
    std::lock_guard lock(g_methods_mu);
    auto& slow = g_slow_of[f->pMethods];
    if (!slow) {
      slow = std::make_unique<sqlite3_io_methods>(*f->pMethods);
      slow->xSync = SlowSync;
      g_real_of[slow.get()] = f->pMethods;
    }
    f->pMethods = slow.get();
  }
  return rc;
}

void InstallSlowSyncVfs() {
  g_real_vfs = sqlite3_vfs_find(nullptr);
  g_slow_vfs = *g_real_vfs;
  g_slow_vfs.zName = "slow-sync";
  g_slow_vfs.xOpen = SlowOpen;
  sqlite3_vfs_register(&g_slow_vfs, 1);
}

// Durable submissions from 8 clients at once (each its own connection and thread), with the state
// on disk (`disk_dir`: fsync is the point here): jobs that queue behind one holding every GPU.
// Commits grouped (at most `max_batch` jobs each) or, with 1, one per submission. `queued`: jobs
// submitted the same way first (one by one, distinct shapes), all waiting while it is measured:
// for GPUs (`waiting` "gpus"), held ("held"), or for the job holding every GPU to end ("after").
void SubmitThroughput(const std::string& disk_dir, size_t max_batch, int sync_delay_us,
                      int queued = 0, const std::string& waiting = "gpus") {
  std::filesystem::remove_all(disk_dir);
  std::filesystem::create_directories(disk_dir + "/state");
  g_sync_delay_us = sync_delay_us;
  auto store = tessera::server::Store::Open(disk_dir + "/state/tessera.db");
  if (!store.ok()) {
    fprintf(stderr, "server_bench: %s\n", std::string(store.status().message()).c_str());
    return;
  }
  (*store)->set_max_batch(max_batch);
  tessera::server::ServerDeps deps;
  deps.store = std::move(*store);
  tessera::server::ServerConfig config = BenchConfig(disk_dir);
  config.confinement = "off";
  config.max_queued_jobs_per_user = 100000;  // one user submits them all
  auto server = tessera::server::Server::Create(config, std::move(deps));
  if (!server.ok() || !(*server)->Start().ok()) {
    fprintf(stderr, "server_bench: cannot start the server on %s\n", disk_dir.c_str());
    return;
  }
  HttpClient c(config.socket);
  int64_t blocker =
      json::parse(c.Send("POST", "/v1/jobs", Job("sleep 600", 8, 1000, false))->body)["id"];
  constexpr int kClients = 8, kEach = 250;
  std::vector<std::vector<double>> lat(kClients);
  std::atomic<int> failed{0};
  // Each client submits `each` jobs (`prefix` in their idempotency keys), latencies kept when
  // `keep`.
  auto submit = [&](int each, const char* prefix, bool keep) {
    std::vector<std::thread> ts;
    for (int t = 0; t < kClients; ++t) {
      ts.emplace_back([&, t] {
        HttpClient mine(config.socket);
        for (int i = 0; i < each; ++i) {
          auto s0 = Clock::now();
          // Distinct shapes (memory amounts) for the queued ones: no memo covers them all.
          json job = json::parse(Job("true", 1));
          if (!keep) job["resources"]["memory"] = fmt::format("{}MiB", 64 + i % 2000);
          if (!keep && waiting == "held") job["hold"] = true;
          if (!keep && waiting == "after") job["after"] = {fmt::format("ok:{}", blocker)};
          auto r = mine.Send("POST", "/v1/jobs", job.dump(), fmt::format("{}-{}-{}", prefix, t, i));
          if (!r.ok() || r->status != 201) ++failed;
          if (keep) lat[t].push_back(Since(s0) * 1000);
        }
      });
    }
    for (auto& t : ts) t.join();
  };
  if (queued > 0) {
    auto q0 = Clock::now();
    submit(queued / kClients, "queued", false);
    printf("  %d jobs queued first in %.1f s\n", queued, Since(q0));
  }
  auto t0 = Clock::now();
  submit(kEach, "bench", true);
  const double took = Since(t0);
  std::vector<double> all;
  for (const auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  printf(
      "durable submits, %d clients x %d, %s, sync %s, %d queued%s: %.0f submits/s, p50 %.2f ms, "
      "p99 %.2f ms, max %.2f ms, %d failed\n",
      kClients, kEach, max_batch > 1 ? "grouped commits" : "one commit each  ",
      sync_delay_us > 0 ? fmt::format("+{} ms", sync_delay_us / 1000).c_str() : "as is ", queued,
      queued == 0 ? "" : (" (" + waiting + ")").c_str(), all.size() / took, all[all.size() / 2],
      all[all.size() * 99 / 100], all.back(), failed.load());
  // Jobs outlive a stopped server: the blocker is stopped first.
  (void)c.Send("POST", "/v1/jobs/" + std::to_string(blocker) + "/cancel");
  for (auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
    auto r = c.Send("GET", "/v1/jobs/" + std::to_string(blocker));
    if (r.ok() && json::parse(r->body, nullptr, false).value("state", "") == "cancelled") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  (*server)->Stop();
  std::filesystem::remove_all(disk_dir);
}

double PassSeconds(HttpClient& c);

// 10,000 tasks in one array against 10,000 jobs submitted one by one (8 clients, grouped commits),
// state on disk (`disk_dir`), each with an environment like a shell's (40 variables, ~2.4 KB): the
// time to store them, what the database grew by, one scheduling pass with them all queued (none
// fits: a job holds a GPU and each asks for all 8), the same with a %8 limit, and the cancel of the
// whole array.
void ArrayBench(const std::string& disk_dir) {
  std::filesystem::remove_all(disk_dir);
  std::filesystem::create_directories(disk_dir + "/state");
  tessera::server::ServerConfig config = BenchConfig(disk_dir);
  config.confinement = "off";
  auto server = tessera::server::Server::Create(config);
  if (!server.ok() || !(*server)->Start().ok()) {
    fprintf(stderr, "server_bench: cannot start the server on %s\n", disk_dir.c_str());
    return;
  }
  HttpClient c(config.socket);
  const std::string db = config.state_dir + "/tessera.db";
  // The database's size with its WAL checkpointed into it (from a connection of our own).
  auto bytes = [&] {
    sqlite3* h = nullptr;
    if (sqlite3_open(db.c_str(), &h) == SQLITE_OK)
      sqlite3_exec(h, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
    sqlite3_close(h);
    std::error_code ec;
    return static_cast<double>(std::filesystem::file_size(db, ec));
  };
  json env = json::object();
  for (int i = 0; i < 40; ++i)
    env[fmt::format("VARIABLE_{:02}", i)] = std::string(45, static_cast<char>('a' + i % 26));
  auto spec = [&](const std::string& array) {
    json j = {{"command", {"python", "sweep.py"}}, {"env", env}, {"resources", {{"gpus", 8}}}};
    if (!array.empty()) j["array"] = array;
    return j.dump();
  };
  auto pass_ms = [&] {
    // One more submission: one more pass over everything queued, timed by the server.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    int64_t probe = json::parse(c.Send("POST", "/v1/jobs", Job("true", 8))->body)["id"];
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    (void)c.Send("POST", "/v1/jobs/" + std::to_string(probe) + "/cancel");
    return PassSeconds(c) * 1000;
  };
  (void)c.Send("POST", "/v1/jobs", Job("sleep 600", 1, 1000, false));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (const char* range : {"0-9999", "0-9999%8"}) {
    const double before = bytes();
    auto t0 = Clock::now();
    auto r = c.Send("POST", "/v1/jobs", spec(range));
    const double took = Since(t0);
    if (!r.ok() || r->status != 201) {
      fprintf(stderr, "server_bench: array refused: %s\n", r.ok() ? r->body.c_str() : "no answer");
      break;
    }
    const double grown = bytes() - before;
    const int64_t id = json::parse(r->body)["id"];
    const double pass = pass_ms();
    t0 = Clock::now();
    (void)c.Send("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
    printf(
        "array of 10,000 tasks (--array %s): stored in %.1f ms, database +%.2f MiB; scheduling "
        "pass with them queued %.1f ms; cancel of the whole array %.1f ms\n",
        range, took * 1000, grown / (1 << 20), pass, Since(t0) * 1000);
  }
  {
    const double before = bytes();
    auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < 8; ++t) {
      ts.emplace_back([&] {
        HttpClient mine(config.socket);
        for (int i = 0; i < 1250; ++i) (void)mine.Send("POST", "/v1/jobs", spec(""));
      });
    }
    for (auto& t : ts) t.join();
    const double took = Since(t0);
    const double grown = bytes() - before;
    printf(
        "10,000 jobs submitted one by one (8 clients): stored in %.1f ms, database +%.2f MiB; "
        "scheduling pass with them queued %.1f ms\n",
        took * 1000, grown / (1 << 20), pass_ms());
  }
  (void)c.Send("POST", "/v1/jobs/1/cancel");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (*server)->Stop();
  std::filesystem::remove_all(disk_dir);
}

// This process's resident memory now and at its peak since the last ResetPeak (kB).
int64_t StatusKb(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t v = -1;
  while (fgets(line, sizeof line, f) != nullptr) {
    if (strncmp(line, key, strlen(key)) == 0) v = std::atoll(line + strlen(key));
  }
  fclose(f);
  return v;
}
void ResetPeak() {
  FILE* f = fopen("/proc/self/clear_refs", "w");
  if (f != nullptr) {
    fputs("5", f);
    fclose(f);
  }
}

// Issue 51's greedy readers: every job listed, page by page as the CLI does, by 8 readers at once,
// while one client submits small jobs. What the server (this process) held at most beyond what
// it held before, a full listing's time, and the submits' latency with and without the readers.
void ListingBench(const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/state");
  tessera::server::ServerConfig config = BenchConfig(dir);
  config.confinement = "off";
  config.max_queued_jobs_per_user = 100000;
  config.max_queued_bytes_per_user = uint64_t{1} << 30;  // the listing, not the cap, measured here
  auto server = tessera::server::Server::Create(config);
  if (!server.ok() || !(*server)->Start().ok()) {
    fprintf(stderr, "server_bench: cannot start the server on %s\n", dir.c_str());
    return;
  }
  HttpClient c(config.socket);
  auto list_all = [&](HttpClient& h, size_t* bytes) {
    int64_t before = 0;
    size_t jobs = 0;
    for (;;) {
      auto r = h.Send("GET", "/v1/jobs" + (before ? "?before=" + std::to_string(before) : ""));
      if (!r.ok() || r->status != 200) break;
      *bytes += r->body.size();
      json page = json::parse(r->body);
      jobs += page["jobs"].size();
      if (!page.value("more", false)) break;
      before = page["next_before"];
    }
    return jobs;
  };
  auto submit_p50 = [&](int n) {
    std::vector<double> ms;
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      auto r = c.Send("POST", "/v1/jobs", json{{"command", {"true"}}, {"hold", true}}.dump());
      ms.push_back(Since(t0) * 1000);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  auto round = [&](const std::string& what) {
    const double quiet = submit_p50(50);
    const int64_t rss = StatusKb("VmRSS:");
    ResetPeak();
    std::atomic<bool> done{false};
    std::vector<double> listing_s;
    std::mutex mu;
    size_t listed = 0, bytes = 0;
    std::vector<std::thread> readers;
    for (int t = 0; t < 8; ++t) {
      readers.emplace_back([&] {
        HttpClient mine(config.socket);
        for (int i = 0; i < 3; ++i) {
          size_t b = 0;
          auto t0 = Clock::now();
          const size_t n = list_all(mine, &b);
          std::lock_guard lock(mu);
          listing_s.push_back(Since(t0));
          listed = n;
          bytes = b;
        }
      });
    }
    std::vector<double> busy;
    std::thread submitter([&] {
      while (!done) {
        busy.push_back(submit_p50(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    for (auto& t : readers) t.join();
    done = true;
    submitter.join();
    std::sort(listing_s.begin(), listing_s.end());
    std::sort(busy.begin(), busy.end());
    printf(
        "%s: %zu jobs, a full listing %.1f MiB in pages; 8 readers x 3 listings: median %.2f s; "
        "server's peak memory +%.0f MiB over %.0f MiB; a small submit p50 %.2f ms alone, %.2f ms "
        "during (x%.1f)\n",
        what.c_str(), listed, bytes / 1048576.0, listing_s[listing_s.size() / 2],
        (StatusKb("VmHWM:") - rss) / 1024.0, rss / 1024.0, quiet,
        busy.empty() ? 0.0 : busy[busy.size() / 2],
        busy.empty() ? 0.0 : busy[busy.size() / 2] / quiet);
  };
  const std::string arg(100 * 1024, 'x');
  json fat = {{"command", {"echo", arg, arg, arg, arg, arg, arg, arg, arg, arg}}, {"hold", true}};
  for (int i = 0; i < 300; ++i) (void)c.Send("POST", "/v1/jobs", fat.dump());
  round("300 held jobs of 0.9 MB commands");
  {
    std::vector<std::thread> ts;
    for (int t = 0; t < 8; ++t) {
      ts.emplace_back([&] {
        HttpClient mine(config.socket);
        for (int i = 0; i < 3750; ++i)
          (void)mine.Send("POST", "/v1/jobs",
                          json{{"command", {"sleep", "1"}}, {"hold", true}}.dump());
      });
    }
    for (auto& t : ts) t.join();
  }
  round("and 30,000 small held jobs");
  (*server)->Stop();
  // The cap at its default: how far one user's fat jobs get now.
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/state");
  config.max_queued_bytes_per_user = tessera::server::ServerConfig().max_queued_bytes_per_user;
  server = tessera::server::Server::Create(config);
  if (server.ok() && (*server)->Start().ok()) {
    HttpClient d(config.socket);
    int accepted = 0;
    std::string refused;
    for (int i = 0; i < 300; ++i) {
      auto r = d.Send("POST", "/v1/jobs", fat.dump());
      if (r.ok() && r->status == 201) ++accepted;
      if (r.ok() && r->status == 429) {
        refused = json::parse(r->body).value("error", r->body);
        break;
      }
    }
    printf(
        "with limits.max_queued_bytes_per_user at its default: %d of 300 fat jobs accepted, "
        "then 429 (%s)\n",
        accepted, refused.c_str());
    (*server)->Stop();
  }
  std::filesystem::remove_all(dir);
}

double PassSeconds(HttpClient& c) {
  std::string m = c.Send("GET", "/metrics")->body;
  size_t at = m.find("\ntessera_scheduling_pass_seconds ");
  return at == std::string::npos ? -1 : std::stod(m.substr(at + 33));
}

// One scheduling pass over 10,000 queued jobs that cannot start (a job holding one GPU, not
// preemptible, top priority, keeps 8-GPU jobs out): all of one shape, then of 2,001 (priorities).
// On a server of its own with `reservations` backfill reservations.
void QueuedPasses(const std::string& dir, int reservations, int count) {
  std::filesystem::remove_all(dir);
  tessera::server::ServerConfig config = BenchConfig(dir);
  config.backfill_reservations = reservations;
  config.max_queued_jobs_per_user = std::max<size_t>(config.max_queued_jobs_per_user, count + 10);
  auto server = tessera::server::Server::Create(config);
  if (!server.ok() || !(*server)->Start().ok()) {
    fprintf(stderr, "server_bench: cannot start the server\n");
    return;
  }
  HttpClient c(config.socket);
  // `count` queued jobs: a job holding one GPU (not preemptible, top priority) keeps 8-GPU jobs
  // out.
  int64_t blocker =
      json::parse(c.Send("POST", "/v1/jobs", Job("sleep 600", 1, 1000, false))->body)["id"];
  for (int variant = 0; variant < 2; ++variant) {
    auto t0 = Clock::now();
    std::vector<int64_t> ids;
    for (int i = 0; i < count; ++i) {
      int priority = variant == 0 ? 0 : (i % 2001) - 1000;
      ids.push_back(json::parse(c.Send("POST", "/v1/jobs", Job("true", 8, priority))->body)["id"]);
    }
    double submit_s = Since(t0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    (void)c.Send("POST", "/v1/jobs", Job("true", 8));  // one more pass over all of them
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    printf(
        "scheduling pass over %zu queued jobs (%s, %d reservations): %.1f ms (%d submitted in "
        "%.1f s)\n",
        ids.size() + 1, variant == 0 ? "one shape" : "2,001 shapes", reservations,
        PassSeconds(c) * 1000, count, submit_s);
    // A queued job's page (why it waits, when it is expected to start) read while 100 more
    // submissions each make the loop pass over the queue.
    {
      Reader reader(config.socket, {"/v1/jobs/" + std::to_string(ids[ids.size() / 2])});
      auto t1 = Clock::now();
      for (int i = 0; i < 100; ++i) {
        ids.push_back(json::parse(c.Send("POST", "/v1/jobs", Job("true", 8))->body)["id"]);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a pass each
      }
      reader.Stop("of a queued job while 100 submissions pass over the queue", Since(t1));
    }
    for (int64_t id : ids) (void)c.Send("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  }
  (void)c.Send("POST",
               "/v1/jobs/" + std::to_string(blocker) + "/cancel");  // jobs outlive a stopped server
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (*server)->Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace

// A server with its state in `disk_dir` (made afresh) on the slow-sync VFS, each fsync 5 ms longer;
// nullptr (said) when it cannot start.
std::unique_ptr<tessera::server::Server> StartOnSlowDisk(
    const std::string& disk_dir, const tessera::server::ServerConfig& config) {
  std::filesystem::remove_all(disk_dir);
  std::filesystem::create_directories(disk_dir + "/state");
  InstallSlowSyncVfs();
  g_sync_delay_us = 5000;
  auto store = tessera::server::Store::Open(disk_dir + "/state/tessera.db");
  if (!store.ok()) {
    fprintf(stderr, "server_bench: %s\n", std::string(store.status().message()).c_str());
    return nullptr;
  }
  tessera::server::ServerDeps deps;
  deps.store = std::move(*store);
  auto server = tessera::server::Server::Create(config, std::move(deps));
  if (!server.ok() || !(*server)->Start().ok()) {
    fprintf(stderr, "server_bench: cannot start the server\n");
    return nullptr;
  }
  return std::move(*server);
}

// One reader times GET /v1/info and GET /v1/jobs/1 while 200 running jobs end at about the same
// time, with the state on disk and each fsync 5 ms longer (the slow-sync VFS): each end is a
// store write.
void ReadsDuringEnds(const std::string& disk_dir) {
  tessera::server::ServerConfig config = BenchConfig(disk_dir);
  config.confinement = "off";
  auto server = StartOnSlowDisk(disk_dir, config);
  if (server == nullptr) return;
  HttpClient c(config.socket);
  (void)c.Send("POST", "/v1/jobs", json{{"command", {"true"}}}.dump());
  // 200 jobs that end together: each sleeps until the same wall-clock second.
  const auto end_at = std::chrono::system_clock::now() + std::chrono::seconds(4);
  const double end_s = std::chrono::duration<double>(end_at.time_since_epoch()).count();
  std::vector<int64_t> ids;
  for (int i = 0; i < 200; ++i) {
    const std::string cmd =
        fmt::format("now=$(date +%s.%N); sleep $(echo \"{:.3f} - $now\" | bc)", end_s);
    ids.push_back(json::parse(
        c.Send("POST", "/v1/jobs", json{{"command", {"sh", "-c", cmd}}}.dump())->body)["id"]);
  }
  for (;;) {
    std::string st =
        json::parse(c.Send("GET", "/v1/jobs/" + std::to_string(ids.back()))->body)["state"];
    if (st == "running") break;
  }
  std::this_thread::sleep_until(end_at - std::chrono::milliseconds(300));
  Reader reader(config.socket);
  auto t0 = Clock::now();
  for (;;) {
    json j = json::parse(c.Send("GET", "/v1/info")->body);
    if (j["running"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  reader.Stop("while 200 jobs end (fsync +5 ms)", Since(t0));
  server->Stop();
  std::filesystem::remove_all(disk_dir);
}

// Reads while 4 clients change 200 queued jobs (each held, released, given a new priority, then
// cancelled: 800 store writes), with the state on disk and each fsync 5 ms longer.
void ReadsDuringChanges(const std::string& disk_dir) {
  tessera::server::ServerConfig config = BenchConfig(disk_dir);
  config.confinement = "off";
  auto server = StartOnSlowDisk(disk_dir, config);
  if (server == nullptr) return;
  HttpClient c(config.socket);
  // Job 1 holds every GPU; the 200 that follow wait for all of them.
  const int64_t blocker = json::parse(c.Send("POST", "/v1/jobs", Job("sleep 600", 8))->body)["id"];
  std::vector<int64_t> ids;
  for (int i = 0; i < 200; ++i)
    ids.push_back(json::parse(c.Send("POST", "/v1/jobs", Job("true", 8))->body)["id"]);
  Reader reader(config.socket);
  auto t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int k = 0; k < 4; ++k) {
    clients.emplace_back([&, k] {
      HttpClient mine(config.socket);
      for (size_t i = k; i < ids.size(); i += 4) {
        const std::string job = "/v1/jobs/" + std::to_string(ids[i]);
        (void)mine.Send("POST", job + "/hold");
        (void)mine.Send("POST", job + "/release");
        (void)mine.Send("POST", job + "/priority", json{{"priority", 5}}.dump());
        (void)mine.Send("POST", job + "/cancel");
      }
    });
  }
  for (std::thread& t : clients) t.join();
  reader.Stop("while 200 queued jobs are held, released, reprioritized, cancelled (fsync +5 ms)",
              Since(t0));
  // Jobs outlive a stopped server: the blocker is stopped first.
  (void)c.Send("POST", "/v1/jobs/" + std::to_string(blocker) + "/cancel");
  for (auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
    auto r = c.Send("GET", "/v1/jobs/" + std::to_string(blocker));
    if (r.ok() && json::parse(r->body, nullptr, false).value("state", "") == "cancelled") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server->Stop();
  std::filesystem::remove_all(disk_dir);
}

// `tessera acct --jobs` with efficiency fields (issue 58): a page of N ended jobs, each with a GPU
// (so each has GPU-hours to weigh), listed as `ls` lists them and with each job's efficiency
// computed by the server, interleaved; the medians, their ratio and the bytes of each answer.
void AcctJobsBench(const std::string& dir, int count) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/state");
  tessera::server::ServerConfig config = BenchConfig(dir);
  config.confinement = "off";
  config.max_queued_jobs_per_user = 100000;
  auto server = tessera::server::Server::Create(config);
  if (!server.ok() || !(*server)->Start().ok()) {
    fprintf(stderr, "server_bench: cannot start the server on %s\n", dir.c_str());
    return;
  }
  HttpClient c(config.socket);
  for (int i = 0; i < count; ++i) (void)c.Send("POST", "/v1/jobs", Job("true", 1));
  const Clock::time_point deadline = Clock::now() + std::chrono::minutes(5);
  for (;;) {
    auto r = c.Send("GET", "/v1/jobs?state=queued,running&limit=1&env=false");
    if (r.ok() && r->status == 200 && json::parse(r->body)["jobs"].empty()) break;
    if (Clock::now() > deadline) {
      fprintf(stderr, "server_bench: %d jobs did not end in 5 minutes\n", count);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string plain = fmt::format("/v1/jobs?limit={}&env=false", count);
  const std::string eff = plain + "&efficiency=true";
  std::vector<double> plain_s, eff_s;
  size_t plain_bytes = 0, eff_bytes = 0;
  for (int round = 0; round < 30; ++round) {
    for (bool with : {false, true}) {
      const Clock::time_point t0 = Clock::now();
      auto r = c.Send("GET", with ? eff : plain);
      const double took = Since(t0);
      if (!r.ok() || r->status != 200) {
        fprintf(stderr, "server_bench: listing failed\n");
        return;
      }
      (with ? eff_s : plain_s).push_back(took);
      (with ? eff_bytes : plain_bytes) = r->body.size();
    }
  }
  std::sort(plain_s.begin(), plain_s.end());
  std::sort(eff_s.begin(), eff_s.end());
  const double p = plain_s[plain_s.size() / 2], e = eff_s[eff_s.size() / 2];
  printf(
      "acct --jobs over %d ended jobs (one page): median %.1f ms without efficiency (%.0f KB), "
      "%.1f ms with each job's efficiency (%.0f KB): %.2fx\n",
      count, p * 1e3, plain_bytes / 1024.0, e * 1e3, eff_bytes / 1024.0, e / p);
  (*server)->Stop();
  std::filesystem::remove_all(dir);
}

int main(int argc, char** argv) {
  const bool burst_only = argc > 1 && std::string(argv[1]) == "--burst";
  const bool submit_only = argc > 1 && std::string(argv[1]) == "--submit";
  spdlog::set_level(spdlog::level::warn);
  if (argc > 1 && std::string(argv[1]) == "--queued") {
    const int count = argc > 2 ? std::atoi(argv[2]) : 10000;
    for (int reservations : {8, 0})
      QueuedPasses("/dev/shm/tessera-queued-bench-" + std::to_string(getpid()), reservations,
                   count);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--ends") {
    std::string disk = argc > 2 ? argv[2] : "/var/tmp";
    ReadsDuringEnds(disk + "/tessera-ends-bench-" + std::to_string(getpid()));
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--changes") {
    std::string disk = argc > 2 ? argv[2] : "/var/tmp";
    ReadsDuringChanges(disk + "/tessera-changes-bench-" + std::to_string(getpid()));
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--listing") {
    ListingBench("/dev/shm/tessera-listing-bench-" + std::to_string(getpid()));
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--acct-jobs") {
    AcctJobsBench("/dev/shm/tessera-acct-jobs-bench-" + std::to_string(getpid()),
                  argc > 2 ? std::atoi(argv[2]) : 1000);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--array") {
    std::string disk = argc > 2 ? argv[2] : "/var/tmp";
    ArrayBench(disk + "/tessera-array-bench-" + std::to_string(getpid()));
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--submit-queued") {
    // Durable submits with an empty queue and with 20,000 jobs waiting (grouped commits, the
    // disk's own fsync): the engine's work per submission must not grow with the queue.
    std::string disk = argc > 2 ? argv[2] : "/var/tmp";
    disk += "/tessera-submit-queued-bench-" + std::to_string(getpid());
    SubmitThroughput(disk, 512, 0, 0);
    for (const char* waiting : {"gpus", "held", "after"})
      SubmitThroughput(disk, 512, 0, 20000, waiting);
    return 0;
  }
  if (submit_only) {
    // On disk: the directory given, or one in /var/tmp (not a tmpfs). This disk's own fsync, then
    // a flush of 5 ms added to each; one commit per submission against grouped commits, in turn.
    std::string disk = argc > 2 ? argv[2] : "/var/tmp";
    disk += "/tessera-submit-bench-" + std::to_string(getpid());
    InstallSlowSyncVfs();
    for (int delay_us : {0, 5000}) {
      for (size_t batch : {size_t{1}, size_t{512}}) SubmitThroughput(disk, batch, delay_us);
    }
    return 0;
  }
  std::string dir = "/dev/shm/tessera-server-bench-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  tessera::server::ServerConfig config = BenchConfig(dir);
  // The default poll interval (0.25 s): jobs that end are reaped when their pidfd says so.
  auto server = tessera::server::Server::Create(config);
  if (!server.ok() || !(*server)->Start().ok()) {
    fprintf(stderr, "server_bench: cannot start the server\n");
    return 1;
  }
  HttpClient c(config.socket);
  if (burst_only) {
    ReadsDuringBurst(config.socket);
    (*server)->Stop();
    std::filesystem::remove_all(dir);
    return 0;
  }

  // Submit-to-running.
  std::vector<double> lat;
  for (int i = 0; i < 300; ++i) {
    auto t0 = Clock::now();
    auto r = c.Send("POST", "/v1/jobs", Job("exit 0", 1));
    int64_t id = json::parse(r->body)["id"];
    for (;;) {
      std::string st = json::parse(c.Send("GET", "/v1/jobs/" + std::to_string(id))->body)["state"];
      if (st != "queued") break;
    }
    lat.push_back(Since(t0) * 1000);
  }
  std::sort(lat.begin(), lat.end());
  printf(
      "submit to running (300 jobs, 1 GPU each, polled): median %.2f ms, p99 %.2f ms, max %.2f "
      "ms\n",
      lat[lat.size() / 2], lat[lat.size() * 99 / 100], lat.back());

  // Hand-over: a job waiting for every GPU starts when the job holding them ends. Both write the
  // time (CLOCK_REALTIME, ns) as their last and first act: the gap is the server's reaping and
  // starting.
  std::vector<double> gap;
  for (int i = 0; i < 50; ++i) {
    const std::string a = dir + "/a" + std::to_string(i), b = dir + "/b" + std::to_string(i);
    (void)c.Send("POST", "/v1/jobs", Job("sleep 0.05; date +%s%N > " + a, 8));
    int64_t id = json::parse(c.Send("POST", "/v1/jobs", Job("date +%s%N > " + b, 8))->body)["id"];
    for (;;) {
      std::string st = json::parse(c.Send("GET", "/v1/jobs/" + std::to_string(id))->body)["state"];
      if (st == "succeeded" || st == "failed") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    auto read_ns = [](const std::string& path) {
      FILE* f = fopen(path.c_str(), "r");
      long long v = 0;
      if (f) {
        if (fscanf(f, "%lld", &v) != 1) v = 0;
        fclose(f);
      }
      return v;
    };
    gap.push_back((read_ns(b) - read_ns(a)) / 1e6);
  }
  std::sort(gap.begin(), gap.end());
  printf(
      "hand-over to a waiting job (50, all 8 GPUs): median %.2f ms, p99 %.2f ms, max %.2f ms (poll "
      "interval %.2f s)\n",
      gap[gap.size() / 2], gap[gap.size() * 99 / 100], gap.back(), config.poll_interval_s);

  // API reads.
  for (int threads : {1, 2}) {
    std::atomic<long> done{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&] {
        HttpClient mine(config.socket);
        while (!stop) {
          if (mine.Send("GET", "/v1/jobs/1")->status == 200) ++done;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
    stop = true;
    for (auto& t : ts) t.join();
    printf("API reads, GET /v1/jobs/1, %d client thread(s): %.0f requests/s\n", threads,
           done / Since(t0));
  }

  ReadsDuringBurst(config.socket);

  (*server)->Stop();
  std::filesystem::remove_all(dir);
  // 10,000 queued jobs, with backfill reservations (the server's default) and without, each on a
  // server of its own.
  for (int reservations : {8, 0}) QueuedPasses(dir + "-queued", reservations, 10000);
  return 0;
}
